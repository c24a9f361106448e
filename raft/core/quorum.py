"""QuorumTracker: how far each member's log is known to match the leader's, and what a majority holds."""
from __future__ import annotations

from typing import Iterable


def majority(n: int) -> int:
    return n // 2 + 1


class QuorumTracker:
    def __init__(self, members: Iterable[str]) -> None:
        self.match: dict[str, int] = {m: 0 for m in members}

    def update(self, member: str, index: int) -> bool:
        """Raise member's match index; matches only move forward within a term."""
        if index > self.match[member]:
            self.match[member] = index
            return True
        return False

    def regress(self, member: str, index: int) -> None:
        """Lower member's match index: it lost entries it had acknowledged."""
        self.match[member] = min(self.match[member], index)

    def quorum_index(self) -> int:
        """The highest index held by a majority of members."""
        ordered = sorted(self.match.values(), reverse=True)
        return ordered[majority(len(ordered)) - 1]
