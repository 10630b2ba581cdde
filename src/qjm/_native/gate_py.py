"""Pure-Python write gate of a node's open segment (twin of ``gate_c``).

A ``WriteGate`` holds what each of a writer's frames is checked against before a byte of it is
written (the epoch admitted, the open segment, the next txid), stages the frames that pass into
the segment's appender, makes them durable with one sync, acks, and keeps what the journal learns
from each durable run (the frames' index, the counters of its stats) until the journal takes them.
A frame or notice the gate does not pass is left to the journal's own checks, which say why
(design §1.3): the gate decides only the common case, and decides it the same way.

Written as the simplest correct code: the native twin does the same with the receive buffer's
bytes in place, no Python object per frame, and nothing after the ack but counters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from qjm._native.framing_py import verify_frame_ids
from qjm.errors import QJMError
from qjm.histogram import Histogram

Buffer = bytes | bytearray | memoryview

# (batches, txns, bytes, lagging batches, sync-time counts per bound (+Inf last), their sum, wall clock of the last)
GateStats = tuple[int, int, int, int, list[int], float, float]

MAX_BOUNDS = 32  # the native twin's fixed array of bounds (qjm.histogram's default has 16)


class WriteGate:
    """The write side of one open segment; see the module's docstring.

    ``appender`` is the segment's, just created (``qjm.server.storage.SegmentAppender``: ``size``,
    ``append``, ``sync``), and ``start`` its first txid; ``stager`` a ``segment_io.Appender`` the
    native twin may copy frames into in place (the same file's, or None: this twin ignores it).
    ``bounds`` are the sync-time histogram's upper bounds in seconds; ``clock`` times the syncs.
    """

    def __init__(
        self,
        appender: Any,
        start: int,
        *,
        stager: Any = None,
        bounds: Sequence[float] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if start < 1:
            raise ValueError(f"a segment starts at txid 1 or later, not {start}")
        if len(bounds) > MAX_BOUNDS:
            raise ValueError(f"a gate takes at most {MAX_BOUNDS} bounds, not {len(bounds)}")
        self._appender = appender
        self._start = start
        self._next = start
        self._last_epoch = 0
        self._bounds = tuple(bounds)
        self._clock = clock
        # Frames must carry ``epoch`` to pass (0: none passes); set by the journal under its lock.
        self.epoch = 0
        # A frame ending at or below ``committed`` was on a quorum before it came: "written while lagging".
        self.committed = 0
        # Called with each frame's first txid before the frame is staged (the simulation's crash points).
        self.hook: Callable[[int], None] | None = None
        # False only for a protocol bug the fault search must catch (an ack without the sync).
        self.sync_data = True
        self.noticed = 0  # the highest commit notice of the admitted epoch this gate passed
        self._staged: list[tuple[int, int, int, int]] = []  # (first, last, offset, length) not yet durable
        self._staged_epoch = 0
        self._index: list[tuple[int, int, int, int]] = []  # durable frames the journal has not taken
        self._lock = threading.Lock()  # the counters below: a scrape takes them without the journal's lock
        self._stats = self._zero_stats()

    def _zero_stats(self) -> list[Any]:
        return [0, 0, 0, 0, Histogram(self._bounds), 0.0]

    @property
    def start(self) -> int:
        return self._start

    @property
    def next_txid(self) -> int:
        """The txid the next frame must start at once everything staged is durable."""
        return self._next

    @property
    def last_epoch(self) -> int:
        """The epoch of the last durable frame (the segment's, as far as this gate wrote it)."""
        return self._last_epoch

    @property
    def staged_txid(self) -> int:
        """The last txid staged and not yet durable; 0 when nothing is."""
        return self._staged[-1][1] if self._staged else 0

    def _expected(self) -> int:
        return self._staged[-1][1] + 1 if self._staged else self._next

    def stage(self, frame: Buffer) -> bool:
        """Stage ``frame`` if it passes: whole and intact, of the admitted epoch, of this segment, at
        the next txid. False (nothing staged) otherwise; the journal's checks then say why."""
        try:
            epoch, segment, first, last = verify_frame_ids(frame)
        except QJMError:
            return False
        if self.epoch == 0 or epoch != self.epoch or segment != self._start or first != self._expected():
            return False
        if last >= 1 << 64:  # as the native twin, whose txids are 64-bit: the journal says why
            return False
        self.stage_checked(frame, epoch, first, last)
        return True

    def stage_checked(self, frame: Buffer, epoch: int, first: int, last: int) -> None:
        """Stage ``frame``, which the journal checked itself (``stage`` refused it)."""
        if self.hook is not None:
            self.hook(first)
        offset = self._appender.size
        self._appender.append(bytes(frame))
        self._staged.append((first, last, offset, len(frame)))
        self._staged_epoch = epoch

    def note(self, epoch: int, txid: int) -> bool:
        """A commit notice: taken (True) if of the admitted epoch, else left to the journal (False)."""
        if self.epoch == 0 or epoch != self.epoch:
            return False
        self.noticed = max(self.noticed, txid)
        return True

    def sync(self, ack: Callable[[int], None] | None = None) -> int:
        """Make everything staged durable with one sync, ``ack`` its last txid, then keep its index
        and counters; returns the durable txid (``next_txid - 1``). A failed sync raises with the
        frames still staged: the journal then drops the open segment."""
        if not self._staged:
            return self._next - 1
        started = self._clock()
        if self.sync_data:
            self._appender.sync()
        seconds = self._clock() - started
        durable = self._staged[-1][1]
        try:
            if ack is not None:
                ack(durable)
        finally:
            self._fold(seconds)
        return durable

    def _fold(self, seconds: float) -> None:
        staged, self._staged = self._staged, []
        self._index.extend(staged)
        self._next = staged[-1][1] + 1
        self._last_epoch = self._staged_epoch
        head, tail = staged[0], staged[-1]
        lagging = sum(1 for f in staged if f[1] <= self.committed)
        with self._lock:
            s = self._stats
            s[0] += len(staged)
            s[1] += tail[1] - head[0] + 1
            s[2] += tail[2] + tail[3] - head[2]
            s[3] += lagging
            s[4].observe(seconds)
            s[5] = time.time()

    def take_index(self) -> list[tuple[int, int, int, int]]:
        """The durable frames since the last call, (first, last, offset, length) each, in order."""
        out, self._index = self._index, []
        return out

    def take_stats(self) -> GateStats:
        """The counters since the last call (``GateStats``), and zero them."""
        with self._lock:
            s, self._stats = self._stats, self._zero_stats()
        return (s[0], s[1], s[2], s[3], s[4].counts, s[4].total, s[5])
