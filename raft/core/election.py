"""Election: what a node keeps to stand and to vote, apart from the term and the vote it cast
(the core's hard state): its election timer, the votes of the round it stands in (a pre-vote
round, then the real one), and the rejoin floor of a node that lost its log.

The core (raft.py) decides the role changes; it asks here when to stand, whether a candidate's log
deserves a vote, and whether a round is won."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from raft.core.config import CoreConfig
from raft.core.quorum import majority
from raft.core.raft_log import RaftLog


@dataclass(slots=True)
class Election:
    """`rejoin_floor`: this node lost its log and comes back empty (its hard state's term set
    above any it can have voted in), and this is the most up-to-date log position (last term, last
    index) its peers reported (raft/node/joining.py). Until it has caught up it never stands, and
    votes only for a candidate whose log is at least that up to date: an empty log would vote for
    a candidate that lacks entries the lost copy held, and a majority could then elect a leader
    without them; a candidate as up to date as the best of a set of peers that meets every
    majority holds everything committed. Caught up means: its disk holds the log up to a commit
    index its leader told it whose entry is of the leader's own term. Such an entry commits only
    after everything committed in earlier terms, so the node then holds all its lost copy had."""

    config: CoreConfig
    rng: random.Random
    voters: frozenset[str]  # whose votes count (the latest configuration's voters)
    rejoin_floor: tuple[int, int] | None = None
    deadline: int = 0
    # The votes of the round this node stands in: voter -> granted (itself included).
    votes: dict[str, bool] = field(default_factory=dict)
    # The last leader contact whose silence hasten() has already acted on.
    _hastened_for: int | None = None

    @property
    def rejoining(self) -> bool:
        return self.rejoin_floor is not None

    def reset_timer(self, now: int) -> None:
        t = self.config.election_timeout_ms
        self.deadline = now + self.rng.randrange(t, 2 * t)

    def hasten(self, leader_contact: int) -> None:
        """The leader's process is gone (its connection was refused or reset), not merely slow:
        stand as soon as a pre-vote can succeed, when no follower can have heard from the leader
        for T, plus up to T/4 of jitter so two followers seldom stand together (two at once split
        the vote and wait another [T, 2T)). Only the timer moves, so a wrong report costs nothing:
        the leader's next message resets it.

        The transport reports again on every failed reconnect (every 50 ms). Only the first
        report of a silence draws the jitter: keeping the earliest of twenty draws left both
        followers standing within a few ms of T, and one election in four split."""
        if self._hastened_for == leader_contact:
            return
        self._hastened_for = leader_contact
        t = self.config.election_timeout_ms
        self.deadline = min(self.deadline, leader_contact + t + self.rng.randrange(max(1, t // 4)))

    def stand(self, me: str) -> bool:
        """Start a round with our own vote; True when that alone wins it (a single member)."""
        self.votes = {me: True}
        return self.won()

    def record(self, voter: str, granted: bool) -> bool:
        """A voter's answer in the current round; True once the round is won."""
        self.votes[voter] = granted
        return self.won()

    def won(self) -> bool:
        granted = sum(1 for voter, yes in self.votes.items() if yes and voter in self.voters)
        return granted >= majority(len(self.voters))

    def deserves_vote(self, log: RaftLog, last_log_index: int, last_log_term: int) -> bool:
        """Is a candidate's log at least as up to date as ours (Raft §5.4.1), and, while we
        rejoin, as our rejoin floor?"""
        up_to_date = log.is_up_to_date(last_log_index, last_log_term)
        if self.rejoin_floor is not None:
            up_to_date = up_to_date and (last_log_term, last_log_index) >= self.rejoin_floor
        return up_to_date

    def refloor(self, floor: tuple[int, int] | None) -> None:
        """(Rejoining) The rejoin floor asked again (raft/node/joining.py): None when no log
        holds anything any more."""
        if self.rejoin_floor is not None:
            self.rejoin_floor = floor

    def check_caught_up(self, log: RaftLog, leader: str | None, commit: int, term: int) -> None:
        """(Rejoining) A voter again once its disk holds the log through a commit index of the
        current term."""
        if (self.rejoin_floor is not None and leader is not None and 0 < commit <= log.persisted_index
                and log.term(commit) == term):
            self.rejoin_floor = None
