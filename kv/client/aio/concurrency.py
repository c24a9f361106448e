"""kv.aio.concurrency: the locks and elections of kv.concurrency (kv/client/concurrency.py) on
kv.aio.Client, with the same key layout, transactions and algorithm (etcd's clientv3/concurrency),
so they contend with kv.concurrency's, etcdctl lock and etcdctl elect on the same names.

    from kv.aio.concurrency import Lock, Election
    async with Lock(client, "jobs/nightly") as held:   # waits until this task holds it
        held.revision                                  # the fencing revision
    election = Election(client, "scheduler")
    await election.campaign(b"node-a")                 # waits until node-a leads
    await election.leader(); await election.resign(); await election.close()
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import time
from types import TracebackType
from typing import TYPE_CHECKING

from kv.client.concurrency import (
    DEFAULT_TTL_S,
    ElectionError,
    campaign_ops,
    lock_ops,
    lock_position,
    participant_key,
    proclaim_ops,
    resign_ops,
)
from kv.client.key_like import KeyLike, to_bytes

if TYPE_CHECKING:
    from kv.client.aio.client import Client
    from kv.client.aio.lease import Lease

__all__ = ["Election", "ElectionError", "Lock", "Session", "wait_deletes"]


class Session:
    """A lease kept alive for the locks and elections made with it (etcd's concurrency.Session):
    granted when first awaited, entered or used."""

    def __init__(self, client: Client, ttl: int = DEFAULT_TTL_S) -> None:
        self.client = client
        self.lease: Lease = client.lease(ttl)

    async def start(self) -> Session:
        await self.lease.start()
        return self

    @property
    def lease_id(self) -> int:
        assert self.lease.id is not None, "the session's lease is not granted yet: await session.start()"
        return self.lease.id

    async def close(self) -> None:
        """Revoke the lease: every lock held and every campaign made with it ends."""
        await self.lease.close()

    async def __aenter__(self) -> Session:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


class Lock:
    """etcd's concurrency.Mutex. Without a session it makes one of its own (closed on release)."""

    def __init__(self, client: Client, name: KeyLike, session: Session | None = None, ttl: int = DEFAULT_TTL_S) -> None:
        self._client = client
        self._prefix = to_bytes(name) + b"/"
        self._session = session
        self._own_session = session is None
        self._ttl = ttl
        self.key: bytes | None = None
        self.revision = 0  # the fencing revision while held: this holder's key's create revision

    async def acquire(self, timeout: float | None = None) -> Lock:
        """Wait until held (TimeoutError after `timeout` seconds, the lock not taken)."""
        if self._session is None:
            self._session = Session(self._client, self._ttl)
        session = await self._session.start()
        key = participant_key(self._prefix, session.lease_id)
        try:
            result = await self._client.txn(*lock_ops(self._prefix, key, session.lease_id))
            self.key = key
            self.revision, behind = lock_position(result)
            if behind:
                await wait_deletes(self._client, self._prefix, self.revision - 1, timeout)
        except BaseException:
            await self.release()
            raise
        return self

    async def release(self) -> None:
        if self.key is not None:
            await self._client.delete(self.key)
            self.key = None
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Lock:
        return await self.acquire()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.release()


class Election:
    """etcd's concurrency.Election."""

    def __init__(self, client: Client, name: KeyLike, session: Session | None = None, ttl: int = DEFAULT_TTL_S) -> None:
        self._client = client
        self._prefix = to_bytes(name) + b"/"
        self._session = session or Session(client, ttl)
        self.key: bytes | None = None
        self.revision = 0  # the leader key's create revision while campaigning or leading

    async def campaign(self, value: KeyLike, timeout: float | None = None) -> None:
        """Wait until this participant leads with `value`."""
        session = await self._session.start()
        key = participant_key(self._prefix, session.lease_id)
        data = to_bytes(value, "value")
        result = await self._client.txn(*campaign_ops(key, data, session.lease_id))
        self.key, self.revision = key, result.revision
        if not result.succeeded:
            kept = result.responses[0][0]
            self.revision = kept.create_revision
            if kept.value != data:
                await self.proclaim(data)
        try:
            await wait_deletes(self._client, self._prefix, self.revision - 1, timeout)
        except BaseException:
            await self.resign()
            raise

    async def proclaim(self, value: KeyLike) -> None:
        """A new value from the leader, without another election (ElectionError if it is not)."""
        if self.key is None:
            raise ElectionError("not the leader of this election")
        result = await self._client.txn(*proclaim_ops(self.key, self.revision, value, self._session.lease_id))
        if not result.succeeded:
            self.key = None
            raise ElectionError("not the leader of this election")

    async def resign(self) -> None:
        """Stop leading (or campaigning): the next participant leads."""
        if self.key is not None:
            await self._client.txn(*resign_ops(self.key, self.revision))
            self.key = None

    async def leader(self) -> bytes | None:
        """The leader's value now, None when nobody leads."""
        kvs, _ = await self._client.get_range(self._prefix, sort_by="create", limit=1)
        return kvs[0].value if kvs else None

    async def observe(self) -> AsyncIterator[bytes]:
        """The leader's value now, then each time it changes (etcd's Observe), without end."""
        last: bytes | None = None
        while True:
            kvs, revision = await self._client.get_range(self._prefix, sort_by="create", limit=1)
            if kvs and kvs[0].value != last:
                last = kvs[0].value
                yield last
            async with self._client.watch(prefix=self._prefix, start_revision=revision + 1) as changes:
                await anext(aiter(changes))  # any change under the election's prefix: look again

    async def close(self) -> None:
        await self.resign()
        await self._session.close()


async def wait_deletes(client: Client, prefix: bytes, max_create_revision: int, timeout: float | None = None) -> None:
    """Return once every key under `prefix` created at or before `max_create_revision` is gone,
    watching only the newest of them each time (etcd's waitDeletes)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        kvs, revision = await client.get_range(prefix, sort_by="create", descending=True, limit=1,
                                               max_create_revision=max_create_revision)
        if not kvs:
            return
        await _wait_delete(client, kvs[0].key, revision, deadline)


async def _wait_delete(client: Client, key: bytes, revision: int, deadline: float | None) -> None:
    """Return once `key` is deleted at `revision` or later (TimeoutError at `deadline`)."""
    try:
        async with asyncio.timeout(None if deadline is None else max(0.0, deadline - time.monotonic())):
            async with client.watch(key=key, start_revision=revision) as watch:
                async for event in watch:
                    if event.type == "DELETE":
                        return
    except TimeoutError:
        pass
    raise TimeoutError("the lock or election was not won within the timeout")
