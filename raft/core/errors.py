"""Errors the core raises to its driver."""
from __future__ import annotations


class NotLeaderError(Exception):
    """This node cannot take the request: it is not the leader. Retryable elsewhere."""

    def __init__(self, leader: str | None, term: int) -> None:
        self.leader = leader
        self.term = term
        super().__init__(f"not leader (term {term}); leader is {leader or 'unknown'}")
