"""The operator's calls on kv.Client: status, alarms, and snapshots (save from the leader,
inspect and restore a file). Mixed into Client as AuthAdmin is; they use its connections,
retries and credentials."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc

from kv.client.credentials import Credentials
from kv.client.retries import MAX_FREE_HOPS, MIN_ATTEMPT_S
from kv.client.router import Router
from kv.client.status import alarm_dicts, status_dict
from kv.client.tls import TLS, with_hint
from kv.errors import NotLeaderError, UnavailableError, from_rpc_error
from raftkv_proto import kv_pb2, kv_pb2_grpc


class Maintenance:
    """Mixed into kv.Client: what these calls use of it."""

    endpoints: list[str]
    timeout: float
    tls: TLS | None
    _credentials: Credentials
    _router: Router
    _call: Callable[..., Any]
    _stub: Callable[[str], kv_pb2_grpc.KVStub]
    _log_in_once: Callable[[float], None]

    # ---- alarms ------------------------------------------------------------------------------

    def alarm_list(self) -> list[dict[str, str]]:
        """The raised alarms, as etcdctl's `alarm list`: [{"member_id": "n2", "alarm": "NOSPACE"}, ...]."""
        return alarm_dicts(self._call(lambda stub: stub.Alarm, kv_pb2.AlarmRequest()).alarms)

    def alarm_disarm(self, member_id: str = "", alarm: str = "") -> list[dict[str, str]]:
        """Clear `member_id`'s `alarm` ("NOSPACE", "CORRUPT"), through the log; with neither,
        every alarm (etcdctl's `alarm disarm`). Returns the alarms still raised after it (one
        whose cause lasts is raised again within a second). Root only while auth is on."""
        request = kv_pb2.AlarmRequest(action=kv_pb2.AlarmRequest.DEACTIVATE, member_id=member_id,
                                      alarm=kv_pb2.AlarmType.Value(alarm) if alarm else kv_pb2.NONE)
        return alarm_dicts(self._call(lambda stub: stub.Alarm, request).alarms)

    def status(self) -> list[dict[str, Any]]:
        """One dict per configured endpoint (asked in parallel); an endpoint that does not answer
        gives {"address": ..., "error": ...}."""
        futures = [(address, self._stub(address).Status.future(kv_pb2.StatusRequest(), timeout=self.timeout,
                                                               metadata=self._credentials.metadata))
                   for address in self.endpoints]
        return [_status_dict(address, future, self.tls) for address, future in futures]

    # ---- snapshots ---------------------------------------------------------------------------

    def save_snapshot(self, path: str | os.PathLike[str], timeout: float = 600.0,
                      progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Stream a consistent snapshot from the leader (taken after a ReadIndex round: it holds
        every write acknowledged before this call) into `path`, verified by size and sha256
        before it is renamed into place. `progress(received, total)` is called per chunk.
        Returns the manifest as a dict."""
        destination = Path(path)
        if not destination.parent.is_dir():  # a typo in the path should not become a new directory
            raise FileNotFoundError(f"{destination.parent} is not a directory: create it first, or save elsewhere")
        self._log_in_once(time.monotonic() + timeout)
        router = self._router
        target, deadline, last_error = router.preferred, time.monotonic() + timeout, None
        for _ in range(MAX_FREE_HOPS + 2 * len(self.endpoints)):
            try:
                return self._save_snapshot_from(target, destination, deadline - time.monotonic(), progress)
            except grpc.RpcError as rpc_error:
                last_error = router.hinted(from_rpc_error(rpc_error))
                if not last_error.retryable or time.monotonic() >= deadline:
                    raise last_error from None
                hint = last_error.leader_address if isinstance(last_error, NotLeaderError) else None
                target = hint or router.next_endpoint(target)
        raise last_error or UnavailableError("no node could stream a snapshot")

    def _save_snapshot_from(self, address: str, destination: Path, timeout: float,
                            progress: Callable[[int, int], None] | None) -> dict[str, Any]:
        # The operator's snapshot methods use the snapshot and server packages (installed with
        # raftkv), imported here so that the client's data path imports only the protocol.
        from snapshot.transfer import SnapshotReceiver

        chunks = self._stub(address).SaveSnapshot(kv_pb2.SaveSnapshotRequest(), timeout=max(timeout, MIN_ATTEMPT_S),
                                                  metadata=self._credentials.metadata)
        with SnapshotReceiver(destination.parent, source=f"snapshot from {address}") as receiver:
            first = None
            for chunk in chunks:
                first = first or chunk
                receiver.feed(chunk.offset, chunk.data)
                if progress is not None:
                    progress(receiver.received, first.total_size)
                if chunk.done:
                    verified = receiver.finish(first.total_size, first.sha256)
                    os.replace(verified, destination)
                    return json.loads(first.manifest_json)
        raise UnavailableError(f"the snapshot stream from {address} ended before its last chunk")

    @staticmethod
    def inspect_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
        """The manifest, key count and checksum verdict of a snapshot file (of an etcd snapshot:
        format "etcd" and, under "etcd", what `etcdctl snapshot status` reports)."""
        from snapshot.inspection import inspect
        return inspect(path)

    @staticmethod
    def restore_snapshot(path: str | os.PathLike[str], data_dir: str | os.PathLike[str], node_id: str = "n1",
                         peers: Mapping[str, str] | None = None, cluster_id: str | None = None) -> str:
        """Prepare `data_dir` so that `raftkv serve --data-dir data_dir ...` starts a new cluster
        holding the snapshot's data - a raftkv snapshot, or an etcd 3.x one (`etcdctl snapshot
        save`), told apart by content; returns the new cluster's id (pass the same --cluster-id to
        every member restored for a multi-node cluster)."""
        from kv.server.restore import restore
        return restore(path, data_dir, node_id, dict(peers or {node_id: "127.0.0.1:7001"}), cluster_id)


def _status_dict(address: str, future: Future, tls: TLS | None) -> dict[str, Any]:
    try:
        return status_dict(future.result(), address)
    except grpc.RpcError as rpc_error:
        return {"address": address, "error": with_hint(str(from_rpc_error(rpc_error)), tls)}

