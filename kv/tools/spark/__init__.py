"""raftkv's data pipeline on Spark (the optional extra ``raftkv[spark]``: PySpark 4.x, pyarrow).

- Consistent export to Parquet with pyarrow, live (`export_live`) or from a snapshot file
  (`export_snapshot`, no cluster needed): kv.tools.spark.parquet_export.
- The PySpark data source ``raftkv`` (kv.tools.spark.datasource): ``register(spark)``, then
  ``spark.read.format("raftkv")`` / ``df.write.format("raftkv")``.
- Bulk load of (key, value) rows through the leader in batches: kv.tools.spark.bulk_load.
- The change feed, ``spark.readStream.format("raftkv")``: every change by revision, exactly once
  with a checkpoint (kv.tools.spark.stream).

This package imports pyspark only in kv.tools.spark.datasource, so export and import work with pyarrow
alone.
"""
from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make ``format("raftkv")`` available in `spark` (a SparkSession)."""
    from kv.tools.spark.datasource import RaftKVDataSource

    spark.dataSource.register(RaftKVDataSource)
