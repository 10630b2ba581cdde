"""Data-plane messages other than frames: the hello, commit notices, acks and errors.

A writer opens one TCP connection per node and sends ``HELLO`` (which journal), then frames
(``include/qjm/frame.h``, sent as they will be stored) and ``COMMIT`` notices, pipelined. The node
answers cumulatively with ``ACK`` ("durable through txid N") or, once, with ``ERROR`` and closes.
Every message starts with a 4-byte magic so a confused peer is detected at once.

``include/qjm/wire.h`` declares the same layout for the native data plane; this module is the one
Python declaration of it (``fanout_py`` uses these structs too), and ``tests/unit/test_wire_layout.py``
checks that ``layout()`` equals the one ``fanout_c.wire_layout()`` reports from the header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from qjm.errors import CorruptFrameError

HELLO_MAGIC: Final = b"QJMH"
COMMIT_MAGIC: Final = b"QJMC"
ACK_MAGIC: Final = b"QJMA"
ERROR_MAGIC: Final = b"QJME"
WIRE_VERSION: Final = 1
MAX_ERROR_CODE: Final = 255
MAX_ERROR_TEXT: Final = 64 * 1024

# Each message header as a struct and its field names in order; the hello is followed by the
# journal id, the error by its code and its text.
HELLO: Final = struct.Struct("<4sHH")
HELLO_FIELDS: Final = ("magic", "version", "journal_id_len")
COMMIT: Final = struct.Struct("<4sIQq")
COMMIT_FIELDS: Final = ("magic", "reserved", "epoch", "committed_txid")
ACK: Final = struct.Struct("<4sIQ")
ACK_FIELDS: Final = ("magic", "reserved", "txid")
ERROR: Final = struct.Struct("<4sHHIq")
ERROR_FIELDS: Final = ("magic", "code_len", "reserved", "message_len", "durable_txid")


def field_offsets(fmt: struct.Struct, names: tuple[str, ...]) -> dict[str, int]:
    """Offset of each field of a packed little-endian struct (``4s`` is one field), by position."""
    offsets: list[int] = []
    pos = 0
    count = ""
    for ch in fmt.format.removeprefix("<"):
        if ch.isdigit():
            count += ch
            continue
        offsets.append(pos)
        pos += struct.calcsize(f"<{count}{ch}")
        count = ""
    if len(offsets) != len(names) or pos != fmt.size:
        raise ValueError(f"struct {fmt.format!r} does not have the fields {names}")
    return dict(zip(names, offsets, strict=True))


def layout() -> dict[str, dict[str, int]]:
    """Field offsets and sizes of the message headers, and the constants, as declared above.

    ``fanout_c.wire_layout()`` reports the same dict computed from ``include/qjm/wire.h``.
    """
    return {
        "hello": {**field_offsets(HELLO, HELLO_FIELDS), "size": HELLO.size},
        "commit": {**field_offsets(COMMIT, COMMIT_FIELDS), "size": COMMIT.size},
        "ack": {**field_offsets(ACK, ACK_FIELDS), "size": ACK.size},
        "error": {**field_offsets(ERROR, ERROR_FIELDS), "size": ERROR.size},
        "constants": {
            "HELLO_MAGIC": int.from_bytes(HELLO_MAGIC, "little"),
            "COMMIT_MAGIC": int.from_bytes(COMMIT_MAGIC, "little"),
            "ACK_MAGIC": int.from_bytes(ACK_MAGIC, "little"),
            "ERROR_MAGIC": int.from_bytes(ERROR_MAGIC, "little"),
            "WIRE_VERSION": WIRE_VERSION,
            "MAX_ERROR_CODE": MAX_ERROR_CODE,
            "MAX_ERROR_TEXT": MAX_ERROR_TEXT,
        },
    }


def encode_hello(journal_id: str) -> bytes:
    jid = journal_id.encode()
    return HELLO.pack(HELLO_MAGIC, WIRE_VERSION, len(jid)) + jid


def encode_commit(epoch: int, txid: int) -> bytes:
    return COMMIT.pack(COMMIT_MAGIC, 0, epoch, txid)


def encode_ack(txid: int) -> bytes:
    return ACK.pack(ACK_MAGIC, 0, txid)


def encode_error(code: str, message: str, durable_txid: int) -> bytes:
    c = code.encode()[:MAX_ERROR_CODE]
    m = message.encode()[:MAX_ERROR_TEXT]
    return ERROR.pack(ERROR_MAGIC, len(c), 0, len(m), durable_txid) + c + m


@dataclass(frozen=True, slots=True)
class Ack:
    txid: int


@dataclass(frozen=True, slots=True)
class NodeError:
    code: str
    message: str
    durable_txid: int


def parse_reply(buf: bytearray) -> tuple[Ack | NodeError | None, int]:
    """Parse one node→writer message from the front of ``buf``: (message or None if incomplete, bytes used)."""
    if len(buf) < 4:
        return None, 0
    magic = bytes(buf[:4])
    if magic == ACK_MAGIC:
        if len(buf) < ACK.size:
            return None, 0
        _, _, txid = ACK.unpack_from(buf)
        return Ack(txid), ACK.size
    if magic == ERROR_MAGIC:
        if len(buf) < ERROR.size:
            return None, 0
        _, clen, _, mlen, durable = ERROR.unpack_from(buf)
        if mlen > MAX_ERROR_TEXT:
            raise CorruptFrameError(f"node error text of {mlen} bytes is too long", reason="wire")
        need = ERROR.size + clen + mlen
        if len(buf) < need:
            return None, 0
        code = bytes(buf[ERROR.size : ERROR.size + clen]).decode(errors="replace")
        text = bytes(buf[ERROR.size + clen : need]).decode(errors="replace")
        return NodeError(code, text, durable), need
    raise CorruptFrameError(f"unexpected data-plane reply magic {magic!r}", reason="wire")
