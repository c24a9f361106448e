"""Thrifty replication: which followers the leader pushes each new entry to at once.

A write commits once a majority holds it: in a cluster of three, the leader and one follower.
Sending every entry to every follower at once makes each write wake every node; on a machine
that runs the members side by side (and on any leader, whose socket writes are its costliest
step under one writer) that work sits on the write's path. So new entries go at once only to
the followers a majority needs, the *eager* ones. The others, the *lazy* ones, get full batches
(at the leader's next tick, or on their own answers) and whatever else is pending at least every
`lazy_push_ms`, so they trail by at most that much and write and sync far fewer, larger batches.

What it costs: a write waits for one given follower instead of the fastest of two. So the
leader revisits the choice at each of its ticks (EagerSet.tick):
- An eager follower that leaves a batch unanswered for `eager_timeout_ms` (paused, crashed, cut
  off) gives its place to a lazy one, which then gets everything pending at once; when fewer
  followers keep up than a majority needs, every follower is eager, as without this.
- An eager follower that answers, but much more slowly than a lazy one answers its own batches
  (more than twice as slowly and by more than a tenth of `eager_timeout_ms`: a slow disk, a busy
  machine), gives its place at once.
- A lazy follower's own answers come from larger batches to an idle process, so they cannot
  show a follower that is only a little faster. Trials can: `eager_trial_ms` after the leader
  starts and then every `eager_trial_every_ms`, the lazy follower eager longest ago takes the
  place of the slowest eager one for `eager_trial_ms`. Only batches sent once it has caught up
  are timed (Inflight.timed); it stays if they were answered in under 4/5 of the time the one it
  replaced took, else the latter comes back. A trial starts only while writes are answered.
Safety is untouched: what counts toward a commit is still only what followers report on their
disks.

The choice is sticky (an eager follower that keeps up and is not much slower stays eager), so the
same follower keeps its caches warm and the lazy one keeps batching. Answer times are moving
averages (Dispatcher.answer_ms, eager_answer_ms) on the time the driver passes in."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from raft.core.config import CoreConfig
from raft.core.dispatcher import Dispatcher

# A trial's follower stays eager only if it answered in under this share of the other's time.
TRIAL_MUST_BEAT = 0.8
_NEVER = 1 << 62


@dataclass(slots=True)
class _Trial:
    candidate: Dispatcher
    replaced: Dispatcher
    ends_at: int


class EagerSet:
    """A leader's choice of eager followers, made at its ticks."""

    def __init__(self, dispatchers: Sequence[Dispatcher], need: int, config: CoreConfig, now: int) -> None:
        self._dispatchers = list(dispatchers)
        self._need = need
        self._config = config
        self._trial: _Trial | None = None
        self._next_trial = now + config.eager_trial_ms if config.eager_trial_every_ms else _NEVER
        self._eager_at = {d.peer: now for d in dispatchers}  # when each was last eager

    def tick(self, now: int) -> None:
        """Mark `need` of the dispatchers eager and the rest lazy: the eager ones that keep up stay,
        vacancies go to the followers furthest along, and all are eager if too few keep up."""
        fit = [d for d in self._dispatchers if d.keeping_up(now)]
        if len(fit) < self._need:
            if self._trial is not None:
                self._end_trial(now + self._config.eager_trial_every_ms)
            for d in self._dispatchers:
                d.eager = True
            return
        ranked = sorted(fit, key=lambda d: (not d.eager, -d.match_index, d.peer))
        chosen, rest = ranked[:self._need], ranked[self._need:]
        if self._trial is not None:
            self._judge_trial(chosen, now)
        elif not _swap_if_much_slower(chosen, rest, self._config) and now >= self._next_trial:
            self._start_trial(chosen, rest, now)
        for d in self._dispatchers:
            d.eager = d in chosen
        for d in chosen:
            self._eager_at[d.peer] = now

    def _start_trial(self, chosen: list[Dispatcher], rest: list[Dispatcher], now: int) -> None:
        # Only while writes flow: the one replaced must have a recent time to compare with.
        recent = now - self._config.eager_trial_ms
        timed = [d for d in chosen if d.timed_answer_at is not None and d.timed_answer_at >= recent]
        if not rest or not timed:
            return
        replaced = max(timed, key=lambda d: (d.eager_answer_ms or 0.0, d.peer))
        candidate = min(rest, key=lambda d: (self._eager_at[d.peer], d.peer))
        candidate.eager_answer_ms = None  # measured afresh, on this trial's batches only
        chosen[chosen.index(replaced)] = candidate
        self._trial = _Trial(candidate, replaced, now + self._config.eager_trial_ms)

    def _judge_trial(self, chosen: list[Dispatcher], now: int) -> None:
        trial = self._trial
        assert trial is not None
        if trial.candidate not in chosen:  # it stopped keeping up: the trial is over, and lost
            self._end_trial(now + self._config.eager_trial_every_ms)
            return
        if now < trial.ends_at:
            return
        tried, before = trial.candidate.eager_answer_ms, trial.replaced.eager_answer_ms
        # A trial with nothing written meanwhile told nothing: the next comes soon.
        self._end_trial(now + (self._config.eager_trial_ms if tried is None else self._config.eager_trial_every_ms))
        won = tried is not None and before is not None and tried < TRIAL_MUST_BEAT * before
        if not won and trial.replaced not in chosen and trial.replaced.keeping_up(now):
            chosen[chosen.index(trial.candidate)] = trial.replaced

    def _end_trial(self, next_trial: int) -> None:
        self._trial = None
        self._next_trial = next_trial


def _swap_if_much_slower(chosen: list[Dispatcher], rest: list[Dispatcher], config: CoreConfig) -> bool:
    """One swap at most per tick: the slowest chosen for the fastest of the rest, when the former
    answers more than twice as slowly and by more than a tenth of eager_timeout_ms."""
    timed_chosen = [(d.answer_ms, d.peer, d) for d in chosen if d.answer_ms is not None]
    timed_rest = [(d.answer_ms, d.peer, d) for d in rest if d.answer_ms is not None]
    if not timed_chosen or not timed_rest:
        return False
    slow_ms, _, slow = max(timed_chosen)
    fast_ms, _, fast = min(timed_rest)
    if slow_ms > 2 * fast_ms + config.eager_timeout_ms / 10:
        chosen[chosen.index(slow)] = fast
        return True
    return False
