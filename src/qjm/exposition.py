"""Plain figures as Prometheus metric families, built at scrape time (node and writer collectors).

Both sides keep their figures in plain Python (``qjm.histogram``, ``qjm.server.journal_stats``,
``Writer.stats()``) and describe them to ``prometheus_client`` only when scraped: nothing on the
write path touches the metrics library. A family is declared with its label names and filled with
one sample per labelled thing (journal, node).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from qjm.histogram import Histogram


def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def counter(name: str, doc: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
    """``name`` without ``_total``: the family adds it."""
    return CounterMetricFamily(name, doc, labels=list(labels))


def histogram(name: str, doc: str, labels: Sequence[str] = ()) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=list(labels))


def add_histogram(family: HistogramMetricFamily, label_values: Sequence[str], h: Histogram) -> None:
    buckets = h.cumulative()
    family.add_metric(list(label_values), buckets=buckets, sum_value=h.total)
