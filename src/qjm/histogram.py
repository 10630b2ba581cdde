"""A latency histogram in plain integers, exposed to Prometheus only when scraped.

The node and the writer observe one value per batch on their hot paths; a ``prometheus_client``
metric would take a lock and build label children there. This keeps a bucket count per bound
(bisect on a short tuple) and a sum, and ``qjm.exposition`` turns a snapshot into a Prometheus
histogram at scrape time. Readers take no lock: a scrape may see a count one observation ahead of
the sum, which a monitoring system tolerates (the next scrape is consistent again).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

# Seconds: fdatasync on NVMe is ~50 µs-2 ms, on a busy SATA disk or a cloud volume 5-50 ms; the
# tail up to 10 s is where a node gets dropped (Hadoop logs a sync over 1 s as a warning).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class Histogram:
    """Counts of observations per upper bound (not cumulative), plus +Inf, their sum and count."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def add(self, counts: Sequence[int], total: float) -> None:
        """Count observations timed elsewhere: ``counts`` per bound of this histogram (+Inf last)."""
        if len(counts) != len(self.counts):
            raise ValueError(f"{len(counts)} counts for a histogram of {len(self.counts)} buckets")
        for i, n in enumerate(counts):
            self.counts[i] += n
        self.total += total

    def copy(self) -> Histogram:
        out = Histogram(self.bounds)
        out.counts, out.total = list(self.counts), self.total
        return out

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(bound as Prometheus writes it, observations <= bound), ending with ``+Inf``: the exposition form."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), list(self.counts), strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding the ``q`` quantile (``inf`` past the last bound, 0 when empty)."""
        counts = list(self.counts)
        n = sum(counts)
        if n == 0:
            return 0.0
        rank = q * n
        running = 0
        for bound, c in zip((*self.bounds, float("inf")), counts, strict=True):
            running += c
            if running >= rank:
                return bound
        return float("inf")
