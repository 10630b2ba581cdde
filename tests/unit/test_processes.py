"""qjm.testing.processes.stop_process: SIGTERM first, SIGKILL for a child that ignores it."""

from __future__ import annotations

import signal
import subprocess
import sys

from qjm.testing.processes import stop_process

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
