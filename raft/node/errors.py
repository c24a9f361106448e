"""Why the node refused a request. raft must not import kv, so the client service maps these onto
kv.errors; "not leader" is raft.core's NotLeaderError (leader id and term), re-exported here."""
from __future__ import annotations

from raft.core.errors import NotLeaderError

__all__ = ["DiskFullError", "NodeError", "NodeStoppedError", "NotLeaderError", "QueueFullError"]


class NodeError(Exception):
    """Base class of the driver's own refusals."""


class QueueFullError(NodeError):
    """More client requests are waiting on this node than Limits.max_pending_requests (raft/node/config.py)."""


class DiskFullError(NodeError):
    """The log (or state) store is full: writes are refused, reads keep working."""


class NodeStoppedError(NodeError):
    """The node is shutting down (or stopped on a fatal error); nothing more is accepted."""
