"""``qjm faultsim`` on a real Spark local[2]: seeds spread over executors, every result accounted for."""

from __future__ import annotations

import io

import pytest

from qjm.testing.faultsim import run_faultsim

pytestmark = [pytest.mark.sim, pytest.mark.spark]


def test_faultsim_on_spark_local2_runs_every_seed_without_violations() -> None:
    out = io.StringIO()
    rep = run_faultsim(range(2000), master="local[2]", use_spark=True, batch=1000, out=out)
    assert rep.engine.startswith("Spark") and "local[2]" in rep.engine
    assert rep.cores == 2
    assert rep.seeds == 2000 and rep.ok + len(rep.failures) == 2000
    failing = "\n".join(f"seed {s}: {v}" for s, v, _ in sorted(rep.failures)[:10])
    assert len(rep.failures) == 0, f"{len(rep.failures)} seeds violated an invariant:\n{failing}"
    progress = out.getvalue()
    assert "1000/2000 seeds" in progress and "2000/2000 seeds" in progress
    assert rep.stats["recoveries"] > 2000
