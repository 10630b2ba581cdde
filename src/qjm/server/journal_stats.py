"""What one journal has done since the node opened it: Hadoop's ``JournalMetrics`` counters.

``Journal`` updates these under its own lock, from its write gate's counters when read (never per
record) and once per refused request; ``qjm.server.metrics`` reads them at scrape time. Plain integers so
the pure protocol code (and the simulation running it) needs no metrics library.
"""

from __future__ import annotations

from collections.abc import Sequence

from qjm.histogram import Histogram


class JournalStats:
    """Counters of one journal. ``batches`` are the writer's frames (Hadoop: one ``journal`` call each)."""

    __slots__ = (
        "batches_written",
        "batches_written_while_lagging",
        "bytes_written",
        "fenced_refused",
        "last_journal_time",
        "out_of_sync",
        "out_of_sync_refused",
        "purged_bytes",
        "purged_segments",
        "sync_seconds",
        "txns_written",
    )

    def __init__(self) -> None:
        self.batches_written = 0
        self.txns_written = 0
        self.bytes_written = 0
        self.batches_written_while_lagging = 0
        self.sync_seconds = Histogram()
        self.last_journal_time = 0.0  # wall clock of the last durable batch (0: none since opened)
        self.fenced_refused = 0
        self.out_of_sync_refused = 0
        self.purged_segments = 0  # segment files a purge removed
        self.purged_bytes = 0
        self.out_of_sync = False  # refused the writer's batches this segment; cleared by the next start

    def add_durable(
        self,
        batches: int,
        txns: int,
        nbytes: int,
        lagging: int,
        sync_counts: Sequence[int],
        sync_total: float,
        last_time: float,
    ) -> None:
        """Count durable runs a segment's write gate kept (``qjm._native.gate``'s ``take_stats``):
        frames, txns and bytes made durable, the frames wholly at or below the committed txid when
        they came (already on a quorum: Hadoop's "written while lagging"), the syncs' times per
        bucket of ``sync_seconds`` and their sum, and the wall clock of the last one (0: none)."""
        if not batches:
            return
        self.batches_written += batches
        self.txns_written += txns
        self.bytes_written += nbytes
        self.batches_written_while_lagging += lagging
        self.sync_seconds.add(sync_counts, sync_total)
        self.last_journal_time = last_time

    def record_out_of_sync(self) -> None:
        self.out_of_sync_refused += 1
        self.out_of_sync = True


class SyncStats:
    """What catch-up (``qjm.server.syncer``, design §4.4) did for one journal since the node opened it."""

    __slots__ = ("bytes", "divergences", "failures", "last_error", "last_run", "runs", "segments_downloaded")

    def __init__(self) -> None:
        self.runs = 0
        self.segments_downloaded = 0
        self.bytes = 0  # bytes of installed and discarded downloads alike
        self.divergences = 0  # peers' finalized segments refused because a different one is here
        self.failures = 0  # rounds or downloads that failed (peer down, damaged download)
        self.last_run = 0.0  # wall clock of the end of the last round (0: none since opened)
        self.last_error = ""

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}
