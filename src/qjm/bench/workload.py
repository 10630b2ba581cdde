"""What every side of ``qjm bench`` measures, and how: the workloads, the run lengths, the percentile.

The floor, qjm and the peers run the same two workloads: sync-commit latency of one
``LATENCY_RECORD``-byte record with one batch outstanding, and pipelined throughput of records of
each of ``RECORD_SIZES`` bytes. ``FULL`` and ``SMOKE`` say how long each part runs.

Every figure is measured in phases: one warm-up phase that is not counted (a cold JVM, the first
segment files, connections still opening), then ``phases`` counted ones. The figure is the median
of the counted phases and its spread their minimum and maximum (``spread``); the JSON keeps every
phase. Failover figures are the median and interquartile range of their repetitions, each its own
small run.
"""

from __future__ import annotations

import glob
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from qjm.protocol.frame import FRAME_HEADER_SIZE, RECORD_PREFIX_SIZE

RECORD_SIZES: Final = (100, 1024)
LATENCY_RECORD: Final = 1024
BATCH_BYTES: Final = 64 * 1024  # the Writer's default batch_bytes
# the networked round in Python processes (qjm.bench.pyfloor): with no protocol, and over qjm's wire
PYTHON_FLOORS: Final = ("py", "bare")

# latency rounds per phase, seconds per throughput phase, counted phases (each part adds one
# warm-up phase), failover repetitions (warm and cold), records whose tail staleness is measured,
# records read back one by one and packed, pairs of phases with and without automatic rolls
FULL: Final = {
    "rounds": 1000, "seconds": 2.0, "phases": 3, "failovers": 15, "cold_failovers": 9, "tail_rounds": 1000,
    "read_records": 200_000, "roll_pairs": 5,
}  # fmt: skip
SMOKE: Final = {
    "rounds": 30, "seconds": 0.2, "phases": 2, "failovers": 2, "cold_failovers": 1, "tail_rounds": 20,
    "read_records": 5000, "roll_pairs": 2,
}  # fmt: skip
FAILOVER_WARMUP: Final = 3  # takeovers run before the counted ones (after the throughput phases)
ROLL_EVERY: Final = 1.0  # seconds between the writer's own rolls in the roll variant (roll_interval)
ROLL_RECORD: Final = 1024  # record size of the roll variant's pipelined phases
ROLL_PHASE_LIMIT: Final = 5  # a rolling phase whose roll has not come ends after this many roll periods
PURE_SCALE: Final = 0.5  # the pure run is slow: fewer latency rounds (throughput phases are timed anyway)


def pct(values: list[float], p: float) -> float:
    """The ``p`` quantile of ``values`` (nearest rank), NaN for no values."""
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))] if s else float("nan")


T = TypeVar("T")

PROGRESS: Final = "qjm bench: "  # the prefix of a worker's progress lines on stderr, which the driver shows


def progress(message: str, step: bool = True) -> None:
    """One progress line on stderr (a worker's stderr reaches the user only through these lines);
    a ``step`` of a part is indented under the part's own line."""
    print(f"{PROGRESS}{'  ' if step else ''}{message}", file=sys.stderr, flush=True)


def phased(cfg: dict[str, float], what: str, measure: Callable[[], T]) -> tuple[T, list[T]]:
    """``measure`` once as a warm-up, then ``cfg["phases"]`` times counted: (warm-up, counted)."""
    progress(f"{what}: warm-up phase")
    warm = measure()
    counted = []
    for i in range(int(cfg["phases"])):
        progress(f"{what}: phase {i + 1}/{int(cfg['phases'])}")
        counted.append(measure())
    return warm, counted


def spread(phases: Sequence[float]) -> dict[str, Any]:
    """A figure measured in counted ``phases``: their median, minimum and maximum, and every phase."""
    if not phases:
        nan = float("nan")
        return {"median": nan, "min": nan, "max": nan, "phases": []}
    return {"median": statistics.median(phases), "min": min(phases), "max": max(phases), "phases": list(phases)}


def iqr(samples: Sequence[float]) -> dict[str, Any]:
    """A figure measured as repeated small runs (failovers): median, interquartile range, every run."""
    return {"median": pct(list(samples), 0.5), "q1": pct(list(samples), 0.25), "q3": pct(list(samples), 0.75),
            "runs": list(samples)}  # fmt: skip


def records_per_batch(size: int) -> int:
    """How many records of ``size`` bytes the Writer puts in one batch (closed at BATCH_BYTES)."""
    return -(-BATCH_BYTES // (size + RECORD_PREFIX_SIZE))


def disk_bytes_per_record(size: int) -> float:
    """What one record of ``size`` bytes costs in a segment: its length prefix and its share of the
    frame header of the Writer's batches."""
    return size + RECORD_PREFIX_SIZE + FRAME_HEADER_SIZE / records_per_batch(size)


def roll_every(cfg: dict[str, float]) -> float:
    """The roll variant's roll_interval: ``ROLL_EVERY``, or less in a smoke run's short phases."""
    return min(ROLL_EVERY, cfg["seconds"] / 2)


def process_cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, kernel) CPU seconds so far of process ``pid``, every thread included (``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # fields from the 3rd on: utime, stime are 14, 15
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def voluntary_switches(pid: int) -> int:
    """Voluntary context switches so far of process ``pid``, every live thread included (``/proc``):
    each is a wait (a recv, a disk wait, a lock) that put a thread to sleep."""
    total = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(status) as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except FileNotFoundError:
            pass  # a thread that ended between the listing and the read
    return total


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """(user, kernel) CPU seconds so far of this process and of ``pids``, every thread included."""
    t = os.times()
    user, kernel = t.user, t.system
    for pid in pids:
        u, k = process_cpu_seconds(pid)
        user += u
        kernel += k
    return user, kernel


def cpu_per_record(before: tuple[float, float], after: tuple[float, float], records: int) -> dict[str, float]:
    return {
        "cpu_user_ns": (after[0] - before[0]) / records * 1e9,
        "cpu_kernel_ns": (after[1] - before[1]) / records * 1e9,
    }


def median_cpu(phases: list[dict[str, float]]) -> dict[str, float]:
    """The median over counted phases of each CPU-per-record figure of ``cpu_per_record``."""
    return {k: statistics.median(c[k] for c in phases) for k in phases[0]} if phases else {}
