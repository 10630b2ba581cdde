"""Every nondeterministic decision of a simulated run, and what shapes them.

``Chooser`` (one seeded ``random.Random`` in ``RandomChooser``, every alternative in the exhaustive
search), the fault probabilities (``FaultRates``) and the writers of a run (``WriterPlan``,
``Workload``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "NO_FAULTS",
    "RANDOM_WORKLOAD",
    "Chooser",
    "ChooserRandom",
    "FaultRates",
    "RandomChooser",
    "Workload",
    "WriterPlan",
]


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


class ChooserRandom(random.Random):
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
    ping_fail: float = 0.5  # a call got no reply: its node does not answer the client's ping either (no retry)
    duplicate: float = 0.01  # the network delivers a control request once more, later
    late: float = 0.01  # a control request is held up: the client retries, the first copy arrives later
    gap: float = 0.05  # a run of batches loses its first frame on the way (the node sees a txid gap)
    reorder: float = 0.1  # the next data and control messages of a channel arrive swapped
    disk_loss: float = 0.0  # per step, once a run: a node loses its disk (empty storage, down)

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
            ping_fail=self.ping_fail,
            duplicate=self.duplicate * k,
            late=self.late * k,
            gap=self.gap * k,
            reorder=self.reorder * k,
            disk_loss=self.disk_loss * k,
        )


NO_FAULTS = FaultRates(0, 0, 0, 1.0, 0, 0, 0, 0, 0.3, 0, 0, 0, 0, 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class WriterPlan:
    """What one writer does after recovery: ``b<n>`` a batch of n txids, ``sync``, ``roll``, ``fin``."""

    ops: tuple[str, ...]
    pipeline: int = 1  # batches in flight before the writer waits for the oldest
    format: bool = False  # format the journal first (through the protocol, so faults apply)


@dataclass(frozen=True, slots=True)
class WriterRole:
    """A writer's part in a recovery scenario of the ``shapes`` profile: its plan, where it dies
    and whom its calls reach. Everything a role leaves open (delivery order, other faults) stays
    random."""

    plan: WriterPlan
    death_op: str = ""  # it dies on entering its death_nth-th wait on a call of this kind ("": no)
    death_nth: int = 1
    reach: frozenset[int] | None = None  # at its death its queued calls still reach exactly these nodes
    cut: frozenset[int] = frozenset()  # nodes it cannot reach at all: every call to them is lost
    miss_accept: frozenset[int] = frozenset()  # nodes its accept_recovery never reaches


@dataclass(frozen=True, slots=True)
class Workload:
    """The writers of a run. ``plans=None`` draws them from the chooser (random mode)."""

    plans: tuple[WriterPlan, ...] | None = None
    interleaved: bool | None = None  # None: drawn per seed
    nodes: int = 3
    format_in_setup: bool = True  # format every node before the run, outside fault injection
    slow: tuple[tuple[int, int], ...] = ()  # (writer, node) channels that lag (delivered last by default)
    newest_first: bool = False  # the default schedule serves the newest writer's channels first
    # The log's lifecycle (design §2.12): a writer rolls once its segment holds roll_txns txids or
    # its first txid is roll_age simulated seconds old (0: never on its own), and with purge it
    # purges after every roll and every sync, asking for everything the limits let go (the floor
    # keeps the newest min_retained_txids committed txids).
    roll_txns: int = 0
    roll_age: float = 0.0
    purge: bool = False
    min_retained_txids: int = 0


RANDOM_WORKLOAD = Workload(roll_txns=5, roll_age=0.06, purge=True, min_retained_txids=3)
"""The random search's writers: drawn plans, and rolls and purges of their own."""
