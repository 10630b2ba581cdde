"""Where the sync gap to the C floor lies: six rungs from the C floor to qjm, round after round.

    python bench/gap_ladder.py [ROUNDS] [DIR]

Each round (default 5) runs, one after the other on the disk of DIR (default: the system's
temporary directory), six ways of committing 1 KiB to two of three replicas on loopback, each
adding one part of qjm to the rung below it:

1. ``C``: the C networked floor (``bench/netfloor``'s ``net`` mode, no protocol).
2. ``pyw``: a Python writer (``qjm.bench.pyfloor.commit_rounds``: one thread, ``select``) sending
   netfloor's message to netfloor's own C receivers (its ``serve`` mode): the writer's Python alone.
3. ``py``: the same writer to Python receivers appending with qjm's segment appender
   (``qjm.bench.pyfloor``'s ``py``, which ``qjm bench`` runs beside its C floor): Python at both ends.
4. ``bare``: the same writer sending qjm frames over qjm's data-plane wire to three bare receiver
   processes: qjm's native ``Receiver``, frame check and appender in one thread, no ``Journal``,
   no JournalNode (``qjm.bench.pyfloor``'s ``bare``).
5. ``node``: the same writer against three real JournalNodes (a ``MiniJournalCluster``): the
   node's data plane, ``Journal.journal`` and everything else a node runs. A qjm writer formats
   the journal and starts the segment, then lets go of it; the frames carry its epoch on.
6. ``qjm``: qjm's writer itself (``open_writer``, ``append`` + ``sync``) against a fresh cluster.

Each rung times COMMITS commits after WARM uncounted ones. Each round prints every rung's p50 and
p99 and its p50 over the C floor's of the same round; the last lines give, per rung, the median
over the rounds of those ratios and of the step from the rung below (in µs), so that each part's
share of the gap is read beside the floor, the machine's noise weighing on every rung alike.
A measuring tool, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from script_args import count_and_dir  # bench/, the script's own directory

if TYPE_CHECKING:
    from qjm import Writer
    from qjm.testing.minicluster import MiniJournalCluster

HERE = Path(__file__).resolve().parent
COMMITS = 3000
WARM = 200  # as qjm.bench.pyfloor.WARMUP: every rung counts alike
RECORD = 1024
RUNGS = ("C", "pyw", "py", "bare", "node", "qjm")
# netfloor.c's message and ack, for the pyw rung's writer
NETFLOOR_MESSAGE = 1088
NETFLOOR_HEADER = struct.Struct("<IIQ")  # length, magic "QJMN", round: the first 16 of its 64 header bytes
NETFLOOR_MAGIC = 0x514A4D4E
NETFLOOR_ACK = 16


def _netfloor_runner() -> ModuleType:  # bench/netfloor/run.py builds the binary; it is a script, not a package
    spec = importlib.util.spec_from_file_location("netfloor_run", HERE / "netfloor" / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _json_rung(argv: list[str]) -> tuple[float, float]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"gap_ladder.py: {' '.join(argv[:3])} failed (exit {out.returncode}): {out.stderr.strip()[-400:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return float(r["p50_us"]), float(r["p99_us"])


def c_floor(binary: Path, directory: str) -> tuple[float, float]:
    sub = tempfile.mkdtemp(prefix="gap-c-", dir=directory)
    try:
        return _json_rung([str(binary), "net", sub, str(COMMITS)])
    finally:
        shutil.rmtree(sub, ignore_errors=True)


def python_writer(binary: Path, directory: str) -> tuple[float, float]:
    """The ``pyw`` rung: ``qjm.bench.pyfloor``'s writer (``commit_rounds``) sending netfloor's
    message to netfloor's own C receivers (its ``serve`` mode): what a Python writer costs alone."""
    from qjm.bench import pyfloor
    from qjm.bench.workload import pct

    sub = tempfile.mkdtemp(prefix="gap-pyw-", dir=directory)
    proc = subprocess.Popen([str(binary), "serve", sub, str(WARM + COMMITS)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ports = json.loads(proc.stdout.readline())["ports"]
        socks = []
        for port in ports:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(sock)
        payload = os.urandom(NETFLOOR_MESSAGE - NETFLOOR_HEADER.size)

        def message(r: int) -> bytes:
            return NETFLOOR_HEADER.pack(NETFLOOR_MESSAGE, NETFLOOR_MAGIC, r) + payload

        lat = pyfloor.commit_rounds(socks, message, WARM + COMMITS, NETFLOOR_ACK)
        for sock in socks:  # every ack read, then EOF: each receiver reports and exits
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
            sock.close()
        out, _ = proc.communicate(timeout=60)
        if proc.returncode != 0 or '"mode":"serve"' not in out:  # its receivers each saw every round
            sys.exit(f"gap_ladder.py: netfloor serve failed (exit {proc.returncode}): {out.strip()[-400:]}")
        return pct(lat, 0.5) * 1e6, pct(lat, 0.99) * 1e6
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(sub, ignore_errors=True)


def python_floor(mode: str, directory: str) -> tuple[float, float]:
    """The ``py`` or ``bare`` rung: ``qjm.bench.pyfloor`` in a fresh process."""
    sub = tempfile.mkdtemp(prefix=f"gap-{mode}-", dir=directory)
    try:
        return _json_rung([sys.executable, "-m", "qjm.bench.pyfloor", mode, sub, str(WARM + COMMITS)])
    finally:
        shutil.rmtree(sub, ignore_errors=True)


def _all_nodes_hold(w: Writer) -> int:
    """Commit one record that every node, not only a quorum, holds in the open segment; its txid.

    A node whose start of the segment is still on its way when the writer lets go would refuse
    the raw frames; one left out of sync is given the next segment."""
    for _ in range(5):
        w.append(b"x" * RECORD)
        last = w.sync()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            nodes = w.stats().nodes
            if all(n.acked_txid >= last and not n.out_of_sync for n in nodes):
                return last
            time.sleep(0.01)  # a measuring tool's set-up, not a test: polling is enough
        w.roll()
    sys.exit("gap_ladder.py: the three nodes never all held the open segment")


@contextmanager
def node_links(directory: str) -> Iterator[tuple[MiniJournalCluster, list[socket.socket], Callable[[int], bytes]]]:
    """Three real JournalNodes holding an open segment a qjm writer started and let go of, a raw
    data-plane connection to each (hello sent), and the frame of commit ``r`` on them: what the
    ``node`` rung's writer sends (``bench/node_syscalls.py`` watches the same round)."""
    import qjm
    from qjm._native import framing
    from qjm.protocol import wire
    from qjm.testing.minicluster import MiniJournalCluster

    work = tempfile.mkdtemp(prefix="gap-node-", dir=directory)
    try:
        with MiniJournalCluster(3, os.path.join(work, "cluster")) as c:
            w = qjm.open_writer(c.uri, create=True)
            last = _all_nodes_hold(w)
            epoch, segment, journal = w.epoch, w.segment_txid, w.qjm.journal_id
            w.abort()  # the segment stays open in its epoch; its threads and links are gone
            socks: list[socket.socket] = []
            try:
                for n in c.nodes:
                    s = socket.create_connection((c.host, n.data_port))
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    s.sendall(wire.encode_hello(journal))
                    socks.append(s)
                record = os.urandom(RECORD)

                def frame(r: int) -> bytes:
                    return framing.encode_frame([record], epoch=epoch, segment_txid=segment, first_txid=last + 1 + r)

                yield c, socks, frame
            finally:
                for s in socks:
                    s.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def node(directory: str) -> list[float]:
    from qjm.bench import pyfloor
    from qjm.protocol import wire

    with node_links(directory) as (_, socks, frame):
        lat = pyfloor.commit_rounds(socks, frame, WARM + COMMITS, wire.ACK.size, pyfloor.check_ack)
        return [t * 1e9 for t in lat]


def qjm_writer(directory: str) -> list[float]:
    import qjm
    from qjm.testing.minicluster import MiniJournalCluster

    record = os.urandom(RECORD)
    work = tempfile.mkdtemp(prefix="gap-qjm-", dir=directory)
    lat: list[float] = []
    try:
        with MiniJournalCluster(3, os.path.join(work, "cluster")) as c, qjm.open_writer(c.uri, create=True) as w:
            for r in range(WARM + COMMITS):
                t = time.perf_counter_ns()
                w.append(record)
                w.sync()
                if r >= WARM:
                    lat.append(time.perf_counter_ns() - t)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return lat


def _quantiles(lat: list[float]) -> tuple[float, float]:
    from qjm.bench.workload import pct

    return pct(lat, 0.5) / 1e3, pct(lat, 0.99) / 1e3


def main(rounds: int, directory: str) -> None:
    runner = _netfloor_runner()
    with tempfile.TemporaryDirectory() as tmp:
        binary = runner.build(Path(tmp))
        steps: dict[str, Callable[[], tuple[float, float]]] = {
            "C": lambda: c_floor(binary, directory),
            "pyw": lambda: python_writer(binary, directory),
            "py": lambda: python_floor("py", directory),
            "bare": lambda: python_floor("bare", directory),
            "node": lambda: _quantiles(node(directory)),
            "qjm": lambda: _quantiles(qjm_writer(directory)),
        }
        print(f"{rounds} rounds of six rungs, {COMMITS} commits of 1 KiB each after {WARM} uncounted (p50/p99 µs)")
        p50s: dict[str, list[float]] = {k: [] for k in RUNGS}
        for i in range(rounds):
            got = {k: steps[k]() for k in RUNGS}
            floor = got["C"][0]
            print(
                f"round {i + 1} (load {os.getloadavg()[0]:.1f}): "
                + "; ".join(f"{k} {p50:.0f}/{p99:.0f} ({p50 / floor:.2f}x)" for k, (p50, p99) in got.items())
            )
            for k in RUNGS:
                p50s[k].append(got[k][0])
        print(f"over {rounds} rounds, medians: rung p50 / that round's C floor p50, and the step from the rung below")
        for j, k in enumerate(RUNGS):
            ratio = statistics.median(p / c for p, c in zip(p50s[k], p50s["C"], strict=True))
            line = f"  {k:<4} {ratio:.2f}x the floor"
            if j:
                below = RUNGS[j - 1]
                step = statistics.median(a - b for a, b in zip(p50s[k], p50s[below], strict=True))
                line += f", {step:+.0f} µs over {below}"
            print(line)


if __name__ == "__main__":
    main(*count_and_dir(sys.argv[1:], "gap_ladder.py", "ROUNDS", 5))
