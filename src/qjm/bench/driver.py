"""``qjm bench``'s driver: each measurement in a worker process, then the tables (or JSON, or a plot)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
from typing import Any

from qjm._native import capabilities
from qjm.bench.download import measure_download_rss
from qjm.bench.floor import run_c_floors, worker_floor
from qjm.bench.peers import PEERS, measure
from qjm.bench.report import peer_goals, peers_table, plot_result, summarise, table
from qjm.bench.workers import run_peer_worker, run_worker, worker_process_failover, worker_qjm
from qjm.bench.workload import FULL, PURE_SCALE, SMOKE

DESCRIPTION = "qjm against the disk's floor, native against pure, in one run on one disk"
DOWNLOAD_MIB = 1024  # the segment of the download_rss_mib phase


def run(smoke: bool = False, json_out: bool = False, plot: str | None = None, peers: bool = False) -> dict[str, Any]:
    """Measure floor, qjm native and qjm pure in one run on one disk; print the table (or JSON).

    ``smoke`` runs tiny counts (seconds), for CI. ``peers`` then measures ZooKeeper, etcd and NATS
    JetStream (``qjm.bench.peers``) on the same disk and prints the second table (a failed or
    missing peer fails the run rather than being skipped).
    """
    base = tempfile.mkdtemp(prefix="qjm-bench-")
    peer_raw: dict[str, dict[str, Any]] = {}
    try:
        machine = machine_info(base)
        raw: dict[str, Any] = {
            "floor": run_worker("floor", os.path.join(base, "floor"), smoke, pure=False),
        }
        c_floors = run_c_floors(base, smoke)
        raw |= {
            "native": run_worker("qjm", os.path.join(base, "native"), smoke, pure=False),
            "pure": run_worker("qjm", os.path.join(base, "pure"), smoke, pure=True),
        }
        # 1 GiB through the writer, a catch-up and a reader: minutes, so not in --smoke (the
        # integration test runs the same measurement on 120 MiB)
        download = None if smoke else measure_download_rss(os.path.join(base, "download"), DOWNLOAD_MIB)
        if peers:
            machine["loadavg_before_peers"] = os.getloadavg()
            for name in PEERS:
                peer_raw[name] = run_peer_worker(name, os.path.join(base, f"peer-{name}"), smoke)
        machine["loadavg_after"] = os.getloadavg()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result: dict[str, Any] = {
        "smoke": smoke,
        "machine": machine,
        "summary": {k: summarise(v) for k, v in raw.items()},
        "c_floors": c_floors,
        "raw": raw,
    }
    if download is not None:
        result["download_rss_mib"] = download
    if peers:
        result["peers"] = {k: {m: x for m, x in v.items() if m != "latency"} for k, v in peer_raw.items()}
        raw["peers"] = {k: {"latency": v["latency"]} for k, v in peer_raw.items()}
        result["peer_goals"] = peer_goals(result)
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``run``, for ``python -m qjm.bench`` and ``qjm bench`` alike."""
    p.add_argument("--smoke", action="store_true", help="tiny counts, for CI")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--plot", metavar="PNG", help="latency CDF and throughput bars (needs matplotlib)")
    p.add_argument("--peers", action="store_true", help="also ZooKeeper, etcd and NATS JetStream (bench/peers/)")


def run_from(a: argparse.Namespace) -> int:
    """``run`` with the options of ``add_arguments``."""
    run(smoke=a.smoke, json_out=a.json, plot=a.plot, peers=a.peers)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qjm.bench", description=DESCRIPTION)
    add_arguments(p)
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
            res = measure(a.peer, a.base, cfg)
        else:
            res = worker_floor(a.base, cfg) if a.worker == "floor" else worker_qjm(a.base, cfg)
        print(json.dumps(res))
        return 0
    return run_from(a)


def machine_info(base: str) -> dict[str, Any]:
    """The machine, the file system and the commit the figures were measured on."""
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
