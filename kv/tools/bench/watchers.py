"""W14's watchers, in a process of their own (`python -m kv.tools.bench.watchers CONFIG_JSON`), so
that receiving a million events a second does not take the writer's interpreter lock.

Each stream is one client: its own channel to one member, one Watch stream carrying several
watches on the same prefix, as etcd's clientv3 multiplexes a client's watches over one stream.
Every event's value is a put's sequence number and send time (time.monotonic_ns, the same clock
in every process of this machine); each event's delivery latency is its receive time (when the
response reached this process) minus that send time.

Per watch the process counts the events, checks their mod revisions only increase and that each
is a put into the prefix, and folds the sequence numbers in arrival order into an order-sensitive
hash: the bench compares it with the hash of the puts in the order of the revisions the writer was
acknowledged, so a watch that missed, repeated or reordered one event does not match.

Protocol (one JSON object a line on stdout; commands on stdin):
  -> {"ready": watches}                 every watch is created
  <- {"events": N, "drain_s": S}        the writer is done: wait until every watch has N events
                                        (at most S seconds more)
  -> {"done": true, "complete": bool}   as soon as every watch has N events, or S ran out
  -> {...}                              the result: counts, hashes, errors, latency quantiles
"""
from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
from array import array
from collections.abc import Iterable
from typing import Any

import grpc

from kv.client.client import CHANNEL_OPTIONS
from kv.client.tls import TLS
from raftkv_proto import etcd_mvcc_pb2 as mvccpb
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc as pb_grpc

# A put's value: its sequence number and its send time (monotonic ns).
VALUE = struct.Struct(">QQ")
HASH_MULTIPLIER = 1_000_003
HASH_MASK = (1 << 61) - 1
# Latency quantiles sent back (QUANTILES + 1 points, the first the minimum, the last the maximum).
QUANTILES = 10_000
CHECK_S = 0.02
CREATE_TIMEOUT_S = 60.0


def order_hash(seqs: Iterable[int]) -> int:
    """The hash a watch that received exactly the puts `seqs`, in this order, ends with."""
    h = 0
    for seq in seqs:
        h = (h * HASH_MULTIPLIER + seq + 1) & HASH_MASK
    return h


def quantile_points(values: list[int] | array, points: int = QUANTILES) -> list[int]:
    """`points` + 1 values at evenly spaced ranks of `values` (nearest rank; [] for none)."""
    if not values:
        return []
    ordered = sorted(values)
    last = len(ordered) - 1
    return [ordered[round(i * last / points)] for i in range(points + 1)]


def merged_percentile(sketches: list[tuple[int, list[int]]], p: float) -> float:
    """The p-th percentile (0..100) of the values behind several (count, quantile_points) sketches,
    each point weighing count / len(points); accurate to 1/QUANTILES of the ranks."""
    weighted = sorted((value, count / len(points)) for count, points in sketches if points for value in points)
    if not weighted:
        return 0.0
    total = sum(w for _, w in weighted)
    wanted, seen = p / 100.0 * total, 0.0
    for value, weight in weighted:
        seen += weight
        if seen >= wanted - 1e-9:
            return float(value)
    return float(weighted[-1][0])


class _Watch:
    __slots__ = ("endpoint", "watch_id", "count", "hash", "last_revision", "error")

    def __init__(self, endpoint: str, watch_id: int) -> None:
        self.endpoint = endpoint
        self.watch_id = watch_id
        self.count = 0
        self.hash = 0
        self.last_revision = 0
        self.error: str | None = None


class _Watchers:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.prefix = config["prefix"].encode()
        self.watches: list[_Watch] = []
        self.latencies: dict[str, array] = {}  # by endpoint
        self.first_ns = 0
        self.last_ns = 0
        self.stream_errors: list[str] = []
        self.expected: int | None = None

    async def run(self) -> None:
        tls = self.config.get("tls")
        credentials = TLS(*tls).credentials() if tls else None
        calls, channels = [], []
        try:
            for endpoint, watches in self.config["streams"]:
                channel = (grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS) if credentials is None
                           else grpc.aio.secure_channel(endpoint, credentials, options=CHANNEL_OPTIONS))
                channels.append(channel)
                calls.append((endpoint, watches, pb_grpc.WatchStub(channel).Watch()))
            created = await asyncio.wait_for(asyncio.gather(*(self._create(e, n, c) for e, n, c in calls)),
                                             CREATE_TIMEOUT_S)
            _say({"ready": len(self.watches)})
            readers = [asyncio.create_task(self._consume(endpoint, call, mine))
                       for (endpoint, _, call), mine in zip(calls, created)]
            command = json.loads(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
            self.expected = command["events"]
            complete = await self._drained(command["drain_s"])
            _say({"done": True, "complete": complete})
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        finally:
            for _, _, call in calls:
                call.cancel()
            for channel in channels:
                await channel.close()
        _say(self.result())

    async def _create(self, endpoint: str, watches: int, call: grpc.aio.StreamStreamCall) -> dict[int, _Watch]:
        """`watches` watches on the prefix, from the next revision on; {watch id: its state}."""
        request = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=self.prefix,
                                                                       range_end=prefix_end(self.prefix)))
        mine: dict[int, _Watch] = {}
        for _ in range(watches):
            await call.write(request)
            response = await call.read()
            if response is grpc.aio.EOF or not response.created or response.canceled:
                raise RuntimeError(f"watch on {endpoint} not created: {response}")
            watch = _Watch(endpoint, response.watch_id)
            mine[response.watch_id] = watch
            self.watches.append(watch)
        return mine

    async def _consume(self, endpoint: str, call: grpc.aio.StreamStreamCall, watches: dict[int, _Watch]) -> None:
        append = self.latencies.setdefault(endpoint, array("q")).append
        unpack = VALUE.unpack
        clock = time.monotonic_ns
        put = mvccpb.Event.PUT
        prefix = self.prefix
        try:
            while True:
                response = await call.read()
                now = clock()
                if response is grpc.aio.EOF:
                    self.stream_errors.append(f"{endpoint}: the stream ended")
                    return
                watch = watches.get(response.watch_id)
                if watch is None or response.canceled:
                    self.stream_errors.append(f"{endpoint}: unexpected response {str(response)[:200]!r}")
                    continue
                if not response.events:
                    continue  # a progress notification
                count, h, last = watch.count, watch.hash, watch.last_revision
                for event in response.events:
                    kv = event.kv
                    revision = kv.mod_revision
                    if revision <= last or event.type != put or not kv.key.startswith(prefix):
                        if watch.error is None:
                            watch.error = (f"event #{count + 1}: {kv.key!r} at revision {revision} "
                                           f"(type {event.type}) after revision {last}")
                    seq, sent = unpack(kv.value)
                    last = revision
                    h = (h * HASH_MULTIPLIER + seq + 1) & HASH_MASK
                    count += 1
                    append(now - sent)
                watch.count, watch.hash, watch.last_revision = count, h, last
                if not self.first_ns:
                    self.first_ns = now
                self.last_ns = now
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as error:
            self.stream_errors.append(f"{endpoint}: {error.code().name} {error.details()}")

    async def _drained(self, drain_s: float) -> bool:
        """Wait until every watch has every put (True), or `drain_s` passes (False)."""
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline:
            if self._complete():
                return True
            await asyncio.sleep(CHECK_S)  # the consumers are on this loop: poll their counts
        return self._complete()

    def _complete(self) -> bool:
        assert self.expected is not None
        return all(w.count >= self.expected for w in self.watches)

    def result(self) -> dict[str, Any]:
        return {
            "watches": [[w.endpoint, w.watch_id, w.count, w.hash, w.error] for w in self.watches],
            "events": sum(len(values) for values in self.latencies.values()),
            # By endpoint: [events, quantile points] of the latencies of the events it delivered.
            "latencies": {endpoint: [len(values), quantile_points(values)]
                          for endpoint, values in self.latencies.items()},
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            "stream_errors": self.stream_errors[:20],
            "cpu_s": time.process_time(),
        }


def prefix_end(prefix: bytes) -> bytes:
    """etcd's range end of a prefix: the prefix with its last byte incremented."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    config = json.loads((argv if argv is not None else sys.argv[1:])[0])
    asyncio.run(_Watchers(config).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
