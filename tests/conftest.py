"""Suite-wide collection rules: on a pure run (``QJM_NO_EXTENSIONS=1``) the tests that compare
against compiled modules are left out (deselected, never reported as skipped or passed).

Timing rules that hold on a loaded machine: Spark tests get a longer per-test timeout
(SPARK_TIMEOUT), and property tests have no per-example time limit: Hypothesis' default (200 ms,
and its "too slow" health check) fails an example that a loaded machine merely stalled, which says
nothing about the property. The suite's per-test timeout (pyproject.toml) still bounds a hang.

Scheduling rules for xdist: the fault searches spread through the run, and a check that the
Spark tests' groups reached the workers (tests/spark/conftest.py makes them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from qjm.testing.certs import Pki, make_pki

settings.register_profile("qjm", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("qjm")

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
NATIVE_ONLY_MODULES = {"test_parity.py", "test_native_parity.py"}  # import the compiled modules
# A Spark test's time may include a session start (a JVM): 150 s of setup alone under
# load, against the suite's 300 s per test (pyproject.toml). Still a bound on a hang.
SPARK_TIMEOUT = 1200


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if NO_EXTENSIONS and collection_path.name in NATIVE_ONLY_MODULES:
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for it in items:
        if it.get_closest_marker("spark") is not None and it.get_closest_marker("timeout") is None:
            it.add_marker(pytest.mark.timeout(SPARK_TIMEOUT))
    if NO_EXTENSIONS:
        drop = [it for it in items if it.get_closest_marker("native") is not None]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = [it for it in items if it.get_closest_marker("native") is None]
    items[:] = _interleave_searches(items)


# The fault searches on the simulator (tests/sim, neither nodes nor Spark) keep a CPU busy for up
# to a minute each; most other tests wait on processes and sockets. Spread through the run rather
# than run back to back, they fill the CPU time the waiting tests leave, once xdist runs more
# workers than there are CPUs (Makefile's XDIST). The longest searches go first, so that none is
# left to the end of the run. Every process computes the same order, as xdist requires.
SEARCH_MODULES = ("test_sim_exhaustive.py", "test_sim_random.py", "test_teeth.py")


def _is_search(it: pytest.Item) -> bool:
    return (
        it.get_closest_marker("sim") is not None
        and it.get_closest_marker("integration") is None
        and it.get_closest_marker("spark") is None
    )


def _interleave_searches(items: list[pytest.Item]) -> list[pytest.Item]:
    searches = [it for it in items if _is_search(it)]
    rest = [it for it in items if not _is_search(it)]
    if not searches or not rest:
        return items
    rank = {name: i for i, name in enumerate(SEARCH_MODULES)}
    searches.sort(key=lambda it: rank.get(it.path.name, len(rank)))  # stable: file order within each
    # over the first two thirds of the others, so that the end of the run is short tests
    step = max(1, (2 * len(rest)) // (3 * len(searches)))
    out: list[pytest.Item] = []
    for i, it in enumerate(rest):
        if i % step == 0 and searches:
            out.append(searches.pop(0))
        out.append(it)
    return out + searches


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    # A Spark module whose tests reach several workers starts a session and a cluster on each: CI
    # minutes, and nothing fails. xdist marks a grouped test by an "@group" suffix on the node id it
    # reports, which pytest 9.2's structured node ids drop (pytest-xdist#1386).
    lost = [i for i in ids if i.startswith("tests/spark/") and "@" not in i]
    if lost and node.config.getvalue("dist") == "loadgroup":
        pytest.exit(
            f"--dist loadgroup lost the Spark modules' groups ({lost[0]} has none): this pytest-xdist "
            "cannot group tests on this pytest; install the versions pyproject.toml's test extra names",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A CA with node certificates jn0..jn2, clients alice, bob and ops, an expired client and one
    signed by another CA (qjm.testing.certs)."""
    return make_pki(str(tmp_path / "pki"))
