"""The ``qjm`` format as a Spark sink: one fenced writer per write, each batch framed by markers.

A journal has exactly one writer, so a write runs as a single task (the input must have one
partition: ``df.coalesce(1)``; a task of any other partition fails at once, before it touches the
journal). That task opens its own fenced writer: a retried or restarted attempt fences the one
it replaces, which can then append nothing more.

Each batch goes out as ``begin`` marker, records, ``end`` marker (``qjm.spark.markers``); once
Spark's driver commits the job (or micro-batch), it writes a ``commit`` marker in a segment of its
own, and a failed batch write gets an ``abort`` marker: readers show only committed batches by
default (``qjm.spark.transactions``). Before writing, an attempt that may repeat earlier work
scans the journal's tail for this query's (or write's) last marker and

* skips the batch if its ``end`` or ``commit`` marker is there (the sink finished but Spark did
  not record it);
* resumes after the records already there if only its ``begin`` marker is, checking that they
  equal the start of the replayed input (a replay must be deterministic, as Spark requires); the
  resumed part starts with a ``resume`` marker, so readers see it continues the batch;
* writes it whole otherwise.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from qjm.client.writer import Writer, open_writer
from qjm.errors import ConfigError, NotFormattedError, QJMError
from qjm.spark.compat import StreamWriterBase, arrow_batches
from qjm.spark.journal import JournalClient
from qjm.spark.markers import MAGIC, Marker, decode_marker
from qjm.spark.options import WriteOptions

log = logging.getLogger("qjm.spark")

QUERY_ID_KEY = "sql.streaming.queryId"  # the query's id, kept in its checkpoint across restarts
BATCH_ID_KEY = "streaming.sql.batchId"


class ReplayMismatchError(QJMError):
    """A replayed batch differs from what its interrupted attempt already wrote: the input is not deterministic."""

    code = "REPLAY_MISMATCH"


class InjectedFailure(RuntimeError):
    """Raised by the ``_test.*`` options only."""


@dataclass
class WriteCommit(WriterCommitMessage):
    """What one write task did: user records ``first_txid..last_txid`` (0, 0 if none)."""

    tag: str
    batch: int
    first_txid: int
    last_txid: int
    records: int
    epoch: int
    skipped: bool = False
    resumed: int = 0


def check_input_schema(schema: StructType, serializer: str) -> None:
    """Refuse what the sink cannot turn into records, before any task starts."""
    if serializer == "json":
        return
    names = schema.fieldNames()
    if names != ["record"] or not isinstance(schema["record"].dataType, BinaryType | StringType):
        raise ConfigError(
            f"the qjm sink writes one column 'record' (binary, or string as UTF-8), got {schema.simpleString()}; "
            "select it, or set option 'serializer' to 'json' to write each row as a JSON object"
        )


def _json_default(v: object) -> object:
    if isinstance(v, bytes | bytearray):
        return base64.b64encode(v).decode()
    if isinstance(v, datetime.datetime | datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    raise TypeError(f"cannot serialize {type(v).__name__} to JSON")


def serialize(batch: pa.RecordBatch, serializer: str) -> list[bytes]:
    """The records of one Arrow batch, refusing nulls and user records that would pass for markers."""
    if serializer == "json":
        return [
            json.dumps(row, separators=(",", ":"), default=_json_default, ensure_ascii=False).encode()
            for row in batch.to_pylist()
        ]
    col = batch.column(0)
    if col.null_count:
        raise ValueError("the qjm sink cannot write a null record")
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.binary())
    if pc.any(pc.starts_with(col, pattern=MAGIC)).as_py():
        raise ValueError("a record starts with the qjm marker magic (qjm.spark.markers.MAGIC); refused")
    out: list[bytes] = col.to_pylist()
    return out


def _hash_into(h: Any, rec: bytes) -> None:
    h.update(len(rec).to_bytes(4, "little"))
    h.update(rec)


@dataclass(frozen=True, slots=True)
class _Found:
    txid: int
    marker: Marker


def last_marker(client: JournalClient, tag: str, until: int, kinds: tuple[str, ...] | None = None) -> _Found | None:
    """This tag's newest marker (of one of ``kinds``), scanning finalized segments from the newest back.

    Markers are written alone in their frame, so only one-record frames are decoded. Usually the
    newest segment holds the marker; the first batch of a brand-new query downloads every segment.
    """
    for seg in reversed(client.finalized(1)):
        if seg.start > until:
            continue
        found: _Found | None = None
        for chunk in client.read(seg.start, min(seg.end, until), singletons=True):
            for i, rec in enumerate(chunk.records):
                if rec[:2] == MAGIC[:2] and rec.startswith(MAGIC):
                    m = decode_marker(rec)
                    if m.tag == tag and (kinds is None or m.kind in kinds):
                        found = _Found(chunk.first + i, m)
        if found is not None:
            return found
    return None


class _Failer:
    """Test hook: crash the task after ``n`` records of the chosen batch, once (a marker file remembers)."""

    def __init__(self, opts: WriteOptions, batch: int) -> None:
        f = opts.fail
        armed = f.after_records is not None and (f.batch is None or f.batch == batch)
        if armed and f.once_file:
            armed = not os.path.exists(f.once_file)
        self.left = f.after_records if armed else None
        self.once_file = f.once_file

    def fire(self, w: Writer) -> None:
        w.sync()  # what was written stays: the crash comes after a durable partial batch
        if self.once_file:
            with open(self.once_file, "w") as fh:
                fh.write("fired\n")
        raise InjectedFailure("injected failure in the middle of a batch (_test.failAfterRecords)")


def write_task(
    opts: WriteOptions, tag: str, batch: int, batches: Iterator[pa.RecordBatch], *, may_repeat: bool
) -> WriteCommit:
    """Write one batch through a new fenced writer; see the module docstring for the replay rules."""
    ctx = TaskContext.get()
    if ctx is not None and ctx.partitionId() != 0:
        raise ConfigError(
            f"the qjm sink needs a single input partition (a journal has one writer), but this is partition "
            f"{ctx.partitionId()}: write df.coalesce(1)"
        )
    try:
        w = open_writer(opts.uri, create=opts.create, config=opts.config)
    except NotFormattedError:
        raise NotFormattedError(
            f'the journal {opts.uri} is not formatted on any node: write with .option("create", "true") to format it'
        ) from None
    try:
        commit = _write(w, opts, tag, batch, batches, may_repeat)
        w.close()
        return commit
    except BaseException:
        w.abort()
        raise


@dataclass(slots=True)
class _Replay:
    """What an earlier attempt of this batch left: nothing, all of it (``done``), or a prefix to resume."""

    done: WriteCommit | None = None
    begin_txid: int = 0  # its begin marker, when resuming
    written: int = 0  # user records after that marker
    digest: int = 0  # over those records (length-prefixed)
    first: int = 0  # txids of the first and last of them
    last: int = 0


def _replay_state(w: Writer, opts: WriteOptions, tag: str, batch: int) -> _Replay:
    with JournalClient(opts.uri, opts.config) as jc:
        found = last_marker(jc, tag, w.last_txid)
        if found is None:
            return _Replay()
        m = found.marker
        if m.kind in ("end", "commit") and m.batch >= batch:
            log.info("qjm sink: %s batch %d is already in the journal; skipping", tag, batch)
            return _Replay(done=WriteCommit(tag, batch, m.first, m.last, m.records, w.epoch, skipped=True))
        if m.kind in ("begin", "resume") and m.batch > batch:
            raise ReplayMismatchError(
                f"the journal holds batch {m.batch} of {tag} but Spark asks for batch {batch}: "
                "is the checkpoint older than the journal?"
            )
        if m.kind == "resume" and m.batch == batch:
            found = last_marker(jc, tag, found.txid, ("begin",))
            if found is None or found.marker.batch != batch:
                raise ReplayMismatchError(f"batch {batch} of {tag} was resumed, but its begin marker is gone")
            m = found.marker
        if m.kind == "begin" and m.batch == batch:
            h = xxhash.xxh3_64()
            replay = _Replay(begin_txid=found.txid)
            for txid, rec in jc.records(found.txid + 1, w.last_txid):
                if rec.startswith(MAGIC):
                    r = decode_marker(rec)
                    if (r.kind, r.tag, r.batch) == ("resume", tag, batch):
                        continue
                    raise ReplayMismatchError(f"a marker inside the unfinished batch {batch} of {tag}")
                _hash_into(h, rec)
                replay.written += 1
                replay.first = replay.first or txid
                replay.last = txid
            replay.digest = h.intdigest()
            log.info("qjm sink: resuming %s batch %d after %d records already written", tag, batch, replay.written)
            return replay
        if m.kind == "begin":
            log.warning("qjm sink: batch %d of %s was left unfinished at txid %d", m.batch, tag, found.txid)
        return _Replay()


def _write(
    w: Writer, opts: WriteOptions, tag: str, batch: int, batches: Iterator[pa.RecordBatch], may_repeat: bool
) -> WriteCommit:
    replay = _replay_state(w, opts, tag, batch) if opts.markers and may_repeat else _Replay()
    if replay.done is not None:
        return replay.done
    head = Marker("resume" if replay.begin_txid else "begin", tag, batch) if opts.markers else None

    def lead() -> None:
        """Markers travel alone in their frame, first in their segment: the tail scan decodes
        nothing else, and readers find transactions from segment heads. A resume marker waits until
        the replayed prefix checked out, so a refused replay appends nothing."""
        nonlocal head
        if head is not None:
            w.append(head.encode())
            w.sync()
            head = None

    if head is not None and head.kind == "begin":
        lead()
    new = first = 0
    skip = replay.written
    seen = xxhash.xxh3_64()
    failer = _Failer(opts, batch)
    for rb in batches:
        recs = serialize(rb, opts.serializer)
        if skip:
            done, recs = recs[:skip], recs[skip:]
            for rec in done:
                _hash_into(seen, rec)
            skip -= len(done)
            if not skip and seen.intdigest() != replay.digest:
                raise ReplayMismatchError(f"replayed batch {batch} of {tag} differs from the records already written")
        while recs:
            room = opts.segment_records - (w.last_txid - w.segment_txid + 1)
            if room <= 0:
                w.roll()
                room = opts.segment_records
            take = recs[:room] if failer.left is None else recs[: min(room, failer.left)]
            recs = recs[len(take) :]
            if take:
                lead()
                first = first or w.last_txid + 1
                w.append_many(take)
                new += len(take)
            if failer.left is not None:
                failer.left -= len(take)
                if failer.left <= 0:
                    failer.fire(w)
    if skip:
        raise ReplayMismatchError(f"replayed batch {batch} of {tag} has fewer records than were already written")
    lead()  # a resumed batch with nothing left to write still heads its segment with the marker
    records = replay.written + new
    lo = replay.first if replay.written else first
    hi = w.last_txid if new else replay.last
    if opts.markers:
        w.sync()
        w.append(Marker("end", tag, batch, records, lo, hi).encode())
    return WriteCommit(tag, batch, lo, hi, records, w.epoch, resumed=replay.written)


def decide(opts: WriteOptions, marker: Marker) -> None:
    """Write the driver's ``commit`` or ``abort`` marker, alone in a segment of its own writer."""
    w = open_writer(opts.uri, config=opts.config)
    try:
        w.append(marker.encode())
        w.close()
    except BaseException:
        w.abort()
        raise


def commit_all(opts: WriteOptions, messages: list[WriterCommitMessage | None]) -> None:
    """Spark's driver commits: each task's batch becomes visible to read-committed readers."""
    for m in messages:
        if isinstance(m, WriteCommit):
            decide(opts, Marker("commit", m.tag, m.batch, m.records, m.first_txid, m.last_txid))


def abort_batch(opts: WriteOptions, tag: str, batch: int) -> None:
    """Best effort: readers treat an unfinished batch followed by anything else as aborted anyway;
    the marker only lets a waiting stream go on at once."""
    try:
        decide(opts, Marker("abort", tag, batch))
    except QJMError as e:
        log.warning("qjm sink: could not mark %s batch %d aborted (%s)", tag, batch, e)


def report(opts: WriteOptions, messages: list[WriterCommitMessage | None]) -> None:
    """Log what a write committed and, with ``reportPath``, append it there as one JSON line."""
    for m in messages:
        if not isinstance(m, WriteCommit):
            continue
        log.info("qjm sink committed %s batch %d: txids %d-%d", m.tag, m.batch, m.first_txid, m.last_txid)
        if opts.report_path:
            with open(opts.report_path, "a") as f:
                f.write(json.dumps(asdict(m), sort_keys=True) + "\n")


class QJMBatchWriter(DataSourceArrowWriter):
    """``df.write.format("qjm").mode("append")``: one task, one fenced writer, one marker-framed batch."""

    def __init__(self, opts: WriteOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("a journal is append-only: use mode('append'), not 'overwrite'")
        check_input_schema(schema, opts.serializer)
        self.opts = opts
        self.write_id = f"write-{uuid.uuid4()}"  # made once per save(), shared by all attempts of its task

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        return write_task(self.opts, self.write_id, 0, iterator, may_repeat=attempt > 0)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.markers:
            commit_all(self.opts, messages)
        report(self.opts, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Records that reached the journal stay; the abort marker hides them from default readers."""
        log.warning("qjm sink: write %s aborted", self.write_id)
        if self.opts.markers:
            abort_batch(self.opts, self.write_id, 0)


class QJMStreamWriter(StreamWriterBase):
    """``writeStream.format("qjm")``: exactly once per micro-batch, keyed by the query id and batch id."""

    def __init__(self, opts: WriteOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("a journal is append-only: use outputMode('append'), not 'complete'")
        if not opts.markers:
            raise ConfigError("option 'markers' cannot be false for a streaming write: exactly-once needs them")
        check_input_schema(schema, opts.serializer)
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        ctx = TaskContext.get()
        query = ctx.getLocalProperty(QUERY_ID_KEY) if ctx is not None else None
        batch = ctx.getLocalProperty(BATCH_ID_KEY) if ctx is not None else None
        if not query or batch is None:
            raise QJMError("the qjm stream sink found no streaming query id / batch id in its task context")
        return write_task(self.opts, f"query-{query}", int(batch), arrow_batches(iterator), may_repeat=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_all(self.opts, messages)
        report(self.opts, messages)
        f = self.opts.fail
        if f.in_commit and f.once_file and not os.path.exists(f.once_file):
            with open(f.once_file, "w") as fh:
                fh.write("fired\n")
            raise InjectedFailure(f"injected failure after batch {batchId} was written (_test.failInCommit)")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """No abort marker: the replay of this batch resumes or skips it (module docstring), and
        read-committed streams wait for it."""
        log.warning("qjm sink: batch %d aborted; its replay will resume it", batchId)
