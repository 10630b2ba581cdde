"""A streaming query's view of the journal's committed end, pushed by the nodes (design §3.1).

The driver side of a stream asks, every trigger, how far the journal is committed and, for the
read-committed view, which segments start with which markers. A ``CommitFeed`` keeps both current
without a round of calls: a ``Follower`` (``qjm.client.follow``) is pushed every committed frame
from the stream's position on, one node at a time, failing over as it does for ``Reader.tail``.
The feed keeps the last txid pushed and the head of each segment whose first frame goes by, and
drops the records: the executors read them, by txid range, from any replica.

It never knows more than the nodes pushed, and they push only committed frames, so its end is never
past the committed txid. With ``majority_loss_timeout`` it also asks every node for its state once
in a while (never more than one call per node in flight), and fails once fewer than a majority
have answered for that long: a paused majority is otherwise indistinguishable from an idle writer.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

from qjm.client.channel import RemoteLogger
from qjm.client.follow import Follower
from qjm.client.manager import QuorumJournalManager
from qjm.config import QJMConfig
from qjm.errors import CorruptFrameError, QJMError, QuorumError
from qjm.protocol.frame import FrameHeader
from qjm.protocol.messages import JournalState
from qjm.spark.journal import OPEN_END, Head, head_marker


class CommitFeed:
    """The committed end and segment heads of a journal from txid ``start`` on, kept by a thread.

    ``heads`` are the segments' heads known when the feed starts (``JournalClient.heads``); the
    feed extends them with every segment that starts later. ``end``/``snapshot``/``wait_for`` may
    be called from any thread; ``close`` stops the feed.
    """

    def __init__(
        self,
        uri: str,
        config: QJMConfig,
        start: int,
        heads: Sequence[Head] = (),
        *,
        majority_loss_timeout: float | None = None,
    ) -> None:
        self.start = start
        self.majority_loss_timeout = majority_loss_timeout
        self.records = 0  # txids pushed past ``start``
        self.bytes = 0  # frame bytes pushed
        self._qjm = QuorumJournalManager(uri, config=config)
        self._follower = Follower(self._qjm)
        self._cond = threading.Condition()
        self._end = start - 1
        self._heads = list(heads)
        self._error: QJMError | None = None
        self._closed = threading.Event()
        self._answered_at: dict[str, float] = {}
        self._probes: dict[str, Future[JournalState]] = {}
        self._majority_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="qjm-spark-feed", daemon=True)
        self._thread.start()
        self._watchdog: threading.Thread | None = None
        if majority_loss_timeout is not None:
            self._watchdog = threading.Thread(target=self._watch, name="qjm-spark-majority", daemon=True)
            self._watchdog.start()

    @property
    def failovers(self) -> int:
        """Times the feed moved to another node (a node died, fell silent, refused or lagged)."""
        return self._follower.failovers

    @property
    def current_node(self) -> str:
        """The node the feed follows now ("" before it reached one)."""
        return self._follower.current_node

    def end(self) -> int:
        """The last txid known committed (``start - 1`` until a frame is pushed); raises the
        feed's error if it stopped on one."""
        return self.snapshot()[0]

    def snapshot(self) -> tuple[int, list[Head]]:
        """The last txid known committed and every segment head up to it, consistent together."""
        with self._cond:
            if self._error is not None:
                raise self._error
            return self._end, list(self._heads)

    def wait_for(self, txid: int, timeout: float) -> int:
        """Block until ``txid`` has been pushed (it must be committed already); the end then.
        Raises ``QuorumError`` after ``timeout`` seconds, or the feed's error if it stops."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._error is None and self._end < txid:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed.is_set():
                    raise QuorumError(f"txid {txid} is committed but no node pushed it within {timeout}s")
                self._cond.wait(left)
            if self._error is not None:
                raise self._error
            return self._end

    def close(self) -> None:
        self._closed.set()
        self._follower.close()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        self._qjm.close()

    # -- the thread that is pushed frames ----------------------------------------------------

    def _run(self) -> None:
        try:
            for buf, pos, h in self._follower.frames(lambda: self._end + 1):
                if self._closed.is_set():
                    return
                self._pushed(buf, pos, h)
        except QJMError as e:
            self._fail(e)
        except Exception as e:  # a bug must stop the stream, not freeze its end silently
            self._fail(QJMError(f"following the journal failed: {e!r}"))

    def _pushed(self, buf: bytes | bytearray, pos: int, h: FrameHeader) -> None:
        if h.last_txid <= self._end:
            return  # the frame the follower resumed in: already counted
        if h.first_txid > self._end + 1:
            raise CorruptFrameError(f"txid gap: expected {self._end + 1}, frame starts at {h.first_txid}")
        head = None
        if h.first_txid == h.segment_txid:
            head = Head(h.segment_txid, OPEN_END, h.epoch, head_marker(buf, pos, h.record_count))
        with self._cond:
            if head is not None and (not self._heads or self._heads[-1].start < head.start):
                last = self._heads[-1] if self._heads else None
                if last is not None and last.end == OPEN_END:  # a new segment ends the one before
                    self._heads[-1] = dataclasses.replace(last, end=head.start - 1)
                self._heads.append(head)
            self.records += h.last_txid - self._end
            self.bytes += h.frame_len
            self._end = h.last_txid
            self._cond.notify_all()

    def _fail(self, error: QJMError) -> None:
        with self._cond:
            if self._error is None and not self._closed.is_set():
                self._error = error
            self._cond.notify_all()
        self._follower.close()

    # -- is a majority there? ----------------------------------------------------------------

    def _watch(self) -> None:
        assert self.majority_loss_timeout is not None
        timeout = self.majority_loss_timeout
        interval = min(1.0, timeout / 4)
        nodes = [lg for lg in self._qjm.loggers.loggers if isinstance(lg, RemoteLogger)]
        need = self._qjm.loggers.majority
        while not self._closed.wait(interval):
            now = time.monotonic()
            for lg in nodes:
                pending = self._probes.get(lg.name)
                if pending is None or pending.done():  # a paused node's call hangs: queue none behind it
                    fut = self._probes[lg.name] = lg.get_journal_state()
                    fut.add_done_callback(functools.partial(self._answered, lg.name))
            times = sorted(self._answered_at.values(), reverse=True)
            if len(times) >= need:  # when a majority last answered: the majority-th latest answer
                self._majority_at = max(self._majority_at, times[need - 1])
            if now - self._majority_at > timeout:
                fresh = [n for n, at in self._answered_at.items() if now - at <= 2 * interval]
                self._fail(
                    QuorumError(
                        f"no majority of the journal's {len(nodes)} nodes answered for {timeout:g}s "
                        f"(option majorityLossTimeout; answering: {', '.join(sorted(fresh)) or 'none'})"
                    )
                )
                return

    def _answered(self, name: str, f: Future[JournalState]) -> None:
        if not f.cancelled() and f.exception() is None:
            self._answered_at[name] = time.monotonic()
