"""Reading a snapshot's state payload (an LMDB environment as KVStateMachine lays it out)
without the state machine: the snapshot code may be imported by raft/node, which must not import
statemachine, so it relies only on the layout - user data in the named database ``data``."""
from __future__ import annotations

import os

import lmdb

STATE_FILE = "data.mdb"
_DATA_DB = b"data"


def count_keys(state_dir: str | os.PathLike[str]) -> int:
    """Number of user keys in the LMDB environment at `state_dir`, opened read-only with no lock
    file (the directory is a private copy nobody else writes)."""
    env = lmdb.open(str(state_dir), readonly=True, lock=False, max_dbs=8, subdir=True)
    try:
        with env.begin() as txn:
            if txn.get(_DATA_DB) is None:  # named databases are keys of the main database
                return 0
            data = env.open_db(_DATA_DB, txn=txn, create=False)
            return int(txn.stat(data)["entries"])
    finally:
        env.close()
