"""Batch writes when a task attempt dies or lingers: the next attempt fences it and finishes the write once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from qjm.errors import FencedError
from qjm.spark import decode_marker, is_marker
from qjm.spark.journal import JournalClient
from qjm.spark.options import WriteOptions
from qjm.spark.sink import InjectedFailure, ReplayMismatchError, write_task

pytestmark = pytest.mark.spark

SPARK_MASTER = "local[2,2]"  # Spark may retry a failed task once


def _all(uri: str) -> list[tuple[int, bytes]]:
    with JournalClient(uri) as jc:
        return list(jc.records(1, jc.committed_end(1)))


def test_retried_task_fences_and_resumes_the_failed_attempt(spark: Any, uri: str, tmp_path: Path) -> None:
    n = 5000
    df = spark.range(n).select(F.format_string("r%05d", "id").cast("binary").alias("record")).coalesce(1)
    report = tmp_path / "report.jsonl"
    (
        df.write.format("qjm")
        .option("uri", uri)
        .option("create", "true")
        .option("reportPath", str(report))
        .option("_test.failAfterRecords", "1234")  # attempt 0 dies after 1234 durable records
        .option("_test.failOnceFile", str(tmp_path / "fired"))
        .mode("append")
        .save()
    )
    (rep,) = [json.loads(line) for line in report.read_text().splitlines()]
    # begin at 1, attempt 0's records, attempt 1's resume marker at 1236, its records, end, commit
    assert (rep["first_txid"], rep["last_txid"], rep["records"], rep["resumed"]) == (2, n + 2, n, 1234)

    got = _all(uri)
    assert [r for _, r in got if not is_marker(r)] == [b"r%05d" % i for i in range(n)]
    assert [(t, decode_marker(r).kind) for t, r in got if is_marker(r)] == [
        (1, "begin"), (1236, "resume"), (n + 3, "end"), (n + 4, "commit")
    ]  # fmt: skip
    epochs = (
        spark.read.format("qjm").option("uri", uri).load().groupBy("epoch").agg(F.min("txid"), F.max("txid"))
    ).orderBy("epoch")
    (first, second) = [tuple(r) for r in epochs.collect()]
    assert first[1:] == (2, 1235) and second[1:] == (1237, n + 2) and second[0] > first[0]


def _batches(lo: int, hi: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([b"z%05d" % i for i in range(lo, hi)], pa.binary())], names=["record"])


def test_zombie_attempt_can_append_nothing(uri: str) -> None:
    """Attempt A stalls mid-write; attempt B of the same task fences it and completes; A then fails."""
    opts = WriteOptions.parse({"uri": uri, "create": "true"})
    paused, go = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def a_input() -> Iterator[pa.RecordBatch]:
        yield _batches(0, 100)
        paused.set()
        go.wait(60)
        yield _batches(100, 300)

    def attempt_a() -> None:
        try:
            write_task(opts, "write-t", 0, a_input(), may_repeat=False)
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    a = threading.Thread(target=attempt_a)
    a.start()
    assert paused.wait(60)
    b = write_task(opts, "write-t", 0, iter([_batches(0, 100), _batches(100, 300)]), may_repeat=True)
    go.set()
    a.join(60)
    assert isinstance(outcome[0], FencedError)
    got = _all(uri)
    assert [r for _, r in got if not is_marker(r)] == [b"z%05d" % i for i in range(300)]
    # B resumed after A's begin marker (synced before A's first record) and its durable records
    assert [decode_marker(r).kind for _, r in got if is_marker(r)] == ["begin", "resume", "end"]
    assert (b.last_txid, b.records) == (302, 300)


def test_replay_after_a_bare_begin_marker_and_a_changed_replay(uri: str, tmp_path: Path) -> None:
    """An attempt dying right after its begin marker is resumed without a second one; a different replay is refused."""

    def opts(after: int, once: str) -> WriteOptions:
        return WriteOptions.parse(
            {"uri": uri, "create": "true", "_test.failAfterRecords": str(after), "_test.failOnceFile": once}
        )

    with pytest.raises(InjectedFailure):
        write_task(opts(0, str(tmp_path / "a")), "q", 0, iter([_batches(0, 10)]), may_repeat=True)
    done = write_task(opts(0, str(tmp_path / "a")), "q", 0, iter([_batches(0, 10)]), may_repeat=True)
    assert (done.first_txid, done.last_txid, done.resumed) == (3, 12, 0)
    got = _all(uri)
    assert [decode_marker(r).kind for _, r in got if is_marker(r)] == ["begin", "resume", "end"]

    with pytest.raises(InjectedFailure):
        write_task(opts(5, str(tmp_path / "b")), "q", 1, iter([_batches(0, 10)]), may_repeat=True)
    with pytest.raises(ReplayMismatchError):
        write_task(opts(5, str(tmp_path / "b")), "q", 1, iter([_batches(1, 11)]), may_repeat=True)
    assert len(_all(uri)) == 13 + 1 + 5  # the refused replay appended nothing, not even its resume marker
