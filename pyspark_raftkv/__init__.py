"""Lets PySpark find raftkv's data source by module name:
spark.read.format("pyspark_raftkv")... (or register it once with kv.tools.spark.register(spark) and use
the short name "raftkv")."""
from kv.tools.spark.datasource import RaftKVDataSource as DefaultSource

__all__ = ["DefaultSource"]
