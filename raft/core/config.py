"""Protocol timing and batching, in one typed place. All times are milliseconds of the clock
the driver passes in with each tick; the core never reads a clock itself."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CoreConfig:
    # Election timeout T: a follower waits a random time in [T, 2T) without hearing from a leader
    # before it starts a pre-vote. A leader that has not heard from a quorum for T steps down.
    election_timeout_ms: int = 1000
    # How often an idle leader sends heartbeats (which also carry the commit index).
    heartbeat_interval_ms: int = 100
    # Replication batches: at most this many entries / bytes per push.
    max_batch_entries: int = 512
    max_batch_bytes: int = 1 << 20
    # How many APPEND batches may be in flight to one follower at once (pipelining).
    max_inflight_batches: int = 2
    # An APPEND or COMPARE not answered within this time is sent again (from match + 1).
    push_timeout_ms: int = 1000
    # Thrifty replication (raft/core/eager_set.py): new entries go at once only to as many
    # followers as a majority needs ("eager"); the others get them in full batches, and whatever
    # is pending at least this often. 0: every follower gets every entry at once.
    lazy_push_ms: int = 100
    # An eager follower that leaves a batch unanswered this long gives its place to a lazy one,
    # which gets everything pending at once: what a stopped follower costs a write. One that
    # answers, but more than twice as slowly as a lazy one and by more than a tenth of this,
    # gives its place too (eager_set.py).
    eager_timeout_ms: int = 20
    # Trials of the choice (eager_set.py): eager_trial_ms after a leader starts and then this
    # often, a lazy follower is made eager for eager_trial_ms, and kept if its batches are
    # answered clearly faster than those of the one it replaced. 0: no trials.
    eager_trial_every_ms: int = 30_000
    eager_trial_ms: int = 1_000
    # A follower holds an APPEND that starts past its end this long, waiting for the gap to fill,
    # before it answers INCONSISTENT.
    out_of_order_hold_ms: int = 200
    # A follower in INSTALL_SNAPSHOT that has not finished within this time is retried.
    snapshot_timeout_ms: int = 60_000
    # Most entries handed to the state machine in one Ready.
    max_apply_batch: int = 4096
    # Leader lease for opt-in lease reads: quorum contact younger than this is trusted. It is
    # shorter than the election timeout to leave room for clock drift between nodes.
    lease_ms: int = 900

    def __post_init__(self) -> None:
        if self.heartbeat_interval_ms <= 0 or self.election_timeout_ms <= self.heartbeat_interval_ms:
            raise ValueError("need 0 < heartbeat_interval_ms < election_timeout_ms")
        if self.lease_ms >= self.election_timeout_ms:
            raise ValueError("lease_ms must be shorter than election_timeout_ms")
        if self.max_batch_entries < 1 or self.max_inflight_batches < 1:
            raise ValueError("batch limits must be positive")
        if self.lazy_push_ms < 0 or self.eager_timeout_ms <= 0:
            raise ValueError("need lazy_push_ms >= 0 and eager_timeout_ms > 0")
        if self.eager_trial_every_ms < 0 or self.eager_trial_ms <= 0:
            raise ValueError("need eager_trial_every_ms >= 0 and eager_trial_ms > 0")
