"""The data commands: `raftkv put`, `get`, `delete` and `scan`, with `--rev` (the store as of a
past revision) on get and scan, and `compact` and `revision` (`txn` is in txn_command). Values are
bytes end to end: put takes them from the command line, stdin or a file; get writes them unchanged;
scan escapes them so that one line is always one pair; -w json (--json) carries them in base64
with each pair's create_revision, mod_revision, version and lease, as etcdctl does, and -w table
shows them escaped as scan does."""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from kv.client.client import CONSISTENCY, Client, to_bytes
from kv.client.revisions import KeyValue
from kv.tools.arguments import Formatter, non_negative_int, positive_int
from kv.tools.client_options import EXIT_FAILED, b64, client_of
from kv.tools.lease_commands import lease_id
from kv.tools.write_out import JSON, SIMPLE, TABLE, add_write_out, print_table
from raftkv_proto.key_ranges import prefix_end


def add_data_commands(commands: Any, client_options: argparse.ArgumentParser) -> None:
    _add_put(commands, client_options)
    _add_get(commands, client_options)
    _add_delete(commands, client_options)
    _add_scan(commands, client_options)
    _add_compact(commands, client_options)
    _add_revision(commands, client_options)


def _add_put(commands: Any, client_options: argparse.ArgumentParser) -> None:
    put = commands.add_parser(
        "put", parents=[client_options], formatter_class=Formatter, help="write a value",
        description="Write VALUE under KEY; prints the raft index. The value can also come from stdin\n"
                    "(VALUE '-') or from a file (--value-file), as bytes, unchanged: binary data and\n"
                    "trailing newlines are kept. To write a literal '-', put it in a file and use\n"
                    "--value-file. With --lease ID (`raftkv lease grant`), the key is deleted when the\n"
                    "lease is revoked or expires; such a put goes through etcd's Put and prints the\n"
                    "store's revision after it instead of the raft index (OK revision=N).",
        epilog="examples:\n  raftkv put user/1 alice\n  gzip -c report.txt | raftkv put reports/1 -\n"
               "  raftkv put config/app --value-file app.yaml\n"
               "  raftkv put service/a 10.0.0.1:80 --lease 694d7a1e0f4a2c05")
    put.add_argument("key", metavar="KEY", help="the key (UTF-8, at most 32768 bytes)")
    put.add_argument("value", metavar="VALUE", nargs="?", default=None,
                     help="the value (UTF-8); '-' reads it from stdin")
    put.add_argument("--value-file", type=Path, default=None, metavar="PATH",
                     help="read the value from this file instead of VALUE")
    put.add_argument("--lease", type=lease_id, default=0, metavar="ID",
                     help="attach the key to this lease, its id in hex as etcdctl's (0: none, the default)")
    add_write_out(put, SIMPLE, simple="OK index=N (--lease: OK revision=N)",
                  table="KEY and INDEX (--lease: REVISION)",
                  json='{"key": KEY, "index": N} (--lease: "revision" for "index"), the key in base64')
    put.set_defaults(run=_run_put, command_parser=put)


def _add_get(commands: Any, client_options: argparse.ArgumentParser) -> None:
    get = commands.add_parser(
        "get", parents=[client_options], formatter_class=Formatter, help="read a value (--rev: as it was then)",
        description="Print the value under KEY; exit 1 when it is absent. With --rev N, the value KEY\n"
                    "had at revision N (the store's revision rises by one with every write; `raftkv\n"
                    "revision` prints it, -w json gives each key's). A revision below the last\n"
                    "compaction, or above the store's, is an error (exit 1): \"required revision has\n"
                    "been compacted\" / \"required revision is a future revision\", etcd's messages.",
        epilog="examples:\n  raftkv get user/1\n  raftkv get user/1 --rev 42       the value as of revision 42\n"
               "  raftkv get user/1 -w json         with create_revision, mod_revision, version, lease")
    get.add_argument("key", metavar="KEY", help="the key")
    _add_rev(get)
    _add_consistency(get)
    add_write_out(get, SIMPLE, simple="the value's bytes as they are", table="KEY and VALUE, escaped as scan's",
                  json='{"key": KEY, "value": VALUE or null, "found": true or false, "create_revision": N, '
                       '"mod_revision": N, "version": N, "lease": ID (these four null when absent)}, key and '
                       'value in base64')
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
                    "cuts the listing short, stderr says so. With --rev N, the keys and values as\n"
                    "they were at revision N (--limit 0 reads every page at that revision). With\n"
                    "--keys-only, KEY lines alone: no value is read off the member.",
        epilog="examples:\n  raftkv scan --prefix user/\n  raftkv scan --prefix user/ --rev 42   as of revision 42\n"
               "  raftkv scan --start a --end m --limit 0 -w json\n  raftkv scan --prefix user/ --keys-only --limit 0")
    scan.add_argument("--prefix", default=None, help="only keys starting with this")
    scan.add_argument("--start", default=None, help="first key of the range (inclusive)")
    scan.add_argument("--end", default=None, help="end of the range (exclusive; default: the last key)")
    scan.add_argument("--limit", type=non_negative_int, default=100, metavar="N",
                      help="at most N pairs; 0: all of them, fetched a page at a time")
    scan.add_argument("--keys-only", action="store_true",
                      help="the keys alone, as etcdctl get --keys-only (-w json: every value empty)")
    _add_rev(scan)
    _add_consistency(scan)
    add_write_out(scan, SIMPLE, simple="KEY<TAB>VALUE lines, escaped",
                  table="KEY and VALUE columns, escaped (the whole listing is held to lay it out)",
                  json='{"kvs": [{"key": KEY, "value": VALUE, "create_revision": N, "mod_revision": N, '
                       '"version": N, "lease": ID}, ...], "count": N, "more": true when --limit cut it short}, '
                       'keys and values in base64')
    scan.set_defaults(run=_run_scan, command_parser=scan)


def _add_compact(commands: Any, client_options: argparse.ArgumentParser) -> None:
    compact = commands.add_parser(
        "compact", aliases=["compaction"], parents=[client_options], formatter_class=Formatter,
        help="drop the history below a revision",
        description="Compact the store's history at revision REV, as etcdctl's compaction: reads at\n"
                    "revisions below REV (get/scan --rev) fail from then on, and the space the older\n"
                    "versions took is reused. Prints \"compacted revision REV\". REV already compacted\n"
                    "or above the store's revision is an error (exit 1). `compaction` is its etcdctl name.",
        epilog="examples:\n  raftkv compact 42\n  raftkv compact \"$(raftkv revision)\"   keep only the present")
    compact.add_argument("revision", metavar="REV", type=positive_int, help="the revision to compact at")
    compact.add_argument("--physical", action="store_true",
                         help="accepted for etcdctl's sake: raftkv's compaction is always physical "
                              "(done when the command returns)")
    compact.set_defaults(run=_run_compact, command_parser=compact)


def _add_revision(commands: Any, client_options: argparse.ArgumentParser) -> None:
    revision = commands.add_parser(
        "revision", parents=[client_options], formatter_class=Formatter, help="print the store's revision",
        description="Print the store's revision now (a linearizable read): 1 when empty, up by one with\n"
                    "every write or transaction that changed something. get/scan --rev and compact\n"
                    "take revisions.",
        epilog="examples:\n  raftkv revision\n"
               "  rev=$(raftkv revision); raftkv put cfg v2; raftkv get cfg --rev \"$rev\"")
    revision.set_defaults(run=_run_revision, command_parser=revision)


def _add_consistency(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--consistency", choices=tuple(CONSISTENCY), default="linearizable",
                        help="linearizable: confirmed by a quorum; lease: the leader's lease; stale: any node's local state")


def _add_rev(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rev", type=non_negative_int, default=0, metavar="N",
                        help="as of revision N (etcdctl's --rev); 0: now (default)")


def kv_json(kv: KeyValue) -> dict[str, Any]:
    """A pair with its revisions, as -w json prints it: key and value in base64, then etcd's
    create_revision, mod_revision, version and lease (0: none)."""
    return {"key": b64(kv.key), "value": b64(kv.value), "create_revision": kv.create_revision,
            "mod_revision": kv.mod_revision, "version": kv.version, "lease": kv.lease}


def _write_line(data: bytes, out: TextIO) -> None:
    """Values are bytes: write them as they are, not as Python's repr."""
    out.flush()
    out.buffer.write(data + b"\n")
    out.buffer.flush()


def _run_put(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    value = _put_value(args, parser)
    with client_of(args) as client:
        index = client.put(args.key, value, lease=args.lease)
    what = "revision" if args.lease else "index"  # a leased put is etcd's Put, which tells the revision
    if args.write_out == JSON:
        print(json.dumps({"key": b64(to_bytes(args.key)), what: index}))
    elif args.write_out == TABLE:
        print_table(("KEY", what.upper()), [(args.key, str(index))])
    else:
        print(f"OK {what}={index}")
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
        if args.write_out == JSON:  # with the key's revisions, which etcd's Range gives
            kv = client.get_kv(args.key, revision=args.rev or None, consistency=args.consistency)
            value = None if kv is None else kv.value
            print(json.dumps(_get_json(to_bytes(args.key), kv)))  # printed when absent too: "found" says so
        else:
            value = client.get(args.key, consistency=args.consistency, revision=args.rev or None)
    if value is None:
        print(f"not found: {args.key}", file=sys.stderr)
        return EXIT_FAILED
    if args.write_out == TABLE:
        print_table(("KEY", "VALUE"), [(args.key, escaped(value))])
    elif args.write_out == SIMPLE:
        _write_line(value, sys.stdout)
    return 0


def _get_json(key: bytes, kv: KeyValue | None) -> dict[str, Any]:
    """get's -w json: its first three fields, then the revisions and lease (null when absent)."""
    if kv is None:
        return {"key": b64(key), "value": None, "found": False, "create_revision": None, "mod_revision": None,
                "version": None, "lease": None}
    return {"key": b64(key), "value": b64(kv.value), "found": True, "create_revision": kv.create_revision,
            "mod_revision": kv.mod_revision, "version": kv.version, "lease": kv.lease}


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


def _run_compact(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        client.compact(args.revision)
    print(f"compacted revision {args.revision}")  # etcdctl's line
    return 0


def _run_revision(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        print(client.revision())
    return 0


def _run_scan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.prefix is not None and (args.start is not None or args.end is not None):
        parser.error("give either --prefix or --start/--end, not both")
    if args.rev or args.write_out == JSON:
        return _run_scan_kvs(args)
    with client_of(args) as client:
        if args.limit:
            page = _scan_page(client, args)
            pairs: Iterable[Pair] = page[:args.limit]
            more = len(page) > args.limit
        else:
            pairs, more = itertools.chain.from_iterable(_scan_pages(client, args)), False
        shown = _print_scan(args.write_out, pairs, more, args.keys_only)
    if more:
        print(f"raftkv scan: {shown} keys shown, more exist; --limit 0 shows all", file=sys.stderr)
    return 0


def _run_scan_kvs(args: argparse.Namespace) -> int:
    """scan with --rev, or -w json: read through etcd's Range, which gives each pair's revisions."""
    with client_of(args) as client:
        if args.limit:
            page = _scan_kv_page(client, args, args.limit + 1)
            kvs: Iterable[KeyValue] = page[:args.limit]
            more = len(page) > args.limit
        else:
            kvs, more = itertools.chain.from_iterable(_scan_kv_pages(client, args)), False
        if args.write_out == JSON:
            listed = [kv_json(kv) for kv in kvs]
            print(json.dumps({"kvs": listed, "count": len(listed), "more": more}))
            shown = len(listed)
        else:
            shown = _print_scan(args.write_out, ((kv.key, kv.value) for kv in kvs), more, args.keys_only)
    if more:
        print(f"raftkv scan: {shown} keys shown, more exist; --limit 0 shows all", file=sys.stderr)
    return 0


def _scan_kv_page(client: Client, args: argparse.Namespace, limit: int, start: bytes | None = None) -> list[KeyValue]:
    """Up to `limit` pairs from `start` on (None: the range's first key), at --rev (0: now). Only
    "stale" differs here: etcd's serializable read; lease reads are linearizable ones."""
    if args.prefix is not None:
        first, end = to_bytes(args.prefix), prefix_end(to_bytes(args.prefix))  # b"": to the last key
    else:
        first, end = to_bytes(args.start or b""), to_bytes(args.end or b"")
    return client.scan_at(args.rev, start=start if start is not None else first, end=end or None, limit=limit,
                          consistency=args.consistency, keys_only=args.keys_only)


def _scan_kv_pages(client: Client, args: argparse.Namespace) -> Iterator[list[KeyValue]]:
    """Every pair of the range a page at a time; with --rev, every page at that revision, so the
    pages together are the store as it was then."""
    start: bytes | None = None
    while True:
        page = _scan_kv_page(client, args, SCAN_ALL_PAGE, start)
        yield page
        if len(page) < SCAN_ALL_PAGE:
            return
        start = page[-1].key + b"\x00"  # the smallest key after the last one listed


Pair = tuple[bytes, bytes]
# --limit 0 lists everything in pages of this many pairs, printed as they come (each page is
# consistent on its own, as every page of a scan is).
SCAN_ALL_PAGE = 1000


def _scan_page(client: Client, args: argparse.Namespace) -> list[Pair]:
    """Up to --limit pairs and one more: the extra one tells that the limit cut the listing short."""
    return client.scan(prefix=args.prefix, start=args.start, end=args.end, limit=args.limit + 1,
                       consistency=args.consistency, keys_only=args.keys_only)


def _scan_pages(client: Client, args: argparse.Namespace) -> Iterator[list[Pair]]:
    """Every pair in the range, a page at a time, so that listing a large store holds one page."""
    if args.prefix is not None:
        start, end = to_bytes(args.prefix), prefix_end(to_bytes(args.prefix))  # b"": to the last key
    else:
        start, end = to_bytes(args.start or b""), to_bytes(args.end or b"")
    while True:
        page = client.scan(start=start, end=end or None, limit=SCAN_ALL_PAGE, consistency=args.consistency,
                           keys_only=args.keys_only)
        yield page
        if len(page) < SCAN_ALL_PAGE:
            return
        start = page[-1][0] + b"\x00"  # the smallest key after the last one listed


def _print_scan(write_out: str, pairs: Iterable[Pair], more: bool, keys_only: bool) -> int:
    """The pairs in the -w form asked for (the keys alone with `keys_only`); returns how many."""
    if write_out == JSON:
        return _print_scan_json(pairs, more)
    if write_out == TABLE and keys_only:
        return print_table(("KEY",), ((escaped(key),) for key, _ in pairs))
    if write_out == TABLE:
        return print_table(("KEY", "VALUE"), ((escaped(key), escaped(value)) for key, value in pairs))
    return _print_scan_lines(pairs, keys_only)


def _print_scan_lines(pairs: Iterable[Pair], keys_only: bool) -> int:
    """KEY<TAB>VALUE lines (KEY lines with `keys_only`), escaped; returns how many."""
    shown = 0
    for key, value in pairs:
        _write_line(escape(key) if keys_only else escape(key) + b"\t" + escape(value), sys.stdout)
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


