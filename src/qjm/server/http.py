"""The node's HTTP port (Hadoop's JournalNode serves one, 8480 by default): metrics, health, status.

``/metrics``  the Prometheus text format (OpenMetrics or gzip when the scraper asks), from the
              node's own registry (``qjm.server.metrics``)
``/health``   200 ``{"healthy": true}`` when the data directory takes a write and every journal on it
              loaded; otherwise 503 with the reasons, for a load balancer or an orchestrator's probe
``/status``   the node and its journals as JSON; as a small HTML page when a browser asks for HTML
              (or with ``?format=html``)

A WSGI app on ``wsgiref``'s threading server, as ``prometheus_client.start_http_server`` uses, with
the request log sent to the ``qjm.http`` logger at DEBUG instead of stderr.

With the node's TLS (design §9.5) the port serves HTTPS with the node's certificate, asking for a
client certificate: ``optional`` serves a client without one (a scraper, a load balancer's probe)
but refuses one whose certificate the CA did not sign; ``required`` serves only clients with a
certificate of the CA. The accepting thread only accepts: the handshake runs in the connection's
own thread, within ``hello_timeout`` in all, so a client that stalls or sends garbage holds one
thread for at most that long and never the accept loop. At most ``max_http_connections`` are
served at once; one more is closed at once, with no thread. Each refusal (a failed or missing
handshake: reason ``tls``; the bound: ``limit``) is logged at INFO and counted.
"""

from __future__ import annotations

import html
import json
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from qjm.addresses import family_of
from qjm.errors import ConfigError
from qjm.security.tls import TlsConfig
from qjm.server.metrics import NodeMetrics
from qjm.server.sockets import DRAIN_SECONDS, TLS_HANDSHAKE_RECORD, drain

log = logging.getLogger("qjm.http")

StartResponse = Callable[..., Any]


CLIENT_AUTH = {"optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
"""``http_client_auth``: whether a client of the HTTPS port must present a certificate of the CA."""

_NOT_TLS = (
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)
_NOT_TLS_BODY = b"this port serves HTTPS only: ask https://, trusting the CA that signed the node's certificate\n"
_FULL = b"HTTP/1.0 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


def https_context(tls: TlsConfig, client_auth: str = "optional") -> ssl.SSLContext:
    """The HTTPS port's server context: the node's certificate, TLS 1.3 (``TlsConfig``), and a client
    certificate of the CA ``optional`` (checked when one is presented) or ``required``."""
    if client_auth not in CLIENT_AUTH:
        raise ConfigError(f"http_client_auth must be one of {', '.join(CLIENT_AUTH)}, got {client_auth!r}")
    ctx = tls.server_ssl_context()
    ctx.verify_mode = CLIENT_AUTH[client_auth]
    return ctx


class _QuietHandler(WSGIRequestHandler):
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.io_timeout)  # each read and write of the request and the reply

    def get_environ(self) -> dict[str, str]:
        env = super().get_environ()
        if self.server.tls is not None:
            env["HTTPS"] = "on"  # wsgi.url_scheme https
        return env

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class _Server(ThreadingWSGIServer):
    """One thread per connection, at most ``max_connections`` at once; with ``tls`` (an
    ``ssl.SSLContext``) each thread runs its connection's handshake within ``io_timeout``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], *, tls: ssl.SSLContext | None, io_timeout: float, max_connections: int
    ) -> None:
        self.tls = tls
        self.io_timeout = io_timeout
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._active = 0
        self._refused = {"tls": 0, "limit": 0}
        self.address_family = family_of(address[0])  # read by the base class when it makes the socket
        super().__init__(address, _QuietHandler)

    def refused(self) -> dict[str, int]:
        with self._lock:
            return dict(self._refused)

    def connection_count(self) -> int:
        with self._lock:
            return self._active

    def _refuse(self, reason: str, peer: object, why: str) -> None:
        with self._lock:
            self._refused[reason] += 1
        log.info("HTTP port %s: refused: %s", peer, why)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            full = self._active >= self.max_connections
            if not full:
                self._active += 1
        if full:
            self._refuse("limit", client_address, f"{self.max_connections} connections already (max_http_connections)")
            if self.tls is None:
                try:
                    request.setblocking(False)
                    request.send(_FULL)
                except OSError:
                    pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # a thread of its own
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        with self._lock:
            self._active -= 1

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        conn = request
        try:
            if self.tls is not None:
                conn = self._secure(request, client_address)
            if conn is not None:
                self.finish_request(conn, client_address)
        except Exception:
            self.handle_error(conn, client_address)
        finally:
            if conn is not None:
                self.shutdown_request(conn)
            self._release()

    def _secure(self, sock: socket.socket, peer: object) -> ssl.SSLSocket | None:
        """The TLS handshake on an accepted socket, within ``io_timeout`` in all; None (logged,
        counted, closed) if the client does not complete one."""
        assert self.tls is not None
        deadline = time.monotonic() + self.io_timeout
        try:
            sock.settimeout(self.io_timeout)
            first = sock.recv(1, socket.MSG_PEEK)
        except OSError as e:
            self._refuse("tls", peer, f"no TLS handshake: {_why(e, self.io_timeout)}")
            sock.close()
            return None
        if not first:  # connected and hung up: a TCP probe
            log.debug("HTTP port %s: closed before a handshake", peer)
            sock.close()
            return None
        if first[0] != TLS_HANDSHAKE_RECORD:
            self._refuse("tls", peer, "a client that does not speak TLS (plain HTTP?)")
            self._answer_not_tls(sock, deadline)
            return None
        conn = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)  # takes over ``sock``
        try:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))  # bounds the whole handshake
            conn.do_handshake()
        except OSError as e:  # ssl.SSLError included: a certificate of another CA, a garbled record
            self._refuse("tls", peer, f"TLS handshake failed: {_why(e, self.io_timeout)}")
            try:
                conn.shutdown(socket.SHUT_WR)  # after the alert the session sent, which the client should read
                drain(conn, min(deadline, time.monotonic() + DRAIN_SECONDS))
            except OSError:
                pass
            conn.close()
            return None
        return conn

    @staticmethod
    def _answer_not_tls(sock: socket.socket, deadline: float) -> None:
        """Tell a plaintext client (curl http://) what the port wants, then close."""
        try:
            sock.setblocking(False)
            try:
                sock.recv(65536)  # the request, read so that closing does not reset the reply
            except BlockingIOError:
                pass
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(_NOT_TLS % (len(_NOT_TLS_BODY), _NOT_TLS_BODY))
            sock.shutdown(socket.SHUT_WR)
            drain(sock, min(deadline, time.monotonic() + DRAIN_SECONDS))
        except OSError:
            pass
        finally:
            sock.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        e = sys.exc_info()[1]
        if isinstance(e, OSError):  # a client that went away or stalled mid-request
            log.debug("HTTP port %s: connection ended: %s", client_address, _why(e, self.io_timeout))
        else:
            log.error("HTTP port %s: unexpected error", client_address, exc_info=True)


def _why(e: OSError, timeout: float) -> str:
    if isinstance(e, TimeoutError):
        return f"nothing within {timeout:g} s"
    if isinstance(e, ssl.SSLError):
        return e.verify_message if isinstance(e, ssl.SSLCertVerificationError) else (e.reason or str(e))
    return e.strerror or str(e)


def _json(start: StartResponse, code: str, body: object) -> list[bytes]:
    data = (json.dumps(body, indent=2, default=str) + "\n").encode()
    start(code, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def _status_html(st: dict[str, Any]) -> bytes:
    e = html.escape
    state = "healthy" if st["healthy"] else "UNHEALTHY: " + "; ".join(st["reasons"])
    cols = [
        "journal_id", "formatted", "promised_epoch", "writer_epoch", "committed_txid", "last_written_txid",
        "lag_txns", "open_segment", "segments", "disk_bytes", "txns_written", "out_of_sync", "fenced_requests",
    ]  # fmt: skip
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    rows = "".join("<tr>" + "".join(f"<td>{e(str(j.get(c, '')))}</td>" for c in cols) + "</tr>" for j in st["journals"])
    node = "".join(
        f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>"
        for k, v in st.items()
        if k not in ("journals", "reasons", "healthy", "load_failures")
    )
    fails = "".join(f"<li>{e(k)}: {e(v)}</li>" for k, v in st["load_failures"].items())
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>qjm JournalNode</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}</style></head><body>"
        f"<h1>qjm JournalNode</h1><p><b>{e(state)}</b></p><table>{node}</table>"
        f"<h2>Journals</h2><table><tr>{head}</tr>{rows}</table>"
        + (f"<h2>Failed to load</h2><ul>{fails}</ul>" if fails else "")
        + "<p><a href='/metrics'>/metrics</a> <a href='/health'>/health</a> "
        "<a href='/status?format=json'>/status as JSON</a></p></body></html>\n"
    ).encode()


def make_app(metrics: NodeMetrics) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    prom = make_wsgi_app(metrics.registry)

    def app(environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return prom(environ, start)  # type: ignore[no-any-return]
        if path == "/health":
            h = metrics.health()
            body = {"healthy": h.healthy, "reasons": h.reasons}
            return _json(start, "200 OK" if h.healthy else "503 Service Unavailable", body)
        if path in ("/status", "/"):
            st = metrics.status()
            fmt = parse_qs(environ.get("QUERY_STRING", "")).get("format", [""])[0]
            wants_html = fmt == "html" or (not fmt and "text/html" in environ.get("HTTP_ACCEPT", ""))
            if wants_html:
                data = _status_html(st)
                start("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(data)))])
                return [data]
            return _json(start, "200 OK", st)
        pages = ["/metrics", "/health", "/status"]
        return _json(start, "404 Not Found", {"error": f"no such page {path}", "pages": pages})

    return app


class NodeHttpServer:
    """Bound when made (a taken port fails the node's start, like its other ports); served by ``start``.

    ``tls``: HTTPS with this certificate (``https_context``); ``timeout``: the bound on the
    handshake and on each read and write of a request; ``max_connections`` served at once."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics: NodeMetrics,
        *,
        tls: ssl.SSLContext | None = None,
        timeout: float = 10.0,
        max_connections: int = 32,
    ) -> None:
        self._server = _Server((host, port), tls=tls, io_timeout=timeout, max_connections=max_connections)
        self._server.set_app(make_app(metrics))
        self.port: int = self._server.server_address[1]
        self.scheme = "https" if tls is not None else "http"
        self._thread: threading.Thread | None = None

    def refused(self) -> dict[str, int]:
        """Connections refused, by reason: ``tls`` (no or a failed handshake), ``limit``."""
        return self._server.refused()

    def connection_count(self) -> int:
        """Connections being served (their handshake or request running)."""
        return self._server.connection_count()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="qjm-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
