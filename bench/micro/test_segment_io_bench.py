"""Appends made durable on a real disk: io_uring write linked to fdatasync, pwrite + fdatasync, the twin."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
PATHS = [("py", "pwrite")] + ([] if NO_EXTENSIONS else [("native", "io_uring"), ("native", "pwrite")])


@pytest.mark.parametrize(("backend_name", "path"), PATHS, ids=[f"{b}-{p}" for b, p in PATHS])
@pytest.mark.parametrize("size", [1100, 64 * 1024 + 64])
def test_append_sync(benchmark: BenchmarkFixture, tmp_path: Path, backend_name: str, path: str, size: int) -> None:
    sio = importlib.import_module(f"qjm._native.segment_io_{'c' if backend_name == 'native' else 'py'}")
    a = sio.Appender(str(tmp_path / "seg"), bytes(64), io_uring=path == "io_uring")
    frame = os.urandom(size)

    def append_sync() -> None:
        a.append(frame)
        a.sync()

    benchmark(append_sync)
    assert a.size > 64 and (a.io == path or not sio.io_uring_available())
    a.close()


@pytest.mark.parametrize("group", [1, 16])
def test_group_commit(
    benchmark: BenchmarkFixture, tmp_path: Path, load: Callable[[str], ModuleType], group: int
) -> None:
    """``group`` 1 KiB frames per fdatasync, as the node does with frames that arrived meanwhile."""
    sio = load("segment_io")
    a = sio.Appender(str(tmp_path / "seg"), bytes(64))
    frame = os.urandom(1100)

    def run() -> None:
        for _ in range(group):
            a.append(frame)
        a.sync()

    benchmark(run)
    assert os.path.getsize(tmp_path / "seg") == a.allocated
    a.close()
