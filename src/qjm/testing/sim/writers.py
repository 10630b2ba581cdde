"""Simulated writers: each a greenlet (``Task``) that runs only while it holds the scheduler's baton,
with its batches in flight (``Batch``); ``Killed`` unwinds one the scheduler declared dead.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import greenlet

from qjm.client.quorum import BatchCall
from qjm.testing.sim.choice import WriterPlan, WriterRole
from qjm.testing.sim.transport import SimCondition, SimLife, SimManager, logger_key, sim_logger

if TYPE_CHECKING:
    from qjm.testing.sim.simulation import Simulation

__all__ = [
    "Batch",
    "Killed",
    "Task",
]


class Killed(BaseException):
    """Unwinds a writer the scheduler declared dead (not an Exception: nothing catches it)."""


@dataclass
class Batch:
    """A batch a writer sent and has not yet seen acknowledged by a quorum."""

    first: int
    last: int
    records: list[bytes]
    call: BatchCall


class Task:
    """A writer that only runs while it holds the baton.

    A greenlet in the scheduler's thread: the scheduler and its writers take turns and never run
    at once, so handing the baton over is a switch of stacks (about a microsecond), not two OS
    wake-ups that each wait for a CPU, which on a busy machine would be most of a search's time.
    """

    def __init__(self, sim: Simulation, wid: int, plan: WriterPlan, final: bool = False) -> None:
        self.sim = sim
        self.wid = wid
        self.plan = plan
        self.final = final
        self.state = "new"  # new | running | waiting | done
        self.kill = False
        self.cond: SimCondition | None = None
        self.error: Exception | None = None
        self.outcome = ""
        self.waits = 0
        self.death_at = 0  # dies on entering its death_at-th wait (0: no planned death)
        self.role: WriterRole | None = None  # its part in a shapes-profile scenario
        self.op_waits: dict[str, int] = {}  # waits so far per kind of call
        self.recovered: int | None = None
        # program position, for the exhaustive search's state key
        self.pc = 0
        self.phase = "spawn"
        self.segment = 0
        self.next_txid = 0
        self.segment_at = 0.0  # simulated time of the segment's first batch (its age for rolls)
        self.purged_below = 0  # the highest purge bound this writer sent
        self.inflight: deque[Batch] = deque()
        self.life = SimLife()
        pairs = [sim_logger(sim, wid, i, self.life) for i in range(len(sim.nodes))]
        self.loggers = [lg for lg, _ in pairs]
        self.ios = [io for _, io in pairs]
        self.qjm = SimManager(sim, wid, self.loggers, self.ios, sim.bugs)
        self._scheduler = greenlet.getcurrent()  # made by the scheduler, in its greenlet
        self._glet = greenlet.greenlet(self._main, parent=self._scheduler)

    def resume(self) -> None:
        """In the scheduler: run this writer until it waits again or ends."""
        self._glet.switch()

    def park(self) -> None:
        """In this writer: hand the baton back until the scheduler resumes it."""
        self._scheduler.switch()

    @property
    def is_current(self) -> bool:
        return greenlet.getcurrent() is self._glet

    def _main(self) -> None:
        try:
            if self.kill:
                raise Killed
            self.state = "running"
            self.sim.writer_body(self)
            self.outcome = "done"
        except Killed:
            self.outcome = "killed"
        except Exception as e:  # the others (a deadline, Ctrl-C) go on to the scheduler
            self.error = e
        finally:
            self.state = "done"  # and the greenlet's end hands the baton back

    @property
    def runnable(self) -> bool:
        if self.state == "new":
            return True
        return self.state == "waiting" and self.cond is not None and self.cond.notified and self.cond.owner.can_return()

    def channel_keys(self) -> tuple[object, ...]:
        return tuple(logger_key(lg, io) for lg, io in zip(self.loggers, self.ios, strict=True))

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
            self.purged_below,
            tuple((b.first, b.last) for b in self.inflight),
            q.epoch,
            q.active,
            q.committed_txid,
            self.life.crashed,
            call,
            self.cond.notified if self.cond is not None else None,
            self.waits if self.death_at else 0,
            self.death_at,
            self.role,
            tuple(sorted(self.op_waits.items())) if self.role is not None else (),
        )
