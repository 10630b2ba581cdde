"""Node-side fault points around the paxos commit point and appends, on real node processes."""

from __future__ import annotations

import os

import qjm
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import ScriptedWriter, eventually, inspect_journal, segment_frames, txn_data


def lagging_setup(c: MiniJournalCluster) -> None:
    """Segment 1 holds 1-10 on nodes 0 and 1 but only 1-5 on node 2; the writer is gone."""
    from qjm.testing.faults import FaultPlan

    plan = FaultPlan()
    w = ScriptedWriter(c.uri, hooks=plan)
    w.qjm.format()
    w.recover()
    w.start(1)
    w.write(1, 5)
    plan.fail_before(c.name(2), "journal")
    w.write(6, 10)
    w.close()


def await_exit(c: MiniJournalCluster, i: int) -> None:
    """Wait for node ``i`` to die at its fault point. The writer stays open meanwhile: closing it
    first could drop the call that reaches the fault point, and the exit is asynchronous anyway."""
    eventually(lambda: not c.is_running(i), what=f"node {i} exited at its fault point")


def test_node_dies_before_persisting_paxos(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Node 2 dies inside accept_recovery before the commit point: recovery still succeeds on the
    others, and once restarted node 2 still holds its own short copy, with no accepted record."""
    with MiniJournalCluster(3, str(tmp_path / "c"), server_faults={2: "before_persist_paxos=exit"}) as c:
        lagging_setup(c)
        w = ScriptedWriter(c.uri)
        assert w.recover() == 10  # a quorum without node 2, whose accept_recovery is still queued
        await_exit(c, 2)
        w.close()
        c.nodes[2].faults = ""
        c.start(2)
        v = inspect_journal(c.journal_dir(2))
        assert v.plain()[f"edits_inprogress_{1:019d}"] == 5 and v.accepted == {}
        w2 = qjm.open_writer(c.uri)  # the next recovery brings node 2 in line
        w2.close()
        r = qjm.open_reader(c.uri)
        assert list(r) == [(i, txn_data(i)) for i in range(1, 11)]
        r.qjm.close()


def test_node_dies_after_persisting_paxos(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Node 2 dies right after the commit point, before renaming the download in: on restart the next
    prepare rolls the accepted copy forward, and its finalized copy matches the others."""
    with MiniJournalCluster(3, str(tmp_path / "c"), server_faults={2: "after_persist_paxos=exit"}) as c:
        lagging_setup(c)
        w = ScriptedWriter(c.uri)
        assert w.recover() == 10  # a quorum without node 2, whose accept_recovery is still queued
        await_exit(c, 2)
        w.close()
        names = os.listdir(c.journal_dir(2))
        assert any(".epoch=" in n for n in names), names  # the downloaded copy, not yet renamed in
        assert inspect_journal(c.journal_dir(2)).accepted[1][0] == 10
        c.nodes[2].faults = ""
        c.start(2)
        c.stop(0)  # the next recovery must use node 2's accepted state
        w2 = ScriptedWriter(c.uri)
        assert w2.recover() == 10
        w2.close()
        name = f"edits_{1:019d}-{10:019d}"
        assert segment_frames(os.path.join(c.journal_dir(2), name)) == segment_frames(
            os.path.join(c.journal_dir(1), name)
        )


def test_node_fails_appends(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A node whose appends fail is dropped for the segment; the writer goes on with the majority."""
    with MiniJournalCluster(3, str(tmp_path / "c"), server_faults={1: "before_append=fail"}) as c:
        w = qjm.open_writer(c.uri, create=True)
        for i in range(1, 101):
            w.append(txn_data(i))
        assert w.sync() == 100  # a majority: node 1's refusal may land a moment later
        eventually(lambda: w.qjm.loggers.loggers[1].out_of_sync, what="node 1 out of sync")
        w.close()
        r = qjm.open_reader(c.uri)
        assert list(r) == [(i, txn_data(i)) for i in range(1, 101)]
        r.qjm.close()
