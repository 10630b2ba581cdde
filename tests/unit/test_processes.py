"""qjm.testing.processes: a child's ready line, or why there is none; SIGTERM first, then SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from qjm.testing.processes import NotReady, read_ready_line, stop_process

# The child says "ready" only once its SIGTERM disposition is set, so the test never races it.
CHILD = """
import signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(120)
"""


def child(on_term: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, on_term], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_a_child_that_exits_on_sigterm_is_not_killed() -> None:
    with child("default") as proc:
        stop_process(proc, 60)
    assert proc.returncode == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    with child("ignore") as proc:
        stop_process(proc, 0.2)
    assert proc.returncode == -signal.SIGKILL


def test_a_child_that_already_exited_is_left_as_it_ended() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    stop_process(proc, 60)
    assert proc.returncode == 3


def piped(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def test_the_ready_line_is_read_whole_even_when_it_arrives_in_pieces() -> None:
    code = (
        "import sys, time; sys.stdout.write('READY a'); sys.stdout.flush(); time.sleep(0.05); print(' b', flush=True)"
    )
    with piped(code) as proc:
        assert read_ready_line(proc, 60) == b"READY a b\n"


def test_a_child_that_exits_before_its_ready_line_says_how_it_exited() -> None:
    with piped("raise SystemExit(3)") as proc, pytest.raises(NotReady, match="exited with 3"):
        read_ready_line(proc, 60)


def test_a_child_that_says_nothing_is_not_ready_after_the_timeout() -> None:
    with piped("import time; time.sleep(120)") as proc:
        with pytest.raises(NotReady, match=r"not ready in 0\.2 s"):
            read_ready_line(proc, 0.2)
        assert proc.poll() is None  # left running for the caller to stop
        stop_process(proc, 60)
