"""Which cluster a node belongs to, kept in data_dir/cluster_id so a restarted node cannot be
pointed at another cluster by mistake. Peers refuse messages carrying another id.

On a node's first start (no data_dir/cluster_id yet) the id is the configured one (--cluster-id)
if given, else derived from what every member of a new cluster agrees on: the member ids and the
initial cluster token (--initial-cluster-token, as etcd's flag). Never from the --peers
addresses: each member may reach the others at addresses of its own. Once stored, the stored id
is the node's id for good; a configured id that differs is refused and the token is not read."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

FILE_NAME = "cluster_id"
# etcd's default for --initial-cluster-token: clusters started alike with the default token get
# one id, so give each cluster a token of its own where several could reach each other.
DEFAULT_CLUSTER_TOKEN = "etcd-cluster"


def derived_cluster_id(members: Iterable[str], token: str = DEFAULT_CLUSTER_TOKEN) -> str:
    """The id every member of a new cluster computes alike from the same member ids and token,
    whatever addresses it reaches them at."""
    # JSON keeps the spec unambiguous whatever characters the token or the ids hold.
    spec = json.dumps({"token": token, "members": sorted(set(members))}, separators=(",", ":"))
    return "c-" + hashlib.sha256(spec.encode()).hexdigest()[:16]


def resolve_cluster_id(data_dir: Path, configured: str | None, members: Iterable[str],
                       token: str = DEFAULT_CLUSTER_TOKEN) -> str:
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
    cluster_id = configured if configured is not None else derived_cluster_id(members, token)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(cluster_id + "\n")
    os.replace(tmp, path)  # atomic: a crash leaves either no file or the whole id
    return cluster_id
