"""Peers for ``qjm bench --peers``: ZooKeeper, etcd and NATS JetStream, three servers each, on loopback.

qjm's figures mean little without the systems people would use instead, measured on the same
machine, the same disk and the same two workloads: so this module starts real 3-server clusters
from the Debian packages (``zookeeper``, ``etcd-server``, ``nats-server``; installed by
``scripts/install-system-deps.sh``) in a temporary directory on free loopback ports, waits until
each is healthy by polling it, and drives it through its usual Python client:

1. sync-commit latency of one 1 KiB record with one request outstanding;
2. pipelined throughput of 1 KiB (and 100 B) records, one record per request, as many requests in
   flight as the client allows;
3. the same throughput through the peer's best batching client (``batched``): ZooKeeper ``multi``
   (kazoo ``transaction()``) of ``ZK_MULTI`` creates with ``ZK_MULTI_WINDOW`` in flight; etcd
   ``/v3/kv/txn`` of ``ETCD_TXN_OPS`` puts (its ``--max-txn-ops`` default) on ``ETCD_TXN_CONNECTIONS``
   connections; NATS JetStream bursts of ``NATS_BATCH`` asynchronous publishes with
   ``NATS_BATCH_WINDOW`` acks outstanding (2.9 has no multi-message publish: each message is its own
   request, the client writes a burst in one go). The sizes and windows are the best found on this
   machine (a ZooKeeper multi of 512 creates broke the connection); each cluster's ``how_batched``
   states them.

Every server is started in its own process group with ``PR_SET_PDEATHSIG`` and killed by group when
the cluster is left, also on failure, so nothing outlives the harness. ``bench/peers/README.md``
says what is started and how. ``measure`` returns raw samples in the shape of ``qjm.bench.workers.worker_qjm``'s
plus ``batch{size}`` (the batched phases), ``durable``, ``version``, ``how`` and ``how_batched``.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import http.client
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from qjm.bench.workload import LATENCY_RECORD, RECORD_SIZES, phased, progress

PEERS = ("zookeeper", "etcd", "nats")
START_TIMEOUT = 120.0  # seconds for a cluster to elect a leader on a loaded 2-core machine
INSTALL_HINT = "run scripts/install-system-deps.sh (as root) to install the Debian packages of the peers"

ZK_JAR = "/usr/share/java/zookeeper.jar"
ZK_LOG_JAR = "/usr/share/java/slf4j-simple.jar"  # Debian's slf4j binding: server logs to stderr (our log file)
ZK_WINDOW = 1000  # ZooKeeper's default globalOutstandingLimit per server
ETCD_THREADS = 64  # concurrent HTTP connections of the etcd pipelined phase (best of 4..64 here: raft batches more)
NATS_WINDOW = 4000  # nats-py's default publish_async_max_pending
ZK_MULTI = 128  # creates per multi (256 was no faster here; 512 broke the connection)
ZK_MULTI_WINDOW = 16  # multis in flight
ETCD_TXN_OPS = 128  # puts per txn: etcd's --max-txn-ops default
ETCD_TXN_CONNECTIONS = 16  # threads, each a keep-alive connection
NATS_BATCH = 256  # publish_async calls per burst
NATS_BATCH_WINDOW = 4096  # acks outstanding
NATS_STREAM = "QJMBENCH"
NATS_SUBJECT = "qjm.bench"

_PR_SET_PDEATHSIG = 1


class PeerUnavailable(RuntimeError):
    """A peer's binaries or Python client are not installed."""


def missing_binaries(name: str) -> list[str]:
    """The files a peer needs that are not on this machine (empty when it can run)."""
    need = {
        "zookeeper": [ZK_JAR, shutil.which("java") or "java (a JRE)"],
        "etcd": [shutil.which("etcd") or "/usr/bin/etcd"],
        "nats": [shutil.which("nats-server") or "/usr/sbin/nats-server"],
    }[name]
    return [p for p in need if not os.path.exists(p)]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (all held open at once, so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the harness dies, so a crashed run leaves no server."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _http(port: int, method: str, path: str, body: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


class ServerDied(RuntimeError):
    """A server process exited while the cluster was starting or running."""


class Servers:
    """The three server processes of one cluster, each in its own process group."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[str] = []

    def spawn(self, argv: list[str], cwd: str, log: str) -> None:
        with open(log, "ab") as out:
            p = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed as a whole, never by name
                preexec_fn=_die_with_parent,
            )
        self.procs.append(p)
        self.logs.append(log)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def check_alive(self) -> None:
        for p, log in zip(self.procs, self.logs, strict=True):
            if p.poll() is not None:
                raise ServerDied(f"{self.name}: {self._state(p, log, 3000)}")

    def describe(self) -> str:
        """Each server's state (running, or its exit status) and the tail of its log: what a failed
        phase says beside its own error."""
        return "\n".join(
            f"{self.name} {self._state(p, log, 1500)}" for p, log in zip(self.procs, self.logs, strict=True)
        )

    @staticmethod
    def _state(p: subprocess.Popen[bytes], log: str, tail: int) -> str:
        state = "running" if p.poll() is None else f"exited ({p.returncode})"
        return f"server pid {p.pid} {state}; {log}:\n{_tail(log, tail)}"

    def stop(self) -> None:
        """SIGKILL every process group and reap it: the data is thrown away, a clean shutdown buys nothing."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            p.wait()
        self.procs.clear()
        self.logs.clear()  # a retried start spawns three again: one log per process


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"(no log: {e})"


def wait_until(what: str, servers: Servers, probe: Callable[[], bool], deadline: float) -> None:
    """Poll ``probe`` until it answers True (exceptions count as not yet), failing fast if a server dies."""
    last: BaseException | None = None
    while True:
        servers.check_alive()
        try:
            if probe():
                return
        except Exception as e:
            last = e
        if time.monotonic() > deadline:
            raise TimeoutError(f"{servers.name}: {what} not reached in time (last error: {last!r})")
        time.sleep(0.1)  # a polling interval, not a synchronisation: the probe decides


class PeerClient(ABC):
    """One client of a peer cluster: the two workloads and a read-back for the tests."""

    @abstractmethod
    def put(self, value: bytes) -> str:
        """Commit one record (returns when the peer acknowledged it); returns its key."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The record stored under ``key``."""

    @abstractmethod
    def pipelined(self, value: bytes, seconds: float) -> tuple[int, float]:
        """Write ``value`` as many times as possible for ``seconds``: (records acknowledged, elapsed s)."""

    @abstractmethod
    def batched(self, value: bytes, seconds: float) -> tuple[int, float]:
        """``pipelined`` through the peer's best batching client (module docstring)."""

    @abstractmethod
    def close(self) -> None: ...


class PeerCluster(ABC):
    """A 3-server cluster in ``base``; ``with`` starts it (ready) and always kills it."""

    name = ""
    durable = True
    how = ""
    how_batched = ""

    def __init__(self, base: str) -> None:
        self.base = base
        self.servers = Servers(self.name)
        self.version = "?"

    def __enter__(self) -> PeerCluster:
        missing = missing_binaries(self.name)
        if missing:
            raise PeerUnavailable(f"{self.name}: missing {', '.join(missing)}; {INSTALL_HINT}")
        os.makedirs(self.base, exist_ok=True)
        for attempt in range(2):  # a port taken by someone else between choosing and binding: retry once
            try:
                self._start(time.monotonic() + START_TIMEOUT)
                return self
            except ServerDied:
                self.servers.stop()
                if attempt:
                    raise
            except BaseException:
                self.servers.stop()
                raise
        raise AssertionError("unreachable")

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.servers.stop()

    @property
    def pids(self) -> list[int]:
        return self.servers.pids

    def _dir(self, *parts: str) -> str:
        d = os.path.join(self.base, *parts)
        os.makedirs(d, exist_ok=True)
        return d

    @abstractmethod
    def _start(self, deadline: float) -> None:
        """Spawn the three servers and return once the cluster commits writes."""

    @abstractmethod
    def client(self) -> PeerClient: ...


# -- ZooKeeper -----------------------------------------------------------------------------------


def _zk_4lw(port: int, cmd: bytes = b"srvr") -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as s:
        s.sendall(cmd)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


class ZooKeeperCluster(PeerCluster):
    name = "zookeeper"
    how = (
        "3 servers (QuorumPeerMain, forceSync=yes: txn log fsynced before the ack); kazoo; "
        f"sync: create sequential znode; pipelined: kazoo create_async, <= {ZK_WINDOW} in flight, one session"
    )
    how_batched = f"kazoo transaction() (a multi) of {ZK_MULTI} sequential creates, {ZK_MULTI_WINDOW} multis in flight"

    def _start(self, deadline: float) -> None:
        ports = free_ports(9)
        self.client_ports = ports[0:3]
        quorum = [f"server.{i + 1}=127.0.0.1:{ports[3 + i]}:{ports[6 + i]}" for i in range(3)]
        cp = ZK_JAR + (":" + ZK_LOG_JAR if os.path.exists(ZK_LOG_JAR) else "")
        for i in range(3):
            d = self._dir(f"zk{i + 1}")
            with open(os.path.join(d, "myid"), "w") as f:
                f.write(f"{i + 1}\n")
            cfg = os.path.join(d, "zoo.cfg")
            with open(cfg, "w") as f:
                f.write(
                    "\n".join(
                        [
                            "tickTime=2000",
                            "initLimit=10",
                            "syncLimit=5",
                            f"dataDir={d}",
                            f"clientPort={self.client_ports[i]}",
                            "clientPortAddress=127.0.0.1",
                            "forceSync=yes",  # the default, stated: the transaction log is fsynced before acking
                            "admin.enableServer=false",  # no Jetty admin server on :8080
                            "4lw.commands.whitelist=srvr",
                            *quorum,
                            "",
                        ]
                    )
                )
            argv = [
                "java",
                "-Xms64m",
                "-Xmx512m",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-cp",
                cp,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                cfg,
            ]
            self.servers.spawn(argv, d, os.path.join(d, "server.log"))

        def quorate() -> bool:
            modes = [_zk_4lw(p) for p in self.client_ports]
            if all("Mode: leader" in m or "Mode: follower" in m for m in modes):
                first = modes[0].splitlines()[0]  # "Zookeeper version: 3.8.0-<git id>, built on ..."
                self.version = first.split(":", 1)[1].split(",")[0].strip().split("-")[0]
                return True
            return False

        wait_until("a leader and two followers", self.servers, quorate, deadline)

    def client(self) -> PeerClient:
        return _ZkClient(",".join(f"127.0.0.1:{p}" for p in self.client_ports))


def _created(result: Any) -> int:
    """Records a completed kazoo create acknowledged (its error raised)."""
    if result.exception is not None:
        raise result.exception
    return 1


def _multi_created(result: Any) -> int:
    """Records a completed kazoo multi acknowledged (its first failed operation raised)."""
    if result.exception is not None:
        raise result.exception
    failed = [r for r in result.value if isinstance(r, BaseException)]
    if failed:
        raise failed[0]
    return len(result.value)


def _kazoo_windowed(
    slots: int, seconds: float, send: Callable[[], Any], count: Callable[[Any], int], what: str
) -> tuple[int, float]:
    """Keep ``slots`` kazoo requests in flight for ``seconds``: ``send`` starts one and returns its
    async result, ``count`` gives the records an answered one acknowledged. Returns the records
    acknowledged and the seconds until the last answer."""
    window = threading.BoundedSemaphore(slots)
    acked = [0]
    errors: list[BaseException] = []

    def done(result: Any) -> None:  # in kazoo's completion thread
        try:
            acked[0] += count(result)
        except BaseException as e:
            errors.append(e)
        window.release()

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds and not errors:
        window.acquire()
        send().rawlink(done)
    for _ in range(slots):  # drain: every slot back means every request answered
        window.acquire()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"zookeeper: {what} failed: {errors[0]!r}")
    return acked[0], elapsed


class _ZkClient(PeerClient):
    def __init__(self, hosts: str) -> None:
        try:
            from kazoo.client import KazooClient  # type: ignore[import-untyped,import-not-found,unused-ignore]
        except ImportError as e:
            raise PeerUnavailable("zookeeper: kazoo is not installed: pip install -e '.[bench]'") from e
        logging.getLogger("kazoo").setLevel(logging.ERROR)
        self.zk = KazooClient(hosts=hosts, timeout=30.0, randomize_hosts=False)
        self.zk.start(timeout=30.0)
        self.zk.ensure_path("/qjm-bench")

    def put(self, value: bytes) -> str:
        path: str = self.zk.create("/qjm-bench/r-", value, sequence=True)
        return path

    def get(self, key: str) -> bytes:
        data: bytes = self.zk.get(key)[0]
        return data

    def pipelined(self, value: bytes, seconds: float) -> tuple[int, float]:
        def create() -> Any:
            return self.zk.create_async("/qjm-bench/p-", value, sequence=True)

        return _kazoo_windowed(ZK_WINDOW, seconds, create, _created, "pipelined create")

    def batched(self, value: bytes, seconds: float) -> tuple[int, float]:
        def multi() -> Any:
            tx = self.zk.transaction()
            for _ in range(ZK_MULTI):
                tx.create("/qjm-bench/b-", value, sequence=True)
            return tx.commit_async()

        return _kazoo_windowed(ZK_MULTI_WINDOW, seconds, multi, _multi_created, "multi")

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()


# -- etcd ----------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class EtcdCluster(PeerCluster):
    name = "etcd"
    how = (
        "3 members (WAL fsynced before the ack, the default); JSON gRPC-gateway through http.client; "
        f"sync: put; pipelined: {ETCD_THREADS} threads x keep-alive connection to one member, one put per request"
    )
    how_batched = (
        f"/v3/kv/txn of {ETCD_TXN_OPS} puts (--max-txn-ops, the default), {ETCD_TXN_CONNECTIONS} threads x "
        "keep-alive connection to one member"
    )

    def _start(self, deadline: float) -> None:
        ports = free_ports(6)
        self.client_ports = ports[0:3]
        peer = ports[3:6]
        initial = ",".join(f"m{i + 1}=http://127.0.0.1:{peer[i]}" for i in range(3))
        for i in range(3):
            d = self._dir(f"etcd{i + 1}")
            argv = [
                shutil.which("etcd") or "etcd",
                f"--name=m{i + 1}",
                f"--data-dir={os.path.join(d, 'data')}",
                f"--listen-client-urls=http://127.0.0.1:{self.client_ports[i]}",
                f"--advertise-client-urls=http://127.0.0.1:{self.client_ports[i]}",
                f"--listen-peer-urls=http://127.0.0.1:{peer[i]}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer[i]}",
                f"--initial-cluster={initial}",
                "--initial-cluster-token=qjm-bench",
                "--initial-cluster-state=new",
                "--logger=zap",
                "--log-outputs=stderr",
                "--log-level=warn",
            ]
            self.servers.spawn(argv, d, os.path.join(d, "server.log"))

        def healthy() -> bool:
            for p in self.client_ports:  # /health is true only with a leader and a committed read
                status, body = _http(p, "GET", "/health")
                if status != 200 or json.loads(body).get("health") != "true":
                    return False
            status, body = _http(self.client_ports[0], "GET", "/version")
            self.version = str(json.loads(body)["etcdserver"])
            return True

        wait_until("/health true on all members", self.servers, healthy, deadline)

    def client(self) -> PeerClient:
        return _EtcdClient(self.client_ports[0])


class _EtcdClient(PeerClient):
    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30.0)
        self.seq = 0

    @staticmethod
    def _call(conn: http.client.HTTPConnection, path: str, req: dict[str, Any]) -> dict[str, Any]:
        conn.request("POST", path, body=json.dumps(req), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"etcd: {path} -> HTTP {r.status}: {body[:300]!r}")
        out: dict[str, Any] = json.loads(body)
        return out

    def put(self, value: bytes) -> str:
        self.seq += 1
        key = f"/qjm-bench/r-{self.seq:012d}"
        self._call(self.conn, "/v3/kv/put", {"key": _b64(key.encode()), "value": _b64(value)})
        return key

    def get(self, key: str) -> bytes:
        resp = self._call(self.conn, "/v3/kv/range", {"key": _b64(key.encode())})
        return base64.b64decode(resp["kvs"][0]["value"])

    def pipelined(self, value: bytes, seconds: float) -> tuple[int, float]:
        v64 = _b64(value)
        return self._threads(
            ETCD_THREADS, seconds, lambda t, n: ("/v3/kv/put", {"key": _b64(f"/qjm-bench/p{t}-{n:012d}".encode()),
                                                                "value": v64}, 1)
        )  # fmt: skip

    def batched(self, value: bytes, seconds: float) -> tuple[int, float]:
        v64 = _b64(value)

        def txn(t: int, n: int) -> tuple[str, dict[str, Any], int]:
            puts = [
                {"requestPut": {"key": _b64(f"/qjm-bench/b{t}-{n:012d}-{i:03d}".encode()), "value": v64}}
                for i in range(ETCD_TXN_OPS)
            ]
            return "/v3/kv/txn", {"success": puts}, ETCD_TXN_OPS

        return self._threads(ETCD_TXN_CONNECTIONS, seconds, txn)

    def _threads(
        self, threads: int, seconds: float, request: Callable[[int, int], tuple[str, dict[str, Any], int]]
    ) -> tuple[int, float]:
        """``threads`` threads, each a keep-alive connection sending ``request(thread, n)`` (path,
        body, records in it) back to back for ``seconds``: (records acknowledged, elapsed s)."""
        counts = [0] * threads
        errors: list[BaseException] = []
        start = threading.Barrier(threads + 1)

        def writer(t: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30.0)
            try:
                start.wait()
                n = 0
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < seconds and not errors:
                    path, body, records = request(t, n)
                    self._call(conn, path, body)
                    counts[t] += records
                    n += 1
            except BaseException as e:
                errors.append(e)
            finally:
                conn.close()

        ts = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(threads)]
        for th in ts:
            th.start()
        start.wait()
        t0 = time.perf_counter()
        for th in ts:
            th.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"etcd: pipelined write failed: {errors[0]!r}")
        return sum(counts), elapsed

    def close(self) -> None:
        self.conn.close()


# -- NATS JetStream ------------------------------------------------------------------------------


class NatsCluster(PeerCluster):
    name = "nats"
    durable = False
    how = (
        "3 servers, file storage, stream replicas=3; nats-py; sync: js.publish waiting for the "
        f"ack; pipelined: js.publish_async, <= {NATS_WINDOW} acks outstanding; not durable per message: 2.9 "
        "fsyncs its file store on a timer (sync_interval: always is refused by 2.9.10)"
    )
    how_batched = (
        f"bursts of {NATS_BATCH} js.publish_async written in one go, <= {NATS_BATCH_WINDOW} acks outstanding "
        "(2.9 has no multi-message publish: each message is its own request and ack)"
    )

    def _start(self, deadline: float) -> None:
        ports = free_ports(9)
        self.client_ports, routes, monitor = ports[0:3], ports[3:6], ports[6:9]
        route_urls = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in routes)
        for i in range(3):
            d = self._dir(f"nats{i + 1}")
            cfg = os.path.join(d, "nats.conf")
            with open(cfg, "w") as f:
                f.write(
                    f'server_name: "n{i + 1}"\n'
                    f'listen: "127.0.0.1:{self.client_ports[i]}"\n'
                    f'http: "127.0.0.1:{monitor[i]}"\n'
                    "jetstream {\n"
                    f'  store_dir: "{os.path.join(d, "js")}"\n'
                    "  max_memory_store: 64MB\n"
                    "  max_file_store: 8GB\n"
                    "}\n"
                    "cluster {\n"
                    '  name: "qjm-bench"\n'
                    f'  listen: "127.0.0.1:{routes[i]}"\n'
                    f"  routes: [{route_urls}]\n"
                    "}\n"
                )
            argv = [shutil.which("nats-server") or "nats-server", "-c", cfg]
            self.servers.spawn(argv, d, os.path.join(d, "server.log"))

        def healthy() -> bool:
            for p in monitor:
                status, _ = _http(p, "GET", "/healthz")
                if status != 200:
                    return False
            status, body = _http(monitor[0], "GET", "/varz")
            self.version = str(json.loads(body)["version"])
            return True

        wait_until("/healthz ok on all servers", self.servers, healthy, deadline)
        self._deadline = deadline

    def client(self) -> PeerClient:
        return _NatsClient(self, self._deadline)


class _NatsClient(PeerClient):
    """nats-py is asyncio-only: this client owns an event loop and runs each call to completion on it."""

    def __init__(self, cluster: NatsCluster, deadline: float) -> None:
        try:
            import nats
        except ImportError as e:
            raise PeerUnavailable("nats: nats-py is not installed: pip install -e '.[bench]'") from e
        self.loop = asyncio.new_event_loop()
        self.cluster = cluster
        servers = [f"nats://127.0.0.1:{p}" for p in cluster.client_ports[:1]]  # one server, like one ZK session
        try:
            self.nc = self.loop.run_until_complete(nats.connect(servers=servers, connect_timeout=10))
            self.js = self.nc.jetstream(publish_async_max_pending=max(NATS_WINDOW, NATS_BATCH_WINDOW))
            self.loop.run_until_complete(self._stream(deadline))
        except BaseException:
            self.loop.close()
            raise

    async def _stream(self, deadline: float) -> None:
        """Create the R3 file stream, retrying until the JetStream meta leader exists, then wait for its leader."""
        from nats.js.api import StorageType, StreamConfig

        cfg = StreamConfig(name=NATS_STREAM, subjects=[NATS_SUBJECT], storage=StorageType.FILE, num_replicas=3)
        last: BaseException | None = None
        while True:
            self.cluster.servers.check_alive()
            try:
                info = await self.js.add_stream(cfg)
                while not (info.cluster and info.cluster.leader and len(info.cluster.replicas or []) == 2):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"nats: stream {NATS_STREAM} has no leader and two replicas: {info}")
                    await asyncio.sleep(0.1)  # polling interval: stream_info decides
                    info = await self.js.stream_info(NATS_STREAM)
                return
            except TimeoutError:
                raise
            except Exception as e:
                last = e
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats: could not create stream {NATS_STREAM} (last error: {last!r})")
            await asyncio.sleep(0.2)

    def put(self, value: bytes) -> str:
        ack = self.loop.run_until_complete(self.js.publish(NATS_SUBJECT, value, timeout=30.0))
        return str(ack.seq)

    def get(self, key: str) -> bytes:
        msg = self.loop.run_until_complete(self.js.get_msg(NATS_STREAM, int(key)))
        return msg.data or b""

    def pipelined(self, value: bytes, seconds: float) -> tuple[int, float]:
        return self.loop.run_until_complete(self._pipelined(value, seconds))

    def batched(self, value: bytes, seconds: float) -> tuple[int, float]:
        return self.loop.run_until_complete(self._pipelined(value, seconds, NATS_BATCH, NATS_BATCH_WINDOW))

    async def _pipelined(self, value: bytes, seconds: float, burst: int = 1, window: int = 0) -> tuple[int, float]:
        """Publish ``burst`` messages at a time (no ack awaited in between) for ``seconds``; with a
        ``window``, wait before a burst while that many acks are outstanding (else nats-py's own)."""
        acked = [0]
        sent = [0]
        errors: list[BaseException] = []
        room = asyncio.Event()  # set when a whole burst fits in the window again

        def done(f: asyncio.Future[Any]) -> None:
            if f.cancelled():
                errors.append(asyncio.CancelledError())
            elif f.exception() is not None:
                errors.append(f.exception())  # type: ignore[arg-type]
            else:
                acked[0] += 1
            if errors or sent[0] - acked[0] + burst <= window:
                room.set()

        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds and not errors:
            if window and sent[0] - acked[0] + burst > window:
                room.clear()
                await room.wait()  # the acks' callbacks set it: no polling
                continue
            for _ in range(burst):
                fut = await self.js.publish_async(NATS_SUBJECT, value, wait_stall=30.0)
                sent[0] += 1
                fut.add_done_callback(done)
        await asyncio.wait_for(self.js.publish_async_completed(), timeout=60.0)
        elapsed = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"nats: pipelined publish failed: {errors[0]!r}")
        return acked[0], elapsed

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.nc.close())
        finally:
            self.loop.close()


CLUSTERS: dict[str, type[PeerCluster]] = {"zookeeper": ZooKeeperCluster, "etcd": EtcdCluster, "nats": NatsCluster}


def make_cluster(name: str, base: str) -> PeerCluster:
    if name not in CLUSTERS:
        raise ValueError(f"unknown peer {name!r}: one of {', '.join(PEERS)}")
    return CLUSTERS[name](base)


@contextmanager
def running(name: str, base: str) -> Iterator[tuple[PeerCluster, PeerClient]]:
    """A started cluster and a connected client; both are torn down on the way out, whatever happens."""
    with make_cluster(name, base) as cluster:
        client = cluster.client()
        try:
            yield cluster, client
        finally:
            client.close()


def measure(name: str, base: str, cfg: dict[str, float]) -> dict[str, Any]:
    """The workloads against one peer, in phases (``qjm.bench.workload``): ``cfg`` holds ``rounds``
    (latency samples per phase), ``seconds`` per throughput phase and ``phases``.

    Returns raw samples in the shape of ``qjm.bench.workers.worker_qjm``'s (``latency``, ``tput{size}``
    and their ``*_warmup``), the batched client's phases as ``batch{size}``, ``durable``, ``version``,
    ``how`` and ``how_batched``."""
    out: dict[str, Any] = {}
    progress(f"{name}: starting three servers")
    with running(name, base) as (cluster, client):
        try:
            _workloads(name, cluster, client, cfg, out)
        except Exception as e:  # the servers' side of it goes with the error, their logs are deleted after
            raise PeerFailed(f"{name}: {type(e).__name__}: {e}\n{cluster.servers.describe()}") from e
    return out


class PeerFailed(RuntimeError):
    """A peer's workload failed; the message holds the error and its servers' states and log tails."""


def _workloads(name: str, cluster: PeerCluster, client: PeerClient, cfg: dict[str, float], out: dict[str, Any]) -> None:
    """``measure``'s phases against a started ``cluster`` through ``client``, into ``out``."""
    rounds = int(cfg["rounds"])
    rec = os.urandom(LATENCY_RECORD)

    def latency_phase() -> list[float]:
        lat = []
        for _ in range(rounds):
            t = time.perf_counter()
            client.put(rec)
            lat.append(time.perf_counter() - t)
        return lat

    out["latency_warmup"], out["latency"] = phased(cfg, f"{name} sync latency", latency_phase)
    for size in RECORD_SIZES:
        value = os.urandom(size)
        for key, fn, what in (("tput", client.pipelined, "one per request"), ("batch", client.batched, "batched")):

            def phase(fn: Callable[[bytes, float], tuple[int, float]] = fn, value: bytes = value) -> float:
                n, elapsed = fn(value, cfg["seconds"])
                return n / elapsed

            out[f"{key}{size}_warmup"], out[f"{key}{size}"] = phased(cfg, f"{name} {size} B {what}", phase)
    out.update(durable=cluster.durable, version=cluster.version, how=cluster.how, how_batched=cluster.how_batched)
