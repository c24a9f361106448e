"""kv.aio.Client.watch: kv.Client.watch's iterator (kv/client/watch.py) as an async iterator, with
its algorithm: etcd's Watch stream from the first revision not yet delivered; the events of one
revision come in one response, so after each response every revision up to its last event is
complete, and when the stream breaks the watch opens another on the next member from the
revision after that. Each change once, in revision order.

    async with client.watch(prefix="cfg/", start_revision=await client.revision() + 1) as events:
        async for event in events:        # waits; ends when closed
            event.type, event.key, event.value, event.mod_revision, event.prev
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from kv.client.watch import RETRY_PAUSE_S, WatchEvent, _cancelled
from kv.errors import from_rpc_error
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc

__all__ = ["Watch", "WatchEvent"]


class Watch:
    """An open watch; iterate it with `async for`, close it (or leave its `async with`) to end it."""

    def __init__(self, endpoints: list[str], channel: Callable[[str], grpc.aio.Channel],
                 metadata: Callable[[], Awaitable[Any]], key: bytes, range_end: bytes, start_revision: int,
                 prev_kv: bool) -> None:
        self._endpoints = endpoints
        self._channel = channel
        self._metadata = metadata
        self._key, self._range_end, self._prev_kv = key, range_end, prev_kv
        self.next_revision = start_revision  # the first revision not yet delivered (0: from now)
        self._closed = False
        self._call: Any = None
        self._target = 0

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """End the watch: an iteration under way ends (from any task of the loop)."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        while not self._closed:
            try:
                async for event in self._stream():
                    yield event
            except grpc.RpcError as e:
                if self._closed:
                    return
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    raise from_rpc_error(e) from None
            except asyncio.CancelledError:
                # grpc.aio ends a read on a call cancelled here (close()) so; a cancelled task goes on.
                current = asyncio.current_task()
                if self._closed and (current is None or not current.cancelling()):
                    return
                raise
            if not self._closed:
                self._target = (self._target + 1) % len(self._endpoints)  # the next member
                await asyncio.sleep(RETRY_PAUSE_S)

    async def _stream(self) -> AsyncIterator[WatchEvent]:
        stub = etcd_rpc_pb2_grpc.WatchStub(self._channel(self._endpoints[self._target]))
        metadata = await self._metadata()
        if self._closed:
            return
        create = pb.WatchCreateRequest(key=self._key, range_end=self._range_end, start_revision=self.next_revision,
                                       prev_kv=self._prev_kv)
        call = self._call = stub.Watch(metadata=metadata)
        try:
            await call.write(pb.WatchRequest(create_request=create))
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return
                if response.canceled:
                    raise _cancelled(response, self.next_revision)
                if response.created and self.next_revision == 0:
                    self.next_revision = response.header.revision + 1  # "from now" is now fixed
                for event in response.events:
                    yield WatchEvent.of(event)
                if response.events:  # a revision's events all come in one response (no fragments asked)
                    self.next_revision = response.events[-1].kv.mod_revision + 1
        finally:
            call.cancel()
            self._call = None
