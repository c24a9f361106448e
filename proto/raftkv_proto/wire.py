"""Replies written as protobuf's wire bytes directly, where building the message first costs more
than the reply is worth (hand-written, not generated): a watch event encoded once for every
watch that gets it (kv/server/etcd_watch.py), and a Scan page.

A Scan page of 10,000 pairs of 1 KiB built as a ScanResponse copies each value into the message,
then again into the serialized bytes, whose buffer upb grows by doubling and copying: on a loaded
member that serialization took 29% of the leader's samples under W17's native lists (py-spy
--native: upb_BackAlloc_Grow and encode_scalar). Joined here, each value is copied once.
tests/unit/test_wire.py checks every writer against SerializeToString, byte for byte."""
from __future__ import annotations

from collections.abc import Iterable

_ONE_BYTE = [bytes([n]) for n in range(0x80)]

# kv.proto's field numbers: ScanResponse.items 1; KeyValue.key 1, KeyValue.value 2.
_ITEMS_TAG = b"\x0a"
_KEY_TAG = b"\x0a"
_VALUE_TAG = b"\x12"


def varint(n: int) -> bytes:
    """Protobuf's varint of an int64 (a negative one as its 64-bit two's complement)."""
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    n &= (1 << 64) - 1
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def length_prefixed(data: bytes) -> bytes:
    return varint(len(data)) + data


def scan_items(items: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
    """The `items` field of a ScanResponse, pair by pair, as SerializeToString writes it (an
    empty key or value is left out, as proto3 leaves it): the pieces to join, each value as it
    is, not copied."""
    parts: list[bytes] = []
    append = parts.append
    for key, value in items:
        head = (_KEY_TAG + varint(len(key)) + key if key else b"") + (_VALUE_TAG + varint(len(value)) if value else b"")
        append(_ITEMS_TAG + varint(len(head) + len(value)) + head)
        if value:
            append(value)
    return parts
