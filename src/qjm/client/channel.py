"""RemoteLogger: one node over the network (Hadoop IPCLoggerChannel), on both planes.

Control calls run on a single-thread executor, so each node sees them in submission order and
the serial numbers it checks always increase. Batches go out on a long-lived TCP connection by a
sender thread and are acknowledged cumulatively by the node; a receiver thread completes their
futures. A node that fails a batch, or lets its unacknowledged bytes pass the queue limit, is
out of sync until the next ``start_log_segment`` (design §2.2, §5.1.1).
"""

from __future__ import annotations

import collections
import encodings.idna  # noqa: F401  (socket.create_connection encodes host names with it; see below)
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from typing import TypeVar

import grpc
import xxhash

from qjm import errors
from qjm._native import backend_of
from qjm.addresses import reachable_at, split_host_port
from qjm.client import shared
from qjm.client.link_batch import Delivery
from qjm.client.loggers import CallHooks, WriterLife
from qjm.config import NodeAddress, QJMConfig
from qjm.errors import (
    FencedError,
    NodeTooFarBehindError,
    NodeUnavailableError,
    OutOfSyncError,
    QJMError,
    WriterCrashedError,
)
from qjm.protocol import convert, wire
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol.messages import (
    NO_TXID,
    EditLogManifest,
    JournaledEdits,
    JournalState,
    NamespaceInfo,
    NewEpochResponse,
    PrepareRecoveryResponse,
    RequestInfo,
    SegmentState,
)
from qjm.protocol.rpcmeta import CLIENT_GRPC_OPTIONS, ERROR_CODE_KEY, rpc_code

log = logging.getLogger("qjm.channel")

# The idna codec is imported above, not on a writer's first data-link connect: there it would cost
# a standby process about 3 ms of CPU (the codec, stringprep, their regular expressions) in the
# middle of its takeover.
T = TypeVar("T")
_CHANNEL_OPTIONS = tuple(CLIENT_GRPC_OPTIONS)


def error_from_rpc(node: str, e: grpc.RpcError) -> QJMError:
    """Rebuild the node's typed error from the status and trailing metadata it sent."""
    code = rpc_code(e)
    trailing = getattr(e, "trailing_metadata", None)
    md = dict(trailing() or ()) if callable(trailing) else {}
    details_fn = getattr(e, "details", None)
    details = (details_fn() if callable(details_fn) else None) or str(e)
    qcode = md.get(ERROR_CODE_KEY)
    if isinstance(qcode, str):
        return errors.from_code(qcode, f"{node}: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return NodeUnavailableError(f"{node}: {details}")
    return QJMError(f"{node}: {code}: {details}")


class _DataLink:
    """One TCP connection to a node's data plane: a sender thread, a receiver thread, cumulative acks."""

    def __init__(
        self,
        name: str,
        address: str,
        journal_id: str,
        connect_timeout: float,
        on_ack: Callable[[], None],
        on_fail: Callable[[_DataLink, BaseException], None],
    ) -> None:
        self.name = name
        self._sock = socket.create_connection(split_host_port(address), timeout=connect_timeout)
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._q: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._pending: collections.deque[tuple[int, Future[int], int]] = collections.deque()
        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)  # an ack or the failure
        self._on_ack = on_ack
        self._on_fail = on_fail
        self.queued_bytes = 0
        self._acked = 0
        self.failed: BaseException | None = None
        self.closed = False
        self._q.put(wire.encode_hello(journal_id))
        self._sender = threading.Thread(target=self._send_loop, name=f"qjm-send-{name}", daemon=True)
        self._receiver = threading.Thread(target=self._recv_loop, name=f"qjm-recv-{name}", daemon=True)
        self._sender.start()
        self._receiver.start()

    def send(self, frame: bytes, last_txid: int, fut: Future[int], commit: bytes | None) -> None:
        with self._lock:
            if self.failed is not None:
                fut.set_exception(self.failed)
                return
            self._pending.append((last_txid, fut, len(frame)))
            self.queued_bytes += len(frame)
        if commit is not None:
            self._q.put(commit)
        self._q.put(frame)

    def send_untracked(self, frame: bytes, last_txid: int, commit: bytes | None) -> None:
        """Only quiet native links (``FanoutLink``) send without a future."""
        raise TypeError(f"{type(self).__name__} tracks every batch with a future")

    def last_pending(self) -> Future[int] | None:
        with self._lock:
            return self._pending[-1][1] if self._pending else None

    def acked_txid(self) -> int:
        """Highest txid this node has acknowledged as durable on this link, even after it failed."""
        return self._acked

    def unacked_bytes(self) -> int:
        """Bytes of the batches sent on this link that the node has not acknowledged."""
        with self._lock:
            return self.queued_bytes

    def wait_for_room(self, nbytes: int, limit: int, stall: float) -> None:
        """Wait while ``nbytes`` more would put more than ``limit`` bytes in flight, as long as the
        node keeps acknowledging: a node that acknowledges nothing for ``stall`` seconds is left to
        the limit (which drops it). Returns as soon as the link has failed."""
        with self._lock:
            acked, since = self._acked, time.monotonic()
            while self.failed is None and self.queued_bytes > 0 and self.queued_bytes + nbytes > limit:
                now = time.monotonic()
                if self._acked != acked:
                    acked, since = self._acked, now
                elif now - since >= stall:
                    return
                self._progress.wait(since + stall - now)

    def wait_idle(self, timeout: float) -> None:
        """Wait (bounded) until the node has answered every batch sent on this link, or it failed."""
        last = self.last_pending()
        if last is not None:
            wait([last], timeout=timeout)

    def _send_loop(self) -> None:
        try:
            while True:
                msg = self._q.get()
                if msg is None:
                    return
                self._sock.sendall(msg)
        except OSError as e:
            self.fail(NodeUnavailableError(f"{self.name}: data plane send failed: {e}"))

    def _recv_loop(self) -> None:
        buf = bytearray()
        try:
            while True:
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise NodeUnavailableError(f"{self.name}: data plane connection closed by the node")
                buf += chunk
                while True:
                    msg, used = wire.parse_reply(buf)
                    if msg is None:
                        break
                    del buf[:used]
                    if isinstance(msg, wire.Ack):
                        self._complete(msg.txid)
                    else:
                        self._complete(msg.durable_txid)
                        raise errors.from_code(msg.code, f"{self.name}: {msg.message}")
        except BaseException as e:
            if isinstance(e, OSError) and not isinstance(e, QJMError):
                e = NodeUnavailableError(f"{self.name}: data plane receive failed: {e}")
            self.fail(e)

    def _complete(self, txid: int) -> None:
        done: list[Future[int]] = []
        with self._lock:
            self._acked = max(self._acked, txid)
            while self._pending and self._pending[0][0] <= txid:
                _, fut, n = self._pending.popleft()
                self.queued_bytes -= n
                done.append(fut)
            self._progress.notify_all()
        for fut in done:
            if not fut.done():
                fut.set_result(txid)
        if done:
            self._on_ack()

    def fail(self, e: BaseException) -> None:
        with self._lock:
            if self.failed is not None:
                return
            self.failed = e
            pending = list(self._pending)
            self._pending.clear()
            self.queued_bytes = 0
            self._progress.notify_all()
        self.close()
        for _, fut, _ in pending:
            if not fut.done():
                fut.set_exception(e)
        self._on_fail(self, e)

    def close(self) -> None:
        """Batches still pending fail (the node may or may not have them); then release the link."""
        self.closed = True
        if self.failed is None:
            self.fail(OutOfSyncError(f"{self.name}: data link closed with batches pending"))
            return  # fail() closes again, with ``failed`` set
        self._release()

    def _release(self) -> None:
        """Stop both threads and close the socket."""
        self._q.put(None)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def _close_unused_link(fut: Future[_DataLink]) -> None:
    """A link connected for a segment start that failed: nothing will use it."""
    if not fut.cancelled() and fut.exception() is None:
        fut.result().close()


class RemoteLogger:
    """One JournalNode reached over gRPC (control) and framed TCP (data)."""

    def __init__(
        self,
        address: NodeAddress,
        journal_id: str,
        *,
        config: QJMConfig | None = None,
        hooks: CallHooks | None = None,
        life: WriterLife | None = None,
    ) -> None:
        self.address = address
        self.journal_id = journal_id
        self.config = config or QJMConfig()
        self.hooks = hooks or CallHooks()
        self.life = life or WriterLife()
        self._name = str(address)
        # Batches counted by the waiting thread over quiet native links (qjm.client.link_batch), not
        # by a future per batch; fault hooks need the futures' per-batch callbacks.
        self.native_acks = backend_of("fanout") == "native" and type(self.hooks) is CallHooks
        # shared with every other logger of this process that talks to the same node (qjm.client.shared)
        self._channel, self._stub = shared.acquire_channel(self._name, _CHANNEL_OPTIONS)
        self._exec = shared.SerialExecutor()  # this node's calls, in order (Hadoop: one thread per logger)
        self._par = shared.PooledExecutor()  # reads, side by side
        self._epoch = -1
        self._serial = 0
        self._committed = NO_TXID
        self._committed_sent = NO_TXID
        self._out_of_sync = False
        self._fenced: FencedError | None = None  # what put the node out of sync, when it was fencing
        self._unreachable: NodeUnavailableError | None = None  # ... when the node stopped answering
        self._link: _DataLink | None = None
        # segments whose start is queued or running → batches sent for them meanwhile
        self._starting: dict[int, list[tuple[bytes, int, Future[int] | Delivery, bytes | None]]] = {}
        self._seg_lock = threading.Lock()
        self._started = threading.Condition(self._seg_lock)  # a pending start succeeded or failed
        self._backlog_bytes = 0  # of the frames in _starting
        self._highest_acked = 0
        self._closed = False
        self._channel_released = False
        self._reachable = False
        self._ping_failed_at = -1e9
        self._data_address = ""  # learnt from get_journal_state: spares a round before each link

    def _rpc(self, method: Callable[..., T], request: object, timeout: float) -> T:
        """One unary call; a node that refused the connection gets one more chance once it is back.

        A restarted node sits in gRPC's reconnect backoff for a moment: a ping that waits for the
        connection (bounded by ``timeouts.reconnect``) tells a node that is back from one that is
        down, so a dead node fails fast and a returning one is not skipped for a whole segment.
        Retrying is safe: UNAVAILABLE before a reply means the call never reached the node, and
        every control call is idempotent or refused harmlessly (a new serial is stamped anyway).
        """
        try:
            out = method(request, timeout=timeout)
        except grpc.RpcError as e:
            if rpc_code(e) != grpc.StatusCode.UNAVAILABLE:
                raise
            self._reachable = False
            if time.monotonic() - self._ping_failed_at < self.config.timeouts.reconnect:
                raise  # it was just found down: fail fast, do not wait again for each queued call
            ping = pb.JournalIdRequest(journal_id=self.journal_id)
            try:
                self._stub.IsFormatted(ping, timeout=self.config.timeouts.reconnect, wait_for_ready=True)
            except grpc.RpcError:
                self._ping_failed_at = time.monotonic()
                raise e from None
            out = method(request, timeout=timeout)
        self._reachable = True
        return out

    # -- identity / state --------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def source_url(self) -> str:
        return self._name

    @property
    def out_of_sync(self) -> bool:
        return self._out_of_sync

    @property
    def fenced(self) -> bool:
        """Out of sync because this node fenced the writer (a newer writer holds the journal)."""
        return self._fenced is not None

    @property
    def highest_acked_txid(self) -> int:
        """The highest txid this node has acknowledged as durable to this writer."""
        link = self._link
        if self.native_acks and link is not None:
            self._highest_acked = max(self._highest_acked, link.acked_txid())
        return self._highest_acked

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def set_committed_txid(self, txid: int) -> None:
        if txid < self._committed:
            raise errors.InvariantViolation(f"committed txid moving backward: {txid} < {self._committed}")
        self._committed = txid

    def _req(self) -> pb.RequestInfoProto:
        if self._epoch <= 0:
            raise errors.QJMError(f"{self._name}: no epoch yet; fence (recover) before writing")
        self._serial += 1
        return convert.req_to_pb(RequestInfo(self.journal_id, self._epoch, self._serial, self._committed))

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, op: str, fn: Callable[[], T], *, parallel: bool = False, writer: bool = True) -> Future[T]:
        def run() -> T:
            if writer:
                self.life.check()
            self.hooks.before(self._name, op)
            try:
                result = fn()
            except grpc.RpcError as e:
                err = error_from_rpc(self._name, e)
                log.info("%s: %s failed: %s: %s", self._name, op, type(err).__name__, err)
                raise err from None
            except QJMError as e:
                log.info("%s: %s failed: %s: %s", self._name, op, type(e).__name__, e)
                raise
            try:
                self.hooks.after(self._name, op)
            except WriterCrashedError as e:
                self.life.crash(str(e))
                raise
            return result

        return (self._par if parallel else self._exec).submit(run)

    # -- control plane -----------------------------------------------------------------------

    def is_formatted(self) -> Future[bool]:
        t = self.config.timeouts.operations
        return self._call(
            "is_formatted",
            lambda: self._rpc(self._stub.IsFormatted, pb.JournalIdRequest(journal_id=self.journal_id), t).formatted,
            writer=False,
        )

    def format(self, ns: NamespaceInfo, force: bool) -> Future[None]:
        t = self.config.timeouts.operations

        def go() -> None:
            self._rpc(
                self._stub.Format, pb.FormatRequest(journal_id=self.journal_id, ns=convert.ns_to_pb(ns), force=force), t
            )

        return self._call("format", go, writer=False)

    def get_journal_state(self) -> Future[JournalState]:
        t = self.config.timeouts.get_journal_state

        def go() -> JournalState:
            st = convert.state_from_pb(
                self._rpc(self._stub.GetJournalState, pb.JournalIdRequest(journal_id=self.journal_id), t)
            )
            self._data_address = reachable_at(st.data_address, self.address.host)
            return st

        return self._call("get_journal_state", go)

    def new_epoch(self, ns: NamespaceInfo, epoch: int) -> Future[NewEpochResponse]:
        t = self.config.timeouts.new_epoch

        def go() -> NewEpochResponse:
            reply = self._rpc(
                self._stub.NewEpoch,
                pb.NewEpochRequest(journal_id=self.journal_id, ns=convert.ns_to_pb(ns), epoch=epoch),
                t,
            )
            if reply.data_address:
                self._data_address = reachable_at(reply.data_address, self.address.host)
            return convert.new_epoch_from_pb(reply)

        return self._call("new_epoch", go)

    def start_log_segment(self, txid: int) -> Future[None]:
        """Start segment ``txid`` and open a fresh data link to the node for it.

        Batches sent before the node has answered wait in a backlog, so the node never sees a frame
        of the segment before the segment itself (Hadoop gets this from one executor per node).
        """
        t = self.config.timeouts.start_segment
        with self._seg_lock:
            self._starting[txid] = []  # from now on batches belong to the new segment

        def go() -> None:
            with self._seg_lock:
                old, self._link = self._link, None
            if old is not None:
                old.close()  # calls queued before this one (a finalize) have run: FIFO executor
            connecting: Future[_DataLink] | None = None
            try:
                # Connect the data plane while the node starts the segment (one round less on the
                # way to the first commit); no frame is sent on it before the start succeeded.
                connecting = self._par.submit(self._open_link)
                self._rpc(self._stub.StartLogSegment, pb.StartLogSegmentRequest(req=self._req(), txid=txid), t)
                link = connecting.result()
            except BaseException as e:
                if connecting is not None:
                    connecting.add_done_callback(_close_unused_link)
                self._drop_backlog(txid, e if isinstance(e, QJMError) else NodeUnavailableError(f"{self._name}: {e}"))
                raise
            with self._seg_lock:
                dropped = txid not in self._starting
                if not dropped:
                    # A successful start brings an out-of-sync node back for the new segment (reference §3.2).
                    self._link = link
                    self._out_of_sync = False
                    self._fenced = None
                    self._unreachable = None
                    backlog = self._take_backlog(txid)
                    for frame, last, fut, commit in backlog:
                        if isinstance(fut, Delivery):
                            link.send_untracked(frame, last, commit)
                            fut.link = link
                        else:
                            link.send(frame, last, fut, commit)
            if dropped:
                # Its backlog passed the queue limit while it started: it sits this segment out,
                # like a node dropped on a full send queue.
                link.close()
                return
            if backlog and self.native_acks:
                self._wake_counters()

        return self._call("start_log_segment", go)

    def _drop_backlog(self, txid: int, e: QJMError) -> None:
        with self._seg_lock:
            backlog = self._take_backlog(txid)
            self._lose_sync(e)
        for _, _, fut, _ in backlog:
            if isinstance(fut, Delivery):
                fut.error = e
            elif not fut.done():
                fut.set_exception(e)
        if backlog and self.native_acks:
            self._wake_counters()

    def _backlog_full(self, nbytes: int) -> NodeTooFarBehindError | None:
        """The error for a batch that would put the backlog of a segment being started past the
        queue limit (seg lock held): a node stuck in its start is dropped like one that stopped
        acknowledging, instead of the writer keeping every batch for it."""
        limit = self.config.queued_edits_limit_bytes
        if self._backlog_bytes == 0 or self._backlog_bytes + nbytes <= limit:
            return None
        return NodeTooFarBehindError(
            f"{self._name}: {self._backlog_bytes} bytes kept while the node starts segment "
            f"{next(reversed(self._starting))}; a batch of {nbytes} would pass the limit of {limit}"
        )

    def _drop_starting(self, e: QJMError) -> None:
        """Fail the batches kept for every segment being started: the node sits this segment out."""
        with self._seg_lock:
            pending = list(self._starting)
        for txid in pending:
            self._drop_backlog(txid, e)

    def _hold(self, frame: bytes, last_txid: int, fut: Future[int] | Delivery, commit: bytes | None) -> None:
        """Keep a batch for the segment being started (seg lock held)."""
        self._starting[next(reversed(self._starting))].append((frame, last_txid, fut, commit))
        self._backlog_bytes += len(frame)

    def _take_backlog(self, txid: int) -> list[tuple[bytes, int, Future[int] | Delivery, bytes | None]]:
        """The batches kept for segment ``txid``, whose start is over (seg lock held)."""
        backlog = self._starting.pop(txid, [])
        self._backlog_bytes -= sum(len(b[0]) for b in backlog)
        self._started.notify_all()
        return backlog

    @staticmethod
    def _wake_counters() -> None:
        """Deliveries changed outside the engine: threads counting a batch's quorum look again."""
        from qjm.client.fanout_link import shared_engine

        shared_engine().fanout.notify()

    def finalize_log_segment(self, start: int, end: int, copy_epoch: int = 0) -> Future[None]:
        t = self.config.timeouts.finalize_segment

        def go() -> None:
            # Batches and control calls travel on different connections: let this node's batches
            # land first, so it is finalized in the order Hadoop's single executor would give.
            self.wait_for_batches(t)
            if self._out_of_sync:
                raise self._not_in_sync(f"; not finalizing {start}-{end}")
            self._rpc(
                self._stub.FinalizeLogSegment,
                pb.FinalizeLogSegmentRequest(req=self._req(), start_txid=start, end_txid=end, copy_epoch=copy_epoch),
                t,
            )

        return self._call("finalize_log_segment", go)

    def purge_logs(self, min_txid_to_keep: int) -> Future[None]:
        t = self.config.timeouts.operations

        def go() -> None:
            self._rpc(self._stub.PurgeLogs, pb.PurgeLogsRequest(req=self._req(), min_txid_to_keep=min_txid_to_keep), t)

        return self._call("purge_logs", go)

    def prepare_recovery(self, segment: int) -> Future[PrepareRecoveryResponse]:
        t = self.config.timeouts.prepare_recovery
        return self._call(
            "prepare_recovery",
            lambda: convert.prepare_from_pb(
                self._rpc(
                    self._stub.PrepareRecovery, pb.PrepareRecoveryRequest(req=self._req(), segment_txid=segment), t
                )
            ),
        )

    def accept_recovery(self, state: SegmentState, source_url: str) -> Future[None]:
        t = self.config.timeouts.accept_recovery

        def go() -> None:
            self._rpc(
                self._stub.AcceptRecovery,
                pb.AcceptRecoveryRequest(
                    req=self._req(), state_to_accept=convert.seg_to_pb(state), from_url=source_url
                ),
                t,
            )

        return self._call("accept_recovery", go)

    def get_edit_log_manifest(self, since: int, in_progress_ok: bool) -> Future[EditLogManifest]:
        t = self.config.timeouts.select_input_streams
        req = pb.ManifestRequest(journal_id=self.journal_id, since_txid=since, in_progress_ok=in_progress_ok)
        return self._call(
            "get_edit_log_manifest",
            lambda: convert.manifest_from_pb(self._rpc(self._stub.GetEditLogManifest, req, t)),
            parallel=True,
            writer=False,
        )

    def get_journaled_edits(self, since: int, max_txns: int) -> Future[JournaledEdits]:
        t = self.config.timeouts.select_input_streams
        req = pb.JournaledEditsRequest(journal_id=self.journal_id, since_txid=since, max_txns=max_txns)

        def go() -> JournaledEdits:
            r = self._rpc(self._stub.GetJournaledEdits, req, t)
            return JournaledEdits(r.txn_count, r.frames)

        return self._call("get_journaled_edits", go, parallel=True, writer=False)

    def read_segment(self, segment: int) -> Iterator[bytes]:
        """Stream a segment's bytes; the sender's length and checksum are verified at the end."""
        h = xxhash.xxh3_64()
        total = 0
        req = pb.SegmentRequest(journal_id=self.journal_id, segment_txid=segment)
        try:
            for chunk in self._stub.DownloadSegment(req, timeout=self.config.timeouts.select_input_streams * 30):
                h.update(chunk.data)
                total += len(chunk.data)
                if chunk.last:
                    if chunk.total_bytes != total or chunk.xxh3 != h.intdigest():
                        raise errors.CorruptFrameError(
                            f"{self._name}: segment {segment} arrived damaged", reason="download"
                        )
                    yield chunk.data
                    return
                yield chunk.data
        except grpc.RpcError as e:
            raise error_from_rpc(self._name, e) from None
        raise NodeUnavailableError(f"{self._name}: download of segment {segment} ended early")

    def status(self) -> Future[dict[str, object]]:
        import json

        return self._call(
            "status",
            lambda: dict(
                json.loads(
                    self._rpc(
                        self._stub.Status, pb.JournalIdRequest(journal_id=self.journal_id), self.config.timeouts.connect
                    ).json
                )
            ),
            parallel=True,
            writer=False,
        )

    # -- data plane --------------------------------------------------------------------------

    def _open_link(self) -> _DataLink:
        """Connect the data plane, at the address fencing learnt; asked afresh if that one fails
        (a node restarted with another data port)."""
        if self._data_address:
            try:
                return self._connect_link(self._data_address)
            except NodeUnavailableError as e:
                if not isinstance(e.__cause__, ConnectionRefusedError):
                    raise  # unreachable: asking the node again would only wait twice
        st = self._rpc(
            self._stub.GetJournalState, pb.JournalIdRequest(journal_id=self.journal_id), self.config.timeouts.connect
        )
        self._data_address = reachable_at(st.data_address, self.address.host)
        return self._connect_link(self._data_address)

    def _connect_link(self, data_address: str) -> _DataLink:
        try:
            if backend_of("fanout") == "native":
                # The native fan-out: one epoll thread for every node's link (qjm.client.fanout_link).
                from qjm.client.fanout_link import FanoutLink

                return FanoutLink(
                    self._name,
                    data_address,
                    self.journal_id,
                    self.config.timeouts.connect,
                    on_ack=lambda: None,
                    on_fail=self._link_failed,
                    max_count=max(1024, 16 * self.config.max_inflight_batches),
                    max_bytes=self.config.queued_edits_limit_bytes or 1,
                    report_acks=not self.native_acks,
                )
            return _DataLink(
                self._name,
                data_address,
                self.journal_id,
                self.config.timeouts.connect,
                on_ack=lambda: None,
                on_fail=self._link_failed,
            )
        except OSError as e:
            raise NodeUnavailableError(f"{self._name}: cannot reach the data plane at {data_address}: {e}") from e

    def _link_failed(self, link: _DataLink, e: BaseException) -> None:
        with self._seg_lock:
            if link is not self._link:
                return  # an old segment's link, closed on purpose
            self._lose_sync(e)
        if not self._closed:
            if isinstance(e, NodeUnavailableError):
                log.warning("%s: unreachable (%s); no batches to it until the next segment", self._name, e)
            else:
                log.warning("%s: batches failed (%s); out of sync until the next segment", self._name, e)

    def _lose_sync(self, e: BaseException) -> None:
        """The node takes no more batches this segment; remember whether fencing or an unreachable
        node did it, so that later refusals say so."""
        self._out_of_sync = True
        if isinstance(e, FencedError):
            self._fenced = e
        elif isinstance(e, NodeUnavailableError) and self._unreachable is None:
            self._unreachable = e

    def _not_in_sync(self, detail: str = "") -> QJMError:
        """The error for a batch or finalize this node cannot take. A node out of sync because it
        fenced this writer says so: told only "out of sync", a writer whose batch reached a majority
        before the fencing would report a lost quorum, not that a newer writer holds the journal."""
        f = self._fenced
        if f is not None:
            return FencedError(
                f"{self._name}: fenced earlier in this segment ({f}){detail}",
                request_epoch=f.request_epoch,
                promised_epoch=f.promised_epoch,
            )
        u = self._unreachable
        if u is not None:
            return NodeUnavailableError(
                f"{self._name}: unreachable ({u}); no batches to it until the next segment{detail}"
            )
        return OutOfSyncError(f"{self._name}: out of sync until the next segment{detail}")

    def send_batch(self, frame: bytes, first_txid: int, last_txid: int) -> Future[int]:
        fut: Future[int] = Future()
        try:
            self.life.check()
            self.hooks.before(self._name, "journal")
            with self._seg_lock:
                if self._out_of_sync and not self._starting:  # a pending start may bring the node back
                    raise self._not_in_sync()
                link = self._link
                queued = link.queued_bytes if link is not None else 0
                limit = self.config.queued_edits_limit_bytes
                if queued > 0 and queued + len(frame) > limit:
                    self._out_of_sync = True
                    raise NodeTooFarBehindError(
                        f"{self._name}: {queued} bytes unacknowledged; a batch of {len(frame)} would pass the "
                        f"limit of {limit}"
                    )
                if self._starting:
                    full = self._backlog_full(len(frame))
                    if full is not None:
                        raise full
                commit = self._commit_notice()
                fut.add_done_callback(self._on_batch_done)
                if self._starting:
                    self._hold(frame, last_txid, fut, commit)
                elif link is not None:
                    link.send(frame, last_txid, fut, commit)
                else:
                    self._out_of_sync = True
                    raise OutOfSyncError(f"{self._name}: no data link; out of sync until the next segment")
        except QJMError as e:
            if not isinstance(e, WriterCrashedError):
                self._lose_sync(e)
                if isinstance(e, NodeTooFarBehindError):
                    self._drop_starting(e)
                    self._close_link()
            if not fut.done():
                fut.set_exception(e)
        return fut

    def deliver_batch(self, frame: bytes, first_txid: int, last_txid: int) -> Delivery:
        """``send_batch`` without a future, for ``native_acks`` loggers: where the batch went.

        The in-flight byte limit is the quiet link's engine window (set to
        ``queued_edits_limit_bytes``): a batch past it fails the link, as ``send_batch`` would.
        """
        try:
            self.life.check()
            with self._seg_lock:
                if self._out_of_sync and not self._starting:  # a pending start may bring the node back
                    raise self._not_in_sync()
                link = self._link
                if self._starting:
                    full = self._backlog_full(len(frame))
                    if full is not None:
                        raise full
                commit = self._commit_notice()
                if self._starting:
                    pending = Delivery()
                    self._hold(frame, last_txid, pending, commit)
                    return pending
                if link is None:
                    raise OutOfSyncError(f"{self._name}: no data link; out of sync until the next segment")
                link.send_untracked(frame, last_txid, commit)
                return Delivery(link)
        except QJMError as e:
            if not isinstance(e, WriterCrashedError):
                self._lose_sync(e)
                if isinstance(e, NodeTooFarBehindError):
                    self._drop_starting(e)
            return Delivery(error=e)

    def unacked_bytes(self) -> int:
        """Bytes sent to this node (or kept for the segment it is starting) not acknowledged yet."""
        with self._seg_lock:
            link, backlog = self._link, self._backlog_bytes
        return backlog + (link.unacked_bytes() if link is not None else 0)

    def pace(self, nbytes: int) -> None:
        """Hold the writer back while this node is a full queue behind but still acknowledging.

        Hadoop drops such a node at once; on a writer faster than its slowest node (three nodes
        sharing one disk, a busy machine) that leaves two replicas for the rest of the segment. A
        node that acknowledges nothing for ``lag_wait`` is still dropped by the queue limit.
        """
        stall = self.config.lag_wait
        if stall <= 0:
            return
        limit = self.config.queued_edits_limit_bytes
        if self._starting:  # rare: batches kept while the node starts the segment all go out at once
            with self._seg_lock:
                deadline = time.monotonic() + stall
                while self._starting and self._backlog_bytes > 0 and self._backlog_bytes + nbytes > limit:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._started.wait(remaining)
        link = self._link
        if link is not None and not self._starting:
            link.wait_for_room(nbytes, limit, stall)

    def _commit_notice(self) -> bytes | None:
        """The COMMIT message to send ahead of the next batch, if the committed txid moved (lock held)."""
        if self._committed <= self._committed_sent:
            return None
        self._committed_sent = self._committed
        return wire.encode_commit(self._epoch, self._committed)

    def wait_for_batches(self, timeout: float) -> None:
        """Wait (bounded) until this node has answered every batch sent to it, or its link failed."""
        link = self._link
        if link is not None:
            link.wait_idle(timeout)

    def _close_link(self) -> None:
        with self._seg_lock:
            link, self._link = self._link, None
        if link is not None:
            link.close()

    def _on_batch_done(self, fut: Future[int]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        self._highest_acked = max(self._highest_acked, fut.result())
        try:
            self.hooks.after(self._name, "journal")
        except WriterCrashedError as e:
            self.life.crash(str(e))

    def close(self, grace: float = 0.0) -> None:
        """Release the node; with ``grace``, first let calls already queued for it finish (bounded)."""
        # A node that is not connected would only make us wait for its timeouts.
        if grace > 0 and not self._closed and self._reachable:
            deadline = time.monotonic() + grace
            wait([self._exec.submit(lambda: None)], timeout=grace)
            self.wait_for_batches(max(0.0, deadline - time.monotonic()))
        self._closed = True
        self._close_link()
        self._exec.shutdown(cancel_futures=True)
        self._par.shutdown(cancel_futures=True)
        with self._seg_lock:
            release, self._channel_released = not self._channel_released, True
        if release:
            shared.release_channel(self._name, _CHANNEL_OPTIONS)
