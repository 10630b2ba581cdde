"""What one journal has done since the node opened it: Hadoop's ``JournalMetrics`` counters.

``Journal`` updates these under its own lock, once per durable run of batches (never per record)
and once per refused request; ``qjm.server.metrics`` reads them at scrape time. Plain integers so
the pure protocol code (and the simulation running it) needs no metrics library.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence

from qjm.histogram import Histogram

_LAST_TXID = operator.itemgetter(1)


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

    def record_durable(
        self,
        index: Sequence[tuple[int, int, int, int]],
        first: int,
        end: int,
        committed: int,
        seconds: float,
        now: float,
    ) -> None:
        """Frames ``index[first:end]`` ((first_txid, last_txid, offset, length) each) were made
        durable by one sync of ``seconds``. A frame wholly at or below ``committed`` was already on
        a quorum before it arrived here: Hadoop's "written while lagging"."""
        n = end - first
        if n <= 0:
            return
        head, tail = index[first], index[end - 1]
        self.batches_written += n
        self.txns_written += tail[1] - head[0] + 1
        self.bytes_written += tail[2] + tail[3] - head[2]
        if head[1] <= committed:
            lagging = bisect.bisect_right(index, committed, first, end, key=_LAST_TXID) - first
            self.batches_written_while_lagging += lagging
        self.sync_seconds.observe(seconds)
        self.last_journal_time = now

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
