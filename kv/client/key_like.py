"""What the client takes for a key or a value: bytes, or str (UTF-8)."""
from __future__ import annotations

KeyLike = str | bytes | bytearray | memoryview


def to_bytes(value: KeyLike, what: str = "key") -> bytes:
    """Keys and values travel as bytes; str is UTF-8 encoded."""
    if type(value) is bytes:  # the common case, and immutable: no copy
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be str or bytes, not {type(value).__name__}")
