"""Child processes of the bench: each in its own process group (so Ctrl-C in the terminal reaches
only the bench, which then stops them in order; see stopping.py), all tracked in one registry so
that every exit path - normal end, error, Ctrl-C, SIGTERM - stops every one of them."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

STOP_GRACE_S = 10.0


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a running process (Linux /proc), None once it is gone."""
    return _status_bytes(pid, "VmRSS:")


def peak_rss_bytes(pid: int) -> int | None:
    """The most a process has held resident since it started or since reset_peak_rss (VmHWM)."""
    return _status_bytes(pid, "VmHWM:")


def reset_peak_rss(pid: int) -> bool:
    """Start a process's peak resident size again from what it holds now (Linux's clear_refs 5);
    False when not allowed (another user's process) or the process is gone."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def _status_bytes(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


@dataclass
class Child:
    """One started process, its output appended to `log_path`."""

    name: str
    command: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    def start(self) -> None:
        assert not self.running, f"{self.name} is already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log.write(f"---- start: {' '.join(self.command)}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                        stdin=subprocess.DEVNULL, start_new_session=True)

    def kill(self) -> None:
        """SIGKILL to the whole process group: a crash, and nothing left behind."""
        if self.running:
            _signal_group(self.pid, signal.SIGKILL)
        self._reap(timeout=None)

    def terminate(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, then SIGKILL after `grace_s`."""
        if self.running:
            _signal_group(self.pid, signal.SIGTERM)
            _signal_group(self.pid, signal.SIGCONT)
        self._reap(timeout=grace_s)

    def _reap(self, timeout: float | None) -> None:
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.pid, signal.SIGKILL)
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # start_new_session made the child its group's leader: pgid == pid
    except ProcessLookupError:
        pass


@dataclass
class Registry:
    """Every child the bench starts; `stop_all` is safe to call from any exit path, repeatedly."""

    children: list[Child] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def spawn(self, child: Child) -> Child:
        with self._lock:
            self.children.append(child)
        child.start()
        return child

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to every running child at once (they shut down in parallel), then SIGKILL the
        ones still running after `grace_s`."""
        with self._lock:
            children = list(self.children)
        running = [c for c in children if c.running]
        for child in running:
            _signal_group(child.pid, signal.SIGTERM)
            _signal_group(child.pid, signal.SIGCONT)
        for child in children:
            child.terminate(grace_s)

    def forget(self, stopped: Sequence[Child]) -> None:
        with self._lock:
            self.children = [c for c in self.children if c not in stopped]


class MemberProcesses:
    """A bench cluster's member processes, one Child per member name, under a Registry that stops
    them whatever happens. Subclasses fill `registry` and `children` in their __init__."""

    registry: Registry
    children: dict[str, Child]

    def start(self) -> None:
        for child in self.children.values():
            self.registry.spawn(child)

    def stop(self) -> None:
        for child in self.children.values():
            child.terminate()
        self.registry.forget(list(self.children.values()))

    def kill(self, member: str) -> None:
        self.children[member].kill()

    def restart(self, member: str) -> None:
        """SIGKILL and start again; the member rejoins from its data directory."""
        child = self.children[member]
        child.kill()
        child.start()

    def pid(self, member: str) -> int | None:
        child = self.children[member]
        return child.pid if child.running else None
