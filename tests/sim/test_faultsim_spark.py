"""``qjm faultsim`` on a real Spark local[2]: seeds spread over executors, every result accounted for."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from qjm.testing.faultsim import run_faultsim

pytestmark = [pytest.mark.sim, pytest.mark.spark]


# In the Spark tests' xdist group (tests/spark/conftest.py): on their worker, in the JVM they use.
@pytest.mark.xdist_group("spark")
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


def test_a_master_spark_refuses_is_one_clear_line() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "qjm", "faultsim", "--seeds", "0:2", "--master", "bogus://x"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 1
    assert "qjm faultsim: ConfigError: Spark did not start with master 'bogus://x'" in r.stderr
    assert "--local" in r.stderr and "Traceback" not in r.stderr
