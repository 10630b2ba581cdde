"""include/qjm/wire.h (as compiled into fanout_c) and its Python declaration protocol/wire.py agree."""

from __future__ import annotations

import importlib
import struct

import pytest

from qjm.protocol import wire


def test_python_declaration_is_self_consistent() -> None:
    """The structs, their field names and the constants of protocol/wire.py agree."""
    got = wire.layout()
    for name, fmt, fields in (
        ("hello", wire.HELLO, wire.HELLO_FIELDS),
        ("commit", wire.COMMIT, wire.COMMIT_FIELDS),
        ("ack", wire.ACK, wire.ACK_FIELDS),
        ("error", wire.ERROR, wire.ERROR_FIELDS),
    ):
        assert list(got[name]) == [*fields, "size"]
        assert got[name]["size"] == fmt.size == struct.calcsize(fmt.format)
        assert fmt.format.startswith("<4s")  # little-endian, packed, a 4-byte magic first
    for magic in ("HELLO", "COMMIT", "ACK", "ERROR"):
        assert getattr(wire, f"{magic}_MAGIC") == b"QJM" + magic[0].encode()
    assert wire.encode_ack(7) == wire.ACK.pack(wire.ACK_MAGIC, 0, 7)
    assert len(wire.encode_error("c" * 999, "", 0)) == wire.ERROR.size + wire.MAX_ERROR_CODE


def test_field_offsets_refuses_names_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="does not have the fields"):
        wire.field_offsets(wire.ACK, ("magic", "txid"))


def test_pure_data_plane_reports_the_python_declaration() -> None:
    pure = importlib.import_module("qjm._native.fanout_py")
    assert pure.wire_layout() == wire.layout()
    assert wire.ACK.size == pure.ACK_SIZE


@pytest.mark.native
def test_native_layout_matches_the_python_declaration() -> None:
    native = importlib.import_module("qjm._native.fanout_c")  # an import failure fails the test
    got = native.wire_layout()
    want = wire.layout()
    for part in ("hello", "commit", "ack", "error", "constants"):
        assert got[part] == want[part], part
    assert got == want
    assert wire.ACK.size == native.ACK_SIZE
