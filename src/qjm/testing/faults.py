"""Fault hooks for tests, injected as objects (never globals).

``FaultPlan`` is a client-side ``CallHooks``: fail the n-th call of an operation to a node before
it is sent, or hold a node's calls back until another node answered. ``ServerFaults`` is a node-side
``JournalHooks``: fail or kill the node around the paxos commit point or before an append.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass

from qjm.client.loggers import CallHooks
from qjm.errors import NodeUnavailableError, StorageError
from qjm.server.journal import JournalHooks

ANY = "*"


@dataclass(slots=True)
class _Rule:
    node: str
    op: str
    call: int | None  # 1-based n-th call of (node, op); None: every call


class FaultPlan(CallHooks):
    """Client fault plan. Counts every (node, op) so sweeps can learn how many calls a run makes."""

    def __init__(self) -> None:
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._follow: dict[str, str] = {}  # node → leader whose answer it waits for
        self._answered: dict[tuple[str, str], threading.Event] = {}
        self.calls: Counter[tuple[str, str]] = Counter()

    def fail_before(self, node: str, op: str = ANY, *, call: int | None = None) -> FaultPlan:
        """The matching call to ``node`` fails before anything is sent (the node never sees it)."""
        self._rules.append(_Rule(node, op, call))
        return self

    def answer_after(self, node: str, leader: str) -> FaultPlan:
        """Hold each call to ``node`` until ``leader`` has answered the same operation.

        Makes a quorum wait deterministic: the writer then hears from ``leader`` among the first
        majority, as when a scenario says "the recovery talks to all three".
        """
        self._follow[node] = leader
        return self

    def _answered_event(self, node: str, op: str) -> threading.Event:
        with self._lock:
            return self._answered.setdefault((node, op), threading.Event())

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def _match(self, node: str, op: str, n: int) -> bool:
        return any(r.node in (node, ANY) and r.op in (op, ANY) and (r.call is None or r.call == n) for r in self._rules)

    def before(self, node: str, op: str) -> None:
        leader = self._follow.get(node)
        if leader is not None and not self._answered_event(leader, op).wait(timeout=30):
            raise NodeUnavailableError(f"injected: {leader} never answered {op}, so {node} was held back")
        with self._lock:
            self.calls[(node, op)] += 1
            n = self.calls[(node, op)]
            hit = self._match(node, op, n)
        if hit:
            raise NodeUnavailableError(f"injected: {op} #{n} to {node} failed before sending")

    def after(self, node: str, op: str) -> None:
        self._answered_event(node, op).set()


class ServerFaults(JournalHooks):
    """Node-side faults. ``action`` is ``"fail"`` (the RPC fails with a storage error) or ``"exit"``
    (the node process dies on the spot, as with a power cut)."""

    POINTS = ("before_persist_paxos", "after_persist_paxos", "before_append")

    def __init__(self, spec: dict[str, str] | None = None) -> None:
        self.spec = dict(spec or {})
        for point, action in self.spec.items():
            if point not in self.POINTS or action not in ("fail", "exit"):
                raise ValueError(f"bad server fault {point}={action}; points {self.POINTS}, actions fail|exit")

    @classmethod
    def parse(cls, text: str) -> ServerFaults:
        """``before_persist_paxos=exit,before_append=fail``"""
        spec = dict(part.split("=", 1) for part in text.split(",") if part)
        return cls(spec)

    def _fire(self, point: str, what: str) -> None:
        action = self.spec.get(point)
        if action == "exit":
            os._exit(17)
        if action == "fail":
            raise StorageError(f"injected fault at {point} ({what})")

    def before_persist_paxos(self, journal_id: str, segment: int) -> None:
        self._fire("before_persist_paxos", f"{journal_id} segment {segment}")

    def after_persist_paxos(self, journal_id: str, segment: int) -> None:
        self._fire("after_persist_paxos", f"{journal_id} segment {segment}")

    def before_append(self, journal_id: str, first_txid: int) -> None:
        self._fire("before_append", f"{journal_id} txid {first_txid}")
