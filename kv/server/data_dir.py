"""DataDirLock: one process at a time per data directory.

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

LOCK_FILE = "LOCK"


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
