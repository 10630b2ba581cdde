"""Journal: the per-journal state machine of a JournalNode (design §2, reference §1.3-1.4).

Pure protocol: storage, the segment fetcher used by accept_recovery, the clock and the fault hooks
are all injected, so the deterministic simulation runs this same code in memory. One lock
serialises every call for a journal, like Hadoop's ``synchronized`` Journal methods.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from qjm._native import framing
from qjm._native import gate as gate_mod
from qjm.errors import (
    AlreadyFormattedError,
    ConfigError,
    CorruptFrameError,
    EpochError,
    FencedError,
    InvariantViolation,
    NamespaceMismatchError,
    NotFormattedError,
    NotFoundError,
    OutOfOrderError,
    OutOfSyncError,
    PurgeRefusedError,
    SegmentStateError,
    StorageError,
)
from qjm.protocol.frame import SEGMENT_HEADER_SIZE
from qjm.protocol.messages import (
    NO_TXID,
    EditLogManifest,
    JournaledEdits,
    JournalState,
    NamespaceInfo,
    NewEpochResponse,
    PersistedPaxosData,
    PrepareRecoveryResponse,
    RemoteEditLog,
    RequestInfo,
    SegmentState,
)
from qjm.server.journal_stats import JournalStats, SyncStats
from qjm.server.storage import (
    JournalStorage,
    SegmentAppender,
    SegmentFile,
    SegmentReader,
    SegmentStreamScan,
    finalized_name,
    inprogress_name,
    scan_segment_windows,
)


class NodeBugs(Protocol):
    """The test-only switches a node reads (``qjm.testing.bugs.ProtocolBugs`` has them): each one,
    when True, drops one rule on purpose so the fault search can show it notices."""

    @property
    def ack_before_fsync(self) -> bool: ...

    @property
    def skip_data_plane_epoch_check(self) -> bool: ...

    @property
    def finalize_any_same_length_copy(self) -> bool: ...

    @property
    def purge_ignores_open_segment(self) -> bool: ...

    @property
    def accept_txid_gap(self) -> bool: ...

    @property
    def skip_serial_check(self) -> bool: ...

    @property
    def skip_committed_loss_check(self) -> bool: ...

    @property
    def rejoined_node_votes(self) -> bool: ...


log = logging.getLogger("qjm.journal")

PROMISED = "last-promised-epoch"
WRITER = "last-writer-epoch"
COMMITTED = "committed-txid"
REJOINED = "rejoined"  # 1 from a rejoin (design §4.5) until this node's first segment after it

COMMITTED_WRITE_INTERVAL = 0.1
"""Seconds between writes of the ``committed-txid`` file while the committed txid advances (design
§4.1): an advance within this time of the last write is written with the next advance after it,
or by the next finalize, new promise or close, whichever comes first. The file is a lower bound
read only at open (``_load_committed``), and a machine crash may lose it anyway (it is not
fsynced), so an older value after a killed process is as true as any; writing it on every commit
notice cost a write(2) and its rendering per sync commit on each node."""

SegmentFetcher = Callable[[str, str, int], Iterable[bytes]]
"""fetch(source, journal_id, segment_txid) -> another node's segment file, in chunks as they arrive;
it raises, at the latest after the last chunk, if the bytes are not what the sender vouched for."""

DOWNLOAD_CHUNK = 1 << 20
"""Bytes a download reads and sends at a time (design §4.3): what a node holds per download."""


class SegmentDownload:
    """A segment's valid bytes (header and whole frames) read a chunk at a time from an open file,
    so that serving a segment of any size holds one chunk (design §4.3). ``state`` is what the
    node vouches for: the last txid and epoch of those bytes."""

    def __init__(self, state: SegmentState, size: int, reader: SegmentReader) -> None:
        self.state = state
        self.size = size
        self._reader = reader

    def chunks(self, chunk: int = DOWNLOAD_CHUNK) -> Iterator[bytes]:
        """The bytes in order; the file is closed when this ends, fails or is closed early."""
        try:
            pos = 0
            while pos < self.size:
                data = self._reader.read(pos, min(chunk, self.size - pos))
                if not data:
                    raise NotFoundError(f"segment {self.state.start_txid} was cut short at offset {pos} while read")
                pos += len(data)
                yield data
        finally:
            self._reader.close()

    def close(self) -> None:
        self._reader.close()


class JournalHooks:
    """Server-side fault points (no-ops here; ``qjm.testing.faults`` supplies real ones)."""

    def before_persist_paxos(self, journal_id: str, segment: int) -> None:
        """Called just before an accepted recovery is made durable."""

    def after_persist_paxos(self, journal_id: str, segment: int) -> None:
        """Called just after it is durable, before the downloaded copy is renamed in."""

    def before_append(self, journal_id: str, first_txid: int) -> None:
        """Called before a batch is written to the open segment."""


class _OpenSegment:
    """The open in-progress segment: its appender and its write gate (``qjm._native.gate``), which
    holds the next txid and the last epoch and keeps each durable run's index until taken here."""

    __slots__ = ("_index", "appender", "gate")

    def __init__(self, appender: SegmentAppender, gate: gate_mod.WriteGate) -> None:
        self.appender = appender
        self.gate = gate
        self._index: list[tuple[int, int, int, int]] = []

    @property
    def start(self) -> int:
        """The segment's first txid."""
        return self.gate.start

    @property
    def next_txid(self) -> int:
        return self.gate.next_txid

    @property
    def last_epoch(self) -> int:
        """The epoch of the last frame written."""
        return self.gate.last_epoch

    @property
    def index(self) -> list[tuple[int, int, int, int]]:
        """(first_txid, last_txid, offset, length) of each durable frame, for tailing without rescanning."""
        self._index.extend(self.gate.take_index())
        return self._index

    def scan_result(self) -> framing.ScanResult | None:
        """What a scan of this file would find: every frame was verified on arrival and is durable
        (``journal`` syncs before it returns), so the node need not re-read a segment it wrote.
        None if the file holds anything the index does not account for."""
        index = self.index
        res = framing.ScanResult(
            valid_end=index[-1][2] + index[-1][3] if index else SEGMENT_HEADER_SIZE,
            frame_count=len(index),
            first_txid=index[0][0] if index else 0,
            last_txid=self.next_txid - 1,
            last_epoch=self.last_epoch,
            tail="clean",
            error="",
        )
        return res if res.valid_end == self.appender.size else None


def _no_fetcher(source: str, journal_id: str, segment: int) -> Iterable[bytes]:
    raise NotFoundError(f"this node cannot download segment {segment} from {source}: no fetcher configured")


class Journal:
    """One journal on one node. Every public method is one RPC of the protocol."""

    def __init__(
        self,
        storage: JournalStorage,
        *,
        fetcher: SegmentFetcher = _no_fetcher,
        clock: Callable[[], float] = time.monotonic,
        hooks: JournalHooks | None = None,
        bugs: NodeBugs | None = None,
    ) -> None:
        self.storage = storage
        self._bugs = bugs  # test-only protocol switches; None is the correct protocol
        self.journal_id = storage.journal_id
        self._fetch = fetcher
        self._clock = clock
        self.hooks = hooks or JournalHooks()
        self._lock = threading.RLock()
        # Signalled whenever what a follower may be pushed changes: the committed txid advances, a
        # segment is finalized or started, the journal closes (design §3.1).
        self._advanced = threading.Condition(self._lock)
        self._closed = False
        self._ns = storage.read_namespace()
        self._promised = storage.read_long(PROMISED) or 0
        self._writer_epoch = storage.read_long(WRITER) or 0
        self._rejoined = bool(storage.read_long(REJOINED))
        self._committed = NO_TXID
        self._committed_stored = NO_TXID  # the value last written to the committed-txid file
        self._committed_stored_at = -COMMITTED_WRITE_INTERVAL  # ``clock`` time of that write
        self._followers_waiting = 0  # ``wait_committed_frames`` calls waiting on ``_advanced``
        # Hints this node could not vouch for (a committed txid past its own log end, an unreadable
        # committed-txid file): dropped or lowered, logged, and counted here.
        self.committed_hints_dropped = 0
        self._serial = -1
        self._open: _OpenSegment | None = None
        self._highest_written = 0
        # Scans of finalized segments, which never change (invariant 5): the newest one is scanned
        # by every new_epoch that follows a clean roll, and it may be gigabytes.
        self._finalized_scans: dict[str, framing.ScanResult] = {}
        # Scans made during the current new_epoch (its phase 1 scans the newest segment twice)
        self._scan_memo: dict[str, framing.ScanResult] | None = None
        self.stats = JournalStats()
        # The open segment's gate keeps its durable runs' counters until ``record_stats`` takes
        # them under _stats_lock, which is taken inside _lock or alone (a scrape never waits on _lock).
        self._stats_lock = threading.Lock()
        self.sync_stats = SyncStats()  # kept by qjm.server.syncer
        if self._ns is not None:
            # A crash between accept_recovery's commit point and its rename leaves the accepted
            # copy in a temp file; put it in place before any call can look at the segment (a
            # finalize after the restart would otherwise take the copy held before the accept).
            self._roll_forward_accepted()
            self._highest_written = self._scan_newest_on_open()
        self._committed = self._committed_stored = self._load_committed()
        self._committed_before_epoch = self._committed

    def _load_committed(self) -> int:
        """The committed txid on disk, as a hint: unreadable or past this node's log end, it is
        lowered to what this node can vouch for, so that it cannot block a recovery (see
        ``_note_committed``)."""
        try:
            committed = self.storage.read_long(COMMITTED)
        except StorageError as e:
            self.committed_hints_dropped += 1
            log.warning("journal %s: ignoring an unreadable committed txid: %s", self.journal_id, e)
            return NO_TXID
        if committed is None or committed < NO_TXID:
            return NO_TXID
        if committed > self._highest_written:
            self.committed_hints_dropped += 1
            log.warning(
                "journal %s: the stored committed txid %d is past this node's log end %d; using %d",
                self.journal_id,
                committed,
                self._highest_written,
                self._highest_written,
            )
            return self._highest_written
        return committed

    # -- checks (reference §1.3) -----------------------------------------------------------

    def _check_formatted(self) -> NamespaceInfo:
        if self._ns is None:
            raise NotFormattedError(
                f"journal {self.journal_id} is not formatted on this node ({self.storage.describe()})"
            )
        return self._ns

    def _refuse_while_rejoined(self, what: str) -> None:
        """A node that rejoined after losing its disk holds none of the segments a recovery may
        need: an answer "I have no such segment" from it is no evidence, so it takes no part in
        fencing or recovery until a writer has started a segment on it (design §4.5)."""
        if self._rejoined and (self._bugs is None or not self._bugs.rejoined_node_votes):
            raise OutOfSyncError(
                f"{what}: this node rejoined journal {self.journal_id} after losing its disk and holds none of its "
                "segments yet; it takes part in fencing and recovery once a writer has started a segment on it"
            )

    def _check_request(self, req: RequestInfo) -> None:
        """Epoch fencing on every mutating RPC (design §2.3); a newer epoch is adopted and persisted."""
        self._check_formatted()
        _check_epoch(req.epoch, self._promised)
        if req.epoch < self._promised:
            self.stats.fenced_refused += 1
            raise FencedError(
                f"epoch {req.epoch} is below the promised epoch {self._promised} of journal {self.journal_id}",
                request_epoch=req.epoch,
                promised_epoch=self._promised,
            )
        if req.epoch > self._promised:
            self._set_promised(req.epoch)
        if req.serial > MAX_SERIAL or (self._serial >= 0 and req.serial - self._serial > MAX_SERIAL_STEP):
            raise OutOfOrderError(
                f"request serial {req.serial} is too far above the last serial {self._serial} in epoch {req.epoch}",
                expected=self._serial + 1,
                actual=req.serial,
            )
        if req.serial <= self._serial and (self._bugs is None or not self._bugs.skip_serial_check):
            raise OutOfOrderError(
                f"request serial {req.serial} is not above the last serial {self._serial} in epoch {req.epoch}",
                expected=self._serial + 1,
                actual=req.serial,
            )
        self._serial = req.serial
        if req.committed_txid != NO_TXID:
            self._note_committed(req.committed_txid)

    def _note_committed(self, txid: int) -> None:
        # The control and data planes are separate connections, so a notice may arrive after a
        # newer one: the committed txid is a lower bound (reference §3.7), keep the highest seen.
        # It is a hint the writer gives, and a recovery refuses to drop what any node reports
        # committed; so a node keeps only what it can vouch for: never past its own log end. A
        # lagging node keeps its own end (true, as a lower bound); a bogus notice cannot make this
        # node block every later recovery.
        txid = min(txid, self._committed_cap())
        if txid > self._committed:
            self._committed = txid
            if self._clock() - self._committed_stored_at >= COMMITTED_WRITE_INTERVAL:
                self._store_committed()
            if self._followers_waiting:
                self._advanced.notify_all()

    def _store_committed(self) -> None:
        """Write the committed txid to its file if it advanced since the last write (best effort:
        not fsynced, see ``COMMITTED_WRITE_INTERVAL``)."""
        if self._committed > self._committed_stored:
            self.storage.write_long(COMMITTED, self._committed, durable=False)
            self._committed_stored = self._committed
            self._committed_stored_at = self._clock()

    def _committed_cap(self) -> int:
        """The highest txid this node holds durably: in its open segment, or its log end."""
        if self._open is not None:
            return max(self._highest_written, self._open.next_txid - 1)
        return self._highest_written

    def _check_writer(self, epoch: int) -> None:
        """Only the writer that started the open segment may append to it (HDFS-3845, design §2.4)."""
        if epoch < self._promised:
            self.stats.fenced_refused += 1
            raise FencedError(
                f"batch epoch {epoch} is below the promised epoch {self._promised} of journal {self.journal_id}",
                request_epoch=epoch,
                promised_epoch=self._promised,
            )
        if epoch != self._writer_epoch:
            self.stats.fenced_refused += 1
            raise FencedError(
                f"batch epoch {epoch} is not the writer epoch {self._writer_epoch} of journal {self.journal_id}",
                request_epoch=epoch,
                promised_epoch=self._promised,
            )

    def _set_promised(self, epoch: int) -> None:
        self._store_committed()
        self.storage.write_long(PROMISED, epoch)
        self._promised = epoch
        self._committed_before_epoch = self._committed
        self._serial = -1

    # -- format / state ----------------------------------------------------------------------

    def format(self, ns: NamespaceInfo, force: bool = False, promised_epoch: int = 0) -> None:
        """Stamp the journal with ``ns``, empty.

        ``promised_epoch``: the promise the node starts with, written before the stamp. A node that
        lost its disk rejoins with the highest promise of its peers (``qjm.client.rejoin``): with
        none it would take requests from a writer a majority has fenced (design §4.5).
        """
        with self._lock:
            if ns.namespace_id == 0:
                raise NamespaceMismatchError("cannot format with namespace id 0")
            if promised_epoch < 0:
                raise ConfigError(f"promised epoch must be >= 0, got {promised_epoch}")
            if not force and self.storage.has_data():
                raise AlreadyFormattedError(
                    f"journal {self.journal_id} on this node already holds data ({self.storage.describe()}); "
                    "use force to wipe it"
                )
            self._abort_open()
            self.storage.format(ns, {PROMISED: promised_epoch, REJOINED: 1} if promised_epoch else None)
            self._ns = ns
            self._writer_epoch = 0
            self._promised = promised_epoch
            self._rejoined = promised_epoch > 0
            self._committed = self._committed_before_epoch = self._committed_stored = NO_TXID
            self._serial = -1
            self._highest_written = 0
            log.info("formatted journal %s in %s", self.journal_id, self.storage.describe())

    def is_formatted(self) -> bool:
        return self._ns is not None

    def has_open_segment(self) -> bool:
        """True while a writer's segment is open here (the node's registry never closes such a journal)."""
        return self._open is not None

    def get_journal_state(self) -> JournalState:
        with self._lock:
            self._check_formatted()
            return JournalState(
                last_promised_epoch=self._promised,
                last_writer_epoch=self._writer_epoch,
                committed_txid=self._committed,
                highest_written_txid=self._highest_written,
                open_segment_txid=self._open.start if self._open else 0,
            )

    @property
    def namespace(self) -> NamespaceInfo | None:
        return self._ns

    # -- fencing -----------------------------------------------------------------------------

    def new_epoch(self, ns: NamespaceInfo, epoch: int) -> NewEpochResponse:
        """Promise never to accept a lower epoch again (design §2.5 step 3)."""
        with self._lock:
            mine = self._check_formatted()
            self._refuse_while_rejoined(f"new_epoch({epoch})")
            _check_epoch(epoch, self._promised)
            if (ns.namespace_id, ns.cluster_id) != (mine.namespace_id, mine.cluster_id):
                raise NamespaceMismatchError(
                    f"journal {self.journal_id} belongs to namespace {mine.namespace_id}/{mine.cluster_id}, "
                    f"not {ns.namespace_id}/{ns.cluster_id}"
                )
            if epoch <= self._promised:
                raise EpochError(f"proposed epoch {epoch} <= last promise {self._promised}")
            self._set_promised(epoch)
            # The segment this node was writing: phase 1 needs no re-read of it (after a writer
            # crash that can be a large file); only a restarted node scans it.
            was_open = self._open
            known = was_open.scan_result() if was_open is not None else None
            self._abort_open()
            promoted = self._roll_forward_accepted()
            self._scan_memo = {}
            if was_open is not None and known is not None and was_open.start not in promoted:
                self._scan_memo[inprogress_name(was_open.start)] = known
            try:
                newest = self._newest_segment_with_txns()
                if newest is None:
                    return NewEpochResponse(
                        None, PrepareRecoveryResponse(None, None, self._writer_epoch, self._committed)
                    )
                # Paxos phase 1 for the newest segment comes with the promise: the new epoch is
                # promised now, which is all prepare_recovery checks, and a node whose newest
                # segment is older than the newest a quorum reports holds neither that segment nor
                # a proposal for it.
                return NewEpochResponse(newest.start, self._prepare(newest.start))
            finally:
                self._scan_memo = None

    def heartbeat(self, req: RequestInfo) -> None:
        with self._lock:
            self._check_request(req)

    # -- writing -----------------------------------------------------------------------------

    def start_log_segment(self, req: RequestInfo, txid: int) -> None:
        with self._lock:
            self._check_request(req)
            if txid < 1:
                raise SegmentStateError(f"segment txid must be >= 1, got {txid}")
            self._abort_open()
            for seg in self.storage.list_segments():
                if seg.start != txid:
                    if seg.end is not None and seg.start < txid <= seg.end:
                        raise SegmentStateError(f"txid {txid} lies inside finalized segment {seg.name}")
                    continue
                if not seg.in_progress:
                    raise SegmentStateError(f"already have a finalized segment {seg.name} at txid {txid}")
                res = self._scan(seg, repair=True)
                if res is not None and res.frame_count > 0:
                    self._set_aside_stale_segment(seg, res, req.epoch)
            if self._writer_epoch != req.epoch:
                self.storage.write_long(WRITER, req.epoch)
                self._writer_epoch = req.epoch
            self.storage.delete_paxos(txid)
            appender = self.storage.create_segment(txid, framing.encode_segment_header(txid, req.epoch))
            self._open = _OpenSegment(appender, self._new_gate(appender, txid))
            if self._rejoined:
                # A writer starts a segment only once a quorum finalized every one before it
                # (invariant 6): from here on this node's answers in a recovery are evidence.
                self.storage.write_long(REJOINED, 0)
                self._rejoined = False
            self.stats.out_of_sync = False
            self._highest_written = max(self._highest_written, txid - 1)
            self._advanced.notify_all()

    def _set_aside_stale_segment(self, seg: SegmentFile, res: framing.ScanResult, epoch: int) -> None:
        """Make way for a writer in ``epoch`` restarting segment ``seg.start``, or refuse.

        The rule: the copy here is moved aside (kept, never deleted) when its frames are all from
        an epoch below the writer's; a copy holding the writer's own epoch is refused.

        Why that is safe (design §2.7, invariants 1 and 6): a writer in epoch E starts a segment at N
        only after its recovery over a quorum, each member having promised E, found the log ending
        at N-1; a node of that quorum holding frames at N or later would have reported a newer
        segment, which recovery would have finalized first. So frames written here before epoch E
        are on no node of a quorum, and fencing (invariant 4) keeps any more from arriving: they
        were never committed, and nothing committed is lost. Frames of epoch E itself are the
        writer's own and may be committed (a start repeated after its first reply was lost), so
        they are never replaced. Every frame of an in-progress file carries one epoch (only the
        writer that started the segment appends to it, and a recovery copy is such a file), so the
        last frame's epoch is the file's. This is Hadoop's restart of a segment that a newer
        recovery showed uncommitted (``Journal.startLogSegment``), stated by epoch rather than by
        Hadoop's "at most one transaction", which relies on HDFS opening every segment with one
        transaction alone.
        """
        unsafe = getattr(self._bugs, "restart_segment_of_own_epoch", False)
        if res.last_epoch >= epoch and not unsafe:
            raise SegmentStateError(
                f"in-progress segment {seg.name} already holds txids {seg.start}-{res.last_txid} written in epoch "
                f"{res.last_epoch}; a writer in epoch {epoch} cannot restart it (they may be committed)"
            )
        log.warning(
            "journal %s: writer epoch %d restarts segment %d; moving aside the uncommitted copy of txids %d-%d "
            "from epoch %d",
            self.journal_id,
            epoch,
            seg.start,
            seg.start,
            res.last_txid,
            res.last_epoch,
        )
        self.storage.move_aside(seg, f".superseded-epoch{res.last_epoch}")

    def _new_gate(self, appender: SegmentAppender, txid: int) -> gate_mod.WriteGate:
        gate = gate_mod.WriteGate(
            appender, txid, stager=appender.stager, bounds=self.stats.sync_seconds.bounds, clock=self._clock
        )
        if type(self.hooks).before_append is not JournalHooks.before_append:
            gate.hook = functools.partial(self.hooks.before_append, self.journal_id)
        if self._bugs is not None and self._bugs.ack_before_fsync:
            gate.sync_data = False
        return gate

    def _arm(self, gate: gate_mod.WriteGate) -> None:
        """(_lock held.) What the gate passes without the journal's own checks: frames of the writer
        epoch while it is the promised one or newer (``_check_writer``'s rule)."""
        w = self._writer_epoch
        gate.epoch = w if w >= self._promised else 0
        gate.committed = self._committed

    def journal(self, frames: Sequence[bytes], ack: Callable[[int], None] | None = None) -> int:
        """Append a run of pipelined frames and make them durable with one fdatasync (group commit).

        Each frame is verified and checked for epoch and txid continuity before any byte of it is
        written; the node acknowledges only what this returns, i.e. what is on disk (invariant 4).
        Returns the highest durable txid of the open segment. The open segment's write gate passes
        the common case; a frame it does not pass gets the checks below, which raise or (for a
        protocol bug under test) let it through.

        ``ack``, if given, is called with that txid as soon as the fdatasync returns, before the
        bookkeeping nobody waits on (the index tailing reads, the stats): a writer's commit waits on
        the ack, and Python run between a node's fdatasync and its ack costs the commit several
        times its CPU time (docs/performance.md). It is called under the lock, so no other call sees
        the frames durable before their bookkeeping is done. A refused run does not call it: the
        error carries ``durable_txid`` instead.
        """
        with self._lock:
            if self._ns is None:
                self._check_formatted()
            seg = self._open
            if seg is None:
                if frames:
                    self._check_frame_epoch(framing.verify_frame_ids(frames[0])[0])
                    self.stats.record_out_of_sync()
                raise OutOfSyncError(f"cannot write to journal {self.journal_id}: no segment is open on this node")
            gate = seg.gate
            self._arm(gate)
            try:
                for frame in frames:
                    if not gate.stage(frame):
                        self._stage_refused(seg, frame)
            except BaseException as e:
                if isinstance(e, OutOfSyncError | OutOfOrderError):
                    self.stats.record_out_of_sync()
                # What this call staged before the bad frame is still made durable and
                # acknowledged. Only this call's frames: the node's own highest txid may hold
                # another writer's bytes, and a fenced writer counting it as its ack could reach a
                # false quorum and acknowledge records the log holds with other bytes (invariant 2).
                if gate.staged_txid and self._open is seg:
                    self._sync(seg, None)
                    e.durable_txid = seg.next_txid - 1  # type: ignore[attr-defined]
                raise
            return self._sync(seg, ack)

    def _stage_refused(self, seg: _OpenSegment, frame: bytes) -> None:
        """(_lock held.) A frame the gate did not pass: raise why, or stage it for a bug under test."""
        epoch, segment_txid, first_txid, last_txid = framing.verify_frame_ids(frame)
        self._check_frame_epoch(epoch)
        if segment_txid != seg.start:
            # A frame of a newer segment means this node missed that segment's start: its open
            # segment is stale (Hadoop's rule). A frame of an older one is late, left on a
            # connection of a segment the writer dropped this node from (batches and control calls
            # travel on different connections): refused, the open segment kept.
            if segment_txid > seg.start:
                self._abort_open()
            raise OutOfSyncError(
                f"writer thinks it is writing segment {segment_txid} but the open segment is {seg.start}"
            )
        expected = seg.gate.staged_txid + 1 if seg.gate.staged_txid else seg.next_txid
        if first_txid != expected and not (
            self._bugs is not None and self._bugs.accept_txid_gap and first_txid > expected
        ):
            raise OutOfOrderError(
                f"frame starts at txid {first_txid}, expected {expected}", expected=expected, actual=first_txid
            )
        seg.gate.stage_checked(frame, epoch, first_txid, last_txid)

    def _check_frame_epoch(self, epoch: int) -> None:
        if (epoch != self._writer_epoch or epoch < self._promised) and (
            self._bugs is None or not self._bugs.skip_data_plane_epoch_check
        ):
            self._check_writer(epoch)  # raises FencedError

    def journal_through_gate(self, receive: Callable[[gate_mod.WriteGate], int]) -> int:
        """Let ``receive`` (the data plane's ``Receiver.journal_run``) stage, sync and ack a writer's
        frames and notices through the open segment's gate, under this journal's lock; it returns
        the gate's status, 0 also when no segment is open (the caller then applies the run with
        ``journal`` and ``note_committed``, whose checks say what is wrong)."""
        with self._lock:
            seg = self._open
            if seg is None or self._ns is None:
                return 0
            gate = seg.gate
            self._arm(gate)
            aborted = False
            try:
                status = receive(gate)
            except BaseException:
                if gate.staged_txid and self._open is seg:
                    # Staged bytes that are not durable (a failed sync) may not be acknowledged or
                    # appended after: drop the open segment, as a failed sync does below.
                    log.exception("journal %s: writing segment %d failed; closing it", self.journal_id, seg.start)
                    self._abort_open()
                    aborted = True
                raise
            finally:
                if not aborted:  # what the gate synced is durable, its ack sent or not
                    self._highest_written = max(self._highest_written, gate.next_txid - 1)
            if gate.noticed > self._committed:
                self._note_committed(gate.noticed)
            return status

    def _sync(self, seg: _OpenSegment, ack: Callable[[int], None] | None) -> int:
        """Make what ``seg``'s gate staged durable and ``ack`` it; returns the durable txid."""
        aborted = False
        try:
            return seg.gate.sync(ack)
        except Exception:
            if seg.gate.staged_txid:
                # Nothing after the last durable point may be acknowledged: drop the open segment so
                # the writer marks this node out of sync; a torn tail is repaired when the file is
                # next scanned.
                log.exception("journal %s: sync of segment %d failed; closing it", self.journal_id, seg.start)
                self._abort_open()
                aborted = True
            raise
        finally:
            if not aborted:  # what the gate synced is durable and indexed, its ack sent or not
                self._highest_written = max(self._highest_written, seg.next_txid - 1)

    def record_stats(self) -> JournalStats:
        """Count the open segment's durable runs in ``stats`` and return them: readers call it
        before they look."""
        with self._stats_lock:
            seg = self._open
            if seg is not None:
                self.stats.add_durable(*seg.gate.take_stats())
        return self.stats

    def note_committed(self, epoch: int, txid: int) -> None:
        """The writer's data plane says a quorum holds everything through ``txid``."""
        with self._lock:
            self._check_writer(epoch)
            self._note_committed(txid)

    def finalize_log_segment(self, req: RequestInfo, start: int, end: int, copy_epoch: int = 0) -> None:
        """Finalize segment ``start`` at ``end``.

        ``copy_epoch`` (recovery only): the epoch of the last frame of the copy the writer decided
        on; this node's copy is finalized only if it is that copy.
        """
        with self._lock:
            self._check_request(req)
            self._finalize(start, end, req.epoch, copy_epoch)
            self._store_committed()

    def _finalize(self, start: int, end: int, epoch: int, copy_epoch: int = 0) -> None:
        if end < start:
            raise SegmentStateError(f"cannot finalize segment {start} at {end}: a finalized segment holds a txid")
        known: framing.ScanResult | None = None
        if self._open is not None and self._open.start == start:
            seg = self._open
            if seg.next_txid != end + 1:
                raise OutOfSyncError(
                    f"cannot finalize segment {start} at {end}: it is written only through {seg.next_txid - 1}"
                )
            # Rolling a segment this node wrote: no re-read (Hadoop's JournalNode rescans the whole
            # file here, with a TODO that the length is already known; a 1 GB segment cost each
            # node seconds of CPU and a 1 GB buffer).
            known = seg.scan_result()  # None: scanned below, as for any other copy
            self._abort_open()
        current = self._find(start)
        if current is None:
            raise NotFoundError(f"no segment starting at txid {start} to finalize")
        if not current.in_progress:
            if current.end != end:
                raise InvariantViolation(
                    f"segment {start} is already finalized at {current.end}; refusing to re-finalize at {end}"
                )
            self.storage.delete_paxos(start)
            return
        res = known if known is not None else self._scan(current, repair=True)
        if res is None or res.last_txid != end:
            last = res.last_txid if res is not None else start - 1
            raise OutOfSyncError(f"cannot finalize segment {start} at {end}: the log on disk ends at {last}")
        # Only a copy this epoch wrote, the copy a recovering writer names (same end, same last
        # epoch: the identity accept_recovery uses to skip a download), or one this epoch made
        # ours through accept_recovery. A node that missed the accept may hold a same-length copy
        # from another writer: finalizing it would leave two different finalized segments of one
        # name (invariant 2).
        paxos = self.storage.read_paxos(start)
        accepted = paxos is not None and paxos.accepted_in_epoch == epoch and paxos.segment_state.end_txid == end
        named = copy_epoch != 0 and res.last_epoch == copy_epoch
        anything = self._bugs is not None and self._bugs.finalize_any_same_length_copy
        if not (accepted or named or res.last_epoch == epoch or anything):
            raise OutOfSyncError(
                f"cannot finalize segment {start} at {end} in epoch {epoch}: this copy holds epoch "
                f"{res.last_epoch}'s frames, "
                + (f"not the named copy's epoch {copy_epoch}, " if copy_epoch else "")
                + f"and was not accepted in epoch {epoch}"
            )
        self.storage.finalize_segment(start, end, res.valid_end)
        if res.tail == "clean":  # the finalized file is these bytes, cut after the last frame
            self._remember_finalized(finalized_name(start, end), res)
        self.storage.delete_paxos(start)
        self._highest_written = max(self._highest_written, end)
        self._advanced.notify_all()
        log.info("journal %s: finalized segment %d-%d", self.journal_id, start, end)

    def purge_logs(self, req: RequestInfo, min_txid_to_keep: int, *, admin: bool = False) -> None:
        """Remove the segments wholly below ``min_txid_to_keep`` (design §2.12).

        ``admin``: an operator's purge, checked against the promised epoch without taking a serial
        (``_check_admin``). Either way the newest segment stays: a purge reaching into it is
        refused whole, before anything is removed.
        """
        with self._lock:
            if admin:
                self._check_admin(req)
            else:
                self._check_request(req)
            segments = self.storage.list_segments()
            newest = max((seg.start for seg in segments), default=0)
            keep_open = self._bugs is None or not self._bugs.purge_ignores_open_segment
            if keep_open and segments and min_txid_to_keep > newest:
                raise PurgeRefusedError(
                    f"purge below txid {min_txid_to_keep} would remove the newest segment (from txid {newest}) "
                    f"of journal {self.journal_id}: the open segment, or the one a restarted node resumes"
                )
            for seg in segments:
                if keep_open and self._open is not None and seg.start == self._open.start:
                    continue
                if (seg.end is not None and seg.end < min_txid_to_keep) or (
                    seg.in_progress and seg.start < min_txid_to_keep
                ):
                    if self._open is not None and seg.start == self._open.start:
                        self._abort_open()
                    self.stats.purged_bytes += self.storage.delete_segment(seg)
                    self.stats.purged_segments += 1
                elif seg.in_progress and seg.start < newest:
                    # superseded leftover (HDFS-8178). Unlike Hadoop, never the newest segment: on a
                    # restarted node it is the current one, not open here but holding committed txids.
                    self.storage.move_aside(seg, ".stale")
            self.storage.delete_aside_before(min_txid_to_keep)
            for p in self.storage.list_paxos():
                if p < min_txid_to_keep:
                    self.storage.delete_paxos(p)

    def _check_admin(self, req: RequestInfo) -> None:
        """An operator's purge names the epoch it read from this node: a stale one (a writer won a
        newer epoch since) is refused as fenced, a higher one is never adopted, and no serial is
        taken, so the writer's requests go on unaffected (design §2.12)."""
        self._check_formatted()
        _check_epoch(req.epoch, self._promised)
        if req.epoch != self._promised:
            self.stats.fenced_refused += 1
            raise FencedError(
                f"admin purge names epoch {req.epoch}, but journal {self.journal_id} has promised epoch "
                f"{self._promised}: read the state again",
                request_epoch=req.epoch,
                promised_epoch=self._promised,
            )

    # -- recovery (design §2.8) -------------------------------------------------------------

    def prepare_recovery(self, req: RequestInfo, segment: int) -> PrepareRecoveryResponse:
        """Paxos phase 1: report the segment as on disk, or the proposal accepted earlier."""
        with self._lock:
            self._refuse_while_rejoined(f"prepare_recovery({segment})")
            self._check_request(req)
            self._abort_open()
            return self._prepare(segment)

    def _prepare(self, segment: int) -> PrepareRecoveryResponse:
        paxos = self.storage.read_paxos(segment)
        if paxos is not None and self.storage.has_temp_segment(segment, paxos.accepted_in_epoch):
            # crashed between the paxos commit point and the rename: roll forward (reference §2.4)
            self.storage.promote_temp_segment(segment, paxos.accepted_in_epoch)
            if self._scan_memo is not None:
                self._scan_memo.clear()  # another file now has the segment's name
        state = self._segment_state(segment)
        if paxos is not None and (state is None or state.in_progress):
            if state is None or state.end_txid != paxos.segment_state.end_txid:
                raise InvariantViolation(
                    f"segment {segment} on disk is {state} but the accepted recovery says {paxos.segment_state}"
                )
            return PrepareRecoveryResponse(state, paxos.accepted_in_epoch, self._writer_epoch, self._committed)
        return PrepareRecoveryResponse(state, None, self._writer_epoch, self._committed)

    def accept_recovery(self, req: RequestInfo, state: SegmentState, source: str) -> None:
        """Paxos phase 2: make the chosen copy ours, then persist the decision (the commit point)."""
        with self._lock:
            self._refuse_while_rejoined(f"accept_recovery({state})")
            self._check_request(req)
            self._abort_open()
            seg = state.start_txid
            if seg < 1 or state.end_txid < seg:
                raise SegmentStateError(f"bad recovery state {state}")
            old = self.storage.read_paxos(seg)
            if old is not None and old.accepted_in_epoch > req.epoch:
                raise InvariantViolation(
                    f"bad paxos transition: accepted in epoch {old.accepted_in_epoch}, now asked in {req.epoch}"
                )
            current = self._segment_state(seg)
            downloaded = False
            same = current is not None and current.end_txid == state.end_txid and current.epoch == state.epoch
            if not same:
                if current is not None and not current.in_progress:
                    raise InvariantViolation(f"recovery would change finalized segment {current} into {state}")
                # Only a committed txid learned before this epoch can be one of this segment's: the
                # proposing writer commits txids only in segments it starts after this recovery, so
                # one it reports past the proposed end (a delayed accept, stamped when it runs) is
                # the same number in a later segment, not a txid of this node's longer copy.
                committed = self._committed_before_epoch
                if (
                    (self._bugs is None or not self._bugs.skip_committed_loss_check)
                    and current is not None
                    and current.start_txid <= committed <= current.end_txid
                    and not state.start_txid <= committed <= state.end_txid
                ):
                    raise InvariantViolation(
                        f"recovery to {state} would discard committed txid {committed} held in {current}"
                    )
                self._download_recovery_copy(source, state, req.epoch)
                downloaded = True
            self.hooks.before_persist_paxos(self.journal_id, seg)
            self.storage.write_paxos(seg, PersistedPaxosData(state, req.epoch))
            self.hooks.after_persist_paxos(self.journal_id, seg)
            if downloaded:
                self.storage.promote_temp_segment(seg, req.epoch)
            self._highest_written = max(self._highest_written, state.end_txid)
            log.info("journal %s: accepted recovery %s in epoch %d", self.journal_id, state, req.epoch)

    def _download_recovery_copy(self, source: str, state: SegmentState, epoch: int) -> None:
        """Stream ``source``'s copy of the segment into the temporary file of ``epoch``, each frame
        verified as it arrives (design §4.3); it must end where ``state`` says."""
        seg = state.start_txid
        scan = SegmentStreamScan(seg)
        try:
            self.storage.write_temp_segment(seg, epoch, scan.passing(self._fetch(source, self.journal_id, seg)))
            res = scan.finish()
            if res.last_txid != state.end_txid or (state.epoch and res.last_epoch != state.epoch):
                raise CorruptFrameError(
                    f"downloaded segment {seg} from {source} ends at {res.last_txid} in epoch {res.last_epoch}, "
                    f"not {state.end_txid} in epoch {state.epoch}",
                    reason="recovery_length",
                )
        except BaseException:
            self.storage.discard_temp_segment(seg, epoch)
            raise

    # -- catch-up (design §4.4) ---------------------------------------------------------------

    def sync_need(self, start: int, end: int) -> str:
        """What catch-up should do with a peer's finalized segment ``start``-``end``:

        ``"missing"``: nothing here holds it (download it); ``"stale"``: an in-progress copy here
        that no writer has open (a node down while the segment was finalized): download the
        finalized copy and move this one aside; ``"have"``: the same finalized segment is here;
        ``"busy"``: the segment is open here; ``"diverged"``: a finalized segment here overlaps it
        with another range, or an in-progress one starts inside it -- never replaced.
        """
        with self._lock:
            if self._ns is None:
                return "busy"
            if self._open is not None and self._open.start == start:
                return "busy"
            verdict = "missing"
            replace_finalized = getattr(self._bugs, "sync_replaces_finalized_copy", False)
            for seg in self.storage.list_segments():
                if seg.end is not None:
                    if seg.start == start and seg.end == end:
                        return "have"
                    if seg.start == start and replace_finalized:
                        return "stale"
                    if seg.start <= end and start <= seg.end:
                        return "diverged"
                elif seg.start == start:
                    verdict = "stale"
                elif start < seg.start <= end:
                    return "diverged"
            return verdict

    def install_synced(self, start: int, end: int, chunks: Iterable[bytes]) -> str:
        """Take a peer's finalized segment ``start``-``end`` from ``chunks`` (design §4.4).

        The copy is written beside the segments with each frame verified as it arrives (no lock
        held: a download may take long), must hold exactly txids ``start..end``, and is renamed
        in only if ``sync_need`` still says so under the lock (a finalize or a recovery may have
        raced the download). Returns ``"installed"`` or the verdict that stopped it.
        """
        scan = SegmentStreamScan(start)
        try:
            self.storage.write_sync_segment(start, end, scan.passing(chunks))
            res = scan.finish()
            if res.first_txid != start or res.last_txid != end:
                raise CorruptFrameError(
                    f"catch-up copy of segment {start}-{end} holds txids {res.first_txid}-{res.last_txid}",
                    reason="sync_length",
                )
        except BaseException:
            self.storage.discard_sync_segment(start, end)
            raise
        with self._lock:
            verdict = self.sync_need(start, end)
            if verdict not in ("missing", "stale"):
                self.storage.discard_sync_segment(start, end)
                return verdict
            if verdict == "stale":
                local = self._find(start)
                if local is not None:
                    log.warning(
                        "journal %s: catch-up replaces the unfinished copy %s with the finalized segment %d-%d "
                        "(kept as %s.stale)",
                        self.journal_id, local.name, start, end, local.name,
                    )  # fmt: skip
                    self.storage.move_aside(local, ".stale")
            self.storage.install_sync_segment(start, end)
            self._remember_finalized(finalized_name(start, end), res)
            self._highest_written = max(self._highest_written, end)
            log.info("journal %s: catch-up installed segment %d-%d", self.journal_id, start, end)
            return "installed"

    # -- reading -----------------------------------------------------------------------------

    def get_edit_log_manifest(self, since_txid: int, in_progress_ok: bool = False) -> EditLogManifest:
        with self._lock:
            self._check_formatted()
            logs: list[RemoteEditLog] = []
            for seg in self.storage.list_segments():
                if seg.end is not None:
                    if seg.end >= since_txid:
                        logs.append(RemoteEditLog(seg.start, seg.end, False, self.storage.segment_mtime(seg)))
                elif in_progress_ok:
                    if self._open is not None and self._open.start == seg.start:
                        end = self._open.next_txid - 1
                    else:
                        res = self._scan(seg, repair=False)
                        end = res.last_txid if res is not None else seg.start - 1
                    if end >= seg.start and end >= since_txid:
                        logs.append(RemoteEditLog(seg.start, end, True))
            return EditLogManifest(tuple(logs), self._committed)

    def get_journaled_edits(self, since_txid: int, max_txns: int) -> JournaledEdits:
        """Whole frames of the open segment from ``since_txid`` on (the tailing fast path, reference §4.3)."""
        with self._lock:
            self._check_formatted()
            seg = self._open
            if seg is None or since_txid < seg.start:
                raise NotFoundError(f"txid {since_txid} is not in an open segment on this node")
            if since_txid == seg.next_txid:
                return JournaledEdits(0)
            if since_txid > seg.next_txid:
                raise NotFoundError(f"txid {since_txid} is ahead of this node's log (next is {seg.next_txid})")
            picked = [f for f in seg.index if f[1] >= since_txid]
            out: list[tuple[int, int, int, int]] = []
            count = 0
            for f in picked:
                out.append(f)
                count = f[1] - since_txid + 1
                if count >= max_txns:
                    break
            count = min(count, max_txns)
            lo, hi = out[0][2], out[-1][2] + out[-1][3]
            data = self.storage.read_segment(SegmentFile(seg.start, None, inprogress_name(seg.start)), lo, hi - lo)
            return JournaledEdits(count, data)

    def open_download(self, segment: int) -> SegmentDownload:
        """The segment's valid bytes (header and whole frames), for recovery downloads, readers and
        catch-up, served from an open file a chunk at a time (design §4.3). The lock is held
        only to find the file and its valid end; a finalize or purge during the download leaves
        the open file readable."""
        with self._lock:
            self._check_formatted()
            seg = self._find(segment)
            if seg is None:
                raise NotFoundError(f"no segment starting at txid {segment} on this node")
            reader = self.storage.open_segment(seg)
            try:
                res = self._open.scan_result() if self._open is not None and self._open.start == segment else None
                if res is None:
                    res = self._scan(seg, repair=False)
                if res is None:
                    raise CorruptFrameError(f"segment file {seg.name} has no valid header", reason="segment")
                if seg.end is not None and res.last_txid != seg.end:
                    raise CorruptFrameError(
                        f"finalized segment {seg.name} is damaged: valid frames end at {res.last_txid}, not {seg.end} "
                        f"({res.error})",
                        reason="finalized_damaged",
                    )
            except BaseException:
                reader.close()
                raise
            state = SegmentState(segment, res.last_txid, seg.in_progress, res.last_epoch)
            return SegmentDownload(state, res.valid_end, reader)

    def read_segment_file(self, segment: int) -> tuple[bytes, SegmentState]:
        """``open_download`` read whole: for tests and the simulation, whose segments are small."""
        d = self.open_download(segment)
        return b"".join(d.chunks()), d.state

    # -- following ---------------------------------------------------------------------------

    @property
    def committed_txid(self) -> int:
        return self._committed

    def wake_followers(self) -> None:
        """Wake every ``wait_committed_frames`` (a follower went away, the node is stopping)."""
        with self._lock:
            self._advanced.notify_all()

    def wait_committed_frames(self, since: int, max_bytes: int, timeout: float) -> tuple[bytes, int, int] | None:
        """``committed_frames``, waiting up to ``timeout`` for some; None if none came (or woken)."""
        with self._lock:
            got = self.committed_frames(since, max_bytes)
            if got is None and not self._closed:
                self._followers_waiting += 1
                try:
                    self._advanced.wait(timeout)
                finally:
                    self._followers_waiting -= 1
                got = self.committed_frames(since, max_bytes)
            return got

    def committed_frames(self, since: int, max_bytes: int) -> tuple[bytes, int, int] | None:
        """``(frames, first_txid, last_txid)``: whole frames from the one holding ``since`` on, all
        of them committed as far as this node knows (design §3.1); None when there is none yet.

        A finalized segment is decided (invariant 5): the rest of it is served at once, read once
        (the caller splits it). The open segment is served only through the committed txid, only
        while no newer writer has been promised (a recovery may yet cut it), only whole frames, at
        most ``max_bytes`` of them (at least one).
        Raises ``NotFoundError`` when ``since`` is held here in a form this node cannot vouch for
        (an in-progress copy it does not have open: a restarted or recovering node) or was purged:
        the follower asks another node.
        """
        with self._lock:
            self._check_formatted()
            if self._closed:
                raise NotFoundError(f"journal {self.journal_id} is closing on this node")
            seg = self._open
            if seg is not None and seg.start <= since:
                if self._writer_epoch != self._promised:
                    return None
                limit = self._committed
                return self._frames_of_index(seg.start, seg.index, since, limit, max_bytes)
            segments = self.storage.list_segments()
            for f in segments:
                if f.end is not None and f.start <= since <= f.end:
                    return self._finalized_frames(f, since)
            if since <= self._highest_written or (segments and since < segments[0].start):
                raise NotFoundError(
                    f"txid {since} is not in a finalized or open segment on this node: follow another node"
                )
            return None

    def _frames_of_index(
        self, start: int, index: Sequence[tuple[int, int, int, int]], since: int, limit: int, max_bytes: int
    ) -> tuple[bytes, int, int] | None:
        picked = _pick_frames(index, since, limit, max_bytes)
        if not picked:
            return None
        lo, hi = picked[0][2], picked[-1][2] + picked[-1][3]
        data = self.storage.read_segment(SegmentFile(start, None, inprogress_name(start)), lo, hi - lo)
        return data, picked[0][0], picked[-1][1]

    def _finalized_frames(self, seg: SegmentFile, since: int) -> tuple[bytes, int, int]:
        """Every frame of a finalized segment from the one holding ``since``: read once, whatever its size."""
        data = self.storage.read_segment(seg)
        pos = SEGMENT_HEADER_SIZE
        while pos < len(data):
            h = framing.decode_header(data, pos)
            if h.last_txid >= since:
                if h.first_txid > since:
                    break
                return data[pos:], h.first_txid, seg.end if seg.end is not None else h.last_txid
            pos += h.frame_len
        raise CorruptFrameError(f"finalized segment {seg.name} does not hold txid {since}")

    # -- internals ---------------------------------------------------------------------------

    def _abort_open(self) -> None:
        if self._open is not None:
            with self._stats_lock:
                self.stats.add_durable(*self._open.gate.take_stats())
            self._open.appender.close()
            self._open = None

    def close(self) -> None:
        with self._lock:
            try:
                self._store_committed()
            except StorageError as e:  # a hint: the node still stops, and reads an older one at open
                log.warning("journal %s: could not write the committed txid on close: %s", self.journal_id, e)
            self._abort_open()
            self._closed = True
            self._advanced.notify_all()

    def _find(self, start: int) -> SegmentFile | None:
        for seg in self.storage.list_segments():
            if seg.start == start:
                return seg
        return None

    def _scan(self, seg: SegmentFile, *, repair: bool) -> framing.ScanResult | None:
        """Scan a segment; for an in-progress one with ``repair``, cut a torn tail (copied aside first)."""
        known = (self._finalized_scans if seg.end is not None else self._scan_memo or {}).get(seg.name)
        if known is not None:
            return known
        res = self._scan_file(seg, repair=repair)
        if res is not None and res.tail == "clean":
            if seg.end is not None:
                self._remember_finalized(seg.name, res)
            elif self._scan_memo is not None:
                self._scan_memo[seg.name] = res
        return res

    def _remember_finalized(self, name: str, res: framing.ScanResult) -> None:
        self._finalized_scans[name] = res
        if len(self._finalized_scans) > 16:
            del self._finalized_scans[next(iter(self._finalized_scans))]

    def _scan_file(self, seg: SegmentFile, *, repair: bool) -> framing.ScanResult | None:
        try:
            # a window at a time: a segment can be gigabytes
            res = scan_segment_windows(lambda offset, n: self.storage.read_segment(seg, offset, n), seg.start)
        except CorruptFrameError as e:
            if seg.in_progress and e.reason == "short_header":  # shorter than a segment header
                if repair:
                    log.warning("journal %s: %s has no complete header; moving it aside", self.journal_id, seg.name)
                    self.storage.move_aside(seg, ".empty")
                return None
            if not seg.in_progress:
                raise
            if repair:
                log.warning("journal %s: %s has a corrupt header (%s); moving it aside", self.journal_id, seg.name, e)
                self.storage.move_aside(seg, ".corrupt")
            return None
        if res.tail != "clean" and seg.in_progress and repair:
            log.warning(
                "journal %s: %s has a torn tail at offset %d (%s); truncating (tail kept beside it)",
                self.journal_id,
                seg.name,
                res.valid_end,
                res.error,
            )
            self.storage.truncate_inprogress(seg.start, res.valid_end)
        return res

    def _segment_state(self, start: int) -> SegmentState | None:
        """The segment as prepare/accept see it; an in-progress one without txids is moved aside."""
        seg = self._find(start)
        if seg is None:
            return None
        res = self._scan(seg, repair=True)
        if seg.end is not None:
            return SegmentState(start, seg.end, False, res.last_epoch if res is not None else 0)
        if res is None:
            return None
        if res.frame_count == 0:
            self.storage.move_aside(seg, ".empty")  # design §2.10.5: an empty segment never existed
            return None
        return SegmentState(start, res.last_txid, True, res.last_epoch)

    def _roll_forward_accepted(self) -> set[int]:
        """Promote every downloaded copy whose acceptance was persisted (the paxos commit point)
        but not yet renamed into place, so that new_epoch reports the segment it belongs to.
        Returns the segments whose file this replaced."""
        promoted = set()
        for segment in self.storage.list_paxos():
            paxos = self.storage.read_paxos(segment)
            if paxos is not None and self.storage.has_temp_segment(segment, paxos.accepted_in_epoch):
                self.storage.promote_temp_segment(segment, paxos.accepted_in_epoch)
                promoted.add(segment)
        return promoted

    def _newest_segment_with_txns(self) -> SegmentFile | None:
        """Newest segment, moving aside newest in-progress files that hold no txid (reference §1.4)."""
        while True:
            segs = self.storage.list_segments()
            if not segs:
                return None
            newest = max(segs, key=lambda s: s.start)
            if not newest.in_progress:
                return newest
            res = self._scan(newest, repair=True)
            if res is not None and res.frame_count > 0:
                return newest
            if res is not None:
                self.storage.move_aside(newest, ".empty")

    def _scan_newest_on_open(self) -> int:
        newest = self._newest_segment_with_txns()
        if newest is None:
            return 0
        if newest.end is not None:
            return newest.end
        res = self._scan(newest, repair=False)
        return res.last_txid if res is not None else newest.start - 1

    def peek_state(self) -> JournalState | None:
        """The state without taking the lock (None if not formatted), for metrics and health pages:
        a scrape must not wait behind a recovery download. Each field is read atomically; two
        fields may be from moments apart."""
        if self._ns is None:
            return None
        seg = self._open
        return JournalState(
            last_promised_epoch=self._promised,
            last_writer_epoch=self._writer_epoch,
            committed_txid=self._committed,
            highest_written_txid=self._highest_written,
            open_segment_txid=seg.start if seg is not None else 0,
        )

    def memory_key(self) -> tuple[object, ...]:
        """The in-memory state that decides what this journal does next and is not in its storage
        (epochs, committed txid, last serial, highest written, the open segment's start and next
        txid, whether it rejoined without segments): with the storage's contents it identifies a
        node's state, as the simulator's exhaustive search needs to prune states it has seen. No
        lock, like ``peek_state``."""
        o = self._open
        return (
            self._promised, self._writer_epoch, self._committed, self._serial, self._highest_written,
            None if o is None else (o.start, o.next_txid), self._rejoined,
        )  # fmt: skip

    def status(self) -> dict[str, object]:
        """A snapshot for ``qjm status``."""
        with self._lock:
            return {
                "journal_id": self.journal_id,
                "formatted": self._ns is not None,
                **_namespace_fields(self._ns),
                "rejoined_without_segments": self._rejoined,
                "promised_epoch": self._promised,
                "writer_epoch": self._writer_epoch,
                "committed_txid": self._committed,
                "highest_written_txid": self._highest_written,
                "open_segment": self._open.start if self._open else None,
                "segments": [s.name for s in self.storage.list_segments()],
                "batches_written": self.record_stats().batches_written,
                "committed_hints_dropped": self.committed_hints_dropped,
                "purged_segments": self.stats.purged_segments,
                "purged_bytes": self.stats.purged_bytes,
                "sync": self.sync_stats.as_dict(),
            }


def _pick_frames(
    index: Sequence[tuple[int, int, int, int]], since: int, limit: int, max_bytes: int
) -> list[tuple[int, int, int, int]]:
    """The index entries from the frame holding ``since`` on, each ending at or before ``limit``,
    together at most ``max_bytes`` (but at least one)."""
    picked: list[tuple[int, int, int, int]] = []
    size = 0
    for f in index:
        if f[1] < since:
            continue
        if f[1] > limit or (picked and size + f[3] > max_bytes):
            break
        picked.append(f)
        size += f[3]
    return picked


def _namespace_fields(ns: NamespaceInfo | None) -> dict[str, object]:
    """The namespace a journal is stamped with, for ``status`` (a rejoining node is formatted with
    its peers')."""
    if ns is None:
        return {}
    return {"namespace_id": ns.namespace_id, "cluster_id": ns.cluster_id, "ctime": ns.ctime}


def unformatted_status(journal_id: str) -> dict[str, object]:
    """``Journal.status()`` of a journal this node has never seen (nothing is created to answer it)."""
    return {
        "journal_id": journal_id,
        "formatted": False,
        "promised_epoch": 0,
        "writer_epoch": 0,
        "committed_txid": NO_TXID,
        "highest_written_txid": 0,
        "open_segment": None,
        "segments": [],
        "batches_written": 0,
        "committed_hints_dropped": 0,
        "purged_segments": 0,
        "purged_bytes": 0,
        "sync": SyncStats().as_dict(),
    }


MAX_EPOCH = 2**63 - 1
"""Epochs travel as uint64 but are stored as signed 64-bit integers (``durable_long``), like Hadoop's
Java ``long``: a larger one is refused before anything is persisted."""


MAX_EPOCH_STEP = 2**20
"""How far above its promise a node takes an epoch. Writers propose one above the highest promise
they learn of, so a node sees a jump only as large as the failovers it missed; a caller naming an
epoch near ``MAX_EPOCH`` would otherwise leave no epoch for any later writer (design §9.3)."""
MAX_SERIAL = 2**63 - 1
MAX_SERIAL_STEP = 2**32
"""How far above the last serial of the epoch a request's serial may be: a writer numbers its calls
to a node one by one, so a larger jump is not from it, and would make its next calls out of order."""


def _check_epoch(epoch: int, promised: int) -> None:
    if not 0 <= epoch <= MAX_EPOCH:
        raise EpochError(f"epoch {epoch} is out of range: epochs are 0..{MAX_EPOCH} (signed 64-bit)")
    if epoch - promised > MAX_EPOCH_STEP:
        raise EpochError(
            f"epoch {epoch} is more than {MAX_EPOCH_STEP} above the promised epoch {promised}: not a writer's proposal"
        )
