"""Describing a snapshot file (`raftkv snapshot inspect`): its manifest, whether its payload
verifies, and how many keys it really holds; for an etcd snapshot (snapshot/etcd_file.py), what
`etcdctl snapshot status` reports, the store's revision and its live keys."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from snapshot.errors import SnapshotCorruptError
from snapshot.etcd_file import is_etcd_snapshot, live_keys, open_etcd_snapshot, status
from snapshot.file_format import read_header
from snapshot.install import extract_state
from snapshot.state_payload import count_keys, store_revision


def inspect(snapshot_file: str | os.PathLike[str], work_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Describe a snapshot file: its manifest, whether the payload verifies, and the number of keys
    the payload really holds (counted by opening a verified copy read-only in a temporary directory
    under `work_dir`, default the system's). Raises SnapshotCorruptError only when even the header
    is unreadable; a short or damaged payload is reported as checksum_ok False with the reason."""
    if is_etcd_snapshot(snapshot_file):
        return inspect_etcd(snapshot_file)
    manifest, _ = read_header(snapshot_file)
    report: dict[str, Any] = {
        "file": str(snapshot_file), "manifest": manifest.to_dict(),
        "checksum_ok": False, "error": None, "key_count": None, "key_count_matches": None, "revision": None,
    }
    with tempfile.TemporaryDirectory(prefix="raftkv-inspect-", dir=work_dir) as tmp:
        state = Path(tmp) / "state"
        try:
            extract_state(snapshot_file, state)
        except SnapshotCorruptError as exc:
            report["error"] = str(exc)
            return report
        report["checksum_ok"] = True
        report["key_count"] = count_keys(state)
        report["revision"] = store_revision(state)
    report["key_count_matches"] = report["key_count"] == manifest.key_count
    return report


def inspect_etcd(snapshot_file: str | os.PathLike[str]) -> dict[str, Any]:
    """Describe an etcd snapshot: format "etcd", etcdctl's status ("etcd": hash, revision,
    totalKey, totalSize), the live keys, and whether the file (its sum and every page) checks."""
    report: dict[str, Any] = {"file": str(snapshot_file), "format": "etcd", "manifest": None, "checksum_ok": False,
                              "error": None, "key_count": None, "revision": None, "etcd": None}
    try:
        with open_etcd_snapshot(snapshot_file) as db:
            etcd = status(db)
            report["key_count"] = live_keys(db)
    except SnapshotCorruptError as exc:
        report["error"] = str(exc)
        return report
    report.update(checksum_ok=True, revision=etcd.revision, etcd=etcd.to_dict())
    return report
