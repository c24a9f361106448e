"""The asyncio driver with the real core, real stores (the write-ahead log; LMDB for the state) and real gRPC on 127.0.0.1: a single
node electing itself and applying proposals, read barriers, refusals (queue full, disk full), and
three nodes in one process replicating."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from raftkv_proto import kv_pb2
from raft.core.config import CoreConfig
from raft.core.types import HardState
from raft.log import WalLogStore, open_log_store
from raft.log.wal_records import ENTRY_FIELDS_SIZE, HEADER_SIZE, SegmentStart, segment_body
from raft.node.cluster_id import DEFAULT_CLUSTER_TOKEN, derived_cluster_id, resolve_cluster_id
from raft.node.config import Limits, NodeConfig, StorageConfig, Tuning
from raft.node.errors import DiskFullError, NodeStoppedError, NotLeaderError, QueueFullError
from raft.node import ready_handler
from raft.node.node import RaftNode
from raft.transport.tcp_transport import TcpTransport
from kv.server.server import RunningServer, start_server
from kv.tools.cluster_up import free_ports
from statemachine.commands import encode_command, put_op
from statemachine.errors import StateFullError
from statemachine.apply_batch import ApplyOutcome
from statemachine.kv_state import KVStateMachine

# Short timeouts keep elections (and so the tests) fast; the ratios match the defaults.
FAST = CoreConfig(election_timeout_ms=300, heartbeat_interval_ms=30, lease_ms=250, push_timeout_ms=300)
WAIT_S = 10.0  # upper bound on any wait below; tests end as soon as the awaited event happens


def free_port() -> int:
    """A port below the kernel's ephemeral range, reserved against other suites (free_ports): a
    port from a bind to port 0 may be handed out again as a connection's local end before the
    node binds it."""
    return free_ports(1)[0]


def put_cmd(key: bytes, value: bytes) -> bytes:
    return encode_command([put_op(key, value)])


def layers(tick_interval_ms: int = 5, log_max_bytes: int = 64 << 20, state_max_bytes: int = 64 << 20,
           **settings: Any) -> dict[str, Any]:
    """NodeConfig's layers from the settings a test names, with the tests' small sizes and quick
    ticks (each setting goes to the layer that has a field of its name)."""
    def pick(layer: type) -> Any:
        return layer(**{k: v for k, v in settings.items() if k in layer.__dataclass_fields__})
    settings.update(tick_interval_ms=tick_interval_ms, log_max_bytes=log_max_bytes, state_max_bytes=state_max_bytes)
    unknown = set(settings) - set(Tuning.__dataclass_fields__) - set(Limits.__dataclass_fields__) \
        - set(StorageConfig.__dataclass_fields__)
    assert not unknown, f"no layer has {unknown}"
    return {"tuning": pick(Tuning), "limits": pick(Limits), "storage": pick(StorageConfig)}


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


class Single:
    """A single RaftNode on real stores (the default log store, LMDB state), without a gRPC server;
    it has no peers, so its transport has no peer listener."""

    def __init__(self, data_dir: Path, log_max_bytes: int = 64 << 20, **settings: Any) -> None:
        self.config = NodeConfig(node_id="n1", listen=f"127.0.0.1:{free_port()}", data_dir=data_dir, core=FAST,
                                 **layers(log_max_bytes=log_max_bytes, **settings))
        self.log = open_log_store(data_dir, max_bytes=log_max_bytes)
        self.fsm = KVStateMachine(data_dir / "state", map_size=64 << 20)
        self.node = RaftNode(self.config, self.log, self.fsm, TcpTransport(self.config, "c-test", lambda: (0, 0, 0)),
                             cluster_id="c-test")

    async def __aenter__(self) -> RaftNode:
        await self.node.start()
        await asyncio.wait_for(self.node.wait_for_leader(), WAIT_S)
        return self.node

    async def __aexit__(self, *exc: object) -> None:
        await self.node.stop()
        self.fsm.close()
        self.log.close()


def test_single_node_elects_itself_applies_and_restarts(tmp_path: Path) -> None:
    async def first_life() -> None:
        async with Single(tmp_path) as node:
            assert node.leader == "n1"
            outcomes = [await node.propose(put_cmd(b"k%d" % i, b"v%d" % i)) for i in range(20)]
            assert all(isinstance(o, ApplyOutcome) and o.ok for o in outcomes)
            assert [o.index for o in outcomes] == sorted({o.index for o in outcomes})
            st = node.status()
            assert (st["id"], st["role"], st["leader"]) == ("n1", "leader", "n1")
            assert st["applied_index"] == st["commit_index"] == st["last_index"] == outcomes[-1].index
            assert st["log_size_bytes"] > 0 and st["cluster_id"]

    async def second_life() -> None:
        single = Single(tmp_path)
        assert single.fsm.get(b"k19") == b"v19"  # applied state survived the restart
        async with single as node:
            outcome = await node.propose(put_cmd(b"after", b"restart"))
            assert outcome.ok and single.fsm.get(b"after") == b"restart"
            assert node.status()["term"] >= 2

    run(first_life)
    run(second_life)


def test_read_barriers(tmp_path: Path) -> None:
    async def main() -> None:
        single = Single(tmp_path)
        async with single as node:
            outcome = await node.propose(put_cmd(b"a", b"1"))
            for level in ("linearizable", "lease", "stale"):
                index = await asyncio.wait_for(node.read_barrier(level), WAIT_S)
                assert index >= outcome.index, level
                assert single.fsm.get(b"a") == b"1"
            with pytest.raises(ValueError):
                await node.read_barrier("eventual")

    run(main)


def test_held_reads_are_served_together_after_the_hold(tmp_path: Path) -> None:
    async def main() -> None:
        async with Single(tmp_path, read_hold_ms=200, read_hold_siblings=0) as node:
            outcome = await node.propose(put_cmd(b"a", b"1"))
            loop = asyncio.get_running_loop()
            started = loop.time()
            reads = [node.read_barrier("linearizable") for _ in range(5)]
            indexes = await asyncio.wait_for(asyncio.gather(*reads), WAIT_S)
            # A lower bound only: the reads reached the core when the hold ended, not before.
            assert loop.time() - started >= 0.2
            assert all(index >= outcome.index for index in indexes)

    run(main)


def test_a_lone_read_is_not_held(tmp_path: Path) -> None:
    async def main() -> None:
        async with Single(tmp_path, read_hold_ms=60_000, read_hold_siblings=1) as node:
            lone = node.read_barrier("linearizable")  # no other read waits: goes straight on
            await asyncio.wait_for(lone, WAIT_S)

    run(main)


def test_a_lone_read_is_served_inside_the_call_when_the_driver_is_idle(tmp_path: Path) -> None:
    """The short cut of RaftNode.ready_soon: a lone reader's Ready (here a single node's, which
    needs no round) is handled inside read_barrier instead of at the driver's next loop turn.
    The driver may be busy with a tick's Ready at any one call, so of 20 reads at least one must
    come back done; without the short cut none can."""
    async def main() -> None:
        async with Single(tmp_path) as node:
            assert (await node.propose(put_cmd(b"k", b"v"))).ok  # the leader's term has an applied entry
            served_at_once = 0
            for _ in range(20):
                read = node.read_barrier("linearizable")
                served_at_once += read.done()
                await asyncio.wait_for(read, WAIT_S)
            assert served_at_once > 0

    run(main)


def test_a_lone_read_keeps_the_leader_loop_awake_and_held_reads_do_not(tmp_path: Path) -> None:
    """raft/node/loop_spin.py: a lone linearizable read keeps the loop polling until
    read_spin_us after it is served (a minute here, so the check cannot race the deadline);
    stopping the node ends the spin. With read_spin_us 0, or for reads held to share a round
    (a busy leader's), no spin."""
    async def main() -> None:
        async with Single(tmp_path / "spin", read_spin_us=60_000_000) as node:
            assert (await node.propose(put_cmd(b"k", b"v"))).ok
            assert not node.spinning
            await asyncio.wait_for(node.read_barrier("linearizable"), WAIT_S)
            assert node.spinning
        assert not node.spinning
        async with Single(tmp_path / "off", read_spin_us=0) as node:
            assert (await node.propose(put_cmd(b"k", b"v"))).ok
            await asyncio.wait_for(node.read_barrier("linearizable"), WAIT_S)
            assert not node.spinning
        async with Single(tmp_path / "crowd", read_spin_us=60_000_000, read_hold_ms=60_000,
                          read_hold_siblings=0) as node:
            assert (await node.propose(put_cmd(b"k", b"v"))).ok
            # siblings 0: every read is held, so none is ever the lone one handed to the core
            reads = [node.read_barrier("linearizable") for _ in range(3)]
            await asyncio.sleep(0)
            assert not node.spinning
            for r in reads:
                r.cancel()

    run(main)


def test_held_reads_fail_when_the_node_stops(tmp_path: Path) -> None:
    async def main() -> None:
        # siblings 0: every read is held, for a minute
        async with Single(tmp_path, read_hold_ms=60_000, read_hold_siblings=0) as node:
            held = [node.read_barrier("linearizable") for _ in range(2)]
            await asyncio.sleep(0.05)  # a loop turn or so: not a synchronisation, the hold is a minute
            assert not any(r.done() for r in held)
        for read in held:
            with pytest.raises(NodeStoppedError):
                await read

    run(main)


def test_queue_full_refuses_beyond_the_bound(tmp_path: Path) -> None:
    async def main() -> None:
        async with Single(tmp_path, max_pending_requests=1) as node:
            first = node.propose(put_cmd(b"a", b"1"))  # registered at once: propose is no coroutine
            with pytest.raises(QueueFullError):  # refused at once, while the first still waits
                node.propose(put_cmd(b"b", b"2"))
            assert (await first).ok
            assert (await node.propose(put_cmd(b"c", b"3"))).ok  # room again

    run(main)


def full_segment_value(key: bytes, max_bytes: int, node_id: str = "n1") -> bytes:
    """A value whose put under `key` makes an ENTRY record of exactly half a segment's room after
    its SEGMENT record, for a WalLogStore of `max_bytes` (segments of max(64 KiB, max_bytes // 8)):
    two such entries fill a segment to its last byte. Without that a segment keeps up to an entry's
    worth of room when the log can take no new segment, and the NOOP a re-elected leader appends
    fits there: the log would accept writes again a moment after refusing one."""
    segment = max(64 << 10, max_bytes // 8)
    header = HEADER_SIZE + len(segment_body(SegmentStart(1, 1, 0, 0, HardState(1, node_id))))
    assert (segment - header) % 2 == 0
    record = (segment - header) // 2
    assert 2 * record <= segment  # a new segment is max(segment, 2 x what did not fit): stays `segment`
    for size in range(record, 0, -1):
        value = b"x" * size
        if HEADER_SIZE + ENTRY_FIELDS_SIZE + len(put_cmd(key, value)) == record:
            return value
    raise AssertionError(f"no value makes a record of {record} bytes")


def test_full_log_refuses_writes_and_keeps_serving_reads(tmp_path: Path) -> None:
    async def main() -> None:
        max_bytes = 1 << 20
        single = Single(tmp_path, log_max_bytes=max_bytes)
        assert isinstance(single.log, WalLogStore)  # sized by log_max_bytes
        big = full_segment_value(b"big000", max_bytes)  # keys of one length: every record the same size
        async with single as node:
            await node.propose(put_cmd(b"kept", b"yes"))
            # The write that meets the full log fails as on a loss of leadership (had its entry
            # reached followers, the next leader could commit it: the outcome is unknown, not
            # "refused"); the ones after it are refused before anything is stored.
            with pytest.raises(NotLeaderError):
                for i in range(200):  # 200 x 64 KiB cannot fit a 1 MiB log
                    await node.propose(put_cmd(b"big%03d" % i, big))
            # Full to the byte: every segment the cap allows, the last without room for even a NOOP,
            # so the node stays refusing (on LMDB, a full map does the same).
            assert single.log.size_bytes() == max_bytes
            with pytest.raises(DiskFullError):
                await node.propose(put_cmd(b"more", b"1"))
            assert await node.read_barrier("stale") >= 1
            assert single.fsm.get(b"kept") == b"yes"
            assert node.status()["disk_full"] is True

    run(main)


def test_cluster_id_is_kept_and_checked(tmp_path: Path) -> None:
    members = ["n1", "n2"]
    derived = resolve_cluster_id(tmp_path, None, members)
    assert derived == resolve_cluster_id(tmp_path / "other", None, reversed(members))
    assert (tmp_path / "cluster_id").read_text().strip() == derived
    # The stored one wins over other members, another token, and is kept as it is.
    assert resolve_cluster_id(tmp_path, None, ["n1"], token="other") == derived
    assert resolve_cluster_id(tmp_path, derived, members) == derived
    with pytest.raises(ValueError, match="belongs to cluster"):
        resolve_cluster_id(tmp_path, "something-else", members)
    # An explicit id wins over the derivation on the first start.
    assert resolve_cluster_id(tmp_path / "explicit", "c-mine", members, token="t") == "c-mine"


def test_a_heartbeat_interval_no_longer_than_a_tick_is_refused() -> None:
    """The core takes a gap between ticks longer than a heartbeat interval for a stall of the node
    (raft/core/stall.py): with heartbeats as often as ticks, every tick would be one."""
    fast = CoreConfig(election_timeout_ms=100, heartbeat_interval_ms=10, lease_ms=80)
    with pytest.raises(ValueError, match=r"heartbeat_interval_ms \(10\) must be longer than tick_interval_ms \(10\)"):
        NodeConfig(node_id="n1", listen="127.0.0.1:1", data_dir=Path("/nowhere"), core=fast)
    NodeConfig(node_id="n1", listen="127.0.0.1:1", data_dir=Path("/nowhere"), core=fast, tuning=Tuning(tick_interval_ms=5))


def test_the_derived_cluster_id_depends_on_the_member_ids_and_token_only() -> None:
    """Members reaching each other at different addresses derive one id (the id is made from
    what they all agree on); another token or another member set makes another id."""
    maps = [{"n1": "127.0.0.1:7101", "n2": "127.0.0.1:7102", "n3": "127.0.0.1:7103"},
            {"n3": "10.0.0.3:2380", "n1": "localhost:7101", "n2": "proxy.example:9000"}]
    assert len({derived_cluster_id(peers) for peers in maps}) == 1
    assert derived_cluster_id(maps[0]) == derived_cluster_id(["n1", "n2", "n3"], DEFAULT_CLUSTER_TOKEN)
    assert derived_cluster_id(maps[0], "prod-a") == derived_cluster_id(maps[1], "prod-a")
    ids = {derived_cluster_id(maps[0]), derived_cluster_id(maps[0], "prod-a"), derived_cluster_id(maps[0], "prod-b"),
           derived_cluster_id(["n1", "n2"]), derived_cluster_id(["n1", "n2", "n3", "n4"])}
    assert len(ids) == 5
    # No joining of ids and token can be taken for another.
    assert derived_cluster_id(["a,b"]) != derived_cluster_id(["a", "b"])
    assert derived_cluster_id(["n1"], "x") != derived_cluster_id(["x"], "n1")
    assert all(i.startswith("c-") and len(i) == 18 for i in ids)


def test_single_node_throughput(tmp_path: Path) -> None:
    """Prints puts/s for 1 and 16 concurrent proposers (a measurement, not a check)."""
    async def main() -> None:
        async with Single(tmp_path) as node:
            for writers in (1, 16):
                per_writer = 200 if writers == 1 else 50
                started = time.perf_counter()

                async def writer(w: int) -> None:
                    for i in range(per_writer):
                        assert (await node.propose(put_cmd(b"w%d/%d" % (w, i), b"v"))).ok

                await asyncio.gather(*(writer(w) for w in range(writers)))
                rate = writers * per_writer / (time.perf_counter() - started)
                print(f"\nsingle node, {writers:2d} concurrent proposers: {rate:,.0f} puts/s")

    run(main)


# ---- three nodes in one process ----------------------------------------------------------------

async def start_cluster(tmp_path: Path, n: int = 3, **config_fields: Any) -> list[RunningServer]:
    """n members, each with a client port (--listen) and a peer port (its --peers entry)."""
    peers = {f"n{i}": f"127.0.0.1:{free_port()}" for i in range(1, n + 1)}
    servers = []
    for nid in peers:
        config = NodeConfig(node_id=nid, listen=f"127.0.0.1:{free_port()}", peers=peers, data_dir=tmp_path / nid, core=FAST,
                            **layers(**config_fields))
        servers.append(await start_server(config))
    return servers


def test_three_nodes_replicate(tmp_path: Path) -> None:
    async def main() -> None:
        servers = await start_cluster(tmp_path)
        try:
            nodes = {s.node.id: s for s in servers}
            leader_id = await asyncio.wait_for(servers[0].node.wait_for_leader(), WAIT_S)
            leader = nodes[leader_id]
            outcomes = [await leader.node.propose(put_cmd(b"k%d" % i, b"v%d" % i)) for i in range(30)]
            last = outcomes[-1].index
            for s in servers:  # every member applies every entry
                await asyncio.wait_for(s.node.wait_applied(last), WAIT_S)
                assert s.fsm.get(b"k29") == b"v29"
            st = leader.node.status()
            assert st["role"] == "leader" and set(st["peers"]) >= {"n1", "n2", "n3"} - {leader_id}
            # A follower refuses proposals and linearizable reads, naming the leader.
            follower = next(s for s in servers if s.node.id != leader_id)
            with pytest.raises(NotLeaderError) as err:
                await follower.node.propose(put_cmd(b"x", b"y"))
            assert err.value.leader == leader_id
            # The leader's client address, which the follower learnt in the peers' handshake.
            assert follower.node.status()["leader_address"] == leader.config.listen != leader.config.peers[leader_id]
            # A linearizable read through the leader sees the last write.
            index = await asyncio.wait_for(leader.node.read_barrier("linearizable"), WAIT_S)
            assert index >= last
            # Through the client service too (same server, no gRPC hop here).
            response = await leader.handler.get(kv_pb2.GetRequest(key=b"k0"), 5.0)
            assert response.found and response.value == b"v0"
        finally:
            for s in servers:
                await s.stop()

    run(main)


def test_followers_give_way_on_large_batches_and_the_leader_never_does(tmp_path: Path, monkeypatch) -> None:
    sliced: list[tuple[object, int]] = []  # (the state machine applying, entries)
    yields: list[int] = []
    real_apply_in_slices = ready_handler.apply_in_slices

    def recording_apply_in_slices(apply: Callable[..., Any], entries: list[Any], every: int) -> list[Any]:
        sliced.append((apply.__self__, len(entries)))
        return real_apply_in_slices(apply, entries, every)

    monkeypatch.setattr(ready_handler, "apply_in_slices", recording_apply_in_slices)
    monkeypatch.setattr(ready_handler, "yield_cpu", lambda: yields.append(1))

    async def main() -> None:
        servers = await start_cluster(tmp_path, follower_yield_entries=4)
        try:
            nodes = {s.node.id: s for s in servers}
            leader = nodes[await asyncio.wait_for(servers[0].node.wait_for_leader(), WAIT_S)]
            # Proposed together: one Ready, one batch to each follower.
            outcomes = await asyncio.gather(*(leader.node.propose(put_cmd(b"k%d" % i, b"v%d" % i)) for i in range(64)))
            for s in servers:
                await asyncio.wait_for(s.node.wait_applied(outcomes[-1].index), WAIT_S)
                assert s.fsm.get(b"k63") == b"v63"
            followers = {s.node.fsm for s in servers if s is not leader}
            assert sliced and {fsm for fsm, _ in sliced} <= followers  # never the leader's
            assert all(n > 4 for _, n in sliced)
            assert yields  # and a follower's save of the batch gave way first
        finally:
            for s in servers:
                await s.stop()

    run(main)


async def applied_through(node: RaftNode, index: int) -> None:
    """Wait until `node` has applied `index`. A store-full rebuild fails the waits it finds (as it
    fails reads: that core is going away), so wait again after one."""
    while True:
        try:
            await node.wait_applied(index)
            return
        except NotLeaderError:
            await asyncio.sleep(0.01)


async def write_64_and_see_them_everywhere(leader: Any, servers: list[Any]) -> None:
    """64 puts through `leader`, then every server has applied them all."""
    outcomes = await asyncio.gather(*(leader.node.propose(put_cmd(b"k%d" % i, b"v%d" % i)) for i in range(64)))
    for s in servers:
        await asyncio.wait_for(applied_through(s.node, outcomes[-1].index), WAIT_S)
        assert s.fsm.get(b"k63") == b"v63"


def test_a_follower_whose_state_fills_during_an_apply_goes_on_once_it_has_room(tmp_path: Path) -> None:
    """A follower's state machine refuses a large batch for space: the driver rebuilds its core
    from what is durable and applies the batch again, and the follower ends up with every entry
    (rather than stopping, or applying an entry twice)."""
    async def main() -> None:
        servers = await start_cluster(tmp_path)
        try:
            leader_id = await asyncio.wait_for(servers[0].node.wait_for_leader(), WAIT_S)
            leader = next(s for s in servers if s.node.id == leader_id)
            follower = next(s for s in servers if s is not leader)
            real_apply, failed = follower.fsm.apply, []

            def full_once(entries: list[Any]) -> list[Any]:
                if not failed and len(entries) > 4:
                    failed.append(entries[0].index)
                    raise StateFullError("state machine map is full (the test's)")
                return real_apply(entries)

            follower.fsm.apply = full_once  # type: ignore[method-assign]
            await write_64_and_see_them_everywhere(leader, servers)
            assert failed  # the fault did happen
        finally:
            for s in servers:
                await s.stop()

    run(main)


def test_a_follower_whose_state_fills_in_the_middle_of_a_sliced_apply_goes_on_from_what_it_applied(
        tmp_path: Path, monkeypatch) -> None:
    """The first slices of a follower's sliced apply are committed when a later one finds the
    state machine full: the rebuilt core must start after them, not hand them out again (the
    state machine would refuse them as out of order and the node would stop)."""
    failed: list[int] = []
    real_apply_in_slices = ready_handler.apply_in_slices

    def full_after_one_slice(apply: Callable[..., Any], entries: list[Any], every: int) -> list[Any]:
        if failed:
            return real_apply_in_slices(apply, entries, every)
        apply(entries[:every])
        failed.append(entries[every].index)
        raise StateFullError("state machine map is full (the test's)")

    monkeypatch.setattr(ready_handler, "apply_in_slices", full_after_one_slice)

    async def main() -> None:
        servers = await start_cluster(tmp_path, follower_yield_entries=4)
        try:
            leader_id = await asyncio.wait_for(servers[0].node.wait_for_leader(), WAIT_S)
            leader = next(s for s in servers if s.node.id == leader_id)
            await write_64_and_see_them_everywhere(leader, servers)
            assert failed  # the fault did happen
        finally:
            for s in servers:
                await s.stop()

    run(main)


def test_leader_loss_elects_a_new_leader_that_keeps_the_data(tmp_path: Path) -> None:
    async def main() -> None:
        servers = await start_cluster(tmp_path)
        try:
            old_id = await asyncio.wait_for(servers[0].node.wait_for_leader(), WAIT_S)
            old = next(s for s in servers if s.node.id == old_id)
            written = await old.node.propose(put_cmd(b"before", b"failover"))
            await old.stop()
            rest = [s for s in servers if s is not old]

            new_id = await asyncio.wait_for(rest[0].node.wait_for_leader(other_than=old_id), WAIT_S)
            new = next(s for s in rest if s.node.id == new_id)
            outcome = await asyncio.wait_for(new.node.propose(put_cmd(b"after", b"failover")), WAIT_S)
            assert outcome.ok and outcome.index > written.index
            assert new.fsm.get(b"before") == b"failover"  # committed before the loss, kept
        finally:
            for s in servers:
                await s.stop()

    run(main)


def test_a_read_held_while_its_leader_loses_the_quorum_fails_with_not_leader(tmp_path: Path) -> None:
    async def main() -> None:
        # The hold (3 s) outlasts the step-down (check-quorum: about one election timeout, 0.3 s).
        servers = await start_cluster(tmp_path, read_hold_ms=3000, read_hold_siblings=1)
        try:
            leader_id = await asyncio.wait_for(servers[0].node.wait_for_leader(), WAIT_S)
            leader = next(s for s in servers if s.node.id == leader_id)
            lone = leader.node.read_barrier("linearizable")
            held = leader.node.read_barrier("linearizable")  # one other read waits: held
            await asyncio.wait_for(lone, WAIT_S)
            assert not held.done()
            await asyncio.gather(*(s.stop(grace=0) for s in servers if s is not leader))
            with pytest.raises(NotLeaderError):
                await asyncio.wait_for(held, WAIT_S)
        finally:
            for s in servers:
                await s.stop()

    run(main)
