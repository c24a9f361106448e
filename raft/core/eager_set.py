"""Thrifty replication: which followers the leader pushes each new entry to at once.

A write commits once a majority holds it: in a cluster of three, the leader and one follower.
Sending every entry to every follower at once makes each write wake every node; on a machine
that runs the members side by side (and on any leader, whose socket writes are its costliest
step under one writer) that work sits on the write's path. So new entries go at once only to
the followers a majority needs, the *eager* ones. The others, the *lazy* ones, get full batches
(at the leader's next tick, or on their own answers) and whatever else is pending at least every
`lazy_push_ms`, so they trail by at most that much and write and sync far fewer, larger batches.

What it costs: a write waits for one given follower instead of the fastest of two. An eager
follower that leaves a batch unanswered for `eager_timeout_ms` (slow disk, paused, crashed, cut
off) gives its place to a lazy one at the leader's next tick, which then gets everything pending
at once; when fewer followers keep up than a majority needs, every follower is eager, as without
this. Safety is untouched: what counts toward a commit is still only what followers report on
their disks.

The choice is sticky (an eager follower that keeps up stays eager), so the same follower keeps
its caches warm and the lazy one keeps batching. It is made at the leader's ticks, on the time
the core last learnt (a batch is dated by the tick before it left), so a follower's silence is
judged up to a tick early and acted on up to a tick late."""
from __future__ import annotations

from typing import Sequence

from raft.core.dispatcher import Dispatcher


def choose_eager(dispatchers: Sequence[Dispatcher], need: int, now: int) -> None:
    """Mark `need` of the dispatchers eager and the rest lazy: the eager ones that keep up stay,
    vacancies go to the followers furthest along, and all are eager if too few keep up."""
    fit = [d for d in dispatchers if d.keeping_up(now)]
    if len(fit) < need:
        for d in dispatchers:
            d.eager = True
        return
    chosen = set(sorted(fit, key=lambda d: (not d.eager, -d.match_index, d.peer))[:need])
    for d in dispatchers:
        d.eager = d in chosen
