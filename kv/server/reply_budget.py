"""ReplyBudget: the bytes of large replies a member holds at once (decision 0070).

A Range (or a read-only Txn's ranges) is measured before its values are read
(statemachine/range_read.py). The measured size is then checked here, in the worker thread that
reads, between measuring and building:

- over `max_reply_bytes` (the member's send limit), the reply is refused at once with gRPC's words
  for a message too large to send ("grpc: trying to send message larger than max (N vs. M)",
  RESOURCE_EXHAUSTED, as etcd's gRPC server answers one over its limit), no value read;
- else it takes its size from the member's budget of replies in flight, and gives it back when
  its call has ended (the reply sent, or the call gone). With no room, the read is given up
  (`NoRoom`) and the caller waits for room (`wait_room`) and reads again.

So however many clients ask for large lists at once, a member holds at most `limit_bytes` of them
(a reply is always taken when nothing else is in flight), and the lists wait their turn instead of
growing the process."""
from __future__ import annotations

import asyncio
import threading
import time

from kv import errors
from kv.server.server_group import MAX_SEND_BYTES

# The largest reply a member sends: gRPC's limit on what it sends.
MAX_REPLY_BYTES = MAX_SEND_BYTES
# Bytes of measured replies a member holds at once: four of the largest, or eight lists of 32 MiB
# (about 30,000 keys of 1 KiB). A reply costs the process about twice its size until it is sent
# (the message, then its bytes); the values are read into the message one at a time.
REPLY_BUDGET_BYTES = 4 * MAX_REPLY_BYTES


def too_large_message(size: int, limit: int) -> str:
    """gRPC's status for a message over the send limit (grpc-go's server.go, etcd's server)."""
    return f"grpc: trying to send message larger than max ({size} vs. {limit})"


class NoRoom(Exception):
    """The member's budget cannot take a reply of `size` bytes now."""

    def __init__(self, size: int) -> None:
        super().__init__(f"no room for a reply of {size} bytes")
        self.size = size


class ReplyBudget:
    def __init__(self, limit_bytes: int = REPLY_BUDGET_BYTES, max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self.max_reply_bytes = max_reply_bytes
        self._lock = threading.Lock()  # taken from worker threads, given back on the loop
        self.in_flight = 0
        self._released = asyncio.Event()  # set, and replaced, each time bytes come back

    def grant(self) -> Grant:
        """One read's claim on the budget: call it with the reply's size from the reading thread."""
        return Grant(self)

    def _take(self, size: int) -> None:
        if size > self.max_reply_bytes:
            raise errors.ReplyTooLargeError(too_large_message(size, self.max_reply_bytes))
        with self._lock:
            if self.in_flight and self.in_flight + size > self.limit_bytes:
                raise NoRoom(size)
            self.in_flight += size

    def _give_back(self, size: int) -> None:
        """On the loop."""
        with self._lock:
            self.in_flight -= size
        released, self._released = self._released, asyncio.Event()
        released.set()

    async def wait_room(self, size: int, timeout: float | None) -> None:
        """Return once `size` bytes would fit (or nothing is in flight); errors.TimeoutError after
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.in_flight and self.in_flight + size > self.limit_bytes:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise errors.TimeoutError(f"no room within {timeout:.3f}s for a reply of {size} bytes: "
                                          f"{self.in_flight} bytes of replies are in flight on this member")
            try:
                await asyncio.wait_for(self._released.wait(), remaining)
            except asyncio.TimeoutError:
                pass


class Grant:
    """What one read took from the budget (`__call__`, in the reading thread), given back once
    (`release`, on the loop). A grant released before its thread took anything takes nothing:
    the thread of a call that was given up stops before it builds its reply."""

    def __init__(self, budget: ReplyBudget) -> None:
        self._budget = budget
        self.max_bytes: int | None = budget.max_reply_bytes  # a plan holds no keys past it
        self._lock = threading.Lock()
        self._taken = 0
        self._closed = False

    def __call__(self, size: int) -> None:
        with self._lock:
            if self._closed:
                raise NoRoom(size)
            self._budget._take(size)
            self._taken = size

    def release(self) -> None:
        with self._lock:
            self._closed = True
            taken, self._taken = self._taken, 0
        if taken:
            self._budget._give_back(taken)
