"""A writer's data-plane link to one node: the ``DataLink`` protocol and what its implementations share.

A link carries one segment's batches to one node and learns the node's cumulative acks; the first
failure (a refusal from the node, a broken connection, a full window) ends it, and the logger marks
the node out of sync until its next segment (design §4). Two implementations:
``qjm.client.threaded_link.ThreadedLink`` (a sender and a receiver thread, pure Python) and
``qjm.client.fanout_link.FanoutLink`` (the native epoll engine, one thread for every link). Both
track their futures with ``PendingBatches``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Protocol

from qjm import errors
from qjm.client.node_state import CommitNotice
from qjm.errors import FencedError
from qjm.protocol import wire

__all__ = ["DataLink", "LinkBugs", "LinkFailed", "PendingBatches", "encode_commit"]


class LinkBugs(Protocol):
    """The test-only switch a link reads (``qjm.testing.bugs.ProtocolBugs`` has it)."""

    @property
    def fenced_refusal_counts_as_ack(self) -> bool: ...


class DataLink(Protocol):
    """One node's data-plane connection for one segment."""

    name: str
    failed: BaseException | None
    """Why the link ended, once it has (read for every batch counted: a plain attribute)."""

    def send(self, frame: bytes, last_txid: int, fut: Future[int], commit: CommitNotice | None) -> None:
        """Send a batch; ``fut`` resolves to the node's cumulative ack covering it, or fails."""
        ...

    def send_untracked(self, frame: bytes, last_txid: int, commit: CommitNotice | None) -> None:
        """Send a batch without a future (quiet native links); its outcome is read from
        ``acked_txid`` and ``failed``."""
        ...

    def send_notice(self, notice: bytes) -> None:
        """Send a COMMIT notice on its own, between batches (nothing to acknowledge)."""
        ...

    def engine_id(self) -> int | None:
        """This link's id in the shared engine, for batches its caller sends through the engine
        itself (``Fanout.sync_batch``); None when the link cannot take batches that way (not a
        quiet engine link, or ended)."""
        ...

    def acked_txid(self) -> int:
        """Highest txid the node has acknowledged as durable on this link, even after it failed."""
        ...

    def fold_latencies(self) -> None:
        """Hand the send-to-ack times this link measured since the last call to the ``on_latencies``
        it was opened with (links that time nothing: nothing to do)."""
        ...

    def unacked_bytes(self) -> int:
        """Bytes of the batches sent on this link that the node has not acknowledged."""
        ...

    def wait_for_room(self, nbytes: int, limit: int, stall: float) -> None:
        """Wait while ``nbytes`` more would put more than ``limit`` bytes in flight, as long as the
        node keeps acknowledging: a node that acknowledges nothing for ``stall`` seconds is left to
        the limit (which drops it). Returns as soon as the link has failed."""
        ...

    def wait_idle(self, timeout: float) -> None:
        """Wait (bounded) until the node has answered every batch sent on this link, or it failed."""
        ...

    def close(self) -> None:
        """Batches still pending fail (the node may or may not have them); then release the link."""
        ...


LinkFailed = Callable[[DataLink, BaseException], None]
"""Called once when a link fails (also when it is closed with batches pending)."""

LatencySink = Callable[[list[int], float], None]
"""Given the send-to-ack times a link measured: frames per bound of ``qjm.histogram.LATENCY_BUCKETS``
(+Inf last), and their sum in seconds."""


def encode_commit(commit: CommitNotice | None) -> bytes | None:
    """The COMMIT message for a notice (None: no notice to send)."""
    return None if commit is None else wire.encode_commit(*commit)


class PendingBatches:
    """The futures of the batches sent on one link, completed by the node's cumulative acks.

    ``complete`` and ``fail`` run on the thread that reads the node's replies; ``add`` on the
    sender's. The first failure fails every batch still pending and every later ``add``.
    """

    def __init__(self, bugs: LinkBugs | None = None) -> None:
        self._bugs = bugs  # test-only switches; None is the correct client
        self.lock = threading.Lock()
        self.progress = threading.Condition(self.lock)  # an ack or the failure
        self._pending: collections.deque[tuple[int, Future[int], int]] = collections.deque()
        self.queued_bytes = 0
        self.acked = 0
        self.failed: BaseException | None = None

    def add(self, last_txid: int, fut: Future[int], nbytes: int) -> bool:
        """Track a batch about to be sent (lock held); False (and ``fut`` failed) once the link failed."""
        if self.failed is not None:
            fut.set_exception(self.failed)
            return False
        self._pending.append((last_txid, fut, nbytes))
        self.queued_bytes += nbytes
        return True

    def __bool__(self) -> bool:
        return bool(self._pending)

    def last(self) -> Future[int] | None:
        with self.lock:
            return self._pending[-1][1] if self._pending else None

    def complete(self, txid: int) -> None:
        """The node holds everything through ``txid``."""
        done: list[Future[int]] = []
        with self.lock:
            self.acked = max(self.acked, txid)
            while self._pending and self._pending[0][0] <= txid:
                _, fut, n = self._pending.popleft()
                self.queued_bytes -= n
                done.append(fut)
            self.progress.notify_all()
        for fut in done:
            if not fut.done():
                fut.set_result(txid)

    def take_replies(self, buf: bytearray, name: str) -> None:
        """Apply the node's whole replies at the head of ``buf`` (consumed) and leave a partial one.

        An ACK completes the batches through its txid. An ERROR completes those through the durable
        txid it reports, then raises the node's typed error: the link has failed."""
        while True:
            msg, used = wire.parse_reply(buf)
            if msg is None:
                return
            del buf[:used]
            if isinstance(msg, wire.Ack):
                self.complete(msg.txid)
                continue
            self.complete(msg.durable_txid)
            e = errors.from_code(msg.code, f"{name}: {msg.message}")
            if isinstance(e, FencedError) and self._bugs is not None and self._bugs.fenced_refusal_counts_as_ack:
                with self.lock:
                    last = self._pending[-1][0] if self._pending else 0
                self.complete(last)
            raise e

    def fail(self, e: BaseException) -> bool:
        """Fail what is pending with ``e``; False if the link had failed already."""
        with self.lock:
            if self.failed is not None:
                return False
            self.failed = e
            pending = list(self._pending)
            self._pending.clear()
            self.queued_bytes = 0
            self.progress.notify_all()
        for _, fut, _ in pending:
            if not fut.done():
                fut.set_exception(e)
        return True

    def wait_for_room(self, nbytes: int, limit: int, stall: float) -> None:
        """``DataLink.wait_for_room`` over the bytes tracked here."""
        with self.lock:
            acked, since = self.acked, time.monotonic()
            while self.failed is None and self.queued_bytes > 0 and self.queued_bytes + nbytes > limit:
                now = time.monotonic()
                if self.acked != acked:
                    acked, since = self.acked, now
                elif now - since >= stall:
                    return
                self.progress.wait(since + stall - now)

    def wait_idle(self, timeout: float) -> None:
        last = self.last()
        if last is not None:
            wait([last], timeout=timeout)
