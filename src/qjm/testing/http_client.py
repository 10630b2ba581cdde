"""A client of a node's HTTP port (``/metrics``, ``/health``, ``/status``) for tests: plain HTTP, or
HTTPS when the node has TLS (design §9.5), checking the node's certificate against the CA and
presenting a certificate when given one (``http_client_auth = required`` asks for it)."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from qjm.security.tls import TlsConfig


@dataclass(frozen=True, slots=True)
class HttpsClient:
    """The CA a node's HTTPS certificate must chain to, and the certificate and key this client
    presents (None: none, which a node with ``http_client_auth = required`` refuses)."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def of(cls, tls: TlsConfig, *, present_certificate: bool = True) -> HttpsClient:
        if present_certificate:
            return cls(tls.ca_file, tls.cert_file, tls.key_file)
        return cls(tls.ca_file)

    def context(self) -> ssl.SSLContext:
        """A client context as a scraper's: the node's certificate checked against the CA and the host dialled."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        if self.cert_file is not None:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def prometheus_tls_config(self) -> dict[str, str]:
        """Prometheus' ``tls_config`` of a scrape job for this client."""
        out = {"ca_file": self.ca_file}
        if self.cert_file is not None:
            out["cert_file"] = self.cert_file
        if self.key_file is not None:
            out["key_file"] = self.key_file
        return out


def node_url(address: str, path: str = "/", https: HttpsClient | None = None) -> str:
    return f"{'https' if https is not None else 'http'}://{address}{path}"


def http_get(
    address: str,
    path: str = "/",
    *,
    https: HttpsClient | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes, str]:
    """(status, body, content type) of a GET on ``address`` (``HOST:PORT``), error statuses included;
    a connection or TLS failure raises its own ``OSError`` (``ssl.SSLError``, ``ConnectionResetError``)."""
    req = urllib.request.Request(node_url(address, path, https), headers=dict(headers or {}))
    ctx = https.context() if https is not None else None
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")
    except urllib.error.URLError as e:
        if isinstance(e.reason, OSError):
            raise e.reason from None
        raise
