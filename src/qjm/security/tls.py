"""TLS material of a node or client: one ``TlsConfig`` (CA, certificate, key paths), turned into
``ssl`` contexts for plain sockets and into gRPC credentials, and the identity a verified peer
certificate names. Design §9.

Both ends verify: a server requires a client certificate signed by the CA, a client checks the
server's certificate against the CA and the name or address it dialled. ``ssl`` contexts allow TLS
1.3 only; gRPC's Python API does not expose the version bounds, so its channels negotiate 1.2 or 1.3
(both with the same certificates and verification).
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from qjm.errors import ConfigError
from qjm.security.certs import IDENTITY_URI_PREFIX


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

    def grpc_server_credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials requiring a client certificate signed by the CA."""
        self.check()
        return grpc.ssl_server_credentials(
            [(self.key_pem(), self.cert_pem())], root_certificates=self.ca_pem(), require_client_auth=True
        )

    def grpc_channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials presenting this certificate and verifying the server's."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem(), private_key=self.key_pem(), certificate_chain=self.cert_pem()
        )


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


def identity_of(cert: x509.Certificate) -> str:
    """The identity a certificate names: its first SAN URI ``qjm:<name>`` (client certificates),
    else its first SAN DNS name (node certificates), else its subject CN; "" if it names none."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    if san is not None:
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
            if uri.startswith(IDENTITY_URI_PREFIX) and len(uri) > len(IDENTITY_URI_PREFIX):
                return uri[len(IDENTITY_URI_PREFIX) :]
        dns = san.get_values_for_type(x509.DNSName)
        if dns:
            return dns[0]
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = cns[0].value if cns else ""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


@functools.lru_cache(maxsize=256)
def identity_of_pem(pem: bytes) -> str:
    """``identity_of`` a PEM certificate (cached: a connection's certificate is asked on every call)."""
    return identity_of(x509.load_pem_x509_certificate(pem))


@functools.lru_cache(maxsize=256)
def identity_of_der(der: bytes) -> str:
    """``identity_of`` a DER certificate, as ``ssl.SSLSocket.getpeercert(binary_form=True)`` gives it."""
    return identity_of(x509.load_der_x509_certificate(der))


def grpc_peer_identity(context: grpc.ServicerContext) -> str | None:
    """The verified identity of a gRPC call's client, or None on a plaintext server (no identity).
    gRPC has verified the certificate against the CA before the call reaches the servicer."""
    auth = context.auth_context()
    pems = auth.get("x509_pem_cert")
    if not pems:
        return None
    return identity_of_pem(pems[0])
