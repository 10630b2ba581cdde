"""Catch-up: a node fetches the finalized segments its peers hold and it lacks (design §4.4;
Hadoop's ``JournalNodeSyncer``, HDFS-4025).

Plain protocol over injected parts, so that the simulation runs this same code: the journal, a
function listing a peer's segments, the segment fetcher recovery uses, a clock and a sleep. One
round asks one peer (round robin), compares, and downloads what is missing through
``Journal.install_synced``, which verifies every frame and decides under the journal's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from qjm.errors import QJMError
from qjm.protocol.messages import RemoteEditLog
from qjm.server.journal import Journal, SegmentFetcher

log = logging.getLogger("qjm.syncer")

PeerManifest = Callable[[str, str, bool], Sequence[RemoteEditLog]]
"""manifest(peer, journal_id, in_progress_ok) -> the peer's segments (``get_edit_log_manifest(1, ...)``)."""


class SyncBugs(Protocol):
    """The test-only switch catch-up reads (``qjm.testing.bugs.ProtocolBugs`` has it)."""

    @property
    def sync_takes_in_progress(self) -> bool: ...


class RateLimit:
    """A token bucket of ``rate`` bytes a second (0: no limit) over an injected clock and sleep;
    one burst of a second's worth is allowed."""

    def __init__(
        self,
        rate: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(rate)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate) - n
            self._at = now
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)


class JournalSyncer:
    """Catch-up rounds for one journal. ``peers`` are the other nodes' control-plane addresses."""

    def __init__(
        self,
        journal: Journal,
        peers: Sequence[str],
        manifest: PeerManifest,
        fetch: SegmentFetcher,
        *,
        limit: RateLimit | None = None,
        wall: Callable[[], float] = time.time,
        bugs: SyncBugs | None = None,
    ) -> None:
        self.journal = journal
        self.peers = list(peers)
        self._manifest = manifest
        self._fetch = fetch
        self._limit = limit or RateLimit(0)
        self._wall = wall
        self._bugs = bugs
        self._next = 0

    def run_once(self) -> int:
        """One round against the next peer; returns the segments installed. Never raises a
        ``QJMError``: a failure is logged and counted, and the next round tries the next peer."""
        j = self.journal
        stats = j.sync_stats
        if not self.peers or not j.is_formatted():
            return 0
        peer = self.peers[self._next % len(self.peers)]
        self._next += 1
        takes_open = self._bugs is not None and self._bugs.sync_takes_in_progress
        installed = 0
        try:
            logs = sorted(self._manifest(peer, j.journal_id, takes_open), key=lambda x: x.start_txid)
            for x in logs:
                if x.in_progress and not takes_open:
                    continue  # only finalized segments are decided; an open one may still change
                verdict = j.sync_need(x.start_txid, x.end_txid)
                if verdict == "missing" or verdict == "stale":
                    verdict = j.install_synced(
                        x.start_txid, x.end_txid, self._metered(self._fetch(peer, j.journal_id, x.start_txid))
                    )
                if verdict == "installed":
                    installed += 1
                    stats.segments_downloaded += 1
                elif verdict == "diverged":
                    stats.divergences += 1
                    log.error(
                        "journal %s: peer %s holds finalized segment %d-%d, which overlaps a different segment "
                        "here; not replacing it (a divergence: compare the copies)",
                        j.journal_id, peer, x.start_txid, x.end_txid,
                    )  # fmt: skip
        except QJMError as e:
            stats.failures += 1
            stats.last_error = f"{peer}: {type(e).__name__}: {e}"
            log.warning("journal %s: catch-up from %s failed: %s: %s", j.journal_id, peer, type(e).__name__, e)
        stats.runs += 1
        stats.last_run = self._wall()
        if installed:
            log.info("journal %s: caught up %d segment(s) from %s", j.journal_id, installed, peer)
        return installed

    def _metered(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        stats = self.journal.sync_stats
        for chunk in chunks:
            self._limit.take(len(chunk))
            stats.bytes += len(chunk)
            yield chunk
