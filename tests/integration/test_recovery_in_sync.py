"""Recovery without an accept round when every node holds the same copy (qjm.client.recovery.in_sync_copy).

Real nodes; the FaultPlan only counts calls (and, where said, holds one node back). Each case also
reads everything back and compares the finalized copies byte for byte.
"""

from __future__ import annotations

import os

import qjm
from qjm.config import QJMConfig
from qjm.testing.faults import FaultPlan
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import (
    SETTLE_TIMEOUT,
    inspect_journal,
    ops,
    ops_reach,
    read_all,
    segment_frames,
    wait_for_every_node,
)


def fin(start: int, end: int) -> str:
    return f"edits_{start:019d}-{end:019d}"


def old_writer_dies(c: MiniJournalCluster, n: int, plan: FaultPlan | None = None) -> qjm.Writer:
    """A writer that committed ``n`` records in one open segment, then crashed (abort: no finalize)."""
    w = qjm.open_writer(c.uri, create=True, hooks=plan)
    for i in range(n):
        w.append(b"r%d" % i)
    w.sync()
    wait_for_every_node(w)  # the same copy on all three nodes, not only on the majority sync waits for
    w.abort()
    return w


def assert_identical(c: MiniJournalCluster, nodes: list[int], start: int, end: int) -> None:
    copies = [segment_frames(os.path.join(c.journal_dir(i), fin(start, end))) for i in nodes]
    assert copies[0] and all(x == copies[0] for x in copies)


def test_in_sync_failover_skips_the_accept_round(icluster: MiniJournalCluster) -> None:
    old = old_writer_dies(icluster, 100)
    plan = FaultPlan()
    # a generous wait for the third reply: on a loaded machine 3 ms can pass, and the shortcut
    # is what this test is about (a full recovery would be correct too, see the tests below)
    w = qjm.open_writer(icluster.uri, hooks=plan, config=QJMConfig(in_sync_wait=10, close_grace=SETTLE_TIMEOUT))
    assert w.epoch == old.epoch + 1 and w.last_txid == 100
    assert ops_reach(plan, "finalize_log_segment", 3) == 3
    assert ops(plan, "accept_recovery") == 0 and ops(plan, "prepare_recovery") == 0
    w.append(b"new")
    w.close()
    assert [r for _, r in read_all(icluster.uri)] == [b"r%d" % i for i in range(100)] + [b"new"]
    assert_identical(icluster, [0, 1, 2], 1, 100)
    assert all(not inspect_journal(icluster.journal_dir(i)).accepted for i in range(3))


def test_a_lagging_node_means_a_full_recovery(icluster: MiniJournalCluster) -> None:
    """Node 0 missed the last batch: the copies differ, so the accept round runs and node 0 downloads."""
    plan = FaultPlan()
    w = qjm.open_writer(icluster.uri, create=True, hooks=plan)
    for i in range(50):
        w.append(b"r%d" % i)
    w.sync()
    wait_for_every_node(w)
    plan.fail_before(icluster.name(0), "journal")
    for i in range(50, 60):
        w.append(b"r%d" % i)
    w.sync()
    w.abort()
    assert inspect_journal(icluster.journal_dir(0)).plain()[f"edits_inprogress_{1:019d}"] == 50
    plan2 = FaultPlan()
    w2 = qjm.open_writer(icluster.uri, hooks=plan2, close_grace=SETTLE_TIMEOUT)
    assert w2.last_txid == 60
    assert ops_reach(plan2, "accept_recovery", 3) == 3
    w2.close()
    assert [r for _, r in read_all(icluster.uri)] == [b"r%d" % i for i in range(60)]
    assert_identical(icluster, [0, 1, 2], 1, 60)


def test_a_dead_node_means_a_full_recovery(icluster: MiniJournalCluster) -> None:
    """With a node down nobody can tell what it holds: the accept round runs on the other two."""
    old_writer_dies(icluster, 20)
    icluster.stop(2)
    plan = FaultPlan()
    w = qjm.open_writer(icluster.uri, hooks=plan)
    assert w.last_txid == 20
    # the accept round ran on the two live nodes (the stopped node's call is counted too, once it
    # gets its turn, and fails)
    assert [plan.calls[(icluster.name(i), "accept_recovery")] for i in (0, 1)] == [1, 1]
    w.close()
    icluster.start(2)
    assert [r for _, r in read_all(icluster.uri)] == [b"r%d" % i for i in range(20)]
    assert_identical(icluster, [0, 1], 1, 20)


def test_a_silent_node_is_waited_for_only_briefly(cluster: MiniJournalCluster) -> None:
    """A node that never answers (SIGSTOPped) costs the bounded in_sync_wait, then the accept
    round runs with the quorum; the writer goes on without it."""
    old_writer_dies(cluster, 20)
    cluster.pause(2)
    try:
        plan = FaultPlan()
        cfg = QJMConfig(in_sync_wait=0.05).with_timeouts(new_epoch=30, accept_recovery=30)
        w = qjm.open_writer(cluster.uri, config=cfg, hooks=plan)
        assert w.last_txid == 20
        assert ops(plan, "accept_recovery") >= 2  # the two that answered; the third is queued behind its new_epoch
        w.append(b"more")
        w.sync()
    finally:
        cluster.resume(2)
    w.close()
    assert [r for _, r in read_all(cluster.uri)] == [b"r%d" % i for i in range(20)] + [b"more"]


def test_the_shortcut_can_be_turned_off(icluster: MiniJournalCluster) -> None:
    old_writer_dies(icluster, 10)
    plan = FaultPlan()
    w = qjm.open_writer(icluster.uri, config=QJMConfig(in_sync_wait=0, close_grace=SETTLE_TIMEOUT), hooks=plan)
    assert w.last_txid == 10 and ops_reach(plan, "accept_recovery", 3) == 3
    w.close()
    assert_identical(icluster, [0, 1, 2], 1, 10)
