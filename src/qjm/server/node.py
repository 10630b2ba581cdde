"""JournalNode: wires journals on a data directory to the gRPC control plane and the TCP data plane."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from concurrent import futures

import grpc

from qjm._native import framing
from qjm.errors import CorruptFrameError, NotFoundError, StorageError
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol.rpcmeta import GRPC_OPTIONS, add_servicer, make_stub
from qjm.server.data import DataServer
from qjm.server.journal import JournalHooks
from qjm.server.limits import NodeLimits
from qjm.server.registry import JournalRegistry
from qjm.server.rpc import QJournalServicer

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
    """One node: any number of journals under ``data_dir``, each created by ``Format``.

    The data directory is locked (``<data_dir>/in_use.lock``) for the node's life: a second node
    on it refuses to start. A node that fails to start releases everything it took (ports, lock).
    """

    def __init__(
        self,
        data_dir: str,
        *,
        host: str = "127.0.0.1",
        rpc_port: int = 0,
        data_port: int = 0,
        hooks: JournalHooks | None = None,
        fetcher: Callable[[str, str, int], bytes] = fetch_segment,
        rpc_workers: int = 16,
        limits: NodeLimits | None = None,
    ) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.host = host
        self.limits = (limits or NodeLimits()).fitted_to_descriptors()
        self._lock_fd = lock_data_dir(self.data_dir)
        data_server: DataServer | None = None
        try:
            self.journals = JournalRegistry(
                self.data_dir, max_open=self.limits.max_open_journals, fetcher=fetcher, hooks=hooks
            )
            # The control port is bound last: gRPC keeps a port it bound until the server has run,
            # so nothing may fail after it (Hadoop's HDFS-12407: a failed start kept its RPC port).
            data_server = DataServer((host, data_port), self.journals, self.limits)
            self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=rpc_workers), options=GRPC_OPTIONS)
            add_servicer(QJournalServicer(self.journals, lambda: self.data_address), self._grpc)
            self.rpc_port = self._grpc.add_insecure_port(f"{host}:{rpc_port}")
            if self.rpc_port == 0:
                raise OSError(errno.EADDRINUSE, f"cannot bind the control plane to {host}:{rpc_port}")
        except BaseException:
            if data_server is not None:
                data_server.server_close()
            unlock_data_dir(self._lock_fd)
            raise
        self.data_server = data_server
        self.data_port = self.data_server.server_address[1]
        self._data_thread: threading.Thread | None = None

    @property
    def rpc_address(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    @property
    def data_address(self) -> str:
        return f"{self.host}:{self.data_port}"

    def start(self) -> JournalNode:
        self._grpc.start()
        self._data_thread = self.data_server.start()
        log.info("JournalNode serving %s: control %s, data %s", self.data_dir, self.rpc_address, self.data_address)
        return self

    def stop(self, grace: float | None = None) -> None:
        self.data_server.shutdown()
        self.data_server.server_close()
        self._grpc.stop(grace).wait()
        self.data_server.close_connections()
        self.journals.close_all()
        if self._lock_fd >= 0:
            unlock_data_dir(self._lock_fd)
            self._lock_fd = -1

    def wait(self) -> None:
        self._grpc.wait_for_termination()


def lock_data_dir(data_dir: str) -> int:
    """Create ``data_dir`` if needed and take its exclusive lock; the fd holds it.

    Raises ``StorageError`` naming the directory (and the holder's pid, when it wrote one) if
    another node has it, or if the directory cannot be created or locked.
    """
    path = os.path.join(data_dir, "in_use.lock")
    try:
        os.makedirs(data_dir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise StorageError(f"cannot use data directory {data_dir}: {e.strerror or e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise StorageError(
            f"data directory {data_dir} is in use by another JournalNode"
            + (f" (pid {holder})" if holder.isdigit() else "")
            + f": {e.strerror}; one directory serves one node"
        ) from e
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def unlock_data_dir(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
