"""W17: lists as Kubernetes makes them. `--list-keys` keys of 1 KiB under a prefix of their own
are written in bulk (untimed); then `--list-clients` clients each list the whole prefix, one list
after another, in three variants measured one after the other:

- "full": every key with its value, linearizable (etcd's API: one Range; the native API: one
  scan, which the client continues where the member cuts a reply at its page budget);
- "keys-only": the same without values (etcd's keys_only; the native scan's keys_only);
- "paged 500": ranges of at most `--list-page` keys, each from the key after the last one, as a
  paginated LIST; one list is all its pages (etcd's API: the later pages at the first page's
  revision, as Kubernetes reads them; the native API: each page a linearizable scan of its own).

Every list must return every key (the round fails otherwise). Reported per variant: lists/s, p50,
p99, the CPU per list, and the members' peak resident memory over the variant (Linux's VmHWM,
reset before it): the largest, and the leader's."""
from __future__ import annotations

from kv.tools.bench.measure import Operation
from kv.tools.bench.processes import peak_rss_bytes, reset_peak_rss
from kv.tools.bench.systems import Cluster, Target
from kv.tools.bench.workloads import MB, Context, Metric, load_metrics, measured_load, key, value_of

LIST_PREFIX = "ls"
# (label, keys_only, page): page 0 is one range of everything; None is --list-page.
VARIANTS = (("full", False, 0), ("keys-only", True, 0), ("paged", False, None))


def load_list_set(cluster: Cluster, ctx: Context) -> bytes:
    """Write W17's keys (in bulk, untimed); the prefix they share."""
    sizes = ctx.sizes
    value = value_of(sizes.list_value_bytes)
    target = ctx.target(cluster)
    pairs = [(key(LIST_PREFIX, 0, i, sizes.key_bytes), value) for i in range(sizes.list_keys)]
    for start in range(0, len(pairs), cluster.max_bulk_ops):
        target.bulk_put(pairs[start:start + cluster.max_bulk_ops])
    return LIST_PREFIX.encode()


def w17_lists(cluster: Cluster, ctx: Context) -> list[Metric]:
    prefix = load_list_set(cluster, ctx)
    metrics: list[Metric] = []
    for label, keys_only, page in VARIANTS:
        page = ctx.sizes.list_page if page is None else page
        name = f"paged {page}" if label == "paged" else label
        metrics += _variant(cluster, ctx, prefix, name, keys_only, page)
    return metrics


def _variant(cluster: Cluster, ctx: Context, prefix: bytes, label: str, keys_only: bool,
             page: int) -> list[Metric]:
    wanted = ctx.sizes.list_keys

    def list_all(target: Target) -> None:
        listed = target.list_prefix(prefix, keys_only, page)
        if listed != wanted:
            raise AssertionError(f"{cluster.system} listed {listed} of the {wanted} keys under {prefix!r} ({label})")

    list_all(ctx.target(cluster))  # untimed: that it lists every key

    def operation(worker: int) -> Operation:
        target = ctx.target(cluster)
        return lambda i: list_all(target)

    pids = {m: pid for m in cluster.members if (pid := cluster.pid(m)) is not None}
    reset = all([reset_peak_rss(pid) for pid in pids.values()])
    result, roles = measured_load(cluster, ctx, [operation(w) for w in range(ctx.sizes.list_clients)])
    metrics = load_metrics("W17", result, label, roles)
    peaks = {m: peak for m, pid in pids.items() if (peak := peak_rss_bytes(pid)) is not None}
    if peaks:
        since = "over the variant" if reset else "since the member started (its peak could not be reset)"
        note = ", ".join(f"{m} {v / MB:.0f}" for m, v in peaks.items())
        metrics.append(Metric("W17", f"{label} peak MB", max(peaks.values()) / MB, False,
                              f"peak RSS MB {since}: {note}"))
        if roles.leader in peaks:  # the member that led as the load began, as for the CPU figures
            metrics.append(Metric("W17", f"{label} leader peak MB", peaks[roles.leader] / MB, False))
    return metrics
