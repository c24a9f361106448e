"""etcd's stubs as raftkv's clients use them: every call asks a follower for a "not leader" answer
naming the leader (kv.errors.LEADER_HINTS_KEY) instead of being forwarded, so a client that makes
only etcd-API calls (txn, get at a revision, leases) learns the leader as its native calls do and
pays no extra hop after the first."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kv.errors import LEADER_HINTS_KEY

_HINTS = (LEADER_HINTS_KEY, "1")


class LeaderHinted:
    """Wraps a generated stub (sync or grpc.aio): its methods take the same arguments."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)

        def call(*request: Any, metadata: Any = None, **kwargs: Any) -> Any:  # a stream call of grpc.aio takes none
            return method(*request, metadata=(*(metadata or ()), _HINTS), **kwargs)
        return call
