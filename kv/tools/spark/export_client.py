"""Client of the Export service (proto/export.proto): begin a point-in-time export on the leader,
read key ranges of it (from any process: Spark executors, export threads), end it.

    with ExportClient(endpoints) as c:
        export = c.begin(partitions=8)               # on the leader, after a ReadIndex round
        for start, end in export.ranges: rows = list(c.read(export, start, end))
        c.end(export)
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from kv.client.client import CHANNEL_OPTIONS, Client
from kv.client.router import parse_endpoints
from kv.client.tls import TLS, open_channel, with_hint
from kv.errors import NotLeaderError, RaftKVError, from_rpc_error
from raftkv_proto import export_pb2, export_pb2_grpc

# The staging area of atomic Spark writes (kv.tools.spark.bulk_load); exports skip it.
STAGING_PREFIX = b"\xff\xfe.raftkv-staging/"
RETRY_PAUSE_S = 0.05
T = TypeVar("T")


def _started(batches: Iterator[export_pb2.ExportBatch]) -> Iterator[export_pb2.ExportBatch]:
    """A server stream with its first batch already in (so a refused token raises here, where it
    can be renewed, not half-way through the caller's loop)."""
    first = next(batches, None)
    if first is None:
        return iter(())
    return itertools.chain((first,), batches)


@dataclass(frozen=True, slots=True)
class ExportInfo:
    """A pinned export: where it lives and the point in time every read of it sees."""

    export_id: str
    address: str  # the node that pinned it (the leader at BeginExport)
    index: int
    term: int
    cluster_id: str
    start: bytes
    end: bytes  # b"": to the last key
    split_points: tuple[bytes, ...]
    key_count: int
    ttl_ms: int
    revision: int = 0  # the store's revision at `index`

    @property
    def ranges(self) -> list[tuple[bytes, bytes]]:
        """The key ranges [start, end) the split points cut the export into, in key order."""
        bounds = [self.start, *self.split_points, self.end]
        return list(zip(bounds[:-1], bounds[1:]))


@dataclass
class ExportClient:
    """`user` and `password`: once the cluster has auth enabled, exports are for a user with the
    root role (they read every key); its token is renewed once when a call finds it expired."""

    endpoints: Sequence[str] | str
    timeout: float = 30.0
    tls: TLS | None = None  # as kv.Client's: TLS to nodes started with --cert-file
    user: str | None = None
    password: str | None = None
    _channels: dict[str, grpc.Channel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.endpoints = parse_endpoints(self.endpoints)
        self._channel_credentials = self.tls.credentials() if self.tls is not None else None
        # Logs in (KV.Authenticate) and keeps the token; no streams of its own.
        self._login = Client(self.endpoints, timeout=self.timeout, streams=False, tls=self.tls, user=self.user,
                             password=self.password)

    def __enter__(self) -> ExportClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._login.close()

    def _logged_in(self, call: Callable[[tuple[tuple[str, str], ...] | None], T]) -> T:
        """call(metadata), again once with a new token when the token was refused."""
        metadata = self._login.call_metadata()
        try:
            return call(metadata)
        except grpc.RpcError as rpc_error:
            if rpc_error.code() != grpc.StatusCode.UNAUTHENTICATED or not self._login.renew_login(metadata):
                raise
        return call(self._login.call_metadata())

    def _stub(self, address: str) -> export_pb2_grpc.ExportStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._channel_credentials, CHANNEL_OPTIONS)
        return export_pb2_grpc.ExportStub(channel)

    def begin(self, prefix: bytes = b"", start: bytes = b"", end: bytes = b"", partitions: int = 1,
              ttl_ms: int = 0) -> ExportInfo:
        """Pin a point-in-time view on the leader (found by following "not leader" hints, with
        retries until `timeout`)."""
        request = export_pb2.BeginExportRequest(prefix=prefix, start=start, end=end, partitions=partitions,
                                                ttl_ms=ttl_ms)
        deadline = time.monotonic() + self.timeout
        candidates = list(self.endpoints)
        target = candidates[0]
        last: RaftKVError | None = None
        while time.monotonic() < deadline:
            try:
                r = self._logged_in(lambda metadata: self._stub(target).BeginExport(
                    request, timeout=max(deadline - time.monotonic(), 0.01), metadata=metadata))
                return ExportInfo(r.export_id, target, r.index, r.term, r.cluster_id, r.start, r.end,
                                  tuple(r.split_points), r.key_count, r.ttl_ms, r.revision)
            except grpc.RpcError as rpc_error:
                if rpc_error.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise RaftKVError(f"the node at {target} does not serve live exports (the Export service); "
                                      "export a snapshot file instead: raftkv export --snapshot FILE") from None
                last = from_rpc_error(rpc_error)
                last.args = (with_hint(str(last), self.tls),)  # a TLS mismatch must not read as a node down
            if not last.retryable:
                raise last
            hint = last.leader_address if isinstance(last, NotLeaderError) else None
            if hint and hint != target:
                target = hint  # follow at once
                continue
            target = candidates[(candidates.index(target) + 1) % len(candidates)] if target in candidates else candidates[0]
            time.sleep(RETRY_PAUSE_S)
        raise last or TimeoutError(f"no leader answered BeginExport within {self.timeout}s")

    def read(self, export: ExportInfo, start: bytes, end: bytes, batch_size: int = 0,
             skip_staging: bool = True) -> Iterator[list[tuple[bytes, bytes]]]:
        """Batches of (key, value) in [start, end) of the export, in key order."""
        request = export_pb2.ReadExportRequest(export_id=export.export_id, start=start, end=end,
                                               batch_size=batch_size)
        try:
            batches = self._logged_in(lambda metadata: _started(self._stub(export.address).ReadExport(
                request, timeout=self.timeout * 20, metadata=metadata)))
            for batch in batches:
                items = [(kv.key, kv.value) for kv in batch.items]
                if skip_staging and items and items[-1][0] >= STAGING_PREFIX:
                    items = [(k, v) for k, v in items if not k.startswith(STAGING_PREFIX)]
                yield items
        except grpc.RpcError as rpc_error:
            raise from_rpc_error(rpc_error) from None

    def end(self, export: ExportInfo) -> bool:
        """Release the pinned view now; False when it was already released."""
        try:
            response = self._logged_in(lambda metadata: self._stub(export.address).EndExport(
                export_pb2.EndExportRequest(export_id=export.export_id), timeout=self.timeout, metadata=metadata))
        except grpc.RpcError as rpc_error:
            raise from_rpc_error(rpc_error) from None
        return response.released
