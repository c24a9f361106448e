"""Read a snapshot file (snapshot/file_format.py) as key ranges, without a running cluster: the
payload is verified and unpacked into a private temporary LMDB environment, opened read-only.

    with SnapshotSource("backup.snap") as snap:
        snap.index, snap.term, snap.cluster_id
        for start, end in snap.ranges(4): ...snap.read(start, end)...
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import lmdb

from kv.tools.spark.export_client import STAGING_PREFIX
from snapshot.file_format import copy_payload
from snapshot.state_payload import STATE_FILE, revision_in
from statemachine.key_record import stored_value
from statemachine.long_keys import DATA_LONG_DB_NAME, LONG_KEYS_DB_NAME, KeyedTable, LongKeyNames

# The state machine's user data (statemachine/kv_state.py): short keys, long keys, their names.
_DATA_DBS = (b"data", DATA_LONG_DB_NAME, LONG_KEYS_DB_NAME)
DEFAULT_BATCH_SIZE = 5000


class SnapshotSource:
    def __init__(self, path: str | os.PathLike[str], workdir: str | os.PathLike[str] | None = None) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="raftkv-export-", dir=workdir))
        try:
            with open(self._dir / STATE_FILE, "wb") as out:
                manifest = copy_payload(path, out)  # verifies size and sha256 on the way
            self._env = lmdb.open(str(self._dir), readonly=True, lock=False, max_dbs=8, subdir=True)
            self._data = _data_table(self._env)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self.index, self.term, self.cluster_id = manifest.index, manifest.term, manifest.cluster_id
        self.revision = revision_in(self._env)

    def __enter__(self) -> SnapshotSource:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._env.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def ranges(self, partitions: int) -> list[tuple[bytes, bytes]]:
        """[start, end) ranges of about equal key count covering every key (b"" = unbounded)."""
        if self._data is None:
            return [(b"", b"")]
        with self._env.begin() as txn:
            count = self._data.count(txn)
            if partitions <= 1 or count < partitions:
                return [(b"", b"")]
            step = count / partitions
            wanted = {round(step * i) for i in range(1, partitions)}
            splits = [key for position, key in enumerate(self._data.keys(txn)) if position in wanted]
        bounds = [b"", *splits, b""]
        return list(zip(bounds[:-1], bounds[1:]))

    def read(self, start: bytes, end: bytes, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[list[tuple[bytes, bytes]]]:
        """Batches of (key, value) in [start, end), in key order (one read transaction each call)."""
        if self._data is None:
            return
        with self._env.begin() as txn:
            batch: list[tuple[bytes, bytes]] = []
            for key, value in self._data.ordered(txn, start, end or None):
                if key.startswith(STAGING_PREFIX):
                    continue  # rows of an atomic write that was not published when the snapshot was taken
                batch.append((key, stored_value(key, value)))
                if len(batch) == batch_size:
                    yield batch
                    batch = []
            if batch:
                yield batch


def _data_table(env: lmdb.Environment) -> KeyedTable | None:
    """The user data of a state opened read-only (None: it has none). A state written before long
    keys existed has no long-key tables, and no long key."""
    with env.begin() as txn:
        present = [txn.get(name) is not None for name in _DATA_DBS]
    if not present[0]:
        return None
    short, long, names = (env.open_db(name, create=False) if there else None
                          for name, there in zip(_DATA_DBS, present))
    return KeyedTable(short, long, LongKeyNames(names))
