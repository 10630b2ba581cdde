"""Materialize a journal (or a txid range of it) as Parquet with a Spark batch job.

    python examples/journal_to_parquet.py                    # demo: own cluster, seeded with JSON records
    python examples/journal_to_parquet.py --uri 'qjournal://h1:8485;h2:8485;h3:8485/events' \\
        --output /data/events.parquet [--start-txid N] [--end-txid M] [--json]

The source splits the journal by segment, so the job reads segments in parallel, each from any
replica. ``--json`` parses records as JSON objects (schema inferred from the records) into
columns; otherwise the raw bytes are kept. ``txid``, ``segment`` and ``epoch`` always come along,
so an incremental export can resume at ``max(txid) + 1``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
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


def materialize(
    spark: Any, uri: str, output: str, *, start: int | None = None, end: int | None = None, as_json: bool = False
) -> int:
    """Write the journal's committed records to ``output`` (Parquet); returns how many."""
    from pyspark.sql import functions as F

    reader = spark.read.format("qjm").option("uri", uri)
    if start is not None:
        reader = reader.option("startTxid", start)
    if end is not None:
        reader = reader.option("endTxid", end)
    df = reader.load()
    if as_json:
        text = df.select(F.col("record").cast("string").alias("s"))
        schema = spark.read.json(text.rdd.map(lambda r: r.s)).schema
        df = df.select("txid", "segment", "epoch", F.from_json(F.col("record").cast("string"), schema).alias("r"))
        df = df.select("txid", "segment", "epoch", "r.*")
    df.write.mode("overwrite").parquet(output)
    return int(spark.read.parquet(output).count())


def seed(spark: Any, uri: str, n: int = 50_000) -> None:
    """Demo data: JSON records written through the qjm sink."""
    rows = spark.range(n).selectExpr(
        "to_json(named_struct('id', id, 'kind', element_at(array('click', 'view', 'buy'), CAST(id % 3 + 1 AS INT)), "
        "'amount', id % 1000)) AS record"
    )
    rows.coalesce(1).write.format("qjm").option("uri", uri).option("create", "true").mode("append").save()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--uri", help="qjournal:// URI; default: start a local 3-node MiniJournalCluster and seed it")
    p.add_argument("--output", help="Parquet output directory; default: a temporary one")
    p.add_argument("--start-txid", type=int)
    p.add_argument("--end-txid", type=int)
    p.add_argument("--json", action="store_true", help="parse records as JSON objects into columns")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="qjm-parquet-") as tmp:
        cluster = None if args.uri else MiniJournalCluster(3, os.path.join(tmp, "jn"), journal_id="events")
        try:
            spark = spark_session("qjm-journal-to-parquet")
            try:
                uri = args.uri
                if uri is None:
                    assert cluster is not None
                    uri = cluster.uri
                    seed(spark, uri)
                    args.json = True
                output = args.output or os.path.join(tmp, "out.parquet")
                n = materialize(spark, uri, output, start=args.start_txid, end=args.end_txid, as_json=args.json)
                print(f"wrote {n} records from {uri} to {output}")
                spark.read.parquet(output).orderBy("txid").show(5, truncate=False)
            finally:
                spark.stop()
        finally:
            if cluster is not None:
                cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
