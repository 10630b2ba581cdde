"""``qjm bench``'s pipeline figures: how soon a follower in another process sees a commit, and how
much faster packed reading (``Reader.batches``) is than a Python object per record.

Tail staleness: the writer stamps each record with ``time.monotonic_ns()`` as its ``sync()``
returns; a ``Reader.tail()`` in another process (``python -m qjm.bench --worker tail``) stamps it
as it is yielded and prints both. CLOCK_MONOTONIC is one clock for every process on Linux, so the
difference is the staleness. Records go ``TAIL_GAP`` apart, so each is measured on its own (a
follower that is only behind, not slow, would show its backlog instead).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

from qjm._native import framing
from qjm.client.reader import open_reader
from qjm.client.record_batch import RecordBatch
from qjm.client.replicas import finalized_segments
from qjm.client.writer import Writer

TAIL_GAP = 0.005  # seconds between the staleness records
TAIL_READY = 60.0  # seconds for the follower process to start and see the first record


def tail_staleness(uri: str, w: Writer, rounds: int) -> list[float]:
    """Staleness in seconds of ``rounds`` records, each synced by ``w`` and yielded by a tail in
    another process."""
    first = w.last_txid + 1
    cmd = [sys.executable, "-m", "qjm.bench", "--worker", "tail", "--uri", uri, "--follow", str(first)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen: dict[int, int] = {}
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            txid, at = (int(x) for x in line.split())
            seen[txid] = at
            ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        w.append(b"ready")  # the follower is subscribed once it has yielded this one
        w.sync()
        if not ready.wait(TAIL_READY):
            raise RuntimeError("qjm bench: the tail process saw nothing")
        synced: dict[int, int] = {}
        for _ in range(rounds):
            time.sleep(TAIL_GAP)
            txid = w.append(b"x" * 100)
            w.sync()
            synced[txid] = time.monotonic_ns()
        last = w.last_txid
        deadline = time.monotonic() + TAIL_READY
        while last not in seen and time.monotonic() < deadline and reader.is_alive():
            reader.join(0.05)
        missing = [t for t in synced if t not in seen]
        if missing:
            raise RuntimeError(f"qjm bench: the tail process never yielded txids {missing[:5]}...")
        return [(seen[t] - at) / 1e9 for t, at in synced.items()]
    finally:
        proc.kill()
        proc.wait()


def worker_tail(uri: str, from_txid: int) -> None:
    """The follower of ``tail_staleness``: ``txid monotonic_ns`` per record yielded, until killed."""
    with open_reader(uri, from_txid) as r:
        for txid, _ in r.tail():
            print(txid, time.monotonic_ns(), flush=True)


def batches_speedup(uri: str, w: Writer, records: int) -> dict[str, Any]:
    """Reading ``records`` 100-byte records back, one Python object each and packed.

    End to end (``Reader`` iteration against ``Reader.batches``, each after a warm-up read) the
    transfer from the node bounds both; ``reader_batches_speedup`` is the ratio over the same
    frames once they have arrived (``decode_records`` into ``(txid, record)`` tuples, as the
    reader's iteration does, against ``pack_records`` into a ``RecordBatch``), what packing saves.
    """
    w.roll()
    first = w.last_txid + 1
    chunk = [os.urandom(100)] * 1000
    for _ in range(max(1, records // len(chunk))):
        w.append_many(chunk)
    segment = w.segment_txid
    w.roll()
    last = w.last_txid
    n = last - first + 1

    def per_record() -> float:
        t = time.perf_counter()
        with open_reader(uri, first) as r:
            got = sum(1 for txid, _ in r if txid <= last)
        assert got == n
        return n / (time.perf_counter() - t)

    def packed() -> float:
        t = time.perf_counter()
        got = 0
        with open_reader(uri, first) as r:
            for b in r.batches():
                got += len(b)
        assert got == n
        return n / (time.perf_counter() - t)

    # from a node that finalized it: one the writer dropped for lagging holds only part of it
    holder = next(s.nodes[0] for s in finalized_segments(w.qjm, first) if s.start == segment)
    seg = b"".join(w.qjm.loggers.by_name(holder).read_segment(segment))
    frames = framing.iter_frames(seg, segment)

    def decode_per_record() -> float:
        t = time.perf_counter()
        got = 0
        for h, pos in frames:
            for i, rec in enumerate(framing.decode_records(seg, pos)):
                got += (h.first_txid + i, rec)[0] > 0
        assert got == n
        return n / (time.perf_counter() - t)

    def decode_packed() -> float:
        t = time.perf_counter()
        got = 0
        for h, pos in frames:
            data, offsets = framing.pack_records(seg, pos)
            got += len(RecordBatch(h.first_txid, data, offsets))
        assert got == n
        return n / (time.perf_counter() - t)

    per_record(), packed()  # warm-up: the page cache, the channels
    return {
        "reader_records_rps": max(per_record() for _ in range(2)),
        "reader_batches_rps": max(packed() for _ in range(2)),
        "reader_batches_speedup": max(decode_packed() for _ in range(3)) / max(decode_per_record() for _ in range(3)),
    }
