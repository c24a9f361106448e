"""What every `raftkv` command that talks to a cluster shares: --endpoints and --timeout, TLS
(--cacert, --cert, --key), the Client they make, base64 for JSON, exit codes and how an error is told on
stderr."""
from __future__ import annotations

import argparse
import base64
import os
from pathlib import Path

from kv.client.client import Client
from kv.client.tls import CACERT_VARIABLE, CERT_VARIABLE, KEY_VARIABLE, TLS
from kv.tools.arguments import default_endpoints, endpoints_help, positive_float
from kv.tools.user_options import add_user_options, credentials_of
from raft.node.config import DEFAULT_LISTEN

DEFAULT_ENDPOINTS = DEFAULT_LISTEN
# Exit codes: 1 for a failed request or an absent key (argparse exits 2 for a bad command line).
EXIT_FAILED = 1
# How long a command that talks to a cluster tries, retries included, unless --timeout says.
# (etcdctl's --command-timeout is 5 s; a snapshot streams the whole state.)
COMMAND_TIMEOUT_S = 5.0
SNAPSHOT_SAVE_TIMEOUT_S = 600.0


def client_options(timeout: float = COMMAND_TIMEOUT_S) -> argparse.ArgumentParser:
    """--endpoints / --timeout, for the commands that talk to a cluster. A parent parser's options
    are shared by every command built from it (set_defaults on one would change them all), so a
    command with another default timeout gets a parent of its own."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--endpoints", default=default_endpoints(DEFAULT_ENDPOINTS), metavar="HOST:PORT,...",
                         help=endpoints_help(DEFAULT_ENDPOINTS))
    options.add_argument("--timeout", type=positive_float, default=timeout, metavar="SECONDS",
                         help="give up (and exit 1) after this long, retries included")
    add_tls_options(options)
    add_user_options(options)
    return options


# (flag, dest, environment variable, help) of the client's TLS files: etcdctl's flag names. The
# dests are not "key" and "cert": put/get/delete take a positional KEY.
TLS_OPTIONS = (
    ("--cacert", "tls_cacert", CACERT_VARIABLE, "connect with TLS, verifying the members' certificates with this "
                                                "CA (the one that signed their --cert-file)"),
    ("--cert", "tls_cert", CERT_VARIABLE, "connect with TLS presenting this client certificate (with --key), for members "
                              "started with --client-cert-auth"),
    ("--key", "tls_key", KEY_VARIABLE, "the private key of --cert"),
)


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    """--cacert, --cert and --key, each defaulting to its environment variable when set (read when
    the parser is built, as $RAFTKV_ENDPOINTS). Any of them turns TLS on; none: plaintext."""
    group = parser.add_argument_group("TLS (to members started with --cert-file; docs/security.md)")
    for flag, dest, variable, text in TLS_OPTIONS:
        group.add_argument(flag, dest=dest, type=Path, default=os.environ.get(variable) or None, metavar="PEM",
                           help=f"{text} (default: ${variable} when set)")


def tls_of(args: argparse.Namespace) -> TLS | None:
    """The TLS that --cacert/--cert/--key (or their variables) ask for; None: plaintext."""
    if args.tls_cacert is None and args.tls_cert is None and args.tls_key is None:
        return None
    return TLS(args.tls_cacert, args.tls_cert, args.tls_key)


def client_of(args: argparse.Namespace) -> Client:
    return Client(args.endpoints, timeout=args.timeout, tls=tls_of(args), **credentials_of(args))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def describe(error: Exception) -> str:
    """An error as one line: its kind (UNAVAILABLE, ...) when it has one, then its message."""
    kind = getattr(error, "kind", None)
    return f"{kind}: {error}" if kind else str(error)
