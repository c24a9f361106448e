"""`kv.aio.concurrency`: kv.concurrency's locks and elections on kv.aio.Client (their home is
kv/client/aio/concurrency.py)."""
from kv.client.aio.concurrency import Election, ElectionError, Lock, Session

__all__ = ["Election", "ElectionError", "Lock", "Session"]
