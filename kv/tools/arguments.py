"""What the `raftkv` commands share in parsing their command lines: the help formatter and the
argument types."""
from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from typing import Any

LOG_LEVELS = ("debug", "info", "warning", "error")

# The default of every client command's --endpoints when set and not empty, as etcdctl's
# ETCDCTL_ENDPOINTS; the flag wins over it.
ENDPOINTS_VARIABLE = "RAFTKV_ENDPOINTS"
ENDPOINTS_HELP = "comma-separated addresses of cluster members; the client finds the leader"


def default_endpoints(fallback: str | None) -> str | None:
    """$RAFTKV_ENDPOINTS, else `fallback`. Called when a parser is built (each main() call), so
    the environment of the run counts."""
    return os.environ.get(ENDPOINTS_VARIABLE) or fallback


def endpoints_help(fallback: str) -> str:
    return f"{ENDPOINTS_HELP} (default: ${ENDPOINTS_VARIABLE} when set, else {fallback})"


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keep the examples' line breaks, and show a flag's default unless its help already talks
    about it or there is nothing worth showing (flags, empty values)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, "", argparse.SUPPRESS) or isinstance(default, bool):
            return text
        return f"{text} (default: %(default)s)"


def at_least(kind: Callable[[str], float], minimum: int) -> Callable[[str], Any]:
    """An argparse type: a number (int or float, as `kind` parses) no smaller than `minimum`."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'a whole number' if kind is int else 'a number'}, got {text!r}") from None
        if not value >= minimum:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value
    return parse


positive_int = at_least(int, 1)
non_negative_int = at_least(int, 0)
non_negative_float = at_least(float, 0)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def byte_size(text: str) -> int:
    """An argparse type: bytes, as a whole number with an optional unit (64MiB, 8GiB, 1500000)."""
    found = _SIZE.match(text)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a size such as 1048576, 64MiB or 8GiB, got {text!r}")
    return int(found.group(1)) * _UNITS[unit]


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a port: {value}")
    return value
