"""The ``qjm`` command: run a JournalNode, format, inspect and tail journals, try it out locally."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from qjm.errors import QJMError


def _journalnode(a: argparse.Namespace) -> int:
    from qjm.server.limits import NodeLimits
    from qjm.server.node import JournalNode
    from qjm.testing.faults import ServerFaults

    hooks = ServerFaults.parse(a.fault) if a.fault else None
    given = {
        "max_open_journals": a.max_open_journals,
        "max_data_connections": a.max_data_connections,
        "frame_memory": a.frame_memory_mb * 1024 * 1024 if a.frame_memory_mb is not None else None,
        "idle_timeout": a.idle_timeout,
    }
    limits = NodeLimits(**{k: v for k, v in given.items() if v is not None})
    node = JournalNode(
        a.data_dir, host=a.host, rpc_port=a.rpc_port, data_port=a.data_port, hooks=hooks, limits=limits
    ).start()
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
    from qjm.client.manager import QuorumJournalManager

    with QuorumJournalManager(a.uri) as m:
        m.format(force=a.force)
    print(f"formatted {a.uri}")
    return 0


def _status(a: argparse.Namespace) -> int:
    from qjm.client.manager import QuorumJournalManager

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
    from qjm.client.reader import open_reader

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
    from qjm._native import framing
    from qjm.protocol.frame import SEGMENT_HEADER_SIZE

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


def _cluster_up(a: argparse.Namespace) -> int:
    from qjm.testing.minicluster import MiniJournalCluster

    with MiniJournalCluster(a.nodes, a.dir, journal_id=a.journal) as c:
        print(f"{a.nodes} JournalNodes up; data in {c.base_dir}")
        print(f"URI: {c.uri}")
        print("Ctrl-C to stop.", flush=True)
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        try:
            done.wait()
        except KeyboardInterrupt:
            pass
    return 0


def _demo(a: argparse.Namespace) -> int:
    from qjm.demo import run_demo

    return run_demo(records=a.records)


def _bench(a: argparse.Namespace) -> int:
    from qjm.bench import run

    run(smoke=a.smoke, json_out=a.json, plot=a.plot, peers=a.peers)
    return 0


def _sim(a: argparse.Namespace) -> int:
    """Replay one simulator seed (or run the double-failure sweep / the small-world search)."""
    from qjm.testing.bugs import ProtocolBugs

    if not a.verbose:
        logging.getLogger("qjm").setLevel(logging.ERROR)  # torn tails are expected in a fault run
    bugs = ProtocolBugs.parse(a.bugs)
    if a.sweep:
        from qjm.testing.exhaustive import double_failure_sweep

        sw = double_failure_sweep(bugs=bugs)
        print(f"double-failure sweep: {sw.runs} runs, calls per node {sw.calls_per_node}, {sw.acked_txids} txids "
              f"acknowledged, {len(sw.violations)} violations, {sw.seconds:.1f}s")  # fmt: skip
        for plan, r in sw.violations[:5]:
            print(f"  faults {plan}: {r.violation}")
        return 0 if sw.ok else 1
    if a.explore:
        from qjm.testing.exhaustive import explore, small_worlds

        bad = 0
        for w in small_worlds():
            e = explore(w, bugs=bugs, time_limit=a.time_limit)
            done = "complete" if e.complete else f"stopped after {a.time_limit:g}s"
            print(f"{w.name}: {e.states} states, {e.runs} executions, {e.seconds:.1f}s, {done}, "
                  f"{len(e.violations)} violations")  # fmt: skip
            for _path, r in e.violations:
                bad += 1
                print(f"  {r.violation}")
                if a.trace:
                    print("\n".join("    " + t for t in r.trace))
        return 1 if bad else 0
    from qjm.testing.sim import run_seed

    if a.seed is None:
        print("qjm sim: give --seed N (or --sweep / --explore)", file=sys.stderr)
        return 2
    r = run_seed(a.seed, steps=a.steps, bugs=bugs, keep_trace=True)
    if a.trace:
        print("\n".join(r.trace))
    verdict = "ok" if r.ok else f"VIOLATION: {r.violation}"
    print(f"seed {a.seed}: {verdict}")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(r.stats.items()) if v))
    return 0 if r.ok else 1


def _faultsim(a: argparse.Namespace) -> int:
    """Many simulator seeds over Spark (or a local process pool without pyspark)."""
    from qjm.testing.faultsim import parse_range, run_faultsim

    rep = run_faultsim(
        parse_range(a.seeds), master=a.master, steps=a.steps, bugs=a.bugs, batch=a.batch,
        use_spark=False if a.local else None,
    )  # fmt: skip
    print(rep.summary())
    return 0 if not rep.failures else 1


def _chaos(a: argparse.Namespace) -> int:
    """Writer processes and JournalNodes killed and paused at random; verify every acknowledged txid."""
    from qjm.testing.chaos import ChaosConfig, parse_duration, run_chaos

    cfg = ChaosConfig(
        duration=parse_duration(a.duration), writers=a.writers, nodes=a.nodes, seed=a.seed, proxy=not a.no_proxy,
        base_dir=a.dir,
    )  # fmt: skip
    rep = run_chaos(cfg, out=sys.stderr)
    print(rep.summary())
    return 0 if rep.ok else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qjm", description="qjm: a replicated, fenced write-ahead log")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("journalnode", help="run a JournalNode")
    s.add_argument("--data-dir", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--rpc-port", type=int, default=8485)
    s.add_argument("--data-port", type=int, default=8486)
    s.add_argument("--fault", default="", help=argparse.SUPPRESS)
    s.add_argument("--ready-line", action="store_true", help="print READY ... on stdout once serving")
    s.add_argument("--max-open-journals", type=int, help="journals open at once; idle ones are closed (default 64)")
    s.add_argument("--max-data-connections", type=int, help="data-plane connections at once (default 256)")
    s.add_argument("--frame-memory-mb", type=int, help="MiB for unfinished frames, all connections (default 256)")
    s.add_argument(
        "--idle-timeout", type=float, help="close a data-plane connection idle this long (seconds, default 900)"
    )
    s.set_defaults(fn=_journalnode)

    s = sub.add_parser("format", help="format a journal on every node")
    s.add_argument("uri")
    s.add_argument("--force", action="store_true", help="wipe existing data")
    s.set_defaults(fn=_format)

    s = sub.add_parser("status", help="per-node epochs, segments, committed txid and lag")
    s.add_argument("uri")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=_status)

    s = sub.add_parser("tail", help="print committed records")
    s.add_argument("uri")
    s.add_argument("--from", dest="from_txid", type=int, default=1)
    s.add_argument("-f", "--follow", action="store_true")
    s.add_argument("--hex", action="store_true")
    s.set_defaults(fn=_tail)

    s = sub.add_parser("dump", help="show the frames of a segment file")
    s.add_argument("file")
    s.add_argument("--records", action="store_true")
    s.set_defaults(fn=_dump)

    s = sub.add_parser("cluster", help="local clusters for trying qjm out")
    cs = s.add_subparsers(dest="cluster_cmd", required=True)
    up = cs.add_parser("up", help="run N local JournalNodes until Ctrl-C")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--dir", default=None)
    up.add_argument("--journal", default="demo")
    up.set_defaults(fn=_cluster_up)

    s = sub.add_parser("demo", help="3 nodes, a writer, a node killed, a failover, everything read back")
    s.add_argument("--records", type=int, default=2000)
    s.set_defaults(fn=_demo)

    s = sub.add_parser("bench", help="latency/throughput against the disk's floor")
    s.add_argument("--smoke", action="store_true")
    s.add_argument("--json", action="store_true")
    s.add_argument("--plot", default=None, metavar="PNG", help="latency CDF and throughput bars (matplotlib)")
    s.add_argument("--peers", action="store_true", help="also ZooKeeper, etcd and NATS JetStream on loopback")
    s.set_defaults(fn=_bench)

    s = sub.add_parser("sim", help="deterministic fault simulation: replay a seed, sweep double failures, search")
    s.add_argument("--seed", type=int, default=None, help="the seed to run")
    s.add_argument("--trace", action="store_true", help="print every call, fault and check of the run")
    s.add_argument("--steps", type=int, default=400, help="scheduler steps before the final recovery")
    s.add_argument("--bugs", default="", help="test-only protocol bugs to switch on (comma separated)")
    s.add_argument("--sweep", action="store_true", help="the double-failure sweep (Hadoop TestQJMWithFaults)")
    s.add_argument("--explore", action="store_true", help="search every execution of the small worlds")
    s.add_argument("--time-limit", type=float, default=120.0, help="seconds per world for --explore")
    s.set_defaults(fn=_sim)

    s = sub.add_parser("faultsim", help="run many simulator seeds on Spark (any master) or a local pool")
    s.add_argument("--seeds", default="0:10000", help="lo:hi")
    s.add_argument("--master", default="local[*]")
    s.add_argument("--steps", type=int, default=400)
    s.add_argument("--bugs", default="")
    s.add_argument("--batch", type=int, default=None, help="seeds per Spark job (progress is printed per job)")
    s.add_argument("--local", action="store_true", help="use a local process pool even if pyspark imports")
    s.set_defaults(fn=_faultsim)

    s = sub.add_parser("chaos", help="process-level chaos: writers and nodes SIGKILLed/SIGSTOPped, then verified")
    s.add_argument("--duration", default="60s", help="e.g. 60s, 10m")
    s.add_argument("--writers", type=int, default=3)
    s.add_argument("--nodes", type=int, default=3)
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--dir", default=None, help="keep the cluster and logs here")
    s.add_argument("--no-proxy", action="store_true", help="no TCP proxy in front of the nodes")
    s.set_defaults(fn=_chaos)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    level = logging.INFO if a.verbose or a.cmd == "journalnode" else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(a.fn(a))
    except QJMError as e:
        print(f"qjm {a.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        os._exit(0)
