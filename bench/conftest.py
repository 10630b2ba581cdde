"""pytest-benchmark suites: every micro benchmark runs on the native module and its pure twin.

``pytest bench`` measures; ``pytest bench --benchmark-disable`` runs each body once (CI smoke).
The backend, the capabilities (io_uring, O_DIRECT, xxh3) and the commit go into the results.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
BACKENDS = ["py"] if NO_EXTENSIONS else ["native", "py"]


def module(role: str, backend: str) -> ModuleType:
    return importlib.import_module(f"qjm._native.{role}_{'c' if backend == 'native' else 'py'}")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def load(backend: str) -> Callable[[str], ModuleType]:
    """``load("framing")``: the module of that role on the backend under test."""
    return lambda role: module(role, backend)


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    from qjm._native import capabilities
    from qjm.bench.driver import qjm_build

    machine_info["qjm_capabilities"] = capabilities()
    machine_info["qjm_version"], machine_info["qjm_commit"] = qjm_build()  # the checkout measured, not the cwd's
