"""The CPU of a sync commit process by process, beside the C networked floor's, run after run.

    python bench/cpu_split.py [RUNS] [DIR]

Each run (default 3) times the C networked floor (``bench/netfloor``'s ``net`` mode: a writer and
three receivers, no protocol) and then qjm native (a writer in this process syncing 1 KiB records
one by one against a three-node ``MiniJournalCluster``), both on the disk of DIR (default: the
system's temporary directory). For each it prints the sync p50 and p99 and, per process, the CPU
(user + kernel, from ``/proc``) and the voluntary context switches per commit; then qjm's p50 and
p99 over the C floor's, pair by pair and their medians over all pairs: each floor is measured
right before its qjm phase, so load and disk stalls that come and go weigh on both sides alike
over many pairs.

netfloor reports only its latencies, so its processes are read twice while it runs: its whole
CPU per round is exact (``getrusage`` of its process tree over the whole run, divided by the
rounds), and that is split between its writer and receivers, and turned into switches per round,
by what each process used between the two reads. A measuring tool, not a test: nothing here
asserts a time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from script_args import count_and_dir  # bench/, the script's own directory

HERE = Path(__file__).resolve().parent
C_ROUNDS = 30000  # 6-10 s here: the two reads below must fall inside its run
C_WINDOW = 2.0  # seconds between the two reads of netfloor's processes, well inside its run
QJM_SECONDS = 3.0
WARM_COMMITS = 500


def _netfloor_runner():  # bench/netfloor/run.py builds the binary; it is a script, not a package
    spec = importlib.util.spec_from_file_location("netfloor_run", HERE / "netfloor" / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _read(pids: list[int]) -> list[tuple[float, int]]:
    from qjm.bench.workload import process_cpu_seconds, voluntary_switches

    return [(sum(process_cpu_seconds(p)), voluntary_switches(p)) for p in pids]


def c_floor(binary: Path, directory: str) -> dict[str, object]:
    sub = tempfile.mkdtemp(prefix="cpu-split-c-", dir=directory)
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen([str(binary), "net", sub, str(C_ROUNDS)], stdout=subprocess.PIPE, text=True)
        receivers: list[int] = []
        deadline = time.monotonic() + 10
        while len(receivers) < 3 and time.monotonic() < deadline:  # forked once its files are ready
            out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
            receivers = [int(x) for x in out.split()]
            time.sleep(0.01)
        pids = [proc.pid, *receivers]
        time.sleep(0.5)  # past its uncounted warm-up rounds; what is measured is the window below
        first = _read(pids)
        time.sleep(C_WINDOW)
        second = _read(pids)
        stdout, _ = proc.communicate(timeout=600)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        shutil.rmtree(sub, ignore_errors=True)
    if proc.returncode != 0 or len(receivers) != 3:
        sys.exit(f"cpu_split.py: netfloor net failed (exit {proc.returncode}, {len(receivers)} receivers seen)")
    result = json.loads(stdout.strip().splitlines()[-1])
    per_round = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / C_ROUNDS
    used = [b[0] - a[0] for a, b in zip(first, second, strict=True)]
    rounds = sum(used) / per_round  # the rounds the window held, from the CPU they took
    return {
        "p50_us": result["p50_us"],
        "p99_us": result["p99_us"],
        "cpu_us": [per_round * u / sum(used) * 1e6 for u in used],
        "switches": [(b[1] - a[1]) / rounds for a, b in zip(first, second, strict=True)],
    }


def qjm_native(directory: str) -> dict[str, object]:
    import qjm
    from qjm.testing.minicluster import MiniJournalCluster

    record = b"x" * 1024
    work = tempfile.mkdtemp(prefix="cpu-split-qjm-", dir=directory)
    try:
        with MiniJournalCluster(3, os.path.join(work, "cluster")) as c:
            w = qjm.open_writer(c.uri, create=True)
            for _ in range(WARM_COMMITS):
                w.append(record)
                w.sync()
            pids = [os.getpid(), *(n.proc.pid for n in c.nodes if n.proc is not None)]
            first = _read(pids)
            lat: list[float] = []
            end = time.monotonic() + QJM_SECONDS
            while time.monotonic() < end:
                t = time.perf_counter_ns()
                w.append(record)
                w.sync()
                lat.append(time.perf_counter_ns() - t)
            second = _read(pids)
            w.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from qjm.bench.workload import pct

    n = len(lat)
    return {
        "p50_us": pct(lat, 0.5) / 1e3,
        "p99_us": pct(lat, 0.99) / 1e3,
        "cpu_us": [(b[0] - a[0]) / n * 1e6 for a, b in zip(first, second, strict=True)],
        "switches": [(b[1] - a[1]) / n for a, b in zip(first, second, strict=True)],
    }


def _line(name: str, others: str, r: dict[str, object]) -> str:
    cpu, sw = r["cpu_us"], r["switches"]
    assert isinstance(cpu, list) and isinstance(sw, list)
    return (
        f"  {name:<4} p50 {r['p50_us']:5.0f} µs, p99 {r['p99_us']:5.0f} µs; "
        f"CPU per commit {sum(cpu):4.0f} µs: writer {cpu[0]:.0f}, "
        f"{others} {', '.join(f'{x:.0f}' for x in cpu[1:])}; voluntary switches: writer {sw[0]:.2f}, "
        f"{others} {', '.join(f'{x:.2f}' for x in sw[1:])}"
    )


def main(runs: int, directory: str) -> None:
    runner = _netfloor_runner()
    with tempfile.TemporaryDirectory() as tmp:
        binary = runner.build(Path(tmp))
        print(f"{runs} runs: C networked floor ({C_ROUNDS} rounds) then qjm native ({QJM_SECONDS:.0f} s of syncs)")
        ratios: list[tuple[float, float]] = []
        for i in range(runs):
            c = c_floor(binary, directory)
            q = qjm_native(directory)
            print(f"run {i + 1} (load {os.getloadavg()[0]:.1f})")
            print(_line("C", "receivers", c))
            print(_line("qjm", "nodes", q))
            print(f"  qjm / C: p50 {q['p50_us'] / c['p50_us']:.2f}x, p99 {q['p99_us'] / c['p99_us']:.2f}x")
            ratios.append((q["p50_us"] / c["p50_us"], q["p99_us"] / c["p99_us"]))
        if runs > 1:
            p50s, p99s = sorted(r[0] for r in ratios), sorted(r[1] for r in ratios)
            print(
                f"over {runs} pairs: qjm / C p50 median {statistics.median(p50s):.2f}x ({p50s[0]:.2f}-{p50s[-1]:.2f}), "
                f"p99 median {statistics.median(p99s):.2f}x ({p99s[0]:.2f}-{p99s[-1]:.2f})"
            )


if __name__ == "__main__":
    main(*count_and_dir(sys.argv[1:], "cpu_split.py", "RUNS", 3))
