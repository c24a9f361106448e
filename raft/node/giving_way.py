"""A follower gives way: before it saves, and while it applies, a large batch of entries, it lets
the other runnable processes on its CPU go first (`sched_yield`).

On this project's 2-vCPU bench machine a put needs the client, the leader and one follower in
turn, and the other (lazy) follower gets the writes in batches every 100 ms (thrifty
replication). The slowest 1% of one client's puts fell every 100 ms, on the lazy follower's batch,
with or without fsync: a process that has slept most of the time keeps its CPU over one that just
woke, so a put whose next step was woken on that CPU waited out the batch (2-3 ms). A lazy
follower's save and apply are on no client's path, and an eager follower's apply is not either
(it acknowledges first); its save is, but a yield only lets a process go first that is runnable
on the same CPU, and that process (client, leader) is the one the save would otherwise delay.
So a follower steps aside at these points rather than holding the CPU for the whole batch
(README, Performance; 16 writers, whose batches the eager follower saves too, measured the same
with and without). Leaders never yield: everything a leader does is on some client's path."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from raft.core.types import Entry, Role

T = TypeVar("T")


_sched_yield: Callable[[], None] | None = getattr(os, "sched_yield", None)  # not on Windows


def yield_cpu() -> None:
    """Let other runnable threads on this CPU run first; returns at once when there are none."""
    if _sched_yield is not None:
        _sched_yield()


def gives_way(role: Role, entries: int, every: int) -> bool:
    """Whether a node in `role` handling `entries` entries at once should give way (every: the
    node's follower_yield_entries; 0 turns it off)."""
    return every > 0 and entries > every and role is not Role.LEADER


def apply_in_slices(apply: Callable[[Sequence[Entry]], list[T]], entries: Sequence[Entry], every: int,
                    pause: Callable[[], Any] = yield_cpu) -> list[T]:
    """`apply` the entries `every` at a time (a transaction each), pausing between slices; one
    result per entry applied, as one call would give (a slice the state machine ended early ends
    the whole: StateMachine.apply)."""
    results: list[T] = []
    for start in range(0, len(entries), every):
        if start:
            pause()
        piece = entries[start:start + every]
        applied = apply(piece)
        results.extend(applied)
        if len(applied) < len(piece):
            break
    return results
