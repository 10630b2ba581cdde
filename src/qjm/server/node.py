"""JournalNode: wires journals on a data directory to the gRPC control plane and the TCP data plane."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent import futures

import grpc

from qjm._native import framing
from qjm.addresses import advertised, check_bindable, join_host_port
from qjm.errors import BindError, CorruptFrameError, NotFoundError, QJMError
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol.rpcmeta import GRPC_OPTIONS, add_servicer, make_stub
from qjm.server.data import DataServer
from qjm.server.http import NodeHttpServer
from qjm.server.journal import Journal, JournalHooks
from qjm.server.metrics import NodeMetrics
from qjm.server.rpc import QJournalServicer
from qjm.server.storage import DiskStorage, journal_ids_on_disk

log = logging.getLogger("qjm.node")


def fetch_segment(source: str, journal_id: str, segment: int, timeout: float = 60.0) -> bytes:
    """Download a segment from another node's control plane and verify what its sender vouched for."""
    with grpc.insecure_channel(source, options=GRPC_OPTIONS) as ch:
        stub = make_stub(ch)
        parts: list[bytes] = []
        last: pb.SegmentChunk | None = None
        try:
            for chunk in stub.DownloadSegment(
                pb.SegmentRequest(journal_id=journal_id, segment_txid=segment), timeout=timeout
            ):
                parts.append(chunk.data)
                if chunk.last:
                    last = chunk
        except grpc.RpcError as e:
            raise NotFoundError(f"download of segment {segment} from {source} failed: {e.details()}") from e
    data = b"".join(parts)
    if last is None or last.total_bytes != len(data) or last.xxh3 != framing.xxh3_64(data):
        raise CorruptFrameError(f"download of segment {segment} from {source} arrived damaged", reason="download")
    return data


class JournalNode:
    """One node: any number of journals under ``data_dir``, each created on first use.

    ``host`` is where both ports listen (``data_host`` moves the data plane elsewhere); the
    ``*_advertise`` addresses (``host`` or ``host:port``) are what clients are told, by default
    the bind address; a wildcard bind advertises no host (qjm.addresses).
    """

    def __init__(
        self,
        data_dir: str,
        *,
        host: str = "127.0.0.1",
        rpc_port: int = 0,
        data_port: int = 0,
        data_host: str | None = None,
        rpc_advertise: str | None = None,
        data_advertise: str | None = None,
        hooks: JournalHooks | None = None,
        fetcher: Callable[[str, str, int], bytes] = fetch_segment,
        rpc_workers: int = 16,
        http_port: int | None = None,
        http_host: str | None = None,
    ) -> None:
        self.host = host
        self.data_host = host if data_host is None else data_host
        advertised(host, rpc_port, rpc_advertise)  # a bad advertised address fails before any port is taken
        advertised(self.data_host, data_port, data_advertise)
        self.data_dir = os.path.abspath(data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self._hooks = hooks
        self._fetcher = fetcher
        self._journals: dict[str, Journal] = {}
        self._storages: list[DiskStorage] = []
        self._lock = threading.Lock()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=rpc_workers), options=GRPC_OPTIONS)
        add_servicer(QJournalServicer(self.get_journal, lambda: self.data_address), self._grpc)
        check_bindable(host, rpc_port, "control plane")
        check_bindable(self.data_host, data_port, "data plane")  # before gRPC holds the other port
        self.http_host = host if http_host is None else http_host
        if http_port is not None:
            check_bindable(self.http_host, http_port, "HTTP port")
        try:
            self.rpc_port = self._grpc.add_insecure_port(join_host_port(host, rpc_port))
        except RuntimeError:  # taken between the check and here; gRPC says no more than this
            self.rpc_port = 0
        if self.rpc_port == 0:
            raise BindError(f"cannot bind the control plane to {join_host_port(host, rpc_port)}")
        self._data = DataServer((self.data_host, data_port), self.get_journal)
        self.data_port = self._data.server_address[1]
        self._data_thread: threading.Thread | None = None
        self.rpc_address = advertised(host, self.rpc_port, rpc_advertise)
        self.data_address = advertised(self.data_host, self.data_port, data_advertise)
        self.load_failures: dict[str, str] = {}  # journal id -> why its directory did not load
        self.metrics = NodeMetrics(self.data_dir, self.loaded_journals, lambda: dict(self.load_failures), self._info)
        # ``http_port`` None: no HTTP port (library use); 0: any free port. It listens on ``host``
        # unless ``http_host`` says otherwise (Hadoop's dfs.journalnode.http-bind-host).
        self.http = NodeHttpServer(self.http_host, http_port, self.metrics) if http_port is not None else None

    @property
    def rpc_bind_address(self) -> str:
        return join_host_port(self.host, self.rpc_port)

    @property
    def data_bind_address(self) -> str:
        return join_host_port(self.data_host, self.data_port)

    @property
    def http_address(self) -> str | None:
        return join_host_port(self.http_host, self.http.port) if self.http is not None else None

    def _info(self) -> dict[str, str]:
        http = self.http_address or ""
        return {"rpc_address": self.rpc_address, "data_address": self.data_address, "http_address": http}

    def loaded_journals(self) -> list[Journal]:
        with self._lock:
            return list(self._journals.values())

    def load_journals(self) -> None:
        """Open every journal on disk now, so that one that cannot load is known (and logged, and
        reported by /health) before a writer needs it; a later successful open clears it."""
        for jid in journal_ids_on_disk(self.data_dir):
            try:
                self.get_journal(jid)
            except (QJMError, OSError) as e:
                self.load_failures[jid] = f"{type(e).__name__}: {e}"
                log.error("journal %s did not load: %s: %s", jid, type(e).__name__, e)

    def get_journal(self, journal_id: str) -> Journal:
        with self._lock:
            j = self._journals.get(journal_id)
            if j is None:
                storage = DiskStorage(self.data_dir, journal_id)  # validates the id, takes the lock
                self._storages.append(storage)
                j = Journal(storage, fetcher=self._fetcher, hooks=self._hooks)
                self._journals[journal_id] = j
                self.load_failures.pop(journal_id, None)
                _log_loaded(j)
            return j

    def start(self) -> JournalNode:
        self.load_journals()
        self._grpc.start()
        self._data_thread = self._data.start()
        if self.http is not None:
            self.http.start()
        log.info(
            "JournalNode serving %s: control %s (advertised %s), data %s (advertised %s), http %s",
            self.data_dir, self.rpc_bind_address, self.rpc_address, self.data_bind_address, self.data_address,
            self.http_address or "off",
        )  # fmt: skip
        return self

    def stop(self, grace: float | None = None) -> None:
        if self.http is not None:
            self.http.stop()
        self._data.shutdown()
        self._data.server_close()
        self._grpc.stop(grace).wait()
        with self._lock:
            for j in self._journals.values():
                j.close()
            for s in self._storages:
                s.close()
            self._journals.clear()
            self._storages.clear()

    def wait(self) -> None:
        self._grpc.wait_for_termination()


def _log_loaded(j: Journal) -> None:
    st = j.peek_state()
    if st is None:
        log.info("loaded journal %s (%s): not formatted", j.journal_id, j.storage.describe())
        return
    log.info(
        "loaded journal %s (%s): promised epoch %d, writer epoch %d, last txid %d, committed %d, open segment %s",
        j.journal_id, j.storage.describe(), st.last_promised_epoch, st.last_writer_epoch, st.highest_written_txid,
        st.committed_txid, st.open_segment_txid or "none",
    )  # fmt: skip
