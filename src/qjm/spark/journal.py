"""Frame-level reading of a journal for Spark: txid ranges with each record's segment and writer epoch.

``qjm.client.reader.Reader`` yields ``(txid, record)`` only and decodes every frame before its
start; Spark needs the frame header (epoch, segment) of each record and reads many disjoint
ranges, so this module reads whole frames with the same rules as ``Reader``:

* finalized segments are decided, so any replica serves them; a download that fails mid-way
  resumes at the next txid on another replica (``qjm.client.replicas``, shared with ``Reader``);
* the in-progress segment is read only up to what a majority of the newest writer's nodes hold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from qjm._native import framing
from qjm.client.loggers import CallHooks
from qjm.client.manager import QuorumJournalManager
from qjm.client.replicas import ReplicaReader, Segment, finalized_segments
from qjm.client.segment_stream import committed_in_progress
from qjm.config import QJMConfig
from qjm.errors import CorruptFrameError, NotFoundError, QuorumError
from qjm.spark.markers import MAGIC, Marker, decode_marker

log = logging.getLogger("qjm.spark")

# in-progress reads ask each node for at most this many txns per call (bounds reply size)
EDITS_PER_CALL = 20_000
OPEN_END = (1 << 63) - 1  # the end of the open segment: not fixed yet


@dataclass(frozen=True, slots=True)
class Head:
    """A segment's start of txids, its end (``OPEN_END`` while it is open), the epoch of the writer
    that started it, and its first record when that is a marker alone in its frame.

    What a segment's first frame holds never changes once committed, so heads are cached.
    """

    start: int
    end: int
    epoch: int
    marker: Marker | None


def head_marker(buf: bytes | bytearray, pos: int, record_count: int) -> Marker | None:
    """The marker a segment's first frame holds, if that frame is one marker alone."""
    if record_count != 1:
        return None
    (rec,) = framing.decode_records(buf, pos)
    return decode_marker(bytes(rec)) if bytes(rec[: len(MAGIC)]) == MAGIC else None


@dataclass(slots=True)
class Chunk:
    """Consecutive records from one frame: txids ``first .. first + len(records) - 1``."""

    first: int
    segment: int
    epoch: int
    records: list[bytes]

    @property
    def last(self) -> int:
        return self.first + len(self.records) - 1


class JournalClient:
    """A reader's handle on a journal; needs no epoch, so it never disturbs the writer. Not thread-safe."""

    def __init__(self, uri: str, config: QJMConfig | None = None, hooks: CallHooks | None = None) -> None:
        self.qjm = QuorumJournalManager(uri, config=config, hooks=hooks)
        self._replicas = ReplicaReader(self.qjm)
        self._heads: dict[tuple[int, int], Head] = {}

    @property
    def failovers(self) -> int:
        return self._replicas.failovers

    def close(self) -> None:
        self.qjm.close()

    def __enter__(self) -> JournalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what is there -----------------------------------------------------------------------

    def finalized(self, since: int = 1) -> list[Segment]:
        """Finalized segments ending at or after ``since``, oldest first (manifests of a majority)."""
        return finalized_segments(self.qjm, since)

    def committed_end(self, since: int = 1, limit: int | None = None) -> int:
        """The last committed txid reachable without a gap from ``since`` (``since - 1`` if none).

        With ``limit``, stops after that many txids: a streaming trigger must not pull the whole
        in-progress segment just to learn where it ends.
        """
        cap = since - 1 + limit if limit is not None else None
        end = since - 1
        for seg in self.finalized(since):
            if seg.start > end + 1:
                if end < since:
                    raise NotFoundError(
                        f"txid {since} is in no segment the nodes list (the next starts at {seg.start}; purged?)"
                    )
                break
            end = seg.end
        if cap is not None and end >= cap:
            return cap
        while cap is None or end < cap:
            want = EDITS_PER_CALL if cap is None else min(EDITS_PER_CALL, cap - end)
            durable, _ = committed_in_progress(self.qjm, end + 1, want)
            end += max(durable, 0)
            if durable < want:  # caught up with what a majority holds
                break
        return end

    def heads(self) -> list[Head]:
        """Every segment's ``Head``, oldest first: the finalized ones and the open one if it holds a
        committed txid. Costs one download of a first frame per segment not seen before."""
        segs = self.finalized(1)
        out: list[Head] = []
        for seg in segs:
            head = self._heads.get((seg.start, seg.end))
            if head is None:
                for buf, pos, h in self._replicas.frames(seg, seg.start, seg.start):
                    head = Head(seg.start, seg.end, h.epoch, head_marker(buf, pos, h.record_count))
                    break
                assert head is not None  # frames() yields the first frame or raises
                self._heads[(seg.start, seg.end)] = head
            out.append(head)
        nxt = segs[-1].end + 1 if segs else 1
        head = self._heads.get((nxt, OPEN_END))
        if head is None:
            durable, edits = committed_in_progress(self.qjm, nxt, 1)
            if durable > 0 and edits is not None:
                h = framing.decode_header(edits.frames, 0)
                if h.segment_txid == nxt:
                    head = Head(nxt, OPEN_END, h.epoch, head_marker(edits.frames, 0, h.record_count))
                    self._heads[(nxt, OPEN_END)] = head
        if head is not None:
            out.append(head)
        return out

    # -- reading -----------------------------------------------------------------------------

    def read(
        self, start: int, end: int, *, prefer: int = 0, timeout: float = 120.0, singletons: bool = False
    ) -> Iterator[Chunk]:
        """Every record ``start..end`` exactly once, in txid order, from any replica.

        ``end`` must be committed already (see ``committed_end``). If the in-progress part looks
        shorter for a while (a node holding it died and no writer has recovered it yet), this
        polls for up to ``timeout`` seconds before giving up. ``prefer`` rotates the replica order
        so that parallel partitions spread over the nodes. ``singletons`` yields only the records
        that are alone in their frame (where the Spark sink puts its markers) without decoding others.
        """
        nxt = start
        deadline: float | None = None
        pause = 0.05
        while nxt <= end:
            segs = self.finalized(nxt)
            if segs and segs[0].start > nxt:
                raise NotFoundError(f"txid {nxt} is in no finalized segment (the next starts at {segs[0].start})")
            if segs:
                stop = min(end, segs[0].end)
                yield from self._read_finalized(segs[0], nxt, stop, prefer, singletons)
                nxt = stop + 1  # not the last chunk's end: ``singletons`` may skip the segment's tail
                deadline = None
                continue
            got = False
            for chunk in self._read_in_progress(nxt, min(end - nxt + 1, EDITS_PER_CALL)):
                got = True
                nxt = chunk.last + 1
                if not singletons or len(chunk.records) == 1:
                    yield chunk
            if got:
                deadline = None
                continue
            now = time.monotonic()
            if deadline is None:
                deadline = now + timeout
            elif now > deadline:
                raise QuorumError(f"txids {nxt}..{end} were committed but no majority serves them after {timeout}s")
            time.sleep(pause)  # not synchronisation: waiting for a writer to recover the segment
            pause = min(pause * 2, 1.0)

    def records(self, start: int, end: int, *, timeout: float = 120.0) -> Iterator[tuple[int, bytes]]:
        """``(txid, record)`` for ``start..end``: the plain view of ``read``."""
        for c in self.read(start, end, timeout=timeout):
            yield from zip(range(c.first, c.last + 1), c.records, strict=True)

    def _read_finalized(
        self, seg: Segment, start: int, stop: int, prefer: int, singletons: bool = False
    ) -> Iterator[Chunk]:
        """Records ``start..stop`` of a finalized segment from any replica (``ReplicaReader``)."""
        for buf, pos, h in self._replicas.frames(seg, start, stop, prefer):
            if not singletons or h.record_count == 1:
                yield _clip(buf, pos, h.first_txid, h.segment_txid, h.epoch, max(start, h.first_txid), stop)

    def _read_in_progress(self, since: int, max_txns: int) -> Iterator[Chunk]:
        durable, edits = committed_in_progress(self.qjm, since, max_txns)
        if edits is None:
            return
        stop = since + durable - 1
        buf = edits.frames
        pos = 0
        nxt = since
        while pos < len(buf) and nxt <= stop:
            h = framing.decode_header(buf, pos)
            if h.last_txid >= nxt:
                chunk = _clip(buf, pos, h.first_txid, h.segment_txid, h.epoch, nxt, stop)
                nxt = chunk.last + 1
                yield chunk
            pos += h.frame_len


def _clip(buf: bytes | bytearray, pos: int, first: int, segment: int, epoch: int, nxt: int, stop: int) -> Chunk:
    """The records of the frame at ``pos`` with txids in ``nxt..stop`` (checksums verified)."""
    if first > nxt:
        raise CorruptFrameError(f"txid gap: expected {nxt}, frame starts at {first}")
    recs = framing.decode_records(buf, pos)
    lo = nxt - first
    hi = min(stop - first + 1, len(recs))
    return Chunk(nxt, segment, epoch, recs[lo:hi] if lo or hi < len(recs) else recs)
