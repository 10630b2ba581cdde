"""Fuzz: both framing twins on damaged bytes and any offset (negative and past the end included).

Inputs are valid frames and segments, then cut, bit-flipped, spliced and read from arbitrary
offsets. The twins must give the same result or the same error (type, reason, offset, message),
and neither may fail with anything but a typed error: ``CorruptFrameError`` for bad bytes,
``ValueError`` for a bad argument such as a negative offset.

The comparison needs the compiled module and is marked ``native`` (a pure run deselects it);
the robustness of the pure twin alone runs in both modes.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qjm.protocol.frame import SEGMENT_HEADER_SIZE
from qjm.testing.twins import Outcome, outcome

py = importlib.import_module("qjm._native.framing_py")

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def compiled() -> ModuleType:
    return importlib.import_module("qjm._native.framing_c")  # an import failure is an error, not a skip


@st.composite
def segments(draw: st.DrawFn) -> tuple[bytes, int]:
    """A segment's bytes (header and frames), then damaged; and its start txid."""
    start = draw(st.integers(min_value=1, max_value=1000))
    epoch = draw(st.integers(min_value=1, max_value=5))
    out = bytearray(py.encode_segment_header(start, epoch))
    txid = start
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        recs = draw(st.lists(st.binary(max_size=40), min_size=1, max_size=5))
        out += py.encode_frame(recs, epoch=epoch, segment_txid=start, first_txid=txid)
        txid += len(recs)
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        kind = draw(st.sampled_from(["flip", "cut", "splice", "zeros"]))
        if not out:
            break
        at = draw(st.integers(min_value=0, max_value=len(out) - 1))
        if kind == "flip":
            out[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif kind == "cut":
            del out[at:]
        elif kind == "splice":
            out[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            out[at:] = bytes(len(out) - at)
    return bytes(out), start


offsets = st.one_of(
    st.integers(min_value=-200, max_value=-1),
    st.sampled_from([0, SEGMENT_HEADER_SIZE, 2**63 - 1, 2**63, -(2**63) - 1]),
    st.integers(min_value=0, max_value=400),
)


def calls(mod: ModuleType, data: bytes, start: int, offset: int) -> dict[str, Outcome]:
    return {
        "decode_header": outcome(mod.decode_header, data, offset),
        "verify_frame": outcome(mod.verify_frame, data, offset),
        "decode_records": outcome(mod.decode_records, data, offset),
        "scan": outcome(mod.scan, data, start, offset),
        "iter_frames": outcome(mod.iter_frames, data, start, offset),
        "decode_segment_header": outcome(mod.decode_segment_header, data),
        "scan_base": outcome(mod.scan, data[max(offset, 0) :], start, 0, base=offset),
    }


@pytest.mark.native
@FUZZ
@given(segments(), offsets)
def test_twins_agree_on_damaged_bytes_at_any_offset(seg: tuple[bytes, int], offset: int) -> None:
    data, start = seg
    assert calls(py, data, start, offset) == calls(compiled(), data, start, offset)


ints = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]),
)


def arg_calls(mod: ModuleType, data: bytes, start: int, n: tuple[int, int, int, int]) -> dict[str, Outcome]:
    a, b, c, d = n
    return {
        "scan_args": outcome(mod.scan, data, a, max(0, min(b, 400)), expected_txid=c, last_epoch=d),
        "scan_base": outcome(mod.scan, data, start, SEGMENT_HEADER_SIZE, base=b),
        "encode_segment_header": outcome(mod.encode_segment_header, a, b),
        "encode_frame": outcome(mod.encode_frame, [b"x"], epoch=a, segment_txid=c, first_txid=d),
    }


@pytest.mark.native
@FUZZ
@given(segments(), st.tuples(ints, ints, ints, ints))
def test_twins_agree_on_out_of_range_arguments(seg: tuple[bytes, int], n: tuple[int, int, int, int]) -> None:
    data, start = seg
    assert arg_calls(py, data, start, n) == arg_calls(compiled(), data, start, n)


@pytest.mark.native
def test_twins_refuse_a_negative_offset_alike() -> None:
    frame = py.encode_frame([b"a"], epoch=1, segment_txid=1, first_txid=1)
    c = compiled()
    for name in ("decode_header", "verify_frame", "decode_records"):
        a, b = outcome(getattr(py, name), frame, -len(frame)), outcome(getattr(c, name), frame, -len(frame))
        assert a == b and a.exc_type is ValueError, (name, a, b)
    for mod in (py, c):
        assert outcome(mod.scan, frame, 1, -1).exc_type is ValueError
        assert outcome(mod.iter_frames, frame, 1, -1).exc_type is ValueError


@FUZZ
@given(segments(), offsets)
def test_pure_twin_fails_only_with_typed_errors(seg: tuple[bytes, int], offset: int) -> None:
    data, start = seg
    for name, got in calls(py, data, start, offset).items():  # outcome() lets anything else through
        if offset < 0 and name in ("decode_header", "verify_frame", "decode_records", "scan", "iter_frames"):
            assert got.exc_type in (ValueError, OverflowError), (name, got)
