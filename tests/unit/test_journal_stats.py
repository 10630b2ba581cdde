"""A journal's counters (Hadoop JournalMetrics) as the protocol code keeps them, and the histogram."""

from __future__ import annotations

import pytest

from qjm._native import framing
from qjm.errors import FencedError, OutOfOrderError
from qjm.histogram import Histogram
from qjm.protocol.messages import NamespaceInfo, RequestInfo
from qjm.server.journal import Journal
from qjm.server.journal_stats import JournalStats
from qjm.testing.memstore import MemoryStorage

NS = NamespaceInfo(42, "cluster-a")


def frame(first: int, n: int, *, epoch: int, seg: int) -> bytes:
    records = [b"r%d" % t for t in range(first, first + n)]
    return bytes(framing.encode_frame(records, epoch=epoch, segment_txid=seg, first_txid=first))


def writing_journal(epoch: int = 1) -> Journal:
    j = Journal(MemoryStorage("j"))
    j.format(NS)
    j.new_epoch(NS, epoch)
    j.start_log_segment(RequestInfo("j", epoch, 1, -1), 1)
    return j


def test_histogram_buckets_are_cumulative_and_quantiles_are_bucket_bounds() -> None:
    h = Histogram((0.001, 0.01, 0.1))
    for v in (0.0005, 0.001, 0.005, 0.05, 0.05, 3.0):
        h.observe(v)
    assert h.cumulative() == [("0.001", 2), ("0.01", 3), ("0.1", 5), ("+Inf", 6)]
    assert h.count == 6
    assert h.total == pytest.approx(3.1065)
    assert h.quantile(0.5) == 0.01
    assert h.quantile(0.99) == float("inf")
    assert Histogram().quantile(0.5) == 0.0


def test_add_durable_counts_what_a_gate_kept() -> None:
    s = JournalStats()
    s.add_durable(3, 35, 140, 2, [1] + [0] * 16, 0.002, 1234.0)
    assert (s.batches_written, s.txns_written, s.bytes_written) == (3, 35, 140)
    assert s.batches_written_while_lagging == 2
    assert s.sync_seconds.count == 1 and s.last_journal_time == 1234.0
    s.add_durable(0, 0, 0, 0, [0] * 17, 0.0, 0.0)  # nothing durable since: nothing counted, the time kept
    assert s.sync_seconds.count == 1 and s.last_journal_time == 1234.0
    with pytest.raises(ValueError, match="17 buckets"):
        s.add_durable(1, 1, 10, 0, [1], 0.001, 1235.0)


def test_frames_a_node_receives_are_above_the_committed_txid_it_keeps() -> None:
    j = writing_journal()
    j.journal([frame(1, 10, epoch=1, seg=1), frame(11, 20, epoch=1, seg=1)])
    j.note_committed(1, 30)  # a lower bound, capped at this node's end (30)
    j.journal([frame(31, 5, epoch=1, seg=1)])
    j.journal([frame(36, 5, epoch=1, seg=1)])  # came after the notice: not lagging, as 31-35 was not
    s = j.record_stats()
    # A node keeps no committed txid past its own end, so what reaches it is never behind a quorum.
    assert (s.batches_written, s.txns_written, s.batches_written_while_lagging) == (4, 40, 0)


def test_journal_counts_what_it_made_durable() -> None:
    j = writing_journal()
    frames = [frame(1, 5, epoch=1, seg=1), frame(6, 3, epoch=1, seg=1)]
    assert j.journal(frames) == 8
    assert j.journal([frame(9, 2, epoch=1, seg=1)]) == 10
    s = j.record_stats()  # the data plane records each sync once its ack is out; readers first
    assert (s.batches_written, s.txns_written) == (3, 10)
    assert s.bytes_written == sum(len(f) for f in frames) + len(frame(9, 2, epoch=1, seg=1))
    assert s.sync_seconds.count == 2  # one sync per run of frames (group commit)
    assert j.status()["batches_written"] == 3
    st = j.peek_state()
    assert st is not None and st.highest_written_txid == 10 and st.open_segment_txid == 1


def test_fenced_requests_and_batches_are_counted() -> None:
    j = writing_journal(epoch=1)
    j.new_epoch(NS, 2)  # a newer writer
    with pytest.raises(FencedError):
        j.journal([frame(1, 1, epoch=1, seg=1)])  # the old writer's batch
    with pytest.raises(FencedError):
        j.heartbeat(RequestInfo("j", 1, 5, -1))  # and its control-plane call
    assert j.stats.fenced_refused == 2
    assert j.stats.batches_written == 0


def test_out_of_sync_is_set_by_a_refused_batch_and_cleared_by_the_next_segment() -> None:
    j = writing_journal()
    j.journal([frame(1, 2, epoch=1, seg=1)])
    with pytest.raises(OutOfOrderError):
        j.journal([frame(5, 1, epoch=1, seg=1)])  # a gap: txids 3-4 never arrived
    assert j.stats.out_of_sync and j.stats.out_of_sync_refused == 1
    j.finalize_log_segment(RequestInfo("j", 1, 2, -1), 1, 2)
    j.start_log_segment(RequestInfo("j", 1, 3, -1), 3)
    assert not j.stats.out_of_sync and j.stats.out_of_sync_refused == 1


def test_an_unformatted_journal_has_no_state_to_peek() -> None:
    assert Journal(MemoryStorage("j")).peek_state() is None
