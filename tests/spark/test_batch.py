"""Batch reads and writes of the ``qjm`` format against real JournalNodes."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

import qjm
from qjm.errors import ConfigError
from qjm.spark import decode_marker, is_marker
from qjm.spark.options import ReadOptions, WriteOptions

pytestmark = pytest.mark.spark


def _error(fn: Any) -> str:
    with pytest.raises(Exception) as ei:
        fn()
    return str(ei.value)


def _read(spark: Any, uri: str, **options: object) -> Any:
    r = spark.read.format("qjm").option("uri", uri)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def _records(df: Any) -> list[tuple[int, int, int, bytes]]:
    return [(r.txid, r.segment, r.epoch, bytes(r.record)) for r in df.orderBy("txid").collect()]


def test_options_are_checked(spark: Any, uri: str) -> None:
    # through Spark: our message reaches the user at load()/save() time, before any action
    assert "option 'uri' is required" in _error(lambda: spark.read.format("qjm").load())
    assert "option 'startTxid'" in _error(
        lambda: spark.read.format("qjm").option("uri", uri).option("startTxid", "x").load()
    )
    bad_stream = spark.readStream.format("qjm").option("uri", uri).option("maxRecordsPerTrigger", "0")
    assert "option 'maxRecordsPerTrigger'" in _error(bad_stream.load)
    assert "option 'uri' is required" in _error(spark.readStream.format("qjm").load)
    lossy = spark.readStream.format("qjm").option("uri", uri).option("majorityLossTimeout", "soon")
    assert "option 'majorityLossTimeout' must be a number" in _error(lossy.load)
    assert "fixed schema" in _error(
        lambda: spark.read.format("qjm").schema("x long").option("uri", uri).load().collect()
    )
    assert "for streams" in _error(lambda: _read(spark, uri, startTxid="latest").collect())
    # one partition: with two, the empty one's "single input partition" refusal can win the race
    df = spark.createDataFrame([(b"a",)], "record binary").coalesce(1)
    assert '.option("create", "true")' in _error(
        lambda: df.write.format("qjm").option("uri", uri).mode("append").save()
    )
    assert "append-only" in _error(lambda: df.write.format("qjm").option("uri", uri).mode("overwrite").save())
    two = spark.createDataFrame([(b"a", 1)], "record binary, n int")
    msg = _error(lambda: two.write.format("qjm").option("uri", uri).mode("append").save())
    assert "one column 'record'" in msg and "serializer" in msg

    # the parsers themselves (each error names its option)
    def bad(parse: Any, **options: str) -> str:
        with pytest.raises(ConfigError) as ei:
            parse(options)
        return str(ei.value)

    assert "option 'uri'" in bad(ReadOptions.parse, uri="http://x/y")
    assert "option 'startTxid'" in bad(ReadOptions.parse, uri=uri, startTxid="abc")
    assert "option 'startTxid'" in bad(ReadOptions.parse, uri=uri, startTxid="0")
    assert "option 'endTxid'" in bad(ReadOptions.parse, uri=uri, startTxid="9", endTxid="3")
    assert "option 'includeInProgress'" in bad(ReadOptions.parse, uri=uri, includeInProgress="maybe")
    assert "option 'maxRecordsPerTrigger'" in bad(ReadOptions.parse, uri=uri, maxRecordsPerTrigger="-1")
    assert "unknown option 'starttxd'" in bad(ReadOptions.parse, uri=uri, startTxd="1")
    assert "'qjm.nosuch'" in bad(ReadOptions.parse, uri=uri, **{"qjm.nosuch": "1"})
    assert "'qjm.batch_bytes'" in bad(WriteOptions.parse, uri=uri, **{"qjm.batch_bytes": "big"})
    assert "option 'serializer'" in bad(WriteOptions.parse, uri=uri, serializer="xml")
    assert "option 'segmentRecords'" in bad(WriteOptions.parse, uri=uri, segmentRecords="0")
    assert "unknown option 'starttxid'" in bad(WriteOptions.parse, uri=uri, startTxid="1")
    assert "option 'majorityLossTimeout' must be a finite number > 0" in bad(
        ReadOptions.parse, uri=uri, majorityLossTimeout="0"
    )
    for raw in ("nan", "inf"):  # float() takes them; a timeout cannot be either
        assert "must be a finite number > 0" in bad(ReadOptions.parse, uri=uri, majorityLossTimeout=raw)
        assert "must be a finite number > 0" in bad(ReadOptions.parse, uri=uri, readTimeout=raw)
    o = ReadOptions.parse({"PATH": uri, "STARTTXID": "latest", "qjm.reconnect_timeout": "0.5"})
    assert (o.uri, o.start_latest, o.config.timeouts.reconnect) == (uri, True, 0.5)
    assert o.majority_loss_timeout is None and o.partition_wait == 120.0  # unset: a read waits for its majority
    o = ReadOptions.parse({"uri": uri, "majorityLossTimeout": "7.5", "readTimeout": "30"})
    assert (o.majority_loss_timeout, o.partition_wait, o.config.timeouts.select_input_streams) == (7.5, 7.5, 7.5)


def test_read_columns_segments_epochs_and_ranges(spark: Any, uri: str) -> None:
    w = qjm.open_writer(uri, create=True)
    w.append_many(b"a%d" % i for i in range(10))
    w.roll()
    w.append_many(b"b%d" % i for i in range(5))
    e1 = w.epoch
    w.close()
    w = qjm.open_writer(uri)
    w.append_many(b"c%d" % i for i in range(7))
    e2 = w.epoch
    w.close()
    want = (
        [(1 + i, 1, e1, b"a%d" % i) for i in range(10)]
        + [(11 + i, 11, e1, b"b%d" % i) for i in range(5)]
        + [(16 + i, 16, e2, b"c%d" % i) for i in range(7)]
    )
    df = _read(spark, uri)
    assert df.schema.simpleString() == "struct<txid:bigint,segment:bigint,epoch:bigint,record:binary>"
    assert df.rdd.getNumPartitions() == 3  # one per segment
    assert _records(df) == want

    split = _read(spark, uri, maxRecordsPerPartition=3)
    assert split.rdd.getNumPartitions() == 4 + 2 + 3
    assert _records(split) == want
    assert _records(_read(spark, uri, startTxid=5, endTxid=17)) == want[4:17]
    assert _records(_read(spark, uri, startTxid=20, endTxid=1000)) == want[19:]
    assert _read(spark, uri, startTxid=23).count() == 0


def test_txid_filters_read_only_the_segments_they_overlap(spark: Any, uri: str) -> None:
    w = qjm.open_writer(uri, create=True)
    for k in range(5):  # segments 1-100, 101-200, ..., 401-500
        w.append_many(b"%d" % (k * 100 + i + 1) for i in range(100))
        w.roll()
    w.close()
    everything = _read(spark, uri)
    assert everything.rdd.getNumPartitions() == 5
    cases = {
        "txid BETWEEN 150 AND 260": (2, list(range(150, 261))),
        "txid >= 420": (1, list(range(420, 501))),
        "txid < 101": (1, list(range(1, 101))),
        "txid = 333": (1, [333]),
        "txid > 200 AND txid <= 300 AND epoch > 0": (1, list(range(201, 301))),
        "txid > 500": (1, []),  # no range: Spark plans its one empty placeholder partition
    }
    for where, (parts, txids) in cases.items():
        df = everything.where(where)
        assert df.rdd.getNumPartitions() == parts, where
        assert [(r.txid, bytes(r.record)) for r in df.orderBy("txid").collect()] == [(t, b"%d" % t) for t in txids]
    assert everything.where("txid IN (5, 7)").count() == 2
    assert everything.where("txid = 5 OR txid = 450").count() == 2  # not pushed (OR): still right


def test_in_progress_records_only_when_asked(spark: Any, uri: str) -> None:
    w = qjm.open_writer(uri, create=True)
    try:
        w.append_many([b"x", b"y"])
        w.roll()
        w.append_many([b"p", b"q", b"r"])
        w.sync()
        assert [bytes(r.record) for r in _read(spark, uri).orderBy("txid").collect()] == [b"x", b"y"]
        got = _records(_read(spark, uri, includeInProgress="true"))
        assert [(t, s, bytes(r)) for t, s, _, r in got] == [
            (1, 1, b"x"),
            (2, 1, b"y"),
            (3, 3, b"p"),
            (4, 3, b"q"),
            (5, 3, b"r"),
        ]
    finally:
        w.close()


def test_write_markers_report_and_serializers(spark: Any, uri: str, tmp_path: Path) -> None:
    report = tmp_path / "report.jsonl"
    df = spark.createDataFrame([(b"one",), (b"two",), (b"three",)], "record binary")
    (
        df.coalesce(1)
        .write.format("qjm")
        .option("uri", uri)
        .option("create", "true")
        .option("reportPath", str(report))
        .mode("append")
        .save()
    )
    (rep,) = [json.loads(line) for line in report.read_text().splitlines()]
    assert (rep["first_txid"], rep["last_txid"], rep["records"], rep["skipped"]) == (2, 4, 3, False)
    assert [bytes(r.record) for r in _read(spark, uri).orderBy("txid").collect()] == [b"one", b"two", b"three"]

    shown = _records(_read(spark, uri, showMarkers="true"))
    assert [t for t, *_ in shown] == [1, 2, 3, 4, 5, 6]
    begin, end, commit = (decode_marker(shown[i][3]) for i in (0, 4, 5))
    assert [(m.kind, m.tag) for m in (begin, end, commit)] == [(k, rep["tag"]) for k in ("begin", "end", "commit")]
    assert (end.records, end.first, end.last) == (commit.records, commit.first, commit.last) == (3, 2, 4)
    assert shown[5][1] == 6  # the driver's commit marker has a segment of its own
    assert not any(is_marker(r) for *_, r in shown[1:4])

    # a string 'record' column is written as UTF-8; serializer=json writes whole rows
    spark.createDataFrame([("héllo",)], "record string").coalesce(1).write.format("qjm").option("uri", uri).mode(
        "append"
    ).save()
    rows = spark.sql("select 7L as id, 'ann' as name, cast('2024-05-06 07:08:09' as timestamp) as ts, X'00ff' as raw")
    rows.write.format("qjm").option("uri", uri).option("serializer", "json").mode("append").save()
    tail = [bytes(r.record) for r in _read(spark, uri, startTxid=6).orderBy("txid").collect()]
    assert tail[0] == "héllo".encode()
    doc = json.loads(tail[1])
    assert doc["id"] == 7 and doc["name"] == "ann" and doc["ts"].startswith("2024-05-06") and doc["raw"] == "AP8="

    # markers=false: plain appends, nothing hidden (and no resume on task retries)
    spark.createDataFrame([(b"bare",)], "record binary").coalesce(1).write.format("qjm").option("uri", uri).option(
        "markers", "false"
    ).mode("append").save()
    last = _records(_read(spark, uri, startTxid=15, showMarkers="true"))
    assert [(t, r) for t, _, _, r in last] == [(15, b"bare")]

    # user records may never pass for markers
    fake = spark.createDataFrame([(qjm.spark.MAGIC + b"{}",)], "record binary").coalesce(1)
    assert "marker magic" in _error(lambda: fake.write.format("qjm").option("uri", uri).mode("append").save())


def test_more_than_one_input_partition_is_refused(spark: Any, uri: str) -> None:
    qjm.open_writer(uri, create=True).close()
    df = spark.range(0, 10, 1, 2).select(F.col("id").cast("string").alias("record"))
    msg = _error(lambda: df.write.format("qjm").option("uri", uri).mode("append").save())
    assert "single input partition" in msg and "coalesce(1)" in msg


def _count(spark: Any, uri: str, **options: object) -> int:
    return int(_read(spark, uri, includeInProgress="true", **options).count())


def test_a_failed_save_leaves_nothing_visible(spark: Any, uri: str) -> None:
    """The issue's reproduction: two input partitions, no coalesce(1); partition 0 may have written."""
    qjm.open_writer(uri, create=True).close()  # partition 0 may fail before it could format the journal
    df = spark.range(0, 200000, 1, 2).select(F.col("id").cast("string").alias("record"))
    msg = _error(lambda: df.write.format("qjm").option("uri", uri).mode("append").save())
    assert "single input partition" in msg
    assert _count(spark, uri) == 0
    # Partition 0's task may still be writing (Spark does not wait for it): the next writer fences it.
    w = qjm.open_writer(uri)
    w.append(b"next")
    w.close()
    assert [bytes(r.record) for r in _read(spark, uri).collect()] == [b"next"]
    raw = _read(spark, uri, isolation="read_uncommitted").collect()
    assert bytes(raw[-1].record) == b"next" and len(raw) == len({r.txid for r in raw})


def test_a_save_failing_midway_is_hidden_and_the_raw_view_shows_it(spark: Any, uri: str) -> None:
    df = spark.range(0, 5000, 1, 1).select(F.col("id").cast("string").alias("record"))
    ok = spark.createDataFrame([(b"kept",)], "record binary").coalesce(1)
    ok.write.format("qjm").option("uri", uri).option("create", "true").mode("append").save()
    failing = df.write.format("qjm").option("uri", uri).option("_test.failAfterRecords", "1234").mode("append")
    assert "injected failure" in _error(failing.save)
    assert [bytes(r.record) for r in _read(spark, uri).collect()] == [b"kept"]
    raw = _read(spark, uri, isolation="read_uncommitted", showMarkers="true").orderBy("txid").collect()
    assert [bytes(r.record) for r in raw if not is_marker(r.record)] == [b"kept"] + [b"%d" % i for i in range(1234)]
    kinds = [decode_marker(bytes(r.record)).kind for r in raw if is_marker(r.record)]
    assert kinds == ["begin", "end", "commit", "begin", "abort"]
    ok.write.format("qjm").option("uri", uri).mode("append").save()  # later writes are visible again
    assert [bytes(r.record) for r in _read(spark, uri).collect()] == [b"kept", b"kept"]
    assert "option 'isolation'" in _error(lambda: _read(spark, uri, isolation="serializable"))


def test_million_records_round_trip(spark: Any, uri: str) -> None:
    """Acceptance: 1,000,000 records of ~100 bytes through df.write and back through spark.read."""
    n = 1_000_000
    src = spark.range(n).select(
        F.concat(F.lpad(F.col("id").cast("string"), 10, "0"), F.lit("|"), F.sha1(F.col("id").cast("string")))
        .cast("binary")
        .alias("record")
    )  # 10 + 1 + 40 = 51 bytes: pad to ~100
    src = src.select(F.concat("record", F.lit(b"." * 49)).alias("record"))

    def digest(df: Any) -> tuple[int, int, int]:
        row = df.agg(
            F.count("*").alias("n"),
            F.sum(F.crc32("record")).alias("crc"),
            F.sum(F.xxhash64("record").cast("decimal(38,0)")).alias("xx"),
        ).collect()[0]
        return row.n, row.crc, int(row.xx)

    t0 = time.monotonic()
    src.coalesce(1).write.format("qjm").option("uri", uri).option("create", "true").mode("append").save()
    write_s = time.monotonic() - t0

    df = _read(spark, uri)
    t0 = time.monotonic()
    got = digest(df)
    read_s = time.monotonic() - t0
    assert got == digest(src)
    assert got[0] == n
    segments = df.select("segment").distinct().count()
    assert segments == 5  # the sink rolls every 250,000 txids (segmentRecords)
    assert df.rdd.getNumPartitions() == segments
    txids = df.agg(F.min("txid"), F.max("txid"), F.countDistinct("txid")).collect()[0]
    assert tuple(txids) == (2, n + 1, n)  # markers at 1 and n + 2 are hidden
    print(
        f"\n1M x 100 B: write {write_s:.1f} s ({n / write_s:,.0f} rec/s), read {read_s:.1f} s ({n / read_s:,.0f} rec/s)"
    )


def test_journal_to_parquet_example_pipeline(spark: Any, uri: str, tmp_path: Path) -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "journal_to_parquet.py"
    spec = importlib.util.spec_from_file_location("qjm_example_journal_to_parquet", path)
    assert spec is not None and spec.loader is not None
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    ex.seed(spark, uri, n=3000)
    out = str(tmp_path / "out.parquet")
    assert ex.materialize(spark, uri, out, start=102, end=2001, as_json=True) == 1900
    back = spark.read.parquet(out)
    assert back.columns == ["txid", "segment", "epoch", "amount", "id", "kind"]
    assert back.agg(F.min("id"), F.max("id")).first() == (100, 1999)  # txid = id + 2 (begin marker at 1)


def test_the_docs_quick_start_runs_as_written(spark: Any, uri: str) -> None:
    """docs/spark.md's first example, with only its URI replaced by a fresh journal's."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "spark.md").read_text(encoding="utf-8")
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    placeholder = '"qjournal://h1:8485;h2:8485;h3:8485/events"'
    assert example.count(placeholder) == 1
    namespace: dict[str, Any] = {}
    exec(compile(example.replace(placeholder, repr(uri)), "docs/spark.md", "exec"), namespace)
    assert namespace["spark"] is spark  # getOrCreate found the test's session
    got = [(r.txid, r.record) for r in namespace["df"].selectExpr("txid", "CAST(record AS STRING) AS record").collect()]
    assert [rec for _, rec in sorted(got)] == [str(i) for i in range(10)]
