"""Design §2.10.1-2.10.7 and HDFS-3845, reproduced on real nodes with the exact per-node states.

Each scenario builds the table's state with injected faults, checks every node's files against
the table, runs a recovery with the quorum the text discusses, and checks the recovered end and
that finalized copies are byte-identical (invariant 2).
"""

from __future__ import annotations

import itertools
import os

import pytest

import qjm
from qjm.errors import QuorumError
from qjm.testing.faults import FaultPlan
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import SETTLE_TIMEOUT, ScriptedWriter, inspect_journal, read_all, segment_frames, txn_data


def ip(start: int) -> str:
    return f"edits_inprogress_{start:019d}"


def fin(start: int, end: int) -> str:
    return f"edits_{start:019d}-{end:019d}"


def view(c: MiniJournalCluster, i: int):  # type: ignore[no-untyped-def]
    return inspect_journal(c.journal_dir(i))


def prior_segment(c: MiniJournalCluster, plan: FaultPlan | None = None) -> ScriptedWriter:
    """Epoch-1 writer with segment 1-100 finalized everywhere and segment 101 started."""
    w = ScriptedWriter(c.uri, hooks=plan)
    w.qjm.format()
    assert w.recover() == 0
    w.start(1)
    w.write(1, 100)
    w.finalize(1, 100)
    w.start(101)
    w.settle()  # segment 101 started on all three before a scenario's faults
    return w


def recover_with(c: MiniJournalCluster, nodes: list[int]) -> int:
    """Run a new writer's recovery with only ``nodes`` up; returns the recovered last txid."""
    for i in range(3):
        if i not in nodes and c.is_running(i):
            c.stop(i)
        elif i in nodes and not c.is_running(i):
            c.start(i)
    # Nodes answer in the order listed, so the first majority of ``nodes`` is the quorum that decides.
    plan = FaultPlan()
    for leader, follower in itertools.pairwise(nodes):
        plan.answer_after(c.name(follower), c.name(leader))
    w = ScriptedWriter(c.uri, hooks=plan)
    try:
        return w.recover()
    finally:
        w.close()


def assert_finalized_identical(c: MiniJournalCluster, nodes: list[int], start: int, end: int) -> None:
    copies = {i: segment_frames(os.path.join(c.journal_dir(i), fin(start, end))) for i in nodes}
    first = copies[nodes[0]]
    assert all(v == first for v in copies.values()), "finalized copies differ"
    assert first  # and they hold frames


# -- 2.10.1 --------------------------------------------------------------------------------


def setup_2_10_1(c: MiniJournalCluster) -> None:
    plan = FaultPlan()
    w = prior_segment(c, plan)
    w.write(101, 150)
    plan.fail_before(c.name(0), "journal")
    w.write(151, 153)  # reaches JN2 and JN3: a quorum, then the writer dies
    w.close()
    views = [view(c, i) for i in range(3)]
    assert [v.plain()[ip(101)] for v in views] == [150, 153, 153]
    assert [v.writer_epoch for v in views] == [1, 1, 1]


def test_design_2_10_1_middle_of_log_prior_quorum_succeeded(icluster: MiniJournalCluster) -> None:
    """Prior writer reached JN2+JN3 with 151-153 and died: recovery must keep 153 (rule 3c)."""
    setup_2_10_1(icluster)
    assert recover_with(icluster, [0, 1, 2]) == 153
    assert_finalized_identical(icluster, [0, 1, 2], 101, 153)
    assert [t for t, _ in read_all(icluster.uri)] == list(range(1, 154))


def test_design_2_10_1_any_quorum_keeps_committed(icluster: MiniJournalCluster) -> None:
    """Even a quorum holding the lagging JN1 recovers the committed 153."""
    setup_2_10_1(icluster)
    assert recover_with(icluster, [0, 1]) == 153
    assert_finalized_identical(icluster, [0, 1], 101, 153)


# -- 2.10.2 --------------------------------------------------------------------------------


def setup_2_10_2(c: MiniJournalCluster) -> None:
    plan = FaultPlan()
    w = prior_segment(c, plan)
    w.write(101, 125)
    plan.fail_before(c.name(2), "journal")
    w.write(126, 150)
    plan.fail_before(c.name(0), "journal")
    with pytest.raises(QuorumError):
        w.write(151, 153)  # only JN2 gets it
    w.close()
    views = [view(c, i) for i in range(3)]
    assert [v.plain()[ip(101)] for v in views] == [150, 153, 125]
    assert [v.writer_epoch for v in views] == [1, 1, 1]


@pytest.mark.parametrize(("nodes", "end"), [([0, 1], 153), ([0, 2], 150), ([1, 2], 153), ([0, 1, 2], 153)])
def test_design_2_10_2_middle_of_log_prior_quorum_failed(
    icluster: MiniJournalCluster, nodes: list[int], end: int
) -> None:
    """Lengths 150/153/125: the quorum seen decides 150 or 153, never 125 (rule 3c)."""
    setup_2_10_2(icluster)
    assert recover_with(icluster, nodes) == end
    assert_finalized_identical(icluster, nodes, 101, end)
    assert read_all(icluster.uri)[-1] == (end, txn_data(end))


# -- 2.10.3 --------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [[0, 1, 2], [1, 2], [0, 2]])
def test_design_2_10_3_finalize_prior_quorum_succeeded(icluster: MiniJournalCluster, nodes: list[int]) -> None:
    """Finalized on JN1+JN2, JN3 lags at 145 in progress: any quorum sees a finalized copy (rule 2)."""
    c = icluster
    plan = FaultPlan()
    w = prior_segment(c, plan)
    w.write(101, 145)
    plan.fail_before(c.name(2), "journal")
    w.write(146, 150)
    w.finalize(101, 150)  # JN3 is out of sync: only JN1 and JN2 finalize
    w.close()
    views = [view(c, i) for i in range(3)]
    assert views[0].plain()[fin(101, 150)] == 150 and views[1].plain()[fin(101, 150)] == 150
    assert views[2].plain()[ip(101)] == 145
    assert recover_with(c, nodes) == 150
    assert_finalized_identical(c, nodes, 101, 150)


# -- 2.10.4 --------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [[0, 1, 2], [0, 2], [1, 2]])
def test_design_2_10_4_finalize_prior_quorum_failed(icluster: MiniJournalCluster, nodes: list[int]) -> None:
    """Finalize reached JN1 only: with JN1 rule 2 picks it, without it JN2's 150 wins by rule 3c."""
    c = icluster
    plan = FaultPlan()
    w = prior_segment(c, plan)
    w.write(101, 125)
    plan.fail_before(c.name(2), "journal")
    w.write(126, 150)
    plan.fail_before(c.name(1), "finalize_log_segment")
    with pytest.raises(QuorumError):
        w.finalize(101, 150)
    w.close()
    views = [view(c, i) for i in range(3)]
    assert views[0].plain() == {fin(1, 100): 100, fin(101, 150): 150}
    assert views[1].plain()[ip(101)] == 150
    assert views[2].plain()[ip(101)] == 125
    assert recover_with(c, nodes) == 150
    assert_finalized_identical(c, nodes, 101, 150)


# -- 2.10.5 --------------------------------------------------------------------------------


def test_design_2_10_5_starting_a_log_prior_quorum_failed(icluster: MiniJournalCluster) -> None:
    """start(151) reached JN1 only: its empty segment is moved aside and nothing needs recovery."""
    c = icluster
    plan = FaultPlan()
    w = prior_segment(c, plan)
    w.write(101, 150)
    w.finalize(101, 150)
    plan.fail_before(c.name(1), "start_log_segment").fail_before(c.name(2), "start_log_segment")
    with pytest.raises(QuorumError):
        w.start(151)
    w.close()
    views = [view(c, i) for i in range(3)]
    assert views[0].plain() == {fin(1, 100): 100, fin(101, 150): 150, ip(151): 150}
    assert views[1].plain() == views[2].plain() == {fin(1, 100): 100, fin(101, 150): 150}
    assert recover_with(c, [0, 1, 2]) == 150
    assert ip(151) + ".empty" in view(c, 0).aside()
    w2 = qjm.open_writer(c.uri, close_grace=SETTLE_TIMEOUT)  # the next segment starts on all three again
    w2.append(b"x")
    w2.close()
    assert all(fin(151, 151) in view(c, i).plain() for i in range(3))


# -- 2.10.6 --------------------------------------------------------------------------------


def setup_2_10_6(c: MiniJournalCluster) -> None:
    plan = FaultPlan()
    w = prior_segment(c, plan)
    w.write(101, 150)
    w.finalize(101, 150)
    w.start(151)
    plan.fail_before(c.name(1), "journal").fail_before(c.name(2), "journal")
    with pytest.raises(QuorumError):
        w.write(151, 153)
    w.close()
    v = view(c, 0)
    assert v.plain()[ip(151)] == 153 and v.writer_epoch == 1
    # recovery by epoch 2 with only JN2 and JN3, which then commits one transaction and dies
    c.stop(0)
    w2 = ScriptedWriter(c.uri)
    assert w2.recover() == 150
    w2.start(151)
    w2.write(151, 151)
    w2.close()
    views = [view(c, i) for i in range(3)]
    assert [v.plain()[ip(151)] for v in views] == [153, 151, 151]
    assert [v.writer_epoch for v in views] == [1, 2, 2]


@pytest.mark.parametrize("nodes", [[0, 1, 2], [0, 1], [0, 2]])
def test_design_2_10_6_first_batch_prior_quorum_failed(icluster: MiniJournalCluster, nodes: list[int]) -> None:
    """JN1's longer 153 is from an older writer: the writer epoch 2 of 151 wins (rule 3b)."""
    setup_2_10_6(icluster)
    assert recover_with(icluster, nodes) == 151
    assert_finalized_identical(icluster, nodes, 151, 151)
    assert read_all(icluster.uri)[-1] == (151, txn_data(151))


# -- 2.10.7 --------------------------------------------------------------------------------


def test_design_2_10_7_multiple_recoveries_first_failed(icluster: MiniJournalCluster) -> None:
    """A first recovery accepted 150 on JN1+JN3 and finalized only JN3; a recovery seeing JN1+JN2
    must pick the accepted 150, not JN2's 153 (rule 3b via acceptedInEpoch)."""
    c = icluster
    setup_2_10_2(c)
    c.stop(1)
    plan = FaultPlan().fail_before(c.name(0), "finalize_log_segment")
    w = ScriptedWriter(c.uri, hooks=plan)
    with pytest.raises(QuorumError):
        w.recover()
    w.close()
    views = [view(c, i) for i in range(3)]
    assert views[0].plain()[ip(101)] == 150 and views[0].accepted[101] == (150, 2) and views[0].writer_epoch == 1
    assert views[1].plain()[ip(101)] == 153 and views[1].accepted == {} and views[1].writer_epoch == 1
    assert views[2].plain()[fin(101, 150)] == 150
    assert recover_with(c, [0, 1]) == 150
    assert_finalized_identical(c, [0, 1], 101, 150)
    c.start(2)
    assert_finalized_identical(c, [0, 1, 2], 101, 150)


# -- HDFS-3845 (design §2.10.6) -------------------------------------------------------------


def setup_seed_004(c: MiniJournalCluster) -> None:
    plan = FaultPlan()
    w = prior_segment(c, plan)
    plan.fail_before(c.name(1), "journal").fail_before(c.name(2), "journal")
    with pytest.raises(QuorumError):
        w.write(101, 101)  # the first txn of the new segment reaches JN0 only
    w.close()
    # recovery by epoch 2 sees all three, decides 101-101, accepts on JN0 only, dies
    plan2 = FaultPlan().fail_before(c.name(1), "accept_recovery").fail_before(c.name(2), "accept_recovery")
    plan2.answer_after(c.name(1), c.name(0)).answer_after(c.name(2), c.name(0))  # it talks to all three
    w2 = ScriptedWriter(c.uri, hooks=plan2)
    with pytest.raises(QuorumError):
        w2.recover()
    w2.close()
    views = [view(c, i) for i in range(3)]
    assert views[0].plain()[ip(101)] == 101 and views[0].accepted[101] == (101, 2) and views[0].writer_epoch == 1
    for v in views[1:]:
        assert ip(101) not in v.plain() and ip(101) + ".empty" in v.aside()
    # epoch 3 writes 101-150 to JN1 and JN2 only, then crashes
    c.stop(0)
    w3 = ScriptedWriter(c.uri)
    assert w3.recover() == 100
    w3.start(101)
    w3.write(101, 150)
    w3.close()
    views = [view(c, i) for i in range(3)]
    assert views[0].plain()[ip(101)] == 101 and views[0].accepted[101] == (101, 2) and views[0].writer_epoch == 1
    assert [v.plain()[ip(101)] for v in views[1:]] == [150, 150]
    assert [v.writer_epoch for v in views[1:]] == [3, 3]


def test_seed_004_recovers_to_150_not_101(icluster: MiniJournalCluster) -> None:
    """The sequence of HDFS-3845 exactly: the stale accepted 101-101 must lose to epoch 3's 101-150."""
    setup_seed_004(icluster)
    assert recover_with(icluster, [0, 1, 2]) == 150
    assert_finalized_identical(icluster, [0, 1, 2], 101, 150)
    assert [t for t, _ in read_all(icluster.uri)] == list(range(1, 151))


@pytest.mark.parametrize("nodes", [[0, 1], [0, 2]])
def test_seed_004_stale_acceptor_in_final_quorum(icluster: MiniJournalCluster, nodes: list[int]) -> None:
    """The node holding the stale accepted recovery is one of only two in the final recovery."""
    setup_seed_004(icluster)
    assert recover_with(icluster, nodes) == 150
    assert_finalized_identical(icluster, nodes, 101, 150)
