"""Following a journal by push (design §3.1): committed frames as the nodes learn of them.

A ``Follower`` subscribes to one node at a time (``RemoteLogger.follow``), which pushes whole
frames it knows are committed as its committed txid advances, and heartbeats while nothing moves.
It moves to the next node, resuming at the caller's next txid, when the node fails, goes silent
(no message for ``silence`` seconds: a paused or partitioned node), refuses (it cannot vouch for
that txid: restarted, recovering, purged), or lags (heartbeats only, for ``stall`` seconds, while
another node reports a higher committed txid: a node the writer dropped).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from qjm._native import framing
from qjm.client.channel import RemoteLogger
from qjm.client.manager import QuorumJournalManager
from qjm.client.node_io import FollowStream
from qjm.errors import ConfigError, NotFormattedError, QJMError
from qjm.protocol.frame import FrameHeader
from qjm.protocol.messages import JournalState

log = logging.getLogger("qjm.follow")

_RETRY_FIRST = 0.01  # after every node failed in a row: wait this long, doubling up to ...
_RETRY_MAX = 0.5
_MAX_DOUBLINGS = 6  # 0.01 * 2**6 > _RETRY_MAX


def retry_delay(rounds: int) -> float:
    """The wait after ``rounds`` more failures than nodes: doubling from ``_RETRY_FIRST`` up to
    ``_RETRY_MAX``. The exponent is capped, since an outage of any length may reach it and
    ``2**n`` past about 1,000 overflows a float."""
    return min(_RETRY_FIRST * float(2 ** min(rounds, _MAX_DOUBLINGS)), _RETRY_MAX)


class Follower:
    """Frames of committed records pushed by the nodes, one node at a time. One ``frames`` per
    follower; ``close`` may be called from any thread (it ends a ``frames`` in progress)."""

    def __init__(
        self,
        qjm: QuorumJournalManager,
        *,
        heartbeat: float = 0.25,
        silence: float = 3.0,
        stall: float = 1.0,
        prefer: int = 0,
    ) -> None:
        self.qjm = qjm
        self.nodes = [lg for lg in qjm.loggers.loggers if isinstance(lg, RemoteLogger)]
        if not self.nodes:
            raise TypeError("following needs nodes reached over the network")
        self.heartbeat = heartbeat
        self.silence = silence
        self.stall = stall
        self.failovers = 0
        self.messages = 0  # pushed by the nodes so far, heartbeats included
        self.current_node = ""
        self._turn = prefer % len(self.nodes)
        self._lock = threading.Lock()
        self._call: FollowStream | None = None
        self._heard_at = 0.0
        self._consuming = False
        self._closed = threading.Event()

    def frames(
        self, next_txid: Callable[[], int], stop: threading.Event | None = None
    ) -> Iterator[tuple[bytes, int, FrameHeader]]:
        """``(buffer, offset, header)`` of each committed frame from ``next_txid()`` on, until
        ``stop`` is set or ``close`` is called. A frame may start before ``next_txid()`` (the
        caller skips what it has); a node taken over resumes at ``next_txid()`` as it is then."""
        watchdog = threading.Thread(target=self._watch, args=(stop,), name="qjm-follow-watchdog", daemon=True)
        watchdog.start()
        failed_in_a_row = 0
        refusals: dict[str, QJMError] = {}  # this round's errors no retry can mend
        try:
            while not self._closed.is_set():
                node = self.nodes[self._turn]
                moved = False
                try:
                    for got in self._follow(node, next_txid):
                        moved = True
                        yield got
                except (NotFormattedError, ConfigError) as e:
                    refusals[node.name] = e
                    if len(refusals) == len(self.nodes):  # every node says so: the caller's mistake
                        raise
                except QJMError as e:
                    log.info("following %s from txid %d: %s; trying the next node", node.name, next_txid(), e)
                if self._closed.is_set():
                    return
                if moved:
                    refusals.clear()
                failed_in_a_row = 0 if moved else failed_in_a_row + 1
                self.failovers += 1
                self._turn = (self._turn + 1) % len(self.nodes)
                if failed_in_a_row >= len(self.nodes):
                    self._closed.wait(retry_delay(failed_in_a_row - len(self.nodes)))
        finally:
            self.close()

    def _follow(self, node: RemoteLogger, next_txid: Callable[[], int]) -> Iterator[tuple[bytes, int, FrameHeader]]:
        """One node's push, until it fails, goes silent, lags or the follower stops."""
        call = node.follow(next_txid(), self.heartbeat)
        with self._lock:
            self._call = call
            self._heard_at = time.monotonic()
        self.current_node = node.name
        if self._closed.is_set():
            call.cancel()
        progress_at = time.monotonic()
        try:
            for frames, _first, _last, committed in call:
                now = time.monotonic()
                self._heard_at = now
                self.messages += 1
                if self._closed.is_set():
                    return
                if frames:
                    progress_at = now
                    pos = 0
                    while pos < len(frames):
                        h = framing.verify_frame(frames, pos)
                        # A standby that follows knows the epoch to fence above (qjm.client.shared).
                        self.qjm.note_epoch(h.epoch)
                        self._consuming = True  # the caller's time, not the node's silence
                        try:
                            yield frames, pos, h
                        finally:
                            self._consuming = False
                            # the caller's time is neither the node's silence nor its stall: the
                            # heartbeats queued meanwhile carry the commit point of before
                            self._heard_at = progress_at = time.monotonic()
                        pos += h.frame_len
                elif now - progress_at > self.stall:
                    if self._others_ahead(node, max(committed, next_txid() - 1)):
                        log.info("%s lags the other nodes at txid %d; following another", node.name, committed)
                        return
                    progress_at = now
        finally:
            self._end_call(call)

    def _others_ahead(self, node: RemoteLogger, known: int) -> bool:
        """Another node reports a committed txid past ``known`` (asked in parallel, bounded)."""
        futs = [lg.get_journal_state() for lg in self.nodes if lg is not node]
        deadline = time.monotonic() + self.silence
        for f in futs:
            try:
                st = f.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # an unreachable node is simply not ahead
                continue
            if isinstance(st, JournalState) and st.committed_txid > known:
                return True
        return False

    def _watch(self, stop: threading.Event | None) -> None:
        """End the current node's push when it goes silent; close the follower when ``stop`` is set."""
        tick = min(self.heartbeat, self.silence / 4)
        while not self._closed.wait(tick):
            if stop is not None and stop.is_set():
                self.close()
                return
            with self._lock:
                call, heard = self._call, self._heard_at
            if call is not None and not self._consuming and time.monotonic() - heard > self.silence:
                log.info("%s sent nothing for %.1f s; following another node", call.node, self.silence)
                call.cancel()
                self._silenced(call)

    def _silenced(self, call: FollowStream) -> None:
        with self._lock:
            if self._call is call:
                self._call = None

    def _end_call(self, call: FollowStream | None = None) -> None:
        with self._lock:
            if call is None:
                call = self._call
            if call is self._call:
                self._call = None
        if call is not None:
            call.cancel()

    def close(self) -> None:
        """Stop following (from any thread): a ``frames`` in progress ends."""
        self._closed.set()
        self._end_call()
