"""``qjm faultsim``: many simulator seeds spread over Spark executors (design §7.3's Hadoop Streaming job).

Hadoop ran its randomized fault test as 5000 map tasks on a 100-node cluster and reported every
failing seed. Here ``sc.parallelize(range(lo, hi), numSlices)`` spreads the seeds; each partition
runs ``run_seed`` for its seeds and sends back only counts and the failing seeds (with their
traces), so 100,000 seeds do not ship 100,000 results. Seeds go out in batches so progress (seeds
done, violations, rate) is printed as it goes. Any master URL works; ``local[*]`` uses every core.

Each seed runs under a wall-clock ``deadline`` (``qjm.testing.sim.deadline``): a seed stuck in the
harness is reported as a harness failure with the stack it was stuck in, and the search goes on.

Without pyspark the same batches run on a local ``multiprocessing`` pool, and the run says so.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from qjm.errors import ConfigError
from qjm.testing.bugs import ProtocolBugs
from qjm.testing.sim.deadline import DEFAULT_DEADLINE, HARNESS_FAILURE

__all__ = ["FaultsimReport", "replay_command", "run_faultsim"]


def replay_command(seed: int, *, steps: int, bugs: ProtocolBugs | None) -> str:
    """The ``qjm sim`` command line that runs ``seed`` again exactly as the search ran it.

    A run is a function of the seed, the step budget and the protocol-bug switches (the fault
    profile and every decision are drawn from the seed), so these are all it needs to carry.
    """
    argv = ["qjm", "sim", "--seed", str(seed), "--steps", str(steps)]
    if bugs is not None:
        argv += ["--bugs", bugs.spec()]
    return shlex.join([*argv, "--trace"])


@dataclass
class FaultsimReport:
    seeds: int = 0
    ok: int = 0
    failures: list[tuple[int, str, list[str]]] = field(default_factory=list)  # (seed, violation, trace)
    stats: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cores: int = 1
    engine: str = ""
    steps: int = 400
    bugs: ProtocolBugs | None = None

    @property
    def harness_failures(self) -> int:
        """Failing seeds that ran past their deadline: the harness's fault, not the protocol's."""
        return sum(1 for _, v, _ in self.failures if v.startswith(HARNESS_FAILURE))

    @property
    def rate(self) -> float:
        return self.seeds / self.seconds if self.seconds > 0 else 0.0

    @property
    def rate_per_core(self) -> float:
        return self.rate / max(1, self.cores)

    def summary(self) -> str:
        lines = [
            f"faultsim: {self.seeds} seeds on {self.engine} ({self.cores} cores) in {self.seconds:.1f}s: "
            f"{self.rate:.0f} seeds/s, {self.rate_per_core:.0f} seeds/s per core",
            f"  {self.ok} passed, {len(self.failures) - self.harness_failures} violated an invariant, "
            f"{self.harness_failures} harness failures (ran past the deadline)",
            "  totals: " + ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items())),
        ]
        for seed, violation, trace in sorted(self.failures):
            replay = replay_command(seed, steps=self.steps, bugs=self.bugs)
            lines.append(f"\nFAILING SEED {seed}: {violation}\n  replay: {replay}")
            lines.extend("  " + t for t in trace)
        return "\n".join(lines)


def _quiet_logs() -> None:
    """Nodes log torn tails as warnings; thousands of seeds would bury the summary."""
    lg = logging.getLogger("qjm")
    lg.propagate = False
    if not lg.handlers:
        lg.addHandler(logging.NullHandler())


def run_partition(
    seeds: Iterable[int], steps: int = 400, bugs: ProtocolBugs | None = None, deadline: float | None = DEFAULT_DEADLINE
) -> Iterator[dict[str, Any]]:
    """Run the seeds of one partition; yield one record: counts, stats totals, failures with traces."""
    from qjm.testing.sim import run_seed

    _quiet_logs()
    n = ok = 0
    totals: dict[str, int] = {}
    failures: list[tuple[int, str, list[str]]] = []
    for seed in seeds:
        r = run_seed(seed, steps=steps, bugs=bugs, deadline=deadline)
        n += 1
        for k, v in r.stats.items():
            totals[k] = totals.get(k, 0) + v
        if r.ok:
            ok += 1
        else:
            failures.append((seed, r.violation or "?", r.trace))
    yield {"n": n, "ok": ok, "stats": totals, "failures": failures}


def _merge(report: FaultsimReport, parts: Iterable[dict[str, Any]]) -> tuple[int, int]:
    n_all = bad_all = 0
    for p in parts:
        report.seeds += p["n"]
        report.ok += p["ok"]
        n_all += p["n"]
        bad_all += p["n"] - p["ok"]
        for k, v in p["stats"].items():
            report.stats[k] = report.stats.get(k, 0) + v
        report.failures.extend((s, v, list(t)) for s, v, t in p["failures"])
    return n_all, bad_all


def _batches(seeds: range, batch: int) -> list[range]:
    return [seeds[i : i + batch] for i in range(0, len(seeds), batch)]


def _progress(out: TextIO, report: FaultsimReport, total: int, t0: float) -> None:
    el = time.perf_counter() - t0
    rate = report.seeds / el if el > 0 else 0.0
    print(
        f"faultsim: {report.seeds}/{total} seeds, {len(report.failures)} violations, "
        f"{rate:.0f} seeds/s ({rate / max(1, report.cores):.0f}/core), {el:.0f}s",
        file=out,
        flush=True,
    )


def _spark_session(master: str) -> Any:
    """A SparkSession bound to loopback only, workers on this very interpreter (ecosystem recipes §5)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("qjm-faultsim")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _have_pyspark() -> bool:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return False
    return True


def run_faultsim(
    seeds: range,
    *,
    master: str = "local[*]",
    steps: int = 400,
    bugs: ProtocolBugs | None = None,
    batch: int | None = None,
    slices_per_core: int = 4,
    out: TextIO = sys.stderr,
    use_spark: bool | None = None,
    processes: int | None = None,
    deadline: float | None = DEFAULT_DEADLINE,
) -> FaultsimReport:
    """Run every seed of ``seeds``; Spark if pyspark imports (or ``use_spark``), else a process pool."""
    if use_spark is None:
        use_spark = _have_pyspark()
    report = FaultsimReport(steps=steps, bugs=bugs)
    t0 = time.perf_counter()
    if use_spark:
        try:
            spark = _spark_session(master)
        except Exception as e:  # a bad master URL, no Java: the JVM's own lines above say more
            raise ConfigError(
                f"Spark did not start with master {master!r}: {type(e).__name__}: {str(e).splitlines()[0]} "
                "(use --local for a process pool instead)"
            ) from e
        try:
            sc = spark.sparkContext
            report.cores = int(sc.defaultParallelism)
            report.engine = f"Spark {spark.version} master {sc.master}"
            print(f"faultsim: {report.engine}, defaultParallelism {report.cores}", file=out, flush=True)
            size = batch or max(report.cores * 250, len(seeds) // 20 or 1)
            fn = _partition_fn(steps, bugs, deadline)
            for b in _batches(seeds, size):
                slices = max(1, min(len(b), report.cores * slices_per_core))
                parts = sc.parallelize(b, slices).mapPartitions(fn).collect()
                _merge(report, parts)
                _progress(out, report, len(seeds), t0)
        finally:
            spark.stop()
    else:
        import multiprocessing as mp

        report.cores = processes or os.cpu_count() or 1
        why = "pyspark is not importable" if not _have_pyspark() else "Spark not requested"
        report.engine = f"a local multiprocessing pool of {report.cores} processes"
        print(f"faultsim: {why}; running on {report.engine}", file=out, flush=True)
        size = batch or max(report.cores * 250, len(seeds) // 20 or 1)
        chunk = max(1, min(200, size // (report.cores * slices_per_core) or 1))
        ctx = mp.get_context("spawn")
        with ctx.Pool(report.cores) as pool:
            for b in _batches(seeds, size):
                jobs = [(b[i : i + chunk], steps, bugs, deadline) for i in range(0, len(b), chunk)]
                _merge(report, pool.starmap(_pool_job, jobs))
                _progress(out, report, len(seeds), t0)
    report.seconds = time.perf_counter() - t0
    return report


def _pool_job(seeds: range, steps: int, bugs: ProtocolBugs | None, deadline: float | None) -> dict[str, Any]:
    return next(run_partition(seeds, steps, bugs, deadline))


def _partition_fn(
    steps: int, bugs: ProtocolBugs | None, deadline: float | None
) -> Callable[[Iterable[int]], Iterator[dict[str, Any]]]:
    """A picklable function of one partition (the import happens on the executor)."""

    def fn(seeds: Iterable[int]) -> Iterator[dict[str, Any]]:
        from qjm.testing.faultsim import run_partition

        return run_partition(seeds, steps, bugs, deadline)

    return fn


def _search_job(
    lo: int, hi: int, bugs: ProtocolBugs | None, steps: int, check_durable_ack: bool
) -> tuple[int, str, list[str]] | None:
    from qjm.testing.sim import search_seeds

    _quiet_logs()
    hit = search_seeds(range(lo, hi), bugs=bugs, steps=steps, check_durable_ack=check_durable_ack)
    if hit is None:
        return None
    seed, r = hit
    return seed, r.violation or "?", r.trace


def first_violation(
    seeds: range,
    *,
    bugs: ProtocolBugs | None = None,
    processes: int | None = None,
    chunk: int = 250,
    steps: int = 400,
    check_durable_ack: bool = True,
) -> tuple[int, str, list[str]] | None:
    """The lowest seed of ``seeds`` that violates an invariant (with ``bugs``: one the switches caused).

    Chunks run on a process pool in order and the first chunk with a hit decides, so the answer is
    the same as a sequential scan's, only sooner.
    """
    import multiprocessing as mp

    n = processes or os.cpu_count() or 1
    chunks = [(seeds[i : i + chunk][0], seeds[i : i + chunk][-1] + 1) for i in range(0, len(seeds), chunk)]
    with mp.get_context("spawn").Pool(n) as pool:
        pending = [pool.apply_async(_search_job, (lo, hi, bugs, steps, check_durable_ack)) for lo, hi in chunks]
        for job in pending:
            hit = job.get()
            if hit is not None:
                pool.terminate()
                return hit
    return None
