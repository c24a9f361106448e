"""A description of the machine a run was measured on, including how fast its disk syncs (the
floor under every durable write)."""
from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc

from kv.tools.bench.measure import percentile
from kv.tools.cluster_up import SOURCE_ROOT

FSYNC_SAMPLES = 200


def fdatasync_ms(directory: Path, samples: int = FSYNC_SAMPLES) -> dict[str, float]:
    """p50 / p99 of write(4 KiB) + fdatasync in `directory`."""
    path = directory / "fdatasync.probe"
    block = b"\0" * 4096
    times: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i in range(samples):
            os.pwrite(fd, block, (i % 16) * len(block))
            began = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - began)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {"p50": percentile(times, 50) * 1000, "p99": percentile(times, 99) * 1000}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return None


def source_revision(source: Path) -> str | None:
    """`git describe --always --dirty` of the raftkv source being measured, None outside git."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=source, capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def describe(work_dir: Path, etcd: str | None) -> dict[str, Any]:
    memory = _memory_gb()
    return {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gb": round(memory, 1) if memory else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "etcd": etcd,
        "raftkv_revision": source_revision(SOURCE_ROOT),
        "fdatasync_ms": fdatasync_ms(work_dir),
    }


def summary_line(machine: dict[str, Any]) -> str:
    sync = machine["fdatasync_ms"]
    return (f"{machine['cpus']} x {machine['cpu']}, {machine['memory_gb']} GB, Linux {machine['kernel']}, "
            f"Python {machine['python']}, grpcio {machine['grpcio']}, {machine['etcd'] or 'no etcd'}; "
            f"fdatasync p50 {sync['p50']:.2f} ms, p99 {sync['p99']:.2f} ms")
