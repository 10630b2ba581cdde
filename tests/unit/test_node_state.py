"""NodeState: one writer's per-node rules, checked without any I/O."""

from __future__ import annotations

import pytest

from qjm.client.node_state import Held, NodeState, Refusal, Route
from qjm.errors import FencedError, InvariantViolation, NodeTooFarBehindError, NodeUnavailableError, OutOfSyncError

LIMIT = 100


def state() -> NodeState[str]:
    st: NodeState[str] = NodeState("n0", "j", LIMIT)
    st.set_epoch(3)
    return st


def held(n: int, tag: str = "b") -> Held[str]:
    return Held(bytes(n), n, tag, None)


def test_every_request_and_every_retry_takes_a_fresh_serial() -> None:
    st = state()
    serials = [st.request().serial for _ in range(4)]
    assert serials == [1, 2, 3, 4]
    assert st.request().epoch == 3


def test_no_request_before_an_epoch() -> None:
    st: NodeState[str] = NodeState("n0", "j", LIMIT)
    with pytest.raises(Exception, match="no epoch yet"):
        st.request()


def test_commit_notice_only_when_the_committed_txid_moved() -> None:
    st = state()
    assert st.commit_notice() is None
    st.set_committed(5)
    assert st.commit_notice() == (3, 5)
    assert st.commit_notice() is None
    with pytest.raises(InvariantViolation):
        st.set_committed(4)


def test_batches_wait_for_a_start_and_go_with_it() -> None:
    st = state()
    st.start_begun(1)
    assert st.route(10, 0, has_link=False) is Route.HOLD
    st.hold(held(10, "a"))
    st.hold(held(20, "b"))
    assert st.backlog_bytes == 30
    backlog = st.start_succeeded(1)
    assert backlog is not None and [h.ticket for h in backlog] == ["a", "b"]
    assert st.backlog_bytes == 0 and not st.starting and not st.out_of_sync
    assert st.route(10, 0, has_link=True) is Route.SEND


def test_a_failed_start_is_out_of_sync_at_once_and_fails_its_backlog() -> None:
    """Whether it failed at the node or before reaching it: out of sync for that segment, its
    batches handed back to fail, later batches refused at once (not held), back at the next start."""
    st = state()
    st.start_begun(4)
    st.hold(held(10, "a"))
    cause = NodeUnavailableError("n0: injected: start_log_segment #2 to n0 failed before sending")
    assert [h.ticket for h in st.start_failed(4, cause)] == ["a"]
    assert st.out_of_sync and not st.starting and st.backlog_bytes == 0
    r = st.route(10, 0, has_link=True)
    assert isinstance(r, Refusal) and isinstance(r.error, NodeUnavailableError) and "unreachable" in str(r.error)
    assert "n0" in str(r.error) and "until the next segment" in str(r.error)
    assert st.start_failed(4, cause) == []  # ending it twice is harmless
    st.start_begun(6)
    assert st.route(10, 0, has_link=False) is Route.HOLD  # the next start may bring it back
    assert st.start_succeeded(6) == []
    assert not st.out_of_sync and st.unreachable is None


def test_a_start_that_fails_while_a_later_one_is_pending_leaves_that_one_alone() -> None:
    st = state()
    st.start_begun(4)
    st.start_begun(6)
    st.hold(held(10, "for 6"))
    assert st.start_failed(4, NodeUnavailableError("n0: down")) == []
    assert st.route(10, 0, has_link=False) is Route.HOLD
    backlog = st.start_succeeded(6)
    assert backlog is not None and [h.ticket for h in backlog] == ["for 6"]
    assert not st.out_of_sync


def test_a_backlog_past_the_limit_drops_the_node_for_the_segment() -> None:
    st = state()
    st.start_begun(1)
    st.hold(held(60, "a"))
    r = st.route(60, 0, has_link=False)
    assert isinstance(r, Refusal) and isinstance(r.error, NodeTooFarBehindError) and r.close_link
    assert [h.ticket for h in r.dropped] == ["a"]
    assert st.out_of_sync and st.start_succeeded(1) is None  # it sits the segment out


def test_a_single_batch_larger_than_the_limit_is_taken_when_nothing_is_queued() -> None:
    st = state()
    assert st.route(LIMIT * 3, 0, has_link=True) is Route.SEND  # Hadoop: a limit of 0 is one batch
    r = st.route(10, LIMIT, has_link=True)
    assert isinstance(r, Refusal) and isinstance(r.error, NodeTooFarBehindError)


def test_a_start_refused_by_the_node_is_out_of_sync() -> None:
    st = state()
    st.start_begun(4)
    st.start_failed(4, OutOfSyncError("n0: refused"))
    r = st.route(10, 0, has_link=True)
    assert isinstance(r, Refusal) and isinstance(r.error, OutOfSyncError)


def test_no_link_outside_a_start_is_out_of_sync() -> None:
    st = state()
    r = st.route(10, 0, has_link=False)
    assert isinstance(r, Refusal) and isinstance(r.error, OutOfSyncError) and st.out_of_sync


def test_a_node_that_fenced_the_writer_refuses_as_fenced_until_the_next_segment() -> None:
    st = state()
    st.lose_sync(FencedError("n0: epoch 3 below 4", request_epoch=3, promised_epoch=4))
    r = st.route(10, 0, has_link=True)
    assert isinstance(r, Refusal) and isinstance(r.error, FencedError) and r.error.promised_epoch == 4
    st.start_begun(9)
    st.start_succeeded(9)
    assert st.fenced is None and st.route(10, 0, has_link=True) is Route.SEND
