"""RaftCore: one node's protocol state machine — election (with pre-vote and check-quorum),
replication through per-follower dispatchers, quorum commit, ReadIndex and lease reads.

It never touches a socket, a disk, a clock or a thread: time comes in with `tick(now)`, randomness
from the generator passed in, the stable log is read through a LogStore, and every effect leaves in
a `Ready` (see ready.py for how a driver must handle one). That is what lets tests/sim run many
cores under a virtual clock and a hostile network, deterministically from a seed."""
from __future__ import annotations

import random
from typing import Sequence

from raft.core.apply_cursor import ApplyCursor
from raft.core.config import CoreConfig
from raft.core.dispatcher import Outgoing
from raft.core.election import Election
from raft.core.entry_handler import EntryHandler
from raft.core.errors import NotLeaderError, TransferringError
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
from raft.core.leadership import Leadership, Transfer
from raft.core.raft_log import RaftLog
from raft.core.read_index import ReadIndexTracker
from raft.core.ready import DroppedProposals, FailedRead, Ready, SnapshotSend, SoftState
from raft.core.types import CoreStatus, Entry, EntryType, HardState, Role, SnapshotMeta

_NEVER = -(1 << 62)


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
        self.now = now
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
        self._term = hard.term
        self._voted_for = hard.voted_for
        self._hard_dirty = False
        self._role = Role.FOLLOWER
        self._leader: str | None = None
        self._leader_contact = _NEVER
        self._commit = applied_index
        self._apply = ApplyCursor(applied_index)
        self._handler = EntryHandler(self.log, config)
        self._reads = ReadIndexTracker()
        self._election = Election(config, rng, frozenset(self.membership.voters), rejoin_floor)
        self._election.reset_timer(now)
        self._lead: Leadership | None = None  # while this node leads its term
        # Output queues, drained by ready().
        self._messages: list[Message] = []
        self._leader_messages: list[Message] = []
        self._failed_proposals: list[DroppedProposals] = []
        self._failed_reads: list[FailedRead] = []
        self._snapshot_sends: list[SnapshotSend] = []
        self._pending_snapshot: SnapshotMeta | None = None
        self._installing = False
        self._last_soft: SoftState | None = None
        self._outstanding: Ready | None = None

    # ------------------------------------------------------------------ views

    @property
    def term(self) -> int:
        return self._term

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
        return self._configs.at(self._commit)

    @property
    def removed_at(self) -> int | None:
        """The index of a committed configuration that removed this node (None: none did). Once
        it is applied the node is done (the driver stops it)."""
        return self._removed_at

    @property
    def role(self) -> Role:
        return self._role

    @property
    def leader(self) -> str | None:
        return self._leader

    @property
    def commit_index(self) -> int:
        return self._commit

    @property
    def rejoining(self) -> bool:
        return self._election.rejoining

    @property
    def applied_index(self) -> int:
        return self._apply.applied

    def status(self) -> CoreStatus:
        peers = dict(self._lead.quorum.match) if self._lead is not None else {}
        transfer = self._lead.transfer if self._lead is not None else None
        return CoreStatus(self.id, self._role, self._term, self._leader, self._commit, self._apply.applied,
                          self.log.last_index(), self.log.before_begin()[0], peers,
                          tuple(sorted(self.membership.voters)), tuple(sorted(self.membership.learners)),
                          transfer.target if transfer is not None else None)

    def recently_active(self) -> frozenset[str]:
        """(Leader) This node and the members that answered it within an election timeout
        (etcd's "started" members, for its strict reconfiguration check); empty when not leader."""
        if self._lead is None:
            return frozenset()
        live = {p for p in self._lead.dispatchers
                if self._lead.contact.live(p, self.now, self.config.election_timeout_ms)}
        return frozenset({self.id, *live})

    def replicating_floor(self) -> int | None:
        """(Leader) The lowest match index of the followers that are appending and answered within
        an election timeout: the driver's compaction keeps what they still need, so a live
        follower (a lazy one trails by up to lazy_push_ms) is not sent a snapshot for entries the
        leader dropped a moment ago. None when not leader or no follower is live."""
        return self._lead.replicating_floor() if self._lead is not None else None

    def _committed_in_term(self) -> bool:
        return self.log.term(self._commit) == self._term

    def lease_valid(self) -> bool:
        """True while a quorum acknowledged a heartbeat sent less than lease_ms ago. Followers do
        not grant (pre-)votes for election_timeout_ms after hearing from a leader, so no other
        leader can exist meanwhile (lease_ms < election_timeout_ms leaves room for clock drift)."""
        if self._lead is None or not self._committed_in_term():
            return False
        return self._lead.contact.lease_valid(self.now, self.config.lease_ms)

    # ------------------------------------------------------------------ inputs

    def tick(self, now: int) -> None:
        self.clock(now)
        if self._lead is not None:
            self._tick_leader(self._lead)
            return
        if self.now >= self._election.deadline:
            if self.rejoining or not self._may_stand(self.id):
                self._election.reset_timer(self.now)  # not a voter (yet): it waits for a leader
            else:
                self._start_pre_vote()
        self._messages.extend(self._handler.expire_held(self.now))

    def clock(self, now: int) -> None:
        """The driver's time between ticks, passed with other inputs: sends and answers are dated
        by it (how fast each follower answers, a lease's age), while timers still fire only at
        ticks. Time never moves backwards."""
        self.now = max(self.now, now)

    def propose(self, payloads: Sequence[bytes]) -> tuple[int, int]:
        lead = self._leading()
        first = self.log.last_index() + 1
        self.log.append([Entry(first + i, self._term, EntryType.NORMAL, p) for i, p in enumerate(payloads)])
        lead.proposed(first, self.log.last_index())
        return first, self._term

    def _leading(self) -> Leadership:
        """This node's leadership, if it takes proposals now."""
        if self._lead is None:
            raise NotLeaderError(self._leader, self._term)
        if self._lead.transfer is not None:
            raise TransferringError(self._lead.transfer.target, self._term)
        return self._lead

    def propose_membership(self, kind: ChangeKind, member: str, address: str = "") -> tuple[int, int]:
        """Propose one membership change as a CONFIG entry: (index, term) of the entry, which
        takes effect at once and is answered, as any proposal, when it is applied.
        MembershipChangeError when it cannot be made now (membership.py's rules)."""
        lead = self._leading()
        if self._configs.latest_index > self._commit:
            raise MembershipChangeError(f"a membership change is still in progress (the configuration at index "
                                        f"{self._configs.latest_index} is not committed yet); try again shortly")
        if not self._committed_in_term():
            raise MembershipChangeError("the leader has not committed an entry of its term yet; try again shortly")
        changed = self.membership.changed(kind, member, address)
        index = self.log.last_index() + 1
        self.log.append([Entry(index, self._term, EntryType.CONFIG, changed.encode())])
        lead.proposed(index, index)
        self._sync_membership()
        return index, self._term

    def transfer_leadership(self, target: str) -> None:
        """Hand leadership to voter `target` (Raft thesis §3.10): take no proposals, bring its log
        up to ours, then tell it to stand at once (TimeoutNowRequest). If it has not won within an
        election timeout, lead on. ValueError for a target that cannot lead."""
        lead = self._leading()
        if target == self.id:
            raise ValueError(f"{target} already leads")
        if not self.membership.is_voter(target):
            raise ValueError(f"{target} is not a voter" + (" (a learner: promote it first)"
                                                           if target in self.membership.learners else ""))
        lead.transfer = Transfer(target, self.now + self.config.election_timeout_ms)
        dispatcher = lead.dispatchers[target]
        dispatcher.eager = True  # a lazy follower's tail would wait up to lazy_push_ms
        self._send(dispatcher.poll(self.now))
        self._maybe_send_timeout_now(lead)

    def _maybe_send_timeout_now(self, lead: Leadership) -> None:
        transfer = lead.transfer
        if transfer is None or transfer.timeout_sent:
            return
        if lead.match_index(transfer.target) >= self.log.last_index():
            transfer.timeout_sent = True
            self._leader_messages.append(TimeoutNowRequest(self.id, transfer.target, self._term))

    def read_index(self, ctx: object) -> None:
        if self._role != Role.LEADER:
            raise NotLeaderError(self._leader, self._term)
        self._reads.add(ctx, self._commit if self._committed_in_term() else None)

    def peer_unreachable(self, peer: str) -> None:
        """The transport lost its connection to `peer`: refused or reset, so the process is gone.
        A follower whose leader that is stands sooner (Election.hasten)."""
        if self._role == Role.FOLLOWER and peer == self._leader:
            self._election.hasten(self._leader_contact)

    def join(self, term: int, floor: tuple[int, int] | None) -> None:
        """A node that started empty learnt what its cluster holds (raft/node/joining.py): it takes
        `term` (above every term its peers reported, so it cannot vote again in a term it voted in
        before losing its data); with a `floor` (the cluster has a log) it rejoins (see
        election.py), else it is a founder and votes from now on."""
        if term > self._term:
            self._term, self._voted_for, self._hard_dirty = term, None, True
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
        return not self._installing and self._apply.has_more(self._commit)

    def step(self, msg: Message) -> None:
        if msg.dst != self.id or msg.src == self.id:
            return
        if isinstance(msg, VoteRequest) and not self._may_stand(msg.src):
            # Only the latest configuration's voters stand: a removed member (or one this node's
            # log does not yet know as a voter) gets no vote and moves no term. (Save one that
            # an uncommitted configuration removes: see _may_stand.)
            if not msg.pre_vote or msg.term > self._term:
                self._messages.append(VoteResponse(self.id, msg.src, self._term, granted=False, pre_vote=msg.pre_vote))
            return
        self._step(msg)
        self._sync_membership()

    def _step(self, msg: Message) -> None:
        if msg.term > self._term:
            if isinstance(msg, VoteRequest):
                if msg.pre_vote:
                    self._on_vote_request(msg)  # a pre-vote changes no one's term
                    return
                if self._in_lease() and not msg.transfer:
                    return  # a disruptive candidate: ignore it without adopting its term
            if isinstance(msg, VoteResponse) and msg.pre_vote and msg.granted:
                self._on_vote_response(msg)  # carries the term we would stand in
                return
            is_leader_msg = isinstance(msg, (HeartbeatRequest, PushRequest, InstallSnapshotRequest, TimeoutNowRequest))
            self._become_follower(msg.term, msg.src if is_leader_msg else None)
        elif msg.term < self._term:
            reply = refusal_of_stale(msg, self.id, self._term, self.log.last_index())
            if reply is not None:
                self._messages.append(reply)
            return
        handler = {
            VoteRequest: self._on_vote_request,
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
            self._soft_state_changed() or self._hard_dirty or self._pending_snapshot
            or self.log.has_unpersisted() or self._messages or self._leader_messages
            or self._entries_to_apply()
            or self._failed_proposals or self._failed_reads or self._snapshot_sends
            or (self._lead is not None and (self._lead.log_grew or self._reads.wants_round()))
            or self._reads.has_ready(self._apply.applied)
        )

    def ready_is_light(self) -> bool:
        """Whether the next Ready only sends messages and serves or fails reads and proposals: no
        role change, nothing to persist, install, apply or stream. A driver may handle such a Ready
        inside the call that made it. (A leader's dispatchers poll inside ready() only after a
        proposal, whose entries are unpersisted, so a light Ready never starts a snapshot stream.)"""
        return not (
            self._soft_state_changed() or self._hard_dirty or self._pending_snapshot
            or self.log.has_unpersisted() or self._entries_to_apply()
            or self._snapshot_sends
        )

    def ready(self) -> Ready:
        if self._outstanding is not None:
            raise RuntimeError("advance() the previous Ready before asking for another")
        if self._lead is not None:
            if self._lead.log_grew:
                self._lead.log_grew = False
                self._send(self._lead.poll_eager())
            if self._reads.wants_round():
                self._send_read_round()
        rd = Ready()
        if self._soft_state_changed():
            rd.soft_state = self._last_soft = SoftState(self._role, self._leader, self._term, self.rejoining)
        if self._hard_dirty:
            rd.hard_state, self._hard_dirty = HardState(self._term, self._voted_for), False
        if self._pending_snapshot is not None:
            rd.snapshot, self._pending_snapshot = self._pending_snapshot, None
        rd.truncate_from, rd.entries = self.log.take_unpersisted()
        rd.leader_messages, self._leader_messages = self._leader_messages, []
        rd.messages, self._messages = self._messages, []
        if self._entries_to_apply():
            first, last = self._apply.take(self._commit, self.config.max_apply_batch)
            rd.committed_entries = self.log.entries(first, last + 1)
        rd.reads = self._reads.take_ready(self._apply.applied)
        rd.failed_reads, self._failed_reads = self._failed_reads, []
        rd.failed_proposals, self._failed_proposals = self._failed_proposals, []
        rd.snapshot_sends, self._snapshot_sends = self._snapshot_sends, []
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
            self._commit = max(self._commit, idx)
            self._apply.installed(idx)
            self._handler.matched_through(idx)
            self._configs.reset(idx, Membership.decode(rd.snapshot.membership) if rd.snapshot.membership else None)
            self._configs.scan(self.log, idx)
        if rd.entries:
            self.log.stable_to(rd.entries[-1].index, rd.entries[-1].term)
        self._election.check_caught_up(self.log, self._leader, self._commit, self._term)
        if self._lead is not None:
            # The leader counts itself toward a quorum only for what is on its own disk.
            self._update_match(self.id, self.log.persisted_index)
        self._sync_membership()

    def _sync_membership(self) -> None:
        """Follow the latest configuration in the log (membership.py), and act on one that
        committed: a leader it removed steps down; a node it removed is done."""
        configs = self._configs
        latest = configs.latest
        if latest is not self.membership:
            self.membership = latest
            self._election.voters = frozenset(latest.voters)
            if self._lead is not None:
                self._send(self._lead.reconfigure(latest))
                self._maybe_commit(self._lead)  # fewer voters may make a majority already
        configs.committed_through(self._commit)
        committed = configs.latest_index <= self._commit
        if committed and self.id in latest.removed and self._removed_at is None:
            self._removed_at = configs.latest_index
        if self._lead is not None and not latest.is_voter(self.id) and committed:
            self._hand_over(self._lead)

    def _hand_over(self, lead: Leadership) -> None:
        """(Leader) A committed configuration took away our vote: step down, first telling the
        most caught-up voter to stand at once, so the cluster need not wait out a timeout."""
        best = max(lead.dispatchers.values(), key=lambda d: (d.peer in self.membership.voters, d.match_index),
                   default=None)
        if best is not None and best.peer in self.membership.voters and best.match_index >= self.log.last_index():
            self._leader_messages.append(TimeoutNowRequest(self.id, best.peer, self._term))
        self._become_follower(self._term, None)

    def _soft_state_changed(self) -> bool:
        # Field by field: has_ready runs several times per write, and building a SoftState to
        # compare cost more than the rest of it.
        last = self._last_soft
        return (last is None or last.role is not self._role or last.leader != self._leader or last.term != self._term
                or last.rejoining != self.rejoining)

    def _send(self, outgoing: list[Outgoing]) -> None:
        for item in outgoing:
            if isinstance(item, SnapshotSend):
                self._snapshot_sends.append(item)
            else:
                self._leader_messages.append(item)

    # ------------------------------------------------------------------ roles

    def _reset_election_timer(self) -> None:
        self._election.reset_timer(self.now)

    def _in_lease(self) -> bool:
        """Has this node heard from a live leader within the election timeout?"""
        if self._role == Role.LEADER:
            return True
        return self._leader is not None and self.now - self._leader_contact < self.config.election_timeout_ms

    def _set_leader(self, leader: str | None) -> None:
        if leader != self._leader:
            self._handler.reset()
        self._leader = leader

    def _become_follower(self, term: int, leader: str | None) -> None:
        old_term = self._term
        if term > self._term:
            self._term, self._voted_for, self._hard_dirty = term, None, True
            self._handler.reset()
        if self._role == Role.LEADER:
            self._drop_leadership(old_term, leader)
        self._role = Role.FOLLOWER
        self._election.votes = {}
        self._set_leader(leader)
        if leader is not None:
            self._leader_contact = self.now
        self._reset_election_timer()

    def _drop_leadership(self, old_term: int, new_leader: str | None) -> None:
        assert self._lead is not None
        dropped = self._lead.dropped(self._commit, old_term, new_leader)
        if dropped is not None:
            self._failed_proposals.append(dropped)
        self._failed_reads.extend(self._reads.fail_unconfirmed(new_leader))
        self._lead = None

    def _may_stand(self, member: str) -> bool:
        """Whether `member` may stand, as far as this node's log says: a voter of the latest
        configuration, or of the one before it while the latest is uncommitted (a voter that an
        uncommitted change removes; its votes are counted in the latest configuration, its own
        not, and voters that hold that change still consider its requests). Otherwise the
        leader of two voters that removed itself and lost its leadership before the change
        reached the other leaves that one unable to win (it needs this node's vote, which this
        node's longer log refuses) while this one would wait for a leader forever; and with
        three, the voters holding the change would refuse the only candidate a rejoining voter
        (raft/core/election.py) may vote for. Granting a vote is safe whoever asks (Raft thesis
        §4.1: servers vote for candidates outside their latest configuration); the refusal only
        keeps members removed for good from disturbing the cluster."""
        if self.membership.is_voter(member):
            return True
        configs = self._configs
        return configs.latest_index > self._commit and configs.at(configs.latest_index - 1).is_voter(member)

    def _voter_peers(self) -> list[str]:
        return [p for p in self.membership.voters if p != self.id]

    def _start_pre_vote(self) -> None:
        self._role = Role.PRE_CANDIDATE
        self._set_leader(None)
        self._reset_election_timer()
        if self._election.stand(self.id):
            self._start_election()
            return
        for p in self._voter_peers():
            self._messages.append(VoteRequest(self.id, p, self._term + 1, self.log.last_index(),
                                              self.log.last_term(), pre_vote=True))

    def _start_election(self, transfer: bool = False) -> None:
        self._term += 1
        self._voted_for, self._hard_dirty = self.id, True
        self._role = Role.CANDIDATE
        self._set_leader(None)
        self._reset_election_timer()
        if self._election.stand(self.id):
            self._become_leader()
            return
        for p in self._voter_peers():
            # Sent only after the Ready carrying our vote for ourselves is on disk.
            self._messages.append(VoteRequest(self.id, p, self._term, self.log.last_index(), self.log.last_term(),
                                              transfer=transfer))

    def _become_leader(self) -> None:
        self._role = Role.LEADER
        self._set_leader(self.id)
        self._election.votes = {}
        # A no-op of our term: entries of older terms commit only under one of ours (Raft §5.4.2).
        # While the log names no configuration (a new cluster's first leader), the configuration
        # it starts with takes the no-op's place, so that every log names its members.
        index = self.log.last_index() + 1
        if self._configs.logged:
            self.log.append([Entry(index, self._term, EntryType.NOOP)])
        else:
            self.log.append([Entry(index, self._term, EntryType.CONFIG, self.membership.encode())])
        self._lead = Leadership(self)
        self._send(self._lead.start())
        self._broadcast_heartbeat()
        self._update_match(self.id, self.log.persisted_index)
        self._sync_membership()

    # ------------------------------------------------------------------ election messages

    def _on_vote_request(self, msg: VoteRequest) -> None:
        up_to_date = self._election.deserves_vote(self.log, msg.last_log_index, msg.last_log_term)
        if msg.pre_vote:
            grant = msg.term > self._term and up_to_date and not self._in_lease()
            self._messages.append(VoteResponse(self.id, msg.src, msg.term if grant else self._term,
                                               granted=grant, pre_vote=True))
            return
        grant = self._role == Role.FOLLOWER and self._voted_for in (None, msg.src) and up_to_date
        if grant:
            self._voted_for, self._hard_dirty = msg.src, True
            self._reset_election_timer()
        # The answer leaves only after the vote it records is on disk (Ready.messages).
        self._messages.append(VoteResponse(self.id, msg.src, self._term, granted=grant))

    def _on_vote_response(self, msg: VoteResponse) -> None:
        if msg.pre_vote:
            if self._role != Role.PRE_CANDIDATE or (msg.granted and msg.term != self._term + 1):
                return
            if self._election.record(msg.src, msg.granted):
                self._start_election()
            return
        if self._role != Role.CANDIDATE or msg.term != self._term:
            return
        if self._election.record(msg.src, msg.granted):
            self._become_leader()

    # ------------------------------------------------------------------ follower side

    def _accept_leader(self, leader: str) -> bool:
        """A leader's message of our term: follow it. False if we lead this term ourselves
        (impossible while election safety holds; ignored rather than obeyed)."""
        if self._role == Role.LEADER:
            return False
        if self._role != Role.FOLLOWER or self._leader != leader:
            self._become_follower(self._term, leader)
        self._leader_contact = self.now
        self._reset_election_timer()
        return True

    def _learn_commit(self, leader_commit: int) -> None:
        self._commit = max(self._commit, self._handler.commit_bound(leader_commit))

    def _on_heartbeat(self, msg: HeartbeatRequest) -> None:
        if not self._accept_leader(msg.src) or self._installing:
            return
        # The leader sends min(its commit, our match index): our log matches its log that far.
        self._handler.matched_through(min(msg.commit_index, self.log.last_index()))
        self._learn_commit(msg.commit_index)
        self._messages.append(HeartbeatResponse(self.id, msg.src, self._term, success=True, seq=msg.seq,
                                                end_index=self.log.last_index()))

    def _on_push(self, msg: PushRequest) -> None:
        if not self._accept_leader(msg.src) or self._installing:
            return
        self._messages.extend(self._handler.handle(msg, self.now, self._commit))
        self._learn_commit(msg.commit_index)

    def _on_timeout_now(self, msg: TimeoutNowRequest) -> None:
        """Our leader hands us leadership: stand now, with no pre-vote (its log is ours)."""
        if not self._accept_leader(msg.src) or self.rejoining or not self.membership.is_voter(self.id):
            return
        self._start_election(transfer=True)

    def _on_install_snapshot(self, msg: InstallSnapshotRequest) -> None:
        if not self._accept_leader(msg.src) or self._installing:
            return
        meta = msg.meta
        if meta.index > self._commit:
            self._installing = True
            self.log.discard_unpersisted()
            self._handler.reset()
            self._pending_snapshot = meta
        # else: we already hold everything it contains (committed entries match every leader's).
        self._messages.append(InstallSnapshotResponse(self.id, msg.src, self._term, success=True,
                                                      index=meta.index, end_index=max(meta.index, self.log.last_index())))

    # ------------------------------------------------------------------ leader side

    def _tick_leader(self, lead: Leadership) -> None:
        if lead.transfer is not None and self.now >= lead.transfer.deadline:
            lead.transfer = None  # the target did not win in time: lead on, and take proposals again
        if self.now >= lead.next_heartbeat:
            self._broadcast_heartbeat()
        if not lead.contact.quorum_active(self.now, self.config.election_timeout_ms):
            self._become_follower(self._term, None)  # check-quorum: we may be cut off
            return
        self._send(lead.tick())

    def _broadcast_heartbeat(self) -> None:
        """The periodic heartbeat, to every follower; it also serves waiting reads."""
        assert self._lead is not None
        self._lead.next_heartbeat = self.now + self.config.heartbeat_interval_ms
        self._heartbeat_round(self._lead, list(self._lead.dispatchers))

    def _send_read_round(self) -> None:
        """A heartbeat round for waiting reads, to no more followers than a majority needs: each
        heartbeat is a message to write and an answer to read on the leader, its busiest costs
        under reads (docs/performance.md); in a three-node cluster this halves them. If a chosen
        follower does not answer, the next periodic heartbeat (to every follower) confirms the
        round instead."""
        assert self._lead is not None
        self._heartbeat_round(self._lead, self._lead.contact.read_round_peers())

    def _heartbeat_round(self, lead: Leadership, peers: Sequence[str]) -> None:
        seq, heartbeats = lead.heartbeats(peers, self._commit)
        self._reads.round_sent(seq)
        self._leader_messages.extend(heartbeats)
        self._check_read_rounds(lead)

    def _check_read_rounds(self, lead: Leadership) -> None:
        confirmed = lead.contact.confirmed_round()
        if confirmed > 0:
            self._reads.round_confirmed(confirmed)

    def _on_heartbeat_response(self, msg: HeartbeatResponse) -> None:
        if self._lead is None or not msg.success:
            return
        newer, out = self._lead.on_heartbeat_response(msg)
        if newer:
            self._check_read_rounds(self._lead)
        self._send(out)

    def _on_push_response(self, msg: PushResponse) -> None:
        if self._lead is None:
            return
        self._send(self._lead.on_push_response(msg))
        self._update_match(msg.src, self._lead.match_index(msg.src))
        if self._lead is not None:
            self._maybe_send_timeout_now(self._lead)

    def _on_snapshot_response(self, msg: InstallSnapshotResponse) -> None:
        if self._lead is None:
            return
        self._send(self._lead.on_snapshot_response(msg))
        self._update_match(msg.src, self._lead.match_index(msg.src))

    def _update_match(self, member: str, index: int) -> None:
        if self._lead is not None and self._lead.quorum.update(member, index):
            self._maybe_commit(self._lead)

    def _maybe_commit(self, lead: Leadership) -> None:
        """Commit the highest index a majority holds — only if that entry is of our term: an
        older-term entry is never committed by counting replicas (Raft §5.4.2, Figure 8)."""
        n = lead.quorum.quorum_index()
        if n <= self._commit or self.log.term(n) != self._term:
            return
        first_in_term = not self._committed_in_term()
        self._commit = n
        if first_in_term:
            self._reads.committed_in_term(n)
        # Entries waiting to go carry the new commit index now; a COMMIT push on its own waits for
        # the next tick (see the Dispatcher).
        self._send(lead.poll_eager())
