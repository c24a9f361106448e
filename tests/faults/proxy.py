"""A fault layer that needs no root: one TCP proxy per directed peer link.

Node i reaches node j's peer port at the proxy of link (i, j) - its --peers entry for j names
that port - so each link can be switched at run time, from any thread. Everything node i sends
node j travels there: its messages on one connection, each snapshot stream on one of its own.

- pass: bytes flow (optionally each chunk held back by a delay with jitter, order kept);
- blackhole: bytes vanish in both directions and new connections hang; when the link leaves
  blackhole, its connections are reset (as a long-dead TCP connection would time out) rather
  than carry on with a hole in their byte stream;
- reject: connections are reset, new ones too;
- flaky: pass, but each chunk resets its connection with a probability.

Like docker-proxy, a Kubernetes Service proxy or a service-mesh sidecar, a proxy keeps listening
while the member behind it is down: it accepts each connection, fails to reach the member, and
closes the accepted connection - with a reset (default), or with a plain FIN (`DownClose.FIN`, as
docker-proxy and Envoy do), so the dialer's connect succeeds and the failure shows only after.
With `DownClose.HOLD` it never closes what it accepted: a connection accepted while the member is
down, or whose connection to the member ended (the member died), stays open on the dialer's side;
the proxy goes on reading and acknowledging its bytes (TCP keepalives too) and drops them, and never
reaches the member for it again, even once the member is back: a half-dead connection.

A link carries node i's requests to j and j's replies to them, so blackholing (i, j) cuts what i
sends to j and nothing of what j sends to i: a one-way partition. Partitions and heal are built
on links. Everything runs on one asyncio loop in a daemon thread.
"""
from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from kv.tools.cluster_up import free_ports

CHUNK_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 1.0


class DownClose(str, Enum):
    """How a proxy closes a connection it accepted while the member behind it is down."""

    RESET = "reset"
    FIN = "fin"
    # Keep it open, read and drop what comes on it, never reach the member for it: also when a
    # connection's member side ends (the member died) while the dialer's side is open.
    HOLD = "hold"


class Mode(str, Enum):
    PASS = "pass"
    BLACKHOLE = "blackhole"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class LinkFault:
    """How one link behaves. Delay, jitter and reset_prob apply in PASS mode."""

    mode: Mode = Mode.PASS
    delay_s: float = 0.0
    jitter_s: float = 0.0
    reset_prob: float = 0.0


HEALTHY = LinkFault()
BLACKHOLE = LinkFault(Mode.BLACKHOLE)
REJECT = LinkFault(Mode.REJECT)


def flaky(delay_s: float, jitter_s: float, reset_prob: float) -> LinkFault:
    return LinkFault(Mode.PASS, delay_s, jitter_s, reset_prob)


def link_count(members: int, clients: int = 0) -> int:
    """How many links (hence ports) a network of `members` and `clients` client links needs."""
    return members * (members - 1) + clients * members


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST, not FIN: SO_LINGER 0, then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


@dataclass(eq=False)
class _Connection:
    """One proxied connection: the accepted side and the upstream side."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tainted: bool = False  # lost bytes to a blackhole: must not carry on after it

    def reset(self) -> None:
        _reset(self.client)
        if self.upstream is not None:
            _reset(self.upstream)


@dataclass(eq=False)
class Link:
    """The proxy of one directed link src -> dst."""

    src: str
    dst: str
    listen_port: int
    target: tuple[str, int]
    rng: random.Random
    fault: LinkFault = HEALTHY
    connections: set[_Connection] = field(default_factory=set)
    server: asyncio.AbstractServer | None = None
    resets: int = 0
    down_close: DownClose = DownClose.RESET
    closed_while_down: int = 0  # connections accepted, then closed because the member was down
    held: int = 0  # connections kept open, their bytes dropped, because the member was down or died

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    def set_fault(self, fault: LinkFault) -> None:
        """On the loop: switch mode, resetting connections that must not survive the switch."""
        old, self.fault = self.fault, fault
        leaving_blackhole = old.mode is Mode.BLACKHOLE and fault.mode is not Mode.BLACKHOLE
        for conn in list(self.connections):
            if fault.mode is Mode.REJECT or (leaving_blackhole and conn.tainted):
                self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        self.resets += 1
        conn.reset()
        self.connections.discard(conn)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._proxy(reader, writer)
        except asyncio.CancelledError:
            # Closing the network cancels us. Ending normally keeps asyncio's stream callback
            # from logging the cancellation as an error (Python 3.11).
            _reset(writer)

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(writer)
        self.connections.add(conn)
        if self.fault.mode is Mode.REJECT:
            self._drop(conn)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            self._member_down(conn)
            if self.down_close is DownClose.HOLD:
                await self._hold(conn, reader)
            elif self.down_close is DownClose.FIN:
                await self._finish(conn, reader)
            return
        conn.upstream = up_writer
        if conn not in self.connections:  # reset while connecting
            _reset(up_writer)
            return
        to_member = asyncio.create_task(self._pump(conn, reader, up_writer))
        # Held, the dialer's side must not see the member's side end.
        from_member = asyncio.create_task(self._pump(conn, up_reader, writer,
                                                     pass_eof=self.down_close is not DownClose.HOLD))
        try:
            await asyncio.wait([to_member, from_member], return_when=asyncio.FIRST_COMPLETED)
            if (self.down_close is DownClose.HOLD and from_member.done() and not to_member.done()
                    and conn in self.connections):
                # The member's side ended first (it died): keep the dialer's side, drop its bytes.
                to_member.cancel()
                await asyncio.gather(to_member, return_exceptions=True)
                _reset(up_writer)
                await self._hold(conn, reader)
                return
            await asyncio.gather(to_member, from_member, return_exceptions=True)
        finally:
            for task in (to_member, from_member):
                task.cancel()
        if conn in self.connections:
            self.connections.discard(conn)
            conn.reset()

    async def _hold(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        """Read and drop what the dialer sends, until it closes or a fault resets the connection."""
        self.held += 1
        conn.upstream = None
        await self._drain(conn, reader)
        if conn in self.connections:
            self.connections.discard(conn)
            conn.reset()

    async def _drain(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        """Read and drop what the dialer sends until it closes its side or the connection ends."""
        try:
            while conn in self.connections and await reader.read(CHUNK_BYTES):
                pass
        except OSError:
            pass

    async def _finish(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        """Close with a FIN whatever the dialer sent: a close() with unread bytes in the socket's
        receive buffer (a dialer writes as soon as it connects) resets the connection instead. So
        half-close first (the FIN), then read and drop what comes until the dialer closes its side
        (or a fault resets the connection), and only then close."""
        try:
            conn.client.write_eof()
        except OSError:
            pass
        else:
            await self._drain(conn, reader)
        if conn in self.connections:
            self.connections.discard(conn)
            conn.client.close()

    def _member_down(self, conn: _Connection) -> None:
        """The member did not take our connection: close the one we accepted for it (FIN: _finish)."""
        if self.down_close is DownClose.HOLD:
            return
        self.closed_while_down += 1
        if self.down_close is DownClose.RESET:
            self._drop(conn)

    async def _pump(self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    pass_eof: bool = True) -> None:
        """Copy one direction chunk by chunk, applying the link's fault to each chunk. Delayed
        chunks go through a queue drained by one task, so they stay in order."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer, pass_eof))
        last_due = 0.0
        try:
            while conn in self.connections:
                data = await reader.read(CHUNK_BYTES)
                if not data:
                    break
                fault = self.fault
                if fault.mode is Mode.BLACKHOLE:
                    conn.tainted = True
                    continue
                if fault.mode is Mode.REJECT or (fault.reset_prob and self.rng.random() < fault.reset_prob):
                    self._drop(conn)
                    break
                delay = fault.delay_s + (self.rng.uniform(-fault.jitter_s, fault.jitter_s) if fault.jitter_s else 0.0)
                last_due = max(last_due, loop.time() + max(0.0, delay))
                queue.put_nowait((last_due, data))
        finally:
            queue.put_nowait(None)
            await sender

    async def _send(self, queue: asyncio.Queue[tuple[float, bytes] | None], writer: asyncio.StreamWriter,
                    pass_eof: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                writer.write(data)
                await writer.drain()
            if pass_eof and writer.can_write_eof():
                writer.write_eof()  # pass a half-close on
        except (OSError, RuntimeError):
            pass  # the connection was reset under us


class ProxyNetwork:
    """A proxy for every ordered pair of members, and one from each named client source to
    every member. `targets` maps a member id to its real peer address (--listen-peer),
    `client_targets` to its real client address (--listen; default: `targets`). Use
    `peers_for(i)` as node i's --peers and `client_address(source, j)` as a client's endpoint
    for j."""

    def __init__(self, targets: dict[str, str], seed: int = 0, ports: list[int] | None = None,
                 client_sources: Iterable[str] = (), client_targets: dict[str, str] | None = None,
                 down_close: DownClose = DownClose.RESET) -> None:
        """`ports`: one free port per link (`link_count`), picked together with the members'
        own ports so that none is handed out twice. `down_close`: how each link closes what it
        accepted while its member is down."""
        self.targets = dict(targets)
        self.client_targets = dict(client_targets if client_targets is not None else targets)
        ids = sorted(targets)
        self.client_sources = sorted(client_sources)
        assert not set(self.client_sources) & set(ids), "a client source cannot be named like a member"
        pairs = [(a, b) for a in ids for b in ids if a != b] + [(c, m) for c in self.client_sources for m in ids]
        ports = ports if ports is not None else free_ports(len(pairs))
        assert len(ports) == len(pairs), f"{len(pairs)} link ports needed, {len(ports)} given"
        rng = random.Random(seed)
        self.links: dict[tuple[str, str], Link] = {}
        for (src, dst), port in zip(pairs, ports):
            target = self.targets[dst] if src in self.targets else self.client_targets[dst]
            host, target_port = target.rsplit(":", 1)
            self.links[(src, dst)] = Link(src, dst, port, (host, int(target_port)), random.Random(rng.random()),
                                          down_close=down_close)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._started = False

    @property
    def members(self) -> list[str]:
        return sorted(self.targets)

    def peers_for(self, node_id: str) -> dict[str, str]:
        """Node `node_id`'s --peers: itself at its own address, every other member via a proxy."""
        return {m: self.targets[m] if m == node_id else self.links[(node_id, m)].address for m in self.members}

    def client_address(self, source: str, member: str) -> str:
        return self.links[(source, member)].address

    def member_behind(self, address: str) -> str | None:
        """The member a proxy address (or a member's own peer or client address) leads to."""
        for link in self.links.values():
            if link.address == address:
                return link.dst
        for addresses in (self.targets, self.client_targets):
            member = next((m for m, a in addresses.items() if a == address), None)
            if member is not None:
                return member
        return None

    def real_address(self, address: str) -> str:
        """The member address behind a proxy address (itself when it is not a proxy)."""
        for link in self.links.values():
            if link.address == address:
                return f"{link.target[0]}:{link.target[1]}"
        return address

    @property
    def peer_links(self) -> list[tuple[str, str]]:
        return [pair for pair in self.links if pair[0] in self.targets]

    @property
    def client_links(self) -> list[tuple[str, str]]:
        return [pair for pair in self.links if pair[0] not in self.targets]

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ProxyNetwork:
        self._thread.start()
        self._started = True
        self._run(self._start_servers())
        return self

    async def _start_servers(self) -> None:
        for link in self.links.values():
            link.server = await asyncio.start_server(link.handle, "127.0.0.1", link.listen_port)

    def close(self) -> None:
        if not self._started:
            return
        self._run(self._stop_servers())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._started = False

    async def _stop_servers(self) -> None:
        for link in self.links.values():
            for conn in list(link.connections):
                link._drop(conn)
            if link.server is not None:
                link.server.close()
        # Connection handlers still waiting on their pumps: end them here, not at interpreter exit.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    # ---- faults -------------------------------------------------------------------------------

    def set_links(self, pairs: Iterable[tuple[str, str]], fault: LinkFault) -> None:
        pairs = list(pairs)

        async def apply() -> None:
            for pair in pairs:
                self.links[pair].set_fault(fault)
        self._run(apply())

    def set_all(self, fault: LinkFault) -> None:
        """Every peer link (client links keep their fault)."""
        self.set_links(self.peer_links, fault)

    def set_clients(self, fault: LinkFault) -> None:
        self.set_links(self.client_links, fault)

    def heal(self) -> None:
        """Every link healthy, client links too."""
        self.set_links(self.links, HEALTHY)

    def cut(self, sources: Iterable[str], destinations: Iterable[str], fault: LinkFault = BLACKHOLE) -> None:
        """One way: nothing from `sources` reaches `destinations`."""
        dsts = set(destinations)
        self.set_links([(s, d) for s in sources for d in dsts if s != d], fault)

    def partition(self, *groups: Iterable[str], fault: LinkFault = BLACKHOLE) -> None:
        """Heal the peer links, then cut every one between different groups (both ways).
        Members not named form one more group. Client links are left as they are."""
        sets = [set(g) for g in groups]
        rest = set(self.members).difference(*sets)
        if rest:
            sets.append(rest)
        group_of = {m: i for i, g in enumerate(sets) for m in g}
        self._run(self._apply_each({pair: HEALTHY if group_of[pair[0]] == group_of[pair[1]] else fault
                                    for pair in self.peer_links}))

    def isolate(self, node_id: str, fault: LinkFault = BLACKHOLE) -> None:
        self.partition([node_id], fault=fault)

    def flaky_everywhere(self, delay_s: float, jitter_s: float, reset_prob: float) -> None:
        self.set_all(flaky(delay_s, jitter_s, reset_prob))

    async def _apply_each(self, faults: dict[tuple[str, str], LinkFault]) -> None:
        for pair, fault in faults.items():
            self.links[pair].set_fault(fault)

    def fault_of(self, src: str, dst: str) -> LinkFault:
        return self.links[(src, dst)].fault
