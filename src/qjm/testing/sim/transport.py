"""The simulated transport between the real client code and the real nodes.

``SimLogger`` implements the ``Logger`` protocol: a call is queued as a ``Msg`` on its (writer,
node) channel and its ``Future`` completes when the scheduler delivers it. ``SimQuorumCall`` is a
``QuorumCall`` whose waits yield to the scheduler (``SimCondition``); ``SimLoggerSet`` and
``SimManager`` put them under the real ``QuorumJournalManager``. ``short`` summarizes a reply for
the trace.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from qjm._native import framing
from qjm.client.loggers import CallHooks, Logger, LoggerSet, WriterLife
from qjm.client.manager import QuorumJournalManager
from qjm.client.node_state import Held, NodeState, NodeStateView, Refusal, Route
from qjm.client.quorum import QuorumCall
from qjm.client.recovery import choose_recovery_source, in_sync_copy
from qjm.errors import InvariantViolation, QJMError, WriterCrashedError
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
from qjm.server.journal import Journal
from qjm.testing.bugs import ProtocolBugs
from qjm.testing.sim.nodes import JOURNAL_ID, NS

if TYPE_CHECKING:
    from qjm.testing.sim.simulation import Simulation

__all__ = [
    "Msg",
    "SimCondition",
    "SimLogger",
    "SimLoggerSet",
    "SimManager",
    "SimQuorumCall",
    "short",
]


T = TypeVar("T")


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
    logger: SimLogger
    op: str
    summary: str
    fut: Future[Any]
    run: Callable[[Journal], Any] | None = None  # control plane
    frame: bytes = b""  # data plane
    first: int = 0
    last: int = 0
    epoch: int = 0
    segment: int = 0
    gen: int = 0
    commit: int | None = None
    seq: int = 0  # n-th call on this channel (1-based), for planned faults

    @property
    def is_data(self) -> bool:
        return self.run is None


class SimLogger(NodeStateView[Msg]):
    """One writer's channel to one simulated node: the ``Logger`` protocol, like ``RemoteLogger``.

    The per-node rules are ``RemoteLogger``'s own ``NodeState``: serials stamped when a call runs;
    a batch that fails breaks the data link and leaves the node out of sync (or fenced) until the
    next ``start_log_segment`` succeeds; a start that fails, however it fails, does the same at
    once; batches sent while a start is pending go behind it; ``finalize_log_segment`` refuses
    while out of sync; the committed txid rides on the next batch. One FIFO queue per channel
    stands in for both planes, so a batch never overtakes the start it was sent after.
    """

    def __init__(
        self, sim: Simulation, writer: int, node: int, life: WriterLife, hooks: CallHooks | None = None
    ) -> None:
        self.sim = sim
        self.writer = writer
        self.node = node
        self.life = life
        self.hooks = hooks or CallHooks()
        self._name = sim.node_name(node)
        self._state: NodeState[Msg] = NodeState(self._name, JOURNAL_ID, sim.config.queued_edits_limit_bytes)
        self._gen = 0  # data link generation: one per start_log_segment sent
        self._broken: set[int] = set()
        self.link_acked: dict[int, int] = {}  # gen → last durable txid the node acked on that link
        self.queue: deque[Msg] = deque()
        self.sent = 0

    # -- identity / state (NodeStateView's, as on RemoteLogger) ------------------------------

    def _req(self) -> RequestInfo:
        return self._state.request()

    def state_key(self) -> tuple[object, ...]:
        st = self._state
        return (
            self.writer,
            self.node,
            st.epoch,
            st.serial,
            st.committed,
            st.committed_sent,
            st.out_of_sync,
            st.fenced is not None,
            st.starting,
            self._gen,
            self._gen in self._broken,
            tuple(m.summary for m in self.queue),
        )

    # -- sending -----------------------------------------------------------------------------

    def _send_checks(self, op: str, writer: bool) -> None:
        if writer:
            self.life.check()
        self.hooks.before(self._name, op)
        self.sent += 1
        self.sim.on_send(self, op)

    def _ctl(
        self, op: str, summary: str, run: Callable[[Journal], T], *, writer: bool = True, epoch: int = 0
    ) -> Future[T]:
        fut: Future[T] = Future()
        try:
            self._send_checks(op, writer)
        except QJMError as e:
            self.sim.note(f"w{self.writer} -> {self._name} {summary}: not sent ({type(e).__name__}: {e})")
            fut.set_exception(e)
            return fut
        self.queue.append(Msg(self, op, summary, fut, run=run, epoch=epoch, seq=self.sent))
        return fut

    def is_formatted(self) -> Future[bool]:
        return self._ctl("is_formatted", "is_formatted()", lambda j: j.is_formatted(), writer=False)

    def format(self, ns: NamespaceInfo, force: bool) -> Future[None]:
        return self._ctl("format", f"format(force={force})", lambda j: j.format(ns, force), writer=False)

    def get_journal_state(self) -> Future[JournalState]:
        return self._ctl("get_journal_state", "get_journal_state()", lambda j: j.get_journal_state())

    def new_epoch(self, ns: NamespaceInfo, epoch: int) -> Future[NewEpochResponse]:
        return self._ctl("new_epoch", f"new_epoch({epoch})", lambda j: j.new_epoch(ns, epoch), epoch=epoch)

    def start_log_segment(self, txid: int) -> Future[None]:
        self._gen += 1
        gen = self._gen
        self._state.start_begun(txid)

        def run(j: Journal) -> None:
            self._broken.add(gen - 1)  # the old segment's link is closed on purpose
            j.start_log_segment(self._req(), txid)

        fut: Future[None] = self._ctl("start_log_segment", f"start_log_segment({txid})", run)
        fut.add_done_callback(partial(self._start_ended, txid, gen))
        return fut

    def _start_ended(self, txid: int, gen: int, fut: Future[None]) -> None:
        """RemoteLogger._start_ended: a start that fails (refused, lost, its reply lost, or never
        sent) drops the batches queued behind it and leaves the node out of sync at once."""
        e = fut.exception()
        if e is None:
            self._state.start_succeeded(txid)  # its batches are already queued behind it
            return
        self._broken.add(gen - 1)
        self._broken.add(gen)
        self._state.start_failed(txid, e if isinstance(e, QJMError) else QJMError(f"{self._name}: {e}"))

    def finalize_log_segment(self, start: int, end: int, copy_epoch: int = 0) -> Future[None]:
        def run(j: Journal) -> None:
            if self._state.out_of_sync:
                raise self._state.not_in_sync(f"; not finalizing {start}-{end}")
            j.finalize_log_segment(self._req(), start, end, copy_epoch)

        return self._ctl("finalize_log_segment", f"finalize_log_segment({start}, {end})", run)

    def purge_logs(self, min_txid_to_keep: int) -> Future[None]:
        return self._ctl(
            "purge_logs", f"purge_logs({min_txid_to_keep})", lambda j: j.purge_logs(self._req(), min_txid_to_keep)
        )

    def admin_purge_logs(self, epoch: int, min_txid_to_keep: int) -> Future[None]:
        req = RequestInfo(JOURNAL_ID, epoch, 0, NO_TXID)
        return self._ctl(
            "purge_logs",
            f"admin purge_logs({min_txid_to_keep}) in epoch {epoch}",
            lambda j: j.purge_logs(req, min_txid_to_keep, admin=True),
            writer=False,
        )

    def prepare_recovery(self, segment: int) -> Future[PrepareRecoveryResponse]:
        return self._ctl(
            "prepare_recovery", f"prepare_recovery({segment})", lambda j: j.prepare_recovery(self._req(), segment)
        )

    def accept_recovery(self, state: SegmentState, source_url: str) -> Future[None]:
        return self._ctl(
            "accept_recovery",
            f"accept_recovery({state}, from {source_url})",
            lambda j: j.accept_recovery(self._req(), state, source_url),
        )

    def get_edit_log_manifest(self, since: int, in_progress_ok: bool) -> Future[EditLogManifest]:
        return self._ctl(
            "get_edit_log_manifest",
            f"get_edit_log_manifest({since}, {in_progress_ok})",
            lambda j: j.get_edit_log_manifest(since, in_progress_ok),
            writer=False,
        )

    def get_journaled_edits(self, since: int, max_txns: int) -> Future[JournaledEdits]:
        return self._ctl(
            "get_journaled_edits",
            f"get_journaled_edits({since}, {max_txns})",
            lambda j: j.get_journaled_edits(since, max_txns),
            writer=False,
        )

    def read_segment(self, segment: int) -> Iterator[bytes]:
        """Out of band (readers only): the node's valid bytes of ``segment``, in small chunks."""
        yield from self.sim.fetch(self._name, JOURNAL_ID, segment)

    def send_batch(self, frame: bytes, first_txid: int, last_txid: int) -> Future[int]:
        fut: Future[int] = Future()
        h = framing.decode_header(frame)
        summary = (
            f"journal(seg {h.segment_txid}, txids {first_txid}-{last_txid}, epoch {h.epoch}, "
            f"#{hashlib.blake2b(frame, digest_size=3).hexdigest()})"
        )
        try:
            self._send_checks("journal", True)
        except QJMError as e:
            if not isinstance(e, WriterCrashedError):
                self._state.lose_sync(e)
            return self._not_sent(fut, summary, e)
        route = self._state.route(len(frame), 0, self._gen > 0)
        if isinstance(route, Refusal):
            if route.close_link:
                self._broken.add(self._gen)  # the batches it dropped are queued: they fail on the broken link
            return self._not_sent(fut, summary, route.error)
        commit = self._state.commit_notice()
        fut.add_done_callback(self._on_batch_done)
        msg = Msg(
            self, "journal", summary, fut, frame=frame, first=first_txid, last=last_txid, epoch=h.epoch,
            segment=h.segment_txid, gen=self._gen, commit=commit[1] if commit else None, seq=self.sent,
        )  # fmt: skip
        if route is Route.HOLD:
            self._state.hold(Held(frame, last_txid, msg, commit))
        self.queue.append(msg)
        return fut

    def _not_sent(self, fut: Future[int], summary: str, e: QJMError) -> Future[int]:
        self.sim.note(f"w{self.writer} -> {self._name} {summary}: not sent ({type(e).__name__}: {e})")
        fut.set_exception(e)
        return fut

    def _on_batch_done(self, fut: Future[int]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        self._state.acked(fut.result())

    def link_failed(self, gen: int, e: BaseException) -> None:
        """A batch of link ``gen`` failed: the link is gone; the node is out of sync if it is current."""
        self._broken.add(gen)
        if gen == self._gen:
            self._state.lose_sync(e)

    def link_broken(self, gen: int) -> bool:
        return gen in self._broken

    def close(self, grace: float = 0.0) -> None:
        """Nothing to release: queued calls stay in flight, as on a real network."""


class SimCondition:
    """Stands in for a ``QuorumCall``'s ``threading.Condition``: ``wait`` yields to the scheduler.

    Only one thread runs at a time, so the lock is not needed; ``notify_all`` marks the call as
    changed so the scheduler knows the waiting writer has something new to look at.
    """

    def __init__(self, sim: Simulation, owner: SimQuorumCall[Any]) -> None:
        self.sim = sim
        self.owner = owner
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


class SimLoggerSet(LoggerSet):
    """``LoggerSet`` whose calls are ``SimQuorumCall``s; it also reports each epoch the writer wins."""

    def __init__(self, loggers: Sequence[SimLogger], sim: Simulation, writer: int) -> None:
        super().__init__(loggers)
        self.sim = sim
        self.writer = writer
        self.sim_loggers = list(loggers)

    def call(self, fn: Callable[[Logger], Future[T]]) -> QuorumCall[T]:
        futures: dict[str, Future[T]] = {}
        summaries: dict[str, str] = {}
        for lg in self.sim_loggers:
            before = len(lg.queue)
            futures[lg.name] = fn(lg)
            summaries[lg.name] = lg.queue[-1].summary if len(lg.queue) > before else "(not sent)"
        return SimQuorumCall(futures, self.sim, summaries)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.sim.checker.on_epoch(self.writer, epoch)
        self.sim.note(f"w{self.writer} won epoch {epoch}")


class SimManager(QuorumJournalManager):
    """The real ``QuorumJournalManager`` over simulated loggers.

    Client-side ``ProtocolBugs`` reach ``choose_recovery_source`` and ``in_sync_copy`` through the
    manager's ``_choose_source`` and ``_in_sync_copy`` seams; everything else is the inherited code.
    The simulation also learns the shape of each recovery (what the prepare replies held).
    """

    def __init__(self, sim: Simulation, writer: int, loggers: Sequence[SimLogger], bugs: ProtocolBugs | None) -> None:
        super().__init__(sim.uri, config=sim.config, loggers=loggers, namespace=NS, epoch_hints=sim.epoch_hints)
        self.loggers = SimLoggerSet(loggers, sim, writer)
        self._bugs = bugs if bugs is not None and bugs.client_side else None
        self._sim = sim

    def _choose_source(
        self, prepared: Mapping[str, PrepareRecoveryResponse]
    ) -> tuple[str, PrepareRecoveryResponse] | None:
        self._sim.on_recovery_shape(prepared)
        return choose_recovery_source(prepared, bugs=self._bugs)

    def _in_sync_copy(self, prepared: Mapping[str, PrepareRecoveryResponse]) -> SegmentState | None:
        return in_sync_copy(prepared, self.loggers.size, bugs=self._bugs)
