"""Pure-Python data plane (twin of ``fanout_c``): selectors and threads, same API and reports.

``Fanout`` is the writer's side: ``run`` serves every link from one thread with a selector; ``send``
writes from the caller's thread while the link's queue is empty and leaves the rest to the loop.
``Receiver`` is the node's side of one connection. Written independently of the Cython module as
the simplest correct code (style-anchors R4). TLS: a link added with a ``TlsClient`` runs an
``ssl.SSLObject`` over two memory BIOs, as the Cython module runs libssl; a ``Receiver`` whose
``handshake`` ran with a ``TlsServer`` reads and acks through an ``ssl.SSLSocket``.
"""

from __future__ import annotations

import bisect
import collections
import errno
import itertools
import math
import os
import select
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from qjm._native.framing_py import decode_header
from qjm.errors import CorruptFrameError, ResourceExhaustedError, TlsError
from qjm.protocol import wire
from qjm.protocol.frame import FRAME_HEADER_SIZE, FRAME_MAGIC, MAX_PAYLOAD
from qjm.security.tls import TlsConfig

if TYPE_CHECKING:
    from qjm._native.gate_py import WriteGate

MAX_LATENCY_BOUNDS = 32  # as the native engine

ACK_SIZE = wire.ACK.size
MAX_WINDOW_COUNT = 1 << 20

_RBUF = 131072  # > the largest reply: the error header, its code and its text
_RECV = 1 << 20
_FRAME_MAGIC = FRAME_MAGIC.to_bytes(4, "little")
_TLS_CHUNK = 16384
_Session = tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]  # a TLS link's session and its two BIOs


class TlsClient:
    """A writer's side of data-plane TLS: its certificate chain and key (PEM files) and the CA
    certificates it trusts; TLS 1.3 (``qjm.security.tls``), the node's certificate always verified."""

    def __init__(
        self, ca_file: str | os.PathLike[str], cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]
    ) -> None:
        ctx = TlsConfig(os.fspath(ca_file), os.fspath(cert_file), os.fspath(key_file)).client_ssl_context()
        self.context = ctx

    def _session(self, sock: socket.socket, server_name: str, timeout: float) -> _Session:
        """A client session on memory BIOs, its handshake done over ``sock`` (non-blocking)."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = self.context.wrap_bio(incoming, outgoing, server_hostname=server_name)
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_READ)
        try:
            while True:
                try:
                    obj.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
                except ssl.SSLError as e:
                    _send_all(sock, outgoing.read(), sel, deadline, server_name)  # the alert, if any
                    raise TlsError(f"TLS handshake with {server_name} failed: {e}") from None
                _send_all(sock, outgoing.read(), sel, deadline, server_name)
                if done:
                    return obj, incoming, outgoing
                sel.modify(sock, selectors.EVENT_READ)
                if not sel.select(deadline - time.monotonic()):
                    raise OSError(errno.ETIMEDOUT, f"TLS handshake with {server_name}: {os.strerror(errno.ETIMEDOUT)}")
                try:
                    data = sock.recv(_TLS_CHUNK)
                except (BlockingIOError, InterruptedError):
                    continue
                if not data:
                    raise TlsError(f"{server_name} hung up during the TLS handshake (is its data plane TLS?)")
                incoming.write(data)
        finally:
            sel.close()


class TlsServer:
    """A node's side of data-plane TLS: its certificate chain and key (PEM files) and the CA whose
    certificates it accepts; TLS 1.3, a client certificate signed by that CA required."""

    def __init__(
        self, ca_file: str | os.PathLike[str], cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]
    ) -> None:
        self.context = TlsConfig(os.fspath(ca_file), os.fspath(cert_file), os.fspath(key_file)).server_ssl_context()
        self.context.num_tickets = 0  # no resumption: a writer's link lives for a segment


def _send_all(sock: socket.socket, data: bytes, sel: selectors.BaseSelector, deadline: float, name: str) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except (BlockingIOError, InterruptedError):
            sel.modify(sock, selectors.EVENT_WRITE)
            if not sel.select(deadline - time.monotonic()):
                raise OSError(errno.ETIMEDOUT, f"TLS handshake with {name}: {os.strerror(errno.ETIMEDOUT)}") from None


Callback = Callable[[int, int, str, object], None]


class _Link:
    def __init__(
        self,
        sock: socket.socket,
        max_count: int,
        max_bytes: int,
        quiet: bool = False,
        tls: _Session | None = None,
        latency_bounds: Sequence[int] = (),
    ) -> None:
        self.sock = sock
        self.tls = tls
        self.cipher = bytearray()  # TLS: ciphertext waiting to be sent
        self.quiet = quiet
        self.lock = threading.Lock()
        self.queue: collections.deque[memoryview] = collections.deque()
        self.inflight: collections.deque[tuple[int, int, int]] = collections.deque()  # (last, bytes, sent ns)
        self.inflight_bytes = 0
        self.latency_bounds = latency_bounds  # ns
        self.latency = [0] * (len(latency_bounds) + 1)
        self.latency_sum_ns = 0
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.acked = 0
        self.rbuf = bytearray()
        self.open = True
        self.news = False
        self.failure: tuple[str, object] | None = None
        self.failure_reported = False
        self.writing = False

    def fail(self, code: str, detail: object) -> None:
        if not self.open:
            return
        self.open = False
        self.failure = (code, detail)
        self.news = True
        self.queue.clear()
        self.inflight.clear()
        self.inflight_bytes = 0

    def pending(self) -> bool:
        return bool(self.queue) or bool(self.cipher)

    def enqueue(self, prefix: bytes | None, frame: bytes) -> bool:
        """Queue ``prefix`` (if any) and ``frame``, encrypted on a TLS link; False if the session refused."""
        if self.tls is not None:
            return (prefix is None or self.encrypt(prefix)) and self.encrypt(frame)
        if prefix is not None:
            self.queue.append(memoryview(prefix))
        self.queue.append(memoryview(frame))
        return True

    def encrypt(self, data: bytes) -> bool:
        """TLS: encrypt ``data`` into ``cipher``; False (the link failed) if the session refuses."""
        assert self.tls is not None
        obj, _, outgoing = self.tls
        try:
            obj.write(data)
        except ssl.SSLError as e:
            self.fail("tls", str(e))
            return False
        self.cipher += outgoing.read()
        return True

    def flush(self) -> None:
        """Send queued bytes until the socket would block; OSError propagates."""
        while self.cipher:
            try:
                n = self.sock.send(self.cipher)
            except (BlockingIOError, InterruptedError):
                return
            del self.cipher[:n]
        while self.queue:
            try:
                n = self.sock.send(self.queue[0])
            except (BlockingIOError, InterruptedError):
                return
            if n == len(self.queue[0]):
                self.queue.popleft()
            else:
                self.queue[0] = self.queue[0][n:]

    def on_ack(self, txid: int) -> None:
        if txid > self.acked:
            self.acked = txid
            self.news = True
        now = 0
        while self.inflight and self.inflight[0][0] <= self.acked:
            _, n, sent = self.inflight.popleft()
            self.inflight_bytes -= n
            now = now or time.monotonic_ns()
            self.latency[bisect.bisect_left(self.latency_bounds, now - sent)] += 1
            self.latency_sum_ns += now - sent

    def parse(self) -> None:
        buf = self.rbuf
        pos = 0
        while self.open and len(buf) - pos >= 4:
            magic = bytes(buf[pos : pos + 4])
            if magic == wire.ACK_MAGIC:
                if len(buf) - pos < wire.ACK.size:
                    break
                self.on_ack(wire.ACK.unpack_from(buf, pos)[2])
                pos += wire.ACK.size
            elif magic == wire.ERROR_MAGIC:
                if len(buf) - pos < wire.ERROR.size:
                    break
                _, clen, _, mlen, durable = wire.ERROR.unpack_from(buf, pos)
                if mlen > wire.MAX_ERROR_TEXT:
                    self.fail("reply", bytes(buf[pos : pos + wire.ERROR.size]))
                    break
                need = wire.ERROR.size + clen + mlen
                if len(buf) - pos < need:
                    break
                if durable > 0:
                    self.on_ack(durable)
                self.fail("reply", bytes(buf[pos : pos + need]))
            else:
                self.fail("reply", magic)
        del buf[:pos]

    def decrypt(self, chunk: bytes) -> None:
        assert self.tls is not None
        obj, incoming, outgoing = self.tls
        incoming.write(chunk)
        while self.open:
            if len(self.rbuf) >= _RBUF:
                self.fail("reply", bytes(self.rbuf[:4]))
                return
            try:
                data = obj.read(_RBUF - len(self.rbuf))
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.fail("eof", None)
                return
            except ssl.SSLError as e:
                self.fail("tls", str(e))
                return
            if not data:
                self.fail("eof", None)
                return
            self.rbuf += data
            self.parse()
        self.cipher += outgoing.read()  # what the session answered (a key update), sent with the rest

    def read(self) -> bool:
        """Take in what the node sent; returns whether the link is still open."""
        self._read()
        return self.open

    def _read(self) -> None:
        while self.open:
            if self.tls is None and len(self.rbuf) >= _RBUF:
                self.fail("reply", bytes(self.rbuf[:4]))
                return
            room = _RBUF - len(self.rbuf)
            try:
                chunk = self.sock.recv(room)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self.fail("oserror", e.errno)
                return
            if not chunk:
                self.fail("eof", None)
                return
            if self.tls is not None:
                self.decrypt(chunk)
                continue
            self.rbuf += chunk
            self.parse()
            if len(chunk) < room:
                return  # nothing more for now: its readers' waits are level-triggered, as the native engine's


def _drain(sock: socket.socket) -> None:
    """Read whatever wake-ups a non-blocking socket holds."""
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


class Fanout:
    """Pipelined sender to many nodes: one selector loop, one non-blocking connection per link.

    ``park_seconds`` and ``keep_notice_seconds`` are checked as the native engine checks them and
    otherwise unused: this loop watches every link at all times, so a sync_batch has nothing to
    keep parked, and sends its commit notice at once (the native engine's parking saves system
    calls and wake-ups, not behaviour anyone can observe beyond when the slowest node's ack is read
    and when a notice leaves: at the latest with the link's next send, or ``park_seconds`` after
    the sync_batch).

    ``latency_bounds``: ascending upper bounds in seconds (at most 32) of the ack latencies each
    link counts, every frame sent with a ``last_txid`` timed from its send to the ack covering it
    (``take_latencies``).
    """

    def __init__(
        self, park_seconds: float = 0.002, latency_bounds: Iterable[float] = (), keep_notice_seconds: float = 0.0002
    ) -> None:
        if not park_seconds >= 0:
            raise ValueError(f"park_seconds must be >= 0, got {park_seconds}")
        if not keep_notice_seconds >= 0:
            raise ValueError(f"keep_notice_seconds must be >= 0, got {keep_notice_seconds}")
        bounds = [float(b) for b in latency_bounds]
        if len(bounds) > MAX_LATENCY_BOUNDS:
            raise ValueError(f"at most {MAX_LATENCY_BOUNDS} latency_bounds, got {len(bounds)}")
        if not all(0 < b < 1e9 for b in bounds) or any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"latency_bounds must be ascending seconds in (0, 1e9), got {tuple(bounds)}")
        self._latency_bounds = tuple(round(b * 1e9) for b in bounds)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._links: dict[int, _Link] = {}
        self._next = 1
        self._lock = threading.Lock()  # guards _links and every selector registration
        self._stop = False
        self._running = False
        self._closed = False
        self._news = 0
        self._notified = 0  # bumped by notify() alone: Python's own state changed
        self._news_cond = threading.Condition(threading.Lock())
        # The sockets that wake each sync_batch polling its links (guarded by _news_cond): one each,
        # so that none drains a wake-up meant for another.
        self._sync_wakers: list[socket.socket] = []

    def _get(self, link: int) -> _Link:
        if self._closed:
            raise ValueError("Fanout is closed")
        lk = self._links.get(link)
        if lk is None:
            raise ValueError(f"unknown link {link}")
        return lk

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:
            pass  # a wake-up is already pending

    def _want_write(self, link: int, lk: _Link) -> None:
        # Called with lk.lock held (lock order: link, then engine), so the interest always matches
        # the queue: watch for writability exactly while bytes wait.
        want = lk.pending()
        if want != lk.writing and lk.open:
            with self._lock:
                if link in self._links:
                    events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
                    try:
                        self._sel.modify(lk.sock, events, link)
                    except (OSError, ValueError, KeyError) as e:
                        # The owner closed the socket under a live link: a link failure, not a
                        # dead loop thread (epoll_ctl says EBADF/ENOENT, the selector KeyError).
                        lk.fail("oserror", getattr(e, "errno", None) or errno.EBADF)
                        try:
                            self._sel.unregister(lk.sock)
                        except (KeyError, ValueError):
                            pass
                        self._wake()  # the loop reports the failure
                        return
                    lk.writing = want

    def add_link(
        self,
        sock: socket.socket,
        *,
        max_count: int = MAX_WINDOW_COUNT,
        max_bytes: int = 1 << 62,
        report_acks: bool = True,
        tls: TlsClient | None = None,
        server_name: str = "",
        timeout: float = 30.0,
    ) -> int:
        """Register a connected socket (made non-blocking); returns the link id.

        With ``report_acks=False`` the link is quiet: ``run``'s callback hears only of its failure,
        and its acks just wake ``wait_news`` (read them with ``acked``). With ``tls`` the link is
        encrypted: the TLS handshake runs here first (at most ``timeout`` seconds), the node's
        certificate checked against ``tls``'s CA and ``server_name`` (a host name or an IP
        address); a refusal raises TlsError, a timeout or a hang-up OSError.
        """
        if self._closed:
            raise ValueError("Fanout is closed")
        if max_count < 1 or max_bytes < 1:
            raise ValueError("max_count and max_bytes must be >= 1")
        if timeout != timeout or timeout <= 0:
            raise ValueError("timeout must be > 0")
        if tls is not None and not server_name:
            raise ValueError("a TLS link needs the node's server_name to check its certificate against")
        sock.setblocking(False)
        session = None if tls is None else tls._session(sock, server_name, timeout)
        with self._lock:
            link = self._next
            self._next += 1
            self._links[link] = _Link(
                sock, max_count, max_bytes, quiet=not report_acks, tls=session, latency_bounds=self._latency_bounds
            )
            self._sel.register(sock, selectors.EVENT_READ, link)
        return link

    def send(self, link: int, frame: bytes, last_txid: int = 0, prefix: bytes | None = None) -> int:
        """Queue ``prefix`` (if any) then ``frame``; a frame with ``last_txid`` > 0 awaits its ack.

        Returns 0 when queued, 1 when the link's window was full (nothing queued; the link fails),
        -1 when the link has failed. Failures (a full window, a write error) are reported by
        ``run``'s callback, never raised here.
        """
        lk = self._get(link)
        if type(frame) is not bytes or (prefix is not None and type(prefix) is not bytes):
            raise TypeError("frame and prefix must be bytes")
        if not 0 <= last_txid < 1 << 64:
            raise OverflowError(f"last_txid {last_txid} out of range")
        n = len(frame)
        with lk.lock:
            if not lk.open:
                return -1
            if last_txid and (
                len(lk.inflight) >= lk.max_count or (lk.inflight_bytes > 0 and lk.inflight_bytes + n > lk.max_bytes)
            ):
                lk.fail("window", None)
                rc = 1
            else:
                rc = -1  # unless queued below: the TLS session refused, or the write failed
                was_empty = not lk.pending()
                if lk.enqueue(prefix, frame):
                    if last_txid:
                        lk.inflight.append((last_txid, n, time.monotonic_ns()))
                        lk.inflight_bytes += n
                    if not was_empty:
                        return 0
                    try:
                        lk.flush()
                    except OSError as e:
                        lk.fail("oserror", e.errno)
                    else:
                        self._want_write(link, lk)
                        return 0
            self._unwatch(link, lk)
        self._wake()  # let the loop report the failure
        return rc

    def _unwatch(self, link: int, lk: _Link) -> None:
        with self._lock:
            if link in self._links:
                try:
                    self._sel.unregister(lk.sock)
                except (KeyError, ValueError):
                    pass

    def remove(self, link: int) -> None:
        """Forget a link: stop watching its socket and drop what is queued. The caller closes the socket."""
        lk = self._get(link)
        with lk.lock:
            lk.open = False
            lk.queue.clear()
            lk.inflight.clear()
            lk.inflight_bytes = 0
            self._unwatch(link, lk)
            with self._lock:
                del self._links[link]

    def acked(self, link: int) -> int:
        """Highest txid the node has acknowledged as durable on this link."""
        lk = self._get(link)
        with lk.lock:
            return lk.acked

    def take_latencies(self, link: int) -> tuple[list[int], float]:
        """``(counts, seconds)``: how many frames the node acknowledged since the last call, per
        ``latency_bounds`` bound their ack latency fell under (one more count, last, for those
        above every bound), and the sum of those latencies; the counts start again from zero."""
        lk = self._get(link)
        with lk.lock:
            counts, total = lk.latency, lk.latency_sum_ns
            lk.latency, lk.latency_sum_ns = [0] * len(counts), 0
        return counts, total / 1e9

    def inflight(self, link: int) -> tuple[int, int]:
        """(frames, bytes) sent or queued on this link and not yet acknowledged."""
        lk = self._get(link)
        with lk.lock:
            return len(lk.inflight), lk.inflight_bytes

    def quorum_txid(self, links: Iterable[int]) -> int:
        """Highest txid acknowledged by a majority of ``links`` (0 when none or no majority has one)."""
        acks = sorted((self.acked(link) for link in links), reverse=True)
        return acks[len(acks) // 2] if acks else 0

    def news(self) -> int:
        """A counter that grows whenever a link's acked advances, a link fails, or ``notify`` runs."""
        with self._news_cond:
            return self._news

    def wait_news(self, seen: int, timeout: float) -> bool:
        """Block until ``news()`` differs from ``seen``, at most ``timeout`` seconds.

        Returns whether it differs. Read ``news()`` before looking at the state you wait on, then
        pass it here: news that arrived in between is never missed.
        """
        if timeout != timeout:
            raise ValueError("timeout is NaN")
        with self._news_cond:
            if timeout > 0:
                self._news_cond.wait_for(lambda: self._news != seen, min(timeout, 1e6))
            return self._news != seen

    def notify(self) -> None:
        """Bump ``news()`` and wake every ``wait_news`` (Python calls it when its own state changed)."""
        with self._news_cond:
            self._notified += 1
        self._bump_news()

    def _bump_news(self, skip: socket.socket | None = None) -> None:
        """Wake every wait_news and every sync_batch polling its links but the one ``skip`` wakes
        (a sync_batch telling of what it read itself)."""
        with self._news_cond:
            self._news += 1
            self._news_cond.notify_all()
            for waker in self._sync_wakers:  # under the lock: none is closed meanwhile
                if waker is not skip:
                    try:
                        waker.send(b"\0")
                    except BlockingIOError:
                        pass  # a wake-up is already pending

    def sync_batch(
        self,
        links: Sequence[int],
        frame: bytes,
        last_txid: int,
        need: int,
        notice: bytes | None,
        timeout: float,
        room: int = 0,
    ) -> int:
        """Send ``frame`` on each of ``links`` (as ``send`` does, awaiting ``last_txid``), wait until
        ``need`` of them have acknowledged ``last_txid``, then queue ``notice`` (if not None) on each
        of them. Returns how many had acknowledged it.

        ``room`` > 0: a link with unacknowledged bytes that ``frame`` would take past ``room``, or
        with its window's frames all in flight, makes it return -1 having sent nothing.

        The wait also ends, with fewer than ``need``, when one of the links is no longer open, when
        ``notify`` runs (the caller's own state changed) or after ``timeout`` seconds; the caller
        then looks at the links itself. An unknown link raises ValueError before anything is sent.
        While it waits, this thread polls the links and reads their acks itself (under each link's
        lock, as the loop does), so it needs no loop running to see its quorum; a failure it finds
        is reported by the loop, as any other."""
        if timeout != timeout:
            raise ValueError("timeout is NaN")
        if type(frame) is not bytes:
            raise TypeError("frame must be bytes")
        lks = [self._get(link) for link in links]
        if room > 0:
            for lk in lks:
                with lk.lock:
                    if lk.inflight_bytes > 0 and (
                        lk.inflight_bytes + len(frame) > room or len(lk.inflight) >= lk.max_count
                    ):
                        return -1
        for link in links:
            try:
                self.send(link, frame, last_txid)
            except ValueError:
                pass  # it left the engine meanwhile: gone, below
        deadline = time.monotonic() + min(timeout, 1e6)
        # Read the acks here, not through the loop: the reply wakes this thread directly.
        poller = select.poll()
        by_fd: dict[int, tuple[int, _Link]] = {}
        for link, lk in zip(links, lks, strict=True):
            fd = lk.sock.fileno()
            if fd >= 0:
                poller.register(fd, select.POLLIN)
                by_fd[fd] = (link, lk)
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        poller.register(wake_r.fileno(), select.POLLIN)
        with self._news_cond:
            notified = self._notified
            self._sync_wakers.append(wake_w)  # from here news wakes the poll below
        failed = False
        try:
            while True:
                count = gone = 0
                for link, lk in zip(links, lks, strict=True):
                    with lk.lock:
                        if not lk.open or self._links.get(link) is not lk:
                            gone += 1
                        elif lk.acked >= last_txid:
                            count += 1
                remaining = deadline - time.monotonic()
                if count >= need or gone or remaining <= 0:
                    break
                with self._news_cond:
                    if self._notified != notified:
                        break
                changed = False
                for fd, _ in poller.poll(max(1, math.ceil(remaining * 1000))):
                    if fd not in by_fd:
                        _drain(wake_r)
                        continue
                    link, lk = by_fd[fd]
                    with lk.lock:
                        if lk.open and self._links.get(link) is lk:
                            acked0 = lk.acked
                            still_open = lk.read()
                            changed = changed or lk.acked != acked0 or not still_open
                            if not still_open:
                                self._unwatch(link, lk)
                                failed = True  # the loop reports it: woken below
                            elif lk.quiet:
                                lk.news = False
                if changed:
                    self._bump_news(wake_w)
        finally:
            with self._news_cond:
                self._sync_wakers.remove(wake_w)
            wake_r.close()
            wake_w.close()
        if failed:
            self._wake()
        if count >= need and notice is not None:
            for link in links:
                try:
                    self.send(link, notice)
                except ValueError:
                    pass  # the link left the engine meanwhile: its node is out of sync already
        return count

    def lane(self, links: Iterable[int], need: int, room: int = 0) -> Lane:
        """A ``Lane``: ``sync_batch`` over ``links`` for a writer committing batch after batch.
        An unknown link raises ValueError."""
        return Lane(self, links, need, room)

    def run(self, callback: Callback) -> None:
        """Serve every link until ``stop``; ``callback(link, acked, code, detail)`` reports news.

        ``code`` is ``""`` (acked advanced), ``"reply"`` (the node sent an ERROR or something
        unparseable: ``detail`` holds those bytes), ``"eof"``, ``"oserror"`` (``detail`` = errno) or
        ``"window"`` (a send found the in-flight window full), ``"tls"`` (the link's TLS session
        failed: ``detail`` is the reason, as text).
        """
        if self._closed:
            raise ValueError("Fanout is closed")
        if self._running:
            raise RuntimeError("Fanout.run is already running")
        self._running = True
        try:
            while not self._stop:
                ready = self._sel.select()
                touched: list[int] = []
                changed = False
                for key, events in ready:
                    if key.data is None:
                        try:
                            self._wake_r.recv(4096)
                        except BlockingIOError:
                            pass
                        touched = list(self._links)
                        continue
                    link = key.data
                    lk = self._links.get(link)
                    if lk is None:
                        continue
                    with lk.lock:
                        was_open, acked0 = lk.open, lk.acked
                        if lk.open and events & selectors.EVENT_WRITE:
                            try:
                                lk.flush()
                            except OSError as e:
                                lk.fail("oserror", e.errno)
                        if lk.open and events & selectors.EVENT_READ:
                            lk.read()
                        if lk.open:
                            self._want_write(link, lk)
                        else:
                            self._unwatch(link, lk)
                        changed = changed or lk.acked != acked0 or lk.open != was_open
                        if lk.quiet and lk.open:
                            lk.news = False  # acks only: the waiters hear of them below
                    touched.append(link)
                if changed:
                    self._bump_news()
                for link in dict.fromkeys(touched):
                    self._report(link, callback)
        finally:
            self._stop = False  # honoured: a stop that came before this run, too
            self._running = False

    def _report(self, link: int, callback: Callback) -> None:
        lk = self._links.get(link)
        if lk is None:
            return
        with lk.lock:
            if not lk.news:
                return
            lk.news = False
            acked = lk.acked
            code, detail = "", None
            if lk.failure is not None and not lk.failure_reported:
                lk.failure_reported = True
                code, detail = lk.failure
        try:
            callback(link, acked, code, detail)
        except Exception:
            import traceback

            traceback.print_exc()

    def stop(self) -> None:
        """Make ``run`` return (from any thread); a stop before ``run`` makes it return at once."""
        self._stop = True
        self._wake()

    def close(self) -> None:
        """Remove every link and release the selector; ``run`` must have returned."""
        if self._running:
            raise RuntimeError("Fanout.close while run is running; stop it first")
        if self._closed:
            return
        for link in list(self._links):
            self.remove(link)
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


_UNSENT_MAX = 64  # plaintext bytes non-waiting acks may leave unsent between flushes, as the native receiver


class Lane:
    """``Fanout.sync_batch`` bound to one writer's links, quorum and queue limit, for a writer that
    syncs batch after batch: each ``commit`` encodes the batch's commit notice, sends, waits and
    times the commit in one call (in the native engine with no Python between the writer's frame
    and the wait). Good until ``revoke``, or until a commit finds a link gone from the engine or
    its wait short of a quorum, which revokes it."""

    def __init__(self, fanout: Fanout, links: Iterable[int], need: int, room: int = 0) -> None:
        self._fanout = fanout
        self._links = tuple(int(x) for x in links)
        for link in self._links:
            fanout._get(link)  # an unknown link: ValueError now, not at the first commit
        if not 1 <= need <= len(self._links):
            raise ValueError(f"need must be in [1, {len(self._links)}], got {need}")
        self.need = need
        self._room = room
        self.revoked = False
        self.committed = 0  # the highest last_txid a commit made durable
        self._bounds = fanout._latency_bounds
        self._times = [0] * (len(self._bounds) + 1)
        self._times_ns = 0

    @property
    def links(self) -> tuple[int, ...]:
        return self._links

    def revoke(self) -> None:
        """End the lane: every later ``commit`` returns -2 having done nothing."""
        self.revoked = True

    def commit(self, frame: bytes, last_txid: int, epoch: int, timeout: float) -> int:
        """``sync_batch`` of ``frame`` (awaiting ``last_txid``) with the commit notice of ``epoch`` and
        ``last_txid``. Returns how many links acknowledged it (at least ``need``: committed and
        timed; fewer: the wait ended short, and the lane is revoked), -1 having sent nothing when a
        link has no room, -2 having sent nothing when the lane is revoked or a link left the engine
        (which revokes it)."""
        if self.revoked:
            return -2
        if not 0 <= epoch < 1 << 64:
            raise OverflowError(f"epoch {epoch} is not an unsigned 64-bit integer")
        if not 0 <= last_txid < 1 << 63:
            raise OverflowError(f"last_txid {last_txid} does not fit a commit notice (signed 64 bits)")
        notice = wire.encode_commit(epoch, last_txid)
        started = time.monotonic_ns()
        try:
            acked = self._fanout.sync_batch(self._links, frame, last_txid, self.need, notice, timeout, self._room)
        except ValueError:
            self.revoked = True  # raised before anything was sent: a link left the engine
            return -2
        if acked >= self.need:
            took = time.monotonic_ns() - started
            self._times[bisect.bisect_left(self._bounds, took)] += 1
            self._times_ns += took
            self.committed = max(self.committed, last_txid)
        elif acked >= 0:
            self.revoked = True
        return acked

    def times(self) -> tuple[list[int], float]:
        """``(counts, seconds)`` of every commit so far: how many took at most each of the engine's
        ``latency_bounds`` (one more count, last, for those above every bound), and their sum."""
        return list(self._times), self._times_ns / 1e9


class Receiver:
    """The node's end of one data-plane connection: hello, then runs of frames and commit notices.

    ``max_frame``: the largest frame (header included) taken; a larger one raises
    ResourceExhaustedError before any of it is buffered. ``memory``: the node's budget
    (``take(n)``, ``give(n)``); the buffer grows past its base (one receive chunk) only with bytes
    taken from it, and gives them back once the large frame is consumed, or on ``close``.
    """

    def __init__(
        self, sock: socket.socket, max_frame: int = FRAME_HEADER_SIZE + MAX_PAYLOAD, memory: Any = None
    ) -> None:
        self._sock = sock
        self._buf = bytearray()
        self._eof = False
        self._max_frame = max_frame
        self._memory = memory
        self._cap = _RECV  # the buffer never holds more than this; past _RECV it is budgeted
        self._closed = False
        self._tls: ssl.SSLSocket | None = None
        self._unsent = b""  # what a non-waiting ack could not send yet
        self._acked = 0

    def handshake(self, tls: TlsServer, timeout: float) -> None:
        """Run the node's side of the TLS handshake first, within ``timeout`` seconds in all; the
        connection is then read and answered through the session. A peer the session refuses (no
        certificate, another CA, expired, not TLS) raises TlsError; a timeout or a hang-up OSError."""
        if self._closed:
            raise OSError(errno.EBADF, "receiver is closed")
        if self._tls is not None:
            raise RuntimeError("the TLS handshake already ran")
        if timeout != timeout or timeout <= 0:
            raise ValueError("timeout must be > 0")
        # On a duplicate of the descriptor: wrapping takes the socket over, and the caller keeps its own.
        secured = tls.context.wrap_socket(self._sock.dup(), server_side=True, do_handshake_on_connect=False)
        secured.settimeout(timeout)
        try:
            secured.do_handshake()
        except ssl.SSLError as e:
            secured.close()
            raise TlsError(f"TLS handshake failed: {e}") from None
        except ConnectionError:
            secured.close()
            raise TlsError("the peer hung up during the TLS handshake") from None
        except BaseException:
            secured.close()
            raise
        secured.settimeout(None)  # the caller's SO_RCVTIMEO on the shared socket bounds each read
        self._tls = secured
        self._sock = secured

    def peer_certificate(self) -> bytes | None:
        """The peer's verified certificate (DER) after ``handshake``; None on a plaintext connection."""
        return None if self._tls is None else self._tls.getpeercert(binary_form=True)

    def send(self, data: bytes) -> None:
        """Send ``data`` whole to the peer (an ERROR message), through the session if any."""
        if self._unsent:
            data, self._unsent = self._unsent + data, b""
        try:
            self._sock.sendall(data)
        except ssl.SSLError as e:
            raise TlsError(f"TLS write failed: {e}") from None

    def flush(self) -> None:
        """Send, waiting, what ``ack(..., wait=False)`` left unsent (nothing to do: no system call)."""
        if self._unsent:
            self.send(b"")

    def close(self) -> None:
        """Give back the memory held past the base buffer; the receiver cannot be used after."""
        if not self._closed:
            self._closed = True
            if self._cap > _RECV and self._memory is not None:
                self._memory.give(self._cap - _RECV)
            self._cap = _RECV
            self._buf = bytearray()
            if self._tls is not None:
                self._tls.close()

    def _shrink(self) -> None:
        if self._cap > _RECV and len(self._buf) <= _RECV // 2:
            if self._memory is not None:
                self._memory.give(self._cap - _RECV)
            self._cap = _RECV
            self._buf = bytearray(self._buf)  # a fresh, small allocation

    def _fill(self, need: int = 0) -> None:
        if self._closed:
            raise OSError(errno.EBADF, "receiver is closed")
        cap = self._cap
        if cap < need or cap - len(self._buf) < _RECV // 4:
            cap = max(need, len(self._buf) + _RECV)
            cap = (cap + 65535) & ~65535
        if cap != self._cap:
            if self._memory is not None:
                self._memory.take(cap - self._cap)
            self._cap = cap
        try:
            chunk = self._sock.recv(min(_RECV, self._cap - len(self._buf)))
        except ssl.SSLWantReadError:  # SO_RCVTIMEO, as the native receiver reports it
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN)) from None
        except ssl.SSLError as e:
            raise TlsError(f"TLS session failed: {e}") from None
        if not chunk:
            self._eof = True
        self._buf += chunk

    def hello(self) -> str | None:
        """The journal id the writer names, or None if it hung up first."""
        while True:
            jlen = 0
            if len(self._buf) >= wire.HELLO.size:
                magic, version, jlen = wire.HELLO.unpack_from(self._buf)
                if magic != wire.HELLO_MAGIC or version != wire.WIRE_VERSION:
                    raise CorruptFrameError(f"bad data-plane hello {bytes(self._buf[:8])!r}", reason="wire")
                if len(self._buf) >= wire.HELLO.size + jlen:
                    jid = bytes(self._buf[wire.HELLO.size : wire.HELLO.size + jlen]).decode(errors="replace")
                    del self._buf[: wire.HELLO.size + jlen]
                    return jid
            if self._eof:
                return None
            self._fill(wire.HELLO.size + jlen)

    def _message_at(self, pos: int) -> tuple[bytes, int]:
        """The magic and whole length of the message at ``pos`` (4 bytes there), which may pass the
        buffer's end; a frame's header counts until it is all there. Raises CorruptFrameError (a
        bad magic or frame header) or ResourceExhaustedError (a frame past max_frame_bytes)."""
        buf = self._buf
        magic = bytes(buf[pos : pos + 4])
        if magic == _FRAME_MAGIC:
            if len(buf) - pos < FRAME_HEADER_SIZE:
                return magic, FRAME_HEADER_SIZE
            flen = decode_header(bytes(buf[pos : pos + FRAME_HEADER_SIZE])).frame_len
            if flen > self._max_frame:
                raise ResourceExhaustedError(
                    f"a frame of {flen} bytes is larger than this node takes ({self._max_frame} bytes, max_frame_bytes)"
                )
            return magic, flen
        if magic == wire.COMMIT_MAGIC:
            return magic, wire.COMMIT.size
        raise CorruptFrameError(f"unexpected data-plane message magic {magic!r}", reason="magic", offset=0)

    def next_run(self) -> tuple[list[bytes], list[tuple[int, int]]] | None:
        """Every complete frame and commit notice received so far, waiting for at least one.

        Returns ``(frames, commits)`` with ``commits`` as (epoch, txid) pairs, or None once the
        writer has hung up. A malformed message raises CorruptFrameError, after the messages
        before it have been returned.
        """
        while True:
            frames: list[bytes] = []
            commits: list[tuple[int, int]] = []
            buf = self._buf
            pos = 0
            need = 0
            try:
                while len(buf) - pos >= 4:
                    magic, n = self._message_at(pos)
                    if len(buf) - pos < n:
                        need = n
                        break
                    if magic == _FRAME_MAGIC:
                        frames.append(bytes(buf[pos : pos + n]))
                    else:
                        _, _, epoch, txid = wire.COMMIT.unpack_from(buf, pos)
                        commits.append((epoch, txid))
                    pos += n
            except (CorruptFrameError, ResourceExhaustedError):
                del buf[:pos]
                if frames or commits:
                    return frames, commits
                raise
            del buf[:pos]
            if frames or commits:
                self._shrink()
                return frames, commits
            if self._eof:
                return None
            self._fill(need)

    def wait_run(self) -> bool:
        """Wait until a whole message, or a malformed one, has been received; False once the writer
        has hung up without one. ``journal_run`` then takes what it can."""
        while True:
            need = 4
            if len(self._buf) >= 4:
                try:
                    need = self._message_at(0)[1]
                except (CorruptFrameError, ResourceExhaustedError):
                    return True  # for next_run to raise
            if len(self._buf) >= need:
                return True
            if self._eof:
                return False
            self._fill(need)

    def journal_run(self, gate: WriteGate) -> int:
        """The messages received so far that ``gate`` passes, in order: frames staged, then written,
        fdatasynced and acked (not waiting, as ``ack(txid, False)``) in one sync; commit notices
        noted in the gate. Never waits for the socket. Returns 1 when it took every whole message,
        0 when it stopped at one the gate does not pass (or a malformed one), which ``next_run``
        then returns (or raises) for the journal's own checks. Called under the journal's lock."""
        buf = self._buf
        pos = 0
        status = 1
        try:
            while len(buf) - pos >= 4:
                try:
                    magic, n = self._message_at(pos)
                except (CorruptFrameError, ResourceExhaustedError):
                    status = 0
                    break
                if len(buf) - pos < n:
                    break
                if magic == _FRAME_MAGIC:
                    taken = gate.stage(bytes(buf[pos : pos + n]))
                else:
                    _, _, epoch, txid = wire.COMMIT.unpack_from(buf, pos)
                    taken = gate.note(epoch, txid)
                if not taken:
                    status = 0
                    break
                pos += n
        finally:
            del buf[:pos]
        if gate.staged_txid:
            gate.sync(self._ack_now)
        if status:
            self._shrink()
        return status

    def _ack_now(self, txid: int) -> None:
        self.ack(txid, False)

    @property
    def acked(self) -> int:
        """The highest txid acked on this connection (0: none)."""
        return self._acked

    def ack(self, txid: int, wait: bool = True) -> bool:
        """Tell the writer everything through ``txid`` is durable; True once all of it is sent.

        ``wait=False`` never blocks (a caller holding the journal's lock must not wait on a peer
        that does not read): what the socket does not take at once is sent by ``flush``, or before
        anything sent after it, and False says so; more than 64 bytes (four acks) left unsent over
        plaintext is refused (RuntimeError): flush between runs. Through a TLS session it sends
        nothing at once (a non-blocking write of an ``ssl`` socket must be retried with the same
        bytes): all of it waits for ``flush``."""
        if not 0 <= txid < 1 << 64:
            raise OverflowError(f"txid {txid} out of range")
        data = wire.encode_ack(txid)
        self._acked = max(self._acked, txid)
        if wait:
            self.send(data)
            return True
        if self._tls is None and len(self._unsent) + len(data) > _UNSENT_MAX:
            raise RuntimeError("more left unsent than a receiver keeps (64 bytes of acks): flush between runs")
        if self._unsent or self._tls is not None:
            self._unsent += data
            return False
        try:
            sent = self._sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        self._unsent = data[sent:]
        return not self._unsent


def wire_layout() -> dict[str, dict[str, int]]:
    """The data-plane message layout as ``qjm.protocol.wire`` declares it; ``fanout_c.wire_layout()``
    reports the same dict from ``include/qjm/wire.h``."""
    return wire.layout()
