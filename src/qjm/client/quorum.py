"""Waiting for a quorum of per-node futures (design §5.1.2, reference §3.3).

A ``QuorumCall`` wraps one future per node. Each future reports itself through a done-callback that
records the result and wakes the waiters of a ``threading.Condition``; ``wait_for`` only ever
sleeps in ``Condition.wait`` and re-checks its stop conditions on every wake-up. Results that arrive
after a wait returned still update the call, so the ``wait_for_*`` helpers hand back copies, and
``successes`` / ``exceptions`` are replaced rather than mutated, so they are safe to iterate from any
thread while late results come in.

Both kinds of batch wait (``QuorumCall`` over futures, ``qjm.client.link_batch.LinkBatch`` over
native links) and the simulator decide with the same ``tally`` and give up at the same
``Deadline``, which is extended after a pause of the waiting thread as Hadoop's QuorumCall does
(HDFS-10733): a process stopped past the deadline (GC, SIGSTOP, a suspended VM) has not given the
nodes the time the timeout promised them.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import Generic, Protocol, TypeVar

from qjm.errors import InvariantViolation, QuorumError

__all__ = ["PAUSE_FRACTION", "BatchCall", "Deadline", "Outcome", "QuorumCall", "majority", "tally"]

log = logging.getLogger("qjm.quorum")

T = TypeVar("T")


def majority(n: int) -> int:
    """Smallest number of nodes that intersects every other majority of ``n`` nodes."""
    if n < 0:
        raise ValueError(f"node count must be >= 0, got {n}")
    return n // 2 + 1


class Outcome(enum.Enum):
    WON = "won"
    LOST = "lost"
    PENDING = "pending"


def tally(nodes: int, need: int, succeeded: int, failed: int) -> Outcome:
    """Where a call to ``nodes`` nodes stands once ``succeeded`` of them hold it and ``failed`` cannot:
    won at ``need`` successes, lost once more than ``nodes - need`` failed, else still pending."""
    if succeeded >= need:
        return Outcome.WON
    if failed > nodes - need:
        return Outcome.LOST
    return Outcome.PENDING


PAUSE_FRACTION = 0.3
"""A gap in the waiting thread longer than this share of the timeout is taken as a pause of the
process, not as time the nodes had (Hadoop's WAIT_PROGRESS_INFO_THRESHOLD)."""


class Deadline:
    """When a quorum wait gives up; extended by every pause of the waiting thread.

    The waiter asks ``remaining()`` before each wait and then waits at most that long. A clock
    reading further on than the previous reading plus the wait asked for means the thread did not
    run meanwhile: if that gap passes ``PAUSE_FRACTION`` of the timeout, the deadline moves by the
    gap, so answers that came in during the pause (or right after it) are still taken.
    """

    __slots__ = ("_asked", "_clock", "_last", "at", "paused", "timeout")

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
        self.timeout = timeout
        self.at = now + timeout
        self.paused = 0.0  # total pause time added
        self._last = now
        self._asked = 0.0

    def remaining(self) -> float:
        """Seconds left (<= 0: time is up); the caller then waits at most that long."""
        now = self._clock()
        gap = now - self._last - self._asked
        if gap > PAUSE_FRACTION * self.timeout:
            self.at += gap
            self.paused += gap
            log.info("a pause of %.3fs while waiting for a quorum: the deadline moves by as much", gap)
        self._last = now
        left = self.at - now
        self._asked = max(left, 0.0)
        return left


class BatchCall(Protocol):
    """What a writer waits on for one batch: a ``QuorumCall`` of per-node futures, or a
    ``qjm.client.link_batch.LinkBatch`` counted over the native links."""

    def wait_for_write_quorum(self, timeout: float, op: str) -> Mapping[str, int]: ...

    def wait_for_all(self, timeout: float, op: str) -> Mapping[str, int]: ...


class QuorumCall(Generic[T]):
    """One RPC sent to several nodes: node name -> future of that node's reply."""

    def __init__(self, futures: Mapping[str, Future[T]], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._futures: dict[str, Future[T]] = dict(futures)
        self._clock = clock
        self._cond = threading.Condition()
        self.successes: dict[str, T] = {}
        self.exceptions: dict[str, BaseException] = {}
        for name, fut in self._futures.items():
            fut.add_done_callback(partial(self._on_done, name))  # runs at once if already done

    @property
    def node_count(self) -> int:
        return len(self._futures)

    @property
    def responses(self) -> int:
        with self._cond:
            return len(self.successes) + len(self.exceptions)

    def _on_done(self, name: str, fut: Future[T]) -> None:
        try:
            value = fut.result()
        except CancelledError as e:
            error: BaseException | None = e
        except BaseException as e:  # every failure of a node is a result to record
            error = e
        else:
            error = None
        with self._cond:
            # Copy on write: a caller iterating a dict it read earlier never sees it change size.
            if error is None:
                self.successes = {**self.successes, name: value}
            else:
                self.exceptions = {**self.exceptions, name: error}
            self._cond.notify_all()

    def _raise_invariant_violation(self) -> None:
        """Like Hadoop rethrowing AssertionErrors: a broken protocol invariant is never outvoted."""
        for name in sorted(self.exceptions):
            e = self.exceptions[name]
            if isinstance(e, InvariantViolation):
                raise e

    def wait_for(self, min_responses: int, min_successes: int, max_exceptions: int, timeout: float, op: str) -> None:
        """Block until one stop condition holds (reference §3.3).

        Stops when responses >= ``min_responses`` (if > 0), successes >= ``min_successes`` (if > 0)
        or exceptions > ``max_exceptions`` (if >= 0). Raises ``QuorumError`` on timeout, and also at
        once when every node has answered without meeting a condition (waiting could not help).
        Raises a node's ``InvariantViolation`` as soon as it is seen.
        """
        with self._cond:
            deadline = Deadline(timeout, self._clock)
            while True:
                self._raise_invariant_violation()
                ok, nok = len(self.successes), len(self.exceptions)
                if (
                    (min_responses > 0 and ok + nok >= min_responses)
                    or (min_successes > 0 and ok >= min_successes)
                    or (max_exceptions >= 0 and nok > max_exceptions)
                ):
                    return
                if ok + nok == len(self._futures):
                    raise self._error(f"{op}: all {len(self._futures)} nodes answered ({ok} succeeded, {nok} failed)")
                remaining = deadline.remaining()
                if remaining <= 0:
                    raise self._error(
                        f"{op}: timed out after {timeout:g}s waiting for nodes to respond "
                        f"({ok} succeeded, {nok} failed of {len(self._futures)})"
                    )
                self._cond.wait(remaining)

    def _error(self, message: str) -> QuorumError:
        return QuorumError(message, successes=dict(self.successes), causes=dict(self.exceptions))

    def wait_for_write_quorum(self, timeout: float, op: str) -> dict[str, T]:
        """Wait until a majority succeeded (or can no longer succeed); return a copy of the successes.

        With 3 nodes this returns at 2 successes and fails at 2 failures, without waiting for the
        third node (unlike Hadoop, which waits for a third failure, reference §3.3).
        """
        n = len(self._futures)
        need = majority(n)
        if n == 0:
            raise QuorumError(f"{op}: no nodes to ask")
        self.wait_for(n, need, n - need, timeout, op)
        with self._cond:
            if tally(n, need, len(self.successes), len(self.exceptions)) is not Outcome.WON:
                raise self._error(f"{op}: {len(self.successes)} of {n} nodes succeeded, {need} needed")
            return dict(self.successes)

    def wait_for_stragglers(self, grace: float, op: str) -> dict[str, T]:
        """Give the nodes that have not answered up to ``grace`` seconds more; return a copy of the
        successes then. For shortcuts that need every node's answer but must never wait on a dead
        node: a timeout is not an error here. A node's ``InvariantViolation`` still raises.
        """
        try:
            self.wait_for(len(self._futures), 0, -1, grace, op)
        except QuorumError:
            pass
        with self._cond:
            return dict(self.successes)

    def wait_for_all(self, timeout: float, op: str) -> dict[str, T]:
        """Every node must succeed (format and friends); fails at the first exception."""
        n = len(self._futures)
        if n == 0:
            return {}
        self.wait_for(n, n, 0, timeout, op)
        with self._cond:
            if tally(n, n, len(self.successes), len(self.exceptions)) is not Outcome.WON:
                raise self._error(f"{op}: {len(self.exceptions)} of {n} nodes failed, all must succeed")
            return dict(self.successes)

    def cancel(self) -> None:
        """Cancel every future that has not started; running ones finish and are still recorded."""
        for fut in self._futures.values():
            fut.cancel()
