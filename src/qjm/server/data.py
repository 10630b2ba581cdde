"""The node's data plane: framed batches in, cumulative durable acks out.

One thread per writer connection. The bytes are moved by ``qjm._native.fanout.Receiver`` (Cython,
the GIL released while it waits and splits the stream; its pure twin when QJM_NO_EXTENSIONS=1):
each run is every complete message received since the last one. Under the journal's lock the
receiver hands the run's frames, still in its buffer, to the open segment's write gate
(``qjm._native.gate``: verify, fence, append, one fdatasync for all of them: group commit), and
acks the highest durable txid as soon as it is durable, without waiting on the socket (design
§1.3); what the socket does not take at once follows when the run is done. A frame or notice the
gate does not pass, and every run while no segment is open, goes to ``Journal.journal`` and
``note_committed``, whose checks accept it or say why not. While that fdatasync runs the next
frames pile up in the socket, so a busy writer gets larger groups. A bad frame, a stale epoch or
a txid gap is answered with one ERROR message and the connection is closed: a stream cannot be
resynchronised safely, and the writer treats the node as out of sync until its next segment
(style-anchors R17: the error becomes state, never an unwind through the receive loop).

With TLS (design §9.4) the Receiver first runs the handshake (a client certificate signed by the
node's CA required), bounded by ``hello_timeout`` like the hello, then reads and acks through the
session without the GIL; the writer's identity must hold the writer role on the journal its hello
names. A peer that does not start with a TLS handshake
record (a plaintext writer, garbage) is answered with one plaintext ERROR (code TLS) and closed.
"""

from __future__ import annotations

import logging
import operator
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from qjm._native import fanout
from qjm.addresses import family_of
from qjm.errors import QJMError, ResourceExhaustedError, TlsError, to_code
from qjm.protocol import wire
from qjm.security.authz import WRITER, Authorizer
from qjm.security.certs import identity_of_der
from qjm.security.redact import public_message
from qjm.security.tls import TlsConfig
from qjm.server.frame_memory import FrameMemory
from qjm.server.journal import Journal
from qjm.server.limits import NodeLimits
from qjm.server.registry import JournalRegistry
from qjm.server.sockets import DRAIN_SECONDS, TLS_HANDSHAKE_RECORD, drain

log = logging.getLogger("qjm.data")

_NOTICE_TXID = operator.itemgetter(1)  # of a commit notice (epoch, txid)


def apply_run(
    journal: Journal, frames: Sequence[bytes], commits: Sequence[tuple[int, int]], ack: Callable[[int], None]
) -> int:
    """Apply one run of a writer's data stream to ``journal``; returns the highest durable txid.

    The frames are verified, fenced, appended and made durable together (``Journal.journal``), the
    durable txid is acked, then the newest commit notice is noted: a lower bound that only grows,
    so the highest of the run says it all. A refusal raises the node's error; one raised by the
    frames carries ``durable_txid`` when frames before the bad one were made durable. The node's
    data handler applies with this what the open segment's gate did not pass; the simulator
    applies every run with it.
    """
    durable = 0
    if frames:
        durable = journal.journal(frames, ack)  # acked once durable, before the journal's bookkeeping
    if commits:
        journal.note_committed(*(commits[0] if len(commits) == 1 else max(commits, key=_NOTICE_TXID)))
    return durable


def _set_receive_timeout(sock: socket.socket, seconds: float) -> None:
    """SO_RCVTIMEO, not ``settimeout``: the native receiver calls recv(2) on the descriptor, and
    ``settimeout`` would make it non-blocking. A recv past the timeout fails with EAGAIN (OSError);
    0 clears the timeout."""
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, int((seconds - whole) * 1e6)))


class _Conn(socketserver.BaseRequestHandler):
    server: DataServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        limits = self.server.limits
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A peer that vanishes (power loss, a partition) without a FIN is noticed by keepalive.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, limits.keepalive_idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, limits.keepalive_interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, limits.keepalive_count)
        _set_receive_timeout(sock, limits.hello_timeout)
        rx = fanout.Receiver(sock, limits.max_frame_bytes, self.server.frame_memory)
        try:
            identity: str | None = None
            if self.server.tls is not None:
                if not self._accept_tls(sock, rx, self.server.tls):
                    return
                identity = identity_of_der(rx.peer_certificate() or b"")
            self._serve(sock, rx, identity)
        finally:
            rx.close()

    def _accept_tls(self, sock: socket.socket, rx: Any, tls: Any) -> bool:
        """The TLS handshake, within ``hello_timeout`` in all; False (logged, counted, closed) if refused."""
        try:
            first = sock.recv(1, socket.MSG_PEEK)  # within the hello_timeout set on the socket
        except OSError as e:
            self.server.count_tls_refusal(self.client_address, f"no TLS handshake: {e}")
            return False
        if not first:
            return False
        if first[0] != TLS_HANDSHAKE_RECORD:
            err = TlsError("this node's data plane requires TLS (mutual, with a certificate of its CA)")
            self.server.count_tls_refusal(self.client_address, "a peer that does not speak TLS")
            self._send_error(sock, rx, to_code(err), str(err), 0)
            drain(sock, time.monotonic() + DRAIN_SECONDS)
            return False
        try:
            rx.handshake(tls, self.server.limits.hello_timeout)
        except (TlsError, OSError) as e:
            self.server.count_tls_refusal(self.client_address, str(e))
            try:
                sock.shutdown(socket.SHUT_WR)  # after the alert the session sent
            except OSError:
                pass
            drain(sock, time.monotonic() + DRAIN_SECONDS)
            return False
        return True

    def _serve(self, sock: socket.socket, rx: Any, identity: str | None) -> None:
        limits = self.server.limits

        def ack(txid: int) -> None:
            # Called under the journal's lock: it must not wait on a writer that does not read its
            # acks (new epochs would wait on it); what the socket does not take now goes at flush.
            rx.ack(txid, False)

        try:
            jid = rx.hello()
            if jid is None:
                return
            self.server.authz.check(identity, jid, WRITER)
            _set_receive_timeout(sock, limits.idle_timeout)
            with self.server.journals.lease(jid) as journal:
                while rx.wait_run():
                    # The common case in the native receiver and gate, under the journal's lock;
                    # what the gate does not pass is applied (or refused) by the journal's checks.
                    if not journal.journal_through_gate(rx.journal_run):
                        frames, commits = rx.next_run()
                        apply_run(journal, frames, commits, ack)
                    rx.flush()
        except QJMError as e:
            durable = getattr(e, "durable_txid", rx.acked)
            log.info("data plane %s: refusing: %s: %s", self.client_address, type(e).__name__, e)
            self._send_error(sock, rx, to_code(e), public_message(str(e), self.server.journals.data_dir), durable)
        except OSError as e:
            log.info("data plane %s: connection lost or idle too long: %s", self.client_address, e)
        except Exception as e:  # a bug must not kill the node: report it to the writer and log it
            log.exception("data plane %s: unexpected error", self.client_address)
            self._send_error(
                sock, rx, "QJM_ERROR", public_message(f"{type(e).__name__}: {e}", self.server.journals.data_dir),
                rx.acked,
            )  # fmt: skip

    @staticmethod
    def _send_error(sock: socket.socket, rx: Any, code: str, msg: str, durable: int) -> None:
        """One ERROR message (through the TLS session, once there is one), then the write side closed."""
        try:
            rx.send(wire.encode_error(code, msg, durable))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class DataServer(socketserver.ThreadingTCPServer):
    """One thread per connection, at most ``limits.max_data_connections`` of them; a connection
    past that is refused with one ERROR message from the accepting thread, and no thread."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        journals: JournalRegistry,
        limits: NodeLimits,
        *,
        tls: TlsConfig | None = None,
        authz: Authorizer | None = None,
    ) -> None:
        self.journals = journals
        self.limits = limits
        # With TLS, a client certificate signed by the CA is required, and its identity is checked
        # against ``authz`` for the writer role on the journal the hello names (design §9.4).
        self.tls = fanout.TlsServer(tls.ca_file, tls.cert_file, tls.key_file) if tls is not None else None
        self.authz = authz or Authorizer()
        self.tls_refusals = 0
        self.frame_memory = FrameMemory(limits.frame_memory, limits.frame_memory_wait)
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self.refused_connections = 0
        self.address_family = family_of(address[0])  # read by the base class when it makes the socket
        super().__init__(address, _Conn)

    def count_tls_refusal(self, peer: object, why: str) -> None:
        self.tls_refusals += 1
        log.warning("data plane %s: refused: %s", peer, why)

    def connection_count(self) -> int:
        with self._conns_lock:
            return len(self._conns)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            full = len(self._conns) >= self.limits.max_data_connections
            if not full:
                self._conns.add(request)
        if full:
            self.refused_connections += 1
            err = ResourceExhaustedError(
                f"this node already serves {self.limits.max_data_connections} data-plane connections "
                "(max_data_connections)"
            )
            try:
                request.setblocking(False)
                request.send(wire.encode_error(to_code(err), str(err), 0))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Wake every connection thread (its recv fails) so that it lets go of its journal."""
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="qjm-data", daemon=True)
        t.start()
        return t
