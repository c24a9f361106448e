"""Which cluster a node belongs to, kept in data_dir/cluster_id so a restarted node cannot be
pointed at another cluster by mistake. Peers refuse messages carrying another id."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

FILE_NAME = "cluster_id"


def derived_cluster_id(peers: dict[str, str]) -> str:
    """A stable id every member computes alike from the same --peers list."""
    spec = ",".join(f"{pid}={addr}" for pid, addr in sorted(peers.items()))
    return "c-" + hashlib.sha256(spec.encode()).hexdigest()[:16]


def resolve_cluster_id(data_dir: Path, configured: str | None, peers: dict[str, str]) -> str:
    """The stored id if there is one (refusing a different configured id), else the configured or
    derived id, which is stored for the next start."""
    path = Path(data_dir) / FILE_NAME
    if path.exists():
        stored = path.read_text().strip()
        if configured is not None and configured != stored:
            raise ValueError(
                f"data directory {data_dir} belongs to cluster {stored!r}, but this node was started "
                f"with cluster id {configured!r}; use the right --data-dir or cluster id")
        return stored
    cluster_id = configured if configured is not None else derived_cluster_id(peers)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(cluster_id + "\n")
    os.replace(tmp, path)  # atomic: a crash leaves either no file or the whole id
    return cluster_id
