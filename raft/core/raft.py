"""RaftCore: one node's protocol state machine — election (with pre-vote and check-quorum),
replication through per-follower dispatchers, quorum commit, ReadIndex and lease reads.

It never touches a socket, a disk, a clock or a thread: time comes in with `tick(now)`, randomness
from the generator passed in, the stable log is read through a LogStore, and every effect leaves in
a `Ready` (see ready.py for how a driver must handle one). That is what lets tests/sim run many
cores under a virtual clock and a hostile network, deterministically from a seed.

The core takes the inputs, routes messages, makes the role changes and serves the follower's side;
the election (election.py) stands and votes, and while this node leads, its Leadership
(leadership.py) runs the rounds and the commit. They share the node's term, vote, role, leader and
commit index (node_state.py) and leave their output in one Outbox (outbox.py) for the next Ready."""
from __future__ import annotations

import random
from typing import Sequence

from raft.core.apply_cursor import ApplyCursor
from raft.core.config import CoreConfig
from raft.core.election import Election
from raft.core.entry_handler import EntryHandler
from raft.core.errors import NotLeaderError, TransferringError
from raft.core.leadership import Leadership
from raft.core.log_store import LogStore
from raft.core.membership import ChangeKind, Membership, MembershipChangeError, MembershipLog
from raft.core.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    Message,
    PushRequest,
    PushResponse,
    TimeoutNowRequest,
    VoteRequest,
    VoteResponse,
    refusal_of_stale,
)
from raft.core.node_state import NodeState
from raft.core.outbox import Outbox
from raft.core.raft_log import RaftLog
from raft.core.read_index import ReadIndexTracker
from raft.core.ready import Ready, SoftState
from raft.core.stall import StallMeter
from raft.core.types import CoreStatus, Entry, EntryType, HardState, Role, SnapshotMeta


class RaftCore:
    """Inputs: tick(now), clock(now), step(message), propose(payloads), propose_membership(change),
    transfer_leadership(target), read_index(ctx), applied_to(index), peer_unreachable(peer).
    Outputs: ready() -> Ready, handled by the driver, then advance(ready).

    `membership`: the configuration in force at `applied_index` (what the state machine holds,
    else the bootstrap one of a new cluster; a plain sequence names voters without addresses);
    None for a node that joins a cluster it knows nothing of yet: it campaigns for nothing and
    follows whichever leader reaches it. Configurations in the log after `applied_index` take
    effect at once (membership.py). `log` is read, never written, by the core. `applied_index`
    is what the state machine already holds on (re)start: the core will not hand those entries
    out again. `membership_logged`: whether the base configuration came from the log (the
    state machine applied a CONFIG entry, or installed a snapshot); a leader writes one as its
    term's first entry while none is, so every log names its members. `rng` supplies the
    election timeout jitter, so a seeded generator makes runs repeatable. `rejoin_floor`: this
    node lost its log and rejoins (election.py says what that means)."""

    def __init__(self, node_id: str, membership: Membership | Sequence[str] | None, log: LogStore, config: CoreConfig,
                 rng: random.Random, now: int, applied_index: int = 0,
                 rejoin_floor: tuple[int, int] | None = None, membership_logged: bool = False) -> None:
        if membership is not None and not isinstance(membership, Membership):
            membership = Membership.of_voters({m: "" for m in membership})
        if membership is not None and node_id not in membership and not membership_logged:
            # (A configuration from the log may not name this node: a learner's first snapshot
            # can predate the entry that added it, which its log may not hold yet; a removed
            # node learns below that it was removed.)
            raise ValueError(f"{node_id!r} is not among the members {list(membership.members)}")
        self.id = node_id
        self.config = config
        self.log = RaftLog(log)
        before_index, _ = self.log.before_begin()
        if not before_index <= applied_index <= self.log.last_index():
            raise ValueError(f"the state machine's applied index {applied_index} lies outside the log "
                             f"({before_index}, {self.log.last_index()}]: the data directory is inconsistent")
        self._configs = MembershipLog(applied_index, membership or Membership(), logged=membership_logged,
                                      known=membership is not None)
        self.log.configs = self._configs
        self._configs.scan(self.log, applied_index)
        self.membership = self._configs.latest
        self._removed_at: int | None = None  # the committed configuration that removed this node
        hard = log.hard_state()
        # Term, vote, role, leader and commit index, shared with the election and the leadership.
        self._state = NodeState(node_id, config, self.log, now, hard.term, hard.voted_for, commit_index=applied_index)
        self._apply = ApplyCursor(applied_index)
        self._handler = EntryHandler(self.log, config)
        self._reads = ReadIndexTracker()
        self._out = Outbox()  # drained by ready()
        self._election = Election(self._state, self._configs, self._out, rng, rejoin_floor)
        self._election.reset_timer()
        self._lead: Leadership | None = None  # while this node leads its term
        self._pending_snapshot: SnapshotMeta | None = None
        self._installing = False
        self._last_soft: SoftState | None = None
        self._outstanding: Ready | None = None
        self._stalls = StallMeter(now, config.heartbeat_interval_ms)

    # ------------------------------------------------------------------ views

    @property
    def now(self) -> int:
        return self._state.now

    @property
    def term(self) -> int:
        return self._state.term

    @property
    def members(self) -> tuple[str, ...]:
        """Every member of the latest configuration, voters and learners."""
        return self.membership.members

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(m for m in self.membership.members if m != self.id)

    @property
    def committed_membership(self) -> Membership:
        """The configuration in force at the commit index (the latest one may be newer, and may
        still be truncated away)."""
        return self._configs.at(self._state.commit_index)

    @property
    def removed_at(self) -> int | None:
        """The index of a committed configuration that removed this node (None: none did). Once
        it is applied the node is done (the driver stops it)."""
        return self._removed_at

    @property
    def role(self) -> Role:
        return self._state.role

    @property
    def leader(self) -> str | None:
        return self._state.leader

    @property
    def commit_index(self) -> int:
        return self._state.commit_index

    @property
    def rejoining(self) -> bool:
        return self._election.rejoining

    @property
    def applied_index(self) -> int:
        return self._apply.applied

    def status(self) -> CoreStatus:
        s = self._state
        peers = dict(self._lead.quorum.match) if self._lead is not None else {}
        transfer = self._lead.transfer if self._lead is not None else None
        return CoreStatus(self.id, s.role, s.term, s.leader, s.commit_index, self._apply.applied,
                          self.log.last_index(), self.log.before_begin()[0], peers,
                          tuple(sorted(self.membership.voters)), tuple(sorted(self.membership.learners)),
                          transfer.target if transfer is not None else None)

    def recently_active(self) -> frozenset[str]:
        """(Leader) This node and the members that answered it within an election timeout
        (etcd's "started" members, for its strict reconfiguration check); empty when not leader."""
        return self._lead.recently_active() if self._lead is not None else frozenset()

    def replicating_floor(self) -> int | None:
        """(Leader) The lowest match index of the followers that are appending and answered within
        an election timeout: the driver's compaction keeps what they still need, so a live
        follower (a lazy one trails by up to lazy_push_ms) is not sent a snapshot for entries the
        leader dropped a moment ago. None when not leader or no follower is live."""
        return self._lead.replicating_floor() if self._lead is not None else None

    def lease_valid(self) -> bool:
        """True while a quorum acknowledged a heartbeat sent less than lease_ms ago. Followers do
        not grant (pre-)votes for election_timeout_ms after hearing from a leader, so no other
        leader can exist meanwhile (lease_ms < election_timeout_ms leaves room for clock drift)."""
        return self._lead is not None and self._lead.lease_valid()

    # ------------------------------------------------------------------ inputs

    def tick(self, now: int) -> None:
        held = self._stalls.held(now)
        if held:  # this node stalled: its timers count a heartbeat interval of it (stall.py)
            (self._lead if self._lead is not None else self._election).discount(held)
        self.clock(now)
        if self._lead is not None:
            if not self._lead.tick():
                self._become_follower(self._state.term, None)  # check-quorum: we may be cut off
            return
        if self._election.timer_fired():
            self._set_leader(None)
            if self._election.start_pre_vote():
                self._become_leader()
        self._out.messages.extend(self._handler.expire_held(self.now))

    def clock(self, now: int) -> None:
        """The driver's time between ticks, passed with other inputs: sends and answers are dated
        by it (how fast each follower answers, a lease's age), while timers still fire only at
        ticks. Time never moves backwards."""
        self._state.now = max(self._state.now, now)

    def propose(self, payloads: Sequence[bytes]) -> tuple[int, int]:
        lead, term = self._leading(), self._state.term
        first = self.log.last_index() + 1
        self.log.append([Entry(first + i, term, EntryType.NORMAL, p) for i, p in enumerate(payloads)])
        lead.proposed(first, self.log.last_index())
        return first, term

    def _leading(self) -> Leadership:
        """This node's leadership, if it takes proposals now."""
        if self._lead is None:
            raise NotLeaderError(self._state.leader, self._state.term)
        if self._lead.transfer is not None:
            raise TransferringError(self._lead.transfer.target, self._state.term)
        return self._lead

    def propose_membership(self, kind: ChangeKind, member: str, address: str = "") -> tuple[int, int]:
        """Propose one membership change as a CONFIG entry: (index, term) of the entry, which
        takes effect at once and is answered, as any proposal, when it is applied.
        MembershipChangeError when it cannot be made now (membership.py's rules)."""
        lead = self._leading()
        if self._configs.latest_index > self._state.commit_index:
            raise MembershipChangeError(f"a membership change is still in progress (the configuration at index "
                                        f"{self._configs.latest_index} is not committed yet); try again shortly")
        if not self._state.committed_in_term():
            raise MembershipChangeError("the leader has not committed an entry of its term yet; try again shortly")
        changed = self.membership.changed(kind, member, address)
        index, term = self.log.last_index() + 1, self._state.term
        self.log.append([Entry(index, term, EntryType.CONFIG, changed.encode())])
        lead.proposed(index, index)
        self._sync_membership()
        return index, term

    def transfer_leadership(self, target: str) -> None:
        """Hand leadership to voter `target` (Raft thesis §3.10): take no proposals, bring its log
        up to ours, then tell it to stand at once (TimeoutNowRequest). If it has not won within an
        election timeout, lead on. ValueError for a target that cannot lead."""
        self._leading().transfer_to(target)

    def read_index(self, ctx: object) -> None:
        s = self._state
        if s.role != Role.LEADER:
            raise NotLeaderError(s.leader, s.term)
        self._reads.add(ctx, s.commit_index if s.committed_in_term() else None)

    def peer_unreachable(self, peer: str) -> None:
        """The transport lost its connection to `peer`: refused or reset, so the process is gone.
        A follower whose leader that is stands sooner (Election.peer_unreachable)."""
        self._election.peer_unreachable(peer)

    def join(self, term: int, floor: tuple[int, int] | None) -> None:
        """A node that started empty learnt what its cluster holds (raft/node/joining.py): it takes
        `term`, the highest its peers reported, as one it has voted in (its own vote, which grants
        no other candidate one: it may have voted in that term before losing its data), so it
        follows that term's leader and deposes no one; with a `floor` (the cluster has a log) it
        rejoins (see election.py), else it is a founder and votes from the next term on."""
        if term > self._state.term:
            self._state.new_term(term)
            self._state.vote(self._state.id)
        self._election.rejoin_floor = floor

    def refloor(self, floor: tuple[int, int] | None) -> None:
        self._election.refloor(floor)

    def applied_to(self, index: int) -> None:
        self._apply.applied_to(index)

    def apply_stopped(self, applied_index: int, hold: bool = False) -> None:
        """The state machine applied only through `applied_index` of what was handed out (it ends
        a batch at a state check marker, or its disk is full): the rest is handed out again, in the
        next Ready or, with `hold`, after resume_apply(). The entries stay committed; nothing else
        waits on them (a leader goes on replicating, and refusing new writes is the driver's)."""
        self._apply.stopped(applied_index, hold)

    def resume_apply(self) -> None:
        self._apply.resume()

    def _entries_to_apply(self) -> bool:
        return not self._installing and self._apply.has_more(self._state.commit_index)

    def step(self, msg: Message) -> None:
        if msg.dst != self.id or msg.src == self.id:
            return
        if isinstance(msg, VoteRequest) and self._election.refused_stranger(msg):
            return
        self._step(msg)
        self._sync_membership()

    def _step(self, msg: Message) -> None:
        s = self._state
        if msg.term > s.term:
            if isinstance(msg, VoteRequest):
                if msg.pre_vote:
                    self._election.on_vote_request(msg)  # a pre-vote changes no one's term
                    return
                if self._election.in_lease() and not msg.transfer:
                    return  # a disruptive candidate: ignore it without adopting its term
            if isinstance(msg, VoteResponse) and msg.pre_vote and msg.granted:
                self._on_vote_response(msg)  # carries the term we would stand in
                return
            is_leader_msg = isinstance(msg, (HeartbeatRequest, PushRequest, InstallSnapshotRequest, TimeoutNowRequest))
            self._become_follower(msg.term, msg.src if is_leader_msg else None)
        elif msg.term < s.term:
            reply = refusal_of_stale(msg, self.id, s.term, self.log.last_index())
            if reply is not None:
                self._out.messages.append(reply)
            return
        handler = {
            VoteRequest: self._election.on_vote_request,
            VoteResponse: self._on_vote_response,
            HeartbeatRequest: self._on_heartbeat,
            HeartbeatResponse: self._on_heartbeat_response,
            PushRequest: self._on_push,
            PushResponse: self._on_push_response,
            InstallSnapshotRequest: self._on_install_snapshot,
            InstallSnapshotResponse: self._on_snapshot_response,
            TimeoutNowRequest: self._on_timeout_now,
        }[type(msg)]
        handler(msg)  # type: ignore[operator]

    # ------------------------------------------------------------------ outputs

    def has_ready(self) -> bool:
        if self._outstanding is not None:
            return False
        return bool(
            self._soft_state_changed() or self._state.hard_dirty or self._pending_snapshot
            or self.log.has_unpersisted() or self._out.pending() or self._entries_to_apply()
            or (self._lead is not None and self._lead.wants_ready())
            or self._reads.has_ready(self._apply.applied)
        )

    def ready_is_light(self) -> bool:
        """Whether the next Ready only sends messages and serves or fails reads and proposals: no
        role change, nothing to persist, install, apply or stream. A driver may handle such a Ready
        inside the call that made it. (A leader's dispatchers poll inside ready() only after a
        proposal, whose entries are unpersisted, so a light Ready never starts a snapshot stream.)"""
        return not (
            self._soft_state_changed() or self._state.hard_dirty or self._pending_snapshot
            or self.log.has_unpersisted() or self._entries_to_apply()
            or self._out.snapshot_sends
        )

    def take_early_messages(self) -> list[Message]:
        """The messages that may leave now, before the Ready being handled is advanced: the
        leader's (heartbeats and appends, which may precede even its own write: Raft thesis
        §10.2.1) and a follower's answers to heartbeats (they acknowledge no entry; not while a new
        term is still to be saved). Taken out of the next Ready. A node whose apply of one large
        entry (a range deletion of 100,000 keys) outlasts an election timeout stays heard: as a
        leader its heartbeats leave, as a follower its answers do, so neither the followers stand
        nor the leader's check-quorum deposes it (etcd's raft loop likewise runs beside its apply)."""
        return self._out.take_early(answers=not self._state.hard_dirty)

    def ready(self) -> Ready:
        if self._outstanding is not None:
            raise RuntimeError("advance() the previous Ready before asking for another")
        if self._lead is not None:
            self._lead.before_ready()
        s = self._state
        rd = Ready()
        if self._soft_state_changed():
            rd.soft_state = self._last_soft = SoftState(s.role, s.leader, s.term, self.rejoining)
        if s.hard_dirty:
            rd.hard_state, s.hard_dirty = HardState(s.term, s.voted_for), False
        if self._pending_snapshot is not None:
            rd.snapshot, self._pending_snapshot = self._pending_snapshot, None
        rd.truncate_from, rd.entries = self.log.take_unpersisted()
        if self._entries_to_apply():
            first, last = self._apply.take(s.commit_index, self.config.max_apply_batch)
            rd.committed_entries = self.log.entries(first, last + 1)
        rd.reads = self._reads.take_ready(self._apply.applied)
        self._out.take_into(rd)
        self._outstanding = rd
        return rd

    def advance(self, rd: Ready) -> None:
        """The driver has handled `rd` completely (persisted, sent, applied what it carried)."""
        if rd is not self._outstanding:
            raise RuntimeError("advance() takes the Ready last returned by ready()")
        self._outstanding = None
        if rd.snapshot is not None:
            self.log.reload_after_snapshot()
            self._installing = False
            idx = rd.snapshot.index
            self._state.commit_index = max(self._state.commit_index, idx)
            self._apply.installed(idx)
            self._handler.matched_through(idx)
            self._configs.reset(idx, Membership.decode(rd.snapshot.membership) if rd.snapshot.membership else None)
            self._configs.scan(self.log, idx)
        if rd.entries:
            self.log.stable_to(rd.entries[-1].index, rd.entries[-1].term)
        self._election.check_caught_up()
        if self._lead is not None:
            # The leader counts itself toward a quorum only for what is on its own disk.
            self._lead.update_match(self.id, self.log.persisted_index)
        self._sync_membership()

    def _sync_membership(self) -> None:
        """Follow the latest configuration in the log (membership.py), and act on one that
        committed: a leader it removed steps down; a node it removed is done."""
        configs = self._configs
        latest = configs.latest
        if latest is not self.membership:
            self.membership = self._election.membership = latest
            if self._lead is not None:
                self._lead.follow(latest)
        configs.committed_through(self._state.commit_index)
        committed = configs.latest_index <= self._state.commit_index
        if committed and self.id in latest.removed and self._removed_at is None:
            self._removed_at = configs.latest_index
        if self._lead is not None and not latest.is_voter(self.id) and committed:
            self._lead.hand_over()
            self._become_follower(self._state.term, None)

    def _soft_state_changed(self) -> bool:
        # Field by field: has_ready runs several times per write, and building a SoftState to
        # compare cost more than the rest of it.
        last, s = self._last_soft, self._state
        return (last is None or last.role is not s.role or last.leader != s.leader or last.term != s.term
                or last.rejoining != self.rejoining)

    # ------------------------------------------------------------------ roles

    def _set_leader(self, leader: str | None) -> None:
        if leader != self._state.leader:
            self._handler.reset()
        self._state.leader = leader

    def _become_follower(self, term: int, leader: str | None) -> None:
        s = self._state
        old_term = s.term
        if term > s.term:
            s.new_term(term)
            self._handler.reset()
        if s.role == Role.LEADER:
            self._drop_leadership(old_term, leader)
        s.role = Role.FOLLOWER
        self._election.votes = {}
        self._set_leader(leader)
        if leader is not None:
            s.leader_contact = s.now
        self._election.reset_timer()

    def _drop_leadership(self, old_term: int, new_leader: str | None) -> None:
        assert self._lead is not None
        dropped = self._lead.dropped(self._state.commit_index, old_term, new_leader)
        if dropped is not None:
            self._out.failed_proposals.append(dropped)
        self._out.failed_reads.extend(self._reads.fail_unconfirmed(new_leader))
        self._lead = None

    def _become_leader(self) -> None:
        s = self._state
        s.role = Role.LEADER
        self._set_leader(self.id)
        self._election.votes = {}
        # A no-op of our term: entries of older terms commit only under one of ours (Raft §5.4.2).
        # While the log names no configuration (a new cluster's first leader), the configuration
        # it starts with takes the no-op's place, so that every log names its members.
        index = self.log.last_index() + 1
        if self._configs.logged:
            self.log.append([Entry(index, s.term, EntryType.NOOP)])
        else:
            self.log.append([Entry(index, s.term, EntryType.CONFIG, self.membership.encode())])
        self._lead = Leadership(s, self.membership, self._out, self._reads)
        self._lead.start()
        self._sync_membership()

    def _on_vote_response(self, msg: VoteResponse) -> None:
        if self._election.on_vote_response(msg):
            self._become_leader()

    # ------------------------------------------------------------------ follower side

    def _accept_leader(self, leader: str) -> bool:
        """A leader's message of our term: follow it. False if we lead this term ourselves
        (impossible while election safety holds; ignored rather than obeyed)."""
        s = self._state
        if s.role == Role.LEADER:
            return False
        if s.role != Role.FOLLOWER or s.leader != leader:
            self._become_follower(s.term, leader)
        s.leader_contact = s.now
        self._election.reset_timer()
        return True

    def _learn_commit(self, leader_commit: int) -> None:
        self._state.commit_index = max(self._state.commit_index, self._handler.commit_bound(leader_commit))

    def _on_heartbeat(self, msg: HeartbeatRequest) -> None:
        if not self._accept_leader(msg.src) or self._installing:
            return
        # The leader sends min(its commit, our match index): our log matches its log that far.
        self._handler.matched_through(min(msg.commit_index, self.log.last_index()))
        self._learn_commit(msg.commit_index)
        self._out.messages.append(HeartbeatResponse(self.id, msg.src, self._state.term, success=True, seq=msg.seq,
                                                    end_index=self.log.last_index()))

    def _on_push(self, msg: PushRequest) -> None:
        if not self._accept_leader(msg.src) or self._installing:
            return
        self._out.messages.extend(self._handler.handle(msg, self.now, self._state.commit_index))
        self._learn_commit(msg.commit_index)

    def _on_timeout_now(self, msg: TimeoutNowRequest) -> None:
        """Our leader hands us leadership: stand now, with no pre-vote (its log is ours)."""
        if not self._accept_leader(msg.src) or self.rejoining or not self.membership.is_voter(self.id):
            return
        self._set_leader(None)
        if self._election.start_election(transfer=True):
            self._become_leader()

    def _on_install_snapshot(self, msg: InstallSnapshotRequest) -> None:
        if not self._accept_leader(msg.src) or self._installing:
            return
        meta = msg.meta
        if meta.index > self._state.commit_index:
            self._installing = True
            self.log.discard_unpersisted()
            self._handler.reset()
            self._pending_snapshot = meta
        # else: we already hold everything it contains (committed entries match every leader's).
        self._out.messages.append(InstallSnapshotResponse(self.id, msg.src, self._state.term, success=True,
                                                          index=meta.index,
                                                          end_index=max(meta.index, self.log.last_index())))

    # ------------------------------------------------------------------ leader side

    def _on_heartbeat_response(self, msg: HeartbeatResponse) -> None:
        if self._lead is not None:
            self._lead.on_heartbeat_response(msg)

    def _on_push_response(self, msg: PushResponse) -> None:
        if self._lead is not None:
            self._lead.on_push_response(msg)

    def _on_snapshot_response(self, msg: InstallSnapshotResponse) -> None:
        if self._lead is not None:
            self._lead.on_snapshot_response(msg)
