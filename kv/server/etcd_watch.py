"""etcd's Watch service (a bidirectional stream) on a node's client port, as etcd 3.4's
etcdserver/api/v3rpc/watch.go serves it, over the node's WatchHub (kv/server/watch_hub.py).

On one stream: create requests (key, range_end with etcd's conventions, start_revision, filters,
prev_kv, progress_notify, fragment, watch_id or one the stream assigns from 0 up), cancel requests
and progress requests. A watch is answered "created" before any of its events; the events of one
revision are never split over responses (unless the watch asked for fragments of a response over
--max-request-bytes); a watch whose start revision was compacted gets compact_revision and is
cancelled. Any member serves watches from its own applied state."""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from kv import errors
from kv.server.etcd_checks import EtcdError
from kv.server.etcd_face import EtcdFace, etcd_error, go_error_text
from kv.server.watch_hub import WatchHub, Watcher
from raftkv_proto import etcd_mvcc_pb2 as mvccpb
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from raftkv_proto.wire import length_prefixed, varint
from statemachine.auth_state import permission_range
from statemachine.etcd_txn import to_proto
from statemachine.mvcc import Change

# etcd's default progress notification interval (--experimental-watch-progress-notify-interval).
PROGRESS_INTERVAL_S = 600.0
# Responses a stream may hold unsent (or bytes of their events) before its watchers stop taking
# changes from the hub and catch up from the store at the stream's pace instead.
MAX_QUEUED_RESPONSES = 64
MAX_QUEUED_EVENT_BYTES = 4 << 20
# A watch response's header and watch id, at most: events join a queued response only while it
# stays under the stream's response limit (it is never fragmented afterwards).
_RESPONSE_FRAME_BYTES = 64
INVALID_WATCH_ID = -1
DUPLICATE_WATCH_ID = "mvcc: duplicate watch ID provided on the WatchStream"
# Encoded events kept for the watches that deliver the same change (about one revision's worth
# for each watch on a busy prefix): up to this many changes or this many bytes (values may be
# large), then dropped all at once.
ENCODED_EVENTS_KEPT = 4096
ENCODED_EVENTS_KEPT_BYTES = 16 << 20


class EtcdWatchServicer(etcd_rpc_pb2_grpc.WatchServicer):
    def __init__(self, face: EtcdFace, hub: WatchHub, max_response_bytes: int,
                 progress_interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self._face = face
        self._hub = hub
        self._max_response_bytes = max_response_bytes
        self._progress_interval_s = progress_interval_s
        self._encoder = EventEncoder(face)

    async def Watch(self, requests: AsyncIterator[pb.WatchRequest],
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WatchResponse | bytes]:
        stream = _WatchStream(self._face, self._hub, context, self._max_response_bytes, self._encoder)
        reader = asyncio.create_task(stream.read(requests))
        progress = asyncio.create_task(stream.notify_progress(self._progress_interval_s))
        try:
            while True:
                yield await stream.next_response()
        finally:
            reader.cancel()
            progress.cancel()
            stream.close()


@dataclass(eq=False)
class _Watch:
    watch_id: int
    watcher: Watcher
    filters: frozenset[int]
    prev_kv: bool
    fragment: bool
    progress_notify: bool
    quiet: bool = True  # no events sent since the last progress notification


class EventEncoder:
    """A watch response's bytes built from parts encoded once and shared: each change's event
    (with and without its previous version) and each revision's header. A put on a prefix that
    340 watches on this member follow is encoded once, not 340 times (etcd, too, builds a
    revision's events once for all its watchers). The handler sends the bytes as they are
    (kv/server/input_checks.py lets a response be bytes)."""

    def __init__(self, face: EtcdFace) -> None:
        self._face = face
        self._events: dict[tuple[int, int, bool], bytes] = {}
        self._events_bytes = 0
        self._header: tuple[int, int, bytes] = (-1, -1, b"")
        self._last_events: tuple[list[Change] | None, bool, frozenset[int], list[bytes]] = \
            (None, False, frozenset(), [])

    def response(self, watch_id: int, revision: int, events: list[bytes]) -> bytes:
        """A WatchResponse: the header at `revision`, `watch_id`, then the encoded `events`
        (fields may come in any order on the wire; these come in field-number order, as
        SerializeToString writes them)."""
        watch_field = _WATCH_ID_TAG + varint(watch_id) if watch_id else b""
        return b"".join((self._header_field(revision), watch_field, *events))

    def events(self, changes: list[Change], with_prev: bool, filters: frozenset[int]) -> list[bytes]:
        """The encoded events of `changes` a watch with `filters` gets. The hub hands the watches
        of one range the same list, one watch after another: their events are built once."""
        last_changes, last_prev, last_filters, encoded = self._last_events
        if changes is last_changes and with_prev == last_prev and filters == last_filters:
            return encoded
        no_delete = pb.WatchCreateRequest.NODELETE in filters
        no_put = pb.WatchCreateRequest.NOPUT in filters
        encoded = [self.event(change, with_prev) for change in changes
                   if not (no_delete if change.kv.tombstone else no_put)]
        self._last_events = (changes, with_prev, filters, encoded)
        return encoded

    def event(self, change: Change, with_prev: bool) -> bytes:
        """The event field (tag and length included) of `change`, with its previous version
        when `with_prev` and etcd gives one (not for a creation)."""
        kv = change.kv
        key = (kv.mod_revision, kv.mod_sub, with_prev)  # (mod_revision, mod_sub) names one change
        encoded = self._events.get(key)
        if encoded is None:
            encoded = _EVENTS_TAG + length_prefixed(event_message(change, with_prev).SerializeToString())
            if len(self._events) >= ENCODED_EVENTS_KEPT or self._events_bytes + len(encoded) > ENCODED_EVENTS_KEPT_BYTES:
                self._events.clear()
                self._events_bytes = 0
            self._events[key] = encoded
            self._events_bytes += len(encoded)
        return encoded

    def _header_field(self, revision: int) -> bytes:
        term = self._face.node.core.term
        cached_revision, cached_term, encoded = self._header
        if (cached_revision, cached_term) != (revision, term):
            header = pb.ResponseHeader()
            self._face.header(header, revision)
            encoded = _HEADER_TAG + length_prefixed(header.SerializeToString())
            self._header = (revision, term, encoded)
        return encoded


def event_message(change: Change, with_prev: bool) -> mvccpb.Event:
    """`change` as etcd's watch event."""
    kv = change.kv
    if kv.tombstone:
        event = mvccpb.Event(type=mvccpb.Event.DELETE, kv=mvccpb.KeyValue(key=kv.key, mod_revision=kv.mod_revision))
    else:
        event = mvccpb.Event(type=mvccpb.Event.PUT, kv=to_proto(kv))
    # etcd looks up no previous version for a creation.
    if with_prev and change.prev is not None and kv.create_revision != kv.mod_revision:
        event.prev_kv.CopyFrom(to_proto(change.prev))
    return event


# WatchResponse's fields as etcd's rpc.proto numbers them: header 1, watch_id 2, events 11.
_HEADER_TAG = bytes([1 << 3 | 2])
_WATCH_ID_TAG = bytes([2 << 3 | 0])
_EVENTS_TAG = bytes([11 << 3 | 2])


@dataclass(eq=False)
class _Events:
    """A watch's events not yet sent, of one or more revisions: while the stream waits to send,
    later revisions' events join the same response (etcd, too, sends a watcher that fell behind
    many revisions in one response). One response then carries what would have been many, and a
    member fanning out a busy prefix sends, and waits on, as many messages as its streams can take
    rather than one per watch per revision."""

    watch_id: int
    revision: int  # the response's header: the last revision whose events it holds
    events: list[bytes]  # encoded, shared with every watch that has the same event (EventEncoder)
    size: int


class _WatchStream:
    def __init__(self, face: EtcdFace, hub: WatchHub, context: grpc.aio.ServicerContext,
                 max_response_bytes: int, encoder: EventEncoder) -> None:
        self._face = face
        self._hub = hub
        self._context = context
        self._max_bytes = max_response_bytes
        self._encoder = encoder
        # Responses in the order they go out; a watch's _Events stays open to more events (in
        # `_open`) until it is sent or another response is queued after it, so no event ever
        # overtakes a response queued before it (created, cancelled, progress).
        self._queue: deque[_Events | pb.WatchResponse] = deque()
        self._open: dict[int, _Events] = {}
        self._queued_bytes = 0
        self._queued = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._watches: dict[int, _Watch] = {}
        self._next_id = 0

    # ---- the stream's responses --------------------------------------------------------------

    async def next_response(self) -> pb.WatchResponse | bytes:
        while not self._queue:
            self._queued.clear()
            await self._queued.wait()
        item = self._queue.popleft()
        if isinstance(item, _Events):
            if self._open.get(item.watch_id) is item:
                del self._open[item.watch_id]
            self._queued_bytes -= item.size
            response: pb.WatchResponse | bytes = self._encoder.response(item.watch_id, item.revision, item.events)
        else:
            response = item
        if len(self._queue) < MAX_QUEUED_RESPONSES // 2 and self._queued_bytes < MAX_QUEUED_EVENT_BYTES // 2:
            self._room.set()
        return response

    def _send(self, response: pb.WatchResponse) -> None:
        self._open.clear()  # what is queued from now on goes after it
        self._enqueue(response)

    def _send_events(self, watch_id: int, revision: int, events: list[bytes]) -> None:
        size = sum(map(len, events))
        pending = self._open.get(watch_id)
        if pending is not None and pending.size + size + _RESPONSE_FRAME_BYTES < self._max_bytes:
            pending.events.extend(events)
            pending.revision = revision
            pending.size += size
            self._queued_bytes += size
        else:
            pending = self._open[watch_id] = _Events(watch_id, revision, list(events), size)
            self._queued_bytes += size
            self._enqueue(pending)
        if self._queued_bytes >= MAX_QUEUED_EVENT_BYTES:
            self._room.clear()

    def _enqueue(self, item: _Events | pb.WatchResponse) -> None:
        self._queue.append(item)
        self._queued.set()
        if len(self._queue) >= MAX_QUEUED_RESPONSES:
            self._room.clear()

    def _response(self, revision: int, watch_id: int, **fields: object) -> pb.WatchResponse:
        response = pb.WatchResponse(watch_id=watch_id, **fields)  # type: ignore[arg-type]
        self._face.header(response.header, revision)
        return response

    def close(self) -> None:
        for watch in self._watches.values():
            self._hub.remove(watch.watcher)
        self._watches.clear()

    # ---- requests ----------------------------------------------------------------------------

    async def read(self, requests: AsyncIterator[pb.WatchRequest]) -> None:
        """Handle requests until the client stops sending (the stream stays open for what its
        watches deliver, as etcd's)."""
        async for request in requests:
            kind = request.WhichOneof("request_union")
            if kind == "create_request":
                self._create(request.create_request)
            elif kind == "cancel_request":
                self._cancel(request.cancel_request.watch_id)
            elif kind == "progress_request":
                self._send(self._response(self._delivered_through(), INVALID_WATCH_ID))

    def _delivered_through(self) -> int:
        """The revision through which every watch of this stream has had its events queued before
        this response: what a progress response may report (etcd once answered with its store's
        revision while a watch still had events of it to send: etcd issue 15220). A watch that is catching up holds it back; the member's applied revision, which the hub has
        not read yet, never counts."""
        through = self._hub.revision
        for watch in self._watches.values():
            through = min(through, watch.watcher.next_revision - 1)
        return through

    def _create(self, create: pb.WatchCreateRequest) -> None:
        revision = self._face.fsm.revision
        key = create.key or b"\0"  # etcd: the smallest key
        refusal = self._refusal(key, create.range_end)
        if refusal is not None:
            self._send(self._response(revision, INVALID_WATCH_ID, created=True, canceled=True, cancel_reason=refusal))
            return
        watch_id = create.watch_id
        if watch_id == 0:
            while self._next_id in self._watches:
                self._next_id += 1
            watch_id = self._next_id
            self._next_id += 1
        elif watch_id in self._watches:
            self._send(self._response(revision, INVALID_WATCH_ID, created=True, canceled=True,
                                      cancel_reason=DUPLICATE_WATCH_ID))
            return
        if not create.range_end:
            end: bytes | None = key + b"\0"
        elif create.range_end == b"\0":
            end = None
        else:
            end = create.range_end
        watcher = Watcher(
            key, end, create.start_revision or revision + 1, create.prev_kv,
            deliver=lambda changes, through: self._deliver(watch, changes, through),
            compacted=lambda compacted: self._compacted(watch, compacted),
            behind=lambda: not self._room.is_set(), room=lambda: self._room)
        watch = _Watch(watch_id, watcher, frozenset(create.filters), create.prev_kv, create.fragment,
                       create.progress_notify)
        self._watches[watch_id] = watch
        self._send(self._response(revision, watch_id, created=True))  # before any of its events
        self._hub.add(watch.watcher)

    def _refusal(self, key: bytes, range_end: bytes) -> str | None:
        """Why the caller may not watch [key, range_end), or None: etcd's cancel reason, its gRPC
        error as Go prints it ("rpc error: code = PermissionDenied desc = ...")."""
        gate = self._face.gate
        try:
            gate.check_read(gate.caller(self._context), permission_range(key, range_end))
        except errors.RaftKVError as e:
            error = etcd_error(e)
            assert isinstance(error, EtcdError)
            return go_error_text(error)
        return None

    def _cancel(self, watch_id: int) -> None:
        watch = self._watches.pop(watch_id, None)
        if watch is None:
            return  # etcd answers nothing for a watch it does not have
        self._hub.remove(watch.watcher)
        self._send(self._response(self._face.fsm.revision, watch_id, canceled=True))

    # ---- what the hub delivers ---------------------------------------------------------------

    def _deliver(self, watch: _Watch, changes: list[Change], revision: int) -> None:
        events = self._encoder.events(changes, watch.prev_kv, watch.filters)
        if not events:
            return
        watch.quiet = False
        if watch.fragment and len(events) > 1:
            response = self._encoder.response(watch.watch_id, revision, events)
            if len(response) >= self._max_bytes:
                for part in _fragments(pb.WatchResponse.FromString(response), self._max_bytes):
                    self._send(part)
                return
        self._send_events(watch.watch_id, revision, events)

    def _compacted(self, watch: _Watch, compacted: int) -> None:
        self._watches.pop(watch.watch_id, None)
        self._send(self._response(self._face.fsm.revision, watch.watch_id, compact_revision=compacted,
                                  canceled=True))

    async def notify_progress(self, interval_s: float) -> None:
        """Every `interval_s`, a watch that asked for progress notifications and got no event since
        the last one is told the revision it is synced to (etcd's progress_notify)."""
        while True:
            await asyncio.sleep(interval_s)
            for watch in list(self._watches.values()):
                if watch.progress_notify and watch.quiet and not watch.watcher.removed \
                        and watch.watcher.next_revision > self._hub.revision:
                    self._send(self._response(self._hub.revision, watch.watch_id))
                watch.quiet = True


def _fragments(response: pb.WatchResponse, max_bytes: int) -> list[pb.WatchResponse]:
    """etcd's sendFragments: the events in responses of at most `max_bytes` each (one event at
    least), each marked fragment but the last."""
    parts: list[pb.WatchResponse] = []
    events = list(response.events)
    index = 0
    while index < len(events):
        part = pb.WatchResponse(header=response.header, watch_id=response.watch_id, fragment=True)
        while index < len(events):
            part.events.append(events[index])
            if len(part.events) > 1 and part.ByteSize() >= max_bytes:
                del part.events[-1]
                break
            index += 1
        parts.append(part)
    parts[-1].fragment = False
    return parts
