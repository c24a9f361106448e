"""raftkv's user-facing package: the client (`from kv import Client, TLS`), its typed errors, the CLI.

The names below are imported on first use (PEP 562), so that `import kv.tools.cli` does not import
grpc before the CLI has chosen gRPC's I/O manager (kv/tools/grpc_io.py)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kv.client.client import Client
    from kv.client.revisions import KeyValue, TxnResult
    from kv.client.tls import TLS
    from kv.errors import (
        CorruptClusterError,
        DiskFullError,
        FailedPreconditionError,
        InvalidArgumentError,
        NotFoundError,
        NotLeaderError,
        PermissionDeniedError,
        QueueFullError,
        RaftKVError,
        RevisionError,
        TimeoutError,
        UnauthenticatedError,
        UnavailableError,
        WrongClusterError,
    )

_HOMES = {
    "Client": "kv.client.client",
    "TLS": "kv.client.tls",
    "CorruptClusterError": "kv.errors",
    "DiskFullError": "kv.errors",
    "FailedPreconditionError": "kv.errors",
    "PermissionDeniedError": "kv.errors",
    "UnauthenticatedError": "kv.errors",
    "InvalidArgumentError": "kv.errors",
    "NotFoundError": "kv.errors",
    "NotLeaderError": "kv.errors",
    "QueueFullError": "kv.errors",
    "RaftKVError": "kv.errors",
    "RevisionError": "kv.errors",
    "KeyValue": "kv.client.revisions",
    "TxnResult": "kv.client.revisions",
    "TimeoutError": "kv.errors",
    "UnavailableError": "kv.errors",
    "WrongClusterError": "kv.errors",
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'kv' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
