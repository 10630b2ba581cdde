"""The simulated network under the real client transport.

Each writer talks to each node through the production ``RemoteLogger`` (``qjm.client.channel``);
only its ``NodeIO`` is simulated (``SimNodeIO``). What leaves the writer is queued as a ``Msg`` on
that (writer, node) channel, FIFO like the logger's single control executor and its ordered data
link: a control call as the logger's own ``run`` closure, a batch as a frame on a ``SimLink``. When
the scheduler delivers a control ``Msg`` it runs the closure inline, on the scheduler's thread, so
no thread hands anything over: the logger stamps the request (a fresh serial), the ``SimNodeIO``
answers its ``call`` at once through the node's real gRPC servicer (``qjm.server.rpc``, with its
message conversions and typed errors) unless a fault strikes, and the logger's retry, refusal and
start handling run as in production. A batch is applied with the node's ``apply_run`` and its
replies framed with ``qjm.protocol.wire``, read back by the client's own ``PendingBatches``.

``SimQuorumCall`` is a ``QuorumCall`` whose waits yield to the scheduler (``SimCondition``);
``SimLoggerSet`` and ``SimManager`` put them under the real ``QuorumJournalManager``. ``short``
summarizes a reply for the trace.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import grpc

from qjm import errors
from qjm._native import framing
from qjm.client.channel import RemoteLogger
from qjm.client.data_link import LatencySink, LinkFailed, PendingBatches
from qjm.client.grpc_io import METHODS
from qjm.client.link_batch import Delivery, LinkBatch
from qjm.client.loggers import CallHooks, Logger, LoggerSet, WriterLife
from qjm.client.manager import QuorumJournalManager
from qjm.client.node_state import CommitNotice
from qjm.client.quorum import BatchCall, Outcome, QuorumCall, majority, tally
from qjm.client.recovery import choose_recovery_source, in_sync_copy
from qjm.config import NodeAddress
from qjm.errors import InvariantViolation, OutOfSyncError, QJMError
from qjm.protocol.messages import JournalState, NewEpochResponse, PrepareRecoveryResponse, SegmentState
from qjm.protocol.rpcmeta import ERROR_CODE_KEY
from qjm.server.journal import Journal
from qjm.server.rpc import QJournalServicer
from qjm.testing.bugs import ProtocolBugs
from qjm.testing.sim.nodes import JOURNAL_ID, NS

if TYPE_CHECKING:
    from qjm.testing.sim.simulation import Simulation

__all__ = [
    "Msg",
    "SimCallHooks",
    "SimCondition",
    "SimLife",
    "SimLink",
    "SimLinkBatch",
    "SimLoggerSet",
    "SimManager",
    "SimNodeIO",
    "SimQuorumCall",
    "SimServicer",
    "SimWait",
    "short",
    "sim_logger",
]


T = TypeVar("T")
SIM_DATA_DIR = "/qjm-sim"  # no message names it: the servicer's redaction leaves them alone


def short(v: object) -> str:
    if isinstance(v, PrepareRecoveryResponse):
        s = v.segment_state
        return f"prep({s}, acc={v.accepted_in_epoch}, lwe={v.last_writer_epoch}, c={v.last_committed_txid})"
    if isinstance(v, JournalState):
        return f"state(promised={v.last_promised_epoch}, writer={v.last_writer_epoch})"
    if isinstance(v, NewEpochResponse):
        rec = f", {short(v.recovery)}" if v.recovery is not None and v.last_segment_txid is not None else ""
        return f"epoch_ok(last_segment={v.last_segment_txid}{rec})"
    return repr(v)


@dataclass(eq=False, slots=True)
class Msg:
    """One thing in flight on a (writer, node) channel, in one of three kinds.

    ``ctl``: a control call, ``run`` being the logger's closure and ``fut`` its executor future;
    ``data``: a batch on ``link``, ``fut`` its future there; ``ghost``: a copy of a control request the network delivers
    again (a duplicate, or a late first attempt the writer has retried since), whose reply no one
    reads."""

    io: SimNodeIO
    kind: str
    op: str
    summary: str
    seq: int  # n-th message on this channel (1-based), for planned faults
    fut: Future[Any] | None = None
    run: Callable[[], Any] | None = None
    link: SimLink | None = None
    frame: bytes = b""
    first: int = 0
    last: int = 0
    epoch: int = 0
    segment: int = 0
    commit: CommitNotice | None = None
    request: Any = None
    on_wire: bool = False  # sent before its writer died: it still arrives

    @property
    def is_data(self) -> bool:
        return self.kind == "data"


class SimLife(WriterLife):
    """A writer's life; ``on_wire`` lets a request its dead writer had already sent be built and
    delivered (the simulation builds a request when it delivers it)."""

    def __init__(self) -> None:
        super().__init__()
        self.on_wire = False

    def check(self) -> None:
        if not self.on_wire:
            super().check()


class SimCallHooks(CallHooks):
    """The writer may die as it sends a call (``Simulation.on_send``)."""

    def __init__(self, io: SimNodeIO) -> None:
        self.io = io

    def before(self, node: str, op: str) -> None:
        self.io.sim.on_send(self.io, op)


class SimContext:
    """What the servicer needs of a gRPC context: an abort carries the node's typed error back."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.code = ""

    def set_trailing_metadata(self, md: Sequence[tuple[str, str]]) -> None:
        self.code = dict(md).get(ERROR_CODE_KEY, "")

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise errors.from_code(self.code or "QJM_ERROR", f"{self.node}: {details}")


class SimServicer:
    """One simulated node's control plane: the real ``QJournalServicer`` over the node's journal.

    A call that fails outside the protocol's typed errors (a bug in the node) is kept in
    ``unexpected`` for the simulation to report: the servicer turns it into a reply."""

    def __init__(self, sim: Simulation, node: int) -> None:
        self.sim = sim
        self.node = node
        self.data_dir = SIM_DATA_DIR
        self.unexpected: BaseException | None = None
        self.servicer = QJournalServicer(self, lambda: f"{sim.node_name(node)}:2")  # type: ignore[arg-type]

    def exists(self, journal_id: str) -> bool:
        return True

    @contextmanager
    def lease(self, journal_id: str, *, create: bool = False) -> Iterator[Journal]:
        j = self.sim.nodes[self.node].journal
        assert j is not None, "delivered to a node that is down"
        try:
            yield j
        except QJMError:
            raise
        except Exception as e:
            self.unexpected = e
            raise

    def take_unexpected(self) -> BaseException | None:
        e, self.unexpected = self.unexpected, None
        return e

    def call(self, op: str, request: Any) -> Any:
        self.unexpected = None
        method = getattr(self.servicer, METHODS[op])
        return method(request, SimContext(self.sim.node_name(self.node)))


class SimLink:
    """A segment's data link over the simulated channel: the ``DataLink`` protocol.

    Batches are queued as ``Msg``s behind the control calls sent before them; the node's replies
    come back as ``wire`` bytes into ``PendingBatches``, as on ``ThreadedLink``. A quiet link
    (``report_acks=False``, as the native engine's) takes ``send_untracked`` batches: the writer
    reads their outcome from ``acked_txid`` and ``failed``, and every ack or failure bumps the
    simulation's news counter, which wakes the writers counting a ``LinkBatch``."""

    def __init__(self, io: SimNodeIO, on_fail: LinkFailed, gen: int, *, quiet: bool = False) -> None:
        self.name = io.name
        self.io = io
        self.gen = gen
        self.quiet = quiet
        self.failed: BaseException | None = None
        bugs = io.sim.bugs
        self.batches = PendingBatches(bugs if bugs is not None and bugs.fenced_refusal_counts_as_ack else None)
        self._on_fail = on_fail
        self._buf = bytearray()

    def send(self, frame: bytes, last_txid: int, fut: Future[int], commit: CommitNotice | None) -> None:
        with self.batches.lock:
            if not self.batches.add(last_txid, fut, len(frame)):
                return
        self.io.queue_batch(self, frame, last_txid, commit, fut)

    def send_untracked(self, frame: bytes, last_txid: int, commit: CommitNotice | None) -> None:
        if not self.quiet:
            raise TypeError("a link that reports acks takes batches with a future")
        # Tracked here only for the link's own accounting (unacked bytes, the switch that counts a
        # refusal as an ack); no one waits on this future.
        with self.batches.lock:
            if not self.batches.add(last_txid, Future(), len(frame)):
                return
        self.io.queue_batch(self, frame, last_txid, commit, None)

    def send_notice(self, notice: bytes) -> None:
        raise TypeError("the simulated writers send commit notices ahead of their batches only")

    def engine_id(self) -> int | None:
        return None  # batches go through the simulator's scheduler, never a real engine

    def acked_txid(self) -> int:
        return self.batches.acked

    def fold_latencies(self) -> None:
        pass  # the writer times simulated acks (AckTimer)

    def unacked_bytes(self) -> int:
        return self.batches.queued_bytes

    def wait_for_room(self, nbytes: int, limit: int, stall: float) -> None:
        """Never waits: the simulated writers do not pace."""

    def wait_idle(self, timeout: float) -> None:
        """Never waits: a channel is one FIFO, so every batch sent before a control call is
        delivered before it (the scheduler's order stands for the real wait)."""

    def replies(self, data: bytes) -> None:
        """The node's reply bytes reach the client; an ERROR among them fails the link."""
        self._buf += data
        try:
            self.batches.take_replies(self._buf, self.name)
        except QJMError as e:
            self.fail(e)
        self.io.sim.on_news()

    def fail(self, e: BaseException) -> None:
        if self.batches.fail(e):
            self.failed = e
            self._on_fail(self, e)
            self.io.sim.on_news()

    def close(self) -> None:
        self.fail(OutOfSyncError(f"{self.name}: data link closed with batches pending"))


class SimNodeIO:
    """One (writer, node) channel of the simulated network: the ``NodeIO`` a ``RemoteLogger`` runs on.

    ``quiet_links`` is the simulation's: with it the logger counts batches as a native build
    does (``LinkBatch``), without it with a future per batch as a pure build does."""

    def __init__(self, sim: Simulation, writer: int, node: int, life: SimLife) -> None:
        self.sim = sim
        self.quiet_links = sim.quiet_links
        self.times_acks = False  # the writer times acks (AckTimer), on the simulation's clock
        self.writer = writer
        self.node = node
        self.life = life
        self.name = sim.node_name(node)
        self.queue: deque[Msg] = deque()
        self.sent = 0
        self.gen = 0  # data links opened
        self.current: Msg | None = None  # the control call being delivered
        self.attempt = 0  # its attempts so far (a retry is the second; a call it makes on the way is none)
        self.sticky = False  # the fault on the current attempt also fails the ping (no retry)

    def _add(self, msg: Msg) -> Msg:
        self.queue.append(msg)
        return msg

    def submit(self, what: str, fn: Callable[[], T], *, parallel: bool = False) -> Future[T]:
        fut: Future[T] = Future()
        self.sent += 1
        op = what.removeprefix("admin ").split("(", 1)[0]
        self._add(Msg(self, "ctl", op, what, self.sent, fut=fut, run=fn))
        return fut

    def beside(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        try:
            fut.set_result(fn())
        except QJMError as e:
            fut.set_exception(e)
        return fut

    def call(self, op: str, request: Any, timeout: float) -> Any:
        cur = self.current
        if cur is not None and op == cur.op:
            self.attempt += 1
        return self.sim.deliver_request(self, op, request)

    def ping(self, timeout: float) -> bool:
        return self.sim.ping(self)

    def monotonic(self) -> float:
        return self.sim.clock()

    def open_link(
        self, data_address: str, on_fail: LinkFailed, *, report_acks: bool, on_latencies: LatencySink | None = None
    ) -> SimLink:
        self.gen += 1
        return SimLink(self, on_fail, self.gen, quiet=not report_acks)

    def wake_counters(self) -> None:
        self.sim.on_news()

    def queue_batch(
        self, link: SimLink, frame: bytes, last_txid: int, commit: CommitNotice | None, fut: Future[int] | None
    ) -> None:
        h = framing.decode_header(frame)
        summary = (
            f"journal(seg {h.segment_txid}, txids {h.first_txid}-{last_txid}, epoch {h.epoch}, "
            f"#{hashlib.blake2b(frame, digest_size=3).hexdigest()})"
        )
        self.sent += 1
        self._add(Msg(
            self, "data", "journal", summary, self.sent, fut=fut, link=link, frame=frame, first=h.first_txid,
            last=last_txid, epoch=h.epoch, segment=h.segment_txid, commit=commit,
        ))  # fmt: skip

    def queue_ghost(self, op: str, request: Any, summary: str) -> None:
        """The network delivers ``request`` again later (its reply goes nowhere)."""
        self.sent += 1
        self._add(Msg(self, "ghost", op, summary, self.sent, request=request))

    def read_segment(self, journal_id: str, segment: int) -> Iterator[bytes]:
        """Out of band (readers only): the node's valid bytes of ``segment``, in small chunks."""
        yield from self.sim.fetch(self.name, journal_id, segment)

    def follow(self, journal_id: str, since: int, heartbeat: float) -> NoReturn:
        raise QJMError("following is not simulated")

    def shutdown(self) -> None:
        """Nothing to release: queued calls stay in flight, as on a real network."""


def sim_logger(sim: Simulation, writer: int, node: int, life: SimLife) -> tuple[RemoteLogger, SimNodeIO]:
    """The production ``RemoteLogger`` of writer ``writer`` to node ``node``, on the simulated network."""
    io = SimNodeIO(sim, writer, node, life)
    bugs = sim.bugs if sim.bugs is not None and sim.bugs.transport_side else None
    lg = RemoteLogger(
        NodeAddress(io.name, 1), JOURNAL_ID, config=sim.config, hooks=SimCallHooks(io), life=life, io=io, bugs=bugs
    )
    return lg, io


def logger_key(lg: RemoteLogger, io: SimNodeIO) -> tuple[object, ...]:
    """The channel's part of the exhaustive search's state key. A dead writer's channel with
    nothing in flight can change nothing any more: its logger's state is left out."""
    if io.life.crashed and not io.queue:
        return (io.writer, io.node)
    link = lg.current_link
    state, fail_fast, address = lg.state_snapshot()
    if io.sim.rates.ping_fail >= 1.0:
        fail_fast = True  # no ping is ever answered: failing fast or after a ping is one outcome
    return (
        io.writer,
        io.node,
        state,
        fail_fast,
        address,
        io.gen,
        link is not None and link.failed is not None,
        tuple(m.summary for m in io.queue),
    )


class SimWait(Protocol):
    """What the scheduler reads of the call a writer waits on (``SimQuorumCall``, ``SimLinkBatch``)."""

    summaries: dict[str, str]

    def can_return(self) -> bool: ...

    def state_key(self) -> tuple[object, ...]: ...


class SimCondition:
    """Stands in for a ``QuorumCall``'s ``threading.Condition``: ``wait`` yields to the scheduler.

    Only one thread runs at a time, so the lock is not needed; ``notify_all`` marks the call as
    changed so the scheduler knows the waiting writer has something new to look at. ``on_news``:
    the engine's news (any quiet link's ack or failure) notifies it, as ``Fanout.wait_news`` wakes.
    """

    def __init__(self, sim: Simulation, owner: SimWait, *, on_news: bool = False) -> None:
        self.sim = sim
        self.owner = owner
        self.on_news = on_news
        self.notified = False

    def __enter__(self) -> SimCondition:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def notify_all(self) -> None:
        self.notified = True

    def notify(self, n: int = 1) -> None:
        self.notified = True

    def wait(self, timeout: float | None = None) -> bool:
        self.sim.block_current(self)
        return True


class SimQuorumCall(QuorumCall[T]):
    """A ``QuorumCall`` whose waits are scheduler steps and whose clock is the simulation's.

    Nothing of ``QuorumCall``'s logic is overridden: only the condition it sleeps on is swapped
    for one that yields to the scheduler (qjm.client.quorum has no hook for that; see the report).
    """

    def __init__(self, futures: Mapping[str, Future[T]], sim: Simulation, summaries: dict[str, str]) -> None:
        super().__init__(futures, clock=sim.clock)
        self._cond = SimCondition(sim, self)  # type: ignore[assignment]
        self.summaries = summaries
        self.want: tuple[int, int, int] | None = None

    def wait_for(self, min_responses: int, min_successes: int, max_exceptions: int, timeout: float, op: str) -> None:
        """Unchanged; only notes the stop conditions so the scheduler wakes the writer when one holds."""
        self.want = (min_responses, min_successes, max_exceptions)
        super().wait_for(min_responses, min_successes, max_exceptions, timeout, op)

    def can_return(self) -> bool:
        """Would ``wait_for`` return (or raise) now? The same stop conditions, evaluated from outside."""
        ok, nok = len(self.successes), len(self.exceptions)
        if self.want is None or ok + nok == self.node_count:
            return True
        if any(isinstance(e, InvariantViolation) for e in self.exceptions.values()):
            return True
        min_responses, min_successes, max_exceptions = self.want
        return (
            (min_responses > 0 and ok + nok >= min_responses)
            or (min_successes > 0 and ok >= min_successes)
            or (max_exceptions >= 0 and nok > max_exceptions)
        )

    def state_key(self) -> tuple[object, ...]:
        ok = tuple(sorted((n, short(v)) for n, v in self.successes.items()))
        bad = tuple(sorted((n, type(e).__name__) for n, e in self.exceptions.items()))
        return (tuple(sorted(self.summaries.items())), ok, bad)


class SimNews:
    """The engine's news counter (``NewsSource``) for one ``SimLinkBatch``: ``wait_news`` yields
    to the scheduler until a quiet link's ack or failure, or a held batch's fate, is news."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.cond: SimCondition | None = None

    def news(self) -> int:
        return self.sim.news

    def wait_news(self, seen: int, timeout: float) -> bool:
        if self.sim.news == seen:
            assert self.cond is not None
            self.sim.block_current(self.cond)
        return True


class SimLinkBatch(LinkBatch):
    """A ``LinkBatch`` whose waits are scheduler steps and whose clock is the simulation's.

    Nothing of ``LinkBatch``'s counting is overridden: its news source is one whose waits yield
    to the scheduler (``SimNews``), and the stop conditions are noted so the scheduler wakes the
    writer when one holds."""

    def __init__(
        self, sim: Simulation, last_txid: int, deliveries: Mapping[str, Delivery], summaries: dict[str, str]
    ) -> None:
        news = SimNews(sim)
        super().__init__(news, last_txid, deliveries, clock=sim.clock)
        news.cond = SimCondition(sim, self, on_news=True)
        self.summaries = summaries
        self.need = 0

    def wait_for_write_quorum(self, timeout: float, op: str) -> dict[str, int]:
        self.need = majority(self.node_count)
        return super().wait_for_write_quorum(timeout, op)

    def wait_for_all(self, timeout: float, op: str) -> dict[str, int]:
        self.need = self.node_count
        return super().wait_for_all(timeout, op)

    def can_return(self) -> bool:
        """Would the wait return (or raise) now? ``LinkBatch``'s stop conditions, from outside."""
        if self.need == 0:
            return True
        ok, lost = self.outcome()
        if any(isinstance(e, InvariantViolation) for e in lost.values()):
            return True
        return tally(self.node_count, self.need, len(ok), len(lost)) is not Outcome.PENDING

    def state_key(self) -> tuple[object, ...]:
        ok, lost = self.outcome()
        bad = tuple(sorted((n, type(e).__name__) for n, e in lost.items()))
        return (tuple(sorted(self.summaries.items())), tuple(sorted(ok.items())), bad)


class SimLoggerSet(LoggerSet):
    """``LoggerSet`` whose calls are ``SimQuorumCall``s; it also reports each epoch the writer wins."""

    def __init__(self, loggers: Sequence[RemoteLogger], ios: Sequence[SimNodeIO], sim: Simulation, writer: int) -> None:
        super().__init__(loggers)
        self.sim = sim
        self.writer = writer
        self.pairs = list(zip(loggers, ios, strict=True))

    def call(self, fn: Callable[[Logger], Future[T]]) -> QuorumCall[T]:
        futures: dict[str, Future[T]] = {}
        summaries: dict[str, str] = {}
        for lg, io in self.pairs:
            before = io.sent
            futures[lg.name] = fn(lg)
            summaries[lg.name] = io.queue[-1].summary if io.sent > before and io.queue else "(held or not sent)"
        return SimQuorumCall(futures, self.sim, summaries)

    def send_batch(self, frame: bytes, first_txid: int, last_txid: int) -> BatchCall:
        """As ``RemoteLoggerSet.send_batch``: when every logger counts natively (quiet links), the
        batch goes out through ``RemoteLogger.deliver_batch`` and is counted by a ``LinkBatch``;
        otherwise each node answers with a future. (Pacing is left out: the simulated links never
        fill.)"""
        if not all(lg.native_acks for lg, _ in self.pairs):
            return super().send_batch(frame, first_txid, last_txid)
        deliveries: dict[str, Delivery] = {}
        summaries: dict[str, str] = {}
        for lg, io in self.pairs:
            before = io.sent
            deliveries[lg.name] = lg.deliver_batch(frame, first_txid, last_txid)
            summaries[lg.name] = io.queue[-1].summary if io.sent > before and io.queue else "(held or not sent)"
        self.sim.stats["link_batches"] += 1
        return SimLinkBatch(self.sim, last_txid, deliveries, summaries)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.sim.checker.on_epoch(self.writer, epoch)
        self.sim.note(f"w{self.writer} won epoch {epoch}")


class SimManager(QuorumJournalManager):
    """The real ``QuorumJournalManager`` over the real loggers on the simulated network.

    Client-side ``ProtocolBugs`` reach ``choose_recovery_source`` and ``in_sync_copy`` through the
    manager's ``_choose_source`` and ``_in_sync_copy`` seams; everything else is the inherited code.
    The simulation also learns the shape of each recovery (what the prepare replies held).
    """

    def __init__(
        self,
        sim: Simulation,
        writer: int,
        loggers: Sequence[RemoteLogger],
        ios: Sequence[SimNodeIO],
        bugs: ProtocolBugs | None,
    ) -> None:
        super().__init__(sim.uri, config=sim.config, loggers=loggers, namespace=NS, epoch_hints=sim.epoch_hints)
        self.loggers = SimLoggerSet(loggers, ios, sim, writer)
        self._bugs = bugs if bugs is not None and bugs.client_side else None
        self._sim = sim

    def _choose_source(
        self, prepared: Mapping[str, PrepareRecoveryResponse]
    ) -> tuple[str, PrepareRecoveryResponse] | None:
        self._sim.on_recovery_shape(prepared)
        return choose_recovery_source(prepared, bugs=self._bugs)

    def _in_sync_copy(self, prepared: Mapping[str, PrepareRecoveryResponse]) -> SegmentState | None:
        return in_sync_copy(prepared, self.loggers.size, bugs=self._bugs)
