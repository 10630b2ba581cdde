"""include/qjm/frame.h (as compiled into framing_c) and its Python mirror protocol/frame.py agree."""

from __future__ import annotations

import importlib

import pytest

from qjm.protocol import frame as pf
from qjm.protocol.wire import field_offsets


def mirror_layout() -> dict[str, dict[str, int]]:
    return importlib.import_module("qjm._native.framing_py").layout()  # type: ignore[no-any-return]


def test_python_mirror_is_self_consistent() -> None:
    """The offsets table, the struct formats and the constants of protocol/frame.py agree."""
    assert field_offsets(pf.FRAME_HEADER, tuple(pf.FRAME_FIELD_OFFSETS)) == pf.FRAME_FIELD_OFFSETS
    assert field_offsets(pf.SEGMENT_HEADER, tuple(pf.SEGMENT_FIELD_OFFSETS)) == pf.SEGMENT_FIELD_OFFSETS
    assert pf.FRAME_HEADER.size == pf.FRAME_HEADER_SIZE
    assert pf.SEGMENT_HEADER.size == pf.SEGMENT_HEADER_SIZE
    assert pf.FRAME_FIELD_OFFSETS["header_xxh3"] == pf.FRAME_HEADER_CHECKED
    assert pf.SEGMENT_FIELD_OFFSETS["header_xxh3"] == pf.SEGMENT_HEADER_CHECKED
    assert pf.RECORD_PREFIX.size == pf.RECORD_PREFIX_SIZE
    assert pf.FRAME_MAGIC.to_bytes(4, "little") == b"QJMF"
    assert pf.SEGMENT_MAGIC.to_bytes(4, "little") == b"QJMS"


@pytest.mark.native
def test_native_layout_matches_python_mirror() -> None:
    native = importlib.import_module("qjm._native.framing_c")  # an import failure fails the test
    got = native.layout()
    want = mirror_layout()
    assert got["frame"] == want["frame"]
    assert got["segment"] == want["segment"]
    assert got["constants"] == want["constants"]
    assert got == want
