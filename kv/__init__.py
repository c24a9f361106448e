"""raftkv's user-facing package: the client (`from kv import Client`), its typed errors, the CLI."""
from kv.client import Client
from kv.errors import (
    DiskFullError,
    InvalidArgumentError,
    NotLeaderError,
    QueueFullError,
    RaftKVError,
    TimeoutError,
    UnavailableError,
    WrongClusterError,
)

__all__ = [
    "Client",
    "DiskFullError",
    "InvalidArgumentError",
    "NotLeaderError",
    "QueueFullError",
    "RaftKVError",
    "TimeoutError",
    "UnavailableError",
    "WrongClusterError",
]
