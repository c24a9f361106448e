"""`raftkv snapshot save`, `inspect` and `restore`: back a cluster up to a file, check one, seed a
new cluster from one (raftkv's own files, and etcd 3.x snapshots for inspect and restore)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kv.client.client import Client
from kv.tools.arguments import Formatter
from kv.tools.client_options import EXIT_FAILED, SNAPSHOT_SAVE_TIMEOUT_S, client_of, client_options
from kv.tools.write_out import JSON, SIMPLE, TABLE, add_write_out, byte_progress, print_table
from raft.node.config import DEFAULT_LISTEN, DEFAULT_NODE_ID, parse_peers


def add_snapshot_commands(commands: Any) -> None:
    snap = commands.add_parser("snapshot", formatter_class=Formatter, help="save, inspect and restore snapshots",
                               description="Back up a cluster to a snapshot file, check one, or seed a new "
                                           "cluster from one.")
    actions = snap.add_subparsers(dest="action", metavar="ACTION", required=True)
    save = actions.add_parser("save", parents=[client_options(SNAPSHOT_SAVE_TIMEOUT_S)], formatter_class=Formatter,
                              help="stream a consistent snapshot from the leader to FILE",
                              description="Ask the leader for a snapshot holding every write acknowledged "
                                          "before this command (confirmed by a ReadIndex round), stream it to "
                                          "FILE and verify its size and sha256. A progress bar on stderr "
                                          "(its final state only when stderr is not a terminal).")
    save.add_argument("file", type=Path, metavar="FILE")
    save.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_write_out(save, SIMPLE, simple="one line: saved FILE: index, term, keys, bytes, sha256",
                  table=f"{', '.join(SNAPSHOT_COLUMNS)}",
                  json='{"file", "index", "term", "key_count", "size", "sha256"}')
    save.set_defaults(run=_run_snapshot_save, command_parser=save)
    inspect = actions.add_parser("inspect", formatter_class=Formatter,
                                 help="print a snapshot's manifest and key count, verify its checksum",
                                 description="A raftkv snapshot or an etcd 3.x snapshot (`etcdctl snapshot "
                                             "save`), told apart by content; for an etcd file the JSON adds "
                                             '"etcd": what `etcdctl snapshot status` reports (hash, revision, '
                                             "totalKey, totalSize). Exit code 1 when the file does not verify.")
    inspect.add_argument("file", type=Path, metavar="FILE")
    add_write_out(inspect, JSON, simple="the table's cells separated by ', ' (as etcdctl snapshot status)",
                  table=f"{', '.join(SNAPSHOT_COLUMNS)} and CHECKSUM (ok or bad)",
                  json='{"file", "manifest": {...}, "checksum_ok", "error", "key_count", "key_count_matches"}')
    inspect.set_defaults(run=_run_snapshot_inspect, command_parser=inspect)
    restore = actions.add_parser(
        "restore", formatter_class=Formatter, help="prepare a data directory for a new cluster from FILE",
        description="Create --data-dir (which must be empty or absent) so that `raftkv serve` with the same "
                    "--id, --peers and --data-dir starts a NEW cluster holding the snapshot's data. FILE is a "
                    "raftkv snapshot or an etcd 3.x snapshot (`etcdctl snapshot save`: keys with their "
                    "revisions and versions, history from the compacted revision, leases, users, roles and "
                    "the auth switch), told apart by content; a damaged or truncated file is refused and "
                    "nothing is written. The new "
                    "cluster gets a new cluster id, so it cannot be confused with the old one; for a multi-node "
                    "cluster restore every member from the same file with the same --cluster-id.",
        epilog="example, three members:\n"
               "  raftkv snapshot restore backup.snap --data-dir ./data/n1 --id n1 --peers $PEERS --cluster-id c-restored\n"
               "  (same for n2 and n3), then raftkv serve --id n1 --data-dir ./data/n1 --peers $PEERS")
    restore.add_argument("file", type=Path, metavar="FILE", help="a raftkv or an etcd 3.x snapshot")
    restore.add_argument("--data-dir", type=Path, required=True, help="the new member's data directory")
    restore.add_argument("--id", dest="node_id", default=DEFAULT_NODE_ID, help="the new member's id")
    restore.add_argument("--peers", default="", metavar="ID=HOST:PORT,...",
                         help="the new cluster's members and their peer addresses, as `raftkv serve --peers` "
                              "will name them (default: this one alone)")
    restore.add_argument("--cluster-id", default=None, help="the new cluster's id (default: a new random one)")
    restore.set_defaults(run=_run_snapshot_restore, command_parser=restore)


def _run_snapshot_save(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client, byte_progress(enabled=args.progress) as bar:
        task = bar.add_task("snapshot save", total=None)  # the size comes with the first chunk

        def progress(received: int, total: int) -> None:
            bar.update(task, completed=received, total=total)

        manifest = client.save_snapshot(args.file, timeout=args.timeout, progress=progress)
    size = args.file.stat().st_size
    if args.write_out == JSON:
        print(json.dumps({"file": str(args.file), "index": manifest["index"], "term": manifest["term"],
                          "key_count": manifest["key_count"], "size": size, "sha256": manifest["sha256"]}))
    elif args.write_out == TABLE:
        print_table(SNAPSHOT_COLUMNS, [_snapshot_cells(args.file, manifest, manifest["key_count"], size)])
    else:
        print(f"saved {args.file}: index {manifest['index']} term {manifest['term']}, {manifest['key_count']} keys, "
              f"{size} bytes, payload sha256 {manifest['sha256']}")
    return 0


SNAPSHOT_COLUMNS = ("FILE", "INDEX", "TERM", "KEYS", "BYTES", "SHA256")


def _snapshot_cells(file: Path, manifest: dict[str, Any], key_count: Any, size: int) -> list[str]:
    """A row of SNAPSHOT_COLUMNS; '-' for what a damaged file's manifest lacks."""
    return [str(file), *(str(manifest.get(field, "-")) for field in ("index", "term")), str(key_count), str(size),
            str(manifest.get("sha256", "-"))]


def _run_snapshot_inspect(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    report = Client.inspect_snapshot(args.file)
    ok = bool(report.get("checksum_ok")) and not report.get("error")
    if args.write_out == JSON:
        print(json.dumps(report, indent=2, default=str))
    else:
        cells = [*_snapshot_cells(args.file, report.get("manifest") or {}, report.get("key_count", "-"),
                                  args.file.stat().st_size),
                 "ok" if ok else f"bad: {report.get('error') or 'checksum mismatch'}"]
        if args.write_out == TABLE:
            print_table((*SNAPSHOT_COLUMNS, "CHECKSUM"), [cells])
        else:
            print(", ".join(cells))
    return 0 if ok else EXIT_FAILED


def _run_snapshot_restore(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    peers = parse_peers(args.peers) if args.peers else {args.node_id: DEFAULT_LISTEN}
    cluster_id = Client.restore_snapshot(args.file, args.data_dir, args.node_id, peers, args.cluster_id)
    peer_flag = f" --peers {args.peers}" if args.peers else ""
    print(f"restored {args.file} into {args.data_dir} (new cluster id {cluster_id}); start it with:\n"
          f"  raftkv serve --id {args.node_id} --data-dir {args.data_dir}{peer_flag} --cluster-id {cluster_id}")
    return 0


