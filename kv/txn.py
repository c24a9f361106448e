"""`kv.txn`: the transaction builder's public name (its home is kv/client/txn.py, beside the Client
that sends what it builds)."""
from kv.client.txn import Compare, CreateRevision, Lease, ModRevision, Op, Value, Version, delete, get, put, txn

__all__ = ["Compare", "CreateRevision", "Lease", "ModRevision", "Op", "Value", "Version", "delete", "get", "put", "txn"]
