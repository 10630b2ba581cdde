"""Data-plane messages other than frames: the hello, commit notices, acks and errors.

A writer opens one TCP connection per node and sends ``HELLO`` (which journal), then frames
(``include/qjm/frame.h``, sent as they will be stored) and ``COMMIT`` notices, pipelined. The node
answers cumulatively with ``ACK`` ("durable through txid N") or, once, with ``ERROR`` and closes.
Every message starts with a 4-byte magic so a confused peer is detected at once.
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

HELLO: Final = struct.Struct("<4sHH")  # magic, version, journal-id length; then the id
COMMIT: Final = struct.Struct("<4sIQq")  # magic, 0, epoch, committed txid
ACK: Final = struct.Struct("<4sIQ")  # magic, 0, durable-through txid
ERROR: Final = struct.Struct("<4sHHIq")  # magic, code length, 0, message length, durable txid
MAX_ERROR_TEXT: Final = 64 * 1024


def encode_hello(journal_id: str) -> bytes:
    jid = journal_id.encode()
    return HELLO.pack(HELLO_MAGIC, WIRE_VERSION, len(jid)) + jid


def encode_commit(epoch: int, txid: int) -> bytes:
    return COMMIT.pack(COMMIT_MAGIC, 0, epoch, txid)


def encode_ack(txid: int) -> bytes:
    return ACK.pack(ACK_MAGIC, 0, txid)


def encode_error(code: str, message: str, durable_txid: int) -> bytes:
    c = code.encode()[:255]
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
