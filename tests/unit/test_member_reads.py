"""Reads served off the event loop (kv/server/kv_handler.py, decision 0073): etcd ranges and
read-only txns, native scans and change pages run one after another on the member's read thread,
never side by side on threads that would fight over the GIL."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from kv.server.kv_handler import KVHandler
from raftkv_proto import etcd_rpc_pb2 as etcd_pb
from raftkv_proto import kv_pb2
from statemachine.commands import encode_command, put_op
from statemachine.kv_state import KVStateMachine
from tests.unit.test_node import WAIT_S, Single, run


class Recorded:
    """Which threads a state machine's reads ran on, and how many ran at once at most."""

    def __init__(self, fsm: KVStateMachine) -> None:
        self.threads: set[str] = set()
        self.running = self.most = 0
        self._lock = threading.Lock()
        self._inside = threading.local()
        for name in ("etcd_range", "etcd_read_txn", "scan", "scan_prefix"):
            setattr(fsm, name, self._recorded(getattr(fsm, name)))

    def _recorded(self, read: Any) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._inside, "read", False):
                return read(*args, **kwargs)  # scan_prefix calls scan: one read
            self._inside.read = True
            with self._lock:
                self.threads.add(threading.current_thread().name)
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                threading.Event().wait(0.005)  # a read long enough for another to start beside it
                return read(*args, **kwargs)
            finally:
                self._inside.read = False
                with self._lock:
                    self.running -= 1
        return recorded


def test_concurrent_lists_run_one_after_another_on_the_read_thread(tmp_path: Path) -> None:
    async def main() -> None:
        single = Single(tmp_path)
        async with single as node:
            await node.propose(encode_command([put_op(b"k/%03d" % i, b"v" * 100) for i in range(200)]))
            handler = KVHandler(node, single.fsm)
            recorded = Recorded(single.fsm)
            whole = etcd_pb.RangeRequest(key=b"k/", range_end=b"k0")
            txn = etcd_pb.TxnRequest(success=[etcd_pb.RequestOp(request_range=whole)])
            replies = await asyncio.gather(
                *(handler.range(whole, WAIT_S) for _ in range(4)),
                *(handler.read_txn(txn, WAIT_S) for _ in range(2)),
                *(handler.scan(kv_pb2.ScanRequest(prefix=b"k/", limit=1000), WAIT_S) for _ in range(2)),
                handler.scan(kv_pb2.ScanRequest(start=b"k/", end=b"k0", limit=1000), WAIT_S))
            assert [len(r.kvs) for r in replies[:4]] == [200] * 4
            assert [len(r.responses[0].response_range.kvs) for r in replies[4:6]] == [200] * 2
            assert [len(kv_pb2.ScanResponse.FromString(r).items) for r in replies[6:]] == [200] * 3  # wire bytes
            assert recorded.threads == {"raftkv-reads"}
            assert recorded.most == 1
            await handler.close()
    run(main)
