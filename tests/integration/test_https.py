"""HTTPS on the node's HTTP port, with real certificates on real nodes (design §9.5): scrapes with
the CA, and what the port must refuse while it keeps serving: plain HTTP, a certificate of another
CA or an expired one, no certificate when one is required, handshakes that stall, connections past
max_http_connections; and a real Prometheus scraping nodes over HTTPS."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from qjm.errors import ConfigError
from qjm.server.limits import NodeLimits
from qjm.server.node import JournalNode
from qjm.testing import prometheus
from qjm.testing.certs import Pki
from qjm.testing.http_client import HttpsClient, http_get
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.prometheus import PrometheusServer, scrape
from qjm.testing.util import client_hello, closed_by_peer, eventually

CLOSED_WITHIN = 30.0  # how long a refused connection may take to be closed on a loaded machine
STALL_BOUND = 3.0  # a node's hello_timeout where a test waits for it: above a loaded machine's real handshake
LONG_HANDSHAKE = 120.0  # a bound no test waits for: a connection held this long is still held
REFUSED_TLS = 'qjm_node_http_connections_refused_total{reason="tls"}'
REFUSED_LIMIT = 'qjm_node_http_connections_refused_total{reason="limit"}'

NodeFactory = Callable[..., JournalNode]


@pytest.fixture
def tls_node(tmp_path: Path, pki: Pki) -> Iterator[NodeFactory]:
    """Makes started nodes with the PKI's node certificate and an HTTP port; stops them after."""
    started: list[JournalNode] = []

    def make(
        hello_timeout: float = 10.0, max_http_connections: int = 32, http_client_auth: str = "optional"
    ) -> JournalNode:
        limits = NodeLimits(hello_timeout=hello_timeout, max_http_connections=max_http_connections)
        node = JournalNode(
            str(tmp_path / f"jn{len(started)}"), tls=pki.nodes[0], http_port=0, limits=limits,
            http_client_auth=http_client_auth,
        ).start()  # fmt: skip
        started.append(node)
        return node

    yield make
    for n in started:
        n.stop(0)


def address(node: JournalNode) -> str:
    assert node.http_address is not None
    return node.http_address


def refused(node: JournalNode, reason: str) -> float:
    return node.metrics.registry.get_sample_value("qjm_node_http_connections_refused_total", {"reason": reason}) or 0


def refused_by_tls(node: JournalNode, https: HttpsClient) -> Exception:
    """The error of a GET that the node refuses in the handshake."""
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)) as e:
        http_get(address(node), "/health", https=https)
    return e.value


def still_open(s: socket.socket) -> bool:
    """True if the node has neither closed ``s`` nor sent anything on it."""
    s.setblocking(False)
    try:
        s.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    finally:
        s.settimeout(CLOSED_WITHIN)
    return False


def test_https_scrape_with_the_ca_and_refusals_that_leave_the_node_serving(tls_node: NodeFactory, pki: Pki) -> None:
    node = tls_node()
    ca_only = HttpsClient(pki.ca_file)
    status, body, ctype = http_get(address(node), "/health", https=ca_only)
    assert (status, ctype) == (200, "application/json") and b'"healthy": true' in body
    m = scrape(address(node), https=ca_only)
    assert m[REFUSED_TLS] == 0 and m[REFUSED_LIMIT] == 0
    assert any(k.startswith("qjm_node_info{") and f'http_address="{address(node)}"' in k for k in m), m
    # a client certificate of the CA is taken too (optional: checked when presented)
    assert http_get(address(node), "/status", https=HttpsClient.of(pki.clients["alice"]))[0] == 200

    code, body, _ = http_get(address(node), "/health")  # plain HTTP: told what the port wants
    assert code == 400 and b"HTTPS" in body
    assert refused(node, "tls") == 1
    for bad in (pki.foreign, pki.expired):  # presented, so checked: another CA's, an expired one
        err = refused_by_tls(node, HttpsClient.of(bad))
        assert "unknown ca" in str(err).lower() or "expired" in str(err).lower() or isinstance(err, ConnectionError)
    eventually(lambda: refused(node, "tls") == 3, CLOSED_WITHIN, "the bad certificates counted")
    # the node's own certificate is checked by the client: a client trusting another CA refuses it
    other_ca = HttpsClient(str(Path(pki.directory) / "other-ca" / "ca.pem"))
    with pytest.raises(ssl.SSLCertVerificationError):
        http_get(address(node), "/health", https=other_ca)
    m = scrape(address(node), https=ca_only)  # still served, and the refusals are on /metrics
    assert m[REFUSED_TLS] >= 3 and m[REFUSED_LIMIT] == 0


def test_required_client_auth_refuses_a_client_without_a_certificate(tls_node: NodeFactory, pki: Pki) -> None:
    node = tls_node(http_client_auth="required")
    err = refused_by_tls(node, HttpsClient(pki.ca_file))
    assert "certificate required" in str(err).lower() or isinstance(err, ConnectionError), err
    refused_by_tls(node, HttpsClient.of(pki.foreign))
    eventually(lambda: refused(node, "tls") == 2, CLOSED_WITHIN, "both refusals counted")
    for who in (pki.clients["ops"], pki.nodes[1]):  # a client's certificate or another node's
        status, body, _ = http_get(address(node), "/health", https=HttpsClient.of(who))
        assert status == 200 and b'"healthy": true' in body
    code, body, _ = http_get(address(node), "/metrics")  # plain HTTP gets the same answer as with optional
    assert code == 400 and b"HTTPS" in body


def test_client_auth_is_checked_and_needs_tls(tmp_path: Path, pki: Pki) -> None:
    for tls in (pki.nodes[0], None):
        with pytest.raises(ConfigError, match="http_client_auth must be one of optional, required"):
            JournalNode(str(tmp_path / "a"), tls=tls, http_port=0, http_client_auth="sometimes")
    with pytest.raises(ConfigError, match="needs TLS"):
        JournalNode(str(tmp_path / "b"), http_port=0, http_client_auth="required")
    plain = JournalNode(str(tmp_path / "c"), http_port=0).start()  # without TLS the port stays plaintext
    try:
        assert http_get(plain.http_address or "", "/health")[0] == 200
        assert plain.http is not None and plain.http.scheme == "http"
    finally:
        plain.stop(0)


def test_stalled_handshakes_do_not_stop_other_scrapes(tls_node: NodeFactory, pki: Pki) -> None:
    """Connections that send nothing, half a ClientHello or garbage starting like a handshake are
    held by their own threads: scrapes are served meanwhile (a handshake run by the accepting
    thread would make them wait for the handshake bound, far past their own timeout)."""
    node = tls_node(hello_timeout=LONG_HANDSHAKE)
    hello = client_hello(pki.clients["alice"])
    host, port = "127.0.0.1", node.http.port if node.http else 0
    attackers = []
    for payload in (b"", hello[: len(hello) // 2], b"\x16\x03\x01\x02\x00"):
        s = socket.create_connection((host, port), timeout=CLOSED_WITHIN)
        if payload:
            s.sendall(payload)
        attackers.append(s)
    try:
        ca_only = HttpsClient(pki.ca_file)
        for _ in range(3):
            status, _, _ = http_get(address(node), "/metrics", https=ca_only)
            assert status == 200
        assert all(still_open(s) for s in attackers)  # they were being held while the scrapes were served
    finally:
        for s in attackers:
            s.close()


def test_a_stalled_handshake_is_closed_within_the_bound_and_counted(tls_node: NodeFactory, pki: Pki) -> None:
    node = tls_node(hello_timeout=STALL_BOUND)
    port = node.http.port if node.http else 0
    hello = client_hello(pki.clients["alice"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN) as silent,
        socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN) as half,
    ):
        half.sendall(hello[: len(hello) // 2])
        assert closed_by_peer(silent, CLOSED_WITHIN) and closed_by_peer(half, CLOSED_WITHIN)
    eventually(lambda: refused(node, "tls") == 2, CLOSED_WITHIN, "both stalled handshakes counted")
    with socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN):
        pass  # connects and hangs up (a TCP probe): not a refusal
    assert http_get(address(node), "/health", https=HttpsClient(pki.ca_file))[0] == 200
    assert refused(node, "tls") == 2


def test_connections_past_max_http_connections_are_closed_at_once(tls_node: NodeFactory, pki: Pki) -> None:
    node = tls_node(hello_timeout=LONG_HANDSHAKE, max_http_connections=2)
    port = node.http.port if node.http else 0
    holders = [socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN) for _ in range(2)]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN) as third:
            # accepted after both holders: closed at once, long before any handshake bound
            assert closed_by_peer(third, CLOSED_WITHIN)
        assert refused(node, "limit") == 1 and all(still_open(s) for s in holders)
    finally:
        for s in holders:
            s.close()
    ca_only = HttpsClient(pki.ca_file)

    def served() -> bool:
        try:
            return http_get(address(node), "/health", https=ca_only)[0] == 200
        except OSError:
            return False  # a holder's thread has not seen its close yet: this one was refused

    eventually(served, CLOSED_WITHIN, "a scrape served once the holders left")
    assert refused(node, "tls") == 0  # the holders hung up before any byte: TCP probes


@pytest.mark.skipif(not prometheus.available(), reason="Debian's prometheus: scripts/install-system-deps.sh")
def test_prometheus_scrapes_nodes_over_https(tls_node: NodeFactory, pki: Pki, tmp_path: Path) -> None:
    """Debian's Prometheus scraping a node process that requires client certificates (with one and
    without) and an in-process node that takes a scraper without one."""
    optional = tls_node()
    with MiniJournalCluster(1, str(tmp_path / "cluster"), pki=pki, http_client_auth="required") as c:
        assert c.http_get(0, "/health")[0] == 200  # the cluster's client presents a certificate
        required = c.http_address(0)
        jobs = {"with-cert": [required], "without-cert": [required], "optional": [address(optional)]}
        https = {
            "with-cert": HttpsClient.of(pki.clients["ops"]),
            "without-cert": HttpsClient(pki.ca_file),
            "optional": HttpsClient(pki.ca_file),
        }
        with PrometheusServer(jobs, https=https) as prom:
            for job, want in (("with-cert", 1), ("optional", 1), ("without-cert", 0)):
                up = f'up{{job="{job}"}}'
                eventually(lambda up=up, want=want: prom.value(up) == want, 60, f"{up} = {want}")
            refusals = 'qjm_node_http_connections_refused_total{job="with-cert",reason="tls"}'
            eventually(lambda: (prom.value(refusals) or 0) > 0, 60, "the certificate-less scrapes counted")
            assert prom.value('qjm_node_journals{job="optional"}') is not None


def test_the_plaintext_port_has_the_same_bounds(tmp_path: Path) -> None:
    """Without TLS: a request that stalls is closed within hello_timeout while others are served,
    and a connection past max_http_connections is answered 503 at once."""
    limits = NodeLimits(hello_timeout=STALL_BOUND, max_http_connections=2)
    node = JournalNode(str(tmp_path / "jn"), http_port=0, limits=limits).start()
    try:
        port = node.http.port if node.http else 0
        with socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN) as slow:
            slow.sendall(b"GET /metr")  # and nothing more
            assert http_get(address(node), "/health")[0] == 200  # served meanwhile
            assert node.http is not None
            http = node.http
            eventually(lambda: http.connection_count() == 1, CLOSED_WITHIN, "the scrape's connection let go")
            with socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN) as holder:
                eventually(lambda: http.connection_count() == 2, CLOSED_WITHIN, "the holder's connection taken")
                assert still_open(holder)
                with socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN) as third:
                    assert third.recv(4096).startswith(b"HTTP/1.0 503 ")
                assert refused(node, "limit") == 1
            assert closed_by_peer(slow, CLOSED_WITHIN)  # the stalled request, after hello_timeout
        assert refused(node, "tls") == 0
    finally:
        node.stop(0)
