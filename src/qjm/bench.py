"""``qjm bench``: qjm against the disk's floor, native against pure, in one run on one disk.

Three measurements, side by side, each in its own process and all under one base directory:

- **floor**: three concurrent local appenders, one per node directory, doing exactly the node's
  write pattern (the same frames, the same preallocated O_DIRECT segment files through
  ``qjm._native.segment_io``, one fdatasync per batch) with no network and no protocol. A commit
  of the floor is the second of the three appenders to finish (a quorum of three). Its failover is
  the disk work a node does for fence + recover + first commit of a log in sync (promise written
  in place, finalize, writer epoch in place, new preallocated segment, first append), three
  directories at once.
- **qjm native**: a writer and three JournalNodes (``MiniJournalCluster`` subprocesses) on loopback.
- **qjm pure**: the same with ``QJM_NO_EXTENSIONS=1`` in the writer and the nodes.

- **C floors** (from a source checkout with a C compiler): ``bench/netfloor/netfloor.c``, the same
  disk pattern in plain C, locally and as a writer with three receiver processes on loopback (2 of
  3 acks, no protocol, no Python): how close to the floor any implementation with a network hop
  can get on this machine.

Figures: sync-commit latency p50/p99 of a 1 KiB batch with one batch outstanding; pipelined
throughput (records/s, payload MB/s) for 100-byte and 1 KiB records; failover time p50 (fence +
recover + first commit: ``open_writer`` while another writer holds an open segment, then one
synced record), measured on a settled disk (``sync`` after the throughput phases) three ways: by
another process that has read the open segment first, as a standby that follows the journal does
(its connections are open and it knows the epoch); by a cold process (its code imported, nothing
else); and by a new writer in the old writer's own process. Each figure is also given as a ratio
to the floor.

``--peers`` then measures ZooKeeper, etcd and NATS JetStream (three servers each on loopback,
``qjm.bench_peers``, each peer in its own worker process) on the same two workloads and prints a
second table: floor, qjm native and each peer, with qjm native's ratio to each and the issue's
targets (latency <= 0.4x and throughput >= 50x the best durable peer, ahead of the non-durable ones).
``python -m qjm.bench [--smoke] [--json] [--plot out.png] [--peers]``; ``qjm bench`` calls ``run``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

RECORD_SIZES = (100, 1024)
BATCH_BYTES = 64 * 1024  # the Writer's default batch_bytes
LATENCY_RECORD = 1024

# (latency rounds, seconds per throughput phase, failover repetitions)
FULL = {"rounds": 3000, "seconds": 4.0, "failovers": 15, "cold_failovers": 9}
SMOKE = {"rounds": 30, "seconds": 0.3, "failovers": 2, "cold_failovers": 1}
FAILOVER_WARMUP = 3  # takeovers run before the counted ones (after the throughput phases)
PURE_SCALE = 0.5  # the pure run is slow: fewer latency rounds (throughput phases are timed anyway)
PEER_TIMEOUT = {True: 240.0, False: 900.0}  # seconds for one peer worker (smoke, full): start + both workloads
LATENCY_TARGET = 0.4  # qjm native sync p50 <= this x the best durable peer's
THROUGHPUT_TARGET = 50.0  # qjm native 1 KiB records/s >= this x the best durable peer's


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))] if s else float("nan")


def _frame(records: list[bytes], first: int) -> bytes:
    from qjm._native import framing

    return framing.encode_frame(records, epoch=1, segment_txid=1, first_txid=first)


def _segment_header() -> bytes:
    from qjm._native import framing

    return framing.encode_segment_header(1, 1)


def _records_per_batch(size: int) -> int:
    """How many records of ``size`` bytes the Writer puts in one batch (closed at BATCH_BYTES)."""
    from qjm.protocol.frame import RECORD_PREFIX_SIZE

    return -(-BATCH_BYTES // (size + RECORD_PREFIX_SIZE))


# -- the floor ---------------------------------------------------------------------------------


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


def floor_latency(base: str, rounds: int) -> list[float]:
    """Commit latency of 1 KiB batches: per round, the second of three concurrent appenders."""
    from qjm._native import segment_io

    apps = [segment_io.Appender(os.path.join(base, f"lat{i}"), _segment_header()) for i in range(3)]
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
    from qjm._native import segment_io

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


def floor_throughput(base: str, size: int, seconds: float) -> tuple[float, dict[str, float]]:
    """Records/s of the quorum: three appenders each writing full batches, one fdatasync per batch;
    and the CPU they spent per record (per replica set, like the writer's records)."""
    per = _records_per_batch(size)
    before = _cpu_seconds([])
    done = _three_appenders(base, f"tput{size}", _frame([os.urandom(size)] * per, 1), seconds)
    cpu = _cpu_per_record(before, _cpu_seconds([]), sum(n for n, _ in done) * per // 3)
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
    import mmap

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


def _cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """(user, kernel) CPU seconds so far of this process and of ``pids``, every thread included."""
    t = os.times()
    user, kernel = t.user, t.system
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # fields from the 3rd on: utime, stime are 14, 15
        user += int(fields[11]) / tick
        kernel += int(fields[12]) / tick
    return user, kernel


def _cpu_per_record(before: tuple[float, float], after: tuple[float, float], records: int) -> dict[str, float]:
    return {
        "cpu_user_ns": (after[0] - before[0]) / records * 1e9,
        "cpu_kernel_ns": (after[1] - before[1]) / records * 1e9,
    }


def _slot_file(path: str) -> int:
    """An epoch file as the node keeps it (qjm.server.durable_long): 8 KiB, overwritten in place."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, bytes(8192))
    os.fsync(fd)
    return fd


def _slot_write(fd: int, k: int) -> None:
    os.pwrite(fd, b"%4096d" % k, (k % 2) * 4096)
    os.fdatasync(fd)


def floor_failover(base: str, reps: int) -> list[float]:
    """The durable disk work of fence + recover + first commit on a node, three nodes at once."""
    from qjm._native import segment_io
    from qjm.server.durable_long import fsync_dir as _fsync_dir

    record = _frame([os.urandom(LATENCY_RECORD)], 1)
    lat = [[0.0] * reps for _ in range(3)]
    barrier = threading.Barrier(3)

    def node(i: int) -> None:
        d = os.path.join(base, f"fo{i}")
        os.makedirs(d, exist_ok=True)
        promised = _slot_file(os.path.join(d, "last-promised-epoch"))
        writer = _slot_file(os.path.join(d, "last-writer-epoch"))
        old = segment_io.Appender(os.path.join(d, "seg-0"), _segment_header())
        old.append(record)
        old.sync()
        old.close()
        for k in range(reps):
            barrier.wait()
            t = time.perf_counter()
            _slot_write(promised, k)  # new_epoch (the log is in sync: no accept round, no paxos record)
            seg = os.path.join(d, f"seg-{k}")
            fd = os.open(seg, os.O_RDWR)  # finalize: cut the preallocation, fsync, rename
            os.ftruncate(fd, len(record) + 64)
            os.fsync(fd)
            os.close(fd)
            os.rename(seg, seg + ".done")
            _fsync_dir(d)
            _slot_write(writer, k)  # start_log_segment
            new = segment_io.Appender(os.path.join(d, f"seg-{k + 1}"), _segment_header())
            _fsync_dir(d)
            new.append(record)  # first commit
            new.sync()
            lat[i][k] = time.perf_counter() - t
            new.close()
        os.close(promised)
        os.close(writer)

    _three(node)
    return [sorted(lat[i][k] for i in range(3))[1] for k in range(reps)]


def worker_floor(base: str, cfg: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"latency": floor_latency(base, int(cfg["rounds"]))}
    for size in RECORD_SIZES:
        out[f"tput{size}"], out[f"tput{size}_cpu"] = floor_throughput(base, size, cfg["seconds"])
    out["ceiling_bps"] = floor_bandwidth(base, cfg["seconds"])
    try:
        out["raw_ceiling_bps"] = floor_raw_bandwidth(base, cfg["seconds"])
    except OSError as e:  # a file system that refuses O_DIRECT: the appender's ceiling stands alone
        out["raw_ceiling_error"] = str(e)
    out["failover"] = floor_failover(base, max(3, int(cfg["failovers"])))
    return out


# -- qjm -----------------------------------------------------------------------------------------


def worker_qjm(base: str, cfg: dict[str, float]) -> dict[str, Any]:
    """One writer (this process) and three JournalNode subprocesses that inherit this environment."""
    import qjm
    from qjm.testing.minicluster import MiniJournalCluster

    out: dict[str, Any] = {}
    with MiniJournalCluster(3, base) as c:
        w = qjm.open_writer(c.uri, create=True)
        rec = os.urandom(LATENCY_RECORD)
        for _ in range(min(200, int(cfg["rounds"]))):  # warm-up
            w.append(rec)
            w.sync()
        lat = []
        for _ in range(int(cfg["rounds"])):
            t = time.perf_counter()
            w.append(rec)
            w.sync()
            lat.append(time.perf_counter() - t)
        out["latency"] = lat
        pids = [n.proc.pid for n in c.nodes if n.proc is not None]
        for size in RECORD_SIZES:
            w.roll()
            chunk = [os.urandom(size)] * 1000
            before = _cpu_seconds(pids)
            t0 = time.perf_counter()
            n = 0
            while time.perf_counter() - t0 < cfg["seconds"]:
                w.append_many(chunk)
                n += len(chunk)
            w.sync()
            out[f"tput{size}"] = n / (time.perf_counter() - t0)
            out[f"tput{size}_cpu"] = _cpu_per_record(before, _cpu_seconds(pids), n)  # writer + 3 nodes
            # A node more than queued_edits_limit_bytes behind is dropped until the next segment
            # (Hadoop's rule): then the figure is for two replicas, and the table says so.
            out[f"tput{size}_in_sync"] = sum(not lg.out_of_sync for lg in w.qjm.loggers.loggers)
        w.roll()  # recover a small open segment, not the throughput phases' hundreds of MB
        os.sync()  # failover on a settled disk, not behind the writeback of the throughput phases
        fo = []
        warmup = FAILOVER_WARMUP if cfg["failovers"] > FAILOVER_WARMUP else 0
        for _ in range(warmup + int(cfg["failovers"])):
            for _ in range(10):
                w.append(rec)
            w.sync()  # the old writer holds an open segment with committed records
            t = time.perf_counter()
            w2 = qjm.open_writer(c.uri)
            w2.append(rec)
            w2.sync()
            fo.append(time.perf_counter() - t)
            w.abort()
            w = w2
        out["failover_same_process"] = fo[warmup:]  # the first takeovers after gigabytes of writes are slower
        for key, follow in (("failover", True), ("failover_cold", False)):
            took = []
            for _ in range(int(cfg["cold_failovers"])):
                for _ in range(10):
                    w.append(rec)
                w.sync()
                took.append(_process_failover(c.uri, w.segment_txid if follow else 0))
                w.abort()
                w = qjm.open_writer(c.uri)  # takes over from the other process's writer, which exited
            out[key] = took
        w.close()
    return out


def _process_failover(uri: str, follow_from: int) -> float:
    """Failover by another process, its code imported; with ``follow_from`` a standby that has read
    the open segment from that txid first (its connections and the epoch are known), else a cold
    one. Its own timing of open_writer + one synced record; it exits leaving its segment open."""
    cmd = [sys.executable, "-m", "qjm.bench", "--worker", "process-failover", "--uri", uri]
    cmd += ["--follow", str(follow_from)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"qjm bench: failover process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def worker_process_failover(uri: str, follow_from: int) -> float:
    import qjm

    # the code is loaded, as in a process that has been running
    import qjm.client.fanout_link
    import qjm.client.writer

    reader = None
    if follow_from:
        reader = qjm.open_reader(uri, from_txid=follow_from, include_in_progress=True)
        if not any(True for _ in reader):
            raise RuntimeError("the standby read nothing of the open segment")
    rec = os.urandom(LATENCY_RECORD)
    t = time.perf_counter()
    w = qjm.open_writer(uri)
    w.append(rec)
    w.sync()
    took = time.perf_counter() - t
    w.abort()
    if reader is not None:
        reader.qjm.close()
    return took


# -- driver --------------------------------------------------------------------------------------


def _run_worker(kind: str, base: str, smoke: bool, pure: bool) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("QJM_NO_EXTENSIONS", None)
    if pure:
        env["QJM_NO_EXTENSIONS"] = "1"
    cmd = [sys.executable, "-m", "qjm.bench", "--worker", kind, "--base", base]
    if smoke:
        cmd.append("--smoke")
    else:
        os.sync()  # each worker starts on a settled disk, not behind the last one's writeback
    if pure:
        cmd.append("--pure")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"qjm bench: {kind} worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


NETFLOOR_WARMUP = 200  # rounds netfloor.c runs before it counts


def _netfloor_source() -> str | None:
    """``bench/netfloor/netfloor.c`` of a source checkout (a wheel does not ship it)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "bench", "netfloor", "netfloor.c")
    return os.path.normpath(path) if os.path.isfile(path) else None


def run_c_floors(base: str, smoke: bool) -> dict[str, Any]:
    """The C reference of ``bench/netfloor`` in this run: its local floor (three threads, the same
    disk pattern, no network) and its networked floor (a writer and three receiver processes on
    loopback, 2 of 3 acks, no protocol and no Python): what any implementation could reach here.
    Returns ``{"skipped": why}`` where there is no checkout or no C compiler."""
    src = _netfloor_source()
    cc = shutil.which("gcc") or shutil.which("cc")
    if src is None or cc is None:
        why = "no source checkout (bench/netfloor/netfloor.c)" if src is None else "no C compiler (gcc/cc)"
        return {"skipped": why}
    exe = os.path.join(base, "netfloor")
    flags = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]
    done = subprocess.run([cc, *flags, "-o", exe, src], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"qjm bench: compiling {src} failed:\n{done.stderr[-4000:]}")
    rounds = (SMOKE if smoke else FULL)["rounds"] + NETFLOOR_WARMUP
    out: dict[str, Any] = {}
    for mode in ("local", "net"):
        d = os.path.join(base, f"c-{mode}")
        os.makedirs(d)
        if not smoke:
            os.sync()
        done = subprocess.run([exe, mode, d, str(rounds)], capture_output=True, text=True, check=False, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"qjm bench: netfloor {mode} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        out[f"{mode}_p50_us"], out[f"{mode}_p99_us"] = r["p50_us"], r["p99_us"]
        shutil.rmtree(d, ignore_errors=True)
    return out


def _run_peer_worker(name: str, base: str, smoke: bool) -> dict[str, Any]:
    """One peer (``qjm.bench_peers.measure``) in its own process: its servers die with it (PDEATHSIG)."""
    cmd = [sys.executable, "-m", "qjm.bench", "--worker", "peer", "--peer", name, "--base", base]
    if smoke:
        cmd.append("--smoke")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=PEER_TIMEOUT[smoke])
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"qjm bench: peer {name} did not finish in {PEER_TIMEOUT[smoke]:.0f} s") from e
    if proc.returncode != 0:
        raise RuntimeError(f"qjm bench: peer {name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _machine(base: str) -> dict[str, Any]:
    from qjm._native import capabilities

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    fs = "?"
    try:
        probe = ["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", base]
        fs = subprocess.run(probe, capture_output=True, text=True, check=False).stdout.strip() or fs
    except OSError:
        pass
    commit = ""
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        commit = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "filesystem": fs,
        "directory": base,
        "loadavg_before": os.getloadavg(),
        "capabilities": capabilities(base),
        "commit": commit,
    }


def _summarise(raw: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {
        "sync_p50_us": _pct(raw["latency"], 0.5) * 1e6,
        "sync_p99_us": _pct(raw["latency"], 0.99) * 1e6,
        "failover_p50_ms": _pct(raw["failover"], 0.5) * 1e3,
        # the floor's disk work is the same whichever process asks for it
        "failover_cold_p50_ms": _pct(raw.get("failover_cold", raw["failover"]), 0.5) * 1e3,
        "failover_same_process_p50_ms": _pct(raw.get("failover_same_process", raw["failover"]), 0.5) * 1e3,
    }
    for size in RECORD_SIZES:
        s[f"tput{size}_rps"] = raw[f"tput{size}"]
        s[f"tput{size}_mbps"] = raw[f"tput{size}"] * size / 1e6
        s[f"tput{size}_in_sync"] = raw.get(f"tput{size}_in_sync", 3)
        for k, v in raw.get(f"tput{size}_cpu", {}).items():
            s[f"tput{size}_{k}"] = v
    if "ceiling_bps" in raw:
        s["ceiling_mbps"] = raw["ceiling_bps"] / 1e6
        for size in RECORD_SIZES:
            s[f"ceiling{size}_rps"] = raw["ceiling_bps"] / _disk_bytes_per_record(size)
    if "raw_ceiling_error" in raw:
        s["raw_ceiling_error"] = raw["raw_ceiling_error"]
    if "raw_ceiling_bps" in raw:
        s["raw_ceiling_mbps"] = raw["raw_ceiling_bps"] / 1e6
        for size in RECORD_SIZES:
            s[f"raw_ceiling{size}_rps"] = raw["raw_ceiling_bps"] / _disk_bytes_per_record(size)
    return s


def _disk_bytes_per_record(size: int) -> float:
    """What one record of ``size`` bytes costs in a segment: its length prefix and its share of the
    frame header of the Writer's batches."""
    from qjm.protocol.frame import FRAME_HEADER_SIZE, RECORD_PREFIX_SIZE

    return size + RECORD_PREFIX_SIZE + FRAME_HEADER_SIZE / _records_per_batch(size)


ROWS = [
    ("sync commit p50, 1 KiB batch", "sync_p50_us", "µs", "lower"),
    ("sync commit p99, 1 KiB batch", "sync_p99_us", "µs", "lower"),
    ("throughput 100 B records", "tput100_rps", "rec/s", "higher"),
    ("throughput 100 B records", "tput100_mbps", "MB/s", "higher"),
    ("throughput 1 KiB records", "tput1024_rps", "rec/s", "higher"),
    ("throughput 1 KiB records", "tput1024_mbps", "MB/s", "higher"),
    ("CPU per 100 B record, user space (writer + nodes)", "tput100_cpu_user_ns", "ns", "lower"),
    ("CPU per 100 B record, kernel (writer + nodes)", "tput100_cpu_kernel_ns", "ns", "lower"),
    ("CPU per 1 KiB record, user space (writer + nodes)", "tput1024_cpu_user_ns", "ns", "lower"),
    ("CPU per 1 KiB record, kernel (writer + nodes)", "tput1024_cpu_kernel_ns", "ns", "lower"),
    ("failover p50 (fence+recover+commit), standby process", "failover_p50_ms", "ms", "lower"),
    ("failover p50, cold process", "failover_cold_p50_ms", "ms", "lower"),
    ("failover p50, new writer in the old one's process", "failover_same_process_p50_ms", "ms", "lower"),
]


def _fmt(v: float) -> str:
    if v != v:
        return "n/a"
    if v >= 1e5:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.2f}"


def table(result: dict[str, Any]) -> str:
    f, n, p = (result["summary"][k] for k in ("floor", "native", "pure"))
    lines = [
        "| metric | unit | floor | qjm native | native/floor | qjm pure | pure/floor | native vs pure |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, key, unit, better in ROWS:
        ratio_np = _ratio(p[key], n[key]) if better == "lower" else _ratio(n[key], p[key])
        lines.append(
            f"| {label} | {unit} | {_fmt(f[key])} | {_fmt(n[key])} | {_ratio(n[key], f[key]):.2f}x | {_fmt(p[key])} "
            f"| {_ratio(p[key], f[key]):.2f}x | {ratio_np:.1f}x better |"
        )
    for who, v in (("native", n), ("pure", p)):
        for size in RECORD_SIZES:
            if v.get(f"tput{size}_in_sync", 3) < 3:
                lines.append(
                    f"\nqjm {who}, {size} B records: only {v[f'tput{size}_in_sync']} of 3 nodes were in sync at the "
                    "end: a node fell more than queued_edits_limit_bytes behind and was dropped until the next "
                    "segment, so that figure is for fewer replicas than the floor's."
                )
    if "c_floors" in result:
        lines.append("")
        lines.append(c_floor_note(result["c_floors"], n))
    if "ceiling_mbps" in f:
        lines.append("")
        lines.append(ceiling_note(result["summary"]))
    m = result["machine"]
    lines.append("")
    lines.append(
        f"machine: {m['cpu']}, {m['cpus']} CPUs, Linux {m['kernel']}, Python {m['python']}, "
        f"{m['filesystem']} at {m['directory']}, load {m['loadavg_before'][0]:.1f} before / "
        f"{m['loadavg_after'][0]:.1f} after; capabilities {m['capabilities']}; commit {m['commit'] or '?'}"
    )
    return "\n".join(lines)


NATIVE_OVER_PURE_TARGET = 10.0  # the native >= 10x pure on throughput
SYNC_P50_TARGET = 1.25  # the sync p50 <= this x the floor


def c_floor_note(c: dict[str, Any], native: dict[str, Any]) -> str:
    """The C floors beside qjm native: how far the network alone puts any implementation."""
    if "skipped" in c:
        return f"C floors (bench/netfloor): not measured: {c['skipped']}"
    lp, np_ = c["local_p50_us"], c["net_p50_us"]
    return (
        f"C floors (bench/netfloor, this run): local p50 {lp:.0f} µs, p99 {c['local_p99_us']:.0f} µs; "
        f"networked (2 of 3 receiver processes over loopback, no protocol, no Python) p50 {np_:.0f} µs "
        f"= {_ratio(np_, lp):.2f}x its local floor, p99 {c['net_p99_us']:.0f} µs; "
        f"qjm native sync p50 = {_ratio(native['sync_p50_us'], np_):.2f}x the networked floor, "
        f"{_ratio(native['sync_p50_us'], lp):.2f}x the C local floor "
        f"(target: <= {SYNC_P50_TARGET}x the floor)"
    )


def ceiling_note(summary: dict[str, Any]) -> str:
    """How far the disk lets throughput go: qjm native's share of the bandwidth ceiling, and what
    the native >= 10x pure target would need of it."""
    f, n, p = (summary[k] for k in ("floor", "native", "pure"))
    lines = [
        f"disk ceiling, the node's write pattern (three appenders writing ~1 MiB frames into preallocated "
        f"segments, one fdatasync each): {f['ceiling_mbps']:.0f} MB/s each"
    ]
    if "raw_ceiling_mbps" in f:
        raw = f["raw_ceiling_mbps"]
        lines[0] += f"; with no preallocation (1 MiB O_DIRECT writes extending the file): {raw:.0f} MB/s"
    elif "raw_ceiling_error" in f:
        lines[0] += f"; with no preallocation: not measured ({f['raw_ceiling_error']})"
    for size in RECORD_SIZES:
        ceiling = f[f"ceiling{size}_rps"]
        need = NATIVE_OVER_PURE_TARGET * p[f"tput{size}_rps"]
        share = _ratio(n[f"tput{size}_rps"], ceiling)
        line = (
            f"- {size} B records: at most {_fmt(ceiling)}/s; native reaches {share:.0%} of it;"
            f" {NATIVE_OVER_PURE_TARGET:.0f}x pure would be {_fmt(need)}/s = {_ratio(need, ceiling):.2f}x it"
        )
        if "raw_ceiling_mbps" in f:
            line += f" ({_ratio(need, f[f'raw_ceiling{size}_rps']):.2f}x the ceiling with no preallocation)"
        lines.append(line)
    return "\n".join(lines)


PEER_LABELS = {"zookeeper": "ZooKeeper", "etcd": "etcd", "nats": "NATS JetStream"}


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def peer_targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets for qjm native against the peers: the best durable peer per figure, and the rest."""
    n = result["summary"]["native"]
    peers: dict[str, dict[str, Any]] = result["peers"]
    durable = {k: v for k, v in peers.items() if v["durable"]}
    out: dict[str, Any] = {}
    if durable:
        lat_best = min(durable, key=lambda k: durable[k]["sync_p50_us"])
        tput_best = max(durable, key=lambda k: durable[k]["tput1024_rps"])
        lat_ratio = _ratio(n["sync_p50_us"], durable[lat_best]["sync_p50_us"])
        tput_ratio = _ratio(n["tput1024_rps"], durable[tput_best]["tput1024_rps"])
        out["latency"] = {"peer": lat_best, "ratio": lat_ratio, "target": LATENCY_TARGET,
                          "met": lat_ratio <= LATENCY_TARGET}  # fmt: skip
        out["throughput"] = {"peer": tput_best, "ratio": tput_ratio, "target": THROUGHPUT_TARGET,
                             "met": tput_ratio >= THROUGHPUT_TARGET}  # fmt: skip
    out["non_durable"] = {
        k: {
            "latency_ratio": _ratio(n["sync_p50_us"], v["sync_p50_us"]),
            "throughput_ratio": _ratio(n["tput1024_rps"], v["tput1024_rps"]),
            "met": n["sync_p50_us"] < v["sync_p50_us"] and n["tput1024_rps"] > v["tput1024_rps"],
        }
        for k, v in peers.items()
        if not v["durable"]
    }
    return out


def peers_table(result: dict[str, Any]) -> str:
    """Floor, qjm native and each peer on the two workloads, qjm native's ratio to each, and the targets."""
    s = result["summary"]
    n = s["native"]
    lines = [
        "| system | durable per commit | sync p50 µs | sync p99 µs | 1 KiB rec/s | 1 KiB MB/s | 100 B rec/s "
        "| latency qjm/peer | throughput qjm/peer |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(label: str, durable: str, v: dict[str, Any], ratios: bool) -> None:
        lat = f"{_ratio(n['sync_p50_us'], v['sync_p50_us']):.2f}x" if ratios else "—"
        tput = f"{_ratio(n['tput1024_rps'], v['tput1024_rps']):.1f}x" if ratios else "—"
        lines.append(
            f"| {label} | {durable} | {_fmt(v['sync_p50_us'])} | {_fmt(v['sync_p99_us'])} "
            f"| {_fmt(v['tput1024_rps'])} | {_fmt(v['tput1024_mbps'])} | {_fmt(v['tput100_rps'])} | {lat} | {tput} |"
        )

    row("disk floor (no network)", "yes (fdatasync)", s["floor"], False)
    row("qjm native", "yes (fdatasync on a majority)", n, False)
    for name, v in result["peers"].items():
        durable = "yes (fsync on a majority)" if v["durable"] else "**no**: not durable per message (sync interval)"
        row(f"{PEER_LABELS.get(name, name)} {v['version']}", durable, v, True)
    t = result["peer_targets"]
    lines.append("")
    if "latency" in t:
        lat, tput = t["latency"], t["throughput"]
        p_lat, p_tput = result["peers"][lat["peer"]], result["peers"][tput["peer"]]
        lines.append(
            f"target latency: qjm native sync p50 <= {lat['target']}x the best durable peer "
            f"({PEER_LABELS.get(lat['peer'], lat['peer'])}, {_fmt(p_lat['sync_p50_us'])} µs): "
            f"{_fmt(n['sync_p50_us'])} µs = {lat['ratio']:.2f}x -> {'met' if lat['met'] else 'missed'}"
        )
        lines.append(
            f"target throughput: qjm native 1 KiB rec/s >= {tput['target']:.0f}x the best durable peer "
            f"({PEER_LABELS.get(tput['peer'], tput['peer'])}, {_fmt(p_tput['tput1024_rps'])} rec/s): "
            f"{_fmt(n['tput1024_rps'])} rec/s = {tput['ratio']:.1f}x -> {'met' if tput['met'] else 'missed'}"
        )
    for name, v in t["non_durable"].items():
        lines.append(
            f"target ahead of non-durable {PEER_LABELS.get(name, name)}: latency {v['latency_ratio']:.2f}x, "
            f"throughput {v['throughput_ratio']:.1f}x -> {'met' if v['met'] else 'missed'}"
        )
    m = result["machine"]
    if "loadavg_before_peers" in m:
        before, after = m["loadavg_before_peers"][0], m["loadavg_after"][0]
        lines.append(f"load average {before:.1f} before the peers, {after:.1f} after")
    lines.append("")
    for name, v in result["peers"].items():
        lines.append(f"- {PEER_LABELS.get(name, name)} {v['version']}: {v['how']}")
    return "\n".join(lines)


def plot_result(result: dict[str, Any], path: str) -> None:
    """Latency CDF of the three runs and throughput bars (matplotlib: the ``bench`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = {name: (result["raw"][name]["latency"], result["summary"][name]) for name in ("floor", "native", "pure")}
    for name, v in result.get("peers", {}).items():  # --peers: the peers beside qjm
        series[PEER_LABELS.get(name, name)] = (result["raw"]["peers"][name]["latency"], v)
    for name, (samples, _) in series.items():
        lat = sorted(x * 1e6 for x in samples)
        ax1.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=name)
    ax1.set_xscale("log")
    ax1.set_xlabel("sync commit latency of a 1 KiB batch (µs)")
    ax1.set_ylabel("fraction of commits")
    ax1.legend()
    ax1.grid(True, which="both", alpha=0.3)
    width = 0.8 / len(series)
    for j, (name, (_, summary)) in enumerate(series.items()):
        vals = [summary[f"tput{s}_rps"] for s in RECORD_SIZES]
        offset = (j - (len(series) - 1) / 2) * width
        ax2.bar([i + offset for i in range(len(RECORD_SIZES))], vals, width, label=name)
    ax2.set_xticks(range(len(RECORD_SIZES)), [f"{s} B records" for s in RECORD_SIZES])
    ax2.set_ylabel("records/s")
    ax2.set_yscale("log")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(smoke: bool = False, json_out: bool = False, plot: str | None = None, peers: bool = False) -> dict[str, Any]:
    """Measure floor, qjm native and qjm pure in one run on one disk; print the table (or JSON).

    ``smoke`` runs tiny counts (seconds), for CI. ``peers`` then measures ZooKeeper, etcd and NATS
    JetStream (``qjm.bench_peers``) on the same disk and prints the second table (a failed or
    missing peer fails the run rather than being skipped).
    """
    base = tempfile.mkdtemp(prefix="qjm-bench-")
    peer_raw: dict[str, dict[str, Any]] = {}
    try:
        machine = _machine(base)
        raw: dict[str, Any] = {
            "floor": _run_worker("floor", os.path.join(base, "floor"), smoke, pure=False),
        }
        c_floors = run_c_floors(base, smoke)
        raw |= {
            "native": _run_worker("qjm", os.path.join(base, "native"), smoke, pure=False),
            "pure": _run_worker("qjm", os.path.join(base, "pure"), smoke, pure=True),
        }
        if peers:
            from qjm.bench_peers import PEERS

            machine["loadavg_before_peers"] = os.getloadavg()
            for name in PEERS:
                peer_raw[name] = _run_peer_worker(name, os.path.join(base, f"peer-{name}"), smoke)
        machine["loadavg_after"] = os.getloadavg()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result: dict[str, Any] = {
        "smoke": smoke,
        "machine": machine,
        "summary": {k: _summarise(v) for k, v in raw.items()},
        "c_floors": c_floors,
        "raw": raw,
    }
    if peers:
        result["peers"] = {k: {m: x for m, x in v.items() if m != "latency"} for k, v in peer_raw.items()}
        raw["peers"] = {k: {"latency": v["latency"]} for k, v in peer_raw.items()}
        result["peer_targets"] = peer_targets(result)
    if plot:
        plot_result(result, plot)
    if json_out:
        print(json.dumps({k: v for k, v in result.items() if k != "raw"}, indent=2))
    else:
        print(table(result))
        if peers:
            print()
            print(peers_table(result))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qjm.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny counts, for CI")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="PNG", help="latency CDF and throughput bars (needs matplotlib)")
    p.add_argument("--peers", action="store_true", help="also ZooKeeper, etcd and NATS JetStream (bench/peers/)")
    p.add_argument("--worker", choices=["floor", "qjm", "peer", "process-failover"], help=argparse.SUPPRESS)
    p.add_argument("--uri", help=argparse.SUPPRESS)
    p.add_argument("--follow", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--peer", help=argparse.SUPPRESS)
    p.add_argument("--base", help=argparse.SUPPRESS)
    p.add_argument("--pure", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker == "process-failover":
        print(worker_process_failover(a.uri, a.follow))
        return 0
    if a.worker:
        cfg = dict(SMOKE if a.smoke else FULL)
        if a.pure and not a.smoke:
            cfg["rounds"] = int(cfg["rounds"] * PURE_SCALE)
        os.makedirs(a.base, exist_ok=True)
        if a.worker == "peer":
            from qjm.bench_peers import measure

            res = measure(a.peer, a.base, cfg)
        else:
            res = worker_floor(a.base, cfg) if a.worker == "floor" else worker_qjm(a.base, cfg)
        print(json.dumps(res))
        return 0
    run(smoke=a.smoke, json_out=a.json, plot=a.plot, peers=a.peers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
