"""A node's data directory: one process at a time (DataDirLock), and the mark of a member that
rejoins after losing its data (REJOINING_FILE).

Two processes on one directory would both write its log and state and corrupt them (both can
become leader of their own view and acknowledge writes). So whatever opens a data directory
(a node, embedded or served; a restore into it) first takes an exclusive lock on DATA_DIR/LOCK
with flock(2), and keeps it for as long as it uses the directory. The kernel drops the lock when
the process ends, however it ends (SIGKILL included), so a stale LOCK file never blocks a
restart. The file records the holder's pid and what it is doing, for the error the next one gets.

flock locks belong to an open file, not to a process: a second open in the same process (two
embedded nodes on one directory) is refused as well."""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from snapshot.durable import fsync_path
from statemachine.disk_space import free_bytes

LOCK_FILE = "LOCK"
# Present while the node rejoins after it lost its data (raft/node/joining.py): it votes for no
# one until it has caught up, also across restarts meanwhile.
REJOINING_FILE = "REJOINING"


class DataDirInUseError(OSError):
    """Another process (or another open in this one) holds the data directory."""


class DataDirLock:
    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self._fd: int | None = None

    def acquire(self, purpose: str) -> None:
        """Take the lock (creating the directory if needed), or raise DataDirInUseError naming the
        directory and its holder."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "an unknown process"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirInUseError(f"data directory {self.data_dir} is in use by {holder}: stop that "
                                        f"process, or give this one another data directory") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} ({purpose})\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file drops the lock
            self._fd = None

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class DataDirSpace:
    """raft.node.ports.DiskSpace: the free space on the data directory's file system."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir)

    def free_bytes(self) -> int:
        return free_bytes(self.path)


class RejoinFile:
    """raft.node.ports.RejoinRecord as DATA_DIR/REJOINING: present, with the rejoin floor, while
    the node rejoins after losing its data (raft/node/joining.py)."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir) / REJOINING_FILE

    def load(self) -> tuple[int, int] | None:
        if not self.path.exists():
            return None
        last_term, last_index = self.path.read_text().split()[:2]
        return int(last_term), int(last_index)

    def save(self, floor: tuple[int, int] | None) -> None:
        if floor is None:
            self.path.unlink(missing_ok=True)
        else:
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "w") as f:
                f.write(f"{floor[0]} {floor[1]}\nthis member rejoins its cluster after losing its data: until it "
                        "has caught up it votes only for a candidate whose log ends at least at (term, index) above\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        fsync_path(self.path.parent)
