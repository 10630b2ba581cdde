"""The writer's per-node transport on real nodes: failed starts, lost replies and retries (issue 12).

Faults are injected on the client (``FaultPlan``): a call that fails before it is sent, or a reply
the node sent that the writer never reads; the nodes, sockets and disks are real.
"""

from __future__ import annotations

import time

import pytest

from qjm.client.channel import RemoteLogger
from qjm.config import QJMConfig
from qjm.errors import NodeUnavailableError, OutOfSyncError, QuorumError
from qjm.testing.faults import FaultPlan
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import ScriptedWriter, read_all, txn_data

LONG = 60.0  # every quorum wait: a test that waits this long has failed
CONFIG = QJMConfig().with_timeouts(
    write_txns=LONG, start_segment=LONG, finalize_segment=LONG, new_epoch=LONG, get_journal_state=LONG,
    prepare_recovery=LONG, accept_recovery=LONG, operations=LONG,
)  # fmt: skip


def logger(w: ScriptedWriter, name: str) -> RemoteLogger:
    lg = w.qjm.loggers.by_name(name)
    assert isinstance(lg, RemoteLogger)
    return lg


def first_segment(c: MiniJournalCluster, plan: FaultPlan) -> ScriptedWriter:
    w = ScriptedWriter(c.uri, hooks=plan, config=CONFIG)
    w.qjm.format()
    assert w.recover() == 0
    w.start(1)
    w.write(1, 3, wait_all=True)
    return w


def second_segment(c: MiniJournalCluster, plan: FaultPlan) -> tuple[ScriptedWriter, RemoteLogger]:
    """Segment 1-3 written and finalized, segment 4 started under ``plan`` (its faults name the
    second start_log_segment); returns the writer and node 0 once node 0's start has ended, as the
    quorum may return before it does."""
    w = first_segment(c, plan)
    w.finalize(1, 3)
    w.start(4)
    zero = logger(w, c.name(0))
    zero.wait_for_start(LONG)
    return w, zero


def test_miss_finalize_and_next_start(icluster: MiniJournalCluster) -> None:
    """Hadoop's testMissFinalizeAndNextStart: node 0 misses finalize(1-3) and start(4), node 1
    fails at txid 4. The write of 4 fails at once, naming node 0 as out of sync (it does not wait
    for a start that never ran), and a recovery without node 2 ends the log at 3."""
    c = icluster
    plan = FaultPlan()
    w = first_segment(c, plan)
    plan.fail_before(c.name(0), "finalize_log_segment", call=1).fail_before(c.name(0), "start_log_segment", call=2)
    w.finalize(1, 3)
    w.start(4)
    plan.fail_before(c.name(1), "journal")
    begun = time.monotonic()
    with pytest.raises(QuorumError) as info:
        w.write(4, 4)
    assert time.monotonic() - begun < LONG / 4
    causes = info.value.causes
    assert set(causes) == {c.name(0), c.name(1)}
    # out of sync for the segment it never started; unreachable, as the failed start said
    assert isinstance(causes[c.name(0)], OutOfSyncError | NodeUnavailableError)
    assert "until the next segment" in str(causes[c.name(0)]) and c.name(0) in str(causes[c.name(0)])
    assert c.name(0) in str(info.value)
    w.close()
    c.stop(2)
    again = ScriptedWriter(c.uri, config=CONFIG)
    assert again.recover() == 3
    again.close()


def test_a_failed_start_is_out_of_sync_for_its_segment_and_back_at_the_next(icluster: MiniJournalCluster) -> None:
    c = icluster
    w, zero = second_segment(c, FaultPlan().fail_before(c.name(0), "start_log_segment", call=2))
    assert zero.out_of_sync
    begun = time.monotonic()
    with pytest.raises(QuorumError) as info:  # every node must hold it: node 0 cannot, and says so at once
        w.write(4, 5, wait_all=True)
    assert time.monotonic() - begun < LONG / 4
    assert set(info.value.causes) == {c.name(0)}
    w.finalize(4, 5)  # nodes 1 and 2 hold 4-5 (the batch went to them); node 0 refuses to finalize
    w.start(6)
    w.write(6, 8, wait_all=True)  # node 0 is back for the new segment
    assert not zero.out_of_sync
    w.finalize(6, 8)
    w.close()
    assert read_all(c.uri) == [(t, txn_data(t)) for t in range(1, 9)]


def test_a_start_whose_reply_was_lost_is_retried_with_a_fresh_serial(icluster: MiniJournalCluster) -> None:
    """Node 0 starts segment 4 but its reply is lost; the retry (a new serial) starts it again, so
    node 0 is in the segment: the same serial would be refused as out of order."""
    c = icluster
    plan = FaultPlan().lose_reply(c.name(0), "start_log_segment", call=2)
    w, zero = second_segment(c, plan)
    assert plan.replies[(c.name(0), "start_log_segment")] == 3  # segment 1, the lost reply, the retry
    assert not zero.out_of_sync
    w.write(4, 6, wait_all=True)
    w.finalize(4, 6)
    w.close()
    assert read_all(c.uri) == [(t, txn_data(t)) for t in range(1, 7)]


@pytest.mark.parametrize("op", ["finalize_log_segment", "accept_recovery", "purge_logs"])
def test_every_control_call_whose_reply_was_lost_succeeds_on_its_retry(icluster: MiniJournalCluster, op: str) -> None:
    c = icluster
    plan = FaultPlan()
    w = first_segment(c, plan)
    if op == "accept_recovery":  # node 2 misses 4-5: the copies differ, so recovery runs its accept round
        plan.fail_before(c.name(2), "journal", call=2)
        w.write(4, 5)
    else:
        w.write(4, 5, wait_all=True)
    plan.lose_reply(c.name(0), op, call=1)
    if op == "finalize_log_segment":
        w.qjm.loggers.call(lambda lg: lg.finalize_log_segment(1, 5)).wait_for_all(LONG, "finalize")
    elif op == "purge_logs":
        w.finalize(1, 5)
        logger(w, c.name(0)).purge_logs(1).result(LONG)
    else:
        w.close()
        again = ScriptedWriter(c.uri, hooks=plan, config=CONFIG)
        plan.answer_after(c.name(1), c.name(0)).answer_after(c.name(2), c.name(0))
        assert again.recover() == 5
        w = again
    assert plan.replies[(c.name(0), op)] == 2
    w.close()
    assert read_all(c.uri) == [(t, txn_data(t)) for t in range(1, 6)]
