"""RemoteLogger: one node over the network (Hadoop IPCLoggerChannel), on both planes.

A ``RemoteLogger`` is three parts: control calls over gRPC, run on a single-thread executor so the
node sees them in submission order; the node's state as this writer knows it
(``qjm.client.node_state.NodeState``: serials, in sync or not, the start backlog, commit notices),
which decides every step; and a data link per segment (``qjm.client.data_link.DataLink``: the
native ``FanoutLink`` or the pure ``ThreadedLink``) that carries the batches and their cumulative
acks. A node that fails a batch, or lets its unacknowledged bytes pass the queue limit, is out of
sync until the next ``start_log_segment`` (design §2.2, §5.1.1).
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  (socket.create_connection encodes host names with it; see below)
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from functools import partial
from typing import Any, TypeVar

from qjm.addresses import reachable_at
from qjm.client.data_link import DataLink, encode_commit
from qjm.client.grpc_io import GrpcNodeIO
from qjm.client.link_batch import Delivery
from qjm.client.loggers import CallHooks, WriterLife
from qjm.client.node_io import FollowStream, NodeIO, NoReply, TransportBugs
from qjm.client.node_state import Held, NodeState, NodeStateView, Refusal, Route
from qjm.config import NodeAddress, QJMConfig
from qjm.errors import NodeUnavailableError, QJMError, WriterCrashedError
from qjm.histogram import Histogram
from qjm.protocol import convert
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

log = logging.getLogger("qjm.channel")

# The idna codec is imported above, not on a writer's first data-link connect: there it would cost
# a standby process about 3 ms of CPU (the codec, stringprep, their regular expressions) in the
# middle of its takeover.
T = TypeVar("T")


def _close_unused_link(fut: Future[DataLink]) -> None:
    """A link connected for a segment start that failed: nothing will use it."""
    if not fut.cancelled() and fut.exception() is None:
        fut.result().close()


Ticket = Future[int] | Delivery  # how a batch kept while its segment starts is tracked


class RemoteLogger(NodeStateView[Ticket]):
    """One JournalNode reached over gRPC (control) and framed TCP (data)."""

    def __init__(
        self,
        address: NodeAddress,
        journal_id: str,
        *,
        config: QJMConfig | None = None,
        hooks: CallHooks | None = None,
        life: WriterLife | None = None,
        io: NodeIO | None = None,
        bugs: TransportBugs | None = None,
    ) -> None:
        self.address = address
        self.journal_id = journal_id
        self.config = config or QJMConfig()
        self.hooks = hooks or CallHooks()
        self.life = life or WriterLife()
        self._io: NodeIO = io if io is not None else GrpcNodeIO(str(address), journal_id, self.config)
        self._name = self._io.name
        self._bugs = bugs  # test-only transport switches (qjm.testing.bugs); None is the correct client
        # Batches counted by the waiting thread over quiet native links (qjm.client.link_batch), not
        # by a future per batch; hooks that act after each acknowledged batch need its future.
        self.native_acks = self._io.quiet_links and type(self.hooks).after is CallHooks.after
        # Each batch's send-to-ack time, when the links time it themselves (else AckTimer does).
        self.times_acks = self._io.times_acks
        self._write_seconds = Histogram()
        self._write_lock = threading.Lock()  # guards _write_seconds: links fold into it from any thread
        self._lock = threading.Lock()  # guards _state and _link
        self._state: NodeState[Ticket] = NodeState(self._name, journal_id, self.config.queued_edits_limit_bytes)
        self._started = threading.Condition(self._lock)  # a pending start ended
        self._link: DataLink | None = None
        self._closed = False
        self._reachable = False
        self._ping_failed_at = -1e9
        self._data_address = ""  # learnt from get_journal_state: spares a round before each link

    def _rpc(self, op: str, request: Callable[[], Any], timeout: float) -> Any:
        """One unary call; a call that got no reply gets one more chance once the node answers a ping.

        A restarted node sits in gRPC's reconnect backoff for a moment: a ping that waits for the
        connection (bounded by ``timeouts.reconnect``) tells a node that is back from one that is
        down, so a dead node fails fast and a returning one is not skipped for a whole segment.

        ``request`` builds the request for each attempt, so a retry carries a fresh serial
        (``NodeState.request``). The first attempt may have reached the node with only its reply
        lost; the node then runs the retry as a second, newer call, which every control call
        tolerates (see ``qjm.client.node_state``). Resending the same serial would be refused as
        out of order, and the node counted as failed for a call it did.
        """
        first = request()
        try:
            return self._attempt(op, first, timeout)
        except NoReply as e:
            self._reachable = False
            io = self._io
            if io.monotonic() - self._ping_failed_at < self.config.timeouts.reconnect:
                raise  # it was just found down: fail fast, do not wait again for each queued call
            if not io.ping(self.config.timeouts.reconnect):
                self._ping_failed_at = io.monotonic()
                raise e from None
            log.info("%s: %s got no reply; the node answers again: retrying it", self._name, op)
        bugs = self._bugs
        return self._attempt(op, first if bugs is not None and bugs.retry_reuses_serial else request(), timeout)

    def _attempt(self, op: str, request: object, timeout: float) -> Any:
        out = self._io.call(op, request, timeout)
        try:
            self.hooks.replied(self._name, op)
        except NoReply:
            raise
        except NodeUnavailableError as e:  # a reply lost on the way: the node did the call
            raise NoReply(str(e)) from None
        self._reachable = True
        return out

    def _request(self) -> pb.RequestInfoProto:
        with self._lock:
            info = self._state.request()
        return convert.req_to_pb(info)

    # -- identity / state (the rest is NodeStateView's) --------------------------------------

    @property
    def highest_acked_txid(self) -> int:
        """The highest txid this node has acknowledged as durable to this writer."""
        link = self._link
        if self.native_acks and link is not None:
            self._state.acked(link.acked_txid())
        return self._state.highest_acked

    @property
    def current_link(self) -> DataLink | None:
        """The data link of the segment this node is taking batches of, if any."""
        return self._link

    def state_snapshot(self) -> tuple[tuple[object, ...], bool, str]:
        """What this writer knows of the node (``NodeState.snapshot``), whether a call that gets no
        reply now fails without a ping, and the data address it knows (tests, and the simulator's
        exhaustive search, compare channels by them)."""
        fail_fast = self._io.monotonic() - self._ping_failed_at < self.config.timeouts.reconnect
        with self._lock:
            return (self._state.snapshot(), fail_fast, self._data_address)

    # -- plumbing ----------------------------------------------------------------------------

    def _call(
        self, op: str, fn: Callable[[], T], *, what: str = "", parallel: bool = False, writer: bool = True
    ) -> Future[T]:
        """Queue ``fn`` (the call ``what``, ``op`` with its arguments) on this node's executor."""

        def run() -> T:
            if writer:
                self.life.check()
            self.hooks.before(self._name, op)
            try:
                result = fn()
            except QJMError as e:
                log.info("%s: %s failed: %s: %s", self._name, op, type(e).__name__, e)
                raise
            try:
                self.hooks.after(self._name, op)
            except WriterCrashedError as e:
                self.life.crash(str(e))
                raise
            return result

        try:
            return self._io.submit(what or f"{op}()", run, parallel=parallel)
        except RuntimeError:  # the logger is closed: the call never runs
            fut: Future[T] = Future()
            fut.set_exception(NodeUnavailableError(f"{self._name}: {op} not sent: this writer closed the node"))
            return fut

    # -- control plane -----------------------------------------------------------------------

    def _jid(self) -> pb.JournalIdRequest:
        return pb.JournalIdRequest(journal_id=self.journal_id)

    def is_formatted(self) -> Future[bool]:
        t = self.config.timeouts.operations
        return self._call(
            "is_formatted",
            lambda: self._rpc("is_formatted", self._jid, t).formatted,
            writer=False,
        )

    def format(self, ns: NamespaceInfo, force: bool, promised_epoch: int = 0) -> Future[None]:
        """Format the journal on this node; ``promised_epoch`` is the promise it starts with (a
        node that rejoins, ``qjm.client.rejoin``)."""
        t = self.config.timeouts.operations
        req = pb.FormatRequest(
            journal_id=self.journal_id, ns=convert.ns_to_pb(ns), force=force, promised_epoch=promised_epoch
        )

        def go() -> None:
            self._rpc("format", lambda: req, t)

        return self._call("format", go, what=f"format(force={force})", writer=False)

    def get_journal_state(self) -> Future[JournalState]:
        t = self.config.timeouts.get_journal_state

        def go() -> JournalState:
            st = convert.state_from_pb(self._rpc("get_journal_state", self._jid, t))
            self._data_address = reachable_at(st.data_address, self.address.host)
            return st

        return self._call("get_journal_state", go)

    def new_epoch(self, ns: NamespaceInfo, epoch: int) -> Future[NewEpochResponse]:
        t = self.config.timeouts.new_epoch
        req = pb.NewEpochRequest(journal_id=self.journal_id, ns=convert.ns_to_pb(ns), epoch=epoch)

        def go() -> NewEpochResponse:
            reply = self._rpc("new_epoch", lambda: req, t)
            if reply.data_address:
                self._data_address = reachable_at(reply.data_address, self.address.host)
            return convert.new_epoch_from_pb(reply)

        return self._call("new_epoch", go, what=f"new_epoch({epoch})")

    def start_log_segment(self, txid: int) -> Future[None]:
        """Start segment ``txid`` and open a fresh data link to the node for it.

        Batches sent before the node has answered wait in a backlog, so the node never sees a frame
        of the segment before the segment itself (Hadoop gets this from one executor per node).
        However the call ends, the start ends with it: a start that fails, even before it reaches
        the node, leaves the node out of sync for this segment at once (``_start_ended``).
        """
        t = self.config.timeouts.start_segment
        with self._lock:
            self._state.start_begun(txid)

        def go() -> None:
            with self._lock:
                old, self._link = self._link, None
            if old is not None:
                old.close()  # calls queued before this one (a finalize) have run: FIFO executor
            connecting: Future[DataLink] | None = None
            try:
                # Connect the data plane while the node starts the segment (one round less on the
                # way to the first commit); no frame is sent on it before the start succeeded.
                connecting = self._io.beside(self._open_link)
                self._rpc(
                    "start_log_segment",
                    lambda: pb.StartLogSegmentRequest(req=self._request(), txid=txid),
                    t,
                )
                link = connecting.result()
            except BaseException:
                if connecting is not None:
                    connecting.add_done_callback(_close_unused_link)
                raise
            with self._lock:
                backlog = self._state.start_succeeded(txid)
                if backlog is not None:
                    self._link = link
                    for h in backlog:
                        if isinstance(h.ticket, Delivery):
                            link.send_untracked(h.frame, h.last_txid, h.commit)
                            h.ticket.link = link
                        else:
                            link.send(h.frame, h.last_txid, h.ticket, h.commit)
                self._started.notify_all()
            if backlog is None:
                link.close()  # dropped while it started: it sits this segment out
                return
            if backlog and self.native_acks:
                self._io.wake_counters()

        fut = self._call("start_log_segment", go, what=f"start_log_segment({txid})")
        fut.add_done_callback(partial(self._start_ended, txid))
        return fut

    def _start_ended(self, txid: int, fut: Future[None]) -> None:
        """A start that did not succeed, wherever it failed, ends here: the batches kept for it fail."""
        if fut.cancelled():
            cause: BaseException = NodeUnavailableError(f"{self._name}: start_log_segment({txid}) never ran")
        else:
            exc = fut.exception()
            if exc is None:
                return
            cause = exc
            if self._bugs is not None and self._bugs.failed_start_never_cleared:
                return
        e = cause if isinstance(cause, QJMError) else NodeUnavailableError(f"{self._name}: {cause}")
        with self._lock:
            dropped = self._state.start_failed(txid, e)
            self._started.notify_all()
            error = self._state.not_in_sync(f"; segment {txid} did not start ({type(e).__name__}: {e})")
        if not isinstance(e, WriterCrashedError):
            log.warning("%s: start of segment %d failed (%s); out of sync until the next segment", self._name, txid, e)
        self._fail_held(dropped, error)

    def _fail_held(self, held: list[Held[Ticket]], e: BaseException) -> None:
        for h in held:
            if isinstance(h.ticket, Delivery):
                h.ticket.error = e
            elif not h.ticket.done():
                h.ticket.set_exception(e)
        if held and self.native_acks:
            self._io.wake_counters()

    def finalize_log_segment(self, start: int, end: int, copy_epoch: int = 0) -> Future[None]:
        t = self.config.timeouts.finalize_segment

        def go() -> None:
            # Batches and control calls travel on different connections: let this node's batches
            # land first, so it is finalized in the order Hadoop's single executor would give.
            self.wait_for_batches(t)
            with self._lock:
                refusal = (
                    self._state.not_in_sync(f"; not finalizing {start}-{end}") if self._state.out_of_sync else None
                )
            if refusal is not None:
                raise refusal
            self._rpc(
                "finalize_log_segment",
                lambda: pb.FinalizeLogSegmentRequest(
                    req=self._request(), start_txid=start, end_txid=end, copy_epoch=copy_epoch
                ),
                t,
            )

        return self._call("finalize_log_segment", go, what=f"finalize_log_segment({start}, {end})")

    def purge_logs(self, min_txid_to_keep: int) -> Future[None]:
        t = self.config.timeouts.operations

        def go() -> None:
            self._rpc(
                "purge_logs",
                lambda: pb.PurgeLogsRequest(req=self._request(), min_txid_to_keep=min_txid_to_keep),
                t,
            )

        return self._call("purge_logs", go, what=f"purge_logs({min_txid_to_keep})")

    def admin_purge_logs(self, epoch: int, min_txid_to_keep: int) -> Future[None]:
        t = self.config.timeouts.operations
        req = pb.PurgeLogsRequest(
            req=convert.req_to_pb(RequestInfo(self.journal_id, epoch, 0, NO_TXID)),
            min_txid_to_keep=min_txid_to_keep,
            admin=True,
        )

        def go() -> None:
            self._rpc("purge_logs", lambda: req, t)

        what = f"admin purge_logs({min_txid_to_keep}) in epoch {epoch}"
        return self._call("purge_logs", go, what=what, writer=False)

    def prepare_recovery(self, segment: int) -> Future[PrepareRecoveryResponse]:
        t = self.config.timeouts.prepare_recovery

        def go() -> PrepareRecoveryResponse:
            reply = self._rpc(
                "prepare_recovery",
                lambda: pb.PrepareRecoveryRequest(req=self._request(), segment_txid=segment),
                t,
            )
            return convert.prepare_from_pb(reply)

        return self._call("prepare_recovery", go, what=f"prepare_recovery({segment})")

    def accept_recovery(self, state: SegmentState, source_url: str) -> Future[None]:
        t = self.config.timeouts.accept_recovery
        seg = convert.seg_to_pb(state)

        def go() -> None:
            self._rpc(
                "accept_recovery",
                lambda: pb.AcceptRecoveryRequest(req=self._request(), state_to_accept=seg, from_url=source_url),
                t,
            )

        return self._call("accept_recovery", go, what=f"accept_recovery({state}, from {source_url})")

    def get_edit_log_manifest(self, since: int, in_progress_ok: bool) -> Future[EditLogManifest]:
        t = self.config.timeouts.select_input_streams
        req = pb.ManifestRequest(journal_id=self.journal_id, since_txid=since, in_progress_ok=in_progress_ok)
        return self._call(
            "get_edit_log_manifest",
            lambda: convert.manifest_from_pb(self._rpc("get_edit_log_manifest", lambda: req, t)),
            what=f"get_edit_log_manifest({since}, {in_progress_ok})",
            parallel=True,
            writer=False,
        )

    def get_journaled_edits(self, since: int, max_txns: int) -> Future[JournaledEdits]:
        t = self.config.timeouts.select_input_streams
        req = pb.JournaledEditsRequest(journal_id=self.journal_id, since_txid=since, max_txns=max_txns)

        def go() -> JournaledEdits:
            r = self._rpc("get_journaled_edits", lambda: req, t)
            return JournaledEdits(r.txn_count, r.frames)

        what = f"get_journaled_edits({since}, {max_txns})"
        return self._call("get_journaled_edits", go, what=what, parallel=True, writer=False)

    def read_segment(self, segment: int) -> Iterator[bytes]:
        """Stream a segment's bytes; the sender's length and checksum are verified at the end."""
        return self._io.read_segment(self.journal_id, segment)

    def follow(self, since: int, heartbeat: float) -> FollowStream:
        """Be pushed this node's committed frames from txid ``since`` on, with a heartbeat every
        ``heartbeat`` seconds without news; lasts until cancelled or the node goes."""
        return self._io.follow(self.journal_id, since, heartbeat)

    def status(self) -> Future[dict[str, object]]:
        t = self.config.timeouts.connect
        return self._call(
            "status",
            lambda: dict(json.loads(self._rpc("status", self._jid, t).json)),
            parallel=True,
            writer=False,
        )

    # -- data plane --------------------------------------------------------------------------

    def _open_link(self) -> DataLink:
        """Connect the data plane, at the address fencing learnt; asked afresh if that one fails
        (a node restarted with another data port)."""
        if self._data_address:
            try:
                return self._connect_link(self._data_address)
            except NodeUnavailableError as e:
                if not isinstance(e.__cause__, ConnectionRefusedError):
                    raise  # unreachable: asking the node again would only wait twice
        st = self._rpc("get_journal_state", self._jid, self.config.timeouts.connect)
        self._data_address = reachable_at(st.data_address, self.address.host)
        return self._connect_link(self._data_address)

    def _connect_link(self, data_address: str) -> DataLink:
        return self._io.open_link(
            data_address,
            self._link_failed,
            report_acks=not self.native_acks,
            on_latencies=self._add_write_latencies if self.times_acks else None,
        )

    def _add_write_latencies(self, counts: list[int], seconds: float) -> None:
        with self._write_lock:
            self._write_seconds.add(counts, seconds)

    def write_latency(self) -> Histogram:
        """The send-to-ack times of every batch this node acknowledged (``times_acks`` links): a copy."""
        link = self._link
        if link is not None:
            link.fold_latencies()
        with self._write_lock:
            return self._write_seconds.copy()

    def _link_failed(self, link: DataLink, e: BaseException) -> None:
        with self._lock:
            if link is not self._link:
                return  # an old segment's link, closed on purpose
            self._state.lose_sync(e)
        if not self._closed:
            if isinstance(e, NodeUnavailableError):
                log.warning("%s: unreachable (%s); no batches to it until the next segment", self._name, e)
            else:
                log.warning("%s: batches failed (%s); out of sync until the next segment", self._name, e)

    def _refused(self, r: Refusal[Ticket]) -> QJMError:
        """Carry out a refusal (lock not held): fail what it dropped, close the link if it says so."""
        self._fail_held(r.dropped, r.error)
        if r.close_link:
            self._close_link()
        return r.error

    def send_batch(self, frame: bytes, first_txid: int, last_txid: int) -> Future[int]:
        fut: Future[int] = Future()
        try:
            self.life.check()
            self.hooks.before(self._name, "journal")
        except QJMError as e:
            if not isinstance(e, WriterCrashedError):
                with self._lock:
                    self._state.lose_sync(e)
            fut.set_exception(e)
            return fut
        with self._lock:
            link = self._link
            in_flight = link.unacked_bytes() if link is not None else 0
            route = self._state.route(len(frame), in_flight, link is not None)
            if not isinstance(route, Refusal):
                commit = self._state.commit_notice()
                fut.add_done_callback(self._on_batch_done)
                if route is Route.HOLD:
                    self._state.hold(Held(frame, last_txid, fut, commit))
                elif link is not None:
                    link.send(frame, last_txid, fut, commit)
        if isinstance(route, Refusal):
            fut.set_exception(self._refused(route))
        return fut

    def announce_committed(self) -> None:
        """Send the committed txid on the data plane now, if it moved since the last notice and
        the node is taking this segment's batches (else the notice waits for the next batch)."""
        with self._lock:
            link = self._link
            if link is None or self._state.starting or self._state.out_of_sync:
                return
            notice = encode_commit(self._state.commit_notice())
            if notice is not None:
                link.send_notice(notice)

    def deliver_batch(self, frame: bytes, first_txid: int, last_txid: int) -> Delivery:
        """``send_batch`` without a future, for ``native_acks`` loggers: where the batch went.

        The in-flight byte limit is the quiet link's engine window (set to
        ``queued_edits_limit_bytes``): a batch past it fails the link, as ``send_batch`` would.
        """
        try:
            self.life.check()
            self.hooks.before(self._name, "journal")
        except QJMError as e:
            if not isinstance(e, WriterCrashedError):
                with self._lock:
                    self._state.lose_sync(e)
            return Delivery(error=e)
        with self._lock:
            link = self._link
            route = self._state.route(len(frame), 0, link is not None)
            if not isinstance(route, Refusal):
                commit = self._state.commit_notice()
                if route is Route.HOLD:
                    pending = Delivery()
                    self._state.hold(Held(frame, last_txid, pending, commit))
                    return pending
                assert link is not None
                link.send_untracked(frame, last_txid, commit)
                return Delivery(link)
        return Delivery(error=self._refused(route))

    def quiet_link(self) -> tuple[int, DataLink] | None:
        """For ``RemoteLoggerSet.sync_lane``: this node's link and its engine id when batches can go
        out on it with nothing to decide or wait for here (quiet native acks, no hook before a batch,
        in sync, no segment starting, no commit notice to send ahead of one), until this node's
        state next changes (``watch``); the engine checks each batch's room. None: ``pace`` and
        ``deliver_batch`` send batches, which decide."""
        if not self.native_acks or type(self.hooks).before is not CallHooks.before:
            return None
        with self._lock:
            st = self._state
            link = self._link
            if link is None or st.starting or st.out_of_sync or st.committed > st.committed_sent:
                return None
            link_id = link.engine_id()
            return None if link_id is None else (link_id, link)

    def commit_noticed(self, txid: int) -> None:
        """``txid`` is committed and its notice went out on this node's link (with a batch's quorum)."""
        with self._lock:
            st = self._state
            if txid > st.committed:
                st.set_committed(txid)
            st.notice_sent(txid)

    def unacked_bytes(self) -> int:
        """Bytes sent to this node (or kept for the segment it is starting) not acknowledged yet."""
        with self._lock:
            link, backlog = self._link, self._state.backlog_bytes
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
        st = self._state
        if st.starting:  # rare: batches kept while the node starts the segment all go out at once
            with self._lock:
                deadline = time.monotonic() + stall
                while st.starting and st.backlog_bytes > 0 and st.backlog_bytes + nbytes > limit:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._started.wait(remaining)
        link = self._link
        if link is not None and not st.starting:
            link.wait_for_room(nbytes, limit, stall)

    def wait_for_start(self, timeout: float) -> None:
        """Wait (bounded) until no segment start is pending (its batches are held until it ends)."""
        with self._lock:
            self._started.wait_for(lambda: not self._state.starting, timeout)

    def wait_for_batches(self, timeout: float) -> None:
        """Wait (bounded) until this node has answered every batch sent to it, or its link failed."""
        link = self._link
        if link is not None:
            link.wait_idle(timeout)

    def _close_link(self) -> None:
        with self._lock:
            link, self._link = self._link, None
        if link is not None:
            link.close()

    def _on_batch_done(self, fut: Future[int]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        self._state.acked(fut.result())
        try:
            self.hooks.after(self._name, "journal")
        except WriterCrashedError as e:
            self.life.crash(str(e))

    def close(self, grace: float = 0.0) -> None:
        """Release the node; with ``grace``, first let calls already queued for it finish (bounded)."""
        # A node that is not connected would only make us wait for its timeouts.
        if grace > 0 and not self._closed and self._reachable:
            deadline = time.monotonic() + grace
            wait([self._io.submit("close", lambda: None)], timeout=grace)
            self.wait_for_batches(max(0.0, deadline - time.monotonic()))
        self._closed = True
        self._close_link()
        self._io.shutdown()
