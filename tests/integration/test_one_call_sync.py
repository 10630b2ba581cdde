"""A writer that syncs each batch sends it, waits for its quorum and announces the commit in one
native call (``Writer._sync_one_batch``, ``Lane.commit``) while every node is in sync, and
the usual way otherwise; either way the same records are committed, followers learn of them, and
a lost quorum fails within the write timeout."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import CollectorRegistry

import qjm
from qjm.client.metrics import WriterCollector
from qjm.errors import QuorumError
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import SETTLE_TIMEOUT, inspect_journal, txn_data

WAIT = 30.0


def _one_calls(w: qjm.Writer) -> int:
    return w.stats().one_call_syncs


def _settle(w: qjm.Writer, txid: int) -> None:
    """Wait until every node has acknowledged ``txid``: each has started the segment and has its
    link (a node still starting takes batches the usual way, and so does the batch after it, which
    carries the commit notice that node missed). Then sync one more record, that batch."""
    deadline = time.monotonic() + WAIT
    while min(n.acked_txid for n in w.stats().nodes) < txid:
        assert time.monotonic() < deadline, f"the nodes never all acknowledged {txid}"
        time.sleep(0.01)  # polling the writer's own figures; nothing to be woken by
    w.append(txn_data(txid + 1))
    assert w.sync() == txid + 1


def test_each_sync_is_one_call_and_followers_learn_the_commit_from_it(cluster: MiniJournalCluster) -> None:
    # batch_delay: no batch timer closing a batch between an append and its sync
    w = qjm.open_writer(cluster.uri, create=True, close_grace=SETTLE_TIMEOUT, batch_delay=60)
    w.append(txn_data(1))
    w.sync()
    _settle(w, 1)
    before = _one_calls(w)
    timed = w.stats().commit_seconds.count
    for i in range(3, 51):
        w.append(txn_data(i))
        assert w.sync() == i
    assert _one_calls(w) == before + 48
    commit_seconds = w.stats().commit_seconds
    assert commit_seconds.count == timed + 48  # each timed once, by its lane
    assert 0 < commit_seconds.total < 48 * WAIT
    registry = CollectorRegistry()
    registry.register(WriterCollector(w))
    assert registry.get_sample_value("qjm_writer_one_call_syncs_total", {"journal": w.qjm.journal_id}) == before + 48
    # The commit notice went out with the last batch's quorum: a follower gets record 50 with no
    # batch after it to carry the news.
    r = qjm.open_reader(cluster.uri)
    stop = threading.Event()
    got = []
    timer = threading.Timer(WAIT, stop.set)
    timer.start()
    for txid, data in r.tail(stop=stop):
        got.append((txid, data))
        if txid == 50:
            break
    stop.set()
    timer.cancel()
    r.close()
    assert got == [(i, txn_data(i)) for i in range(1, 51)]
    w.close()
    for i in range(3):  # every node took every batch (and finalized the segment at close)
        assert inspect_journal(cluster.journal_dir(i)).plain() == {f"edits_{1:019d}-{50:019d}": 50}


def test_a_node_out_of_sync_takes_the_usual_way_until_its_next_segment(cluster: MiniJournalCluster) -> None:
    w = qjm.open_writer(cluster.uri, create=True, close_grace=SETTLE_TIMEOUT, batch_delay=60)
    w.append(txn_data(1))
    w.sync()
    _settle(w, 1)
    for i in range(3, 11):
        w.append(txn_data(i))
        w.sync()
    assert _one_calls(w) >= 8
    cluster.kill(2)
    deadline = time.monotonic() + WAIT
    i = 10
    while not w.stats().nodes[2].out_of_sync:  # its link fails at a batch or at the hang-up
        assert time.monotonic() < deadline, "the writer never saw node 2 go"
        i += 1
        w.append(txn_data(i))
        assert w.sync() == i
    before = _one_calls(w)
    for _ in range(10):
        i += 1
        w.append(txn_data(i))
        assert w.sync() == i  # two nodes are a quorum
    assert _one_calls(w) == before  # node 2 has something to decide (refuse): the usual way
    cluster.restart(2)
    w.roll()  # node 2 is back at the next segment
    deadline = time.monotonic() + WAIT
    while w.stats().nodes[2].out_of_sync:
        assert time.monotonic() < deadline, "node 2 never came back"
        w.roll()
    i += 1
    w.append(txn_data(i))
    w.sync()
    _settle(w, i)
    i += 1
    before = _one_calls(w)
    for _ in range(5):
        i += 1
        w.append(txn_data(i))
        assert w.sync() == i
    assert _one_calls(w) == before + 5
    # Every batch timed once, whichever way it went: by a lane (those of lanes that ended, as the
    # node came and went and the segments rolled, folded into the writer's figures) or the usual way.
    st = w.stats()
    assert st.commit_seconds.count == st.batches_sent
    w.close()


def test_a_lost_quorum_fails_the_sync_within_the_write_timeout(cluster: MiniJournalCluster) -> None:
    """Two nodes paused: no link fails, no ack comes; the one call waits out the timeout and the
    batch's own wait then has no time left, so the sync fails after one timeout, not two."""
    timeout = 1.0
    w = qjm.open_writer(cluster.uri, create=True, write_txns_timeout=timeout, batch_delay=60)
    w.append(txn_data(1))
    w.sync()
    _settle(w, 1)
    before = _one_calls(w)
    cluster.pause(1)
    cluster.pause(2)
    try:
        w.append(txn_data(3))
        t0 = time.monotonic()
        with pytest.raises(QuorumError, match="timed out"):
            w.sync()
        took = time.monotonic() - t0
        assert timeout <= took < 1.8 * timeout, took
        assert _one_calls(w) == before  # it did not reach its quorum
    finally:
        cluster.resume(1)
        cluster.resume(2)
    w.abort()


def test_each_nodes_write_latency_counts_every_batch_it_acknowledged(cluster: MiniJournalCluster) -> None:
    """Over the native engine each link times its own acks (``Fanout.take_latencies``), and a
    link's last counts are kept when a roll replaces it; elsewhere the writer times them."""
    w = qjm.open_writer(cluster.uri, create=True, close_grace=SETTLE_TIMEOUT, batch_delay=60)
    for i in range(1, 41):  # one batch per sync, a new segment (so new links) half-way
        if i == 21:
            w.roll()
        w.append(txn_data(i))
        assert w.sync() == i
    _settle(w, 40)
    for n in w.stats().nodes:
        # Every batch through 40 acknowledged by every node; the 41st by a quorum at least.
        assert 40 <= n.write_seconds.count <= 41, n
        assert 0 < n.write_seconds.total < WAIT * n.write_seconds.count
    w.close()
