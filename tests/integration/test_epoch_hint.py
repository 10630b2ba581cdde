"""The epoch hint (qjm.client.shared): a process that has seen a journal's epoch fences without
asking the nodes first, and a wrong guess falls back to asking them. Real nodes throughout."""

from __future__ import annotations

import pytest

import qjm
from qjm.client.manager import QuorumJournalManager
from qjm.client.shared import EpochHints
from qjm.errors import NotFormattedError, QuorumError
from qjm.testing.faults import FaultPlan
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import inspect_journal, ops, ops_reach, read_all


def test_a_writer_after_one_of_this_process_skips_get_journal_state(icluster: MiniJournalCluster) -> None:
    a = qjm.open_writer(icluster.uri, create=True)
    a.append(b"a")
    a.sync()
    plan = FaultPlan()
    b = qjm.open_writer(icluster.uri, hooks=plan)
    assert b.epoch == a.epoch + 1
    assert ops_reach(plan, "new_epoch", 3) == 3 and ops(plan, "get_journal_state") == 0
    b.append(b"b")
    b.close()
    a.abort()
    assert [r for _, r in read_all(icluster.uri)] == [b"a", b"b"]


def test_a_stale_hint_falls_back_to_asking_the_nodes(icluster: MiniJournalCluster) -> None:
    """Another process took the journal over twice; this one still remembers epoch 1."""
    for _ in range(3):
        qjm.open_writer(icluster.uri, create=True).close()
    promised = inspect_journal(icluster.journal_dir(0)).promised_epoch
    hints = EpochHints()
    plan = FaultPlan()
    m = QuorumJournalManager(icluster.uri, hooks=plan, epoch_hints=hints)
    hints.note(m._hint_key, 1)
    try:
        m.recover_unfinalized_segments()
        assert m.epoch == promised + 1
        assert ops_reach(plan, "new_epoch", 6) == 6  # the refused guess on 3 nodes, then the real proposal
        assert ops_reach(plan, "get_journal_state", 3) == 3
        assert hints.get(m._hint_key) == m.epoch
    finally:
        m.close()


def test_a_hint_for_a_journal_not_formatted_falls_back_and_formats(icluster: MiniJournalCluster) -> None:
    """The guess meets "not formatted": the fallback asks the nodes and reports it as such, as
    open_writer(create=True) needs; after the format the guess is taken (anything above the
    nodes' fresh promise is)."""
    hints = EpochHints()
    m = QuorumJournalManager(icluster.uri, epoch_hints=hints)
    hints.note(m._hint_key, 7)
    try:
        with pytest.raises(QuorumError) as ei:
            m.recover_unfinalized_segments()
        assert all(isinstance(c, NotFormattedError) for c in ei.value.causes.values())
        assert m.epoch == 0
        m.format()
        m.recover_unfinalized_segments()
        assert m.epoch == 8
    finally:
        m.close()


def test_a_reader_following_the_open_segment_learns_the_epoch(icluster: MiniJournalCluster) -> None:
    hints = EpochHints()
    w = qjm.open_writer(icluster.uri, create=True)
    for i in range(5):
        w.append(b"%d" % i)
    w.sync()
    r = qjm.open_reader(icluster.uri, include_in_progress=True)
    r.qjm._hints = hints  # this reader's process: its own hint store
    assert len(list(r)) == 5
    r.qjm.close()
    assert hints.get(r.qjm._hint_key) == w.epoch
    w.close()


def test_a_tail_learns_the_epoch_from_the_frames_pushed(icluster: MiniJournalCluster) -> None:
    hints = EpochHints()
    w = qjm.open_writer(icluster.uri, create=True)
    w.append(b"one")
    w.sync()
    with qjm.open_reader(icluster.uri) as r:
        r.qjm._hints = hints  # this reader's process: its own hint store
        assert next(r.tail()) == (1, b"one")
        assert hints.get(r.qjm._hint_key) == w.epoch
    w.close()
