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
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from qjm._native import framing
from qjm._version import __version__
from qjm.argtypes import positive_int
from qjm.client.manager import QuorumJournalManager
from qjm.client.reader import open_reader
from qjm.client.retention import PurgeRequest, parse_age
from qjm.config import URI_SYNTAX, QJMConfig
from qjm.errors import ConfigError, InsecureBindError, NodeUnavailableError, QJMError, StorageError
from qjm.logs import FORMATS, LEVELS, configure_logging
from qjm.protocol.frame import FRAME_HEADER_SIZE, SEGMENT_HEADER_SIZE
from qjm.security import certs
from qjm.server.journal import JournalHooks
from qjm.server.limits import NodeLimits
from qjm.server.node import JournalNode
from qjm.server.storage import scan_segment_windows
from qjm.settings import (
    CONFIG_ENV,
    HADOOP_CONF_ENV,
    NODE_KEYS,
    TLS_KEYS,
    client_settings,
    flag_name,
    gather,
    metavar,
    node_settings,
)
from qjm.status import UNKNOWN, format_status_table, node_health
from qjm.stop_signal import wait_for_stop

AddCommand = Callable[..., argparse.ArgumentParser]
"""``add_parser`` of the ``qjm`` command's subcommands: ``add(name, help=...)`` returns its parser."""
Register = Callable[[AddCommand], None]

log = logging.getLogger("qjm.cli")


def add_node_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a JournalNode process; each also reads QJM_<OPTION> and [journalnode] of --config."""
    for key, (_, text) in NODE_KEYS.items():
        if key == "http_address":
            continue  # Hadoop's combined form, for files; the flags are --http-bind and --http-port
        names = [flag_name(key), "--host"] if key == "bind" else [flag_name(key)]
        if key == "insecure":
            p.add_argument(flag_name(key), dest=key, action="store_const", const="true", default=None, help=text)
            continue
        p.add_argument(*names, dest=key, default=None, metavar=metavar(key), help=text)
    _add_settings_args(p)
    p.add_argument("--ready-line", action="store_true", help="print READY ... on stdout once serving")


def serve_node(a: argparse.Namespace, hooks: JournalHooks | None = None) -> int:
    """Serve a JournalNode with the options of ``add_node_arguments`` until SIGTERM or SIGINT."""
    flags = {key: getattr(a, key, None) for key in NODE_KEYS}
    st = node_settings(
        gather("journalnode", flags=flags, config_path=a.config, hadoop_conf=a.hadoop_conf, env=os.environ)
    )
    logging.getLogger("qjm").info("settings: %s", ", ".join(f"{k} from {where}" for k, where in st.origins))
    _check_data_dir(st.data_dir)
    log.info("starting JournalNode %s (pid %d) on %s", __version__, os.getpid(), st.data_dir)
    try:
        node = JournalNode(
            st.data_dir, host=st.rpc_bind, rpc_port=st.rpc_port, data_host=st.data_bind, data_port=st.data_port,
            rpc_advertise=st.rpc_advertise, data_advertise=st.data_advertise, hooks=hooks,
            http_host=st.http_bind, http_port=st.http_port, http_client_auth=st.http_client_auth,
            limits=node_limits(dict(st.limits)),
            tls=st.tls, authz=st.authz, insecure=st.insecure, peers=st.peers,
            sync_interval=st.sync_interval, sync_bandwidth=st.sync_bandwidth,
        ).start()  # fmt: skip
    except InsecureBindError as e:
        print(f"qjm journalnode: {e}", file=sys.stderr)
        return 2
    msg = (
        f"READY rpc={node.rpc_bind_address} data={node.data_bind_address} "
        f"advertised rpc={node.rpc_address} data={node.data_address} http={node.http_address}"
    )

    def ready() -> None:
        log.info("%s", msg)
        if a.ready_line:
            print(msg, flush=True)

    got = wait_for_stop(on_ready=ready)
    log.info("received %s: shutting down", got)
    node.stop(grace=1.0)
    log.info("JournalNode stopped")
    return 0


def node_limits(given: Mapping[str, Any]) -> NodeLimits:
    """``NodeLimits`` from the limit settings that were given (``LIMIT_KEYS``); the rest default."""
    kw = dict(given)
    if "frame_memory_mb" in kw:
        kw["frame_memory"] = kw.pop("frame_memory_mb") * 1024 * 1024
    return NodeLimits(**kw)


def _check_data_dir(path: str) -> None:
    """Refuse a data directory the node could not write, at start rather than at the first write."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise StorageError(f"cannot use data directory {path}: it exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".qjm-probe-"):
            pass
    except OSError as e:
        raise StorageError(f"cannot use data directory {path}: {e.strerror or e}") from None


def _client(a: argparse.Namespace, **flags: object) -> tuple[str, QJMConfig]:
    """The URI and client settings of a command: its URI argument, TLS flags (and client ``flags``
    it has) over QJM_URI and QJM_* variables, --config and --hadoop-conf."""
    given = {"uri": a.uri, **{key: getattr(a, key) for key in TLS_KEYS}, **flags}
    st = client_settings(gather("client", flags=given, config_path=a.config, hadoop_conf=a.hadoop_conf, env=os.environ))
    if st.uri is None:
        raise ConfigError(
            f"no journal URI: give it as an argument, QJM_URI, or uri in [client] of --config ({URI_SYNTAX})"
        )
    return st.uri, st.config


def _format(a: argparse.Namespace) -> int:
    uri, config = _client(a)
    with QuorumJournalManager(uri, config=config) as m:
        m.format(force=a.force)
    print(f"formatted {uri}")
    return 0


def _status(a: argparse.Namespace) -> int:
    uri, config = _client(a)
    with QuorumJournalManager(uri, config=config) as m:
        asked = [(lg.name, lg.status()) for lg in m.loggers.loggers]
        rows: list[dict[str, object]] = []
        for name, fut in asked:  # all asked at once: a dead node costs one connect timeout, not one each
            try:
                rows.append({"node": name, **fut.result(timeout=2 * m.config.timeouts.connect)})
            except (NodeUnavailableError, TimeoutError) as e:
                rows.append({"node": name, "unreachable": str(e) or "no answer in time"})
            except QJMError as e:
                rows.append({"node": name, "error": f"{type(e).__name__}: {e}"})
    report = node_health(rows)
    if a.json:
        print(json.dumps({"state": report.state, "exit_code": report.exit_code, "nodes": report.rows}, indent=2))
        return report.exit_code
    print(format_status_table(report))
    if report.state == "not-formatted":
        print(f"run: qjm format {shlex.quote(uri)}")
    else:
        for row in report.rows:
            if row.get("state") == "not formatted":
                print(
                    f"node {row['node']} does not hold the journal; if its data directory was replaced, run: "
                    f"qjm rejoin {shlex.quote(uri)} --node {row['node']}"
                )
    return report.exit_code


def _rejoin(a: argparse.Namespace) -> int:
    try:
        uri, config = _client(a)
        with QuorumJournalManager(uri, config=config) as m:
            plan = m.rejoin_node(a.node)
    except ConfigError as e:
        print(f"qjm rejoin: {e}", file=sys.stderr)
        return 2
    ns = plan.namespace
    print(
        f"node {plan.node} holds journal {m.journal_id} again: formatted in namespace {ns.namespace_id}/"
        f"{ns.cluster_id} with promised epoch {plan.promised_epoch}, from {', '.join(plan.peers)}.\n"
        "It holds no segment yet. It takes the writer's segments from its next roll on (until then it takes no "
        "part in fencing or recovery), and copies the finalized segments it lacks from its peers if it runs "
        "with --peers (qjm status shows how far it is). Until then the records it lost are on fewer nodes: "
        "roll the writer soon."
    )
    return 0


def _purge_request(a: argparse.Namespace) -> PurgeRequest:
    """The one criterion of ``qjm purge``, checked (ConfigError names what is wrong)."""
    given = [(flag, v) for flag, v in (("--before-txid", a.before_txid), ("--keep-txids", a.keep_txids),
                                       ("--older-than", a.older_than)) if v is not None]  # fmt: skip
    if len(given) != 1:
        raise ConfigError("give exactly one of --before-txid N, --keep-txids N, --older-than AGE (e.g. 7d)")
    flag, text = given[0]
    if flag == "--older-than":
        return PurgeRequest(older_than=parse_age(text))
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"{flag} {text!r}: expected a positive integer")
    return PurgeRequest(before_txid=n) if flag == "--before-txid" else PurgeRequest(keep_txids=n)


def _purge(a: argparse.Namespace) -> int:
    try:
        request = _purge_request(a)
        uri, config = _client(a, min_retained_txids=a.min_retained_txids)
    except ConfigError as e:
        print(f"qjm purge: {e}", file=sys.stderr)
        return 2
    with QuorumJournalManager(uri, config=config) as m:
        out = m.admin_purge(request, min_retained_txids=config.min_retained_txids, now=time.time())
    if not out.segments:
        print(f"nothing to purge: no finalized segment ends before txid {out.min_txid_to_keep}")
        return 0
    names = ", ".join(f"{s}-{e}" for s, e in out.segments)
    print(f"purged below txid {out.min_txid_to_keep} (segments {names}) on {', '.join(out.purged) or 'no node'}")
    for node, err in sorted(out.failed.items()):
        print(f"qjm purge: {node}: {type(err).__name__}: {err}", file=sys.stderr)
    return 1 if out.failed else 0


def _tail(a: argparse.Namespace) -> int:
    uri, config = _client(a)
    r = open_reader(uri, a.from_txid, include_in_progress=True, config=config)
    it = r.tail() if a.follow else iter(r)
    try:
        for txid, rec in it:
            text = rec.decode("utf-8", "backslashreplace") if not a.hex else rec.hex()
            print(f"{txid}\t{text}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        r.close()
    return 0


def _dump(a: argparse.Namespace) -> int:
    # A window at a time (the scan) and a frame at a time (the listing): a segment can be gigabytes.
    try:
        f = open(a.file, "rb")  # noqa: SIM115  (closed below, after the listing)
    except OSError as e:
        print(f"qjm dump: cannot read {a.file}: {e.strerror or e}", file=sys.stderr)
        return 1

    def read(offset: int, n: int) -> bytes:
        f.seek(offset)
        return f.read(n)

    with f:
        size = os.fstat(f.fileno()).st_size
        try:
            h = framing.decode_segment_header(read(0, SEGMENT_HEADER_SIZE))
        except QJMError as e:
            print(f"{a.file}: not a qjm segment: {e}")
            return 1
        print(f"segment {a.file}: start txid {h.start_txid}, started by epoch {h.epoch}, {size} bytes")
        res = scan_segment_windows(read, h.start_txid)
        off = SEGMENT_HEADER_SIZE
        while off < res.valid_end:  # every frame before valid_end verified in the scan
            fh = framing.decode_header(read(off, FRAME_HEADER_SIZE))
            print(
                f"  @{off:<10} frame epoch {fh.epoch} txids {fh.first_txid}-{fh.last_txid} "
                f"({fh.record_count} records, {fh.payload_len} bytes, xxh3 {fh.payload_xxh3:016x})"
            )
            if a.records:
                for i, rec in enumerate(framing.decode_records(read(off, fh.frame_len), 0)):
                    print(f"      {fh.first_txid + i}: {rec[:60]!r}{'...' if len(rec) > 60 else ''}")
            off += fh.frame_len
    print(
        f"  {res.frame_count} frames, last txid {res.last_txid}, tail {res.tail}"
        + (f": {res.error}" if res.error else "")
    )
    return 0 if res.tail == "clean" else 2


def _certs(a: argparse.Namespace) -> int:
    if a.certs_cmd == "init":
        print(f"created CA {certs.init_ca(a.dir, days=a.days)}")
        return 0
    if a.certs_cmd == "node":
        made = certs.node_cert(a.dir, a.name, dns=a.dns, ips=a.ip, days=a.days)
    else:
        made = certs.client_cert(a.dir, a.name, days=a.days)
    print(f"created {made.cert_file} and {made.key_file} (identity {a.name!r}; CA {made.ca_file})")
    return 0


def _register_certs(add: AddCommand) -> None:
    s = add(
        "certs", help="create a CA, node and client certificates for mutual TLS",
        description="Create the certificates of a test or small deployment (docs/configuration.md, TLS): "
        "`qjm certs init DIR` makes the CA, `qjm certs node DIR --name jn1 --dns jn1.example --ip 10.0.0.1` "
        "a node's certificate, `qjm certs client DIR --name alice` a client's (identity alice).",
    )  # fmt: skip
    sub = s.add_subparsers(dest="certs_cmd", required=True, parser_class=_Parser)
    for name, text in (("init", "create the CA"), ("node", "a node certificate"), ("client", "a client certificate")):
        c = sub.add_parser(name, help=text)
        c.add_argument("dir", help="directory of the CA (ca.pem, ca.key) and of the certificates made")
        if name != "init":
            c.add_argument("--name", required=True, help="identity and file name (<name>.pem, <name>.key)")
        if name == "node":
            c.add_argument("--dns", action="append", default=[], help="another DNS name the node is reached by")
            c.add_argument("--ip", action="append", default=[], help="an IP address the node is reached at")
        c.add_argument(
            "--days", type=positive_int, default=3650 if name == "init" else certs.DEFAULT_DAYS, help="validity"
        )
    s.set_defaults(fn=_certs)


class _Parser(argparse.ArgumentParser):
    """argparse with the exit code of a usage error settable per command (``qjm status`` exits 3,
    "could not check", so that 2 keeps meaning "no quorum" to a health check)."""

    usage_exit = 2

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.commands: Mapping[str, argparse.ArgumentParser] = {}

    def parse_args(self, args: Sequence[str] | None = None, namespace: None = None) -> argparse.Namespace:  # type: ignore[override]
        """Arguments a command does not know are refused by that command, with its exit code."""
        a, extra = self.parse_known_args(args)
        if extra:
            self.commands.get(getattr(a, "cmd", ""), self).error(f"unrecognized arguments: {' '.join(extra)}")
        return a

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(self.usage_exit, f"{self.prog}: error: {message}\n")


def _add_settings_args(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--config", metavar="FILE", default=None,
        help=f"TOML settings file ({CONFIG_ENV} when not given); see docs/configuration.md",
    )  # fmt: skip
    s.add_argument(
        "--hadoop-conf", metavar="FILE", default=None,
        help=f"a Hadoop hdfs-site.xml to read dfs.journalnode.*, dfs.qjournal.* and "
        f"dfs.namenode.shared.edits.dir from ({HADOOP_CONF_ENV} when not given)",
    )  # fmt: skip


def _add_uri_arg(s: argparse.ArgumentParser) -> None:
    s.add_argument("uri", nargs="?", default=None, help=f"the journal (else QJM_URI or [client] uri): {URI_SYNTAX}")
    _add_settings_args(s)
    for key, (_, text) in TLS_KEYS.items():
        s.add_argument(flag_name(key), dest=key, default=None, metavar="FILE", help=f"{text} (else QJM_{key.upper()})")


def register(add: AddCommand) -> None:
    """Add the operator's commands to the ``qjm`` command."""
    s = add(
        "journalnode", help="run a JournalNode",
        description="Run a JournalNode: a control-plane port (gRPC) and a data-plane port (framed TCP), both "
        "to be reachable from every writer and reader, and an HTTP port for /metrics (Prometheus), /health and "
        "/status (docs/observability.md). Each option also reads QJM_<OPTION> and the "
        "[journalnode] table of --config.",
    )  # fmt: skip
    add_node_arguments(s)
    s.set_defaults(fn=serve_node)

    s = add("format", help="format a journal on every node")
    _add_uri_arg(s)
    s.add_argument("--force", action="store_true", help="wipe existing data")
    s.set_defaults(fn=_format)

    s = add(
        "status", help="per-node state, epochs, txids and lag; exit 0 in sync, 1 degraded, 2 no quorum",
        description="Ask every node for the journal's state. Exit code: 0 every node in sync; 1 degraded "
        "(a quorum is fine, some node is unreachable, unformatted or behind); 2 no quorum, or not "
        "formatted; 3 the check could not run (bad URI or settings).",
    )  # fmt: skip
    if isinstance(s, _Parser):
        s.usage_exit = UNKNOWN
    _add_uri_arg(s)
    s.add_argument("--json", action="store_true", help="print the state and each node's answer as JSON")
    s.set_defaults(fn=_status)

    s = add(
        "rejoin", help="bring back a node that lost its disk: format it from its peers",
        description="Format the journal on one node whose copy of it is gone (a replaced disk, a wiped data "
        "directory), with the namespace of the other nodes and the highest epoch they promised, so that it "
        "refuses every writer they have fenced. The writer is not fenced; the node takes the writer's next "
        "segment, and with --peers copies the finalized segments it lacks. Refused, with nothing changed, "
        "when the node still holds the journal or fewer than a majority of the cluster's size among the "
        "other nodes answer. Exit code: 0 done, 1 refused, 2 bad arguments.",
    )  # fmt: skip
    _add_uri_arg(s)
    s.add_argument("--node", required=True, metavar="HOST:PORT", help="the node to bring back, as the URI names it")
    s.set_defaults(fn=_rejoin)

    s = add("tail", help="print committed records")
    _add_uri_arg(s)
    s.add_argument("--from", dest="from_txid", type=positive_int, default=1, help="first txid to print (default 1)")
    s.add_argument("-f", "--follow", action="store_true", help="keep printing new records as they commit")
    s.add_argument("--hex", action="store_true", help="print records as hex instead of UTF-8 text")
    s.set_defaults(fn=_tail)

    s = add(
        "purge", help="remove old finalized segments from every node (retention)",
        description="Remove the finalized segments wholly before a txid from every node, beside a running "
        "writer (it is not fenced). Refused, with nothing removed, when the purge would reach the open "
        "segment or the newest min_retained_txids committed txids (the retention floor). Exit code: 0 done "
        "(or nothing to purge), 1 refused or failed on some node, 2 bad arguments.",
    )  # fmt: skip
    _add_uri_arg(s)
    s.add_argument("--before-txid", metavar="N", default=None, help="purge segments that end before txid N")
    s.add_argument("--keep-txids", metavar="N", default=None, help="keep the newest N committed txids")
    s.add_argument(
        "--older-than",
        metavar="AGE",
        default=None,
        help="purge segments finalized over AGE ago (90s, 30m, 12h, 7d)",
    )
    s.add_argument(
        "--min-retained-txids", metavar="N", default=None,
        help="the retention floor: committed txids always kept (default: setting min_retained_txids, 1000000)",
    )  # fmt: skip
    s.set_defaults(fn=_purge)

    s = add("dump", help="show the frames of a segment file")
    s.add_argument("file", help="a segment file (edits_* in a journal directory)")
    s.add_argument("--records", action="store_true", help="also print each record (first 60 bytes)")
    s.set_defaults(fn=_dump)

    _register_certs(add)


def build_parser(*groups: Register) -> argparse.ArgumentParser:
    """The ``qjm`` parser with the subcommands each of ``groups`` registers."""
    p = _Parser(
        prog="qjm",
        description="qjm: a replicated, fenced write-ahead log",
        epilog=f"Journal URIs: {URI_SYNTAX}. Settings: flags > QJM_* environment > --config > --hadoop-conf > "
        "defaults (docs/configuration.md).",
    )
    p.add_argument("--version", action="version", version=f"qjm {__version__}", help="print the version and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    p.commands = sub.choices
    for group in groups:
        group(sub.add_parser)
    _add_log_args(p, top=True)
    for cmd in sub.choices.values():
        _add_log_args(cmd, top=False)
    return p


def _add_log_args(p: argparse.ArgumentParser, *, top: bool) -> None:
    """Accepted before or after the command name; a command's own default never overrides the top's."""
    p.add_argument(
        "--log-level", type=str.lower, choices=LEVELS, default=None if top else argparse.SUPPRESS,
        help="log threshold (default: info for journalnode, else warning; -v means info)",
    )  # fmt: skip
    p.add_argument(
        "--log-format", choices=FORMATS, default="text" if top else argparse.SUPPRESS,
        help="text, or json: one JSON object per line (time, level, logger, message)",
    )  # fmt: skip


def main(argv: Sequence[str] | None = None, groups: Sequence[Register] = (register,)) -> int:
    """Run one ``qjm`` command; ``groups`` register the commands there are (the operator's alone here)."""
    a = build_parser(*groups).parse_args(argv)
    level = a.log_level or ("info" if a.verbose or a.cmd == "journalnode" else "warning")
    configure_logging(level, a.log_format)
    try:
        return int(a.fn(a))
    except QJMError as e:
        print(f"qjm {a.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return UNKNOWN if a.cmd == "status" else 1
    except BrokenPipeError:
        os._exit(0)
    except OSError as e:  # a path or resource the user named (a directory that cannot be made...)
        where = f": {e.filename}" if e.filename else ""
        print(f"qjm {a.cmd}: {e.strerror or e}{where}", file=sys.stderr)
        return UNKNOWN if a.cmd == "status" else 1
