"""The manifest: what a snapshot file contains, stored as JSON in the file's header.

The manifest is the only thing a reader needs to trust the payload: ``size`` and ``sha256``
describe the payload bytes exactly, ``index``/``term`` say which log entry the state includes last,
``members`` the member ids at that point and ``membership`` its configuration (voters, learners
and their peer addresses, as raft/core/membership.py encodes it; empty when the state never
applied one). ``cluster_id`` and ``created_at`` are for people
(`raftkv snapshot inspect`), not for the protocol: a restored cluster gets a new cluster id.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

# Version of the snapshot file (header + payload layout and manifest fields). A reader refuses
# any other version rather than guessing.
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class SnapshotManifest:
    index: int
    term: int
    members: tuple[str, ...]
    cluster_id: str
    size: int  # bytes of the state payload (the compacted LMDB data.mdb)
    sha256: str  # hex digest of the payload
    key_count: int
    membership: str = ""
    created_at: str = field(default_factory=lambda: utc_now_iso())
    format_version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        fields = asdict(self)
        fields["members"] = list(self.members)
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> SnapshotManifest:
        """Parse and type-check a manifest; ValueError names the first bad field."""
        try:
            fields = json.loads(raw.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"manifest is not valid JSON: {exc}") from None
        if not isinstance(fields, dict):
            raise ValueError("manifest is not a JSON object")
        return cls(
            index=_int(fields, "index"),
            term=_int(fields, "term"),
            members=tuple(_str_list(fields, "members")),
            cluster_id=_typed(fields, "cluster_id", str),
            size=_int(fields, "size"),
            sha256=_sha256(fields),
            key_count=_int(fields, "key_count"),
            membership=_typed(fields, "membership", str),
            created_at=_typed(fields, "created_at", str),
            format_version=_int(fields, "format_version"),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (for `inspect` and `--json` output)."""
        return json.loads(self.to_json())


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _typed(fields: dict[str, Any], name: str, kind: type) -> Any:
    if name not in fields:
        raise ValueError(f"manifest field {name!r} is missing")
    value = fields[name]
    # bool is an int in Python; a manifest saying "index": true is damaged, not 1.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"manifest field {name!r} should be {kind.__name__}, got {value!r}")
    return value


def _int(fields: dict[str, Any], name: str) -> int:
    value: int = _typed(fields, name, int)
    if value < 0:
        raise ValueError(f"manifest field {name!r} is negative ({value})")
    return value


def _str_list(fields: dict[str, Any], name: str) -> list[str]:
    value = _typed(fields, name, list)
    if not all(isinstance(item, str) for item in value):
        raise ValueError(f"manifest field {name!r} should list strings, got {value!r}")
    return value


def _sha256(fields: dict[str, Any]) -> str:
    value: str = _typed(fields, "sha256", str)
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"manifest field 'sha256' is not a hex sha256 digest: {value!r}")
    return value
