"""``qjm demo``: the whole story on one machine, narrated.

Three JournalNodes start as real processes; a writer appends; one node is killed with SIGKILL and
the writer keeps committing on the remaining majority; a second writer takes over (fencing the
first and recovering the log by Paxos); the first writer finds itself fenced; the killed node comes
back and catches up at the next segment; a reader reads everything back and checks it.

The faults it makes are logged as warnings (a node unreachable, a writer fenced): the log goes to a
file in the demo's directory, which the narration names, so that it reads as one story.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator

from qjm.cli import main as cli_main
from qjm.client.reader import open_reader
from qjm.client.writer import open_writer
from qjm.errors import FencedError, QJMError
from qjm.testing.minicluster import MiniJournalCluster


def _step(n: int, text: str) -> None:
    print(f"\n[{n}] {text}", flush=True)


def _rec(i: int) -> bytes:
    return f"record {i:06d} ".encode() + hashlib.sha256(str(i).encode()).hexdigest().encode()


@contextlib.contextmanager
def _logging_to(path: str) -> Iterator[None]:
    """Send this process's log records to ``path`` instead of the terminal, at the levels and in the
    format already set."""
    root = logging.getLogger()
    saved = root.handlers[:]
    handler = logging.FileHandler(path)
    formatter = next((h.formatter for h in saved if h.formatter is not None), None)
    handler.setFormatter(formatter or logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.handlers[:] = [handler]
    try:
        yield
    finally:
        root.handlers[:] = saved
        handler.close()


def run_demo(records: int = 2000, workdir: str | None = None) -> int:
    """Narrate the demo on stdout; nodes' data and every log go under ``workdir`` (default: a new
    temporary directory), which is kept for a look afterwards."""
    workdir = workdir or tempfile.mkdtemp(prefix="qjm-demo-")
    log_path = os.path.join(workdir, "demo.log")
    print(f"qjm demo: the nodes' data and every log go to {workdir}/")
    print("    (demo.log for the writers and the reader, jn0.log-jn2.log for the nodes; the faults")
    print("    this demo makes show up there as warnings)")
    with _logging_to(log_path):
        code = _run(records, workdir)
    print(f"logs: {log_path} and {os.path.join(workdir, 'jn0.log')}-jn2.log")
    return code


def _run(records: int, workdir: str) -> int:
    t0 = time.monotonic()
    with MiniJournalCluster(3, workdir, journal_id="demo") as c:
        _step(1, f"three JournalNodes up (subprocesses): {', '.join(c.addresses)}")
        print(f"    journal URI: {c.uri}")

        _step(2, f"writer A: format, fence, start a segment, append {records} records")
        a = open_writer(c.uri, create=True)
        half = records // 2
        for i in range(1, half + 1):
            a.append(_rec(i))
        a.sync()
        print(f"    writer A holds epoch {a.epoch}; txids 1-{a.committed_txid} committed on a majority")

        _step(3, "SIGKILL node 2 in the middle of the stream; A keeps writing to the other two")
        for i in range(half + 1, half + 51):
            a.append(_rec(i))
        c.kill(2)
        for i in range(half + 51, records + 1):
            a.append(_rec(i))
        a.sync()
        print(f"    committed through txid {a.committed_txid} with node 2 down")

        _step(4, "node 2 restarts: a torn tail from the SIGKILL, if any, is cut (and kept aside)")
        c.start(2)
        print("    node 2 is back with A's segment as far as it got; A still writes to the majority")

        _step(5, "writer B opens the journal: new epoch (fences A), Paxos recovery of A's open segment")
        t = time.monotonic()
        b = open_writer(c.uri)
        took = 1000 * (time.monotonic() - t)
        print(f"    B won epoch {b.epoch} and recovered the log to txid {b.last_txid} in {took:.1f} ms")
        print("    (node 2 downloaded the recovered segment from the recovery source)")

        _step(6, "writer A tries to go on")
        a.append(b"this must never be read")
        try:
            a.sync()
            print("    ERROR: A was not fenced")
            return 1
        except FencedError as e:
            print(f"    A is fenced: {type(e).__name__} (its epoch {e.request_epoch} < promised {e.promised_epoch})")
        a.abort()

        _step(7, "B appends, rolls a segment, appends more, closes")
        start = b.last_txid + 1
        for i in range(start, start + 100):
            b.append(_rec(i))
        b.roll()
        for i in range(start + 100, start + 200):
            b.append(_rec(i))
        b.sync()
        last = b.last_txid
        b.close()
        print(f"    B wrote through txid {last} and finalized its segment")

        _step(8, "read everything back from the replicas and check every record")
        with open_reader(c.uri) as r:
            got = list(r)
        expect = [(i, _rec(i)) for i in range(1, last + 1)]
        if got != expect:
            bad = next((x for x, y in zip(got, expect, strict=False) if x != y), None)
            print(f"    MISMATCH: read {len(got)} records, expected {len(expect)}; first difference {bad}")
            return 1
        print(f"    read {len(got)} records, txids 1-{last}, all intact; A's fenced record is nowhere")
        try:
            _step(9, "qjm status")
            cli_main(["status", c.uri])
        except QJMError:
            pass
    print(f"\ndemo OK in {time.monotonic() - t0:.1f} s")
    return 0
