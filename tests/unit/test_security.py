"""Certificates, TLS configs, identities and the authorizer (qjm.security), and their settings keys."""

from __future__ import annotations

import os
import ssl
import stat

import pytest
from cryptography import x509

from qjm.errors import ConfigError, PermissionDeniedError, from_code, to_code
from qjm.security import certs
from qjm.security.authz import ADMIN, READER, WRITER, Authorizer, authorizer_from
from qjm.security.certs import identity_of_pem
from qjm.security.tls import TlsConfig, tls_config
from qjm.settings import gather, node_settings
from qjm.spark.options import ReadOptions, WriteOptions
from qjm.testing.certs import Pki


def _pem(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _cert(path: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(_pem(path))


def test_node_and_client_certificates_name_their_identity(pki: Pki) -> None:
    node = _cert(pki.nodes[1].cert_file)
    san = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["jn1", "localhost"]
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    assert identity_of_pem(_pem(pki.nodes[1].cert_file)) == "jn1"
    assert identity_of_pem(_pem(pki.clients["alice"].cert_file)) == "alice"
    assert stat.S_IMODE(os.stat(pki.clients["alice"].key_file).st_mode) == 0o600


def test_ssl_contexts_verify_both_ends_at_tls13(pki: Pki) -> None:
    server = pki.nodes[0].server_ssl_context()
    client = pki.clients["alice"].client_ssl_context()
    assert server.verify_mode == ssl.CERT_REQUIRED and server.minimum_version == ssl.TLSVersion.TLSv1_3
    assert client.check_hostname and client.minimum_version == ssl.TLSVersion.TLSv1_3


def test_unusable_tls_files_are_refused_naming_them(pki: Pki, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "not.pem"
    bad.write_text("hello")
    with pytest.raises(ConfigError, match=r"not\.pem"):
        TlsConfig(str(bad), pki.nodes[0].cert_file, pki.nodes[0].key_file).server_ssl_context()
    with pytest.raises(ConfigError, match="missing"):
        TlsConfig(str(tmp_path / "missing"), pki.nodes[0].cert_file, pki.nodes[0].key_file).server_ssl_context()
    mismatched = TlsConfig(pki.ca_file, pki.nodes[0].cert_file, pki.nodes[1].key_file)
    with pytest.raises(ConfigError, match="not a usable pair"):
        mismatched.check()
    with pytest.raises(ConfigError, match="missing: key"):
        tls_config("ca", "cert", None)
    assert tls_config(None, None, None) is None


def test_a_ca_is_never_overwritten_by_accident(pki: Pki) -> None:
    with pytest.raises(ConfigError, match="already holds a CA"):
        certs.init_ca(pki.directory)
    with pytest.raises(ConfigError, match="not an IP"):
        certs.node_cert(pki.directory, "jn9", ips=["jn9"])


def test_authorizer_grants_roles_per_journal_with_wildcard() -> None:
    a = authorizer_from({"alice": {"writer": ["orders"], "reader": ["*"]}, "ops": {"admin": ["*"]}}, "[authz]")
    assert a.allowed("alice", "orders", WRITER) and a.allowed("alice", "other", READER)
    assert not a.allowed("alice", "other", WRITER) and not a.allowed("alice", "orders", ADMIN)
    assert a.allowed("ops", "x", ADMIN) and a.allowed("ops", "x", READER) and not a.allowed("ops", "x", WRITER)
    assert not a.allowed("mallory", "orders", READER)
    assert a.allowed(None, "orders", ADMIN)  # no TLS, no identity: allowed as without authz
    assert Authorizer().allowed("anyone", "orders", ADMIN)  # TLS without [authz]: authentication alone
    denied: list[tuple[str, str, str]] = []
    a.on_denied.append(lambda *d: denied.append(d))
    with pytest.raises(PermissionDeniedError) as e:
        a.check("alice", "other", WRITER)
    assert e.value.role == WRITER and denied == [("alice", "other", WRITER)]
    back = from_code(to_code(e.value), "x")
    assert type(back) is PermissionDeniedError and back.role == WRITER


@pytest.mark.parametrize(
    "table, match",
    [
        ({"alice": {"owner": ["x"]}}, "unknown role"),
        ({"alice": {"writer": "orders"}}, "list of journal ids"),
        ({"alice": ["writer"]}, "table of roles"),
    ],
)
def test_bad_authz_tables_are_refused(table: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        authorizer_from(table, "[authz]")


def test_node_settings_read_tls_insecure_and_authz(pki: Pki, tmp_path) -> None:  # type: ignore[no-untyped-def]
    conf = tmp_path / "jn.toml"
    n = pki.nodes[0]
    conf.write_text(
        f'[journalnode]\ndata_dir = "{tmp_path}"\ntls_ca = "{n.ca_file}"\ntls_cert = "{n.cert_file}"\n'
        f'tls_key = "{n.key_file}"\n[authz]\n"alice" = {{ writer = ["orders"] }}\n'
    )
    st = node_settings(gather("journalnode", config_path=str(conf), env={}))
    assert st.tls == n and not st.insecure
    assert st.authz is not None and st.authz.allowed("alice", "orders", WRITER)
    st = node_settings(gather("journalnode", flags={"data_dir": str(tmp_path), "insecure": "true"}, env={}))
    assert st.tls is None and st.insecure and st.authz is None
    conf.write_text('[authz]\n"alice" = { owner = ["x"] }\n')
    with pytest.raises(ConfigError, match=r"jn.toml: \[authz\] 'alice': unknown role"):
        gather("journalnode", config_path=str(conf), env={})
    with pytest.raises(ConfigError, match="QJM_TLS_CA"):
        node_settings(gather("journalnode", env={"QJM_DATA_DIR": str(tmp_path), "QJM_TLS_CA": n.ca_file}))


def test_spark_options_take_the_tls_paths() -> None:
    opts = {"uri": "qjournal://a:1/j", "tlsCa": "/p/ca.pem", "tlsCert": "/p/app.pem", "tlsKey": "/p/app.key"}
    tls = TlsConfig("/p/ca.pem", "/p/app.pem", "/p/app.key")
    assert ReadOptions.parse(opts).config.tls == tls and WriteOptions.parse(opts).config.tls == tls
    assert ReadOptions.parse({"uri": "qjournal://a:1/j"}).config.tls is None
    with pytest.raises(ConfigError, match="missing: certificate, key"):
        WriteOptions.parse({"uri": "qjournal://a:1/j", "tlsCa": "/p/ca.pem"})


def test_peers_and_insecure_from_files_environment_and_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    conf = tmp_path / "jn.toml"
    conf.write_text(f'[journalnode]\ndata_dir = "{tmp_path}"\npeers = ["jn1:8485", "[::1]:8485"]\n')
    assert node_settings(gather("journalnode", config_path=str(conf), env={})).peers == ("jn1:8485", "[::1]:8485")
    env = {"QJM_DATA_DIR": str(tmp_path), "QJM_PEERS": "a:1, b:2", "QJM_INSECURE": "1"}
    st = node_settings(gather("journalnode", env=env))
    assert st.peers == ("a:1", "b:2") and st.insecure
    with pytest.raises(ConfigError, match="QJM_INSECURE"):
        gather("journalnode", env={"QJM_INSECURE": "maybe"})
    with pytest.raises(ConfigError, match="QJM_PEERS"):
        gather("journalnode", env={"QJM_PEERS": "a:1,b:x"})
