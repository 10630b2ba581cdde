"""The Journal state machine (reference §1.3-1.4) on MemoryStorage and on DiskStorage alike."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qjm._native import framing
from qjm.errors import (
    AlreadyFormattedError,
    CorruptFrameError,
    EpochError,
    FencedError,
    InvariantViolation,
    JournalIdError,
    NamespaceMismatchError,
    NotFormattedError,
    NotFoundError,
    OutOfOrderError,
    OutOfSyncError,
    PurgeRefusedError,
    QJMError,
    SegmentStateError,
    StorageError,
)
from qjm.protocol.frame import SEGMENT_HEADER_SIZE
from qjm.protocol.messages import (
    NO_TXID,
    NamespaceInfo,
    NewEpochResponse,
    PrepareRecoveryResponse,
    RemoteEditLog,
    RequestInfo,
    SegmentState,
)
from qjm.server import storage as storage_module
from qjm.server.journal import COMMITTED, COMMITTED_WRITE_INTERVAL, Journal, JournalHooks
from qjm.server.storage import (
    DiskStorage,
    JournalStorage,
    SegmentAppender,
    SegmentFile,
    finalized_name,
    inprogress_name,
    scan_segment_bytes,
)
from qjm.testing.bugs import ProtocolBugs
from qjm.testing.memstore import MemoryStorage

JID = "j"
NS = NamespaceInfo(42, "cluster-a")


def frame(first: int, n: int, *, epoch: int, seg: int, tag: bytes = b"t") -> bytes:
    records = [tag + str(t).encode() for t in range(first, first + n)]
    return bytes(framing.encode_frame(records, epoch=epoch, segment_txid=seg, first_txid=first))


def records_of(segment_bytes: bytes) -> list[bytes]:
    out: list[bytes] = []
    for _h, off in framing.iter_frames(segment_bytes, framing.decode_segment_header(segment_bytes).start_txid):
        out.extend(framing.decode_records(segment_bytes, off))
    return out


class Env:
    """Creates per-node storages of one kind, restarts nodes and lists their files."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.nodes: dict[str, Journal] = {}
        self._dirs: dict[int, Path] = {}
        self._opened: list[JournalStorage] = []

    def storage(self, node: str = "n0") -> JournalStorage:
        st: JournalStorage
        if self.kind == "memory":
            st = MemoryStorage(JID)
        else:
            d = self.tmp_path / node
            st = DiskStorage(str(d), JID)
            self._dirs[id(st)] = d
        self._opened.append(st)
        return st

    def fetch(self, source: str, journal_id: str, segment: int) -> Iterator[bytes]:
        assert journal_id == JID
        return self.nodes[source].open_download(segment).chunks(1000)

    def journal(self, node: str = "n0", *, hooks: JournalHooks | None = None, fmt: bool = True) -> Journal:
        j = Journal(self.storage(node), fetcher=self.fetch, hooks=hooks)
        if fmt:
            j.format(NS)
        self.nodes[node] = j
        return j

    def restart(self, j: Journal, node: str = "n0") -> Journal:
        """Stop the node (a crash for memory: unsynced bytes are lost) and open the same storage again."""
        j.close()
        st = j.storage
        new_st: JournalStorage
        if isinstance(st, MemoryStorage):
            st.crash()
            new_st = st
        else:
            assert isinstance(st, DiskStorage)
            st.close()
            new_st = DiskStorage(str(self._dirs[id(st)]), JID)
            self._dirs[id(new_st)] = self._dirs[id(st)]
            self._opened.append(new_st)
        nj = Journal(new_st, fetcher=self.fetch)
        self.nodes[node] = nj
        return nj

    def names(self, st: JournalStorage) -> list[str]:
        if isinstance(st, MemoryStorage):
            return st.file_names()
        assert isinstance(st, DiskStorage)
        return sorted(n for n in os.listdir(st.current) if n.startswith("edits"))

    def close(self) -> None:
        for j in self.nodes.values():
            j.close()
        for st in self._opened:
            if isinstance(st, DiskStorage):
                st.close()


@pytest.fixture(params=["memory", "disk"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    e = Env(request.param, tmp_path)
    yield e
    e.close()


class Writer:
    """A minimal stand-in for the writer: stamps epoch and increasing serials on requests."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.serial = 0

    def req(self, committed: int = NO_TXID) -> RequestInfo:
        self.serial += 1
        return RequestInfo(JID, self.epoch, self.serial, committed)


def writing(j: Journal, epoch: int = 1, seg: int = 1, upto: int = 0) -> Writer:
    """new_epoch(epoch) + start_log_segment(seg) + frames of 3 txids through ``upto``."""
    j.new_epoch(NS, epoch)
    w = Writer(epoch)
    j.start_log_segment(w.req(), seg)
    txid = seg
    while txid <= upto:
        n = min(3, upto - txid + 1)
        assert j.journal([frame(txid, n, epoch=epoch, seg=seg)]) == txid + n - 1
        txid += n
    return w


# -- format / state ------------------------------------------------------------------------------


def test_format_and_not_formatted(env: Env) -> None:
    j = env.journal(fmt=False)
    assert not j.is_formatted()
    with pytest.raises(NotFormattedError):
        j.get_journal_state()
    with pytest.raises(NotFormattedError):
        j.new_epoch(NS, 1)
    with pytest.raises(NotFormattedError):
        j.heartbeat(RequestInfo(JID, 1, 1))
    with pytest.raises(NotFormattedError):
        j.journal([frame(1, 1, epoch=1, seg=1)])
    j.format(NS)
    assert j.is_formatted()
    assert j.namespace == NS
    s = j.get_journal_state()
    assert (s.last_promised_epoch, s.last_writer_epoch, s.committed_txid, s.open_segment_txid) == (0, 0, NO_TXID, 0)
    # VERSION survives a restart
    assert env.restart(j).namespace == NS


def test_format_refuses_existing_data_without_force(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=3, upto=3)
    with pytest.raises(AlreadyFormattedError):
        j.format(NS)
    assert j.get_journal_state().last_promised_epoch == 3
    j.format(NamespaceInfo(7, "other"), force=True)
    s = j.get_journal_state()
    assert (s.last_promised_epoch, s.last_writer_epoch, s.open_segment_txid) == (0, 0, 0)
    assert j.namespace == NamespaceInfo(7, "other")
    assert env.names(j.storage) == []
    with pytest.raises(NamespaceMismatchError):
        j.format(NamespaceInfo(0, "x"), force=True)


def test_new_epoch_must_increase_and_namespace_must_match(env: Env) -> None:
    j = env.journal()
    assert j.new_epoch(NS, 1).last_segment_txid is None
    with pytest.raises(EpochError):
        j.new_epoch(NS, 1)
    j.new_epoch(NS, 5)
    with pytest.raises(EpochError):
        j.new_epoch(NS, 4)
    with pytest.raises(NamespaceMismatchError):
        j.new_epoch(NamespaceInfo(43, NS.cluster_id), 6)
    with pytest.raises(NamespaceMismatchError):
        j.new_epoch(NamespaceInfo(NS.namespace_id, "cluster-b"), 6)
    assert j.get_journal_state().last_promised_epoch == 5
    assert env.restart(j).get_journal_state().last_promised_epoch == 5  # the promise is durable


# -- fencing ------------------------------------------------------------------------------------


def test_fencing_rpc_and_frames(env: Env) -> None:
    j = env.journal()
    old = writing(j, epoch=1, upto=3)
    j.new_epoch(NS, 2)
    with pytest.raises(FencedError) as info:
        j.heartbeat(old.req())
    assert (info.value.request_epoch, info.value.promised_epoch) == (1, 2)
    with pytest.raises(FencedError) as info:
        j.start_log_segment(old.req(), 4)
    assert (info.value.request_epoch, info.value.promised_epoch) == (1, 2)
    with pytest.raises(FencedError) as finfo:
        j.journal([frame(4, 1, epoch=1, seg=1)])
    assert (finfo.value.request_epoch, finfo.value.promised_epoch) == (1, 2)
    # the new writer may not append to a segment it did not start (writer epoch is still 1)
    with pytest.raises(FencedError):
        j.journal([frame(4, 1, epoch=2, seg=1)])
    assert j.get_journal_state().highest_written_txid == 3


def test_a_refused_frame_reports_no_durable_txid_of_another_writer(env: Env) -> None:
    """The durable txid of an error covers only the refused call's own frames. Found by the fault
    search: a fenced writer counted the node's txids 1-3 -- written by its successor -- as its own
    ack and reached a false quorum."""
    j = env.journal()
    writing(j, epoch=2, upto=3)  # the successor's txids 1-3
    for stale in (frame(1, 3, epoch=1, seg=1, tag=b"old"), frame(4, 1, epoch=1, seg=1)):
        with pytest.raises(FencedError) as info:
            j.journal([stale])
        assert not hasattr(info.value, "durable_txid")
    with pytest.raises(OutOfOrderError) as oinfo:
        j.journal([frame(2, 1, epoch=2, seg=1)])  # a duplicate: nothing of this call was written
    assert not hasattr(oinfo.value, "durable_txid")


def test_the_ack_goes_out_once_durable_and_a_failed_ack_loses_no_bookkeeping(env: Env) -> None:
    """``journal``'s ack runs as soon as the run is durable (before the index and stats are kept,
    which no writer waits on); if it fails (the writer's connection is gone), the frames are still
    the journal's: the next run continues after them."""
    j = env.journal()
    w = writing(j, epoch=1, upto=3)
    st = j.storage
    acked: list[int] = []

    def ack(txid: int) -> None:
        if isinstance(st, MemoryStorage):  # everything written is durable by now
            name = next(n for n in st.file_names() if "inprogress" in n)
            assert st.durable_size(name) == len(st.read_file(name))
        acked.append(txid)

    assert j.journal([frame(4, 2, epoch=1, seg=1), frame(6, 1, epoch=1, seg=1)], ack) == 6
    assert acked == [6]

    def lost(txid: int) -> None:
        raise ConnectionResetError("the writer hung up")

    with pytest.raises(ConnectionResetError):
        j.journal([frame(7, 2, epoch=1, seg=1)], lost)
    assert j.peek_state().highest_written_txid == 8  # type: ignore[union-attr]
    assert j.journal([frame(9, 1, epoch=1, seg=1)], ack) == 9
    assert acked == [6, 9]
    # A run refused part-way is not acked: the error carries what of it is durable.
    with pytest.raises(OutOfOrderError) as info:
        j.journal([frame(10, 1, epoch=1, seg=1), frame(12, 1, epoch=1, seg=1)], ack)
    assert info.value.durable_txid == 10  # type: ignore[attr-defined]
    assert acked == [6, 9]
    j.finalize_log_segment(w.req(), 1, 10)  # the node's end is 10: refused otherwise
    name = [n for n in env.names(st) if n.startswith("edits_0")]
    assert len(name) == 1
    data = st.read_file(name[0]) if isinstance(st, MemoryStorage) else (Path(st.current) / name[0]).read_bytes()
    assert records_of(data) == [b"t%d" % t for t in range(1, 11)]


def test_serial_must_increase_and_higher_epoch_is_adopted(env: Env) -> None:
    j = env.journal()
    j.new_epoch(NS, 1)
    j.heartbeat(RequestInfo(JID, 1, 5))
    with pytest.raises(OutOfOrderError) as info:
        j.heartbeat(RequestInfo(JID, 1, 5))
    assert (info.value.expected, info.value.actual) == (6, 5)
    with pytest.raises(OutOfOrderError):
        j.heartbeat(RequestInfo(JID, 1, 4))
    j.heartbeat(RequestInfo(JID, 1, 6))
    # a newer epoch is adopted (and persisted), and its serials start afresh
    j.heartbeat(RequestInfo(JID, 7, 1))
    assert j.get_journal_state().last_promised_epoch == 7
    with pytest.raises(FencedError):
        j.heartbeat(RequestInfo(JID, 1, 100))
    with pytest.raises(EpochError):
        j.new_epoch(NS, 7)
    assert env.restart(j).get_journal_state().last_promised_epoch == 7


def test_committed_txid_never_moves_backward(env: Env) -> None:
    j = env.journal()
    w = writing(j, epoch=1, upto=6)
    j.heartbeat(w.req(committed=5))
    assert j.get_journal_state().committed_txid == 5
    # journal.py keeps the highest value seen: a stale, lower notice (the data and control planes
    # are separate connections) is ignored rather than refused, but never lowers the txid.
    j.heartbeat(w.req(committed=3))
    assert j.get_journal_state().committed_txid == 5
    assert j.prepare_recovery(w.req(), 1).last_committed_txid == 5
    j.heartbeat(w.req())  # NO_TXID: no information, not a move backward
    assert j.get_journal_state().committed_txid == 5


def test_committed_txid_file_is_written_at_most_every_interval_and_at_finalize_promise_and_close(
    env: Env,
) -> None:
    now = [0.0]
    st = env.storage()
    j = Journal(st, clock=lambda: now[0])
    j.format(NS)
    w = writing(j, epoch=1, upto=12)
    j.note_committed(1, 3)
    assert st.read_long(COMMITTED) == 3  # the first advance is written at once
    j.note_committed(1, 4)
    j.heartbeat(w.req(committed=5))
    assert (j.committed_txid, st.read_long(COMMITTED)) == (5, 3)  # within the interval: not yet
    now[0] += COMMITTED_WRITE_INTERVAL
    j.note_committed(1, 6)
    assert st.read_long(COMMITTED) == 6
    j.note_committed(1, 9)
    assert st.read_long(COMMITTED) == 6
    j.finalize_log_segment(w.req(), 1, 12)
    assert st.read_long(COMMITTED) == 9  # a finalize writes the newest
    j.heartbeat(w.req(committed=10))
    assert st.read_long(COMMITTED) == 9
    j.new_epoch(NS, 2)
    assert st.read_long(COMMITTED) == 10  # so does a new promise
    w = Writer(2)
    j.start_log_segment(w.req(), 13)
    assert j.journal([frame(13, 3, epoch=2, seg=13)]) == 15
    j.note_committed(2, 14)
    assert st.read_long(COMMITTED) == 10
    j.close()
    assert st.read_long(COMMITTED) == 14  # and a close
    if isinstance(st, DiskStorage):
        st.close()
        reopened = DiskStorage(str(env.tmp_path / "n0"), JID)
        try:
            assert Journal(reopened).committed_txid == 14
        finally:
            reopened.close()


def test_a_waiting_follower_is_woken_by_a_commit_notice(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=1, upto=6)
    got: list[tuple[bytes, int, int] | None] = []
    follower = threading.Thread(target=lambda: got.append(j.wait_committed_frames(1, 1 << 20, 60.0)))
    started = time.monotonic()
    follower.start()
    while j._followers_waiting == 0:  # the follower found nothing committed and waits
        assert follower.is_alive() and time.monotonic() - started < 30
        time.sleep(0.001)
    j.note_committed(1, 6)
    follower.join(30)
    assert not follower.is_alive() and got and got[0] is not None
    assert got[0][1:] == (1, 6)
    assert j._followers_waiting == 0


# -- writing -------------------------------------------------------------------------------------


def test_write_and_finalize_happy_path(env: Env) -> None:
    j = env.journal()
    w = writing(j, epoch=1, seg=1)
    st = j.get_journal_state()
    assert (st.last_writer_epoch, st.open_segment_txid) == (1, 1)
    assert j.journal([frame(1, 2, epoch=1, seg=1), frame(3, 3, epoch=1, seg=1)]) == 5
    assert j.journal([frame(6, 1, epoch=1, seg=1)]) == 6
    assert j.journal([]) == 6
    assert j.get_journal_state().highest_written_txid == 6
    j.finalize_log_segment(w.req(), 1, 6)
    assert j.get_journal_state().open_segment_txid == 0
    assert finalized_name(1, 6) in env.names(j.storage)
    data, state = j.read_segment_file(1)
    assert state == SegmentState(1, 6, False, 1)
    assert records_of(data) == [b"t%d" % t for t in range(1, 7)]
    # next segment
    j.start_log_segment(w.req(), 7)
    assert j.journal([frame(7, 2, epoch=1, seg=7)]) == 8
    m = j.get_edit_log_manifest(1, in_progress_ok=True)
    assert m.logs == (RemoteEditLog(1, 6, False), RemoteEditLog(7, 8, True))
    assert j.get_edit_log_manifest(1).logs == (RemoteEditLog(1, 6, False),)
    assert j.get_edit_log_manifest(7).logs == ()
    # after a restart the in-progress segment is found by scanning
    j2 = env.restart(j)
    assert j2.get_journal_state().highest_written_txid == 8
    assert j2.get_edit_log_manifest(0, in_progress_ok=True).logs[-1] == RemoteEditLog(7, 8, True)


def test_gap_or_duplicate_is_out_of_order_and_appends_nothing(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=1, upto=3)
    size = len(j.read_segment_file(1)[0])
    for bad in (frame(5, 1, epoch=1, seg=1), frame(3, 1, epoch=1, seg=1), frame(1, 3, epoch=1, seg=1)):
        with pytest.raises(OutOfOrderError) as info:
            j.journal([bad])
        assert info.value.expected == 4
        assert len(j.read_segment_file(1)[0]) == size
    assert j.get_journal_state().highest_written_txid == 3
    # a good frame followed by a bad one: the good one is kept, durable and reported
    with pytest.raises(OutOfOrderError) as info:
        j.journal([frame(4, 1, epoch=1, seg=1), frame(6, 1, epoch=1, seg=1)])
    assert info.value.durable_txid == 4  # type: ignore[attr-defined]
    assert j.get_journal_state().highest_written_txid == 4
    assert j.journal([frame(5, 1, epoch=1, seg=1)]) == 5


def test_wrong_segment_is_out_of_sync_and_closes_the_segment(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=1, seg=1, upto=3)
    with pytest.raises(OutOfSyncError) as info:
        j.journal([frame(4, 1, epoch=1, seg=4)])
    assert not isinstance(info.value, OutOfOrderError)
    assert j.get_journal_state().open_segment_txid == 0
    with pytest.raises(OutOfSyncError):
        j.journal([frame(4, 1, epoch=1, seg=1)])


def test_a_late_frame_of_an_older_segment_leaves_the_open_one_alone(env: Env) -> None:
    """Batches and control calls travel on different connections: a node dropped from segment 1
    (the writer stopped waiting for it) can read frames of segment 1 still buffered on the old
    connection after it started segment 4. It refuses them, and segment 4 stays open."""
    j = env.journal()
    w = writing(j, epoch=1, seg=1, upto=3)
    j.start_log_segment(w.req(), 4)  # out of sync for segment 1: no finalize before the next start
    with pytest.raises(OutOfSyncError):
        j.journal([frame(4, 1, epoch=1, seg=1)])
    assert j.get_journal_state().open_segment_txid == 4
    assert j.journal([frame(4, 1, epoch=1, seg=4)]) == 4


def test_corrupt_frame_is_refused_and_the_node_keeps_serving(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=1, upto=3)
    good = frame(4, 2, epoch=1, seg=1)
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    for bad in (bytes(flipped), good[:-1], b"", b"garbage" * 20):
        with pytest.raises(CorruptFrameError):
            j.journal([bad])
    assert j.get_journal_state().highest_written_txid == 3
    assert j.journal([good]) == 5
    assert records_of(j.read_segment_file(1)[0])[-2:] == [b"t4", b"t5"]


def test_journal_without_open_segment(env: Env) -> None:
    j = env.journal()
    w = writing(j, epoch=1, upto=3)
    j.finalize_log_segment(w.req(), 1, 3)
    with pytest.raises(OutOfSyncError):
        j.journal([frame(4, 1, epoch=1, seg=4)])
    with pytest.raises(OutOfSyncError):
        j.journal([])


def test_finalize_checks(env: Env) -> None:
    j = env.journal()
    w = writing(j, epoch=1, upto=3)
    with pytest.raises(OutOfSyncError):
        j.finalize_log_segment(w.req(), 1, 5)
    with pytest.raises(OutOfSyncError):
        j.finalize_log_segment(w.req(), 1, 2)
    assert j.get_journal_state().open_segment_txid == 1  # still open, still writable
    assert j.journal([frame(4, 1, epoch=1, seg=1)]) == 4
    j.finalize_log_segment(w.req(), 1, 4)
    j.finalize_log_segment(w.req(), 1, 4)  # idempotent
    with pytest.raises(InvariantViolation):
        j.finalize_log_segment(w.req(), 1, 5)
    with pytest.raises(NotFoundError):
        j.finalize_log_segment(w.req(), 9, 10)
    assert finalized_name(1, 4) in env.names(j.storage)


def test_finalize_of_a_closed_in_progress_segment_checks_the_disk(env: Env) -> None:
    j = env.journal()
    w = writing(j, epoch=1, upto=6)
    j = env.restart(j)  # the open segment is closed: finalize checks the file on disk
    with pytest.raises(OutOfSyncError):
        j.finalize_log_segment(w.req(), 1, 7)
    j.finalize_log_segment(w.req(), 1, 6)
    assert j.read_segment_file(1)[1] == SegmentState(1, 6, False, 1)


def test_finalize_refuses_end_before_start(env: Env) -> None:
    j = env.journal()
    w = writing(j, epoch=1, seg=5)
    with pytest.raises(SegmentStateError):
        j.finalize_log_segment(w.req(), 5, 4)
    assert finalized_name(5, 4) not in env.names(j.storage)


def test_start_segment_checks(env: Env) -> None:
    j = env.journal()
    w = writing(j, epoch=1, upto=6)
    j.finalize_log_segment(w.req(), 1, 6)
    with pytest.raises(SegmentStateError):
        j.start_log_segment(w.req(), 1)
    with pytest.raises(SegmentStateError):
        j.start_log_segment(w.req(), 4)
    with pytest.raises(SegmentStateError):
        j.start_log_segment(w.req(), 0)
    j.start_log_segment(w.req(), 7)
    j.journal([frame(7, 1, epoch=1, seg=7)])
    # an in-progress segment holding transactions is not overwritten either
    with pytest.raises(SegmentStateError):
        j.start_log_segment(w.req(), 7)
    assert records_of(j.read_segment_file(7)[0]) == [b"t7"]


def test_start_segment_records_writer_epoch_and_restarts_an_empty_segment(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=1, seg=1)
    j.new_epoch(NS, 2)
    w2 = Writer(2)
    j.start_log_segment(w2.req(), 1)  # the epoch-1 file holds no txid: it may be recreated
    assert j.get_journal_state().last_writer_epoch == 2
    assert j.journal([frame(1, 2, epoch=2, seg=1)]) == 2
    assert env.restart(j).get_journal_state().last_writer_epoch == 2


def test_new_epoch_reports_newest_segment_and_moves_aside_empty_one(env: Env) -> None:
    j = env.journal()
    w = writing(j, epoch=1, upto=3)
    j.finalize_log_segment(w.req(), 1, 3)
    j.start_log_segment(w.req(), 4)
    assert inprogress_name(4) in env.names(j.storage)
    assert j.new_epoch(NS, 2).last_segment_txid == 1
    names = env.names(j.storage)
    assert inprogress_name(4) not in names
    assert inprogress_name(4) + ".empty" in names
    assert j.get_journal_state().open_segment_txid == 0
    # an in-progress segment with transactions is reported as it is
    w3 = Writer(3)
    j.heartbeat(w3.req())
    j.start_log_segment(w3.req(), 4)
    j.journal([frame(4, 1, epoch=3, seg=4)])
    assert j.new_epoch(NS, 4).last_segment_txid == 4
    assert inprogress_name(4) in env.names(j.storage)


def test_purge_logs(env: Env) -> None:
    j = env.journal()
    w = writing(j, epoch=1, upto=3)
    j.finalize_log_segment(w.req(), 1, 3)
    j.start_log_segment(w.req(), 4)
    j.journal([frame(4, 3, epoch=1, seg=4)])
    j.finalize_log_segment(w.req(), 4, 6)
    j.start_log_segment(w.req(), 7)
    j.journal([frame(7, 2, epoch=1, seg=7)])
    j.purge_logs(w.req(), 5)
    names = env.names(j.storage)
    assert finalized_name(1, 3) not in names
    assert finalized_name(4, 6) in names
    assert inprogress_name(7) in names  # the open segment is never touched
    assert j.journal([frame(9, 1, epoch=1, seg=7)]) == 9
    before = env.names(j.storage)
    with pytest.raises(PurgeRefusedError):  # past the open segment's first txid: refused whole
        j.purge_logs(w.req(), 100)
    assert env.names(j.storage) == before
    j.purge_logs(w.req(), 7)
    assert env.names(j.storage) == [inprogress_name(7)]
    assert j.stats.purged_segments == 2 and j.stats.purged_bytes > 2 * SEGMENT_HEADER_SIZE
    assert j.status()["purged_segments"] == 2


def test_a_restarted_node_refuses_a_purge_into_its_newest_segment(env: Env) -> None:
    """No segment open here, but the newest in-progress one may hold committed txids: refused."""
    j = env.journal()
    writing(j, epoch=1, seg=10, upto=12)
    j = env.restart(j)
    j.new_epoch(NS, 2)
    with pytest.raises(PurgeRefusedError):
        j.purge_logs(Writer(2).req(), 11)
    assert env.names(j.storage) == [inprogress_name(10)]


def test_an_admin_purge_needs_the_promised_epoch_and_takes_no_serial(env: Env) -> None:
    j = env.journal()
    w = writing(j, epoch=2, upto=3)
    j.finalize_log_segment(w.req(), 1, 3)
    j.start_log_segment(w.req(), 4)
    for stale_or_new in (1, 3):
        with pytest.raises(FencedError):
            j.purge_logs(RequestInfo(JID, stale_or_new, 0, NO_TXID), 4, admin=True)
    assert finalized_name(1, 3) in env.names(j.storage)
    j.purge_logs(RequestInfo(JID, 2, 0, NO_TXID), 4, admin=True)
    assert env.names(j.storage) == [inprogress_name(4)]
    assert j.get_journal_state().last_promised_epoch == 2
    j.journal([frame(4, 1, epoch=2, seg=4)])
    j.finalize_log_segment(w.req(), 4, 4)  # the writer's serials go on as if nothing happened


def test_purge_keeps_the_newest_in_progress_segment(env: Env) -> None:
    """A restarted node's current segment is not open there but may hold committed txids: kept."""
    j = env.journal()
    writing(j, epoch=1, seg=10, upto=12)
    j = env.restart(j)
    j.new_epoch(NS, 2)
    j.purge_logs(Writer(2).req(), 5)
    assert env.names(j.storage) == [inprogress_name(10)]


def test_purge_marks_a_superseded_in_progress_segment_stale(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=1, seg=10, upto=12)
    j = env.restart(j)  # segment 10 left in progress on this node
    w = Writer(2)
    j.new_epoch(NS, 2)
    j.start_log_segment(w.req(), 20)
    j.purge_logs(w.req(), 5)
    assert inprogress_name(10) + ".stale" in env.names(j.storage)
    j.purge_logs(w.req(), 15)  # moved-aside files of purged ranges go too
    assert env.names(j.storage) == [inprogress_name(20)]


def test_get_journaled_edits_counts(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=1, upto=9)  # frames 1-3, 4-6, 7-9
    e = j.get_journaled_edits(5, 10)
    assert e.txn_count == 5
    recs = []
    off = 0
    while off < len(e.frames):
        h = framing.verify_frame(e.frames, off)
        recs.extend(framing.decode_records(e.frames, off))
        off += h.frame_len
    assert recs == [b"t%d" % t for t in range(4, 10)]  # whole frames, from the one holding 5
    e2 = j.get_journaled_edits(5, 2)
    assert e2.txn_count == 2
    h2 = framing.verify_frame(e2.frames)
    assert (h2.first_txid, h2.frame_len) == (4, len(e2.frames))
    assert j.get_journaled_edits(1, 3).txn_count == 3
    assert j.get_journaled_edits(10, 5).txn_count == 0
    assert j.get_journaled_edits(10, 5).frames == b""
    with pytest.raises(NotFoundError):
        j.get_journaled_edits(11, 5)
    with pytest.raises(NotFoundError):
        j.get_journaled_edits(0, 5)


# -- recovery -----------------------------------------------------------------------------------


def three_nodes(env: Env) -> tuple[Journal, Journal, Journal]:
    """n0 holds 1-5, n1 holds 1-3, n2 has no segment (design §2.10.2-like), all from writer epoch 1."""
    a, b, c = env.journal("n0"), env.journal("n1"), env.journal("n2")
    writing(a, epoch=1, upto=5)
    writing(b, epoch=1, upto=3)
    writing(c, epoch=1)  # empty: moved aside at prepare
    for j in (a, b, c):
        j.new_epoch(NS, 2)
    return a, b, c


def test_prepare_and_accept_recovery(env: Env) -> None:
    a, b, c = three_nodes(env)
    w = Writer(2)
    prep = {n: env.nodes[n].prepare_recovery(w.req(), 1) for n in ("n0", "n1", "n2")}
    assert prep["n0"] == PrepareRecoveryResponse(SegmentState(1, 5, True, 1), None, 1, NO_TXID)
    assert prep["n1"] == PrepareRecoveryResponse(SegmentState(1, 3, True, 1), None, 1, NO_TXID)
    assert prep["n2"].segment_state is None and prep["n2"].last_writer_epoch == 1
    assert inprogress_name(1) + ".empty" in env.names(c.storage)
    target = SegmentState(1, 5, True, 1)
    for j in (a, b, c):
        j.accept_recovery(w.req(), target, "n0")
    for j in (a, b, c):
        data, state = j.read_segment_file(1)
        assert state == target
        assert records_of(data) == [b"t%d" % t for t in range(1, 6)]
    # a later prepare (a newer writer) sees the accepted proposal with its epoch
    w3 = Writer(3)
    for j in (a, b, c):
        assert j.prepare_recovery(w3.req(), 1) == PrepareRecoveryResponse(target, 2, 1, NO_TXID)
    for j in (a, b, c):
        j.accept_recovery(w3.req(), target, "n0")  # epoch 3 proposes the accepted value again
        j.finalize_log_segment(w3.req(), 1, 5)
    # once finalized, the paxos record is gone and the finalized state is reported
    for j in (a, b, c):
        assert j.prepare_recovery(w3.req(), 1) == PrepareRecoveryResponse(
            SegmentState(1, 5, False, 1), None, 1, NO_TXID
        )
        assert j.storage.list_paxos() == []


def test_accept_recovery_on_finalized_segment_with_other_end(env: Env) -> None:
    _, b, _ = three_nodes(env)
    w = Writer(2)
    b.accept_recovery(w.req(), SegmentState(1, 3, True, 1), "n1")  # its own copy
    b.finalize_log_segment(w.req(), 1, 3)
    with pytest.raises(InvariantViolation):
        b.accept_recovery(w.req(), SegmentState(1, 5, True, 1), "n0")
    assert b.read_segment_file(1)[1] == SegmentState(1, 3, False, 1)
    b.accept_recovery(w.req(), SegmentState(1, 3, True, 1), "n0")  # same end: nothing to change


def test_accept_recovery_refuses_to_drop_a_committed_txid(env: Env) -> None:
    a, b = env.journal("n0"), env.journal("n1")
    writing(a, epoch=1, upto=5)
    writing(b, epoch=1, upto=3)
    a.note_committed(1, 5)  # epoch 1's writer had 1-5 on a quorum
    for j in (a, b):
        j.new_epoch(NS, 2)
    w = Writer(2)
    with pytest.raises(InvariantViolation, match="would discard committed txid 5"):
        a.accept_recovery(w.req(), SegmentState(1, 3, True, 1), "n1")
    assert a.read_segment_file(1)[1] == SegmentState(1, 5, True, 1)


def test_accept_recovery_may_drop_txids_its_own_writer_committed_in_a_later_segment(env: Env) -> None:
    """A delayed accept_recovery carries the committed txid of its writer at delivery: by then the
    writer may have finalized the segment shorter and committed the same txid numbers in the next
    segment. Those are not txids of this node's longer, older copy, which recovery must replace."""
    a, b = env.journal("n0"), env.journal("n1")
    writing(a, epoch=1, upto=8)  # 6-8 reached only this node: never committed
    writing(b, epoch=1, upto=5)
    a.note_committed(1, 5)
    for j in (a, b):
        j.new_epoch(NS, 2)
    w = Writer(2)
    target = SegmentState(1, 5, True, 1)
    b.accept_recovery(w.req(), target, "n1")
    b.finalize_log_segment(w.req(), 1, 5)
    b.start_log_segment(w.req(), 6)
    assert b.journal([frame(6, 3, epoch=2, seg=6)]) == 8  # with a second node: 6-8 committed
    a.accept_recovery(w.req(committed=8), target, "n1")
    a.finalize_log_segment(w.req(committed=8), 1, 5)
    assert records_of(a.read_segment_file(1)[0]) == [b"t%d" % t for t in range(1, 6)]
    a.start_log_segment(w.req(committed=8), 6)
    assert a.journal([frame(6, 3, epoch=2, seg=6)]) == 8


def test_accept_recovery_rejects_bad_state_and_short_download(env: Env) -> None:
    a, b, _ = three_nodes(env)
    w = Writer(2)
    with pytest.raises(SegmentStateError):
        b.accept_recovery(w.req(), SegmentState(5, 4, True, 1), "n0")
    # the source holds only 1-3, not the 1-5 the proposal names
    a2 = env.journal("n3")
    writing(a2, epoch=1, upto=3)
    with pytest.raises(CorruptFrameError):
        a.accept_recovery(w.req(), SegmentState(1, 4, True, 1), "n3")
    assert a.storage.read_paxos(1) is None
    assert a.read_segment_file(1)[1] == SegmentState(1, 5, True, 1)


class CrashAt(JournalHooks):
    def __init__(self, point: str) -> None:
        self.point = point

    def before_persist_paxos(self, journal_id: str, segment: int) -> None:
        if self.point == "before":
            raise RuntimeError("crash before the paxos commit point")

    def after_persist_paxos(self, journal_id: str, segment: int) -> None:
        if self.point == "after":
            raise RuntimeError("crash after the paxos commit point")


@pytest.mark.parametrize("point", ["before", "after"])
def test_paxos_commit_point_and_roll_forward(env: Env, point: str) -> None:
    src = env.journal("n0")
    writing(src, epoch=1, upto=5)
    b = env.journal("n1", hooks=CrashAt(point))
    writing(b, epoch=1, upto=3)
    b.new_epoch(NS, 2)
    with pytest.raises(RuntimeError):
        b.accept_recovery(Writer(2).req(), SegmentState(1, 5, True, 1), "n0")
    b = env.restart(b, "n1")
    prep = b.prepare_recovery(Writer(3).req(), 1)
    if point == "before":  # no visible change: the download was never committed
        assert prep == PrepareRecoveryResponse(SegmentState(1, 3, True, 1), None, 1, NO_TXID)
    else:  # committed: rolled forward to the downloaded copy
        assert prep == PrepareRecoveryResponse(SegmentState(1, 5, True, 1), 2, 1, NO_TXID)
        assert records_of(b.read_segment_file(1)[0]) == [b"t%d" % t for t in range(1, 6)]


def test_new_epoch_answers_phase_one_and_rolls_an_accepted_copy_forward(env: Env) -> None:
    """new_epoch carries prepare_recovery's answer for the node's newest segment. A node that
    crashed after persisting an accepted proposal but before renaming the downloaded copy, and
    that had no copy of the segment before, must report it: otherwise its newest segment would
    look older and the proposal would be missed (the 2.10.7 hazard)."""
    src = env.journal("n0")
    writing(src, epoch=1, upto=5)
    b = env.journal("n1", hooks=CrashAt("after"))
    empty = env.journal("n2")
    for j in (src, b, empty):
        j.new_epoch(NS, 2)
    with pytest.raises(RuntimeError):
        b.accept_recovery(Writer(2).req(), SegmentState(1, 5, True, 1), "n0")
    b = env.restart(b, "n1")
    target = SegmentState(1, 5, True, 1)
    assert b.new_epoch(NS, 3) == NewEpochResponse(1, PrepareRecoveryResponse(target, 2, 0, NO_TXID))
    assert src.new_epoch(NS, 3) == NewEpochResponse(1, PrepareRecoveryResponse(target, None, 1, NO_TXID))
    assert empty.new_epoch(NS, 3) == NewEpochResponse(None, PrepareRecoveryResponse(None, None, 0, NO_TXID))
    # the same answers as the separate prepare round gives
    assert b.prepare_recovery(Writer(3).req(), 1) == PrepareRecoveryResponse(target, 2, 0, NO_TXID)
    assert records_of(b.read_segment_file(1)[0]) == [b"t%d" % t for t in range(1, 6)]


def test_a_restarted_node_finalizes_the_copy_it_accepted_not_the_one_it_held(env: Env) -> None:
    """A crash between the paxos commit point and the rename leaves the accepted copy in its temp
    file. If the writer's finalize is the restarted node's next call, the accepted proposal must
    not vouch for the same-length copy the node held before: that is another writer's history."""
    j = env.journal("n0", hooks=CrashAt("after"))
    writing(j, epoch=1, upto=1)  # txid 1 from writer epoch 1, on this node only
    src = env.journal("n1")
    writing(src, epoch=2, upto=1)  # the chosen copy: epoch 2's txid 1
    j.new_epoch(NS, 3)
    w3 = Writer(3)
    with pytest.raises(RuntimeError):
        j.accept_recovery(w3.req(), SegmentState(1, 1, True, 2), "n1")
    j = env.restart(j, "n0")
    j.finalize_log_segment(w3.req(), 1, 1, 2)
    data, state = j.read_segment_file(1)
    assert state == SegmentState(1, 1, False, 2)
    assert data == src.read_segment_file(1)[0]


def test_finalize_refuses_a_copy_the_epoch_neither_wrote_nor_accepted(env: Env) -> None:
    """A node that missed accept_recovery may hold a same-length copy from another writer: the
    recovering writer's finalize must not make it a second history (found by the fault search)."""
    j = env.journal()
    writing(j, epoch=1, upto=1)  # txid 1 from writer epoch 1, never committed
    j.new_epoch(NS, 3)
    w3 = Writer(3)
    with pytest.raises(OutOfSyncError, match="not accepted in epoch 3"):
        j.finalize_log_segment(w3.req(), 1, 1)
    assert j.read_segment_file(1)[1] == SegmentState(1, 1, True, 1)  # still in progress, untouched
    src = env.journal("n1")
    writing(src, epoch=2, upto=1)  # the chosen copy: epoch 2's txid 1
    j.accept_recovery(w3.req(), SegmentState(1, 1, True, 2), "n1")
    j.finalize_log_segment(w3.req(), 1, 1)
    assert j.read_segment_file(1)[1] == SegmentState(1, 1, False, 2)


def test_finalize_takes_the_named_copy_and_only_that_one(env: Env) -> None:
    """A recovering writer that found every node holding one copy finalizes it without an accept
    round, naming the copy by its last frame's epoch: the node finalizes its copy only if it is
    that copy (same end, same epoch), so a same-length copy of another writer is still refused."""
    j = env.journal()
    writing(j, epoch=1, upto=3)
    j.new_epoch(NS, 3)
    w3 = Writer(3)
    with pytest.raises(OutOfSyncError, match="not the named copy's epoch 2"):
        j.finalize_log_segment(w3.req(), 1, 3, copy_epoch=2)
    with pytest.raises(OutOfSyncError, match="ends at 3"):
        j.finalize_log_segment(w3.req(), 1, 4, copy_epoch=1)
    assert j.read_segment_file(1)[1] == SegmentState(1, 3, True, 1)  # refused calls changed nothing
    j.finalize_log_segment(w3.req(), 1, 3, copy_epoch=1)
    assert j.read_segment_file(1)[1] == SegmentState(1, 3, False, 1)
    assert j.get_journal_state().highest_written_txid == 3


def counting_reads(j: Journal) -> list[str]:
    """The names of the segment files ``j`` reads from now on."""
    reads: list[str] = []
    real = j.storage.read_segment

    def counting(seg: SegmentFile, offset: int = 0, length: int = -1) -> bytes:
        reads.append(seg.name)
        return real(seg, offset, length)

    j.storage.read_segment = counting  # type: ignore[method-assign]
    return reads


def test_new_epoch_reads_a_segment_once_and_a_finalized_one_not_again(env: Env) -> None:
    """Phase 1 needs no read of the segment this node was writing, and scans any other newest
    segment once per new_epoch; a segment this node finalized is never read again for it
    (finalized segments do not change), and the answers stay the same."""
    j = env.journal()
    writing(j, epoch=1, upto=6)
    reads = counting_reads(j)
    phase1 = NewEpochResponse(1, PrepareRecoveryResponse(SegmentState(1, 6, True, 1), None, 1, NO_TXID))
    assert j.new_epoch(NS, 2) == phase1
    assert reads == []
    j = env.restart(j)  # a restarted node has to read it, once
    reads = counting_reads(j)
    assert j.new_epoch(NS, 3) == phase1
    assert reads == [inprogress_name(1)]
    j.finalize_log_segment(Writer(3).req(), 1, 6, copy_epoch=1)
    reads.clear()
    assert j.new_epoch(NS, 4) == NewEpochResponse(
        1, PrepareRecoveryResponse(SegmentState(1, 6, False, 1), None, 1, NO_TXID)
    )
    assert reads == []
    restarted = env.restart(j)  # a restarted node knows nothing and reads it again
    reads = counting_reads(restarted)
    assert restarted.new_epoch(NS, 5).recovery == PrepareRecoveryResponse(
        SegmentState(1, 6, False, 1), None, 1, NO_TXID
    )
    assert reads == [finalized_name(1, 6)]


def test_rolling_its_own_segment_reads_nothing_and_knows_what_a_scan_finds(env: Env) -> None:
    """Finalizing the open segment this node wrote uses what it knows (every frame was verified
    and synced on arrival) instead of re-reading the file; what it remembers for readers is what
    a scan of the finalized file finds."""
    j = env.journal()
    w = writing(j, epoch=1, upto=9)
    j.journal([frame(10, 2, epoch=1, seg=1)])
    reads = counting_reads(j)
    j.finalize_log_segment(w.req(), 1, 11)
    assert reads == []
    data, state = j.read_segment_file(1)
    assert state == SegmentState(1, 11, False, 1)
    assert j._finalized_scans[finalized_name(1, 11)] == scan_segment_bytes(data, 1)
    assert records_of(data)[-2:] == [b"t10", b"t11"]
    j2 = env.journal("n1")
    w2 = writing(j2, epoch=1, upto=3)
    with pytest.raises(OutOfSyncError, match="written only through 3"):
        j2.finalize_log_segment(w2.req(), 1, 4)
    j2.finalize_log_segment(w2.req(), 1, 3)
    assert j2.read_segment_file(1)[1] == SegmentState(1, 3, False, 1)


@pytest.mark.parametrize("seed", range(12))
def test_what_the_node_knows_of_its_open_segment_is_what_a_scan_finds(env: Env, seed: int) -> None:
    """Random runs of good frames, refused frames (wrong txid, older epoch, corrupt) and refused
    frames in the middle of a run: the open segment's own account (used instead of re-reading it
    on roll and on new_epoch) always equals a scan of the file."""
    rng = random.Random(seed)
    j = env.journal()
    epoch = rng.randint(1, 3)
    w = writing(j, epoch=epoch, seg=5)
    nxt = 5
    for _ in range(rng.randint(1, 25)):
        run: list[bytes] = []
        for _ in range(rng.randint(1, 4)):
            n = rng.randint(1, 5)
            kind = rng.choice(["good"] * 6 + ["gap", "old_epoch", "corrupt"])
            if kind == "good":
                run.append(frame(nxt, n, epoch=epoch, seg=5))
                nxt += n
            elif kind == "gap":
                run.append(frame(nxt + 1, n, epoch=epoch, seg=5))
            elif kind == "old_epoch":
                run.append(frame(nxt, n, epoch=epoch - 1 or epoch + 9, seg=5))
            else:
                bad = bytearray(frame(nxt, n, epoch=epoch, seg=5))
                bad[-1] ^= 0xFF
                run.append(bytes(bad))
            if kind != "good":
                break
        try:
            j.journal(run)
        except QJMError:
            pass
        nxt = j.get_journal_state().highest_written_txid + 1
        assert j._open is not None
        known = j._open.scan_result()
        assert known is not None
        data = j.storage.read_segment(SegmentFile(5, None, inprogress_name(5)))
        assert known == scan_segment_bytes(data, 5)
    if nxt > 5:
        j.finalize_log_segment(w.req(), 5, nxt - 1)
        data, state = j.read_segment_file(5)
        assert state == SegmentState(5, nxt - 1, False, epoch)
        assert len(data) == known.valid_end


def test_a_restarted_node_scans_a_large_segment_a_window_at_a_time(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Phase 1 on a restarted node reads its newest segment in windows (it can be gigabytes),
    and finds what a scan of the whole file finds."""
    j = env.journal()
    writing(j, epoch=1)
    big = [bytes([i % 251]) * 3000 for i in range(40)]
    txid = 1
    for k in range(0, len(big), 4):
        j.journal([bytes(framing.encode_frame(big[k : k + 4], epoch=1, segment_txid=1, first_txid=txid))])
        txid += 4
    j = env.restart(j)
    reads: list[int] = []
    real = j.storage.read_segment

    def counting(seg: SegmentFile, offset: int = 0, length: int = -1) -> bytes:
        reads.append(length)
        return real(seg, offset, length)

    monkeypatch.setattr(j.storage, "read_segment", counting)
    monkeypatch.setattr(storage_module, "SCAN_WINDOW", 16 * 1024)
    assert j.new_epoch(NS, 2).recovery == PrepareRecoveryResponse(SegmentState(1, 40, True, 1), None, 1, NO_TXID)
    assert len(reads) > 7 and max(reads) == 16 * 1024  # 120 KiB of frames, never more than a window at once
    whole = scan_segment_bytes(real(SegmentFile(1, None, inprogress_name(1))), 1)
    assert (whole.frame_count, whole.last_txid, whole.tail) == (10, 40, "clean")


def test_accept_recovery_replaces_a_same_length_copy_from_an_older_writer(env: Env) -> None:
    # Epoch 1 wrote txid 1 to n0 only; epoch 2 (n0 unreachable) wrote a different txid 1 to n1 and n2.
    n0, n1 = env.journal("n0"), env.journal("n1")
    writing(n0, epoch=1)
    n0.journal([frame(1, 1, epoch=1, seg=1, tag=b"old")])
    writing(n1, epoch=2)
    n1.journal([frame(1, 1, epoch=2, seg=1, tag=b"new")])
    # Epoch 3 recovers: n1 wins on its writer epoch (HDFS-3845) and every node accepts 1-1 from it.
    w = Writer(3)
    for j in (n0, n1):
        j.new_epoch(NS, 3)
    assert n1.prepare_recovery(w.req(), 1).last_writer_epoch > n0.prepare_recovery(w.req(), 1).last_writer_epoch
    for j in (n0, n1):
        j.accept_recovery(w.req(), SegmentState(1, 1, True, 2), "n1")
        j.finalize_log_segment(w.req(), 1, 1)
    assert records_of(n0.read_segment_file(1)[0]) == records_of(n1.read_segment_file(1)[0]) == [b"new1"]


# -- disk specifics ------------------------------------------------------------------------------


def test_torn_tail_is_cut_on_open_and_kept_aside(tmp_path: Path) -> None:
    st = DiskStorage(str(tmp_path), JID)
    j = Journal(st)
    j.format(NS)
    writing(j, epoch=1, upto=6)
    j.close()
    st.close()
    path = tmp_path / JID / "current" / inprogress_name(1)
    valid = scan_segment_bytes(path.read_bytes(), 1).valid_end  # the file may be preallocated past it
    garbage = frame(7, 3, epoch=1, seg=1)[:-5]  # a frame cut short by a crash
    with open(path, "r+b") as f:
        f.seek(valid)
        f.write(garbage)
    st2 = DiskStorage(str(tmp_path), JID)
    try:
        j2 = Journal(st2)
        assert path.stat().st_size == valid
        kept = tmp_path / JID / "current" / f"{inprogress_name(1)}.corrupt-tail-{valid}"
        assert kept.read_bytes() == garbage
        assert j2.get_journal_state().highest_written_txid == 6
        assert j2.get_edit_log_manifest(1, in_progress_ok=True).logs == (RemoteEditLog(1, 6, True),)
        j2.new_epoch(NS, 2)
        w2 = Writer(2)
        j2.accept_recovery(w2.req(), SegmentState(1, 6, True, 1), "n0")  # its own copy: nothing to fetch
        j2.finalize_log_segment(w2.req(), 1, 6)
        assert records_of(j2.read_segment_file(1)[0]) == [b"t%d" % t for t in range(1, 7)]
    finally:
        st2.close()


@pytest.mark.parametrize("bad", ["../x", "", ".hidden", "a/b", "..", "/abs"])
def test_hostile_journal_ids(tmp_path: Path, bad: str) -> None:
    with pytest.raises(JournalIdError):
        DiskStorage(str(tmp_path), bad)
    with pytest.raises(JournalIdError):
        MemoryStorage(bad)
    assert list(tmp_path.iterdir()) == []


def test_two_disk_storages_on_one_directory(tmp_path: Path) -> None:
    st = DiskStorage(str(tmp_path), JID)
    try:
        with pytest.raises(StorageError):
            DiskStorage(str(tmp_path), JID)
    finally:
        st.close()
    DiskStorage(str(tmp_path), JID).close()  # free again once the first one let go


# -- memory crash model --------------------------------------------------------------------------


class _UnsyncedAppender:
    """Wraps an appender whose ``sync`` the test can hold back: appended, not yet durable."""

    def __init__(self, inner: SegmentAppender, owner: DeferredSyncStorage) -> None:
        self._inner = inner
        self._owner = owner

    @property
    def size(self) -> int:
        return self._inner.size

    @property
    def stager(self) -> None:
        return None

    def append(self, data: bytes) -> None:
        self._inner.append(data)

    def sync(self) -> None:
        if not self._owner.hold_sync:
            self._inner.sync()

    def truncate(self, size: int) -> None:
        self._inner.truncate(size)

    def close(self) -> None:
        self._inner.close()


class DeferredSyncStorage(MemoryStorage):
    hold_sync = False

    def create_segment(self, start: int, header: bytes) -> SegmentAppender:
        return _UnsyncedAppender(super().create_segment(start, header), self)


def test_memory_crash_keeps_only_synced_txids() -> None:
    st = DeferredSyncStorage(JID)
    j = Journal(st)
    j.format(NS)
    w = writing(j, epoch=1, upto=3)
    j.heartbeat(w.req(committed=3))  # best effort, not durable
    st.hold_sync = True
    j.journal([frame(4, 2, epoch=1, seg=1)])  # appended but never synced
    assert len(st.read_file(inprogress_name(1))) > st.durable_size(inprogress_name(1))
    st.hold_sync = False
    st.crash()
    j2 = Journal(st)
    s = j2.get_journal_state()
    assert (s.highest_written_txid, s.last_promised_epoch, s.last_writer_epoch) == (3, 1, 1)
    assert s.committed_txid == NO_TXID
    assert records_of(j2.read_segment_file(1)[0]) == [b"t1", b"t2", b"t3"]
    with pytest.raises(StorageError):  # the dead process's appender is gone with it
        j.journal([frame(6, 1, epoch=1, seg=1)])


@pytest.mark.parametrize("seed", range(20))
def test_memory_torn_crash_leaves_a_clean_prefix(seed: int) -> None:
    st = DeferredSyncStorage(JID)
    j = Journal(st)
    j.format(NS)
    writing(j, epoch=1, upto=3)
    st.hold_sync = True
    j.journal([frame(4, 2, epoch=1, seg=1), frame(6, 3, epoch=1, seg=1)])
    st.crash(random.Random(seed))
    j2 = Journal(st)
    last = j2.get_journal_state().highest_written_txid
    assert last in (3, 5, 8)  # whole frames only
    assert records_of(j2.read_segment_file(1)[0]) == [b"t%d" % t for t in range(1, last + 1)]
    # any partial frame was cut and kept aside
    seg = st.read_file(inprogress_name(1))
    assert framing.scan(seg, 1, SEGMENT_HEADER_SIZE).valid_end == len(seg)


def test_memory_storage_basics() -> None:
    st = MemoryStorage("abc")
    assert st.journal_id == "abc"
    assert st.describe() == "mem:abc"
    assert not st.has_data()
    st.write_long("x", 5, durable=False)
    assert st.read_long("x") == 5
    st.crash()
    assert st.read_long("x") is None
    st.write_long("x", 6)
    st.write_long("x", 7, durable=False)
    st.crash()
    assert st.read_long("x") == 6
    assert st.crashes == 2


def test_a_newer_writer_restarts_a_segment_holding_only_older_frames(env: Env) -> None:
    """Design §3 invariants 1 and 6: frames of an older epoch in a segment a newer writer starts
    were on no node of its recovery quorum, so never committed; they are moved aside, not lost.
    The writer's own frames are never replaced."""
    j = env.journal()
    writing(j, epoch=1, upto=4)
    w2 = Writer(2)
    j.start_log_segment(w2.req(), 1)
    assert any(".superseded-epoch1" in n for n in env.names(j.storage))
    assert j.journal([frame(1, 2, epoch=2, seg=1, tag=b"n")]) == 2
    with pytest.raises(SegmentStateError, match="written in epoch 2"):
        j.start_log_segment(w2.req(), 1)
    assert records_of(j.read_segment_file(1)[0]) == [b"n1", b"n2"]


def test_tooth_restarting_a_segment_of_the_writers_own_epoch_loses_committed_txids(env: Env) -> None:
    """The unsafe variant of the rule above (``restart_segment_of_own_epoch``): a repeated start
    in the same epoch drops frames a quorum may have acknowledged."""
    bugged = Journal(env.storage("bugged"), fetcher=env.fetch, bugs=ProtocolBugs.only("restart_segment_of_own_epoch"))
    bugged.format(NS)
    env.nodes["bugged"] = bugged
    w = writing(bugged, epoch=1, upto=3)
    bugged.note_committed(1, 3)
    bugged.start_log_segment(w.req(), 1)  # a start repeated after its first reply was lost
    assert bugged.get_edit_log_manifest(1, in_progress_ok=True).logs == ()  # txids 1-3 are gone


# -- the data plane's way in: the open segment's write gate ---------------------------------------


def test_journal_through_gate_arms_the_gate_with_the_writer_epoch_and_folds_its_notices(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=2, upto=3)
    seen: list[tuple[int, int]] = []

    def receive(gate: Any) -> int:
        seen.append((gate.epoch, gate.next_txid))
        assert gate.stage(frame(4, 3, epoch=2, seg=1)) and gate.note(2, 6)
        gate.sync()
        return 1

    assert j.journal_through_gate(receive) == 1
    assert seen == [(2, 4)]
    assert j.committed_txid == 6 and j.peek_state().highest_written_txid == 6  # type: ignore[union-attr]
    got = j.committed_frames(1, 1 << 20)
    assert got is not None and got[1:] == (1, 6)  # the index the gate kept serves tailing reads
    j.new_epoch(NS, 3)  # a newer writer's promise: frames of epoch 2 no longer pass
    assert j.journal_through_gate(lambda gate: gate.epoch) == 0
    j.finalize_log_segment(Writer(3).req(), 1, 6, copy_epoch=2)  # a recovery by the newer writer
    assert j.journal_through_gate(lambda gate: pytest.fail("no segment is open, nothing to pass")) == 0


def test_a_failed_write_through_the_gate_closes_the_open_segment(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=1, upto=3)

    def receive(gate: Any) -> int:
        assert gate.stage(frame(4, 2, epoch=1, seg=1))
        raise StorageError("fdatasync failed: the disk is gone")

    with pytest.raises(StorageError, match="disk is gone"):
        j.journal_through_gate(receive)
    assert j.peek_state().open_segment_txid == 0  # type: ignore[union-attr]
    with pytest.raises(OutOfSyncError, match="no segment is open"):
        j.journal([frame(4, 2, epoch=1, seg=1)])


def test_a_failed_ack_through_the_gate_keeps_the_segment_and_its_end(env: Env) -> None:
    j = env.journal()
    writing(j, epoch=1, upto=3)

    def lost(txid: int) -> None:
        raise ConnectionResetError("the writer hung up")

    def receive(gate: Any) -> int:
        assert gate.stage(frame(4, 2, epoch=1, seg=1))
        gate.sync(lost)
        return 1

    with pytest.raises(ConnectionResetError):
        j.journal_through_gate(receive)
    st = j.peek_state()
    assert st is not None and (st.open_segment_txid, st.highest_written_txid) == (1, 5)
    assert j.journal([frame(6, 1, epoch=1, seg=1)]) == 6  # the next run continues after them
