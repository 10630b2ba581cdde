"""Readers: committed records in txid order, from any replica, failing over between them.

Finalized segments are decided (design §3), so any replica serves them; the reader streams one
and, if that node dies mid-read, resumes from the next txid on another replica that holds at least
as much. The in-progress segment is read only up to what a majority of the current writer's nodes
hold (reference §4.3): the quorum-th highest count among replies from the newest writer epoch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace

from qjm._native import framing
from qjm.client.manager import QuorumJournalManager
from qjm.client.replicas import ReplicaReader, finalized_segments
from qjm.client.segment_stream import committed_in_progress
from qjm.config import QJMConfig
from qjm.errors import CorruptFrameError, NotFoundError
from qjm.protocol.messages import JournaledEdits
from qjm.security.tls import TlsConfig

log = logging.getLogger("qjm.reader")

Record = tuple[int, bytes]


class Reader:
    """Iterates ``(txid, record)`` from ``from_txid``; ``tail()`` keeps following new commits."""

    def __init__(
        self,
        qjm: QuorumJournalManager,
        from_txid: int = 1,
        *,
        include_in_progress: bool = False,
        max_txns_per_poll: int = 5000,
    ) -> None:
        if from_txid < 1:
            raise ValueError("txids start at 1")
        self.qjm = qjm
        self.next_txid = from_txid
        self.include_in_progress = include_in_progress
        self.max_txns = max_txns_per_poll
        self._replicas = ReplicaReader(qjm)

    def __iter__(self) -> Iterator[Record]:
        """Everything committed now, from ``next_txid`` on; ends when caught up."""
        while True:
            got = False
            for rec in self._read_finalized():
                got = True
                yield rec
            if self.include_in_progress:
                for rec in self._read_in_progress():
                    got = True
                    yield rec
            if not got:
                return

    def tail(self, poll_interval: float = 0.05, stop: threading.Event | None = None) -> Iterator[Record]:
        """Follow the journal: yields committed records as they appear, until ``stop`` is set."""
        stop = stop or threading.Event()
        saved = self.include_in_progress
        self.include_in_progress = True
        try:
            while not stop.is_set():
                got = False
                for rec in self:
                    got = True
                    yield rec
                if not got:
                    stop.wait(poll_interval)
        finally:
            self.include_in_progress = saved

    # -- finalized segments ------------------------------------------------------------------

    @property
    def failovers(self) -> int:
        return self._replicas.failovers

    @property
    def current_node(self) -> str:
        """The replica the reader is streaming a finalized segment from."""
        return self._replicas.current_node

    def _read_finalized(self) -> Iterator[Record]:
        for seg in finalized_segments(self.qjm, self.next_txid):
            if seg.start > self.next_txid:
                raise NotFoundError(
                    f"gap in the journal: next txid {self.next_txid} is in no finalized segment the nodes listed "
                    f"(next segment starts at {seg.start})"
                )
            for buf, pos, h in self._replicas.frames(seg, self.next_txid, seg.end):
                yield from self._records_of(buf, pos, h.first_txid, seg.end)

    def _records_of(self, buf: bytes | bytearray, pos: int, first: int, limit: int) -> Iterator[Record]:
        if first > self.next_txid:
            raise CorruptFrameError(f"txid gap: expected {self.next_txid}, frame starts at {first}")
        recs = framing.decode_records(buf, pos)
        for i, rec in enumerate(recs):
            txid = first + i
            if txid > limit:
                return
            if txid == self.next_txid:
                self.next_txid += 1
                yield txid, rec

    # -- the in-progress segment -------------------------------------------------------------

    def _read_in_progress(self) -> Iterator[Record]:
        since = self.next_txid
        durable, edits = committed_in_progress(self.qjm, since, self.max_txns)
        if edits is not None:
            yield from self._records_from_edits(edits, since + durable - 1)

    def _records_from_edits(self, edits: JournaledEdits, limit: int) -> Iterator[Record]:
        buf = edits.frames
        pos = 0
        while pos < len(buf) and self.next_txid <= limit:
            h = framing.verify_frame(buf, pos)
            yield from self._records_of(buf, pos, h.first_txid, limit)
            pos += h.frame_len


def open_reader(
    uri: str,
    from_txid: int = 1,
    *,
    include_in_progress: bool = False,
    config: QJMConfig | None = None,
    tls: TlsConfig | None = None,
) -> Reader:
    """A reader of ``uri`` from ``from_txid``; needs no epoch, so it never disturbs the writer.
    ``tls`` connects with mutual TLS (it replaces ``config.tls``)."""
    if tls is not None:
        config = replace(config or QJMConfig(), tls=tls)
    return Reader(QuorumJournalManager(uri, config=config), from_txid, include_in_progress=include_in_progress)
