"""Stream a directory of JSON-lines files into a journal, exactly once, with Spark Structured Streaming.

    python examples/ingest_jsonl_stream.py                       # demo: own 3-node cluster and sample files
    python examples/ingest_jsonl_stream.py --input DIR --uri 'qjournal://h1:8485;h2:8485;h3:8485/events' \\
        --checkpoint /var/lib/ingest/ck [--follow]

Each line becomes one record, byte for byte. Every micro-batch is framed by marker records holding
the query id and batch id, so re-running the command with the same checkpoint after a crash
neither loses nor repeats a line. Without ``--follow`` the query processes what is there and stops
(``trigger(availableNow=True)``); with it, it keeps watching the directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from qjm.testing.minicluster import MiniJournalCluster


def spark_session(app: str) -> Any:
    """A local session on loopback; workers must run this interpreter (it has pyarrow and qjm)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import qjm.spark

    spark = (
        SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local[2]"))
        .appName(app)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    qjm.spark.register(spark)
    return spark


def ingest(
    spark: Any, input_dir: str, uri: str, checkpoint: str, *, follow: bool = False, files_per_batch: int = 1
) -> Any:
    """Start the streaming query; returns it (already finished unless ``follow``)."""
    lines = spark.readStream.option("maxFilesPerTrigger", files_per_batch).text(input_dir)
    query = (
        lines.selectExpr("value AS record")
        .coalesce(1)  # a journal has one writer: the sink needs a single partition per batch
        .writeStream.format("qjm")
        .option("uri", uri)
        .option("create", "true")
        .option("checkpointLocation", checkpoint)
        .queryName("ingest-jsonl")
    )
    query = query.trigger(processingTime="1 second") if follow else query.trigger(availableNow=True)
    q = query.start()
    if not follow:
        q.awaitTermination()
    return q


def sample_files(d: Path, files: int = 4, rows: int = 2500) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(d / f"events-{f:03d}.jsonl", "w") as out:
            for i in range(rows):
                out.write(
                    json.dumps({"file": f, "seq": i, "user": f"u{(f * rows + i) % 97}", "amount": i % 100}) + "\n"
                )


def summary(spark: Any, uri: str) -> None:
    df = spark.read.format("qjm").option("uri", uri).load()
    row = df.selectExpr(
        "count(*) AS n", "min(txid) AS lo", "max(txid) AS hi", "count(DISTINCT segment) AS segs"
    ).first()
    print(f"journal {uri}: {row.n} records, txids {row.lo}..{row.hi}, {row.segs} segments")
    df.selectExpr("txid", "epoch", "CAST(record AS STRING) AS line").orderBy("txid").show(3, truncate=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--uri", help="qjournal:// URI; default: start a local 3-node MiniJournalCluster")
    p.add_argument("--input", help="directory of JSON-lines files; default: generate sample files")
    p.add_argument("--checkpoint", help="streaming checkpoint directory; default: a temporary one")
    p.add_argument("--files-per-batch", type=int, default=1)
    p.add_argument("--follow", action="store_true", help="keep watching the directory (Ctrl-C to stop)")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="qjm-ingest-") as tmp:
        cluster = None if args.uri else MiniJournalCluster(3, os.path.join(tmp, "jn"), journal_id="events")
        try:
            uri = args.uri if cluster is None else cluster.uri
            input_dir = args.input
            if input_dir is None:
                input_dir = os.path.join(tmp, "in")
                sample_files(Path(input_dir))
            checkpoint = args.checkpoint or os.path.join(tmp, "checkpoint")
            spark = spark_session("qjm-ingest-jsonl")
            try:
                q = ingest(spark, input_dir, uri, checkpoint, follow=args.follow, files_per_batch=args.files_per_batch)
                if args.follow:
                    try:
                        q.awaitTermination()
                    except KeyboardInterrupt:
                        q.stop()
                summary(spark, uri)
            finally:
                spark.stop()
        finally:
            if cluster is not None:
                cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
