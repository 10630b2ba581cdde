"""The .pyi of each compiled module matches the module (mypy.stubtest), so the stub cannot drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.native
@pytest.mark.parametrize("module", ["qjm._native.framing_c", "qjm._native.segment_io_c", "qjm._native.fanout_c"])
def test_stubtest(module: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", str(ROOT / "pyproject.toml"), module],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, f"stubtest {module} failed:\n{proc.stdout}\n{proc.stderr}"
