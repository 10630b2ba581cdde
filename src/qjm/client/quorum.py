"""Waiting for a quorum of per-node futures (design §5.1.2, reference §3.3).

A ``QuorumCall`` wraps one future per node. Each future reports itself through a done-callback that
records the result and wakes the waiters of a ``threading.Condition``; ``wait_for`` only ever
sleeps in ``Condition.wait`` and re-checks its stop conditions on every wake-up. Results that arrive
after a wait returned still update the call, so the ``wait_for_*`` helpers hand back copies, and
``successes`` / ``exceptions`` are replaced rather than mutated, so they are safe to iterate from any
thread while late results come in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import Generic, Protocol, TypeVar

from qjm.errors import InvariantViolation, QuorumError

__all__ = ["BatchCall", "QuorumCall", "majority"]

T = TypeVar("T")


def majority(n: int) -> int:
    """Smallest number of nodes that intersects every other majority of ``n`` nodes."""
    if n < 0:
        raise ValueError(f"node count must be >= 0, got {n}")
    return n // 2 + 1


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
            deadline = self._clock() + timeout
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
                remaining = deadline - self._clock()
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
            if len(self.successes) < need:
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
            if self.exceptions or len(self.successes) < n:
                raise self._error(f"{op}: {len(self.exceptions)} of {n} nodes failed, all must succeed")
            return dict(self.successes)

    def cancel(self) -> None:
        """Cancel every future that has not started; running ones finish and are still recorded."""
        for fut in self._futures.values():
            fut.cancel()
