"""Membership: which members a cluster has (voters, and learners that count in no quorum), and
how it changes through the log (decision 0064).

A configuration is a whole `Membership` carried by a CONFIG entry, as hashicorp/raft's
configuration entries are: every member with the peer address it was added with (the driver dials
it there unless its own --peers names another address). A node uses the latest configuration in
its log, committed or not, from the moment the entry is appended (Raft thesis §4.1); when a
truncation removes that entry, the one before it is in force again. `MembershipLog` keeps that
sequence for the entries the log holds past the state machine's base.

Changes are single-server (one voter added, removed or promoted per entry), so any majority of
the old voters and any majority of the new overlap. An update changes only one member's peer
address (etcd's MemberUpdate): the voters, and so every majority, stay as they were. A leader accepts one only when its latest
configuration is committed and it has committed an entry of its own term (the fix for the bug
Ongaro reported in 2015: a leader of a new term could otherwise add a change on top of an
uncommitted one of a deposed leader's, and two disjoint majorities could exist)."""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from raft.core.quorum import majority
from raft.core.types import Entry, EntryType

# How much of the log one read takes while scanning it for CONFIG entries.
_SCAN_BYTES = 4 << 20


class EntryReader(Protocol):
    def last_index(self) -> int: ...
    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> Sequence[Entry]: ...


class ChangeKind(enum.Enum):
    ADD_VOTER = "add-voter"
    ADD_LEARNER = "add-learner"
    PROMOTE = "promote"
    REMOVE = "remove"
    UPDATE = "update"  # the member's peer address, nothing else


class MembershipChangeError(ValueError):
    """A membership change refused: its message says why, for the operator."""


@dataclass(frozen=True, slots=True)
class Membership:
    """member id -> peer address, for voters and for learners (disjoint); the ids removed so far,
    which are never members again (a member replaying the log would see its own removal); and the
    members whose address an update set (`moved`): every member dials those at the configuration's
    address, whatever its own --peers says of them."""

    voters: Mapping[str, str] = field(default_factory=dict)
    learners: Mapping[str, str] = field(default_factory=dict)
    removed: frozenset[str] = frozenset()
    moved: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        both = set(self.voters) & set(self.learners)
        if both:
            raise ValueError(f"{sorted(both)} both voter and learner")

    @staticmethod
    def of_voters(members: Mapping[str, str]) -> "Membership":
        return Membership(dict(members), {})

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(sorted({*self.voters, *self.learners}))

    def __contains__(self, member: object) -> bool:
        return member in self.voters or member in self.learners

    def is_voter(self, member: str) -> bool:
        return member in self.voters

    def address(self, member: str) -> str | None:
        return self.voters.get(member, self.learners.get(member))

    def quorum(self) -> int:
        return majority(len(self.voters))

    def encode(self) -> bytes:
        spec = {"voters": dict(sorted(self.voters.items())), "learners": dict(sorted(self.learners.items())),
                "removed": sorted(self.removed)}
        if self.moved:  # (absent otherwise: a configuration no update touched is encoded as before)
            spec["moved"] = sorted(self.moved)
        return json.dumps(spec, separators=(",", ":")).encode()

    @staticmethod
    def decode(data: bytes) -> "Membership":
        spec = json.loads(data)
        return Membership(dict(spec["voters"]), dict(spec["learners"]), frozenset(spec["removed"]),
                          frozenset(spec.get("moved", ())))

    def changed(self, kind: ChangeKind, member: str, address: str = "") -> "Membership":
        """The configuration after one change; MembershipChangeError when it cannot be made."""
        voters, learners = dict(self.voters), dict(self.learners)
        if kind in (ChangeKind.ADD_VOTER, ChangeKind.ADD_LEARNER):
            if member in self:
                raise MembershipChangeError(f"{member} is already a member")
            if member in self.removed:
                raise MembershipChangeError(f"{member} was removed from this cluster, and an id is never used again: "
                                            f"add the machine under a new id, with an empty data directory")
            if not member:
                raise MembershipChangeError("a member needs an id")
            (voters if kind is ChangeKind.ADD_VOTER else learners)[member] = address
        elif kind is ChangeKind.PROMOTE:
            if member in voters:
                raise MembershipChangeError(f"{member} is already a voter")
            if member not in learners:
                raise MembershipChangeError(f"{member} is not a member")
            voters[member] = learners.pop(member)
        elif kind is ChangeKind.REMOVE:
            if member not in self:
                raise MembershipChangeError(f"{member} is not a member")
            if member in voters and len(voters) == 1:
                raise MembershipChangeError(f"{member} is the only voter: removing it would leave no one to decide")
            voters.pop(member, None)
            learners.pop(member, None)
            return Membership(voters, learners, self.removed | {member}, self.moved - {member})
        elif kind is ChangeKind.UPDATE:
            if member not in self:
                raise MembershipChangeError(f"{member} is not a member")
            if not address:
                raise MembershipChangeError(f"a peer address for {member} is needed")
            taken = next((m for m in self.members if m != member and self.address(m) == address), None)
            if taken is not None:
                raise MembershipChangeError(f"{address} is the peer address of {taken}")
            (voters if member in voters else learners)[member] = address
            return Membership(voters, learners, self.removed, self.moved | {member})
        return Membership(voters, learners, self.removed, self.moved)


class MembershipLog:
    """The configurations in force along the log: `base` as of `base_index` (what the state
    machine or a snapshot holds), then one per CONFIG entry the log holds after it.

    `logged`: the base came from a CONFIG entry (applied, or in a snapshot), not from the
    bootstrap configuration. `known`: there is a base at all (False on a node joining a cluster
    before its leader has sent it anything)."""

    def __init__(self, base_index: int, base: Membership, logged: bool = True, known: bool = True) -> None:
        self._base_index = base_index
        self._base = base
        self._base_logged = logged
        self._known = known
        self._entries: list[tuple[int, Membership]] = []  # ascending index, all > base_index

    @property
    def logged(self) -> bool:
        """Whether the configuration in force came from the log (a leader writes one otherwise)."""
        return self._base_logged or bool(self._entries)

    @property
    def known(self) -> bool:
        return self._known or bool(self._entries)

    def scan(self, log: "EntryReader", after: int) -> None:
        """Take the configurations of the CONFIG entries the log holds after `after` (at start,
        and after a snapshot install keeps a tail), reading in bounded slices."""
        index, last = after + 1, log.last_index()
        while index <= last:
            entries = log.entries(index, last + 1, _SCAN_BYTES)
            for e in entries:
                if e.type is EntryType.CONFIG:
                    self.appended(e.index, Membership.decode(e.payload))
            index = entries[-1].index + 1

    @property
    def latest(self) -> Membership:
        return self._entries[-1][1] if self._entries else self._base

    @property
    def latest_index(self) -> int:
        """Index of the entry that made the latest configuration (the base's index without one)."""
        return self._entries[-1][0] if self._entries else self._base_index

    def appended(self, index: int, membership: Membership) -> None:
        if index <= self.latest_index:
            raise AssertionError(f"configuration at {index} appended after one at {self.latest_index}")
        self._entries.append((index, membership))

    def truncated_from(self, index: int) -> None:
        """Entries >= index left the log: the configurations they made are no longer in force."""
        while self._entries and self._entries[-1][0] >= index:
            self._entries.pop()

    def at(self, index: int) -> Membership:
        """The configuration in force once the log ends at `index` (index >= base_index)."""
        found = self._base
        for at, membership in self._entries:
            if at > index:
                break
            found = membership
        return found

    def committed_through(self, index: int) -> None:
        """Entries up to `index` are committed: the configurations they made never change again,
        so the newest of them becomes the base (the others are forgotten)."""
        while self._entries and self._entries[0][0] <= index:
            self._base_index, self._base = self._entries.pop(0)
            self._base_logged = self._known = True

    def reset(self, index: int, membership: Membership | None) -> None:
        """A snapshot at `index` was installed: its configuration is the base (None: it names
        none, and the base stays); the caller scans the entries the log kept after it."""
        self._entries = []
        self._base_index = index
        if membership is not None:
            self._base = membership
            self._base_logged = self._known = True
