"""Where a JournalNode's data thread spends a sync commit, from the kernel's own syscall events.

    python bench/node_syscalls.py [COMMITS] [DIR]

Runs ``bench/gap_ladder.py``'s ``node`` rung (a minimal Python writer sending one frame a commit to
three real JournalNodes on the disk of DIR, 2 of 3 acks) and, while it runs COMMITS commits
(default 2000, after 300 uncounted), records node 0's ``recvfrom``, ``pwrite64``, ``fdatasync``
and ``sendto`` entries and exits through tracefs (``/sys/kernel/tracing``: root). Prints, as
medians over the commits of the node's data thread (the thread with the most writes):

- ``recv->write``: from ``recvfrom`` returning with the frame to the ``pwrite64`` that writes it
  (the node's work before the disk: the run's parsing, the journal's checks, the append);
- ``write`` and ``fdatasync``: the disk's two waits;
- ``sync->ack``: from the fdatasync returning to the ack's ``sendto``;
- ``ack->recv``: from the ack to the next ``recvfrom`` (the node's bookkeeping after the ack,
  which runs while the writer and the other nodes want the CPUs).

Not the wall time of a commit (the writer's side and the network are not in it): where the node's
own share goes, without instrumenting the node. A measuring tool, not a test: nothing is asserted.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
from collections import Counter

from gap_ladder import node_links  # bench/, the script's own directory
from script_args import count_and_dir

TRACEFS = "/sys/kernel/tracing"
SYSCALLS = ("recvfrom", "pwrite64", "fdatasync", "sendto")
WARM = 300
# "python-3184 [001] ..... 60497.448704: sys_fdatasync(fd: 0x12)" and "... sys_fdatasync -> 0x0"
EVENT = re.compile(r"-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+): sys_(\w+)(\(| ->)")


def _write(name: str, value: str) -> None:
    with open(os.path.join(TRACEFS, name), "w") as f:
        f.write(value)


def _events(on: bool) -> None:
    for call in SYSCALLS:
        for edge in ("enter", "exit"):
            _write(f"events/syscalls/sys_{edge}_{call}/enable", "1" if on else "0")


def traced_round(commits: int, directory: str) -> tuple[float, str]:
    """The node rung's round, node 0's threads traced while it runs: (its p50 in µs, the trace)."""
    from qjm.bench import pyfloor
    from qjm.protocol import wire

    with node_links(directory) as (cluster, socks, frame):
        pyfloor.commit_rounds(socks, frame, pyfloor.WARMUP + WARM, wire.ACK.size, pyfloor.check_ack)
        proc = cluster.nodes[0].proc
        assert proc is not None
        _write("tracing_on", "0")
        _write("trace", "")
        _write("set_event_pid", " ".join(os.listdir(f"/proc/{proc.pid}/task")))
        try:
            _events(True)
            _write("tracing_on", "1")
            lat = pyfloor.commit_rounds(
                socks, lambda r: frame(pyfloor.WARMUP + WARM + r), pyfloor.WARMUP + commits, wire.ACK.size,
                pyfloor.check_ack,
            )  # fmt: skip
        finally:
            _write("tracing_on", "0")
            _events(False)
            _write("set_event_pid", "")
        with open(os.path.join(TRACEFS, "trace")) as f:
            return statistics.median(lat) * 1e6, f.read()


def intervals(trace: str) -> dict[str, float]:
    """Medians (µs) of the data thread's intervals per commit; ``commits``: how many were seen."""
    events = []
    for line in trace.splitlines():
        m = EVENT.search(line)
        if m:
            events.append((int(m.group(1)), float(m.group(2)) * 1e6, m.group(3), m.group(4) == "("))
    writes = Counter(tid for tid, _, call, enter in events if call == "pwrite64" and enter)
    if not writes:
        sys.exit("node_syscalls.py: no pwrite64 of node 0 in the trace (is tracefs recording syscalls?)")
    data_thread = writes.most_common(1)[0][0]
    spans: dict[str, list[float]] = {k: [] for k in ("recv->write", "write", "fdatasync", "sync->ack", "ack->recv")}
    received = write_at = sync_at = synced = acked = None
    for tid, t, call, enter in events:
        if tid != data_thread:
            continue
        if call == "recvfrom" and enter and acked is not None:
            spans["ack->recv"].append(t - acked)
            acked = None
        elif call == "recvfrom" and not enter:
            received = t
        elif call == "pwrite64" and enter:
            if received is not None:
                spans["recv->write"].append(t - received)
                received = None
            write_at = t
        elif call == "pwrite64" and write_at is not None:
            spans["write"].append(t - write_at)
        elif call == "fdatasync" and enter:
            sync_at = t
        elif call == "fdatasync" and sync_at is not None:
            spans["fdatasync"].append(t - sync_at)
            synced = t
        elif call == "sendto" and enter and synced is not None:
            spans["sync->ack"].append(t - synced)
            synced = None
        elif call == "sendto":
            acked = t
    out = {k: statistics.median(v) for k, v in spans.items() if v}
    out["commits"] = len(spans["write"])
    return out


def main() -> None:
    commits, directory = count_and_dir(sys.argv[1:], "node_syscalls.py", "COMMITS", 2000)
    if not os.access(os.path.join(TRACEFS, "set_event_pid"), os.W_OK):
        sys.exit(f"node_syscalls.py: needs root and tracefs at {TRACEFS} (mount -t tracefs nodev {TRACEFS})")
    p50, trace = traced_round(commits, directory)
    spans = intervals(trace)
    print(f"node rung p50 {p50:.0f} µs (the writer's view, traced); node 0's data thread, medians over "
          f"{spans.pop('commits'):.0f} commits:")  # fmt: skip
    for name, us in spans.items():
        print(f"  {name:<12} {us:6.1f} µs")


if __name__ == "__main__":
    main()
