"""A writer's figures for Prometheus: ``Writer.stats()`` read at scrape time.

    registry = CollectorRegistry()
    registry.register(WriterCollector(writer))
    server, thread = prometheus_client.start_http_server(9480, addr="127.0.0.1", registry=registry)

Names (Hadoop ``IPCLoggerChannelMetrics`` in parentheses), labels ``journal`` and, per node, ``node``:
``qjm_writer_node_queued_bytes`` (QueuedEditsSize), ``qjm_writer_node_lag_txns`` (CurrentLagTxns),
``qjm_writer_node_out_of_sync`` (IsOutOfSync), ``qjm_writer_node_write_seconds`` histogram
(WritesE2E), ``qjm_writer_node_fenced``, ``qjm_writer_node_acked_txid``; and the writer's
``qjm_writer_epoch``, ``qjm_writer_segment_txid``, ``qjm_writer_last_txid``,
``qjm_writer_committed_txid``, ``qjm_writer_inflight_batches``, ``qjm_writer_batches_sent_total``,
``qjm_writer_txns_sent_total``, ``qjm_writer_bytes_sent_total``, ``qjm_writer_one_call_syncs_total``,
``qjm_writer_commit_seconds``.
One collector per writer; register writers of different journals in one registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qjm.client.writer import Writer
from qjm.exposition import add_histogram, counter, gauge, histogram

Family = Callable[[str, str, Sequence[str]], GaugeMetricFamily | CounterMetricFamily]


class WriterCollector(Collector):
    def __init__(self, writer: Writer) -> None:
        self._stats = writer.stats

    def collect(self) -> Iterator[Metric]:
        st = self._stats()
        jl = [st.journal_id]
        scalars: list[tuple[Family, str, str, int]] = [
            (gauge, "qjm_writer_epoch", "The writer's epoch", st.epoch),
            (gauge, "qjm_writer_segment_txid", "First txid of the segment being written", st.segment_txid),
            (gauge, "qjm_writer_last_txid", "Txid of the last record appended", st.last_txid),
            (gauge, "qjm_writer_committed_txid", "Every txid up to this one is on a quorum", st.committed_txid),
            (gauge, "qjm_writer_inflight_batches", "Batches sent and not yet on a quorum", st.inflight_batches),
            (counter, "qjm_writer_batches_sent", "Batches sent to the nodes", st.batches_sent),
            (counter, "qjm_writer_txns_sent", "Transactions sent to the nodes", st.txns_sent),
            (counter, "qjm_writer_bytes_sent", "Frame bytes sent to each node", st.bytes_sent),
            (counter, "qjm_writer_one_call_syncs", "Syncs done in one native call", st.one_call_syncs),
        ]
        for family, name, doc, value in scalars:
            m = family(name, doc, ["journal"])
            m.add_metric(jl, value)
            yield m
        commit = histogram("qjm_writer_commit_seconds", "Time from sending a batch to its quorum", ["journal"])
        add_histogram(commit, jl, st.commit_seconds)
        yield commit

        labels = ["journal", "node"]
        queued = gauge(
            "qjm_writer_node_queued_bytes",
            "Bytes sent to the node and not acknowledged (Hadoop QueuedEditsSize)",
            labels,
        )
        lag = gauge(
            "qjm_writer_node_lag_txns",
            "Committed txid minus the node's highest acknowledged txid (Hadoop CurrentLagTxns)",
            labels,
        )
        oos = gauge(
            "qjm_writer_node_out_of_sync", "1 while the node takes no batches until the next segment (Hadoop "
            "IsOutOfSync)", labels,
        )  # fmt: skip
        fenced = gauge("qjm_writer_node_fenced", "1 if the node refused this writer as fenced", labels)
        acked = gauge("qjm_writer_node_acked_txid", "Highest txid the node acknowledged as durable", labels)
        writes = histogram(
            "qjm_writer_node_write_seconds",
            "Time from sending a batch to seeing the node's ack, an upper bound (Hadoop WritesE2E)",
            labels,
        )
        for n in st.nodes:
            nl = [st.journal_id, n.node]
            queued.add_metric(nl, n.queued_bytes)
            lag.add_metric(nl, n.lag_txns)
            oos.add_metric(nl, 1 if n.out_of_sync else 0)
            fenced.add_metric(nl, 1 if n.fenced else 0)
            acked.add_metric(nl, n.acked_txid)
            add_histogram(writes, nl, n.write_seconds)
        yield from (queued, lag, oos, fenced, acked, writes)
