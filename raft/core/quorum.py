"""QuorumTracker: how far each member's log is known to match the leader's, and what a majority
of the voters holds (learners are tracked, and count in no majority)."""
from __future__ import annotations

from typing import Iterable


def majority(n: int) -> int:
    return n // 2 + 1


class QuorumTracker:
    def __init__(self, members: Iterable[str], voters: Iterable[str] | None = None) -> None:
        self.match: dict[str, int] = {m: 0 for m in members}
        self.voters = frozenset(self.match if voters is None else voters)

    def reconfigure(self, members: Iterable[str], voters: Iterable[str]) -> None:
        """A new configuration: members keep what is known of them; new ones start at 0."""
        self.match = {m: self.match.get(m, 0) for m in members}
        self.voters = frozenset(voters)

    def update(self, member: str, index: int) -> bool:
        """Raise member's match index; matches only move forward within a term. True when that
        changed what a majority may hold (a voter's rose)."""
        if index > self.match.get(member, index):
            self.match[member] = index
            return member in self.voters
        return False

    def regress(self, member: str, index: int) -> None:
        """Lower member's match index: it lost entries it had acknowledged."""
        if member in self.match:
            self.match[member] = min(self.match[member], index)

    def quorum_index(self) -> int:
        """The highest index held by a majority of the voters."""
        ordered = sorted((self.match.get(v, 0) for v in self.voters), reverse=True)
        return ordered[majority(len(ordered)) - 1] if ordered else 0
