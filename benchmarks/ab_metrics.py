"""What measuring costs: the bench's W1 / W2 (puts1, puts16) on two live clusters side by side,
alternating windows as ab_clusters.py does (read it first):

- "base": with --base-code, the code of an earlier revision exported to a directory (git archive
  REV | tar -x -C DIR), so without any counter, alarm watch or health service; without it, this
  checkout with metrics off (no --listen-metrics-urls);
- "metrics": this checkout with --listen-metrics-urls on every member and a scraper reading each
  member's /metrics and /health once a second (Prometheus usually scrapes every 15 s: this is
  harsher).

    git archive 92b3345 | tar -x -C /tmp/base
    python benchmarks/ab_metrics.py --base-code /tmp/base --rounds 6 --seconds 5
    python benchmarks/ab_metrics.py --rounds 6 --seconds 5      # the same code, metrics off / on

Run it from outside the checkout (cd /tmp): `python -m kv` would otherwise import the checkout's
kv from the working directory ahead of --base-code.
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab_clusters  # noqa: E402
from ab_clusters import SHOWN, Config, _figures, start, window  # noqa: E402

from kv.tools.bench import raftkv_cluster  # noqa: E402
from kv.tools.bench.processes import Registry  # noqa: E402
from kv.tools.bench.settings import Sizes  # noqa: E402
from kv.tools.cluster_up import child_env  # noqa: E402

METRICS_LINE = re.compile(r"metrics and health on (http://\S+)")


def base_env(code: Path) -> dict[str, str]:
    env = child_env()
    env["PYTHONPATH"] = f"{code}:{code / 'proto'}"  # the exported revision, not this checkout
    return env


class Scraper(threading.Thread):
    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls, self.scrapes, self.stopping = urls, 0, threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            for url in self.urls:
                for path in ("/metrics", "/health"):
                    try:
                        with urllib.request.urlopen(url + path, timeout=2.0) as reply:
                            reply.read()
                        self.scrapes += 1
                    except OSError:
                        pass


def metrics_urls(work: Path, names: list[str]) -> list[str]:
    urls = []
    for name in names:
        found = METRICS_LINE.search((work / f"{name}.log").read_text(errors="replace"))
        assert found, f"{name} logged no metrics listener"
        urls.append(found.group(1))
    return urls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-code", type=Path, default=None,
                        help="an exported earlier revision (default: this checkout, metrics off)")
    parser.add_argument("--loads", default="puts1,puts16")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    base, metrics = Config("base", [], {}), Config("metrics", ["--listen-metrics-urls", "http://127.0.0.1:0"], {})
    configs, loads = [base, metrics], args.loads.split(",")
    sizes = Sizes(duration_s=args.seconds, warmup_s=0.5)
    registry, work = Registry(), Path(tempfile.mkdtemp(prefix="ab-metrics-"))
    clusters = {}
    own_env = raftkv_cluster.child_env
    try:
        if args.base_code is not None:
            raftkv_cluster.child_env = lambda: base_env(args.base_code.resolve())  # type: ignore[assignment]
        clusters["base"] = start(base, work, registry, sizes)
        raftkv_cluster.child_env = own_env
        clusters["metrics"] = start(metrics, work, registry, sizes)
        scraper = Scraper(metrics_urls(work / "metrics", clusters["metrics"].members))
        scraper.start()
        for r in range(args.rounds):
            for load in loads:
                for c in configs if r % 2 == 0 else configs[::-1]:
                    w = window(clusters[c.name], load, work, sizes)
                    c.windows.setdefault(load, []).append(w)
                    print(f"round {r} {c.name:8s} {load:8s} {_figures(w)}", flush=True)
        print(f"medians ({scraper.scrapes} scrapes):")
        for load in loads:
            for c in configs:
                ws = c.windows[load]
                print(f"  {c.name:8s} {load:8s} {_figures({m: statistics.median(w[m] for w in ws) for m in SHOWN})}")
            ratio = statistics.median(w["ops/s"] for w in metrics.windows[load]) / \
                statistics.median(w["ops/s"] for w in base.windows[load])
            wins = sum(x["ops/s"] > y["ops/s"] for x, y in zip(metrics.windows[load], base.windows[load]))
            print(f"  {load}: metrics / base = {ratio:.3f}; metrics faster in {wins} of {args.rounds} windows")
    finally:
        raftkv_cluster.child_env = own_env
        for cluster in clusters.values():
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    assert ab_clusters  # the module whose machinery this reuses
    main()
