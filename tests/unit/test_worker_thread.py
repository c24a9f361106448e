"""WorkerThread runs calls in order on one thread of its own and answers through futures."""
from __future__ import annotations

import asyncio
import threading

import pytest

from raft.node.worker_thread import WorkerThread


def test_calls_run_in_order_on_the_worker_and_answer_with_results_and_errors() -> None:
    async def main() -> None:
        worker = WorkerThread("test-worker")
        seen: list[tuple[int, str]] = []

        def note(i: int) -> int:
            seen.append((i, threading.current_thread().name))
            return i * 10

        def broken() -> None:
            raise ValueError("no good")

        futures = [worker.run(note, i) for i in range(20)]
        failing = worker.run(broken)
        assert await asyncio.gather(*futures) == [i * 10 for i in range(20)]
        with pytest.raises(ValueError, match="no good"):
            await failing
        assert [i for i, _ in seen] == list(range(20))
        assert {name for _, name in seen} == {"test-worker"}
        await worker.close()
        assert not any(t.name == "test-worker" for t in threading.enumerate())
        with pytest.raises(RuntimeError, match="closed"):
            worker.run(note, 99)

    asyncio.run(main())


def test_a_cancelled_wait_leaves_the_call_running_and_close_waits_for_it() -> None:
    async def main() -> None:
        worker = WorkerThread("test-worker-2")
        release = threading.Event()
        done: list[bool] = []

        def slow() -> None:
            release.wait(10)
            done.append(True)

        waiting = worker.run(slow)
        waiting.cancel()  # the caller gives up; the worker's answer must not fail on it
        release.set()
        await worker.close()
        assert done == [True]
        assert not any(t.name == "test-worker-2" for t in threading.enumerate())

    asyncio.run(main())


def test_an_unused_worker_holds_no_thread() -> None:
    before = threading.active_count()
    worker = WorkerThread("never-used")
    assert threading.active_count() == before
    asyncio.run(worker.close())
