"""The read-committed view: which txids belong to Spark writes that never committed.

Every write task of the sink opens its own fenced writer, so its records fill whole segments: the
first one starts with a ``begin`` marker, segments it rolls to carry its epoch, and a retried
attempt that goes on with the batch starts its segment with a ``resume`` marker. The driver then
writes ``commit`` (or ``abort``) alone in a segment of its own. So segment heads (``Head``: the
first frame of each segment) are enough to find every transaction and its fate, without reading
the records in between:

* a ``begin`` head opens a transaction; heads of the same epoch or a matching ``resume`` extend it;
* the first head after it decides it: committed if that head is its ``commit``, aborted otherwise;
* with no head after it, it is still open: hidden, and a stream waits at its start (Kafka's last
  stable offset).

A marker of version 1 (written before commit markers existed) opens no transaction: such writes
stay visible, as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from qjm.spark.journal import Head

State = Literal["open", "committed", "aborted"]


@dataclass(slots=True)
class Transaction:
    """Txids ``start..end`` written for batch ``batch`` of ``tag`` (``end`` may be ``OPEN_END``)."""

    tag: str
    batch: int
    start: int
    end: int
    state: State = "open"


def transactions(heads: Sequence[Head]) -> list[Transaction]:
    """Every transaction the heads show, oldest first, each with its state."""
    out: list[Transaction] = []
    cur: Transaction | None = None
    epoch = -1
    for h in heads:
        m = h.marker
        if cur is not None:
            resumes = m is not None and m.kind == "resume" and (m.tag, m.batch) == (cur.tag, cur.batch)
            if h.epoch == epoch or resumes:
                cur.end, epoch = h.end, h.epoch
                continue
            commits = m is not None and m.kind == "commit" and (m.tag, m.batch) == (cur.tag, cur.batch)
            cur.state = "committed" if commits else "aborted"
            cur = None
        if m is not None and m.kind == "begin" and m.version > 1:
            cur = Transaction(m.tag, m.batch, h.start, h.end)
            out.append(cur)
            epoch = h.epoch
    return out


def hidden_ranges(txns: Sequence[Transaction]) -> list[tuple[int, int]]:
    """The txid ranges a read-committed reader skips: every transaction not committed."""
    return [(t.start, t.end) for t in txns if t.state != "committed"]


def stable_end(txns: Sequence[Transaction], nxt: int, end: int) -> int:
    """``end`` capped before the first open transaction that reaches ``nxt`` (a stream waits there)."""
    for t in txns:
        if t.state == "open" and t.end >= nxt:
            return min(end, max(t.start, nxt) - 1)
    return end


def subtract(bounds: Sequence[tuple[int, int]], hidden: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``bounds`` (sorted, disjoint, inclusive) without the txids of ``hidden``."""
    out: list[tuple[int, int]] = []
    for lo, hi in bounds:
        for a, b in sorted(hidden):
            if b < lo or a > hi:
                continue
            if a > lo:
                out.append((lo, a - 1))
            lo = b + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return out
