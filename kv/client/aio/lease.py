"""kv.aio.Client.lease: kv.Client.lease's lease (kv/client/lease.py), kept alive by an asyncio task.

    async with client.lease(ttl=10) as lease:        # granted, then renewed every third of its TTL
        await client.put("service/a", "10.0.0.1:80", lease=lease.id)
        ...
    # leaving the block revokes the lease: its keys go at once, in one revision

`lease = await client.lease(10)` grants it without a block; `await lease.close()` revokes it.
`lease.alive` turns False when a keep-alive finds the lease gone."""
from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import Any

import grpc.aio

from kv.client.lease import RENEW_FRACTION, time_to_live_dict
from kv.errors import NotFoundError, UnavailableError
from raftkv_proto import etcd_rpc_pb2 as pb_etcd


class Lease:
    """A lease, granted when first awaited or entered, then kept alive by a task until closed."""

    def __init__(self, ttl: int, grant: Callable[[int], Awaitable[tuple[int, int]]],
                 keep_alive: Callable[[int], Awaitable[int]], revoke: Callable[[int], Awaitable[None]]) -> None:
        self.id: int | None = None  # known once granted
        self.ttl = ttl  # the TTL asked for, then the one granted
        self.alive = False
        self._grant, self._keep_alive, self._revoke = grant, keep_alive, revoke
        self._granting = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> Lease:
        """Grant the lease (once) and start renewing it; returns the lease."""
        async with self._granting:
            if self.id is None:
                if self._closed:
                    raise RuntimeError("the lease is closed")
                self.id, self.ttl = await self._grant(self.ttl)
                self.alive = True
                self._task = asyncio.get_running_loop().create_task(self._renew(), name=f"raftkv-lease-{self.id:x}")
        return self

    def __await__(self) -> Generator[Any, None, Lease]:
        return self.start().__await__()

    async def _renew(self) -> None:
        assert self.id is not None
        while True:
            await asyncio.sleep(self.ttl / RENEW_FRACTION)
            try:
                if await self._keep_alive(self.id) == 0:
                    self.alive = False  # expired while unreachable, or revoked elsewhere
                    return
            except Exception:  # noqa: BLE001 - no member reachable now: the next round tries again
                continue

    async def close(self, revoke: bool = True) -> None:
        """Stop renewing; with `revoke`, revoke the lease now (its keys go at once)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # its end, without taking its cancellation for this task's
        if revoke and self.alive and self.id is not None:
            try:
                await self._revoke(self.id)
            except NotFoundError:
                pass  # gone already: an earlier attempt of this revoke was applied, or it expired
            self.alive = False

    async def __aenter__(self) -> Lease:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


class Leases:
    """Mixed into kv.aio.Client: etcd's lease calls (kv/client/lease.py), on its connections and retries."""

    _call: Callable[..., Any]
    _leases: weakref.WeakSet[Lease]  # those lease() made, stopped when the client closes

    async def lease_grant(self, ttl: int, lease_id: int = 0) -> tuple[int, int]:
        """A new lease of at least `ttl` seconds; (its id, its TTL)."""
        response = await self._call(lambda stub: stub.etcd_lease.LeaseGrant,
                                    pb_etcd.LeaseGrantRequest(TTL=ttl, ID=lease_id))
        return response.ID, response.TTL

    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke the lease: its keys are deleted at once, in one revision."""
        await self._call(lambda stub: stub.etcd_lease.LeaseRevoke, pb_etcd.LeaseRevokeRequest(ID=lease_id))

    async def lease_keep_alive(self, lease_id: int) -> int:
        """Renew the lease once; its TTL, 0 when it no longer exists."""
        return (await self._call(_keep_alive_once, pb_etcd.LeaseKeepAliveRequest(ID=lease_id))).TTL

    async def lease_time_to_live(self, lease_id: int, keys: bool = False) -> dict[str, Any]:
        """{"id", "ttl" (seconds left; -1: no such lease), "granted_ttl", "keys" (with `keys`)}."""
        return time_to_live_dict(await self._call(lambda stub: stub.etcd_lease.LeaseTimeToLive,
                                                  pb_etcd.LeaseTimeToLiveRequest(ID=lease_id, keys=keys)))

    async def leases(self) -> list[int]:
        """The ids of every lease the cluster holds."""
        response = await self._call(lambda stub: stub.etcd_lease.LeaseLeases, pb_etcd.LeaseLeasesRequest())
        return [status.ID for status in response.leases]

    def lease(self, ttl: int) -> Lease:
        """A lease kept alive by an asyncio task: `async with c.lease(10) as lease:` (revoked when
        the block ends), or `lease = await c.lease(10)` and later `await lease.close()`."""
        lease = Lease(ttl, self.lease_grant, self.lease_keep_alive, self.lease_revoke)
        self._leases.add(lease)
        return lease


def _keep_alive_once(stub: Any) -> Callable[..., Awaitable[pb_etcd.LeaseKeepAliveResponse]]:
    """etcd's LeaseKeepAlive stream as a unary call: one request, its one answer."""
    async def call(request: pb_etcd.LeaseKeepAliveRequest, **kwargs: Any) -> pb_etcd.LeaseKeepAliveResponse:
        stream = stub.etcd_lease.LeaseKeepAlive(**kwargs)
        try:
            await stream.write(request)
            response = await stream.read()
            if response is grpc.aio.EOF:
                raise UnavailableError("the keep-alive stream ended without an answer")
            return response
        finally:
            stream.cancel()
    return call
