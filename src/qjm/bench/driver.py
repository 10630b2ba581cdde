"""``qjm bench``'s driver: each measurement in a worker process, then the tables (or JSON, or a plot)."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, TypeVar

import qjm
from qjm._native import capabilities
from qjm.bench.control_floor import run_control_floor
from qjm.bench.download import measure_download_rss
from qjm.bench.floor import FloorSkipped, build_netfloor, run_c_floors, worker_floor
from qjm.bench.peers import PEERS, measure
from qjm.bench.pipeline import worker_tail
from qjm.bench.report import (
    peer_goals,
    peers_table,
    plot_result,
    summarise,
    sync_goals,
    table,
    tls_goals,
    tls_table,
)
from qjm.bench.workers import run_peer_worker, run_worker, worker_process_failover, worker_qjm
from qjm.bench.workload import FULL, PURE_SCALE, RECORD_SIZES, SMOKE, progress, roll_every
from qjm.errors import QJMError

DESCRIPTION = "qjm against the disk's floor, native against pure, in one run on one disk"
DOWNLOAD_MIB = 1024  # the segment of the download_rss_mib phase


class BenchUsageError(ValueError):
    """An option of ``qjm bench`` that cannot work on this machine, found before anything runs."""


def check_options(plot: str | None, directory: str | None) -> None:
    """Refuse, before the run, what would fail after it: ``--plot`` without matplotlib or where no
    file can be written, a bad ``--dir``."""
    if plot and importlib.util.find_spec("matplotlib") is None:
        raise BenchUsageError("--plot needs matplotlib: pip install 'qjm[bench]' (or run without --plot)")
    if plot:
        parent = os.path.dirname(os.path.abspath(plot))
        if os.path.isdir(plot):
            raise BenchUsageError(f"--plot {plot}: a directory, give the PNG file to write")
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
            raise BenchUsageError(f"--plot {plot}: cannot write a file in {parent}")
    if directory is not None and not os.path.isdir(directory):
        raise BenchUsageError(f"--dir {directory}: not a directory")
    if directory is not None and not os.access(directory, os.W_OK | os.X_OK):
        raise BenchUsageError(f"--dir {directory}: not writable")


# The most a full run held on its disk at once (e6bbc6b, this project's 2-core VM: the native
# worker's and the TLS worker's throughput phases, ~28 GB each); a faster disk writes more.
FULL_RUN_PEAK_BYTES = 30 * 10**9


def warn_if_short_of_space(directory: str | None, smoke: bool) -> None:
    """Say before a full run when its disk has less free space than a run held at its peak here:
    a phase that fills the disk fails (the download and the peers alone, in ``failed_phases``;
    qjm's own workers end the run with the error)."""
    if smoke:
        return
    where = directory or tempfile.gettempdir()
    free = shutil.disk_usage(where).free
    if free < FULL_RUN_PEAK_BYTES:
        progress(
            f"warning: {where} has {free / 1e9:.0f} GB free; a full run held up to "
            f"{FULL_RUN_PEAK_BYTES / 1e9:.0f} GB at once on the machine of docs/performance.md (more on a faster "
            "disk): a phase that fills it fails (--dir chooses the disk)",
            False,
        )


T = TypeVar("T")


def in_dir(path: str, measure: Callable[[str], T]) -> T:
    """``measure(path)``, then ``path`` removed, whatever happened: a worker's segments (gigabytes
    after its throughput phases) go before the next phase starts, so a run needs the disk of its
    largest phase, not of all of them."""
    try:
        return measure(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def estimate_seconds(smoke: bool, peers: bool, tls: bool = False) -> float:
    """About how long ``run`` takes on an idle 2-core machine (a loaded one takes longer).

    Fitted to runs of this machine: a full run with ``--peers --tls`` took 343 s (the floors beside
    each latency phase and the plaintext cluster beside TLS included), a smoke run with them 35 s
    and one without them 17 s (both before those)."""
    cfg = SMOKE if smoke else FULL
    phases = int(cfg["phases"]) + 1
    tput = len(RECORD_SIZES) * phases * cfg["seconds"]
    floor = 1 + tput + 2 * cfg["seconds"] + phases * cfg["rounds"] * 3e-4 + cfg["failovers"] * 0.05
    # C local and networked, then the Python floors (a process start-up each)
    c_floors = 1 + int(cfg["phases"]) * (4 * (cfg["rounds"] + 200) * 3e-4 + 2 * 0.3)
    # cold takeovers: over gRPC with disk work and without, over sockets with it
    control_floor = 1 + 3 * (cfg["cold_failovers"] + 1) * 0.4
    # a worker: cluster, latency, tail staleness and reading, throughput, failovers in its process
    worker = 3 + tput + phases * cfg["rounds"] * 4e-4 + cfg["failovers"] * 0.1
    qjm = worker + 2 * cfg["cold_failovers"] * 0.6  # standby and cold takeovers, a process each
    qjm += cfg["roll_pairs"] * 2 * (roll_every(cfg) + 0.05)  # the roll variant: one roll period a phase
    # the C floor and bare beside each of native's latency phases (bare: a process start-up)
    beside = phases * (2 * (cfg["rounds"] + 200) * 3e-4 + 0.3)
    # with TLS: its worker, and a plaintext cluster's phase beside each of its phases
    total = floor + c_floors + control_floor + 2 * qjm + beside + (2 * worker if tls else 0)
    if peers:
        total += len(PEERS) * (3 + 2 * tput + phases * cfg["rounds"] * 1e-3 + (0 if smoke else 7))
    if not smoke:
        total += 25  # download_rss_mib: 1 GiB written, caught up by a node and read
    return total


def duration_words(seconds: float) -> str:
    """A duration in words: "about 40 s" under a minute and a half, else "about 5 min"."""
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.0f} min"


def run(
    smoke: bool = False,
    json_out: bool = False,
    plot: str | None = None,
    peers: bool = False,
    directory: str | None = None,
    tls: bool = False,
) -> dict[str, Any]:
    """Measure floor, qjm native and qjm pure in one run on one disk; print the table (or JSON).

    ``smoke`` runs tiny counts (seconds), for CI. ``peers`` then measures ZooKeeper, etcd and NATS
    JetStream (``qjm.bench.peers``) on the same disk and prints the second table (a failed or
    missing peer fails the run, exit status 1 and ``failed_phases`` naming it, rather than being
    skipped; the figures of every other phase are still reported). ``directory`` is where the run's
    temporary directory goes (the disk measured; default: the system's temporary directory).
    ``plot`` writes a PNG there. Progress lines go to stderr, starting with an estimate of the time.

    Returns a dict (the ``--json`` output is the same without ``raw``):

    - ``smoke``: bool; ``machine``: cpu, cpus, kernel, python, filesystem, directory, load averages,
      capabilities, ``qjm_version`` and ``commit`` (of the qjm checkout measured, or "unknown");
    - ``summary``: ``floor``, ``native``, ``pure``, each a dict of figures: ``sync_p50_us``,
      ``sync_p99_us``, ``sync_cpu_us`` (CPU per sync commit, user + kernel, of every process of
      the worker), ``tput100_rps``/``_mbps``, ``tput1024_rps``/``_mbps``, CPU per record
      (``tput{size}_cpu_user_ns``/``_kernel_ns``), ``tput{size}_in_sync``, ``failover_p50_ms``,
      ``failover_cold_p50_ms``, ``failover_same_process_p50_ms`` (the floor: also ``ceiling_*``;
      native and pure: also ``tput_roll_rps``, ``tput_noroll_rps`` and ``pipelined_roll_ratio``,
      the median of the ratios of pairs of phases with and without the writer's own rolls, and
      ``rolls``, ``roll_every_s``, ``roll_in_sync`` of ``roll_nodes``);
      each figure is the median of its counted phases, and ``spread[figure]`` holds ``min``, ``max``
      and every counted ``phases`` value (failovers: ``q1``, ``q3`` and every ``runs`` value);
      ``warmup`` the warm-up phases, which are not counted;
    - ``c_floors``: ``local_p50_us``, ``local_p99_us``, ``net_p50_us``, ``net_p99_us``,
      ``local_cpu_us``, ``net_cpu_us`` (CPU per commit of netfloor and its receivers), and the
      same networked round in Python processes (``qjm.bench.pyfloor``): ``py_*`` with no protocol,
      ``bare_*`` over qjm's wire and native receiver (``_p50_us``, ``_p99_us``, ``_cpu_us``)
      (medians of runs) and their ``spread``, or ``skipped``: why;
    - ``summary["native"]["floors_beside"]``: the C networked floor and ``bare`` run right before
      each counted sync-latency phase (``net_p50_us``, ``net_p99_us``, ``bare_p50_us``,
      ``bare_p99_us``; the warm-up phase's under ``warmup``), absent when the C floors were skipped;
    - ``sync_goals`` (empty when the C floors were skipped): for ``sync_p50_us`` and ``sync_p99_us``,
      qjm native's ``ratio`` to the C networked floor's, ``goal``, ``met``, ``phases_ratio`` and
      ``settled`` (False when the goal lies inside ``phases_ratio``). With ``floors_beside``
      (``paired``: True) the ratio is the median over the phases of each phase's over the C floor
      run right before it, ``phases_ratio`` their lowest and highest, and ``separate_runs_ratio``
      the medians' ratio against the C floor's own runs; else the ratio is that, and
      ``phases_ratio`` the widest ratio the phases allow. With the Python floors,
      ``python_floors`` (each over the C floor; paired, ``bare`` only, from beside the phases),
      ``allowance_us`` (what the goal leaves qjm's protocol over ``bare``; negative when the goal
      is below ``bare``) and ``protocol_us`` (what it takes);
    - ``control_floor`` (absent when it failed: see ``failed_phases``): ``cold_p50_ms`` and
      ``cold_nodisk_p50_ms``, a cold process's takeover rounds over bare gRPC to three servers
      doing the node's disk work in each round, or none, and ``cold_socket_p50_ms``, the same rounds
      with the disk work over plain TCP sockets (``qjm.bench.control_floor``), medians of
      ``cold_failovers`` runs, and their ``spread``;
    - with ``peers``: ``peers``: per peer the same figures, plus ``batch{size}_rps``/``_mbps`` of its
      batching client, ``durable``, ``version``, ``how``, ``how_batched``; and ``peer_goals``:
      ``best_durable_row`` (peer, client, ratio of qjm native's 1 KiB records/s to it, in words),
      ``latency``, ``throughput`` and ``non_durable`` (the project's goals, met or not);
    - ``download_rss_mib`` (not in a smoke run): the RSS growth, in MiB, of a node catching up a
      1 GiB finalized segment, of the node serving it, of a reader reading it and of the node serving
      that reader, and the read's seconds;
    - with ``tls``: ``summary.native_tls`` (qjm native with mutual TLS on both planes, its
      failovers by other processes not measured; ``plain_beside``: the phases of a plaintext
      cluster run right before each of its latency and throughput phases, per figure) and
      ``tls_goals`` (each goal's ratio and verdict; with ``plain_beside``, ``paired``: the median
      of each TLS phase's ratio to the plaintext phase before it, ``phases_ratio``, ``settled``
      and ``separate_runs_ratio``, the ratio to ``summary.native``);
    - ``failed_phases`` (only when one failed): phase name → the error; the other phases' figures
      are still reported, and ``qjm bench`` exits with 1;
    - ``raw``: every sample of every worker (latency samples per phase, in seconds).
    """
    check_options(plot, directory)
    warn_if_short_of_space(directory, smoke)
    kind = "smoke" if smoke else "full"
    took = duration_words(estimate_seconds(smoke, peers, tls))
    progress(f"{took} on an idle 2-core machine ({kind} run)", False)
    # absolute: the peers' servers run in directories of their own and are given paths under it
    base = tempfile.mkdtemp(prefix="qjm-bench-", dir=os.path.abspath(directory) if directory else None)
    peer_raw: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    t0 = time.monotonic()
    try:
        machine = machine_info(base)
        progress("floor (three local appenders)", False)
        raw: dict[str, Any] = {
            "floor": in_dir(os.path.join(base, "floor"), lambda d: run_worker("floor", d, smoke, pure=False)),
        }
        progress(f"C and Python networked floors ({time.monotonic() - t0:.0f} s so far)", False)
        netfloor: str | None = None
        try:
            netfloor = build_netfloor(base)
            c_floors = run_c_floors(base, smoke, netfloor)
        except FloorSkipped as e:
            c_floors = {"skipped": str(e)}
        progress(
            f"control floor: a takeover's rounds over bare gRPC and sockets ({time.monotonic() - t0:.0f} s so far)",
            False,
        )
        control_floor = None
        try:
            control_floor = in_dir(os.path.join(base, "control"), lambda d: run_control_floor(d, smoke))
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            failed["control_floor"] = f"{type(e).__name__}: {e}"  # the other phases' figures still count
            progress(f"control floor failed: {e}", False)
        progress(f"qjm native ({time.monotonic() - t0:.0f} s so far)", False)
        raw["native"] = in_dir(
            os.path.join(base, "native"), lambda d: run_worker("qjm", d, smoke, pure=False, netfloor=netfloor)
        )
        progress(f"qjm pure ({time.monotonic() - t0:.0f} s so far)", False)
        raw["pure"] = in_dir(os.path.join(base, "pure"), lambda d: run_worker("qjm", d, smoke, pure=True))
        if tls:
            progress(f"qjm native with mutual TLS ({time.monotonic() - t0:.0f} s so far)", False)
            raw["native_tls"] = in_dir(
                os.path.join(base, "native_tls"), lambda d: run_worker("qjm", d, smoke, pure=False, tls=True)
            )
        # 1 GiB through the writer, a catch-up and a reader: minutes, so not in --smoke (the
        # integration test runs the same measurement on 120 MiB)
        download = None
        if not smoke:
            progress(f"download_rss_mib: a {DOWNLOAD_MIB} MiB segment ({time.monotonic() - t0:.0f} s so far)", False)
            try:
                download = in_dir(os.path.join(base, "download"), lambda d: measure_download_rss(d, DOWNLOAD_MIB))
            except (AssertionError, OSError, RuntimeError, subprocess.SubprocessError, QJMError) as e:
                # one phase that fails does not throw away the others' minutes of figures
                failed["download_rss_mib"] = f"{type(e).__name__}: {e}"
                progress(f"download_rss_mib failed: {e}", False)
        if peers:
            machine["loadavg_before_peers"] = os.getloadavg()
            for name in PEERS:
                progress(f"peer {name} ({time.monotonic() - t0:.0f} s so far)", False)
                try:
                    peer_raw[name] = in_dir(
                        os.path.join(base, f"peer-{name}"), functools.partial(run_peer_worker, name, smoke=smoke)
                    )
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    # The run fails (exit 1, the peer named), but keeps every figure measured: a peer
                    # that dies must not throw away minutes of qjm's and the other peers' phases.
                    failed[f"peer {name}"] = f"{type(e).__name__}: {e}"
                    progress(f"peer {name} failed: {str(e).splitlines()[0]}", False)
        machine["loadavg_after"] = os.getloadavg()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    progress(f"done in {time.monotonic() - t0:.0f} s", False)
    result: dict[str, Any] = {
        "smoke": smoke,
        "machine": machine,
        "summary": {k: summarise(v) for k, v in raw.items()},
        "c_floors": c_floors,
        "raw": raw,
    }
    if control_floor is not None:
        result["control_floor"] = control_floor
    if download is not None:
        result["download_rss_mib"] = download
    if failed:
        result["failed_phases"] = failed
    if peers:
        meta = ("durable", "version", "how", "how_batched")
        result["peers"] = {k: summarise(v) | {m: v[m] for m in meta} for k, v in peer_raw.items()}
        raw["peers"] = peer_raw
        result["peer_goals"] = peer_goals(result)
    if tls:
        result["tls_goals"] = tls_goals(result["summary"])
    result["sync_goals"] = sync_goals(c_floors, result["summary"]["native"])
    if plot:
        plot_result(result, plot)
    if json_out:
        print(json.dumps({k: v for k, v in result.items() if k != "raw"}, indent=2))
    else:
        print(table(result))
        if tls:
            print()
            print(tls_table(result))
        if peers:
            print()
            print(peers_table(result))
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``run``, for ``python -m qjm.bench`` and ``qjm bench`` alike."""
    p.add_argument("--smoke", action="store_true", help="tiny counts, for CI")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--plot", metavar="PNG", help="latency, throughput, failover, tail panels (matplotlib)")
    p.add_argument("--peers", action="store_true", help="also ZooKeeper, etcd and NATS JetStream (bench/peers/)")
    p.add_argument("--dir", metavar="DIR", help="measure the disk of DIR (default: the system's temporary directory)")
    p.add_argument("--tls", action="store_true", help="also qjm native with mutual TLS on both planes, beside native")


def run_from(a: argparse.Namespace) -> int:
    """``run`` with the options of ``add_arguments``; a usage error is one line on stderr, exit code 2."""
    try:
        check_options(a.plot, a.dir)
    except BenchUsageError as e:
        print(f"qjm bench: {e}", file=sys.stderr)
        return 2
    result = run(smoke=a.smoke, json_out=a.json, plot=a.plot, peers=a.peers, directory=a.dir, tls=a.tls)
    for phase, why in result.get("failed_phases", {}).items():
        print(f"qjm bench: the {phase} phase failed: {why}", file=sys.stderr)
    return 1 if result.get("failed_phases") else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qjm.bench", description=DESCRIPTION)
    add_arguments(p)
    p.add_argument("--worker", choices=["floor", "qjm", "peer", "process-failover", "tail"], help=argparse.SUPPRESS)
    p.add_argument("--uri", help=argparse.SUPPRESS)
    p.add_argument("--follow", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--peer", help=argparse.SUPPRESS)
    p.add_argument("--base", help=argparse.SUPPRESS)
    p.add_argument("--pure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--netfloor", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker == "process-failover":
        print(worker_process_failover(a.uri, a.follow))
        return 0
    if a.worker == "tail":
        worker_tail(a.uri, a.follow)
        return 0
    if a.worker:
        cfg = dict(SMOKE if a.smoke else FULL)
        if a.pure and not a.smoke:
            cfg["rounds"] = int(cfg["rounds"] * PURE_SCALE)
        os.makedirs(a.base, exist_ok=True)
        if a.worker == "peer":
            try:
                res = measure(a.peer, a.base, cfg)
            except RuntimeError as e:  # the peer failed to start or to run: said whole, no traceback
                print(f"qjm bench: {e}", file=sys.stderr)
                return 1
        else:
            res = (
                worker_floor(a.base, cfg)
                if a.worker == "floor"
                else worker_qjm(a.base, cfg, tls=a.tls, netfloor=a.netfloor, settle=not a.smoke)
            )
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
    version, commit = qjm_build()
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "filesystem": fs,
        "directory": base,
        "loadavg_before": os.getloadavg(),
        "capabilities": capabilities(base),
        "qjm_version": version,
        "commit": commit,
    }


def qjm_build() -> tuple[str, str]:
    """qjm's version and the commit of the qjm checkout this package was imported from (found from
    the package's own location, whatever the current directory), or "unknown" for an installed copy."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(qjm.__file__)))
    commit = "unknown"
    try:
        top = subprocess.run(
            ["git", "-C", here, "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False
        ).stdout.strip()
        # the package must be in that checkout's tree (src/qjm), not merely under some other repository
        if top and os.path.isfile(os.path.join(top, "src", "qjm", "__init__.py")):
            done = subprocess.run(["git", "-C", top, "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
            commit = done.stdout.strip() or commit
            dirty = subprocess.run(
                ["git", "-C", top, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True, check=False,
            ).stdout.strip()  # fmt: skip
            if dirty and commit != "unknown":
                commit += "+dirty"
    except OSError:
        pass
    return qjm.__version__, commit
