"""A simulated execution stuck outside the simulation is reported as a harness failure, with the stack
it was stuck in, instead of hanging the search; the caller's own alarm survives the deadline."""

from __future__ import annotations

import io
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

import pytest

from qjm.__main__ import main
from qjm.testing.exhaustive import explore, small_worlds
from qjm.testing.faultsim import run_faultsim
from qjm.testing.sim import STACK_HEADING, Simulation, run_seed
from qjm.testing.sim.deadline import DeadlineExceeded, execution_deadline
from qjm.testing.sim.writers import Task

pytestmark = pytest.mark.sim

TOO_SHORT = 1e-4  # seconds: the quickest seed takes over a millisecond, so every run overruns this


@pytest.fixture
def own_alarm() -> Iterator[list[int]]:
    """An alarm of the test's own (as pytest-timeout arms one), put back as it was afterwards."""
    fired: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        fired.append(signum)

    before_handler = signal.signal(signal.SIGALRM, handler)
    before_timer = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, *before_timer)
        signal.signal(signal.SIGALRM, before_handler)


def test_a_writer_blocked_on_a_real_event_is_reported_not_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    never = threading.Event()

    def stuck_writer(self: Simulation, task: Task) -> None:
        never.wait()  # a real wait: the scheduler's thread blocks with this writer

    monkeypatch.setattr(Simulation, "writer_body", stuck_writer)
    r = run_seed(5, deadline=0.5)
    assert not r.ok and r.harness_failure
    assert r.violation is not None and r.violation.startswith("harness failure: the execution ran past its 0.5 s")
    stack = r.trace[r.trace.index(STACK_HEADING) + 1 :]
    assert any("stuck_writer" in ln for ln in stack), stack
    assert any("never.wait()" in ln for ln in stack), stack


def test_a_writer_that_swallows_the_deadline_is_caught_again(monkeypatch: pytest.MonkeyPatch) -> None:
    never = threading.Event()
    swallowed: list[BaseException] = []

    def stubborn_writer(self: Simulation, task: Task) -> None:
        try:
            never.wait()
        except BaseException as e:  # code under test that carries on regardless
            swallowed.append(e)
        never.wait()

    monkeypatch.setattr(Simulation, "writer_body", stubborn_writer)
    r = run_seed(5, deadline=0.2)
    assert r.harness_failure
    assert len(swallowed) == 1 and isinstance(swallowed[0], DeadlineExceeded)


def test_a_search_reports_every_overrun_seed_and_carries_on() -> None:
    out = io.StringIO()
    rep = run_faultsim(range(10, 14), steps=100, use_spark=False, processes=1, out=out, deadline=TOO_SHORT)
    assert rep.seeds == 4 and rep.ok == 0
    assert rep.harness_failures == 4 and sorted(s for s, _, _ in rep.failures) == [10, 11, 12, 13]
    assert all(STACK_HEADING in trace for _, _, trace in rep.failures)
    summary = rep.summary()
    assert "0 violated an invariant, 4 harness failures (ran past the deadline)" in summary
    assert summary.count("FAILING SEED") == 4


def test_the_same_seeds_pass_within_the_default_deadline() -> None:
    rep = run_faultsim(range(10, 14), steps=100, use_spark=False, processes=1, out=io.StringIO())
    assert (rep.ok, rep.harness_failures, rep.failures) == (4, 0, [])


def test_qjm_sim_prints_the_stack_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--seed", "3", "--deadline", str(TOO_SHORT)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("seed 3: harness failure: the execution ran past its 0.0001 s deadline")
    assert out[1] == STACK_HEADING and any(ln.strip().startswith("File ") for ln in out[2:])


@pytest.mark.parametrize("bad", ["0", "-1", "inf", "nan", "soon"])
def test_a_bad_deadline_is_a_clear_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["faultsim", "--seeds", "0:1", "--local", "--deadline", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--deadline" in err and "Traceback" not in err


def test_the_small_world_search_stops_at_a_stuck_execution() -> None:
    e = explore(small_worlds()[0], deadline=TOO_SHORT, time_limit=60)
    assert e.runs == 1 and not e.complete
    [(_path, r)] = e.violations
    assert r.harness_failure and STACK_HEADING in r.trace


def test_a_later_alarm_of_the_caller_comes_back_less_the_time_taken(own_alarm: list[int]) -> None:
    signal.setitimer(signal.ITIMER_REAL, 50.0)
    handler = signal.getsignal(signal.SIGALRM)
    t0 = time.monotonic()
    r = run_seed(1, steps=100, deadline=5.0)
    took = time.monotonic() - t0
    assert r.ok
    assert signal.getsignal(signal.SIGALRM) is handler
    left, _ = signal.getitimer(signal.ITIMER_REAL)
    assert 0 < left <= 50.0 - took + 0.01
    assert own_alarm == []


def test_a_sooner_alarm_of_the_caller_is_left_alone(own_alarm: list[int]) -> None:
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    handler = signal.getsignal(signal.SIGALRM)
    with execution_deadline(60.0):
        assert signal.getsignal(signal.SIGALRM) is handler
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left <= 30.0
    assert signal.getsignal(signal.SIGALRM) is handler


def test_outside_the_main_thread_a_run_has_no_deadline() -> None:
    seen: list[object] = []

    def run() -> None:
        with execution_deadline(TOO_SHORT):
            time.sleep(0.01)  # longer than the deadline; no alarm can be armed here
        seen.append("done")

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert seen == ["done"]
