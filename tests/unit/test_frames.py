"""Length-prefixed frames: what arrives in pieces comes out whole and in order, and a length over
the limit is refused before its body is buffered."""
from __future__ import annotations

import pytest

from raft.transport.frames import HEADER_BYTES, FrameError, FrameReader, frame

BODIES = [b"", b"a", b"\x00" * 300, bytes(range(256)) * 40]


def test_frames_fed_byte_by_byte_come_out_whole_and_in_order() -> None:
    stream = b"".join(frame(b) for b in BODIES)
    reader = FrameReader(1 << 20)
    out: list[bytes] = []
    for i in range(len(stream)):
        out += reader.feed(stream[i:i + 1])
    assert out == BODIES
    assert reader.buffered == 0


def test_many_frames_in_one_read_and_a_partial_tail() -> None:
    stream = b"".join(frame(b) for b in BODIES) + frame(b"tail")
    reader = FrameReader(1 << 20)
    assert reader.feed(stream[:-2]) == BODIES
    assert reader.buffered == 2  # the header is read; two bytes of the body wait
    assert reader.feed(stream[-2:]) == [b"tail"]
    assert reader.buffered == 0


def test_a_length_over_the_limit_is_refused_from_the_header_alone() -> None:
    reader = FrameReader(100)
    assert reader.feed(frame(b"x" * 100)) == [b"x" * 100]
    with pytest.raises(FrameError, match="101 bytes is over the limit of 100"):
        reader.feed(frame(b"x" * 101)[:HEADER_BYTES])
    with pytest.raises(FrameError):
        FrameReader(1 << 20).feed(b"\xff\xff\xff\xff")
