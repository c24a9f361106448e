"""Leadership: what a node holds only while it leads a term, made anew at each election won.

- a Dispatcher per follower (dispatcher.py): replication, DLedger's per-follower states;
- the eager set (eager_set.py): which followers get new entries at once (thrifty replication);
- the quorum tracker (quorum.py): each member's match index, and what a majority holds;
- the follower contact (contact.py): heartbeat rounds, the lease, check-quorum;
- the range of indexes proposed in this term (failed back to their callers if the term ends).

The core (raft.py) routes messages here and sends what comes back; it keeps the roles, the commit
index and the read rounds."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from raft.core.contact import FollowerContact
from raft.core.dispatcher import Dispatcher, DispatchState, Outgoing
from raft.core.eager_set import EagerSet
from raft.core.messages import HeartbeatRequest, HeartbeatResponse, InstallSnapshotResponse, PushResponse
from raft.core.quorum import QuorumTracker, majority
from raft.core.ready import DroppedProposals

if TYPE_CHECKING:
    from raft.core.raft import RaftCore


class Leadership:
    def __init__(self, core: RaftCore) -> None:
        quorum = majority(len(core.members))
        self._core = core
        self.dispatchers = {p: Dispatcher(p, core) for p in core.peers}
        self.eager_set = EagerSet(list(self.dispatchers.values()), quorum - 1, core.config, core.now)
        self.quorum = QuorumTracker(core.members)
        self.contact = FollowerContact(core.peers, quorum, core.now)
        self.next_heartbeat = 0
        # follower -> the newest heartbeat round sent before its match index last rose: an answer
        # to a later round comes from a log that held those entries, unless it lost them.
        self._match_round: dict[str, int] = {}
        self._proposed: tuple[int, int] | None = None  # [first, last] proposed in this term
        # Entries were proposed since the last Ready: eager dispatchers send them in the next one
        # (batching everything proposed meanwhile).
        self.log_grew = False

    def start(self) -> list[Outgoing]:
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
        return seq, [HeartbeatRequest(core.id, p, core.term, commit_index=min(commit, self.quorum.match[p]), seq=seq)
                     for p in peers]

    def on_heartbeat_response(self, msg: HeartbeatResponse) -> tuple[bool, list[Outgoing]]:
        """(whether it acknowledges a newer round than this follower had, what to send). A
        follower whose end is below the match index it acknowledged before this round was sent
        lost entries (an idle leader learns it here, having no appends to be refused)."""
        self.contact.heard_from(msg.src, self._core.now)
        newer = self.contact.acknowledged(msg.src, msg.seq)
        d = self.dispatchers[msg.src]
        d.on_heartbeat_response(msg.end_index)
        if msg.end_index < d.match_index and msg.seq > self._match_round.get(msg.src, 0):
            out = d.follower_lost_entries(msg.end_index, self._core.now)
            self.quorum.regress(msg.src, d.match_index)
            return newer, out
        return newer, []

    def on_push_response(self, msg: PushResponse) -> list[Outgoing]:
        self.contact.heard_from(msg.src, self._core.now)
        return self._tracking_match(msg.src, self.dispatchers[msg.src].on_push_response(msg, self._core.now))

    def on_snapshot_response(self, msg: InstallSnapshotResponse) -> list[Outgoing]:
        self.contact.heard_from(msg.src, self._core.now)
        return self._tracking_match(msg.src, self.dispatchers[msg.src].on_snapshot_response(msg, self._core.now))

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
        return self.dispatchers[peer].match_index

    def replicating_floor(self) -> int | None:
        """The lowest match index of the followers that are appending and answered within an
        election timeout (None when none is)."""
        now, t = self._core.now, self._core.config.election_timeout_ms
        live = [d.match_index for d in self.dispatchers.values()
                if d.state == DispatchState.APPEND and self.contact.live(d.peer, now, t)]
        return min(live) if live else None
