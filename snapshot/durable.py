"""Making file-system changes survive a crash: a rename is only durable once the directory that
holds it is fsynced, and a file's bytes only once the file is."""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO


def fsync_file(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or directory by path (a directory fsync persists the names in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(src: Path, dst: Path) -> None:
    """Atomically move src to dst (same file system) and persist the rename."""
    os.replace(src, dst)
    fsync_path(dst.parent)
    if src.parent != dst.parent:
        fsync_path(src.parent)
