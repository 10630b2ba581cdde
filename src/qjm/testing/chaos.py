"""Process-level chaos (design §7.4.1 "loggers in isolation" and §7.4.2): real processes, real signals.

Several writer processes keep taking the journal over from each other (``open_writer`` on a
``MiniJournalCluster``), write random records, and log every acknowledged txid with its bytes to a
side file, only after ``sync()`` returned. Meanwhile the driver SIGKILLs and SIGSTOP/SIGCONTs
writers and JournalNodes at random, and a ``TcpProxy`` in front of each node's control plane adds
latency, resets connections and partitions nodes. At the end everything is healed, a last writer
recovers the log, and the verifier checks design §7.4.1's properties:

* no txid was acknowledged to two writers with different bytes;
* every acknowledged txid is in the final log (what a fresh reader returns) with its bytes;
* finalized segments with the same name are identical on every node (checksums of their frames).

The data plane is not proxied: writers connect to the data address a node advertises in
get_journal_state, so proxying it needs the node to advertise the proxy (a server change).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from qjm.security.tls import TlsConfig, tls_config
from qjm.testing.certs import make_pki

if TYPE_CHECKING:
    from qjm.config import QJMConfig

__all__ = ["ChaosConfig", "ChaosReport", "run_chaos", "verify"]

JOURNAL_ID = "chaos"
_FINALIZED = re.compile(r"edits_\d{19}-\d{19}")
WRITER_OPTIONS: dict[str, object] = {
    "get_journal_state_timeout": 5.0,
    "new_epoch_timeout": 5.0,
    "prepare_recovery_timeout": 5.0,
    "accept_recovery_timeout": 5.0,
    "finalize_segment_timeout": 5.0,
    "start_segment_timeout": 5.0,
    "write_txns_timeout": 5.0,
    "operations_timeout": 5.0,
    "close_grace": 0.5,
}


def _writer_config(tls: TlsConfig | None = None) -> QJMConfig:
    from qjm.config import config_from

    return dataclasses.replace(config_from(WRITER_OPTIONS), tls=tls)


@dataclass
class ChaosConfig:
    duration: float = 60.0
    writers: int = 3
    nodes: int = 3
    seed: int | None = None
    proxy: bool = True
    base_dir: str | None = None
    tls: bool = False  # nodes and writers with mutual TLS (certificates made in base_dir/pki)
    mean_gap: float = 0.7  # seconds between chaos actions, on average


@dataclass
class ChaosReport:
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    base_dir: str = ""
    seed: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        c = self.counts
        lines = [
            f"chaos: {self.seconds:.0f}s, seed {self.seed}, {'OK' if self.ok else 'FAILED'} (data in {self.base_dir})",
            f"  writers: {c.get('takeovers', 0)} takeovers, {c.get('writers_fenced', 0)} fenced, "
            f"{c.get('writer_errors', 0)} other errors, {c.get('writer_kills', 0)} SIGKILLed, "
            f"{c.get('writer_pauses', 0)} SIGSTOPped",
            f"  nodes: {c.get('node_kills', 0)} SIGKILLed, {c.get('node_pauses', 0)} SIGSTOPped; proxy: "
            f"{c.get('proxy_delays', 0)} delays, {c.get('proxy_drops', 0)} connection resets, "
            f"{c.get('partitions', 0)} partitions",
            f"  txids: {c.get('acked', 0)} acknowledged ({c.get('acked_claims', 0)} acks), {c.get('verified', 0)} acks "
            f"verified in the final log of "
            f"{c.get('final_txids', 0)}; finalized segments compared: {c.get('segments_compared', 0)} "
            f"({c.get('segment_copies', 0)} copies)",
        ]
        lines.extend(f"  PROBLEM: {p}" for p in self.problems)
        return "\n".join(lines)


# -- the writer process -----------------------------------------------------------------------


def writer_main(argv: Sequence[str]) -> int:
    """One writer process: take over, write, log acknowledged txids; again and again until killed."""
    import logging

    from qjm.client.writer import open_writer
    from qjm.errors import FencedError, QJMError

    logging.getLogger("qjm").setLevel(logging.CRITICAL)
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--seed", type=int, default=0)
    for flag in ("--tls-ca", "--tls-cert", "--tls-key"):
        p.add_argument(flag, default=None)
    a = p.parse_args(argv)
    tls = tls_config(a.tls_ca, a.tls_cert, a.tls_key)
    rng = random.Random(a.seed)
    fd = os.open(a.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()
    n = 0

    def log(line: str) -> None:
        os.write(fd, (line + "\n").encode())  # one write per line: a kill leaves at most a torn last line

    while True:
        w = None
        try:
            w = open_writer(a.uri, config=_writer_config(tls))
            log(f"O\t{w.epoch}\t{w.last_txid}")
            end = time.monotonic() + rng.uniform(0.3, 3.0)
            while time.monotonic() < end:
                batch = []
                for _ in range(rng.randint(1, 20)):
                    n += 1
                    rec = b"p%d-e%d-%d-" % (pid, w.epoch, n) + rng.randbytes(rng.randint(0, 64)).hex().encode()
                    batch.append((w.append(rec), rec))
                w.sync()
                log("\n".join(f"A\t{t}\t{w.epoch}\t{r.hex()}" for t, r in batch))
                if rng.random() < 0.08:
                    w.roll()
            if rng.random() < 0.5:
                w.close()
                log(f"C\t{w.epoch}")
            else:
                w.abort()
        except FencedError as e:
            log(f"F\t{getattr(w, 'epoch', 0)}\t{str(e)[:200]!r}")
        except QJMError as e:
            log(f"E\t{type(e).__name__}\t{str(e)[:200]!r}")
        finally:
            if w is not None:
                try:
                    w.abort()
                except Exception:
                    pass
        time.sleep(rng.uniform(0.0, 0.4))  # pacing between takeovers


# -- the driver -------------------------------------------------------------------------------


class _Writers:
    def __init__(self, uri: str, log_dir: str, count: int, rng: random.Random, tls: TlsConfig | None = None) -> None:
        self.uri = uri
        self.tls = tls
        self.log_dir = log_dir
        self.rng = rng
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self.paused: dict[int, float] = {}  # index → resume time
        self.dead: dict[int, float] = {}  # index → restart time
        self.spawned = 0

    def start(self, i: int) -> None:
        self.spawned += 1
        log = os.path.join(self.log_dir, f"writer-{self.spawned}.log")
        cmd = [sys.executable, "-m", "qjm.testing.chaos", "writer", "--uri", self.uri, "--log", log,
               "--seed", str(self.rng.randrange(1 << 30))]  # fmt: skip
        if self.tls is not None:
            cmd += ["--tls-ca", self.tls.ca_file, "--tls-cert", self.tls.cert_file, "--tls-key", self.tls.key_file]
        with open(os.path.join(self.log_dir, f"writer-{self.spawned}.err"), "ab") as err:
            self.procs[i] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and i not in self.paused]

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None:
            p.kill()
            p.wait()
            self.procs[i] = None

    def stop_all(self) -> None:
        for i, p in enumerate(self.procs):
            if p is not None:
                if i in self.paused:
                    p.send_signal(signal.SIGCONT)
                self.kill(i)
        self.paused.clear()


def run_chaos(cfg: ChaosConfig, out: TextIO = sys.stderr) -> ChaosReport:
    """Run the chaos for ``cfg.duration`` seconds, heal, recover, verify."""
    from qjm.client.manager import QuorumJournalManager
    from qjm.testing.minicluster import MiniJournalCluster
    from qjm.testing.proxy import TcpProxy

    seed = cfg.seed if cfg.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    base = cfg.base_dir or tempfile.mkdtemp(prefix="qjm-chaos-")
    os.makedirs(base, exist_ok=True)
    log_dir = os.path.join(base, "writers")
    os.makedirs(log_dir, exist_ok=True)
    rep = ChaosReport(base_dir=base, seed=seed)
    c = rep.counts
    t0 = time.monotonic()
    pki = make_pki(os.path.join(base, "pki"), nodes=cfg.nodes) if cfg.tls else None
    tls = pki.clients["alice"] if pki is not None else None
    cluster = MiniJournalCluster(cfg.nodes, os.path.join(base, "cluster"), journal_id=JOURNAL_ID, pki=pki)
    proxies: list[TcpProxy] = []
    writers: _Writers | None = None
    try:
        if cfg.proxy:
            proxies = [TcpProxy((cluster.host, n.rpc_port)).start() for n in cluster.nodes]
            uri = "qjournal://" + ";".join(p.address for p in proxies) + "/" + JOURNAL_ID
        else:
            uri = cluster.uri
        with QuorumJournalManager(cluster.uri, config=_writer_config(tls)) as m:
            m.format()
        writers = _Writers(uri, log_dir, cfg.writers, rng, tls)
        for i in range(cfg.writers):
            writers.start(i)
        print(f"chaos: {cfg.nodes} nodes, {cfg.writers} writers, seed {seed}, {cfg.duration:.0f}s, data in {base}",
              file=out, flush=True)  # fmt: skip
        node_down: dict[int, float] = {}
        node_paused: dict[int, float] = {}
        proxy_heal: dict[int, float] = {}
        deadline = t0 + cfg.duration
        forced_kill_at = t0 + cfg.duration * 0.3  # so that every run kills a node at least once
        last_report = t0
        while time.monotonic() < deadline:
            time.sleep(rng.expovariate(1.0 / cfg.mean_gap))  # pacing of the chaos, not synchronisation
            now = time.monotonic()
            _heal_due(now, cluster, writers, proxies, node_down, node_paused, proxy_heal)
            faulted = len(node_down) + len(node_paused) + sum(1 for p in proxies if p.partitioned)
            choices = ["writer_kill", "writer_pause", "proxy_delay", "proxy_drop"]
            if faulted == 0 or (faulted == 1 and rng.random() < 0.15):
                choices += ["node_kill", "node_kill", "node_pause", "partition"]
            action = "node_kill" if now >= forced_kill_at and not c.get("node_kills") and faulted == 0 else None
            action = action or rng.choice(choices)
            _act(action, rng, now, cluster, writers, proxies, node_down, node_paused, proxy_heal, c)
            if now - last_report > 15:
                last_report = now
                acked = sum(1 for _ in _acked_lines(log_dir))
                print(f"chaos: {now - t0:.0f}s, {acked} txids acknowledged so far, "
                      + ", ".join(f"{k} {v}" for k, v in sorted(c.items())), file=out, flush=True)  # fmt: skip
        # heal everything, stop the writers, recover and verify
        writers.stop_all()
        for i in list(node_paused):
            cluster.resume(i)
        node_paused.clear()
        for p in proxies:
            p.partition(False)
            p.delay = 0.0
        for i in list(node_down):
            cluster.start(i)
        node_down.clear()
        verify(cluster, log_dir, rep)
    finally:
        if writers is not None:
            writers.stop_all()
        for p in proxies:
            p.stop()
        cluster.shutdown()
    rep.seconds = time.monotonic() - t0
    if cfg.base_dir is None and rep.ok:
        shutil.rmtree(base, ignore_errors=True)  # keep the evidence only when something failed
        rep.base_dir = f"{base} (removed)"
    return rep


def _heal_due(
    now: float,
    cluster: object,
    writers: _Writers,
    proxies: Sequence[object],
    node_down: dict[int, float],
    node_paused: dict[int, float],
    proxy_heal: dict[int, float],
) -> None:
    from qjm.testing.minicluster import MiniJournalCluster
    from qjm.testing.proxy import TcpProxy

    assert isinstance(cluster, MiniJournalCluster)
    for i, at in list(writers.paused.items()):
        if now >= at:
            p = writers.procs[i]
            if p is not None:
                p.send_signal(signal.SIGCONT)
            del writers.paused[i]
    for i, at in list(writers.dead.items()):
        if now >= at:
            writers.start(i)
            del writers.dead[i]
    for i, at in list(node_down.items()):
        if now >= at:
            cluster.start(i)
            del node_down[i]
    for i, at in list(node_paused.items()):
        if now >= at:
            cluster.resume(i)
            del node_paused[i]
    for i, at in list(proxy_heal.items()):
        if now >= at:
            px = proxies[i]
            assert isinstance(px, TcpProxy)
            px.partition(False)
            px.delay = 0.0
            del proxy_heal[i]


def _act(
    action: str,
    rng: random.Random,
    now: float,
    cluster: object,
    writers: _Writers,
    proxies: Sequence[object],
    node_down: dict[int, float],
    node_paused: dict[int, float],
    proxy_heal: dict[int, float],
    c: dict[str, int],
) -> None:
    from qjm.testing.minicluster import MiniJournalCluster
    from qjm.testing.proxy import TcpProxy

    assert isinstance(cluster, MiniJournalCluster)
    up = [i for i in range(len(cluster.nodes)) if i not in node_down and i not in node_paused]
    if action == "writer_kill" and writers.alive():
        i = rng.choice(writers.alive())
        writers.kill(i)
        writers.dead[i] = now + rng.uniform(0.0, 1.5)
        c["writer_kills"] = c.get("writer_kills", 0) + 1
    elif action == "writer_pause" and writers.alive():
        i = rng.choice(writers.alive())
        p = writers.procs[i]
        assert p is not None
        p.send_signal(signal.SIGSTOP)
        writers.paused[i] = now + rng.uniform(0.2, 6.0)
        c["writer_pauses"] = c.get("writer_pauses", 0) + 1
    elif action == "node_kill" and up:
        i = rng.choice(up)
        cluster.kill(i)
        node_down[i] = now + rng.uniform(0.3, 4.0)
        c["node_kills"] = c.get("node_kills", 0) + 1
    elif action == "node_pause" and up:
        i = rng.choice(up)
        cluster.pause(i)
        node_paused[i] = now + rng.uniform(0.2, 4.0)
        c["node_pauses"] = c.get("node_pauses", 0) + 1
    elif proxies and action in ("proxy_delay", "proxy_drop", "partition"):
        i = rng.randrange(len(proxies))
        px = proxies[i]
        assert isinstance(px, TcpProxy)
        if action == "proxy_delay":
            px.delay = rng.choice((0.002, 0.01, 0.05, 0.2))
            proxy_heal[i] = now + rng.uniform(0.5, 5.0)
            c["proxy_delays"] = c.get("proxy_delays", 0) + 1
        elif action == "proxy_drop":
            px.drop_connections()
            c["proxy_drops"] = c.get("proxy_drops", 0) + 1
        elif i in up:
            px.partition(True)
            proxy_heal[i] = now + rng.uniform(0.3, 4.0)
            c["partitions"] = c.get("partitions", 0) + 1


# -- the verifier -----------------------------------------------------------------------------


def _acked_lines(log_dir: str) -> list[tuple[int, int, bytes, str]]:
    out: list[tuple[int, int, bytes, str]] = []
    for name in sorted(os.listdir(log_dir)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(log_dir, name), "rb") as f:
            data = f.read()
        for raw in data.split(b"\n")[:-1]:  # a torn last line (a kill mid-write) has no newline
            parts = raw.decode().split("\t")
            if parts[0] == "A" and len(parts) == 4:
                out.append((int(parts[1]), int(parts[2]), bytes.fromhex(parts[3]), name))
    return out


def _events(log_dir: str, kind: str) -> int:
    n = 0
    for name in os.listdir(log_dir):
        if name.endswith(".log"):
            with open(os.path.join(log_dir, name), "rb") as f:
                n += sum(1 for line in f.read().split(b"\n")[:-1] if line.startswith(kind.encode() + b"\t"))
    return n


def verify(cluster: object, log_dir: str, rep: ChaosReport) -> None:
    """Recover with a last writer, read everything back, and compare with what writers were told."""
    from qjm.client.writer import open_writer
    from qjm.testing.minicluster import MiniJournalCluster
    from qjm.testing.util import read_all, segment_frames

    assert isinstance(cluster, MiniJournalCluster)
    c = rep.counts
    c["takeovers"] = _events(log_dir, "O")
    c["writers_fenced"] = _events(log_dir, "F")
    c["writer_errors"] = _events(log_dir, "E")
    claims: dict[int, list[tuple[bytes, int, str]]] = {}  # txid → every (bytes, epoch, writer log) acked
    for txid, epoch, rec, who in _acked_lines(log_dir):
        claims.setdefault(txid, []).append((rec, epoch, who))
    for txid, cl in sorted(claims.items()):
        if len({rec for rec, _, _ in cl}) > 1:
            rep.problems.append(
                f"txid {txid} acknowledged with different bytes: " + ", ".join(f"epoch {e} ({who})" for _, e, who in cl)
            )
    c["acked"] = len(claims)
    c["acked_claims"] = sum(len(cl) for cl in claims.values())
    tls = cluster.pki.clients["alice"] if cluster.pki is not None else None
    w = open_writer(cluster.uri, config=_writer_config(tls))
    w.close()
    final = dict(read_all(cluster.uri, tls=tls))
    c["final_txids"] = len(final)
    if final and sorted(final) != list(range(1, len(final) + 1)):
        rep.problems.append(f"the final log is not contiguous from txid 1 ({len(final)} txids)")
    verified = 0
    for txid in sorted(claims):
        for rec, epoch, who in claims[txid]:
            got = final.get(txid)
            if got is None:
                rep.problems.append(f"acknowledged txid {txid} (epoch {epoch}, {who}) is missing from the final log")
            elif got != rec:
                rep.problems.append(f"acknowledged txid {txid} (epoch {epoch}, {who}) has other bytes in the final log")
            else:
                verified += 1
    c["verified"] = verified
    sums: dict[str, dict[int, str]] = {}
    for i in range(len(cluster.nodes)):
        d = cluster.journal_dir(i)
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if _FINALIZED.fullmatch(name):
                digest = hashlib.blake2b(segment_frames(os.path.join(d, name)), digest_size=16).hexdigest()
                sums.setdefault(name, {})[i] = digest
    for name, by_node in sorted(sums.items()):
        if len(set(by_node.values())) > 1:
            rep.problems.append(f"finalized segment {name} differs between nodes: {by_node}")
    c["segments_compared"] = len(sums)
    c["segment_copies"] = sum(len(v) for v in sums.values())
    if len(rep.problems) > 20:
        rep.problems[20:] = [f"... and {len(rep.problems) - 20} more problems"]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "writer":
        sys.exit(writer_main(sys.argv[2:]))
    sys.exit("usage: python -m qjm.testing.chaos writer --uri URI --log PATH [--seed N]")
