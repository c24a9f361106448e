"""Compacting the history by itself (etcd's --auto-compaction-mode and --auto-compaction-retention):
the leader proposes a Compact now and then, so the history of an overwrite-heavy store stays
bounded without anyone calling Compact.

- "periodic" keeps at least `retention` seconds of history: the leader notes the store's revision
  every tenth of the retention (at most every 5 minutes) and compacts to the newest revision noted
  at least `retention` ago.
- "revision" keeps the last `retention` revisions: every 5 minutes the leader compacts to the
  store's revision less `retention`.

A retention of 0 turns it off. Only the leader compacts; a new leader starts noting afresh, so a
change of leader never compacts more than the retention allows."""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from raft.node.node import RaftNode
from statemachine.commands import encode_compaction
from statemachine.kv_state import KVStateMachine

log = logging.getLogger(__name__)

PERIODIC, REVISION = "periodic", "revision"
MODES = (PERIODIC, REVISION)
# etcd's revision mode compacts every 5 minutes; periodic notes at most that far apart.
MAX_INTERVAL_S = 300.0


class AutoCompactor:
    def __init__(self, node: RaftNode, fsm: KVStateMachine, mode: str, retention: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if mode not in MODES:
            raise ValueError(f"auto compaction mode must be one of {MODES}, got {mode!r}")
        self._node = node
        self._fsm = fsm
        self._mode = mode
        self._retention = retention
        self._clock = clock
        self._noted: deque[tuple[float, int]] = deque()  # (when, store revision), oldest first
        self._term: int | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def interval_s(self) -> float:
        if self._mode == REVISION:
            return MAX_INTERVAL_S
        return min(MAX_INTERVAL_S, self._retention / 10)

    def start(self) -> None:
        if self._retention > 0:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            target = self.step()
            if target is not None:
                await self._compact(target)
            await asyncio.sleep(self.interval_s)

    def step(self) -> int | None:
        """Note the revision; the revision to compact to now, if any (leader only)."""
        node = self._node
        if node.leader != node.id:
            self._term = None
            self._noted.clear()
            return None
        if self._term != node.core.term:
            self._term = node.core.term
            self._noted.clear()
        revision, compacted = self._fsm.revision, self._fsm.compacted_revision
        if self._mode == REVISION:
            target = revision - int(self._retention)
        else:
            now = self._clock()
            self._noted.append((now, revision))
            target = 0
            while self._noted and now - self._noted[0][0] >= self._retention:
                target = self._noted.popleft()[1]
        return target if target > compacted else None

    async def _compact(self, revision: int) -> None:
        try:
            future = self._node.propose(encode_compaction(revision))
            outcome = await future
        except Exception as e:  # noqa: BLE001 - not leader any more, a full queue: the next round tries again
            log.debug("auto compaction to revision %d: %s", revision, e)
            return
        if outcome.result.refusal:
            log.debug("auto compaction to revision %d refused: %s", revision, outcome.result.refusal)
        else:
            log.info("auto compaction: history before revision %d dropped", revision)
