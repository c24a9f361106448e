"""W14 (issue 31, "Speed"): many watchers on one prefix while one client puts at a steady rate,
through etcd's Watch and KV services (raw gRPC stubs, as EtcdTarget), on raftkv and etcd alike.

- The watchers: `watchers` watches over `watch_streams` streams (each stream one client: its own
  channel, one Watch stream carrying watchers / watch_streams watches, as etcd's clientv3
  multiplexes a client's watches), the streams spread round-robin over the members, run by
  `watch_processes` processes of their own (kv/tools/bench/watchers.py).
- The writer: in the bench process, one client on the leader, puts key i of the prefix at
  start + i / rate, each put's value carrying its send time (time.monotonic_ns just before the
  call), up to WRITER_IN_FLIGHT puts in flight so that one slow put does not hold the rate back
  (when they are all in flight the writer waits: the rate it reached is reported). A put that
  times out is sent again, as EtcdTarget does; the note says how many were.
- Every watch must receive every event the store holds under the prefix (each put, and a put
  applied twice after a retry twice) exactly once, in revision order; otherwise the workload
  fails, naming the watches that did not, with its figures still reported.

Reported: the writer's rate, events delivered per second (every event over the time from the
first put to the last event received), delivery latency p50/p99/max (receive time - send time,
every event of every watch), the members' CPU over the same time (the leader's, a follower's,
and all three per event delivered) and the watching clients'."""
from __future__ import annotations

import functools
import json
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

import grpc

from kv.client.client import CHANNEL_OPTIONS
from kv.client.tls import open_channel
from kv.tools.bench import stopping
from kv.tools.bench.cpu import CpuRoles
from kv.tools.bench.measure import percentile
from kv.tools.bench.processes import Child
from kv.tools.bench.systems import Cluster
from kv.tools.bench.watchers import VALUE, merged_percentile, order_hash, prefix_end
from kv.tools.bench.workloads import CheckFailed, Context, Metric
from kv.tools.cluster_up import child_env
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc as pb_grpc

PREFIX = "w14/"
WRITER_IN_FLIGHT = 64
# Attempts at one put (a retry after a timeout or while there is no leader), as EtcdTarget's.
WRITER_ATTEMPTS = 5
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# How long the watching processes may take to start and create their watches.
READY_TIMEOUT_S = 120.0


@dataclass
class _WatcherProcess(Child):
    """A watching process: a Child (so the registry stops it on every exit path) with its stdin and
    stdout as pipes, one JSON object a line; its stderr goes to its log."""

    def start(self) -> None:
        assert not self.running, f"{self.name} is already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._log, env=self.env, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()

    def _read(self, out: IO[bytes] | None) -> None:
        assert out is not None
        for line in out:
            self.lines.put(line.decode())
        self.lines.put(None)

    def tell(self, message: dict[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()

    def next_message(self, timeout_s: float) -> dict[str, Any]:
        """The next line the process writes, as JSON; RuntimeError if it ends or is silent for `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            stopping.check()
            try:
                line = self.lines.get(timeout=min(0.1, max(deadline - time.monotonic(), 0.001)))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"watching process {self.name} said nothing for {timeout_s:.0f}s; "
                                       f"its log:\n{self.log_tail()}") from None
                continue
            if line is None:
                code = self.process.wait() if self.process is not None else None
                raise RuntimeError(f"watching process {self.name} ended (exit {code}); its log:\n{self.log_tail()}")
            return json.loads(line)


def member_channel(cluster: Cluster, member: str) -> grpc.Channel:
    """A channel of its own (one client) to `member`'s client port."""
    tls = cluster.client_tls
    return open_channel(cluster.client_address(member), tls.credentials() if tls else None, CHANNEL_OPTIONS)


def _tls_files(cluster: Cluster) -> list[str | None] | None:
    tls = cluster.client_tls
    if tls is None:
        return None
    return [str(f) if f is not None else None for f in (tls.ca_file, tls.cert_file, tls.key_file)]


def stream_plan(members: list[str], watchers: int, streams: int) -> list[tuple[str, int]]:
    """(member, watches) of each stream: streams round-robin over the members, the watchers as
    evenly as they go over the streams."""
    streams = max(1, min(streams, watchers))
    return [(members[s % len(members)], watchers // streams + (1 if s < watchers % streams else 0))
            for s in range(streams)]


@dataclass
class _Writes:
    sends_ns: list[int]   # when put i was first sent
    acks_ns: list[int]    # when it was acknowledged
    revisions: list[int]  # the revision it was acknowledged at
    retries: int = 0
    errors: list[str] = field(default_factory=list)


def write_paced(stub: pb_grpc.KVStub, puts: int, rate: float, timeout_s: float,
                in_flight: int = WRITER_IN_FLIGHT) -> _Writes:
    """Put keys 0..puts-1 of the prefix, put i at start + i / rate (as soon as possible when late),
    at most `in_flight` at once, each value carrying its first send time; waits for every answer.
    A put that times out or finds no leader is sent again, the same key and value, up to
    WRITER_ATTEMPTS times in all: the store may then hold it twice (expected_events counts what it
    holds)."""
    writes = _Writes([0] * puts, [0] * puts, [0] * puts)
    slots = threading.Semaphore(in_flight)
    answered = threading.Event()
    left = [puts]
    lock = threading.Lock()

    def send(i: int, request: pb.PutRequest, attempt: int) -> None:
        future = stub.Put.future(request, timeout=timeout_s)
        future.add_done_callback(functools.partial(finished, i, request, attempt))

    def finished(i: int, request: pb.PutRequest, attempt: int, future: grpc.Future) -> None:
        try:
            writes.revisions[i] = future.result().header.revision
            writes.acks_ns[i] = time.monotonic_ns()
        except grpc.RpcError as error:
            code = error.code()  # type: ignore[attr-defined]
            if code in RETRYABLE and attempt < WRITER_ATTEMPTS and not stopping.stop_requested.is_set():
                with lock:
                    writes.retries += 1
                send(i, request, attempt + 1)
                return
            details = error.details()  # type: ignore[attr-defined]
            writes.errors.append(f"put {i}, attempt {attempt}: {code.name} {details}")
        slots.release()
        with lock:
            left[0] -= 1
            if left[0] == 0:
                answered.set()

    period_ns = 1e9 / rate
    start = time.monotonic_ns()
    issued = 0
    for i in range(puts):
        if stopping.stop_requested.is_set() or writes.errors:
            break
        delay = (start + i * period_ns - time.monotonic_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        while not slots.acquire(timeout=0.1):
            stopping.check()
        sent = time.monotonic_ns()
        writes.sends_ns[i] = sent
        send(i, pb.PutRequest(key=f"{PREFIX}{i:08d}".encode(), value=VALUE.pack(i, sent)), 1)
        issued += 1
    with lock:
        left[0] -= puts - issued
        if left[0] == 0:
            answered.set()
    wait_s = WRITER_ATTEMPTS * (timeout_s + 1)
    if not stopping.wait(answered, wait_s):
        raise RuntimeError(f"puts not answered within {wait_s:.0f}s")
    stopping.check()
    if writes.errors:
        raise RuntimeError(f"the writer's puts failed ({len(writes.errors)}): {writes.errors[:3]}")
    return writes


def expected_events(stub: pb_grpc.KVStub, writes: _Writes, timeout_s: float) -> list[int]:
    """The sequence numbers of the puts the store holds under the prefix, in revision order: what
    every watch must receive. A put sent twice (a retry) and applied twice is there twice: a key's
    earlier revisions are read back one by one (its value at the revision before each). Checks
    that each put is there, at the revision it was acknowledged at among its revisions."""
    prefix = PREFIX.encode()
    response = stub.Range(pb.RangeRequest(key=prefix, range_end=prefix_end(prefix), keys_only=True),
                          timeout=timeout_s)
    events: list[tuple[int, int]] = []
    seen = set()
    for kv in response.kvs:
        seq = int(kv.key[len(prefix):])
        revisions = [kv.mod_revision]
        while len(revisions) < kv.version:  # the key's earlier puts: its state just before the last one found
            older = stub.Range(pb.RangeRequest(key=kv.key, revision=revisions[-1] - 1, keys_only=True),
                               timeout=timeout_s).kvs
            if not older:
                raise AssertionError(f"{kv.key!r} has version {kv.version}, but nothing before revision "
                                     f"{revisions[-1]}")
            revisions.append(older[0].mod_revision)
        if seq >= len(writes.revisions) or writes.revisions[seq] not in revisions:
            raise AssertionError(f"{kv.key!r} is at revisions {revisions}, but its put was acknowledged at "
                                 f"{writes.revisions[seq] if seq < len(writes.revisions) else 'none'}")
        seen.add(seq)
        events += [(revision, seq) for revision in revisions]
    missing = sorted(set(range(len(writes.revisions))) - seen)
    if missing:
        raise AssertionError(f"{len(missing)} acknowledged puts are not in the store: keys {missing[:5]}")
    return [seq for _, seq in sorted(events)]


def check_deliveries(system: str, results: list[dict[str, Any]], expected: int,
                     expected_hash: int) -> tuple[int, str | None]:
    """How many watches did not get `expected` events in the order the hash says, and what went
    wrong (naming them; None when every watch did and no stream failed)."""
    bad = [(endpoint, watch_id, count, h, error) for r in results
           for endpoint, watch_id, count, h, error in r["watches"]
           if count != expected or h != expected_hash or error is not None]
    stream_errors = [e for r in results for e in r["stream_errors"]]
    if bad or stream_errors:
        total = sum(len(r["watches"]) for r in results)
        shown = "; ".join(f"{endpoint} watch {watch_id}: {count} events" + (f", {error}" if error else "")
                          + (", out of order" if h != expected_hash and count == expected else "")
                          for endpoint, watch_id, count, h, error in bad[:5])
        delivered = sum(r["watches"][i][2] for r in results for i in range(len(r["watches"])))
        return len(bad), (
            f"{system}: {len(bad)} of {total} watches did not receive each of the {expected:,} events exactly once "
            f"in revision order ({delivered:,} of {expected * total:,} events delivered): {shown}"
            + (f"; stream errors: {stream_errors[:3]}" if stream_errors else ""))
    return 0, None


def w14_watchers(cluster: Cluster, ctx: Context) -> list[Metric]:
    sizes = ctx.sizes
    leader = cluster.wait_healthy(sizes.healthy_timeout_s)
    roles = CpuRoles.of(cluster, leader)
    plan = stream_plan(cluster.members, sizes.watchers, sizes.watch_streams)
    processes = max(1, min(sizes.watch_processes, len(plan)))
    puts = max(1, round(sizes.watch_rate * sizes.watch_duration_s))
    children = []
    for p in range(processes):
        mine = [(cluster.client_address(member), n) for member, n in plan[p::processes]]
        config = {"streams": mine, "prefix": PREFIX, "tls": _tls_files(cluster)}
        children.append(_WatcherProcess(f"w14-watchers-{p + 1}",
                                        [sys.executable, "-m", "kv.tools.bench.watchers", json.dumps(config)],
                                        ctx.work_dir / f"w14-watchers-{p + 1}.log", env=child_env()))
    registry = cluster.registry
    channel = member_channel(cluster, leader)
    try:
        for child in children:
            registry.spawn(child)
        watches = sum(child.next_message(READY_TIMEOUT_S)["ready"] for child in children)
        stub = pb_grpc.KVStub(channel)
        stub.Range(pb.RangeRequest(key=b"\0", count_only=True), timeout=sizes.request_timeout_s)  # connected
        probe = roles.probe()
        before, client_before = probe(), time.process_time()
        writes = write_paced(stub, puts, sizes.watch_rate, sizes.request_timeout_s)
        order = expected_events(stub, writes, sizes.request_timeout_s)
        for child in children:
            child.tell({"events": len(order), "drain_s": sizes.watch_drain_s})
        for child in children:  # each says when its watches have drained
            child.next_message(sizes.watch_drain_s + 30)
        after, client_after = probe(), time.process_time()
        results = [child.next_message(READY_TIMEOUT_S) for child in children]
    finally:
        channel.close()
        for child in children:
            child.terminate()
        registry.forget(children)
    first_put, last_put = writes.sends_ns[0], writes.sends_ns[-1]
    last_event = max([r["last_ns"] for r in results if r["last_ns"]] or [first_put])
    events = sum(r["events"] for r in results)
    seconds = (last_event - first_put) / 1e9
    sketches = [(count, points) for r in results for count, points in r["latencies"].values()]
    by_member = {m: [(count, points) for r in results for address, (count, points) in r["latencies"].items()
                     if address == cluster.client_address(m)] for m in cluster.members}
    served = "; ".join(f"{'leader' if m == leader else 'follower'} {m}: p50 {merged_percentile(s, 50) / 1e6:.3g}, "
                       f"p99 {merged_percentile(s, 99) / 1e6:.3g}" for m, s in by_member.items() if s)
    put_latencies = [(ack - sent) / 1e9 for sent, ack in zip(writes.sends_ns, writes.acks_ns)]
    cpu = {m: after[m] - before[m] for m in roles.pids}
    followers = [m for m in roles.pids if m != leader]
    note = (f"{watches:,} watches on {len(plan)} streams ({sizes.watchers // len(plan)}"
            f"{'+' if sizes.watchers % len(plan) else ''} each) over {len(cluster.members)} members, "
            f"{processes} watching processes; {puts:,} puts, aimed at {sizes.watch_rate:,.0f}/s"
            + (f"; {writes.retries} put attempts repeated after a timeout, {len(order) - puts} puts applied twice"
               if writes.retries else ""))
    rate = (puts - 1) / ((last_put - first_put) / 1e9) if puts > 1 and last_put > first_put else None
    if rate is not None and rate < 0.9 * sizes.watch_rate:
        note += (f"; the writer fell behind (at most {WRITER_IN_FLIGHT} puts in flight): the latencies are those "
                 f"of {rate:,.0f} puts/s, not of the rate aimed at")
    metrics = [
        Metric("W14", "puts/s", rate, True, note),
        Metric("W14", "events/s", events / seconds if seconds > 0 else None, True,
               f"{events:,} events from the first put to the last event, {seconds:.1f}s"),
        Metric("W14", "p50 ms", merged_percentile(sketches, 50) / 1e6, False,
               f"delivery latency, ms, by the member the watch is on: {served}"),
        Metric("W14", "p99 ms", merged_percentile(sketches, 99) / 1e6, False),
        Metric("W14", "max ms", max([points[-1] for _, points in sketches if points] or [0]) / 1e6, False),
        Metric("W14", "put p50 ms", percentile(put_latencies, 50) * 1000, False,
               "the writer's puts, sent to acknowledged (part of the delivery latency)"),
        Metric("W14", "put p99 ms", percentile(put_latencies, 99) * 1000, False),
        Metric("W14", "leader CPU s", cpu[leader], False, f"over the {seconds:.1f}s"),
        Metric("W14", "follower CPU s", sum(cpu[m] for m in followers) / len(followers) if followers else None, False),
        Metric("W14", "members CPU us/event", sum(cpu.values()) * 1e6 / events if events else None, False,
               "the three members' CPU over the run, per event delivered"),
        Metric("W14", "watchers CPU s", sum(r["cpu_s"] for r in results), False,
               "the watching processes' CPU, from their start"),
        Metric("W14", "writer CPU s", client_after - client_before, False, "the bench process's CPU over the run"),
    ]
    wrong, failure = check_deliveries(cluster.system, results, len(order), order_hash(order))
    metrics.append(Metric("W14", "watches not exact", float(wrong), False,
                          f"of {watches:,}: watches that did not get each of the {len(order):,} events exactly once, "
                          f"in revision order"))
    if failure is not None:
        raise CheckFailed(failure, metrics)
    return metrics
