"""``ThreadedLink``: the pure-Python data link, a sender and a receiver thread per node.

Batches are queued to the sender thread, which writes them to a long-lived TCP connection; the
receiver thread parses the node's cumulative ACKs and completes the batches' futures, or its one
ERROR reply, which ends the link (``qjm.client.data_link``). Used where the native fan-out engine
is not built (``QJM_NO_EXTENSIONS=1``). With TLS the connection is an ``ssl.SSLSocket`` (design §9.4).
"""

from __future__ import annotations

import queue
import socket
import ssl
import threading
from concurrent.futures import Future

from qjm.addresses import split_host_port
from qjm.client.data_link import LinkFailed, PendingBatches, encode_commit
from qjm.client.node_state import CommitNotice
from qjm.errors import NodeUnavailableError, OutOfSyncError, QJMError, TlsError
from qjm.protocol import wire
from qjm.security.tls import TlsConfig

__all__ = ["ThreadedLink"]

_THREAD_END = 5.0  # seconds close() waits for the threads, which end as soon as the socket is shut down


class ThreadedLink:
    """One TCP connection to a node's data plane: a sender thread, a receiver thread, cumulative acks."""

    def __init__(
        self,
        name: str,
        address: str,
        journal_id: str,
        connect_timeout: float,
        on_fail: LinkFailed,
        tls: TlsConfig | None = None,
    ) -> None:
        self.name = name
        host, port = split_host_port(address)
        sock = socket.create_connection((host, port), timeout=connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                sock = tls.client_ssl_context().wrap_socket(sock, server_hostname=host)  # the handshake
            except ssl.SSLError as e:
                sock.close()
                raise TlsError(f"{name}: TLS handshake with the data plane failed: {e}") from None
            except BaseException:
                sock.close()
                raise
        self._sock = sock
        self._sock.settimeout(None)
        self._q: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._batches = PendingBatches()
        self._on_fail = on_fail
        self.failed: BaseException | None = None  # set with the PendingBatches' failure
        self.closed = False
        # The descriptor is closed by the last of: _release and the two threads' ends (_leave).
        # Closed while a thread may still call into the socket, its number could be reused at once
        # (a pipe, a segment file) and an SSL session bound to that number would read or write there.
        self._close_lock = threading.Lock()
        self._running = 2
        self._released = False
        self._q.put(wire.encode_hello(journal_id))
        self._sender = threading.Thread(target=self._send_loop, name=f"qjm-send-{name}", daemon=True)
        self._receiver = threading.Thread(target=self._recv_loop, name=f"qjm-recv-{name}", daemon=True)
        self._sender.start()
        self._receiver.start()

    def send(self, frame: bytes, last_txid: int, fut: Future[int], commit: CommitNotice | None) -> None:
        with self._batches.lock:
            if not self._batches.add(last_txid, fut, len(frame)):
                return
        notice = encode_commit(commit)
        if notice is not None:
            self._q.put(notice)
        self._q.put(frame)

    def send_untracked(self, frame: bytes, last_txid: int, commit: CommitNotice | None) -> None:
        raise TypeError(f"{type(self).__name__} tracks every batch with a future")

    def send_notice(self, notice: bytes) -> None:
        self._q.put(notice)

    def engine_id(self) -> int | None:
        return None  # its own thread sends: there is no engine to send through

    def acked_txid(self) -> int:
        return self._batches.acked

    def fold_latencies(self) -> None:
        pass  # the writer times this link's acks (AckTimer)

    def unacked_bytes(self) -> int:
        with self._batches.lock:
            return self._batches.queued_bytes

    def wait_for_room(self, nbytes: int, limit: int, stall: float) -> None:
        self._batches.wait_for_room(nbytes, limit, stall)

    def wait_idle(self, timeout: float) -> None:
        self._batches.wait_idle(timeout)

    def _send_loop(self) -> None:
        try:
            while True:
                msg = self._q.get()
                if msg is None:
                    return
                self._sock.sendall(msg)
        except ssl.SSLError as e:  # under TLS 1.3 a node's refusal of our certificate can surface here
            self._fail(TlsError(f"{self.name}: data plane TLS session failed: {e}"))
        except OSError as e:
            self._fail(NodeUnavailableError(f"{self.name}: data plane send failed: {e}"))
        finally:
            self._leave()

    def _recv_loop(self) -> None:
        buf = bytearray()
        try:
            while True:
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise NodeUnavailableError(f"{self.name}: data plane connection closed by the node")
                buf += chunk
                self._batches.take_replies(buf, self.name)
        except BaseException as e:
            if isinstance(e, ssl.SSLError):
                e = TlsError(f"{self.name}: data plane TLS session failed: {e}")
            elif isinstance(e, OSError) and not isinstance(e, QJMError):
                e = NodeUnavailableError(f"{self.name}: data plane receive failed: {e}")
            self._fail(e)
        finally:
            self._leave()

    def _leave(self) -> None:
        """A thread of the link has stopped using the socket."""
        with self._close_lock:
            self._running -= 1
            last = self._released and self._running == 0
        if last:
            self._sock.close()

    def _fail(self, e: BaseException) -> None:
        if self._batches.fail(e):
            self.failed = e
            self.closed = True
            self._release()
            self._on_fail(self, e)

    def close(self) -> None:
        self.closed = True
        self._fail(OutOfSyncError(f"{self.name}: data link closed with batches pending"))
        self._release()

    def _release(self) -> None:
        """Stop both threads and close the socket once neither uses it (again is harmless).

        Shutting the connection down ends the receiver's recv and the sender's sendall at once; a
        caller other than the link's own threads waits for both (briefly), so that the descriptor
        is closed when ``close()`` returns."""
        self._q.put(None)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        me = threading.current_thread()
        if me is not self._sender and me is not self._receiver:
            self._sender.join(_THREAD_END)
            self._receiver.join(_THREAD_END)
        with self._close_lock:
            self._released = True
            last = self._running == 0
        if last:
            self._sock.close()
