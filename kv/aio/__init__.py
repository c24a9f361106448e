"""`kv.aio`: raftkv's client on asyncio, for services on an event loop (FastAPI, aiohttp, ...).

    import kv.aio
    async with kv.aio.Client(["127.0.0.1:7001", "127.0.0.1:7002"], timeout=5.0) as c:
        await c.put("user/1", "alice")
        await c.get("user/1")                        # b"alice"
        async with c.lease(10) as lease:             # kept alive by a task
            await c.put("svc/a", "up", lease=lease.id)

kv.Client's methods, arguments, answers, kv.errors exceptions, retries and exactly-once writes;
its home is kv/client/aio/. Locks and elections: kv.aio.concurrency."""
from kv.client.aio.client import Client
from kv.client.aio.lease import Lease
from kv.client.aio.watch import Watch, WatchEvent
from kv.client.revisions import KeyValue, TxnResult
from kv.client.tls import TLS

__all__ = ["TLS", "Client", "KeyValue", "Lease", "TxnResult", "Watch", "WatchEvent"]
