"""The peer transport: the codec round trip, the RaftPeer service and the TCP message listener
refusing what they must, and the client over both (real gRPC servers and sockets on 127.0.0.1)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import grpc
import pytest

from raftkv_proto import raft_pb2, raft_pb2_grpc
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
    VoteRequest,
    VoteResponse,
)
from raft.core.types import Entry, EntryType, SnapshotMeta
from raft.transport.codec import CodecError, from_proto, pack_entries, to_proto
from raft.transport.frames import FrameReader, frame
from raft.transport.message_listener import MessageListener
from raft.transport.peer_client import PeerClient
from raft.transport.peer_transport import SERVER_OPTIONS, PeerService

H = {"src": "n1", "dst": "n2", "term": 7}
APPEND = PushRequest(**H, type=PushType.APPEND, pre_index=10, pre_term=5, commit_index=9,
                     entries=[Entry(11, 7, EntryType.NOOP, b""), Entry(12, 7, EntryType.NORMAL, b"\x00cmd\xff")])

EVERY_MESSAGE: list[Message] = [
    VoteRequest(**H, last_log_index=12, last_log_term=6, pre_vote=True),
    VoteResponse(**H, granted=True, pre_vote=True),
    HeartbeatRequest(**H, commit_index=11, seq=99),
    HeartbeatResponse(**H, success=True, seq=99, end_index=12),
    APPEND,
    PushRequest(**H, type=PushType.TRUNCATE, truncate_index=8, truncate_term=4),
    PushResponse(**H, type=PushType.COMPARE, code=PushCode.INCONSISTENT, pre_index=10, index=3,
                 end_index=9, x_term=4, x_index=6),
    InstallSnapshotRequest(**H, meta=SnapshotMeta(100, 6, ("n1", "n2", "n3"))),
    InstallSnapshotResponse(**H, success=True, index=100, end_index=100),
]


@pytest.mark.parametrize("packed", [False, True], ids=["entries", "packed"])
@pytest.mark.parametrize("msg", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_codec_round_trip(msg: Message, packed: bool) -> None:
    wire = to_proto(msg, packed).SerializeToString()
    back = from_proto(raft_pb2.PeerMessage.FromString(wire))
    assert type(back) is type(msg)
    assert dataclasses.asdict(back) == dataclasses.asdict(msg)


def test_packed_entries_take_one_field_and_no_entry_objects() -> None:
    body = to_proto(APPEND, packed=True).push_request
    assert len(body.entries) == 0 and body.packed_entries == pack_entries(APPEND.entries)
    assert len(to_proto(APPEND).push_request.entries) == 2 and not to_proto(APPEND).push_request.packed_entries


@pytest.mark.parametrize("cut, words", [
    (lambda b: b[:10], "inside an entry's header"),
    (lambda b: b[:-1], "claims 5 payload bytes; 4 are left"),
    (lambda b: b[:16] + b"\x09" + b[17:], "unknown EntryType value 9"),
], ids=["header", "payload", "type"])
def test_codec_refuses_broken_packed_entries(cut: Any, words: str) -> None:
    packed = pack_entries([Entry(12, 7, EntryType.NORMAL, b"\x00cmd\xff")])
    bad = raft_pb2.PeerMessage(src="n1", dst="n2", term=7,
                               push_request=raft_pb2.PushRequest(packed_entries=cut(packed)))
    with pytest.raises(CodecError, match=words):
        from_proto(bad)


def test_codec_refuses_a_push_with_both_entry_forms() -> None:
    both = to_proto(APPEND)
    both.push_request.packed_entries = pack_entries([Entry(13, 7, EntryType.NORMAL, b"x")])
    with pytest.raises(CodecError, match="both"):
        from_proto(both)


def test_codec_covers_every_body_case() -> None:
    cases = {to_proto(m).WhichOneof("body") for m in EVERY_MESSAGE}
    assert cases == {f.name for f in raft_pb2.PeerMessage.DESCRIPTOR.oneofs_by_name["body"].fields}


def test_codec_refuses_bodyless_and_unknown_enum() -> None:
    with pytest.raises(CodecError):
        from_proto(raft_pb2.PeerMessage(src="n1", dst="n2", term=1))
    bad = raft_pb2.PeerMessage(src="n1", dst="n2", term=1, push_request=raft_pb2.PushRequest(type=42))
    with pytest.raises(CodecError):
        from_proto(bad)


def test_snapshot_data_does_not_travel() -> None:
    msg = InstallSnapshotRequest(**H, meta=SnapshotMeta(5, 2), data=b"big")
    assert from_proto(to_proto(msg)).data is None  # type: ignore[attr-defined]


# ---- the service over real gRPC ----------------------------------------------------------------

class Peer:
    """A PeerService for node n2 of cluster "c1" on a free port, collecting what it delivers; with
    transport "tcp" also a MessageListener, whose port its Hello tells."""

    def __init__(self, transport: str = "grpc", service_class: type[PeerService] = PeerService) -> None:
        self.delivered: list[Message] = []
        self.batches: list[raft_pb2.MessageBatch] = []  # every batch, as it came off the wire
        self.arrived = asyncio.Event()
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        service = service_class("n2", "c1", ["n1", "n2", "n3"], self._deliver,
                                message_port=lambda: self.listener.port if self.listener else 0)
        self.listener = MessageListener(self._recording(service.check), self._deliver) if transport == "tcp" else None
        raft_pb2_grpc.add_RaftPeerServicer_to_server(service, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        if self.listener is not None:
            await self.listener.start("127.0.0.1", 0)
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(None)
        if self.listener is not None:
            await self.listener.close()

    def _deliver(self, messages: list[Message]) -> None:
        self.delivered.extend(messages)
        self.arrived.set()

    def _recording(self, check: Any) -> Any:
        def recorded(batch: raft_pb2.MessageBatch) -> list[Message]:
            self.batches.append(batch)
            return check(batch)  # type: ignore[no-any-return]
        return recorded


class NodeBeforePackedEntries(PeerService):
    """A peer from before packed entries: its Hello does not offer them."""

    async def Hello(self, request: raft_pb2.HelloRequest, context: grpc.aio.ServicerContext) -> raft_pb2.HelloReply:
        reply = await super().Hello(request, context)
        return raft_pb2.HelloReply(message_port=reply.message_port)


@pytest.mark.parametrize("service_class, packed", [(PeerService, True), (NodeBeforePackedEntries, False)],
                         ids=["peer-reads-packed", "peer-from-before"])
def test_pushes_go_packed_only_to_a_peer_whose_hello_offers_it(service_class: type[PeerService],
                                                               packed: bool) -> None:
    async def main() -> None:
        peer = Peer("tcp", service_class)
        await peer.start()
        client = PeerClient("n1", "c1", {"n1": "127.0.0.1:1", "n2": peer.address}, rpc_timeout_ms=500)
        push = APPEND
        try:
            client.send([push])
            await asyncio.wait_for(peer.arrived.wait(), 5)
            assert peer.delivered == [push]
            wire = peer.batches[0].messages[0].push_request
            assert (bool(wire.packed_entries), len(wire.entries)) == ((True, 0) if packed else (False, 2))
        finally:
            await client.close()
            await peer.stop()

    _run(main())


def _batch(cluster: str = "c1", from_id: str = "n1", dst: str = "n2") -> raft_pb2.MessageBatch:
    msg = to_proto(HeartbeatRequest(src=from_id, dst=dst, term=3, commit_index=1, seq=1))
    return raft_pb2.MessageBatch(cluster_id=cluster, from_id=from_id, messages=[msg])


def _run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_send_refusals_and_garbage() -> None:
    async def main() -> None:
        peer = Peer()
        await peer.server.start()
        try:
            async with grpc.aio.insecure_channel(peer.address) as channel:
                stub = raft_pb2_grpc.RaftPeerStub(channel)
                cases = [(_batch(cluster="other"), "wrong cluster id: got 'other', this cluster is 'c1'"),
                         (_batch(from_id="n9"), "unknown member id"),
                         (_batch(dst="n3"), "reached 'n2'")]
                for batch, words in cases:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.Send(batch, timeout=2)
                    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                    assert words in err.value.details()
                # Bytes that do not parse as a MessageBatch, sent on a raw method handle.
                raw = channel.unary_unary("/raftkv.raft.RaftPeer/Send")
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await raw(b"\xff\xff\xff\xff garbage", timeout=2)
                assert err.value.code() != grpc.StatusCode.OK
                assert peer.delivered == []
                # ... and the service still serves a good batch afterwards.
                await stub.Send(_batch(), timeout=2)
                assert [type(m) for m in peer.delivered] == [HeartbeatRequest]
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.InstallSnapshot(iter([raft_pb2.SnapshotChunk()]), timeout=2)
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await peer.server.stop(None)

    _run(main())


TRANSPORTS = pytest.mark.parametrize("transport", ["tcp", "grpc"])


@TRANSPORTS
def test_client_sends_and_reports_reachability(caplog: pytest.LogCaptureFixture, transport: str) -> None:
    caplog.set_level(logging.INFO, logger="raft.transport.peer_client")

    async def main() -> None:
        peer = Peer(transport)
        client = PeerClient("n1", "c1", {"n1": "127.0.0.1:1", "n2": peer.address}, rpc_timeout_ms=500)
        try:
            # Nothing listens yet: the call fails and the peer is reported unreachable, once.
            for _ in range(3):
                await _send_and_settle(client, HeartbeatRequest(src="n1", dst="n2", term=1))
            assert client.reachable("n2") is False
            assert sum("unreachable" in r.message for r in caplog.records) == 1
            await peer.start()
            # A healed link carries traffic again after a short reconnect backoff.
            loop = asyncio.get_running_loop()
            started = loop.time()
            while not peer.delivered:
                await _send_and_settle(client, HeartbeatRequest(src="n1", dst="n2", term=1))
                if not peer.delivered:
                    await asyncio.sleep(0.01)  # the pace of Raft's retransmissions (heartbeats), not a sync
            print(f"\nreconnected after {1000 * (loop.time() - started):.0f} ms")
            assert loop.time() - started < 1.0
            assert client.reachable("n2") is True
            assert any("reachable again" in r.message for r in caplog.records)
            assert (client._links["n2"].connection is not None) == (transport == "tcp")
        finally:
            await client.close()
            await peer.stop()

    _run(main())


async def _send_and_settle(client: PeerClient, msg: Message) -> None:
    """Send and wait until the link's stream pump has next learned whether the peer is reachable
    (the client is fire-and-forget; the pump works in the background)."""
    link = client._links[msg.dst]
    link.checked.clear()
    client.send([msg])
    await asyncio.wait_for(link.checked.wait(), 5)


@TRANSPORTS
def test_client_drops_beyond_inflight_bound(transport: str) -> None:
    async def main() -> None:
        # An address that accepts TCP but never answers HTTP/2 keeps calls in flight until their
        # deadline: a bare listening socket.
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = PeerClient("n1", "c1", {"n1": "127.0.0.1:1", "n2": f"127.0.0.1:{port}"},
                            rpc_timeout_ms=300, max_inflight=4, peer_transport=transport)
        try:
            for _ in range(10):
                client.send([HeartbeatRequest(src="n1", dst="n2", term=1)])
            assert client.dropped("n2") == 6
            await asyncio.wait_for(client._links["n2"].checked.wait(), 5)
            assert client.reachable("n2") is False
        finally:
            await client.close()
            server.close()

    _run(main())


@TRANSPORTS
def test_no_batch_is_lost_after_an_outage(transport: str) -> None:
    """Every failed reconnect attempt leaves gRPC's consumer of that call's request iterator
    alive; it must not take (and drop) batches meant for the stream that finally connects. The
    regression: after a peer's restart its pre-votes and votes vanished for up to 40 s, one per
    failed attempt, so a cluster of two live nodes could not elect a leader."""

    async def main() -> None:
        peer = Peer(transport)
        client = PeerClient("n1", "c1", {"n1": "127.0.0.1:1", "n2": peer.address}, rpc_timeout_ms=500,
                            peer_transport=transport)
        link = client._links["n2"]
        try:
            # The peer is down: the pump's reconnect attempts fail one after another.
            await _send_and_settle(client, HeartbeatRequest(src="n1", dst="n2", term=1))
            for _ in range(10):
                link.checked.clear()
                await asyncio.wait_for(link.checked.wait(), 5)
            assert client.reachable("n2") is False
            await peer.start()
            while client.reachable("n2") is not True:
                link.checked.clear()
                await asyncio.wait_for(link.checked.wait(), 5)
            # One message, sent once, as a pre-vote is: it must arrive.
            client.send([HeartbeatRequest(src="n1", dst="n2", term=7)])
            await asyncio.wait_for(peer.arrived.wait(), 5)
            assert [m.term for m in peer.delivered] == [7]
        finally:
            await client.close()
            await peer.stop()

    _run(main())


# ---- the TCP message listener --------------------------------------------------------------------

async def _exchange(port: int, data: bytes) -> tuple[list[bytes], bool]:
    """Send raw bytes to a message port; the frames the listener sends back, and whether it then
    closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        received = await asyncio.wait_for(reader.read(), 5)  # to EOF: the listener closes
        return FrameReader(1 << 20).feed(received), reader.at_eof()
    finally:
        writer.close()


def test_listener_refuses_garbage_and_strangers_and_serves_on() -> None:
    async def main() -> None:
        peer = Peer("tcp")
        await peer.start()
        assert peer.listener is not None
        port = peer.listener.port
        try:
            cases = [(b"\x00\x00\x00\x04\xff\xff\xff\xff", "malformed peer message"),
                     (b"\xff\xff\xff\xff", "over the limit"),
                     (frame(_batch(cluster="other").SerializeToString()), "wrong cluster id: got 'other'"),
                     (frame(_batch(from_id="n9").SerializeToString()), "unknown member id"),
                     (frame(_batch(dst="n3").SerializeToString()), "reached 'n2'")]
            for data, words in cases:
                reasons, closed = await _exchange(port, data)
                assert len(reasons) == 1 and words in reasons[0].decode(), (words, reasons)
                assert closed
            assert peer.delivered == []
            # A good batch after all that is delivered; one with a bad batch behind it in the
            # same write keeps the good one (batches are whole) and refuses the rest.
            good = frame(_batch().SerializeToString())
            reasons, closed = await _exchange(port, good + frame(_batch(cluster="other").SerializeToString()))
            assert "wrong cluster id" in reasons[0].decode() and closed
            assert [type(m) for m in peer.delivered] == [HeartbeatRequest]
        finally:
            await peer.stop()

    _run(main())


def test_client_logs_a_refusal_once_and_does_not_call_the_peer_gone(caplog: pytest.LogCaptureFixture) -> None:
    """A node whose --peers puts n3 at n2's address: Hello passes (same cluster, known member),
    the batches for n3 are refused by n2's listener with the reason, which the client logs once."""
    caplog.set_level(logging.INFO, logger="raft.transport.peer_client")

    async def main() -> None:
        peer = Peer("tcp")
        await peer.start()
        gone: list[str] = []
        client = PeerClient("n1", "c1", {"n1": "127.0.0.1:1", "n3": peer.address}, rpc_timeout_ms=500,
                            on_gone=gone.append)
        link = client._links["n3"]
        try:
            for _ in range(3):
                await _send_and_settle(client, HeartbeatRequest(src="n1", dst="n3", term=1))
                while link.last_refusal is None:  # the refusal arrives after the connection opened
                    link.checked.clear()
                    await asyncio.wait_for(link.checked.wait(), 5)
            refusals = [r.message for r in caplog.records if "refused our messages" in r.message]
            assert len(refusals) == 1 and "message for 'n3' reached 'n2'" in refusals[0]
            assert gone == [] and peer.delivered == []
        finally:
            await client.close()
            await peer.stop()

    _run(main())


def test_client_calls_the_peer_gone_when_its_connection_closes() -> None:
    """A follower learns its leader's process is gone from the closed connection and stands for
    election sooner (W7): the TCP link must report it as the gRPC stream's UNAVAILABLE did."""

    async def main() -> None:
        peer = Peer("tcp")
        await peer.start()
        gone = asyncio.Event()
        client = PeerClient("n1", "c1", {"n1": "127.0.0.1:1", "n2": peer.address}, rpc_timeout_ms=500,
                            on_gone=lambda p: gone.set())
        try:
            client.send([HeartbeatRequest(src="n1", dst="n2", term=1)])
            await asyncio.wait_for(peer.arrived.wait(), 5)
            assert not gone.is_set()
            await peer.stop()  # closes the listener's connections
            await asyncio.wait_for(gone.wait(), 5)
            assert client.reachable("n2") is False
        finally:
            await client.close()

    _run(main())


def test_listener_takes_one_port_on_every_address_it_binds() -> None:
    """An empty host binds IPv4 and IPv6 (where the machine has both), a socket each; `Hello`
    tells a single port, so both must listen on it."""

    async def main() -> None:
        listener = MessageListener(lambda batch: [], lambda messages: None)
        port = await listener.start("", 0)
        try:
            assert listener._server is not None
            assert {s.getsockname()[1] for s in listener._server.sockets} == {port}
        finally:
            await listener.close()

    _run(main())
