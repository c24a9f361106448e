"""WorkerThread: one thread that runs a node's blocking calls (log writes, large applies) in the
order they were handed over, each answered through an asyncio future.

Why not `loop.run_in_executor` with a one-thread ThreadPoolExecutor: that builds a
concurrent.futures Future, a work item and an asyncio future chained to it for every call, and
goes through the executor's locks and idle-thread bookkeeping. A follower makes one such call for
every batch it receives (its log write), where the machinery cost 15 µs of CPU per call more than
a queue and one `call_soon_threadsafe` (52 against 37 µs a round trip, mostly the two wake-ups,
in a micro-benchmark on the bench machine).
"""
from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_STOP = object()


class WorkerThread:
    """The thread starts with the first call (a node that never writes holds none)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._closed = False

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Call `fn(*args)` on the thread, after everything handed over before; the future (of
        the running loop) resolves to its result or fails with its exception. RuntimeError once
        closed, as an executor's submit after shutdown."""
        if self._closed:
            raise RuntimeError(f"{self._thread.name} is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._calls.put((future, fn, args))
        if self._thread.ident is None:
            self._thread.start()
        return future

    async def close(self) -> None:
        """Finish the calls handed over, then end the thread."""
        self._closed = True
        if self._thread.is_alive():
            self._calls.put(_STOP)
            await asyncio.to_thread(self._thread.join)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not _STOP:
            future, fn, args = call
            try:
                result = fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, as an executor does
                _answer(future, _fail, e)
            else:
                _answer(future, _succeed, result)


def _answer(future: asyncio.Future[Any], settle: Callable[[asyncio.Future[Any], Any], None], value: Any) -> None:
    try:
        future.get_loop().call_soon_threadsafe(settle, future, value)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():  # its waiter may have been cancelled meanwhile
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
