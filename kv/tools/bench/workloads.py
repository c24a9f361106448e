"""W1..W9, the issue's standard workloads, and W12, W13 (etcd's revisions and transactions: reads
at a past revision, compare-and-swap transactions). Each takes a started, healthy cluster and
returns its metrics; the runner decides which system runs which."""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kv.tools.bench import stopping
from kv.tools.bench.cpu import CpuRoles
from kv.tools.bench.measure import LoadResult, Operation, closed_loop, percentile
from kv.tools.bench.processes import rss_bytes
from kv.tools.bench.settings import Sizes
from kv.tools.bench.systems import LEASE, LINEARIZABLE, STALE, Cluster, Target

MB = 1 << 20
READ_PREFIX = "rd"


@dataclass(frozen=True, slots=True)
class Metric:
    workload: str            # "W1"
    name: str                # "ops/s", "p50 ms", ...
    value: float | None      # None: could not be measured (see note)
    higher_is_better: bool
    note: str = ""


@dataclass
class Context:
    """What one system's run shares between workloads."""

    work_dir: Path
    sizes: Sizes
    targets: list[Target] = field(default_factory=list)

    def target(self, cluster: Cluster) -> Target:
        target = cluster.target(self.sizes.request_timeout_s)
        self.targets.append(target)
        return target

    def close(self) -> None:
        for target in self.targets:
            target.close()
        self.targets.clear()


Workload = Callable[[Cluster, Context], list[Metric]]


class CheckFailed(AssertionError):
    """A workload's check failed after it measured: the round fails with this message, and its
    figures are still reported (say, how many events were delivered, how many leases expired)."""

    def __init__(self, message: str, metrics: list[Metric]) -> None:
        super().__init__(message)
        self.metrics = metrics


def key(prefix: str, worker: int, i: int, size: int = 16) -> bytes:
    """A distinct key of exactly `size` bytes (at least 16): prefix (2 chars), worker, sequence."""
    return f"{prefix[:2]:<2}{worker:03d}{i:0{size - 5}d}".encode()


def value_of(size: int) -> bytes:
    return (b"raftkv-bench-value-" * (size // 19 + 1))[:size]


def load_metrics(workload: str, result: LoadResult, label: str = "", roles: CpuRoles | None = None) -> list[Metric]:
    prefix = f"{label} " if label else ""
    metrics = [Metric(workload, f"{prefix}ops/s", result.ops_per_s, True),
               Metric(workload, f"{prefix}p50 ms", result.percentile_ms(50), False),
               Metric(workload, f"{prefix}p99 ms", result.percentile_ms(99), False)]
    if roles is not None and result.probes is not None:
        per_op = roles.ms_per_op(*result.probes, result.ops)
        metrics += [Metric(workload, f"{prefix}{who} CPU ms/op", value, False) for who, value in per_op.items()]
    return metrics


def measured_load(cluster: Cluster, ctx: Context, operations: list[Operation]) -> tuple[LoadResult, CpuRoles]:
    """The closed loop over `operations`, with the CPU time of every process over its window."""
    roles = CpuRoles.of(cluster, cluster.wait_healthy(ctx.sizes.healthy_timeout_s))
    return closed_loop(operations, ctx.sizes.duration_s, ctx.sizes.warmup_s, roles.probe()), roles


def _puts(cluster: Cluster, ctx: Context, workload: str, clients: int) -> list[Metric]:
    value = value_of(ctx.sizes.value_bytes)

    def operation(worker: int) -> Operation:
        target = ctx.target(cluster)
        return lambda i: target.put(key(workload, worker, i, ctx.sizes.key_bytes), value)

    result, roles = measured_load(cluster, ctx, [operation(w) for w in range(clients)])
    return load_metrics(workload, result, roles=roles)


def w1_sequential_puts(cluster: Cluster, ctx: Context) -> list[Metric]:
    return _puts(cluster, ctx, "W1", 1)


def w2_concurrent_puts(cluster: Cluster, ctx: Context) -> list[Metric]:
    return _puts(cluster, ctx, "W2", ctx.sizes.clients)


def load_read_set(cluster: Cluster, ctx: Context, value: bytes | None = None) -> None:
    """Write the keys W3..W5 and W12 read (in bulk, untimed)."""
    value = value if value is not None else value_of(ctx.sizes.value_bytes)
    pairs = [(key(READ_PREFIX, 0, i, ctx.sizes.key_bytes), value) for i in range(ctx.sizes.read_keys)]
    target = ctx.target(cluster)
    for start in range(0, len(pairs), cluster.max_bulk_ops):
        target.bulk_put(pairs[start:start + cluster.max_bulk_ops])


def _gets(cluster: Cluster, ctx: Context, workload: str, clients: int,
          consistency: str) -> tuple[LoadResult, CpuRoles]:
    n = ctx.sizes.read_keys

    def operation(worker: int) -> Operation:
        target = ctx.target(cluster)

        def get(i: int) -> None:
            wanted = key(READ_PREFIX, 0, (worker * 7919 + i) % n, ctx.sizes.key_bytes)
            if target.get(wanted, consistency) is None:
                raise AssertionError(f"{cluster.system} lost {wanted!r}")
        return get

    return measured_load(cluster, ctx, [operation(w) for w in range(clients)])


def w3_sequential_gets(cluster: Cluster, ctx: Context) -> list[Metric]:
    result, roles = _gets(cluster, ctx, "W3", 1, LINEARIZABLE)
    return load_metrics("W3", result, roles=roles)


def w4_concurrent_gets(cluster: Cluster, ctx: Context) -> list[Metric]:
    result, roles = _gets(cluster, ctx, "W4", ctx.sizes.clients, LINEARIZABLE)
    return load_metrics("W4", result, roles=roles)


def w5_relaxed_gets(cluster: Cluster, ctx: Context) -> list[Metric]:
    """Lease and stale reads where the system has them (etcd: serializable reads count as stale)."""
    metrics: list[Metric] = []
    for consistency in (LEASE, STALE):
        if consistency in cluster.consistencies:
            result, roles = _gets(cluster, ctx, "W5", ctx.sizes.clients, consistency)
            metrics += load_metrics("W5", result, consistency, roles)
    return metrics


def w12_past_revision_gets(cluster: Cluster, ctx: Context) -> list[Metric]:
    """16 clients' linearizable reads of the read set as it was at a past revision: the store's
    revision is noted, then every key of the read set is overwritten (untimed), so each read
    (etcd's Range with `revision`) is answered from the history, never from the current value.
    Each read checks that it got the old value."""
    sizes = ctx.sizes
    past = ctx.target(cluster).revision()
    old = value_of(sizes.value_bytes)
    load_read_set(cluster, ctx, b"N" * len(old))  # the values after `past`
    n = sizes.read_keys

    def operation(worker: int) -> Operation:
        target = ctx.target(cluster)

        def get(i: int) -> None:
            wanted = key(READ_PREFIX, 0, (worker * 7919 + i) % n, sizes.key_bytes)
            got = target.get_at(wanted, past)
            if got != old:
                raise AssertionError(f"{cluster.system} read {got!r:.40} under {wanted!r} at revision {past}")
        return get

    result, roles = measured_load(cluster, ctx, [operation(w) for w in range(sizes.clients)])
    return load_metrics("W12", result, roles=roles)


def w13_cas_txns(cluster: Cluster, ctx: Context) -> list[Metric]:
    """16 clients' compare-and-swap transactions: each client owns one key and sends one Txn after
    another, with one compare (the key's mod revision is the one its last Txn left) and one put, the
    failure branch reading the key. A compare fails only if a Txn was applied twice (a retry after
    an unknown outcome): counted, and shown as "failed compares" when any did."""
    sizes = ctx.sizes
    value = value_of(sizes.value_bytes)
    failed = [0] * sizes.clients

    def operation(worker: int) -> Operation:
        target = ctx.target(cluster)
        mine = key("cs", worker, 0, sizes.key_bytes)  # not "W1"'s keys: key() keeps two characters
        seen = [0]  # the key's mod revision; 0: absent (the first Txn creates it)

        def cas(i: int) -> None:
            new = f"{i:016d}".encode() + value[16:]  # a new value each time
            done, seen[0] = target.cas(mine, seen[0], new)
            if not done:
                failed[worker] += 1
        return cas

    result, roles = measured_load(cluster, ctx, [operation(w) for w in range(sizes.clients)])
    metrics = load_metrics("W13", result, roles=roles)
    if sum(failed):
        metrics.append(Metric("W13", "failed compares", float(sum(failed)), False,
                              "Txns whose compare failed: a retried Txn applied twice"))
    return metrics


def w6_bulk_load(cluster: Cluster, ctx: Context) -> list[Metric]:
    """bulk_keys keys in batches, bulk_clients batches in flight: keys/s."""
    sizes = ctx.sizes
    batch = min(sizes.bulk_batch, cluster.max_bulk_ops)
    value = value_of(sizes.bulk_value_bytes)
    starts: Iterator[int] = iter(range(0, sizes.bulk_keys, batch))
    lock = threading.Lock()

    def next_batch() -> list[tuple[bytes, bytes]] | None:
        if stopping.stop_requested.is_set():
            return None
        with lock:
            start = next(starts, None)
        if start is None:
            return None
        return [(key("bk", 0, i, sizes.key_bytes), value) for i in range(start, min(start + batch, sizes.bulk_keys))]

    def operation(worker: int) -> Operation:
        target = ctx.target(cluster)

        def load(i: int) -> None:
            while (pairs := next_batch()) is not None:
                target.bulk_put(pairs)
        return load

    # One "operation" per worker that drains the shared queue; no warm-up, the whole load counts.
    began = time.perf_counter()
    closed_loop_once([operation(w) for w in range(sizes.bulk_clients)])
    seconds = time.perf_counter() - began
    return [Metric("W6", "keys/s", sizes.bulk_keys / seconds, True, f"{sizes.bulk_keys} keys, batches of {batch}"),
            Metric("W6", "seconds", seconds, False)]


def closed_loop_once(operations: Sequence[Operation]) -> None:
    """Run each operation once, each in its own thread; raise the first error."""
    errors: list[BaseException] = []

    def run(op: Operation) -> None:
        try:
            op(0)
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            errors.append(error)

    threads = [threading.Thread(target=run, args=(op,), daemon=True) for op in operations]
    for thread in threads:
        thread.start()
    for thread in threads:
        stopping.join(thread)
    stopping.check()
    if errors:
        raise errors[0]


@dataclass
class _FailoverProbe:
    """Writers note each acknowledged write; the first one that started after the kill marks the
    end of the failover."""

    kill_time: float | None = None
    first_ack: float | None = None
    acks: int = 0
    warmed: threading.Event = field(default_factory=threading.Event)
    recovered: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    warm_acks: int = 20

    def acknowledged(self, started: float, ended: float) -> None:
        with self.lock:
            self.acks += 1
            if self.acks >= self.warm_acks:
                self.warmed.set()
            if self.kill_time is not None and started >= self.kill_time and self.first_ack is None:
                self.first_ack = ended
                self.recovered.set()


def _failover_writer(target: Target, probe: _FailoverProbe, worker: int, value: bytes) -> None:
    for i in itertools.count():
        if probe.stop.is_set() or stopping.stop_requested.is_set():
            return
        started = time.monotonic()
        try:
            target.put(key("fo", worker, i), value)
        except Exception:  # noqa: BLE001 - a write may time out during the election; keep loading
            continue
        probe.acknowledged(started, time.monotonic())


def failover_trial(cluster: Cluster, ctx: Context) -> float:
    """Kill the leader under write load; seconds from the SIGKILL to the first acknowledged write
    issued after it. The killed member is restarted and caught up before returning."""
    sizes = ctx.sizes
    leader = cluster.wait_healthy(sizes.healthy_timeout_s)
    probe = _FailoverProbe()
    value = value_of(sizes.value_bytes)
    targets = [cluster.target(sizes.request_timeout_s) for _ in range(sizes.failover_clients)]
    writers = [threading.Thread(target=_failover_writer, args=(t, probe, w, value), daemon=True)
               for w, t in enumerate(targets)]
    try:
        for writer in writers:
            writer.start()
        if not stopping.wait(probe.warmed, sizes.healthy_timeout_s):
            raise RuntimeError(f"{cluster.system}: writes are not being acknowledged before the kill")
        with probe.lock:
            probe.kill_time = time.monotonic()
        cluster.kill(leader)
        if not stopping.wait(probe.recovered, sizes.healthy_timeout_s):
            raise RuntimeError(f"{cluster.system}: no write acknowledged within {sizes.healthy_timeout_s:.0f}s "
                               f"of killing leader {leader}")
        assert probe.first_ack is not None
        return probe.first_ack - probe.kill_time
    finally:
        probe.stop.set()
        for writer in writers:
            stopping.join(writer)
        for target in targets:
            target.close()
        stopping.check()  # stopping: the registry stops the members; no restart
        cluster.restart(leader)
        cluster.wait_healthy(sizes.healthy_timeout_s)


def w7_failover(cluster: Cluster, ctx: Context) -> list[Metric]:
    times = [failover_trial(cluster, ctx) for _ in range(ctx.sizes.failover_trials)]
    return [Metric("W7", "p50 s", percentile(times, 50), False, f"{len(times)} trials"),
            Metric("W7", "max s", max(times), False)]


def w9_memory(cluster: Cluster, ctx: Context) -> list[Metric]:
    """Resident size of each member (run after W6)."""
    sizes = {m: rss_bytes(pid) for m in cluster.members if (pid := cluster.pid(m)) is not None}
    known = [v for v in sizes.values() if v is not None]
    if not known:
        return [Metric("W9", "max MB", None, False, "no member running")]
    note = ", ".join(f"{m} {v / MB:.0f}" for m, v in sizes.items() if v is not None)
    return [Metric("W9", "max MB", max(known) / MB, False, f"RSS MB: {note}"),
            Metric("W9", "sum MB", sum(known) / MB, False)]
