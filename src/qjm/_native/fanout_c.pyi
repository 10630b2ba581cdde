"""Stub of the compiled data plane; same API as ``fanout_py`` (checked by mypy.stubtest)."""

import os
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from typing_extensions import disjoint_base

from qjm._native.gate_c import WriteGate

ACK_SIZE: Final[int]
MAX_WINDOW_COUNT: Final[int]

@disjoint_base
class Lane:
    """``Fanout.sync_batch`` bound to one writer's links, quorum and queue limit: each ``commit``
    encodes the batch's commit notice, sends, waits and times the commit in one call. Good until
    ``revoke``, or until a commit finds a link gone or its wait short of a quorum."""

    def __init__(self, fanout: Fanout, links: Iterable[int], need: int, room: int = 0) -> None: ...
    @property
    def need(self) -> int: ...
    @property
    def revoked(self) -> bool: ...
    @property
    def committed(self) -> int:
        """The highest last_txid a commit made durable."""
    @property
    def links(self) -> tuple[int, ...]: ...
    def revoke(self) -> None:
        """End the lane: every later ``commit`` returns -2 having done nothing."""
    def commit(self, frame: bytes, last_txid: int, epoch: int, timeout: float) -> int:
        """Returns how many links acknowledged ``frame`` (at least ``need``: committed; fewer: the
        wait ended short, and the lane is revoked), -1 having sent nothing when a link has no room,
        -2 having sent nothing when the lane is revoked or a link left the engine."""
    def times(self) -> tuple[list[int], float]:
        """``(counts, seconds)`` of every commit so far, per latency bound of the engine (+Inf last)."""

@disjoint_base
class TlsClient:
    """A writer's side of data-plane TLS: its certificate chain and key (PEM files) and the CA
    certificates it trusts; TLS 1.3 (as ``qjm.security.tls``), the node's certificate always verified."""

    def __init__(
        self, ca_file: str | os.PathLike[str], cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]
    ) -> None:
        """A file that cannot be loaded, or a key that does not match the certificate, raises ConfigError."""

@disjoint_base
class TlsServer:
    """A node's side of data-plane TLS: its certificate chain and key (PEM files) and the CA whose
    certificates it accepts; TLS 1.3, a client certificate signed by that CA required."""

    def __init__(
        self, ca_file: str | os.PathLike[str], cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]
    ) -> None:
        """A file that cannot be loaded, or a key that does not match the certificate, raises ConfigError."""

@disjoint_base
class Fanout:
    """Pipelined sender to many nodes: one epoll loop, one non-blocking connection per link."""

    def __init__(
        self, park_seconds: float = 0.002, latency_bounds: Iterable[float] = (), keep_notice_seconds: float = 0.0002
    ) -> None: ...
    def add_link(
        self,
        sock: socket.socket,
        *,
        max_count: int = 1048576,
        max_bytes: int = 4611686018427387904,
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

    def send(self, link: int, frame: bytes, last_txid: int = 0, prefix: bytes | None = None) -> int:
        """Queue ``prefix`` (if any) then ``frame``; a frame with ``last_txid`` > 0 awaits its ack.

        Returns 0 when queued, 1 when the link's window was full (nothing queued; the link fails),
        -1 when the link has failed. Failures (a full window, a write error) are reported by
        ``run``'s callback, never raised here.
        """

    def remove(self, link: int) -> None:
        """Forget a link: stop watching its socket and drop what is queued. The caller closes the socket."""

    def acked(self, link: int) -> int:
        """Highest txid the node has acknowledged as durable on this link."""

    def take_latencies(self, link: int) -> tuple[list[int], float]:
        """``(counts, seconds)``: how many frames the node acknowledged since the last call, per
        ``latency_bounds`` bound their ack latency fell under (one more count, last, for those
        above every bound), and the sum of those latencies; the counts start again from zero."""

    def inflight(self, link: int) -> tuple[int, int]:
        """(frames, bytes) sent or queued on this link and not yet acknowledged."""

    def quorum_txid(self, links: Iterable[int]) -> int:
        """Highest txid acknowledged by a majority of ``links`` (0 when none or no majority has one)."""

    def news(self) -> int:
        """A counter that grows whenever a link's acked advances, a link fails, or ``notify`` runs."""

    def wait_news(self, seen: int, timeout: float) -> bool:
        """Block (without the GIL) until ``news()`` differs from ``seen``, at most ``timeout`` seconds.

        Returns whether it differs. Read ``news()`` before looking at the state you wait on, then
        pass it here: news that arrived in between is never missed.
        """

    def notify(self) -> None:
        """Bump ``news()`` and wake every ``wait_news`` (Python calls it when its own state changed)."""

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
        """Send ``frame`` on each of ``links`` (as ``send`` does, awaiting ``last_txid``), wait without
        the GIL until ``need`` of them have acknowledged ``last_txid``, then queue ``notice`` (if not
        None) on each of them. Returns how many had acknowledged it. The waiting thread reads the
        links' acks itself: no ``run`` loop is needed for the quorum. A link it leaves parked keeps
        the notice for its next send (the node reads it just ahead of that send's bytes), or until
        ``run`` releases the link idle (``park_seconds``), when this call came within
        ``keep_notice_seconds`` of the one before on the link. ``room`` > 0: a link with
        unacknowledged bytes that ``frame`` would take past ``room``, or with its window's frames
        all in flight, makes it return -1 having sent nothing."""

    def lane(self, links: Iterable[int], need: int, room: int = 0) -> Lane:
        """A ``Lane``: ``sync_batch`` over ``links`` for a writer committing batch after batch.
        An unknown link raises ValueError."""

    def run(self, callback: Callable[[int, int, str, object], None]) -> None:
        """Serve every link until ``stop``; ``callback(link, acked, code, detail)`` reports news.

        ``code`` is ``""`` (acked advanced), ``"reply"`` (the node sent an ERROR or something
        unparseable: ``detail`` holds those bytes), ``"eof"``, ``"oserror"`` (``detail`` = errno) or
        ``"window"`` (a send found the in-flight window full), ``"tls"`` (the link's TLS session
        failed: ``detail`` is the reason, as text).
        """

    def stop(self) -> None:
        """Make ``run`` return (from any thread); a stop before ``run`` makes it return at once."""

    def close(self) -> None:
        """Remove every link and release the epoll instance; ``run`` must have returned."""

    @property
    def closed(self) -> bool: ...

@disjoint_base
class Receiver:
    """The node's end of one data-plane connection: hello, then runs of frames and commit notices."""

    def __init__(self, sock: socket.socket, max_frame: int = ..., memory: object | None = None) -> None:
        """``max_frame``: the largest frame (header included) this connection takes; a larger one
        raises ResourceExhaustedError before any of it is buffered. ``memory``: the node's budget, with
        ``take(n)`` (may raise ResourceExhaustedError) and ``give(n)`` (``qjm.server.frame_memory``);
        the buffer grows past its base (one receive chunk) only with bytes taken from it, and gives
        them back once the large frame is consumed or on ``close``."""

    def handshake(self, tls: TlsServer, timeout: float) -> None:
        """Run the node's side of the TLS handshake first, within ``timeout`` seconds in all; the
        connection is then read and answered through the session. A peer the session refuses (no
        certificate, another CA, expired, not TLS) raises TlsError; a timeout or a hang-up OSError."""

    def peer_certificate(self) -> bytes | None:
        """The peer's verified certificate (DER) after ``handshake``; None on a plaintext connection."""

    def send(self, data: bytes) -> None:
        """Send ``data`` whole to the peer (an ERROR message), through the session if any."""

    def close(self) -> None:
        """Give back the memory held past the base buffer; the receiver cannot be used after."""

    def hello(self) -> str | None:
        """The journal id the writer names, or None if it hung up first."""

    def next_run(self) -> tuple[list[bytes], list[tuple[int, int]]] | None:
        """Every complete frame and commit notice received so far, waiting for at least one.

        Returns ``(frames, commits)`` with ``commits`` as (epoch, txid) pairs, or None once the
        writer has hung up. A malformed message raises CorruptFrameError, after the messages
        before it have been returned.
        """

    def wait_run(self) -> bool:
        """Wait (the GIL released) until a whole message, or a malformed one, has been received;
        False once the writer has hung up without one. ``journal_run`` then takes what it can."""

    def journal_run(self, gate: WriteGate) -> int:
        """The messages received so far that ``gate`` passes, in order: frames staged, then written,
        fdatasynced and acked (not waiting, as ``ack(txid, False)``) in one sync; commit notices
        noted in the gate. Never waits for the socket. Returns 1 when it took every whole message,
        0 when it stopped at one the gate does not pass (or a malformed one), which ``next_run``
        then returns (or raises) for the journal's own checks. Called under the journal's lock."""

    @property
    def acked(self) -> int:
        """The highest txid acked on this connection (0: none)."""

    def ack(self, txid: int, wait: bool = True) -> bool:
        """Tell the writer everything through ``txid`` is durable; True once all of it is sent.

        ``wait=False`` never blocks (a caller holding the journal's lock must not wait on a peer
        that does not read): what the socket does not take at once is sent by ``flush``, or before
        anything sent after it, and False says so; more than 64 bytes (four acks) left unsent over
        plaintext is refused (RuntimeError): flush between runs."""

    def flush(self) -> None:
        """Send, waiting, what ``ack(..., wait=False)`` left unsent (nothing to do: no system call)."""

def wire_layout() -> dict[str, dict[str, int]]:
    """Field offsets and sizes of the data-plane message headers, and the constants, from include/qjm/wire.h."""
