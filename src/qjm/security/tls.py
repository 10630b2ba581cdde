"""TLS material of a node or client: one ``TlsConfig`` (CA, certificate, key paths), turned into
``ssl`` contexts for plain sockets (gRPC credentials: ``qjm.protocol.rpcmeta``; the identity a
verified certificate names: ``qjm.security.certs.identity_of``). Design §9.1. Only the standard
library here, so a ``QJMConfig`` carrying a ``TlsConfig`` stays light to import.

Both ends verify: a server requires a client certificate signed by the CA, a client checks the
server's certificate against the CA and the name or address it dialled. ``ssl`` contexts allow TLS
1.3 only; gRPC's Python API does not expose the version bounds, so its channels negotiate 1.2 or 1.3
(both with the same certificates and verification).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from qjm.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Paths of the CA certificate(s) to trust, and of this end's certificate and private key (PEM)."""

    ca_file: str
    cert_file: str
    key_file: str

    def _read(self, path: str, what: str) -> bytes:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ConfigError(f"cannot read the TLS {what} {path}: {e.strerror or e}") from None
        if b"-----BEGIN " not in data:
            raise ConfigError(f"the TLS {what} {path} is not a PEM file")
        return data

    def ca_pem(self) -> bytes:
        return self._read(self.ca_file, "CA certificate")

    def cert_pem(self) -> bytes:
        return self._read(self.cert_file, "certificate")

    def key_pem(self) -> bytes:
        return self._read(self.key_file, "private key")

    def check(self) -> TlsConfig:
        """Refuse files that cannot be used, naming the file, before anything listens or dials."""
        self.server_ssl_context()
        return self

    def _context(self, purpose: int) -> ssl.SSLContext:
        ctx = ssl.SSLContext(purpose)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ca = self.ca_pem().decode("ascii", "replace")
        self.cert_pem()
        self.key_pem()
        try:
            ctx.load_verify_locations(cadata=ca)
        except ssl.SSLError as e:
            raise ConfigError(f"the TLS CA certificate {self.ca_file} is not usable: {e.reason or e}") from None
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except ssl.SSLError as e:
            raise ConfigError(
                f"the TLS certificate {self.cert_file} and key {self.key_file} are not a usable pair: {e.reason or e}"
            ) from None
        return ctx

    def server_ssl_context(self) -> ssl.SSLContext:
        """A server context: TLS 1.3, a client certificate signed by the CA required."""
        ctx = self._context(ssl.PROTOCOL_TLS_SERVER)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_ssl_context(self) -> ssl.SSLContext:
        """A client context: TLS 1.3, presenting this certificate, the server's checked against the
        CA and against the host name or IP address dialled (``server_hostname``)."""
        ctx = self._context(ssl.PROTOCOL_TLS_CLIENT)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.check_hostname = True
        return ctx


def tls_config(ca: str | None, cert: str | None, key: str | None, *, where: str = "TLS settings") -> TlsConfig | None:
    """A ``TlsConfig`` from three optional paths: none given is no TLS; some but not all is an error."""
    given = {"CA": ca, "certificate": cert, "key": key}
    if not any(given.values()):
        return None
    missing = [k for k, v in given.items() if not v]
    if missing:
        raise ConfigError(f"{where}: TLS needs a CA, a certificate and a key; missing: {', '.join(missing)}")
    assert ca and cert and key
    return TlsConfig(ca, cert, key)
