"""The operator's ``qjm`` commands: run a JournalNode, format, inspect and tail journals, dump segments.

These commands work on real nodes and journal files. The ones that start clusters or simulations of
their own (``cluster up``, ``demo``, ``bench``, ``sim``, ``faultsim``, ``chaos``) are
``qjm.testing.cli``'s, and ``qjm.__main__`` builds the ``qjm`` command from both sides, each adding
its subcommands with its ``register``. The split is a module boundary rather than harness imports
deferred into function bodies because it reads better: this file's imports say all an operator's
command depends on, and what a node started by ``qjm journalnode`` can do is what it shows here --
it has no fault option, no hook but the protocol's own. Fault injection reaches a node only through
the harness: ``qjm.testing.node`` serves one the way ``serve_node`` does, with ``ServerFaults``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from qjm._native import framing
from qjm.client.manager import QuorumJournalManager
from qjm.client.reader import open_reader
from qjm.errors import QJMError
from qjm.protocol.frame import SEGMENT_HEADER_SIZE
from qjm.server.journal import JournalHooks
from qjm.server.node import JournalNode

AddCommand = Callable[..., argparse.ArgumentParser]
"""``add_parser`` of the ``qjm`` command's subcommands: ``add(name, help=...)`` returns its parser."""
Register = Callable[[AddCommand], None]


def add_node_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a JournalNode process."""
    p.add_argument("--data-dir", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--rpc-port", type=int, default=8485)
    p.add_argument("--data-port", type=int, default=8486)
    p.add_argument("--ready-line", action="store_true", help="print READY ... on stdout once serving")


def serve_node(a: argparse.Namespace, hooks: JournalHooks | None = None) -> int:
    """Serve a JournalNode with the options of ``add_node_arguments`` until SIGTERM or SIGINT."""
    node = JournalNode(a.data_dir, host=a.host, rpc_port=a.rpc_port, data_port=a.data_port, hooks=hooks).start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    msg = f"READY rpc={node.rpc_address} data={node.data_address}"
    if a.ready_line:
        print(msg, flush=True)
    else:
        logging.getLogger("qjm").info(msg)
    done.wait()
    node.stop(grace=1.0)
    return 0


def _format(a: argparse.Namespace) -> int:
    with QuorumJournalManager(a.uri) as m:
        m.format(force=a.force)
    print(f"formatted {a.uri}")
    return 0


def _status(a: argparse.Namespace) -> int:
    with QuorumJournalManager(a.uri) as m:
        rows = []
        for lg in m.loggers.loggers:
            try:
                st = lg.status().result(timeout=m.config.timeouts.connect)  # type: ignore[attr-defined]
            except Exception as e:
                rows.append({"node": lg.name, "error": f"{type(e).__name__}: {e}"})
                continue
            rows.append({"node": lg.name, **st})
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    highest = max((int(r.get("highest_written_txid", 0)) for r in rows if "error" not in r), default=0)
    print(f"{'node':<22} {'promised':>8} {'writer':>6} {'committed':>10} {'written':>10} {'lag':>6}  segments")
    for r in rows:
        if "error" in r:
            print(f"{r['node']:<22} DOWN: {r['error']}")
            continue
        segs: list[object] = list(r.get("segments") or [])
        shown = ", ".join(str(s).replace("edits_", "") for s in segs[-3:])
        more = f" (+{len(segs) - 3} older)" if len(segs) > 3 else ""
        written = int(str(r["highest_written_txid"]))
        print(
            f"{r['node']:<22} {r['promised_epoch']:>8} {r['writer_epoch']:>6} {r['committed_txid']:>10} "
            f"{written:>10} {highest - written:>6}  {shown}{more}"
        )
    return 0


def _tail(a: argparse.Namespace) -> int:
    r = open_reader(a.uri, a.from_txid, include_in_progress=True)
    it = r.tail() if a.follow else iter(r)
    try:
        for txid, rec in it:
            text = rec.decode("utf-8", "backslashreplace") if not a.hex else rec.hex()
            print(f"{txid}\t{text}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        r.qjm.close()
    return 0


def _dump(a: argparse.Namespace) -> int:
    with open(a.file, "rb") as f:
        data = f.read()
    try:
        h = framing.decode_segment_header(data)
    except QJMError as e:
        print(f"{a.file}: not a qjm segment: {e}")
        return 1
    print(f"segment {a.file}: start txid {h.start_txid}, started by epoch {h.epoch}, {len(data)} bytes")
    res = framing.scan(data, h.start_txid, SEGMENT_HEADER_SIZE)
    for fh, off in framing.iter_frames(data, h.start_txid, SEGMENT_HEADER_SIZE):
        print(
            f"  @{off:<10} frame epoch {fh.epoch} txids {fh.first_txid}-{fh.last_txid} "
            f"({fh.record_count} records, {fh.payload_len} bytes, xxh3 {fh.payload_xxh3:016x})"
        )
        if a.records:
            for i, rec in enumerate(framing.decode_records(data, off)):
                print(f"      {fh.first_txid + i}: {rec[:60]!r}{'...' if len(rec) > 60 else ''}")
    print(
        f"  {res.frame_count} frames, last txid {res.last_txid}, tail {res.tail}"
        + (f": {res.error}" if res.error else "")
    )
    return 0 if res.tail == "clean" else 2


def register(add: AddCommand) -> None:
    """Add the operator's commands to the ``qjm`` command."""
    s = add("journalnode", help="run a JournalNode")
    add_node_arguments(s)
    s.set_defaults(fn=serve_node)

    s = add("format", help="format a journal on every node")
    s.add_argument("uri")
    s.add_argument("--force", action="store_true", help="wipe existing data")
    s.set_defaults(fn=_format)

    s = add("status", help="per-node epochs, segments, committed txid and lag")
    s.add_argument("uri")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=_status)

    s = add("tail", help="print committed records")
    s.add_argument("uri")
    s.add_argument("--from", dest="from_txid", type=int, default=1)
    s.add_argument("-f", "--follow", action="store_true")
    s.add_argument("--hex", action="store_true")
    s.set_defaults(fn=_tail)

    s = add("dump", help="show the frames of a segment file")
    s.add_argument("file")
    s.add_argument("--records", action="store_true")
    s.set_defaults(fn=_dump)


def build_parser(*groups: Register) -> argparse.ArgumentParser:
    """The ``qjm`` parser with the subcommands each of ``groups`` registers."""
    p = argparse.ArgumentParser(prog="qjm", description="qjm: a replicated, fenced write-ahead log")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = p.add_subparsers(dest="cmd", required=True)
    for group in groups:
        group(sub.add_parser)
    return p


def main(argv: Sequence[str] | None = None, groups: Sequence[Register] = (register,)) -> int:
    """Run one ``qjm`` command; ``groups`` register the commands there are (the operator's alone here)."""
    a = build_parser(*groups).parse_args(argv)
    level = logging.INFO if a.verbose or a.cmd == "journalnode" else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(a.fn(a))
    except QJMError as e:
        print(f"qjm {a.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        os._exit(0)
