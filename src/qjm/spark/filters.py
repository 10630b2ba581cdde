"""Filter pushdown for batch reads (Spark 4.1+ ``DataSourceReader.pushFilters``): ``txid`` bounds.

A ``WHERE`` on ``txid`` (``=``, ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN``) narrows the txid
range the reader plans, so segments outside it are never downloaded. Filters are recognised by
their class name, so this module needs no pyspark newer than the floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COLUMN = "txid"


@dataclass(slots=True)
class TxidBounds:
    """``lo <= txid <= hi`` (``hi=None``: no upper bound), narrowed by each pushed filter."""

    lo: int = 1
    hi: int | None = None
    pushed: int = 0  # how many filters narrowed the range (for tests and logs)

    def _cap(self, hi: int) -> None:
        self.hi = hi if self.hi is None else min(self.hi, hi)

    def narrow(self, f: Any) -> bool:
        """Narrow by ``f`` if it bounds ``txid``; True when the range alone enforces it exactly."""
        attr = getattr(f, "attribute", None)
        if not isinstance(attr, tuple) or len(attr) != 1 or str(attr[0]).lower() != COLUMN:
            return False
        kind = type(f).__name__
        value = getattr(f, "value", None)
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        if kind == "EqualTo":
            self.lo = max(self.lo, value)
            self._cap(value)
        elif kind == "GreaterThan":
            self.lo = max(self.lo, value + 1)
        elif kind == "GreaterThanOrEqual":
            self.lo = max(self.lo, value)
        elif kind == "LessThan":
            self._cap(value - 1)
        elif kind == "LessThanOrEqual":
            self._cap(value)
        else:
            return False
        self.pushed += 1
        return True
