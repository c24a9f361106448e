"""`kv.concurrency`: locks and elections compatible with etcd's clientv3/concurrency (their home is
kv/client/concurrency.py, beside the Client they use)."""
from kv.client.concurrency import Election, ElectionError, Lock, Session

__all__ = ["Election", "ElectionError", "Lock", "Session"]
