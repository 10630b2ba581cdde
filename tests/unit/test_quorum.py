"""QuorumCall over real futures completed from other threads (no sleeps: events order the threads)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qjm.client.quorum import PAUSE_FRACTION, Deadline, QuorumCall, majority
from qjm.errors import FencedError, InvariantViolation, NodeUnavailableError, QuorumError

NAMES = ["n0", "n1", "n2", "n3", "n4", "n5", "n6"]


def futures(n: int) -> dict[str, Future[int]]:
    return {NAMES[i]: Future() for i in range(n)}


class SignallingClock:
    """time.monotonic that sets ``waiting`` on every call.

    QuorumCall reads its clock while holding its lock, and a future's callback needs that lock, so a
    completer that starts once ``waiting`` is set delivers its results while the caller is parked in
    ``Condition.wait``: this exercises the wake-up path without sleeping.
    """

    def __init__(self) -> None:
        self.waiting = threading.Event()

    def __call__(self) -> float:
        self.waiting.set()
        return time.monotonic()


def complete_later(
    clock: SignallingClock, actions: Iterable[tuple[Future[int], int | BaseException]]
) -> threading.Thread:
    """Complete the futures from another thread once the caller has started waiting."""

    def run() -> None:
        assert clock.waiting.wait(10)
        for fut, outcome in actions:
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize(("n", "expected"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)])
def test_majority(n: int, expected: int) -> None:
    assert majority(n) == expected
    # any two majorities intersect, and a majority can lose n - majority nodes
    assert 2 * majority(n) > n
    assert 2 * (majority(n) - 1) <= n


def test_majority_rejects_negative() -> None:
    with pytest.raises(ValueError):
        majority(-1)


def test_write_quorum_returns_at_two_of_three() -> None:
    fs = futures(3)
    clock = SignallingClock()
    call = QuorumCall(fs, clock=clock)
    t = complete_later(clock, [(fs["n0"], 10), (fs["n2"], 12)])  # n1 never answers
    start = time.monotonic()
    got = call.wait_for_write_quorum(30.0, "journal")
    assert time.monotonic() - start < 5
    assert got == {"n0": 10, "n2": 12}
    t.join(5)
    # the returned dict is a copy: later results and caller edits do not leak either way
    fs["n1"].set_result(11)
    assert got == {"n0": 10, "n2": 12}
    assert call.successes == {"n0": 10, "n1": 11, "n2": 12}
    got["n9"] = 99
    assert "n9" not in call.successes


def test_write_quorum_fails_at_two_failures_with_per_node_causes() -> None:
    fs = futures(3)
    clock = SignallingClock()
    call = QuorumCall(fs, clock=clock)
    e0, e1 = FencedError("newer writer", request_epoch=1, promised_epoch=2), NodeUnavailableError("down")
    t = complete_later(clock, [(fs["n0"], e0), (fs["n1"], e1)])  # n2 never answers
    start = time.monotonic()
    with pytest.raises(QuorumError) as info:
        call.wait_for_write_quorum(30.0, "start_log_segment")
    assert time.monotonic() - start < 5  # did not wait for n2 or the timeout
    assert info.value.causes == {"n0": e0, "n1": e1}
    assert info.value.successes == {}
    assert info.value.fenced
    assert "start_log_segment" in str(info.value)
    t.join(5)


def test_write_quorum_one_failure_two_successes() -> None:
    fs = futures(3)
    fs["n1"].set_exception(NodeUnavailableError("down"))  # done before the call exists
    clock = SignallingClock()
    call = QuorumCall(fs, clock=clock)
    t = complete_later(clock, [(fs["n0"], 1), (fs["n2"], 3)])
    assert call.wait_for_write_quorum(30.0, "op") == {"n0": 1, "n2": 3}
    assert set(call.exceptions) == {"n1"}
    t.join(5)


def test_timeout_raises_quorum_error() -> None:
    fs = futures(3)
    fs["n0"].set_result(1)
    call = QuorumCall(fs)
    start = time.monotonic()
    with pytest.raises(QuorumError, match=r"timed out after 0\.2s") as info:
        call.wait_for_write_quorum(0.2, "new_epoch")
    assert time.monotonic() - start < 5
    assert "new_epoch" in str(info.value)
    assert info.value.successes == {"n0": 1}
    assert info.value.causes == {}


class PausingClock:
    """time.monotonic, plus a jump of ``pause`` seconds at the ``at``-th reading: the waiting thread
    was stopped there (GC, SIGSTOP, a suspended VM). ``on_pause`` runs at the jump."""

    def __init__(self, pause: float, at: int, on_pause: Callable[[], object] = lambda: None) -> None:
        self.pause, self.at, self.on_pause = pause, at, on_pause
        self.reads = 0
        self.offset = 0.0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads == self.at:
            self.offset += self.pause
            self.on_pause()
        return time.monotonic() + self.offset


def completer(actions: Iterable[tuple[Future[int], int | BaseException]]) -> Callable[[], threading.Thread]:
    """Start a thread that completes the futures (QuorumCall's callbacks wait for its lock, so the
    results land once the caller is parked in its wait)."""

    def run() -> None:
        for fut, outcome in actions:
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    def start() -> threading.Thread:
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    return start


def test_a_pause_past_the_deadline_does_not_fail_a_call_whose_answers_come_right_after() -> None:
    """Hadoop's QuorumCall extends the deadline by a pause of the waiting thread (HDFS-10733)."""
    fs = futures(3)
    clock = PausingClock(100.0, at=2, on_pause=completer([(fs["n0"], 1), (fs["n1"], 2)]))
    call = QuorumCall(fs, clock=clock)
    start = time.monotonic()
    assert call.wait_for_write_quorum(10.0, "journal") == {"n0": 1, "n1": 2}
    assert time.monotonic() - start < 5


def test_a_pause_extends_the_deadline_by_the_pause_only() -> None:
    """After the pause the nodes still get the rest of the timeout, not forever."""
    call = QuorumCall(futures(3), clock=PausingClock(100.0, at=2))
    start = time.monotonic()
    with pytest.raises(QuorumError, match="timed out"):
        call.wait_for_write_quorum(0.2, "journal")
    assert time.monotonic() - start < 5


class ScriptedClock:
    """Readings from a list; ``on_read[i]`` runs at the i-th reading (1-based)."""

    def __init__(self, ticks: list[float], on_read: dict[int, Callable[[], object]]) -> None:
        self.ticks, self.on_read, self.reads = ticks, on_read, 0

    def __call__(self) -> float:
        self.reads += 1
        self.on_read.get(self.reads, lambda: None)()
        return self.ticks[self.reads - 1]


def test_a_short_gap_is_not_a_pause() -> None:
    """A gap under PAUSE_FRACTION of the timeout is time the nodes had: past the deadline, the call
    times out at once. (n0's answer wakes the waiter; the clock then says 12 s went by, 10 waited.)"""
    fs = futures(3)
    gap = PAUSE_FRACTION * 10.0 - 1.0
    clock = ScriptedClock([0.0, 0.0, 10.0 + gap], {2: completer([(fs["n0"], 1)])})
    start = time.monotonic()
    with pytest.raises(QuorumError, match="timed out"):
        QuorumCall(fs, clock=clock).wait_for_write_quorum(10.0, "op")
    assert time.monotonic() - start < 5


def test_deadline_moves_by_a_gap_beyond_the_wait_asked_for() -> None:
    now = [0.0]
    d = Deadline(10.0, clock=lambda: now[0])
    assert d.remaining() == 10.0
    now[0] = 10.0  # the whole wait asked for went by: no pause
    assert d.remaining() == 0.0 and d.paused == 0.0
    d2 = Deadline(10.0, clock=lambda: now[0])  # due at 20
    now[0] = 12.0
    assert d2.remaining() == 8.0  # a 2 s gap (under 3 s) is time the nodes had
    now[0] = 12.0 + 8.0 + 50.0  # waited the 8 s asked for, then stopped for 50 s
    assert d2.remaining() == 0.0
    assert d2.paused == 50.0 and d2.at == 70.0


def test_invariant_violation_is_reraised_at_once() -> None:
    fs = futures(3)
    clock = SignallingClock()
    call = QuorumCall(fs, clock=clock)
    bad = InvariantViolation("would discard committed txid")
    t = complete_later(clock, [(fs["n2"], bad)])
    start = time.monotonic()
    with pytest.raises(InvariantViolation) as info:
        call.wait_for_write_quorum(30.0, "accept_recovery")
    assert info.value is bad
    assert time.monotonic() - start < 5
    t.join(5)


def test_invariant_violation_wins_over_a_met_quorum() -> None:
    fs = futures(3)
    fs["n0"].set_result(0)
    fs["n1"].set_result(1)
    fs["n2"].set_exception(InvariantViolation("finalized segments differ"))
    with pytest.raises(InvariantViolation):
        QuorumCall(fs).wait_for_write_quorum(30.0, "finalize")


def test_wait_for_all_success() -> None:
    fs = futures(3)
    clock = SignallingClock()
    call = QuorumCall(fs, clock=clock)
    t = complete_later(clock, [(fs[n], i) for i, n in enumerate(fs)])
    assert call.wait_for_all(30.0, "format") == {"n0": 0, "n1": 1, "n2": 2}
    t.join(5)


def test_wait_for_all_fails_at_first_exception() -> None:
    fs = futures(3)
    clock = SignallingClock()
    call = QuorumCall(fs, clock=clock)
    err = NodeUnavailableError("disk gone")
    t = complete_later(clock, [(fs["n0"], 0), (fs["n1"], err)])  # n2 never answers
    start = time.monotonic()
    with pytest.raises(QuorumError) as info:
        call.wait_for_all(30.0, "format")
    assert time.monotonic() - start < 5
    assert info.value.causes == {"n1": err}
    assert info.value.successes == {"n0": 0}
    t.join(5)


def test_wait_for_all_times_out() -> None:
    fs = futures(2)
    fs["n0"].set_result(0)
    start = time.monotonic()
    with pytest.raises(QuorumError, match="timed out"):
        QuorumCall(fs).wait_for_all(0.2, "format")
    assert time.monotonic() - start < 5


def test_wait_for_min_responses_counts_failures_too() -> None:
    fs = futures(3)
    fs["n0"].set_result(0)
    fs["n1"].set_exception(NodeUnavailableError("x"))
    call = QuorumCall(fs)
    call.wait_for(2, 0, -1, 30.0, "is_formatted")  # 2 responses, whatever they are
    assert call.responses == 2
    with pytest.raises(QuorumError, match="timed out"):
        call.wait_for(3, 0, -1, 0.2, "is_formatted")


def test_wait_for_max_exceptions() -> None:
    fs = futures(3)
    fs["n0"].set_exception(NodeUnavailableError("x"))
    call = QuorumCall(fs)
    call.wait_for(0, 0, 0, 30.0, "op")  # more than 0 exceptions: returns at once
    with pytest.raises(QuorumError):
        call.wait_for(0, 0, 1, 0.2, "op")


def test_all_answered_without_meeting_the_condition_fails_fast() -> None:
    fs = futures(3)
    for i, f in enumerate(fs.values()):
        f.set_result(i)
    start = time.monotonic()
    with pytest.raises(QuorumError, match="all 3 nodes answered"):
        QuorumCall(fs).wait_for(0, 4, -1, 30.0, "op")
    assert time.monotonic() - start < 5


def test_cancel_cancels_outstanding_futures_only() -> None:
    fs = futures(3)
    fs["n0"].set_result(0)
    running = fs["n1"]
    assert running.set_running_or_notify_cancel()
    call = QuorumCall(fs)
    call.cancel()
    assert fs["n2"].cancelled()
    assert not running.cancelled()
    assert isinstance(call.exceptions["n2"], CancelledError)
    assert call.successes == {"n0": 0}
    running.set_result(1)
    assert call.successes == {"n0": 0, "n1": 1}


def test_result_dicts_are_safe_to_iterate_while_results_arrive() -> None:
    fs = futures(3)
    fs["n0"].set_result(0)
    call = QuorumCall(fs)
    snapshot = call.successes
    it = iter(snapshot.items())
    assert next(it) == ("n0", 0)
    fs["n1"].set_result(1)
    fs["n2"].set_exception(NodeUnavailableError("x"))
    assert list(it) == []  # no "dictionary changed size during iteration"
    assert snapshot == {"n0": 0}
    assert call.successes == {"n0": 0, "n1": 1}
    assert set(call.exceptions) == {"n2"}


def test_empty_call() -> None:
    call: QuorumCall[int] = QuorumCall({})
    assert call.wait_for_all(1.0, "op") == {}
    with pytest.raises(QuorumError):
        call.wait_for_write_quorum(1.0, "op")


def test_futures_from_an_executor() -> None:
    """The shape the logger set uses: one submitted call per node."""
    barrier = threading.Barrier(3)

    def rpc(i: int) -> Callable[[], int]:
        def go() -> int:
            barrier.wait(10)  # all three calls really run concurrently
            if i == 1:
                raise NodeUnavailableError("n1 down")
            return i * 10

        return go

    with ThreadPoolExecutor(3) as pool:
        call = QuorumCall({f"n{i}": pool.submit(rpc(i)) for i in range(3)})
        assert call.wait_for_write_quorum(30.0, "journal") == {"n0": 0, "n2": 20}


# -- property: the outcome is decided by the majority rule alone ----------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=7), st.data())
def test_write_quorum_matches_majority_rule(pattern: list[bool], data: st.DataObject) -> None:
    n = len(pattern)
    fs = futures(n)
    names = list(fs)
    oks = {names[i] for i in range(n) if pattern[i]}
    fails = set(names) - oks
    early = data.draw(st.sets(st.sampled_from(names)), label="done before the call")
    order = data.draw(st.permutations([x for x in names if x not in early]), label="completion order")

    def finish(name: str) -> None:
        if name in oks:
            fs[name].set_result(names.index(name))
        else:
            fs[name].set_exception(NodeUnavailableError(name))

    for name in early:
        finish(name)
    clock = SignallingClock()
    call = QuorumCall(fs, clock=clock)

    def late() -> None:
        assert clock.waiting.wait(10)
        for name in order:
            finish(name)

    t = threading.Thread(target=late, daemon=True)
    t.start()
    dumb_ok = 2 * len(oks) > n
    try:
        got = call.wait_for_write_quorum(30.0, "op")
    except QuorumError as e:
        assert not dumb_ok
        assert set(e.causes) <= fails
        assert set(e.successes) <= oks
        assert len(e.successes) < majority(n)
    else:
        assert dumb_ok
        assert set(got) <= oks
        assert len(got) >= majority(n)
        assert all(got[k] == names.index(k) for k in got)
    finally:
        t.join(10)
    assert not t.is_alive()


def test_stragglers_wait_is_bounded_and_never_an_error() -> None:
    fs = futures(3)
    fs["n0"].set_result(1)
    fs["n1"].set_exception(NodeUnavailableError("down"))
    call = QuorumCall(fs)
    start = time.monotonic()
    assert call.wait_for_stragglers(0.1, "new_epoch") == {"n0": 1}  # n2 silent: the grace expires
    assert time.monotonic() - start < 5
    fs["n2"].set_result(3)
    assert call.wait_for_stragglers(0.1, "new_epoch") == {"n0": 1, "n2": 3}


def test_stragglers_that_answer_while_waited_for_are_included() -> None:
    fs = futures(3)
    fs["n0"].set_result(1)
    fs["n1"].set_result(2)
    clock = SignallingClock()
    call = QuorumCall(fs, clock=clock)
    t = complete_later(clock, [(fs["n2"], 3)])
    assert call.wait_for_stragglers(30.0, "new_epoch") == {"n0": 1, "n1": 2, "n2": 3}
    t.join(5)


def test_stragglers_invariant_violation_is_raised() -> None:
    fs = futures(3)
    fs["n0"].set_result(1)
    fs["n1"].set_result(2)
    fs["n2"].set_exception(InvariantViolation("two histories"))
    with pytest.raises(InvariantViolation):
        QuorumCall(fs).wait_for_stragglers(1.0, "new_epoch")
