"""Exhaustive fault search on the simulator: the double-failure sweep and a small-world model check.

* ``double_failure_sweep`` is Hadoop's ``TestQJMWithFaults.testRecoverAfterDoubleFailures``: run
  format + recovery + two short segments once without faults, counting the calls each node gets;
  then for every pair (i, j) fail the i-th call to one node and the j-th call to another (lost
  before delivery, or executed with the reply lost), and let a new writer recover: nothing that
  was acknowledged may be missing, and every invariant of design §2.7 must hold throughout.
* ``explore`` walks every execution of a small world (3 nodes, 2-3 writers with fixed plans, at
  most 2 segments and 3 txids, a bounded number of faults): every delivery order, every place a
  fault can strike. It is a stateless search (each execution is replayed from its choice prefix,
  as in VeriSoft/CHESS), depth first, with state caching: a state already reached with at least
  the remaining fault budget and delays is not explored again (with less of either, an execution
  from it can only make a subset of the choices the earlier one could). The state hash covers every
  node's storage and in-memory Journal state, every channel's queued calls and logger state, every
  writer's program position and pending quorum call, and what the checker remembers.
"""

from __future__ import annotations

import hashlib
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from qjm.testing.bugs import ProtocolBugs
from qjm.testing.sim import (
    DEFAULT_DEADLINE,
    NO_FAULTS,
    Chooser,
    FaultRates,
    SimResult,
    Simulation,
    Workload,
    WriterPlan,
)

__all__ = [
    "ExploreChooser",
    "ExploreResult",
    "SweepResult",
    "World",
    "double_failure_sweep",
    "explore",
    "small_worlds",
    "teeth_worlds",
]


# -- the double-failure sweep ------------------------------------------------------------------

SWEEP_WORKLOAD = Workload(
    plans=(WriterPlan(("b1", "b2", "roll", "b1", "b2"), pipeline=1, format=True),),
    interleaved=False,
    format_in_setup=False,
)
"""Format, recover, segment 1-3 (finalized), segment 4-6 (left open for the next writer to recover)."""


@dataclass
class SweepResult:
    runs: int
    calls_per_node: dict[int, int]
    violations: list[tuple[dict[tuple[int, int, int], str], SimResult]]
    acked_txids: int
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.violations


def double_failure_sweep(
    *,
    bugs: ProtocolBugs | None = None,
    kinds: Sequence[str] = ("fail", "lost"),
    workload: Workload = SWEEP_WORKLOAD,
    seed: int = 0,
    stop_on_violation: bool = False,
    check_durable_ack: bool = True,
    deadline: float | None = DEFAULT_DEADLINE,
) -> SweepResult:
    """Fail every pair of calls (i-th to one node, j-th to another) and check every recovery."""
    t0 = time.perf_counter()
    learn = Simulation(seed, rates=NO_FAULTS, workload=workload, bugs=bugs, keep_trace=False, deadline=deadline)
    res = learn.run()
    if not res.ok:
        return SweepResult(1, {}, [({}, res)], res.stats["acked_txids"], time.perf_counter() - t0)
    writer = learn.tasks[0]
    calls = {io.node: io.sent for io in writer.ios}
    nodes = sorted(calls)
    violations: list[tuple[dict[tuple[int, int, int], str], SimResult]] = []
    runs = 1
    acked = 0
    for ai, a in enumerate(nodes):
        for b in nodes[ai + 1 :]:
            for i in range(1, calls[a] + 1):
                for j in range(1, calls[b] + 1):
                    for ka in kinds:
                        for kb in kinds:
                            plan = {(1, a, i): ka, (1, b, j): kb}
                            sim = Simulation(
                                seed, rates=NO_FAULTS, workload=workload, bugs=bugs, planned=plan, keep_trace=False,
                                check_durable_ack=check_durable_ack, deadline=deadline,
                            )  # fmt: skip
                            r = sim.run()
                            runs += 1
                            acked += r.stats["acked_txids"]
                            if not r.ok:
                                again = r if r.harness_failure else Simulation(
                                    seed, rates=NO_FAULTS, workload=workload, bugs=bugs, planned=plan,
                                    check_durable_ack=check_durable_ack, deadline=deadline,
                                ).run()  # fmt: skip
                                violations.append((plan, again))
                                if stop_on_violation or r.harness_failure:
                                    return SweepResult(runs, calls, violations, acked, time.perf_counter() - t0)
    return SweepResult(runs, calls, violations, acked, time.perf_counter() - t0)


# -- the small-world search ----------------------------------------------------------------------


class ExploreChooser(Chooser):
    """Replays a prefix of choices, then takes the first option at every new choice point.

    Delay bounding (as in CHESS): option 0 of a scheduling choice is the default schedule (the
    first channel with something queued); taking any other option spends one of ``delays``.
    Faults are choice points only while ``budget`` lasts, and only for the enabled kinds. So the
    tree holds every execution with at most ``delays`` deviations and ``budget`` faults, and the
    search over it is complete. ``path`` records (choice, options). ``seen`` maps each state's
    hash to the (budget, delays) left at the visits that count: no one of them has at least the
    budget and the delays of another (that other would add no execution).
    """

    BRANCHING_INTS = ("torn_tail", "unsent")
    SCHEDULING = ("action", "which_node", "which_channel", "which_cut", "drain")

    def __init__(
        self,
        prefix: Sequence[int],
        seen: dict[bytes, list[tuple[int, int]]],
        budget: int,
        kinds: frozenset[str],
        delays: int = 1_000_000,
    ) -> None:
        self.prefix = list(prefix)
        self.seen = seen
        self.budget = budget
        self.delays = delays
        self.kinds = kinds
        self.path: list[tuple[int, int]] = []
        self.new_states = 0

    def choice(self, n: int, what: str) -> int:
        if n <= 1:
            return 0
        if what in self.SCHEDULING and self.delays <= 0:
            return 0
        i = len(self.path)
        c = min(self.prefix[i], n - 1) if i < len(self.prefix) else 0  # a replay may meet fewer options
        self.path.append((c, n))
        if c and what in self.SCHEDULING:
            self.delays -= 1
        return c

    def chance(self, p: float, what: str) -> bool:
        if p <= 0 or what not in self.kinds:
            return False
        if what in FAULT_KINDS:
            if self.budget <= 0:
                return False
            hit = self.choice(2, what) == 1
            if hit:
                self.budget -= 1
            return hit
        return self.choice(2, what) == 1

    def randint(self, a: int, b: int, what: str) -> int:
        if b <= a or what not in self.BRANCHING_INTS or what not in self.kinds:
            return a
        return a if self.choice(2, what) == 0 else b

    def at_state(self, key: Callable[[], object]) -> bool:
        if len(self.path) < len(self.prefix):
            return True  # replaying: these states were reached (and registered) by an earlier run
        h = hashlib.blake2b(pickle.dumps(key(), protocol=5), digest_size=16).digest()
        left = (self.budget, self.delays)
        visits = self.seen.get(h, [])
        if any(b >= left[0] and d >= left[1] for b, d in visits):
            return False  # every execution from here was open to that visit too
        self.seen[h] = [(b, d) for b, d in visits if b > left[0] or d > left[1]] + [left]
        self.new_states += 1
        return True


FAULT_KINDS = frozenset(
    {"fail_before", "reply_lost", "node_crash", "crash_inside", "writer_kill", "writer_crash_send", "fetch_fail"}
)
"""Choice points that spend the fault budget; ``node_restart`` is a free choice while a node is down."""


@dataclass(frozen=True)
class World:
    """A small world: who writes what, and which faults may strike (at most ``budget`` of them)."""

    name: str
    plans: tuple[WriterPlan, ...]
    budget: int
    kinds: frozenset[str]
    interleaved: bool = False
    delays: int = 2
    about: str = ""
    slow: tuple[tuple[int, int], ...] = ()  # (writer, node): that node answers that writer last by default
    newest_first: bool = False

    def rates(self) -> FaultRates:
        on = self.kinds
        return FaultRates(
            fail_before=1.0 if "fail_before" in on else 0.0,
            reply_lost=1.0 if "reply_lost" in on else 0.0,
            node_crash=1.0 if "node_crash" in on else 0.0,
            node_restart=1.0 if "node_restart" in on else 0.0,
            crash_inside=1.0 if "crash_inside" in on else 0.0,
            writer_kill=1.0 if "writer_kill" in on else 0.0,
            writer_crash_send=1.0 if "writer_crash_send" in on else 0.0,
            fetch_fail=1.0 if "fetch_fail" in on else 0.0,
            group_commit=0.0,
            partition=0.0,
            slow_node=0.0,
            death_point=0.0,
            ping_fail=1.0,  # a call that got no reply fails: the worlds' faults stay single faults
            duplicate=0.0,
            late=0.0,
            gap=0.0,
            reorder=0.0,
        )

    @property
    def txids(self) -> int:
        return sum(int(op[1:]) for p in self.plans for op in p.ops if op.startswith("b"))


def small_worlds() -> list[World]:
    """The worlds searched for the correct protocol: 3 nodes, 2-3 writers, <=2 segments, <=3 txids.

    Each search is complete within its bounds (``delays`` deviations from the default schedule,
    ``budget`` faults of the listed kinds). ``slow`` makes a node answer a writer last by default,
    as a lagging replica does, so that the design's scenarios need no delay to set up.
    """
    lost = frozenset({"fail_before", "reply_lost", "writer_kill", "unsent"})
    crash = frozenset({"node_crash", "node_restart", "writer_kill", "unsent", "torn_tail"})
    death = frozenset({"writer_kill", "unsent"})
    return [
        World("takeover", (WriterPlan(("b1", "roll", "b1")), WriterPlan(("b1",))), 1, lost, delays=2,
              about="2 writers one after another, 2 segments; lost calls, lost replies, a writer death"),
        World("race", (WriterPlan(("b1", "b1")), WriterPlan(("b1",))), 1, lost, interleaved=True, delays=2,
              about="2 writers interleaved; lost calls, lost replies, a writer death"),
        World("crash", (WriterPlan(("b1", "b1")), WriterPlan(("b1",)), WriterPlan(())), 1, crash, delays=1,
              about="3 writers; a node crash losing un-synced bytes (torn or not), restarts, a writer death"),
        World("2.10.6", (WriterPlan(("b1", "roll", "b1")), WriterPlan(("b1",)), WriterPlan(())), 1, death,
              delays=1, slow=((2, 0),),
              about="design §2.10.6 / HDFS-3845: a new segment's first txid on one node, the next writer misses it"),
        World("2.10.7", (WriterPlan(("b1", "b1")), WriterPlan(()), WriterPlan(())), 2, death, delays=0,
              slow=((2, 1), (3, 2)),
              about="design 2.10.7: a recovery accepted on two nodes dies after finalizing one"),
        World("same-length", (WriterPlan(("b1",)), WriterPlan(("b1",)), WriterPlan(())), 2,
              frozenset({"writer_kill", "unsent", "fetch_fail"}), delays=0, slow=((2, 0),),
              about="two writers' same-length copies of one segment; a node misses the accept, not the finalize"),
    ]  # fmt: skip


def teeth_worlds() -> list[World]:
    """The small worlds in which the exhaustive search must catch each ``ProtocolBugs`` switch."""
    return [w for w in small_worlds() if w.name in ("race", "2.10.6", "2.10.7", "same-length")]


@dataclass
class ExploreResult:
    world: str
    runs: int
    states: int
    pruned: int
    complete: bool
    seconds: float
    violations: list[tuple[list[int], SimResult]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def explore(
    world: World,
    *,
    bugs: ProtocolBugs | None = None,
    max_runs: int = 1_000_000,
    time_limit: float = 600.0,
    stop_on_violation: bool = True,
    check_durable_ack: bool = True,
    differential: bool = False,
    deadline: float | None = DEFAULT_DEADLINE,
) -> ExploreResult:
    """Depth-first over every execution of ``world``; stops at the first violation if asked.

    With ``differential`` (for ``bugs``), a violation counts only if the same choices replayed
    with the correct protocol pass: it is then the switch's doing, not another bug's.
    """
    t0 = time.perf_counter()
    seen: dict[bytes, list[tuple[int, int]]] = {}
    prefix: list[int] = []
    runs = pruned = states = 0
    violations: list[tuple[list[int], SimResult]] = []
    complete = False
    workload = Workload(
        plans=world.plans, interleaved=world.interleaved, slow=world.slow, newest_first=world.newest_first
    )
    kinds = (
        world.kinds | {"node_restart"} if "node_crash" in world.kinds or "crash_inside" in world.kinds else world.kinds
    )
    rates = world.rates()
    while runs < max_runs and time.perf_counter() - t0 < time_limit:
        ch = ExploreChooser(prefix, seen, world.budget, frozenset(kinds), world.delays)
        sim = Simulation(
            None, steps=100_000, bugs=bugs, chooser=ch, rates=rates, workload=workload, keep_trace=False,
            check_durable_ack=check_durable_ack, deadline=deadline,
        )  # fmt: skip
        res = sim.run()
        runs += 1
        pruned += res.pruned
        states += ch.new_states
        choices = [c for c, _ in ch.path]
        if res.harness_failure:  # a stuck execution: its stack is the report, and the search ends
            violations.append(([c for c, _ in ch.path], res))
            break
        if not res.ok and differential:
            base = ExploreChooser(choices, {}, world.budget, frozenset(kinds), world.delays)
            clean = Simulation(
                None, steps=100_000, chooser=base, rates=rates, workload=workload, keep_trace=False,
                check_durable_ack=check_durable_ack, deadline=deadline,
            ).run()  # fmt: skip
            if not clean.ok and _category(clean.violation) == _category(res.violation):
                res = clean  # the same invariant breaks without the switch: not its doing, keep searching
                res.ok = True
        if not res.ok:
            replay = ExploreChooser(choices, {}, world.budget, frozenset(kinds), world.delays)
            again = Simulation(
                None, steps=100_000, bugs=bugs, chooser=replay, rates=rates, workload=workload,
                check_durable_ack=check_durable_ack, deadline=deadline,
            ).run()  # fmt: skip
            violations.append((choices, again))
            if stop_on_violation:
                break
        nxt = _backtrack(ch.path)
        if nxt is None:
            complete = True
            break
        prefix = nxt
    return ExploreResult(world.name, runs, states, pruned, complete, time.perf_counter() - t0, violations)


def _category(violation: str | None) -> str:
    """ "invariant 4 (fencing)" of "invariant 4 (fencing): n1 acknowledged ..."."""
    return (violation or "").split(":", 1)[0]


def _backtrack(path: Sequence[tuple[int, int]]) -> list[int] | None:
    """The next prefix in depth-first order: bump the deepest choice that has options left."""
    for i in range(len(path) - 1, -1, -1):
        c, n = path[i]
        if c + 1 < n:
            return [p for p, _ in path[:i]] + [c + 1]
    return None
