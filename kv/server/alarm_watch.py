"""Raising the cluster's alarms: the leader watches every member and proposes an alarm through the
log for each member that needs one, so every member applies and lists the same alarms
(statemachine/alarms.py). Once a second the leader reads each member's Status (its own directly):

- `nospace` not empty (the member refuses writes for space: a full store, its disk below
  --reserve-free-bytes, or its state over --quota-backend-bytes): NOSPACE for that member;
- `corrupt` not empty (its state check found it corrupt and it stopped serving): CORRUPT.

An alarm stays raised until an operator disarms it (`raftkv alarm disarm`), as etcd's do; one
disarmed while its cause lasts is raised again within a second. A leader short of space proposes
NOSPACE from its disk's reserve (RaftNode.propose(within_reserve=True)) and then gives way on the
next write it refuses, as before; a member with a full log cannot append at all, so its alarm comes
from the next leader."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from raft.core.types import Role
from raft.node.node import RaftNode
from kv.server.state_check import PeerStatuses
from raftkv_proto import kv_pb2
from statemachine.alarms import CORRUPT, NOSPACE, Alarm, AlarmHolder, encode_alarm

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0


class AlarmWatch:
    def __init__(self, node: RaftNode, alarms: AlarmHolder, own_status: Callable[[], kv_pb2.StatusResponse],
                 peer_status: PeerStatuses) -> None:
        self._node = node
        self._alarms = alarms
        self._own_status = own_status
        self._peer_status = peer_status
        self._proposed: set[Alarm] = set()  # proposed and not yet seen applied (no duplicates meanwhile)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"alarm-watch-{self._node.id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._peer_status.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if self._node.core.role is not Role.LEADER or not self._node.running:
                continue
            try:
                await self._watch_once()
            except Exception:  # a round that fails must not end the watching
                log.exception("alarm watch failed")

    async def _watch_once(self) -> None:
        peers = [m for m in self._node.config.members if m != self._node.id]
        answers = await asyncio.gather(*(self._peer_status(p) for p in peers))
        statuses = {self._node.id: self._own_status(), **{p: a for p, a in zip(peers, answers) if a is not None}}
        for member, status in statuses.items():
            if status.nospace:
                self._raise(Alarm(member, NOSPACE), status.nospace)
            if status.corrupt:
                self._raise(Alarm(member, CORRUPT), status.corrupt)

    def _raise(self, alarm: Alarm, why: str) -> None:
        if alarm in self._alarms.alarms or alarm in self._proposed:
            return
        try:
            future = self._node.propose(encode_alarm(True, alarm.member_id, alarm.alarm), within_reserve=True)
        except Exception as e:  # not leader any more, a full log, a full queue: the next round
            log.warning("alarm %s for member %s not raised yet: %s", alarm.name, alarm.member_id, e)
            return
        log.error("raising alarm %s for member %s: %s", alarm.name, alarm.member_id, why)
        self._proposed.add(alarm)
        future.add_done_callback(lambda f: self._settled(alarm, f))

    def _settled(self, alarm: Alarm, future: asyncio.Future[object]) -> None:
        """Applied (the holder lists it now) or lost with the leadership (the next round tries again)."""
        self._proposed.discard(alarm)
        if not future.cancelled():
            future.exception()  # retrieved, so asyncio does not log a lost leadership as unhandled
