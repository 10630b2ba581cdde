"""Stub of the compiled write gate; same API as ``gate_py`` (checked by mypy.stubtest)."""

from collections.abc import Callable, Sequence
from typing import Any

from typing_extensions import Buffer, disjoint_base

@disjoint_base
class WriteGate:
    """The write side of one open segment (``qjm._native.gate_py.WriteGate``'s twin).

    ``stager``, a native ``segment_io.Appender`` behind ``appender``, takes the frames in place;
    without one they go through ``appender.append``. This twin times syncs with CLOCK_MONOTONIC and
    ignores ``clock``; it counts them per bound as ``qjm.histogram.Histogram.observe`` does.
    """

    epoch: int
    committed: int
    hook: Callable[[int], None] | None
    sync_data: bool
    noticed: int

    def __init__(
        self,
        appender: Any,
        start: int,
        *,
        stager: Any = None,
        bounds: Sequence[float] = (),
        clock: Callable[[], float] = ...,
    ) -> None: ...
    @property
    def start(self) -> int: ...
    @property
    def next_txid(self) -> int:
        """The txid the next frame must start at once everything staged is durable."""
    @property
    def last_epoch(self) -> int:
        """The epoch of the last durable frame (the segment's, as far as this gate wrote it)."""
    @property
    def staged_txid(self) -> int:
        """The last txid staged and not yet durable; 0 when nothing is."""
    def stage(self, frame: Buffer) -> bool:
        """Stage ``frame`` if it passes: whole and intact, of the admitted epoch, of this segment, at
        the next txid. False (nothing staged) otherwise; the journal's checks then say why."""
    def stage_checked(self, frame: Buffer, epoch: int, first: int, last: int) -> None:
        """Stage ``frame``, which the journal checked itself (``stage`` refused it)."""
    def note(self, epoch: int, txid: int) -> bool:
        """A commit notice: taken (True) if of the admitted epoch, else left to the journal (False)."""
    def sync(self, ack: Callable[[int], None] | None = None) -> int:
        """Make everything staged durable with one sync, ``ack`` its last txid, then keep its index
        and counters; returns the durable txid (``next_txid - 1``). A failed sync raises with the
        frames still staged: the journal then drops the open segment."""
    def take_index(self) -> list[tuple[int, int, int, int]]:
        """The durable frames since the last call, (first, last, offset, length) each, in order."""
    def take_stats(self) -> tuple[int, int, int, int, list[int], float, float]:
        """The counters since the last call, (batches, txns, bytes, lagging batches, sync-time
        counts per bound (+Inf last), their sum, wall clock of the last), and zero them."""
