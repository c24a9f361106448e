"""W16 (raftkv only): membership change and leadership transfer on the bench's three-node cluster
(decision 0064), through etcd's Cluster and Maintenance services as kv.Client calls them
(kv/client/members.py), whatever `--api` says; the puts of part 2 go through the `--api`'s client.

1. Add to voter. The store holds at least `membership_keys` keys: if it holds fewer (W16 alone, or
   after the small workloads), W16 bulk-loads its own keys up to that count (W6's key and value
   sizes, untimed); after W6 it reuses W6's store. Then, timed: MemberAdd of the learner n4;
   n4 started with `serve --join` on an empty data directory under the round's work dir; n4
   caught up (its applied index reaches the leader's commit index; its snapshot index says
   whether it got there by a snapshot install or by the log); MemberPromote retried while refused
   ("can only promote a learner member which is in sync with leader") until it succeeds. Reported:
   the whole, its two parts, the store's keys and size. Then n4 is removed (MemberRemove) and its
   process stopped: the cluster has its three members again.
2. Transfer stall. One client puts sequentially as fast as it can; after warmup_s,
   MoveLeader to a follower, `transfers` times, `TRANSFER_SETTLE_S` apart. For each transfer, the
   longest gap between two acknowledged puts whose interval overlaps the MoveLeader call; reported:
   the median and the max of those, the median put latency over the whole run, and how long
   MoveLeader took (it answers once the target leads)."""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kv.client.client import Client
from kv.errors import FailedPreconditionError, RaftKVError, UnavailableError
from kv.errors import TimeoutError as KvTimeoutError
from kv.tools.bench import stopping
from kv.tools.bench.measure import median, percentile
from kv.tools.bench.processes import Child
from kv.tools.bench.systems import Cluster
from kv.tools.bench.watch_workload import member_channel
from kv.tools.bench.workloads import MB, Context, Metric, key, value_of
from kv.tools.cluster_up import CERTS_DIR, NodeSpec, child_env, free_ports, serve_command, with_tls
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc as pb_grpc

NEW_MEMBER = "n4"
LOAD_PREFIX = "mc"  # W16's own keys, when the store holds fewer than membership_keys
PUT_PREFIX = "mv"   # the puts of part 2
POLL_S = 0.05
# How long n4 may take to start, catch up and be promoted; and a membership call to be taken.
JOIN_TIMEOUT_S = 600.0
CHANGE_TIMEOUT_S = 60.0
# Puts between two transfers (and after the last): the next one starts on a settled cluster.
TRANSFER_SETTLE_S = 1.0
WARM_ACKS = 20
# Refusals a membership call is retried on: a change still in progress, no leader for a moment,
# a learner not in sync yet.
RETRIED = (FailedPreconditionError, UnavailableError, KvTimeoutError)


def w16_membership(cluster: Cluster, ctx: Context) -> list[Metric]:
    sizes = ctx.sizes
    cluster.wait_healthy(sizes.healthy_timeout_s)
    with Client(_endpoints(cluster), timeout=sizes.request_timeout_s, tls=cluster.client_tls) as admin:
        joined = add_to_voter(cluster, ctx, admin)
        cluster.wait_healthy(sizes.healthy_timeout_s)
        stalls = transfer_stalls(cluster, ctx, admin)
    return joined + stalls


def _endpoints(cluster: Cluster) -> list[str]:
    return [cluster.client_address(m) for m in cluster.members]


# ---- 1. add to voter -----------------------------------------------------------------------------

def store_keys(cluster: Cluster, member: str) -> int:
    """How many keys the store holds (a count-only Range over every key at `member`)."""
    channel = member_channel(cluster, member)
    try:
        request = pb.RangeRequest(key=b"\0", range_end=b"\0", count_only=True)
        return int(pb_grpc.KVStub(channel).Range(request, timeout=60.0).count)
    finally:
        channel.close()


def fill_store(cluster: Cluster, ctx: Context, have: int) -> int:
    """Bulk-put W16's own keys until the store holds membership_keys keys; how many were put."""
    sizes = ctx.sizes
    wanted = sizes.membership_keys - have
    if wanted <= 0:
        return 0
    batch = min(sizes.bulk_batch, cluster.max_bulk_ops)
    value = value_of(sizes.bulk_value_bytes)
    target = ctx.target(cluster)
    for start in range(0, wanted, batch):
        stopping.check()
        target.bulk_put([(key(LOAD_PREFIX, 0, i, sizes.key_bytes), value)
                         for i in range(start, min(start + batch, wanted))])
    return wanted


def retried(what: str, call: Any, timeout_s: float = CHANGE_TIMEOUT_S) -> tuple[Any, int]:
    """call() until it is not refused with one of RETRIED; (its answer, how many calls it took)."""
    deadline = time.monotonic() + timeout_s
    for attempt in itertools.count(1):
        stopping.check()
        try:
            return call(), attempt
        except RETRIED as refusal:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: still refused after {timeout_s:.0f}s: {refusal}") from refusal
        time.sleep(POLL_S)  # the cluster gives no event to await: ask again
    raise AssertionError("unreachable")


def _status_of(client: Client) -> dict[str, Any] | None:
    try:
        (status,) = client.status()
    except RaftKVError:
        return None
    return None if "error" in status else status


def _leader_status(cluster: Cluster) -> dict[str, Any] | None:
    statuses = cluster.statuses()  # type: ignore[attr-defined]  # a RaftkvCluster's
    leader = cluster.leader()
    return statuses.get(leader) if leader is not None else None


def _joining_child(cluster: Cluster, ctx: Context) -> tuple[Child, NodeSpec]:
    client_port, peer_port = free_ports(2)
    spec = NodeSpec(NEW_MEMBER, f"127.0.0.1:{client_port}", ctx.work_dir / NEW_MEMBER,
                    {NEW_MEMBER: f"127.0.0.1:{peer_port}"}, ("--join", ",".join(_endpoints(cluster))))
    if cluster.client_tls is not None:  # as the others: TLS on both ports, certificates under the same CA
        (spec,), _ = with_tls([spec], ctx.work_dir / CERTS_DIR)
    return Child(NEW_MEMBER, serve_command(spec), ctx.work_dir / f"{NEW_MEMBER}.log", env=child_env()), spec


def add_to_voter(cluster: Cluster, ctx: Context, admin: Client) -> list[Metric]:
    sizes = ctx.sizes
    leader = cluster.wait_healthy(sizes.healthy_timeout_s)
    had = store_keys(cluster, leader)
    loaded = fill_store(cluster, ctx, had)
    keys = had + loaded
    source = (f"W16 bulk-loaded {loaded:,} keys of its own" + (f" onto the {had:,} there" if had else "")
              if loaded else "the keys already there (W6's, when it ran), none loaded")
    leader = cluster.wait_healthy(sizes.healthy_timeout_s)
    state = cluster.statuses()[leader]  # type: ignore[attr-defined]
    child, spec = _joining_child(cluster, ctx)
    try:
        began = time.monotonic()
        retried("MemberAdd", lambda: admin.member_add(NEW_MEMBER, spec.peers[NEW_MEMBER], learner=True))
        cluster.registry.spawn(child)
        answered, caught_up, snapshot_index = _wait_caught_up(cluster, child, spec.listen)
        _, promotes = retried("MemberPromote", lambda: admin.member_promote(NEW_MEMBER), JOIN_TIMEOUT_S)
        promoted = time.monotonic()
        now_leading = cluster.wait_healthy(sizes.healthy_timeout_s)
        voters = set(cluster.statuses()[now_leading]["voters"])  # type: ignore[attr-defined]
        if NEW_MEMBER not in voters:
            raise RuntimeError(f"{NEW_MEMBER} promoted, yet the voters are {sorted(voters)}")
        retried("MemberRemove", lambda: admin.member_remove(NEW_MEMBER))
        _wait_voters(cluster, set(cluster.members), sizes.healthy_timeout_s)
    finally:
        child.terminate()  # removed, it stops by itself; stopped here on any other path
        cluster.registry.forget([child])
    how = f"a snapshot install (snapshot index {snapshot_index:,})" if snapshot_index else "the log (no snapshot)"
    return [
        Metric("W16", "seconds add to voter", promoted - began, False,
               f"MemberAdd of learner {NEW_MEMBER}, its start with --join on an empty data dir, catch-up by {how}, "
               f"MemberPromote; store: {keys:,} keys, {source}"),
        Metric("W16", "add->caught up s", caught_up - began, False,
               f"MemberAdd to the learner's applied index reaching the leader's commit index; its process "
               f"answered {answered - began:.2f}s after MemberAdd"),
        Metric("W16", "caught up->promoted s", promoted - caught_up, False, f"{promotes} MemberPromote call(s)"),
        Metric("W16", "store keys", float(keys), True),
        Metric("W16", "store MB", state["state_size_bytes"] / MB, False, "the leader's state_size_bytes"),
    ]


def _wait_caught_up(cluster: Cluster, child: Child, address: str) -> tuple[float, float, int]:
    """Once the new member has applied all the leader has committed: (when it first answered,
    when it caught up, its snapshot index then). Until it first answers, each poll opens a new
    client: a channel opened before the process listens would wait out gRPC's reconnect backoff."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    own: Client | None = None
    answered: float | None = None
    try:
        while time.monotonic() < deadline:
            stopping.check()
            if not child.running:
                raise RuntimeError(f"{NEW_MEMBER} exited while joining:\n{child.log_tail()}")
            if own is None:
                own = Client([address], timeout=2.0, tls=cluster.client_tls)
            mine = _status_of(own)
            if mine is None and answered is None:
                own.close()
                own = None
            elif mine is not None:
                answered = answered or time.monotonic()
                try:
                    leader = _leader_status(cluster)
                except Exception:  # noqa: BLE001 - members come and go while we poll, as wait_healthy
                    leader = None
                if leader is not None and mine["applied_index"] >= leader["commit_index"]:
                    return answered, time.monotonic(), int(mine["snapshot_index"])
            time.sleep(POLL_S)  # no event to await: poll the statuses
    finally:
        if own is not None:
            own.close()
    raise RuntimeError(f"{NEW_MEMBER} did not catch up within {JOIN_TIMEOUT_S:.0f}s:\n{child.log_tail()}")


def _wait_voters(cluster: Cluster, voters: set[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        stopping.check()
        try:
            statuses = cluster.statuses()  # type: ignore[attr-defined]
            if all("error" not in s and set(s["voters"]) == voters and not s["learners"] for s in statuses.values()):
                return
            last = {m: (s.get("voters"), s.get("learners")) for m, s in statuses.items()}
        except Exception as error:  # noqa: BLE001 - as wait_healthy
            last = error
        time.sleep(POLL_S)
    raise RuntimeError(f"the voters did not become {sorted(voters)} within {timeout_s:.0f}s: {last!r}")


# ---- 2. transfer stall ---------------------------------------------------------------------------

@dataclass
class _Writer:
    """Sequential puts, each acknowledged one noted as (sent, acknowledged) monotonic seconds."""

    acks: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, target: Any, key_bytes: int, value: bytes) -> None:
        for i in itertools.count():
            if self.stop.is_set() or stopping.stop_requested.is_set():
                return
            sent = time.monotonic()
            try:
                target.put(key(PUT_PREFIX, 0, i, key_bytes), value)
            except Exception as error:  # noqa: BLE001 - counted; the gap shows what it cost
                self.errors.append(f"{type(error).__name__}: {error}")
                continue
            self.acks.append((sent, time.monotonic()))


def longest_gap(acked: list[float], begin: float, end: float) -> float:
    """The longest interval between two consecutive acknowledgements (times, ascending) that
    overlaps [begin, end]; 0.0 when fewer than two acknowledgements bracket it."""
    gaps = [later - earlier for earlier, later in zip(acked, acked[1:]) if earlier <= end and later >= begin]
    return max(gaps, default=0.0)


def _agreed_leader(cluster: Cluster, timeout_s: float) -> str:
    """The leader every member agrees on, once there is one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            leader = cluster.leader()
        except Exception:  # noqa: BLE001 - members come and go while we poll, as wait_healthy
            leader = None
        if leader is not None:
            return leader
        _wait(POLL_S)  # the cluster gives no event to await: ask again
    raise RuntimeError(f"no agreed leader within {timeout_s:.0f}s")


def _wait(seconds: float) -> None:
    stopping.stop_requested.wait(seconds)
    stopping.check()


def transfer_stalls(cluster: Cluster, ctx: Context, admin: Client) -> list[Metric]:
    sizes = ctx.sizes
    writer = _Writer()
    target = ctx.target(cluster)
    thread = threading.Thread(target=writer.run, args=(target, sizes.key_bytes, value_of(sizes.value_bytes)),
                              daemon=True, name="w16-writer")
    windows: list[tuple[float, float]] = []
    moves: list[float] = []
    wrong: list[str] = []
    thread.start()
    try:
        deadline = time.monotonic() + sizes.healthy_timeout_s
        while len(writer.acks) < WARM_ACKS:
            if time.monotonic() > deadline:
                raise RuntimeError(f"puts are not being acknowledged: {writer.errors[-3:]}")
            _wait(POLL_S)
        _wait(sizes.warmup_s)
        for _ in range(sizes.transfers):
            # Not wait_healthy: with the writer running, a lazy follower trails by up to
            # lazy_push_ms of puts, so every member is seldom caught up at one instant.
            leader = _agreed_leader(cluster, sizes.healthy_timeout_s)
            to = sorted(m for m in cluster.members if m != leader)[len(windows) % (len(cluster.members) - 1)]
            begin = time.monotonic()
            new, calls = retried(f"MoveLeader to {to}", lambda to=to: admin.move_leader(to))
            end = time.monotonic()
            if calls > 1:
                wrong.append(f"{calls} calls to move it to {to}")
            windows.append((begin, end))
            moves.append(end - begin)
            if new != to:
                wrong.append(f"{to} asked, {new} leads")
            _wait(TRANSFER_SETTLE_S)
    finally:
        writer.stop.set()
        stopping.join(thread)
    acked = [done for _, done in writer.acks]
    stalls = [longest_gap(acked, begin, end) * 1000 for begin, end in windows]
    latencies = [done - sent for sent, done in writer.acks]
    note = (f"{len(stalls)} MoveLeader calls to a follower, {TRANSFER_SETTLE_S:.0f}s of puts apart, one client "
            f"putting sequentially ({len(writer.acks):,} puts acknowledged"
            + (f", {len(writer.errors)} failed" if writer.errors else "") + ")"
            + (f"; {', '.join(wrong)}" if wrong else ""))
    return [
        Metric("W16", "transfer stall ms", median(stalls), False,
               f"median over the transfers of the longest gap between two acknowledged puts around one; {note}"),
        Metric("W16", "transfer stall max ms", max(stalls), False, ", ".join(f"{s:.0f}" for s in stalls)),
        Metric("W16", "put p50 ms", percentile(latencies, 50) * 1000, False, "every put of the run"),
        Metric("W16", "MoveLeader ms", median(moves) * 1000, False, "until the target leads (median)"),
        Metric("W16", "MoveLeader max ms", max(moves) * 1000, False),
    ]
