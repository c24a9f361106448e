"""ProposalGate: what a write meets before the core takes it.

- Space: a write is refused while the disk is short (DiskSpacePolicy.check_write).
- The pending limit: a write, or a read that needs the leader, is refused with QueueFullError
  while Limits.max_pending_requests calls already wait on the node (proposals, reads, held
  writes together), so a node under more load than it can serve pushes back on its clients.
- The hold: a write that arrives while this leader hands leadership over (the core takes none
  meanwhile) is held, not refused, so that its client is not sent to a target that does not lead
  yet and back. It fails with "not leader" naming the new leader the moment one is known (its
  client retries there at once), or is proposed here if the transfer fails."""
from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any, Callable

from raft.core.errors import NotLeaderError
from raft.core.types import Role
from raft.node.errors import QueueFullError
from raft.node.ports import Clock

if TYPE_CHECKING:
    from raft.node.node import RaftNode


class ProposalGate:
    def __init__(self, node: RaftNode, clock: Clock) -> None:
        self._node = node
        self._clock = clock
        # Writes that arrived while leadership was being handed over (hold), since when.
        self._held: list[tuple[bytes, asyncio.Future[Any]]] = []
        self._held_since = 0

    def admit(self, payload: bytes, *, within_reserve: bool) -> None:
        """Refuse (DiskFullError, QueueFullError) a write the node must not take now."""
        self._node.disk_space.check_write(len(payload), within_reserve=within_reserve)
        self.check_queue()

    def check_queue(self) -> None:
        """Refuse (QueueFullError) a call when the node already has its limit of waiting ones."""
        node = self._node
        pending = len(node.proposals) + node.reads.pending + len(self._held)
        limit = node.config.limits.max_pending_requests
        if pending >= limit:
            raise QueueFullError(
                f"{pending} requests are already waiting on node {node.id} "
                f"(max_pending_requests={limit}); back off and retry")

    def hold(self, payload: bytes) -> asyncio.Future[Any]:
        """Hold a write the core refused while it transfers leadership; the future takes the
        outcome `release` gives it."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self._held:
            self._held_since = self._clock()
        self._held.append((payload, future))
        return future

    def release(self) -> None:
        """After a tick or a change of role: settle the held writes once the transfer is over:
        this node leads on, or another leader is known (or none came within an election timeout)."""
        if not self._held:
            return
        node = self._node
        core = node.core
        if core.role is Role.LEADER:
            if core.status().transferring_to is not None:
                return
        elif core.leader is None and self._clock() - self._held_since < node.config.core.election_timeout_ms:
            return  # the target is standing: its victory names where the writes go
        held, self._held = self._held, []
        for payload, future in held:
            if future.done():
                continue
            if node.core.role is not Role.LEADER:
                future.set_exception(NotLeaderError(node.core.leader, node.core.term))
                continue
            try:
                index, term = node.core.propose([payload])
            except NotLeaderError as e:
                future.set_exception(e)
                continue
            proposed = node.proposals.add(index, term)
            proposed.add_done_callback(functools.partial(_chain, future))
        node.poke()

    def fail_held(self, error: Callable[[], Exception]) -> None:
        """Fail every held write with a fresh error()."""
        held, self._held = self._held, []
        for _, future in held:
            if not future.done():
                future.set_exception(error())


def _chain(held: asyncio.Future[Any], proposed: asyncio.Future[Any]) -> None:
    """A held write's future takes the outcome of its proposal."""
    if held.done():
        return
    if proposed.cancelled():
        held.cancel()
    elif proposed.exception() is not None:
        held.set_exception(proposed.exception())  # type: ignore[arg-type]
    else:
        held.set_result(proposed.result())
