"""Parts of the Python data source API newer than the floor (pyspark 4.0), where they exist.

* Streaming admission control (read limits, ``Trigger.AvailableNow``) came in Spark 4.2
  (``pyspark.sql.streaming.datasource``). Before, the stand-ins below take its place: Spark hands
  no limit to ``latestOffset`` (the source applies ``maxRecordsPerTrigger`` itself) and never calls
  ``prepareForTriggerAvailableNow``, so ``Trigger.AvailableNow`` runs as Spark's own fallback.
* The Arrow stream writer (``DataSourceStreamArrowWriter``) came after 4.0: before, the stream
  sink gets rows, which ``arrow_batches`` turns into Arrow batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    NATIVE = True
except ImportError:  # pyspark < 4.2
    NATIVE = False

    class ReadLimit:  # type: ignore[no-redef]
        """How much one trigger may read (stand-in)."""

    @dataclass
    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        """No limit (stand-in)."""

    @dataclass
    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        """At most ``max_rows`` rows (stand-in)."""

        max_rows: int

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Marks a source that can stop at the end it saw when the query started (stand-in)."""

        def prepareForTriggerAvailableNow(self) -> None:
            raise NotImplementedError


try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamWriterBase

    ARROW_STREAM_WRITER = True
except ImportError:  # pyspark 4.0
    from pyspark.sql.datasource import DataSourceStreamWriter as StreamWriterBase  # type: ignore[assignment]

    ARROW_STREAM_WRITER = False

ROWS_PER_BATCH = 16_384


def arrow_batches(items: Iterator[Any]) -> Iterator[pa.RecordBatch]:
    """Arrow batches as they come, or rows (``pyspark.sql.Row``) gathered into batches."""
    rows: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, pa.RecordBatch):
            yield item
            continue
        rows.append(item.asDict(recursive=True))
        if len(rows) >= ROWS_PER_BATCH:
            yield pa.RecordBatch.from_pylist(rows)
            rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows)


__all__ = [
    "ARROW_STREAM_WRITER",
    "NATIVE",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxRows",
    "StreamWriterBase",
    "SupportsTriggerAvailableNow",
    "arrow_batches",
]
