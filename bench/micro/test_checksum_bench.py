"""XXH3-64 over batch-sized buffers: libxxhash from Cython against the PyPI xxhash of the twin."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

import pytest
import xxhash
from pytest_benchmark.fixture import BenchmarkFixture


@pytest.mark.parametrize("size", [64, 1024, 64 * 1024, 4 << 20])
def test_xxh3_64(benchmark: BenchmarkFixture, load: Callable[[str], ModuleType], size: int) -> None:
    framing = load("framing")
    data = os.urandom(size)
    assert benchmark(framing.xxh3_64, data) == xxhash.xxh3_64_intdigest(data)
