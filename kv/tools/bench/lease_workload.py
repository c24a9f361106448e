"""W15 (issue 31, "Speed"): many leases kept alive, through etcd's Lease service (raw gRPC stubs,
as EtcdTarget), on raftkv and etcd alike; what each keep-alive costs the leader.

- `leases` leases of `lease_ttl_s` are granted on the leader (up to GRANTS_IN_FLIGHT at once), the
  server choosing their IDs; the grants per second are reported.
- `lease_streams` LeaseKeepAlive streams to the leader (each one client: its own channel, one
  stream, as etcd's clientv3 keeps one stream per client) share the leases, and every lease is
  kept alive once per TTL/3, as clientv3 renews each of its leases: evenly spread, leases x 3 / TTL
  keep-alives a second in all. They start with the grants: a lease is kept alive from its first
  turn after its grant was answered, so a slow grant phase expires none.
- Once every lease is granted, after warmup_s, the window of `lease_duration_s`: keep-alives
  renewing a lease (answered with a TTL) in it per second, and the CPU of each member (and of the
  bench's client) over it per such keep-alive.
- A keep-alive answered with TTL 0 (no such lease) fails the round, and so does a lease missing
  from LeaseLeases at the end, or one whose LeaseTimeToLive says it has expired (sampled); the
  figures are still reported, "leases expired" among them.
"""
from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc

from kv.tools.bench import stopping
from kv.tools.bench.cpu import CpuRoles
from kv.tools.bench.measure import percentile
from kv.tools.bench.systems import Cluster
from kv.tools.bench.watch_workload import member_channel
from kv.tools.bench.workloads import CheckFailed, Context, Metric
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc as pb_grpc

GRANTS_IN_FLIGHT = 64
# Leases whose remaining TTL is read back at the end (LeaseTimeToLive), besides LeaseLeases.
TIME_TO_LIVE_SAMPLE = 100


@dataclass
class _Grants:
    """The leases as they are granted: lease j (the j-th grant sent) has ids[j] once answered."""

    total: int
    ids: list[int | None]
    answered_ns: list[int]
    errors: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def of(cls, total: int) -> _Grants:
        return cls(total, [None] * total, [0] * total)


def grant_all(stub: pb_grpc.LeaseStub, grants: _Grants, ttl_s: int, timeout_s: float) -> None:
    """Grant every lease of `grants`, up to GRANTS_IN_FLIGHT at once; returns once all are answered."""
    slots = threading.Semaphore(GRANTS_IN_FLIGHT)
    lock = threading.Lock()
    left = [grants.total]

    def finished(j: int, future: grpc.Future) -> None:
        now = time.monotonic_ns()
        try:
            response = future.result()
            if response.TTL >= ttl_s and not response.error:
                grants.answered_ns[j] = now
                grants.ids[j] = response.ID
            else:
                grants.errors.append(f"granted {response.ID:x} with TTL {response.TTL} ({response.error!r})")
        except grpc.RpcError as error:
            grants.errors.append(f"{error.code().name} {error.details()}")  # type: ignore[attr-defined]
        slots.release()
        with lock:
            left[0] -= 1
            if left[0] == 0:
                grants.done.set()

    issued = 0
    for j in range(grants.total):
        while not slots.acquire(timeout=0.1):
            stopping.check()
        if grants.errors:
            break
        stub.LeaseGrant.future(pb.LeaseGrantRequest(TTL=ttl_s), timeout=timeout_s).add_done_callback(
            functools.partial(finished, j))
        issued += 1
    with lock:
        left[0] -= grants.total - issued
        if left[0] == 0:
            grants.done.set()
    if not stopping.wait(grants.done, timeout_s + 5):
        raise RuntimeError(f"lease grants not answered within {timeout_s + 5:.0f}s")
    stopping.check()
    if grants.errors:
        raise RuntimeError(f"lease grants failed ({len(grants.errors)}): {grants.errors[:3]}")


@dataclass
class _KeepAliveStream:
    """One client's LeaseKeepAlive stream over the leases j of `mine` (indices into grants.ids):
    lease j is kept alive at start + (j / total + k) x period, k = 0, 1, ..., from the first such
    time after it was granted, while that time is before `stop_ns` (set once the window is known).
    Answers are counted in `window` (also set then)."""

    mine: list[int]
    grants: _Grants
    start_ns: int
    period_ns: int
    stop_ns: float = float("inf")
    window: tuple[float, float] = (float("inf"), float("inf"))
    sent: int = 0
    acked_in_window: int = 0  # answers renewing a lease (TTL > 0)
    gone_in_window: int = 0   # answers saying the lease is gone (TTL 0)
    latencies_ns: list[int] = field(default_factory=list)
    expired: list[int] = field(default_factory=list)
    error: str | None = None
    _pending: dict[int, int] = field(default_factory=dict)
    _halt: threading.Event = field(default_factory=threading.Event)

    def requests(self) -> Iterator[pb.LeaseKeepAliveRequest]:
        """Consumed by gRPC's own thread: each keep-alive when it is due."""
        ids, total = self.grants.ids, self.grants.total
        for k in itertools.count():
            for j in self.mine:
                due = self.start_ns + (j * self.period_ns) // total + k * self.period_ns
                if due >= self.stop_ns:
                    return
                while (left := due - time.monotonic_ns()) > 0:
                    if self._halt.wait(min(left / 1e9, 0.5)) or due >= self.stop_ns:
                        return
                if self._halt.is_set():
                    return
                lease = ids[j]
                if lease is None:
                    continue  # not granted yet: from its next turn on
                self._pending[lease] = time.monotonic_ns()
                self.sent += 1
                yield pb.LeaseKeepAliveRequest(ID=lease)
        return

    def read(self, responses: Iterator[pb.LeaseKeepAliveResponse]) -> None:
        """Until the server ends the stream (after the last request): count and time the answers."""
        try:
            for response in responses:
                now = time.monotonic_ns()
                sent = self._pending.pop(response.ID, None)
                begin, end = self.window
                if response.TTL <= 0:
                    self.expired.append(response.ID)
                    self.gone_in_window += begin <= now <= end
                elif begin <= now <= end:
                    self.acked_in_window += 1
                    if sent is not None:
                        self.latencies_ns.append(now - sent)
        except grpc.RpcError as error:
            self.error = f"{error.code().name} {error.details()}"  # type: ignore[attr-defined]
            self._halt.set()

    def halt(self) -> None:
        self._halt.set()


def w15_leases(cluster: Cluster, ctx: Context) -> list[Metric]:
    sizes = ctx.sizes
    leader = cluster.wait_healthy(sizes.healthy_timeout_s)
    roles = CpuRoles.of(cluster, leader)
    ttl, n = sizes.lease_ttl_s, sizes.leases
    period_ns = ttl * 1_000_000_000 // 3
    channels = [member_channel(cluster, leader) for _ in range(1 + sizes.lease_streams)]
    grants = _Grants.of(n)
    streams: list[_KeepAliveStream] = []
    calls: list[grpc.Future] = []
    readers: list[threading.Thread] = []
    try:
        stub = pb_grpc.LeaseStub(channels[0])
        start = time.monotonic_ns()
        # The keep-alives start with the grants: a lease is kept alive from its first turn after it
        # was granted, however long granting all of them takes.
        for s in range(sizes.lease_streams):
            stream = _KeepAliveStream(list(range(s, n, sizes.lease_streams)), grants, start, period_ns)
            call = pb_grpc.LeaseStub(channels[1 + s]).LeaseKeepAlive(stream.requests())
            reader = threading.Thread(target=stream.read, args=(call,), daemon=True, name=f"w15-keepalive-{s}")
            reader.start()
            streams.append(stream)
            calls.append(call)
            readers.append(reader)
        grant_all(stub, grants, ttl, sizes.request_timeout_s)
        granted = time.monotonic_ns()
        window = (granted + int(sizes.warmup_s * 1e9), granted + int((sizes.warmup_s + sizes.lease_duration_s) * 1e9))
        for stream in streams:
            stream.window, stream.stop_ns = window, window[1]
        probe = roles.probe()
        _sleep_until(window[0], streams)
        before = probe()
        _sleep_until(window[1], streams)
        after = probe()
        for reader in readers:  # each stream ends once its last keep-alive is answered
            reader.join(sizes.request_timeout_s)
            stopping.check()
        ids = [lease for lease in grants.ids if lease is not None]
        alive = {status.ID for status in
                 stub.LeaseLeases(pb.LeaseLeasesRequest(), timeout=sizes.request_timeout_s).leases}
        sample = ids[:: max(1, n // TIME_TO_LIVE_SAMPLE)]
        remaining = [stub.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lease), timeout=sizes.request_timeout_s).TTL
                     for lease in sample]
    finally:
        for stream in streams:
            stream.halt()
        for call in calls:
            call.cancel()
        for channel in channels:
            channel.close()
    errors = [s.error for s in streams if s.error]
    if errors:
        raise RuntimeError(f"{cluster.system}: keep-alive streams failed: {errors[:3]}")
    acked = sum(s.acked_in_window for s in streams)
    gone = sum(s.gone_in_window for s in streams)
    per_us = {who: ms * 1000 for who, ms in roles.ms_per_op(before, after, acked).items()} if acked else {}
    latencies = [lat / 1e9 for s in streams for lat in s.latencies_ns]
    grant_s = (granted - start) / 1e9
    expired = [lease for s in streams for lease in s.expired]
    missing = set(ids) - alive
    dead = [(lease, ttl_left) for lease, ttl_left in zip(sample, remaining) if ttl_left <= 0]
    metrics = [
        Metric("W15", "keep-alives/s", acked / sizes.lease_duration_s, True,
               f"{n:,} leases of {ttl}s, each kept alive every {ttl / 3:.1f}s over {sizes.lease_streams} streams "
               f"to the leader: {n * 3 / ttl:,.0f}/s aimed at; answers renewing a lease in the "
               f"{sizes.lease_duration_s:.0f}s window"
               + (f", besides {gone:,} saying it was gone (TTL 0)" if gone else "")),
        Metric("W15", "leader CPU us/keep-alive", per_us.get("leader"), False,
               "over the window, per keep-alive renewing a lease"),
        Metric("W15", "follower CPU us/keep-alive", per_us.get("follower"), False),
        Metric("W15", "client CPU us/keep-alive", per_us.get("client"), False),
        Metric("W15", "p50 ms", percentile(latencies, 50) * 1000, False, "a renewing keep-alive's round trip"),
        Metric("W15", "p99 ms", percentile(latencies, 99) * 1000, False),
        Metric("W15", "grants/s", n / grant_s, True,
               f"{GRANTS_IN_FLIGHT} grants in flight, the keep-alives of those granted running: {grant_s:.1f}s"),
        Metric("W15", "leases expired", float(len(missing)), False,
               f"of {n:,}: missing from LeaseLeases after the window; {len(expired):,} keep-alives answered TTL 0"),
    ]
    if expired or missing or dead or not acked:
        raise CheckFailed(
            f"{cluster.system}: leases expired while kept alive: {len(expired):,} keep-alives answered TTL 0, "
            f"{len(missing):,} of {n:,} leases missing from LeaseLeases, {len(dead)} of {len(sample)} sampled "
            f"with no time left, {acked:,} keep-alives answered in the window", metrics)
    return metrics


def _sleep_until(instant_ns: int, streams: list[_KeepAliveStream]) -> None:
    """Until time.monotonic_ns() reaches `instant_ns`, or a stream failed, or Ctrl-C."""
    while (left := instant_ns - time.monotonic_ns()) > 0:
        if any(s.error for s in streams):
            return
        stopping.stop_requested.wait(min(left / 1e9, 0.1))
        stopping.check()
