"""The Watch service's responses built from shared encoded parts (kv/server/etcd_watch.py,
EventEncoder): byte for byte what protobuf writes for the same WatchResponse, so a client cannot
tell them apart."""
from __future__ import annotations

import pytest

from kv.server import etcd_watch
from kv.server.etcd_watch import EventEncoder, event_message
from raftkv_proto import etcd_rpc_pb2 as pb
from statemachine.key_record import KeyVersion
from statemachine.mvcc import Change


class _Core:
    term = 7


class _Node:
    core = _Core()


class MemberFace:
    """What EventEncoder asks of the node's etcd face: its term, and a header filled as etcd's."""

    node = _Node()

    def header(self, header: pb.ResponseHeader, revision: int) -> None:
        header.cluster_id = 0xFEEDFACECAFEBEEF
        header.member_id = 12345
        header.raft_term = self.node.core.term
        header.revision = revision


# Three changes of one revision (one transaction), each with its sub.
PUT = Change(KeyVersion(b"a/1", b"v2", create_revision=3, mod_revision=9, version=2, lease=77, mod_sub=0),
             prev=KeyVersion(b"a/1", b"v1", create_revision=3, mod_revision=3, version=1))
CREATION = Change(KeyVersion(b"a/2", b"new", create_revision=9, mod_revision=9, version=1, mod_sub=1))
DELETE = Change(KeyVersion(b"a/3", b"", create_revision=0, mod_revision=9, version=0, mod_sub=2),
                prev=KeyVersion(b"a/3", b"old", create_revision=4, mod_revision=5, version=1))


def expected(watch_id: int, revision: int, changes: list[Change], with_prev: bool) -> bytes:
    """The response as one protobuf message per watch, serialized by protobuf."""
    response = pb.WatchResponse(watch_id=watch_id, events=[event_message(c, with_prev) for c in changes])
    MemberFace().header(response.header, revision)
    return response.SerializeToString()


@pytest.mark.parametrize("with_prev", [False, True])
@pytest.mark.parametrize("watch_id", [0, 1, 300, 2**40])
def test_a_response_is_byte_for_byte_what_protobuf_writes(watch_id: int, with_prev: bool) -> None:
    encoder = EventEncoder(MemberFace())  # type: ignore[arg-type]
    changes = [PUT, CREATION, DELETE]
    built = encoder.response(watch_id, 9, [encoder.event(c, with_prev) for c in changes])
    assert built == expected(watch_id, 9, changes, with_prev)
    parsed = pb.WatchResponse.FromString(built)
    assert [e.kv.key for e in parsed.events] == [b"a/1", b"a/2", b"a/3"]
    assert parsed.events[0].HasField("prev_kv") == with_prev
    assert not parsed.events[1].HasField("prev_kv")  # a creation has none, as etcd


def test_shared_parts_follow_the_revision_and_the_term() -> None:
    face = MemberFace()
    encoder = EventEncoder(face)  # type: ignore[arg-type]
    first = encoder.response(2, 9, [encoder.event(PUT, False)])
    assert pb.WatchResponse.FromString(first).header.raft_term == 7
    assert encoder.response(2, 10, []) == expected(2, 10, [], False)
    _Core.term = 8
    try:
        assert pb.WatchResponse.FromString(encoder.response(2, 10, [])).header.raft_term == 8
    finally:
        _Core.term = 7
    # A change's event with and without its previous version are kept apart.
    assert encoder.event(PUT, True) != encoder.event(PUT, False)


def test_two_changes_of_one_key_in_one_revision_are_told_apart() -> None:
    # A batch that deletes a key and writes it again: one revision, two subs.
    deleted = Change(KeyVersion(b"k", b"", create_revision=0, mod_revision=12, version=0, mod_sub=0))
    written = Change(KeyVersion(b"k", b"again", create_revision=12, mod_revision=12, version=1, mod_sub=1))
    encoder = EventEncoder(MemberFace())  # type: ignore[arg-type]
    events = [encoder.event(c, False) for c in (deleted, written)]
    assert events[0] != events[1]
    assert encoder.response(1, 12, events) == expected(1, 12, [deleted, written], False)


def test_kept_events_are_bounded_by_bytes_as_well_as_by_count(monkeypatch) -> None:
    monkeypatch.setattr(etcd_watch, "ENCODED_EVENTS_KEPT_BYTES", 10_000)
    encoder = EventEncoder(MemberFace())  # type: ignore[arg-type]
    big = [Change(KeyVersion(b"big/%d" % i, b"x" * 3_000, create_revision=20 + i, mod_revision=20 + i, version=1))
           for i in range(10)]
    for change in big:
        assert pb.WatchResponse.FromString(encoder.response(1, change.kv.mod_revision, [encoder.event(change, False)])
                                           ).events[0].kv.value == b"x" * 3_000
        assert encoder._events_bytes <= 10_000
