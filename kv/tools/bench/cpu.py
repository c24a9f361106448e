"""CPU time per operation, by process: the leader, the followers and the bench's own client
threads. Where a system's time goes on a machine with fewer cores than busy processes is as
telling as its throughput (README, "Where the time goes")."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from kv.tools.bench.systems import Cluster

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
CLIENT = "client"


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process, all its threads (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        # The command name (field 2) may hold spaces: count fields after its closing parenthesis.
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


@dataclass(frozen=True, slots=True)
class CpuRoles:
    """Which member leads (when the load starts) and the process ids to read."""

    leader: str
    pids: dict[str, int]

    @classmethod
    def of(cls, cluster: Cluster, leader: str) -> CpuRoles:
        pids = {m: pid for m in cluster.members if (pid := cluster.pid(m)) is not None}
        return cls(leader, pids)

    def probe(self) -> Callable[[], dict[str, float]]:
        """CPU seconds so far of every member and of this process (the client threads)."""
        def sample() -> dict[str, float]:
            cpu = {member: process_cpu_s(pid) for member, pid in self.pids.items()}
            cpu[CLIENT] = time.process_time()
            return cpu
        return sample

    def ms_per_op(self, before: dict[str, float], after: dict[str, float], ops: int) -> dict[str, float]:
        """{"leader", "follower" (their mean), "client"}: CPU ms per operation over the window."""
        if ops <= 0:
            return {}

        def ms(name: str) -> float:
            return (after[name] - before[name]) * 1000 / ops

        followers = [m for m in self.pids if m != self.leader]
        return {
            "leader": ms(self.leader),
            "follower": sum(ms(m) for m in followers) / len(followers) if followers else 0.0,
            CLIENT: ms(CLIENT),
        }


def descendants_cpu_s(root: int, exclude: Collection[int] = ()) -> float:
    """User + system CPU seconds of every running descendant of process `root`, leaving out the
    processes in `exclude` and theirs (Linux /proc). W10 reads Spark's share with it: its JVM and
    Python workers are this process's descendants, as the members are."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (parent := _parent_pid(int(entry.name))) is not None:
            children.setdefault(parent, []).append(int(entry.name))
    total, pending = 0.0, [pid for pid in children.get(root, []) if pid not in exclude]
    while pending:
        pid = pending.pop()
        total += _cpu_s_or_zero(pid)
        pending += [child for child in children.get(pid, []) if child not in exclude]
    return total


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None  # it has exited meanwhile


def _cpu_s_or_zero(pid: int) -> float:
    try:
        return process_cpu_s(pid)
    except (OSError, IndexError, ValueError):
        return 0.0
