"""PeerLinks: the dialing half of raft/transport/peer_protocol.py. Per peer, one MESSAGES
connection that carries every batch of messages to it, in order; and a connection of its own for
each snapshot stream.

The driver loop must never wait on a peer, so `send` never blocks: on an open connection it
writes the batch as one frame at once; otherwise a pump task per peer connects (hello, answer)
and flushes what queued meanwhile, merging it into few frames. At most `max_inflight` sends queue
per peer and messages beyond that are dropped, as are the queued ones when the link fails and
those that would overfill a connection's send buffer - Raft retransmits (heartbeats, push
timeouts), so a drop costs latency, never safety. A failed link is dialled again after
REOPEN_PAUSE_S, so a healed link carries traffic again within ~100 ms.

The listener acknowledges what arrives on a MESSAGES connection (an empty frame, within a quarter
of `ack_timeout_ms` of receiving it). A connection on which something we wrote has gone
unacknowledged for `ack_timeout_ms` is closed and dialled again: its other end is gone although
nothing in TCP says so - a proxy (docker-proxy, a Service proxy, a mesh sidecar) that keeps our
side open and takes our bytes after the member behind it died, and never reaches the member
again for that connection. Messages are one-way (answers come on the peer's own connection to
us), so nothing else would show that our messages vanish.

With peer TLS on (`tls`, raft/transport/peer_tls.py), every connection is dialled with TLS, and
before our hello goes out the listener's verified certificate must name the member we meant to
reach (not the address we dialled: the member id is the identity); otherwise the link is refused
with the reason, as a refused hello is.

Once `time_round_trips(every_s)` is called (TcpTransport.start), each peer is also asked, every
`every_s` seconds, the question a rejoining member asks (a PROBE hello, peer_protocol.py) on a
connection of its own dialled as a MESSAGES one is (the peer's address in --peers, TLS when on,
so through any proxy on the way), and the seconds from the hello's write to the answer's arrival go
into that peer's `round_trip_seconds` histogram (etcd_network_peer_round_trip_time_seconds). Each
peer is timed by a task of its own, off the messages' path: a peer that does not answer within the
connect timeout records nothing and holds up neither the others nor any send."""
from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from google.protobuf.message import DecodeError

from raftkv_proto import raft_pb2
from raft.core.messages import Message
from raft.core.types import SnapshotMeta
from raft.node.ports import ClientAddresses
from raft.node.stats import PEER_RTT_BUCKETS_S, Histogram
from raft.transport.address import socket_host, split_address
from raft.transport.codec import encode_batch, meta_to_proto
from raft.transport.frames import FrameError, FrameReader, frame
from raft.transport.peer_protocol import (
    MAX_HELLO_BYTES,
    MESSAGES,
    PROBE,
    SNAPSHOT,
    PeerRefused,
    RemovedMember,
    check_reply,
    configure_peer_socket,
    hello,
    looks_like_tls,
)
from raft.transport.peer_tls import check_names_member, handshake_refusal

log = logging.getLogger(__name__)

# Most queued sends merged into one frame when a connection opens.
MAX_SENDS_PER_WRITE = 16
# Pause before dialling a link again after it failed.
REOPEN_PAUSE_S = 0.05
# The listener is asked to acknowledge within ack_timeout / ACKS_PER_TIMEOUT, and the dialer checks
# that often whether a write has gone unacknowledged for ack_timeout.
ACKS_PER_TIMEOUT = 4
# A connection holding this much unsent data takes no more batches until it drains (they are
# dropped): its peer is not reading, and Raft resends what still matters once it does.
MAX_BUFFERED_BYTES = 16 << 20


@dataclass(slots=True)
class PeerLink:
    peer_id: str
    address: str  # where we reach the peer's listener (our --peers entry for it)
    host: str | None
    port: int
    reachable: bool | None = None  # None until the first connection attempt ends: nothing to report yet
    dropped: int = 0
    last_refusal: str | None = None
    queue: deque[Sequence[Message]] = field(default_factory=deque)
    pump: asyncio.Task[None] | None = None
    # The open connection, once the queue is flushed into it: send() writes there.
    connection: _Outbound | None = None
    # Set each time the pump learns whether the peer is reachable (tests and tools await it).
    checked: asyncio.Event = field(default_factory=asyncio.Event)
    # Seconds of each timed round trip to the peer (PeerLinks.time_round_trips).
    round_trip_seconds: Histogram = field(default_factory=lambda: Histogram(PEER_RTT_BUCKETS_S))


class PeerLinks:
    """Sends core messages and snapshot streams to peers. Create and use it on the event loop
    that runs the node."""

    def __init__(self, node_id: str, cluster_id: str, client: ClientAddresses, peers: dict[str, str],
                 connect_timeout_ms: int, max_inflight: int = 64,
                 on_gone: Callable[[str], None] | None = None,
                 learnt: Callable[[str, ClientAddresses], None] | None = None, ack_timeout_ms: int = 2000,
                 tls: Callable[[], ssl.SSLContext] | None = None, peer_address: str = "") -> None:
        """`peers`: member id -> its peer address (ours, if named, is skipped). `on_gone(peer)` is
        called each time a link to `peer` fails because the connection was refused, reset or
        closed without a reason: the peer's process is most likely gone. `learnt(peer, address)`
        is told where each peer takes clients, as its answer to our hello says.
        `ack_timeout_ms`: a MESSAGES connection on which what we wrote goes unacknowledged this
        long is closed and dialled again (TcpTransport: twice the election timeout). `tls`:
        peer_tls.ReloadingPeerTLS.dial_context, which gives the context each dial uses (None:
        plaintext). `peer_address`: where our listener is, announced in our hellos. `on_removed(why)` is called when a peer
        refuses us as a removed member."""
        self._node_id = node_id
        self.peer_address = peer_address
        self.on_removed: Callable[[str], None] | None = None
        self._cluster_id = cluster_id
        self._client = client
        self._timeout_s = connect_timeout_ms / 1000
        self._max_inflight = max_inflight
        self._ack_timeout_s = ack_timeout_ms / 1000
        self._ack_within_ms = max(1, ack_timeout_ms // ACKS_PER_TIMEOUT)
        self.on_gone = on_gone
        self._learnt = learnt
        self._tls = tls
        # What create_connection / open_connection are given: nothing more for plaintext.
        self._links: dict[str, PeerLink] = {}
        self._timing: list[asyncio.Task[None]] = []  # a round-trip timer per peer, once started
        for pid, address in peers.items():
            self.add_peer(pid, address)

    def _dial_options(self) -> dict[str, Any]:
        """What create_connection / open_connection are given: nothing more for plaintext; with
        TLS, the context of the peer files as they are now."""
        if self._tls is None:
            return {}
        return {"ssl": self._tls(), "ssl_handshake_timeout": self._timeout_s}

    def add_peer(self, peer_id: str, address: str) -> bool:
        """A link to a member not linked yet (a configuration added it); True if it is new. Links
        are never removed: a removed member is simply sent nothing more."""
        if peer_id == self._node_id or peer_id in self._links or not address:
            return False
        host, port = split_address(address)
        self._links[peer_id] = PeerLink(peer_id, address, socket_host(host), port)
        return True

    def move_peer(self, peer_id: str, address: str) -> bool:
        """Dial the linked member `peer_id` at `address` from now on (an update of its peer address
        applied): its open connection is closed and the link dials the new address; True if the
        address changed."""
        link = self._links.get(peer_id)
        if link is None or not address or link.address == address:
            return False
        host, port = split_address(address)
        log.info("peer %s moves from %s to %s", peer_id, link.address, address)
        link.address, link.host, link.port = address, socket_host(host), port
        link.reachable = None
        if link.connection is not None:
            link.connection.abort()  # its session ends and the pump dials the new address
        return True

    def link(self, peer_id: str) -> PeerLink:
        return self._links[peer_id]

    def reachable(self, peer_id: str) -> bool | None:
        return self._links[peer_id].reachable

    def dropped(self, peer_id: str) -> int:
        return self._links[peer_id].dropped

    def round_trip_seconds(self) -> dict[str, Histogram]:
        """Peer -> its timed round trips (every peer, from the start: no answer yet, no count)."""
        return {pid: link.round_trip_seconds for pid, link in self._links.items()}

    # ---- messages ----------------------------------------------------------------------------

    def send(self, messages: Sequence[Message]) -> None:
        """Write or queue the messages on their destinations' links; return at once."""
        by_dst: dict[str, list[Message]] = {}
        for m in messages:
            by_dst.setdefault(m.dst, []).append(m)
        for dst, batch in by_dst.items():
            link = self._links.get(dst)
            if link is None:
                log.error("dropping %d message(s) for %r: not a peer of %r", len(batch), dst, self._node_id)
                continue
            connection = link.connection
            if connection is not None:  # the queue is empty while a connection is open
                if not connection.write(frame(encode_batch(batch))):
                    link.dropped += len(batch)
                continue
            if link.pump is None:
                link.pump = asyncio.get_running_loop().create_task(self._pump(link), name=f"raft-link-{dst}")
            if len(link.queue) >= self._max_inflight:
                link.dropped += len(batch)
                continue
            link.queue.append(batch)

    async def _pump(self, link: PeerLink) -> None:
        """Keep the link connected: dial, flush the queue, hand the connection to send(); when it
        fails, say why and dial again."""
        while True:
            try:
                await self._session(link)
            except RemovedMember as e:
                self._refused(link, str(e))
                if self.on_removed is not None:
                    self.on_removed(str(e))
            except PeerRefused as e:  # the peer answered but refused us, and said why
                self._refused(link, str(e))
            except TimeoutError:
                self._unreachable(link, f"no connection and answer to our hello within {self._timeout_s:g} s")
            except _Unacknowledged:
                self._unreachable(link, f"what we sent went unacknowledged for {self._ack_timeout_s:g} s; "
                                        f"dialling again")
            except OSError as e:  # refused, reset, or closed by a peer that gave no reason
                if self.on_gone is not None:
                    self.on_gone(link.peer_id)
                self._unreachable(link, str(e) or type(e).__name__)
            self._drop_queued(link)  # stale by the time the link heals; Raft resends
            link.checked.set()
            await asyncio.sleep(REOPEN_PAUSE_S)

    async def _session(self, link: PeerLink) -> None:
        """Connect and say hello, flush what queued meanwhile, then let send() write directly
        until the connection ends (always by an exception)."""
        loop = asyncio.get_running_loop()
        connection = _Outbound(loop, link.address, link.peer_id, tls=self._tls is not None)
        try:
            async with asyncio.timeout(self._timeout_s):
                try:
                    await loop.create_connection(lambda: connection, link.host, link.port, **self._dial_options())
                except ssl.SSLError as e:
                    raise handshake_refusal(link.peer_id, link.address, e) from None
                self._check_identity(link, connection.peercert())
                connection.write(self._hello(link, MESSAGES, self._ack_within_ms))
                answer = await connection.answer
            connection.acks = self._accepted(link, answer).acks
            self._reachable(link)
            while link.queue:
                sends = [link.queue.popleft() for _ in range(min(len(link.queue), MAX_SENDS_PER_WRITE))]
                if not connection.write(frame(encode_batch(m for queued in sends for m in queued))):
                    link.dropped += sum(len(queued) for queued in sends)
            link.connection = connection
            check_s = self._ack_timeout_s / ACKS_PER_TIMEOUT
            while not (await asyncio.wait((connection.closed,), timeout=check_s if connection.acks else None))[0]:
                since = connection.unacknowledged_since
                if since is not None and loop.time() - since >= self._ack_timeout_s:
                    raise _Unacknowledged()
        finally:
            link.connection = None
            connection.abort()
            if not connection.answer.done():
                connection.answer.cancel()  # nobody will read what it would say
        if connection.refusal is not None:
            raise PeerRefused(connection.refusal)
        raise ConnectionResetError(f"connection closed: {connection.closed.result() or 'by the peer'}")

    def _check_identity(self, link: PeerLink, peercert: dict[str, Any] | None) -> None:
        """With TLS: PeerRefused unless the listener's certificate names the member we dialled."""
        if self._tls is not None:
            check_names_member(peercert, link.peer_id, f"the certificate of {link.address}",
                               f": is {link.address} {link.peer_id}'s peer address, and {link.peer_id}'s "
                               f"--peer-cert-file its own?")

    def _hello(self, link: PeerLink, purpose: int, ack_within_ms: int = 0) -> bytes:
        h = hello(self._cluster_id, self._node_id, link.peer_id, self._client, purpose, self.peer_address)
        h.ack_within_ms = ack_within_ms
        return frame(h.SerializeToString())

    def _accepted(self, link: PeerLink, answer: bytes) -> raft_pb2.PeerHelloReply:
        reply = check_reply(answer, link.peer_id, link.address)
        if reply.client_address and self._learnt is not None:
            self._learnt(link.peer_id, ClientAddresses(reply.client_address, reply.client_http_address))
        return reply

    def _drop_queued(self, link: PeerLink) -> None:
        link.dropped += sum(len(queued) for queued in link.queue)
        link.queue.clear()

    def _reachable(self, link: PeerLink) -> None:
        if link.reachable is False:
            log.info("peer %s at %s reachable again", link.peer_id, link.address)
        link.reachable = True
        link.checked.set()

    def _unreachable(self, link: PeerLink, why: str) -> None:
        if link.reachable is not False:
            log.warning("peer %s at %s unreachable: %s", link.peer_id, link.address, why)
        link.reachable = False
        # A refusal is logged once while it repeats (the link dials again and is refused again
        # every REOPEN_PAUSE_S); a peer that went away and refuses again is logged again.
        link.last_refusal = None

    def _refused(self, link: PeerLink, refusal: str) -> None:
        # The peer answered but refused (wrong cluster id, misaddressed): a configuration problem.
        # Log each distinct refusal once, not once per attempt.
        if refusal != link.last_refusal:
            log.error("peer %s at %s refused our connection: %s", link.peer_id, link.address, refusal)
            link.last_refusal = refusal

    # ---- probes ------------------------------------------------------------------------------

    async def probe(self) -> dict[str, tuple[int, int, int]]:
        """Ask every peer, at once, for its term and the end of its log: member -> (term, last log
        term, last log index) of those that answered within the connect timeout."""
        answers = await asyncio.gather(*(self._probe(link) for link in self._links.values()))
        return {link.peer_id: answer for link, answer in zip(self._links.values(), answers) if answer is not None}

    async def _probe(self, link: PeerLink) -> tuple[int, int, int] | None:
        answered = await self._ask(link)
        if answered is None:
            return None  # not up yet, or not ours to ask: the caller asks again
        reply, _ = answered
        return reply.term, reply.last_log_term, reply.last_log_index

    async def _ask(self, link: PeerLink) -> tuple[raft_pb2.PeerHelloReply, float] | None:
        """A PROBE hello on a connection of its own, and the peer's answer with the seconds from
        the hello's write to the answer's arrival (one round trip: the TCP and TLS handshakes are
        over by then); None when the peer did not answer within the connect timeout, or refused."""
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self._timeout_s):
                reader, writer = await asyncio.open_connection(link.host, link.port, **self._dial_options())
                configure_peer_socket(writer.get_extra_info("socket"))
                self._check_identity(link, writer.get_extra_info("peercert"))
                # Not loop.time(): uvloop's is in whole milliseconds, and read once per iteration.
                asked = time.perf_counter()
                writer.write(self._hello(link, PROBE))
                answer = await _read_frame(reader)
                took = time.perf_counter() - asked
                reply = self._accepted(link, answer)
        except (OSError, EOFError, TimeoutError, FrameError, PeerRefused):
            return None
        finally:
            if writer is not None:
                writer.close()
        return reply, took

    # ---- round trips -------------------------------------------------------------------------

    def time_round_trips(self, every_s: float) -> None:
        """From now on, time a round trip to each peer every `every_s` seconds (the first after
        `every_s`), into its link's round_trip_seconds; a task per peer, so one that does not
        answer delays no other. A second call changes nothing."""
        if self._timing:
            return
        loop = asyncio.get_running_loop()
        self._timing = [loop.create_task(self._time_round_trips(link, every_s), name=f"raft-rtt-{link.peer_id}")
                        for link in self._links.values()]

    async def _time_round_trips(self, link: PeerLink, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            answered = await self._ask(link)
            if answered is not None:
                link.round_trip_seconds.observe(answered[1])

    # ---- snapshots ---------------------------------------------------------------------------

    async def send_snapshot(self, peer_id: str, term: int, meta: SnapshotMeta, total_size: int, sha256: str,
                            chunks: AsyncIterator[tuple[int, bytes, bool]], timeout_s: float) -> tuple[bool, str]:
        """Stream a snapshot file to a peer on a connection of its own; (accepted, why not)."""
        link = self._links.get(peer_id)
        if link is None:
            return False, f"{peer_id!r} is not a peer of {self._node_id!r}"
        writer: asyncio.StreamWriter | None = None
        ack: asyncio.Task[bytes] | None = None
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    async with asyncio.timeout(self._timeout_s):
                        try:
                            reader, writer = await asyncio.open_connection(link.host, link.port,
                                                                           **self._dial_options())
                        except ssl.SSLError as e:
                            return False, str(handshake_refusal(peer_id, link.address, e))
                        configure_peer_socket(writer.get_extra_info("socket"))
                        try:
                            self._check_identity(link, writer.get_extra_info("peercert"))
                        except PeerRefused as e:
                            return False, f"no snapshot for {peer_id}: {e}"
                        writer.write(self._hello(link, SNAPSHOT))
                        answer = await _read_frame(reader)
                except FrameError:
                    raise PeerRefused(f"{link.address} does not answer as a raftkv peer") from None
                except TimeoutError:
                    return False, f"{peer_id} at {link.address} did not answer within {self._timeout_s:g} s"
                except (OSError, EOFError) as e:
                    return False, f"cannot reach {peer_id} at {link.address}: {e or type(e).__name__}"
                self._accepted(link, answer)
                header = raft_pb2.SnapshotHeader(term=term, meta=meta_to_proto(meta), total_size=total_size,
                                                 sha256=sha256)
                writer.write(frame(header.SerializeToString()))
                # The ack may come before the last chunk (the peer refuses the stream part way).
                ack = asyncio.get_running_loop().create_task(_read_frame(reader))
                try:
                    async for offset, data, done in chunks:
                        if ack.done():
                            break
                        chunk = raft_pb2.SnapshotChunk(offset=offset, data=data, done=done)
                        writer.write(frame(chunk.SerializeToString()))
                        await writer.drain()
                except OSError:
                    if not ack.done():
                        raise
                reply = raft_pb2.SnapshotAck.FromString(await ack)
            return reply.success, reply.message
        except PeerRefused as e:
            return False, f"{peer_id} refused the snapshot connection: {e}"
        except TimeoutError:
            return False, f"{peer_id} did not take the snapshot within {timeout_s:g} s"
        except (OSError, EOFError, FrameError, DecodeError) as e:
            return False, f"the snapshot stream to {peer_id} broke off: {e or type(e).__name__}"
        finally:
            if ack is not None:
                if not ack.done():
                    ack.cancel()
                elif not ack.cancelled():
                    ack.exception()  # retrieved: a failure here was reported another way
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            if writer is not None:
                writer.close()

    async def close(self) -> None:
        pending = [link.pump for link in self._links.values() if link.pump is not None] + self._timing
        self._timing = []
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    """One answer frame from the listener. EOFError when the connection ends first."""
    frames = FrameReader(MAX_HELLO_BYTES)
    while True:
        data = await reader.read(MAX_HELLO_BYTES)
        if not data:
            raise EOFError("the peer closed the connection without answering")
        got = frames.feed(data)
        if got:
            return got[0]


class _Unacknowledged(Exception):
    """What we wrote on a connection went unacknowledged for the ack timeout."""


class _Outbound(asyncio.Protocol):
    """Our end of a MESSAGES connection. What flows back: the answer to our hello, then (when the
    answer says `acks`) empty frames acknowledging what arrived, and at most one Refusal: why the
    peer closes the connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop, address: str, peer_id: str, tls: bool = False) -> None:
        self.answer: asyncio.Future[bytes] = loop.create_future()
        self.closed: asyncio.Future[Exception | None] = loop.create_future()
        self.refusal: str | None = None
        self.acks = False  # the peer acknowledges what we write (its answer said so)
        # When we first wrote something not acknowledged since (None: everything was, or acks off).
        self.unacknowledged_since: float | None = None
        self._loop = loop
        self._address = address
        self._peer_id = peer_id
        self._tls = tls
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader(MAX_HELLO_BYTES)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        configure_peer_socket(transport.get_extra_info("socket"))

    def peercert(self) -> dict[str, Any] | None:
        """The listener's verified certificate (None on a plaintext connection)."""
        return self._transport.get_extra_info("peercert") if self._transport is not None else None

    def data_received(self, data: bytes) -> None:
        unreadable = False
        try:
            frames = self._reader.feed(data)
        except FrameError as e:
            frames = e.frames
            if not frames and not self.answer.done():
                self.answer.set_exception(self._not_a_peer(data))
                self.abort()
                return
            unreadable = True
        for body in frames:
            if not self.answer.done():
                self.answer.set_result(body)
            elif not body and self.acks:
                self.unacknowledged_since = None
            elif self.refusal is None:
                try:
                    self.refusal = raft_pb2.Refusal.FromString(body).reason or "no reason given"
                except DecodeError:
                    self.refusal = "an unreadable reason"
        if unreadable and self.refusal is None:
            self.refusal = "an unreadable reason"

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            if self._reader.buffered:  # something came back, but not a frame
                self.answer.set_exception(self._not_a_peer())
            elif isinstance(exc, ssl.SSLError):  # TLS 1.3: the listener refuses our certificate after the handshake
                self.answer.set_exception(handshake_refusal(self._peer_id, self._address, exc))
            else:
                # With TLS, a listener that refuses our certificate may just close: its log says why.
                hint = f"; does {self._peer_id} accept our certificate?" if self._tls else ""
                self.answer.set_exception(ConnectionResetError(
                    f"the connection closed before an answer to our hello{f' ({exc})' if exc else ''}{hint}"))
        if not self.closed.done():
            self.closed.set_result(exc)

    def _not_a_peer(self, received: bytes = b"") -> PeerRefused:
        if looks_like_tls(received):
            return PeerRefused(f"{self._address} answers with TLS: does {self._peer_id} run with "
                               f"--peer-cert-file and this member without?")
        return PeerRefused(f"{self._address} does not answer as a raftkv peer: is it {self._peer_id}'s peer "
                           f"address (--listen-peer), not its client one?")

    def write(self, data: bytes) -> bool:
        """Queue the bytes on the connection; False (nothing written) when it is closing or its
        peer has left MAX_BUFFERED_BYTES unread."""
        t = self._transport
        if t is None or t.is_closing() or t.get_write_buffer_size() > MAX_BUFFERED_BYTES:
            return False
        t.write(data)
        if self.acks and self.unacknowledged_since is None:
            self.unacknowledged_since = self._loop.time()
        return True

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
