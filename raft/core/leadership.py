"""Leadership: what a node holds only while it leads a term, made anew at each election won, and
the leader's work: its rounds, its commit, a leadership transfer.

- a Dispatcher per follower (dispatcher.py): replication, DLedger's per-follower states;
- the eager set (eager_set.py): which followers get new entries at once (thrifty replication);
- the quorum tracker (quorum.py): each member's match index, and what a majority holds;
- the follower contact (contact.py): heartbeat rounds, the lease, check-quorum;
- the range of indexes proposed in this term (failed back to their callers if the term ends);
- a leadership transfer under way (Raft thesis §3.10), if any.

Learners get a dispatcher like any follower, always lazy, and count in no majority.

The core (raft.py) routes the leader's inputs here; it keeps the roles, the proposals' entries and
the follower side. What leaves goes to the Outbox the core drains into each Ready."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from raft.core.contact import FollowerContact
from raft.core.dispatcher import Dispatcher, DispatchState, Outgoing
from raft.core.eager_set import EagerSet
from raft.core.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    InstallSnapshotResponse,
    PushResponse,
    TimeoutNowRequest,
)
from raft.core.membership import Membership
from raft.core.node_state import NodeState
from raft.core.outbox import Outbox
from raft.core.quorum import QuorumTracker
from raft.core.read_index import ReadIndexTracker
from raft.core.ready import DroppedProposals


@dataclass(slots=True)
class Transfer:
    """Leadership is being handed to `target`: no proposals are taken until it wins (this term
    ends) or `deadline` passes (the transfer failed; this node leads on)."""

    target: str
    deadline: int
    timeout_sent: bool = False


class Leadership:
    def __init__(self, state: NodeState, membership: Membership, out: Outbox, reads: ReadIndexTracker) -> None:
        self._state = state
        self._out = out
        self._reads = reads
        self.dispatchers: dict[str, Dispatcher] = {}
        self.quorum = QuorumTracker([state.id], [])
        self.contact = FollowerContact((), 0, state.now)
        self.transfer: Transfer | None = None
        self._started = False
        self._reconfigure(membership)
        self.next_heartbeat = 0
        # follower -> the newest heartbeat round sent before its match index last rose: an answer
        # to a later round comes from a log that held those entries, unless it lost them.
        self._match_round: dict[str, int] = {}
        self._proposed: tuple[int, int] | None = None  # [first, last] proposed in this term
        # Entries were proposed since the last Ready: eager dispatchers send them in the next one
        # (batching everything proposed meanwhile).
        self.log_grew = False

    def start(self) -> None:
        """The term's first acts: every dispatcher starts, a heartbeat to every follower, and this
        node's own log counts toward a quorum."""
        s = self._state
        self._started = True
        self._out.send([out for d in self.dispatchers.values() for out in d.start(s.now)])
        self.broadcast_heartbeat()
        self.update_match(s.id, s.log.persisted_index)

    def follow(self, membership: Membership) -> None:
        """A new configuration took effect: follow it, and commit what its voters already hold
        (fewer voters may make a majority already)."""
        self._reconfigure(membership)
        self.maybe_commit()

    def _reconfigure(self, membership: Membership) -> None:
        """A dispatcher for each member but this node (kept for those that stay), the quorum over
        its voters; new dispatchers start at once (once the term's start() has run)."""
        s = self._state
        self._membership = membership
        peers = [m for m in membership.members if m != s.id]
        voter_peers = [m for m in membership.voters if m != s.id]
        need = membership.quorum() - (1 if s.id in membership.voters else 0)
        new = [p for p in peers if p not in self.dispatchers]
        self.dispatchers = {p: self.dispatchers.get(p) or Dispatcher(p, s) for p in peers}
        self.quorum.reconfigure([s.id, *peers], membership.voters)
        self.contact.reconfigure(voter_peers, need)
        self.eager_set = EagerSet([self.dispatchers[p] for p in voter_peers], need, s.config, s.now)
        for p in peers:
            if p not in membership.voters and s.config.lazy_push_ms:
                self.dispatchers[p].eager = False
        if self.transfer is not None and self.transfer.target not in membership.voters:
            self.transfer = None
        if self._started:
            self._out.send([out for p in new for out in self.dispatchers[p].start(s.now)])

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
        now = self._state.now
        return [out for d in self.dispatchers.values() if d.eager for out in d.poll(now)]

    def discount(self, held: int) -> None:
        """This leader stalled `held` ms beyond a heartbeat interval (stall.py): neither its
        check-quorum nor a transfer's deadline counts them (the target's answers waited unread)."""
        self.contact.discount(held)
        if self.transfer is not None:
            self.transfer.deadline += held

    def tick(self) -> bool:
        """The leader's tick: a transfer that ran out, the periodic heartbeat, check-quorum, the
        lazy followers' batches. False when no majority answered for an election timeout: this
        node may be cut off, and steps down (the core makes it a follower)."""
        s = self._state
        if self.transfer is not None and s.now >= self.transfer.deadline:
            self.transfer = None  # the target did not win in time: lead on, and take proposals again
        if s.now >= self.next_heartbeat:
            self.broadcast_heartbeat()
        if not self.contact.quorum_active(s.now, s.config.election_timeout_ms):
            return False
        if s.config.lazy_push_ms:  # thrifty replication on (else every dispatcher stays eager)
            self.eager_set.tick(s.now)
        self._out.send([out for d in self.dispatchers.values() for out in d.tick(s.now)])
        return True

    def wants_ready(self) -> bool:
        return self.log_grew or self._reads.wants_round()

    def before_ready(self) -> None:
        """The leader's part of the next Ready: what was proposed since the last one goes to the
        eager followers in one batch, and waiting reads get a round."""
        if self.log_grew:
            self.log_grew = False
            self._out.send(self.poll_eager())
        if self._reads.wants_round():
            self.send_read_round()

    # ------------------------------------------------------------------ heartbeat rounds

    def broadcast_heartbeat(self) -> None:
        """The periodic heartbeat, to every follower; it also serves waiting reads."""
        self.next_heartbeat = self._state.now + self._state.config.heartbeat_interval_ms
        self._heartbeat_round(list(self.dispatchers))

    def send_read_round(self) -> None:
        """A heartbeat round for waiting reads, to no more followers than a majority needs: each
        heartbeat is a message to write and an answer to read on the leader, its busiest costs
        under reads (docs/performance.md); in a three-node cluster this halves them. If a chosen
        follower does not answer, the next periodic heartbeat (to every follower) confirms the
        round instead."""
        self._heartbeat_round(self.contact.read_round_peers())

    def _heartbeat_round(self, peers: Sequence[str]) -> None:
        """A new heartbeat round to `peers`. Each follower is told the commit index only as far
        as we know its log matches ours, so it may adopt it without checking (as etcd does): a
        follower that restarted learns the commit again from an idle leader."""
        s = self._state
        seq = self.contact.new_round(s.now)
        self._reads.round_sent(seq)
        self._out.leader_messages.extend(
            [HeartbeatRequest(s.id, p, s.term, commit_index=min(s.commit_index, self.quorum.match.get(p, 0)), seq=seq)
             for p in peers])
        self._check_read_rounds()

    def _check_read_rounds(self) -> None:
        confirmed = self.contact.confirmed_round()
        if confirmed > 0:
            self._reads.round_confirmed(confirmed)

    def on_heartbeat_response(self, msg: HeartbeatResponse) -> None:
        """A follower whose end is below the match index it acknowledged before this round was
        sent lost entries (an idle leader learns it here, having no appends to be refused)."""
        d = self.dispatchers.get(msg.src)
        if d is None or not msg.success:
            return  # (no longer a member)
        self.contact.heard_from(msg.src, self._state.now)
        newer = self.contact.acknowledged(msg.src, msg.seq)
        d.on_heartbeat_response(msg.end_index)
        lost: list[Outgoing] = []
        if msg.end_index < d.match_index and msg.seq > self._match_round.get(msg.src, 0):
            lost = d.follower_lost_entries(msg.end_index, self._state.now)
            self.quorum.regress(msg.src, d.match_index)
        if newer:
            self._check_read_rounds()
        self._out.send(lost)

    def lease_valid(self) -> bool:
        """See RaftCore.lease_valid."""
        return self._state.committed_in_term() and self.contact.lease_valid(self._state.now,
                                                                            self._state.config.lease_ms)

    def recently_active(self) -> frozenset[str]:
        """This node and the members that answered it within an election timeout."""
        s = self._state
        live = {p for p in self.dispatchers if self.contact.live(p, s.now, s.config.election_timeout_ms)}
        return frozenset({s.id, *live})

    # ------------------------------------------------------------------ replication and commit

    def on_push_response(self, msg: PushResponse) -> None:
        d = self.dispatchers.get(msg.src)
        if d is not None:
            self.contact.heard_from(msg.src, self._state.now)
            self._out.send(d.on_push_response(msg, self._state.now))
            self._track_match(msg.src)
        self.update_match(msg.src, self.match_index(msg.src))
        self._maybe_send_timeout_now()

    def on_snapshot_response(self, msg: InstallSnapshotResponse) -> None:
        d = self.dispatchers.get(msg.src)
        if d is not None:
            self.contact.heard_from(msg.src, self._state.now)
            self._out.send(d.on_snapshot_response(msg, self._state.now))
            self._track_match(msg.src)
        self.update_match(msg.src, self.match_index(msg.src))

    def _track_match(self, peer: str) -> None:
        """Bring the quorum tracker and the match round up to the dispatcher's match index (which
        an answer raises, or lowers when the follower lost entries)."""
        match = self.dispatchers[peer].match_index
        if match < self.quorum.match[peer]:
            self.quorum.regress(peer, match)
        elif match > self.quorum.match[peer]:
            self._match_round[peer] = self.contact.seq

    def match_index(self, peer: str) -> int:
        d = self.dispatchers.get(peer)
        return d.match_index if d is not None else 0

    def update_match(self, member: str, index: int) -> None:
        """`member` holds the log through `index` (the leader itself: what is on its own disk)."""
        if self.quorum.update(member, index):
            self.maybe_commit()

    def maybe_commit(self) -> None:
        """Commit the highest index a majority holds — only if that entry is of our term: an
        older-term entry is never committed by counting replicas (Raft §5.4.2, Figure 8)."""
        s = self._state
        n = self.quorum.quorum_index()
        if n <= s.commit_index or s.log.term(n) != s.term:
            return
        first_in_term = not s.committed_in_term()
        s.commit_index = n
        if first_in_term:
            self._reads.committed_in_term(n)
        # Entries waiting to go carry the new commit index now; a COMMIT push on its own waits for
        # the next tick (see the Dispatcher).
        self._out.send(self.poll_eager())

    def replicating_floor(self) -> int | None:
        """The lowest match index of the followers that are appending and answered within an
        election timeout (None when none is)."""
        now, t = self._state.now, self._state.config.election_timeout_ms
        live = [d.match_index for d in self.dispatchers.values()
                if d.state == DispatchState.APPEND and self.contact.live(d.peer, now, t)]
        return min(live) if live else None

    # ------------------------------------------------------------------ handing leadership over

    def transfer_to(self, target: str) -> None:
        """See RaftCore.transfer_leadership. ValueError for a target that cannot lead."""
        s = self._state
        if target == s.id:
            raise ValueError(f"{target} already leads")
        if not self._membership.is_voter(target):
            raise ValueError(f"{target} is not a voter" + (" (a learner: promote it first)"
                                                           if target in self._membership.learners else ""))
        self.transfer = Transfer(target, s.now + s.config.election_timeout_ms)
        dispatcher = self.dispatchers[target]
        dispatcher.eager = True  # a lazy follower's tail would wait up to lazy_push_ms
        self._out.send(dispatcher.poll(s.now))
        self._maybe_send_timeout_now()

    def _maybe_send_timeout_now(self) -> None:
        """Tell the transfer's target to stand once its log is ours."""
        transfer, s = self.transfer, self._state
        if transfer is None or transfer.timeout_sent:
            return
        if self.match_index(transfer.target) >= s.log.last_index():
            transfer.timeout_sent = True
            self._out.leader_messages.append(TimeoutNowRequest(s.id, transfer.target, s.term))

    def hand_over(self) -> None:
        """A committed configuration took away our vote, and this node steps down (the core makes
        it a follower): first tell the most caught-up voter to stand at once, so the cluster need
        not wait out a timeout."""
        s, voters = self._state, self._membership.voters
        best = max(self.dispatchers.values(), key=lambda d: (d.peer in voters, d.match_index), default=None)
        if best is not None and best.peer in voters and best.match_index >= s.log.last_index():
            self._out.leader_messages.append(TimeoutNowRequest(s.id, best.peer, s.term))
