"""Deterministic fault simulation of the real protocol code (design §7.3, Hadoop TestQJMWithFaults).

What runs is the production code: ``Journal`` on ``MemoryStorage`` for every node, and
``QuorumJournalManager`` with its ``QuorumCall`` waits and the pure recovery choice for every writer.
Only the transport is simulated:

* ``SimLogger`` implements the ``Logger`` protocol (the same methods as ``RemoteLogger``). A call
  does not go anywhere: it is queued on the (writer, node) channel, FIFO like ``RemoteLogger``'s
  single control executor and its ordered data link, and its ``Future`` completes when the
  scheduler delivers it.
* Each writer runs in its own thread, but only one thread ever runs at a time: a writer runs until
  its ``QuorumCall`` has to wait, then hands control back to the scheduler (a baton passed with two
  semaphores). The scheduler, driven by one ``Chooser`` (one seeded ``random.Random``), decides
  everything else: which channel delivers next, which writer resumes, where faults strike. So one
  seed is one execution, and replaying it gives the same trace.

``QuorumCall`` waits in ``threading.Condition.wait``; the simulation gives each of its calls a
condition whose ``wait`` yields to the scheduler, and a virtual clock, so no real time passes and
no timeout fires (see ``SimQuorumCall``). The manager, the quorum logic and the Journal are not
changed in any way.

Faults, all drawn from the chooser: a call lost before delivery; a call executed whose reply is
lost (the data link then breaks, as a TCP connection would); a node crash that keeps only what was
fsynced (``MemoryStorage.crash``, torn tails included), also from inside a call at the paxos commit
point or before an append, and a restart over the same storage; a failed segment download; a
writer that dies while sending, or while waiting between any two phases; several writers that take
over one after the other or interleave.

After every step the invariants of design §2.7 are checked (``Checker``); a violation raises
``SimViolation`` (an ``InvariantViolation``) carrying the seed and the trace of every call.
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from qjm._native import framing
from qjm.client.loggers import CallHooks, Logger, LoggerSet, WriterLife
from qjm.client.manager import QuorumJournalManager
from qjm.client.quorum import BatchCall, QuorumCall
from qjm.client.recovery import choose_recovery_source
from qjm.client.shared import EpochHints
from qjm.config import QJMConfig
from qjm.errors import (
    CorruptFrameError,
    InvariantViolation,
    NodeUnavailableError,
    OutOfSyncError,
    QJMError,
    QuorumError,
    WriterCrashedError,
)
from qjm.protocol.frame import SEGMENT_HEADER_SIZE
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
from qjm.server.journal import COMMITTED, PROMISED, WRITER, Journal, JournalHooks
from qjm.testing.bugs import ProtocolBugs
from qjm.testing.memstore import MemoryStorage

__all__ = [
    "Chooser",
    "FaultRates",
    "RandomChooser",
    "SimLogger",
    "SimResult",
    "SimViolation",
    "Simulation",
    "Workload",
    "WriterPlan",
    "run_seed",
]

T = TypeVar("T")

JOURNAL_ID = "sim"
NS = NamespaceInfo(4242, "sim")
_FINALIZED = re.compile(r"edits_(\d{19})-(\d{19})")
_INPROGRESS = re.compile(r"edits_inprogress_(\d{19})")
_UNFENCED_OPS = ("is_formatted", "format", "get_journal_state", "get_edit_log_manifest", "get_journaled_edits")
_BATON_TIMEOUT = 120.0  # a writer thread that never yields back is a harness bug, not a slow machine


# -- decisions --------------------------------------------------------------------------------


class Chooser:
    """Every nondeterministic decision of a run goes through one of these."""

    def choice(self, n: int, what: str) -> int:
        """An index in ``range(n)``."""
        raise NotImplementedError

    def chance(self, p: float, what: str) -> bool:
        """A fault of kind ``what`` with probability ``p``."""
        raise NotImplementedError

    def randint(self, a: int, b: int, what: str) -> int:
        raise NotImplementedError

    def pick(self, weights: Sequence[float], what: str) -> int:
        """An index chosen with the given weights (the exhaustive search tries every index)."""
        return self.choice(len(weights), what)

    def at_state(self, key: Callable[[], object]) -> bool:
        """Called before each scheduler step; False prunes the run (exhaustive search only)."""
        return True


class RandomChooser(Chooser):
    """All decisions from one seeded ``random.Random``: a seed names an execution."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def choice(self, n: int, what: str) -> int:
        return self.rng.randrange(n) if n > 1 else 0

    def chance(self, p: float, what: str) -> bool:
        return p > 0 and self.rng.random() < p

    def randint(self, a: int, b: int, what: str) -> int:
        return self.rng.randint(a, b) if b > a else a

    def pick(self, weights: Sequence[float], what: str) -> int:
        if len(weights) <= 1:
            return 0
        x = self.rng.random() * sum(weights)
        for i, w in enumerate(weights):
            x -= w
            if x < 0:
                return i
        return len(weights) - 1


class _ChooserRandom(random.Random):
    """What ``MemoryStorage.crash(rng)`` draws from: routes its ``randint`` through the chooser."""

    def __init__(self, chooser: Chooser) -> None:
        super().__init__(0)
        self._chooser = chooser

    def randint(self, a: int, b: int) -> int:
        return self._chooser.randint(a, b, "torn_tail")


@dataclass(frozen=True, slots=True)
class FaultRates:
    """Probabilities of each fault, per opportunity (a delivery, a send, a step, a hook point)."""

    fail_before: float = 0.04  # a call is lost before it reaches the node
    reply_lost: float = 0.04  # the node executes the call but the reply never arrives
    node_crash: float = 0.012  # per step: a node loses its un-synced bytes and goes down
    node_restart: float = 0.15  # per step, per down node
    crash_inside: float = 0.01  # per server hook point: crash in the middle of a call
    writer_kill: float = 0.01  # per step, per waiting writer: the writer dies between phases
    writer_crash_send: float = 0.004  # per send: the writer dies partway through a fan-out
    fetch_fail: float = 0.05  # a recovery download fails
    group_commit: float = 0.3  # deliver the next frames of a link together (one fsync)
    partition: float = 0.015  # per step: cut one writer-node channel (calls on it are lost) or heal one
    slow_node: float = 0.5  # per writer: one node answers it rarely (a lagging replica, stable over phases)
    death_point: float = 0.35  # per writer: it dies at its k-th wait, k uniform in 1..12 (any phase alike)

    def scaled(self, k: float) -> FaultRates:
        return FaultRates(
            fail_before=self.fail_before * k,
            reply_lost=self.reply_lost * k,
            node_crash=self.node_crash * k,
            node_restart=self.node_restart,
            crash_inside=self.crash_inside * k,
            writer_kill=self.writer_kill * k,
            writer_crash_send=self.writer_crash_send * k,
            fetch_fail=self.fetch_fail * k,
            group_commit=self.group_commit,
            partition=self.partition * k,
            slow_node=self.slow_node,
            death_point=self.death_point,
        )


NO_FAULTS = FaultRates(0, 0, 0, 1.0, 0, 0, 0, 0, 0.3, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class WriterPlan:
    """What one writer does after recovery: ``b<n>`` a batch of n txids, ``sync``, ``roll``, ``fin``."""

    ops: tuple[str, ...]
    pipeline: int = 1  # batches in flight before the writer waits for the oldest
    format: bool = False  # format the journal first (through the protocol, so faults apply)


@dataclass(frozen=True, slots=True)
class Workload:
    """The writers of a run. ``plans=None`` draws them from the chooser (random mode)."""

    plans: tuple[WriterPlan, ...] | None = None
    interleaved: bool | None = None  # None: drawn per seed
    nodes: int = 3
    format_in_setup: bool = True  # format every node before the run, outside fault injection
    slow: tuple[tuple[int, int], ...] = ()  # (writer, node) channels that lag (delivered last by default)
    newest_first: bool = False  # the default schedule serves the newest writer's channels first


class SimViolation(InvariantViolation):
    """An invariant broke in a simulated run: carries the seed and the trace of every call."""

    def __init__(self, message: str, *, seed: int | None, trace: Sequence[str]) -> None:
        super().__init__(message)
        self.message = message
        self.seed = seed
        self.trace = list(trace)

    def report(self, last: int | None = None) -> str:
        lines = self.trace if last is None else self.trace[-last:]
        return f"seed {self.seed}: {self.message}\n" + "\n".join(lines)


@dataclass
class SimResult:
    seed: int | None
    ok: bool
    violation: str | None
    trace: list[str]
    stats: dict[str, int]
    pruned: bool = False


class _Killed(BaseException):
    """Unwinds a writer thread the scheduler declared dead (not an Exception: nothing catches it)."""


class _NodeCrash(BaseException):
    """Raised from a server hook: the node dies in the middle of the call."""


# -- the transport ----------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Msg:
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
    on_fail: Callable[[], None] | None = None  # what the client does when this call fails, however it fails

    @property
    def is_data(self) -> bool:
        return self.run is None


class SimLogger:
    """One writer's channel to one simulated node: the ``Logger`` protocol, like ``RemoteLogger``.

    Mirrors ``RemoteLogger``: serials are stamped when a call runs; a batch that fails breaks the
    data link and leaves the node out of sync until the next ``start_log_segment`` succeeds;
    ``finalize_log_segment`` refuses while out of sync; the committed txid rides on the next batch.
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
        self._epoch = -1
        self._serial = 0
        self._committed = NO_TXID
        self._committed_sent = NO_TXID
        self._out_of_sync = False
        self._gen = 0  # data link generation: one per start_log_segment sent
        self._broken: set[int] = set()
        self.link_acked: dict[int, int] = {}  # gen → last durable txid the node acked on that link
        self.queue: deque[_Msg] = deque()
        self.sent = 0
        self.highest_acked_txid = 0

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

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def set_committed_txid(self, txid: int) -> None:
        if txid < self._committed:
            raise InvariantViolation(f"committed txid moving backward: {txid} < {self._committed}")
        self._committed = txid

    def _req(self) -> RequestInfo:
        if self._epoch <= 0:
            raise QJMError(f"{self._name}: no epoch yet; fence (recover) before writing")
        self._serial += 1
        return RequestInfo(JOURNAL_ID, self._epoch, self._serial, self._committed)

    def state_key(self) -> tuple[object, ...]:
        return (
            self.writer,
            self.node,
            self._epoch,
            self._serial,
            self._committed,
            self._committed_sent,
            self._out_of_sync,
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
        self.queue.append(_Msg(self, op, summary, fut, run=run, epoch=epoch, seq=self.sent))
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

        def run(j: Journal) -> None:
            self._broken.add(gen - 1)  # the old segment's link is closed on purpose
            j.start_log_segment(self._req(), txid)
            self._out_of_sync = False

        def failed() -> None:
            # RemoteLogger: a start that fails (refused, lost, or its reply lost) drops the batches
            # queued behind it and leaves the node out of sync until the next start succeeds.
            self._broken.add(gen - 1)
            self._broken.add(gen)
            self._out_of_sync = True

        fut = self._ctl("start_log_segment", f"start_log_segment({txid})", run)
        if fut.done():
            failed()
        elif self.queue:
            self.queue[-1].on_fail = failed
        return fut

    def finalize_log_segment(self, start: int, end: int, copy_epoch: int = 0) -> Future[None]:
        def run(j: Journal) -> None:
            if self._out_of_sync:
                raise OutOfSyncError(f"{self._name}: out of sync until the next segment; not finalizing {start}-{end}")
            j.finalize_log_segment(self._req(), start, end, copy_epoch)

        return self._ctl("finalize_log_segment", f"finalize_log_segment({start}, {end})", run)

    def purge_logs(self, min_txid_to_keep: int) -> Future[None]:
        return self._ctl(
            "purge_logs", f"purge_logs({min_txid_to_keep})", lambda j: j.purge_logs(self._req(), min_txid_to_keep)
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
        """Out of band (readers only): the node's valid bytes of ``segment``, read at once."""
        yield self.sim.fetch(self._name, JOURNAL_ID, segment)

    def send_batch(self, frame: bytes, first_txid: int, last_txid: int) -> Future[int]:
        fut: Future[int] = Future()
        h = framing.decode_header(frame)
        summary = (
            f"journal(seg {h.segment_txid}, txids {first_txid}-{last_txid}, epoch {h.epoch}, "
            f"#{hashlib.blake2b(frame, digest_size=3).hexdigest()})"
        )
        try:
            self._send_checks("journal", True)
            if self._out_of_sync:
                raise OutOfSyncError(f"{self._name}: out of sync until the next segment")
            if self._gen == 0:
                self._out_of_sync = True
                raise OutOfSyncError(f"{self._name}: no data link; out of sync until the next segment")
            commit = None
            if self._committed > self._committed_sent:
                commit = self._committed
                self._committed_sent = self._committed
            fut.add_done_callback(self._on_batch_done)
        except QJMError as e:
            if not isinstance(e, WriterCrashedError):
                self._out_of_sync = True
            self.sim.note(f"w{self.writer} -> {self._name} {summary}: not sent ({type(e).__name__}: {e})")
            fut.set_exception(e)
            return fut
        self.queue.append(
            _Msg(
                self, "journal", summary, fut, frame=frame, first=first_txid, last=last_txid, epoch=h.epoch,
                segment=h.segment_txid, gen=self._gen, commit=commit, seq=self.sent,
            )
        )  # fmt: skip
        return fut

    def _on_batch_done(self, fut: Future[int]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        self.highest_acked_txid = max(self.highest_acked_txid, fut.result())

    def link_failed(self, gen: int) -> None:
        """A batch of link ``gen`` failed: the link is gone; the node is out of sync if it is current."""
        self._broken.add(gen)
        if gen == self._gen:
            self._out_of_sync = True

    def link_broken(self, gen: int) -> bool:
        return gen in self._broken

    def close(self, grace: float = 0.0) -> None:
        """Nothing to release: queued calls stay in flight, as on a real network."""


class _SimCondition:
    """Stands in for a ``QuorumCall``'s ``threading.Condition``: ``wait`` yields to the scheduler.

    Only one thread runs at a time, so the lock is not needed; ``notify_all`` marks the call as
    changed so the scheduler knows the waiting writer has something new to look at.
    """

    def __init__(self, sim: Simulation, owner: SimQuorumCall[Any]) -> None:
        self.sim = sim
        self.owner = owner
        self.notified = False

    def __enter__(self) -> _SimCondition:
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
        self._cond = _SimCondition(sim, self)  # type: ignore[assignment]
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
        ok = tuple(sorted((n, _short(v)) for n, v in self.successes.items()))
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

    Client-side ``ProtocolBugs`` reach ``choose_recovery_source`` through the manager's
    ``_choose_source`` seam; everything else is the inherited code.
    """

    def __init__(self, sim: Simulation, writer: int, loggers: Sequence[SimLogger], bugs: ProtocolBugs | None) -> None:
        super().__init__(sim.uri, config=sim.config, loggers=loggers, namespace=NS, epoch_hints=sim.epoch_hints)
        self.loggers = SimLoggerSet(loggers, sim, writer)
        self._bugs = bugs if bugs is not None and bugs.client_side else None

    def _choose_source(
        self, prepared: Mapping[str, PrepareRecoveryResponse]
    ) -> tuple[str, PrepareRecoveryResponse] | None:
        return choose_recovery_source(prepared, bugs=self._bugs)


# -- nodes ------------------------------------------------------------------------------------


class _SimHooks(JournalHooks):
    """Server fault points: the node may die right there (at the paxos commit point, before an append)."""

    def __init__(self, sim: Simulation, node: int) -> None:
        self.sim = sim
        self.node = node

    def _maybe(self, point: str) -> None:
        if self.sim.chooser.chance(self.sim.rates.crash_inside, "crash_inside"):
            self.sim.note(f"{self.sim.node_name(self.node)} dies inside the call at {point}")
            raise _NodeCrash(point)

    def before_persist_paxos(self, journal_id: str, segment: int) -> None:
        self._maybe("before_persist_paxos")

    def after_persist_paxos(self, journal_id: str, segment: int) -> None:
        self._maybe("after_persist_paxos")

    def before_append(self, journal_id: str, first_txid: int) -> None:
        self._maybe("before_append")


@dataclass(eq=False)
class _Node:
    index: int
    name: str
    storage: MemoryStorage
    journal: Journal | None


# -- writers ----------------------------------------------------------------------------------


@dataclass
class _Batch:
    first: int
    last: int
    records: list[bytes]
    call: BatchCall


class _Task:
    """A writer thread that only runs while it holds the baton."""

    def __init__(self, sim: Simulation, wid: int, plan: WriterPlan, final: bool = False) -> None:
        self.sim = sim
        self.wid = wid
        self.plan = plan
        self.final = final
        self.go = threading.Semaphore(0)
        self.state = "new"  # new | running | waiting | done
        self.kill = False
        self.cond: _SimCondition | None = None
        self.error: BaseException | None = None
        self.outcome = ""
        self.waits = 0
        self.death_at = 0  # dies on entering its death_at-th wait (0: no planned death)
        self.recovered: int | None = None
        # program position, for the exhaustive search's state key
        self.pc = 0
        self.phase = "spawn"
        self.segment = 0
        self.next_txid = 0
        self.inflight: deque[_Batch] = deque()
        self.life = WriterLife()
        self.loggers = [SimLogger(sim, wid, i, self.life) for i in range(len(sim.nodes))]
        self.qjm = SimManager(sim, wid, self.loggers, sim.bugs)
        self.thread = threading.Thread(target=self._main, name=f"qjm-sim-w{wid}", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        self.go.acquire()
        try:
            if self.kill:
                raise _Killed
            self.state = "running"
            self.sim.writer_body(self)
            self.outcome = "done"
        except _Killed:
            self.outcome = "killed"
        except BaseException as e:
            self.error = e
        finally:
            self.state = "done"
            self.sim.baton_back()

    @property
    def runnable(self) -> bool:
        if self.state == "new":
            return True
        return self.state == "waiting" and self.cond is not None and self.cond.notified and self.cond.owner.can_return()

    def state_key(self) -> tuple[object, ...]:
        q = self.qjm
        call = self.cond.owner.state_key() if self.cond is not None and self.state == "waiting" else None
        return (
            self.wid,
            self.state,
            self.pc,
            self.phase,
            self.segment,
            self.next_txid,
            tuple((b.first, b.last) for b in self.inflight),
            q.epoch,
            q.active,
            q.committed_txid,
            self.life.crashed,
            call,
            self.cond.notified if self.cond is not None else None,
            self.waits if self.death_at else 0,
            self.death_at,
        )


# -- invariants -------------------------------------------------------------------------------


def _short(v: object) -> str:
    if isinstance(v, PrepareRecoveryResponse):
        s = v.segment_state
        return f"prep({s}, acc={v.accepted_in_epoch}, lwe={v.last_writer_epoch}, c={v.last_committed_txid})"
    if isinstance(v, JournalState):
        return f"state(promised={v.last_promised_epoch}, writer={v.last_writer_epoch})"
    if isinstance(v, NewEpochResponse):
        rec = f", {_short(v.recovery)}" if v.recovery is not None and v.last_segment_txid is not None else ""
        return f"epoch_ok(last_segment={v.last_segment_txid}{rec})"
    return repr(v)


def _records(frames: bytes, start: int) -> dict[int, bytes]:
    """txid → record of a segment's frames (without the segment header)."""
    out: dict[int, bytes] = {}
    for h, off in framing.iter_frames(frames, start, 0):
        for i, rec in enumerate(framing.decode_records(frames, off)):
            out[h.first_txid + i] = rec
    return out


class Checker:
    """The invariants of design §2.7, checked as the run goes (numbers refer to that list)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.majority = len(sim.nodes) // 2 + 1
        self.acked: dict[int, tuple[bytes, int]] = {}  # txid → (record, writer) quorum-acked
        self.records: dict[int, tuple[bytes, str]] = {}  # txid → record in some finalized segment
        self.finalized: dict[int, tuple[int, bytes, str]] = {}  # start → (end, frames, where first seen)
        self.seen_final: list[dict[str, bytes]] = [{} for _ in sim.nodes]  # per node: name → frames
        self.epochs: dict[int, int] = {}  # epoch → writer that won it
        self.recoveries = 0
        self.check_durable_ack = True
        self._parsed: dict[tuple[int, bytes], dict[int, bytes]] = {}

    def fail(self, message: str) -> None:
        self.sim.note(f"VIOLATION: {message}")
        raise SimViolation(message, seed=self.sim.seed, trace=self.sim.trace)

    # 3: unique epochs
    def on_epoch(self, writer: int, epoch: int) -> None:
        other = self.epochs.get(epoch)
        if other is not None and other != writer:
            self.fail(f"invariant 3 (unique epochs): writers w{other} and w{writer} both won epoch {epoch}")
        self.epochs[epoch] = writer

    # 1, 2: what a writer was told is committed
    def on_acked(self, writer: int, first: int, records: Sequence[bytes]) -> None:
        for i, rec in enumerate(records):
            t = first + i
            prev = self.acked.get(t)
            if prev is not None and prev[0] != rec:
                self.fail(
                    f"invariant 2 (one history): txid {t} acknowledged to w{prev[1]} as {prev[0]!r} "
                    f"and to w{writer} as {rec!r}"
                )
            self.acked[t] = (rec, writer)
            seen = self.records.get(t)
            if seen is not None and seen[0] != rec:
                self.fail(
                    f"invariant 1 (committed is forever): txid {t} acknowledged to w{writer} as {rec!r} "
                    f"but finalized as {seen[0]!r} on {seen[1]}"
                )

    # 4: fencing, and durability before acknowledgement
    def on_request(self, node: _Node, op: str, epoch: int, promised_before: int) -> None:
        if epoch < promised_before:
            self.fail(
                f"invariant 4 (fencing): {node.name} accepted {op} in epoch {epoch} "
                f"after promising epoch {promised_before}"
            )

    def on_new_epoch(self, node: _Node, epoch: int, promised_before: int) -> None:
        if epoch <= promised_before:
            self.fail(f"invariant 3: {node.name} granted new_epoch({epoch}) after promising {promised_before}")

    def on_frames(
        self, node: _Node, acked: Sequence[_Msg], promised_before: int, writer_epoch: int, size_before: int
    ) -> None:
        """Every frame the writer will count as acknowledged must have been appended by this very
        call, be durable, and carry the node's promised epoch (the client reads acks by txid)."""
        if not acked:
            return
        name = f"edits_inprogress_{acked[-1].segment:019d}"
        st = node.storage
        data = st.read_file(name) if name in st.file_names() else b""
        durable = st.durable_size(name) if data else 0
        for m in acked:
            pos = data.find(m.frame, max(SEGMENT_HEADER_SIZE, size_before))
            if pos < 0:
                self.fail(
                    f"invariant 4 (acknowledged only when durable): {node.name} acknowledged w{m.logger.writer}'s "
                    f"frame (txids {m.first}-{m.last}, epoch {m.epoch}) but did not write it to {name}"
                )
            if m.epoch < promised_before:
                self.fail(
                    f"invariant 4 (fencing): {node.name} acknowledged a frame of epoch {m.epoch} "
                    f"(txids {m.first}-{m.last}) after promising epoch {promised_before}"
                )
            if m.epoch != writer_epoch:
                self.fail(
                    f"invariant 4 (fencing, seed 004): {node.name} appended a frame of epoch {m.epoch} "
                    f"to a segment opened by writer epoch {writer_epoch}"
                )
            if self.check_durable_ack and pos + len(m.frame) > durable:
                self.fail(
                    f"invariant 4 (durable before acknowledged): {node.name} acknowledged txid {m.last} "
                    f"with {pos + len(m.frame) - durable} bytes of it in {name} not yet synced"
                )

    # 2, 5, 6: what the nodes hold
    def check_node(self, node: _Node) -> None:
        st = node.storage
        names = st.file_names()
        mine = self.seen_final[node.index]
        finals: dict[int, int] = {}
        inprog: list[int] = []
        for name in names:
            m = _FINALIZED.fullmatch(name)
            if m:
                start, end = int(m.group(1)), int(m.group(2))
                finals[start] = end
                data = st.read_file(name)
                frames = data[SEGMENT_HEADER_SIZE:]
                old = mine.get(name)
                if old is None:
                    self._new_final(node, name, start, end, frames)
                    mine[name] = frames
                elif old != frames:
                    self.fail(f"invariant 5 (finalized never changes): {node.name}/{name} changed")
                continue
            m = _INPROGRESS.fullmatch(name)
            if m:
                inprog.append(int(m.group(1)))
        for name in mine:
            if name not in names:
                self.fail(f"invariant 5 (finalized never reopens): {node.name}/{name} disappeared")
        for s in inprog:
            for fs, fe in finals.items():
                if fs <= s <= fe:
                    self.fail(
                        f"invariant 5 (finalized never reopens): {node.name} has in-progress segment {s} "
                        f"inside its finalized segment {fs}-{fe}"
                    )
        for s in [*finals, *inprog]:
            if s > 1:
                self._check_chain(node, s)

    def _new_final(self, node: _Node, name: str, start: int, end: int, frames: bytes) -> None:
        where = f"{node.name}/{name}"
        prev = self.finalized.get(start)
        if prev is not None:
            if prev[0] != end or prev[1] != frames:
                self.fail(
                    f"invariant 2 (one history): finalized segments starting at {start} differ: "
                    f"{prev[2]} ends at {prev[0]}, {where} ends at {end}"
                    + ("" if prev[0] != end else " (same length, different frames)")
                )
            return
        self.finalized[start] = (end, frames, where)
        try:
            recs = _records(frames, start)
        except CorruptFrameError as e:
            self.fail(f"invariant 5: finalized segment {where} is damaged: {e}")
            return
        if sorted(recs) != list(range(start, end + 1)):
            self.fail(f"finalized segment {where} holds txids {sorted(recs)}, not {start}-{end}")
        for t, rec in recs.items():
            seen = self.records.get(t)
            if seen is not None and seen[0] != rec:
                self.fail(f"invariant 2 (one history): txid {t} is {seen[0]!r} in {seen[1]} but {rec!r} in {where}")
            self.records[t] = (rec, where)
            a = self.acked.get(t)
            if a is not None and a[0] != rec:
                self.fail(
                    f"invariant 1 (committed is forever): txid {t} acknowledged to w{a[1]} as {a[0]!r} "
                    f"but finalized as {rec!r} in {where}"
                )

    def _check_chain(self, node: _Node, start: int) -> None:
        """Invariant 6: a segment at N anywhere means a quorum has a finalized segment ending at N-1."""
        holders = 0
        for other in self.sim.nodes:
            if any(
                (m := _FINALIZED.fullmatch(name)) and int(m.group(2)) == start - 1
                for name in self.seen_final[other.index]
            ):
                holders += 1
        if holders < self.majority:
            self.fail(
                f"invariant 6 (segment chain): {node.name} has a segment starting at {start}, but only "
                f"{holders} node(s) hold a finalized segment ending at {start - 1}"
            )

    # 1: every recovery keeps what was committed
    def after_recovery(self, writer: int, epoch: int, last: int) -> bool:
        """Check a recovery's result; False if the writer was already superseded (nothing to check).

        "Later" is in epoch order: a writer that won its epoch after a newer one was won decided
        from promises the newer writer overtook; it is fenced at its first mutation, and what it
        "recovered" is moot. For the newest epoch, everything acknowledged and everything
        finalized must lie within the result (all of it came from older epochs).
        """
        self.recoveries += 1
        for n in self.sim.nodes:
            self.check_node(n)
        newest = max(self.epochs, default=0)
        if epoch < newest:
            return False
        lost = sorted(t for t in self.acked if t > last)
        if lost:
            t = lost[0]
            self.fail(
                f"invariant 1 (committed is forever): w{writer}'s recovery ended the log at {last}, "
                f"losing txid(s) {lost} acknowledged to w{self.acked[t][1]}"
            )
        beyond = sorted(t for t in self.records if t > last)
        if beyond:
            self.fail(
                f"invariant 1: w{writer}'s recovery ended the log at {last}, but txid {beyond[0]} is in "
                f"finalized segment {self.records[beyond[0]][1]}"
            )
        for t in sorted(self.acked):
            rec, w = self.acked[t]
            holders = sum(1 for n in self.sim.nodes if self._final_record(n, t) == rec)
            if holders < self.majority:
                self.fail(
                    f"invariant 1 (committed is forever): after w{writer}'s recovery to {last}, txid {t} "
                    f"(acknowledged to w{w}) is finalized with its bytes on only {holders} node(s)"
                )
        return True

    def _final_record(self, node: _Node, t: int) -> bytes | None:
        for name, frames in self.seen_final[node.index].items():
            m = _FINALIZED.fullmatch(name)
            assert m is not None
            start, end = int(m.group(1)), int(m.group(2))
            if start <= t <= end:
                key = (start, frames)
                recs = self._parsed.get(key)
                if recs is None:
                    recs = self._parsed[key] = _records(frames, start)
                return recs.get(t)
        return None

    def state_key(self) -> tuple[object, ...]:
        return (
            tuple(sorted((t, r, w) for t, (r, w) in self.acked.items())),
            tuple(sorted(self.epochs.items())),
        )


# -- the simulation ---------------------------------------------------------------------------


class Simulation:
    """One execution: nodes, writers, a scheduler, faults, and the invariant checks."""

    def __init__(
        self,
        seed: int | None = None,
        *,
        steps: int = 400,
        bugs: ProtocolBugs | None = None,
        chooser: Chooser | None = None,
        rates: FaultRates | None = None,
        workload: Workload | None = None,
        planned: Mapping[tuple[int, int, int], str] | None = None,
        keep_trace: bool = True,
        check_durable_ack: bool = True,
    ) -> None:
        self.seed = seed
        self.max_steps = steps
        self.bugs = bugs
        self.rng = random.Random(seed)
        self.chooser = chooser or RandomChooser(self.rng)
        self.workload = workload or Workload()
        self.planned = dict(planned or {})  # (writer, node, n-th call on that channel) → "fail" | "lost"
        self.keep_trace = keep_trace
        self.trace: list[str] = []
        self.step = 0
        self._time = 0.0
        self.config = QJMConfig()
        # Odd seeds: the writers share an epoch hint, as a standby in the old writer's process
        # would; even seeds (and the exhaustive worlds): every writer asks the nodes first, as a
        # new process does. Both paths stay under the search without an extra random draw.
        self.epoch_hints = EpochHints(enabled=(seed or 0) % 2 == 1)
        self.uri = "qjournal://" + ";".join(f"n{i}:1" for i in range(self.workload.nodes)) + "/" + JOURNAL_ID
        self.nodes: list[_Node] = []
        for i in range(self.workload.nodes):
            st = MemoryStorage(JOURNAL_ID)
            self.nodes.append(_Node(i, self.node_name(i), st, None))
            self.nodes[i].journal = self._new_journal(i)
        self.checker = Checker(self)
        self.checker.check_durable_ack = check_durable_ack
        self.tasks: list[_Task] = []
        self._back = threading.Semaphore(0)
        self._current: _Task | None = None
        self._torn = _ChooserRandom(self.chooser)
        self.stats: dict[str, int] = {
            "steps": 0, "deliveries": 0, "fail_before": 0, "reply_lost": 0, "node_crashes": 0, "crash_inside": 0,
            "writer_kills": 0, "writer_crash_send": 0, "fetch_fail": 0, "writers": 0, "acked_txids": 0,
            "recoveries": 0, "fenced": 0, "group_commits": 0, "partitions": 0, "invariant_replies": 0,
        }  # fmt: skip
        self._setup_rates(rates)
        self._plans: list[WriterPlan] = []
        self._interleaved = False
        self._final = False
        self._cut: set[tuple[int, int]] = set()  # (writer, node) channels that lose every call
        self._slow: dict[tuple[int, int], float] = {}  # (writer, node) → delivery weight below 1
        self.invariant_replies: list[str] = []  # nodes' InvariantViolation replies (see SimResult)
        for w, n in self.workload.slow:
            self._slow[(w, n)] = 0.1

    # -- small services ------------------------------------------------------------------------

    @staticmethod
    def node_name(i: int) -> str:
        return f"n{i}"

    def clock(self) -> float:
        return self._time

    def note(self, line: str) -> None:
        if self.keep_trace:
            self.trace.append(f"{self.step:4d}  {line}")

    def _setup_rates(self, rates: FaultRates | None) -> None:
        """Swarm testing: each seed draws a profile, so calm, stormy and recovery-heavy runs all occur.

        Most bugs need one or two faults; some (design §2.10.6, §2.10.7) need a chain of writers
        that each die in a particular phase with a particular node lagging. The ``recovery`` profile
        makes such chains likely: many short-lived writers, planned deaths, lagging nodes.
        """
        self.profile = "fixed"
        if rates is not None:
            self.rates = rates
            return
        r = self.chooser.choice(10, "profile")
        if r == 0:
            self.profile, self.rates = "calm", FaultRates().scaled(0.0)
        elif r < 6:
            self.profile = "mixed"
            self.rates = FaultRates().scaled((0.5, 1.0, 1.0, 2.0, 3.0)[self.chooser.choice(5, "storm")])
        else:
            self.profile = "recovery"
            self.rates = replace(FaultRates().scaled(0.5), death_point=0.8, slow_node=0.7)

    def _new_journal(self, i: int) -> Journal:
        bugs = self.bugs if self.bugs is not None and self.bugs.server_side else None
        return Journal(self.nodes[i].storage, fetcher=self.fetch, clock=self.clock, hooks=_SimHooks(self, i), bugs=bugs)

    def fetch(self, source: str, journal_id: str, segment: int) -> bytes:
        """accept_recovery's download from another node (a direct read of its Journal)."""
        node = self.nodes[int(source[1:])]
        if node.journal is None:
            raise NodeUnavailableError(f"{source} is down: cannot download segment {segment}")
        if self.chooser.chance(self.rates.fetch_fail, "fetch_fail"):
            self.stats["fetch_fail"] += 1
            raise NodeUnavailableError(f"injected: download of segment {segment} from {source} failed")
        return node.journal.read_segment_file(segment)[0]

    # -- baton -------------------------------------------------------------------------------

    def block_current(self, cond: _SimCondition) -> None:
        """In a writer thread: give the baton to the scheduler until it resumes this writer."""
        task = self._current
        if task is None or threading.current_thread() is not task.thread:
            raise RuntimeError("a simulated quorum wait outside a writer task")
        task.waits += 1
        if task.waits == task.death_at and not self._final:
            self.stats["writer_kills"] += 1
            task.life.crash("planned death")
            self.note(f"w{task.wid} CRASHES (its planned death at wait {task.waits}) while {task.phase}")
            self._drop_unsent(task)
            raise _Killed
        task.state = "waiting"
        task.cond = cond
        cond.notified = False
        self._back.release()
        task.go.acquire()
        task.state = "running"
        if task.kill:
            raise _Killed

    def baton_back(self) -> None:
        self._back.release()

    def _run_task(self, task: _Task) -> None:
        self._current = task
        task.go.release()
        if not self._back.acquire(timeout=_BATON_TIMEOUT):
            raise RuntimeError(f"writer w{task.wid} did not yield within {_BATON_TIMEOUT}s")
        self._current = None
        if task.state == "done":
            self._task_ended(task)

    def _task_ended(self, task: _Task) -> None:
        e = task.error
        if e is None:
            self.note(f"w{task.wid} ended: {task.outcome}")
            return
        if isinstance(e, SimViolation):
            raise e
        if isinstance(e, InvariantViolation):
            self.note(f"w{task.wid} hit InvariantViolation: {e}")
            self.checker.fail(f"the protocol code raised InvariantViolation in w{task.wid}: {e}")
        if isinstance(e, (QuorumError, WriterCrashedError)):
            if isinstance(e, QuorumError) and e.fenced:
                self.stats["fenced"] += 1
            self.note(f"w{task.wid} ended: {type(e).__name__}: {e}")
            return
        tb = "".join(traceback.format_exception(e)).rstrip()
        self.note(f"w{task.wid} crashed with an unexpected error:\n{tb}")
        self.checker.fail(f"client code failed unexpectedly in w{task.wid}: {type(e).__name__}: {e}")

    def _kill(self, task: _Task, why: str) -> None:
        task.life.crash(why)
        task.kill = True
        self.note(f"w{task.wid} CRASHES ({why}) while {task.phase}")
        self._drop_unsent(task)
        self._run_task(task)

    def _drop_unsent(self, task: _Task) -> None:
        """A dead writer's calls still queued in its process die with it: per channel only a prefix
        was already on the wire (and may still arrive); the rest is never sent."""
        if self._final:
            return
        for lg in task.loggers:
            if not lg.queue:
                continue
            keep = self.chooser.randint(0, len(lg.queue), "unsent")
            dropped = list(lg.queue)[keep:]
            for _ in dropped:
                lg.queue.pop()
            for m in dropped:
                self.note(f"w{task.wid} -> {lg.name} {m.summary}: never sent (the writer died)")
                m.fut.set_exception(WriterCrashedError(f"w{task.wid} died before sending {m.op}"))

    # -- sending and delivering ----------------------------------------------------------------

    def on_send(self, lg: SimLogger, op: str) -> None:
        """Fault point when a writer sends: it may die partway through its fan-out."""
        if not self._final and self.chooser.chance(self.rates.writer_crash_send, "writer_crash_send"):
            self.stats["writer_crash_send"] += 1
            lg.life.crash(f"died while sending {op} to {lg.name}")
            self.note(f"w{lg.writer} CRASHES while sending {op} to {lg.name}")
            for t in self.tasks:
                if t.wid == lg.writer:
                    self._drop_unsent(t)
            lg.life.check()

    def _fault_for(self, m: _Msg) -> str:
        planned = self.planned.get((m.logger.writer, m.logger.node, m.seq))
        if planned is not None:
            return planned
        if self._final:
            return "ok"
        if (m.logger.writer, m.logger.node) in self._cut:
            return "fail"
        if self.chooser.chance(self.rates.fail_before, "fail_before"):
            return "fail"
        if self.chooser.chance(self.rates.reply_lost, "reply_lost"):
            return "lost"
        return "ok"

    def deliver(self, lg: SimLogger) -> None:
        m = lg.queue.popleft()
        node = self.nodes[lg.node]
        self.stats["deliveries"] += 1
        if m.is_data:
            self._deliver_data(lg, node, m)
        else:
            self._deliver_ctl(lg, node, m)
        self.checker.check_node(node)

    def _complete(self, m: _Msg, node: _Node, result: object = None, error: BaseException | None = None) -> None:
        lg = m.logger
        if error is None:
            try:
                lg.hooks.after(node.name, m.op)
            except WriterCrashedError as e:
                lg.life.crash(str(e))
                error = e
        if error is None:
            m.fut.set_result(result)
        else:
            if m.on_fail is not None:
                m.on_fail()
            m.fut.set_exception(error)

    def _deliver_ctl(self, lg: SimLogger, node: _Node, m: _Msg) -> None:
        tag = f"{node.name} <- w{lg.writer} {m.summary}"
        fault = self._fault_for(m)
        j = node.journal
        if j is None:
            self.note(f"{tag} => node down")
            self._complete(m, node, error=NodeUnavailableError(f"{node.name} is down"))
            return
        if fault == "fail":
            self.stats["fail_before"] += 1
            self.note(f"{tag} => LOST before delivery")
            self._complete(m, node, error=NodeUnavailableError(f"injected: {m.op} to {node.name} lost"))
            return
        promised = node.storage.read_long(PROMISED) or 0
        assert m.run is not None
        try:
            result = m.run(j)
        except _NodeCrash as c:
            self.stats["crash_inside"] += 1
            self._crash_node(node, f"inside {m.op} at {c}")
            self.note(f"{tag} => node died")
            self._complete(m, node, error=NodeUnavailableError(f"{node.name} died during {m.op}"))
            return
        except QJMError as e:
            # An InvariantViolation reply is delivered like any error: the QuorumCall of a writer
            # still waiting raises it at once (never outvoted), which ends the run as a violation.
            self.note(f"{tag} => {type(e).__name__}: {e}")
            if isinstance(e, InvariantViolation):
                self.stats["invariant_replies"] += 1
                self.invariant_replies.append(f"{node.name} {m.summary}: {e}")
            self._complete(m, node, error=e)
            return
        except Exception as e:
            self.note(f"{tag} => unexpected {type(e).__name__}: {e}\n{traceback.format_exc().rstrip()}")
            self.checker.fail(f"{node.name} failed unexpectedly in {m.op}: {type(e).__name__}: {e}")
            return
        if m.op == "new_epoch":
            self.checker.on_new_epoch(node, m.epoch, promised)
        elif m.op not in _UNFENCED_OPS:
            self.checker.on_request(node, m.op, lg._epoch, promised)
        if fault == "lost":
            self.stats["reply_lost"] += 1
            self.note(f"{tag} => done, REPLY LOST ({_short(result)})")
            self._complete(m, node, error=NodeUnavailableError(f"injected: reply to {m.op} from {node.name} lost"))
            return
        self.note(f"{tag} => ok {_short(result) if result is not None else ''}".rstrip())
        self._complete(m, node, result)

    def _deliver_data(self, lg: SimLogger, node: _Node, m: _Msg) -> None:
        group = [m]
        while (
            lg.queue
            and lg.queue[0].is_data
            and lg.queue[0].gen == m.gen
            and len(group) < 4
            and self.chooser.chance(self.rates.group_commit, "group_commit")
        ):
            group.append(lg.queue.popleft())
        if len(group) > 1:
            self.stats["group_commits"] += 1
        tag = f"{node.name} <- w{lg.writer} " + " + ".join(g.summary for g in group)
        if lg.link_broken(m.gen):
            self.note(f"{tag} => link already broken")
            for g in group:
                self._complete(g, node, error=OutOfSyncError(f"{node.name}: data link failed earlier"))
            return
        fault = self._fault_for(m)
        j = node.journal
        if j is None or fault == "fail":
            if j is not None:
                self.stats["fail_before"] += 1
            self.note(f"{tag} => {'node down' if j is None else 'LOST before delivery'}; link breaks")
            lg.link_failed(m.gen)
            for g in group:
                self._complete(g, node, error=NodeUnavailableError(f"{node.name}: data link lost"))
            return
        promised = node.storage.read_long(PROMISED) or 0
        writer_epoch = node.storage.read_long(WRITER) or 0
        seg_name = f"edits_inprogress_{m.segment:019d}"
        size_before = len(node.storage.read_file(seg_name)) if seg_name in node.storage.file_names() else 0
        error: BaseException | None = None
        durable = 0
        try:
            durable = j.journal([g.frame for g in group])
        except _NodeCrash as c:
            self.stats["crash_inside"] += 1
            self._crash_node(node, f"inside journal at {c}")
            self.note(f"{tag} => node died")
            lg.link_failed(m.gen)
            for g in group:
                self._complete(g, node, error=NodeUnavailableError(f"{node.name} died"))
            return
        except InvariantViolation as e:
            self.checker.fail(f"{node.name} raised InvariantViolation in journal: {e}")
        except QJMError as e:
            # data.py: the error carries the journal's durable txid, else the connection's last ack
            durable = int(getattr(e, "durable_txid", lg.link_acked.get(m.gen, 0)))
            error = e
        except Exception as e:
            self.note(f"{tag} => unexpected {type(e).__name__}: {e}\n{traceback.format_exc().rstrip()}")
            self.checker.fail(f"{node.name} failed unexpectedly in journal: {type(e).__name__}: {e}")
        # RemoteLogger completes every pending batch at or below the durable txid a node reports,
        # also in an error reply: so does the simulation, and the checker looks at what that means.
        ok = [g for g in group if error is None or g.last <= durable]
        if ok:
            lg.link_acked[m.gen] = max(lg.link_acked.get(m.gen, 0), durable)
        if error is not None and ok:
            self.note(f"{tag} => {type(error).__name__} reporting durable through {durable}: acks {len(ok)} frame(s)")
        self.checker.on_frames(node, ok, promised, writer_epoch, size_before)
        if error is None:
            commits = [g.commit for g in group if g.commit is not None]
            if commits:
                try:
                    j.note_committed(m.epoch, max(commits))
                except QJMError as e:
                    error = e  # the node closes the link after the acks it already sent
        if fault == "lost":
            self.stats["reply_lost"] += 1
            self.note(f"{tag} => durable through {durable}, REPLY LOST; link breaks")
            lg.link_failed(m.gen)
            for g in group:
                self._complete(g, node, error=NodeUnavailableError(f"{node.name}: ack lost"))
            return
        if error is not None:
            self.note(f"{tag} => durable through {durable}, then {type(error).__name__}: {error}; link breaks")
            lg.link_failed(m.gen)
        else:
            self.note(f"{tag} => durable through {durable}")
        for g in group:
            if g in ok:
                self._complete(g, node, durable)
            else:
                self._complete(g, node, error=error)

    # -- nodes -------------------------------------------------------------------------------

    def _crash_node(self, node: _Node, why: str) -> None:
        before = {n: len(node.storage.read_file(n)) - node.storage.durable_size(n) for n in node.storage.file_names()}
        node.storage.crash(self._torn)
        node.journal = None
        self.stats["node_crashes"] += 1
        lost = sum(before.values())
        self.note(f"{node.name} CRASHES ({why}); {lost} un-synced byte(s) at risk")
        self.checker.check_node(node)

    def _toggle_partition(self) -> None:
        """Heal a cut channel, or cut one between a live writer and a node (both directions)."""
        c = self.chooser
        if self._cut and c.choice(2, "heal") == 0:
            cut = sorted(self._cut)
            w, n = cut[c.choice(len(cut), "which_cut")]
            self._cut.discard((w, n))
            self.note(f"partition between w{w} and n{n} heals")
            return
        chans = [(t.wid, i) for t in self._live() for i in range(len(self.nodes)) if (t.wid, i) not in self._cut]
        if chans:
            w, n = chans[c.choice(len(chans), "which_channel")]
            self._cut.add((w, n))
            self.stats["partitions"] += 1
            self.note(f"PARTITION: w{w} cannot reach n{n}")

    def _restart_node(self, node: _Node) -> None:
        try:
            node.journal = self._new_journal(node.index)
        except QJMError as e:
            self.checker.fail(f"{node.name} cannot restart: {type(e).__name__}: {e}")
        self.note(f"{node.name} restarts")
        self.checker.check_node(node)

    # -- writers -----------------------------------------------------------------------------

    def _draw_plan(self, first: bool) -> WriterPlan:
        c = self.chooser
        ops: list[str] = []
        for _ in range(c.choice(4 if self.profile == "recovery" else 6, "plan")):
            r = c.choice(10, "plan")
            if r < 6:
                ops.append(f"b{1 + c.choice(3, 'plan')}")
            elif r < 8:
                ops.append("roll")
            else:
                ops.append("sync")
        if c.choice(3, "plan") == 0:
            ops.append("fin")
        return WriterPlan(tuple(ops), pipeline=1 + c.choice(2, "plan"), format=False)

    def _spawn(self, plan: WriterPlan, *, final: bool = False) -> _Task:
        wid = len(self.tasks) + 1
        task = _Task(self, wid, plan, final)
        if not final and self.chooser.chance(self.rates.slow_node, "slow_node"):
            n = self.chooser.choice(len(self.nodes), "which_node")
            self._slow[(wid, n)] = 0.1
            self.note(f"n{n} is slow to answer w{wid}")
        if not final and self.chooser.chance(self.rates.death_point, "death_point"):
            task.death_at = 1 + self.chooser.choice(8 if self.profile == "recovery" else 12, "death_at")
        self.tasks.append(task)
        self.stats["writers"] += 1
        self.note(f"w{wid} starts{' (final recovery, no faults)' if final else ''}: plan {' '.join(plan.ops) or '-'}")
        return task

    def writer_body(self, task: _Task) -> None:
        """What a writer does (in its own thread, holding the baton): recover, then its plan."""
        q = task.qjm
        if task.plan.format:
            task.phase = "format"
            q.format()
        task.phase = "recover"
        last = q.recover_unfinalized_segments()
        task.recovered = last
        self.stats["recoveries"] += 1
        if self.checker.after_recovery(task.wid, q.epoch, last):
            self.note(f"w{task.wid} recovered: the log ends at {last}")
        else:
            self.note(f"w{task.wid} recovered to {last}, but a newer epoch was won meanwhile: it is stale")
        if task.final:
            return
        task.segment = task.next_txid = last + 1
        task.phase = "start"
        q.start_log_segment(task.segment)
        for pc, op in enumerate(task.plan.ops):
            task.pc = pc + 1
            task.phase = op
            if op.startswith("b"):
                self._send(task, int(op[1:]))
                while len(task.inflight) > task.plan.pipeline:
                    self._reap(task)
            elif op == "sync":
                self._sync(task)
            elif op in ("roll", "fin"):
                self._sync(task)
                if task.next_txid > task.segment:
                    q.finalize_log_segment(task.segment, task.next_txid - 1)
                    self.note(f"w{task.wid} finalized {task.segment}-{task.next_txid - 1}")
                    if op == "fin":
                        return
                    task.phase = "start"
                    q.start_log_segment(task.next_txid)
                    task.segment = task.next_txid
        task.phase = "sync"
        self._sync(task)

    def _send(self, task: _Task, n: int) -> None:
        first = task.next_txid
        records = [
            b"w%d-e%d-t%d-%s" % (task.wid, task.qjm.epoch, t, b"%04x" % self.chooser.randint(0, 0xFFFF, "payload"))
            for t in range(first, first + n)
        ]
        frame = framing.encode_frame(records, epoch=task.qjm.epoch, segment_txid=task.segment, first_txid=first)
        call = task.qjm.send_batch(frame, first, first + n - 1)
        task.inflight.append(_Batch(first, first + n - 1, records, call))
        task.next_txid += n

    def _reap(self, task: _Task) -> None:
        b = task.inflight[0]
        b.call.wait_for_write_quorum(self.config.timeouts.write_txns, f"journal({b.first}-{b.last})")
        task.inflight.popleft()
        self.note(f"w{task.wid} ACKED txids {b.first}-{b.last}")
        self.stats["acked_txids"] += b.last - b.first + 1
        self.checker.on_acked(task.wid, b.first, b.records)
        if b.last > task.qjm.committed_txid:
            task.qjm.set_committed_txid(b.last)

    def _sync(self, task: _Task) -> None:
        while task.inflight:
            self._reap(task)

    # -- the scheduler -----------------------------------------------------------------------

    def _live(self) -> list[_Task]:
        return [t for t in self.tasks if t.state != "done"]

    def _channels(self) -> list[SimLogger]:
        """Channels with calls in flight, in the default schedule's order (slow ones last)."""
        chans = [lg for t in self.tasks for lg in t.loggers if lg.queue]
        sign = -1 if self.workload.newest_first else 1
        chans.sort(key=lambda lg: ((lg.writer, lg.node) in self._slow, sign * lg.writer, lg.node))
        return chans

    def state_key(self) -> object:
        """Everything the rest of a run depends on (for pruning in the exhaustive search)."""
        nodes = []
        for n in self.nodes:
            st = n.storage
            files = tuple((name, st.read_file(name), st.durable_size(name)) for name in st.file_names())
            longs = tuple(st.read_long(k) for k in (PROMISED, WRITER, COMMITTED))
            durable = tuple(sorted(getattr(st, "_durable_longs", {}).items()))
            paxos = tuple((p, st.read_paxos(p)) for p in st.list_paxos())
            j = n.journal
            jk = None
            if j is not None:
                o = j._open
                jk = (j._promised, j._writer_epoch, j._committed, j._serial, j._highest_written,
                      None if o is None else (o.start, o.next_txid))  # fmt: skip
            nodes.append((files, longs, durable, paxos, jk))
        chans = tuple(lg.state_key() for t in self.tasks for lg in t.loggers)
        tasks = tuple(t.state_key() for t in self.tasks)
        return (
            tuple(nodes), chans, tasks, self.checker.state_key(), len(self._plans), tuple(sorted(self._cut)),
            self.epoch_hints.snapshot(),
        )  # fmt: skip

    def run(self) -> SimResult:
        """Run to the end: the workload under faults, then a final fault-free recovery and checks."""
        violation: SimViolation | None = None
        pruned = False
        try:
            self._begin()
            while self.step < self.max_steps and not self._idle():
                if not self.chooser.at_state(self.state_key):
                    pruned = True
                    break
                self._step()
            if not pruned:
                self._finish()
        except SimViolation as v:
            violation = v
        finally:
            self._shutdown()
        self.stats["steps"] = self.step
        return SimResult(
            self.seed,
            violation is None,
            None if violation is None else violation.message,
            self.trace if violation is None else violation.trace,
            dict(self.stats),
            pruned,
        )

    def _begin(self) -> None:
        w = self.workload
        if w.format_in_setup:
            for n in self.nodes:
                assert n.journal is not None
                n.journal.format(NS)
            self.note(f"setup: formatted {len(self.nodes)} nodes")
        if w.plans is not None:
            self._plans = list(w.plans)
        else:
            count = (3 if self.profile == "recovery" else 2) + self.chooser.choice(3, "writers")
            self._plans = [self._draw_plan(i == 0) for i in range(count)]
        self._interleaved = w.interleaved if w.interleaved is not None else self.chooser.choice(2, "mode") == 1
        how = "interleaved" if self._interleaved else "one after another"
        self.note(f"profile {self.profile}: {len(self._plans)} writers, {how}")
        self._run_task(self._spawn(self._plans.pop(0)))
        self._settle()

    def _idle(self) -> bool:
        return not self._plans and not self._live()

    def _settle(self) -> None:
        """Let every writer whose quorum call changed look at it, at once.

        Eager resumption loses no execution: a writer only appends to its FIFO channels, so
        sending earlier leaves every later delivery order possible (and keeps the search small).
        """
        progress = True
        while progress:
            progress = False
            for t in self._live():
                if t.runnable and t.state != "new":
                    self._run_task(t)
                    progress = True

    def _step(self) -> None:
        self._step_once()
        self._settle()

    def _step_once(self) -> None:
        self.step += 1
        self._time += 0.001
        c = self.chooser
        for n in self.nodes:
            if n.journal is None and c.chance(self.rates.node_restart, "node_restart"):
                self._restart_node(n)
                return
        if c.chance(self.rates.partition, "partition"):
            self._toggle_partition()
            return
        up = [n for n in self.nodes if n.journal is not None]
        if up and c.chance(self.rates.node_crash, "node_crash"):
            self._crash_node(up[c.choice(len(up), "which_node")], "power cut")
            return
        for t in self._live():
            if t.state == "waiting" and c.chance(self.rates.writer_kill, "writer_kill"):
                self.stats["writer_kills"] += 1
                self._kill(t, "killed by the scheduler")
                return
        actions: list[Callable[[], None]] = []
        weights: list[float] = []
        for lg in self._channels():
            actions.append(lambda lg=lg: self.deliver(lg))  # type: ignore[misc]
            weights.append(self._slow.get((lg.writer, lg.node), 1.0))
        if self._plans and (self._interleaved or not self._live()):
            actions.append(lambda: self._run_task(self._spawn(self._plans.pop(0))))
            weights.append(1.0)
        if not actions:
            if all(n.journal is not None for n in self.nodes):
                waiting = ", ".join(f"w{t.wid} in {t.phase}" for t in self._live())
                self.checker.fail(f"deadlock: {waiting} wait(s) but no call is in flight")
            return  # only a restart can make progress
        actions[c.pick(weights, "action")]()

    def _finish(self) -> None:
        """Heal everything, let in-flight calls land, then a fresh writer recovers; check it all."""
        self._final = True
        self.rates = NO_FAULTS
        self.chooser = RandomChooser(random.Random(self.seed if self.seed is not None else 0))
        self._torn = _ChooserRandom(self.chooser)
        self._plans = []
        for t in self._live():
            if t.state == "waiting":
                self._kill(t, "end of the run")
        for t in self._live():  # never started
            self._kill(t, "end of the run")
        for n in self.nodes:
            if n.journal is None:
                self._restart_node(n)
        while chans := self._channels():
            self.step += 1
            self.deliver(chans[self.chooser.choice(len(chans), "drain")])
        formatted = sum(1 for n in self.nodes if n.storage.read_namespace() is not None)
        final = self._spawn(WriterPlan(()), final=True)
        self._run_task(final)
        while self._live():
            chans = self._channels()
            if not chans:
                self.checker.fail("deadlock in the final recovery")
            self.step += 1
            self.deliver(chans[self.chooser.choice(len(chans), "final")])
            self._settle()
        if final.recovered is None:
            if formatted < self.checker.majority and not self.checker.acked:
                self.note("final recovery impossible: the journal was never formatted on a majority")
                return
            self.checker.fail(f"liveness: with every node up and no faults, the final recovery failed ({final.error})")
        for n in self.nodes:
            self.checker.check_node(n)

    def _shutdown(self) -> None:
        """Unwind every writer thread still parked (also after a violation)."""
        self._final = True
        for t in self.tasks:
            if t.state != "done":
                t.kill = True
                t.life.crash("simulation over")
                self._current = t
                t.go.release()
                self._back.acquire(timeout=_BATON_TIMEOUT)
                self._current = None
        for t in self.tasks:
            t.thread.join(timeout=_BATON_TIMEOUT)


def run_seed(
    seed: int,
    *,
    steps: int = 400,
    bugs: ProtocolBugs | None = None,
    keep_trace: bool = False,
    check_durable_ack: bool = True,
    workload: Workload | None = None,
    rates: FaultRates | None = None,
) -> SimResult:
    """Run one seed. Without ``keep_trace`` a failing seed is run again to record its trace."""
    res = Simulation(
        seed, steps=steps, bugs=bugs, keep_trace=keep_trace, check_durable_ack=check_durable_ack,
        workload=workload, rates=rates,
    ).run()  # fmt: skip
    if not res.ok and not keep_trace:
        again = Simulation(
            seed, steps=steps, bugs=bugs, keep_trace=True, check_durable_ack=check_durable_ack,
            workload=workload, rates=rates,
        ).run()  # fmt: skip
        if again.violation != res.violation:
            raise RuntimeError(f"seed {seed} is not deterministic: {res.violation!r} then {again.violation!r}")
        return again
    return res


def violation_category(violation: str | None) -> str:
    """``"invariant 4 (fencing)"`` of ``"invariant 4 (fencing): n1 acknowledged ..."``."""
    return (violation or "").split(":", 1)[0]


def caused_by(bugs: ProtocolBugs, seed: int, result: SimResult, **kw: Any) -> bool:
    """Is ``result`` (a violation with ``bugs``) the switch's doing? The same seed must pass without
    it, or break a different invariant (another, real bug may also live on that seed)."""
    clean = run_seed(seed, **kw)
    return clean.ok or violation_category(clean.violation) != violation_category(result.violation)


def search_seeds(
    seeds: Iterable[int], *, bugs: ProtocolBugs | None = None, differential: bool = True, **kw: Any
) -> tuple[int, SimResult] | None:
    """The first seed whose run violates an invariant (with ``bugs``: one the switch caused)."""
    for seed in seeds:
        r = run_seed(seed, bugs=bugs, **kw)
        if r.ok:
            continue
        if bugs is not None and differential and not caused_by(bugs, seed, r, **kw):
            continue
        return seed, r
    return None
