"""A local three-member etcd cluster (Debian's etcd-server, as shipped: fsync on, default timing)
and a Python gRPC client of it built like kv.Client: same grpc channel options, same tenacity
backoff, per-call deadline over all retries. It speaks etcd 3.4's own API (proto/raftkv_proto/etcd_rpc.proto,
package etcdserverpb) and uses KV.Put, KV.Range (also at a past revision), KV.Txn (puts only for
bulk loads; one compare on the mod revision for W13) and Maintenance.Status. `raftkv bench --api
etcd` drives raftkv's members with the same EtcdTarget."""
from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from kv.tools.bench import stopping
from kv.tools.bench.processes import Child, MemberProcesses, Registry
from kv.tools.cluster_up import free_ports
from kv.tools.bench.systems import LINEARIZABLE, STALE
from kv.client.client import CHANNEL_OPTIONS
from kv.client.retries import BACKOFF_BASE_S, BACKOFF_MAX_S
from kv.client.tls import TLS, open_channel
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc as pb_grpc
from raftkv_proto.key_ranges import prefix_end

ETCD_BINARY = "etcd"
INSTALL_HINT = "etcd is not installed; for the comparison run: sudo apt-get update && sudo apt-get install -y etcd-server"
# etcd's --max-txn-ops default: a Txn carries at most this many operations.
MAX_TXN_OPS = 128
POLL_S = 0.05
# etcd reports "no leader", "leader changed" and its own request timeouts as UNAVAILABLE; a
# member that was just killed gives UNAVAILABLE too. All are worth another attempt elsewhere.
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def etcd_version() -> str | None:
    """`etcd --version`'s first line, None when etcd is not installed."""
    if shutil.which(ETCD_BINARY) is None:
        return None
    out = subprocess.run([ETCD_BINARY, "--version"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0] if out else "etcd (unknown version)"


def _retryable(error: BaseException) -> bool:
    return isinstance(error, grpc.RpcError) and error.code() in RETRYABLE  # type: ignore[attr-defined]


class EtcdTarget:
    """A client of etcd's API (an etcd cluster, or raftkv's members under `bench --api etcd`):
    unary calls as etcd's clients send them; starts at `endpoints[0]` and moves to the next
    endpoint after a retryable error, as kv.Client does without leader hints (etcd gives none).
    With `tls`, over TLS with those files (raftkv started by `bench --tls`)."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float, tls: TLS | None = None) -> None:
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._current = 0
        credentials = tls.credentials() if tls is not None else None
        self._channels = [open_channel(e, credentials, CHANNEL_OPTIONS) for e in self.endpoints]
        self._stubs = [pb_grpc.KVStub(c) for c in self._channels]

    def put(self, key: bytes, value: bytes) -> None:
        self._call(lambda stub, t: stub.Put(pb.PutRequest(key=key, value=value), timeout=t))

    def get(self, key: bytes, consistency: str = LINEARIZABLE) -> bytes | None:
        request = pb.RangeRequest(key=key, serializable=consistency != LINEARIZABLE)
        response = self._call(lambda stub, t: stub.Range(request, timeout=t))
        return response.kvs[0].value if response.kvs else None

    def bulk_put(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        ops = [pb.RequestOp(request_put=pb.PutRequest(key=k, value=v)) for k, v in pairs]
        request = pb.TxnRequest(success=ops)  # no compares: the success branch always runs
        self._call(lambda stub, t: stub.Txn(request, timeout=t))

    def revision(self) -> int:
        request = pb.RangeRequest(key=b"\0", count_only=True)
        return self._call(lambda stub, t: stub.Range(request, timeout=t)).header.revision

    def get_at(self, key: bytes, revision: int) -> bytes | None:
        request = pb.RangeRequest(key=key, revision=revision)
        response = self._call(lambda stub, t: stub.Range(request, timeout=t))
        return response.kvs[0].value if response.kvs else None

    def cas(self, key: bytes, mod_revision: int, value: bytes) -> tuple[bool, int]:
        request = pb.TxnRequest(
            compare=[pb.Compare(key=key, target=pb.Compare.MOD, result=pb.Compare.EQUAL, mod_revision=mod_revision)],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=value))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=key))])
        response = self._call(lambda stub, t: stub.Txn(request, timeout=t))
        if response.succeeded:  # the put is the Txn's only change: its revision is the key's
            return True, response.header.revision
        kvs = response.responses[0].response_range.kvs
        return False, kvs[0].mod_revision if kvs else 0

    def list_prefix(self, prefix: bytes, keys_only: bool = False, page: int = 0) -> int:
        request = pb.RangeRequest(key=prefix, range_end=prefix_end(prefix), keys_only=keys_only, limit=page)
        listed = 0
        while True:
            response = self._call(lambda stub, t: stub.Range(request, timeout=t))
            listed += len(response.kvs)
            if not response.more:
                return listed
            request.key = response.kvs[-1].key + b"\0"
            request.revision = response.header.revision  # a list's pages see one revision

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def _call(self, attempt):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + self.timeout_s

        def once():  # type: ignore[no-untyped-def]
            index = self._current
            try:
                return attempt(self._stubs[index], max(deadline - time.monotonic(), 0.01))
            except grpc.RpcError as error:
                if _retryable(error):
                    self._current = (index + 1) % len(self._stubs)
                raise

        retrying = Retrying(retry=retry_if_exception(_retryable), reraise=True, sleep=time.sleep,
                            wait=wait_random_exponential(multiplier=BACKOFF_BASE_S, max=BACKOFF_MAX_S),
                            stop=stop_after_delay(self.timeout_s))
        return retrying(once)


class EtcdCluster(MemberProcesses):
    system = "etcd"
    max_bulk_ops = MAX_TXN_OPS
    consistencies = (LINEARIZABLE, STALE)  # STALE: etcd's serializable reads
    client_tls = None

    def __init__(self, work_dir: Path, registry: Registry, members: int = 3) -> None:
        ports = free_ports(2 * members)
        self.members = [f"e{i + 1}" for i in range(members)]
        self.client_urls = {m: f"127.0.0.1:{ports[2 * i]}" for i, m in enumerate(self.members)}
        peer_urls = {m: f"http://127.0.0.1:{ports[2 * i + 1]}" for i, m in enumerate(self.members)}
        initial = ",".join(f"{m}={url}" for m, url in peer_urls.items())
        self.registry = registry
        self.children = {}
        for m in self.members:
            command = [ETCD_BINARY, "--name", m, "--data-dir", str(work_dir / m),
                       "--listen-client-urls", f"http://{self.client_urls[m]}",
                       "--advertise-client-urls", f"http://{self.client_urls[m]}",
                       "--listen-peer-urls", peer_urls[m], "--initial-advertise-peer-urls", peer_urls[m],
                       "--initial-cluster", initial, "--initial-cluster-state", "new",
                       "--initial-cluster-token", "raftkv-bench", "--logger", "zap", "--log-level", "warn"]
            self.children[m] = Child(m, command, work_dir / f"{m}.log")
        self._member_ids: dict[int, str] = {}

    def target(self, timeout_s: float) -> EtcdTarget:
        """A client that starts at the leader, as kv.Client ends up doing after one hint."""
        leader = self.leader()
        order = sorted(self.members, key=lambda m: m != leader)
        return EtcdTarget([self.client_urls[m] for m in order], timeout_s)

    def client_address(self, member: str) -> str:
        return self.client_urls[member]

    def statuses(self) -> dict[str, pb.StatusResponse]:
        """Maintenance.Status of every running member that answers within a second."""
        answers = {}
        for m in self.members:
            if not self.children[m].running:
                continue
            with grpc.insecure_channel(self.client_urls[m]) as channel:
                try:
                    answers[m] = pb_grpc.MaintenanceStub(channel).Status(pb.StatusRequest(), timeout=1.0)
                except grpc.RpcError:
                    continue
            self._member_ids[answers[m].header.member_id] = m
        return answers

    def leader(self) -> str | None:
        return self._leader_of(self.statuses())

    def _leader_of(self, statuses: dict[str, pb.StatusResponse]) -> str | None:
        """The leader every running member agrees on, if all of them are in `statuses`."""
        running = [m for m in self.members if self.children[m].running]
        if len(statuses) < len(running):
            return None
        leaders = {s.leader for s in statuses.values()}
        if len(leaders) != 1:
            return None
        return self._member_ids.get(leaders.pop())

    def wait_healthy(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            stopping.check()
            statuses = self.statuses()
            leader = self._leader_of(statuses)
            if leader is not None and leader in statuses:
                index = statuses[leader].raftIndex
                if all(s.raftAppliedIndex >= index for s in statuses.values()):
                    return leader
            last = statuses
            time.sleep(POLL_S)  # processes give no event to await; poll their status
        tails = "\n".join(f"== {name}\n{child.log_tail()}" for name, child in self.children.items())
        raise RuntimeError(f"etcd cluster not healthy after {timeout_s:.0f}s; last status: {last!r}\n{tails}")
