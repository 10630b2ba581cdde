"""Where one sync commit spends its time: a timeline across the writer and its three nodes.

    python bench/sync_timeline.py [COMMITS]

Starts three JournalNode processes whose ``Journal.journal`` and data-plane ack are wrapped (by a
``sitecustomize`` this script writes to a temporary directory and puts on their PYTHONPATH) to log
monotonic timestamps, then times COMMITS (default 3000) 1 KiB ``append`` + ``sync`` calls in this
process, recording when the batch was sent and when the writer counted its quorum. CLOCK_MONOTONIC
is shared by every process of the machine, so the figures line up. All figures are p50 in µs after
``append`` was called, except the last line: each node process's CPU (user + system, from
``/proc/<pid>/stat``) and voluntary context switches (all its threads) over the timed commits,
divided by their number. A measuring tool, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import bisect
import glob
import os
import statistics
import sys
import time

from node_trace import traced_nodes

SITECUSTOMIZE = """
import os, sys, time, builtins
_path = os.environ.get("QJM_TIMELINE_FILE")
if _path:
    _imp, _done, _buf, _out = builtins.__import__, set(), [], []

    def _log(line):
        _buf.append(line)
        if len(_buf) >= 200:
            if not _out:
                _out.append(open(_path + ".%d" % os.getpid(), "a"))
            _out[0].write("".join(_buf)); _out[0].flush(); _buf.clear()

    def _patch(name, mod):
        if name == "journal":
            orig = mod.Journal.journal
            def journal(self, frames):
                t = time.perf_counter_ns()
                r = orig(self, frames)
                _log("J %d %d\\n" % (t, time.perf_counter_ns()))
                return r
            mod.Journal.journal = journal
            sync = mod.Journal._sync_or_abort
            def sync_or_abort(self, seg):
                t = time.perf_counter_ns()
                r = sync(self, seg)
                _log("S %d %d\\n" % (t, time.perf_counter_ns()))
                return r
            mod.Journal._sync_or_abort = sync_or_abort
        else:
            base = mod.fanout.Receiver
            class Timed(base):
                def ack(self, txid):
                    base.ack(self, txid)
                    _log("A %d\\n" % time.perf_counter_ns())
            import types
            mod.fanout = types.SimpleNamespace(Receiver=Timed)

    def _hook(name, *a, **k):
        m = _imp(name, *a, **k)
        for short, full, attr in (("journal", "qjm.server.journal", "Journal"), ("data", "qjm.server.data", "_Conn")):
            mod = sys.modules.get(full)
            if short not in _done and mod is not None and hasattr(mod, attr):
                _done.add(short)
                _patch(short, mod)
        return m

    builtins.__import__ = _hook
"""


def _p(xs: list[int], q: float = 0.5) -> float:
    return sorted(xs)[int(len(xs) * q)] / 1e3 if xs else float("nan")


def main(commits: int) -> None:
    with traced_nodes(SITECUSTOMIZE, "QJM_TIMELINE_FILE", "qjm-timeline-") as (work, trace):
        import qjm
        from qjm.bench.workload import process_cpu_seconds, voluntary_switches
        from qjm.client import link_batch
        from qjm.testing.minicluster import MiniJournalCluster

        counted: list[tuple[int, int]] = []  # (when, nodes holding the batch) at each look of the writer
        outcome = link_batch.LinkBatch.outcome

        def timed_outcome(self: link_batch.LinkBatch) -> tuple[dict[str, int], dict[str, BaseException]]:
            r = outcome(self)
            counted.append((time.perf_counter_ns(), len(r[0])))
            return r

        link_batch.LinkBatch.outcome = timed_outcome  # type: ignore[method-assign]
        rec = os.urandom(1024)
        commits_at: list[tuple[int, int, int]] = []
        with MiniJournalCluster(3, os.path.join(work, "cluster")) as c:
            w = qjm.open_writer(c.uri, create=True)
            for _ in range(300):
                w.append(rec)
                w.sync()
            counted.clear()
            pids = [n.proc.pid for n in c.nodes if n.proc is not None]
            cpu0 = [sum(process_cpu_seconds(p)) for p in pids]
            csw0 = [voluntary_switches(p) for p in pids]
            for _ in range(commits):
                t0 = time.perf_counter_ns()
                w.append(rec)
                with w._lock:
                    w._flush()
                t1 = time.perf_counter_ns()
                w.sync()
                commits_at.append((t0, t1, time.perf_counter_ns()))
            cpu = [(sum(process_cpu_seconds(p)) - t) / commits * 1e6 for p, t in zip(pids, cpu0, strict=True)]
            csw = [(voluntary_switches(p) - n) / commits for p, n in zip(pids, csw0, strict=True)]
            w.close()
        raw = []
        for path in sorted(glob.glob(trace + ".*")):
            with open(path) as f:
                raw.append([line.split() for line in f])
    journal = [[(int(x[1]), int(x[2])) for x in r if x[0] == "J"] for r in raw]
    syncs = [[(int(x[1]), int(x[2])) for x in r if x[0] == "S"] for r in raw]
    acks = [[int(x[1]) for x in r if x[0] == "A"] for r in raw]
    total = [c - a for a, _, c in commits_at]
    print(f"{commits} commits of 1 KiB; load {os.getloadavg()[0]:.1f}; p50 µs after append()")
    print(f"  sync p50 {_p(total):.0f}, p90 {_p(total, 0.9):.0f}, p99 {_p(total, 0.99):.0f}")
    print(f"  batch framed and sent to all nodes: {_p([b - a for a, b, _ in commits_at]):.0f}")
    ends: list[list[int]] = []
    for k, (js, ak, ss) in enumerate(zip(journal, acks, syncs, strict=True)):
        starts = [s for s, _ in js]
        sync_starts = [s for s, _ in ss]
        arrive, took, end, to_ack, synced = [], [], [], [], []
        for a, _, cend in commits_at:
            i = bisect.bisect_left(starts, a)
            if i < len(js) and js[i][0] < cend:
                s, e = js[i]
                arrive.append(s - a)
                took.append(e - s)
                end.append(e - a)
                j = bisect.bisect_left(ak, e)
                if j < len(ak):
                    to_ack.append(ak[j] - e)
                j = bisect.bisect_left(sync_starts, s)
                if j < len(ss) and ss[j][1] <= e:
                    synced.append(ss[j][1] - ss[j][0])
        ends.append(end)
        print(
            f"  node {k}: append starts {_p(arrive):.0f}, journal() takes {_p(took):.0f} "
            f"(p90 {_p(took, 0.9):.0f}; its fdatasync and stats {_p(synced):.0f}), ends {_p(end):.0f}, "
            f"ack sent {_p(to_ack):.0f} later"
        )
    second = [sorted(e)[1] for e in zip(*ends, strict=False) if len(e) >= 2]
    print(f"  second node to finish journal(): {_p(second):.0f}")
    looks = [t for t, _ in counted]
    seen, n_looks = [], []
    for a, b, cend in commits_at:
        i, j = bisect.bisect_left(looks, b), bisect.bisect_right(looks, cend)
        n_looks.append(j - i)
        done = [t for t, n in counted[i:j] if n >= 2]
        if done:
            seen.append(done[0] - a)
    print(f"  writer counted the quorum: {_p(seen):.0f} ({statistics.mean(n_looks):.2f} looks per commit)")
    _tail(commits_at, journal, counted)
    print(
        "  node CPU per commit (µs): "
        + ", ".join(f"{x:.0f}" for x in cpu)
        + f" (mean {statistics.mean(cpu):.1f}); voluntary switches per commit: "
        + ", ".join(f"{x:.2f}" for x in csw)
    )


def _tail(
    commits_at: list[tuple[int, int, int]], journal: list[list[tuple[int, int]]], counted: list[tuple[int, int]]
) -> None:
    """The same steps for the slowest 1% of commits against the rest: where a slow commit's time went."""
    looks = [t for t, _ in counted]
    starts = [[s for s, _ in js] for js in journal]
    rows = []
    for a, b, c in commits_at:
        ends = []
        for js, st in zip(journal, starts, strict=True):
            i = bisect.bisect_left(st, a)
            if i < len(js) and js[i][0] < c:
                ends.append(js[i])
        if len(ends) < 2:
            continue
        i, j = bisect.bisect_left(looks, b), bisect.bisect_right(looks, c)
        done = [t for t, n in counted[i:j] if n >= 2]
        if not done:
            continue
        second_end = sorted(e for _, e in ends)[1]
        first_start = min(s for s, _ in ends)
        rows.append((c - a, b - a, first_start - a, second_end - a, done[0] - a, max(e - s for s, e in ends)))
    if len(rows) < 100:
        return
    rows.sort()
    cut = len(rows) - len(rows) // 100
    names = ("sync", "sent", "first journal() starts", "second journal() ends", "quorum counted",
             "slowest journal() takes")  # fmt: skip
    for label, part in (("the fastest 99%", rows[:cut]), ("the slowest 1%", rows[cut:])):
        cols = list(zip(*part, strict=True))
        print(
            f"  {label} ({len(part)}), medians: "
            + ", ".join(f"{n} {statistics.median(x) / 1e3:.0f}" for n, x in zip(names, cols, strict=True))
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
