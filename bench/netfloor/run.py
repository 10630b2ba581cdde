#!/usr/bin/env python3
"""Run netfloor's ``local`` and ``net`` modes side by side, alternating, and compare them.

Compiles ``netfloor.c`` with gcc into a temporary directory (or uses ``netfloor`` next to it if
that is newer than the source), runs ``local`` and ``net`` three times each in alternating order
(L N, N L, L N), and prints per-run p50/p99 and the medians of the net/local ratios.

    python3 bench/netfloor/run.py [--rounds N] [--dir D] [--repeats K] [--nosync] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "netfloor.c"
PREBUILT = HERE / "netfloor"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]
RUN_TIMEOUT = 300.0


def build(tmp: Path) -> Path:
    """The netfloor binary: the one next to the source if newer, else freshly compiled in ``tmp``."""
    if PREBUILT.is_file() and os.access(PREBUILT, os.X_OK) and PREBUILT.stat().st_mtime > SOURCE.stat().st_mtime:
        return PREBUILT
    gcc = shutil.which("gcc")
    if gcc is None:
        sys.exit("run.py: gcc not found on PATH; install it (Debian: apt-get install gcc) to build netfloor.c")
    out = tmp / "netfloor"
    proc = subprocess.run([gcc, *CFLAGS, "-o", str(out), str(SOURCE)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"run.py: gcc failed to compile {SOURCE}:\n{proc.stderr}")
    return out


def run_mode(binary: Path, mode: str, directory: Path, rounds: int) -> dict[str, Any]:
    """One run of one mode in a fresh sub-directory; its JSON line as a dict."""
    sub = directory / f"{mode}-{time.monotonic_ns()}"
    sub.mkdir()
    try:
        proc = subprocess.run(
            [str(binary), mode, str(sub), str(rounds)], capture_output=True, text=True, timeout=RUN_TIMEOUT
        )
    finally:
        shutil.rmtree(sub, ignore_errors=True)
    if proc.stderr:
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"run.py: netfloor {mode} failed (exit {proc.returncode})")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        sys.exit(f"run.py: netfloor {mode} printed nothing")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def machine_load() -> str:
    """Load average and I/O pressure right now: other work on the machine skews every figure."""
    parts: list[str] = []
    for name, path in (("loadavg", "/proc/loadavg"), ("io pressure", "/proc/pressure/io")):
        try:
            with open(path) as f:
                parts.append(f"{name}: {f.readline().strip()}")
        except OSError:
            pass
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3000, help="rounds per run, warm-up (200) included (default 3000)")
    p.add_argument("--dir", type=Path, help="data directory (default: a fresh temporary directory under /tmp)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each mode (default 3)")
    p.add_argument("--nosync", action="store_true", help="also run netnosync (receivers skip fdatasync) each time")
    p.add_argument("--json", action="store_true", help="print all results as one JSON object on the last line")
    a = p.parse_args(argv)
    if a.rounds <= 200:
        p.error("--rounds must be > 200 (the first 200 are warm-up)")
    if a.repeats < 1:
        p.error("--repeats must be >= 1")

    with tempfile.TemporaryDirectory(prefix="netfloor-", dir="/tmp") as tmp_name:
        tmp = Path(tmp_name)
        binary = build(tmp)
        if a.dir is not None:
            a.dir.mkdir(parents=True, exist_ok=True)
            data = a.dir
        else:
            data = tmp / "data"
            data.mkdir()
        load_before = machine_load()
        runs: list[dict[str, dict[str, Any]]] = []
        for i in range(a.repeats):
            order = ["local", "net"] if i % 2 == 0 else ["net", "local"]
            if a.nosync:
                order.append("netnosync")
            runs.append({mode: run_mode(binary, mode, data, a.rounds) for mode in order})
        load_after = machine_load()

    ratio50 = [r["net"]["p50_us"] / r["local"]["p50_us"] for r in runs]
    ratio99 = [r["net"]["p99_us"] / r["local"]["p99_us"] for r in runs]
    modes = ["local", "net"] + (["netnosync"] if a.nosync else [])
    head = "| run | order | " + " | ".join(f"{m} p50 | {m} p99" for m in modes) + " | net/local p50 | net/local p99 |"
    print(f"netfloor: {a.rounds} rounds per run (first 200 not counted), µs; binary {binary.name}")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for i, r in enumerate(runs):
        cells = " | ".join(f"{r[m]['p50_us']:.1f} | {r[m]['p99_us']:.1f}" for m in modes)
        seq = " ".join(m[0].upper() if m != "netnosync" else "S" for m in r)
        print(f"| {i + 1} | {seq} | {cells} | {ratio50[i]:.2f} | {ratio99[i]:.2f} |")
    med50, med99 = statistics.median(ratio50), statistics.median(ratio99)
    print(f"median net/local: p50 {med50:.2f}x, p99 {med99:.2f}x")
    print(f"before: {load_before}")
    print(f"after:  {load_after}")
    direct = all(r[m]["o_direct"] for r in runs for m in ("local", "net"))
    if not direct:
        print("note: O_DIRECT was refused somewhere; buffered I/O was used")
    if a.json:
        print(
            json.dumps(
                {
                    "rounds": a.rounds,
                    "runs": runs,
                    "median_ratio_p50": med50,
                    "median_ratio_p99": med99,
                    "o_direct": direct,
                    "load_before": load_before,
                    "load_after": load_after,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
