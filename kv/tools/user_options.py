"""The client options that say who a `raftkv` command is, once the cluster has auth enabled
(docs/security.md): --user NAME[:PASSWORD] and --password, as etcdctl's, with RAFTKV_USER and
RAFTKV_PASSWORD as defaults. A user without a password is asked for one when stdin is a
terminal; otherwise it goes without (a client certificate naming the user identifies it)."""
from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any

USER_VARIABLE = "RAFTKV_USER"
PASSWORD_VARIABLE = "RAFTKV_PASSWORD"


def add_user_options(options: argparse.ArgumentParser) -> None:
    options.add_argument("--user", default=os.environ.get(USER_VARIABLE), metavar="NAME[:PASSWORD]",
                         help=f"the user to make requests as, once auth is enabled (default: ${USER_VARIABLE}); "
                              "a password after ':', else --password, else asked on a terminal")
    options.add_argument("--password", default=os.environ.get(PASSWORD_VARIABLE), metavar="PASSWORD",
                         help=f"the password of --user (default: ${PASSWORD_VARIABLE}); "
                              "it shows in the process list: prefer the variable or the prompt")


def credentials_of(args: argparse.Namespace) -> dict[str, Any]:
    """Client keyword arguments (user, password) for the command line's --user and --password."""
    spec = getattr(args, "user", None)
    if not spec:
        return {}
    name, colon, password = spec.partition(":")
    if not colon:
        password = getattr(args, "password", None)
        if password is None and sys.stdin.isatty():
            password = getpass.getpass(f"Password of {name}: ")
    return {"user": name, "password": password}
