"""Helpers for scripted protocol scenarios (Hadoop QJMTestUtil) and for looking at a node's files.

``ScriptedWriter`` drives a ``QuorumJournalManager`` batch by batch, so a test can place every
fault exactly; ``inspect_journal`` reads a node's directory without locking it, so a running node
can be checked against the tables of the design document.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qjm._native import framing
from qjm.client.loggers import CallHooks
from qjm.client.manager import QuorumJournalManager
from qjm.config import QJMConfig
from qjm.errors import CorruptFrameError
from qjm.protocol.frame import SEGMENT_HEADER_SIZE
from qjm.security.tls import TlsConfig
from qjm.server.durable_long import read_long_file
from qjm.testing.faults import FaultPlan

if TYPE_CHECKING:
    from qjm.client.writer import Writer


SETTLE_TIMEOUT = 60.0  # bounds a wait for something that takes well under a second on an idle machine


def eventually(condition: Callable[[], bool], timeout: float = SETTLE_TIMEOUT, what: str = "condition") -> None:
    """Wait until ``condition()`` holds, failing after ``timeout``: for outcomes a quorum wait does
    not cover (a minority node's reply lands after the majority returned, a process exits). The
    bound is generous because it only decides how long a broken run takes to fail: a loaded CI
    machine can stall a thread for seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        pause.wait(0.002)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes from ``sock``; the peer closing first fails the test."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, f"peer closed after {len(buf)} of {n} bytes"
        buf += chunk
    return bytes(buf)


def closed_by_peer(s: socket.socket, within: float) -> bool:
    """True once the peer closes ``s`` (EOF or reset) within ``within`` seconds; whatever it sends
    before (an alert, a reply) is read and skipped. False if it still holds ``s`` open then."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        s.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            if not s.recv(4096):
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False


def client_hello(tls: TlsConfig) -> bytes:
    """The first flight of a real TLS client of ``tls``: its ClientHello, to send by hand."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = tls.client_ssl_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        conn.do_handshake()
    except ssl.SSLWantReadError:
        return outgoing.read()
    raise AssertionError("a TLS handshake finished without a peer")


def ops(plan: FaultPlan, op: str) -> int:
    """How many ``op`` calls ``plan`` has seen start, to any node."""
    return sum(k for (_, o), k in plan.calls.items() if o == op)


def ops_reach(plan: FaultPlan, op: str, n: int) -> int:
    """How many ``op`` calls have started once ``n`` have: a quorum call returns at a majority, and
    the last node's call runs on that node's own thread whenever it is scheduled."""
    eventually(lambda: ops(plan, op) >= n, what=f"{n} {op} calls")
    return ops(plan, op)


def txn_data(txid: int) -> bytes:
    """The record a scripted writer stores at ``txid``: recognisable and checkable."""
    return b"txn-%d-" % txid + hashlib.blake2b(b"%d" % txid, digest_size=8).hexdigest().encode()


class ScriptedWriter:
    """A writer whose every step is explicit: ``start``, ``write(first, last)``, ``finalize``."""

    def __init__(self, uri: str, *, hooks: CallHooks | None = None, config: QJMConfig | None = None) -> None:
        self.qjm = QuorumJournalManager(uri, hooks=hooks, config=config or QJMConfig().with_timeouts(
            write_txns=10, start_segment=10, finalize_segment=10, new_epoch=10, get_journal_state=10,
            prepare_recovery=10, accept_recovery=10, operations=10,
        ))  # fmt: skip
        self.segment = 0

    def recover(self) -> int:
        """Fence and recover; returns the last txid of the recovered log."""
        return self.qjm.recover_unfinalized_segments()

    def start(self, txid: int) -> None:
        self.qjm.start_log_segment(txid)
        self.segment = txid

    def write(self, first: int, last: int, *, wait_all: bool = False) -> int:
        """One batch holding txids first..last, sent to every node; waits for a quorum (or all)."""
        frame = framing.encode_frame(
            [txn_data(t) for t in range(first, last + 1)],
            epoch=self.qjm.epoch,
            segment_txid=self.segment,
            first_txid=first,
        )
        call = self.qjm.send_batch(frame, first, last)
        if wait_all:
            call.wait_for_all(self.qjm.config.timeouts.write_txns, f"journal({first}-{last})")
        else:
            call.wait_for_write_quorum(self.qjm.config.timeouts.write_txns, f"journal({first}-{last})")
        self.qjm.set_committed_txid(last)
        return last

    def finalize(self, start: int, end: int) -> None:
        self.qjm.finalize_log_segment(start, end)

    def settle(self, timeout: float = SETTLE_TIMEOUT) -> None:
        """Wait until every node has run the control calls queued to it so far (each node's calls
        run in order, so one more answered by all three says so). A step waits for a majority only:
        without this, a fault a scenario adds next can strike a call still queued to the slowest
        node rather than the next one it means."""
        self.qjm.loggers.call(lambda lg: lg.get_journal_state()).wait_for_all(timeout, "get_journal_state (settle)")

    def close(self, grace: float = SETTLE_TIMEOUT) -> None:
        """Release the nodes, first letting calls already queued to live nodes finish (bounded):
        a scenario then reads every node's files, not only a majority's."""
        self.qjm.close(grace=grace)


_SEG = re.compile(r"edits_(?:inprogress_(\d{19})|(\d{19})-(\d{19}))(\..*)?")


@dataclass
class NodeView:
    """A node's journal as its files say: what the design document's tables show."""

    segments: dict[str, int] = field(default_factory=dict)  # file name → last valid txid in it
    promised_epoch: int = 0
    writer_epoch: int = 0
    accepted: dict[int, tuple[int, int]] = field(default_factory=dict)  # segment → (end txid, accepted in epoch)

    def plain(self) -> dict[str, int]:
        """Only the segments a node would serve (no moved-aside files)."""
        return {k: v for k, v in self.segments.items() if "." not in k}

    def aside(self) -> list[str]:
        return sorted(k for k in self.segments if "." in k)


def inspect_journal(current_dir: str) -> NodeView:
    v = NodeView()
    for name in sorted(os.listdir(current_dir)):
        m = _SEG.fullmatch(name)
        if not m:
            continue
        start = int(m.group(1) or m.group(2))
        with open(os.path.join(current_dir, name), "rb") as f:
            data = f.read()
        try:
            framing.decode_segment_header(data)
            last = framing.scan(data, start, SEGMENT_HEADER_SIZE).last_txid
        except CorruptFrameError:
            last = start - 1
        v.segments[name] = last
    for key, fname in (("promised_epoch", "last-promised-epoch"), ("writer_epoch", "last-writer-epoch")):
        value = read_long_file(os.path.join(current_dir, fname))  # the node's own reader: any format
        if value is not None:
            setattr(v, key, value)
    pdir = os.path.join(current_dir, "paxos")
    if os.path.isdir(pdir):
        for name in os.listdir(pdir):
            if name.isdigit():
                with open(os.path.join(pdir, name)) as f:
                    _start, end, _inprog, epoch, *_ = f.readline().split()
                v.accepted[int(name)] = (int(end), int(epoch))
    return v


def segment_frames(path: str) -> bytes:
    """A segment file's frames (header excluded), to compare replicas byte for byte."""
    with open(path, "rb") as f:
        data = f.read()
    h = framing.decode_segment_header(data)
    res = framing.scan(data, h.start_txid, SEGMENT_HEADER_SIZE)
    return data[SEGMENT_HEADER_SIZE : res.valid_end]


def read_all(
    uri: str, from_txid: int = 1, *, include_in_progress: bool = False, tls: TlsConfig | None = None
) -> list[tuple[int, bytes]]:
    """Every committed record a fresh reader returns, its connections released afterwards."""
    from qjm.client.reader import open_reader

    r = open_reader(uri, from_txid, include_in_progress=include_in_progress, tls=tls)
    try:
        return list(r)
    finally:
        r.qjm.close()


def wait_for_every_node(writer: Writer, timeout: float = SETTLE_TIMEOUT) -> None:
    """Wait until every node has answered every batch ``writer`` sent: a sync returns at a majority,
    and a test that needs the same copy on all nodes (before an abort, say) must not race the last."""
    deadline = time.monotonic() + timeout
    for lg in writer.qjm.loggers.loggers:
        wait_for_start = getattr(lg, "wait_for_start", None)
        if wait_for_start is not None:  # a node still starting its segment holds the batches back
            wait_for_start(max(0.0, deadline - time.monotonic()))
        wait_for_batches = getattr(lg, "wait_for_batches", None)
        if wait_for_batches is not None:
            wait_for_batches(max(0.0, deadline - time.monotonic()))
