"""Thrifty replication: which followers the leader pushes each new entry to at once.

A write commits once a majority holds it: in a cluster of three, the leader and one follower.
Sending every entry to every follower at once makes each write wake every node; on a machine
that runs the members side by side (and on any leader, whose socket writes are its costliest
step under one writer) that work sits on the write's path. So new entries go at once only to
the followers a majority needs, the *eager* ones. The others, the *lazy* ones, get full batches
(at the leader's next tick, or on their own answers) and whatever else is pending at least every
`lazy_push_ms`, so they trail by at most that much and write and sync far fewer, larger batches.

What it costs: a write waits for one given follower instead of the fastest of two. So the choice
is revisited at every tick of the leader:
- An eager follower that leaves a batch unanswered for `eager_timeout_ms` (paused, crashed, cut
  off) gives its place to a lazy one, which then gets everything pending at once; when fewer
  followers keep up than a majority needs, every follower is eager, as without this.
- An eager follower that answers, but slowly (a slow disk, an overloaded machine), gives its
  place to a lazy one that answers its batches more than twice as fast and by more than a
  tenth of `eager_timeout_ms` (2 ms by default): otherwise it would hold every write to its pace.
Safety is untouched: what counts toward a commit is still only what followers report on their
disks.

The choice is sticky (an eager follower that keeps up and is not much slower stays eager), so the
same follower keeps its caches warm and the lazy one keeps batching. Answer times are moving
averages (Dispatcher.answer_ms) on the time the driver passes in; a lazy follower's come from its
larger batches, which errs toward keeping the eager one."""
from __future__ import annotations

from typing import Sequence

from raft.core.dispatcher import Dispatcher


def choose_eager(dispatchers: Sequence[Dispatcher], need: int, now: int) -> None:
    """Mark `need` of the dispatchers eager and the rest lazy: the eager ones that keep up stay,
    vacancies go to the followers furthest along, a much slower eager one is swapped for the
    fastest lazy one, and all are eager if too few keep up."""
    fit = [d for d in dispatchers if d.keeping_up(now)]
    if len(fit) < need:
        for d in dispatchers:
            d.eager = True
        return
    ranked = sorted(fit, key=lambda d: (not d.eager, -d.match_index, d.peer))
    chosen, rest = ranked[:need], ranked[need:]
    _swap_if_much_slower(chosen, rest)
    for d in dispatchers:
        d.eager = d in chosen


def _swap_if_much_slower(chosen: list[Dispatcher], rest: list[Dispatcher]) -> None:
    """One swap at most per tick: the slowest chosen for the fastest of the rest, when the former
    answers more than twice as slowly and by more than a tenth of eager_timeout_ms."""
    timed_chosen = [(d.answer_ms, d.peer, d) for d in chosen if d.answer_ms is not None]
    timed_rest = [(d.answer_ms, d.peer, d) for d in rest if d.answer_ms is not None]
    if not timed_chosen or not timed_rest:
        return
    slow_ms, _, slow = max(timed_chosen)
    fast_ms, _, fast = min(timed_rest)
    if slow_ms > 2 * fast_ms + slow.leader.config.eager_timeout_ms / 10:
        chosen[chosen.index(slow)] = fast
