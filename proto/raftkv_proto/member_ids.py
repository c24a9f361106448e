"""etcd's uint64 ids for raftkv's names. raftkv names members (and clusters) by strings ("n1");
etcd by uint64: the first 8 bytes of the name's sha256, the same on every member, in every client,
and across restarts (docs/etcd-compatibility.md)."""
from __future__ import annotations

import hashlib


def member_number(name: str) -> int:
    """etcd's uint64 member (or cluster) id for a raftkv name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
