"""``qjm rejoin`` on real nodes (design §4.5): a node whose disk was replaced comes back with its
peers' namespace and highest promise, refuses the writer they fenced, takes the writer's next
segment and catches up the finalized ones; refused, changing nothing, when it would be unsafe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import qjm
from qjm.client.manager import QuorumJournalManager
from qjm.errors import FencedError, QuorumError
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import eventually

INTERVAL = 0.3
DEADLINE = 60.0  # a few catch-up intervals, stretched for a loaded 2-core machine


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qjm", *args], capture_output=True, text=True, timeout=120)


def node_status(cluster: MiniJournalCluster, i: int) -> dict[str, object]:
    r = run("status", cluster.uri, "--json")
    row: dict[str, object] = next(n for n in json.loads(r.stdout)["nodes"] if n["node"] == cluster.name(i))
    return row


def replace_disk(cluster: MiniJournalCluster, i: int) -> None:
    """Node ``i`` comes back on an empty data directory."""
    cluster.stop(i)
    shutil.rmtree(cluster.node_dir(i))
    os.makedirs(cluster.node_dir(i))
    cluster.start(i)


def test_a_node_on_a_new_disk_rejoins_fenced_against_old_writers_and_catches_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with MiniJournalCluster(3, str(tmp_path / "c"), sync_interval=INTERVAL) as c:
        w1 = qjm.open_writer(c.uri, create=True)
        w1.append_many(b"one-%d" % i for i in range(100))
        w1.roll()
        # Node 2 is down while a second writer fences the first: only nodes 0 and 1 promise epoch 2,
        # and node 2's new disk knows no epoch at all.
        c.stop(2)
        w2 = qjm.open_writer(c.uri)
        w1.abort()
        w2.append_many(b"two-%d" % i for i in range(100))
        w2.roll()
        replace_disk(c, 2)
        assert node_status(c, 2)["formatted"] is False
        hint = f"node {c.name(2)} does not hold the journal; if its data directory was replaced, run: qjm rejoin"
        assert hint in run("status", c.uri).stdout

        r = run("rejoin", c.uri, "--node", c.name(2))
        assert r.returncode == 0, r.stderr
        assert f"node {c.name(2)} holds journal {c.journal_id} again" in r.stdout
        assert "with promised epoch 2" in r.stdout and "roll the writer soon" in r.stdout

        st, peer = node_status(c, 2), node_status(c, 0)
        assert st["formatted"] is True and st["promised_epoch"] == 2 == w2.qjm.epoch
        assert [st[k] for k in ("namespace_id", "cluster_id", "ctime")] == [
            peer[k] for k in ("namespace_id", "cluster_id", "ctime")
        ]
        # A writer in the fenced epoch is refused by the new disk too.
        with QuorumJournalManager(c.uri) as old:
            lg = old.loggers.by_name(c.name(2))
            lg.set_epoch(1)
            with pytest.raises(FencedError, match="epoch 1 is below the promised epoch 2"):
                lg.start_log_segment(10_000).result(timeout=30)

        # The writer goes on unfenced; node 2 takes its next segment and catches up the rest.
        w2.append_many(b"three-%d" % i for i in range(100))
        w2.roll()
        w2.append_many(b"four-%d" % i for i in range(100))
        w2.sync()
        last = w2.sync()
        eventually(
            lambda: node_status(c, 2)["highest_written_txid"] == last,
            timeout=DEADLINE,
            what="node 2 holds the writer's new segment",
        )
        w2.close()
        eventually(
            lambda: c.finalized_segments(2) == c.finalized_segments(0),
            timeout=DEADLINE,
            what="node 2 holds every finalized segment, byte for byte",
        )
        assert len(c.finalized_segments(2)) >= 4


def test_rejoin_is_refused_and_changes_nothing_when_unsafe(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with MiniJournalCluster(3, str(tmp_path / "c")) as c:
        w = qjm.open_writer(c.uri, create=True)
        w.append(b"x")
        w.sync()
        before = node_status(c, 0)
        r = run("rejoin", c.uri, "--node", c.name(0))
        assert r.returncode == 1
        assert f"node {c.name(0)} holds journal {c.journal_id}" in r.stderr
        assert "rejoin is for a node whose copy of the journal is gone" in r.stderr
        assert node_status(c, 0)["promised_epoch"] == before["promised_epoch"]

        r = run("rejoin", c.uri, "--node", "127.0.0.1:1")
        assert r.returncode == 2 and "is not one of the journal's nodes" in r.stderr, r.stderr

        w.close()
        replace_disk(c, 2)
        c.stop(1)
        # With node 1 down, node 0 alone cannot vouch for every epoch a writer may hold.
        r = run("rejoin", c.uri, "--node", c.name(2))
        assert r.returncode == 1
        assert "QuorumError: rejoin" in r.stderr and "1 of the other nodes answered" in r.stderr, r.stderr
        assert node_status(c, 2)["formatted"] is False
        c.start(1)
        r = run("rejoin", c.uri, "--node", c.name(2))
        assert r.returncode == 0, r.stderr
        assert node_status(c, 2)["formatted"] is True and node_status(c, 2)["rejoined_without_segments"] is True

        # Until a writer started a segment on it, node 2's "no such segment" is no evidence: with
        # node 1 down, no new writer recovers the log from nodes 0 and 2.
        c.stop(1)
        with pytest.raises(QuorumError, match=r"rejoined journal .* after losing its disk"):
            qjm.open_writer(c.uri)
        c.start(1)
        w = qjm.open_writer(c.uri)
        w.append(b"y")
        w.sync()
        eventually(
            lambda: node_status(c, 2)["rejoined_without_segments"] is False,
            timeout=DEADLINE,
            what="the writer's segment reached node 2",
        )
        w.close()
        c.stop(1)
        w = qjm.open_writer(c.uri)  # nodes 0 and 2 now recover it together
        w.append(b"z")
        w.sync()
        w.close()
