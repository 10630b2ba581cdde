"""A journal's nodes over the network: one ``RemoteLogger`` each, and how a batch goes out to them.

``QuorumJournalManager`` asks ``open_loggers`` for its nodes and hands every batch to the set's
``send_batch``; it knows no transport class. On a native build with plain hooks every node's link
is quiet, and a batch is counted at its quorum by the waiting thread (``LinkBatch``); otherwise
each node answers with a future (``QuorumCall``). Either way every node is paced first. A writer
syncing one batch at a time takes a lane (``sync_lane``): send, quorum and commit notice in one
native call while no node has anything to decide.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

from qjm._native import fanout
from qjm.client.channel import RemoteLogger
from qjm.client.data_link import DataLink
from qjm.client.fanout_link import Engine, shared_engine
from qjm.client.link_batch import Delivery, LinkBatch
from qjm.client.loggers import CallHooks, Logger, LoggerSet, SyncLane, WriterLife
from qjm.client.quorum import BatchCall, QuorumCall
from qjm.config import JournalURI, QJMConfig

__all__ = ["RemoteLoggerSet", "open_loggers"]

T = TypeVar("T")


class RemoteLoggerSet(LoggerSet):
    """``LoggerSet`` over ``RemoteLogger``s: batches paced per node, counted natively when all links are quiet.

    A writer syncing batch after batch takes a lane (``sync_lane``: its nodes' links claimed once,
    ``qjm._native.fanout.Lane``) and commits each batch with one native call and no Python per
    node, nor in this set: every node's state change, and the writer's crash, revoke the lane
    (``RemoteLogger.watch``, ``WriterLife.watch``), the engine checks each link's room and
    presence, and what the nodes' states would have learnt from each commit (its txid, its notice
    sent) is told them when the set next does anything else (``_settle``). Why: per node, a claim
    and a notice's bookkeeping, and the set's own checks, cost a sync commit microseconds of
    Python around the native call on caches the wait has cooled (``bench/writer_split.py``,
    docs/performance.md). Called under the writer's lock, as the rest of the set.
    """

    def __init__(self, loggers: Sequence[RemoteLogger], engine: Callable[[], Engine] = shared_engine) -> None:
        super().__init__(loggers)
        self._engine = engine  # the process's engine (tests give their own)
        self._remote = list(loggers)
        self._life = self._remote[0].life
        self._quiet = all(lg.native_acks for lg in self._remote)
        self._revisions = itertools.count(1)
        self._revision = 0  # a fresh value from _revisions at every node's change
        self._lane: fanout.Lane | None = None
        self._lane_links: list[DataLink] = []  # the links the lane claimed, node by node
        self._settled = 0  # the highest lane commit told to the nodes' states
        self._room = self._remote[0].config.queued_edits_limit_bytes
        for lg in self._remote:
            lg.watch(self._changed)
        self._life.watch(self._changed)

    def _changed(self) -> None:
        # Unique values, so that a change stored after a claim read the revision always differs
        # from what the claim read, however two nodes' threads interleave.
        self._revision = next(self._revisions)
        lane = self._lane
        if lane is not None:
            lane.revoke()

    def send_batch(self, frame: bytes, first_txid: int, last_txid: int) -> BatchCall:
        self._settle()
        for lg in self._remote:  # before any node gets it: holding one back must not delay the others
            lg.pace(len(frame))
        if self._quiet:
            return LinkBatch(
                self._engine().fanout,
                last_txid,
                {lg.name: lg.deliver_batch(frame, first_txid, last_txid) for lg in self._remote},
            )
        return super().send_batch(frame, first_txid, last_txid)

    def sync_lane(self) -> fanout.Lane | None:
        """Claim every node's link for one-call sync commits (``RemoteLogger.quiet_link``): None
        when a node has something to decide (out of sync, a segment's start pending, a link
        down) or the writer crashed; ``send_batch`` then says why, node by node."""
        if not self._quiet or self._life.crashed:
            return None
        self._settle()
        revision = self._revision  # read before the nodes: a change after it ends this lane
        ids: list[int] = []
        links: list[DataLink] = []
        for lg in self._remote:
            quiet = lg.quiet_link()
            if quiet is None:
                return None
            ids.append(quiet[0])
            links.append(quiet[1])
        try:
            lane: fanout.Lane = self._engine().fanout.lane(ids, self.majority, self._room)
        except ValueError:
            return None  # a link left the engine since: its node is out of sync
        self._lane, self._lane_links = lane, links
        if self._revision != revision:
            lane.revoke()  # a change between the read and the store above: _changed missed it
        return lane

    def lane_call(self, lane: SyncLane, last_txid: int) -> BatchCall:
        if lane is not self._lane:
            raise ValueError("not this set's current lane")
        # The links claimed, not the nodes' current ones: a link that failed meanwhile says so.
        deliveries = {lg.name: Delivery(link) for lg, link in zip(self._remote, self._lane_links, strict=True)}
        return LinkBatch(self._engine().fanout, last_txid, deliveries)

    def _settle(self) -> None:
        """Tell the nodes' states what the lane's commits changed: the committed txid, its notice sent."""
        lane = self._lane
        txid = lane.committed if lane is not None else 0
        if txid > self._settled:
            self._settled = txid
            for lg in self._remote:
                lg.commit_noticed(txid)

    def set_committed_txid(self, txid: int) -> None:
        lane = self._lane
        if lane is not None and txid <= lane.committed:
            return  # a commit of the lane's: the nodes' states learn it at _settle
        self._settle()
        super().set_committed_txid(txid)

    def call(self, fn: Callable[[Logger], Future[T]]) -> QuorumCall[T]:
        self._settle()  # a control call carries the committed txid
        return super().call(fn)

    def announce_committed(self) -> None:
        self._settle()
        for lg in self._remote:
            lg.announce_committed()


def open_loggers(uri: JournalURI, config: QJMConfig, hooks: CallHooks | None, life: WriterLife) -> LoggerSet:
    """One ``RemoteLogger`` per node of ``uri``, sharing the writer's ``life``."""
    return RemoteLoggerSet([RemoteLogger(a, uri.journal_id, config=config, hooks=hooks, life=life) for a in uri.nodes])
