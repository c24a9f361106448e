"""The data commands: `raftkv put`, `get`, `delete` and `scan`. Values are bytes end to end: put
takes them from the command line, stdin or a file; get writes them unchanged; scan escapes them so
that one line is always one pair; -w json (--json) carries them in base64, as etcdctl does, and
-w table shows them escaped as scan does."""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from kv.client.client import CONSISTENCY, Client, to_bytes
from kv.tools.arguments import Formatter, non_negative_int
from kv.tools.client_options import EXIT_FAILED, b64, client_of
from kv.tools.write_out import JSON, SIMPLE, TABLE, add_write_out, print_table
from raftkv_proto.key_ranges import prefix_end


def add_data_commands(commands: Any, client_options: argparse.ArgumentParser) -> None:
    _add_put(commands, client_options)
    _add_get(commands, client_options)
    _add_delete(commands, client_options)
    _add_scan(commands, client_options)


def _add_put(commands: Any, client_options: argparse.ArgumentParser) -> None:
    put = commands.add_parser(
        "put", parents=[client_options], formatter_class=Formatter, help="write a value",
        description="Write VALUE under KEY; prints the raft index. The value can also come from stdin\n"
                    "(VALUE '-') or from a file (--value-file), as bytes, unchanged: binary data and\n"
                    "trailing newlines are kept. To write a literal '-', put it in a file and use\n"
                    "--value-file.",
        epilog="examples:\n  raftkv put user/1 alice\n  gzip -c report.txt | raftkv put reports/1 -\n"
               "  raftkv put config/app --value-file app.yaml")
    put.add_argument("key", metavar="KEY", help="the key (UTF-8, at most 511 bytes)")
    put.add_argument("value", metavar="VALUE", nargs="?", default=None,
                     help="the value (UTF-8); '-' reads it from stdin")
    put.add_argument("--value-file", type=Path, default=None, metavar="PATH",
                     help="read the value from this file instead of VALUE")
    add_write_out(put, SIMPLE, simple="OK index=N", table="KEY and INDEX",
                  json='{"key": KEY, "index": N}, the key in base64')
    put.set_defaults(run=_run_put, command_parser=put)


def _add_get(commands: Any, client_options: argparse.ArgumentParser) -> None:
    get = commands.add_parser("get", parents=[client_options], formatter_class=Formatter,
                              help="read a value", description="Print the value under KEY; exit 1 when it is absent.")
    get.add_argument("key", metavar="KEY", help="the key")
    _add_consistency(get)
    add_write_out(get, SIMPLE, simple="the value's bytes as they are", table="KEY and VALUE, escaped as scan's",
                  json='{"key": KEY, "value": VALUE or null, "found": true or false}, in base64')
    get.set_defaults(run=_run_get, command_parser=get)


def _add_delete(commands: Any, client_options: argparse.ArgumentParser) -> None:
    delete = commands.add_parser("delete", parents=[client_options], formatter_class=Formatter,
                                 help="delete a key", description="Delete KEY; prints whether it existed.")
    delete.add_argument("key", metavar="KEY", help="the key")
    add_write_out(delete, SIMPLE, simple="'deleted' or 'not found ...'", table="KEY and DELETED",
                  json='{"key": KEY, "deleted": true or false}, the key in base64')
    delete.set_defaults(run=_run_delete, command_parser=delete)


def _add_scan(commands: Any, client_options: argparse.ArgumentParser) -> None:
    scan = commands.add_parser(
        "scan", parents=[client_options], formatter_class=Formatter, help="list keys in order",
        description="Print KEY<TAB>VALUE lines in key order: keys starting with --prefix, or in\n"
                    "[--start, --end). Keys and values are escaped as in a Python bytes literal\n"
                    "(\\t, \\n, \\r, \\\\, \\xNN for other unprintable bytes and invalid UTF-8),\n"
                    "so a line is always one pair; printable UTF-8 is kept as it is. When --limit\n"
                    "cuts the listing short, stderr says so.")
    scan.add_argument("--prefix", default=None, help="only keys starting with this")
    scan.add_argument("--start", default=None, help="first key of the range (inclusive)")
    scan.add_argument("--end", default=None, help="end of the range (exclusive; default: the last key)")
    scan.add_argument("--limit", type=non_negative_int, default=100, metavar="N",
                      help="at most N pairs; 0: all of them, fetched a page at a time")
    _add_consistency(scan)
    add_write_out(scan, SIMPLE, simple="KEY<TAB>VALUE lines, escaped",
                  table="KEY and VALUE columns, escaped (the whole listing is held to lay it out)",
                  json='{"kvs": [{"key": KEY, "value": VALUE}, ...], "count": N, "more": true when --limit '
                       'cut it short}, keys and values in base64')
    scan.set_defaults(run=_run_scan, command_parser=scan)


def _add_consistency(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--consistency", choices=tuple(CONSISTENCY), default="linearizable",
                        help="linearizable: confirmed by a quorum; lease: the leader's lease; stale: any node's local state")



def _write_line(data: bytes, out: TextIO) -> None:
    """Values are bytes: write them as they are, not as Python's repr."""
    out.flush()
    out.buffer.write(data + b"\n")
    out.buffer.flush()


def _run_put(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    value = _put_value(args, parser)
    with client_of(args) as client:
        index = client.put(args.key, value)
    if args.write_out == JSON:
        print(json.dumps({"key": b64(to_bytes(args.key)), "index": index}))
    elif args.write_out == TABLE:
        print_table(("KEY", "INDEX"), [(args.key, str(index))])
    else:
        print(f"OK index={index}")
    return 0


STDIN_VALUE = "-"


def _put_value(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str | bytes:
    """VALUE as given, or the bytes of stdin ('-') or of --value-file, undecoded: a value may be
    binary, and a trailing newline is part of it."""
    if args.value is not None and args.value_file is not None:
        parser.error("give VALUE or --value-file, not both")
    if args.value_file is not None:
        return args.value_file.read_bytes()  # OSError: one error line, exit 1 (main)
    if args.value is None:
        parser.error("the following arguments are required: VALUE (or '-' for stdin, or --value-file PATH)")
    if args.value == STDIN_VALUE:
        return sys.stdin.buffer.read()
    return args.value


def _run_get(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        value = client.get(args.key, consistency=args.consistency)
    if args.write_out == JSON:  # printed when absent too: "found" says so
        print(json.dumps({"key": b64(to_bytes(args.key)), "value": None if value is None else b64(value),
                          "found": value is not None}))
    if value is None:
        print(f"not found: {args.key}", file=sys.stderr)
        return EXIT_FAILED
    if args.write_out == TABLE:
        print_table(("KEY", "VALUE"), [(args.key, escaped(value))])
    elif args.write_out == SIMPLE:
        _write_line(value, sys.stdout)
    return 0


def _run_delete(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        existed = client.delete(args.key)
    if args.write_out == JSON:
        print(json.dumps({"key": b64(to_bytes(args.key)), "deleted": existed}))
    elif args.write_out == TABLE:
        print_table(("KEY", "DELETED"), [(args.key, str(existed).lower())])
    else:
        print("deleted" if existed else "not found (nothing to delete)")
    return 0


def _run_scan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.prefix is not None and (args.start is not None or args.end is not None):
        parser.error("give either --prefix or --start/--end, not both")
    with client_of(args) as client:
        if args.limit:
            page = _scan_page(client, args)
            pairs: Iterable[Pair] = page[:args.limit]
            more = len(page) > args.limit
        else:
            pairs, more = itertools.chain.from_iterable(_scan_pages(client, args)), False
        shown = _print_scan(args.write_out, pairs, more)
    if more:
        print(f"raftkv scan: {shown} keys shown, more exist; --limit 0 shows all", file=sys.stderr)
    return 0


Pair = tuple[bytes, bytes]
# --limit 0 lists everything in pages of this many pairs, printed as they come (each page is
# consistent on its own, as every page of a scan is).
SCAN_ALL_PAGE = 1000


def _scan_page(client: Client, args: argparse.Namespace) -> list[Pair]:
    """Up to --limit pairs and one more: the extra one tells that the limit cut the listing short."""
    return client.scan(prefix=args.prefix, start=args.start, end=args.end, limit=args.limit + 1,
                       consistency=args.consistency)


def _scan_pages(client: Client, args: argparse.Namespace) -> Iterator[list[Pair]]:
    """Every pair in the range, a page at a time, so that listing a large store holds one page."""
    if args.prefix is not None:
        start, end = to_bytes(args.prefix), prefix_end(to_bytes(args.prefix))  # b"": to the last key
    else:
        start, end = to_bytes(args.start or b""), to_bytes(args.end or b"")
    while True:
        page = client.scan(start=start, end=end or None, limit=SCAN_ALL_PAGE, consistency=args.consistency)
        yield page
        if len(page) < SCAN_ALL_PAGE:
            return
        start = page[-1][0] + b"\x00"  # the smallest key after the last one listed


def _print_scan(write_out: str, pairs: Iterable[Pair], more: bool) -> int:
    """The pairs in the -w form asked for; returns how many."""
    if write_out == JSON:
        return _print_scan_json(pairs, more)
    if write_out == TABLE:
        return print_table(("KEY", "VALUE"), ((escaped(key), escaped(value)) for key, value in pairs))
    return _print_scan_lines(pairs)


def _print_scan_lines(pairs: Iterable[Pair]) -> int:
    """KEY<TAB>VALUE lines, escaped; returns how many."""
    shown = 0
    for key, value in pairs:
        _write_line(escape(key) + b"\t" + escape(value), sys.stdout)
        shown += 1
    return shown


def _print_scan_json(pairs: Iterable[Pair], more: bool) -> int:
    kvs = [{"key": b64(key), "value": b64(value)} for key, value in pairs]
    print(json.dumps({"kvs": kvs, "count": len(kvs), "more": more}))
    return len(kvs)


_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def escape(data: bytes) -> bytes:
    """`data` as the body of a Python bytes literal would spell it, except that printable UTF-8
    stays as it is: a tab, newline or binary byte in a key or value cannot break scan's lines, and
    codecs.escape_decode gives the bytes back."""
    if data.isascii() and data.decode("ascii").isprintable() and b"\\" not in data:
        return data  # the common case, untouched
    return "".join(_escape_char(c) for c in data.decode("utf-8", "surrogateescape")).encode("utf-8")


def escaped(data: bytes) -> str:
    """escape() as text, for a table cell."""
    return escape(data).decode("utf-8")


def _escape_char(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if "\udc80" <= char <= "\udcff":  # a byte that is not UTF-8, as surrogateescape keeps it
        return f"\\x{ord(char) - 0xdc00:02x}"
    if char.isprintable():
        return char
    return "".join(f"\\x{byte:02x}" for byte in char.encode("utf-8"))


