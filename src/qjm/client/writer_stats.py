"""What a writer reports about itself and each node: ``Writer.stats()`` (Hadoop ``IPCLoggerChannelMetrics``).

Per node: bytes sent and not yet acknowledged (QueuedEditsSize), how many committed txids it has
not acknowledged (CurrentLagTxns), whether it is out of sync until the next segment (IsOutOfSync),
whether it fenced this writer, and the time from sending a batch to seeing the node's ack
(WritesE2E). The writer's own figures ride along: epoch, txids, batches in flight, totals sent and
the time each batch took to reach its quorum.

Over the native fan-out each link times its own acks (``Fanout.take_latencies``: every frame
from its send to the ack covering it being read, with no Python per ack or per batch; an ack a
parked link holds back is read by the next sync) and the node's logger keeps the sum
(``RemoteLogger.write_latency``). Elsewhere (the pure-Python links, the simulation)
each batch's send time is kept per node, and whenever the writer looks (at each batch's quorum,
and at each ``stats()``), every batch a node has acknowledged since is timed to that moment: an
upper bound, tight for the nodes that made the quorum and at most one batch interval late for a
node acknowledging after it.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qjm.client.channel import RemoteLogger
from qjm.client.loggers import Logger
from qjm.histogram import Histogram

PENDING_PER_NODE = 4096  # send times kept per node; a node that stops acknowledging loses the oldest


@dataclass(frozen=True, slots=True)
class NodeStats:
    node: str
    acked_txid: int
    lag_txns: int
    queued_bytes: int
    out_of_sync: bool
    fenced: bool
    write_seconds: Histogram  # a copy


@dataclass(frozen=True, slots=True)
class WriterStats:
    journal_id: str
    epoch: int
    segment_txid: int
    last_txid: int
    committed_txid: int
    inflight_batches: int
    batches_sent: int
    txns_sent: int
    bytes_sent: int
    commit_seconds: Histogram  # a copy
    nodes: tuple[NodeStats, ...]
    one_call_syncs: int = 0  # syncs whose batch, quorum and commit notice went in one native call


class NodeProbe:
    """How the writer reads one node's figures: callables, so any logger (remote or simulated) fits."""

    __slots__ = ("acked", "fenced", "latency", "name", "out_of_sync", "queued_bytes")

    def __init__(
        self,
        name: str,
        acked: Callable[[], int],
        out_of_sync: Callable[[], bool],
        queued_bytes: Callable[[], int] = lambda: 0,
        fenced: Callable[[], bool] = lambda: False,
        latency: Callable[[], Histogram] | None = None,
    ) -> None:
        self.name = name
        self.latency = latency  # the node's write latencies, when its links time them; else AckTimer's
        self.acked = acked
        self.out_of_sync = out_of_sync
        self.queued_bytes = queued_bytes
        self.fenced = fenced


def probe_for(lg: Logger) -> NodeProbe:
    """A remote node reports all its figures; another logger (the simulation's) only whether it is in sync."""
    if isinstance(lg, RemoteLogger):
        return NodeProbe(
            lg.name,
            lambda: lg.highest_acked_txid,
            lambda: lg.out_of_sync,
            lg.unacked_bytes,
            lambda: lg.fenced,
            lg.write_latency if lg.times_acks else None,
        )
    return NodeProbe(lg.name, lambda: 0, lambda: lg.out_of_sync)


def lag(committed: int, acked: int) -> int:
    """Hadoop's client CurrentLagTxns: committed txids this node has not acknowledged (>= 0)."""
    return max(committed - acked, 0) if committed > 0 else 0


class AckTimer:
    """Send times per node, timed against the node's acked txid whenever ``poll`` runs. Thread-safe."""

    def __init__(self, probes: Sequence[NodeProbe]) -> None:
        self.probes = list(probes)
        self._pending = [collections.deque[tuple[int, float]](maxlen=PENDING_PER_NODE) for _ in self.probes]
        self.latency = [Histogram() for _ in self.probes]
        self._lock = threading.Lock()
        # The nodes timed here: a sync that made its quorum over links that time themselves has
        # nothing to do here, which matters because Python right after the wait runs on cold
        # caches (a poll after each quorum costs ~20 µs of sync latency, docs/performance.md).
        self._timed = [
            (p, q, h) for p, q, h in zip(self.probes, self._pending, self.latency, strict=True) if p.latency is None
        ]

    def sent(self, last_txid: int, at: float) -> None:
        if not self._timed:
            return
        with self._lock:
            for _, pending, _ in self._timed:
                pending.append((last_txid, at))

    def poll(self, now: float) -> None:
        if not self._timed:
            return
        with self._lock:
            for probe, pending, hist in self._timed:
                if not pending:
                    continue
                if probe.out_of_sync():
                    pending.clear()  # it will never ack these: its next segment starts afresh
                    continue
                acked = probe.acked()
                while pending and pending[0][0] <= acked:
                    hist.observe(now - pending.popleft()[1])

    def snapshot(self, committed: int) -> tuple[NodeStats, ...]:
        out = []
        with self._lock:
            for probe, hist in zip(self.probes, self.latency, strict=True):
                acked = probe.acked()
                out.append(
                    NodeStats(
                        node=probe.name,
                        acked_txid=acked,
                        lag_txns=lag(committed, acked),
                        queued_bytes=probe.queued_bytes(),
                        out_of_sync=probe.out_of_sync(),
                        fenced=probe.fenced(),
                        write_seconds=hist.copy() if probe.latency is None else probe.latency(),
                    )
                )
        return tuple(out)
