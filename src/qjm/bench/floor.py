"""The disk's floor of ``qjm bench``: the node's write pattern with no network and no protocol.

``worker_floor`` runs three concurrent local appenders, one per node directory, doing exactly the
node's write pattern (the same frames, the same preallocated O_DIRECT segment files through
``qjm._native.segment_io``, one fdatasync per batch). A commit of the floor is the second of the
three appenders to finish (a quorum of three). Its failover is the disk work a node does for fence
+ recover + first commit of a log in sync (promise written in place, finalize, writer epoch in
place, new preallocated segment, first append), three directories at once.

``run_c_floors`` builds and runs ``bench/netfloor/netfloor.c`` (from a source checkout with a C
compiler): the same disk pattern in plain C, locally and as a writer with three receiver processes
on loopback (2 of 3 acks, no protocol, no Python): how close to the floor any implementation with a
network hop can get on this machine. Beside it, run for run, the same networked round in Python
processes (``qjm.bench.pyfloor``): with no protocol, and over qjm's wire and native receiver.
"""

from __future__ import annotations

import functools
import itertools
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from qjm._native import framing, segment_io
from qjm.bench.workload import (
    FULL,
    LATENCY_RECORD,
    PYTHON_FLOORS,
    RECORD_SIZES,
    SMOKE,
    cpu_per_record,
    cpu_seconds,
    median_cpu,
    phased,
    progress,
    records_per_batch,
    spread,
)
from qjm.server.durable_long import fsync_dir as _fsync_dir


def _frame(records: list[bytes], first: int) -> bytes:

    return framing.encode_frame(records, epoch=1, segment_txid=1, first_txid=first)


def _segment_header() -> bytes:

    return framing.encode_segment_header(1, 1)


def _three(fn: Callable[[int], None]) -> None:
    errs: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except BaseException as e:
            errs.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]


def floor_latency(base: str, rounds: int, name: str = "lat") -> list[float]:
    """Commit latency of 1 KiB batches: per round, the second of three concurrent appenders."""
    apps = [segment_io.Appender(os.path.join(base, f"{name}{i}"), _segment_header()) for i in range(3)]
    frame = _frame([os.urandom(LATENCY_RECORD)], 1)
    lat = [[0.0] * rounds for _ in range(3)]
    barrier = threading.Barrier(3)

    def appender(i: int) -> None:
        a = apps[i]
        for k in range(rounds):
            barrier.wait()
            t = time.perf_counter()
            a.append(frame)
            a.sync()
            lat[i][k] = time.perf_counter() - t

    _three(appender)
    for a in apps:
        a.close()
    return [sorted(lat[i][k] for i in range(3))[1] for k in range(rounds)]


def _three_appenders(base: str, name: str, frame: bytes, seconds: float) -> list[tuple[int, float]]:
    """Three appenders (``name``-0..2 under ``base``) appending ``frame`` with one fdatasync each
    for ``seconds``, started together; (frames written, seconds taken) of each."""
    out = [(0, 0.0)] * 3
    barrier = threading.Barrier(3)

    def appender(i: int) -> None:
        a = segment_io.Appender(os.path.join(base, f"{name}-{i}"), _segment_header())
        barrier.wait()
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < seconds:
            a.append(frame)
            a.sync()
            n += 1
        out[i] = (n, time.perf_counter() - t0)
        a.close()

    _three(appender)
    return out


def floor_throughput(base: str, size: int, seconds: float, name: str = "") -> tuple[float, dict[str, float]]:
    """Records/s of the quorum: three appenders each writing full batches, one fdatasync per batch;
    and the CPU they spent per record (per replica set, like the writer's records)."""
    per = records_per_batch(size)
    before = cpu_seconds([])
    done = _three_appenders(base, name or f"tput{size}", _frame([os.urandom(size)] * per, 1), seconds)
    cpu = cpu_per_record(before, cpu_seconds([]), sum(n for n, _ in done) * per // 3)
    return sorted(n * per / e for n, e in done)[1], cpu


CEILING_RECORDS = 1020  # 1 KiB records per frame of the bandwidth ceiling: frames of about 1 MiB


def floor_bandwidth(base: str, seconds: float) -> float:
    """Bytes/s of the quorum when batches are large: three appenders writing ~1 MiB frames, one
    fdatasync each, with the node's write pattern (preallocation included). No per-batch cost is
    left to amortise, so this is the most the disk carries for three replicas, whatever the code."""
    frame = _frame([os.urandom(1024)] * CEILING_RECORDS, 1)
    return sorted(n * len(frame) / e for n, e in _three_appenders(base, "ceiling", frame, seconds))[1]


def floor_raw_bandwidth(base: str, seconds: float) -> float:
    """Bytes/s of three threads appending 1 MiB O_DIRECT writes to files they extend, one fdatasync
    each: the disk's bandwidth with no preallocation and no qjm code at all."""
    rates = [0.0, 0.0, 0.0]
    barrier = threading.Barrier(3)

    def writer(i: int) -> None:
        fd = os.open(os.path.join(base, f"raw-{i}"), os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
        with mmap.mmap(-1, 1 << 20) as buf:  # page-aligned, as O_DIRECT wants
            buf.write(os.urandom(1 << 20))
            barrier.wait()
            t0 = time.perf_counter()
            n = 0
            while time.perf_counter() - t0 < seconds:
                n += os.pwrite(fd, buf, n)
                os.fdatasync(fd)
            rates[i] = n / (time.perf_counter() - t0)
        os.close(fd)

    _three(writer)
    return sorted(rates)[1]


def _slot_file(path: str) -> int:
    """An epoch file as the node keeps it (qjm.server.durable_long): 8 KiB, overwritten in place."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, bytes(8192))
    os.fsync(fd)
    return fd


def _slot_write(fd: int, k: int) -> None:
    os.pwrite(fd, b"%4096d" % k, (k % 2) * 4096)
    os.fdatasync(fd)


class TakeoverDisk:
    """The durable disk work one node does for a takeover of a log in sync, round by round.

    Takeover ``k`` (from 0) finalizes segment ``k`` and starts segment ``k + 1``. The rounds are
    the writer's: ``promise`` (new_epoch: the promise written in place; no accept round, no paxos
    record), ``finalize`` (cut the preallocation, fsync, rename, fsync the directory) and ``start``
    (the writer epoch in place, a new preallocated segment, fsync of the directory), then
    ``first_commit`` (one 1 KiB frame appended and fdatasynced). ``floor_failover`` runs them back
    to back; ``qjm.bench.control_floor`` runs each inside the gRPC round that asks for it."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.record = _frame([os.urandom(LATENCY_RECORD)], 1)
        self._promised = _slot_file(os.path.join(directory, "last-promised-epoch"))
        self._writer = _slot_file(os.path.join(directory, "last-writer-epoch"))
        self._new: segment_io.Appender | None = None
        old = segment_io.Appender(self._segment(0), _segment_header())
        old.append(self.record)
        old.sync()
        old.close()

    def _segment(self, k: int) -> str:
        return os.path.join(self.dir, f"seg-{k}")

    def promise(self, k: int) -> None:
        _slot_write(self._promised, k)

    def finalize(self, k: int) -> None:
        seg = self._segment(k)
        fd = os.open(seg, os.O_RDWR)
        try:
            os.ftruncate(fd, len(self.record) + 64)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(seg, seg + ".done")
        _fsync_dir(self.dir)

    def start(self, k: int) -> None:
        self.release()
        _slot_write(self._writer, k)
        self._new = segment_io.Appender(self._segment(k + 1), _segment_header())
        _fsync_dir(self.dir)

    def first_commit(self) -> None:
        assert self._new is not None, "start comes first"
        self._new.append(self.record)
        self._new.sync()

    def release(self) -> None:
        """Close the new segment's file (outside the timed work: a close is no durable step)."""
        if self._new is not None:
            self._new.close()
            self._new = None

    def close(self) -> None:
        self.release()
        os.close(self._promised)
        os.close(self._writer)


def floor_failover(base: str, reps: int) -> list[float]:
    """The durable disk work of fence + recover + first commit on a node, three nodes at once."""
    lat = [[0.0] * reps for _ in range(3)]
    barrier = threading.Barrier(3)

    def node(i: int) -> None:
        disk = TakeoverDisk(os.path.join(base, f"fo{i}"))
        try:
            for k in range(reps):
                barrier.wait()
                t = time.perf_counter()
                disk.promise(k)
                disk.finalize(k)
                disk.start(k)
                disk.first_commit()
                lat[i][k] = time.perf_counter() - t
                disk.release()
        finally:
            disk.close()

    _three(node)
    return [sorted(lat[i][k] for i in range(3))[1] for k in range(reps)]


def worker_floor(base: str, cfg: dict[str, float]) -> dict[str, Any]:
    """The floor's raw samples, in the shape of ``qjm.bench.workers.worker_qjm``'s."""
    phase = itertools.count()
    rounds = int(cfg["rounds"])
    out: dict[str, Any] = {}
    latency_cpu: list[dict[str, float]] = []

    def latency() -> list[float]:
        before = cpu_seconds([])
        lat = floor_latency(base, rounds, f"lat{next(phase)}-")
        latency_cpu.append(cpu_per_record(before, cpu_seconds([]), len(lat)))
        return lat

    out["latency_warmup"], out["latency"] = phased(cfg, "floor sync latency", latency)
    out["latency_cpu"] = median_cpu(latency_cpu[1:])  # per commit, the three appenders

    def tput(size: int) -> tuple[float, dict[str, float]]:
        return floor_throughput(base, size, cfg["seconds"], f"t{next(phase)}")

    for size in RECORD_SIZES:
        warm, counted = phased(cfg, f"floor {size} B records/s", functools.partial(tput, size))
        out[f"tput{size}_warmup"], out[f"tput{size}"] = warm[0], [r for r, _ in counted]
        out[f"tput{size}_cpu"] = median_cpu([c for _, c in counted])
    progress("floor: the disk's bandwidth ceiling")
    out["ceiling_bps"] = floor_bandwidth(base, cfg["seconds"])
    try:
        out["raw_ceiling_bps"] = floor_raw_bandwidth(base, cfg["seconds"])
    except OSError as e:  # a file system that refuses O_DIRECT: the appender's ceiling stands alone
        out["raw_ceiling_error"] = str(e)
    progress("floor: failover disk work")
    out["failover"] = floor_failover(base, max(3, int(cfg["failovers"])))
    return out


NETFLOOR_WARMUP = 200  # rounds netfloor.c runs before it counts; qjm.bench.pyfloor runs as many
# run one after the other in each run: C local and networked, then the Python floors
NETWORKED_FLOORS = ("local", "net", *PYTHON_FLOORS)


def _netfloor_source() -> str | None:
    """``bench/netfloor/netfloor.c`` of a source checkout (a wheel does not ship it)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "..", "bench", "netfloor", "netfloor.c")
    return os.path.normpath(path) if os.path.isfile(path) else None


class FloorSkipped(Exception):
    """The C floors cannot run here; the message says why."""


def build_netfloor(base: str) -> str:
    """``bench/netfloor``'s binary, compiled into ``base``; its path. Raises ``FloorSkipped`` where
    there is no source checkout or no C compiler, ``RuntimeError`` if it does not compile."""
    src = _netfloor_source()
    cc = shutil.which("gcc") or shutil.which("cc")
    if src is None or cc is None:
        why = "no source checkout (bench/netfloor/netfloor.c)" if src is None else "no C compiler (gcc/cc)"
        raise FloorSkipped(why)
    exe = os.path.join(base, "netfloor")
    flags = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]
    done = subprocess.run([cc, *flags, "-o", exe, src], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"qjm bench: compiling {src} failed:\n{done.stderr[-4000:]}")
    return exe


def networked_floor(exe: str, mode: str, directory: str, rounds: int, settle: bool) -> dict[str, float]:
    """One run of a networked floor (a ``NETWORKED_FLOORS`` mode: C through ``exe``, Python through
    ``qjm.bench.pyfloor``) in a fresh ``directory`` it removes after: ``p50_us``, ``p99_us`` and
    ``cpu_us`` (per commit), over ``rounds`` after its own warm-up rounds; ``settle``: on a disk
    with no writeback pending (``os.sync`` first)."""
    rounds += NETFLOOR_WARMUP
    os.makedirs(directory)
    try:
        if settle:
            os.sync()
        if mode in PYTHON_FLOORS:
            r = _run_json([sys.executable, "-m", "qjm.bench.pyfloor", mode, directory, str(rounds)], f"pyfloor {mode}")
            cpu = r["cpu_us"]  # from its first fork: a Python process's start-up is not a commit's
        else:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            r = _run_json([exe, mode, directory, str(rounds)], f"netfloor {mode}")
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # netfloor and the receivers it reaps
            # per commit (netfloor's: set-up and warm-up rounds included)
            cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / rounds * 1e6
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"p50_us": r["p50_us"], "p99_us": r["p99_us"], "cpu_us": cpu}


# run right before each of qjm's sync-latency phases, so each phase has its own floors beside it
BESIDE_FLOORS = ("net", "bare")


def floors_beside(exe: str, base: str, rounds: int, settle: bool) -> dict[str, float]:
    """The ``BESIDE_FLOORS`` once each (``networked_floor``), in fresh directories under ``base``:
    ``{mode}_p50_us`` and ``{mode}_p99_us``. ``qjm bench`` runs them right before each of qjm's
    sync-latency phases: the floors swing from minute to minute on a shared machine (the C floor's
    p50 by a quarter between runs), and a floor measured a minute away would carry that swing into
    the phase's ratio."""
    out: dict[str, float] = {}
    for mode in BESIDE_FLOORS:
        r = networked_floor(exe, mode, os.path.join(base, f"beside-{mode}"), rounds, settle)
        out[f"{mode}_p50_us"], out[f"{mode}_p99_us"] = r["p50_us"], r["p99_us"]
    return out


def run_c_floors(base: str, smoke: bool, exe: str) -> dict[str, Any]:
    """The C reference of ``bench/netfloor`` in this run (``exe``, from ``build_netfloor``): its
    local floor (three threads, the same disk pattern, no network) and its networked floor (a writer
    and three receiver processes on loopback, 2 of 3 acks, no protocol and no Python): what any
    implementation could reach here. Each run of them is followed by the same networked round in
    Python processes (``qjm.bench.pyfloor``): ``py`` with no protocol, ``bare`` over qjm's wire and
    native receiver with no protocol: what any qjm whose writer and nodes are Python processes could
    reach."""
    cfg = SMOKE if smoke else FULL
    out: dict[str, Any] = {}
    runs: dict[str, list[float]] = {f"{m}_{q}_us": [] for m in NETWORKED_FLOORS for q in ("p50", "p99", "cpu")}
    for phase in range(int(cfg["phases"])):  # each floor runs its own warm-up rounds: every run counts
        progress(f"C and Python floors (bench/netfloor, qjm.bench.pyfloor): run {phase + 1}/{int(cfg['phases'])}")
        for mode in NETWORKED_FLOORS:
            r = networked_floor(exe, mode, os.path.join(base, f"c-{mode}-{phase}"), int(cfg["rounds"]), not smoke)
            for q in ("p50", "p99", "cpu"):
                runs[f"{mode}_{q}_us"].append(r[f"{q}_us"])
    for key, values in runs.items():
        out[key] = statistics.median(values)
    out["spread"] = {key: spread(values) for key, values in runs.items()}
    return out


def _run_json(argv: list[str], what: str) -> dict[str, Any]:
    """Run a floor's process; its last line of output, a JSON object."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"qjm bench: {what} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
