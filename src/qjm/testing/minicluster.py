"""MiniJournalCluster: N real JournalNodes on loopback, in temporary directories (Hadoop's harness).

Nodes run as subprocesses by default (``python -m qjm.testing.node``: a node served as ``qjm
journalnode`` serves one, with the node-side faults of ``server_faults``), so ``kill`` (SIGKILL)
and ``pause`` (SIGSTOP) are real; each node keeps its ports across restarts so the journal URI
stays valid. ``in_process=True`` runs them as threads of this process, faster to start, for tests
that need neither kill nor pause.
"""

from __future__ import annotations

import errno
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from types import TracebackType

from qjm.server.node import JournalNode
from qjm.testing.certs import Pki
from qjm.testing.faults import ServerFaults
from qjm.testing.http_client import HttpsClient, http_get
from qjm.testing.ports import free_port

READY_TIMEOUT = 120.0  # a node process imports gRPC first: seconds each on a loaded 2-core machine
START_ATTEMPTS = 3  # a first start that fails (another process took a probed port) gets fresh ports


class _Node:
    def __init__(self, index: int, data_dir: str, rpc_port: int, data_port: int, http_port: int, faults: str) -> None:
        self.index = index
        self.data_dir = data_dir
        self.rpc_port = rpc_port
        self.data_port = data_port
        self.http_port = http_port
        self.faults = faults
        self.proc: subprocess.Popen[bytes] | None = None
        self.inproc: JournalNode | None = None
        self.paused = False


class MiniJournalCluster:
    """``with MiniJournalCluster(3) as c: w = qjm.open_writer(c.uri, create=True)``"""

    def __init__(
        self,
        num_nodes: int = 3,
        base_dir: str | None = None,
        *,
        journal_id: str = "test-journal",
        in_process: bool = False,
        host: str = "127.0.0.1",
        server_faults: dict[int, str] | None = None,
        env: dict[str, str] | None = None,
        pki: Pki | None = None,
        sync_interval: float = 0.0,
        http_client_auth: str = "optional",
    ) -> None:
        """``pki``: node ``i`` serves mutual TLS with ``pki.nodes[i]`` (no ``[authz]`` table: every
        certificate of the CA may do everything); clients then need ``tls=`` (``client_tls``), and
        the HTTP ports serve HTTPS (``http_client``), a client certificate ``http_client_auth``."""
        self._own_dir = base_dir is None
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="qjm-cluster-")
        self.journal_id = journal_id
        self.in_process = in_process
        self.host = host
        self.env = env
        self.pki = pki
        self.http_client_auth = http_client_auth
        self.sync_interval = sync_interval  # > 0: every node catches up from the others (design §4.4)
        faults = server_faults or {}
        self.nodes = [
            _Node(
                i,
                os.path.join(self.base_dir, f"jn{i}"),
                free_port(host),
                free_port(host),
                free_port(host),
                faults.get(i, ""),
            )
            for i in range(num_nodes)
        ]
        started: list[list[str]] = []
        for i in range(num_nodes):
            self._first_start(i)
            started.append(self.addresses)
        if sync_interval > 0:
            # A node that had to take fresh ports moved after the nodes before it learned their peers.
            for i, seen in enumerate(started):
                if seen != self.addresses:
                    self.restart(i)

    # -- addresses ---------------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        return [f"{self.host}:{n.rpc_port}" for n in self.nodes]

    @property
    def uri(self) -> str:
        return self.uri_for(self.journal_id)

    def uri_for(self, journal_id: str) -> str:
        return "qjournal://" + ";".join(self.addresses) + "/" + journal_id

    def name(self, i: int) -> str:
        """The node name loggers and fault plans use for node ``i``."""
        return self.addresses[i]

    def http_address(self, i: int) -> str:
        """Where node ``i`` serves /metrics, /health and /status."""
        return f"{self.host}:{self.nodes[i].http_port}"

    @property
    def http_client(self) -> HttpsClient | None:
        """How to reach the HTTP ports: None (plain HTTP) without a PKI; with one HTTPS, trusting its
        CA, with a certificate of the CA when the nodes require one (a client's, else node 0's)."""
        if self.pki is None:
            return None
        if self.http_client_auth != "required":
            return HttpsClient(self.pki.ca_file)
        return HttpsClient.of(next(iter(self.pki.clients.values()), self.pki.nodes[0]))

    def http_get(self, i: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
        """(status, body, content type) of a GET on node ``i``'s HTTP port, over HTTPS with a PKI."""
        return http_get(self.http_address(i), path, https=self.http_client, headers=headers)

    def node_dir(self, i: int) -> str:
        return self.nodes[i].data_dir

    def journal_dir(self, i: int, journal_id: str | None = None) -> str:
        return os.path.join(self.nodes[i].data_dir, journal_id or self.journal_id, "current")

    def finalized_segments(self, i: int) -> dict[str, bytes]:
        """Node ``i``'s finalized segment files of the journal, by name: their bytes."""
        d = self.journal_dir(i)
        out = {}
        for name in os.listdir(d):
            if name.startswith("edits_") and "inprogress" not in name and "." not in name:
                with open(os.path.join(d, name), "rb") as f:
                    out[name] = f.read()
        return out

    # -- lifecycle ---------------------------------------------------------------------------

    def _first_start(self, i: int) -> None:
        """Start node ``i``; if it cannot bind its ports, try again on fresh ones (nobody knows the
        URI yet). Other processes on this machine may take a port between the probe and the bind."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self.start(i)
                return
            except (RuntimeError, OSError) as e:
                n = self.nodes[i]
                if attempt == START_ATTEMPTS or not self._bind_failed(n, e):
                    raise
                if n.proc is not None:
                    n.proc.wait()
                    if n.proc.stdout is not None:
                        n.proc.stdout.close()
                    n.proc = None
                n.rpc_port, n.data_port, n.http_port = free_port(self.host), free_port(self.host), free_port(self.host)

    def _bind_failed(self, n: _Node, e: BaseException) -> bool:
        if self.in_process:
            return "bind" in str(e).lower() or getattr(e, "errno", None) == errno.EADDRINUSE
        try:
            with open(os.path.join(self.base_dir, f"jn{n.index}.log"), "rb") as f:
                tail = f.read()[-4000:]
        except OSError:
            return False
        return b"Failed to bind" in tail or b"Address already in use" in tail

    def start(self, i: int) -> None:
        n = self.nodes[i]
        if n.proc is not None and n.proc.poll() is not None:
            self._reap(n)  # it died on its own (a fault hook, a crash)
        if n.proc is not None or n.inproc is not None:
            raise RuntimeError(f"node {i} is already running")
        os.makedirs(n.data_dir, exist_ok=True)
        if self.in_process:
            hooks = ServerFaults.parse(n.faults) if n.faults else None
            n.inproc = JournalNode(
                n.data_dir, host=self.host, rpc_port=n.rpc_port, data_port=n.data_port, hooks=hooks,
                http_port=n.http_port, tls=self.pki.nodes[i] if self.pki is not None else None,
                http_client_auth=self.http_client_auth,
                peers=self.addresses if self.sync_interval > 0 else None, sync_interval=self.sync_interval,
            ).start()  # fmt: skip
            return
        cmd = [
            sys.executable, "-m", "qjm.testing.node",
            "--data-dir", n.data_dir, "--host", self.host,
            "--rpc-port", str(n.rpc_port), "--data-port", str(n.data_port), "--http-port", str(n.http_port),
            "--ready-line",
        ]  # fmt: skip
        if n.faults:
            cmd += ["--fault", n.faults]
        if self.pki is not None:
            tls = self.pki.nodes[i]
            cmd += ["--tls-ca", tls.ca_file, "--tls-cert", tls.cert_file, "--tls-key", tls.key_file]
            cmd += ["--http-client-auth", self.http_client_auth]
        if self.sync_interval > 0:
            cmd += ["--peers", ",".join(self.addresses), "--sync-interval", str(self.sync_interval)]
        env = dict(os.environ, **(self.env or {}))
        with open(os.path.join(self.base_dir, f"jn{i}.log"), "ab") as log:
            n.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env)
        self._await_ready(n)

    def _await_ready(self, n: _Node) -> None:
        assert n.proc is not None and n.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(n.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + READY_TIMEOUT
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                n.proc.kill()
                raise RuntimeError(f"node {n.index} did not become ready; see {self.base_dir}/jn{n.index}.log")
            b = os.read(n.proc.stdout.fileno(), 4096)
            if not b:
                code = n.proc.wait()
                raise RuntimeError(f"node {n.index} exited with {code}; see {self.base_dir}/jn{n.index}.log")
            line += b
        sel.close()
        if not line.startswith(b"READY"):
            raise RuntimeError(f"node {n.index} said {line!r} instead of READY")

    def restart(self, i: int) -> None:
        self.stop(i)
        self.start(i)

    def stop(self, i: int) -> None:
        """Graceful stop (SIGTERM); a stopped node can be started again with ``start``/``restart``."""
        n = self.nodes[i]
        if n.inproc is not None:
            n.inproc.stop(grace=0)
            n.inproc = None
        if n.proc is not None:
            if n.paused:
                n.proc.send_signal(signal.SIGCONT)
                n.paused = False
            n.proc.terminate()
            try:
                n.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait()
            self._reap(n)

    def kill(self, i: int) -> None:
        """SIGKILL: no flush, no goodbye, whatever was not fdatasync'd may be torn."""
        n = self._proc_node(i)
        assert n.proc is not None
        n.proc.kill()
        n.proc.wait()
        n.paused = False
        self._reap(n)

    def pause(self, i: int) -> None:
        n = self._proc_node(i)
        assert n.proc is not None
        n.proc.send_signal(signal.SIGSTOP)
        n.paused = True
        self._await_stopped(n.proc.pid)

    @staticmethod
    def _await_stopped(pid: int) -> None:
        """SIGSTOP is asynchronous: return only once every thread of the node is stopped.

        io_uring's kernel workers (``iou-wrk-*``) are not waited for: they run no node code, and
        one the kernel starts for an already submitted write after the stop took effect may
        never enter the stopped state (a chaos run in CI waited on one for 30 s).
        """
        deadline = time.monotonic() + READY_TIMEOUT
        task_dir = f"/proc/{pid}/task"
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = {}
            for tid in os.listdir(task_dir):
                try:
                    with open(f"{task_dir}/{tid}/comm") as f:
                        comm = f.read().strip()
                    with open(f"{task_dir}/{tid}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue  # the thread exited meanwhile
                if not comm.startswith(("iou-wrk-", "iou-sqp-")):
                    states[f"{tid} {comm}"] = state
            if states and all(st in ("T", "t") for st in states.values()):
                return
            os.sched_yield()
        raise RuntimeError(f"node process {pid} did not stop: thread states {states}")

    def resume(self, i: int) -> None:
        n = self._proc_node(i)
        assert n.proc is not None
        n.proc.send_signal(signal.SIGCONT)
        n.paused = False

    def is_running(self, i: int) -> bool:
        n = self.nodes[i]
        return n.inproc is not None or (n.proc is not None and n.proc.poll() is None)

    def _proc_node(self, i: int) -> _Node:
        n = self.nodes[i]
        if self.in_process:
            raise RuntimeError("kill/pause need subprocess nodes (in_process=False)")
        if n.proc is None:
            raise RuntimeError(f"node {i} is not running")
        return n

    @staticmethod
    def _reap(n: _Node) -> None:
        if n.proc is not None and n.proc.stdout is not None:
            n.proc.stdout.close()
        n.proc = None

    def shutdown(self) -> None:
        for i in range(len(self.nodes)):
            try:
                self.stop(i)
            except Exception:
                pass
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> MiniJournalCluster:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None) -> None:
        self.shutdown()
