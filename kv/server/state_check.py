"""The members compare their states, so a member whose state went wrong stops serving it.

Per-value checksums (statemachine/value_checksum.py) catch a value damaged on the disk when it is
read. What they cannot catch is a state that is consistent but wrong: a record rewritten whole, a
member that applied an entry differently. So, as etcd's corruption check compares HashKV across
members, every `interval_s` the leader proposes a state check marker (Command.check_state). Every
member applies it at the same log index, pins its state as of that index (KVStateMachine
.take_state_checks) and hashes it off the event loop. Each member then asks its peers (their
Status, on the client port) for their hashes at that index:

- a majority of the members agrees on a hash that is not its own: its state is corrupt. It raises
  the alarm: an error in its log, `corrupt` in its status, and it stops serving (RaftNode
  .stop_serving: no votes, no leading, every client call refused as UNAVAILABLE, so clients go to
  another member). Its data is then replaced (README, "Recovering a member");
- it is in the majority and a peer is not: it logs that peer once (the peer raises its own alarm);
- no majority agrees (members lost, or worse): it logs that, and keeps serving.

A value that fails its checksum, while hashing or on any read, raises the same alarm at once."""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import grpc

from kv.server.member_channels import MemberChannels
from raft.core.types import Role
from raft.node.node import RaftNode
from raftkv_proto import kv_pb2, kv_pb2_grpc
from statemachine.commands import check_state_command
from statemachine.errors import CorruptStateError

log = logging.getLogger(__name__)

# Hashes kept (and shown in status) per member: enough for peers that lag a few checks behind.
KEPT_CHECKS = 8
# How long a peer's Status may take before this round goes on without it.
PEER_STATUS_TIMEOUT_S = 2.0

class CorruptionAlarm:
    """This member's verdict on its own state: None while fine, else why it stopped serving."""

    def __init__(self, node: RaftNode) -> None:
        self._node = node
        self.reason: str | None = None

    def raise_(self, reason: str) -> str:
        """Raise the alarm (once); returns the message a refused client call carries."""
        if self.reason is None:
            self.reason = reason
            log.error("node %s: CORRUPT: %s. It serves nothing until its data directory is replaced "
                      "(README, Recovering a member)", self._node.id, reason)
            self._node.stop_serving(f"node {self._node.id} stopped serving: its state is corrupt: {reason}")
        return f"node {self._node.id} stopped serving: its state is corrupt: {self.reason}"


class StateChecker:
    def __init__(self, node: RaftNode, fsm: Any, alarm: CorruptionAlarm, interval_s: float,
                 peer_status: PeerStatuses) -> None:
        self._node = node
        self._fsm = fsm
        self._alarm = alarm
        self._interval_s = interval_s
        self._peer_status = peer_status
        self.hashes: dict[int, str] = {}  # check index -> hex sha256 of the state as of it
        self.hashed = 0  # checks hashed since the start (raftkv_state_checks_total)
        self._judged: set[int] = set()
        self._warned: set[tuple[int, str]] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._peer_status.close()

    def status(self) -> list[kv_pb2.StateCheck]:
        return [kv_pb2.StateCheck(index=i, sha256=h) for i, h in sorted(self.hashes.items())]

    async def _run(self) -> None:
        # Markers go every interval; hashes are taken and compared more often, so that a member
        # learns its verdict soon after its peers have hashed.
        tick = min(1.0, self._interval_s / 4)
        since_marker = 0.0
        while self._alarm.reason is None:
            await asyncio.sleep(tick)
            since_marker += tick
            if since_marker >= self._interval_s and self._node.core.role is Role.LEADER:
                since_marker = 0.0
                self._propose_marker()
            try:
                await self._hash_pinned()
                await self._compare()
            except Exception:  # a check that fails must not end the checking
                log.exception("state check failed")

    def _propose_marker(self) -> None:
        try:
            future = self._node.propose(check_state_command())
        except Exception as e:  # not leader any more, disk full, queue full: the next interval
            log.debug("no state check marker this time: %s", e)
            return
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # outcome not needed

    async def _hash_pinned(self) -> None:
        for view in self._fsm.take_state_checks():
            try:
                digest = await asyncio.to_thread(view.state_hash)
            except CorruptStateError as e:
                self._alarm.raise_(str(e))
                return
            except Exception as e:  # the state was replaced under it (a snapshot install)
                log.info("state check at index %d skipped: %s", view.index, e)
                continue
            finally:
                view.close()
            self.hashes[view.index] = digest
            self.hashed += 1
            for old in sorted(self.hashes)[:-KEPT_CHECKS]:
                del self.hashes[old]
                self._judged.discard(old)

    async def _compare(self) -> None:
        waiting = [i for i in self.hashes if i not in self._judged]
        if not waiting:
            return
        peers = [m for m in self._node.config.members if m != self._node.id]
        if any(self._node.transport.client_address(p) is None for p in peers):
            # Followers never talk to each other: a probe's handshake tells their client addresses.
            await self._node.transport.probe()
        answers = await asyncio.gather(*(self._peer_status(p) for p in peers))
        theirs = {p: {c.index: c.sha256 for c in a.state_checks if c.sha256} for p, a in zip(peers, answers) if a}
        for index in waiting:
            self._judge(index, {p: h[index] for p, h in theirs.items() if index in h})

    def _judge(self, index: int, peer_hashes: dict[str, str]) -> None:
        mine = self.hashes[index]
        members = len(self._node.config.members)
        votes = Counter([mine, *peer_hashes.values()])
        agreed, count = votes.most_common(1)[0]
        if count < members // 2 + 1:
            if len(peer_hashes) == members - 1:
                self._judged.add(index)
                log.error("state check at index %d: no majority of the members agrees on the state (%s)",
                          index, dict(peer_hashes, **{self._node.id: mine}))
            return  # wait for more peers to hash it
        self._judged.add(index)
        if agreed != mine:
            others = sorted(p for p, h in peer_hashes.items() if h == agreed)
            self._alarm.raise_(f"its state at index {index} hashes to {mine[:16]}, while members "
                               f"{', '.join(others)} agree on {agreed[:16]}")
            return
        for peer, theirs in peer_hashes.items():
            if theirs != mine and (index, peer) not in self._warned:
                self._warned.add((index, peer))
                log.error("state check at index %d: member %s's state differs from the majority's", index, peer)


class PeerStatuses:
    """Status calls to the peers' client addresses, on `channels` (kv/server/member_channels.py;
    default: plaintext)."""

    def __init__(self, node: RaftNode, channels: MemberChannels | None = None) -> None:
        self._node = node
        self._channels = channels if channels is not None else MemberChannels(lambda: None)
        self._tls_failures_logged: set[str] = set()  # addresses

    async def __call__(self, peer: str) -> kv_pb2.StatusResponse | None:
        address = self._node.transport.client_address(peer)
        if address is None:
            return None  # not heard from yet
        channel = self._channels.get(address)
        try:
            return await kv_pb2_grpc.KVStub(channel).Status(kv_pb2.StatusRequest(), timeout=PEER_STATUS_TIMEOUT_S)
        except grpc.RpcError as e:
            self._log_failure(peer, address, e.details() or "")
            return None

    def _log_failure(self, peer: str, address: str, details: str) -> None:
        """A peer that is down is the everyday case of the state check and the alarm watch, which
        share these calls (debug); a TLS handshake that fails is a configuration to fix, without
        which no state is compared and no peer's alarm seen: a warning, once per address, since it
        repeats every round."""
        text = details.lower()
        if ("handshake" in text or "hostname verification" in text) and address not in self._tls_failures_logged:
            self._tls_failures_logged.add(address)
            log.warning("peer status: cannot reach %s's client port %s over TLS: %s (the members dial each other's "
                        "client ports with their --cert-file; docs/security.md)", peer, address, details)
            return
        log.debug("peer status: no status from %s at %s: %s", peer, address, details)

    async def close(self) -> None:
        await self._channels.close()
