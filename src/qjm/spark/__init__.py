"""Spark 4 integration: a journal as a batch/streaming source and an exactly-once sink (format ``qjm``).

>>> import qjm.spark
>>> qjm.spark.register(spark)
>>> spark.read.format("qjm").option("uri", "qjournal://h1:8485;h2:8485;h3:8485/log").load()

Needs ``pip install qjm[spark]`` (pyspark >= 4.0 and pyarrow). See docs/spark.md for the options.
"""

from __future__ import annotations

from typing import Any

from qjm.spark.markers import MAGIC, Marker, decode_marker, is_marker

__all__ = ["MAGIC", "PUSHDOWN_CONF", "Marker", "QJMDataSource", "decode_marker", "is_marker", "register"]


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any) -> None:
    """Make ``format("qjm")`` available in this session (Python data sources are per session).

    On Spark 4.1+ this also turns on filter pushdown for Python data sources (``PUSHDOWN_CONF``):
    the batch reader pushes ``txid`` bounds, and Spark refuses a reader that implements
    ``pushFilters`` while the setting is off.
    """
    from pyspark.sql.datasource import DataSourceReader

    from qjm.spark.source import QJMDataSource

    if hasattr(DataSourceReader, "pushFilters"):
        spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(QJMDataSource)


def __getattr__(name: str) -> Any:
    """``QJMDataSource`` imports pyspark: load it only when asked for."""
    if name == "QJMDataSource":
        from qjm.spark.source import QJMDataSource

        return QJMDataSource
    raise AttributeError(f"module 'qjm.spark' has no attribute {name!r}")
