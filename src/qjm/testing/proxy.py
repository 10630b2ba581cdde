"""A userspace TCP proxy for chaos tests: added latency, dropped connections, partitions.

One ``TcpProxy`` listens on loopback and forwards every connection to one target, with a pump
thread per direction. Faults apply live: ``delay`` holds each chunk before forwarding it (order is
kept), ``drop_connections()`` resets every open connection at once (both sides see it die), and
``partition(True)`` does that and refuses new connections until ``partition(False)``.

It sits in front of a node's control plane (gRPC). The data plane cannot be proxied without a
server change: writers connect to the data address the node advertises in get_journal_state.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

__all__ = ["TcpProxy"]

_CHUNK = 1 << 16


class _Conn:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = False
        self._lock = threading.Lock()

    def close(self, reset: bool = False) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.upstream):
            if reset:  # RST instead of FIN: the peer sees the connection die, as on a network fault
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


class TcpProxy:
    """``TcpProxy(("127.0.0.1", 8485)).start()``; then connect to ``proxy.address`` instead."""

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self._listener = socket.create_server((host, port), reuse_port=False)
        self._listener.settimeout(0.2)
        self.host, self.port = self._listener.getsockname()[:2]
        self.delay = 0.0
        self._blocked = False
        self._conns: set[_Conn] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"qjm-proxy-{self.port}", daemon=True)
        self.connections = 0
        self.dropped = 0
        self.refused = 0
        self.bytes = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop_connections(count=False)

    # -- faults ------------------------------------------------------------------------------

    def drop_connections(self, *, count: bool = True) -> int:
        """Reset every open connection; returns how many there were."""
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for c in conns:
            c.close(reset=True)
        if count:
            self.dropped += len(conns)
        return len(conns)

    def partition(self, on: bool) -> None:
        """Cut the target off: open connections die and new ones are refused, until healed."""
        self._blocked = on
        if on:
            self.drop_connections()

    @property
    def partitioned(self) -> bool:
        return self._blocked

    # -- plumbing ----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._blocked:
                self.refused += 1
                _Conn(client, socket.socket()).close(reset=True)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                self.refused += 1
                _Conn(client, socket.socket()).close(reset=True)
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, upstream)
            with self._lock:
                self._conns.add(conn)
            self.connections += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(conn, src, dst), daemon=True).start()

    def _pump(self, conn: _Conn, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                d = self.delay
                if d > 0:
                    time.sleep(d)  # latency injection, not synchronisation
                dst.sendall(data)
                self.bytes += len(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
