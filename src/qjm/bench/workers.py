"""The measuring processes of ``qjm bench`` and how the driver starts them.

Each measurement runs in a process of its own (``python -m qjm.bench --worker KIND``), so the
floor, qjm native, qjm pure and each peer start from the same state and one backend's imports never
leak into another's: ``run_worker`` and ``run_peer_worker`` start one and read the JSON line it
prints. ``worker_qjm`` is the qjm side: one writer (the worker) and three JournalNode subprocesses
on loopback; its failover figures come from ``process_failover``, another process that takes over.
With ``tls`` the nodes and the writer use mutual TLS on both planes (certificates made for the run by
``qjm.testing.certs``); that worker measures latency, throughput and the same-process failover.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from qjm.bench.floor import floors_beside
from qjm.bench.pipeline import batches_speedup, tail_staleness
from qjm.bench.workload import (
    FAILOVER_WARMUP,
    LATENCY_RECORD,
    PROGRESS,
    RECORD_SIZES,
    ROLL_PHASE_LIMIT,
    ROLL_RECORD,
    cpu_per_record,
    cpu_seconds,
    median_cpu,
    phased,
    progress,
    roll_every,
)
from qjm.client.reader import open_reader
from qjm.client.writer import Writer, open_writer
from qjm.testing.certs import make_pki
from qjm.testing.minicluster import MiniJournalCluster

PEER_TIMEOUT = {True: 240.0, False: 900.0}  # seconds for one peer worker (smoke, full): start + both workloads


def sync_phase(w: Writer, rec: bytes, rounds: int, pids: list[int]) -> tuple[list[float], dict[str, float]]:
    """``rounds`` sync commits of ``rec``, one after the other: each one's seconds, and the CPU per
    commit of this process and the nodes ``pids``."""
    lat = []
    before = cpu_seconds(pids)
    for _ in range(rounds):
        t = time.perf_counter()
        w.append(rec)
        w.sync()
        lat.append(time.perf_counter() - t)
    return lat, cpu_per_record(before, cpu_seconds(pids), len(lat))


def tput_phase(w: Writer, chunk: list[bytes], seconds: float, pids: list[int]) -> tuple[float, dict[str, float]]:
    """Pipelined ``append_many`` of ``chunk`` for ``seconds``, then a sync: records/s, and the CPU
    per record of this process and the nodes ``pids``."""
    w.roll()  # each phase starts a segment, as a long-running writer's phases would
    before = cpu_seconds(pids)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        w.append_many(chunk)
        n += len(chunk)
    w.sync()
    return n / (time.perf_counter() - t0), cpu_per_record(before, cpu_seconds(pids), n)


def worker_qjm(
    base: str, cfg: dict[str, float], tls: bool = False, netfloor: str | None = None, settle: bool = False
) -> dict[str, Any]:
    """One writer (this process) and three JournalNode subprocesses that inherit this environment;
    with ``tls`` all of them on mutual TLS, both planes, and beside them a second cluster and
    writer in plaintext, whose phase runs right before each TLS latency and throughput phase. With
    ``netfloor`` (``bench/netfloor``'s binary), each sync-latency phase has the C networked floor and
    ``bare`` run right before it, on the same disk (``floors_beside``; ``settle``: each on a disk
    with no writeback pending).

    Raw samples: ``latency`` (one list of seconds per counted phase), ``latency_beside`` (with
    ``netfloor``: each counted phase's floors), ``tput{size}`` (records/s per counted phase), with
    ``tls`` the plaintext phases beside them (``latency_plain``, ``tput{size}_plain``), the warm-up
    phases under ``*_warmup``, and the failover lists."""
    out: dict[str, Any] = {}
    pki = make_pki(os.path.join(base, "pki")) if tls else None
    client = pki.clients["alice"] if pki is not None else None
    with contextlib.ExitStack() as stack:
        c = stack.enter_context(MiniJournalCluster(3, base, pki=pki))
        w = open_writer(c.uri, create=True, tls=client)
        node_pids = [n.proc.pid for n in c.nodes if n.proc is not None]
        plain: tuple[Writer, list[int]] | None = None
        if tls:
            # Why a plaintext cluster beside: the TLS goals are ratios to plaintext, and a plaintext
            # phase run minutes earlier by another worker carries the disk's drift into them.
            pc = stack.enter_context(MiniJournalCluster(3, os.path.join(base, "plain")))
            pw = stack.enter_context(open_writer(pc.uri, create=True))
            plain = (pw, [n.proc.pid for n in pc.nodes if n.proc is not None])
        rec = os.urandom(LATENCY_RECORD)
        latency_cpu: list[dict[str, float]] = []
        beside: list[dict[str, float]] = []
        latency_plain: list[list[float]] = []

        def latency_phase() -> list[float]:
            if netfloor is not None:  # the cluster idles meanwhile: its nodes wait in recv
                beside.append(floors_beside(netfloor, os.path.join(base, "floors"), int(cfg["rounds"]), settle))
            if plain is not None:
                latency_plain.append(sync_phase(plain[0], rec, int(cfg["rounds"]), plain[1])[0])
            lat, cpu = sync_phase(w, rec, int(cfg["rounds"]), node_pids)
            latency_cpu.append(cpu)
            return lat

        out["latency_warmup"], out["latency"] = phased(cfg, "sync latency", latency_phase)
        out["latency_cpu"] = median_cpu(latency_cpu[1:])  # per sync commit, writer + 3 nodes
        if beside:
            out["latency_beside_warmup"], out["latency_beside"] = beside[0], beside[1:]
        if latency_plain:
            out["latency_plain_warmup"], out["latency_plain"] = latency_plain[0], latency_plain[1:]
        if not tls:  # the TLS row compares sync latency and throughput with plaintext's
            progress("tail staleness and packed reading")
            out["tail_staleness"] = tail_staleness(c.uri, w, int(cfg["tail_rounds"]))
            out |= batches_speedup(c.uri, w, int(cfg["read_records"]))
        for size in RECORD_SIZES:
            chunk = [os.urandom(size)] * 1000
            tput_plain: list[float] = []

            def phase(
                chunk: list[bytes] = chunk, tput_plain: list[float] = tput_plain
            ) -> tuple[float, dict[str, float]]:
                if plain is not None:
                    tput_plain.append(tput_phase(plain[0], chunk, cfg["seconds"], plain[1])[0])
                return tput_phase(w, chunk, cfg["seconds"], node_pids)

            warm, counted = phased(cfg, f"{size} B records/s", phase)
            out[f"tput{size}_warmup"], out[f"tput{size}"] = warm[0], [r for r, _ in counted]
            out[f"tput{size}_cpu"] = median_cpu([c for _, c in counted])  # writer + 3 nodes
            if tput_plain:
                out[f"tput{size}_plain_warmup"], out[f"tput{size}_plain"] = tput_plain[0], tput_plain[1:]
            # A node more than queued_edits_limit_bytes behind is dropped until the next segment
            # (Hadoop's rule): then the figure is for two replicas, and the table says so.
            out[f"tput{size}_in_sync"] = sum(not lg.out_of_sync for lg in w.qjm.loggers.loggers)
        if not tls:
            w = roll_variant(c.uri, w, cfg, out)
        w.roll()  # recover a small open segment, not the throughput phases' hundreds of MB
        os.sync()  # failover on a settled disk, not behind the writeback of the throughput phases
        progress("failover: new writers in this process")
        fo = []
        warmup = FAILOVER_WARMUP if cfg["failovers"] > FAILOVER_WARMUP else 0
        for _ in range(warmup + int(cfg["failovers"])):
            for _ in range(10):
                w.append(rec)
            w.sync()  # the old writer holds an open segment with committed records
            t = time.perf_counter()
            w2 = open_writer(c.uri, tls=client)
            w2.append(rec)
            w2.sync()
            fo.append(time.perf_counter() - t)
            w.abort()
            w = w2
        out["failover_same_process"] = fo[warmup:]  # the first takeovers after gigabytes of writes are slower
        for key, follow in (("failover", True), ("failover_cold", False)):
            if tls:  # the other process would need the certificates: not measured with TLS
                out[key] = []
                continue
            took = []
            progress(f"failover: {'standby' if follow else 'cold'} processes")
            for _ in range(int(cfg["cold_failovers"])):
                for _ in range(10):
                    w.append(rec)
                w.sync()
                took.append(process_failover(c.uri, w.segment_txid if follow else 0))
                w.abort()
                w = open_writer(c.uri)  # takes over from the other process's writer, which exited
            out[key] = took
        w.close()
    return out


def roll_variant(uri: str, w: Writer, cfg: dict[str, float], out: dict[str, Any]) -> Writer:
    """Pipelined ``ROLL_RECORD``-byte records with the writer rolling by itself every ``roll_every``
    seconds against rolls off, in ``cfg["roll_pairs"]`` pairs of phases, each phase by a writer
    opened with its settings; returns the writer left open (rolls at the defaults).

    A rolling phase ends as its writer's first roll completes, so it holds exactly one roll period
    (the segment streamed for ``roll_every``, then the drain and the finalize), never a roll cut
    off by the phase's end; a phase without rolls streams for ``roll_every``. The figure is each
    pair's ratio, so load that comes and goes weighs on both halves of a pair alike, and the
    pairs alternate which half runs first, so load that rises or falls through a pair does not
    favour one side."""
    every = roll_every(cfg)
    pairs = int(cfg["roll_pairs"])
    chunk = [os.urandom(ROLL_RECORD)] * 1000
    rates: dict[str, list[float]] = {"noroll": [], "roll": []}
    rolls = 0
    in_sync = len(w.qjm.loggers.loggers)
    for i in range(pairs):
        order = ("noroll", "roll") if i % 2 == 0 else ("roll", "noroll")
        progress(f"automatic roll: pair {i + 1}/{pairs}, a phase without the writer's own rolls and one with")
        for label in order:
            w.roll()
            w2 = open_writer(uri, roll_bytes=0, roll_interval=every if label == "roll" else 0.0)
            w.abort()
            w = w2
            rolling = label == "roll"
            limit = every * ROLL_PHASE_LIMIT if rolling else every
            t0 = time.perf_counter()
            n = 0
            while not (rolling and w.rolls) and time.perf_counter() - t0 < limit:
                w.append_many(chunk)
                n += len(chunk)
            w.sync()
            rates[label].append(n / (time.perf_counter() - t0))
            rolls += w.rolls
            in_sync = min(in_sync, sum(not lg.out_of_sync for lg in w.qjm.loggers.loggers))
    out["tput_noroll"] = rates["noroll"]
    out["tput_roll"] = rates["roll"]
    out["rolls"] = rolls
    out["roll_every"] = every
    out["roll_in_sync"] = in_sync  # the fewest nodes in sync at the end of a phase
    out["roll_nodes"] = len(w.qjm.loggers.loggers)
    w.roll()
    w2 = open_writer(uri)
    w.abort()
    return w2


def process_failover(uri: str, follow_from: int) -> float:
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
    """The failover of ``process_failover``, in the process it started (the client code is imported
    at module level, as in a process that has been running)."""
    reader = None
    if follow_from:
        reader = open_reader(uri, from_txid=follow_from, include_in_progress=True)
        if not any(True for _ in reader):
            raise RuntimeError("the standby read nothing of the open segment")
    rec = os.urandom(LATENCY_RECORD)
    t = time.perf_counter()
    w = open_writer(uri)
    w.append(rec)
    w.sync()
    took = time.perf_counter() - t
    w.abort()
    if reader is not None:
        reader.qjm.close()
    return took


def run_json(what: str, cmd: list[str], env: dict[str, str] | None = None, timeout: float | None = None) -> Any:
    """Run a worker command; show its progress lines on stderr as they come; its last stdout line as JSON.

    The rest of its stderr is kept for the error a failed worker raises."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
        fired = threading.Event()

        def kill() -> None:
            fired.set()
            proc.kill()

        timer = threading.Timer(timeout, kill) if timeout else None
        if timer is not None:
            timer.start()
        tail: collections.deque[str] = collections.deque(maxlen=400)
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if line.startswith(PROGRESS):
                    sys.stderr.write(line)
                    sys.stderr.flush()
                else:
                    tail.append(line)
            rc = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if fired.is_set():
            raise RuntimeError(f"qjm bench: {what} did not finish in {timeout or 0:.0f} s")
        if rc != 0:
            raise RuntimeError(f"qjm bench: {what} failed ({rc}):\n{''.join(tail)[-4000:]}")
        out.seek(0)
        lines = out.read().strip().splitlines()
    if not lines:
        raise RuntimeError(f"qjm bench: {what} printed no result:\n{''.join(tail)[-4000:]}")
    return json.loads(lines[-1])


def run_worker(
    kind: str, base: str, smoke: bool, pure: bool, tls: bool = False, netfloor: str | None = None
) -> dict[str, Any]:
    """One ``floor`` or ``qjm`` worker in its own process (``pure``: on the pure-Python twins;
    ``tls``: mutual TLS on both planes; ``netfloor``: the C floor's binary, for the floors beside
    each sync-latency phase); its JSON result."""
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
    if tls:
        cmd.append("--tls")
    if netfloor is not None:
        cmd += ["--netfloor", netfloor]
    result: dict[str, Any] = run_json(f"{kind} worker", cmd, env)
    return result


def run_peer_worker(name: str, base: str, smoke: bool) -> dict[str, Any]:
    """One peer (``qjm.bench.peers.measure``) in its own process: its servers die with it (PDEATHSIG)."""
    cmd = [sys.executable, "-m", "qjm.bench", "--worker", "peer", "--peer", name, "--base", base]
    if smoke:
        cmd.append("--smoke")
    result: dict[str, Any] = run_json(f"peer {name}", cmd, timeout=PEER_TIMEOUT[smoke])
    return result
