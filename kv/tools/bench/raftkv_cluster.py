"""A local three-node raftkv cluster for the bench: `python -m kv serve` processes as shipped
(fsync on, default timing), each in its own process group; with `tls`, as `raftkv cluster up --tls`
starts them (TLS on the client and peer ports), and every client of the bench uses TLS. With
`api="etcd"` (`raftkv bench --api etcd`) its clients are EtcdTargets over the members' client
ports: etcd's API through the very client the bench drives etcd with, starting at the leader as
that one does."""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kv.tools.bench import stopping
from kv.tools.bench.processes import Child, MemberProcesses, Registry
from kv.tools.bench.etcd import MAX_TXN_OPS, EtcdTarget
from kv.tools.bench.systems import ETCD_API, LEASE, LINEARIZABLE, NATIVE_API, STALE, Target
from kv.client.client import MAX_PAGE_LIMIT, Client
from kv.client.tls import TLS
from kv.tools.cluster_up import CERTS_DIR, NodeSpec, child_env, free_ports, serve_command, with_tls
from kv.txn import ModRevision, get, put
from raftkv_proto.key_ranges import prefix_end
from statemachine.commands import CommandLimits

POLL_S = 0.05
# The server refuses a write with more ops than this (its per-write op limit).
MAX_BULK_OPS = CommandLimits().max_ops


class RaftkvTarget:
    """kv.Client as a bench Target."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float, tls: TLS | None = None) -> None:
        self.client = Client(list(endpoints), timeout=timeout_s, tls=tls)

    def put(self, key: bytes, value: bytes) -> None:
        self.client.put(key, value)

    def get(self, key: bytes, consistency: str = LINEARIZABLE) -> bytes | None:
        return self.client.get(key, consistency=consistency)

    def bulk_put(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        self.client.batch(pairs)

    def revision(self) -> int:
        return self.client.revision()

    def get_at(self, key: bytes, revision: int) -> bytes | None:
        return self.client.get(key, revision=revision)

    def cas(self, key: bytes, mod_revision: int, value: bytes) -> tuple[bool, int]:
        result = self.client.txn([ModRevision(key) == mod_revision], [put(key, value)], [get(key)])
        if result.succeeded:  # the put is the Txn's only change: its revision is the key's
            return True, result.revision
        kvs = result.responses[0]
        return False, kvs[0].mod_revision if kvs else 0

    def list_prefix(self, prefix: bytes, keys_only: bool = False, page: int = 0) -> int:
        if not page:
            return len(self.client.scan(prefix=prefix, limit=MAX_PAGE_LIMIT, keys_only=keys_only))
        listed, start, end = 0, prefix, prefix_end(prefix)
        while pairs := self.client.scan(start=start, end=end, limit=page, keys_only=keys_only):
            listed += len(pairs)
            if len(pairs) < page:
                break
            start = pairs[-1][0] + b"\0"
        return listed

    def close(self) -> None:
        self.client.close()


class RaftkvCluster(MemberProcesses):
    system = "raftkv"

    def __init__(self, work_dir: Path, registry: Registry, nodes: int = 3, extra_args: Sequence[str] = (),
                 tls: bool = False, api: str = NATIVE_API) -> None:
        self.api = api
        if api == ETCD_API:  # etcd's API has no lease reads (serializable ones count as stale) nor Batch
            self.max_bulk_ops, self.consistencies = MAX_TXN_OPS, (LINEARIZABLE, STALE)
        else:
            self.max_bulk_ops, self.consistencies = MAX_BULK_OPS, (LINEARIZABLE, LEASE, STALE)
        ports = free_ports(2 * nodes)  # one call: a client and a peer port per member, all different
        names = [f"n{i + 1}" for i in range(nodes)]
        peers = {name: f"127.0.0.1:{port}" for name, port in zip(names, ports[nodes:])}
        specs = [NodeSpec(name, f"127.0.0.1:{port}", work_dir / name, peers, tuple(extra_args))
                 for name, port in zip(names, ports)]
        # The TLS every client of the bench uses (None: plaintext).
        self.client_tls: TLS | None = None
        if tls:
            specs, files = with_tls(specs, work_dir / CERTS_DIR)
            self.client_tls = TLS(files.ca, files.cert, files.key)
        self.specs = {spec.node_id: spec for spec in specs}
        self.members = list(self.specs)
        self.registry = registry
        self.children = {name: Child(name, serve_command(spec), work_dir / f"{name}.log", env=child_env())
                         for name, spec in self.specs.items()}

    @property
    def endpoints(self) -> list[str]:
        return [spec.listen for spec in self.specs.values()]

    def target(self, timeout_s: float) -> Target:
        if self.api == ETCD_API:
            # As EtcdCluster.target: start at the leader, as kv.Client ends up doing after one hint.
            leader = self.leader()
            order = sorted(self.members, key=lambda m: m != leader)
            return EtcdTarget([self.specs[m].listen for m in order], timeout_s, self.client_tls)
        return RaftkvTarget(self.endpoints, timeout_s, self.client_tls)

    def client_address(self, member: str) -> str:
        return self.specs[member].listen

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Status of every running member, by name (an unreachable one has an "error" key)."""
        running = [name for name in self.members if self.children[name].running]
        with Client([self.specs[n].listen for n in running], timeout=1.0, tls=self.client_tls) as client:
            return dict(zip(running, client.status()))

    def leader(self) -> str | None:
        return self._leader_of(self.statuses())

    @staticmethod
    def _leader_of(statuses: dict[str, dict[str, Any]]) -> str | None:
        """The leader every member in `statuses` agrees on, if any."""
        if not statuses or any("error" in s for s in statuses.values()):
            return None
        leaders = {s["leader"] for s in statuses.values()}
        leader = leaders.pop() if len(leaders) == 1 else None
        if leader not in statuses or statuses[leader]["role"] != "leader":
            return None
        return leader

    def wait_healthy(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            stopping.check()
            try:
                statuses = self.statuses()
                leader = self._leader_of(statuses)
                if leader is not None:
                    commit = statuses[leader]["commit_index"]
                    if all(s["applied_index"] >= commit for s in statuses.values()):
                        return leader
                last = statuses
            except Exception as error:  # noqa: BLE001 - members come and go while we poll
                last = error
            time.sleep(POLL_S)  # processes give no event to await; poll their status
        tails = "\n".join(f"== {name}\n{child.log_tail()}" for name, child in self.children.items())
        raise RuntimeError(f"raftkv cluster not healthy after {timeout_s:.0f}s; last status: {last!r}\n{tails}")
