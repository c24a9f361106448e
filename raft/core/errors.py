"""Errors the core raises to its driver."""
from __future__ import annotations


class NotLeaderError(Exception):
    """This node cannot take the request: it is not the leader. Retryable elsewhere."""

    def __init__(self, leader: str | None, term: int) -> None:
        self.leader = leader
        self.term = term
        super().__init__(f"not leader (term {term}); leader is {leader or 'unknown'}")


class TransferringError(NotLeaderError):
    """The leader is handing leadership to `leader` (RaftCore.transfer_leadership) and takes no
    proposals meanwhile: retry there, where it will lead within about a round trip, or here if
    the transfer fails."""

    def __init__(self, target: str, term: int) -> None:
        super().__init__(target, term)
        Exception.__init__(self, f"leadership is moving to {target} (term {term})")
