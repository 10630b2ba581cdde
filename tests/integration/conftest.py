"""Real JournalNodes on loopback for every integration test; the cluster is torn down after each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from qjm.testing.minicluster import MiniJournalCluster


@pytest.fixture
def cluster(tmp_path) -> Iterator[MiniJournalCluster]:  # type: ignore[no-untyped-def]
    """Three JournalNodes as subprocesses: kill and pause are real."""
    with MiniJournalCluster(3, str(tmp_path / "cluster")) as c:
        yield c


@pytest.fixture
def icluster(tmp_path) -> Iterator[MiniJournalCluster]:  # type: ignore[no-untyped-def]
    """Three JournalNodes in this process (real sockets and disks), quicker to start and stop."""
    with MiniJournalCluster(3, str(tmp_path / "cluster"), in_process=True) as c:
        yield c
