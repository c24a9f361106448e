"""What `raftkv cluster up` leaves in its --data-dir for `raftkv cluster restart` (run from
another terminal): the state file (CLUSTER_STATE_FILE) naming the supervising process and each
member's serve command, log and pid, and a lock (CLUSTER_LOCK_FILE) that a restart and the
supervisor's stop take, so that a member is never started while the supervisor collects the
members to stop.

The state file exists while `cluster up` runs: it writes the file before it reports the cluster
up and removes it when it has stopped every member. A member restarted by `cluster restart` is
not the supervisor's child; the supervisor learns its pid from this file."""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from kv.server.data_dir import LOCK_FILE

CLUSTER_STATE_FILE = "cluster.json"
CLUSTER_LOCK_FILE = "cluster.lock"


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """How to start one member again, and the pid of its latest process."""

    command: list[str]
    pid: int
    log: str
    data_dir: str


@dataclass(frozen=True, slots=True)
class ClusterState:
    supervisor_pid: int
    pythonpath: str  # the members import the same code as the supervisor's, installed or not
    members: dict[str, MemberRecord]
    # `cluster up --tls`: the export lines that give clients its TLS files (the members' commands
    # carry their own TLS flags); empty: plaintext.
    tls_env: list[str] = field(default_factory=list)

    def with_pid(self, node_id: str, pid: int) -> ClusterState:
        return replace(self, members={**self.members, node_id: replace(self.members[node_id], pid=pid)})


def write_state(cluster_dir: Path, state: ClusterState) -> None:
    """Replace the state file at once: a reader sees the old file or the new one, never half."""
    tmp = cluster_dir / f"{CLUSTER_STATE_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    os.replace(tmp, cluster_dir / CLUSTER_STATE_FILE)


def read_state(cluster_dir: Path) -> ClusterState | None:
    try:
        raw = json.loads((cluster_dir / CLUSTER_STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    members = {name: MemberRecord(**record) for name, record in raw["members"].items()}
    return ClusterState(raw["supervisor_pid"], raw["pythonpath"], members, raw["tls_env"])


def remove_state(cluster_dir: Path) -> None:
    (cluster_dir / CLUSTER_STATE_FILE).unlink(missing_ok=True)


@contextmanager
def state_lock(cluster_dir: Path) -> Iterator[None]:
    """Held by `cluster restart` from its check to its state update, and by `cluster up` while it
    stops the members: a restart cannot start a member that the stop would miss."""
    cluster_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(cluster_dir / CLUSTER_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def pid_running(pid: int) -> bool:
    """Whether `pid` is a live process. A member restarted by `cluster restart` outlives its
    parent and may stay a zombie under an init that does not reap, so a zombie counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: os.kill's answer stands
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the parenthesised name


def data_dir_holder(data_dir: Path) -> str | None:
    """Who holds the member's data directory lock (kv/server/data_dir.py), as its LOCK file names
    the holder, or None when no process does. The probe takes the lock for an instant: a member
    starting at that very instant would be refused, so only a restart calls it."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 256, 0).decode(errors="replace").strip() or "an unknown process"
        return None
    finally:
        os.close(fd)  # also drops the probe's lock


def holds_data_dir(pid: int, data_dir: Path) -> bool:
    """Whether the process `pid` has taken the member's data directory lock (it names itself in
    the LOCK file, kv/server/data_dir.py). Reads the file only: no probe, no interference."""
    try:
        return (data_dir / LOCK_FILE).read_text().startswith(f"process {pid} ")
    except OSError:
        return False
