"""The test harness's ``qjm`` commands: local clusters, the demo, the benchmark, the simulator, chaos.

Each of these starts what it runs on itself -- JournalNode processes through ``MiniJournalCluster``,
or the deterministic simulation -- so they live beside the harness, not among the operator's
commands of ``qjm.cli``, which imports nothing of ``qjm.testing``. ``qjm.__main__`` adds both sides
to the ``qjm`` command through their ``register``.
"""

from __future__ import annotations

import argparse
import logging
import sys

from qjm.argtypes import duration, non_negative_int, positive_int, positive_seconds, seed_range
from qjm.bench import driver as bench
from qjm.cli import AddCommand
from qjm.demo import run_demo
from qjm.stop_signal import wait_for_stop
from qjm.testing.bugs import ProtocolBugs
from qjm.testing.chaos import ChaosConfig, run_chaos
from qjm.testing.exhaustive import double_failure_sweep, explore, small_worlds
from qjm.testing.faultsim import run_faultsim
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.sim import DEFAULT_DEADLINE, STACK_HEADING, run_seed


def _cluster_up(a: argparse.Namespace) -> int:
    with MiniJournalCluster(a.nodes, a.dir, journal_id=a.journal) as c:
        print(f"{a.nodes} JournalNodes up; data in {c.base_dir}")
        print(f"URI: {c.uri}")
        wait_for_stop(on_ready=lambda: print("Ctrl-C to stop.", flush=True))
    return 0


def _demo(a: argparse.Namespace) -> int:
    return run_demo(records=a.records)


def _sim(a: argparse.Namespace) -> int:
    """Replay one simulator seed (or run the double-failure sweep / the small-world search)."""
    qjm_log = logging.getLogger("qjm")
    level = qjm_log.level
    if not a.verbose:
        qjm_log.setLevel(logging.ERROR)  # torn tails are expected in a fault run
    try:
        return _sim_run(a)
    finally:
        qjm_log.setLevel(level)  # a caller in the same process (a test, a notebook) keeps its logging


def _sim_run(a: argparse.Namespace) -> int:
    bugs = ProtocolBugs.parse(a.bugs)
    if a.sweep:
        sw = double_failure_sweep(bugs=bugs, deadline=a.deadline)
        print(f"double-failure sweep: {sw.runs} runs, calls per node {sw.calls_per_node}, {sw.acked_txids} txids "
              f"acknowledged, {len(sw.violations)} violations, {sw.seconds:.1f}s")  # fmt: skip
        for plan, r in sw.violations[:5]:
            print(f"  faults {plan}: {r.violation}")
        return 0 if sw.ok else 1
    if a.explore:
        bad = 0
        for w in small_worlds():
            e = explore(w, bugs=bugs, time_limit=a.time_limit, deadline=a.deadline)
            done = "complete" if e.complete else f"stopped after {a.time_limit:g}s"
            print(f"{w.name}: {e.states} states, {e.runs} executions, {e.seconds:.1f}s, {done}, "
                  f"{len(e.violations)} violations")  # fmt: skip
            for _path, r in e.violations:
                bad += 1
                print(f"  {r.violation}")
                if a.trace:
                    print("\n".join("    " + t for t in r.trace))
        return 1 if bad else 0
    if a.seed is None:
        print("qjm sim: give --seed N (or --sweep / --explore)", file=sys.stderr)
        return 2
    r = run_seed(a.seed, steps=a.steps, bugs=bugs, keep_trace=True, deadline=a.deadline)
    if a.trace:
        print("\n".join(r.trace))
    if r.harness_failure:  # the violation names it; its stack is the one clue, so it prints always
        print(f"seed {a.seed}: {r.violation}")
        if not a.trace:
            print("\n".join(r.trace[r.trace.index(STACK_HEADING) :] if STACK_HEADING in r.trace else r.trace))
    else:
        print(f"seed {a.seed}: {'ok' if r.ok else f'VIOLATION: {r.violation}'}")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(r.stats.items()) if v))
    return 0 if r.ok else 1


def _faultsim(a: argparse.Namespace) -> int:
    """Many simulator seeds over Spark (or a local process pool without pyspark)."""
    rep = run_faultsim(
        a.seeds, master=a.master, steps=a.steps, bugs=ProtocolBugs.parse(a.bugs), batch=a.batch,
        use_spark=False if a.local else None, processes=a.processes, deadline=a.deadline,
    )  # fmt: skip
    print(rep.summary())
    return 0 if not rep.failures else 1


def _chaos(a: argparse.Namespace) -> int:
    """Writer processes and JournalNodes killed and paused at random; verify every acknowledged txid."""
    cfg = ChaosConfig(
        duration=a.duration, writers=a.writers, nodes=a.nodes, seed=a.seed, proxy=not a.no_proxy,
        base_dir=a.dir, tls=a.tls,
    )  # fmt: skip
    rep = run_chaos(cfg, out=sys.stderr)
    print(rep.summary())
    return 0 if rep.ok else 1


def _deadline_argument(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--deadline", type=positive_seconds, default=DEFAULT_DEADLINE, metavar="SECONDS",
        help=f"wall-clock bound on one execution; a run past it is reported as a harness failure with "
        f"the stack it was stuck in (default {DEFAULT_DEADLINE:g})",
    )  # fmt: skip


def register(add: AddCommand) -> None:
    """Add the harness's commands to the ``qjm`` command."""
    s = add("cluster", help="local clusters for trying qjm out")
    cs = s.add_subparsers(dest="cluster_cmd", required=True)
    up = cs.add_parser("up", help="run N local JournalNodes until Ctrl-C")
    up.add_argument("--nodes", type=positive_int, default=3, help="how many JournalNodes (default 3)")
    up.add_argument("--dir", default=None, help="keep the nodes' data here (default: a temporary directory)")
    up.add_argument("--journal", default="demo", help="journal id of the URI printed (default demo)")
    up.set_defaults(fn=_cluster_up)

    s = add("demo", help="3 nodes, a writer, a node killed, a failover, everything read back")
    s.add_argument("--records", type=positive_int, default=2000, help="records the demo writes (default 2000)")
    s.set_defaults(fn=_demo)

    s = add("bench", help="latency/throughput against the disk's floor")
    bench.add_arguments(s)
    s.set_defaults(fn=bench.run_from)

    s = add("sim", help="deterministic fault simulation: replay a seed, sweep double failures, search")
    s.add_argument("--seed", type=int, default=None, help="the seed to run")
    s.add_argument("--trace", action="store_true", help="print every call, fault and check of the run")
    s.add_argument("--steps", type=non_negative_int, default=400, help="scheduler steps before the final recovery")
    s.add_argument("--bugs", default="", help="test-only protocol bugs to switch on (comma separated)")
    s.add_argument("--sweep", action="store_true", help="the double-failure sweep (Hadoop TestQJMWithFaults)")
    s.add_argument("--explore", action="store_true", help="search every execution of the small worlds")
    s.add_argument("--time-limit", type=positive_seconds, default=120.0, help="seconds per world for --explore")
    _deadline_argument(s)
    s.set_defaults(fn=_sim)

    s = add("faultsim", help="run many simulator seeds on Spark (any master) or a local pool")
    s.add_argument(
        "--seeds", type=seed_range, default=range(0, 10000), help="the seeds to run, lo:hi (default 0:10000)"
    )
    s.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    s.add_argument(
        "--steps", type=non_negative_int, default=400, help="scheduler steps before each run's final recovery"
    )
    s.add_argument("--bugs", default="", help="test-only protocol bugs to switch on (comma separated)")
    s.add_argument("--batch", type=positive_int, default=None, help="seeds per Spark job (progress is printed per job)")
    s.add_argument("--local", action="store_true", help="use a local process pool even if pyspark imports")
    s.add_argument("--processes", type=positive_int, default=None, help="size of the local pool (default: every core)")
    _deadline_argument(s)
    s.set_defaults(fn=_faultsim)

    s = add("chaos", help="process-level chaos: writers and nodes SIGKILLed/SIGSTOPped, then verified")
    s.add_argument("--duration", type=duration, default=60.0, help="e.g. 90, 60s, 10m, 1h (default 60s)")
    s.add_argument("--writers", type=positive_int, default=3, help="writer processes taking turns (default 3)")
    s.add_argument("--nodes", type=positive_int, default=3, help="JournalNodes (default 3)")
    s.add_argument("--seed", type=int, default=None, help="seed of the fault schedule (default: random)")
    s.add_argument("--dir", default=None, help="keep the cluster and logs here")
    s.add_argument("--no-proxy", action="store_true", help="no TCP proxy in front of the nodes")
    s.add_argument("--tls", action="store_true", help="nodes and writers with mutual TLS (test certificates)")
    s.set_defaults(fn=_chaos)
