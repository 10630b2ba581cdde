"""Certificates for tests: a CA with node and client certificates in one directory, plus the bad
ones a node must refuse (expired, signed by another CA). Real X.509, made with ``qjm.security.certs``."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

from qjm.security.certs import CertFiles, client_cert, init_ca, node_cert
from qjm.security.tls import TlsConfig

LOOPBACK_IPS = ["127.0.0.1", "::1"]


def _tls(files: CertFiles) -> TlsConfig:
    return TlsConfig(files.ca_file, files.cert_file, files.key_file)


@dataclass(frozen=True, slots=True)
class Pki:
    """``nodes[i]`` is node ``jn<i>`` (SAN localhost, 127.0.0.1, ::1; identity ``jn<i>``); ``clients``
    maps a client identity to its TLS config. ``expired`` (identity ``expired``) expired a day ago;
    ``foreign`` (identity ``alice``, like a granted client) is signed by another CA."""

    directory: str
    nodes: tuple[TlsConfig, ...]
    clients: dict[str, TlsConfig]
    expired: TlsConfig
    foreign: TlsConfig

    @property
    def ca_file(self) -> str:
        return self.nodes[0].ca_file


def make_pki(directory: str, *, nodes: int = 3, clients: tuple[str, ...] = ("alice", "bob", "ops")) -> Pki:
    """A CA in ``directory`` and the certificates of ``Pki``."""
    init_ca(directory)
    node_tls = tuple(_tls(node_cert(directory, f"jn{i}", dns=["localhost"], ips=LOOPBACK_IPS)) for i in range(nodes))
    client_tls = {name: _tls(client_cert(directory, name)) for name in clients}
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=3)
    expired = _tls(client_cert(directory, "expired", days=2, not_before=long_ago))
    other = os.path.join(directory, "other-ca")
    init_ca(other, name="another CA")
    foreign_files = client_cert(other, "alice")
    foreign = TlsConfig(os.path.join(directory, "ca.pem"), foreign_files.cert_file, foreign_files.key_file)
    return Pki(directory, node_tls, client_tls, expired, foreign)
