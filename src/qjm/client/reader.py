"""Readers: committed records in txid order, from any replica, failing over between them.

Finalized segments are decided (design §3), so any replica serves them; the reader streams one
and, if that node dies mid-read, resumes from the next txid on another replica that holds at least
as much. The in-progress segment is read only up to what a majority of the current writer's nodes
hold (reference §4.3): the quorum-th highest count among replies from the newest writer epoch.
``tail`` is pushed committed frames by one node at a time instead (``qjm.client.follow``, design §3.1).
"""

from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Iterator
from dataclasses import replace

from qjm._native import framing
from qjm.client.follow import Follower
from qjm.client.manager import QuorumJournalManager
from qjm.client.record_batch import RecordBatch
from qjm.client.replicas import ReplicaReader, finalized_segments
from qjm.client.segment_stream import committed_in_progress
from qjm.config import QJMConfig, as_config
from qjm.errors import CorruptFrameError, NotFoundError, QJMError
from qjm.protocol.frame import FrameHeader
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
        try:
            from_txid = operator.index(from_txid)  # numpy's integers too
        except TypeError:
            raise TypeError(f"from_txid: expected an integer txid, got {type(from_txid).__name__}") from None
        if from_txid < 1:
            raise ValueError("txids start at 1")
        self.qjm = qjm
        self.next_txid = from_txid
        self.include_in_progress = include_in_progress
        self.max_txns = max_txns_per_poll
        self._replicas = ReplicaReader(qjm)
        self._follower: Follower | None = None
        self._closed = False

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End a ``tail`` in progress (from any thread) and release the nodes. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._follower is not None:
            self._follower.close()
        self.qjm.close()

    def __iter__(self) -> Iterator[Record]:
        """Everything committed now, from ``next_txid`` on; ends when caught up."""
        for buf, pos, h, limit in self._committed_frames():
            yield from self._records_of(buf, pos, h.first_txid, limit)

    def batches(self) -> Iterator[RecordBatch]:
        """``__iter__`` packed: a ``RecordBatch`` per frame (one buffer and an offsets array), no
        Python object per record."""
        for buf, pos, h, limit in self._committed_frames():
            b = self._batch_of(buf, pos, h, limit)
            if b is not None:
                yield b

    def _committed_frames(self) -> Iterator[tuple[bytes | bytearray, int, FrameHeader, int]]:
        """``(buffer, offset, header, limit)`` of each frame holding committed txids from
        ``next_txid`` on (``limit``: the last of them the frame may give); the caller takes the
        records and moves ``next_txid`` before asking for the next frame."""
        while True:
            before = self.next_txid
            for seg in finalized_segments(self.qjm, self.next_txid):
                if seg.start > self.next_txid:
                    raise NotFoundError(
                        f"gap in the journal: next txid {self.next_txid} is in no finalized segment the nodes "
                        f"listed (next segment starts at {seg.start})"
                    )
                for buf, pos, h in self._replicas.frames(seg, self.next_txid, seg.end):
                    yield buf, pos, h, seg.end
            if self.include_in_progress:
                since = self.next_txid
                durable, edits = committed_in_progress(self.qjm, since, self.max_txns)
                if edits is not None:
                    limit = since + durable - 1
                    pos = 0
                    while pos < len(edits.frames) and self.next_txid <= limit:
                        h = framing.verify_frame(edits.frames, pos)
                        yield edits.frames, pos, h, limit
                        pos += h.frame_len
            if self.next_txid == before:
                return

    def tail(self, stop: threading.Event | None = None, *, heartbeat: float = 0.25) -> Iterator[Record]:
        """Follow the journal: yields committed records as the nodes learn they are committed,
        until ``stop`` is set or ``close`` is called (design §3.1).

        One node at a time pushes them (``qjm.client.follow``); when it dies, goes silent for a
        few heartbeats, or lags the others, the next one takes over from the next txid. Never a
        record that is not committed, never one twice.
        """
        for buf, pos, h in self._followed_frames(stop, heartbeat):
            yield from self._records_of(buf, pos, h.first_txid, h.last_txid)

    def tail_batches(self, stop: threading.Event | None = None, *, heartbeat: float = 0.25) -> Iterator[RecordBatch]:
        """``tail`` packed: a ``RecordBatch`` per frame pushed (``batches``)."""
        for buf, pos, h in self._followed_frames(stop, heartbeat):
            b = self._batch_of(buf, pos, h, h.last_txid)
            if b is not None:
                yield b

    def _followed_frames(
        self, stop: threading.Event | None, heartbeat: float
    ) -> Iterator[tuple[bytes | bytearray, int, FrameHeader]]:
        if self._closed:
            raise QJMError("this reader is closed")
        follower = self._follower = Follower(self.qjm, heartbeat=heartbeat)
        yield from follower.frames(lambda: self.next_txid, stop)

    # -- where the reader is, and how records come out of a frame ----------------------------

    @property
    def failovers(self) -> int:
        return self._replicas.failovers + (self._follower.failovers if self._follower is not None else 0)

    @property
    def current_node(self) -> str:
        """The replica the reader is streaming from (a finalized segment, or the tail it follows)."""
        if self._follower is not None:
            return self._follower.current_node
        return self._replicas.current_node

    def _batch_of(self, buf: bytes | bytearray, pos: int, h: FrameHeader, limit: int) -> RecordBatch | None:
        """The records of a frame from ``next_txid`` through ``limit``, packed; moves ``next_txid``."""
        first = self.next_txid
        if h.first_txid > first:
            raise CorruptFrameError(f"txid gap: expected {first}, frame starts at {h.first_txid}")
        if first > min(h.last_txid, limit):
            return None
        data, offsets = framing.pack_records(buf, pos, first - h.first_txid)
        n = min(len(offsets) - 1, limit - first + 1)
        if n < len(offsets) - 1:
            del offsets[n + 1 :]
            data = data[: offsets[n]]
        self.next_txid = first + n
        return RecordBatch(first, data, offsets)

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
        config = replace(as_config(config), tls=tls)
    return Reader(QuorumJournalManager(uri, config=config), from_txid, include_in_progress=include_in_progress)
