"""What every `raftkv` command that talks to a cluster shares: --endpoints and --timeout, the
Client they make, --json, exit codes and how an error is told on stderr."""
from __future__ import annotations

import argparse
import base64

from kv.client.client import Client
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
    add_user_options(options)
    return options


def client_of(args: argparse.Namespace) -> Client:
    return Client(args.endpoints, timeout=args.timeout, **credentials_of(args))


def add_json(parser: argparse.ArgumentParser, shape: str) -> None:
    parser.add_argument("--json", action="store_true",
                        help=f"print JSON, keys and values in base64 (as etcdctl): {shape}")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def describe(error: Exception) -> str:
    """An error as one line: its kind (UNAVAILABLE, ...) when it has one, then its message."""
    kind = getattr(error, "kind", None)
    return f"{kind}: {error}" if kind else str(error)
