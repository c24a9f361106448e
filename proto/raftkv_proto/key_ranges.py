"""Key-range conventions of the wire protocol, shared by clients and nodes (hand-written, not
generated): a prefix stands for the range [prefix, prefix_end(prefix))."""
from __future__ import annotations


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with `prefix` (b"" when there is none)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return b""
    return trimmed[:-1] + bytes([trimmed[-1] + 1])
