"""wait_for_stop in a child process of its own (signals are process-wide): it returns the first stop
signal's name whichever thread the kernel handed the signal to, and a signal that lands the moment
the wait begins is not lost. Synchronisation is by the child's lines on a pipe, never by sleeping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

WAIT = 30.0

CHILD = """
import signal, sys, threading
from qjm.stop_signal import wait_for_stop

how = sys.argv[1]
# A thread that only sleeps, started while SIGTERM is open to every thread.
threading.Thread(target=threading.Event().wait, daemon=True).start()

def ready():
    if how == "other-thread":
        # From here the kernel can hand SIGTERM only to the sleeping thread: the main thread's own
        # wait is never interrupted by it.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    print("ready", flush=True)

print(wait_for_stop(on_ready=ready), flush=True)
"""


def _child(how: str) -> subprocess.Popen[bytes]:
    # Unbuffered: readline takes the "ready" line alone, leaving the rest for communicate.
    p = subprocess.Popen([sys.executable, "-c", CHILD, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n", p.stderr.read() if p.stderr else b""
    return p


def _result(p: subprocess.Popen[bytes]) -> str:
    out, err = p.communicate(timeout=WAIT)
    assert p.returncode == 0, err.decode()
    return out.decode().strip()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_first_stop_signal_is_named(sig: signal.Signals) -> None:
    p = _child("main")
    os.kill(p.pid, sig)
    assert _result(p) == sig.name


def test_a_signal_taken_by_another_thread_still_ends_the_wait() -> None:
    p = _child("other-thread")
    os.kill(p.pid, signal.SIGTERM)
    assert _result(p) == "SIGTERM"


def test_a_signal_right_as_the_wait_begins_is_not_lost() -> None:
    for _ in range(10):
        p = _child("main")
        os.kill(p.pid, signal.SIGTERM)  # the child may not have reached its select yet
        assert _result(p) == "SIGTERM"
