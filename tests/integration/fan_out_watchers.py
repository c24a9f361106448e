"""A client that watches a prefix many times over on one member, for the fan-out test
(tests/integration/test_hostile_clients.py), run as a process of its own so that receiving a
million events does not share the test's interpreter:

    python -m tests.integration.fan_out_watchers ADDRESS STREAMS WATCHES PREFIX EVENTS

Opens STREAMS Watch streams, each with WATCHES watches of PREFIX from now, prints "ready" once every
watch is created, then "done N" once every watch has had EVENTS events (N: the events received),
or "short N" when a stream ended before."""
from __future__ import annotations

import asyncio
import sys

import grpc

from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from raftkv_proto.key_ranges import prefix_end

STREAMS_PER_CHANNEL = 50


async def watch_all(address: str, streams: int, watches: int, prefix: bytes, events: int) -> None:
    channels = [grpc.aio.insecure_channel(address) for _ in range(-(-streams // STREAMS_PER_CHANNEL))]
    created = received = 0
    finished = asyncio.Event()

    async def requests() -> object:
        for _ in range(watches):
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=prefix, range_end=prefix_end(prefix)))
        await finished.wait()

    async def follow(i: int) -> None:
        nonlocal created, received
        call = etcd_rpc_pb2_grpc.WatchStub(channels[i % len(channels)]).Watch(requests())
        async for response in call:
            if response.created:
                created += 1
                if created == streams * watches:
                    print("ready", flush=True)
            received += len(response.events)
            if received == streams * watches * events:
                finished.set()
    tasks = [asyncio.create_task(follow(i)) for i in range(streams)]
    ended = asyncio.create_task(asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION))
    await asyncio.wait([asyncio.create_task(finished.wait()), ended], return_when=asyncio.FIRST_COMPLETED)
    print(f"{'done' if finished.is_set() else 'short'} {received}", flush=True)
    for task in tasks:
        task.cancel()


if __name__ == "__main__":
    address, streams, watches, prefix, events = sys.argv[1:]
    asyncio.run(watch_all(address, int(streams), int(watches), prefix.encode(), int(events)))
