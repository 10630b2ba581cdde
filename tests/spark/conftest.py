"""One real SparkSession for the directory's tests (local[2], loopback only) and real JournalNodes.

A module may set ``SPARK_MASTER`` (e.g. ``"local[2,2]"`` to let Spark retry a failed task once):
the session is restarted with that master for it, in the same JVM (a stopped SparkContext leaves
PySpark's gateway running: a new context takes about 1 s, the JVM's start with its first query
about 20 s and 25 s of CPU). Under xdist (``make test``) every Spark test of the suite is in one
group (``SPARK_GROUP``, also ``tests/sim/test_faultsim_spark.py``'s), which runs on one worker, so
that the run starts one JVM rather than one on each worker the tests would be spread over. Each
module still has its own cluster, and the streams a module started are stopped after it.
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
SPARK_GROUP = "spark"  # a name without "[]": xdist's group parsing stops at a "]"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: before the plain hook in which xdist's worker reads the groups (tests/conftest.py
    # checks that they arrive). An explicit group is kept.
    for it in items:
        if it.get_closest_marker("xdist_group") is None and it.path.parent == HERE:
            it.add_marker(pytest.mark.xdist_group(SPARK_GROUP))


def _master(module: Any) -> str:
    return getattr(module, "SPARK_MASTER", "local[2]")


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


class _Sessions:
    """The directory's one session, restarted for a module that asks another master."""

    def __init__(self) -> None:
        self.master: str | None = None
        self.session: Any = None

    def get(self, master: str, tmp: pytest.TempPathFactory) -> Any:
        if self.session is not None and self.master != master:
            self.close()
        if self.session is None:
            self.session = _session(master, tmp.mktemp("spark-local"))
            self.master = master
        return self.session

    def close(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None


_SESSIONS = _Sessions()


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    s = _SESSIONS.get(_master(request.module), tmp_path_factory)
    try:
        yield s
    finally:
        for q in s.streams.active:
            q.stop()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # After the fixtures' own teardown (trylast), once the next test is not this directory's: a test
    # elsewhere that starts a session of its own (tests/sim/test_faultsim_spark.py) would be handed
    # this one by getOrCreate. A later test of this directory on the same worker starts it again.
    if nextitem is None or nextitem.path.parent != HERE:
        _SESSIONS.close()


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
