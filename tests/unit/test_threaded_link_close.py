"""``ThreadedLink`` lets go of its socket only once its two threads are done with it: a descriptor
closed under a thread still calling into it can be reused at once (a pipe, a segment file) and an
SSL session bound to its number would read or write there. A real TCP peer on loopback stands in
for the node; synchronisation is by queues and bounded joins, never by sleeping."""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from qjm.client.threaded_link import ThreadedLink

WAIT = 10.0


class Peer:
    """Accepts one connection and reads it until EOF (then reports "eof"), or hangs up on demand."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.events: queue.Queue[str] = queue.Queue()
        self.hang_up = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            self.events.put("connected")
            conn.settimeout(0.05)  # to look at hang_up between reads
            while not self.hang_up.is_set():
                try:
                    if not conn.recv(65536):
                        self.events.put("eof")
                        return
                except TimeoutError:
                    continue
            conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.hang_up.set()
        self.thread.join(WAIT)
        self.listener.close()


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


def link_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name in (f"qjm-send-{name}", f"qjm-recv-{name}")]


class WatchedSocket(socket.socket):
    """A socket that counts the calls in progress in it, and at close() notes how many there were."""

    def __init__(self, real: socket.socket) -> None:
        super().__init__(real.family, real.type, real.proto, fileno=real.detach())
        self.lock = threading.Lock()
        self.in_calls = 0
        self.at_close: list[int] = []

    def _enter(self, step: int) -> None:
        with self.lock:
            self.in_calls += step

    def recv(self, n: int, flags: int = 0) -> bytes:
        self._enter(1)
        try:
            return super().recv(n, flags)
        finally:
            self._enter(-1)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._enter(1)
        try:
            super().sendall(data, flags)
        finally:
            self._enter(-1)

    def close(self) -> None:
        with self.lock:
            self.at_close.append(self.in_calls)
        super().close()


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> list[WatchedSocket]:
    """Every socket ThreadedLink connects, watched."""
    made: list[WatchedSocket] = []
    connect = socket.create_connection

    def create_connection(*args: Any, **kwargs: Any) -> WatchedSocket:
        made.append(WatchedSocket(connect(*args, **kwargs)))
        return made[-1]

    monkeypatch.setattr(socket, "create_connection", create_connection)
    return made


def test_close_returns_with_both_threads_ended(peer: Peer, watched: list[WatchedSocket]) -> None:
    """The receiver sits in recv when close() is called: the descriptor is closed after it left."""
    link = ThreadedLink("tl-close", peer.address, "j1", WAIT, lambda _link, e: None)
    assert peer.events.get(timeout=WAIT) == "connected"
    assert len(link_threads("tl-close")) == 2
    fut: Future[int] = Future()
    link.send(b"QJMF" + b"\x00" * 60, 1, fut, None)
    link.close()
    assert link_threads("tl-close") == []
    assert watched[0].at_close and set(watched[0].at_close) == {0}  # no thread was inside the socket
    assert peer.events.get(timeout=WAIT) == "eof"
    assert fut.exception(timeout=WAIT) is not None  # never acknowledged: failed by the close


def test_a_node_that_hangs_up_ends_both_threads(peer: Peer, watched: list[WatchedSocket]) -> None:
    failed: queue.Queue[BaseException] = queue.Queue()
    link = ThreadedLink("tl-hangup", peer.address, "j1", WAIT, lambda _link, e: failed.put(e))
    assert peer.events.get(timeout=WAIT) == "connected"
    threads = link_threads("tl-hangup")
    assert len(threads) == 2
    peer.hang_up.set()
    assert "closed by the node" in str(failed.get(timeout=WAIT))
    for t in threads:  # the receiver failed the link; the sender was told to stop
        t.join(WAIT)
        assert not t.is_alive()
    link.close()  # again, from outside: harmless
    assert link_threads("tl-hangup") == []
    assert watched[0].at_close and set(watched[0].at_close) == {0}
