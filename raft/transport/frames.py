"""Length-prefixed frames on a TCP byte stream: a 4-byte big-endian length, then that many bytes.

The peers' message connections carry one serialized MessageBatch per frame (and, from the
receiver back to the sender, at most one frame: why it closes the connection). A length above the
reader's limit is refused before any of the body is buffered, so a garbage header cannot make a
node allocate gigabytes."""
from __future__ import annotations

import struct

_HEADER = struct.Struct(">I")
HEADER_BYTES = _HEADER.size


class FrameError(ValueError):
    """The stream does not hold frames this reader accepts (a length over its limit)."""


def frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Feed it the bytes as they arrive; it returns the frames they complete, in order."""

    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        self._buf = bytearray()
        self._need: int | None = None  # body length of the frame being read, once its header is in

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        frames: list[bytes] = []
        start = 0
        while True:
            if self._need is None:
                if len(self._buf) - start < HEADER_BYTES:
                    break
                (length,) = _HEADER.unpack_from(self._buf, start)
                if length > self._max:
                    raise FrameError(f"a frame of {length} bytes is over the limit of {self._max}")
                self._need = length
                start += HEADER_BYTES
            if len(self._buf) - start < self._need:
                break
            frames.append(bytes(self._buf[start:start + self._need]))
            start += self._need
            self._need = None
        del self._buf[:start]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._buf)
