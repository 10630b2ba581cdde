"""The arithmetic behind ``qjm bench``'s derived figures: CPU per record and the disk's ceiling."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from qjm.bench import floor, report, workload
from qjm.protocol.frame import FRAME_HEADER_SIZE, RECORD_PREFIX_SIZE


def test_a_record_costs_its_prefix_and_its_share_of_the_frame_header() -> None:
    per = workload.records_per_batch(100)
    assert per * (100 + RECORD_PREFIX_SIZE) >= workload.BATCH_BYTES > (per - 1) * (100 + RECORD_PREFIX_SIZE)
    assert workload.disk_bytes_per_record(100) == 100 + RECORD_PREFIX_SIZE + FRAME_HEADER_SIZE / per


def test_cpu_seconds_counts_another_process() -> None:
    """A child that burns CPU, then waits for its stdin to close, is read while still alive."""
    burn = "import sys,time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass\nprint('done',flush=True)\n"
    burn += "sys.stdin.read()\n"
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        mine = workload.cpu_seconds([])
        both = workload.cpu_seconds([child.pid])
        assert sum(both) - sum(mine) >= 0.25  # process_time() is a system call: user and kernel
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    per = workload.cpu_per_record((1.0, 2.0), (1.5, 2.25), 1000)
    assert per == {"cpu_user_ns": 500_000.0, "cpu_kernel_ns": 250_000.0}


def test_ceiling_figures_and_the_note() -> None:
    raw = {
        "latency": [0.0001],
        "failover": [0.002],
        "tput100": 1e6,
        "tput1024": 1e5,
        "ceiling_bps": 500e6,
        "raw_ceiling_bps": 1000e6,
        "tput100_cpu": {"cpu_user_ns": 10.0, "cpu_kernel_ns": 20.0},
    }
    floor = report.summarise(raw)
    assert floor["ceiling100_rps"] == 500e6 / workload.disk_bytes_per_record(100)
    assert floor["raw_ceiling1024_rps"] == 1000e6 / workload.disk_bytes_per_record(1024)
    assert floor["tput100_cpu_user_ns"] == 10.0
    native = dict(floor, tput100_rps=floor["ceiling100_rps"] / 2, tput1024_rps=floor["ceiling1024_rps"])
    pure = dict(floor, tput100_rps=floor["ceiling100_rps"] / 10, tput1024_rps=floor["ceiling1024_rps"] / 5)
    note = report.ceiling_note({"floor": floor, "native": native, "pure": pure})
    assert "500 MB/s each" in note and "1000 MB/s" in note
    assert "native reaches 50% of it; 10x pure would be" in note and "= 1.00x it (0.50x" in note
    assert "native reaches 100% of it" in note and "= 2.00x it (1.00x" in note
    del raw["raw_ceiling_bps"]
    refused = report.summarise(dict(raw, raw_ceiling_error="[Errno 22] Invalid argument"))
    note = report.ceiling_note({"floor": refused, "native": native, "pure": pure})
    assert "with no preallocation: not measured ([Errno 22] Invalid argument)" in note
    assert "x the ceiling with no preallocation" not in note


def test_c_floors_compile_and_run_in_this_run(tmp_path: Path) -> None:
    """bench/netfloor built and run for real (the checkout has it, and the build needs gcc)."""
    c = floor.run_c_floors(str(tmp_path), smoke=True)
    assert "skipped" not in c, c
    assert 0 < c["local_p50_us"] <= c["local_p99_us"] and 0 < c["net_p50_us"] <= c["net_p99_us"]
    note = report.c_floor_note(c, {"sync_p50_us": 2 * c["net_p50_us"]})
    assert "qjm native sync p50 = 2.00x the networked floor" in note


def test_c_floor_note_says_why_it_was_not_measured() -> None:
    assert report.c_floor_note({"skipped": "no C compiler (gcc/cc)"}, {}) == (
        "C floors (bench/netfloor): not measured: no C compiler (gcc/cc)"
    )


def test_the_tls_goals_compare_native_with_and_without_tls() -> None:
    """Latency is met at or under 1.15x plaintext, throughput at or over 0.8x, each record size on its own."""
    raw = {
        "latency": [0.001],
        "failover": [],
        "failover_same_process": [0.05],
        "tput100": 1e6,
        "tput1024": 1e5,
        "tput100_cpu": {"cpu_user_ns": 100.0, "cpu_kernel_ns": 200.0},
        "tput1024_cpu": {"cpu_user_ns": 1000.0, "cpu_kernel_ns": 2000.0},
    }
    plain = report.summarise(raw)
    tls = report.summarise(dict(raw, latency=[0.00115], tput100=0.8e6, tput1024=0.79e5))
    verdicts = report.tls_goals({"native": plain, "native_tls": tls})
    assert verdicts["sync_p50_us"]["met"] and verdicts["tput100_rps"]["met"]
    assert not verdicts["tput1024_rps"]["met"]
    slower = report.tls_goals({"native": plain, "native_tls": dict(tls, sync_p50_us=plain["sync_p50_us"] * 1.2)})
    assert not slower["sync_p50_us"]["met"]
    table = report.tls_table({"summary": {"native": plain, "native_tls": tls}})
    assert "| 300 | 300 | 1.00x |" in table  # CPU per 100 B record, user + kernel
    assert table.count(": missed") == 1 and table.count(": met") == 2
