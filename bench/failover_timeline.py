"""Where a cold process's takeover spends its time, beside what gRPC itself costs cold.

    python bench/failover_timeline.py [ROUNDS] [SRC ...]

Starts three JournalNode processes, holds a writer with an open segment, and for ROUNDS rounds
(default 15, after one uncounted) runs, one after the other, so that load that comes and goes
weighs on all alike:

- ``cold:SRC`` for each source tree SRC (default: the ``src`` beside this script; ``SRC+hint``
  also hands the process the epoch to propose, so it skips get_journal_state as a standby would;
  ``SRC+standby`` makes it a standby as ``qjm bench``'s failover_p50: it reads the open segment
  through a reader before the clock starts, so its channels are open and it knows the epoch):
  a fresh process with the client imported (as ``qjm bench``'s failover_cold) times
  ``open_writer`` + one 1 KiB ``append`` + ``sync``, with a perf_counter timestamp at the start
  and end of every step: the manager and its channels, each node's control call, each quorum
  wait, each data-link connect, the first batch. Several trees compare before and after.
- ``grpc1`` and ``grpc3``: a fresh process (gRPC and the stubs imported) makes one channel, or
  three in parallel threads, and times the first GetJournalState on each (from the channel's
  creation) and a second one on the warm channel; ``quorum_first`` is when the second of three
  first calls returned.
- ``same``: a takeover in this process (channels warm, the epoch known): what the rounds cost
  without a cold start (``qjm bench``'s failover_same_process).

The step table gives, per step and node, the median start and end in ms after ``open_writer``
was called, and the median duration. A measuring tool, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.abspath(__file__)
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")

Event = tuple[str, str, float, float]  # (step, node, start, end), seconds after open_writer was called


def _timed(owner: Any, name: str, events: list[Event], t0: list[float], label: str = "", node: str = "") -> None:
    """Wrap ``owner.name`` to log its start and end (``node``: the attribute naming the node)."""
    orig = getattr(owner, name)

    def wrapper(self: Any, *a: Any, **k: Any) -> Any:
        s = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            step = f"rpc {a[0]}" if name == "call" else label or name
            if name.startswith("wait_for"):
                step = f"quorum {a[1].split('(')[0]}"
            events.append((step, str(getattr(self, node, "")) if node else "", s - t0[0], time.perf_counter() - t0[0]))

    setattr(owner, name, wrapper)


def cold(uri: str, hint: int, follow: int = 0) -> None:
    """One cold takeover in this (fresh) process, after reading the open segment from txid
    ``follow`` when that is not 0; prints its events as JSON."""
    import qjm.bench.driver  # noqa: F401  (what the bench's failover worker has imported)
    from qjm.client import grpc_io, manager, quorum, writer
    from qjm.client.shared import EPOCH_HINTS
    from qjm.config import parse_uri

    events: list[Event] = []
    t0 = [0.0]
    _timed(grpc_io.GrpcNodeIO, "__init__", events, t0, "channel", "name")
    _timed(grpc_io.GrpcNodeIO, "call", events, t0, node="name")
    _timed(grpc_io.GrpcNodeIO, "open_link", events, t0, "data link", "name")
    _timed(manager.QuorumJournalManager, "__init__", events, t0, "manager")
    _timed(manager.QuorumJournalManager, "create_new_unique_epoch", events, t0, "epoch (fence)")
    _timed(manager.QuorumJournalManager, "recover_unclosed_segment", events, t0, "recover")
    _timed(writer.Writer, "__init__", events, t0, "writer (start segment)")
    _timed(writer.Writer, "sync", events, t0, "first batch")
    _timed(quorum.QuorumCall, "wait_for_write_quorum", events, t0)
    if hint:
        u = parse_uri(uri)
        EPOCH_HINTS.note((tuple(sorted(str(a) for a in u.nodes)), u.journal_id), hint)
    reader = None
    if follow:
        from qjm.client.reader import open_reader

        reader = open_reader(uri, from_txid=follow, include_in_progress=True)
        if not any(True for _ in reader):
            raise RuntimeError("the standby read nothing of the open segment")
    record = os.urandom(1024)
    cpu = time.process_time()
    t0[0] = time.perf_counter()
    w = writer.open_writer(uri)
    opened = time.perf_counter() - t0[0]
    w.append(record)
    w.sync()
    took = time.perf_counter() - t0[0]
    events += [("open_writer", "", 0.0, opened), ("process CPU", "", 0.0, time.process_time() - cpu)]
    w.abort()
    if reader is not None:
        reader.qjm.close()
    print(json.dumps({"took": took, "events": events}))


def bare_grpc(uri: str, k: int) -> None:
    """First channel + first call to ``k`` nodes at once, each from its own thread; prints JSON."""
    import grpc
    import grpc._channel  # imported with the client, as in a cold takeover

    from qjm.config import parse_uri
    from qjm.protocol import qjournal_pb2 as pb
    from qjm.protocol.rpcmeta import CLIENT_GRPC_OPTIONS, make_stub

    u = parse_uri(uri)
    req = pb.JournalIdRequest(journal_id=u.journal_id)
    out: dict[str, float] = {}
    ends: list[float] = []
    start = threading.Barrier(k + 1)

    def one(i: int, address: str) -> None:
        start.wait()
        s = time.perf_counter()
        ch = grpc.insecure_channel(address, options=CLIENT_GRPC_OPTIONS)
        stub = make_stub(ch)
        made = time.perf_counter()
        stub.GetJournalState(req, timeout=30)
        first = time.perf_counter()
        stub.GetJournalState(req, timeout=30)
        out[f"channel{i}"], out[f"first{i}"], out[f"second{i}"] = made - s, first - s, time.perf_counter() - first
        ends.append(first)
        ch.close()

    threads = [threading.Thread(target=one, args=(i, str(a))) for i, a in enumerate(u.nodes[:k])]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    ends.sort()
    out["quorum_first"] = ends[min(1, k - 1)] - t0
    print(json.dumps(out))


def _child(args: list[str], pythonpath: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    p = subprocess.run([sys.executable, HERE, *args], capture_output=True, text=True, timeout=120, env=env)
    if p.returncode:
        raise RuntimeError(f"{args[0]} failed:\n{p.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def measure(rounds: int, trees: list[str]) -> dict[str, list[dict[str, Any]]]:
    from qjm.client.writer import Writer, open_writer
    from qjm.testing.minicluster import MiniJournalCluster

    record = os.urandom(1024)
    out: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as base, MiniJournalCluster(3, base) as c:
        w: Writer = open_writer(c.uri, create=True)

        def take_over(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
            nonlocal w
            r = run()
            w.abort()
            w = open_writer(c.uri)  # takes over from the other process's writer, which exited
            return r

        def same() -> dict[str, Any]:
            nonlocal w
            t = time.perf_counter()
            w2 = open_writer(c.uri)
            w2.append(record)
            w2.sync()
            took = time.perf_counter() - t
            w.abort()
            w = w2
            return {"took": took}

        for i in range(rounds + 1):
            kinds: list[tuple[str, Callable[[], dict[str, Any]]]] = []
            for tree in trees:
                path = tree.removesuffix("+hint").removesuffix("+standby")
                hinted, standby = tree.endswith("+hint"), tree.endswith("+standby")

                def cold_run(p: str = path, hinted: bool = hinted, standby: bool = standby) -> dict[str, Any]:
                    epoch = str(w.epoch if hinted else 0)  # the holder's epoch when this process starts
                    follow = str(w.segment_txid if standby else 0)
                    return take_over(lambda: _child(["cold", c.uri, epoch, follow], p))

                kinds.append((f"cold:{tree}", cold_run))
            kinds += [
                ("grpc1", lambda: _child(["grpc", c.uri, "1"], SRC)),
                ("grpc3", lambda: _child(["grpc", c.uri, "3"], SRC)),
                ("same", same),
            ]
            for kind, run in kinds:
                for _ in range(10):
                    w.append(record)
                w.sync()  # the writer holds an open segment with committed records
                r = run()
                if i:  # the first round warms the disk and the page cache
                    out.setdefault(kind, []).append(r)
        w.close()
    return out


def report(out: dict[str, list[dict[str, Any]]]) -> None:
    def ms(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1e3:6.2f} ({min(xs) * 1e3:.2f}-{max(xs) * 1e3:.2f})"

    for kind, rs in out.items():
        print(f"== {kind}  n={len(rs)}")
        if not kind.startswith("cold:"):
            for key in rs[0]:
                print(f"  {key:14s} {ms([r[key] for r in rs])}")
            continue
        print(f"  {'total':14s} {ms([r['took'] for r in rs])}")
        steps: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for r in rs:
            for step, node, s, e in r["events"]:
                steps.setdefault((step, node), []).append((s, e))
        for (step, node), se in sorted(steps.items(), key=lambda kv: statistics.median(s for s, _ in kv[1])):
            start = statistics.median(s for s, _ in se) * 1e3
            end = statistics.median(e for _, e in se) * 1e3
            took = statistics.median(e - s for s, e in se) * 1e3
            print(f"  {step:26s} {node:22s} {start:6.2f} -> {end:6.2f}  {took:6.2f} ms  n={len(se)}")


def main(argv: list[str]) -> None:
    if argv and argv[0] == "cold":
        cold(argv[1], int(argv[2]), int(argv[3]) if len(argv) > 3 else 0)
    elif argv and argv[0] == "grpc":
        bare_grpc(argv[1], int(argv[2]))
    else:
        rounds = int(argv[0]) if argv else 15
        report(measure(rounds, argv[1:] or [SRC]))


if __name__ == "__main__":
    main(sys.argv[1:])
