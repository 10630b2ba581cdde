"""Suite-wide collection rules: on a pure run (``QJM_NO_EXTENSIONS=1``) the tests that compare
against compiled modules are left out (deselected, never reported as skipped or passed).

Timing rules that hold on a loaded machine: Spark tests get a longer per-test timeout
(SPARK_TIMEOUT), and property tests have no per-example time limit: Hypothesis' default (200 ms,
and its "too slow" health check) fails an example that a loaded machine merely stalled, which says
nothing about the property. The suite's per-test timeout (pyproject.toml) still bounds a hang.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from qjm.testing.certs import Pki, make_pki

settings.register_profile("qjm", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("qjm")

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
NATIVE_ONLY_MODULES = {"test_parity.py", "test_native_parity.py"}  # import the compiled modules
# A Spark test's time includes its module's session start (a JVM): 150 s of setup alone under
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
    if not NO_EXTENSIONS:
        return
    drop = [it for it in items if it.get_closest_marker("native") is not None]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [it for it in items if it.get_closest_marker("native") is None]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A CA with node certificates jn0..jn2, clients alice, bob and ops, an expired client and one
    signed by another CA (qjm.testing.certs)."""
    return make_pki(str(tmp_path / "pki"))
