"""Readers: exactly the committed txids, in order, with fail-over between replicas (design §3)."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

import qjm
from qjm.errors import QJMError
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import eventually, txn_data


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
        x.close()
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
    r.close()


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
        r.close()

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


def test_batches_hold_exactly_what_iteration_yields_and_load_into_numpy_and_arrow(
    icluster: MiniJournalCluster,
) -> None:
    w = qjm.open_writer(icluster.uri, create=True, batch_bytes=2048)
    for i in range(1, 501):
        w.append(txn_data(i) * (i % 7))
        if i % 200 == 0:
            w.roll()
    w.sync()
    with qjm.open_reader(icluster.uri, 37, include_in_progress=True) as r:
        expect = list(r)
    with qjm.open_reader(icluster.uri, 37, include_in_progress=True) as r:
        batches = list(r.batches())
    assert len(batches) > 3  # one per frame, across the rolls
    assert [rec for b in batches for rec in b] == expect == [(i, txn_data(i) * (i % 7)) for i in range(37, 501)]
    assert [b.first_txid for b in batches[1:]] == [b.last_txid + 1 for b in batches[:-1]]
    b = batches[0]
    offs = np.frombuffer(b.offsets, dtype=np.int64)
    assert offs[0] == 0 and offs[-1] == len(b.data) and len(offs) == len(b) + 1
    arr = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(b), [None, pa.py_buffer(b.offsets), pa.py_buffer(b.data)]
    )
    assert arr.to_pylist() == [rec for _, rec in b] and b[-1] == arr[-1].as_py()
    w.close()


def test_close_ends_a_tail_from_another_thread(icluster: MiniJournalCluster) -> None:
    w = qjm.open_writer(icluster.uri, create=True)
    w.append(b"one")
    w.sync()
    r = qjm.open_reader(icluster.uri)
    seen: list[int] = []
    t = threading.Thread(target=lambda: seen.extend(txid for txid, _ in r.tail()))
    t.start()
    eventually(lambda: seen == [1], what="the first record")
    r.close()
    t.join(30)
    assert not t.is_alive()
    with pytest.raises(QJMError):
        next(r.tail())
    w.close()
