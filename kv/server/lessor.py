"""When leases expire: counted by the leader alone, as etcd's lessor does, and never early.

Leases themselves are replicated state (statemachine/leases.py): granted and revoked through the
log. Their deadlines are not: the leader keeps one per lease in memory, renews it on each
keep-alive (after confirming it still leads: a deposed leader acknowledges no keep-alive), and
revokes an expired lease through the log. A member that becomes leader gives every lease its whole
TTL from that moment, so no lease expires before its TTL has passed since the last keep-alive any
leader acknowledged (etcd's Promote; what etcd issues #9395 and #13491 got wrong is a new leader
counting from an older point). A lease may live up to one TTL longer across a change of leader,
never shorter.

Checkpoints (etcd's lease checkpointing) bound that: every `checkpoint_interval_s` the leader
records through the log the remaining TTL of each lease whose TTL is longer than the interval, and
a new leader counts such a lease from its checkpointed remaining TTL instead of its whole one, so
a lease abandoned for hours still expires about on time across a change of leader. A keep-alive of
a checkpointed lease clears its checkpoint through the log before it is acknowledged: a new leader
then counts it from its whole TTL again, never from a remaining TTL older than the renewal."""
from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable

from raft.node.node import RaftNode
from kv.server.node_calls import propose_command
from statemachine.commands import encode_lease_checkpoints, encode_lease_grant, encode_lease_revoke
from statemachine.kv_state import KVStateMachine

log = logging.getLogger(__name__)

# How often the leader looks for expired leases.
CHECK_INTERVAL_S = 0.25


def min_lease_ttl_s(election_timeout_ms: int) -> int:
    """etcd's minimum TTL: one and a half election timeouts, in whole seconds (a shorter lease
    could expire during an election that its holder's keep-alives cannot reach)."""
    return math.ceil(1.5 * election_timeout_ms / 1000)


def new_lease_id() -> int:
    """A positive int64, as etcd chooses when the client gives none."""
    return secrets.randbits(63) or 1


class Lessor:
    def __init__(self, node: RaftNode, fsm: KVStateMachine, clock: Callable[[], float] = time.monotonic,
                 checkpoint_interval_s: float = 0.0) -> None:
        self._node = node
        self._fsm = fsm
        self._clock = clock
        self._checkpoint_interval_s = checkpoint_interval_s  # 0: no checkpoints
        self._next_checkpoint = clock() + checkpoint_interval_s
        # Leases this leader checkpointed: a keep-alive clears the checkpoint even before its entry
        # is applied, so a checkpoint older than the renewal never survives it.
        self._checkpointed: set[int] = set()
        self._deadlines: dict[int, float] = {}
        self._term: int | None = None  # the term in which this member leads, None when it does not
        self._known: dict[int, int] = {}  # the published leases the deadlines were last matched to
        self._revoking: set[int] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def grant(self, lease: int, ttl: int, timeout: float | None) -> tuple[int, int, int]:
        """Grant a lease through the log, on the leader (`lease` 0: one chosen here; `ttl` raised to
        the minimum): (its id, its TTL, the store's revision); its deadline counts from now."""
        lease, ttl = lease or new_lease_id(), max(ttl, min_lease_ttl_s(self._node.config.core.election_timeout_ms))
        outcome = await propose_command(self._node, encode_lease_grant(lease, ttl), timeout)
        self.granted(lease, ttl)
        return lease, ttl, outcome.result.revision

    async def revoke(self, lease: int, timeout: float | None, user: str | None = None) -> int:
        """Revoke a lease and delete its keys through the log, on the leader, as `user` (auth on);
        the store's revision after it."""
        outcome = await propose_command(self._node, encode_lease_revoke(lease, user), timeout)
        return outcome.result.revision

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            for lease in self.expired():
                self._revoke(lease)
            due = self.checkpoints_due()
            if due:
                self._propose_quietly(encode_lease_checkpoints(due), "checkpointing leases")

    def checkpoints_due(self) -> dict[int, int]:
        """(Leader) The remaining TTLs to checkpoint now: every `checkpoint_interval_s`, each lease
        whose TTL is longer than the interval, in whole seconds rounded up (never early)."""
        interval = self._checkpoint_interval_s
        now = self._clock()
        if not interval or now < self._next_checkpoint or not self._leading():
            return {}
        self._next_checkpoint = now + interval
        ttls = self._fsm.leases.ttls
        due = {lease: max(1, math.ceil(deadline - now)) for lease, deadline in self._deadlines.items()
               if ttls.get(lease, 0) > interval}
        self._checkpointed |= due.keys()
        return due

    async def keep_alive(self, lease: int, timeout: float | None) -> int | None:
        """`renew`, and for a checkpointed lease its checkpoint cleared through the log before the
        renewal is acknowledged (module docstring)."""
        ttl = self.renew(lease)
        if ttl and (lease in self._checkpointed or self._fsm.leases.remaining.get(lease)):
            await propose_command(self._node, encode_lease_checkpoints({lease: 0}), timeout)
            self._checkpointed.discard(lease)
        return ttl

    def _leading(self) -> bool:
        """Whether this member leads; on taking the lead, every lease gets its whole TTL from now."""
        node = self._node
        if node.leader != node.id:
            self._term = None
            self._deadlines.clear()
            self._checkpointed.clear()
            return False
        term = node.core.term
        ttls = self._fsm.leases.ttls
        if self._term != term:
            now = self._clock()
            self._term = term
            remaining = self._fsm.leases.remaining  # checkpointed: counted from there, not in full
            self._deadlines = {lease: now + (remaining.get(lease) or ttl) for lease, ttl in ttls.items()}
        elif ttls is not self._known:  # a batch granted or revoked leases since: once per batch, not per call
            now = self._clock()
            for lease, ttl in ttls.items():  # granted since (applied here): from now
                self._deadlines.setdefault(lease, now + ttl)
            for lease in self._deadlines.keys() - ttls.keys():
                del self._deadlines[lease]  # revoked
        self._known = ttls
        return True

    def expired(self) -> list[int]:
        """The leases past their deadline that are not being revoked already (leader only)."""
        if not self._leading():
            return []
        now = self._clock()
        return [lease for lease, deadline in self._deadlines.items() if deadline <= now and lease not in self._revoking]

    def _revoke(self, lease: int) -> None:
        self._revoking.add(lease)
        log.info("lease %x expired: revoking it and its keys", lease)
        future = self._propose_quietly(encode_lease_revoke(lease), f"revoking lease {lease:x}")
        if future is None:
            self._revoking.discard(lease)
            return
        future.add_done_callback(lambda _: self._revoking.discard(lease))

    def _propose_quietly(self, payload: bytes, what: str) -> asyncio.Future[object] | None:
        """Propose the lessor's own command; None when the node refuses it now (not leader any
        more, a full queue): the next check tries again."""
        try:
            return self._node.propose(payload)
        except Exception as e:  # noqa: BLE001 - see the docstring
            log.debug("%s: %s", what, e)
            return None

    def renew(self, lease: int) -> int | None:
        """A keep-alive, on the leader (the caller confirmed it leads): the lease's TTL, 0 when it
        does not exist; None when this member no longer leads (it lost the lead since the caller
        asked), which says nothing of the lease: the keep-alive must go to the new leader."""
        if not self._leading():
            return None
        ttl = self._fsm.leases.ttls.get(lease)
        if ttl is None:
            return 0
        self._deadlines[lease] = self._clock() + ttl
        return ttl

    def granted(self, lease: int, ttl: int) -> None:
        """A grant this leader applied: its deadline counts from now."""
        if self._leading():
            self._deadlines[lease] = self._clock() + ttl

    def remaining(self, lease: int) -> int | None:
        """Whole seconds left before `lease` expires (leader only); None when it does not exist."""
        ttl = self._fsm.leases.ttls.get(lease)
        if ttl is None or not self._leading():
            return None
        return max(0, math.ceil(self._deadlines.get(lease, self._clock() + ttl) - self._clock()))
