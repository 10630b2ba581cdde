"""Waiting for the signal that stops a long-running command (SIGTERM, SIGINT).

The handlers only record the signal. A handler runs between two bytecodes of the main thread,
which may be inside a lock's critical section at that moment (``threading.Event.wait`` holds its
condition's lock on the way in and out), so a handler that took a lock, as ``Event.set`` does,
could deadlock the process on a signal that lands there. And a signal the kernel hands to another
thread does not interrupt the main thread's blocking wait at all. So the main thread sleeps on the
wakeup fd (``signal.set_wakeup_fd``), which the C-level handler writes in whatever thread took the
signal, and looks at least once a second besides.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable, Iterable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
LOOK_EVERY = 1.0  # seconds: the longest a recorded signal can wait for the main thread to see it


def wait_for_stop(signals: Iterable[signal.Signals] = STOP_SIGNALS, on_ready: Callable[[], None] | None = None) -> str:
    """Install handlers for ``signals``, call ``on_ready``, and return the name of the first of them
    to arrive. Main thread only (as ``signal.signal``). The handlers stay installed: a second signal
    while the caller shuts down is recorded and ignored."""
    got: list[int] = []

    def record(signum: int, _frame: object) -> None:
        got.append(signum)  # no lock: see the module's doc

    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    old_fd = signal.set_wakeup_fd(w)
    try:
        for sig in signals:
            signal.signal(sig, record)
        if on_ready is not None:
            on_ready()
        while not got:
            select.select([r], [], [], LOOK_EVERY)
            try:
                os.read(r, 512)
            except BlockingIOError:
                pass
        return signal.Signals(got[0]).name
    finally:
        signal.set_wakeup_fd(old_fd)
        os.close(r)
        os.close(w)
