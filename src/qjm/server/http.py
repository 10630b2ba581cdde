"""The node's HTTP port (Hadoop's JournalNode serves one, 8480 by default): metrics, health, status.

``/metrics``  the Prometheus text format (OpenMetrics or gzip when the scraper asks), from the
              node's own registry (``qjm.server.metrics``)
``/health``   200 ``{"healthy": true}`` when the data directory takes a write and every journal on it
              loaded; otherwise 503 with the reasons, for a load balancer or an orchestrator's probe
``/status``   the node and its journals as JSON; as a small HTML page when a browser asks for HTML
              (or with ``?format=html``)

A WSGI app on ``wsgiref``'s threading server, as ``prometheus_client.start_http_server`` uses, with
the request log sent to the ``qjm.http`` logger at DEBUG instead of stderr.
"""

from __future__ import annotations

import html
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from qjm.server.metrics import NodeMetrics

log = logging.getLogger("qjm.http")

StartResponse = Callable[..., Any]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class _Server(ThreadingWSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


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
    """Bound when made (a taken port fails the node's start, like its other ports); served by ``start``."""

    def __init__(self, host: str, port: int, metrics: NodeMetrics) -> None:
        cls = _Server6 if ":" in host else _Server
        self._server = make_server(host, port, make_app(metrics), cls, handler_class=_QuietHandler)
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="qjm-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
