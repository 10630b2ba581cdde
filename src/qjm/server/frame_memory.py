"""The node's budget of memory for unfinished frames, shared by every data-plane connection.

A connection's receiver holds one buffer; past a base size (one receive chunk) it grows only to
hold a frame whose header it has read, and it asks this budget first. The writer's batches are far
smaller than the base, so the budget is touched by large frames only: a client that declares
64 MiB frames on many connections and sends them slowly cannot grow the node past the budget.
A receiver that cannot get memory waits up to ``wait`` seconds for others to give some back, then
its connection is refused with ``ResourceExhaustedError``.
"""

from __future__ import annotations

import threading
import time

from qjm.errors import ResourceExhaustedError


class FrameMemory:
    def __init__(self, limit: int, wait: float) -> None:
        self.limit = limit
        self.wait = wait
        self._used = 0
        self._cond = threading.Condition()
        self.refusals = 0

    @property
    def used(self) -> int:
        with self._cond:
            return self._used

    def take(self, n: int) -> None:
        """Reserve ``n`` bytes, waiting up to ``wait`` seconds; raises ResourceExhaustedError."""
        deadline = time.monotonic() + self.wait
        with self._cond:
            while self._used + n > self.limit:
                left = deadline - time.monotonic()
                if left <= 0 or n > self.limit:
                    self.refusals += 1
                    raise ResourceExhaustedError(
                        f"no memory for a frame of {n} more bytes: unfinished frames on this node already hold "
                        f"{self._used} of {self.limit} bytes (frame_memory)"
                    )
                self._cond.wait(left)
            self._used += n

    def give(self, n: int) -> None:
        with self._cond:
            self._used -= n
            self._cond.notify_all()
