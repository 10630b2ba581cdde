"""Mutual TLS on the data plane, with real certificates on real nodes (design §9.4): a writer over
TLS on either client backend, and the bad input a TLS data port must refuse while it keeps
serving a good writer: a plaintext writer, a certificate from another CA, an expired one, one with
no writer role, a handshake that never starts or dribbles, garbage instead of a ClientHello. Each is
refused with a typed error or closed within the handshake bound, and nothing it sent is written.
"""

from __future__ import annotations

import importlib
import os
import queue
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

import qjm
from qjm.client.fanout_link import Engine, FanoutLink
from qjm.client.threaded_link import ThreadedLink
from qjm.errors import CorruptFrameError, PermissionDeniedError, TlsError
from qjm.protocol import wire
from qjm.security.authz import authorizer_from
from qjm.security.tls import TlsConfig
from qjm.server.limits import NodeLimits
from qjm.server.node import JournalNode
from qjm.testing.certs import Pki
from qjm.testing.util import eventually

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
JID = "orders"
GRANTS = {
    "alice": {"writer": [JID], "reader": ["*"]},
    "bob": {"reader": [JID]},
    "ops": {"admin": ["*"]},
    **{f"jn{i}": {"reader": ["*"]} for i in range(3)},
}
HANDSHAKE_TIMEOUT = 1.0  # the nodes' hello_timeout, which bounds the TLS handshake too
CLOSED_WITHIN = 30.0  # how long a refused connection may take to be closed on a loaded machine
WAIT = 30.0


@pytest.fixture
def nodes(tmp_path: Path, pki: Pki) -> Iterator[list[JournalNode]]:
    authz = authorizer_from(GRANTS, "test")
    limits = NodeLimits(hello_timeout=HANDSHAKE_TIMEOUT)
    started = [
        JournalNode(str(tmp_path / f"jn{i}"), tls=pki.nodes[i], authz=authz, limits=limits).start() for i in range(3)
    ]
    yield started
    for n in started:
        n.stop(0)


def uri_of(nodes: list[JournalNode]) -> str:
    return "qjournal://" + ";".join(f"127.0.0.1:{n.rpc_port}" for n in nodes) + f"/{JID}"


def format_journal(uri: str, admin: TlsConfig) -> None:
    with qjm.QuorumJournalManager(uri, config=qjm.QJMConfig(tls=admin)) as m:
        m.format()


def read_all(uri: str, tls: TlsConfig) -> list[bytes]:
    r = qjm.open_reader(uri, tls=tls)
    try:
        return [rec for _, rec in r]
    finally:
        r.qjm.close()


class GoodWriter:
    """Appends and syncs numbered records in a thread until stopped: the node must keep serving it."""

    def __init__(self, uri: str, tls: TlsConfig) -> None:
        self.writer = qjm.open_writer(uri, tls=tls)
        self.records: list[bytes] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                rec = b"good-%d" % len(self.records)
                self.writer.append(rec)
                self.writer.sync()
                self.records.append(rec)
        except BaseException as e:
            self.error = e

    def finish(self) -> list[bytes]:
        self.stop.set()
        self.thread.join(WAIT)
        assert self.error is None, f"the good writer failed: {self.error!r}"
        self.writer.close()
        return self.records


def link_outcome(address: str, tls: TlsConfig | None, *, threaded: bool = False) -> BaseException:
    """Open a data link to ``address`` for the journal and send a frame-shaped batch; what ended it:
    a refusal raised while connecting, or the failure reported by the link."""
    failed: queue.Queue[BaseException] = queue.Queue()
    batch = b"QJMF" + b"\x00" * 60  # never read: every refusal comes before the first frame
    try:
        if threaded:
            tl = ThreadedLink("jn0", address, JID, 10.0, lambda _link, e: failed.put(e), tls=tls)
            tl.send(batch, 1, Future(), None)
            return failed.get(timeout=WAIT)
        engine = Engine()
        try:
            link = FanoutLink("jn0", address, JID, 10.0, lambda _link, e: failed.put(e), engine=engine, tls=tls)
            link.send_untracked(batch, 1, None)
            return failed.get(timeout=WAIT)
        finally:
            engine.close()
    except (TlsError, OSError) as e:
        return e


def closed_by_node(address: tuple[str, int], dribble: bytes = b"", every: float = 0.2) -> float:
    """Connect, send ``dribble`` a byte at a time (nothing if empty), and return how long the node
    took to close the connection (what it answered is read and dropped)."""
    pace = threading.Event()
    with socket.create_connection(address, timeout=CLOSED_WITHIN) as s:
        t0 = time.monotonic()
        for b in dribble:
            try:
                s.sendall(bytes([b]))
            except OSError:
                break  # closed already
            pace.wait(every)  # the attacker's pace, not a synchronisation
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
        return time.monotonic() - t0


@pytest.mark.parametrize("threaded", [False, True], ids=["fanout", "threaded"])
def test_bad_data_plane_clients_are_refused_while_a_good_writer_writes(
    nodes: list[JournalNode], pki: Pki, threaded: bool
) -> None:
    uri = uri_of(nodes)
    format_journal(uri, pki.clients["ops"])
    good = GoodWriter(uri, pki.clients["alice"])
    node = nodes[0]
    address = f"127.0.0.1:{node.data_port}"
    hostport = ("127.0.0.1", node.data_port)
    refused_before = node.data_server.tls_refusals

    plaintext = link_outcome(address, None, threaded=threaded)
    assert isinstance(plaintext, TlsError), repr(plaintext)  # the node's plaintext "requires TLS" reply
    for bad in (pki.foreign, pki.expired):
        assert isinstance(link_outcome(address, bad, threaded=threaded), TlsError)
    assert isinstance(link_outcome(address, pki.clients["bob"], threaded=threaded), PermissionDeniedError)

    silent = closed_by_node(hostport)  # connects and never sends a ClientHello
    dribbling = closed_by_node(hostport, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40)
    assert silent < CLOSED_WITHIN and dribbling < CLOSED_WITHIN
    with socket.create_connection(hostport, timeout=WAIT) as s:  # garbage instead of a ClientHello
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
        reply = bytearray()
        while chunk := s.recv(4096):
            reply += chunk
        msg, _ = wire.parse_reply(reply)
        assert isinstance(msg, wire.NodeError) and msg.code == TlsError.code
    closed_by_node(hostport, b"\x16" + os.urandom(300), every=0)  # garbage that starts like a handshake

    assert node.data_server.tls_refusals - refused_before >= 7
    scraped = node.metrics.registry.get_sample_value("qjm_node_data_connections_refused_total", {"reason": "tls"})
    assert scraped == node.data_server.tls_refusals  # operators see the refusals on /metrics
    written = good.finish()
    assert written, "the good writer committed nothing while the bad clients were refused"
    assert read_all(uri, pki.clients["bob"]) == written  # nothing else reached any journal
    eventually(lambda: node.data_server.connection_count() == 0, what="every refused connection closed")


@pytest.mark.parametrize("backend", ["py"] if NO_EXTENSIONS else ["py", "native"])
def test_a_refusal_from_a_tls_node_reaches_either_engine_typed(
    nodes: list[JournalNode], pki: Pki, backend: str
) -> None:
    """Parity: a link of either engine passes the handshake and the writer-role check, and the
    node's ERROR for a bad frame comes back through the session as the same typed error."""
    module = importlib.import_module("qjm._native.fanout_c" if backend == "native" else "qjm._native.fanout_py")
    uri = uri_of(nodes)
    alice = pki.clients["alice"]
    format_journal(uri, pki.clients["ops"])
    w = qjm.open_writer(uri, tls=alice)
    w.append(b"before")
    w.close()
    engine = Engine(module)
    try:
        failed: queue.Queue[BaseException] = queue.Queue()
        link = FanoutLink(
            "jn1", f"127.0.0.1:{nodes[1].data_port}", JID, 10.0, lambda _l, e: failed.put(e), engine=engine, tls=alice
        )
        link.send_untracked(b"QJMF" + b"\x00" * 60, 1, None)
        assert isinstance(failed.get(timeout=WAIT), CorruptFrameError)
    finally:
        engine.close()
    assert read_all(uri, alice) == [b"before"]
