"""Telling a full disk from other failures of an LMDB write. LMDB reports a short write as an I/O
error (EIO) as often as it passes ENOSPC on, and py-lmdb's exceptions carry no errno: the message
and the file system's free space are what there is to go on."""
from __future__ import annotations

import errno
import os
from pathlib import Path

NO_SPACE_MESSAGES = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), os.strerror(errno.EFBIG))
IO_ERROR_MESSAGE = os.strerror(errno.EIO)


def free_bytes(directory: str | Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `directory`."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def out_of_space(error: Exception, directory: str | Path, needed_bytes: int) -> bool:
    """Whether a failed write was the disk running out of space: the error says so, or it is an
    I/O error while fewer than `needed_bytes` are free where the write went."""
    text = str(error)
    if any(m in text for m in NO_SPACE_MESSAGES):
        return True
    return IO_ERROR_MESSAGE in text and free_bytes(directory) < needed_bytes
