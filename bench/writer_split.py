"""Where a sync commit's time goes in qjm's writer process: its Python around the one native call.

    python bench/writer_split.py [COMMITS] [DIR]

Starts three real JournalNodes (a ``MiniJournalCluster`` on the disk of DIR, default the system's
temporary directory) and a writer in this process, then times COMMITS sync commits of 1 KiB
(``append`` + ``sync``, default 4000, the first tenth uncounted), each cut in five by timestamps
taken at its layers' edges: the writer's own Python before the logger set's ``sync_batch``
(``append`` included), the logger set's Python before the engine's ``Fanout.sync_batch`` (its
claim on the nodes' links checked, or taken again when a node's state changed), the native call
(send, the nodes' work, the quorum's acks), the logger set's Python after it and the writer's
after that. Prints the medians in µs. The wrappers that take the
timestamps add about a microsecond to the Python they frame. A measuring tool, not a test.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any

import qjm
from qjm.client import fanout_link
from qjm.testing.minicluster import MiniJournalCluster


class _TimedEngine:
    """The engine's fan-out with its ``sync_batch`` timed; everything else passed through."""

    def __init__(self, fanout: Any, marks: list[tuple[int, int]]) -> None:
        self._fanout = fanout
        self._marks = marks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fanout, name)

    def sync_batch(self, *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = self._fanout.sync_batch(*args)
        self._marks.append((t0, time.perf_counter_ns()))
        return out


def main(commits: int = 4000, where: str | None = None) -> None:
    native: list[tuple[int, int]] = []
    logger_set: list[tuple[int, int]] = []
    outer: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory(dir=where) as base, MiniJournalCluster(3, base) as c:
        w = qjm.open_writer(c.uri, create=True)
        engine = fanout_link.shared_engine()
        engine.fanout = _TimedEngine(engine.fanout, native)
        loggers = w.qjm.loggers
        inner_sync = loggers.sync_batch

        def timed_sync_batch(*args: Any) -> Any:
            t0 = time.perf_counter_ns()
            out = inner_sync(*args)
            logger_set.append((t0, time.perf_counter_ns()))
            return out

        loggers.sync_batch = timed_sync_batch  # type: ignore[method-assign,assignment]
        rec = os.urandom(1024)
        for _ in range(commits):
            t0 = time.perf_counter_ns()
            w.append(rec)
            w.sync()
            outer.append((t0, time.perf_counter_ns()))
        w.close()
    n = commits - commits // 10
    if len(native) < n or len(logger_set) < n:
        sys.exit(f"only {len(native)} of {commits} commits took the one native call: nothing to split")
    o, s, e = outer[-n:], logger_set[-n:], native[-n:]

    def med(xs: list[int]) -> float:
        return statistics.median(xs) / 1000

    print(f"{n} sync commits of 1 KiB, medians (µs):")
    print(f"  whole commit          {med([b - a for a, b in o]):7.1f}")
    print(f"  writer, before        {med([ls[0] - oo[0] for oo, ls in zip(o, s, strict=True)]):7.1f}")
    print(f"  logger set, before    {med([ee[0] - ls[0] for ls, ee in zip(s, e, strict=True)]):7.1f}")
    print(f"  native sync_batch     {med([b - a for a, b in e]):7.1f}")
    print(f"  logger set, after     {med([ls[1] - ee[1] for ls, ee in zip(s, e, strict=True)]):7.1f}")
    print(f"  writer, after         {med([oo[1] - ls[1] for oo, ls in zip(o, s, strict=True)]):7.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000, sys.argv[2] if len(sys.argv) > 2 else None)
