"""When leases expire: counted by the leader alone, as etcd's lessor does, and never early.

Leases themselves are replicated state (statemachine/leases.py): granted and revoked through the
log. Their deadlines are not: the leader keeps one per lease in memory, renews it on each
keep-alive (after confirming it still leads: a deposed leader acknowledges no keep-alive), and
revokes an expired lease through the log. A member that becomes leader gives every lease its whole
TTL from that moment, so no lease expires before its TTL has passed since the last keep-alive any
leader acknowledged (etcd's Promote; what etcd issues #9395 and #13491 got wrong is a new leader
counting from an older point). A lease may live up to one TTL longer across a change of leader,
never shorter."""
from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable

from raft.node.node import RaftNode
from kv.server.node_calls import propose_command
from statemachine.commands import encode_lease_grant, encode_lease_revoke
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
    def __init__(self, node: RaftNode, fsm: KVStateMachine, clock: Callable[[], float] = time.monotonic) -> None:
        self._node = node
        self._fsm = fsm
        self._clock = clock
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

    def _leading(self) -> bool:
        """Whether this member leads; on taking the lead, every lease gets its whole TTL from now."""
        node = self._node
        if node.leader != node.id:
            self._term = None
            self._deadlines.clear()
            return False
        term = node.core.term
        ttls = self._fsm.leases.ttls
        if self._term != term:
            now = self._clock()
            self._term = term
            self._deadlines = {lease: now + ttl for lease, ttl in ttls.items()}
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
        try:
            future = self._node.propose(encode_lease_revoke(lease))
        except Exception as e:  # noqa: BLE001 - not leader any more, a full queue: the next check tries again
            log.debug("revoking lease %x: %s", lease, e)
            self._revoking.discard(lease)
            return
        future.add_done_callback(lambda _: self._revoking.discard(lease))

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
