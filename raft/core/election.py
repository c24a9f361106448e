"""Election: how a node stands and votes. It keeps, apart from the term and the vote it cast (the
hard state, in the NodeState it shares with the core): its election timer, the votes of the round
it stands in (a pre-vote round, then the real one), and the rejoin floor of a node that lost its
log. It takes the election's inputs: the timer, a vote request, a vote's answer, a leader that is
gone.

The core (raft.py) routes those here and makes the role changes that follow: it leads when a round
is won, and follows a leader it hears from or a higher term it learns of."""
from __future__ import annotations

import random

from raft.core.membership import Membership, MembershipLog
from raft.core.messages import VoteRequest, VoteResponse
from raft.core.node_state import NEVER, NodeState
from raft.core.outbox import Outbox
from raft.core.types import Role


class Election:
    """`rejoin_floor`: this node lost its log and comes back empty (its hard state's term set
    above any it can have voted in), and this is the most up-to-date log position (last term, last
    index) its peers reported (raft/node/joining.py). Until it has caught up (check_caught_up) it
    never stands, and votes only for a candidate whose log is at least that up to date: an empty log would vote for
    a candidate that lacks entries the lost copy held, and a majority could then elect a leader
    without them; a candidate as up to date as the best of a set of peers that meets every
    majority holds everything committed. Caught up means: its disk holds the log up to a commit
    index its leader told it whose entry is of the leader's own term. Such an entry commits only
    after everything committed in earlier terms, so the node then holds all its lost copy had."""

    def __init__(self, state: NodeState, configs: MembershipLog, out: Outbox, rng: random.Random,
                 rejoin_floor: tuple[int, int] | None) -> None:
        self._state = state
        self._configs = configs
        self._out = out
        self._rng = rng
        # The latest configuration (the core keeps it current): whose votes count, who may stand.
        self.membership: Membership = configs.latest
        self.rejoin_floor = rejoin_floor
        self.deadline = 0
        # The votes of the round this node stands in: voter -> granted (itself included).
        self.votes: dict[str, bool] = {}
        # The last leader contact whose silence peer_unreachable() has already acted on.
        self._hastened_for: int | None = None

    @property
    def rejoining(self) -> bool:
        return self.rejoin_floor is not None

    def reset_timer(self) -> None:
        t = self._state.config.election_timeout_ms
        self.deadline = self._state.now + self._rng.randrange(t, 2 * t)

    def discount(self, held: int) -> None:
        """This node stalled `held` ms beyond a heartbeat interval (stall.py): its timer and its
        leader's last contact move on by as much."""
        self.deadline += held
        if self._state.leader_contact != NEVER:
            self._state.leader_contact += held

    def peer_unreachable(self, peer: str) -> None:
        """The transport lost its connection to `peer`: refused or reset, so the process is gone,
        not merely slow. If it is the leader this node follows, stand as soon as a pre-vote can
        succeed, when no follower can have heard from the leader for T, plus up to T/4 of jitter
        so two followers seldom stand together (two at once split the vote and wait another
        [T, 2T)). Only the timer moves, so a wrong report costs nothing: the leader's next message
        resets it.

        The transport reports again on every failed reconnect (every 50 ms). Only the first
        report of a silence draws the jitter: keeping the earliest of twenty draws left both
        followers standing within a few ms of T, and one election in four split."""
        s = self._state
        if s.role != Role.FOLLOWER or peer != s.leader or self._hastened_for == s.leader_contact:
            return
        self._hastened_for = s.leader_contact
        t = s.config.election_timeout_ms
        self.deadline = min(self.deadline, s.leader_contact + t + self._rng.randrange(max(1, t // 4)))

    # ------------------------------------------------------------------ standing

    def may_stand(self, member: str) -> bool:
        """Whether `member` may stand, as far as this node's log says: a voter of the latest
        configuration, or of the one before it while the latest is uncommitted (a voter that an
        uncommitted change removes; its votes are counted in the latest configuration, its own
        not, and voters that hold that change still consider its requests). Otherwise the
        leader of two voters that removed itself and lost its leadership before the change
        reached the other leaves that one unable to win (it needs this node's vote, which this
        node's longer log refuses) while this one would wait for a leader forever; and with
        three, the voters holding the change would refuse the only candidate a rejoining voter
        may vote for. Granting a vote is safe whoever asks (Raft thesis §4.1: servers vote for
        candidates outside their latest configuration); the refusal only keeps members removed
        for good from disturbing the cluster."""
        if self.membership.is_voter(member):
            return True
        configs = self._configs
        return (configs.latest_index > self._state.commit_index
                and configs.at(configs.latest_index - 1).is_voter(member))

    def timer_fired(self) -> bool:
        """(Not leading, at a tick) Whether to stand now: the timer fired and this node may stand.
        One that may not (yet: it rejoins, or is no voter) waits for a leader."""
        if self._state.now < self.deadline:
            return False
        if self.rejoining or not self.may_stand(self._state.id):
            self.reset_timer()
            return False
        return True

    def start_pre_vote(self) -> bool:
        """Stand as a pre-candidate: ask the voters whether they would vote for us in the next
        term, which nobody adopts yet. True when this node alone won leadership (a single voter)."""
        s = self._state
        s.role = Role.PRE_CANDIDATE
        self.reset_timer()
        if self._stand():
            return self.start_election()
        self._request_votes(s.term + 1, pre_vote=True)
        return False

    def start_election(self, transfer: bool = False) -> bool:
        """Stand as a candidate in the next term, with our own vote. `transfer`: our leader handed
        us leadership (TimeoutNowRequest). True when this node alone won (a single voter)."""
        s = self._state
        s.term += 1
        s.vote(s.id)
        s.role = Role.CANDIDATE
        self.reset_timer()
        if self._stand():
            return True
        # Sent only after the Ready carrying our vote for ourselves is on disk.
        self._request_votes(s.term, transfer=transfer)
        return False

    def _stand(self) -> bool:
        """Start a round with our own vote; True when that alone wins it."""
        self.votes = {self._state.id: True}
        return self._won()

    def _request_votes(self, term: int, pre_vote: bool = False, transfer: bool = False) -> None:
        s = self._state
        for p in self.membership.voters:
            if p != s.id:
                self._out.messages.append(VoteRequest(s.id, p, term, s.log.last_index(), s.log.last_term(),
                                                      pre_vote=pre_vote, transfer=transfer))

    def _won(self) -> bool:
        granted = sum(1 for voter, yes in self.votes.items() if yes and self.membership.is_voter(voter))
        return granted >= self.membership.quorum()

    def on_vote_response(self, msg: VoteResponse) -> bool:
        """A voter's answer in the round we stand in (a granted pre-vote carries the term we would
        stand in). True when it wins us leadership."""
        s = self._state
        if msg.pre_vote:
            if s.role != Role.PRE_CANDIDATE or (msg.granted and msg.term != s.term + 1):
                return False
            self.votes[msg.src] = msg.granted
            return self._won() and self.start_election()
        if s.role != Role.CANDIDATE or msg.term != s.term:
            return False
        self.votes[msg.src] = msg.granted
        return self._won()

    # ------------------------------------------------------------------ voting

    def in_lease(self) -> bool:
        """Has this node heard from a live leader within the election timeout?"""
        s = self._state
        if s.role == Role.LEADER:
            return True
        return s.leader is not None and s.now - s.leader_contact < s.config.election_timeout_ms

    def refused_stranger(self, msg: VoteRequest) -> bool:
        """Only the latest configuration's voters stand: a removed member (or one this node's log
        does not yet know as a voter) gets no vote and moves no term. (Save one that an
        uncommitted configuration removes: see may_stand.) True when `msg` was refused so."""
        if self.may_stand(msg.src):
            return False
        s = self._state
        if not msg.pre_vote or msg.term > s.term:
            self._out.messages.append(VoteResponse(s.id, msg.src, s.term, granted=False, pre_vote=msg.pre_vote))
        return True

    def on_vote_request(self, msg: VoteRequest) -> None:
        s = self._state
        up_to_date = self.deserves_vote(msg.last_log_index, msg.last_log_term)
        if msg.pre_vote:
            grant = msg.term > s.term and up_to_date and not self.in_lease()
            self._out.messages.append(VoteResponse(s.id, msg.src, msg.term if grant else s.term,
                                                   granted=grant, pre_vote=True))
            return
        grant = s.role == Role.FOLLOWER and s.voted_for in (None, msg.src) and up_to_date
        if grant:
            s.vote(msg.src)
            self.reset_timer()
        # The answer leaves only after the vote it records is on disk (Ready.messages).
        self._out.messages.append(VoteResponse(s.id, msg.src, s.term, granted=grant))

    def deserves_vote(self, last_log_index: int, last_log_term: int) -> bool:
        """Is a candidate's log at least as up to date as ours (Raft §5.4.1), and, while we
        rejoin, as our rejoin floor?"""
        up_to_date = self._state.log.is_up_to_date(last_log_index, last_log_term)
        if self.rejoin_floor is not None:
            up_to_date = up_to_date and (last_log_term, last_log_index) >= self.rejoin_floor
        return up_to_date

    # ------------------------------------------------------------------ rejoining

    def refloor(self, floor: tuple[int, int] | None) -> None:
        """(Rejoining) The rejoin floor asked again (raft/node/joining.py): None when no log
        holds anything any more."""
        if self.rejoin_floor is not None:
            self.rejoin_floor = floor

    def check_caught_up(self) -> None:
        """(Rejoining) A voter again once its disk holds the log through a commit index of the
        current term, or a log at least as up to date as its rejoin floor. The floor is the most
        up-to-date log of a set of peers that meets every majority, so it holds everything
        committed when it was asked, the entries the lost copy helped commit included; a log at
        least as up to date holds all of that too (the argument of Raft's election restriction).
        Without the second way, two members that lost their disks one after the other could leave
        the only log that holds the newest committed entries on a member still rejoining, which
        never stands: no leader, ever (simulator seed 1166)."""
        s = self._state
        floor = self.rejoin_floor
        if floor is None:
            return
        persisted = s.log.persisted_index
        if ((s.leader is not None and 0 < s.commit_index <= persisted and s.log.term(s.commit_index) == s.term)
                or (persisted > 0 and (s.log.term(persisted), persisted) >= floor)):
            self.rejoin_floor = None
