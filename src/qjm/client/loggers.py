"""Loggers: the client's view of one node (Hadoop AsyncLogger) and of all of them (AsyncLoggerSet).

Every call returns a ``Future`` at once; ``LoggerSet`` fans a call out and wraps the futures in a
``QuorumCall``. ``RemoteLogger`` (``qjm.client.channel``, gathered by ``qjm.client.remote``) talks
gRPC + TCP to a real node; the simulation supplies in-process loggers with the same interface.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Protocol, TypeVar

from qjm.client.quorum import BatchCall, QuorumCall, majority
from qjm.errors import WriterCrashedError
from qjm.protocol.messages import (
    EditLogManifest,
    JournaledEdits,
    JournalState,
    NamespaceInfo,
    NewEpochResponse,
    PrepareRecoveryResponse,
    SegmentState,
)

T = TypeVar("T")


class CallHooks:
    """Client-side fault points, per node and per operation; no-ops here (see ``qjm.testing.faults``).

    ``before`` may raise to fail a call before anything is sent. ``replied`` runs as each attempt
    of a control call gets its reply; raising ``NodeUnavailableError`` there models a reply lost on
    the way (the node did the call). ``after`` runs once the node has answered; raising
    ``WriterCrashedError`` there models a writer that dies right after that reply. Hooks that
    override ``after`` keep a future per batch (its callback runs ``after``); others let a native
    build count batches over quiet links (``RemoteLogger.native_acks``).
    """

    def before(self, node: str, op: str) -> None:
        """Called before ``op`` is sent to ``node``."""

    def replied(self, node: str, op: str) -> None:
        """Called when ``node``'s reply to one attempt of control call ``op`` arrives."""

    def after(self, node: str, op: str) -> None:
        """Called after ``node`` answered ``op`` successfully."""


class WriterLife:
    """Shared by all loggers of one writer: once crashed, nothing more leaves this writer."""

    def __init__(self) -> None:
        self._crashed = threading.Event()
        self.reason = ""
        self._watchers: list[Callable[[], None]] = []

    def watch(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the writer crashes (a logger set's lane must end with it)."""
        self._watchers.append(fn)

    def crash(self, reason: str) -> None:
        self.reason = reason
        self._crashed.set()
        for fn in list(self._watchers):
            fn()

    @property
    def crashed(self) -> bool:
        return self._crashed.is_set()

    def check(self) -> None:
        if self._crashed.is_set():
            raise WriterCrashedError(f"writer crashed ({self.reason}); it sends nothing more")


class Logger(Protocol):
    """One node, as the writer and readers use it."""

    @property
    def name(self) -> str: ...

    @property
    def source_url(self) -> str:
        """Where other nodes download this node's segments from (accept_recovery's fromURL)."""
        ...

    @property
    def out_of_sync(self) -> bool: ...

    def set_epoch(self, epoch: int) -> None: ...

    def set_committed_txid(self, txid: int) -> None: ...

    def is_formatted(self) -> Future[bool]: ...

    def format(self, ns: NamespaceInfo, force: bool, promised_epoch: int = 0) -> Future[None]: ...

    def get_journal_state(self) -> Future[JournalState]: ...

    def status(self) -> Future[dict[str, object]]: ...

    def new_epoch(self, ns: NamespaceInfo, epoch: int) -> Future[NewEpochResponse]: ...

    def start_log_segment(self, txid: int) -> Future[None]: ...

    def finalize_log_segment(self, start: int, end: int, copy_epoch: int = 0) -> Future[None]: ...

    def purge_logs(self, min_txid_to_keep: int) -> Future[None]: ...

    def admin_purge_logs(self, epoch: int, min_txid_to_keep: int) -> Future[None]:
        """An operator's purge: ``epoch`` is the node's promised epoch as read (design §2.12)."""
        ...

    def prepare_recovery(self, segment: int) -> Future[PrepareRecoveryResponse]: ...

    def accept_recovery(self, state: SegmentState, source_url: str) -> Future[None]: ...

    def get_edit_log_manifest(self, since: int, in_progress_ok: bool) -> Future[EditLogManifest]: ...

    def get_journaled_edits(self, since: int, max_txns: int) -> Future[JournaledEdits]: ...

    def read_segment(self, segment: int) -> Iterator[bytes]:
        """Stream a segment file's bytes (header and frames) in chunks."""
        ...

    def send_batch(self, frame: bytes, first_txid: int, last_txid: int) -> Future[int]:
        """Queue a frame on the data plane; resolves to the txid the node has made durable."""
        ...

    def close(self, grace: float = 0.0) -> None: ...


class SyncLane(Protocol):
    """A transport's sync commit in one call (``LoggerSet.sync_lane``; ``qjm._native.fanout.Lane``).

    ``commit`` sends a batch's frame to every node, waits for a quorum and queues the commit's
    notice; it returns how many nodes acknowledged it (``need`` or more: committed; fewer: the
    wait ended short and the lane is revoked, ``LoggerSet.lane_call`` waits for the rest), -1
    having sent nothing when a node has no room, -2 having sent nothing when the lane is revoked.
    """

    @property
    def need(self) -> int: ...

    @property
    def revoked(self) -> bool: ...

    def commit(self, frame: bytes, last_txid: int, epoch: int, timeout: float) -> int: ...

    def times(self) -> tuple[list[int], float]:
        """(commits made durable per bound of ``qjm.histogram.LATENCY_BUCKETS``, +Inf last; their
        seconds in sum): every commit it made durable, counted once."""
        ...


class LoggerSet:
    """All nodes of one journal: fan-out, quorum waits, the writer's epoch."""

    def __init__(self, loggers: Sequence[Logger]) -> None:
        if not loggers:
            raise ValueError("a journal needs at least one node")
        self.loggers = list(loggers)
        self.epoch = 0

    @property
    def size(self) -> int:
        return len(self.loggers)

    @property
    def majority(self) -> int:
        return majority(len(self.loggers))

    def by_name(self, name: str) -> Logger:
        for lg in self.loggers:
            if lg.name == name:
                return lg
        raise KeyError(name)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        for lg in self.loggers:
            lg.set_epoch(epoch)

    def set_committed_txid(self, txid: int) -> None:
        for lg in self.loggers:
            lg.set_committed_txid(txid)

    def announce_committed(self) -> None:
        """Send the committed txid to the nodes now (design §3.1). A set whose nodes serve no
        followers (the simulator's) sends nothing: its notices go ahead of the next batch."""

    def call(self, fn: Callable[[Logger], Future[T]]) -> QuorumCall[T]:
        return QuorumCall({lg.name: fn(lg) for lg in self.loggers})

    def send_batch(self, frame: bytes, first_txid: int, last_txid: int) -> BatchCall:
        """Send one batch to every node; wait on the result for its quorum."""
        return self.call(lambda lg: lg.send_batch(frame, first_txid, last_txid))

    def sync_lane(self) -> SyncLane | None:
        """A lane for sync commits in one call, where the transport has one (the remote set over
        the engine, every node taking batches with nothing to decide); None: ``send_batch``."""
        return None

    def lane_call(self, lane: SyncLane, last_txid: int) -> BatchCall:
        """The quorum call of a batch whose ``lane.commit`` ended short of a quorum."""
        raise TypeError(f"{type(self).__name__} gives no lanes")

    def close(self, grace: float = 0.0) -> None:
        """Close every logger; ``grace`` bounds the total wait for calls still queued to slow nodes."""
        deadline = time.monotonic() + grace
        for lg in self.loggers:
            lg.close(max(0.0, deadline - time.monotonic()))
