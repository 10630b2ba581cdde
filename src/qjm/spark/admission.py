"""Spark's streaming admission-control API (read limits, ``Trigger.AvailableNow``), where it exists.

It came in Spark 4.2 (``pyspark.sql.streaming.datasource``). On 4.0 and 4.1 the stand-ins below
take its place: Spark never hands a limit to ``latestOffset`` there (the source applies
``maxRecordsPerTrigger`` itself) and never calls ``prepareForTriggerAvailableNow``, so
``Trigger.AvailableNow`` runs as Spark's own fallback (read all, then stop).
"""

from __future__ import annotations

from dataclasses import dataclass

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


__all__ = ["NATIVE", "ReadAllAvailable", "ReadLimit", "ReadMaxRows", "SupportsTriggerAvailableNow"]
