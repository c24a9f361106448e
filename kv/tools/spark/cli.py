"""`raftkv export` and `raftkv import`: Parquet out of and into a cluster, for people who do not
run Spark (pyarrow only). kv/tools/cli.py adds them with ``add_parsers(commands)``.

    raftkv export --endpoints 127.0.0.1:7001,... --out DIR [--prefix P] [--partitions N]
    raftkv export --snapshot backup.snap --out DIR          # no cluster needed
    raftkv import --parquet DIR --endpoints ... [--atomic] [--rows-per-second N]
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kv.tools.arguments import Formatter, default_endpoints, endpoints_help, positive_float, positive_int
from kv.tools.client_options import add_tls_options, tls_of
from kv.tools.user_options import add_user_options, credentials_of
from kv.tools.write_out import row_progress
from raft.node.config import DEFAULT_LISTEN


def add_parsers(commands: Any) -> None:
    """Add `export` and `import` to the `raftkv` sub-command parsers."""
    _add_export(commands)
    _add_import(commands)


def _endpoint_options(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--endpoints", default=default_endpoints(None if required else DEFAULT_LISTEN),
                        metavar="HOST:PORT,...", help=endpoints_help(DEFAULT_LISTEN))
    parser.add_argument("--timeout", type=positive_float, default=30.0, metavar="SECONDS",
                        help="per request, retries included")
    add_tls_options(parser)
    add_user_options(parser)


def _add_export(commands: Any) -> None:
    export = commands.add_parser(
        "export", formatter_class=Formatter, help="write the store (or a snapshot file) as Parquet",
        description="Write a consistent point in time of the store as Parquet files split by key range, "
                    "with the Raft index, term and cluster id in each file's metadata and in "
                    "DIR/_raftkv_export.json. Read it back with spark.read.parquet(DIR).")
    _endpoint_options(export)
    export.add_argument("--snapshot", type=Path, default=None, metavar="FILE",
                        help="export this snapshot file instead of a running cluster (no cluster needed)")
    export.add_argument("--out", type=Path, required=True, metavar="DIR", help="an empty or new directory")
    export.add_argument("--partitions", type=positive_int, default=4, metavar="N", help="files (key ranges) to write")
    export.add_argument("--prefix", default=None, help="only keys with this prefix (live export)")
    export.add_argument("--start", default=None, help="first key of the range (live export)")
    export.add_argument("--end", default=None, help="end of the range, exclusive (live export)")
    export.set_defaults(run=run_export, command_parser=export)


def _add_import(commands: Any) -> None:
    imp = commands.add_parser(
        "import", formatter_class=Formatter, help="load Parquet (key, value) into the store",
        description="Load the key and value columns (binary or string) of Parquet files through the leader "
                    "in batches of idempotent puts. Without --atomic a failed import may leave part of the "
                    "rows written (running it again is safe); with --atomic readers see all rows or none.")
    _endpoint_options(imp)
    imp.add_argument("--parquet", type=Path, required=True, metavar="DIR", help="a Parquet file or directory")
    imp.add_argument("--atomic", action="store_true", help="stage the rows and publish them in one command")
    imp.add_argument("--batch-rows", type=positive_int, default=1000, metavar="N", help="puts per request (at most 1000)")
    imp.add_argument("--rows-per-second", type=float, default=0.0, metavar="N", help="throttle (0: none)")
    imp.add_argument("--bytes-per-second", type=float, default=0.0, metavar="N", help="throttle (0: none)")
    imp.add_argument("--no-progress", dest="progress", action="store_false",
                     help="no progress bar on stderr (when stderr is not a terminal the bar writes its final "
                          "state only)")
    imp.set_defaults(run=run_import, command_parser=imp)


def _require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ValueError("export and import need pyarrow: pip install 'raftkv[spark]'") from None


def run_export(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _require_pyarrow()
    from kv.tools.spark.parquet_export import export_live, export_snapshot

    if args.snapshot is not None:
        if args.prefix is not None or args.start is not None or args.end is not None:
            parser.error("--prefix/--start/--end apply to a live export, not to --snapshot")
        manifest = export_snapshot(args.snapshot, args.out, partitions=args.partitions)
    else:
        if args.prefix is not None and (args.start is not None or args.end is not None):
            parser.error("give either --prefix or --start/--end, not both")
        manifest = export_live(args.endpoints, args.out, partitions=args.partitions, timeout=args.timeout,
                               prefix=_utf8(args.prefix), start=_utf8(args.start), end=_utf8(args.end),
                               tls=tls_of(args), **credentials_of(args))
    print(json.dumps({k: v for k, v in asdict(manifest).items() if k != "files"} | {"files": len(manifest.files),
                                                                                   "out": str(args.out)}))
    return 0


def run_import(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _require_pyarrow()
    import pyarrow.dataset as ds

    from kv.tools.spark.bulk_load import BulkLoader, Throttle, discard_staged, new_stage, publish_staged

    if not args.parquet.exists():
        raise FileNotFoundError(f"{args.parquet}: no such file or directory")
    dataset = ds.dataset(args.parquet, format="parquet")
    missing = {"key", "value"} - set(dataset.schema.names)
    if missing:
        raise ValueError(f"{args.parquet} has columns {dataset.schema.names}; raftkv import needs key and value "
                         "(binary or string)")
    total = dataset.count_rows()
    stage = new_stage() if args.atomic else b""
    credentials = credentials_of(args)
    tls = tls_of(args)
    started = time.monotonic()
    try:
        with row_progress(enabled=args.progress) as bar:
            task = bar.add_task("import", total=total)
            with BulkLoader(args.endpoints, batch_rows=args.batch_rows, stage=stage, timeout=args.timeout,
                            throttle=Throttle(args.rows_per_second, args.bytes_per_second),
                            on_batch=lambda rows: bar.advance(task, rows), tls=tls, **credentials) as loader:
                rows = loader.load(_pairs(dataset))
        if stage:
            publish_staged(args.endpoints, stage, args.timeout * 4, tls, **credentials)
    except BaseException:
        if stage:
            discard_staged(args.endpoints, stage, args.timeout * 4, tls, **credentials)
        raise
    seconds = time.monotonic() - started
    print(json.dumps({"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / max(seconds, 1e-9)),
                      "atomic": bool(stage)}))
    return 0


def _pairs(dataset: Any) -> Iterator[tuple[bytes, bytes]]:
    from kv.tools.spark.schema import as_binary

    for batch in dataset.to_batches(columns=["key", "value"]):
        keys, values = (as_binary(c) for c in batch.columns)
        if keys.null_count or values.null_count:
            raise ValueError("raftkv import needs a non-null key and value in every row")
        yield from zip(keys.to_pylist(), values.to_pylist())


def _utf8(text: str | None) -> bytes:
    return text.encode("utf-8") if text else b""
