"""`raftkv watch`: every change to a key, a range or a prefix, printed as etcdctl 3.4's `watch`
prints it, until Ctrl-C (exit 0) or the watch fails for good (a compacted --rev, refused
credentials: exit 1). It rides on kv.Client.watch, which resumes by itself on another member when
its stream breaks (a member died, the connection dropped), from the revision after the last one
printed: no change missed, none printed twice.

The simple form is etcdctl's lines for each event: PUT or DELETE, then with --prev-kv the key and
value the key had before (when it existed), then the key and its new value (empty for a DELETE),
the bytes as they are. -w json prints one etcdctl WatchResponse object a line, for each event:
{"Header": {"revision": R}, "Events": [EVENT], "CompactRevision": 0, "Canceled": false,
"Created": false}, EVENT being etcd's JSON of an mvccpb.Event (its fields when not zero: "type": 1
for a DELETE, "kv" and "prev_kv" with key and value in base64). Three differences from etcdctl's
JSON: one event a line (etcd may send the events of several revisions in one response; a
revision's events together, as here, its own line each), the header holds only the revision (the
event's: the resuming watch does not tell which member sent it) and an event's "kv" has no
"lease" (kv.client.watch.WatchEvent does not carry it; "prev_kv" does)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import grpc

from kv.client.revisions import KeyValue
from kv.client.watch import WatchEvent
from kv.errors import from_rpc_error
from kv.tools.arguments import Formatter, non_negative_int
from kv.tools.client_options import b64, client_of
from kv.tools.write_out import JSON, SIMPLE, add_write_out

DESCRIPTION = """\
Print every change to KEY, to the keys in [KEY, RANGE_END), or to those starting with
KEY (--prefix), as etcdctl watch prints it: for each event a PUT or DELETE line, then
(--prev-kv) the key and value before the change when the key existed, then the key and
its value (empty after a DELETE), each on a line of its own, bytes as they are. It runs
until Ctrl-C (exit 0) or until the watch fails for good (exit 1, one line on stderr): a
--rev below the last compaction ("required revision has been compacted"), credentials
refused. When the member it reads from dies or the connection drops, it goes on through
another member from the revision after the last one printed: nothing missed, nothing
twice. Any member serves a watch, followers too.

--rev N starts at revision N (inclusive), from the history: the changes made since N
are printed first, then the new ones as they come. Without it: from now.

Not in raftkv watch: etcdctl's interactive mode (watch -i), running a command for each
event (watch KEY -- COMMAND), ETCDCTL_WATCH_KEY / ETCDCTL_WATCH_RANGE_END."""

EPILOG = """\
examples:
  raftkv watch cfg/app                    each change to one key
  raftkv watch --prefix cfg/ --prev-kv    the keys under cfg/, each with its value before
  raftkv watch a m                        the keys in [a, m)
  raftkv watch cfg/app --rev 42           from revision 42 on (the history first)
  raftkv watch --prefix '' -w json        every key, one JSON object a line"""

JSON_FORM = ('one etcdctl WatchResponse a line per event: {"Header": {"revision": R}, "Events": [{"type": 1 '
             'for DELETE (absent: PUT), "kv": KV, "prev_kv": KV (--prev-kv, when the key existed)}], '
             '"CompactRevision": 0, "Canceled": false, "Created": false}, a KV being {"key", "create_revision", '
             '"mod_revision", "version", "value", "lease"} (those not zero or empty; the key and value in '
             'base64; an event\'s kv has no lease)')


def add_watch_command(commands: Any, client_options: argparse.ArgumentParser) -> None:
    watch = commands.add_parser("watch", parents=[client_options], formatter_class=Formatter,
                                help="print the changes to a key, range or prefix as they happen (etcdctl watch)",
                                description=DESCRIPTION, epilog=EPILOG)
    watch.add_argument("key", metavar="KEY", help="the key, the first key of the range, or the prefix (--prefix)")
    watch.add_argument("range_end", metavar="RANGE_END", nargs="?", default=None,
                       help="watch the keys in [KEY, RANGE_END)")
    watch.add_argument("--prefix", action="store_true", help="watch the keys starting with KEY ('': every key)")
    watch.add_argument("--rev", type=non_negative_int, default=0, metavar="N",
                       help="start at revision N, from the history (etcdctl's --rev); 0: from now (default)")
    watch.add_argument("--prev-kv", action="store_true",
                       help="print each event's previous key and value too (when the key existed)")
    add_write_out(watch, SIMPLE, simple="etcdctl's lines: PUT or DELETE, [previous key, value,] key, value",
                  table=None, json=JSON_FORM)
    watch.set_defaults(run=_run_watch, command_parser=watch)


def _run_watch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.range_end is not None and args.prefix:
        parser.error("`range_end` and `--prefix` are mutually exclusive")  # etcdctl's words
    if args.range_end is not None:
        where: dict[str, str] = {"start": args.key, "end": args.range_end}
    else:
        where = {"prefix" if args.prefix else "key": args.key}
    show = _json_line if args.write_out == JSON else _simple_lines
    try:
        with client_of(args) as client, client.watch(**where, start_revision=args.rev or None,
                                                     prev_kv=args.prev_kv) as events:
            for event in events:
                sys.stdout.buffer.write(show(event))
                sys.stdout.buffer.flush()  # each event as it comes, to a pipe too
    except KeyboardInterrupt:  # Ctrl-C: the way a watch ends
        return 0
    except BrokenPipeError:  # `raftkv watch ... | head -3`: the reader is gone, and so is the need
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except grpc.RpcError as error:  # credentials refused (the watch's one error it does not translate)
        raise from_rpc_error(error) from None
    return 0


def _simple_lines(event: WatchEvent) -> bytes:
    """etcdctl's simple printer's Watch for one event."""
    lines = [event.type.encode()]
    if event.prev is not None:
        lines += [event.prev.key, event.prev.value]
    lines += [event.key, event.value]
    return b"".join(line + b"\n" for line in lines)


def _json_line(event: WatchEvent) -> bytes:
    """One etcdctl -w json WatchResponse holding the event."""
    found: dict[str, Any] = {"type": 1} if event.type == "DELETE" else {}
    found["kv"] = go_kv_json(KeyValue(event.key, event.value, event.create_revision, event.mod_revision,
                                      event.version))
    if event.prev is not None:
        found["prev_kv"] = go_kv_json(event.prev)
    response = {"Header": {"revision": event.mod_revision}, "Events": [found], "CompactRevision": 0,
                "Canceled": False, "Created": False}
    return json.dumps(response, separators=(",", ":")).encode() + b"\n"


def go_kv_json(kv: KeyValue) -> dict[str, Any]:
    """An mvccpb.KeyValue as Go's encoding/json writes it (etcdctl -w json): the fields in the
    proto's order, those that are zero or empty left out, bytes in base64."""
    fields = (("key", b64(kv.key) if kv.key else None), ("create_revision", kv.create_revision),
              ("mod_revision", kv.mod_revision), ("version", kv.version),
              ("value", b64(kv.value) if kv.value else None), ("lease", kv.lease))
    return {name: value for name, value in fields if value}
