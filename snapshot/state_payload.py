"""Reading a snapshot's state payload (an LMDB environment as KVStateMachine lays it out)
without the state machine: the snapshot code may be imported by raft/node, which must not import
statemachine, so it relies only on the layout - user data in the named databases ``data`` and
``data_long``."""
from __future__ import annotations

import os

import lmdb

STATE_FILE = "data.mdb"
_DATA_DBS = (b"data", b"data_long")  # short keys, and keys over 511 bytes
_META_DB = b"meta"
_REVISION_KEY = b"revision"  # the store's revision (statemachine/mvcc.py), an int64


def count_keys(state_dir: str | os.PathLike[str]) -> int:
    """Number of user keys in the LMDB environment at `state_dir`, opened read-only with no lock
    file (the directory is a private copy nobody else writes)."""
    env = lmdb.open(str(state_dir), readonly=True, lock=False, max_dbs=8, subdir=True)
    try:
        with env.begin() as txn:
            # Named databases are keys of the main database; keys over 511 bytes are in a table
            # of their own (statemachine/long_keys.py), absent from a state written before.
            tables = [env.open_db(name, txn=txn, create=False) for name in _DATA_DBS if txn.get(name) is not None]
            return sum(int(txn.stat(data)["entries"]) for data in tables)
    finally:
        env.close()



def store_revision(state_dir: str | os.PathLike[str]) -> int:
    """The store's revision in the LMDB environment at `state_dir` (1: an empty store), opened as
    `count_keys` opens it."""
    env = lmdb.open(str(state_dir), readonly=True, lock=False, max_dbs=8, subdir=True)
    try:
        return revision_in(env)
    finally:
        env.close()


def revision_in(env: lmdb.Environment) -> int:
    """The store's revision in an open state environment (statemachine/mvcc.py keeps it)."""
    with env.begin() as txn:
        if txn.get(_META_DB) is None:
            return 1
        raw = txn.get(_REVISION_KEY, db=env.open_db(_META_DB, txn=txn, create=False))
        return 1 if raw is None else int.from_bytes(raw, "big", signed=True)
