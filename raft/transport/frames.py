"""Length-prefixed frames on a TCP byte stream: a 4-byte big-endian length, then that many bytes.

Every frame on a peer connection is one serialized message (raft/transport/peer_protocol.py). A
length above the reader's limit is refused before any of the body is buffered, so a garbage
header cannot make a node allocate gigabytes; the first frame (a hello, from a dialer not yet
known to be a member) may be held to a lower limit than the frames after it."""
from __future__ import annotations

import struct

_HEADER = struct.Struct(">I")
HEADER_BYTES = _HEADER.size


class FrameError(ValueError):
    """The stream does not hold frames this reader accepts (a length over its limit). `frames`:
    those the same feed completed before the bad one, in order."""

    def __init__(self, message: str, frames: list[bytes]) -> None:
        super().__init__(message)
        self.frames = frames


def frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Feed it the bytes as they arrive; it returns the frames they complete, in order.
    `first_frame_bytes`: the limit of the first frame (default: `max_frame_bytes`)."""

    def __init__(self, max_frame_bytes: int, first_frame_bytes: int | None = None) -> None:
        self._max = max_frame_bytes
        self._limit = max_frame_bytes if first_frame_bytes is None else first_frame_bytes
        self._buf = bytearray()
        self._need: int | None = None  # body length of the frame being read, once its header is in

    def feed(self, data: bytes) -> list[bytes]:
        # Frames are sliced straight out of `data` when nothing is held from before (the usual
        # case: one copy per frame); only an incomplete frame's bytes are kept for the next feed.
        held = self._buf
        if held:
            held += data
            source: bytes | memoryview = memoryview(held)
        else:
            source = data
        frames: list[bytes] = []
        start, end, need = 0, len(source), self._need
        try:
            while True:
                if need is None:
                    if end - start < HEADER_BYTES:
                        break
                    (length,) = _HEADER.unpack_from(source, start)
                    if length > self._limit:
                        raise FrameError(f"a frame of {length} bytes is over the limit of {self._limit}", frames)
                    need = length
                    start += HEADER_BYTES
                if end - start < need:
                    break
                frames.append(bytes(source[start:start + need]))
                start += need
                need = None
                self._limit = self._max
        finally:
            self._need = need
            if held:
                source.release()  # type: ignore[union-attr]
                del held[:start]
            elif start < end:
                held += data[start:]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._buf)
