"""Certificates for a test or small deployment: a CA, node certificates and client certificates.

Everything is written as PEM files in one directory: ``ca.pem``/``ca.key`` for the CA, and
``<name>.pem``/``<name>.key`` for each node or client. A node certificate names its DNS names and
IP addresses in its SAN and serves both as server and as client (a node downloads from its peers
with it); a client certificate carries its identity as a SAN URI ``qjm:<name>`` and as its CN.
Keys are ECDSA P-256, written unencrypted with mode 0600. Design §9.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from qjm.errors import ConfigError

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
IDENTITY_URI_PREFIX = "qjm:"
"""A client identity in a SAN URI: ``qjm:alice`` is the identity ``alice``."""
DEFAULT_DAYS = 365


@dataclass(frozen=True, slots=True)
class CertFiles:
    """The three paths a node or client is configured with."""

    ca_file: str
    cert_file: str
    key_file: str


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_pair(directory: str, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> CertFiles:
    cert_path = os.path.join(directory, f"{name}.pem")
    key_path = os.path.join(directory, f"{name}.key")
    _write(
        key_path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        0o600,
    )
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return CertFiles(os.path.join(directory, CA_CERT), cert_path, key_path)


def _check_name(name: str) -> str:
    if not name or name == "ca" or "/" in name or name.startswith(".") or not name.isprintable():
        raise ConfigError(f"certificate name {name!r} is not usable as a file name (and 'ca' is the CA's)")
    return name


_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
    key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
)  # fmt: skip


def init_ca(directory: str, *, name: str = "qjm CA", days: int = 3650, overwrite: bool = False) -> str:
    """Create a CA in ``directory`` (``ca.pem``, ``ca.key``); returns the CA certificate's path.
    An existing CA is kept unless ``overwrite``: replacing it would orphan every certificate it signed."""
    os.makedirs(directory, exist_ok=True)
    cert_path = os.path.join(directory, CA_CERT)
    if os.path.exists(cert_path) and not overwrite:
        raise ConfigError(f"{directory} already holds a CA ({CA_CERT}); certificates it signed would stop working")
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_pair(directory, "ca", cert, key)
    return cert_path


def _load_ca(directory: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        with open(os.path.join(directory, CA_CERT), "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        with open(os.path.join(directory, CA_KEY), "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    except FileNotFoundError:
        raise ConfigError(f"{directory} holds no CA: run `qjm certs init {directory}` first") from None
    except ValueError as e:
        raise ConfigError(f"{directory}: the CA files are not readable PEM: {e}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{directory}: the CA key is not an ECDSA key")
    return cert, key


def _issue(
    directory: str,
    name: str,
    sans: list[x509.GeneralName],
    usages: list[x509.ObjectIdentifier],
    *,
    days: int,
    not_before: datetime.datetime | None,
) -> CertFiles:
    ca_cert, ca_key = _load_ca(directory)
    key = _new_key()
    start = not_before if not_before is not None else _now() - datetime.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _write_pair(directory, name, cert, key)


def node_cert(
    directory: str,
    name: str,
    *,
    dns: list[str] | None = None,
    ips: list[str] | None = None,
    days: int = DEFAULT_DAYS,
    not_before: datetime.datetime | None = None,
) -> CertFiles:
    """A node's certificate signed by the CA in ``directory``: SAN DNS ``name`` (and ``dns``) and
    the ``ips``; usable as server and as client (node-to-node downloads). Its identity is ``name``."""
    _check_name(name)
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dict.fromkeys([name, *(dns or [])])]
    for ip in ips or []:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(ip.strip("[]"))))
        except ValueError:
            raise ConfigError(f"{ip!r} is not an IP address") from None
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    return _issue(directory, name, sans, usages, days=days, not_before=not_before)


def client_cert(
    directory: str,
    name: str,
    *,
    days: int = DEFAULT_DAYS,
    not_before: datetime.datetime | None = None,
) -> CertFiles:
    """A client's certificate signed by the CA in ``directory``; its identity ``name`` is in the
    SAN as the URI ``qjm:<name>`` and in the CN."""
    _check_name(name)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(IDENTITY_URI_PREFIX + name)]
    return _issue(directory, name, sans, [ExtendedKeyUsageOID.CLIENT_AUTH], days=days, not_before=not_before)


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
