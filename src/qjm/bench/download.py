"""The bench's ``download_rss_mib`` phase (design §4.3): how far the resident set of each process
grows while a large finalized segment is served, caught up by a node that missed it, and read.

Real node processes (``MiniJournalCluster``), sampled through ``/proc/PID/status`` while the
download runs; the reader runs in a process of its own. ``tests/integration/test_bounded_download.py``
runs the same measurement on a smaller segment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import qjm
from qjm.bench.workload import progress
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.rss import rss_bytes, rss_growth
from qjm.testing.util import eventually

RECORD = bytes(4000)
MIB = 1024 * 1024
NODE_LOGGER = "qjm.channel"  # the writer's logger for what happens to one node: "NAME: unreachable (...)"

READER = """
import sys, qjm
from qjm.testing.rss import rss_growth
r = qjm.open_reader(sys.argv[1])
n, grew = rss_growth("self", lambda: sum(1 for _ in r))
print(n, grew)
"""


@contextlib.contextmanager
def node_down_on_purpose(name: str) -> Iterator[None]:
    """While node ``name`` is down on purpose: leave out the writer's warnings about that node (it
    is unreachable, its next segment's start fails), which would read like a failure of the run.
    Its errors, and every record about another node, still show."""

    def keep(record: logging.LogRecord) -> bool:
        return record.levelno != logging.WARNING or not record.getMessage().startswith(f"{name}: ")

    logger = logging.getLogger(NODE_LOGGER)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _write_missed_segment(cluster: MiniJournalCluster, mib: int) -> int:
    """One finalized segment of ``mib`` MiB, written while node 2 is down (stopped once the journal
    is formatted); returns its last txid. Rolling is off: the phase measures one segment of that size."""
    w = qjm.open_writer(cluster.uri, create=True, roll_bytes=0, roll_interval=0)
    progress(f"node 2 stopped on purpose while {mib} MiB are written (the writer's warnings about it are left out)")
    cluster.stop(2)
    n = mib * MIB // len(RECORD)
    w.append_many(RECORD for _ in range(n))
    last = w.sync()
    w.roll()
    w.close()
    return last


def _finalized(cluster: MiniJournalCluster, i: int) -> list[str]:
    return [n for n in os.listdir(cluster.journal_dir(i)) if n.startswith("edits_0") and "." not in n]


def measure_download_rss(base: str, mib: int, timeout: float = 600.0) -> dict[str, float]:
    """Bytes each process grew by (MiB): ``catch_up`` (the node downloading), ``catch_up_serving``
    (the larger of the two nodes it may download from), ``reader`` and ``reader_serving`` (node 0,
    which serves the reader unless it fails over); also the segment's size and the read's time."""
    c = MiniJournalCluster(3, base, sync_interval=1.0)
    # the writer's calls to the stopped node may end after the writer closed: quiet until the end
    with node_down_on_purpose(c.name(2)), c:
        last = _write_missed_segment(c, mib)
        size = os.path.getsize(os.path.join(c.journal_dir(0), _finalized(c, 0)[0]))
        c.start(2)
        progress("node 2 started again: it catches the segment up from another node, then a reader reads it")
        pids = [c.nodes[i].proc.pid for i in range(3)]  # type: ignore[union-attr]
        base_rss = [rss_bytes(p) for p in pids]
        peak = list(base_rss)

        def caught_up() -> bool:
            for k, p in enumerate(pids):
                peak[k] = max(peak[k], rss_bytes(p))
            names = _finalized(c, 2)
            return len(names) == 1 and names[0].endswith(f"{last:019d}")

        eventually(caught_up, timeout=timeout, what="node 2 caught up the segment")
        grew = [p - b for p, b in zip(peak, base_rss, strict=True)]

        def read() -> str:
            cmd = [sys.executable, "-c", READER, c.uri]
            return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=timeout).stdout

        t0 = time.monotonic()
        out, served = rss_growth(pids[0], read)
        seconds = time.monotonic() - t0
        n, reader_grew = map(int, out.split())
        if n != last:
            raise RuntimeError(f"the reader read {n} records, not {last}")
    return {
        "segment_mib": size / MIB,
        "catch_up": grew[2] / MIB,
        "catch_up_serving": max(grew[0], grew[1]) / MIB,
        "reader": reader_grew / MIB,
        "reader_serving": served / MIB,
        "read_seconds": seconds,
    }
