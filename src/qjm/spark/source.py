"""The ``qjm`` format as a Spark source: batch reads by txid range and a tailing micro-batch stream.

Every method here runs in some Spark Python worker, never in the driver script, and objects
travel between workers pickled: readers hold only parsed options, and open their journal
connections inside the method that needs them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from qjm.client.loggers import CallHooks
from qjm.errors import ConfigError, NotFoundError, QuorumError
from qjm.spark import filters
from qjm.spark.compat import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from qjm.spark.feed import CommitFeed
from qjm.spark.journal import Chunk, JournalClient
from qjm.spark.markers import DECISIONS, MAGIC
from qjm.spark.options import ReadOptions, WriteOptions
from qjm.spark.transactions import hidden_ranges, stable_end, subtract, transactions

SCHEMA = "txid long, segment long, epoch long, record binary"
STRUCT = StructType(
    [
        StructField("txid", LongType(), False),
        StructField("segment", LongType(), False),
        StructField("epoch", LongType(), False),
        StructField("record", BinaryType(), False),
    ]
)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("txid", pa.int64(), nullable=False),
        pa.field("segment", pa.int64(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("record", pa.binary(), nullable=False),
    ]
)
ROWS_PER_BATCH = 16_384


@dataclass(frozen=True)
class TxidRange(InputPartition):
    """One Spark partition: txids ``start..end`` (inclusive), inside one segment where possible."""

    start: int
    end: int
    index: int


def hidden(client: JournalClient, opts: ReadOptions) -> list[tuple[int, int]]:
    """What the read-committed view skips (nothing for ``isolation=read_uncommitted``): uncommitted
    transactions, and the driver's one-record commit/abort segments unless markers are shown."""
    if not opts.read_committed:
        return []
    heads = client.heads()
    out = hidden_ranges(transactions(heads))
    if not opts.show_markers:
        out += [(h.start, h.end) for h in heads if h.end == h.start and h.marker and h.marker.kind in DECISIONS]
    return out


def plan_ranges(
    client: JournalClient, start: int, end: int, per_partition: int, skip: list[tuple[int, int]] | None = None
) -> list[TxidRange]:
    """Partitions follow segments; a segment longer than ``per_partition`` is split into even txid ranges.

    Txids past the last finalized segment (the committed part of the in-progress one) are split
    the same way. Txids in ``skip`` (uncommitted transactions) get no partition: they are not read.
    """
    bounds: list[tuple[int, int]] = []
    cursor = start
    for seg in client.finalized(start):
        if seg.start > end:
            break
        lo, hi = max(seg.start, cursor), min(seg.end, end)
        if lo <= hi:
            bounds.append((lo, hi))
        cursor = hi + 1
    if cursor <= end:
        bounds.append((cursor, end))
    if skip:
        bounds = subtract(bounds, skip)
    out: list[TxidRange] = []
    for lo, hi in bounds:
        n = hi - lo + 1
        parts = -(-n // per_partition)
        for k in range(parts):
            a = lo + n * k // parts
            b = lo + n * (k + 1) // parts - 1
            out.append(TxidRange(a, b, len(out)))
    return out


def earliest_txid(client: JournalClient) -> int:
    """First txid still held (segments before it may have been purged)."""
    segs = client.finalized(1)
    return segs[0].start if segs else 1


def read_range(opts: ReadOptions, part: TxidRange) -> Iterator[pa.RecordBatch]:
    """One partition's rows as Arrow batches (markers dropped unless ``showMarkers``)."""
    with JournalClient(opts.uri, opts.config) as client:
        pending: list[Chunk] = []
        rows = 0
        for chunk in client.read(part.start, part.end, prefer=part.index, timeout=opts.partition_wait):
            pending.append(chunk)
            rows += len(chunk.records)
            if rows >= ROWS_PER_BATCH:
                yield _to_arrow(pending, opts.show_markers)
                pending, rows = [], 0
        if pending:
            yield _to_arrow(pending, opts.show_markers)


def _to_arrow(chunks: list[Chunk], show_markers: bool) -> pa.RecordBatch:
    txids: list[int] = []
    segments: list[int] = []
    epochs: list[int] = []
    records: list[bytes] = []
    for c in chunks:
        n = len(c.records)
        txids.extend(range(c.first, c.first + n))
        segments.extend([c.segment] * n)
        epochs.extend([c.epoch] * n)
        records.extend(c.records)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(txids, pa.int64()),
            pa.array(segments, pa.int64()),
            pa.array(epochs, pa.int64()),
            pa.array(records, pa.binary()),
        ],
        schema=ARROW_SCHEMA,
    )
    if not show_markers:
        marks = pc.starts_with(batch.column(3), pattern=MAGIC)
        if pc.any(marks).as_py():
            batch = batch.filter(pc.invert(marks))
    return batch


def _check_schema(schema: StructType) -> None:
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in STRUCT.fields]:
        raise ConfigError(f"the qjm source has a fixed schema ({SCHEMA}); do not pass .schema({schema.simpleString()})")


class QJMBatchReader(DataSourceReader):
    """``spark.read.format("qjm")``: the journal as of planning time, committed records only.

    ``pushFilters`` (Spark 4.1+) narrows the txid range to what a ``WHERE`` on ``txid`` keeps, so
    segments outside it are never downloaded; Spark still applies the filters on the rows.
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.bounds = filters.TxidBounds()

    def pushFilters(self, pushed: list[Any]) -> Iterator[Any]:
        for f in pushed:
            if not self.bounds.narrow(f):
                yield f

    def partitions(self) -> Sequence[InputPartition]:
        try:
            return self._plan()
        except QuorumError as e:
            if self.opts.majority_loss_timeout is None:
                raise
            raise QuorumError(f"{e} (option majorityLossTimeout: {self.opts.majority_loss_timeout:g}s)") from None

    def _plan(self) -> list[TxidRange]:
        o = self.opts
        with JournalClient(o.uri, o.config) as client:
            start = o.start_txid
            if start == 1:
                start = earliest_txid(client)
            start = max(start, self.bounds.lo)
            if o.include_in_progress:
                end = client.committed_end(start)
            else:
                segs = client.finalized(start)
                if segs and segs[0].start > start:
                    raise NotFoundError(f"startTxid {start} is in no segment (the earliest starts at {segs[0].start})")
                end = segs[-1].end if segs else start - 1
            if o.end_txid is not None:
                end = min(end, o.end_txid)
            if self.bounds.hi is not None:
                end = min(end, self.bounds.hi)
            if end < start:
                return []
            return plan_ranges(client, start, end, o.max_records_per_partition, hidden(client, o))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TxidRange):  # Spark's placeholder when there are no partitions
            return iter(())
        return read_range(self.opts, partition)


class QJMStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("qjm")``: tails committed records; offset ``{"txid": next txid to read}``.

    Offsets are txids, so a restarted query resumes exactly where its checkpoint says, whichever
    writer or replicas hold the journal by then. The committed end comes from a ``CommitFeed``
    pushed by the nodes, so a trigger costs no call to them until there is something to read.
    """

    def __init__(self, opts: ReadOptions, hooks: CallHooks | None = None) -> None:
        self.opts = opts
        self.hooks = hooks  # the driver's calls to the nodes (tests count them)
        self._client: JournalClient | None = None
        self._feed: CommitFeed | None = None
        self._until: int | None = None  # availableNow: the committed end when the query started
        self._latest: int | None = None  # the newest txid known committed at the last trigger

    def __getstate__(self) -> dict[str, Any]:
        state = dict.fromkeys(("hooks", "_client", "_feed", "_latest"))
        return {**state, "opts": self.opts, "_until": self._until}

    def _journal(self) -> JournalClient:
        """Kept open between triggers: this object lives in one long-running worker."""
        if self._client is None:
            self._client = JournalClient(self.opts.uri, self.opts.config, self.hooks)
        return self._client

    def feed(self, nxt: int) -> CommitFeed:
        """The feed pushing the committed end from ``nxt`` on (started on first use)."""
        if self._feed is not None and nxt >= self._feed.start:
            return self._feed
        if self._feed is not None:
            self._feed.close()
            self._feed = None
        c = self._journal()
        segs = c.finalized(nxt)
        if segs and segs[0].start > nxt:
            raise NotFoundError(
                f"txid {nxt} is in no segment the nodes list (the next starts at {segs[0].start}; purged?)"
            )
        heads = c.heads() if self.opts.read_committed else []
        self._feed = CommitFeed(
            self.opts.uri, self.opts.config, nxt, heads, majority_loss_timeout=self.opts.majority_loss_timeout
        )
        return self._feed

    def initialOffset(self) -> dict[str, int]:
        c = self._journal()
        if self.opts.start_latest:
            return {"txid": c.committed_end(earliest_txid(c)) + 1}
        if self.opts.start_txid == 1:
            return {"txid": earliest_txid(c)}
        return {"txid": self.opts.start_txid}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict[str, int] | None = None, limit: ReadLimit | None = None) -> dict[str, int]:
        nxt = int((start or self.initialOffset())["txid"])
        caps: list[int] = []
        if isinstance(limit, ReadMaxRows):
            caps.append(limit.max_rows)
        elif limit is None and self.opts.max_records_per_trigger:  # Spark < 4.2 passes no limit
            caps.append(self.opts.max_records_per_trigger)
        if self.opts.end_txid is not None:
            caps.append(self.opts.end_txid - nxt + 1)
        if self._until is not None:
            caps.append(self._until - nxt + 1)
        cap = max(0, min(caps)) if caps else None
        if cap == 0:
            return {"txid": nxt}
        feed = self.feed(nxt)
        if self._until is not None:
            # availableNow ends at the first trigger with nothing new: wait for the push to reach
            # the end that is known committed, or the run would stop short of it
            want = self._until if cap is None else min(self._until, nxt - 1 + cap)
            feed.wait_for(want, self.opts.partition_wait)
        known, heads = feed.snapshot()
        end = self._latest = max(known, nxt - 1)
        if cap is not None:
            end = min(end, nxt - 1 + cap)
        if self.opts.read_committed:
            end = stable_end(transactions(heads), nxt, end)
        return {"txid": end + 1}

    def reportLatestOffset(self) -> dict[str, int] | None:
        """Spark 4.2+ shows it as the progress's ``latestOffset``: the next txid past the newest
        one the nodes pushed as committed."""
        return None if self._latest is None else {"txid": self._latest + 1}

    def prepareForTriggerAvailableNow(self) -> None:
        c = self._journal()
        self._until = c.committed_end(earliest_txid(c))

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        lo, hi = int(start["txid"]), int(end["txid"]) - 1
        if hi < lo:
            return []
        c = self._journal()
        return plan_ranges(c, lo, hi, self.opts.max_records_per_partition, hidden(c, self.opts))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TxidRange):  # Spark's placeholder when there are no partitions
            return iter(())
        return read_range(self.opts, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the journal keeps its records; purging is the writer's business."""

    def stop(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None
        if self._client is not None:
            self._client.close()
            self._client = None


class QJMDataSource(DataSource):
    """``format("qjm")``: a replicated, fenced journal as a Spark source and sink."""

    @classmethod
    def name(cls) -> str:
        return "qjm"

    def schema(self) -> StructType:
        """Spark asks for it in ``load()``: the options are checked here, so a bad one fails there."""
        ReadOptions.parse(self.options)
        return STRUCT

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        opts = ReadOptions.parse(self.options)
        if opts.start_latest:
            raise ConfigError("option 'startTxid' = 'latest' is for streams; a batch read would return nothing")
        return QJMBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return QJMStreamReader(ReadOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from qjm.spark.sink import QJMBatchWriter

        return QJMBatchWriter(WriteOptions.parse(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from qjm.spark.sink import QJMStreamWriter

        return QJMStreamWriter(WriteOptions.parse(self.options), schema, overwrite)
