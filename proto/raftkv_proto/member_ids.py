"""etcd's uint64 ids for raftkv's names. raftkv names members (and clusters) by strings ("n1");
etcd by uint64: the first 8 bytes of the name's sha256, the same on every member, in every client,
and across restarts (docs/etcd-compatibility.md)."""
from __future__ import annotations

import hashlib


# A name that stands for an etcd id no member has (an alarm raised through etcd's API for member 0,
# python-etcd3's default): "#" and the id in hex. A member's name starts with a letter or digit.
_NUMBERED = "#"


def member_number(name: str) -> int:
    """etcd's uint64 member (or cluster) id for a raftkv name."""
    if name.startswith(_NUMBERED):
        return int(name[1:], 16)
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")


def numbered_name(number: int) -> str:
    """The name that stands for etcd id `number` where no member has it (member_number's inverse)."""
    return f"{_NUMBERED}{number:016x}"
