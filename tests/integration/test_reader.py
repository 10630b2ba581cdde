"""Readers: exactly the committed txids, in order, with fail-over between replicas (design §3)."""

from __future__ import annotations

import threading

import qjm
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import txn_data


def test_reader_returns_exactly_committed_in_order(icluster: MiniJournalCluster) -> None:
    w = qjm.open_writer(icluster.uri, create=True)
    for i in range(1, 251):
        w.append(txn_data(i))
        if i % 100 == 0:
            w.roll()
    w.sync()
    r = qjm.open_reader(icluster.uri)  # finalized segments only: 1-100, 101-200
    assert list(r) == [(i, txn_data(i)) for i in range(1, 201)]
    r2 = qjm.open_reader(icluster.uri, 150, include_in_progress=True)  # and the committed part of 201-
    assert list(r2) == [(i, txn_data(i)) for i in range(150, 251)]
    for x in (r, r2):
        x.qjm.close()
    w.close()


def test_reader_fails_over_when_its_node_dies_mid_read(cluster: MiniJournalCluster) -> None:
    """A large finalized segment: kill the node being streamed from after the first records."""
    w = qjm.open_writer(cluster.uri, create=True)
    n = 40_000
    for i in range(1, n + 1):
        w.append(txn_data(i) + bytes(500))
    w.close()
    r = qjm.open_reader(cluster.uri)
    it = iter(r)
    first = [next(it) for _ in range(10)]
    cluster.kill(cluster.addresses.index(r.current_node))
    rest = list(it)
    got = first + rest
    assert r.failovers == 1
    assert [t for t, _ in got] == list(range(1, n + 1))
    assert all(rec == txn_data(t) + bytes(500) for t, rec in got)
    r.qjm.close()


def test_tail_follows_commits(icluster: MiniJournalCluster) -> None:
    """tail() yields each committed record once, across a roll, until stopped."""
    w = qjm.open_writer(icluster.uri, create=True)
    r = qjm.open_reader(icluster.uri)
    stop = threading.Event()
    seen: list[int] = []
    done = threading.Event()

    def follow() -> None:
        for txid, rec in r.tail(stop=stop):
            assert rec == txn_data(txid)
            seen.append(txid)
            if txid == 300:
                done.set()
        r.qjm.close()

    t = threading.Thread(target=follow)
    t.start()
    for i in range(1, 301):
        w.append(txn_data(i))
        if i % 50 == 0:
            w.sync()
        if i == 150:
            w.roll()
    w.sync()
    assert done.wait(60)
    stop.set()
    t.join(60)
    w.close()
    assert seen == list(range(1, 301))
