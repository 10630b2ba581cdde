"""Data-plane TLS on both backends: the engine's links (libssl in fanout_c, ssl.SSLObject in
fanout_py) against a node-side Receiver reading through an ssl.SSLSocket, every engine with every
receiver, with real certificates (qjm.testing.certs). Synchronisation is by queues and events with
a bounded wait, never by sleeping.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import queue
import socket
import ssl
import sys
import termios
import threading
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from qjm._native import framing
from qjm.errors import ConfigError, TlsError
from qjm.protocol import wire
from qjm.protocol.frame import FRAME_HEADER_SIZE
from qjm.security.certs import identity_of_der
from qjm.security.tls import TlsConfig
from qjm.testing.certs import Pki

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
BACKENDS = ["py"] if NO_EXTENSIONS else ["py", "native"]
WAIT = 10.0


def module(name: str) -> ModuleType:
    return importlib.import_module("qjm._native.fanout_c" if name == "native" else "qjm._native.fanout_py")


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest) -> ModuleType:
    return module(request.param)


@pytest.fixture(params=BACKENDS)
def receiver(request: pytest.FixtureRequest) -> ModuleType:
    return module(request.param)


def frame(first: int, size: int = 10) -> bytes:
    return framing.encode_frame([bytes([first % 256]) * size], epoch=1, segment_txid=1, first_txid=first)


class Node:
    """One TLS data-plane connection served as the node serves it: a Receiver (of the module given)
    runs the handshake, then reads and acks each run through its session, with and without waiting
    by turns. Without a module, a
    peer that only runs the handshake (with Python's ssl)."""

    def __init__(
        self, tls: TlsConfig, rx_module: ModuleType | None, *, answer: bool = True, hold: threading.Event | None = None
    ) -> None:
        """``hold``: after the hello, read nothing more until it is set."""
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # room for a test's burst
        self.port = self.listener.getsockname()[1]
        self.tls = tls
        self.context = tls.server_ssl_context()
        self.rx_module = rx_module
        self.answer = answer
        self.hold = hold
        self.frames: list[bytes] = []
        self.runs: list[int] = []  # the frames of each run
        self.commits: list[tuple[int, int]] = []
        self.outcome: queue.Queue[object] = queue.Queue()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        try:
            if not self.answer:  # a peer that never answers the ClientHello
                self.release.wait(WAIT)
                return
            if self.rx_module is None:
                with self.context.wrap_socket(conn, server_side=True) as s:
                    s.recv(1)
                return
            rx = self.rx_module.Receiver(conn)
            rx.handshake(self.rx_module.TlsServer(self.tls.ca_file, self.tls.cert_file, self.tls.key_file), WAIT)
            self.outcome.put(identity_of_der(rx.peer_certificate()))
            self.outcome.put(rx.hello())
            if self.hold is not None:
                self.hold.wait(WAIT)
            waits = False
            while (run := rx.next_run()) is not None:
                frames, commits = run
                self.frames += frames
                self.runs.append(len(frames))
                self.commits += commits
                if frames:
                    # As the JournalNode acks (without waiting, then the rest), and the waiting way,
                    # by turns: the acks arrive in order either way.
                    waits = not waits
                    rx.ack(framing.decode_header(frames[-1][:FRAME_HEADER_SIZE]).last_txid, waits)
                    rx.flush()
            self.outcome.put("eof")
            rx.close()
        except (OSError, ssl.SSLError) as e:
            self.outcome.put(e)
        finally:
            conn.close()

    def close(self) -> None:
        self.release.set()
        self.listener.close()
        self.thread.join(WAIT)


@pytest.fixture
def loop(engine: ModuleType) -> Iterator[tuple[Any, queue.Queue[tuple[int, int, str, object]]]]:
    f = engine.Fanout()
    events: queue.Queue[tuple[int, int, str, object]] = queue.Queue()
    t = threading.Thread(target=f.run, args=(lambda *a: events.put(a),), daemon=True)
    t.start()
    yield f, events
    f.stop()
    t.join(WAIT)
    f.close()


def until_acked(events: queue.Queue[tuple[int, int, str, object]], link: int, txid: int) -> None:
    while True:
        ev = events.get(timeout=WAIT)
        assert ev[0] != link or not ev[2], f"the link failed: {ev}"
        if ev[0] == link and ev[1] >= txid:
            return


def hello_over_tls(f: Any, engine: ModuleType, node: Node, pki: Pki) -> tuple[socket.socket, int]:
    """A TLS link of ``engine`` to ``node``, as alice, that has sent its hello; the node has read
    alice's identity from her verified certificate, and the journal id."""
    sock = socket.create_connection(("127.0.0.1", node.port), timeout=WAIT)
    alice = pki.clients["alice"]
    tls = engine.TlsClient(alice.ca_file, alice.cert_file, alice.key_file)
    link = f.add_link(sock, tls=tls, server_name="127.0.0.1", timeout=WAIT)
    assert f.send(link, wire.encode_hello("j1")) == 0
    assert node.outcome.get(timeout=WAIT) == "alice"
    assert node.outcome.get(timeout=WAIT) == "j1"
    return sock, link


def hang_up(f: Any, link: int, sock: socket.socket, node: Node) -> None:
    """End a test's link (removed from the engine, then its socket closed); the node reads its end."""
    f.remove(link)
    sock.close()
    assert node.outcome.get(timeout=WAIT) == "eof"
    node.close()


def test_a_tls_link_delivers_every_frame_in_order_and_carries_the_acks(
    pki: Pki, engine: ModuleType, receiver: ModuleType, loop: tuple[Any, Any]
) -> None:
    """Small frames, commit notices and frames far larger than a TLS record and than the socket
    buffers (partial writes, EPOLLOUT) arrive byte for byte, whichever engine sends them to
    whichever receiver; the node's acks come back through the session."""
    f, events = loop
    node = Node(pki.nodes[0], receiver)
    sock, link = hello_over_tls(f, engine, node, pki)
    sent = []
    for t in range(1, 201):
        fr = frame(t, size=3 << 20 if t in (50, 51) else 10 + t)
        commit = wire.encode_commit(1, t - 1) if t % 7 == 0 else None
        assert f.send(link, fr, t, commit) == 0
        sent.append(fr)
    until_acked(events, link, 200)
    assert node.frames == sent
    assert node.commits == [(1, t - 1) for t in range(1, 201) if t % 7 == 0]
    assert f.inflight(link) == (0, 0)
    hang_up(f, link, sock, node)


def test_a_sync_batch_commit_notice_reaches_the_node_through_the_session_before_the_next_batch(
    pki: Pki, engine: ModuleType, receiver: ModuleType, loop: tuple[Any, Any]
) -> None:
    """The native engine keeps the notice of a parked link for its next send, and encrypts it then."""
    f, events = loop
    node = Node(pki.nodes[0], receiver)
    sock, link = hello_over_tls(f, engine, node, pki)
    assert f.sync_batch([link], frame(1), 1, 1, wire.encode_commit(1, 1), WAIT) == 1
    assert f.send(link, frame(2), 2) == 0
    # The kept notice gathered with a prefix and the head of a frame past a record, then the rest.
    assert f.sync_batch([link], frame(3, size=40000), 3, 1, wire.encode_commit(1, 3), WAIT) == 1
    assert f.send(link, frame(4, size=40000), 4, wire.encode_commit(2, 3)) == 0
    assert f.sync_batch([link], frame(5), 5, 1, wire.encode_commit(2, 5), WAIT) == 1
    assert f.send(link, frame(6), 6, wire.encode_commit(3, 5)) == 0
    until_acked(events, link, 6)
    assert node.frames == [frame(1), frame(2), frame(3, size=40000), frame(4, size=40000), frame(5), frame(6)]
    assert node.commits == [(1, 1), (1, 3), (2, 3), (2, 5), (3, 5)]
    hang_up(f, link, sock, node)


def test_a_burst_behind_a_full_socket_arrives_in_order_and_lets_go_of_every_batch(
    pki: Pki, engine: ModuleType, receiver: ModuleType, loop: tuple[Any, Any]
) -> None:
    """A writer that pipelines faster than the socket drains: the ciphertext of the batches sent
    meanwhile waits in the link's buffer, commit notices between them; every byte arrives in
    order, and the link holds no batch once the node has acknowledged it (the references come
    back, nothing leaks)."""
    f, events = loop
    node = Node(pki.nodes[0], receiver)
    sock, link = hello_over_tls(f, engine, node, pki)
    sent = [frame(t, size=(1 << 20) + t) for t in range(1, 41)]  # 40 MiB: far past the socket buffers
    base = [sys.getrefcount(fr) for fr in sent]
    for t in range(1, 41):
        assert f.send(link, sent[t - 1], t, wire.encode_commit(1, t - 1) if t % 3 == 0 else None) == 0
    until_acked(events, link, 40)
    assert node.frames == sent
    assert node.commits == [(1, t - 1) for t in range(1, 41) if t % 3 == 0]
    assert f.inflight(link) == (0, 0)
    # A batch is let go once encrypted, which is before its ack is reported.
    assert [sys.getrefcount(fr) for fr in sent] == base
    hang_up(f, link, sock, node)


def client_session(sock: socket.socket, client: TlsConfig) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    """A writer's TLS session over ``sock`` with Python's ssl, its handshake done."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client.client_ssl_context().wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    while True:
        try:
            tls.do_handshake()
            return tls, incoming, outgoing
        except ssl.SSLWantReadError:
            sock.sendall(outgoing.read())
            data = sock.recv(65536)
            assert data, "the node hung up during the handshake"
            incoming.write(data)


def await_ack(sock: socket.socket, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, txid: int) -> None:
    """Read the node's acks through ``tls`` until the one for ``txid`` (one cumulative ack a run)."""
    ack = wire.encode_ack(txid)
    got = b""
    while not got.endswith(ack):
        data = sock.recv(65536)
        assert data, "the node hung up"
        incoming.write(data)
        while True:  # every record that came
            try:
                got += tls.read(65536)
            except ssl.SSLWantReadError:
                break


def test_frames_that_come_in_one_packet_with_the_handshake_are_read(pki: Pki, receiver: ModuleType) -> None:
    """The writer's last handshake flight and its first frames in one send: the node's handshake
    reads them together, and the frames read after it start with the bytes that came with it."""
    node = Node(pki.nodes[0], receiver)
    sock = socket.create_connection(("127.0.0.1", node.port), timeout=WAIT)
    tls, incoming, outgoing = client_session(sock, pki.clients["alice"])
    sent = [frame(t, size=100 * t) for t in range(1, 6)]
    tls.write(wire.encode_hello("j1") + b"".join(sent))
    sock.sendall(outgoing.read())  # the client's Finished and the frames, in one write
    assert node.outcome.get(timeout=WAIT) == "alice"
    assert node.outcome.get(timeout=WAIT) == "j1"
    await_ack(sock, tls, incoming, 5)
    assert node.frames == sent
    sock.close()
    assert node.outcome.get(timeout=WAIT) == "eof"
    node.close()


@pytest.mark.skipif(NO_EXTENSIONS, reason="the native receiver's runs: the pure one reads a record at a time")
def test_a_run_takes_all_the_socket_holds_past_the_sessions_read_buffer(pki: Pki) -> None:
    """The native receiver reads through a session whose read-ahead buffer holds 64 KiB: a run (one
    group commit at the node) still takes every frame the socket holds, as plaintext's one large
    recv does, not only what one buffer's worth brought."""
    hold = threading.Event()
    node = Node(pki.nodes[0], module("native"), hold=hold)
    sock = socket.create_connection(("127.0.0.1", node.port), timeout=WAIT)
    tls, incoming, outgoing = client_session(sock, pki.clients["alice"])
    tls.write(wire.encode_hello("j1"))
    sock.sendall(outgoing.read())
    assert node.outcome.get(timeout=WAIT) == "alice"
    assert node.outcome.get(timeout=WAIT) == "j1"
    sent = [frame(t, size=16 << 10) for t in range(1, 9)]  # 128 KiB, eight records and more
    for fr in sent:
        tls.write(fr)
    sock.sendall(outgoing.read())
    deadline = time.monotonic() + WAIT
    # Every byte acknowledged by the node's TCP, so in its socket, before it reads any.
    while fcntl.ioctl(sock, termios.TIOCOUTQ, b"\0\0\0\0") != b"\0\0\0\0":
        assert time.monotonic() < deadline, "the node's socket never took the frames"
        threading.Event().wait(0.001)
    hold.set()
    await_ack(sock, tls, incoming, 8)
    assert node.frames == sent
    assert node.runs == [8]
    sock.close()
    assert node.outcome.get(timeout=WAIT) == "eof"
    node.close()


def connect(
    f: Any, engine: ModuleType, node: Node, client: TlsConfig, name: str = "127.0.0.1", timeout: float = WAIT
) -> int:
    sock = socket.create_connection(("127.0.0.1", node.port), timeout=WAIT)
    try:
        tls = engine.TlsClient(client.ca_file, client.cert_file, client.key_file)
        link: int = f.add_link(sock, tls=tls, server_name=name, timeout=timeout)
        return link
    finally:
        sock.close()


def test_a_node_certificate_from_another_ca_fails_the_handshake(
    pki: Pki, engine: ModuleType, loop: tuple[Any, Any]
) -> None:
    node = Node(pki.foreign, None)
    with pytest.raises(TlsError):
        connect(loop[0], engine, node, pki.clients["alice"])
    node.close()


def test_a_node_certificate_for_another_address_fails_the_handshake(
    pki: Pki, engine: ModuleType, loop: tuple[Any, Any]
) -> None:
    """The node's certificate names 127.0.0.1, ::1 and localhost, not the address dialled."""
    node = Node(pki.nodes[0], None)
    with pytest.raises(TlsError):
        connect(loop[0], engine, node, pki.clients["alice"], name="10.9.8.7")
    node.close()


def test_a_peer_that_never_answers_the_handshake_times_out(pki: Pki, engine: ModuleType, loop: tuple[Any, Any]) -> None:
    node = Node(pki.nodes[0], None, answer=False)
    with pytest.raises(TimeoutError):
        connect(loop[0], engine, node, pki.clients["alice"], timeout=0.3)
    node.close()


def test_a_peer_that_does_not_speak_tls_fails_the_handshake(
    engine: ModuleType, pki: Pki, loop: tuple[Any, Any]
) -> None:
    """A plaintext data plane reads the ClientHello as a bad hello, answers one ERROR and hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))

    def plaintext_node() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(wire.encode_error("CORRUPT_FRAME", "bad data-plane hello", 0))

    t = threading.Thread(target=plaintext_node, daemon=True)
    t.start()
    sock = socket.create_connection(listener.getsockname(), timeout=WAIT)
    alice = pki.clients["alice"]
    with pytest.raises(TlsError):
        loop[0].add_link(sock, tls=engine.TlsClient(alice.ca_file, alice.cert_file, alice.key_file),
                         server_name="127.0.0.1", timeout=WAIT)  # fmt: skip
    sock.close()
    t.join(WAIT)
    listener.close()


def test_files_that_cannot_be_loaded_are_a_config_error(engine: ModuleType, pki: Pki, tmp_path: Any) -> None:
    alice = pki.clients["alice"]
    with pytest.raises(ConfigError):
        engine.TlsClient(str(tmp_path / "missing.pem"), alice.cert_file, alice.key_file)
    with pytest.raises(ConfigError):
        engine.TlsClient(alice.ca_file, alice.cert_file, pki.clients["bob"].key_file)  # not alice's key


def test_a_tls_link_needs_the_name_to_check(engine: ModuleType, pki: Pki, loop: tuple[Any, Any]) -> None:
    alice = pki.clients["alice"]
    a, b = socket.socketpair()
    with pytest.raises(ValueError):
        loop[0].add_link(a, tls=engine.TlsClient(alice.ca_file, alice.cert_file, alice.key_file))
    a.close()
    b.close()
