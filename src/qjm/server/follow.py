"""What a node pushes to a follower (design §3.1): committed frames as its committed txid advances.

The follower names the txid it needs next; the node answers with whole frames from there on that
it knows are committed (``Journal.committed_frames``), waiting on the journal's condition variable
(signalled when the committed txid advances, a segment is finalized or started) rather than
polling, and with a heartbeat carrying its committed txid when nothing moved for a while, so that
a follower notices a silent node. Plain Python over the ``Journal``; the gRPC servicer only
converts each piece to a message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from qjm._native import framing
from qjm.server.journal import Journal

# A message holds whole frames up to this many bytes (one frame may be larger on its own).
PUSH_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Pushed:
    """One message to a follower: frames holding ``first..last`` (empty on a heartbeat)."""

    frames: bytes
    first_txid: int
    last_txid: int
    committed_txid: int


def follow(journal: Journal, since: int, heartbeat: float, active: Callable[[], bool]) -> Iterator[Pushed]:
    """Committed frames of ``journal`` from txid ``since`` on, while ``active()``; a heartbeat every
    ``heartbeat`` seconds without news. Raises what ``Journal.committed_frames`` raises."""
    while active():
        got = journal.wait_committed_frames(since, PUSH_BYTES, heartbeat)
        if got is None:
            yield Pushed(b"", 0, 0, journal.committed_txid)
            continue
        data, first, last = got
        yield from _split(data, first, last, journal.committed_txid)
        since = last + 1


def _split(data: bytes, first: int, last: int, committed: int) -> Iterator[Pushed]:
    """``data`` in messages of whole frames, each at most ``PUSH_BYTES`` (or one frame)."""
    if len(data) <= PUSH_BYTES:
        yield Pushed(data, first, last, committed)
        return
    lo = pos = 0
    lo_txid = first
    while pos < len(data):
        h = framing.decode_header(data, pos)
        if pos > lo and pos + h.frame_len - lo > PUSH_BYTES:
            yield Pushed(data[lo:pos], lo_txid, h.first_txid - 1, committed)
            lo, lo_txid = pos, h.first_txid
        pos += h.frame_len
    yield Pushed(data[lo:], lo_txid, last, committed)
