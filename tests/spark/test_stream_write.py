"""Exactly-once streaming writes: a query that dies in the middle of a batch, or right after one, and restarts."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from qjm.spark import decode_marker, is_marker
from qjm.spark.journal import JournalClient

pytestmark = pytest.mark.spark

FILES = 3
ROWS = 1000


def _inputs(d: Path) -> None:
    d.mkdir()
    for k in range(FILES):
        lines = (json.dumps({"k": k, "i": i, "payload": f"row {k}/{i}"}) for i in range(ROWS))
        (d / f"part-{k}.json").write_text("\n".join(lines) + "\n")


def _start(spark: Any, src: Path, uri: str, checkpoint: Path, report: Path, **test_options: str) -> Any:
    df = spark.readStream.format("json").schema("k long, i long, payload string").option("maxFilesPerTrigger", 1)
    w = (
        df.load(str(src))
        .coalesce(1)
        .writeStream.format("qjm")
        .option("uri", uri)
        .option("create", "true")
        .option("serializer", "json")
        .option("reportPath", str(report))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    for k, v in test_options.items():
        w = w.option(f"_test.{k}", v)
    return w.start()


def _journal(uri: str) -> tuple[list[dict[str, Any]], list[Any]]:
    """(user rows, markers) of the whole journal, read without Spark."""
    rows: list[dict[str, Any]] = []
    markers: list[Any] = []
    with JournalClient(uri) as jc:
        for _, rec in jc.records(1, jc.committed_end(1)):
            if is_marker(rec):
                markers.append(decode_marker(rec))
            else:
                rows.append(json.loads(rec))
    return rows, markers


def _check_exactly_once(uri: str) -> list[Any]:
    rows, markers = _journal(uri)
    counts = Counter((r["k"], r["i"]) for r in rows)
    assert len(rows) == FILES * ROWS and set(counts.values()) == {1}
    assert sorted(counts) == [(k, i) for k in range(FILES) for i in range(ROWS)]
    ends = [m for m in markers if m.kind == "end"]
    assert [(m.batch, m.records) for m in ends] == [(b, ROWS) for b in range(FILES)]
    return markers


def test_batch_interrupted_midway_is_resumed_once(spark: Any, uri: str, tmp_path: Path) -> None:
    _inputs(tmp_path / "in")
    ck, report = tmp_path / "ck", tmp_path / "report.jsonl"
    fail = {"failBatch": "1", "failAfterRecords": "400", "failOnceFile": str(tmp_path / "fired")}
    q = _start(spark, tmp_path / "in", uri, ck, report, **fail)
    with pytest.raises(StreamingQueryException, match="injected failure"):
        assert q.awaitTermination(120), "query did not finish"
    rows, _ = _journal(uri)
    assert len(rows) == ROWS + 400  # batch 0, and batch 1 cut short after 400 durable records

    q = _start(spark, tmp_path / "in", uri, ck, report, **fail)  # same checkpoint; the fault has fired
    assert q.awaitTermination(120), "query did not finish"
    assert q.exception() is None
    markers = _check_exactly_once(uri)
    assert [(m.kind, m.batch) for m in markers] == [
        ("begin", 0), ("end", 0), ("commit", 0),
        ("begin", 1), ("resume", 1), ("end", 1), ("commit", 1),
        ("begin", 2), ("end", 2), ("commit", 2),
    ]  # fmt: skip
    assert len({m.tag for m in markers}) == 1  # the query id, kept in the checkpoint
    done = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(d["batch"], d["resumed"], d["records"]) for d in done] == [(0, 0, ROWS), (1, 400, ROWS), (2, 0, ROWS)]


def test_batch_written_but_not_committed_by_spark_is_skipped(spark: Any, uri: str, tmp_path: Path) -> None:
    _inputs(tmp_path / "in")
    ck, report = tmp_path / "ck", tmp_path / "report.jsonl"
    fail = {"failInCommit": "true", "failOnceFile": str(tmp_path / "fired")}
    q = _start(spark, tmp_path / "in", uri, ck, report, **fail)
    with pytest.raises(StreamingQueryException, match="injected failure after batch 0"):
        assert q.awaitTermination(120), "query did not finish"
    q = _start(spark, tmp_path / "in", uri, ck, report, **fail)  # Spark replays batch 0
    assert q.awaitTermination(120), "query did not finish"
    assert q.exception() is None
    _check_exactly_once(uri)
    done = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(d["batch"], d["skipped"]) for d in done] == [(0, False), (0, True), (1, False), (2, False)]


def _example(name: str) -> Any:
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"qjm_example_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ingest_example_pipeline(spark: Any, uri: str, tmp_path: Path) -> None:
    ex = _example("ingest_jsonl_stream")
    ex.sample_files(tmp_path / "in", files=3, rows=200)
    ex.ingest(spark, str(tmp_path / "in"), uri, str(tmp_path / "ck"))
    ex.sample_files(tmp_path / "in", files=4, rows=200)  # one new file; the first three are not re-read
    ex.ingest(spark, str(tmp_path / "in"), uri, str(tmp_path / "ck"))
    rows, markers = _journal(uri)
    assert sorted((r["file"], r["seq"]) for r in rows) == [(f, i) for f in range(4) for i in range(200)]
    assert [m.batch for m in markers if m.kind == "end"] == [0, 1, 2, 3]
