"""Streaming reads: a query tailing a journal while its writer fails over and a node dies."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import qjm
from qjm.config import QJMConfig
from qjm.errors import FencedError
from qjm.spark.journal import Chunk, JournalClient
from qjm.spark.options import WriteOptions
from qjm.spark.sink import InjectedFailure, commit_all, write_task
from qjm.testing.minicluster import MiniJournalCluster

pytestmark = pytest.mark.spark


def _rec(txid: int) -> bytes:
    return b"rec-%08d" % txid


class _Journal:
    """Appends records whose content names their txid, so delivery can be checked record by record."""

    def __init__(self) -> None:
        self.n = 0

    def put(self, w: qjm.Writer, k: int) -> None:
        for _ in range(k):
            self.n += 1
            assert w.append(_rec(self.n)) == self.n
        w.sync()


def _drain(q: Any, done: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Run triggers until ``done()``. The nodes push a commit to the stream a moment after the
    writer's ``sync()`` returns, so one trigger right after it may still see the older end."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"the query did not deliver {what} in {timeout}s"
        q.processAllAvailable()


def _tail(spark: Any, uri: str, checkpoint: Path, seen: list[tuple[int, list[tuple[int, int, bytes]]]]) -> Any:
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        rows = [(r.txid, r.epoch, bytes(r.record)) for r in df.collect()]
        with lock:
            seen.append((batch_id, rows))

    return (
        spark.readStream.format("qjm")
        .option("uri", uri)
        .option("maxRecordsPerTrigger", "250")
        .option("qjm.reconnect_timeout", "0.2")  # a dead node is given up on quickly
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def test_stream_survives_writer_failover_and_node_loss(spark: Any, tmp_path: Path) -> None:
    seen: list[tuple[int, list[tuple[int, int, bytes]]]] = []
    j = _Journal()
    with MiniJournalCluster(3, str(tmp_path / "jn")) as c:
        w1 = qjm.open_writer(c.uri, create=True)
        j.put(w1, 400)
        w1.roll()
        j.put(w1, 300)  # committed, in w1's still open segment
        q = _tail(spark, c.uri, tmp_path / "ck", seen)

        def upto(n: int) -> None:
            _drain(q, lambda: sum(len(rows) for _, rows in list(seen)) >= n, f"{n} records")

        try:
            upto(j.n)  # the backlog, 250 records a batch, the last ones from w1's open segment
            j.put(w1, 100)
            # a second writer fences the first and recovers its open segment, under the running query
            w2 = qjm.open_writer(c.uri)
            with pytest.raises(FencedError):
                w1.append(b"zombie write: must never be read")
                w1.sync()
            w1.abort()
            j.put(w2, 300)
            upto(j.n)
            # SIGKILL a node: the one the driver's feed follows first (node 0), so the committed end
            # comes from another; partitions read the in-progress segment from the two others
            c.kill(0)
            j.put(w2, 300)
            upto(j.n)
            w2.roll()
            j.put(w2, 200)
            w2.close()
            upto(j.n)  # finalized segments, from whichever live replica lists them
            assert q.exception() is None
        finally:
            q.stop()
    delivered = [row for _, rows in sorted(seen) for row in rows]
    assert [t for t, _, _ in delivered] == list(range(1, j.n + 1))  # every committed record once, in order
    assert all(rec == _rec(t) for t, _, rec in delivered)
    assert {e for _, e, _ in delivered} == {w1.epoch, w2.epoch}
    assert max(len(rows) for _, rows in seen) <= 250  # maxRecordsPerTrigger
    assert len(seen) >= j.n // 250


def test_stream_restarts_from_its_checkpoint(spark: Any, uri: str, tmp_path: Path) -> None:
    """Offsets are txids: a restarted query goes on at the next txid, with availableNow too."""
    w = qjm.open_writer(uri, create=True)
    w.append_many(_rec(t) for t in range(1, 101))
    w.close()

    def run() -> list[int]:
        got: list[int] = []
        q = (
            spark.readStream.format("qjm")
            .option("uri", uri)
            .option("startTxid", "11")
            .load()
            .writeStream.foreachBatch(lambda df, _: got.extend(r.txid for r in df.orderBy("txid").collect()))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120), "query did not finish"
        assert q.exception() is None
        return got

    assert run() == list(range(11, 101))
    w = qjm.open_writer(uri)
    w.append_many(_rec(t) for t in range(101, 151))
    w.sync()  # left open: the committed part of the in-progress segment is streamed too
    try:
        assert run() == list(range(101, 151))
    finally:
        w.close()


def test_partition_reads_fail_over_between_replicas(tmp_path: Path) -> None:
    """The replica a partition prefers dies after the listing: the read resumes on another one."""
    with MiniJournalCluster(3, str(tmp_path / "jn")) as c:
        w = qjm.open_writer(c.uri, create=True)
        w.append_many(_rec(t) for t in range(1, 3001))
        w.close()
        jc = JournalClient(c.uri, QJMConfig().with_timeouts(reconnect=0.2))
        try:
            (seg,) = jc.finalized(1)
            c.kill(c.addresses.index(seg.nodes[1]))
            got = [(t, r) for ch in jc._read_finalized(seg, 5, 2990, prefer=1) for t, r in _numbered(ch)]
            assert got == [(t, _rec(t)) for t in range(5, 2991)]
            assert jc.failovers == 1
        finally:
            jc.close()


def _numbered(ch: Chunk) -> list[tuple[int, bytes]]:
    return list(zip(range(ch.first, ch.last + 1), ch.records, strict=True))


def test_stream_waits_for_commits_and_skips_aborted_writes(spark: Any, uri: str, tmp_path: Path) -> None:
    """Read-committed streams: an open write holds the stream at its begin marker (Kafka's last
    stable offset) until the driver commits it; an abandoned one is skipped once the journal goes on."""
    w = qjm.open_writer(uri, create=True)
    w.append_many(_rec(t) for t in range(1, 101))
    w.close()
    got: list[int] = []
    q = (
        spark.readStream.format("qjm")
        .option("uri", uri)
        .option("maxRecordsPerTrigger", "60")
        .load()
        .writeStream.foreachBatch(lambda df, _: got.extend(r.txid for r in df.orderBy("txid").collect()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        _drain(q, lambda: len(got) >= 100, "the first 100 records")
        assert got == list(range(1, 101))
        assert json.loads(q.lastProgress["sources"][0]["latestOffset"]) == {"txid": 101}
        opts = WriteOptions.parse({"uri": uri})
        rows = pa.record_batch([pa.array([b"t%d" % i for i in range(10)], pa.binary())], names=["record"])
        done = write_task(opts, "job", 0, iter([rows]), may_repeat=False)  # 101 begin, 102-111, 112 end
        q.processAllAvailable()
        assert got == list(range(1, 101))  # written, not committed: the stream waits at txid 101
        commit_all(opts, [done])  # 113, in a segment of its own
        _drain(q, lambda: len(got) >= 110, "the committed write")
        assert got == list(range(1, 101)) + list(range(102, 112))
        with pytest.raises(InjectedFailure):  # 114 begin, 115-119: never committed
            bad = WriteOptions.parse({"uri": uri, "_test.failAfterRecords": "5"})
            write_task(bad, "job2", 0, iter([rows]), may_repeat=False)
        w = qjm.open_writer(uri)  # the journal goes on: the unfinished write is decided aborted
        w.append_many([b"after-1", b"after-2"])
        w.close()
        _drain(q, lambda: got[-1] == 121, "the records after the aborted write")
        assert got[-3:] == [111, 120, 121]
        assert json.loads(q.lastProgress["sources"][0]["latestOffset"]) == {"txid": 122}
        assert q.exception() is None
    finally:
        q.stop()


def _collect(spark: Any, uri: str, checkpoint: Path, got: list[int], **options: str) -> Any:
    r = spark.readStream.format("qjm").option("uri", uri)
    for k, v in options.items():
        r = r.option(k, v)
    return (
        r.load()
        .writeStream.foreachBatch(lambda df, _: got.extend(r.txid for r in df.orderBy("txid").collect()))
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def test_majority_loss_timeout_fails_a_stream_whose_majority_is_paused(spark: Any, tmp_path: Path) -> None:
    with MiniJournalCluster(3, str(tmp_path / "jn")) as c:
        w = qjm.open_writer(c.uri, create=True)
        w.append_many(_rec(t) for t in range(1, 101))
        w.sync()
        got: list[int] = []
        q = _collect(spark, c.uri, tmp_path / "ck", got, majorityLossTimeout="3")
        try:
            _drain(q, lambda: len(got) >= 100, "the first 100 records")
            c.pause(1)
            c.pause(2)
            paused_at = time.monotonic()
            with pytest.raises(Exception) as ei:  # the query's error, raised by awaitTermination
                q.awaitTermination(120)
            waited = time.monotonic() - paused_at
            err = str(ei.value)
            assert "majorityLossTimeout" in err and "QuorumError" in err, err
            assert c.name(0) in err  # the one node still answering is named
            assert not q.isActive
            assert waited < 3 + 30, f"failed {waited:.1f}s after the majority was paused"  # timeout + Spark's slack
            assert got == list(range(1, 101))
        finally:
            q.stop()
            c.resume(1)
            c.resume(2)
            w.abort()


def test_without_majority_loss_timeout_a_stream_waits_for_its_paused_majority(spark: Any, tmp_path: Path) -> None:
    with MiniJournalCluster(3, str(tmp_path / "jn")) as c:
        w = qjm.open_writer(c.uri, create=True, config=QJMConfig().with_timeouts(write_txns=5))
        w.append_many(_rec(t) for t in range(1, 101))
        w.sync()
        got: list[int] = []
        q = _collect(spark, c.uri, tmp_path / "ck", got)
        try:
            _drain(q, lambda: len(got) >= 100, "the first 100 records")
            c.pause(1)
            c.pause(2)
            try:
                w.append(b"no majority to take it")
                with pytest.raises(qjm.QJMError):  # the writer gives up after 5 s without a majority ...
                    w.sync()
                assert q.isActive and q.exception() is None  # ... the stream does not
            finally:
                c.resume(1)
                c.resume(2)
            w.abort()
            w2 = qjm.open_writer(c.uri)  # recovers the journal, then goes on
            w2.append_many([b"after-%d" % t for t in range(50)])
            w2.close()
            with qjm.open_reader(c.uri) as r:
                want = [t for t, _ in r]
            assert len(want) >= 150
            _drain(q, lambda: len(got) >= len(want), "the records written after the majority came back")
            assert got == want
            assert q.isActive and q.exception() is None
        finally:
            q.stop()
