"""One simulated execution (``Simulation``): the scheduler that passes the baton, fault injection,
delivery of calls to the nodes, and the final fault-free recovery; ``run_seed`` and the seed
searches over it.
"""

from __future__ import annotations

import logging
import random
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from qjm import errors
from qjm._native import framing
from qjm.client.node_io import NoReply
from qjm.client.retention import purge_limit
from qjm.client.shared import EpochHints
from qjm.config import QJMConfig
from qjm.errors import (
    InvariantViolation,
    NodeUnavailableError,
    OutOfOrderError,
    QJMError,
    QuorumError,
    WriterCrashedError,
)
from qjm.protocol import convert, wire
from qjm.protocol.messages import PrepareRecoveryResponse, RemoteEditLog
from qjm.server.data import apply_run
from qjm.server.journal import COMMITTED, PROMISED, WRITER, Journal
from qjm.server.syncer import JournalSyncer
from qjm.testing.bugs import ProtocolBugs
from qjm.testing.memstore import MemoryStorage
from qjm.testing.sim.checker import Checker, SimViolation
from qjm.testing.sim.choice import (
    NO_FAULTS,
    RANDOM_WORKLOAD,
    Chooser,
    ChooserRandom,
    FaultRates,
    RandomChooser,
    Workload,
    WriterPlan,
    WriterRole,
)
from qjm.testing.sim.deadline import (
    DEFAULT_DEADLINE,
    HARNESS_FAILURE,
    STACK_HEADING,
    DeadlineExceeded,
    execution_deadline,
)
from qjm.testing.sim.nodes import JOURNAL_ID, NS, Node, NodeCrash, SimHooks
from qjm.testing.sim.transport import Msg, SimCondition, SimNodeIO, SimServicer, short
from qjm.testing.sim.writers import Batch, Killed, Task

__all__ = [
    "SimResult",
    "Simulation",
    "caused_by",
    "run_seed",
    "search_seeds",
    "violation_category",
]


_UNFENCED_OPS = (
    "is_formatted", "format", "get_journal_state", "get_edit_log_manifest", "get_journaled_edits", "status",
)  # fmt: skip
SIM_CHUNK = 97  # bytes per download chunk: frames arrive cut in several pieces
SYNC_EVERY = 5  # steps between catch-up rounds: node (step / SYNC_EVERY) mod n runs one
DISK_SEEDS = 4  # one seed in this many (by its number, no random draw) may lose a node's disk ...
DISK_LOSS = 0.05  # ... at this rate per step, once (a lost disk and qjm rejoin, design §4.5)


@dataclass
class SimResult:
    seed: int | None
    ok: bool
    violation: str | None
    trace: list[str]
    stats: dict[str, int]
    pruned: bool = False
    node_alarms: list[str] = field(default_factory=list)
    """Every ``InvariantViolation`` a node replied with, whether or not a writer waited for it:
    each one fails the run (the first is its violation)."""
    harness_failure: bool = False
    """The run failed in the harness, not the protocol: it ran past its deadline (its trace ends
    with the stack that was running then)."""


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
        quiet_links: bool | None = None,
        deadline: float | None = DEFAULT_DEADLINE,
    ) -> None:
        self.seed = seed
        self.deadline = deadline
        self.max_steps = steps
        self.bugs = bugs
        self.rng = random.Random(seed)
        self.chooser = chooser or RandomChooser(self.rng)
        self.workload = workload or RANDOM_WORKLOAD
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
        # Seeds 0-1, 4-5, ... (and the exhaustive worlds): quiet links, each batch counted by a
        # LinkBatch from the links' acks, as on a native build; seeds 2-3, 6-7, ...: a future per
        # batch and QuorumCall, as on a pure build (QJM_NO_EXTENSIONS). Both are shipped data paths,
        # so each gets half the seeds, crossed with the epoch hints above, with no random draw.
        self.quiet_links = (seed or 0) // 2 % 2 == 0 if quiet_links is None else quiet_links
        self.news = 0  # the quiet links' news counter (Fanout.news): bumped by every ack or failure
        self.uri = "qjournal://" + ";".join(f"n{i}:1" for i in range(self.workload.nodes)) + "/" + JOURNAL_ID
        self.nodes: list[Node] = []
        for i in range(self.workload.nodes):
            st = MemoryStorage(JOURNAL_ID)
            self.nodes.append(Node(i, self.node_name(i), st, None))
            self.nodes[i].journal = self._new_journal(i)
        self._servicers = [SimServicer(self, i) for i in range(self.workload.nodes)]
        self.checker = Checker(self)
        self.checker.check_durable_ack = check_durable_ack
        self.tasks: list[Task] = []
        self._current: Task | None = None
        self._torn = ChooserRandom(self.chooser)
        self.stats: dict[str, int] = {
            "steps": 0, "deliveries": 0, "fail_before": 0, "reply_lost": 0, "node_crashes": 0, "crash_inside": 0,
            "writer_kills": 0, "writer_crash_send": 0, "fetch_fail": 0, "writers": 0, "acked_txids": 0,
            "recoveries": 0, "fenced": 0, "group_commits": 0, "partitions": 0, "node_alarms": 0,
            "purges": 0, "auto_rolls": 0, "duplicated": 0, "late": 0, "reordered": 0, "gaps": 0,
            "shape_common": 0, "shape_partial": 0, "shape_unequal": 0, "shape_accepted": 0,
            "link_batches": 0, "disk_losses": 0, "rejoins": 0,
        }  # fmt: skip
        self._setup_rates(rates)
        self._plans: list[WriterPlan] = []
        self._roles: list[WriterRole] = []  # shapes profile: the parts of the writers still to start
        self._interleaved = False
        self._final = False
        self._cut: set[tuple[int, int]] = set()  # (writer, node) channels that lose every call
        self._slow: dict[tuple[int, int], float] = {}  # (writer, node) → delivery weight below 1
        self.node_alarms: list[str] = []  # nodes' InvariantViolation replies (see SimResult)
        for w, n in self.workload.slow:
            self._slow[(w, n)] = 0.1
        self._syncers: dict[int, JournalSyncer] = {}
        self._disk_lost: int | None = None  # the node whose disk was lost, if one was
        # (node, peer) → the peer's segments as the node's previous round saw them
        self._seen_manifests: dict[tuple[int, str], list[RemoteEditLog]] = {}

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
        makes such chains likely: many short-lived writers, planned deaths, lagging nodes. The
        ``shapes`` profile goes further for the rarest recovery shapes (see ``_shape_roles``).
        """
        self.profile = "fixed"
        if rates is not None:
            self.rates = rates
            return
        r = self.chooser.choice(10, "profile")
        if r == 0:
            self.profile, self.rates = "calm", FaultRates().scaled(0.0)
        elif r < 5:
            self.profile = "mixed"
            self.rates = FaultRates().scaled((0.5, 1.0, 1.0, 2.0, 3.0)[self.chooser.choice(5, "storm")])
        elif r < 8:
            self.profile = "recovery"
            self.rates = replace(FaultRates().scaled(0.5), death_point=0.8, slow_node=0.7)
        else:
            self.profile = "shapes"
            self.rates = replace(FaultRates().scaled(0.25), death_point=0.0, slow_node=0.3)
        if self.profile in ("mixed", "recovery") and (self.seed or 0) % DISK_SEEDS == DISK_SEEDS - 1:
            self.profile += "+disk"
            self.rates = replace(self.rates, disk_loss=DISK_LOSS)

    def _shape_roles(self) -> list[WriterRole]:
        """A chain of writers built to leave one of the rare recovery shapes behind, around an odd
        node ``o`` (the other two are ``a`` and ``b``); delivery order and light faults stay random.

        * interrupted recovery: w1 dies with its last txid on ``o`` alone (unequal copies); w2,
          cut off from ``o``, recovers from a quorum holding one copy and dies finalizing it on
          ``a`` alone; w3, cut off from ``a``, must recover the copy w2 chose, not ``o``'s longer
          one (design §2.10.7: the accepted proposal decides).
        * same-length copies: w1 dies with its first batch on ``o`` alone; w2, cut off from ``o``,
          writes as many txids into the same segment; w3's accept never reaches ``o``, whose copy
          has the chosen length but another writer's frames, and must not be finalized.
        """
        c = self.chooser
        order = list(range(len(self.nodes)))
        o = order.pop(c.choice(len(order), "odd_node"))
        a = order[c.choice(len(order), "other_node")]
        if c.choice(2, "shape") == 0:
            return [
                WriterRole(WriterPlan(("b1", "sync", "b1")), "journal", 2, reach=frozenset({o})),
                WriterRole(WriterPlan(()), "finalize_log_segment", 1, reach=frozenset({a}), cut=frozenset({o})),
                WriterRole(WriterPlan(()), cut=frozenset({a})),
            ]
        batch = f"b{1 + c.choice(2, 'batch')}"
        return [
            WriterRole(WriterPlan((batch,)), "journal", 1, reach=frozenset({o})),
            WriterRole(WriterPlan((batch,)), cut=frozenset({o})),
            WriterRole(WriterPlan(()), miss_accept=frozenset({o})),
        ]

    def _new_journal(self, i: int) -> Journal:
        bugs = self.bugs if self.bugs is not None and self.bugs.server_side else None
        return Journal(self.nodes[i].storage, fetcher=self.fetch, clock=self.clock, hooks=SimHooks(self, i), bugs=bugs)

    def fetch(self, source: str, journal_id: str, segment: int) -> Iterator[bytes]:
        """A download from another node (a direct read of its Journal), in small chunks that cut
        frames, as the network may."""
        node = self.nodes[int(source[1:])]
        if node.journal is None:
            raise NodeUnavailableError(f"{source} is down: cannot download segment {segment}")
        if self.chooser.chance(self.rates.fetch_fail, "fetch_fail"):
            self.stats["fetch_fail"] += 1
            raise NodeUnavailableError(f"injected: download of segment {segment} from {source} failed")
        return node.journal.open_download(segment).chunks(SIM_CHUNK)

    # -- catch-up (design §4.4) -------------------------------------------------------------------

    def _sync_round(self) -> None:
        """One catch-up round of one node, on a fixed schedule (no random draw, so that the seeds
        of the other faults keep their meaning). A round acts on the manifest the node's previous
        round saw of that peer: the writers' deliveries in between race the download and install,
        as a finalize or a recovery may race a real node's catch-up."""
        self._sync_node(self.step // SYNC_EVERY % len(self.nodes))

    def _sync_node(self, k: int) -> None:
        node = self.nodes[k]
        j = node.journal
        if j is None:
            return
        syncer = self._syncers.get(k)
        if syncer is None or syncer.journal is not j:
            peers = [n.name for n in self.nodes if n.index != k]
            bugs = self.bugs if self.bugs is not None and self.bugs.server_side else None
            syncer = self._syncers[k] = JournalSyncer(
                j, peers, lambda peer, jid, ipok: self._stale_manifest(k, peer, ipok), self._sync_fetch,
                wall=self.clock, bugs=bugs,
            )  # fmt: skip
        before = (j.sync_stats.segments_downloaded, j.sync_stats.divergences)
        syncer.run_once()
        if (j.sync_stats.segments_downloaded, j.sync_stats.divergences) != before:
            self.note(
                f"{node.name} catch-up: {j.sync_stats.segments_downloaded} segment(s) installed, "
                f"{j.sync_stats.divergences} divergence(s) so far"
            )
        self.checker.check_node(node)

    def _stale_manifest(self, k: int, peer: str, in_progress_ok: bool) -> list[RemoteEditLog]:
        seen = self._seen_manifests.get((k, peer), [])
        pj = self.nodes[int(peer[1:])].journal
        if pj is None:
            raise NodeUnavailableError(f"{peer} is down")
        self._seen_manifests[(k, peer)] = list(pj.get_edit_log_manifest(1, in_progress_ok).logs)
        return seen

    def _sync_fetch(self, source: str, journal_id: str, segment: int) -> Iterator[bytes]:
        """Catch-up's download: like ``fetch`` without its injected failure (no random draw)."""
        node = self.nodes[int(source[1:])]
        if node.journal is None:
            raise NodeUnavailableError(f"{source} is down: cannot download segment {segment}")
        return node.journal.open_download(segment).chunks(SIM_CHUNK)

    # -- baton -------------------------------------------------------------------------------

    def block_current(self, cond: SimCondition) -> None:
        """In a writer: give the baton to the scheduler until it resumes this writer."""
        task = self._current
        if task is None or not task.is_current:
            raise RuntimeError("a simulated quorum wait outside a writer task")
        task.waits += 1
        op = next((s.split("(", 1)[0] for s in cond.owner.summaries.values() if s != "(not sent)"), "")
        task.op_waits[op] = task.op_waits.get(op, 0) + 1
        role = task.role
        if role is not None and role.death_op == op and task.op_waits[op] == role.death_nth and not self._final:
            self.stats["writer_kills"] += 1
            task.life.crash("planned death")
            self.note(f"w{task.wid} CRASHES (its role: dies on {op} #{role.death_nth}) while {task.phase}")
            self._drop_unsent(task)
            raise Killed
        if task.waits == task.death_at and not self._final:
            self.stats["writer_kills"] += 1
            task.life.crash("planned death")
            self.note(f"w{task.wid} CRASHES (its planned death at wait {task.waits}) while {task.phase}")
            self._drop_unsent(task)
            raise Killed
        task.state = "waiting"
        task.cond = cond
        cond.notified = False
        task.park()
        task.state = "running"
        if task.kill:
            raise Killed

    def on_news(self) -> None:
        """A quiet link acked or failed, or a held batch went out or failed: as ``Fanout.notify``
        wakes every thread in ``wait_news``, every writer counting a ``LinkBatch`` looks again."""
        self.news += 1
        for t in self.tasks:
            if t.state == "waiting" and t.cond is not None and t.cond.on_news:
                t.cond.notified = True

    def _run_task(self, task: Task) -> None:
        self._current = task
        task.resume()
        self._current = None
        if task.state == "done":
            self._task_ended(task)

    def _task_ended(self, task: Task) -> None:
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

    def _kill(self, task: Task, why: str) -> None:
        task.life.crash(why)
        task.kill = True
        self.note(f"w{task.wid} CRASHES ({why}) while {task.phase}")
        self._drop_unsent(task)
        self._run_task(task)

    def _drop_unsent(self, task: Task) -> None:
        """A dead writer's calls still queued in its process die with it: per channel only a prefix
        was already on the wire (and still arrives); the rest is never sent."""
        if self._final:
            return
        reach = task.role.reach if task.role is not None else None
        for io in task.ios:
            if not io.queue:
                continue
            if reach is not None:
                keep = len(io.queue) if io.node in reach else 0
            else:
                keep = self.chooser.randint(0, len(io.queue), "unsent")
            msgs = list(io.queue)
            for m in msgs[:keep]:
                m.on_wire = True
            dropped = msgs[keep:]
            for _ in dropped:
                io.queue.pop()
            for m in dropped:
                self.note(f"w{task.wid} -> {io.name} {m.summary}: never sent (the writer died)")
                crashed = WriterCrashedError(f"w{task.wid} died before sending {m.op}")
                if m.fut is not None and not m.fut.done():
                    m.fut.set_exception(crashed)
                elif m.fut is None and m.link is not None:
                    m.link.fail(crashed)  # a quiet link: its batches left unsent fail with it

    # -- sending and delivering ----------------------------------------------------------------

    def on_recovery_shape(self, prepared: Mapping[str, PrepareRecoveryResponse]) -> None:
        """A writer is about to choose its recovery source: count the shape of the replies it has.

        common: every node holds one copy; partial: some responder lacks the segment, or not every
        node answered; unequal: in-progress copies of different ends; accepted: an earlier
        recovery's accepted proposal is among them.
        """
        states = [r.segment_state for r in prepared.values()]
        ends = {st.end_txid for st in states if st is not None}
        if any(r.accepted_in_epoch for r in prepared.values()):
            shape = "accepted"
        elif len(ends) > 1:
            shape = "unequal"
        elif len(states) == len(self.nodes) and all(st is not None for st in states):
            shape = "common"
        else:
            shape = "partial"
        self.stats[f"shape_{shape}"] += 1

    def on_send(self, io: SimNodeIO, op: str) -> None:
        """Fault point when a writer sends: it may die partway through its fan-out."""
        cur = io.current
        if self._final or (cur is not None and cur.on_wire):
            return
        if self.chooser.chance(self.rates.writer_crash_send, "writer_crash_send"):
            self.stats["writer_crash_send"] += 1
            io.life.crash(f"died while sending {op} to {io.name}")
            self.note(f"w{io.writer} CRASHES while sending {op} to {io.name}")
            for t in self.tasks:
                if t.wid == io.writer:
                    self._drop_unsent(t)
            io.life.check()

    def _fault_for(self, io: SimNodeIO, m: Msg) -> str:
        """What the network does to message ``m`` (a control call's first attempt, or a run of batches).

        ``sticky`` faults (planned, a cut channel, a role's missed accept) also fail the ping that
        would let the client retry, so the call fails as a whole."""
        io.sticky = False
        if m.kind == "data" or io.attempt == 1:
            planned = self.planned.get((io.writer, io.node, m.seq))
            if planned is not None:
                io.sticky = True
                return planned
        if self._final:
            return "ok"
        if (io.writer, io.node) in self._cut:
            io.sticky = True
            return "fail"
        c = self.chooser
        if c.chance(self.rates.fail_before, "fail_before"):
            return "fail"
        role = self.tasks[io.writer - 1].role
        if role is not None and m.op == "accept_recovery" and io.node in role.miss_accept:
            io.sticky = True
            return "fail"
        if c.chance(self.rates.reply_lost, "reply_lost"):
            return "lost"
        if m.kind == "data":
            return "gap" if c.chance(self.rates.gap, "gap") else "ok"
        if c.chance(self.rates.duplicate, "duplicate"):
            return "dup"
        if c.chance(self.rates.late, "late"):
            return "late"
        return "ok"

    def ping(self, io: SimNodeIO) -> bool:
        """Does the node answer the client's reconnect ping after a call got no reply?"""
        if io.sticky or self.nodes[io.node].journal is None or (io.writer, io.node) in self._cut:
            return False
        if self._final:
            return True
        p = self.rates.ping_fail
        return p < 1.0 and not self.chooser.chance(p, "ping_fail")

    def deliver(self, io: SimNodeIO) -> None:
        q = io.queue
        if (
            len(q) > 1
            and q[0].is_data != q[1].is_data
            and "ghost" not in (q[0].kind, q[1].kind)
            and q[1].op != "finalize_log_segment"  # it waits for the batches sent before it
            and not self._final
            and self.chooser.chance(self.rates.reorder, "reorder")
        ):
            self.stats["reordered"] += 1
            q[0], q[1] = q[1], q[0]
            self.note(f"w{io.writer} -> {io.name}: {q[0].summary} overtakes {q[1].summary}")
        m = q.popleft()
        node = self.nodes[io.node]
        self.stats["deliveries"] += 1
        if m.kind == "data":
            self._deliver_data(io, node, m)
        elif m.kind == "ghost":
            self._deliver_ghost(io, node, m)
        else:
            self._deliver_ctl(io, m)
        self.checker.check_node(node)

    def _deliver_ctl(self, io: SimNodeIO, m: Msg) -> None:
        """Run the logger's call here: its request goes out and its reply comes back in this step."""
        assert m.run is not None and m.fut is not None
        io.current, io.attempt = m, 0
        io.life.on_wire = m.on_wire
        try:
            result = m.run()
        except (SimViolation, DeadlineExceeded):
            raise
        except BaseException as e:
            if not m.fut.done():
                m.fut.set_exception(e)
        else:
            if not m.fut.done():
                m.fut.set_result(result)
        finally:
            io.current = None
            io.life.on_wire = False

    def deliver_request(self, io: SimNodeIO, op: str, request: Any) -> Any:
        """One attempt of a control call on the network: the node's reply, or what the client sees."""
        m = io.current
        assert m is not None
        node = self.nodes[io.node]
        what = m.summary if op == m.op else f"{op} (on the way to {m.summary})"
        tag = f"{node.name} <- w{io.writer} {what}{' (retry)' if op == m.op and io.attempt > 1 else ''}"
        fault = self._fault_for(io, m)
        if node.journal is None:
            self.note(f"{tag} => node down")
            raise NoReply(f"{node.name} is down")
        if fault == "fail":
            self.stats["fail_before"] += 1
            self.note(f"{tag} => LOST before delivery")
            raise NoReply(f"injected: {op} to {node.name} lost")
        if fault == "late":
            self.stats["late"] += 1
            self.note(f"{tag} => DELAYED in the network; no reply")
            io.queue_ghost(op, request, f"{m.summary} (late)")
            raise NoReply(f"injected: {op} to {node.name} delayed")
        try:
            result = self._execute(io, node, op, request, tag)
        except OutOfOrderError as e:
            # Every attempt carries a fresh serial, and only the copies the network repeats
            # (whose replies no one reads) can be out of order: a refusal the client reads means
            # it sent a serial twice, and counts a node that did the call as failed.
            self.checker.fail(f"client: w{io.writer}'s {what} reached {node.name} with a used serial: {e}")
            raise
        if fault == "dup":
            self.stats["duplicated"] += 1
            io.queue_ghost(op, request, f"{m.summary} (duplicate)")
        if fault == "lost":
            self.stats["reply_lost"] += 1
            self.note(f"{tag} => done, REPLY LOST ({self._reply_summary(op, result)})")
            raise NoReply(f"injected: reply to {op} from {node.name} lost")
        self.note(f"{tag} => ok {self._reply_summary(op, result)}".rstrip())
        return result

    def _deliver_ghost(self, io: SimNodeIO, node: Node, m: Msg) -> None:
        tag = f"{node.name} <- w{io.writer} {m.summary}"
        if node.journal is None or (io.writer, io.node) in self._cut:
            self.note(f"{tag} => lost")
            return
        try:
            result = self._execute(io, node, m.op, m.request, tag)
        except QJMError:
            return  # noted; no one reads the reply
        self.note(f"{tag} => done, no one reads the reply ({self._reply_summary(m.op, result)})")

    def _reply_summary(self, op: str, reply: Any) -> str:
        if not self.keep_trace:
            return ""
        if op == "new_epoch":
            return short(convert.new_epoch_from_pb(reply))
        if op == "prepare_recovery":
            return short(convert.prepare_from_pb(reply))
        if op == "get_journal_state":
            return short(convert.state_from_pb(reply))
        if op == "is_formatted":
            return str(reply.formatted)
        return ""

    def _execute(self, io: SimNodeIO, node: Node, op: str, request: Any, tag: str) -> Any:
        """The node runs ``request`` through its servicer; the checker looks at what it accepted."""
        promised = node.storage.read_long(PROMISED) or 0
        files = node.storage.file_names() if op == "purge_logs" else []
        srv = self._servicers[node.index]
        try:
            reply = srv.call(op, request)
        except NodeCrash as c:
            self.stats["crash_inside"] += 1
            self._crash_node(node, f"inside {op} at {c}")
            self.note(f"{tag} => node died")
            raise NoReply(f"{node.name} died during {op}") from None
        except QJMError as e:
            bad = srv.take_unexpected()
            if bad is not None:
                tb = "".join(traceback.format_exception(bad)).rstrip()
                self.note(f"{tag} => unexpected {type(bad).__name__}: {bad}\n{tb}")
                self.checker.fail(f"{node.name} failed unexpectedly in {op}: {type(bad).__name__}: {bad}")
            self.note(f"{tag} => {type(e).__name__}: {e}")
            if isinstance(e, InvariantViolation):
                # A node's own alarm is a violation even when no writer waits for the reply any
                # more (a delayed call of a writer that moved on): a real one, or a false alarm
                # that must be fixed in the node.
                self.stats["node_alarms"] += 1
                self.node_alarms.append(f"{node.name} {tag}: {e}")
                self.checker.fail(f"node-side alarm: {node.name} replied to {tag}: {e}")
            raise
        if op == "purge_logs":
            self.checker.on_purge(node, files)
        if op == "new_epoch":
            self.checker.on_new_epoch(node, request.epoch, promised)
        elif op not in _UNFENCED_OPS:
            self.checker.on_request(node, op, request.req.epoch, promised)
        return reply

    def _deliver_data(self, io: SimNodeIO, node: Node, m: Msg) -> None:
        link = m.link
        assert link is not None
        group = [m]
        while (
            io.queue
            and io.queue[0].link is link
            and len(group) < 4
            and self.chooser.chance(self.rates.group_commit, "group_commit")
        ):
            group.append(io.queue.popleft())
        if len(group) > 1:
            self.stats["group_commits"] += 1
        tag = f"{node.name} <- w{io.writer} " + " + ".join(g.summary for g in group)
        if link.failed is not None:
            self.note(f"{tag} => its link is gone")
            return
        fault = self._fault_for(io, m)
        j = node.journal
        if j is None or fault == "fail":
            if j is not None:
                self.stats["fail_before"] += 1
            self.note(f"{tag} => {'node down' if j is None else 'LOST before delivery'}; link breaks")
            link.fail(NodeUnavailableError(f"{node.name}: data link lost"))
            return
        run = group
        if fault == "gap" and len(group) == 1 and io.queue and io.queue[0].link is link:
            group.append(io.queue.popleft())  # the run the lost frame was part of
            tag = f"{node.name} <- w{io.writer} " + " + ".join(g.summary for g in group)
        if fault == "gap" and len(group) > 1:
            self.stats["gaps"] += 1
            run = group[1:]
            self.note(f"{tag} => the run loses {m.summary} on the way (a txid gap)")
        promised = node.storage.read_long(PROMISED) or 0
        writer_epoch = node.storage.read_long(WRITER) or 0
        seg_name = f"edits_inprogress_{m.segment:019d}"
        size_before = len(node.storage.read_file(seg_name)) if seg_name in node.storage.file_names() else 0
        error: QJMError | None = None
        acks: list[int] = []
        commits = [g.commit for g in run if g.commit is not None]
        durable = 0
        try:
            # The node's own data handler: frames, their ack, then the newest commit notice.
            durable = apply_run(j, [g.frame for g in run], commits, acks.append)
        except NodeCrash as c:
            self.stats["crash_inside"] += 1
            self._crash_node(node, f"inside journal at {c}")
            self.note(f"{tag} => node died")
            link.fail(NodeUnavailableError(f"{node.name} died"))
            return
        except InvariantViolation as e:
            self.stats["node_alarms"] += 1
            self.node_alarms.append(f"{node.name} {tag}: {e}")
            self.checker.fail(f"node-side alarm: {node.name} raised InvariantViolation in journal: {e}")
        except QJMError as e:
            # data.py: what the run acked, else the journal's durable txid, else the link's last ack
            durable = acks[-1] if acks else int(getattr(e, "durable_txid", link.acked_txid()))
            error = e  # after acks it already sent (a refused commit notice), the node closes the link
        except Exception as e:
            self.note(f"{tag} => unexpected {type(e).__name__}: {e}\n{traceback.format_exc().rstrip()}")
            self.checker.fail(f"{node.name} failed unexpectedly in journal: {type(e).__name__}: {e}")
        ok = [g for g in run if error is None or g.last <= durable]
        if error is not None and ok and not acks:
            self.note(f"{tag} => {type(error).__name__} reporting durable through {durable}: acks {len(ok)} frame(s)")
        self.checker.on_frames(node, ok, promised, writer_epoch, size_before)
        if fault == "lost":
            self.stats["reply_lost"] += 1
            self.note(f"{tag} => durable through {durable}, REPLY LOST; link breaks")
            link.fail(NodeUnavailableError(f"{node.name}: ack lost"))
            return
        reply = b"".join(wire.encode_ack(a) for a in acks)
        if error is not None:
            self.note(f"{tag} => durable through {durable}, then {type(error).__name__}: {error}; link breaks")
            reply += wire.encode_error(errors.to_code(error), str(error), durable)
        else:
            self.note(f"{tag} => durable through {durable}")
        link.replies(reply)

    # -- nodes -------------------------------------------------------------------------------

    def _crash_node(self, node: Node, why: str) -> None:
        before = {n: len(node.storage.read_file(n)) - node.storage.durable_size(n) for n in node.storage.file_names()}
        node.storage.crash(self._torn)
        node.journal = None
        self.stats["node_crashes"] += 1
        lost = sum(before.values())
        self.note(f"{node.name} CRASHES ({why}); {lost} un-synced byte(s) at risk")
        self.checker.check_node(node)

    def _lose_disk(self, node: Node) -> None:
        """The node goes down and comes back, when it restarts, on an empty disk: everything it
        held is gone, and only ``qjm rejoin`` (a writer's ``rejoin_node``) formats it again."""
        self.checker.on_disk_lost(node)
        node.storage = MemoryStorage(JOURNAL_ID)
        node.journal = None
        self._disk_lost = node.index
        self.stats["disk_losses"] += 1
        self.note(f"{node.name} LOSES ITS DISK: it comes back empty")

    def _rejoin_lost_disk(self, task: Task) -> None:
        """What an operator does after replacing the disk: ``qjm rejoin`` from the writer's host,
        while the node is up and still empty. Refused (too few peers answer, a race) is fine."""
        if self._disk_lost is None:
            return
        node = self.nodes[self._disk_lost]
        if node.journal is None or node.storage.read_namespace() is not None:
            return
        task.phase = "rejoin"
        try:
            plan = task.qjm.rejoin_node(node.name)
        except QJMError as e:
            self.note(f"w{task.wid}: rejoin {node.name} refused: {type(e).__name__}: {e}")
            return
        self.stats["rejoins"] += 1
        self.note(f"w{task.wid}: {node.name} rejoined with promised epoch {plan.promised_epoch}")

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

    def _restart_node(self, node: Node) -> None:
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

    def _spawn(self, plan: WriterPlan, *, final: bool = False) -> Task:
        wid = len(self.tasks) + 1
        task = Task(self, wid, plan, final)
        if not final and self.chooser.chance(self.rates.slow_node, "slow_node"):
            n = self.chooser.choice(len(self.nodes), "which_node")
            self._slow[(wid, n)] = 0.1
            self.note(f"n{n} is slow to answer w{wid}")
        if not final and self.chooser.chance(self.rates.death_point, "death_point"):
            task.death_at = 1 + self.chooser.choice(8 if self.profile == "recovery" else 12, "death_at")
        if not final and self._roles:
            role = task.role = self._roles.pop(0)
            for n in sorted(role.cut):
                self._cut.add((wid, n))
                self.note(f"PARTITION: w{wid} cannot reach n{n}")
            if role.death_op:
                self.note(f"w{wid} will die on {role.death_op} #{role.death_nth}, its calls then reaching "
                          f"{', '.join(f'n{n}' for n in sorted(role.reach or ())) or 'no node'}")  # fmt: skip
            if role.miss_accept:
                missed = ", ".join(f"n{n}" for n in sorted(role.miss_accept))
                self.note(f"w{wid}'s accept_recovery will not reach {missed}")
        self.tasks.append(task)
        self.stats["writers"] += 1
        self.note(f"w{wid} starts{' (final recovery, no faults)' if final else ''}: plan {' '.join(plan.ops) or '-'}")
        return task

    def writer_body(self, task: Task) -> None:
        """What a writer does (in its own greenlet, holding the baton): recover, then its plan."""
        q = task.qjm
        if task.plan.format:
            task.phase = "format"
            q.format()
        self._rejoin_lost_disk(task)
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
                if self._roll_due(task):
                    task.phase = "auto roll"
                    self.stats["auto_rolls"] += 1
                    self._roll(task)
            elif op == "sync":
                self._sync(task)
                self._purge(task)
            elif op in ("roll", "fin") and self._roll(task, last=op == "fin"):
                return  # finalized for good
        task.phase = "sync"
        self._sync(task)

    def _roll_due(self, task: Task) -> bool:
        """The writer's own roll (design §2.12): by size (txids here) or by age in simulated time."""
        w = self.workload
        held = task.next_txid - task.segment
        return held > 0 and (
            (w.roll_txns > 0 and held >= w.roll_txns) or (w.roll_age > 0 and self._time - task.segment_at >= w.roll_age)
        )

    def _roll(self, task: Task, *, last: bool = False) -> bool:
        """Finalize the segment after its last batch commits, then (unless ``last``) start the next
        and purge. True if the segment was finalized with ``last``: the writer is done."""
        q = task.qjm
        self._sync(task)
        if task.next_txid <= task.segment:
            return False
        q.finalize_log_segment(task.segment, task.next_txid - 1)
        self.note(f"w{task.wid} finalized {task.segment}-{task.next_txid - 1}")
        if last:
            return True
        task.phase = "start"
        q.start_log_segment(task.next_txid)
        task.segment = task.next_txid
        self._purge(task)
        return False

    def _purge(self, task: Task) -> None:
        """Purge all the limits let go: the writer's bound, clamped by ``purge_limit`` only."""
        w = self.workload
        q = task.qjm
        if not w.purge:
            return
        bugs = self.bugs if self.bugs is not None and self.bugs.client_side else None
        bound = purge_limit(
            newest_segment=task.segment,
            committed=q.committed_txid,
            min_retained_txids=w.min_retained_txids,
            bugs=bugs,
        )
        if bound > max(task.purged_below, 1):
            task.purged_below = bound
            self.stats["purges"] += 1
            q.purge_logs_older_than(bound)

    def _send(self, task: Task, n: int) -> None:
        first = task.next_txid
        records = [
            b"w%d-e%d-t%d-%s" % (task.wid, task.qjm.epoch, t, b"%04x" % self.chooser.randint(0, 0xFFFF, "payload"))
            for t in range(first, first + n)
        ]
        frame = framing.encode_frame(records, epoch=task.qjm.epoch, segment_txid=task.segment, first_txid=first)
        call = task.qjm.send_batch(frame, first, first + n - 1)
        task.inflight.append(Batch(first, first + n - 1, records, call))
        if task.next_txid == task.segment:
            task.segment_at = self._time
        task.next_txid += n

    def _reap(self, task: Task) -> None:
        b = task.inflight[0]
        b.call.wait_for_write_quorum(self.config.timeouts.write_txns, f"journal({b.first}-{b.last})")
        task.inflight.popleft()
        self.note(f"w{task.wid} ACKED txids {b.first}-{b.last}")
        self.stats["acked_txids"] += b.last - b.first + 1
        self.checker.on_acked(task.wid, b.first, b.records)
        if b.last > task.qjm.committed_txid:
            task.qjm.set_committed_txid(b.last)

    def _sync(self, task: Task) -> None:
        while task.inflight:
            self._reap(task)

    # -- the scheduler -----------------------------------------------------------------------

    def _live(self) -> list[Task]:
        return [t for t in self.tasks if t.state != "done"]

    def _channels(self) -> list[SimNodeIO]:
        """Channels with calls in flight, in the default schedule's order (slow ones last)."""
        chans = [io for t in self.tasks for io in t.ios if io.queue]
        sign = -1 if self.workload.newest_first else 1
        chans.sort(key=lambda io: ((io.writer, io.node) in self._slow, sign * io.writer, io.node))
        return chans

    def state_key(self) -> object:
        """Everything the rest of a run depends on (for pruning in the exhaustive search)."""
        nodes = []
        for n in self.nodes:
            st = n.storage
            files = tuple((name, st.read_file(name), st.durable_size(name)) for name in st.file_names())
            longs = tuple(st.read_long(k) for k in (PROMISED, WRITER, COMMITTED))
            durable = tuple(sorted(st.durable_longs().items()))
            paxos = tuple((p, st.read_paxos(p)) for p in st.list_paxos())
            jk = None if n.journal is None else n.journal.memory_key()
            nodes.append((files, longs, durable, paxos, jk))
        chans = tuple(t.channel_keys() for t in self.tasks)
        tasks = tuple(t.state_key() for t in self.tasks)
        return (
            tuple(nodes), chans, tasks, self.checker.state_key(), len(self._plans), tuple(sorted(self._cut)),
            self.epoch_hints.snapshot(),
        )  # fmt: skip

    def run(self) -> SimResult:
        """Run to the end: the workload under faults, then a final fault-free recovery and checks.

        The loggers' operational log (every lost link and failed start, thousands per search) is
        held back to errors while the run lasts: the trace records each of those events."""
        channel_log = logging.getLogger("qjm.channel")
        level = channel_log.level
        channel_log.setLevel(logging.ERROR)
        try:
            return self._run()
        finally:
            channel_log.setLevel(level)

    def _run(self) -> SimResult:
        violation: SimViolation | None = None
        overrun: DeadlineExceeded | None = None
        pruned = False
        try:
            with execution_deadline(self.deadline):
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
        except DeadlineExceeded as d:
            overrun = d
        finally:
            self._shutdown()
        self.stats["steps"] = self.step
        if overrun is not None:
            return SimResult(
                self.seed, False,
                f"{HARNESS_FAILURE}: {overrun} at step {self.step} (a writer blocked outside the simulation's "
                "conditions, or a loop that never yields)",
                [*self.trace, STACK_HEADING, *overrun.stack],
                dict(self.stats), pruned, list(self.node_alarms), harness_failure=True,
            )  # fmt: skip
        return SimResult(
            self.seed,
            violation is None,
            None if violation is None else violation.message,
            self.trace if violation is None else violation.trace,
            dict(self.stats),
            pruned,
            list(self.node_alarms),
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
        elif self.profile == "shapes":
            self._roles = self._shape_roles()
            self._plans = [r.plan for r in self._roles]
            if self.chooser.choice(2, "writers"):
                self._plans.append(self._draw_plan(False))
        else:
            count = (3 if self.profile == "recovery" else 2) + self.chooser.choice(3, "writers")
            self._plans = [self._draw_plan(i == 0) for i in range(count)]
        if w.interleaved is not None:
            self._interleaved = w.interleaved
        else:  # a shapes scenario is a chain: each writer takes over from the one before
            self._interleaved = self.profile != "shapes" and self.chooser.choice(2, "mode") == 1
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
        if self.step % SYNC_EVERY == 0:
            self._sync_round()
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
        if self.rates.disk_loss > 0 and self._disk_lost is None and c.chance(self.rates.disk_loss, "disk_loss"):
            self._lose_disk(self.nodes[c.choice(len(self.nodes), "which_disk")])
            return
        for t in self._live():
            if t.state == "waiting" and c.chance(self.rates.writer_kill, "writer_kill"):
                self.stats["writer_kills"] += 1
                self._kill(t, "killed by the scheduler")
                return
        actions: list[Callable[[], None]] = []
        weights: list[float] = []
        for io in self._channels():
            actions.append(lambda io=io: self.deliver(io))  # type: ignore[misc]
            weights.append(self._slow.get((io.writer, io.node), 1.0))
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
        self._torn = ChooserRandom(self.chooser)
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
        self._final_catch_up()

    def _final_catch_up(self) -> None:
        """Every node runs catch-up rounds against each peer, twice (a round acts on the manifest
        the previous one saw); then every node must hold every finalized segment any node holds,
        but for a segment it still has open (a writer that died after starting it there, whose
        successor's promise did not reach the node: only a new epoch closes it)."""
        for _ in range(2 * (len(self.nodes) - 1)):
            for k in range(len(self.nodes)):
                self._sync_node(k)
        formatted = [n for n in self.nodes if n.journal is not None and n.journal.is_formatted()]
        held = {n.index: {(x.start_txid, x.end_txid) for x in self._finalized_of(n)} for n in formatted}
        every = set().union(*held.values())
        for n in formatted:  # a node never formatted (its format call lost) holds nothing to compare
            st = n.journal.peek_state() if n.journal is not None else None
            is_open = st.open_segment_txid if st is not None else 0
            lacking = sorted(x for x in every - held[n.index] if x[0] != is_open)
            if lacking:
                self.checker.fail(f"catch-up: {n.name} lacks finalized segment(s) {lacking} its peers hold")

    @staticmethod
    def _finalized_of(node: Node) -> list[RemoteEditLog]:
        assert node.journal is not None
        return list(node.journal.get_edit_log_manifest(1, False).logs)

    def _shutdown(self) -> None:
        """Unwind every writer still parked (also after a violation)."""
        self._final = True
        for t in self.tasks:
            if t.state != "done":
                t.kill = True
                t.life.crash("simulation over")
                self._current = t
                t.resume()
                self._current = None


def run_seed(
    seed: int,
    *,
    steps: int = 400,
    bugs: ProtocolBugs | None = None,
    keep_trace: bool = False,
    check_durable_ack: bool = True,
    workload: Workload | None = None,
    rates: FaultRates | None = None,
    deadline: float | None = DEFAULT_DEADLINE,
) -> SimResult:
    """Run one seed. Without ``keep_trace`` a failing seed is run again to record its trace (but
    not one that ran past its ``deadline``: the stack it reports is the clue, and a second run
    would only spend the deadline again)."""
    res = Simulation(
        seed, steps=steps, bugs=bugs, keep_trace=keep_trace, check_durable_ack=check_durable_ack,
        workload=workload, rates=rates, deadline=deadline,
    ).run()  # fmt: skip
    if not res.ok and not keep_trace and not res.harness_failure:
        again = Simulation(
            seed, steps=steps, bugs=bugs, keep_trace=True, check_durable_ack=check_durable_ack,
            workload=workload, rates=rates, deadline=deadline,
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
