"""The simulated nodes: a real ``Journal`` on ``MemoryStorage`` each, with server hooks where the
node may die in the middle of a call (``NodeCrash``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from qjm.protocol.messages import NamespaceInfo
from qjm.server.journal import Journal, JournalHooks
from qjm.testing.memstore import MemoryStorage

if TYPE_CHECKING:
    from qjm.testing.sim.simulation import Simulation

__all__ = [
    "JOURNAL_ID",
    "NS",
    "Node",
    "NodeCrash",
    "SimHooks",
]


JOURNAL_ID = "sim"
NS = NamespaceInfo(4242, "sim")


class NodeCrash(BaseException):
    """Raised from a server hook: the node dies in the middle of the call."""


class SimHooks(JournalHooks):
    """Server fault points: the node may die right there (at the paxos commit point, before an append)."""

    def __init__(self, sim: Simulation, node: int) -> None:
        self.sim = sim
        self.node = node

    def _maybe(self, point: str) -> None:
        if self.sim.chooser.chance(self.sim.rates.crash_inside, "crash_inside"):
            self.sim.note(f"{self.sim.node_name(self.node)} dies inside the call at {point}")
            raise NodeCrash(point)

    def before_persist_paxos(self, journal_id: str, segment: int) -> None:
        self._maybe("before_persist_paxos")

    def after_persist_paxos(self, journal_id: str, segment: int) -> None:
        self._maybe("after_persist_paxos")

    def before_append(self, journal_id: str, first_txid: int) -> None:
        self._maybe("before_append")


@dataclass(eq=False)
class Node:
    """One simulated node: its storage and its ``Journal`` (None while the node is down)."""

    index: int
    name: str
    storage: MemoryStorage
    journal: Journal | None
