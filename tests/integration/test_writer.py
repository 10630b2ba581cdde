"""The writer users hold: batching by size and by time, pipelining, roll, close, misuse."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

import qjm
from qjm.errors import QJMError
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import SETTLE_TIMEOUT, inspect_journal, txn_data, wait_for_every_node


def test_time_closes_a_batch_without_sync(icluster: MiniJournalCluster) -> None:
    """A record appended and never synced still reaches a quorum once the batch delay passes."""
    w = qjm.open_writer(icluster.uri, create=True, batch_delay=0.005)
    w.append(b"lonely")
    r = qjm.open_reader(icluster.uri)
    stop = threading.Event()
    got = next(iter(r.tail(stop=stop)))
    stop.set()
    assert got == (1, b"lonely")
    r.close()
    w.close()


def test_size_closes_batches_and_they_pipeline(icluster: MiniJournalCluster) -> None:
    """batch_bytes splits the stream into several frames; all are committed in order by one sync."""
    w = qjm.open_writer(icluster.uri, create=True, batch_bytes=4096, batch_delay=10, close_grace=SETTLE_TIMEOUT)
    last = w.append_many(txn_data(i) + bytes(200) for i in range(1, 1001))
    assert last == 1000
    assert w.sync() == 1000 and w.committed_txid == 1000
    w.close()
    name = f"edits_{1:019d}-{1000:019d}"
    from qjm._native import framing

    with open(os.path.join(icluster.journal_dir(0), name), "rb") as f:
        data = f.read()
    frames = framing.iter_frames(data, 1)
    assert len(frames) > 10  # many batches, not one
    assert all(h.payload_len <= 4096 + 300 for h, _ in frames)


def test_append_many_keeps_the_records_before_one_too_large(icluster: MiniJournalCluster) -> None:
    """A record that cannot fit in any frame is refused; the ones before it keep their txids and
    are committed, and the writer carries on after it (the batch-by-size loop runs natively)."""
    from qjm.protocol.frame import MAX_PAYLOAD
    from qjm.testing.util import read_all

    w = qjm.open_writer(icluster.uri, create=True, batch_bytes=4096)
    records = iter([txn_data(i) for i in range(1, 301)] + [bytes(MAX_PAYLOAD), b"never taken"])
    with pytest.raises(ValueError, match="does not fit"):
        w.append_many(records)
    assert w.last_txid == 300
    assert list(records) == [b"never taken"]
    assert w.append(b"next") == 301
    assert w.sync() == 301
    w.close()
    assert read_all(icluster.uri) == [(i, txn_data(i)) for i in range(1, 301)] + [(301, b"next")]


def test_append_many_packed_records_numpy_rows_and_offsets(icluster: MiniJournalCluster) -> None:
    """The two packed forms: the rows of a 2-D uint8 array, and one buffer with offsets. Both close
    batches at batch_bytes like any other append and come back as the same records."""
    import numpy as np

    from qjm._native import framing
    from qjm.testing.util import read_all

    w = qjm.open_writer(icluster.uri, create=True, batch_bytes=4096, close_grace=SETTLE_TIMEOUT)
    rows = np.frombuffer(b"".join(txn_data(i)[:24].ljust(24, b"-") for i in range(1, 1001)), dtype=np.uint8)
    rows = rows.reshape(1000, 24)
    assert w.append_many(rows) == 1000
    recs = [txn_data(i) * (i % 5) for i in range(1001, 3001)]  # sizes 0..~100, empty ones too
    offsets = np.cumsum([0] + [len(r) for r in recs], dtype=np.int64)
    assert w.append_many(b"".join(recs), offsets) == 3000
    assert w.sync() == 3000
    w.close()
    got = read_all(icluster.uri)
    assert got == [(i, bytes(rows[i - 1])) for i in range(1, 1001)] + [(i, recs[i - 1001]) for i in range(1001, 3001)]
    with open(os.path.join(icluster.journal_dir(0), f"edits_{1:019d}-{3000:019d}"), "rb") as f:
        frames = framing.iter_frames(f.read(), 1)
    assert len(frames) > 20 and all(h.payload_len < 4096 + 200 for h, _ in frames)


def test_roll_and_close_finalize_segments(icluster: MiniJournalCluster) -> None:
    with qjm.open_writer(icluster.uri, create=True, close_grace=SETTLE_TIMEOUT) as w:  # every node is read after
        w.append(b"a")
        assert w.roll() == 2
        w.append(b"b")
        w.roll()
        w.roll()  # nothing appended since: no empty segment is finalized
    for i in range(3):
        v = inspect_journal(icluster.journal_dir(i)).plain()
        assert f"edits_{1:019d}-{1:019d}" in v and f"edits_{2:019d}-{2:019d}" in v
    with pytest.raises(QJMError):
        w.append(b"after close")


def test_writer_continues_txids_after_failover(icluster: MiniJournalCluster) -> None:
    a = qjm.open_writer(icluster.uri, create=True)
    a.append_many([b"1", b"2", b"3"])
    a.sync()
    a.abort()  # crashes with its segment open
    b = qjm.open_writer(icluster.uri)
    assert b.last_txid == 3 and b.append(b"4") == 4
    b.close()


def test_a_stale_data_address_is_asked_again(icluster: MiniJournalCluster) -> None:
    """The data address learnt while fencing is reused for every link; refused there (a node
    restarted on another data port), the writer asks the node again and carries on."""
    from qjm.client.channel import RemoteLogger

    w = qjm.open_writer(icluster.uri, create=True)
    w.append(b"r1")
    assert w.sync() == 1
    loggers = [lg for lg in w.qjm.loggers.loggers if isinstance(lg, RemoteLogger)]
    learnt = {lg.name: lg._data_address for lg in loggers}
    assert all(learnt.values())
    refused = _closed_port_address()
    for lg in loggers:
        lg._data_address = refused
    assert w.roll() == 2  # new links for the new segment
    for i in range(2, 21):
        w.append(b"r%d" % i)
    assert w.sync() == 20
    for lg in loggers:  # the start (and its link) of a node outside the majority may still run:
        lg._io.submit("drain()", lambda: None).result(timeout=30)  # its calls run in order
    assert {lg.name: lg._data_address for lg in loggers} == learnt
    w.close()
    r = qjm.open_reader(icluster.uri)
    assert [d for _, d in r] == [b"r%d" % i for i in range(1, 21)]
    r.close()


def _closed_port_address() -> str:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there now: a connect is refused
    return f"127.0.0.1:{port}"


def test_the_separate_prepare_round_recovers_the_same_end(icluster: MiniJournalCluster) -> None:
    """new_epoch carries phase 1, so recovery normally skips prepare_recovery; the separate round
    (kept for nodes that do not send phase 1) reaches the same decision on real nodes."""
    from qjm.client.manager import QuorumJournalManager, prepared_from_new_epoch

    w = qjm.open_writer(icluster.uri, create=True)
    for i in range(1, 8):
        w.append(b"r%d" % i)
    assert w.sync() == 7
    wait_for_every_node(w)  # a sync returns at a majority; this test needs the copy on all three
    w.abort()  # leaves segment 1 in progress on every node
    m = QuorumJournalManager(icluster.uri)
    m.create_new_unique_epoch()
    folded = prepared_from_new_epoch(m._new_epoch_replies, 1)
    assert folded is not None and all(r.segment_state is not None for r in folded.values())
    assert m.recover_unclosed_segment(1) == 7  # prepare_recovery asked again
    m.close()
    r = qjm.open_reader(icluster.uri)
    assert [d for _, d in r] == [b"r%d" % i for i in range(1, 8)]
    r.close()


def test_cluster_up_serves_until_terminated(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = subprocess.Popen(
        [sys.executable, "-m", "qjm", "cluster", "up", "--dir", str(tmp_path / "c"), "--journal", "j"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        uri = ""
        for line in p.stdout:
            if line.startswith("URI: "):
                uri = line.split(" ", 1)[1].strip()
                break
        assert uri.startswith("qjournal://") and uri.endswith("/j")
        with qjm.open_writer(uri, create=True) as w:
            w.append(b"hello")
        r = qjm.open_reader(uri)
        assert list(r) == [(1, b"hello")]
        r.close()
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
