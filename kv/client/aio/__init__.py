"""The asyncio client (grpc.aio): `Client` (client.py) with kv.Client's methods, awaited, its
watches (watch.py), leases (lease.py) and the locks and elections of kv.concurrency
(concurrency.py). Public as `kv.aio` and `kv.aio.concurrency`."""
