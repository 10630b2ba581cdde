"""Random fault search on the deterministic simulator (design §7.3): many seeds, zero violations.

Each seed is one execution of the real Journal and client code, the client's ``RemoteLogger``
included, under seeded faults (lost calls, lost replies, duplicated and late requests, reordered
planes, runs cut into txid gaps, node crashes with torn tails, partitions, lagging nodes, writers
dying in any phase, competing writers), with the invariants of design §2.7 checked after every step.
"""

from __future__ import annotations

import io
import os

import pytest

from qjm.__main__ import main
from qjm.testing.faultsim import run_faultsim
from qjm.testing.sim import Simulation, run_seed

pytestmark = pytest.mark.sim

SEEDS = 10_000
# The seeds run as CHUNKS parametrized cases, so that the suite's xdist workers share the search;
# together the cases cover range(SEEDS), and each chunk is held to the whole search's rates.
CHUNKS = 4
CHUNK = SEEDS // CHUNKS
# Under xdist each worker already keeps a CPU busy: one process per chunk; run alone, every CPU.
PROCESSES = 1 if os.environ.get("PYTEST_XDIST_WORKER") else (os.cpu_count() or 2)


def test_the_chunks_cover_every_seed_once() -> None:
    assert sorted(s for c in range(CHUNKS) for s in _chunk(c)) == list(range(SEEDS))


def _chunk(c: int) -> range:
    return range(c * CHUNK, (c + 1) * CHUNK)


# CPU-bound: its time doubles when both CPUs are busy elsewhere; the bound is on a hang.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_ten_thousand_random_seeds_hold_every_invariant(chunk: int) -> None:
    out = io.StringIO()
    rep = run_faultsim(_chunk(chunk), use_spark=False, processes=PROCESSES, out=out)
    failing = "\n".join(f"seed {s}: {v}" for s, v, _ in sorted(rep.failures)[:10])
    assert rep.seeds == CHUNK
    assert len(rep.failures) == 0, f"{len(rep.failures)} seeds violated an invariant:\n{failing}"
    # the seeds did exercise the faults and the protocol paths they are meant to
    st = rep.stats
    for kind in ("fail_before", "reply_lost", "node_crashes", "crash_inside", "writer_kills", "writer_crash_send",
                 "partitions", "fetch_fail", "group_commits", "fenced", "duplicated", "late", "reordered",
                 "gaps", "disk_losses", "rejoins"):  # fmt: skip
        assert st[kind] > 0, kind
    assert st["recoveries"] > 2 * CHUNK
    assert st["acked_txids"] > CHUNK
    # every recovery shape occurs, the rare ones too (the shapes profile)
    for shape in ("common", "partial", "unequal", "accepted"):
        assert st[f"shape_{shape}"] > CHUNK // 100, shape
    assert st["node_alarms"] == 0  # an alarm fails its seed: none may be left unreported
    # the writers roll by themselves and purge (design §2.12)
    assert st["auto_rolls"] > CHUNK // 10 and st["purges"] > CHUNK // 10
    # half the seeds count their batches with LinkBatch over quiet links, as a native build does
    assert st["link_batches"] > CHUNK // 4


def test_a_seed_replays_to_the_same_trace() -> None:
    for seed in (1, 77, 4242):
        a = run_seed(seed, keep_trace=True)
        b = run_seed(seed, keep_trace=True)
        assert a.trace == b.trace and a.stats == b.stats
        assert len(a.trace) > 10


def test_quiet_seeds_count_their_batches_with_link_batch() -> None:
    """Seeds 0-1, 4-5, ... run the native build's data path (RemoteLogger.deliver_batch counted by
    LinkBatch from the links' acks), the others a future per batch; both acknowledge txids."""
    quiet = loud = 0
    for seed in range(40):
        r = run_seed(seed)
        assert r.ok, r.violation
        if seed // 2 % 2 == 0:
            quiet += r.stats["link_batches"]
        else:
            assert r.stats["link_batches"] == 0
            loud += r.stats["acked_txids"]
    assert quiet > 20 and loud > 20


def test_trace_names_node_operation_and_outcome() -> None:
    r = Simulation(5).run()
    assert r.ok
    text = "\n".join(r.trace)
    for needle in ("get_journal_state()", "new_epoch(", "won epoch", "recovered", "=> ok"):
        assert needle in text, needle


def test_qjm_sim_replays_a_seed_with_its_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--seed", "5", "--trace"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-2].startswith("seed 5: ok")
    assert "n0 <- w1" in out or "n1 <- w1" in out or "n2 <- w1" in out
