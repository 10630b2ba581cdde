"""Framing a 64 KiB batch and verifying/scanning it: native against the pure twin."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

SIZES = [100, 1024]


def records(size: int) -> list[bytes]:
    return [os.urandom(size)] * (64 * 1024 // (size + 4) + 1)


@pytest.mark.parametrize("size", SIZES)
def test_build_batch(benchmark: BenchmarkFixture, load: Callable[[str], ModuleType], size: int) -> None:
    framing = load("framing")
    recs = records(size)

    def build() -> bytes:
        b = framing.FrameBuilder()
        b.add_many(recs)
        return bytes(b.take(epoch=1, segment_txid=1, first_txid=1))

    frame = benchmark(build)
    assert framing.verify_frame(frame).record_count == len(recs)


@pytest.mark.parametrize("size", SIZES)
def test_build_batch_packed(benchmark: BenchmarkFixture, load: Callable[[str], ModuleType], size: int) -> None:
    """The same batch from one buffer + offsets (no Python object per record on the native side)."""
    import array

    framing = load("framing")
    recs = records(size)
    data = b"".join(recs)
    offsets = array.array("q", range(0, len(data) + 1, size))

    def build() -> bytes:
        b = framing.FrameBuilder()
        b.add_many(data, offsets)
        return bytes(b.take(epoch=1, segment_txid=1, first_txid=1))

    assert benchmark(build) == framing.encode_frame(recs, epoch=1, segment_txid=1, first_txid=1)


@pytest.mark.parametrize("size", SIZES)
def test_append_one_by_one(benchmark: BenchmarkFixture, load: Callable[[str], ModuleType], size: int) -> None:
    framing = load("framing")
    rec = os.urandom(size)
    n = 64 * 1024 // (size + 4) + 1

    def build() -> bytes:
        b = framing.FrameBuilder()
        for _ in range(n):
            b.add(rec)
        return bytes(b.take(epoch=1, segment_txid=1, first_txid=1))

    assert framing.decode_header(benchmark(build)).record_count == n


@pytest.mark.parametrize("size", SIZES)
def test_verify_frame(benchmark: BenchmarkFixture, load: Callable[[str], ModuleType], size: int) -> None:
    framing = load("framing")
    frame = framing.encode_frame(records(size), epoch=1, segment_txid=1, first_txid=1)
    assert benchmark(framing.verify_frame, frame).payload_len == len(frame) - 64


def test_scan_segment(benchmark: BenchmarkFixture, load: Callable[[str], ModuleType]) -> None:
    framing = load("framing")
    seg = [framing.encode_segment_header(1, 1)]
    txid = 1
    for _ in range(64):  # 4 MiB of 1 KiB records, then a zero tail
        recs = records(1024)
        seg.append(framing.encode_frame(recs, epoch=1, segment_txid=1, first_txid=txid))
        txid += len(recs)
    data = b"".join(seg) + bytes(1 << 20)
    res = benchmark(framing.scan, data, 1)
    assert (res.last_txid, res.tail) == (txid - 1, "clean")
