"""The stream reader's committed end is pushed by the nodes: no calls per trigger, fail-over on a
dead node, the read-committed view kept from the pushed segment heads."""

from __future__ import annotations

import pickle
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

import qjm
from qjm.client.loggers import CallHooks
from qjm.config import QJMConfig
from qjm.errors import QuorumError
from qjm.spark.compat import ReadAllAvailable
from qjm.spark.feed import CommitFeed
from qjm.spark.journal import JournalClient
from qjm.spark.options import ReadOptions, WriteOptions
from qjm.spark.sink import commit_all, write_task
from qjm.spark.source import QJMBatchReader, QJMStreamReader
from qjm.testing.minicluster import MiniJournalCluster

WAIT = 60.0  # bound on waiting for a push; only reached if the feed is broken


class _CountCalls(CallHooks):
    """Counts the calls the reader's client sends, by operation."""

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()
        self._lock = threading.Lock()

    def before(self, node: str, op: str) -> None:
        with self._lock:
            self.ops[op] += 1

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.ops)


def test_latest_offset_makes_no_calls_per_trigger(uri: str) -> None:
    hooks = _CountCalls()
    reader = QJMStreamReader(ReadOptions.parse({"uri": uri}), hooks)
    w = qjm.open_writer(uri, create=True)
    try:
        w.append_many([b"r%d" % t for t in range(1, 11)])
        w.sync()
        start = reader.initialOffset()
        assert start == {"txid": 1}
        reader.latestOffset(start, ReadAllAvailable())  # starts the feed: lists the segments once
        feed = reader.feed(1)
        assert feed.wait_for(10, WAIT) >= 10
        assert reader.latestOffset(start, ReadAllAvailable()) == {"txid": 11}
        before = hooks.snapshot()
        assert before["get_edit_log_manifest"] > 0  # the hook sees the reader's calls
        for t in range(11, 61):
            w.append(b"r%d" % t)
            w.sync()
            feed.wait_for(t, WAIT)
            assert reader.latestOffset(start, ReadAllAvailable()) == {"txid": t + 1}
            assert reader.reportLatestOffset() == {"txid": t + 1}
        assert hooks.snapshot() == before  # 50 triggers, not one call to a node
        assert feed.records == 60
        clone = pickle.loads(pickle.dumps(reader))  # how Spark ships the reader to its executors
        assert clone.opts == reader.opts and clone._feed is None and clone.hooks is None
    finally:
        w.close()
        reader.stop()
    assert reader._feed is None


def test_feed_keeps_heads_for_the_read_committed_view(uri: str) -> None:
    """A write in progress holds the stream at its begin marker until its commit segment is pushed."""
    w = qjm.open_writer(uri, create=True)
    w.append_many([b"plain-%d" % t for t in range(1, 11)])
    w.close()
    reader = QJMStreamReader(ReadOptions.parse({"uri": uri}))
    try:
        start = {"txid": 1}
        reader.latestOffset(start, ReadAllAvailable())
        feed = reader.feed(1)
        feed.wait_for(10, WAIT)
        assert reader.latestOffset(start, ReadAllAvailable()) == {"txid": 11}
        opts = WriteOptions.parse({"uri": uri})
        rows = pa.record_batch([pa.array([b"t%d" % i for i in range(5)], pa.binary())], names=["record"])
        done = write_task(opts, "job", 0, iter([rows]), may_repeat=False)  # 11 begin, 12-16, 17 end
        feed.wait_for(17, WAIT)
        assert reader.latestOffset(start, ReadAllAvailable()) == {"txid": 11}  # open: the stream waits
        commit_all(opts, [done])  # 18, a segment of its own
        feed.wait_for(18, WAIT)
        assert reader.latestOffset(start, ReadAllAvailable()) == {"txid": 19}
        _, heads = feed.snapshot()
        assert [(h.start, h.end) for h in heads] == [(1, 10), (11, 17), (18, (1 << 63) - 1)]
        assert [h.marker.kind if h.marker else None for h in heads] == [None, "begin", "commit"]
    finally:
        reader.stop()


def synced_writer(c: MiniJournalCluster, n: int) -> qjm.Writer:
    """A writer on a new journal of ``c`` that has committed records a1..a``n`` (txids 1..n)."""
    w = qjm.open_writer(c.uri, create=True)
    w.append_many([b"a%d" % t for t in range(1, n + 1)])
    w.sync()
    return w


def test_feed_fails_over_when_its_node_dies(tmp_path: Path) -> None:
    with MiniJournalCluster(3, str(tmp_path)) as c:
        w = synced_writer(c, 100)
        jc = JournalClient(c.uri)
        feed = CommitFeed(c.uri, jc.qjm.config, 1, jc.heads())
        try:
            assert feed.wait_for(100, WAIT) == 100
            followed = feed.current_node
            c.kill(c.addresses.index(followed))
            w.append_many([b"b%d" % t for t in range(101, 201)])
            w.sync()
            assert feed.wait_for(200, WAIT) == 200
            assert feed.failovers >= 1
            assert feed.current_node != followed
            assert feed.records == 200  # each txid counted once: no gap, no duplicate
        finally:
            feed.close()
            jc.close()
            w.close()


def test_feed_fails_once_no_majority_answered_for_the_timeout(tmp_path: Path) -> None:
    with MiniJournalCluster(3, str(tmp_path)) as c:
        w = synced_writer(c, 10)
        config = ReadOptions.parse({"uri": c.uri, "majorityLossTimeout": "1"}).config
        feed = CommitFeed(c.uri, config, 1, majority_loss_timeout=1.0)
        try:
            assert feed.wait_for(10, WAIT) == 10
            c.pause(1)
            c.pause(2)
            paused_at = time.monotonic()
            with pytest.raises(QuorumError, match="majorityLossTimeout") as ei:
                feed.wait_for(11, WAIT)  # never pushed: only the paused majority could commit it
            assert time.monotonic() - paused_at < 1.0 + 10.0  # the timeout, then a probe's period
            assert c.name(0) in str(ei.value)  # the node that still answers is named
            with pytest.raises(QuorumError):
                feed.end()  # every later trigger fails the same way
        finally:
            feed.close()
            c.resume(1)
            c.resume(2)
            w.abort()


def test_majority_loss_timeout_bounds_a_batch_read_of_a_paused_majority(tmp_path: Path) -> None:
    with MiniJournalCluster(3, str(tmp_path)) as c:
        synced_writer(c, 10).close()
        reader = QJMBatchReader(ReadOptions.parse({"uri": c.uri, "majorityLossTimeout": "2"}))
        assert [(p.start, p.end) for p in reader.partitions()] == [(1, 10)]
        c.pause(1)
        c.pause(2)
        try:
            paused_at = time.monotonic()
            with pytest.raises(QuorumError, match="majorityLossTimeout: 2s"):
                reader.partitions()
            assert time.monotonic() - paused_at < 2.0 + 10.0
        finally:
            c.resume(1)
            c.resume(2)


def test_without_the_timeout_a_feed_waits_through_a_killed_majority(tmp_path: Path) -> None:
    with MiniJournalCluster(3, str(tmp_path)) as c:
        w = qjm.open_writer(c.uri, create=True, config=QJMConfig().with_timeouts(write_txns=3))
        w.append_many([b"a%d" % t for t in range(1, 11)])
        w.sync()
        feed = CommitFeed(c.uri, QJMConfig().with_timeouts(reconnect=0.2), 1)
        try:
            assert feed.wait_for(10, WAIT) == 10
            c.kill(1)
            c.kill(2)
            w.append(b"no majority to take it")
            with pytest.raises(qjm.QJMError):  # 3 s without a majority: the writer gives up ...
                w.sync()
            assert feed.end() == 10  # ... the feed does not, and made nothing up
            w.abort()
            c.start(1)
            c.start(2)
            w2 = qjm.open_writer(c.uri)
            n = w2.append_many([b"b%d" % t for t in range(5)])
            w2.close()
            assert feed.wait_for(n, WAIT) == n
        finally:
            feed.close()
