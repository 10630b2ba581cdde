"""Fencing on both planes and unique epochs (design §2.3-2.5, invariants 3 and 4), on real nodes."""

from __future__ import annotations

import threading

import pytest

import qjm
from qjm.errors import FencedError, QJMError, QuorumError
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import eventually, inspect_journal, read_all


def test_new_writer_fences_old_on_data_plane(cluster: MiniJournalCluster) -> None:
    """A's next batch after B's new_epoch fails with FencedError, and nothing A sent after it is ever read."""
    a = qjm.open_writer(cluster.uri, create=True)
    for i in range(10):
        a.append(b"a%d" % i)
    a.sync()
    b = qjm.open_writer(cluster.uri)
    assert b.epoch > a.epoch
    a.append(b"zombie")
    with pytest.raises(FencedError) as ei:
        a.sync()
    assert ei.value.request_epoch == a.epoch and ei.value.promised_epoch == b.epoch
    with pytest.raises(FencedError):  # the writer stays failed
        a.append(b"zombie2")
    b.append(b"b0")
    b.close()
    a.abort()
    records = [r for _, r in read_all(cluster.uri)]
    assert records == [b"a%d" % i for i in range(10)] + [b"b0"]


def test_a_node_that_fenced_a_batch_refuses_the_next_ones_as_fenced(cluster: MiniJournalCluster) -> None:
    """After a node refused a batch as fenced, the writer's next batches to it fail as fenced too,
    not as "out of sync": a writer whose earlier batch reached a majority before the fencing must
    still learn that a newer writer holds the journal (a stalled Spark attempt reported a lost
    quorum instead)."""
    from qjm._native import framing

    a = qjm.open_writer(cluster.uri, create=True)
    a.append(b"a")
    a.sync()
    b = qjm.open_writer(cluster.uri)
    m = a.qjm

    def batch(txid: int) -> QuorumError:
        frame = framing.encode_frame([b"z%d" % txid], epoch=m.epoch, segment_txid=a.segment_txid, first_txid=txid)
        with pytest.raises(QuorumError) as ei:
            m.send_batch(frame, txid, txid).wait_for_write_quorum(10, f"journal({txid})")
        return ei.value

    first = batch(2)  # the nodes refuse it on the data plane
    assert first.causes and all(isinstance(c, FencedError) for c in first.causes.values())
    for txid in (3, 4):  # refused by the writer's own bookkeeping now, and still as fenced
        later = batch(txid)
        assert len(later.causes) >= 2
        for c in later.causes.values():
            assert isinstance(c, FencedError), c
            assert (c.request_epoch, c.promised_epoch) == (a.epoch, b.epoch)
    a.abort()
    b.close()
    assert [r for _, r in read_all(cluster.uri)] == [b"a"]


def test_new_writer_fences_old_on_control_plane(cluster: MiniJournalCluster) -> None:
    """A's roll (finalize + start) after B's new_epoch is refused by the nodes with FencedError."""
    a = qjm.open_writer(cluster.uri, create=True)
    a.append(b"x")
    a.sync()
    b = qjm.open_writer(cluster.uri)
    # B's new_epoch returned at a majority: let the third node promise too, or A's start below
    # could reach it first and leave a segment there
    eventually(lambda: all(inspect_journal(cluster.journal_dir(i)).promised_epoch == b.epoch for i in range(3)))
    with pytest.raises(FencedError):
        a.roll()
    with pytest.raises(QuorumError) as ei:
        a.qjm.loggers.call(lambda lg: lg.start_log_segment(100)).wait_for_write_quorum(10, "start")
    assert ei.value.fenced and all(isinstance(e, FencedError) for e in ei.value.causes.values())
    a.abort()
    b.close()
    for i in range(3):
        v = inspect_journal(cluster.journal_dir(i))
        assert v.promised_epoch == b.epoch
        assert not any("0000000000000000100" in name for name in v.segments)


def test_epochs_are_unique_under_racing_writers(icluster: MiniJournalCluster) -> None:
    """Several writers race open_writer: no two win the same epoch, and each winner outranks the last."""
    qjm.open_writer(icluster.uri, create=True).close()
    newest = 1
    for _round in range(3):
        won, lost = race_writers(icluster.uri, 5)
        assert all(e > newest for e in won), "a winner of this round does not outrank every earlier one"
        newest = max(won, default=newest)
        assert won, f"nobody won: {lost}"
        assert len(won) == len(set(won)), f"two writers share an epoch: {won}"
        assert len(won) + len(lost) == 5
        promised = [inspect_journal(icluster.journal_dir(i)).promised_epoch for i in range(3)]
        assert sorted(promised)[1] >= max(won)  # a majority promised at least the newest winner


def race_writers(uri: str, n: int) -> tuple[list[int], list[BaseException]]:
    """Start ``n`` writers at once; returns the epochs won and the errors of those that lost."""
    barrier = threading.Barrier(n)
    won: list[int] = []
    lost: list[BaseException] = []
    lock = threading.Lock()

    def race() -> None:
        barrier.wait()
        try:
            w = qjm.open_writer(uri, new_epoch_timeout=10, get_journal_state_timeout=10)
        except QJMError as e:
            with lock:
                lost.append(e)
            return
        with lock:
            won.append(w.epoch)
        w.abort()

    threads = [threading.Thread(target=race) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost
