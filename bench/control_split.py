"""Where a takeover's control calls spend their time: gRPC on the way in, the node's work, gRPC back.

    python bench/control_split.py [TAKEOVERS]

Starts three JournalNode processes whose gRPC servicer methods and ``Journal`` methods for the
takeover's calls are wrapped (by a ``sitecustomize`` this script writes to a temporary directory
and puts on their PYTHONPATH) to log monotonic timestamps, then runs TAKEOVERS (default 30, after
3 uncounted) takeovers in this process, each a new writer taking over from the last and syncing
one 1 KiB record, with this process's ``GrpcNodeIO.call`` timed the same way. CLOCK_MONOTONIC is
shared by every process of the machine, so each call lines up across the two processes. Per
call, the medians in µs of: the writer's call to the servicer's entry (``in``: the client's gRPC,
the network, the node's gRPC server handing the call to a worker thread), the servicer's own work
before and after the journal method, the journal method (the node's real work, its fsyncs
included), and the servicer's return to the writer's call returning (``out``). A measuring tool,
not a test: nothing here asserts a time.
"""

from __future__ import annotations

import glob
import os
import signal
import statistics
import sys
import time
from typing import Any

from node_trace import traced_nodes

SITECUSTOMIZE = """
import os, sys, time, builtins, signal
_path = os.environ.get("QJM_SPLIT_FILE")
if _path:
    _imp, _done, _buf = builtins.__import__, set(), []

    def _flush(*_):
        with open(_path + ".%d" % os.getpid(), "a") as f:
            f.write("".join(_buf))
        _buf.clear()

    signal.signal(signal.SIGUSR1, _flush)

    def _wrap(cls, name, tag):
        orig = getattr(cls, name)
        def timed(self, *a, **k):
            t = time.perf_counter_ns()
            try:
                return orig(self, *a, **k)
            finally:
                _buf.append("%s %s %d %d\\n" % (tag, name, t, time.perf_counter_ns()))
        setattr(cls, name, timed)

    _WRAP = (
        ("qjm.server.journal", "Journal", ("new_epoch", "finalize_log_segment", "start_log_segment"), "J"),
        ("qjm.server.rpc", "QJournalServicer", ("NewEpoch", "FinalizeLogSegment", "StartLogSegment"), "S"),
    )

    def _hook(name, *a, **k):
        m = _imp(name, *a, **k)
        for full, attr, names, tag in _WRAP:
            mod = sys.modules.get(full)
            if full not in _done and mod is not None and hasattr(mod, attr):
                _done.add(full)
                for n in names:
                    _wrap(getattr(mod, attr), n, tag)
        return m

    builtins.__import__ = _hook
"""

CALLS = {  # the writer's op -> (servicer method, journal method)
    "new_epoch": ("NewEpoch", "new_epoch"),
    "finalize_log_segment": ("FinalizeLogSegment", "finalize_log_segment"),
    "start_log_segment": ("StartLogSegment", "start_log_segment"),
}
COLUMNS = ("in", "servicer before", "journal method", "servicer after", "out", "whole call")


def main(takeovers: int) -> None:
    with traced_nodes(SITECUSTOMIZE, "QJM_SPLIT_FILE", "qjm-split-") as (work, trace):
        from qjm.client import grpc_io
        from qjm.client.writer import open_writer
        from qjm.testing.minicluster import MiniJournalCluster

        calls: list[tuple[str, str, int, int]] = []  # (op, node, start, end) in this process
        call = grpc_io.GrpcNodeIO.call

        def timed_call(self: grpc_io.GrpcNodeIO, op: str, request: Any, timeout: float) -> Any:
            t = time.perf_counter_ns()
            try:
                return call(self, op, request, timeout)
            finally:
                calls.append((op, str(self.name), t, time.perf_counter_ns()))

        grpc_io.GrpcNodeIO.call = timed_call  # type: ignore[method-assign]
        took = []
        with MiniJournalCluster(3, os.path.join(work, "cluster")) as c:
            w = open_writer(c.uri, create=True)
            for i in range(takeovers + 3):
                for _ in range(10):
                    w.append(b"x" * 1024)
                w.sync()  # the writer holds an open segment with committed records
                if i == 3:
                    calls.clear()
                    took.clear()
                t = time.perf_counter()
                w2 = open_writer(c.uri)
                w2.append(b"y" * 1024)
                w2.sync()
                took.append(time.perf_counter() - t)
                w.abort()
                w = w2
            names = {n.proc.pid: c.addresses[i] for i, n in enumerate(c.nodes) if n.proc is not None}
            for pid in names:
                os.kill(pid, signal.SIGUSR1)
            deadline = time.monotonic() + 10
            while len(glob.glob(trace + ".*")) < len(names) and time.monotonic() < deadline:
                time.sleep(0.05)  # a measuring tool: the nodes write their traces when signalled
            time.sleep(0.2)
            w.close()
        node_events: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
        for path in glob.glob(trace + ".*"):
            node = names[int(path.rsplit(".", 1)[1])]
            with open(path) as f:
                for line in f:
                    tag, name, s, e = line.split()
                    node_events.setdefault((tag, name, node), []).append((int(s), int(e)))
    rows: dict[str, list[tuple[float, ...]]] = {}
    for op, node, s, e in calls:
        if op not in CALLS:
            continue
        servicer, method = CALLS[op]
        srv = [x for x in node_events.get(("S", servicer, node), []) if s <= x[0] <= e]
        jrn = [x for x in node_events.get(("J", method, node), []) if s <= x[0] <= e]
        if len(srv) != 1 or len(jrn) != 1:
            continue
        (ss, se), (js, je) = srv[0], jrn[0]
        rows.setdefault(op, []).append(((ss - s) / 1e3, (js - ss) / 1e3, (je - js) / 1e3, (se - je) / 1e3,
                                        (e - se) / 1e3, (e - s) / 1e3))  # fmt: skip
    print(f"{takeovers} takeovers in this process, p50 {statistics.median(took) * 1e3:.2f} ms; load "
          f"{os.getloadavg()[0]:.1f}; medians in µs per call (every node)")  # fmt: skip
    print(f"  {'call':22s} " + " ".join(f"{c:>16s}" for c in COLUMNS))
    for op, r in rows.items():
        cols = list(zip(*r, strict=True))
        print(f"  {op:22s} " + " ".join(f"{statistics.median(x):16.0f}" for x in cols) + f"   n={len(r)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
