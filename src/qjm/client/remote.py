"""A journal's nodes over the network: one ``RemoteLogger`` each, and how a batch goes out to them.

``QuorumJournalManager`` asks ``open_loggers`` for its nodes and hands every batch to the set's
``send_batch``; it knows no transport class. On a native build with plain hooks every node's link
is quiet, and a batch is counted at its quorum by the waiting thread (``LinkBatch``); otherwise
each node answers with a future (``QuorumCall``). Either way every node is paced first. A writer
syncing one batch at a time asks ``sync_batch`` first: send, quorum and commit notice in one
native call when no node has anything to decide.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

from qjm.client.channel import RemoteLogger
from qjm.client.data_link import DataLink
from qjm.client.fanout_link import Engine, shared_engine
from qjm.client.link_batch import Delivery, LinkBatch
from qjm.client.loggers import CallHooks, Logger, LoggerSet, WriterLife
from qjm.client.quorum import BatchCall, QuorumCall
from qjm.config import JournalURI, QJMConfig
from qjm.errors import QJMError

__all__ = ["RemoteLoggerSet", "open_loggers"]

T = TypeVar("T")


class _Lane:
    """The engine ids of every node's link, claimed once for ``sync_batch``; good until ``revision``
    moves (a node's state changed) or the engine refuses an id (a link left it)."""

    __slots__ = ("ids", "links", "revision")

    def __init__(self, ids: list[int], links: list[DataLink], revision: int) -> None:
        self.ids = ids
        self.links = links
        self.revision = revision


class RemoteLoggerSet(LoggerSet):
    """``LoggerSet`` over ``RemoteLogger``s: batches paced per node, counted natively when all links are quiet.

    A writer syncing batch after batch claims its nodes' links once (``_Lane``) and then commits
    each batch with one native call and no Python per node: every node's state change ends the
    claim (``RemoteLogger.watch``), the engine checks each link's room and presence, and what the
    nodes' states would have learnt from each commit (its txid, its notice sent) is told them when
    the set next does anything else (``_settle``). Why: per node, a claim and a notice's
    bookkeeping cost a sync commit about 18 µs of Python around the native call
    (``bench/writer_split.py``, docs/performance.md). Called under the writer's lock, as the
    rest of the set.
    """

    def __init__(self, loggers: Sequence[RemoteLogger], engine: Callable[[], Engine] = shared_engine) -> None:
        super().__init__(loggers)
        self._engine = engine  # the process's engine (tests give their own)
        self._remote = list(loggers)
        self._quiet = all(lg.native_acks for lg in self._remote)
        self._revisions = itertools.count(1)
        self._revision = 0  # a fresh value from _revisions at every node's change
        self._lane: _Lane | None = None
        self._lane_committed = 0  # committed and noticed through the lane; told to the nodes: _settle
        self._settled = 0
        self._room = self._remote[0].config.queued_edits_limit_bytes
        for lg in self._remote:
            lg.watch(self._changed)

    def _changed(self) -> None:
        # Unique values, so that a change stored after a claim read the revision always differs
        # from what the claim read, however two nodes' threads interleave.
        self._revision = next(self._revisions)

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

    def sync_batch(
        self, frame: bytes, first_txid: int, last_txid: int, notice: bytes, timeout: float
    ) -> tuple[int, BatchCall | None] | None:
        """Send a batch, wait for its quorum and queue ``notice`` (the commit it makes) in one native
        call, when every node takes the batch with nothing to decide (``RemoteLogger.quiet_link``)
        and has room for it.

        Returns (the nodes that acknowledged it, None) at a quorum; (fewer, the batch's call) when
        the wait ended short of one (a failed link, a change of the writer's state, ``timeout``),
        to be waited on like any other batch's, which says why; None, having sent nothing, when a
        node has something to decide or no room: ``send_batch`` then sends it."""
        if not self._quiet:
            return None
        try:
            self._remote[0].life.check()
        except QJMError:
            return None  # deliver_batch says why, node by node
        lane = self._lane
        if lane is None or lane.revision != self._revision:
            lane = self._claim()
            if lane is None:
                return None
        fanout = self._engine().fanout
        try:
            acked = fanout.sync_batch(lane.ids, frame, last_txid, self.majority, notice, timeout, self._room)
        except ValueError:
            self._lane = None
            return None  # a link left the engine since the claim: nothing was sent
        if acked < 0:
            return None  # a node has no room: the usual way waits for it (RemoteLogger.pace)
        if acked >= self.majority:
            self._lane_committed = last_txid
            return acked, None
        self._lane = None
        # The links claimed, not the nodes' current ones: a link that failed meanwhile says so.
        deliveries = {lg.name: Delivery(link) for lg, link in zip(self._remote, lane.links, strict=True)}
        return acked, LinkBatch(fanout, last_txid, deliveries)

    def _claim(self) -> _Lane | None:
        self._settle()
        revision = self._revision  # read before the nodes: a change after it ends this claim
        ids: list[int] = []
        links: list[DataLink] = []
        for lg in self._remote:
            quiet = lg.quiet_link()
            if quiet is None:
                self._lane = None
                return None
            ids.append(quiet[0])
            links.append(quiet[1])
        self._lane = _Lane(ids, links, revision)
        return self._lane

    def _settle(self) -> None:
        """Tell the nodes' states what the lane's commits changed: the committed txid, its notice sent."""
        txid = self._lane_committed
        if txid > self._settled:
            self._settled = txid
            for lg in self._remote:
                lg.commit_noticed(txid)

    def set_committed_txid(self, txid: int) -> None:
        if txid <= self._lane_committed:
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
