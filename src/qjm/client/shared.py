"""Process-wide client resources: one gRPC channel per node address, one pool of call threads,
and the newest epoch seen per journal.

Why: a failover that made its own channels (a TCP connect and an HTTP/2 handshake each, one per
node) and its own thread pools, whose threads start on the first call, would spend about 2 ms of a
10 ms budget before the first byte reached a node. Shared, they are already there for a standby
that reads the journal, or for a process that writes several journals. Channels are
reference-counted and closed with their last user; the threads are the pool's and stay.

The epoch hint spares a failover its get_journal_state round: a process that has seen a journal's
epoch (its own writer, a reader following the open segment, a refusal) proposes above it directly.
A hint is only a guess: new_epoch still refuses anything not above each node's promise, and a
refused guess falls back to asking the nodes.

Per-node ordering is kept: ``SerialExecutor`` runs one logger's calls one at a time in submission
order (Hadoop's single-threaded executor per logger) on the shared threads.

After ``fork()`` the child drops what it inherited (threads do not survive a fork and gRPC
channels must not be used across one) and builds its own on first use.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc
import grpc._channel  # grpc imports it on the first channel: see below

from qjm.protocol.rpcmeta import make_stub, open_channel
from qjm.security.tls import TlsConfig

__all__ = [
    "EPOCH_HINTS",
    "EpochHints",
    "PooledExecutor",
    "SerialExecutor",
    "acquire_channel",
    "release_channel",
    "workers",
]

T = TypeVar("T")

# Threads are made only when no idle one is free, and then kept. The bound must exceed the calls
# that can block at once (a hung node holds a thread for its timeout), so it is generous.
POOL_THREADS = 256

# grpc.insecure_channel imports grpc._channel on its first call, several milliseconds of a cold
# process's failover (design §1.4): imported above, with the module, instead.

log = logging.getLogger("qjm.shared")


class _Workers:
    """Threads that run plain callables, made when none is idle and kept after.

    Not a ``ThreadPoolExecutor``: that makes a ``Future`` per call, and the executors here already
    make the one future their caller needs (CPU per call is what a failover is short of).
    """

    def __init__(self, limit: int) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job nobody has claimed them for
        self._backlog = 0  # jobs queued while every thread was busy and no new one was allowed
        self._threads = 0
        self._limit = limit

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job`` (which must not raise) on an idle thread, or a new one, or the first to free up."""
        with self._lock:
            spawn = False
            if self._idle:
                self._idle -= 1  # claimed: that thread takes this job (or an equal one)
            elif self._threads < self._limit:
                self._threads += 1
                spawn = True
            else:
                self._backlog += 1
            self._queue.put(job)
        if spawn:
            threading.Thread(target=self._loop, name=f"qjm-call-{self._threads}", daemon=True).start()

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            try:
                job()
            except BaseException:  # a job reports through its future; this is a bug in the job
                log.exception("qjm: a node call's runner failed")
            with self._lock:
                if self._backlog:
                    self._backlog -= 1  # a job already waits in the queue for this thread
                else:
                    self._idle += 1


_lock = threading.Lock()
_workers: _Workers | None = None
_channels: dict[tuple[str, tuple[tuple[str, Any], ...], TlsConfig | None], tuple[grpc.Channel, Any, int]] = {}


def workers() -> _Workers:
    """The shared threads that run node calls."""
    global _workers
    with _lock:
        if _workers is None:
            _workers = _Workers(POOL_THREADS)
        return _workers


def _run_into(fut: Future[T], fn: Callable[[], T]) -> None:
    if not fut.set_running_or_notify_cancel():
        return
    try:
        result = fn()
    except BaseException as e:  # the caller's future carries every failure
        fut.set_exception(e)
    else:
        fut.set_result(result)


def acquire_channel(
    address: str, options: tuple[tuple[str, Any], ...], tls: TlsConfig | None = None
) -> tuple[grpc.Channel, Any]:
    """The process's channel to ``address`` and its QJournal stub (made on first use: a stub costs
    more CPU to build than a whole failover's calls); pair with ``release_channel``."""
    key = (address, options, tls)
    with _lock:
        if key in _channels:
            ch, stub, refs = _channels[key]
        else:
            ch = open_channel(address, list(options), tls)
            stub, refs = make_stub(ch), 0
        _channels[key] = (ch, stub, refs + 1)
        return ch, stub


def release_channel(address: str, options: tuple[tuple[str, Any], ...], tls: TlsConfig | None = None) -> None:
    """Drop one use of a channel; the last one closes it."""
    key = (address, options, tls)
    with _lock:
        ch, stub, refs = _channels[key]
        if refs > 1:
            _channels[key] = (ch, stub, refs - 1)
            return
        del _channels[key]
    ch.close()


def channel_users(address: str, options: tuple[tuple[str, Any], ...], tls: TlsConfig | None = None) -> int:
    """How many users hold the channel to ``address`` (0: none open)."""
    with _lock:
        entry = _channels.get((address, options, tls))
        return 0 if entry is None else entry[2]


def _after_fork_in_child() -> None:
    global _workers, _lock
    _lock = threading.Lock()
    _workers = None  # its threads stayed in the parent
    _channels.clear()  # the parent's sockets: never closed from here


os.register_at_fork(after_in_child=_after_fork_in_child)


class EpochHints:
    """The newest epoch seen per journal (key: its node addresses and id); only ever grows.

    ``enabled=False`` remembers nothing: every writer asks the nodes (a new process would).
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[tuple[str, ...], str], int] = {}
        self._enabled = enabled

    def note(self, key: tuple[tuple[str, ...], str], epoch: int) -> None:
        with self._lock:
            if self._enabled and epoch > self._seen.get(key, 0):
                self._seen[key] = epoch

    def get(self, key: tuple[tuple[str, ...], str]) -> int:
        with self._lock:
            return self._seen.get(key, 0)

    def snapshot(self) -> tuple[tuple[tuple[tuple[str, ...], str], int], ...]:
        with self._lock:
            return tuple(sorted(self._seen.items()))

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()


EPOCH_HINTS = EpochHints()


class _Executor:
    """What both executors share: a lock, and refusing calls after shutdown."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shut = False

    def _admit(self) -> None:
        """Lock held: refuse a call after shutdown."""
        if self._shut:
            raise RuntimeError("cannot schedule new calls after shutdown")


class SerialExecutor(_Executor):
    """Runs submitted calls one at a time, in submission order, on the shared pool."""

    def __init__(self) -> None:
        super().__init__()
        self._queue: collections.deque[tuple[Future[Any], Callable[[], Any]]] = collections.deque()
        self._running = False

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        with self._lock:
            self._admit()
            self._queue.append((fut, fn))
            if self._running:
                return fut
            self._running = True
        workers().run(self._drain)
        return fut

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._running = False
                    return
                fut, fn = self._queue.popleft()
            _run_into(fut, fn)

    def shutdown(self, *, cancel_futures: bool = False) -> None:
        """Refuse new calls; with ``cancel_futures``, cancel the queued ones (a running one finishes)."""
        with self._lock:
            self._shut = True
            dropped = list(self._queue) if cancel_futures else []
            if cancel_futures:
                self._queue.clear()
        for fut, _ in dropped:
            fut.cancel()


class PooledExecutor(_Executor):
    """Calls that may run side by side (reads) on the shared pool; shutdown cancels the unstarted."""

    def __init__(self) -> None:
        super().__init__()
        self._pending: set[Future[Any]] = set()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        with self._lock:
            self._admit()
            self._pending.add(fut)
        fut.add_done_callback(self._done)
        workers().run(lambda: _run_into(fut, fn))
        return fut

    def _done(self, fut: Future[Any]) -> None:
        with self._lock:
            self._pending.discard(fut)

    def shutdown(self, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            pending = list(self._pending) if cancel_futures else []
        for fut in pending:
            fut.cancel()
