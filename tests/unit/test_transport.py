"""The peer transport: the codec round trip, and the TCP transport (raft/transport/tcp_transport.py)
between real sockets on 127.0.0.1 - messages in order, refused hellos and bad bytes answered with
a reason and a close, snapshot streams and their acks, unreachable peers, the client addresses
members tell each other in the handshake, and the round trips each member times to its peers."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import uvloop

from raftkv_proto import raft_pb2
from raft.core.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    Message,
    PushCode,
    PushRequest,
    PushResponse,
    PushType,
    TimeoutNowRequest,
    VoteRequest,
    VoteResponse,
)
from raft.core.config import CoreConfig
from raft.core.membership import Membership
from raft.core.types import Entry, EntryType, SnapshotMeta
from raft.node.config import NodeConfig, Security
from raft.node.ports import ClientAddresses, SnapshotInfo
from raft.transport import peer_listener
from raft.transport.codec import CodecError, encode_batch, from_proto, pack_entries, to_proto
from raft.transport.frames import FrameError, FrameReader, frame
from raft.transport.peer_links import PeerLinks
from raft.transport.peer_listener import PeerListener
from raft.transport.peer_protocol import MAX_FRAME_BYTES, MESSAGES, PROBE, SNAPSHOT, hello
from raft.transport.refusal_log import RefusalLog, Say
from raft.transport.tcp_transport import TcpTransport
from kv.tools.cluster_up import free_ports

H = {"src": "n1", "dst": "n2", "term": 7}
APPEND = PushRequest(**H, type=PushType.APPEND, pre_index=10, pre_term=5, commit_index=9,
                     entries=[Entry(11, 7, EntryType.NOOP, b""), Entry(12, 7, EntryType.NORMAL, b"\x00cmd\xff")])

EVERY_MESSAGE: list[Message] = [
    VoteRequest(**H, last_log_index=12, last_log_term=6, pre_vote=True),
    VoteRequest(**H, last_log_index=12, last_log_term=6, transfer=True),
    TimeoutNowRequest(**H),
    VoteResponse(**H, granted=True, pre_vote=True),
    HeartbeatRequest(**H, commit_index=11, seq=99),
    HeartbeatResponse(**H, success=True, seq=99, end_index=12),
    APPEND,
    PushRequest(**H, type=PushType.TRUNCATE, truncate_index=8, truncate_term=4),
    PushResponse(**H, type=PushType.COMPARE, code=PushCode.INCONSISTENT, pre_index=10, index=3,
                 end_index=9, x_term=4, x_index=6),
    InstallSnapshotRequest(**H, meta=SnapshotMeta(100, 6, Membership({"n1": "a:1", "n2": "b:2"}, {"n3": "c:3"}).encode())),
    InstallSnapshotResponse(**H, success=True, index=100, end_index=100),
]

# ---- the codec -----------------------------------------------------------------------------------


@pytest.mark.parametrize("msg", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_codec_round_trip(msg: Message) -> None:
    wire = to_proto(msg).SerializeToString()
    back = from_proto(raft_pb2.PeerMessage.FromString(wire))
    assert type(back) is type(msg)
    assert dataclasses.asdict(back) == dataclasses.asdict(msg)


def test_a_batch_is_its_messages_in_order() -> None:
    batch = raft_pb2.MessageBatch.FromString(encode_batch(EVERY_MESSAGE))
    assert [dataclasses.asdict(from_proto(pm)) for pm in batch.messages] == [dataclasses.asdict(m) for m in EVERY_MESSAGE]


def test_packed_entries_take_one_field() -> None:
    assert to_proto(APPEND).push_request.entries == pack_entries(APPEND.entries)
    assert to_proto(PushRequest(**H, type=PushType.COMMIT)).push_request.entries == b""


@pytest.mark.parametrize("cut, words", [
    (lambda b: b[:10], "inside an entry's header"),
    (lambda b: b[:-1], "claims 5 payload bytes; 4 are left"),
    (lambda b: b[:16] + b"\x09" + b[17:], "unknown EntryType value 9"),
], ids=["header", "payload", "type"])
def test_codec_refuses_broken_packed_entries(cut: Any, words: str) -> None:
    packed = pack_entries([Entry(12, 7, EntryType.NORMAL, b"\x00cmd\xff")])
    bad = raft_pb2.PeerMessage(src="n1", dst="n2", term=7, push_request=raft_pb2.PushRequest(entries=cut(packed)))
    with pytest.raises(CodecError, match=words):
        from_proto(bad)


def test_codec_covers_every_body_case() -> None:
    cases = {to_proto(m).WhichOneof("body") for m in EVERY_MESSAGE}
    assert cases == {f.name for f in raft_pb2.PeerMessage.DESCRIPTOR.oneofs_by_name["body"].fields}


def test_codec_refuses_bodyless_and_unknown_enum() -> None:
    with pytest.raises(CodecError):
        from_proto(raft_pb2.PeerMessage(src="n1", dst="n2", term=1))
    bad = raft_pb2.PeerMessage(src="n1", dst="n2", term=1, push_request=raft_pb2.PushRequest(type=42))
    with pytest.raises(CodecError):
        from_proto(bad)


# ---- frames ------------------------------------------------------------------------------------

def test_frames_come_whole_from_any_split_of_the_bytes() -> None:
    data = frame(b"one") + frame(b"") + frame(b"three" * 100)
    for cut in range(len(data) + 1):
        reader = FrameReader(1 << 10)
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) == [b"one", b"", b"three" * 100]
        assert reader.buffered == 0


def test_the_first_frame_has_its_own_limit_and_an_error_keeps_the_frames_before_it() -> None:
    reader = FrameReader(1 << 10, first_frame_bytes=8)
    with pytest.raises(FrameError, match="over the limit of 8"):
        reader.feed(frame(b"x" * 9))
    reader = FrameReader(1 << 10, first_frame_bytes=8)
    assert reader.feed(frame(b"hello") + frame(b"y" * 500)) == [b"hello", b"y" * 500]
    with pytest.raises(FrameError, match="over the limit of 1024") as error:
        reader.feed(frame(b"z") + struct.pack(">I", 1025))
    assert error.value.frames == [b"z"]


# ---- two transports on 127.0.0.1 -----------------------------------------------------------------

CLUSTER = "c1"
WAIT_S = 10.0


class Recorder:
    """The node's side (raft.node.ports.Inbound): what the transport hands over."""

    def __init__(self) -> None:
        self.delivered: list[Message] = []
        self.gone: list[str] = []
        self.removed: list[str] = []  # why peers refused us as a removed member
        self.changed = asyncio.Event()  # set on everything that arrives
        self.snapshots: list[dict[str, Any]] = []
        self.snapshot_answer = (True, "")
        self.gate: asyncio.Event | None = None  # held after the first chunk until set
        self.stop_after_chunks: int | None = None

    def step(self, messages: list[Message]) -> None:
        self.delivered.extend(messages)
        self.changed.set()

    def peer_unreachable(self, peer: str) -> None:
        self.gone.append(peer)
        self.changed.set()

    def removed_from_cluster(self, why: str) -> None:
        self.removed.append(why)
        self.changed.set()

    async def receive_snapshot(self, leader: str, term: int, meta: SnapshotMeta, total_size: int, sha256: str,
                               chunks: AsyncIterator[tuple[int, bytes, bool]]) -> tuple[bool, str]:
        record: dict[str, Any] = dict(leader=leader, term=term, meta=meta, total_size=total_size, sha256=sha256,
                                      chunks=[], error=None)
        self.snapshots.append(record)
        self.changed.set()
        try:
            async for chunk in chunks:
                record["chunks"].append(chunk)
                self.changed.set()
                if self.gate is not None and len(record["chunks"]) == 1:
                    await self.gate.wait()
                if self.stop_after_chunks is not None and len(record["chunks"]) >= self.stop_after_chunks:
                    return False, "a newer snapshot is already here"
        except Exception as e:  # noqa: BLE001 - as the node's snapshot driver: a broken stream is a refusal
            record["error"] = str(e)
            self.changed.set()
            return False, str(e)
        return self.snapshot_answer


async def until(predicate: Callable[[], Any], event: asyncio.Event, timeout: float = WAIT_S) -> None:
    """Wait until `predicate()` holds, checking each time `event` is set."""
    async with asyncio.timeout(timeout):
        while not predicate():
            event.clear()
            if predicate():
                return
            await event.wait()


class Node:
    """A TcpTransport for `node_id` over a Recorder, its peer listener on a free port."""

    def __init__(self, node_id: str, peers: dict[str, str], cluster_id: str = CLUSTER,
                 advertise: str | None = None, port: int = 0, disk: tuple[int, int, int] = (0, 0, 0),
                 core: CoreConfig | None = None, security: Security | None = None,
                 round_trip_every_s: float = 5.0, http: str = "") -> None:
        peers = {**peers, node_id: f"127.0.0.1:{port}"}
        self.config = NodeConfig(node_id=node_id, listen="127.0.0.1:7001", advertise_client=advertise or
                                 f"client-of-{node_id}.example:7001", peers=peers, core=core or CoreConfig(),
                                 security=security or Security(), listen_client_http_urls=http)
        self.disk = disk  # what it answers a probe: (term, last log term, last log index)
        self.transport = TcpTransport(self.config, cluster_id, lambda: self.disk, round_trip_every_s)
        self.inbound = Recorder()

    async def __aenter__(self) -> Node:
        await self.transport.start(self.inbound)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.transport.close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.transport.peer_port}"

    @property
    def port(self) -> int:
        return self.transport.peer_port

    def link(self, peer: str) -> Any:
        return self.transport.links.link(peer)

    async def link_settles(self, peer: str, predicate: Callable[[Any], bool]) -> None:
        link = self.link(peer)
        await until(lambda: predicate(link), link.checked)


def _run(main: Callable[[], Any]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


def heartbeat(seq: int, src: str = "n1", dst: str = "n2", term: int = 3) -> HeartbeatRequest:
    return HeartbeatRequest(src=src, dst=dst, term=term, commit_index=seq, seq=seq)


def test_messages_arrive_in_order_and_members_learn_each_others_client_addresses() -> None:
    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1", "n3": "127.0.0.1:1"}, http="http://127.0.0.1:9102") as n2:
            # n1's gateway binds every interface: it advertises its client host with the gateway's port.
            async with Node("n1", {"n2": n2.address, "n3": "127.0.0.1:1"}, http="http://0.0.0.0:9101") as n1:
                assert n1.transport.client_http_address("n1") == "client-of-n1.example:9101"
                assert n1.transport.client_http_address("n2") is None
                assert n1.transport.client_address("n1") == "client-of-n1.example:7001"
                assert n1.transport.client_address("n2") is None  # no handshake yet
                # Queued while the link connects, then written straight onto the connection.
                n1.transport.send([heartbeat(i) for i in range(20)] + [APPEND])
                for i in range(20, 40):
                    n1.transport.send([heartbeat(i)])
                await n1.link_settles("n2", lambda link: link.connection is not None)
                for i in range(40, 200):
                    n1.transport.send([heartbeat(i)])
                await until(lambda: len(n2.inbound.delivered) == 201, n2.inbound.changed)
                seqs = [m.seq for m in n2.inbound.delivered if isinstance(m, HeartbeatRequest)]
                assert seqs == list(range(200))
                push = n2.inbound.delivered[20]
                assert dataclasses.asdict(push) == dataclasses.asdict(APPEND)
                # Each side learnt the other's advertised client address from the handshake.
                assert n2.transport.client_address("n1") == "client-of-n1.example:7001"
                assert n1.transport.client_address("n2") == "client-of-n2.example:7001"
                assert n1.transport.client_address("n3") is None and n1.transport.client_address("n9") is None
                # And each side's gateway address, the dialer's in its hello, the listener's in its reply.
                assert n2.transport.client_http_address("n1") == "client-of-n1.example:9101"
                assert n1.transport.client_http_address("n2") == "127.0.0.1:9102"
                assert n1.transport.links.dropped("n2") == 0 and n1.inbound.gone == []

    _run(main)


@pytest.mark.parametrize("case, reason", [
    ("wrong cluster", "wrong cluster id: got 'other', this cluster is 'c1'"),
    ("removed member", "n9 was removed from this cluster"),
    ("wrong addressee", "message for 'n3' reached 'n2': check --peers addresses"),
])
def test_a_refused_hello_is_logged_once_with_its_reason(caplog: pytest.LogCaptureFixture, case: str,
                                                        reason: str) -> None:
    caplog.set_level(logging.INFO, logger="raft.transport.peer_links")
    caplog.set_level(logging.INFO, logger="raft.transport.peer_listener")

    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
            sender, dst, cluster = {"wrong cluster": ("n1", "n2", "other"), "removed member": ("n9", "n2", CLUSTER),
                                    "wrong addressee": ("n1", "n3", CLUSTER)}[case]
            n2.transport.reconfigure({}, ["n9"])
            async with Node(sender, {dst: n2.address}, cluster_id=cluster) as dialer:
                dialer.transport.send([heartbeat(1, src=sender, dst=dst)])
                await dialer.link_settles(dst, lambda link: link.last_refusal is not None)
                for _ in range(3):  # the link dials again and is refused again: no new log line
                    link = dialer.link(dst)
                    link.checked.clear()
                    await asyncio.wait_for(link.checked.wait(), WAIT_S)
                    dialer.transport.send([heartbeat(2, src=sender, dst=dst)])
                refusals = [r.getMessage() for r in caplog.records if "refused our connection" in r.getMessage()]
                assert len(refusals) == 1 and reason in refusals[0], refusals
                # The listener says it once too, not once per attempt.
                listened = [r.getMessage() for r in caplog.records if r.name == "raft.transport.peer_listener"]
                assert len(listened) == 1 and reason in listened[0], listened
                assert link.reachable is not True and link.connection is None
                assert dialer.inbound.gone == []  # up but refusing: not gone
                # Only a removed member is told to stop.
                if case == "removed member":
                    assert dialer.inbound.removed and all(reason in why for why in dialer.inbound.removed)
                else:
                    assert dialer.inbound.removed == []
                assert n2.inbound.delivered == []
                assert n2.transport.client_address(sender) is None

    _run(main)


def test_a_member_removed_while_connected_is_told_so_and_its_connection_closed() -> None:
    """n1 holds an open MESSAGES connection to n2 when n2 sees it removed: a hello is never asked
    of it again, so n2 closes that connection; n1 dials again, is refused as a removed member and
    told so (its node stops). Otherwise its messages on the open connection would be taken in
    silence, and a removed follower that already held its links would run on for ever."""
    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
            async with Node("n1", {"n2": n2.address}) as n1:
                n1.transport.send([heartbeat(1)])
                await n1.link_settles("n2", lambda link: link.connection is not None)
                await until(lambda: len(n2.inbound.delivered) == 1, n2.inbound.changed)
                n2.transport.reconfigure({}, ["n1"])
                await until(lambda: n1.inbound.removed, n1.inbound.changed)
                assert all("n1 was removed from this cluster" in why for why in n1.inbound.removed)
                n1.transport.send([heartbeat(2)])
                assert n1.link("n2").connection is None and len(n2.inbound.delivered) == 1

    _run(main)


async def raw_exchange(port: int, data: bytes) -> tuple[list[bytes], bool]:
    """Send raw bytes to a peer port; the frames the listener sends back, and whether it then
    closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        received = await asyncio.wait_for(reader.read(), WAIT_S)  # to EOF: the listener closes
        return FrameReader(1 << 20).feed(received), reader.at_eof()
    finally:
        writer.close()


def hello_frame(from_id: str = "n1", to_id: str = "n2", purpose: int = MESSAGES, cluster: str = CLUSTER) -> bytes:
    return frame(hello(cluster, from_id, to_id, ClientAddresses("client-of-raw:1"), purpose).SerializeToString())


def batch_frame(*messages: raft_pb2.PeerMessage) -> bytes:
    return frame(raft_pb2.MessageBatch(messages=list(messages)).SerializeToString())


def test_bad_bytes_on_the_peer_port_get_a_reason_and_a_close_and_the_node_serves_on() -> None:
    hb = to_proto(heartbeat(1))
    bad_cases: list[tuple[bytes, str, str]] = [
        # Before a hello: the answer is a PeerHelloReply with the refusal.
        (b"\x00\x00\x00\x04\xff\xff\xff\xff", "hello", "malformed hello"),
        (b"\xff\xff\xff\xff", "hello", "over the limit of 65536"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "hello", "a gRPC client connected to it"),
        (hello_frame(purpose=raft_pb2.PURPOSE_UNSPECIFIED), "hello", "no known purpose"),
        (hello_frame(from_id="n2"), "hello", "a connection from 'n2' to itself"),
        # After an accepted hello: the answer, then a Refusal.
        (hello_frame() + frame(b"\xff\xff\xff\xff garbage"), "batch", "malformed peer message"),
        (hello_frame() + struct.pack(">I", MAX_FRAME_BYTES + 1), "batch", "over the limit"),
        (hello_frame() + batch_frame(to_proto(heartbeat(1, src="n3"))), "batch", "a message from 'n3'"),
        (hello_frame() + batch_frame(to_proto(heartbeat(1, dst="n3"))), "batch", "reached 'n2'"),
        (hello_frame() + batch_frame(raft_pb2.PeerMessage(src="n1", dst="n2", term=1)), "batch", "has no body"),
    ]

    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
            for data, stage, words in bad_cases:
                frames, closed = await raw_exchange(n2.port, data)
                assert closed, words
                if stage == "hello":
                    assert len(frames) == 1
                    assert words in raft_pb2.PeerHelloReply.FromString(frames[0]).refusal, words
                else:
                    assert len(frames) == 2
                    assert raft_pb2.PeerHelloReply.FromString(frames[0]).node_id == "n2"
                    assert words in raft_pb2.Refusal.FromString(frames[1]).reason, words
            assert n2.inbound.delivered == []
            # A good batch with a bad one behind it in the same write: the good one (whole) is
            # delivered, the bad one refused, and then the connection is closed.
            frames, closed = await raw_exchange(n2.port, hello_frame() + batch_frame(hb) +
                                                batch_frame(to_proto(heartbeat(2, src="n3"))))
            assert closed and "a message from 'n3'" in raft_pb2.Refusal.FromString(frames[1]).reason
            assert [m.seq for m in n2.inbound.delivered] == [1]  # type: ignore[attr-defined]
            # The listener serves on: a transport's connection is accepted and delivered.
            async with Node("n1", {"n2": n2.address}) as n1:
                n1.transport.send([heartbeat(3)])
                await until(lambda: len(n2.inbound.delivered) == 2, n2.inbound.changed)

    _run(main)


def test_a_dialer_refused_again_and_again_is_logged_once_a_minute_with_the_count(
        caplog: pytest.LogCaptureFixture) -> None:
    """Many bad hellos from one member: one line, then nothing until a minute has passed on the
    listener's clock (injected: no sleeping), then one line with how many went unlogged."""
    caplog.set_level(logging.INFO, logger="raft.transport.peer_listener")
    now = [1000.0]

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "raft.transport.peer_listener"]

    async def main() -> None:
        listener = PeerListener("n2", CLUSTER, ClientAddresses("client:1"), lambda m: None, Recorder().receive_snapshot,
                                lambda member, address: None, lambda: (0, 0, 0), clock=lambda: now[0])
        port = await listener.start("127.0.0.1", 0)
        wrong_cluster = hello_frame(cluster="other")
        try:
            for _ in range(50):
                frames, closed = await raw_exchange(port, wrong_cluster)
                assert closed and "wrong cluster id" in raft_pb2.PeerHelloReply.FromString(frames[0]).refusal
                now[0] += 0.5  # 25 s in all
            assert len(lines()) == 1 and "wrong cluster id: got 'other'" in lines()[0], lines()
            # Another reason from the same member is news: logged at once.
            await raw_exchange(port, hello_frame(to_id="n3"))
            assert len(lines()) == 2 and "check --peers addresses" in lines()[1]
            now[0] += 35.0  # 60 s after the first line
            await raw_exchange(port, wrong_cluster)
            assert len(lines()) == 3, lines()
            assert lines()[2].endswith("(refused 49 more times in the last 60 s)"), lines()[2]
            # The window starts again from that line.
            for _ in range(10):
                await raw_exchange(port, wrong_cluster)
            assert len(lines()) == 3
            # Once the member is accepted, its next refusal is logged at once, with no count.
            frames, _ = await raw_exchange(port, hello_frame(purpose=PROBE))
            assert raft_pb2.PeerHelloReply.FromString(frames[0]).node_id == "n2"
            await raw_exchange(port, wrong_cluster)
            assert len(lines()) == 4 and not lines()[3].endswith("s)"), lines()
        finally:
            await listener.close()

    _run(main)


def test_the_refusal_log_counts_per_source_and_reason_and_stays_bounded() -> None:
    log = RefusalLog(window_s=60.0, max_remembered=2)
    assert log.note("n1", "why", 0.0) == Say()
    assert [log.note("n1", "why", t) for t in (1.0, 2.0, 59.9)] == [None] * 3
    assert log.note("n3", "why", 3.0) == Say()  # another source: its own window
    said = log.note("n1", "why", 70.0)
    assert said == Say(3, 70.0) and said.suffix() == " (refused 3 more times in the last 70 s)"
    # A single refusal long after the last line says no count: nothing was left unsaid.
    assert log.note("n1", "why", 500.0) == Say(0, 430.0) and Say(0, 430.0).suffix() == ""
    assert Say(1, 61.0).suffix() == " (refused 1 more time in the last 61 s)"
    # Past max_remembered sources all are forgotten: each is then news once more.
    log.note("10.0.0.9", "malformed hello", 501.0)
    assert log.note("n1", "why", 502.0) == Say()


def test_a_connection_that_never_says_hello_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_listener, "HELLO_TIMEOUT_S", 0.2)

    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
            frames, closed = await raw_exchange(n2.port, b"")
            assert closed and "no hello within" in raft_pb2.PeerHelloReply.FromString(frames[0]).refusal

    _run(main)


def snapshot_info(size: int) -> SnapshotInfo:
    return SnapshotInfo(index=50, term=4, path=Path("/nowhere"), file_size=size, sha256="ab" * 32)


async def file_chunks(pieces: list[bytes]) -> AsyncIterator[tuple[int, bytes, bool]]:
    offset = 0
    for i, data in enumerate(pieces):
        yield offset, data, i == len(pieces) - 1
        offset += len(data)


META = SnapshotMeta(50, 4, Membership.of_voters({"n1": "a:1", "n2": "b:2"}).encode())


def test_a_snapshot_travels_in_chunks_on_its_own_connection_and_gets_its_ack() -> None:
    pieces = [bytes([i]) * (1000 + i) for i in range(6)]

    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2, Node("n1", {"n2": n2.address}) as n1:
            n2.inbound.gate = asyncio.Event()  # the node holds the stream after its first chunk
            sending = asyncio.create_task(n1.transport.send_snapshot(
                "n2", 9, META, snapshot_info(sum(map(len, pieces))), file_chunks(pieces), timeout_s=WAIT_S))
            await until(lambda: n2.inbound.snapshots and n2.inbound.snapshots[0]["chunks"], n2.inbound.changed)
            # Meanwhile messages flow on the link's own connection.
            n1.transport.send([heartbeat(1)])
            await until(lambda: n2.inbound.delivered, n2.inbound.changed)
            assert not sending.done()
            n2.inbound.gate.set()
            assert await sending == (True, "")
            record = n2.inbound.snapshots[0]
            assert (record["leader"], record["term"], record["meta"]) == ("n1", 9, META)
            assert (record["total_size"], record["sha256"]) == (sum(map(len, pieces)), "ab" * 32)
            assert record["chunks"] == [c async for c in file_chunks(pieces)]
            assert n1.transport.client_address("n2") == "client-of-n2.example:7001"
            # The node's verdict goes back as it is, also a refusal part way through the stream.
            n2.inbound.snapshot_answer = (False, "the term is stale")
            assert await n1.transport.send_snapshot("n2", 9, META, snapshot_info(6), file_chunks([b"abc", b"def"]),
                                                    WAIT_S) == (False, "the term is stale")
            n2.inbound.stop_after_chunks = 1
            many = [b"x" * 100_000] * 200
            assert await n1.transport.send_snapshot("n2", 9, META, snapshot_info(20_000_000), file_chunks(many),
                                                    WAIT_S) == (False, "a newer snapshot is already here")

    _run(main)


def test_a_snapshot_stream_that_breaks_off_is_refused_and_the_sender_hears_why() -> None:
    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
            header = raft_pb2.SnapshotHeader(term=9, meta=raft_pb2.SnapshotMeta(index=50, term=4), total_size=10)
            chunk = raft_pb2.SnapshotChunk(offset=0, data=b"01234")
            _, writer = await asyncio.open_connection("127.0.0.1", n2.port)
            writer.write(hello_frame(purpose=SNAPSHOT) + frame(header.SerializeToString()) +
                         frame(chunk.SerializeToString()))
            await until(lambda: n2.inbound.snapshots and n2.inbound.snapshots[0]["chunks"], n2.inbound.changed)
            writer.close()
            await until(lambda: n2.inbound.snapshots[0]["error"], n2.inbound.changed)
            assert "closed in the middle of a snapshot stream" in n2.inbound.snapshots[0]["error"]
            # Bytes that are no frame where the header should be: an ack that says so.
            frames, closed = await raw_exchange(n2.port, hello_frame(purpose=SNAPSHOT) + b"\xff\xff\xff\xff")
            ack = raft_pb2.SnapshotAck.FromString(frames[1])
            assert closed and not ack.success and "malformed snapshot stream" in ack.message
            # A chunk that does not decode ends the stream with an ack that says so.
            frames, closed = await raw_exchange(n2.port, hello_frame(purpose=SNAPSHOT) +
                                                frame(header.SerializeToString()) + frame(b"\xff\xff\xff"))
            ack = raft_pb2.SnapshotAck.FromString(frames[1])
            assert closed and not ack.success and "malformed snapshot chunk" in ack.message

    _run(main)


def test_a_refused_connection_reports_the_peer_unreachable_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="raft.transport.peer_links")

    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
            address = n2.address
        # n2 is gone: its port refuses connections.
        async with Node("n1", {"n2": address}) as n1:
            n1.transport.send([heartbeat(1)])
            await until(lambda: len(n1.inbound.gone) >= 3, n1.inbound.changed)
            assert set(n1.inbound.gone) == {"n2"}
            assert n1.link("n2").reachable is False
            assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1
            ok, why = await n1.transport.send_snapshot("n2", 9, META, snapshot_info(3), file_chunks([b"abc"]), WAIT_S)
            assert not ok and why.startswith(f"cannot reach n2 at {address}:"), why

    _run(main)


def test_a_peer_that_stops_is_reported_gone_and_reached_again_when_it_is_back(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="raft.transport.peer_links")

    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
            port = n2.port
            async with Node("n1", {"n2": n2.address}) as n1:
                n1.transport.send([heartbeat(1)])
                await until(lambda: n2.inbound.delivered, n2.inbound.changed)
                await n2.transport.close()  # closes its connections: n1 hears the peer is gone
                await until(lambda: n1.inbound.gone, n1.inbound.changed)
                assert n1.link("n2").reachable is False
                # Back on the same port: the link dials again within ~100 ms and carries a message
                # sent once (as a vote is) after it reconnected.
                async with Node("n2", {"n1": "127.0.0.1:1"}, port=port) as again:
                    started = asyncio.get_running_loop().time()
                    await n1.link_settles("n2", lambda link: link.connection is not None)
                    print(f"\nreconnected after {1000 * (asyncio.get_running_loop().time() - started):.0f} ms")
                    n1.transport.send([heartbeat(7)])
                    await until(lambda: again.inbound.delivered, again.inbound.changed)
                    assert [m.seq for m in again.inbound.delivered] == [7]  # type: ignore[attr-defined]
                    assert any("reachable again" in r.getMessage() for r in caplog.records)

    _run(main)


def test_a_member_behind_a_proxy_that_accepts_while_it_is_down_is_reported_gone_and_reached_when_back() -> None:
    """A proxy in front of a dead member accepts each connection and closes it (FIN) before any
    answer: the dialer's connect succeeds, the failure comes after. Each such close reports the
    member gone, like a refused connection, and nothing of it lingers on the link: once the member
    listens again, a message sent once (as a vote is) reaches it."""
    async def accept_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async def main() -> None:
        proxy = await asyncio.start_server(accept_then_close, "127.0.0.1", 0)
        port = proxy.sockets[0].getsockname()[1]
        async with Node("n1", {"n2": f"127.0.0.1:{port}"}) as n1:
            n1.transport.send([heartbeat(1)])
            await until(lambda: len(n1.inbound.gone) >= 3, n1.inbound.changed)  # every close, not only the first
            assert set(n1.inbound.gone) == {"n2"} and n1.link("n2").reachable is False
            proxy.close()
            await proxy.wait_closed()
            async with Node("n2", {"n1": "127.0.0.1:1"}, port=port) as n2:
                await n1.link_settles("n2", lambda link: link.connection is not None)
                n1.transport.send([heartbeat(7)])
                await until(lambda: n2.inbound.delivered, n2.inbound.changed)
                assert [m.seq for m in n2.inbound.delivered] == [7]  # type: ignore[attr-defined]

    _run(main)


class HoldingProxy:
    """In front of a member: passes bytes both ways until the member's end of a connection ends;
    then keeps the dialer's end open, reads and drops what comes on it and never reaches the member
    for it again (as some proxies do when the member behind them dies)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.accepted = 0
        self.held = 0
        self.server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def to_member() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)

        forward = asyncio.create_task(to_member())
        self.tasks.add(forward)
        try:
            while data := await up_reader.read(65536):  # the member's side, until it ends
                writer.write(data)
        except OSError:
            pass
        forward.cancel()
        await asyncio.gather(forward, return_exceptions=True)
        self.held += 1
        try:
            while await reader.read(65536):  # held: taken and dropped
                pass
        except OSError:
            pass

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.server is not None:
            self.server.close()


def test_a_link_whose_peer_went_silent_is_dialled_again_and_reaches_the_member_behind_a_fresh_connection(
        caplog: pytest.LogCaptureFixture) -> None:
    """n1 reaches n2 through a proxy. n2 dies; the proxy keeps n1's connection open and takes its
    bytes (TCP sees nothing wrong) and n2, back, never hears of them - nor sends n1 anything. What n1
    writes goes unacknowledged, so after twice the election timeout n1 closes the connection and
    dials again; the proxy gives the fresh connection to n2, and a message sent then reaches it."""
    caplog.set_level(logging.INFO, logger="raft.transport.peer_links")
    core = CoreConfig(election_timeout_ms=250, heartbeat_interval_ms=50, lease_ms=200)
    ack_timeout_s = 2 * core.election_timeout_ms / 1000

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
            port = n2.port
            proxy = HoldingProxy(port)
            proxy_port = await proxy.start()
            try:
                async with Node("n1", {"n2": f"127.0.0.1:{proxy_port}"}, core=core) as n1:
                    n1.transport.send([heartbeat(1)])
                    await until(lambda: n2.inbound.delivered, n2.inbound.changed)
                    first = n1.link("n2").connection
                    await n2.transport.close()  # n2 dies; the proxy holds n1's connection
                    async with Node("n2", {"n1": "127.0.0.1:1"}, port=port) as again:
                        # Held for as long as it is acknowledged (n2's listener acknowledged
                        # heartbeat 1 on the old connection): nothing says the connection is gone.
                        sent_at = loop.time()
                        seq = 1
                        while not again.inbound.delivered:
                            seq += 1
                            n1.transport.send([heartbeat(seq)])  # as Raft resends, every 50 ms
                            await asyncio.sleep(0.05)
                            assert loop.time() - sent_at < 4 * ack_timeout_s, "never dialled again"
                        took = loop.time() - sent_at
                        print(f"\nreached n2 again {took:.2f} s after the first message it missed")
                        assert proxy.held == 1 and proxy.accepted == 2
                        assert n1.link("n2").connection is not first
                        assert n1.inbound.gone == []  # the proxy hid n2's death; only the silence told
                        assert took >= ack_timeout_s * 0.9
                        assert any("acknowledged" in r.getMessage() for r in caplog.records)
                        # Only what was sent on the fresh connection arrived, in order.
                        seqs = [m.seq for m in again.inbound.delivered]  # type: ignore[attr-defined]
                        assert seqs == sorted(seqs) and seqs[0] > 2
            finally:
                await proxy.close()

    _run(main)


def test_sends_beyond_the_queue_bound_are_dropped_while_the_peer_does_not_answer() -> None:
    async def main() -> None:
        # Accepts TCP but never answers a hello: a stopped (SIGSTOPped) process looks like this.
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        gone: list[str] = []
        links = PeerLinks("n1", CLUSTER, ClientAddresses("client:1"), {"n2": f"127.0.0.1:{port}"}, connect_timeout_ms=300,
                          max_inflight=4, on_gone=gone.append)
        try:
            for _ in range(10):
                links.send([heartbeat(1)])
            assert links.dropped("n2") == 6
            await until(lambda: links.reachable("n2") is False, links.link("n2").checked)
            assert links.dropped("n2") == 10  # the queued ones too, once the link failed
            assert gone == []  # no answer is not "gone": the process may only be slow
        finally:
            await links.close()
            server.close()

    _run(main)


def test_a_dialer_pointed_at_a_grpc_port_says_it_is_not_a_peer(caplog: pytest.LogCaptureFixture) -> None:
    """The old --peers named client (gRPC) ports: a node started with such a list must say so."""
    caplog.set_level(logging.INFO, logger="raft.transport.peer_links")

    async def main() -> None:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        links = PeerLinks("n1", CLUSTER, ClientAddresses("client:1"), {"n2": f"127.0.0.1:{port}"}, connect_timeout_ms=1000)
        try:
            links.send([heartbeat(1)])
            await until(lambda: links.link("n2").last_refusal is not None, links.link("n2").checked)
            assert "does not answer as a raftkv peer" in (links.link("n2").last_refusal or "")
            assert "(--listen-peer), not its client one" in caplog.text
        finally:
            await links.close()
            await server.stop(None)

    _run(main)


def test_the_listener_takes_one_port_on_every_address_it_binds() -> None:
    """An empty host binds IPv4 and IPv6 (where the machine has both), a socket each, and with
    port 0 every one of them must listen on the same port."""

    async def main() -> None:
        listener = PeerListener("n2", CLUSTER, ClientAddresses("client:1"), lambda m: None, Recorder().receive_snapshot,
                                lambda member, address: None, lambda: (0, 0, 0))
        port = await listener.start("", 0)
        try:
            assert listener._server is not None
            assert {s.getsockname()[1] for s in listener._server.sockets} == {port}
        finally:
            await listener.close()

    _run(main)


def test_a_taken_peer_port_is_an_error_that_names_the_flag() -> None:
    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
            taken = Node("n3", {"n1": "127.0.0.1:1"}, port=n2.port)
            with pytest.raises(OSError, match=f"cannot listen for peers on {n2.address} \\(--listen-peer\\)"):
                await taken.transport.start(taken.inbound)

    _run(main)


def test_a_probe_gets_each_answering_peers_term_and_log_end_and_nothing_reaches_the_node() -> None:
    """What a node that starts empty asks before it joins (raft/node/joining.py): the listeners
    answer with their disks' term and log end, and close; a peer that is down does not answer."""
    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1", "n3": "127.0.0.1:1"}, disk=(7, 6, 120)) as n2:
            async with Node("n3", {"n1": "127.0.0.1:1", "n2": n2.address}, disk=(5, 5, 90)) as n3:
                down = free_ports(1)[0]
                async with Node("n1", {"n2": n2.address, "n3": n3.address, "n4": f"127.0.0.1:{down}"}) as n1:
                    assert await n1.transport.probe() == {"n2": (7, 6, 120), "n3": (5, 5, 90)}
                    n2.disk = (8, 8, 121)
                    assert (await n1.transport.probe())["n2"] == (8, 8, 121)  # asked afresh each time
                    assert n1.transport.client_address("n2") == "client-of-n2.example:7001"
                assert not n2.inbound.delivered and not n3.inbound.delivered

    _run(main)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_each_member_times_a_round_trip_to_each_peer_over_the_peer_path_and_a_silent_peer_records_nothing(
        loop: str) -> None:
    """Every interval n1 asks each peer a PROBE hello on a connection dialled as its messages' are
    (here through a proxy in front of n2) and records the hello's round trip in that peer's
    histogram (etcd's buckets). A peer that accepts and never answers, and one that is down, record
    nothing, and hold up neither the timing of the others nor the messages to them. On uvloop (the
    node's default) too, whose loop.time() counts whole milliseconds."""
    every_s = 0.05

    async def until_polled(predicate: Callable[[], Any], timeout: float = WAIT_S) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.01)

    silent_dials = 0

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal silent_dials
        silent_dials += 1
        await reader.read()  # until the dialer gives up and closes

    async def main() -> None:
        silent = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        silent_port = silent.sockets[0].getsockname()[1]
        down = free_ports(1)[0]
        try:
            async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
                proxy = HoldingProxy(n2.port)
                proxy_port = await proxy.start()
                try:
                    async with Node("n1", {"n2": f"127.0.0.1:{proxy_port}", "n3": f"127.0.0.1:{silent_port}",
                                           "n4": f"127.0.0.1:{down}"}, round_trip_every_s=every_s) as n1:
                        rtt = n1.transport.round_trip_seconds()
                        assert sorted(rtt) == ["n2", "n3", "n4"]  # every peer, before any answer
                        assert all(sum(h.counts) == 0 for h in rtt.values())
                        assert rtt["n2"].buckets == tuple(0.0001 * 2 ** i for i in range(16))  # etcd's
                        # The silent peer's first probe times out (the connect timeout, 1 s) and
                        # a second is dialled; meanwhile n2 was timed every interval.
                        await until_polled(lambda: silent_dials >= 2)
                        timed = sum(rtt["n2"].counts)
                        assert timed >= 5
                        assert sum(rtt["n3"].counts) == 0 and sum(rtt["n4"].counts) == 0
                        assert 0 < rtt["n2"].total / timed < 0.5  # a loopback round trip, in seconds
                        # Finer than milliseconds: no sum of whole milliseconds.
                        assert abs(rtt["n2"].total * 1000 - round(rtt["n2"].total * 1000)) > 1e-6
                        assert proxy.accepted >= timed  # each on a connection through the proxy
                        n1.transport.send([heartbeat(1)])  # messages pass meanwhile
                        await until(lambda: n2.inbound.delivered, n2.inbound.changed)
                        await until_polled(lambda: sum(rtt["n2"].counts) > timed)  # and timing goes on
                        assert sum(rtt["n3"].counts) == 0 and sum(rtt["n4"].counts) == 0
                        assert not n2.inbound.delivered[1:]  # a probe hands the node nothing
                finally:
                    await proxy.close()
                # n2 times nothing at the default interval (5 s) this early.
                assert sum(n2.transport.round_trip_seconds()["n1"].counts) == 0
        finally:
            silent.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop) as runner:
        runner.run(asyncio.wait_for(main(), 60))
