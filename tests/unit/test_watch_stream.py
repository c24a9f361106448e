"""A watch stream's queue (kv/server/etcd_watch.py): events a watch is handed while its stream
waits to send join one response (fewer, larger messages when a member fans out a busy prefix),
never past a response queued after them, never over the stream's response limit."""
from __future__ import annotations

import asyncio

from kv.server.etcd_watch import EventEncoder, _Watch, _WatchStream
from raftkv_proto import etcd_rpc_pb2 as pb
from statemachine.key_record import KeyVersion
from statemachine.mvcc import Change
from tests.unit.test_watch_encoding import MemberFace


def put(revision: int, value: bytes = b"v") -> Change:
    return Change(KeyVersion(b"a/%d" % revision, value, revision, revision, 1))


def watch(watch_id: int) -> _Watch:
    return _Watch(watch_id, None, frozenset(), prev_kv=False, fragment=False, progress_notify=False)  # type: ignore[arg-type]


def drain(stream: _WatchStream) -> list[pb.WatchResponse]:
    async def run() -> list[pb.WatchResponse]:
        out = []
        while stream._queue:
            response = await stream.next_response()
            out.append(pb.WatchResponse.FromString(response) if isinstance(response, bytes) else response)
        return out
    return asyncio.run(run())


def stream(max_bytes: int = 1 << 20) -> _WatchStream:
    face = MemberFace()
    return _WatchStream(face, None, None, max_bytes, EventEncoder(face))  # type: ignore[arg-type]


def test_a_waiting_watchs_revisions_join_one_response_in_order() -> None:
    s = stream()
    one, two = watch(1), watch(2)
    for revision in (5, 6, 7):
        s._deliver(one, [put(revision)], revision)
        s._deliver(two, [put(revision)], revision)
    responses = drain(s)
    assert [(r.watch_id, r.header.revision, [e.kv.mod_revision for e in r.events]) for r in responses] == \
        [(1, 7, [5, 6, 7]), (2, 7, [5, 6, 7])]
    assert responses[0].header.member_id == 12345


def test_events_never_overtake_a_response_queued_before_them() -> None:
    s = stream()
    one = watch(1)
    s._deliver(one, [put(5)], 5)
    s._send(pb.WatchResponse(watch_id=-1))  # a progress response: every event through 5 came before it
    s._deliver(one, [put(6)], 6)
    responses = drain(s)
    assert [(r.watch_id, [e.kv.mod_revision for e in r.events]) for r in responses] == [(1, [5]), (-1, []), (1, [6])]


def test_a_joined_response_stays_under_the_streams_limit() -> None:
    s = stream(max_bytes=1000)
    one = watch(1)
    for revision in range(1, 11):
        s._deliver(one, [put(revision, b"x" * 200)], revision)
    responses = drain(s)
    assert [e.kv.mod_revision for r in responses for e in r.events] == list(range(1, 11))
    assert len(responses) > 1 and all(r.ByteSize() < 1000 for r in responses)
