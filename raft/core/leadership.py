"""Leadership: what a node holds only while it leads a term, made anew at each election won.

- a Dispatcher per follower (dispatcher.py): replication, DLedger's per-follower states;
- the eager set (eager_set.py): which followers get new entries at once (thrifty replication);
- the quorum tracker (quorum.py): each member's match index, and what a majority holds;
- the follower contact (contact.py): heartbeat rounds, the lease, check-quorum;
- the range of indexes proposed in this term (failed back to their callers if the term ends);
- a leadership transfer under way (Raft thesis §3.10), if any.

Learners get a dispatcher like any follower, always lazy, and count in no majority.

The core (raft.py) routes messages here and sends what comes back; it keeps the roles, the commit
index and the read rounds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from raft.core.contact import FollowerContact
from raft.core.dispatcher import Dispatcher, DispatchState, Outgoing
from raft.core.eager_set import EagerSet
from raft.core.messages import HeartbeatRequest, HeartbeatResponse, InstallSnapshotResponse, PushResponse
from raft.core.membership import Membership
from raft.core.quorum import QuorumTracker
from raft.core.ready import DroppedProposals

if TYPE_CHECKING:
    from raft.core.raft import RaftCore


@dataclass(slots=True)
class Transfer:
    """Leadership is being handed to `target`: no proposals are taken until it wins (this term
    ends) or `deadline` passes (the transfer failed; this node leads on)."""

    target: str
    deadline: int
    timeout_sent: bool = False


class Leadership:
    def __init__(self, core: RaftCore) -> None:
        self._core = core
        self.dispatchers: dict[str, Dispatcher] = {}
        self.quorum = QuorumTracker([core.id], [])
        self.contact = FollowerContact((), 0, core.now)
        self.transfer: Transfer | None = None
        self._started = False
        self.reconfigure(core.membership)
        self.next_heartbeat = 0
        # follower -> the newest heartbeat round sent before its match index last rose: an answer
        # to a later round comes from a log that held those entries, unless it lost them.
        self._match_round: dict[str, int] = {}
        self._proposed: tuple[int, int] | None = None  # [first, last] proposed in this term
        # Entries were proposed since the last Ready: eager dispatchers send them in the next one
        # (batching everything proposed meanwhile).
        self.log_grew = False

    def reconfigure(self, membership: Membership) -> list[Outgoing]:
        """Follow a new configuration: a dispatcher for each member but this node (kept for those
        that stay), the quorum over its voters. Returns what new dispatchers send first."""
        core = self._core
        peers = [m for m in membership.members if m != core.id]
        voter_peers = [m for m in membership.voters if m != core.id]
        need = membership.quorum() - (1 if core.id in membership.voters else 0)
        new = [p for p in peers if p not in self.dispatchers]
        self.dispatchers = {p: self.dispatchers.get(p) or Dispatcher(p, core) for p in peers}
        self.quorum.reconfigure([core.id, *peers], membership.voters)
        self.contact.reconfigure(voter_peers, need)
        self.eager_set = EagerSet([self.dispatchers[p] for p in voter_peers], need, core.config, core.now)
        for p in peers:
            if p not in membership.voters and core.config.lazy_push_ms:
                self.dispatchers[p].eager = False
        if self.transfer is not None and self.transfer.target not in membership.voters:
            self.transfer = None
        if not self._started:  # start() starts them all
            return []
        return [out for p in new for out in self.dispatchers[p].start(core.now)]

    def start(self) -> list[Outgoing]:
        self._started = True
        return [out for d in self.dispatchers.values() for out in d.start(self._core.now)]

    def proposed(self, first: int, last: int) -> None:
        self._proposed = (first if self._proposed is None else self._proposed[0], last)
        self.log_grew = True

    def dropped(self, commit: int, term: int, new_leader: str | None) -> DroppedProposals | None:
        """The term ends: the proposals past `commit` will never commit from this node."""
        if self._proposed is None:
            return None
        first, last = max(self._proposed[0], commit + 1), self._proposed[1]
        return DroppedProposals(term, first, last, new_leader) if first <= last else None

    def poll_eager(self) -> list[Outgoing]:
        """What the eager dispatchers send now (new entries, a new commit index riding along);
        the lazy ones take theirs at a tick (eager_set.py)."""
        now = self._core.now
        return [out for d in self.dispatchers.values() if d.eager for out in d.poll(now)]

    def tick(self) -> list[Outgoing]:
        now = self._core.now
        if self._core.config.lazy_push_ms:  # thrifty replication on (else every dispatcher stays eager)
            self.eager_set.tick(now)
        return [out for d in self.dispatchers.values() for out in d.tick(now)]

    def heartbeats(self, peers: Sequence[str], commit: int) -> tuple[int, list[HeartbeatRequest]]:
        """A new heartbeat round to `peers`: its number and its messages. Each follower is told
        the commit index only as far as we know its log matches ours, so it may adopt it without
        checking (as etcd does): a follower that restarted learns the commit again from an idle
        leader."""
        core = self._core
        seq = self.contact.new_round(core.now)
        return seq, [HeartbeatRequest(core.id, p, core.term, commit_index=min(commit, self.quorum.match.get(p, 0)),
                                      seq=seq)
                     for p in peers]

    def on_heartbeat_response(self, msg: HeartbeatResponse) -> tuple[bool, list[Outgoing]]:
        """(whether it acknowledges a newer round than this follower had, what to send). A
        follower whose end is below the match index it acknowledged before this round was sent
        lost entries (an idle leader learns it here, having no appends to be refused)."""
        d = self.dispatchers.get(msg.src)
        if d is None:
            return False, []  # no longer a member
        self.contact.heard_from(msg.src, self._core.now)
        newer = self.contact.acknowledged(msg.src, msg.seq)
        d.on_heartbeat_response(msg.end_index)
        if msg.end_index < d.match_index and msg.seq > self._match_round.get(msg.src, 0):
            out = d.follower_lost_entries(msg.end_index, self._core.now)
            self.quorum.regress(msg.src, d.match_index)
            return newer, out
        return newer, []

    def on_push_response(self, msg: PushResponse) -> list[Outgoing]:
        d = self.dispatchers.get(msg.src)
        if d is None:
            return []
        self.contact.heard_from(msg.src, self._core.now)
        return self._tracking_match(msg.src, d.on_push_response(msg, self._core.now))

    def on_snapshot_response(self, msg: InstallSnapshotResponse) -> list[Outgoing]:
        d = self.dispatchers.get(msg.src)
        if d is None:
            return []
        self.contact.heard_from(msg.src, self._core.now)
        return self._tracking_match(msg.src, d.on_snapshot_response(msg, self._core.now))

    def _tracking_match(self, peer: str, out: list[Outgoing]) -> list[Outgoing]:
        """Bring the quorum tracker and the match round up to the dispatcher's match index (which
        an answer raises, or lowers when the follower lost entries)."""
        match = self.dispatchers[peer].match_index
        if match < self.quorum.match[peer]:
            self.quorum.regress(peer, match)
        elif match > self.quorum.match[peer]:
            self._match_round[peer] = self.contact.seq
        return out

    def match_index(self, peer: str) -> int:
        d = self.dispatchers.get(peer)
        return d.match_index if d is not None else 0

    def replicating_floor(self) -> int | None:
        """The lowest match index of the followers that are appending and answered within an
        election timeout (None when none is)."""
        now, t = self._core.now, self._core.config.election_timeout_ms
        live = [d.match_index for d in self.dispatchers.values()
                if d.state == DispatchState.APPEND and self.contact.live(d.peer, now, t)]
        return min(live) if live else None
