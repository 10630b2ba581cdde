"""The arithmetic behind ``qjm bench``'s figures (phases, spread, CPU per record, the disk's ceiling),
its wording, the peers' rows, its options and what it records about the qjm it measured."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import qjm
from qjm.bench import control_floor, download, driver, floor, peers, pyfloor, report, workload
from qjm.protocol import wire
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


def test_voluntary_switches_counts_every_thread_of_another_process() -> None:
    """A child whose second thread sleeps 50 times (each sleep a voluntary switch of that thread),
    read while both threads are alive: more than the main thread's own count by at least those 50."""
    sleeps = "import sys,threading,time\n"
    sleeps += "def s():\n    for _ in range(50):\n        time.sleep(0.001)\n"
    sleeps += "    print('done',flush=True); sys.stdin.read()\n"
    sleeps += "t=threading.Thread(target=s); t.start(); t.join()\n"
    child = subprocess.Popen([sys.executable, "-c", sleeps], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        with open(f"/proc/{child.pid}/status") as f:  # the main thread's line (the process's own file)
            main = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        assert workload.voluntary_switches(child.pid) >= main + 50
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert workload.voluntary_switches(child.pid) == 0  # gone: no threads left to read


def test_ceiling_figures_and_the_note() -> None:
    raw = {
        "latency": [[0.0001]],
        "failover": [0.002],
        "tput100": [1e6],
        "tput1024": [1e5],
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
    """bench/netfloor built and run for real (the checkout has it, and the build needs gcc), and
    the Python floors beside it, each run of them counted; their segment files are gone after."""
    exe = floor.build_netfloor(str(tmp_path))
    c = floor.run_c_floors(str(tmp_path), True, exe)
    for mode in ("local", "net", "py", "bare"):
        assert 0 < c[f"{mode}_p50_us"] <= c[f"{mode}_p99_us"], mode
        assert c[f"{mode}_cpu_us"] > 0, mode  # the writer and its receivers, per commit
        assert len(c["spread"][f"{mode}_p50_us"]["phases"]) == workload.SMOKE["phases"]
    assert [n for n in os.listdir(tmp_path) if n != "netfloor"] == []
    beside = floor.floors_beside(exe, str(tmp_path / "beside"), int(workload.SMOKE["rounds"]), False)
    assert sorted(beside) == ["bare_p50_us", "bare_p99_us", "net_p50_us", "net_p99_us"]
    assert 0 < beside["net_p50_us"] <= beside["net_p99_us"] and 0 < beside["bare_p50_us"] <= beside["bare_p99_us"]
    assert os.listdir(tmp_path / "beside") == []  # each floor's segment files gone after it
    p50 = report.sync_goals(c, {"sync_p50_us": 2 * c["net_p50_us"]})["sync_p50_us"]
    assert p50["python_floors"]["bare"] == pytest.approx(c["bare_p50_us"] / c["net_p50_us"])
    assert p50["protocol_us"] == pytest.approx(2 * c["net_p50_us"] - c["bare_p50_us"])
    note = report.c_floor_note(c, {"sync_p50_us": 2 * c["net_p50_us"]})
    assert "qjm native sync p50 = 2.00x the networked floor" in note
    assert "CPU per sync commit" not in note  # no figure of qjm's to set beside it
    note = report.c_floor_note(c, {"sync_p50_us": 2 * c["net_p50_us"], "sync_cpu_us": 3 * c["net_cpu_us"]})
    assert f"C networked {c['net_cpu_us']:.0f} µs, qjm native {3 * c['net_cpu_us']:.0f} µs (3.0x)" in note


def _processes_naming(text: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass  # a process that ended while the list was read
    return found


def test_the_control_floor_runs_the_takeover_rounds_on_three_real_servers(tmp_path: Path) -> None:
    """The three kinds of cold takeover are measured; the takeovers with disk work, over gRPC and
    over sockets alike, reach every node's disk, the slowest node's included (segments finalized
    and started in order); no server outlives the measurement."""
    c = control_floor.run_control_floor(str(tmp_path), smoke=True)
    counted = int(workload.SMOKE["cold_failovers"])
    for key in ("cold_p50_ms", "cold_nodisk_p50_ms", "cold_socket_p50_ms"):
        assert c[key] > 0 and len(c["spread"][key]["runs"]) == counted
    takeovers = 2 * (control_floor.WARMUP + counted)  # one over gRPC and one over sockets a repetition
    for i in range(3):
        names = set(os.listdir(tmp_path / f"control-{i}"))
        assert {f"seg-{k}.done" for k in range(takeovers)} <= names and f"seg-{takeovers}" in names, names
    assert _processes_naming(str(tmp_path)) == []


def test_a_control_floor_round_that_fails_fails_the_run(tmp_path: Path) -> None:
    """A node whose disk work fails (its segment to finalize is gone) is a clear error, not a
    figure, over either transport."""
    proc, port, sport = control_floor.start_server(str(tmp_path / "n0"))
    try:
        os.remove(tmp_path / "n0" / "seg-0")
        with pytest.raises(RuntimeError, match="round F"):
            control_floor.cold_run(0, True, [port, port, port])
        with pytest.raises(RuntimeError, match="round F: error FileNotFoundError"):
            control_floor.cold_run(0, True, [sport, sport, sport], over_sockets=True)
    finally:
        proc.kill()
        proc.communicate()
    assert control_floor.main(["nonsense"]) == 2


def test_a_control_floor_that_fails_costs_the_run_only_its_own_figure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run goes on to qjm's own phases, names the failure in ``failed_phases`` and prints the
    table without the control floor's note."""
    cpu = {"cpu_user_ns": 10.0, "cpu_kernel_ns": 20.0}
    raw = {"latency": [[0.0003], [0.0005], [0.0004]], "tput100": [9e5, 8e5], "tput1024": [1e5, 2e5],
           "tput100_cpu": cpu, "tput1024_cpu": cpu, "failover": [0.005, 0.006]}  # fmt: skip
    ran: list[str] = []

    def worker(
        kind: str, base: str, smoke: bool, pure: bool, tls: bool = False, netfloor: str | None = None
    ) -> dict[str, Any]:
        assert netfloor is None  # no C floor to run beside qjm's phases
        ran.append(f"{kind}{'-pure' if pure else ''}")
        return dict(raw)

    def broken(base: str, smoke: bool) -> dict[str, Any]:
        raise RuntimeError("qjm bench: control floor server did not start")

    monkeypatch.setattr(driver, "run_worker", worker)

    def no_compiler(base: str) -> str:
        raise floor.FloorSkipped("no C compiler (gcc/cc)")

    monkeypatch.setattr(driver, "build_netfloor", no_compiler)
    monkeypatch.setattr(driver, "run_control_floor", broken)
    result = driver.run(smoke=True)
    assert ran == ["floor", "qjm", "qjm-pure"]
    assert result["failed_phases"] == {"control_floor": "RuntimeError: qjm bench: control floor server did not start"}
    assert "control_floor" not in result
    out = capsys.readouterr()
    assert "| sync commit p50" in out.out and "failover by a cold process" not in out.out
    assert "control floor failed: qjm bench: control floor server did not start" in out.err


def test_a_full_run_says_when_its_disk_has_less_room_than_a_run_held(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A warning before the run, naming the disk and both figures; none for a smoke run or a disk
    with room."""

    def usage(free: int) -> Any:
        return lambda path: types.SimpleNamespace(total=100 * 10**9, used=100 * 10**9 - free, free=free)

    monkeypatch.setattr(shutil, "disk_usage", usage(12 * 10**9))
    driver.warn_if_short_of_space(str(tmp_path), smoke=False)
    err = capsys.readouterr().err
    assert f"warning: {tmp_path} has 12 GB free; a full run held up to 30 GB at once" in err
    driver.warn_if_short_of_space(str(tmp_path), smoke=True)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(shutil, "disk_usage", usage(60 * 10**9))
    driver.warn_if_short_of_space(str(tmp_path), smoke=False)
    assert capsys.readouterr().err == ""


def test_a_peers_servers_describe_their_state_and_log_tail(tmp_path: Path) -> None:
    """What a failed peer's error carries: each server running or its exit status, its log's end."""
    servers = peers.Servers("demo")
    try:
        servers.spawn(["sh", "-c", "echo boom >&2; exit 3"], str(tmp_path), str(tmp_path / "a.log"))
        servers.spawn(["sleep", "60"], str(tmp_path), str(tmp_path / "b.log"))
        servers.procs[0].wait()
        text = servers.describe()
        assert f"demo server pid {servers.procs[0].pid} exited (3); {tmp_path / 'a.log'}:\nboom" in text
        assert f"demo server pid {servers.procs[1].pid} running" in text
        died = rf"(?s)^demo: server pid {servers.procs[0].pid} exited \(3\); .*boom"
        with pytest.raises(peers.ServerDied, match=died):
            servers.check_alive()
    finally:
        servers.stop()


def test_a_peer_that_fails_costs_the_run_only_its_own_figures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The run goes on to the other peers, names the failed one in ``failed_phases`` (which makes
    the command exit 1) and compares qjm with the peers it measured; the peer's worker says what
    failed in one message, its servers' logs in it, and no traceback. Each phase's directory is
    gone before the next phase starts, a failed one's too."""
    cpu = {"cpu_user_ns": 10.0, "cpu_kernel_ns": 20.0}
    raw = {"latency": [[0.0003], [0.0005], [0.0004]], "tput100": [9e5, 8e5], "tput1024": [1e5, 2e5],
           "tput100_cpu": cpu, "tput1024_cpu": cpu, "failover": [0.005, 0.006]}  # fmt: skip
    peer = {"latency": [[0.002]], "tput100": [3e3], "tput1024": [2e3], "batch100": [2e4], "batch1024": [1e4],
            "durable": True, "version": "1", "how": "one by one", "how_batched": "in batches"}  # fmt: skip
    ran: list[str] = []

    dirs: list[str] = []

    def fills(base: str) -> None:  # a phase's segments; the one before must be gone by now
        assert not any(os.path.exists(d) for d in dirs), dirs
        os.makedirs(base)
        (Path(base) / "segment").write_bytes(b"x" * 4096)
        dirs.append(base)

    def worker(kind: str, base: str, smoke: bool, pure: bool, tls: bool = False, netfloor: str | None = None) -> Any:
        fills(base)
        return dict(raw)

    def peer_worker(name: str, base: str, smoke: bool) -> dict[str, Any]:
        fills(base)
        ran.append(name)
        if name == "etcd":
            raise RuntimeError("qjm bench: peer etcd failed (1):\nqjm bench: etcd: RemoteDisconnected: closed")
        return dict(peer)

    def no_compiler(base: str) -> str:
        raise floor.FloorSkipped("no C compiler (gcc/cc)")

    monkeypatch.setattr(driver, "run_worker", worker)
    monkeypatch.setattr(driver, "run_peer_worker", peer_worker)
    monkeypatch.setattr(driver, "build_netfloor", no_compiler)
    monkeypatch.setattr(driver, "run_control_floor", lambda base, smoke: {"cold_p50_ms": 1.0})
    result = driver.run(smoke=True, peers=True)
    assert ran == ["zookeeper", "etcd", "nats"]
    assert list(result["failed_phases"]) == ["peer etcd"]
    assert "RemoteDisconnected" in result["failed_phases"]["peer etcd"]
    assert sorted(result["peers"]) == ["nats", "zookeeper"]
    assert result["peer_goals"]["best_durable_row"]["peer"] in ("nats", "zookeeper")
    assert "peer etcd failed: qjm bench: peer etcd failed (1):" in capsys.readouterr().err
    assert len(dirs) == 6 and not any(os.path.exists(d) for d in dirs)  # floor, native, pure, 3 peers

    def dies(name: str, base: str, cfg: dict[str, float]) -> dict[str, Any]:
        raise peers.PeerFailed("etcd: RemoteDisconnected: closed\netcd server pid 7 exited (2); server.log:\npanic")

    monkeypatch.setattr(driver, "measure", dies)
    argv = ["--worker", "peer", "--peer", "etcd", "--base", str(tmp_path), "--smoke"]
    assert driver.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("qjm bench: etcd: RemoteDisconnected: closed\n") and "exited (2)" in err
    assert "Traceback" not in err


def test_the_failover_note_sets_the_cold_takeover_beside_the_grpc_and_disk_floors() -> None:
    def iqr_of(key: str, runs: list[float]) -> dict[str, Any]:
        return {key: workload.iqr(runs)["median"], "spread": {key: workload.iqr(runs)}}

    native = iqr_of("failover_cold_p50_ms", [19.0, 20.0, 21.0])
    disk = iqr_of("failover_cold_p50_ms", [2.0, 2.0, 2.0])
    grpc = iqr_of("cold_p50_ms", [14.0, 16.0, 18.0]) | {"cold_nodisk_p50_ms": 10.5}
    note = report.failover_floor_note(grpc, {"native": native, "floor": disk})
    assert "qjm native p50 20.00 (19.00-21.00) ms (goal <= 10 ms: missed)" in note
    assert "16.00 (14.00-18.00) ms with the node's disk work in each round" in note
    assert "10.50 ms without it; the disk work alone 2.00 (2.00-2.00) ms" in note
    assert "qjm native = 1.25x the gRPC floor (that floor is above the goal" in note
    assert "sockets" not in note  # a result without the socket floor (older JSON) says nothing of it
    sockets = report.failover_floor_note(grpc | iqr_of("cold_socket_p50_ms", [4.0, 5.0, 6.0]),
                                         {"native": native, "floor": disk})  # fmt: skip
    assert "10.50 ms without it; the same rounds and disk work over plain TCP sockets, 5.00 (4.00-6.00) ms" in sockets
    assert "cannot meet it on this machine; one whose rounds travel outside gRPC can)" in sockets
    slow = report.failover_floor_note(grpc | {"cold_socket_p50_ms": 12.0}, {"native": native, "floor": disk})
    assert "sockets, 12.00 ms" in slow and "outside gRPC can" not in slow
    fast = report.failover_floor_note(
        grpc | {"cold_p50_ms": 8.0}, {"native": native | {"failover_cold_p50_ms": 9.0}, "floor": disk}
    )
    assert "(goal <= 10 ms: met)" in fast and "above the goal" not in fast and "= 1.12x the gRPC floor" in fast


def test_the_time_estimate_is_in_words_a_reader_can_use() -> None:
    """A smoke run is announced in seconds (never "about 0 min"), a full one in minutes; peers,
    TLS and a full run each add time."""
    assert driver.duration_words(35.3) == "about 35 s" and driver.duration_words(300) == "about 5 min"
    smoke = driver.estimate_seconds(True, False)
    assert driver.duration_words(smoke).endswith(" s") and smoke >= 5
    assert smoke < driver.estimate_seconds(True, True) < driver.estimate_seconds(True, True, tls=True)
    full = driver.estimate_seconds(False, True, tls=True)
    assert driver.duration_words(full).endswith(" min") and full > 5 * driver.estimate_seconds(True, True, tls=True)


def test_cpu_per_sync_commit_is_summarised_from_the_latency_phases() -> None:
    raw: dict[str, Any] = {"latency": [[0.001] * 10], "latency_cpu": {"cpu_user_ns": 150e3, "cpu_kernel_ns": 250e3}}
    assert report.summarise(raw)["sync_cpu_us"] == 400.0
    assert "sync_cpu_us" not in report.summarise({"latency": [[0.001] * 10], "latency_cpu": {}})


def test_c_floor_note_says_why_it_was_not_measured() -> None:
    assert report.c_floor_note({"skipped": "no C compiler (gcc/cc)"}, {}) == (
        "C floors (bench/netfloor): not measured: no C compiler (gcc/cc)"
    )


def test_a_ratio_to_the_c_floor_whose_phases_straddle_its_goal_is_not_called_settled() -> None:
    """The median's verdict stands, and the note adds that the phases fall on both sides of the goal
    when qjm's best phase over the floor's worst and the reverse do; not when both are on one side."""

    def floors(p50: list[float], p99: list[float]) -> dict[str, Any]:
        return {
            "local_p50_us": 100.0, "local_p99_us": 200.0, "net_p50_us": sorted(p50)[1], "net_p99_us": sorted(p99)[1],
            "spread": {"net_p50_us": workload.spread(p50), "net_p99_us": workload.spread(p99)},
        }  # fmt: skip

    def native(p50: list[float], p99: list[float]) -> dict[str, Any]:
        return {
            "sync_p50_us": sorted(p50)[1], "sync_p99_us": sorted(p99)[1],
            "spread": {"sync_p50_us": workload.spread(p50), "sync_p99_us": workload.spread(p99)},
        }  # fmt: skip

    c = floors([200.0, 200.0, 210.0], [400.0, 500.0, 1000.0])
    wide = native([330.0, 340.0, 350.0], [600.0, 700.0, 900.0])
    note = report.c_floor_note(c, wide)
    assert "p50 = 1.70x the networked floor (goal <= 1.2x: missed), " in note  # 330/210 .. 350/200: settled
    assert "p99 = 1.40x the networked p99 (goal <= 1.5x: met; its phases give 0.60x-2.25x, both sides" in note
    assert note.count("this run does not settle it") == 1
    verdicts = report.sync_goals(c, wide)
    assert verdicts["sync_p50_us"]["settled"] and not verdicts["sync_p50_us"]["met"]
    assert verdicts["sync_p99_us"]["met"] and verdicts["sync_p99_us"]["settled"] is False
    assert verdicts["sync_p99_us"]["phases_ratio"] == pytest.approx([0.6, 2.25])
    assert report.sync_goals({"skipped": "no C compiler (gcc/cc)"}, {}) == {}
    steady = report.c_floor_note(
        floors([200.0, 200.0, 210.0], [400.0, 410.0, 420.0]), native([330.0, 340.0, 350.0], [900.0, 950.0, 990.0])
    )
    assert "goal <= 1.5x: missed)" in steady and "does not settle" not in steady  # 900/420 > 1.5
    # Without the floor's phases, or with phases that hold no figure, nothing is called settled or not.
    no_phases = {k: v for k, v in c.items() if k != "spread"}
    assert "does not settle" not in report.c_floor_note(no_phases, wide)
    assert "settled" not in report.sync_goals(no_phases, wide)["sync_p99_us"]
    empty = dict(c, spread={"net_p50_us": workload.spread([]), "net_p99_us": workload.spread([])})
    assert "settled" not in report.sync_goals(empty, wide)["sync_p99_us"]


def test_the_python_floors_refuse_bad_arguments_with_a_usage_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in ([], ["c", str(tmp_path), "300"], ["py", str(tmp_path), "200"], ["py", str(tmp_path), "x"]):
        assert pyfloor.main(argv) == 2
        assert "usage: python -m qjm.bench.pyfloor py|bare DIR ROUNDS" in capsys.readouterr().err
    assert pyfloor.main(["bare", str(tmp_path / "absent"), "300"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(ValueError, match="more than the 200 warm-up rounds"):
        pyfloor.measure("py", str(tmp_path), 200)
    with pytest.raises(ValueError, match="mode must be one of py, bare"):
        pyfloor.measure("C", str(tmp_path), 300)
    pyfloor.check_ack(0, wire.encode_ack(7))
    refusal = wire.encode_error("FENCED", "epoch 3 is below 4", 0)[: wire.ACK.size]
    with pytest.raises(RuntimeError, match=r"receiver 2 answered .* instead of an ack"):
        pyfloor.check_ack(2, refusal)


def test_the_python_floors_say_what_the_sync_goal_leaves_qjms_protocol() -> None:
    """The goal's allowance over the bare floor, in µs, and what qjm's protocol takes; a goal below
    the bare floor itself is called out of reach for Python processes."""
    c = {"local_p50_us": 150.0, "local_p99_us": 300.0, "net_p50_us": 200.0, "net_p99_us": 400.0,
         "py_p50_us": 230.0, "py_p99_us": 450.0, "bare_p50_us": 250.0, "bare_p99_us": 500.0,
         "py_cpu_us": 180.0, "bare_cpu_us": 190.0}  # fmt: skip
    native = {"sync_p50_us": 300.0, "sync_p99_us": 560.0}
    verdicts = report.sync_goals(c, native)
    assert verdicts["sync_p50_us"]["python_floors"] == pytest.approx({"py": 1.15, "bare": 1.25})
    assert verdicts["sync_p50_us"]["allowance_us"] == pytest.approx(-10.0)  # 1.2 x 200 - 250
    assert verdicts["sync_p50_us"]["protocol_us"] == pytest.approx(50.0)
    assert verdicts["sync_p99_us"]["allowance_us"] == pytest.approx(100.0)  # 1.5 x 400 - 500
    note = report.c_floor_note(c, native)
    assert "with no protocol p50 230 µs = 1.15x the C networked floor" in note
    assert "(bare) 250 µs = 1.25x" in note
    assert "The goal lies 10 µs a commit below bare itself: out of reach for Python processes; it takes 50 µs" in note
    assert "CPU per commit, every process: py 180 µs, bare 190 µs" in note
    roomy = report.c_floor_note(dict(c, bare_p50_us=220.0), native)
    assert "The goal leaves qjm's protocol 20 µs a commit over bare; it takes 80 µs" in roomy
    # Runs of the C floors alone (JSON of before the Python floors): no note of them.
    alone = {k: v for k, v in c.items() if not k.startswith(("py_", "bare_"))}
    assert "python_floors" not in report.sync_goals(alone, native)["sync_p50_us"]
    assert "Python processes" not in report.c_floor_note(alone, native)


def test_the_sync_goals_pair_each_phase_with_the_floors_run_right_before_it() -> None:
    """With the floors run beside each latency phase, each phase is judged against its own C floor:
    the ratio is the median of the phases' ratios, their range says whether the run settles the
    goal, and bare's allowance is taken phase by phase; the floor's separate runs are only reported.
    Without a floor beside every phase, the verdict falls back to the separate runs."""
    raw = {
        "latency": [[300e-6] * 3, [340e-6] * 3, [280e-6] * 3],
        "latency_beside": [
            {"net_p50_us": 260.0, "net_p99_us": 400.0, "bare_p50_us": 280.0, "bare_p99_us": 420.0},
            {"net_p50_us": 250.0, "net_p99_us": 400.0, "bare_p50_us": 290.0, "bare_p99_us": 430.0},
            {"net_p50_us": 250.0, "net_p99_us": 380.0, "bare_p50_us": 270.0, "bare_p99_us": 400.0},
        ],
        "latency_beside_warmup": {"net_p50_us": 900.0, "net_p99_us": 990.0, "bare_p50_us": 1.0, "bare_p99_us": 2.0},
    }
    native = report.summarise(raw)
    assert native["floors_beside"] == raw["latency_beside"]
    assert native["warmup"]["floors_beside"]["net_p50_us"] == 900.0  # kept, not counted
    c = {"local_p50_us": 150.0, "local_p99_us": 300.0, "net_p50_us": 200.0, "net_p99_us": 400.0,
         "py_p50_us": 230.0, "py_p99_us": 450.0, "bare_p50_us": 210.0, "bare_p99_us": 500.0}  # fmt: skip
    p50 = report.sync_goals(c, native)["sync_p50_us"]
    ratios = [300 / 260, 340 / 250, 280 / 250]
    assert p50["paired"] and p50["ratio"] == pytest.approx(300 / 260) and p50["met"]
    assert p50["phases_ratio"] == pytest.approx([min(ratios), max(ratios)])
    assert p50["settled"] is False  # 1.12x .. 1.36x holds 1.2x
    assert p50["separate_runs_ratio"] == pytest.approx(1.5)  # qjm's median 300 over the separate runs' 200
    assert p50["python_floors"] == pytest.approx({"bare": 270 / 250})  # of 1.08, 1.16, 1.08
    assert p50["allowance_us"] == pytest.approx(30.0)  # 1.2 x net - bare: 32, 10, 30
    assert p50["protocol_us"] == pytest.approx(20.0)  # qjm - bare: 20, 50, 10
    note = report.c_floor_note(c, native)
    assert "sync p50 = 1.15x the networked floor, phase by phase against the C floor run right before each" in note
    assert "(1.12x-1.36x; against its separate runs 1.50x) (goal <= 1.2x: met; its phases fall on both" in note
    assert "bare, qjm.bench.pyfloor) = 1.08x the C floor beside it" in note
    assert "The goal leaves qjm's protocol 30 µs a commit over bare; it takes 20 µs" in note
    p99 = report.sync_goals(c, native)["sync_p99_us"]  # every sample of a phase is its p99 here
    assert p99["ratio"] == pytest.approx(300 / 400) and p99["met"] and p99["settled"]
    # A floor missing beside a phase: the separate runs judge, as before.
    short = dict(native, floors_beside=raw["latency_beside"][:2])
    alone = report.sync_goals(c, short)["sync_p50_us"]
    assert "paired" not in alone and alone["ratio"] == pytest.approx(1.5)


def test_a_figure_is_the_median_of_counted_phases_and_the_warm_up_is_left_out() -> None:
    raw: dict[str, Any] = {
        "latency_warmup": [0.5] * 10,  # a cold start, far slower: it must not move the figures
        "latency": [[0.001] * 10, [0.003] * 10, [0.002] * 10],
        "tput100_warmup": 1.0,
        "tput100": [300.0, 100.0, 200.0],
        "tput1024": [10.0, 30.0, 20.0],
        "batch1024": [5.0, 7.0],
        "failover": [0.004, 0.001, 0.002, 0.003, 0.005],
    }
    s = report.summarise(raw)
    assert s["sync_p50_us"] == pytest.approx(2000.0)
    assert s["spread"]["sync_p50_us"]["min"] == pytest.approx(1000.0)
    assert s["spread"]["sync_p50_us"]["max"] == pytest.approx(3000.0)
    assert len(s["spread"]["sync_p50_us"]["phases"]) == 3  # every counted phase is kept
    assert s["tput100_rps"] == 200.0 and s["spread"]["tput100_rps"]["phases"] == [300.0, 100.0, 200.0]
    assert s["warmup"] == {"sync_p50_us": pytest.approx(500000.0), "tput100_rps": 1.0}
    assert s["batch1024_rps"] == 6.0 and s["batch1024_mbps"] == 6.0 * 1024 / 1e6
    fo = s["spread"]["failover_p50_ms"]
    assert s["failover_p50_ms"] == pytest.approx(3.0) and (fo["q1"], fo["q3"]) == pytest.approx((2.0, 4.0))
    assert report._fig(s, "tput100_rps") == "200 (100-300)"


def test_phased_runs_one_uncounted_warm_up_then_the_counted_phases(capsys: pytest.CaptureFixture[str]) -> None:
    calls = iter(range(10))
    warm, counted = workload.phased({"phases": 3}, "thing", lambda: next(calls))
    assert (warm, counted) == (0, [1, 2, 3])
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(workload.PROGRESS) and "thing: warm-up phase" in err[0]
    assert err[-1].endswith("thing: phase 3/3")


def test_ratios_are_said_in_words_never_as_a_fraction_better() -> None:
    assert report.times(3.24, "faster", "slower") == "3.2x faster"
    assert report.times(0.7, "faster", "slower") == "1.4x slower"
    assert report.times(float("nan"), "faster", "slower") == "n/a"


def _peer(durable: bool, p50: float, tput: float, batch: float) -> dict[str, Any]:
    v = report.summarise({"latency": [[p50 / 1e6]], "tput100": [tput], "tput1024": [tput], "batch100": [batch],
                          "batch1024": [batch]})  # fmt: skip
    return v | {"durable": durable, "version": "1.0", "how": "one by one", "how_batched": "in multis of 128"}


def test_the_best_durable_row_is_the_batched_one_and_qjm_slower_is_said_slower() -> None:
    native = report.summarise({"latency": [[0.0003]], "tput100": [9e5], "tput1024": [1e5], "failover": [0.005]})
    result: dict[str, Any] = {
        "summary": {"floor": native, "native": native, "pure": native},
        "machine": {},
        "peers": {
            "zookeeper": _peer(True, 1000.0, 3000.0, 20_000.0),
            "etcd": _peer(True, 900.0, 4000.0, 15_000.0),
            "nats": _peer(False, 200.0, 150_000.0, 200_000.0),  # faster than qjm: not durable per message
        },
    }
    assert "failover_p50_ms" not in result["peers"]["etcd"]  # not measured: no NaN in the JSON
    goals = report.peer_goals(result)
    best = goals["best_durable_row"]
    assert (best["peer"], best["client"]) == ("zookeeper", "batched")
    assert best["ratio"] == pytest.approx(5.0) and best["words"] == "5.0x faster"
    assert goals["throughput"]["peer"] == "etcd" and goals["throughput"]["ratio"] == pytest.approx(25.0)
    assert not goals["non_durable"]["nats"]["met"]
    result["peer_goals"] = goals
    text = report.peers_table(result)
    assert "| ZooKeeper 1.0 | batched |" in text and "in multis of 128" in text
    assert "is 5.0x faster" in text
    assert "throughput 2.0x slower" in text  # qjm against NATS's batched row
    assert "better" not in text


def test_plot_without_matplotlib_fails_before_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = driver.importlib.util.find_spec
    monkeypatch.setattr(driver.importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a))

    def no_run(**_: Any) -> dict[str, Any]:
        raise AssertionError("the run started")

    monkeypatch.setattr(driver, "run", no_run)
    args = argparse.Namespace(smoke=True, json=False, plot="out.png", peers=False, dir=None)
    assert driver.run_from(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("qjm bench: --plot needs matplotlib")


@pytest.mark.parametrize("where", ["missing/out.png", "."])
def test_plot_must_be_a_file_it_can_write(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(driver.importlib.util, "find_spec", lambda n, *a: object())  # as if matplotlib were there

    def no_run(**_: Any) -> dict[str, Any]:
        raise AssertionError("the run started")

    monkeypatch.setattr(driver, "run", no_run)
    args = argparse.Namespace(smoke=True, json=False, plot=where, peers=False, dir=None)
    assert driver.run_from(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"qjm bench: --plot {where}: ")


def test_dir_must_be_a_writable_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(smoke=True, json=False, plot=None, peers=False, dir=str(tmp_path / "missing"))
    assert driver.run_from(args) == 2
    assert capsys.readouterr().err == f"qjm bench: --dir {tmp_path / 'missing'}: not a directory\n"


def test_the_commit_recorded_is_the_measured_checkouts_not_the_current_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other-repo"
    other.mkdir()
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")  # fmt: skip
    subprocess.run(["git", "init", "-q"], cwd=other, check=True)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=other, check=True, env=env)
    monkeypatch.chdir(other)
    version, commit = driver.qjm_build()
    assert version == qjm.__version__
    pkg = os.path.dirname(os.path.abspath(qjm.__file__))
    here = subprocess.run(["git", "-C", pkg, "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if here.returncode == 0:  # a checkout: its HEAD, maybe marked dirty
        assert commit.removesuffix("+dirty") == here.stdout.strip()
    else:  # an installed copy
        assert commit == "unknown"
    theirs = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert theirs not in commit


def test_the_plot_has_every_panel_and_says_when_it_is_a_smoke_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    # Throughputs less than a decade apart: matplotlib labels the log axis's minor ticks as well.
    s = report.summarise({"latency": [[0.0003, 0.0004]], "tput100": [2.4e6, 2.3e6], "tput1024": [3e5, 2.9e5],
                          "failover": [0.005, 0.006]})  # fmt: skip
    for smoke, tail in ((True, {}), (False, {"tail_staleness_p50_ms": 1.5, "tail_staleness_p99_ms": 4.0})):
        result = {
            "smoke": smoke,
            "machine": {"qjm_version": "0.1.0", "commit": "abc", "cpus": 2},
            "summary": {"floor": s, "native": s | tail, "pure": s},
            "raw": {k: {"latency": [[0.0003, 0.0004]]} for k in ("floor", "native", "pure")},
        }
        if not smoke:
            result["control_floor"] = {"cold_p50_ms": 15.0}
            result["c_floors"] = {"net_p50_us": 250.0, "py_p50_us": 280.0, "bare_p50_us": 290.0}
        out = tmp_path / f"plot-{smoke}.png"
        texts = report.plot_result(result, str(out))
        assert out.stat().st_size > 10_000
        assert ("SMOKE RUN" in texts[0]) == smoke and "commit abc" in texts[0]
        assert any("failover" in t for t in texts) and any("tail staleness" in t for t in texts)
        assert ("not measured in this run" in texts) == (not tail)
        assert ("cold: bare gRPC rounds + disk work (floor)" in texts) == (not smoke)
        floors = {"p50: C networked floor", "p50: Python, no protocol", "p50: qjm's wire, no protocol",
                  "goal: p50 <= 1.2x the C floor"}  # fmt: skip
        assert (floors <= set(texts)) == (not smoke)
        ticks = [t for t in texts if t[:1].isdigit()]
        assert {"300k", "1M", "2M"} <= set(ticks) and not {"400k", "700k"} & set(ticks), ticks
        assert not [t for t in texts if "times 10" in t or "\\times" in t or "^" in t], "a tick in 10^x form"


def test_over_several_decades_the_throughput_axis_labels_its_major_ticks_only(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    fast = report.summarise({"latency": [[0.0003]], "tput100": [2.4e6], "tput1024": [3e5], "failover": [0.005]})
    slow = report.summarise({"latency": [[0.002]], "tput100": [2.5e3], "tput1024": [2.2e3], "failover": [0.005]})
    result = {
        "smoke": False,
        "machine": {"qjm_version": "0.1.0", "commit": "abc", "cpus": 2},
        "summary": {"floor": fast, "native": fast, "pure": slow},
        "raw": {k: {"latency": [[0.0003]]} for k in ("floor", "native", "pure")},
    }
    ticks = [t for t in report.plot_result(result, str(tmp_path / "p.png")) if t[:1].isdigit()]
    assert {"10k", "100k", "1M"} <= set(ticks) and not {"3k", "20k", "300k"} & set(ticks), ticks


def test_the_table_gives_each_figure_with_its_spread_and_says_when_tail_staleness_was_not_measured() -> None:
    cpu = {"cpu_user_ns": 10.0, "cpu_kernel_ns": 20.0}
    s = report.summarise({"latency": [[0.0003], [0.0005], [0.0004]], "tput100": [9e5, 8e5], "tput1024": [1e5, 2e5],
                          "tput100_cpu": cpu, "tput1024_cpu": cpu, "failover": [0.005, 0.006]})  # fmt: skip
    machine = {"cpu": "cpu", "cpus": 2, "kernel": "6", "python": "3.11", "filesystem": "ext4", "directory": "/d",
               "loadavg_before": (1.0, 1.0, 1.0), "loadavg_after": (2.0, 2.0, 2.0), "capabilities": {},
               "commit": "abc"}  # fmt: skip
    result: dict[str, Any] = {"summary": {"floor": s, "native": s, "pure": s}, "machine": machine,
                              "c_floors": {"skipped": "no C compiler (gcc/cc)"}}  # fmt: skip
    text = report.table(result)
    assert "| 400 (300-500) |" in text
    assert "tail staleness, qjm native: not measured" in text
    result["summary"]["native"] = s | {
        "tail_staleness_p50_ms": 1.5,
        "tail_staleness_p99_ms": 4.25,
        "reader_batches_speedup": 6.0,
    }
    text = report.table(result)
    assert "qjm native: p50 1.50 ms (goal <= 1: MISSED), p99 4.25 ms (goal <= 5: met)" in text
    assert "Reader.batches() reads 6.0x the records/s of per-record iteration (goal >= 5x: met)" in text


def test_the_tls_goals_compare_native_with_and_without_tls() -> None:
    """Latency is met at or under 1.15x plaintext, throughput at or over 0.8x, each record size on its own."""
    raw = {
        "latency": [[0.001]],
        "failover": [],
        "failover_same_process": [0.05],
        "tput100": [1e6],
        "tput1024": [1e5],
        "tput100_cpu": {"cpu_user_ns": 100.0, "cpu_kernel_ns": 200.0},
        "tput1024_cpu": {"cpu_user_ns": 1000.0, "cpu_kernel_ns": 2000.0},
    }
    plain = report.summarise(raw)
    tls = report.summarise(dict(raw, latency=[[0.00115]], tput100=[0.8e6], tput1024=[0.79e5]))
    verdicts = report.tls_goals({"native": plain, "native_tls": tls})
    assert verdicts["sync_p50_us"]["met"] and verdicts["tput100_rps"]["met"]
    assert not verdicts["tput1024_rps"]["met"]
    slower = report.tls_goals({"native": plain, "native_tls": dict(tls, sync_p50_us=plain["sync_p50_us"] * 1.2)})
    assert not slower["sync_p50_us"]["met"]
    table = report.tls_table({"summary": {"native": plain, "native_tls": tls}})
    assert "| 300 | 300 | 1.00x |" in table  # CPU per 100 B record, user + kernel
    assert table.count(": missed") == 1 and table.count(": met") == 2


def test_the_tls_goals_pair_each_tls_phase_with_the_plaintext_phase_run_right_before_it() -> None:
    """With a plaintext cluster's phases beside the TLS worker's, each TLS phase is judged against
    the plaintext phase right before it; the native worker's figure is only reported."""
    cpu = {"cpu_user_ns": 100.0, "cpu_kernel_ns": 200.0}
    plain_raw = {"latency": [[0.0005]], "failover": [], "failover_same_process": [0.05], "tput100": [2e6],
                 "tput1024": [2e5], "tput100_cpu": cpu, "tput1024_cpu": cpu}  # fmt: skip
    tls_raw = dict(
        plain_raw,
        latency=[[0.00033] * 3, [0.00036] * 3, [0.00030] * 3],
        latency_plain=[[0.0003] * 3, [0.0003] * 3, [0.0003] * 3],
        latency_plain_warmup=[0.001],
        tput100=[8.5e5, 7e5, 9e5],
        tput100_plain=[1e6, 1e6, 1e6],
        tput1024=[8e4, 9e4, 7e4],
        tput1024_plain=[1e5, 1e5, 1e5],
    )
    tls = report.summarise(tls_raw)
    assert tls["plain_beside"]["sync_p50_us"] == pytest.approx([300.0] * 3)
    assert tls["plain_beside"]["tput100_rps"] == [1e6] * 3
    verdicts = report.tls_goals({"native": report.summarise(plain_raw), "native_tls": tls})
    p50 = verdicts["sync_p50_us"]
    assert p50["paired"] and p50["ratio"] == pytest.approx(1.1) and p50["met"]
    assert p50["phases_ratio"] == pytest.approx([1.0, 1.2]) and p50["settled"] is False  # 1.2 is past 1.15
    assert p50["separate_runs_ratio"] == pytest.approx(330 / 500)  # the native worker's own, minutes away
    t100 = verdicts["tput100_rps"]
    assert t100["ratio"] == pytest.approx(0.85) and t100["met"] and t100["settled"] is False  # 0.7 .. 0.9
    t1024 = verdicts["tput1024_rps"]
    assert t1024["ratio"] == pytest.approx(0.8) and t1024["met"] and t1024["settled"] is False  # 0.7 .. 0.9
    table = report.tls_table({"summary": {"native": report.summarise(plain_raw), "native_tls": tls}})
    assert "| 1.10x (0.66x) | <= 1.15x: met |" in table and "| 0.85x (0.42x) | >= 0.8x: met |" in table
    assert "each TLS phase over a plaintext cluster's phase run right before it, which the goal judges" in table
    # A plaintext phase missing beside one: the native worker's figure judges, as before.
    short = dict(tls, plain_beside=dict(tls["plain_beside"], sync_p50_us=[300.0, 300.0]))
    alone = report.tls_goals({"native": report.summarise(plain_raw), "native_tls": short})["sync_p50_us"]
    assert "paired" not in alone and alone["ratio"] == pytest.approx(330 / 500)


def test_the_roll_ratio_is_the_median_of_the_pairs_ratios_with_their_spread() -> None:
    """Each pair of phases gives a ratio; the figure is their median, not the ratio of the sums
    (here 0.8), so one pair hit by a burst of load does not move it."""
    raw: dict[str, Any] = {"latency": [[0.001]], "tput_roll": [90e3, 100e3, 50e3], "tput_noroll": [100e3] * 3,
                           "rolls": 3, "roll_every": 1.0, "roll_in_sync": 3, "roll_nodes": 3}  # fmt: skip
    s = report.summarise(raw)
    assert s["pipelined_roll_ratio"] == pytest.approx(0.9)
    sp = s["spread"]["pipelined_roll_ratio"]
    assert (sp["min"], sp["max"]) == pytest.approx((0.5, 1.0)) and sp["phases"] == pytest.approx([0.9, 1.0, 0.5])
    assert s["tput_roll_rps"] == 90e3 and s["spread"]["tput_noroll_rps"]["phases"] == [100e3] * 3
    note = report.roll_note("native", s)
    assert (
        "rolling every 1 s 90,000 (50,000-100,000) against 100,000 (100,000-100,000) with rolls off, in 3 pairs" in note
    )
    assert "pipelined_roll_ratio 0.90 (0.50-1.00), the median of the pairs' ratios (goal >= 0.9: met)" in note
    assert "both sides of the goal, so this run does not settle it" in note
    assert "only" not in note
    steady = report.summarise(raw | {"tput_roll": [95e3, 97e3, 96e3], "rolls": 2, "roll_in_sync": 2})
    note = report.roll_note("pure", steady)
    assert "pipelined_roll_ratio 0.96 (0.95-0.97)" in note and "both sides" not in note
    assert "only 2 rolls in 3 rolling phases" in note
    assert "only 2 of 3 nodes were in sync at the end of some phase" in note


def test_the_writers_warnings_about_a_node_down_on_purpose_are_left_out(caplog: pytest.LogCaptureFixture) -> None:
    """Only warnings about that node, and only while it is down on purpose: its errors, warnings
    about the other nodes and other loggers' warnings still show."""
    channel, other = logging.getLogger(download.NODE_LOGGER), logging.getLogger("qjm.writer")
    # Each logger's own level, not only the root's: a test before this one in the same worker may
    # have configured qjm's loggers (the CLI's log setup).
    with caplog.at_level(logging.WARNING, logger=channel.name), caplog.at_level(logging.WARNING, logger=other.name):
        with download.node_down_on_purpose("127.0.0.1:7002"):
            channel.warning("%s: unreachable (%s); no batches to it until the next segment", "127.0.0.1:7002", "no")
            channel.warning("%s: unreachable (refused)", "127.0.0.1:70021")
            channel.error("127.0.0.1:7002: something worse")
            other.warning("127.0.0.1:7002: said by another logger")
        channel.warning("127.0.0.1:7002: unreachable after the phase")
    assert [r.getMessage() for r in caplog.records] == [
        "127.0.0.1:70021: unreachable (refused)",
        "127.0.0.1:7002: something worse",
        "127.0.0.1:7002: said by another logger",
        "127.0.0.1:7002: unreachable after the phase",
    ]
