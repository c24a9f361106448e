"""kv.Client.watch: every change to a key or range from a revision on, as an iterator that never
misses or repeats an event, whatever happens to the member it reads from.

    with client.watch(prefix="cfg/", start_revision=client.revision() + 1) as events:
        for event in events:          # blocks; ends when closed
            event.type, event.key, event.value, event.mod_revision, event.prev

It uses etcd's Watch service (any member serves it, from its applied state). The events of one
revision always arrive together, so after each response the watch knows every revision up to its
newest event is complete: when the stream breaks (the member died, the connection dropped, the
node restarted), it opens a new one on the next endpoint from the revision after that, so the
caller sees each change exactly once, in revision order. A start revision that was compacted
raises kv.errors.RevisionError, as etcd cancels such a watch."""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc

from kv.client.key_like import KeyLike, to_bytes
from kv.client.revisions import KeyValue
from kv.errors import PermissionDeniedError, RaftKVError, RevisionError, UnauthenticatedError
from raftkv_proto import etcd_mvcc_pb2 as mvccpb
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from raftkv_proto.key_ranges import prefix_end

# How long to wait before opening the stream again on the next endpoint, after a failure.
RETRY_PAUSE_S = 0.1


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change: a PUT (the key's new version) or a DELETE (the key, at the deleting revision)."""

    type: str  # "PUT" or "DELETE"
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    prev: KeyValue | None = None  # the version before the change, when asked for (prev_kv)

    @classmethod
    def of(cls, event: mvccpb.Event) -> WatchEvent:
        kv = event.kv
        prev = KeyValue.of(event.prev_kv) if event.HasField("prev_kv") else None
        kind = "DELETE" if event.type == mvccpb.Event.DELETE else "PUT"
        return cls(kind, kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, prev)


class Watch:
    """An open watch; iterate it for events, close it (or leave its `with`) to end it."""

    def __init__(self, endpoints: list[str], channel: Callable[[str], grpc.Channel],
                 metadata: Callable[[], Any], key: bytes, range_end: bytes, start_revision: int,
                 prev_kv: bool) -> None:
        self._endpoints = endpoints
        self._channel = channel
        self._metadata = metadata
        self._key, self._range_end, self._prev_kv = key, range_end, prev_kv
        self.next_revision = start_revision  # the first revision not yet delivered (0: from now)
        self._closed = threading.Event()
        self._call: Any = None
        self._lock = threading.Lock()
        self._target = 0

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def __iter__(self) -> Iterator[WatchEvent]:
        while not self._closed.is_set():
            try:
                yield from self._stream()
            except grpc.RpcError as e:
                if self._closed.is_set():
                    return
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    raise
            if not self._closed.is_set():
                self._target = (self._target + 1) % len(self._endpoints)  # the next member
                time.sleep(RETRY_PAUSE_S)

    def _stream(self) -> Iterator[WatchEvent]:
        stub = etcd_rpc_pb2_grpc.WatchStub(self._channel(self._endpoints[self._target]))
        create = pb.WatchCreateRequest(key=self._key, range_end=self._range_end, start_revision=self.next_revision,
                                       prev_kv=self._prev_kv)
        requests: queue.Queue[pb.WatchRequest | None] = queue.Queue()
        requests.put(pb.WatchRequest(create_request=create))
        with self._lock:
            if self._closed.is_set():
                return
            self._call = stub.Watch(iter(requests.get, None), metadata=self._metadata())
        try:
            for response in self._call:
                if response.canceled:
                    raise _cancelled(response, self.next_revision)
                if response.created and self.next_revision == 0:
                    self.next_revision = response.header.revision + 1  # "from now" is now fixed
                for event in response.events:
                    yield WatchEvent.of(event)
                if response.events:  # a revision's events all come in one response (no fragments asked)
                    self.next_revision = response.events[-1].kv.mod_revision + 1
        finally:
            requests.put(None)
            with self._lock:
                self._call.cancel()
                self._call = None


def watch_range(key: KeyLike | None, prefix: KeyLike | None, start: KeyLike | None,
                end: KeyLike | None) -> tuple[bytes, bytes]:
    """The (key, range_end) of etcd's WatchCreateRequest for one key, a prefix, or [start, end)
    (no end: to the last key)."""
    if sum(x is not None for x in (key, prefix, start)) != 1:
        raise ValueError("watch takes one of key, prefix or start (with end)")
    if key is not None:
        return to_bytes(key), b""
    if prefix is not None:
        first = to_bytes(prefix)
        return first or b"\0", prefix_end(first) or b"\0"
    return to_bytes(start), (to_bytes(end) if end is not None else b"\0")  # type: ignore[arg-type]


def _cancelled(response: pb.WatchResponse, needed: int) -> RaftKVError:
    """The error a watch the server cancelled stands for."""
    if response.compact_revision:
        return RevisionError(f"etcdserver: mvcc: required revision has been compacted (the watch needs revision "
                             f"{needed}; the oldest kept is {response.compact_revision})")
    if "permission denied" in response.cancel_reason:
        return PermissionDeniedError(response.cancel_reason)
    return UnauthenticatedError(response.cancel_reason or "the watch was cancelled")
