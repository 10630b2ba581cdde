"""A node a full queue behind: the writer waits for it while it acknowledges, drops it once it stalls.

Hadoop drops a node the moment its unacknowledged bytes pass ``queued_edits_limit_bytes``; a writer
faster than its slowest node then runs on two replicas until the next segment. qjm holds the writer
back instead, for as long as the node keeps acknowledging; ``lag_wait`` bounds the wait for a node
that acknowledges nothing (``0`` is Hadoop's rule). A paused node (SIGSTOP) acknowledges nothing.
"""

from __future__ import annotations

import threading
import time

import pytest

import qjm
from qjm.client.writer import Writer
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import SETTLE_TIMEOUT, eventually, inspect_journal, read_all

LIMIT = 256 * 1024
BATCH = 32 * 1024
RECORDS = 2000  # ~2 MiB: eight times the limit


def rec(i: int) -> bytes:
    return b"lag-%06d-" % i + bytes(1000)


def write_in_thread(w: Writer, first: int, last: int) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            w.append_many(rec(i) for i in range(first, last + 1))
            assert w.sync() == last
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def open_lagging(cluster: MiniJournalCluster, lag_wait: float) -> Writer:
    w = qjm.open_writer(
        cluster.uri,
        create=True,
        queued_edits_limit_bytes=LIMIT,
        batch_bytes=BATCH,
        max_inflight_batches=4,  # healthy nodes never hold LIMIT unacknowledged, even with lag_wait=0
        lag_wait=lag_wait,
        close_grace=SETTLE_TIMEOUT,  # node 2's files are read after close
    )
    w.append_many(rec(i) for i in range(1, 11))
    w.sync()
    return w


def test_a_node_that_is_a_full_queue_behind_is_waited_for_and_stays_in_sync(cluster: MiniJournalCluster) -> None:
    w = open_lagging(cluster, lag_wait=60.0)
    slow = w.qjm.loggers.loggers[2]
    cluster.pause(2)
    t, errors = write_in_thread(w, 11, 10 + RECORDS)
    # The writer fills node 2's queue, then has to wait: it cannot send 2 MiB with 256 KiB allowed
    # unacknowledged and node 2 acknowledging nothing.
    eventually(lambda: slow.unacked_bytes() > LIMIT - BATCH, what="node 2 is a full queue behind")
    assert t.is_alive() and slow.unacked_bytes() <= LIMIT
    cluster.resume(2)
    t.join(60)
    assert not t.is_alive() and errors == []
    assert not any(lg.out_of_sync for lg in w.qjm.loggers.loggers)
    w.close()
    want = [(i, rec(i)) for i in range(1, 11 + RECORDS)]
    assert read_all(cluster.uri) == want
    # node 2 holds the whole segment: it was never dropped
    assert inspect_journal(cluster.journal_dir(2)).plain()[f"edits_{1:019d}-{10 + RECORDS:019d}"] == 10 + RECORDS


@pytest.mark.parametrize("lag_wait", [0.0, 0.2])
def test_a_node_that_acknowledges_nothing_is_dropped_after_lag_wait(
    cluster: MiniJournalCluster, lag_wait: float
) -> None:
    w = open_lagging(cluster, lag_wait=lag_wait)
    cluster.pause(2)
    t0 = time.monotonic()
    t, errors = write_in_thread(w, 11, 10 + RECORDS)
    t.join(60)
    took = time.monotonic() - t0
    assert not t.is_alive() and errors == []
    assert w.committed_txid == 10 + RECORDS
    assert [lg.out_of_sync for lg in w.qjm.loggers.loggers] == [False, False, True]
    assert took >= lag_wait  # it waited for the stalled node first (with 0: not at all)
    cluster.resume(2)
    w.roll()  # the node rejoins at the next segment
    w.append(rec(11 + RECORDS))
    w.close()
    assert read_all(cluster.uri) == [(i, rec(i)) for i in range(1, 12 + RECORDS)]
    nxt = 11 + RECORDS
    assert inspect_journal(cluster.journal_dir(2)).plain()[f"edits_{nxt:019d}-{nxt:019d}"] == nxt


@pytest.mark.parametrize("lag_wait", [0.0, 0.2])
def test_a_node_stuck_starting_a_segment_is_dropped_not_queued_for(
    cluster: MiniJournalCluster, lag_wait: float
) -> None:
    """Batches for a node that has not answered start_log_segment wait in a backlog; one that
    stays stuck there is dropped at the queue limit instead of the writer keeping every batch."""
    w = open_lagging(cluster, lag_wait=lag_wait)
    slow = w.qjm.loggers.loggers[2]
    cluster.pause(2)
    first = w.roll()  # finalize and start reach a quorum without node 2; its calls wait behind it
    old_link = slow.unacked_bytes()  # what the paused node had not acknowledged of the last segment
    t, errors = write_in_thread(w, first, first + RECORDS - 1)
    t.join(60)
    assert not t.is_alive() and errors == []
    assert [lg.out_of_sync for lg in w.qjm.loggers.loggers] == [False, False, True]
    assert slow.unacked_bytes() <= old_link  # nothing of the new segment kept for it
    cluster.resume(2)
    w.roll()  # node 2 answers its old calls first, stays out of that segment, rejoins at this one
    w.append(rec(first + RECORDS))
    w.close()
    assert read_all(cluster.uri) == [(i, rec(i)) for i in range(1, first + RECORDS + 1)]
    plain = inspect_journal(cluster.journal_dir(2)).plain()
    nxt = first + RECORDS
    assert plain[f"edits_{nxt:019d}-{nxt:019d}"] == nxt
    assert not any(name.startswith(f"edits_{first:019d}-") for name in plain)
