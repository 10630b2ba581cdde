"""The writer's data link to one node on the shared fan-out engine (``qjm._native.fanout``).

``FanoutLink`` is a ``qjm.client.data_link.DataLink`` with no threads of its own: every link of
the process registers its socket with one ``Fanout`` engine whose loop runs in a single thread
without the GIL. A batch is
written from the sender's thread at once when the socket has room; the loop writes the rest,
parses the node's cumulative acks and calls back here, and the link completes its futures, which
feed each batch's ``QuorumCall`` (design §1.3). A quiet link (``report_acks=False``) has no futures:
its acks only wake ``Fanout.wait_news``, and ``qjm.client.link_batch`` counts the quorum from
``acked_txid`` in the waiting thread. The engine bounds each link's in-flight window in
frames and bytes; a batch past it, an ERROR from the node or a broken connection fail the link,
and ``RemoteLogger`` marks the node out of sync until its next segment (style-anchors R16).
With TLS the engine runs each link's session inside its loop (libssl in the native module; design
§9.4): the handshake happens here, in the connecting thread, before the link joins the loop.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from concurrent.futures import Future
from types import ModuleType
from typing import Any

from qjm import errors
from qjm._native import fanout
from qjm.addresses import split_host_port
from qjm.client.data_link import LatencySink, LinkFailed, PendingBatches, encode_commit
from qjm.client.node_state import CommitNotice
from qjm.errors import CorruptFrameError, NodeTooFarBehindError, NodeUnavailableError, OutOfSyncError, TlsError
from qjm.histogram import LATENCY_BUCKETS
from qjm.protocol import wire
from qjm.security.tls import TlsConfig

log = logging.getLogger("qjm.fanout")

DEFAULT_WINDOW_COUNT = 4096
DEFAULT_WINDOW_BYTES = 1 << 62  # RemoteLogger enforces queued_edits_limit_bytes itself


class Engine:
    """One ``Fanout`` and the thread running its loop, shared by the links registered with it."""

    def __init__(self, backend: ModuleType | None = None) -> None:
        self.backend = backend or fanout
        # Every link times its acks against the writer's latency buckets (RemoteLogger.write_latency).
        self.fanout = self.backend.Fanout(latency_bounds=LATENCY_BUCKETS)
        self._links: dict[int, FanoutLink] = {}
        self._thread = threading.Thread(target=self._run, name="qjm-fanout", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.fanout.run(self._dispatch)
        except BaseException:  # the loop itself failing is a bug: fail every link loudly
            log.exception("qjm fan-out loop died")
            for link in list(self._links.values()):
                link.fail(NodeUnavailableError(f"{link.name}: the fan-out loop died"))
            raise

    def _dispatch(self, link_id: int, acked: int, code: str, detail: object) -> None:
        link = self._links.get(link_id)
        if link is not None:
            link._on_event(acked, code, detail)

    def register(
        self,
        link: FanoutLink,
        sock: socket.socket,
        max_count: int,
        max_bytes: int,
        report_acks: bool = True,
        tls: tuple[Any, str, float] | None = None,
    ) -> int:
        """Add ``link``'s socket to the engine; ``tls``: (TlsClient, the node's name, handshake timeout)."""
        opts: dict[str, Any] = {}
        if tls is not None:
            opts = {"tls": tls[0], "server_name": tls[1], "timeout": tls[2]}
        link_id: int = self.fanout.add_link(
            sock, max_count=max_count, max_bytes=max_bytes, report_acks=report_acks, **opts
        )
        self._links[link_id] = link
        return link_id

    def unregister(self, link_id: int) -> None:
        if self._links.pop(link_id, None) is not None:
            self.fanout.remove(link_id)

    def close(self) -> None:
        """Stop the loop and release the engine (links still registered are failed first)."""
        for link in list(self._links.values()):
            link.close()
        self.fanout.stop()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self.fanout.close()


@functools.lru_cache(maxsize=16)
def tls_client(backend: ModuleType, tls: TlsConfig) -> Any:
    """The engine's TLS context for ``tls`` (loading the CA, certificate and key once per process)."""
    return backend.TlsClient(tls.ca_file, tls.cert_file, tls.key_file)


_shared: Engine | None = None
_shared_lock = threading.Lock()


def _forget_shared_engine() -> None:
    # A forked child has the parent's engine object but not its thread: start afresh on first use.
    global _shared, _shared_lock
    _shared = None
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_shared_engine)


def shared_engine() -> Engine:
    """The process's engine, started on first use (its thread is a daemon)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Engine()
        return _shared


class FanoutLink:
    """One node's data-plane connection, served by the shared fan-out engine."""

    def __init__(
        self,
        name: str,
        address: str,
        journal_id: str,
        connect_timeout: float,
        on_fail: LinkFailed,
        *,
        max_count: int = DEFAULT_WINDOW_COUNT,
        max_bytes: int = DEFAULT_WINDOW_BYTES,
        engine: Engine | None = None,
        report_acks: bool = True,
        tls: TlsConfig | None = None,
        on_latencies: LatencySink | None = None,
    ) -> None:
        self.name = name
        self._on_latencies = on_latencies
        host, port = split_host_port(address)
        self._sock = socket.create_connection((host, port), timeout=connect_timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._batches = PendingBatches()  # loud links: a future per batch
        self._lock = self._batches.lock
        self._on_fail = on_fail
        self.failed: BaseException | None = None  # set with the PendingBatches' failure
        self.closed = False
        self._max_count = max_count
        self._final_acked = 0  # what the node had acked when the link left the engine
        self._engine = engine or shared_engine()
        try:
            session = None
            if tls is not None:
                session = (tls_client(self._engine.backend, tls), host, connect_timeout)
            self._id = self._engine.register(self, self._sock, max_count, max_bytes, report_acks, session)
            self._engine.fanout.send(self._id, wire.encode_hello(journal_id))
        except BaseException:
            self._sock.close()
            raise

    def send(self, frame: bytes, last_txid: int, fut: Future[int], commit: CommitNotice | None) -> None:
        with self._lock:
            if not self._batches.add(last_txid, fut, len(frame)):
                return
            # A refusal (full window, broken socket) comes back through the engine's loop thread:
            # the caller holds RemoteLogger's lock, which the on_fail handler takes.
            self._engine.fanout.send(self._id, frame, last_txid, encode_commit(commit))

    def send_untracked(self, frame: bytes, last_txid: int, commit: CommitNotice | None) -> None:
        """Send a batch on a quiet link: its outcome is read from ``acked_txid`` and ``failed``."""
        with self._lock:
            if self.failed is not None:
                return
            notice = None if commit is None else wire.encode_commit(*commit)
            self._engine.fanout.send(self._id, frame, last_txid, notice)

    def send_notice(self, notice: bytes) -> None:
        with self._lock:
            if self.failed is None and not self.closed:
                self._engine.fanout.send(self._id, notice)

    def engine_id(self) -> int | None:
        with self._lock:
            if self.failed is not None or self.closed or self._id < 0 or self._batches:
                return None  # ended, or a loud link whose batches each have a future
            return self._id

    def fold_latencies(self) -> None:
        """Hand the ack latencies the engine timed on this link since the last fold to ``on_latencies``
        (the rest are handed over as the link leaves the engine)."""
        if self._on_latencies is None:
            return
        with self._lock:
            if self._id < 0:
                return
            counts, seconds = self._engine.fanout.take_latencies(self._id)
        self._on_latencies(counts, seconds)

    def acked_txid(self) -> int:
        """Highest txid this node has acknowledged as durable on this link, even after it failed."""
        with self._lock:
            link_id = self._id
            if link_id < 0:
                return self._final_acked
            return int(self._engine.fanout.acked(link_id))

    def unacked_bytes(self) -> int:
        with self._lock:
            return int(self._engine.fanout.inflight(self._id)[1]) if self._id >= 0 else 0

    def wait_for_room(self, nbytes: int, limit: int, stall: float) -> None:
        fanout = self._engine.fanout
        try:  # the common case, once per batch and node: room already
            frames, queued = fanout.inflight(self._id)
            if queued == 0 or (queued + nbytes <= limit and frames < self._max_count):
                return
        except ValueError:  # the link has left the engine (it failed or closed)
            return
        acked, since = -1, 0.0
        while True:
            seen = fanout.news()
            with self._lock:
                if self.failed is not None or self._id < 0:
                    return
                frames, queued = fanout.inflight(self._id)
                now_acked = int(fanout.acked(self._id))
            if queued == 0 or (queued + nbytes <= limit and frames < self._max_count):
                return
            now = time.monotonic()
            if now_acked != acked:
                acked, since = now_acked, now
            elif now - since >= stall:
                return  # stalled: the engine's window drops it, as Hadoop would at once
            fanout.wait_news(seen, since + stall - now)

    def wait_idle(self, timeout: float) -> None:
        if self._batches:
            self._batches.wait_idle(timeout)
            return
        # A quiet link: batches went out through the engine, from here or from Fanout.sync_batch.
        fanout = self._engine.fanout
        deadline = time.monotonic() + timeout
        while True:
            seen = fanout.news()
            with self._lock:
                if self.failed is not None or self._id < 0 or fanout.inflight(self._id)[0] == 0:
                    return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            fanout.wait_news(seen, remaining)

    def fail(self, e: BaseException) -> None:
        """End the link: its pending batches fail with ``e``; it leaves the engine."""
        if not self._batches.fail(e):
            return
        self.failed = e
        self.closed = True
        self._release()
        self._on_fail(self, e)
        self._engine.fanout.notify()  # threads counting a quorum over this link look again

    def close(self) -> None:
        self.closed = True
        self.fail(OutOfSyncError(f"{self.name}: data link closed with batches pending"))
        self._release()

    def _on_event(self, acked: int, code: str, detail: object) -> None:
        """From the engine's thread: ``acked`` is the node's cumulative ack; ``code`` a failure."""
        if acked:
            self._batches.complete(acked)
        if code:
            self.fail(self._error(code, detail))

    def _error(self, code: str, detail: object) -> BaseException:
        if code == "reply" and isinstance(detail, bytes):
            try:
                msg, _ = wire.parse_reply(bytearray(detail))
            except CorruptFrameError as e:
                return e
            if isinstance(msg, wire.NodeError):
                return errors.from_code(msg.code, f"{self.name}: {msg.message}")
            return CorruptFrameError(f"{self.name}: unparseable data-plane reply", reason="wire")
        if code == "eof":
            return NodeUnavailableError(f"{self.name}: data plane connection closed by the node")
        if code == "oserror" and isinstance(detail, int):
            return NodeUnavailableError(f"{self.name}: data plane connection failed: {os.strerror(detail)}")
        if code == "window":
            return NodeTooFarBehindError(f"{self.name}: too many batches unacknowledged; the in-flight window is full")
        if code == "tls":
            return TlsError(f"{self.name}: data plane TLS session failed: {detail}")
        return NodeUnavailableError(f"{self.name}: data plane failed ({code})")

    def _release(self) -> None:
        """Leave the engine and close the socket (``fail`` has failed what was pending); again is harmless."""
        sink, latencies = self._on_latencies, None
        with self._lock:
            link_id, self._id = self._id, -1
            if link_id >= 0:
                self._final_acked = int(self._engine.fanout.acked(link_id))
                if sink is not None:
                    latencies = self._engine.fanout.take_latencies(link_id)
        if link_id >= 0:
            self._engine.unregister(link_id)
            self._sock.close()
        if sink is not None and latencies is not None:
            sink(*latencies)
