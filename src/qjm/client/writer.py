"""The writer users hold: ``open_writer(uri)`` → ``Writer`` with append / sync / roll / close.

Records are framed into batches (closed by size, by time or by ``sync``); each batch goes to every
in-sync node at once and is committed when a majority has it on disk. Batches are pipelined: up
to ``max_inflight_batches`` may await their quorum while new records are appended. The segment
rolls by itself once it holds ``roll_bytes`` of frames or its first batch is ``roll_interval`` old,
and each roll applies the retention policy (``retain_txids``, ``retain_age``; design §2.12).
"""

from __future__ import annotations

import collections
import logging
import random
import shlex
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import cast

from qjm._native import framing
from qjm.client.loggers import CallHooks, SyncLane
from qjm.client.manager import QuorumJournalManager
from qjm.client.quorum import BatchCall, QuorumCall
from qjm.client.retention import PurgeRequest, purge_limit, requested_bound
from qjm.client.writer_stats import AckTimer, WriterStats, probe_for
from qjm.config import QJMConfig, as_config, config_from
from qjm.errors import EpochError, FencedError, NotFormattedError, QJMError, QuorumError
from qjm.histogram import Histogram
from qjm.protocol.messages import RemoteEditLog
from qjm.security.tls import TlsConfig

log = logging.getLogger("qjm.writer")

Buffer = bytes | bytearray | memoryview


@dataclass(slots=True)
class _Batch:
    first: int
    last: int
    call: BatchCall
    sent_at: float


def _is_rows(records: object) -> bool:
    """A 2-D C-contiguous buffer of single bytes (a numpy uint8 array of fixed-size records)."""
    try:
        mv = memoryview(records)  # type: ignore[arg-type]
    except TypeError:
        return False
    with mv:
        return mv.ndim == 2 and mv.itemsize == 1 and mv.c_contiguous


def _as_fenced(e: QuorumError) -> QJMError:
    """A quorum lost to a newer writer is reported as fencing, the thing the caller must act on."""
    for cause in e.causes.values():
        if isinstance(cause, FencedError):
            f = FencedError(
                f"fenced: a newer writer holds the journal ({cause})",
                request_epoch=cause.request_epoch,
                promised_epoch=cause.promised_epoch,
            )
            f.__cause__ = e
            return f
    return e


class Writer:
    """The single, fenced writer of a journal. Thread-safe; not reusable after an error or close."""

    def __init__(self, qjm: QuorumJournalManager, last_txid: int) -> None:
        self.qjm = qjm
        self.config = qjm.config
        self._lock = threading.RLock()
        self._builder = framing.FrameBuilder()
        self._next_txid = last_txid + 1
        self._batch_first = self._next_txid
        self._segment = 0
        self._inflight: collections.deque[_Batch] = collections.deque()
        self._committed = last_txid
        self._error: QJMError | None = None
        self._closed = False
        self._wake_timer = threading.Event()  # set: the batch timer has something to look at now
        self._batch_started_at = 0.0  # monotonic time the open batch got its first record; 0: none
        self._last_opened = 0.0  # when the newest batch got its first record
        self._timer_idle = False  # the batch timer sleeps until woken (else it looks every batch_delay)
        self._acks = AckTimer([probe_for(lg) for lg in qjm.loggers.loggers])
        self._batches_sent = self._txns_sent = self._bytes_sent = 0
        self._one_call_syncs = 0  # syncs committed through lanes that have ended
        self._lane: SyncLane | None = None  # the transport's one-call sync commit, if it has one
        self._figures_lock = threading.Lock()  # a lane's change against stats(): its commits counted once
        self._write_timeout = self.config.timeouts.write_txns
        self._starting: QuorumCall[None] | None = None  # a roll's start of the segment, not yet awaited
        self._segment_bytes = 0  # frame bytes sent in the current segment
        self._segment_first_at = 0.0  # monotonic time its first batch was sent
        self._purged_below = 0  # the highest bound this writer's retention sent
        self.rolls = 0  # segments finalized by roll(), by hand or by size or age
        self._commit_seconds = Histogram()
        self._start_segment(self._next_txid)
        self._flusher = threading.Thread(target=self._flush_by_time, name="qjm-batch-timer", daemon=True)
        self._flusher.start()

    # -- public API --------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.qjm.epoch

    @property
    def last_txid(self) -> int:
        """The txid of the last record appended (committed or not)."""
        return self._next_txid - 1

    @property
    def committed_txid(self) -> int:
        """Every txid up to this one is on a majority of nodes."""
        return self._committed

    @property
    def segment_txid(self) -> int:
        return self._segment

    def stats(self) -> WriterStats:
        """This writer's figures and each node's (``qjm.client.writer_stats``); never waits for the writer."""
        self._acks.poll(time.monotonic())
        committed = self._committed
        with self._figures_lock:
            commit_seconds = self._commit_seconds.copy()
            one_call_syncs = self._one_call_syncs
            lane = self._lane
            if lane is not None:
                counts, seconds = lane.times()
                commit_seconds.add(counts, seconds)
                one_call_syncs += sum(counts)
        return WriterStats(
            journal_id=self.qjm.journal_id,
            epoch=self.epoch,
            segment_txid=self._segment,
            last_txid=self.last_txid,
            committed_txid=committed,
            inflight_batches=len(self._inflight),
            batches_sent=self._batches_sent,
            txns_sent=self._txns_sent,
            bytes_sent=self._bytes_sent,
            commit_seconds=commit_seconds,
            nodes=self._acks.snapshot(committed),
            one_call_syncs=one_call_syncs,
        )

    def append(self, record: Buffer) -> int:
        """Add one record to the open batch; returns its txid. Durable only after ``sync``."""
        with self._lock:
            self._check()
            self._builder.add(record)
            txid = self._next_txid
            self._next_txid += 1
            self._after_add()
            return txid

    def append_many(self, records: Iterable[Buffer] | Buffer, offsets: Buffer | None = None) -> int:
        """Add many records; returns the txid of the last one.

        ``records``: an iterable of buffers; or the rows of a 2-D C-contiguous uint8 array (numpy),
        one record per row; or, with ``offsets``, one buffer holding the records back to back,
        record i being ``records[offsets[i]:offsets[i + 1]]`` (n + 1 integers: a numpy int64 array,
        ``array('q')``, ...). The two packed forms need no Python object per record.
        """
        with self._lock:
            self._check()
            limit = self.config.batch_bytes
            builder = self._builder
            if offsets is not None or _is_rows(records):
                start = 0
                while True:  # batches still close by size, as with append()
                    before = builder.count
                    try:
                        start = builder.fill_packed(records, start, limit, offsets)  # type: ignore[arg-type]
                    finally:
                        self._next_txid += builder.count - before
                    if builder.nbytes < limit:
                        break
                    self._flush()
            else:
                it = iter(cast(Iterable[Buffer], records))
                done = False
                while not done:
                    before = builder.count
                    try:
                        done = builder.fill(it, limit)  # no Python per record on the native builder
                    finally:
                        self._next_txid += builder.count - before
                    if builder.nbytes >= limit:
                        self._flush()
            self._after_add()
            return self._next_txid - 1

    def sync(self) -> int:
        """Return once everything appended so far is durable on a majority; returns that txid."""
        with self._lock:
            self._check()
            if not self._inflight and self._starting is None and self._builder.count:
                done = self._sync_one_batch()
                if done is not None:
                    return done
            self._flush()
            target = self._next_txid - 1
        self._wait_until(target)
        return target

    def roll(self) -> int:
        """Finalize the current segment and start the next; returns the new segment's first txid.

        Returns once a quorum started the next segment (the writer's own rolls do not wait for it).
        """
        with self._lock:
            self._check()
            self._roll()
            self._check_started()
            return self._segment

    def close(self) -> None:
        """Sync, finalize the segment, release the nodes. Idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._error is None:
                    self.sync()
                    if self._next_txid > self._segment:
                        self.qjm.finalize_log_segment(self._segment, self._next_txid - 1)
            except QuorumError as e:
                raise self._fail(_as_fenced(e)) from None
            finally:
                self._closed = True
                self._wake_timer.set()
                # let lagging in-sync nodes finish the finalize too, so they need no recovery later
                self.qjm.close(grace=self.config.close_grace if self._error is None else 0.0)

    def abort(self) -> None:
        """Drop the writer without finalizing (what a crash leaves behind)."""
        with self._lock:
            self._closed = True
            self._wake_timer.set()
            self.qjm.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- internals ---------------------------------------------------------------------------

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise QJMError("writer is closed")

    def _fail(self, e: QJMError) -> QJMError:
        if self._error is None:
            self._error = e
            if isinstance(e, FencedError) and e.promised_epoch > 0:
                self.qjm.note_epoch(e.promised_epoch)
            log.error("journal %s: writer in epoch %d failed: %s", self.qjm.journal_id, self.epoch, e)
        return self._error

    def _start_segment(self, txid: int) -> None:
        try:
            self.qjm.start_log_segment(txid)
        except QuorumError as e:
            raise self._fail(_as_fenced(e)) from None
        self._new_segment(txid)

    def _new_segment(self, txid: int) -> None:
        self._segment = txid
        self._segment_bytes = 0
        self._segment_first_at = 0.0

    def _roll(self) -> None:
        """Finalize the segment at the last txid appended, start the next, apply retention (lock held).

        The finalize names only committed txids (design §2.12): every batch of the segment is
        flushed and waited for first. The next segment's start is not waited for: its batches queue
        behind it on each node, and the first to commit shows a quorum started it
        (``_check_started``), so the pipeline refills one round trip sooner.
        """
        self._flush()
        self._wait_until(self._next_txid - 1)
        if self._next_txid <= self._segment:
            return
        try:
            self.qjm.finalize_log_segment(self._segment, self._next_txid - 1)
            self._starting = self.qjm.begin_log_segment(self._next_txid)
        except QuorumError as e:
            raise self._fail(_as_fenced(e)) from None
        self._new_segment(self._next_txid)
        self.rolls += 1
        self._apply_retention()

    def _check_started(self) -> None:
        """Wait for the pending start of the segment, if any; its failure is the writer's (lock held)."""
        starting, self._starting = self._starting, None
        if starting is not None:
            try:
                starting.wait_for_write_quorum(
                    self.config.timeouts.start_segment, f"start_log_segment({self._segment})"
                )
            except QuorumError as e:
                raise self._fail(_as_fenced(e)) from None

    def _roll_due(self, now: float) -> bool:
        """The segment is full (``roll_bytes``) or its first batch is ``roll_interval`` old."""
        if not self._segment_bytes:
            return False
        cfg = self.config
        return bool(
            (cfg.roll_bytes and self._segment_bytes >= cfg.roll_bytes)
            or (cfg.roll_interval and now - self._segment_first_at >= cfg.roll_interval)
        )

    def _until_roll(self, now: float) -> float | None:
        """Seconds until the segment is due to roll by age; None: no roll by age is pending."""
        if not (self._segment_bytes and self.config.roll_interval):
            return None
        return max(self._segment_first_at + self.config.roll_interval - now, 0.0)

    def _apply_retention(self) -> None:
        """Purge what ``retain_txids``/``retain_age`` let go, clamped to the limits (qjm.client.retention)."""
        cfg = self.config
        if not (cfg.retain_txids or cfg.retain_age):
            return
        logs: list[RemoteEditLog] = []
        if cfg.retain_age:
            try:
                logs = [x for m in self.qjm.get_edit_log_manifest(0).values() for x in m.logs]
            except QuorumError as e:
                log.warning("journal %s: retention skipped this roll: %s", self.qjm.journal_id, e)
                return
        request = PurgeRequest(keep_txids=cfg.retain_txids, older_than=cfg.retain_age)
        bound = min(
            requested_bound(request, committed=self._committed, segments=logs, now=time.time()),
            purge_limit(
                newest_segment=self._segment, committed=self._committed, min_retained_txids=cfg.min_retained_txids
            ),
        )
        if bound > max(self._purged_below, 1):
            self.qjm.purge_logs_older_than(bound)
            self._purged_below = bound

    def _after_add(self) -> None:
        if self._builder.nbytes >= self.config.batch_bytes:
            self._flush()
        elif self._builder.count and not self._batch_started_at:
            self._batch_started_at = self._last_opened = time.monotonic()
            if self._timer_idle:
                self._wake_timer.set()

    def _flush(self) -> None:
        """Close the open batch and send it (lock held)."""
        self._batch_started_at = 0.0
        if not self._builder.count:
            return
        first, last, frame, now = self._close_batch()
        self._send_batch(first, last, frame, now)

    def _close_batch(self) -> tuple[int, int, bytes, float]:
        """Take the open batch's frame and count it sent (lock held): (first, last, frame, now)."""
        self._batch_started_at = 0.0
        first = self._batch_first
        last = self._next_txid - 1
        frame = self._builder.take(epoch=self.qjm.epoch, segment_txid=self._segment, first_txid=first)
        self._batch_first = last + 1
        now = time.monotonic()
        self._acks.sent(last, now)
        self._batches_sent += 1
        self._txns_sent += last - first + 1
        self._bytes_sent += len(frame)
        if not self._segment_bytes:
            self._segment_first_at = now
        self._segment_bytes += len(frame)
        return first, last, frame, now

    def _send_batch(self, first: int, last: int, frame: bytes, now: float) -> None:
        self._inflight.append(_Batch(first, last, self.qjm.send_batch(frame, first, last), now))
        while len(self._inflight) > self.config.max_inflight_batches:
            self._reap_oldest()
        if self._roll_due(now):
            self._roll()

    def _sync_one_batch(self) -> int | None:
        """``sync`` of the open batch with nothing in flight (lock held), its send, quorum and commit
        notice in one call where the transport has a lane (``QuorumJournalManager.sync_lane``);
        returns the txid it made durable on a majority, or None when the batch is in flight the
        usual way (or still open, a roll being due) for ``sync`` to wait on.

        Why: a writer syncing each record otherwise runs Python per node and per ack between closing
        its batch and returning; through a lane a sync commit runs none, and the lane times and
        counts it itself (docs/performance.md)."""
        if self._roll_due(time.monotonic()):
            return None  # the usual way rolls after sending
        lane = self._lane
        if lane is None or lane.revoked:
            lane = self._next_lane()
            if lane is None:
                return None
        first, last, frame, now = self._close_batch()
        acked = lane.commit(frame, last, self.qjm.epoch, self._write_timeout)
        if acked < 0:  # nothing was sent: a node has no room (paced the usual way) or the lane ended
            self._send_batch(first, last, frame, now)
            return None
        if acked < lane.need:
            # The wait ended short of a quorum (a link failed, the writer's state changed, or the
            # time ran out): the batch is in flight like any other, waited on for the time left;
            # sync's usual wait then counts it committed and announces it.
            call = self.qjm.lane_call(lane, last)
            self._inflight.append(_Batch(first, last, call, now))
            try:
                call.wait_for_write_quorum(
                    max(0.0, now + self._write_timeout - time.monotonic()), f"journal({first}-{last})"
                )
            except QuorumError as e:
                self._check_started()
                raise self._fail(_as_fenced(e)) from None
            return None
        # No AckTimer.poll here: a lane's links time their own acks (qjm.client.writer_stats).
        self._committed = last
        self.qjm.set_committed_txid(last)
        if self._roll_due(time.monotonic()):  # as the usual way rolls once the batch that made it due is sent
            self._roll()
        return last

    def _next_lane(self) -> SyncLane | None:
        """Fold the ended lane's commits into the writer's figures and ask for a new one (lock held).
        The figures' lock only when a lane comes or goes: a set that gives none is asked at each
        sync."""
        old = self._lane
        if old is not None:
            with self._figures_lock:
                self._lane = None
                counts, seconds = old.times()
                self._commit_seconds.add(counts, seconds)
                self._one_call_syncs += sum(counts)
        lane = self.qjm.sync_lane()
        if lane is not None:
            with self._figures_lock:
                self._lane = lane
        return lane

    def _reap_oldest(self) -> None:
        b = self._inflight[0]
        try:
            b.call.wait_for_write_quorum(self._write_timeout, f"journal({b.first}-{b.last})")
        except QuorumError as e:
            self._check_started()  # a start that failed explains the batch's failure best
            raise self._fail(_as_fenced(e)) from None
        if self._starting is not None and b.first >= self._segment:
            self._starting = None  # the batch's quorum started the segment
        self._inflight.popleft()
        now = time.monotonic()
        self._commit_seconds.observe(now - b.sent_at)
        self._acks.poll(now)
        if b.last > self._committed:
            self._committed = b.last
            self.qjm.set_committed_txid(b.last)

    def _wait_until(self, target: int) -> None:
        with self._lock:
            before = self._committed
            while self._inflight and self._inflight[0].first <= target:
                self._reap_oldest()
            self._check()
            self._check_started()  # a sync or roll in a segment no batch has committed in yet
            if self._committed > before:
                # Followers are pushed only what a node knows committed (design §3.1): tell the
                # nodes now rather than ahead of the next batch, which may be long in coming.
                self.qjm.announce_committed()

    def _flush_by_time(self) -> None:
        """Close a batch ``batch_delay`` after its first record, if nothing else closed it first.

        While batches keep opening, the timer looks every ``batch_delay`` instead of being woken for
        each one: a writer that syncs every record would otherwise pay two thread switches per
        commit (the wake-up, then the wait for the writer's lock). A look that finds nothing due
        does not take the writer's lock either: only closing a batch or rolling does, after
        checking again under it. The timer sleeps until woken (or until the segment is due to
        roll by age) only after a whole ``batch_delay`` without an open batch. A segment that ages
        while no batch closes is rolled here. A batch it closed is waited for outside the lock,
        then counted committed and announced (``_wait_until``): followers see records nobody
        synced (design §3.1).
        """
        while True:
            closed = self._close_batch_by_time()
            if closed is None:
                return
            try:
                closed.call.wait_for_write_quorum(self._write_timeout, "journal")
                self._wait_until(closed.last)
            except QJMError:
                return  # the writer has failed: its next call says why

    def _close_batch_by_time(self) -> _Batch | None:
        """Wait until a batch is due and close it; returns it (None: the writer is done)."""
        delay = self.config.batch_delay
        wake = self._wake_timer
        while True:
            wake.clear()  # before looking: a wake-up that lands meanwhile ends the wait below
            if self._closed or self._error is not None:
                return None
            now = time.monotonic()
            started = self._batch_started_at
            if (started and started + delay <= now) or self._roll_due(now):
                stop, closed = self._close_due(delay)
                if stop or closed is not None:
                    return closed
                continue
            roll_in = self._until_roll(now)
            if started:
                due = started + delay - now
                wake.wait(due if roll_in is None else min(due, roll_in))
                continue
            idle_for = now - self._last_opened
            if idle_for < delay:
                wake.wait(delay - idle_for)
                continue
            with self._lock:
                if self._batch_started_at or self._closed or wake.is_set():
                    continue
                self._timer_idle = True
            try:
                wake.wait(roll_in)
            finally:
                self._timer_idle = False

    def _close_due(self, delay: float) -> tuple[bool, _Batch | None]:
        """Under the writer's lock, close the open batch if it is due, or roll a segment due by
        age: (the writer is done, the batch closed if any)."""
        with self._lock:
            if self._closed or self._error is not None:
                return True, None
            now = time.monotonic()
            try:
                if self._batch_started_at and self._batch_started_at + delay <= now:
                    self._flush()  # rolls too when the segment is full or old enough
                    return False, self._inflight[-1] if self._inflight else None
                if self._roll_due(now):  # by age, with no batch closing to notice it
                    self._roll()
            except QJMError:
                return True, None
            return False, None


def open_writer(
    uri: str,
    *,
    config: QJMConfig | None = None,
    hooks: CallHooks | None = None,
    create: bool = False,
    tls: TlsConfig | None = None,
    **options: object,
) -> Writer:
    """Become the journal's writer: fence older writers, recover the log, start a new segment.

    ``create=True`` formats the journal when no node has it yet. ``tls`` connects with mutual TLS
    (it replaces ``config.tls``). Extra keyword options set ``QJMConfig`` fields
    (``batch_bytes=...``) or timeouts (``write_txns_timeout=5``), over ``config`` when both are given.
    """
    cfg = config_from(dict(options), base=as_config(config))
    if tls is not None:
        cfg = replace(cfg, tls=tls)
    rng = random.Random()
    for attempt in range(1, cfg.epoch_attempts + 1):
        qjm = QuorumJournalManager(uri, config=cfg, hooks=hooks)
        try:
            try:
                # No separate is_formatted round: fencing's first call (get_journal_state) says it,
                # one control-plane round less on every failover.
                last = qjm.recover_unfinalized_segments()
            except QuorumError as e:
                if not _nobody_formatted(qjm, e):
                    raise
                if not create:
                    raise NotFormattedError(
                        f"journal {qjm.journal_id} is not formatted on any node; "
                        f"run: qjm format {shlex.quote(str(uri))} (or pass create=True)"
                    ) from None
                qjm.format()
                last = qjm.recover_unfinalized_segments()
            return Writer(qjm, last)
        except QuorumError as e:
            qjm.close()
            # Writers racing for the same epoch can split the nodes' promises so that none wins
            # (design §2.5 fn. 2); back off a random moment and propose again above the new promises.
            lost_race = qjm.epoch == 0 and any(isinstance(c, EpochError) for c in e.causes.values())
            if not lost_race or attempt == cfg.epoch_attempts:
                raise
            log.info("journal %s: lost an epoch race (attempt %d); retrying", qjm.journal_id, attempt)
            threading.Event().wait(rng.uniform(0.005, 0.03) * attempt)
        except BaseException:
            qjm.close()
            raise
    raise AssertionError("unreachable")


def _nobody_formatted(qjm: QuorumJournalManager, e: QuorumError) -> bool:
    """Fencing failed because a majority answered "not formatted" and none answered otherwise."""
    if qjm.epoch or e.successes:
        return False
    return sum(isinstance(c, NotFormattedError) for c in e.causes.values()) >= qjm.loggers.majority
