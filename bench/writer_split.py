"""Where a sync commit's time goes in qjm's writer process: its Python around the one native call.

    python bench/writer_split.py [COMMITS] [DIR]

Starts three real JournalNodes (a ``MiniJournalCluster`` on the disk of DIR, default the system's
temporary directory) and a writer in this process, then times COMMITS sync commits of 1 KiB
(``append`` + ``sync``, default 4000, the first tenth uncounted), each cut in three by timestamps
taken at the edges of the lane's ``commit`` (``qjm._native.fanout.Lane``: the notice, the send,
the nodes' work, the quorum's acks): the writer's Python before it (``append`` included), the
native call, and the writer's Python after it. Prints the medians in µs. The wrapper that takes the
timestamps adds about a microsecond to the Python it frames. A measuring tool, not a test.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any

import qjm
from qjm.testing.minicluster import MiniJournalCluster


class _TimedLane:
    """A lane with its ``commit`` timed; everything else passed through."""

    def __init__(self, lane: Any, marks: list[tuple[int, int]]) -> None:
        self.lane = lane
        self._marks = marks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lane, name)

    def commit(self, *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = self.lane.commit(*args)
        self._marks.append((t0, time.perf_counter_ns()))
        return out


def main(commits: int = 4000, where: str | None = None) -> None:
    native: list[tuple[int, int]] = []
    outer: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory(dir=where) as base, MiniJournalCluster(3, base) as c:
        w = qjm.open_writer(c.uri, create=True)
        loggers = w.qjm.loggers
        inner_lane, inner_call = loggers.sync_lane, loggers.lane_call

        def timed_lane() -> Any:
            lane = inner_lane()
            return None if lane is None else _TimedLane(lane, native)

        def lane_call(lane: Any, last_txid: int) -> Any:
            return inner_call(lane.lane, last_txid)

        loggers.sync_lane = timed_lane  # type: ignore[method-assign]
        loggers.lane_call = lane_call  # type: ignore[method-assign]
        rec = os.urandom(1024)
        for _ in range(commits):
            t0 = time.perf_counter_ns()
            w.append(rec)
            w.sync()
            outer.append((t0, time.perf_counter_ns()))
        w.close()
    n = commits - commits // 10
    if len(native) < n:
        sys.exit(f"only {len(native)} of {commits} commits took the one native call: nothing to split")
    o, e = outer[-n:], native[-n:]

    def med(xs: list[int]) -> float:
        return statistics.median(xs) / 1000

    print(f"{n} sync commits of 1 KiB, medians (µs):")
    print(f"  whole commit          {med([b - a for a, b in o]):7.1f}")
    print(f"  writer, before        {med([ee[0] - oo[0] for oo, ee in zip(o, e, strict=True)]):7.1f}")
    print(f"  native Lane.commit    {med([b - a for a, b in e]):7.1f}")
    print(f"  writer, after         {med([oo[1] - ee[1] for oo, ee in zip(o, e, strict=True)]):7.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000, sys.argv[2] if len(sys.argv) > 2 else None)
