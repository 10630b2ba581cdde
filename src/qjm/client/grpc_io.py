"""``GrpcNodeIO``: a ``NodeIO`` over the process's shared gRPC channel to a node, the shared
executors, and the native or threaded data link; ``error_from_rpc`` rebuilds a node's typed error."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc

from qjm import errors
from qjm._native import backend_of
from qjm.client import shared
from qjm.client.data_link import DataLink, LatencySink, LinkFailed
from qjm.client.fanout_link import FanoutLink, shared_engine
from qjm.client.node_io import NoReply
from qjm.client.threaded_link import ThreadedLink
from qjm.config import QJMConfig
from qjm.errors import NodeUnavailableError, QJMError
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol.download import verified_chunks
from qjm.protocol.rpcmeta import CLIENT_GRPC_OPTIONS, ERROR_CODE_KEY, rpc_code

__all__ = ["FollowCall", "GrpcNodeIO", "error_from_rpc", "tls_hint"]

T = TypeVar("T")
CHANNEL_OPTIONS = tuple(CLIENT_GRPC_OPTIONS)

METHODS = {
    "is_formatted": "IsFormatted",
    "format": "Format",
    "get_journal_state": "GetJournalState",
    "new_epoch": "NewEpoch",
    "start_log_segment": "StartLogSegment",
    "finalize_log_segment": "FinalizeLogSegment",
    "purge_logs": "PurgeLogs",
    "prepare_recovery": "PrepareRecovery",
    "accept_recovery": "AcceptRecovery",
    "get_edit_log_manifest": "GetEditLogManifest",
    "get_journaled_edits": "GetJournaledEdits",
    "status": "Status",
}
"""Control operation → its method of the ``QJournal`` service (the simulator calls the servicer by it too)."""


def error_from_rpc(node: str, e: grpc.RpcError, *, tls: bool | None = None) -> QJMError:
    """Rebuild the node's typed error from the status and trailing metadata it sent. ``tls`` (did
    this client dial with TLS) adds a hint to a connection the node closed or a failed handshake."""
    code = rpc_code(e)
    trailing = getattr(e, "trailing_metadata", None)
    md = dict(trailing() or ()) if callable(trailing) else {}
    details_fn = getattr(e, "details", None)
    details = (details_fn() if callable(details_fn) else None) or str(e)
    qcode = md.get(ERROR_CODE_KEY)
    if isinstance(qcode, str):
        return errors.from_code(qcode, f"{node}: {details}")
    if code is grpc.StatusCode.UNAVAILABLE:
        return NoReply(f"{node}: {details}{tls_hint(details, tls)}")
    if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return NodeUnavailableError(f"{node}: {details}{tls_hint(details, tls)}")
    if tls and "handshake failed" in details.lower():
        return NodeUnavailableError(f"{node}: {details}{tls_hint(details, tls)}")
    return QJMError(f"{node}: {code}: {details}")


def tls_hint(details: str, tls: bool | None) -> str:
    """Why a node may have closed the connection at once, when that is what gRPC reports: the
    node never says why (a refused handshake tells the peer nothing it could misuse)."""
    if tls is None:
        return ""
    text = details.lower()
    if "handshake failed" in text and tls:
        return (
            " (TLS handshake failed: the node may serve plaintext, or its certificate is not of this "
            "client's CA or does not name the host dialled)"
        )
    if "socket closed" in text:
        if tls:
            return " (if the node is up, it refused this client's certificate: not of its CA, or expired)"
        return " (if the node is up, it may require mutual TLS: give tls_ca, tls_cert and tls_key)"
    return ""


class FollowCall:
    """One node's push of committed frames (design §3.1): ``(frames, first_txid, last_txid,
    committed_txid)`` per message, ``frames`` empty on a heartbeat. ``cancel`` (from any thread)
    ends the iteration quietly; any other end raises the node's typed error."""

    def __init__(self, node: str, call: Any, tls: bool) -> None:
        self.node = node
        self._call = call
        self._tls = tls
        self._cancelled = False

    def __iter__(self) -> Iterator[tuple[bytes, int, int, int]]:
        try:
            for c in self._call:
                yield c.frames, c.first_txid, c.last_txid, c.committed_txid
        except grpc.RpcError as e:
            if self._cancelled:
                return
            raise error_from_rpc(self.node, e, tls=self._tls) from None
        if not self._cancelled:
            raise NodeUnavailableError(f"{self.node}: the node ended the follow")

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()


class GrpcNodeIO:
    """One node reached over gRPC (control) and framed TCP (data), from this process."""

    def __init__(self, name: str, journal_id: str, config: QJMConfig) -> None:
        self.name = name
        self.journal_id = journal_id
        self.config = config
        self.quiet_links = backend_of("fanout") == "native"
        self.times_acks = self.quiet_links  # the engine's links time their acks (FanoutLink)
        self._tls = config.tls is not None
        # shared with every other logger of this process that talks to the same node (qjm.client.shared)
        self._channel, self._stub = shared.acquire_channel(name, CHANNEL_OPTIONS, config.tls)
        self._exec = shared.SerialExecutor()  # this node's calls, in order (Hadoop: one thread per logger)
        self._par = shared.PooledExecutor()  # reads, side by side
        self._released = False
        self._lock = threading.Lock()

    def submit(self, what: str, fn: Callable[[], T], *, parallel: bool = False) -> Future[T]:
        return (self._par if parallel else self._exec).submit(fn)

    def beside(self, fn: Callable[[], T]) -> Future[T]:
        return self._par.submit(fn)

    def call(self, op: str, request: Any, timeout: float) -> Any:
        try:
            return getattr(self._stub, METHODS[op])(request, timeout=timeout)
        except grpc.RpcError as e:
            raise error_from_rpc(self.name, e, tls=self._tls) from None

    def ping(self, timeout: float) -> bool:
        # A restarted node sits in gRPC's reconnect backoff for a moment: waiting for the
        # connection tells a node that is back from one that is down.
        try:
            ping = pb.JournalIdRequest(journal_id=self.journal_id)
            self._stub.IsFormatted(ping, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError:
            return False
        return True

    def monotonic(self) -> float:
        return time.monotonic()

    def open_link(
        self, data_address: str, on_fail: LinkFailed, *, report_acks: bool, on_latencies: LatencySink | None = None
    ) -> DataLink:
        c = self.config
        try:
            if self.quiet_links:
                # The native fan-out: one epoll thread for every node's link (qjm.client.fanout_link).
                return FanoutLink(
                    self.name,
                    data_address,
                    self.journal_id,
                    c.timeouts.connect,
                    on_fail,
                    max_count=max(1024, 16 * c.max_inflight_batches),
                    max_bytes=c.queued_edits_limit_bytes or 1,
                    report_acks=report_acks,
                    tls=c.tls,
                    on_latencies=on_latencies,
                )
            return ThreadedLink(self.name, data_address, self.journal_id, c.timeouts.connect, on_fail, tls=c.tls)
        except OSError as e:
            raise NodeUnavailableError(f"{self.name}: cannot reach the data plane at {data_address}: {e}") from e

    def wake_counters(self) -> None:
        if self.quiet_links:
            shared_engine().fanout.notify()

    def read_segment(self, journal_id: str, segment: int) -> Iterator[bytes]:
        req = pb.SegmentRequest(journal_id=journal_id, segment_txid=segment)
        try:
            yield from verified_chunks(
                self._stub.DownloadSegment(req, timeout=self.config.timeouts.select_input_streams * 30),
                f"{self.name}: segment {segment}",
            )
        except grpc.RpcError as e:
            raise error_from_rpc(self.name, e, tls=self._tls) from None

    def follow(self, journal_id: str, since: int, heartbeat: float) -> FollowCall:
        req = pb.FollowRequest(journal_id=journal_id, from_txid=since, heartbeat_ms=max(1, int(heartbeat * 1000)))
        return FollowCall(self.name, self._stub.Follow(req), self._tls)

    def shutdown(self) -> None:
        self._exec.shutdown(cancel_futures=True)
        self._par.shutdown(cancel_futures=True)
        with self._lock:
            release, self._released = not self._released, True
        if release:
            shared.release_channel(self.name, CHANNEL_OPTIONS, self.config.tls)
