"""A node's figures: Hadoop's ``JournalMetrics`` under Prometheus names, its health, its status page.

Everything is read at scrape time from what the node already keeps: each open journal's state
(``Journal.peek_state``, without its lock, so a scrape never waits behind a recovery download) and
its counters (``qjm.server.journal_stats``), the journals that failed to load, and a write probe
of the data directory. One ``CollectorRegistry`` per node, so that nodes sharing a process (the
in-process test cluster) never share a metric.

Names (Hadoop's in parentheses): per journal, label ``journal``:
``qjm_journal_batches_written_total`` (BatchesWritten), ``qjm_journal_txns_written_total``
(TxnsWritten), ``qjm_journal_bytes_written_total`` (BytesWritten),
``qjm_journal_batches_written_while_lagging_total`` (BatchesWrittenWhileLagging),
``qjm_journal_sync_seconds`` histogram (Syncs*), ``qjm_journal_last_written_txid``
(LastWrittenTxId), ``qjm_journal_last_promised_epoch`` (LastPromisedEpoch),
``qjm_journal_last_writer_epoch`` (LastWriterEpoch), ``qjm_journal_current_lag_txns``
(CurrentLagTxns), ``qjm_journal_last_journal_timestamp_seconds`` (LastJournalTimestamp), and
``qjm_journal_committed_txid``, ``qjm_journal_segments``, ``qjm_journal_disk_bytes``,
``qjm_journal_out_of_sync``, ``qjm_journal_out_of_sync_refusals_total``,
``qjm_journal_fenced_requests_total``, ``qjm_journal_formatted``. Per node: ``qjm_node_journals``,
``qjm_node_journal_load_failures``, ``qjm_node_storage_writable``, ``qjm_node_data_dir_free_bytes``,
``qjm_node_start_time_seconds``, ``qjm_node_info``; ``qjm_authz_denied_total`` (labels ``journal``,
``role``: requests refused for want of a role, design §9.2); ``qjm_node_data_connections_refused_total``
(label ``reason``: ``tls`` for a failed or missing TLS handshake, ``limit`` for max_data_connections);
``qjm_node_http_connections_refused_total`` (the same reasons for the HTTP port, ``limit`` for
max_http_connections).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from qjm._version import __version__
from qjm.exposition import add_histogram, counter, gauge, histogram
from qjm.protocol.messages import NO_TXID
from qjm.server.journal import Journal

PROBE_BYTES = 4096  # a full disk refuses a block, not always an empty file
DENIED_SERIES = 1024  # (journal, role) pairs counted apart; further journals count under "(other)"


def current_lag(committed: int, written: int) -> int:
    """Hadoop's CurrentLagTxns: how far this node's log is behind the committed txid (0 if unknown)."""
    if committed in (NO_TXID, 0):
        return 0
    return max(committed - written, 0)


def journal_figures(j: Journal) -> dict[str, object]:
    """One journal as the status page and the collector show it."""
    st = j.peek_state()
    s = j.record_stats()
    out: dict[str, object] = {"journal_id": j.journal_id, "formatted": st is not None}
    if st is not None:
        out.update(
            promised_epoch=st.last_promised_epoch,
            writer_epoch=st.last_writer_epoch,
            committed_txid=st.committed_txid,
            last_written_txid=st.highest_written_txid,
            lag_txns=current_lag(st.committed_txid, st.highest_written_txid),
            open_segment=st.open_segment_txid or None,
        )
    try:
        out["segments"] = len(j.storage.list_segments())
        out["disk_bytes"] = j.storage.disk_bytes()
    except OSError as e:
        out["storage_error"] = e.strerror or str(e)
    out.update(
        batches_written=s.batches_written,
        txns_written=s.txns_written,
        bytes_written=s.bytes_written,
        batches_written_while_lagging=s.batches_written_while_lagging,
        syncs=s.sync_seconds.count,
        sync_p50_seconds=s.sync_seconds.quantile(0.5),
        sync_p99_seconds=s.sync_seconds.quantile(0.99),
        last_journal_time=s.last_journal_time,
        out_of_sync=s.out_of_sync,
        out_of_sync_refusals=s.out_of_sync_refused,
        fenced_requests=s.fenced_refused,
        purged_segments=s.purged_segments,
        purged_bytes=s.purged_bytes,
        sync=j.sync_stats.as_dict(),
    )
    return out


def probe_writable(directory: str) -> str | None:
    """Write (not sync: a probe must not queue behind the journals' syncs) and remove a small
    file in ``directory``; None if that worked, else why not."""
    try:
        fd, path = tempfile.mkstemp(dir=directory, prefix=".qjm-health-")
    except OSError as e:
        return f"data directory {directory} is not writable: {e.strerror or e}"
    try:
        os.write(fd, bytes(PROBE_BYTES))
    except OSError as e:
        return f"data directory {directory} is not writable: {e.strerror or e}"
    finally:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
    return None


@dataclass
class Health:
    healthy: bool
    reasons: list[str] = field(default_factory=list)


class NodeMetrics(Collector):
    """The node's registry, health and status, over callables into the node."""

    def __init__(
        self,
        data_dir: str,
        journals: Callable[[], list[Journal]],
        load_failures: Callable[[], Mapping[str, str]],
        info: Callable[[], Mapping[str, str]],
        refused: Callable[[], Mapping[str, int]] = dict,
        http_refused: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self.data_dir = data_dir
        self._refused = refused
        self._http_refused = http_refused
        self._journals = journals
        self._failures = load_failures
        self._info = info
        self.started = time.time()
        self._denied: dict[tuple[str, str], int] = {}
        self._denied_lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def count_denied(self, identity: str, journal_id: str, role: str) -> None:
        """One request refused for want of ``role`` (``Authorizer.on_denied``)."""
        with self._denied_lock:
            key = (journal_id, role)
            if key not in self._denied and len(self._denied) >= DENIED_SERIES:
                key = ("(other)", role)
            self._denied[key] = self._denied.get(key, 0) + 1

    def denied(self) -> dict[tuple[str, str], int]:
        with self._denied_lock:
            return dict(self._denied)

    def health(self) -> Health:
        """Healthy only when the data directory takes a write and every journal on it loaded."""
        reasons: list[str] = []
        why = probe_writable(self.data_dir)
        if why is not None:
            reasons.append(why)
        for jid, err in sorted(self._failures().items()):
            reasons.append(f"journal {jid} did not load: {err}")
        return Health(not reasons, reasons)

    def status(self) -> dict[str, object]:
        h = self.health()
        return {
            "version": __version__,
            "data_dir": self.data_dir,
            **self._info(),
            "started": self.started,
            "uptime_seconds": round(time.time() - self.started, 3),
            "healthy": h.healthy,
            "reasons": h.reasons,
            "journals": [journal_figures(j) for j in sorted(self._journals(), key=lambda j: j.journal_id)],
            "load_failures": dict(self._failures()),
        }

    def collect(self) -> Iterator[Metric]:
        lj = ["journal"]
        fam: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "batches": counter("qjm_journal_batches_written", "Batches made durable (Hadoop BatchesWritten)", lj),
            "txns": counter("qjm_journal_txns_written", "Transactions made durable (Hadoop TxnsWritten)", lj),
            "bytes": counter("qjm_journal_bytes_written", "Frame bytes made durable (Hadoop BytesWritten)", lj),
            "lagging": counter(
                "qjm_journal_batches_written_while_lagging",
                "Batches already committed on a quorum when they arrived (Hadoop BatchesWrittenWhileLagging)",
                lj,
            ),
            "last_written": gauge(
                "qjm_journal_last_written_txid", "Highest txid durable on this node (Hadoop LastWrittenTxId)", lj
            ),
            "committed": gauge("qjm_journal_committed_txid", "Committed txid the writer last told this node", lj),
            "promised": gauge(
                "qjm_journal_last_promised_epoch", "Highest epoch promised (Hadoop LastPromisedEpoch)", lj
            ),
            "writer": gauge(
                "qjm_journal_last_writer_epoch",
                "Epoch of the writer that started the newest segment (Hadoop LastWriterEpoch)",
                lj,
            ),
            "lag": gauge(
                "qjm_journal_current_lag_txns",
                "Committed txid minus last written txid, 0 if unknown (Hadoop CurrentLagTxns)",
                lj,
            ),
            "last_time": gauge(
                "qjm_journal_last_journal_timestamp_seconds",
                "Wall clock of the last durable batch, 0 if none since loaded (Hadoop LastJournalTimestamp)",
                lj,
            ),
            "segments": gauge("qjm_journal_segments", "Segment files (finalized and in progress)", lj),
            "disk": gauge("qjm_journal_disk_bytes", "Bytes of the journal's files on disk", lj),
            "oos": gauge(
                "qjm_journal_out_of_sync",
                "1 while this node refuses the writer's batches until its next segment (a gap, no open segment)",
                lj,
            ),
            "oos_refused": counter(
                "qjm_journal_out_of_sync_refusals", "Batches refused as out of sync or out of order", lj
            ),
            "fenced": counter(
                "qjm_journal_fenced_requests", "Requests and batches refused for a stale epoch (fenced writers)", lj
            ),
            "purged_segments": counter(
                "qjm_journal_purged_segments", "Segment files removed by purges (retention)", lj
            ),
            "purged_bytes": counter("qjm_journal_purged_bytes", "Bytes of segment files removed by purges", lj),
            "formatted": gauge("qjm_journal_formatted", "1 if the journal is formatted on this node", lj),
            "sync_segments": counter(
                "qjm_sync_segments_downloaded",
                "Finalized segments catch-up copied from peers (Hadoop NumEditLogsSynced)",
                lj,
            ),
            "sync_bytes": counter("qjm_sync_bytes", "Bytes catch-up downloaded from peers", lj),
            "sync_divergences": counter(
                "qjm_sync_divergences",
                "Peers' finalized segments refused because a different finalized segment is here",
                lj,
            ),
            "sync_failures": counter("qjm_sync_failures", "Catch-up rounds or downloads that failed", lj),
            "sync_last": gauge(
                "qjm_sync_last_run_timestamp_seconds", "Wall clock of the last catch-up round, 0 if none", lj
            ),
        }
        syncs = histogram(
            "qjm_journal_sync_seconds", "Duration of the fdatasync making a run of batches durable (Hadoop Syncs)", lj
        )
        journals = self._journals()
        for j in journals:
            label = [j.journal_id]
            st = j.peek_state()
            s = j.record_stats()
            fam["batches"].add_metric(label, s.batches_written)
            fam["txns"].add_metric(label, s.txns_written)
            fam["bytes"].add_metric(label, s.bytes_written)
            fam["lagging"].add_metric(label, s.batches_written_while_lagging)
            fam["last_time"].add_metric(label, s.last_journal_time)
            fam["oos"].add_metric(label, 1 if s.out_of_sync else 0)
            fam["oos_refused"].add_metric(label, s.out_of_sync_refused)
            fam["fenced"].add_metric(label, s.fenced_refused)
            fam["purged_segments"].add_metric(label, s.purged_segments)
            fam["purged_bytes"].add_metric(label, s.purged_bytes)
            fam["formatted"].add_metric(label, 0 if st is None else 1)
            ss = j.sync_stats
            fam["sync_segments"].add_metric(label, ss.segments_downloaded)
            fam["sync_bytes"].add_metric(label, ss.bytes)
            fam["sync_divergences"].add_metric(label, ss.divergences)
            fam["sync_failures"].add_metric(label, ss.failures)
            fam["sync_last"].add_metric(label, ss.last_run)
            add_histogram(syncs, label, s.sync_seconds)
            if st is not None:
                fam["last_written"].add_metric(label, st.highest_written_txid)
                fam["committed"].add_metric(label, st.committed_txid)
                fam["promised"].add_metric(label, st.last_promised_epoch)
                fam["writer"].add_metric(label, st.last_writer_epoch)
                fam["lag"].add_metric(label, current_lag(st.committed_txid, st.highest_written_txid))
            try:
                fam["segments"].add_metric(label, len(j.storage.list_segments()))
                fam["disk"].add_metric(label, j.storage.disk_bytes())
            except OSError:
                pass  # the storage error shows on /health and /status; the scrape goes on
        yield from fam.values()
        yield syncs
        denied = counter(
            "qjm_authz_denied", "Requests refused because the caller's identity lacks the role", ["journal", "role"]
        )
        for (jid, role), n in sorted(self.denied().items()):
            denied.add_metric([jid, role], n)
        yield denied
        refused = counter(
            "qjm_node_data_connections_refused",
            "Data-plane connections the node refused before any frame: a failed or missing TLS handshake "
            "(reason tls), or max_data_connections reached (reason limit)",
            ["reason"],
        )
        for reason, n in sorted(self._refused().items()):
            refused.add_metric([reason], n)
        yield refused
        http_refused = counter(
            "qjm_node_http_connections_refused",
            "HTTP-port connections the node refused before any request: a failed or missing TLS handshake "
            "(reason tls), or max_http_connections reached (reason limit)",
            ["reason"],
        )
        for reason, n in sorted(self._http_refused().items()):
            http_refused.add_metric([reason], n)
        yield http_refused

        yield _value(gauge("qjm_node_journals", "Journals loaded on this node"), len(journals))
        yield _value(
            gauge("qjm_node_journal_load_failures", "Journals on disk that failed to load"), len(self._failures())
        )
        yield _value(
            gauge("qjm_node_storage_writable", "1 if the data directory takes a write"),
            1 if probe_writable(self.data_dir) is None else 0,
        )
        try:
            vfs = os.statvfs(self.data_dir)
            yield _value(
                gauge("qjm_node_data_dir_free_bytes", "Bytes free for the data directory"), vfs.f_bavail * vfs.f_frsize
            )
        except OSError:
            pass
        yield _value(gauge("qjm_node_start_time_seconds", "Wall clock the node started at"), self.started)
        info = {"version": __version__, **self._info()}
        fam_info = gauge("qjm_node_info", "The node's version and addresses", list(info))
        fam_info.add_metric(list(info.values()), 1)
        yield fam_info


def _value(family: GaugeMetricFamily, value: float) -> GaugeMetricFamily:
    family.add_metric([], value)
    return family
