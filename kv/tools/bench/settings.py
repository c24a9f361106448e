"""The sizes of one bench run. The defaults are the issue's; QUICK only checks that the bench works."""
from __future__ import annotations

from dataclasses import dataclass, replace

WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9")
# Run only when named (W10, W11: they need the spark extra and Java; raftkv only, native API;
# W10 loads bulk_keys rows). W12, W13 (reads at a past revision, compare-and-swap Txns) run
# when named, and by default under `--api etcd`. W14, W15 (watchers under a steady writer, leases
# kept alive) run when named, through etcd's Watch and Lease services whatever `--api` says. W16
# (membership change: a learner added and promoted, leadership moved under a writer) runs when
# named, on raftkv only (etcd's side is not measured).
# W17 (lists of a prefix: whole, keys-only, paged) runs when named, through either API.
OPTIONAL_WORKLOADS = ("W10", "W11", "W12", "W13", "W14", "W15", "W16", "W17")
REVISION_WORKLOADS = ("W12", "W13")
# What only raftkv's native API can drive, with why: refused under `--api etcd`.
NATIVE_ONLY = {
    "W8": "snapshot save and restore go through kv.Client's save_snapshot/restore_snapshot",
    "W10": "the Spark data source writes through kv.Client",
    "W11": "the Spark export reads through kv.Client",
}


@dataclass(frozen=True, slots=True)
class Sizes:
    duration_s: float = 5.0         # measured window of each load (W1..W5, W12, W13, each W17 variant)
    warmup_s: float = 1.0           # unmeasured lead-in of each load
    clients: int = 16               # W2, W4, W5, W12, W13
    key_bytes: int = 16
    value_bytes: int = 256
    read_keys: int = 1_000          # keys written before W3..W5 and W12 read them
    bulk_keys: int = 1_000_000      # W6
    bulk_value_bytes: int = 16      # W6: 1M keys of 16 + 16 bytes, a store of about 36 MB
    bulk_batch: int = 1_000         # keys per batch request (etcd: capped at its 128 txn ops)
    bulk_clients: int = 4           # batches in flight at once
    failover_trials: int = 10       # W7
    failover_clients: int = 4       # writers keeping the cluster loaded in W7
    request_timeout_s: float = 10.0  # a client's deadline for one request, retries included
    healthy_timeout_s: float = 60.0  # how long a cluster may take to elect and catch up
    watchers: int = 1_000           # W14: watches on one prefix
    watch_streams: int = 50         # W14: Watch streams (clients) carrying them, spread over the members
    watch_processes: int = 2        # W14: processes the watching clients run in
    watch_rate: float = 1_000.0     # W14: the writer's puts a second
    watch_duration_s: float = 15.0  # W14: how long the writer writes (rate x this puts)
    watch_drain_s: float = 300.0    # W14: how long after the last put every event may take to arrive
    leases: int = 10_000            # W15: leases kept alive
    lease_ttl_s: int = 30           # W15: their TTL; each is kept alive every TTL/3
    lease_streams: int = 5          # W15: LeaseKeepAlive streams (clients) to the leader
    lease_duration_s: float = 20.0  # W15: the measured window, after warmup_s
    membership_keys: int = 100_000  # W16: keys in the store when the learner joins (topped up if fewer)
    transfers: int = 5              # W16: MoveLeader calls under the writer
    list_keys: int = 10_000         # W17: keys under the listed prefix
    list_value_bytes: int = 1_024   # W17: their values (10 MB a list)
    list_clients: int = 4           # W17: clients listing at once
    list_page: int = 500            # W17: keys per page of the paged list


QUICK = Sizes(duration_s=0.3, warmup_s=0.1, clients=4, read_keys=50, bulk_keys=2_000, bulk_batch=500,
              bulk_clients=2, failover_trials=1, failover_clients=2, watchers=20, watch_streams=4,
              watch_rate=100.0, watch_duration_s=0.5, watch_drain_s=60.0, leases=100, lease_ttl_s=10,
              lease_streams=2, lease_duration_s=2.0, membership_keys=2_000, transfers=2, list_keys=200,
              list_clients=2, list_page=50)


def with_overrides(base: Sizes, **overrides: float | int | None) -> Sizes:
    """`base` with every override that is not None."""
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
