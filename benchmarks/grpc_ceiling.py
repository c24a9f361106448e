"""How many unary calls per second can any Python gRPC server take on this machine? An echo
server with no Raft and no storage, set up as a raftkv node is (grpc.aio on uvloop when it is
installed, gRPC's polling I/O manager, NodeConfig.grpc_servers servers on one port), under the
bench's own closed-loop clients (`kv.tools.bench.measure`, kv.Client's channel options, one connection
per client). Not a test; run it by hand:

    python benchmarks/grpc_ceiling.py [--seconds 5] [--clients 1,16] [--payload 256]

It prints calls/s, p50 latency and the CPU each process spends per call. The 16-client figure is
a ceiling for W2 and W4 (each put or get is one such call on the leader, plus the Raft work), and
the 1-client p50 is the floor of W1 and W3's latency before a single Raft message is sent (README,
Performance).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from kv.tools.grpc_io import prefer_polling_io_manager  # noqa: E402  (before grpc is imported)

prefer_polling_io_manager()

import grpc  # noqa: E402

from kv.tools.bench.cpu import process_cpu_s  # noqa: E402
from kv.tools.bench.measure import closed_loop  # noqa: E402
from kv.client.client import CHANNEL_OPTIONS  # noqa: E402
from kv.tools.cluster_up import free_ports  # noqa: E402
from kv.server.server import event_loop_factory  # noqa: E402
from raft.node.config import NodeConfig  # noqa: E402

METHOD = "/ceiling.Echo/Call"


def serve(port: int, servers: int) -> None:
    """The echo server: `servers` grpc.aio servers sharing `port` (SO_REUSEPORT), as a node's are."""
    echo = grpc.unary_unary_rpc_method_handler(_echo)
    handler = grpc.method_handlers_generic_handler("ceiling.Echo", {"Call": echo})

    async def main() -> None:
        group = [grpc.aio.server(options=[("grpc.so_reuseport", 1)]) for _ in range(servers)]
        for server in group:
            server.add_generic_rpc_handlers((handler,))
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
        await group[0].wait_for_termination()

    with asyncio.Runner(loop_factory=event_loop_factory("auto")) as runner:
        runner.run(main())


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


@dataclass(frozen=True, slots=True)
class Figures:
    clients: int
    calls_per_s: float
    p50_ms: float
    server_cpu_ms: float
    client_cpu_ms: float


def measure(port: int, server_pid: int, clients: int, payload: bytes, seconds: float) -> Figures:
    channels = [grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) for _ in range(clients)]
    try:
        for channel in channels:
            grpc.channel_ready_future(channel).result(timeout=10)
        calls = [channel.unary_unary(METHOD) for channel in channels]
        operations = [lambda i, call=call: call(payload, timeout=5) for call in calls]
        warmup_s = 1.0
        before = process_cpu_s(server_pid), process_cpu_s(os.getpid())
        result = closed_loop(operations, duration_s=seconds, warmup_s=warmup_s)
        after = process_cpu_s(server_pid), process_cpu_s(os.getpid())
    finally:
        for channel in channels:
            channel.close()
    # CPU was counted over the warm-up too: divide by the calls made in the whole run.
    all_calls = result.ops_per_s * (seconds + warmup_s)
    return Figures(clients, result.ops_per_s, result.percentile_ms(50),
                   1000 * (after[0] - before[0]) / all_calls, 1000 * (after[1] - before[1]) / all_calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", default="1,16", help="comma-separated client counts (default 1,16)")
    parser.add_argument("--payload", type=int, default=256, help="bytes per request and reply (default 256)")
    servers = NodeConfig().tuning.grpc_servers
    parser.add_argument("--servers", type=int, default=servers,
                        help=f"gRPC servers on the port (default {servers}, as a node)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.servers)
        return
    port = free_ports(1)[0]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--servers", str(args.servers)])
    try:
        print(f"{'clients':>7} {'calls/s':>9} {'p50 ms':>7} {'server CPU ms/call':>19} {'client CPU ms/call':>19}")
        for clients in (int(c) for c in args.clients.split(",")):
            f = measure(port, server.pid, clients, b"v" * args.payload, args.seconds)
            print(f"{f.clients:>7} {f.calls_per_s:>9,.0f} {f.p50_ms:>7.2f} {f.server_cpu_ms:>19.3f} {f.client_cpu_ms:>19.3f}")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
