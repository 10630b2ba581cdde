"""Memory of a process as the kernel counts it (``/proc/PID/status``), for tests and the bench that
bound what a download may hold: the resident set sampled while something runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def rss_bytes(pid: int | str = "self") -> int:
    """VmRSS of ``pid`` in bytes (0 if the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_growth(pid: int | str, fn: Callable[[], T], every: float = 0.01) -> tuple[T, int]:
    """``fn()``'s result and how far ``pid``'s resident set grew above where it stood before, at
    the highest of samples taken every ``every`` seconds while ``fn`` ran."""
    base = rss_bytes(pid)
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(every):
            peak = max(peak, rss_bytes(pid))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        out = fn()
    finally:
        done.set()
        t.join()
    return out, max(peak, rss_bytes(pid)) - base
