"""A wall-clock deadline for one simulated execution (``execution_deadline``), raising
``DeadlineExceeded`` with the stack that ran past it.

The writers are greenlets in the scheduler's thread, so a writer that blocks on a real lock, event
or future (a harness bug: every wait of the code under test must go through the simulation's
conditions) blocks the scheduler too, and nothing in that thread can time it out. A ``SIGALRM``
can: the handler runs in the blocked thread, between bytecodes or inside the interrupted wait
(Python's lock, condition and socket waits return to run signal handlers), and raises there. So a
search reports such a run as one harness failure, with the writer's stack, instead of hanging.
A loop that never yields is caught the same way.

The alarm is armed once per execution, not per hand-off, so the scheduler's switches stay free of
system calls. It needs the main thread (where Python runs signal handlers); elsewhere the run has
no deadline. An alarm already armed by the caller (pytest-timeout's, say) that would fire first is
left alone; a later one is put back, less the time the run took, when the run ends.
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["DEFAULT_DEADLINE", "HARNESS_FAILURE", "STACK_HEADING", "DeadlineExceeded", "execution_deadline"]

HARNESS_FAILURE = "harness failure"
"""How the violation of a run that ran past its deadline begins: a search's report tells these
apart from the protocol's violations."""

STACK_HEADING = "the stack running at the deadline:"
"""The trace line after which such a run's trace holds the stack the alarm interrupted."""

DEFAULT_DEADLINE = 60.0
"""Seconds one execution may take. Seeds take milliseconds, the longest about a second on a loaded
machine; a minute leaves room for a slow host and still ends a stuck search promptly."""

REPEAT = 1.0
"""Seconds between repeats of the alarm after the deadline, in case the code under test swallows
the first ``DeadlineExceeded`` (an ``except BaseException`` that carries on)."""


class DeadlineExceeded(BaseException):
    """An execution ran past its deadline. Not an ``Exception``: the code under test catches those
    (a writer's ``except Exception`` must not turn a stuck harness into a protocol error)."""

    def __init__(self, seconds: float, stack: list[str]) -> None:
        super().__init__(f"the execution ran past its {seconds:g} s deadline")
        self.seconds = seconds
        self.stack = stack


@contextmanager
def execution_deadline(seconds: float | None) -> Iterator[None]:
    """Raise ``DeadlineExceeded`` in this thread if the block runs longer than ``seconds``."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    if outer_delay and outer_delay <= seconds:
        yield  # the caller's alarm fires first and bounds the run already
        return

    live = True

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        if not live:  # a trip that was pending when the block ended
            return
        stack = traceback.format_stack(frame) if frame is not None else []
        raise DeadlineExceeded(seconds, [ln.rstrip("\n") for part in stack for ln in part.splitlines()])

    start = time.monotonic()
    outer_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT)
    try:
        yield
    finally:
        try:
            live = False
        finally:  # even when the alarm struck just before: the caller's handler and alarm come back
            signal.setitimer(signal.ITIMER_REAL, 0)
            # None: the caller's handler was set outside Python and cannot be put back from here
            signal.signal(signal.SIGALRM, outer_handler if outer_handler is not None else signal.SIG_DFL)
            if outer_delay:
                left = max(outer_delay - (time.monotonic() - start), 1e-3)
                signal.setitimer(signal.ITIMER_REAL, left, outer_interval)
