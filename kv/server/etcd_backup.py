"""etcd's snapshot files and a raftkv node's state, both ways: an etcd 3.x snapshot made into a
restored member's state (`raftkv snapshot restore`, kv/server/restore.py), and a raftkv state
written as an etcd snapshot (etcd's Maintenance.Snapshot on raftkv, kv/server/etcd_services.py).

The bbolt file is the snapshot package's (snapshot/bbolt_reader.py, bbolt_writer.py,
etcd_file.py); what etcd's buckets mean for raftkv's tables is the state machine's
(statemachine/etcd_import.py, etcd_export.py). This module joins the two, as the server's
restore joins a snapshot's state to a member's log. The format: docs/etcd-snapshot-format.md.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from snapshot.bbolt_reader import BoltFile
from snapshot.bbolt_writer import write_bolt
from snapshot.errors import SnapshotCorruptError
from snapshot.etcd_file import open_etcd_snapshot
from snapshot.install import extract_state
from snapshot.store import TMP_PREFIX
from snapshot.transfer import chunk_file
from statemachine import etcd_records as etcd
from statemachine.etcd_import import EtcdBuckets, EtcdDataError, Imported
from statemachine.kv_state import KVStateMachine


def buckets_of(db: BoltFile) -> EtcdBuckets:
    """The buckets the import reads, straight from the file (each walked as it is iterated)."""
    return EtcdBuckets(key=_pairs(db, etcd.KEY), meta=dict(_pairs(db, etcd.META)), lease=_pairs(db, etcd.LEASE),
                       auth=dict(_pairs(db, etcd.AUTH)), users=_pairs(db, etcd.USERS), roles=_pairs(db, etcd.ROLES))


def _pairs(db: BoltFile, name: bytes) -> Iterator[tuple[bytes, bytes]]:
    """A top-level bucket's (key, value) pairs (none when it is absent; etcd nests no buckets)."""
    bucket = db.bucket(name)
    for key, value in bucket.items() if bucket is not None else ():
        if value is not None:
            yield key, value


def restore_etcd_state(snapshot_file: str | os.PathLike[str], state_dir: Path, cluster_id: str) -> Imported:
    """Make `state_dir` (which must not exist) a raftkv state holding the etcd snapshot's data.
    Raises SnapshotCorruptError, naming the file and what is wrong, for a damaged or truncated
    file; the caller removes what was written."""
    with open_etcd_snapshot(snapshot_file) as db:
        buckets = buckets_of(db)
        with KVStateMachine(state_dir) as state:
            try:
                return state.import_etcd(buckets, _signing_key(db, cluster_id))
            except EtcdDataError as exc:
                raise SnapshotCorruptError(f"{snapshot_file}: a damaged etcd snapshot: {exc}") from None


def _signing_key(db: BoltFile, cluster_id: str) -> bytes:
    """The token signing key of a restored cluster whose etcd had auth on: every member restored
    from one file with one cluster id must hold the same state, so it is derived from the cluster
    id and the users' records (their password hashes) rather than drawn at random. Whoever holds
    the file and the id could derive it: `auth disable` then `auth enable` draws a fresh one
    (docs/etcd-snapshot-format.md)."""
    digest = hashlib.sha256(b"raftkv etcd restore signing key\0" + cluster_id.encode() + b"\0")
    for key, value in _pairs(db, etcd.USERS):
        digest.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
    return digest.digest()


def write_etcd_database(state_dir: Path, out: Path) -> int:
    """Write the state at `state_dir` (a raftkv state nobody else has open) as an etcd snapshot's
    bbolt database to `out` (the sha256 etcdctl expects after it is the stream's); its size."""
    with KVStateMachine(state_dir) as state, state.etcd_export() as buckets, open(out, "wb") as f:
        size = write_bolt(f, buckets)
        f.flush()
    return size


async def etcd_snapshot_chunks(snapshot_file: Path, chunk_size: int) -> AsyncIterator[tuple[bytes, int]]:
    """etcd's Maintenance.Snapshot stream of the state in a raftkv snapshot file: (blob, bytes
    remaining after it) pieces of the etcd database, then its sha256 (remaining 0). The database
    is made in a worker thread under the snapshot's directory (a work directory the snapshot
    store removes at start should the process die first) and removed once streamed."""
    work = Path(tempfile.mkdtemp(prefix=TMP_PREFIX + "etcd-", dir=snapshot_file.parent))
    try:
        database = work / "etcd.db"
        size = await asyncio.to_thread(_make_database, snapshot_file, work / "state", database)
        digest = hashlib.sha256()
        sent = 0
        chunks = chunk_file(database, chunk_size)
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            digest.update(chunk.data)
            sent += len(chunk.data)
            yield chunk.data, size - sent  # as etcd counts: the database alone
        yield digest.digest(), 0
    finally:
        await asyncio.to_thread(shutil.rmtree, work, True)


def _make_database(snapshot_file: Path, state_dir: Path, out: Path) -> int:
    extract_state(snapshot_file, state_dir)
    return write_etcd_database(state_dir, out)
