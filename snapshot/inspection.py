"""Describing a snapshot file (`raftkv snapshot inspect`): its manifest, whether its payload
verifies, and how many keys it really holds."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from snapshot.errors import SnapshotCorruptError
from snapshot.file_format import read_header
from snapshot.install import extract_state
from snapshot.state_payload import count_keys, store_revision


def inspect(snapshot_file: str | os.PathLike[str], work_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Describe a snapshot file: its manifest, whether the payload verifies, and the number of keys
    the payload really holds (counted by opening a verified copy read-only in a temporary directory
    under `work_dir`, default the system's). Raises SnapshotCorruptError only when even the header
    is unreadable; a short or damaged payload is reported as checksum_ok False with the reason."""
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
