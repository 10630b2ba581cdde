"""The node's data plane (pure-Python path): framed batches in, cumulative durable acks out.

One thread per writer connection. Each loop reads what the socket has, takes every complete
frame out of the buffer, hands the run to ``Journal.journal`` (one fdatasync for all of them:
group commit) and acks the highest durable txid. A bad frame, a stale epoch or a txid gap is
answered with one ERROR message and the connection is closed: a stream cannot be resynchronised
safely, and the writer treats the node as out of sync until its next segment.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Callable

from qjm._native import framing
from qjm.errors import CorruptFrameError, QJMError, to_code
from qjm.protocol import wire
from qjm.protocol.frame import FRAME_HEADER_SIZE, FRAME_MAGIC
from qjm.server.journal import Journal

log = logging.getLogger("qjm.data")

_FRAME_MAGIC_BYTES = FRAME_MAGIC.to_bytes(4, "little")
RECV_BYTES = 1 << 20


class _Conn(socketserver.BaseRequestHandler):
    server: DataServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        journal: Journal | None = None
        durable = 0
        try:
            while True:
                chunk = sock.recv(RECV_BYTES)
                if not chunk:
                    return
                buf += chunk
                if journal is None:
                    journal, used = self._hello(buf)
                    if journal is None:
                        continue
                    del buf[:used]
                frames, commits, used = _take_messages(buf)
                del buf[:used]
                if frames:
                    durable = journal.journal(frames)
                    sock.sendall(wire.encode_ack(durable))
                for epoch, txid in commits:
                    journal.note_committed(epoch, txid)
        except QJMError as e:
            durable = getattr(e, "durable_txid", durable)
            log.info("data plane %s: refusing: %s: %s", self.client_address, type(e).__name__, e)
            self._send_error(sock, to_code(e), str(e), durable)
        except OSError as e:
            log.info("data plane %s: connection lost: %s", self.client_address, e)
        except Exception as e:  # a bug must not kill the node: report it to the writer and log it
            log.exception("data plane %s: unexpected error", self.client_address)
            self._send_error(sock, "QJM_ERROR", f"{type(e).__name__}: {e}", durable)

    def _hello(self, buf: bytearray) -> tuple[Journal | None, int]:
        if len(buf) < wire.HELLO.size:
            return None, 0
        magic, version, jlen = wire.HELLO.unpack_from(buf)
        if magic != wire.HELLO_MAGIC or version != wire.WIRE_VERSION:
            raise CorruptFrameError(f"bad data-plane hello {bytes(buf[:8])!r}", reason="wire")
        if len(buf) < wire.HELLO.size + jlen:
            return None, 0
        jid = bytes(buf[wire.HELLO.size : wire.HELLO.size + jlen]).decode(errors="replace")
        return self.server.get_journal(jid), wire.HELLO.size + jlen

    @staticmethod
    def _send_error(sock: socket.socket, code: str, msg: str, durable: int) -> None:
        try:
            sock.sendall(wire.encode_error(code, msg, durable))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _take_messages(buf: bytearray) -> tuple[list[bytes], list[tuple[int, int]], int]:
    """Split complete frames and commit notices off the front of ``buf``.

    Only the header is checked here (to learn the length and refuse absurd ones before buffering
    them); the Journal verifies every frame whole before writing a byte of it.
    """
    pos = 0
    frames: list[bytes] = []
    commits: list[tuple[int, int]] = []
    n = len(buf)
    while n - pos >= 4:
        magic = bytes(buf[pos : pos + 4])
        if magic == _FRAME_MAGIC_BYTES:
            if n - pos < FRAME_HEADER_SIZE:
                break
            h = framing.decode_header(buf, pos)
            if n - pos < h.frame_len:
                break
            frames.append(bytes(buf[pos : pos + h.frame_len]))
            pos += h.frame_len
        elif magic == wire.COMMIT_MAGIC:
            if n - pos < wire.COMMIT.size:
                break
            _, _, epoch, txid = wire.COMMIT.unpack_from(buf, pos)
            commits.append((epoch, txid))
            pos += wire.COMMIT.size
        else:
            raise CorruptFrameError(f"unexpected data-plane message magic {magic!r}", reason="magic", offset=pos)
    return frames, commits, pos


class DataServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], get_journal: Callable[[str], Journal]) -> None:
        self.get_journal = get_journal
        super().__init__(address, _Conn)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="qjm-data", daemon=True)
        t.start()
        return t
