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

import json
import os
import subprocess
import sys
import time
from typing import Any

from qjm.bench.workload import FAILOVER_WARMUP, LATENCY_RECORD, RECORD_SIZES, cpu_per_record, cpu_seconds
from qjm.client.reader import open_reader
from qjm.client.writer import open_writer
from qjm.testing.certs import make_pki
from qjm.testing.minicluster import MiniJournalCluster

PEER_TIMEOUT = {True: 240.0, False: 900.0}  # seconds for one peer worker (smoke, full): start + both workloads


def worker_qjm(base: str, cfg: dict[str, float], tls: bool = False) -> dict[str, Any]:
    """One writer (this process) and three JournalNode subprocesses that inherit this environment."""
    out: dict[str, Any] = {}
    pki = make_pki(os.path.join(base, "pki")) if tls else None
    client = pki.clients["alice"] if pki is not None else None
    with MiniJournalCluster(3, base, pki=pki) as c:
        w = open_writer(c.uri, create=True, tls=client)
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
            before = cpu_seconds(pids)
            t0 = time.perf_counter()
            n = 0
            while time.perf_counter() - t0 < cfg["seconds"]:
                w.append_many(chunk)
                n += len(chunk)
            w.sync()
            out[f"tput{size}"] = n / (time.perf_counter() - t0)
            out[f"tput{size}_cpu"] = cpu_per_record(before, cpu_seconds(pids), n)  # writer + 3 nodes
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


def run_worker(kind: str, base: str, smoke: bool, pure: bool, tls: bool = False) -> dict[str, Any]:
    """One ``floor`` or ``qjm`` worker in its own process (``pure``: on the pure-Python twins;
    ``tls``: mutual TLS on both planes); its JSON result."""
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
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"qjm bench: {kind} worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def run_peer_worker(name: str, base: str, smoke: bool) -> dict[str, Any]:
    """One peer (``qjm.bench.peers.measure``) in its own process: its servers die with it (PDEATHSIG)."""
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
