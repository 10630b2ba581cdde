"""One real SparkSession per test module (local[2], loopback only) and real JournalNodes.

A module may set ``SPARK_MASTER`` (e.g. ``"local[2,2]"`` to let Spark retry a failed task once).
Under xdist (``make test``) each module's tests form one group that runs on one worker, so that
the module starts one session (a JVM) rather than one on every worker its tests would be spread over.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qjm.testing.minicluster import MiniJournalCluster

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Runs before xdist reads the groups (its hook is trylast); an explicit group is kept.
    for it in items:
        if it.get_closest_marker("xdist_group") is None and it.path.parent == HERE:
            it.add_marker(pytest.mark.xdist_group(f"spark-{it.path.stem}"))


def _session(master: str, tmp: Path) -> Any:
    # Spark's Python workers are separate processes: they must run this interpreter, which has
    # pyarrow and the project installed; and nothing may listen beyond loopback.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    import qjm.spark

    spark = (
        SparkSession.builder.master(master)
        .appName("qjm-spark-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(tmp))
        .config("spark.sql.streaming.stopTimeout", "60s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    qjm.spark.register(spark)
    return spark


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    master = getattr(request.module, "SPARK_MASTER", "local[2]")
    s = _session(master, tmp_path_factory.mktemp("spark-local"))
    try:
        yield s
    finally:
        for q in s.streams.active:
            q.stop()
        s.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniJournalCluster]:
    """Three JournalNodes as subprocesses (kill is real), shared by a module; tests use their own journals."""
    with MiniJournalCluster(3, str(tmp_path_factory.mktemp("jn"))) as c:
        yield c


_ids = itertools.count(1)


@pytest.fixture
def uri(cluster: MiniJournalCluster, request: pytest.FixtureRequest) -> str:
    """A fresh, unformatted journal on the module's cluster."""
    name = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:80]
    return cluster.uri_for(f"{name}-{next(_ids)}")
