"""A journal's nodes over the network: one ``RemoteLogger`` each, and how a batch goes out to them.

``QuorumJournalManager`` asks ``open_loggers`` for its nodes and hands every batch to the set's
``send_batch``; it knows no transport class. On a native build with plain hooks every node's link
is quiet, and a batch is counted at its quorum by the waiting thread (``LinkBatch``); otherwise
each node answers with a future (``QuorumCall``). Either way every node is paced first. A writer
syncing one batch at a time asks ``sync_batch`` first: send, quorum and commit notice in one
native call when no node has anything to decide.
"""

from __future__ import annotations

from collections.abc import Sequence

from qjm.client.channel import RemoteLogger
from qjm.client.fanout_link import shared_engine
from qjm.client.link_batch import Delivery, LinkBatch
from qjm.client.loggers import CallHooks, LoggerSet, WriterLife
from qjm.client.quorum import BatchCall
from qjm.config import JournalURI, QJMConfig
from qjm.errors import QJMError

__all__ = ["RemoteLoggerSet", "open_loggers"]


class RemoteLoggerSet(LoggerSet):
    """``LoggerSet`` over ``RemoteLogger``s: batches paced per node, counted natively when all links are quiet."""

    def __init__(self, loggers: Sequence[RemoteLogger]) -> None:
        super().__init__(loggers)
        self._remote = list(loggers)
        self._quiet = all(lg.native_acks for lg in self._remote)

    def send_batch(self, frame: bytes, first_txid: int, last_txid: int) -> BatchCall:
        for lg in self._remote:  # before any node gets it: holding one back must not delay the others
            lg.pace(len(frame))
        if self._quiet:
            return LinkBatch(
                shared_engine().fanout,
                last_txid,
                {lg.name: lg.deliver_batch(frame, first_txid, last_txid) for lg in self._remote},
            )
        return super().send_batch(frame, first_txid, last_txid)

    def sync_batch(
        self, frame: bytes, first_txid: int, last_txid: int, notice: bytes, timeout: float
    ) -> tuple[int, BatchCall | None] | None:
        """Send a batch, wait for its quorum and queue ``notice`` (the commit it makes) in one native
        call, when every node takes the batch with nothing to decide (``claim_quiet_send``).

        Returns (the nodes that acknowledged it, None) at a quorum; (fewer, the batch's call) when
        the wait ended short of one (a failed link, a change of the writer's state, ``timeout``),
        to be waited on like any other batch's, which says why; None, having sent nothing, when a
        node has something to decide: ``send_batch`` then sends it."""
        if not self._quiet:
            return None
        try:
            self._remote[0].life.check()
        except QJMError:
            return None  # deliver_batch says why, node by node
        claims = []
        for lg in self._remote:
            claim = lg.claim_quiet_send(last_txid, len(frame))
            if claim is None:
                return None
            claims.append(claim)
        fanout = shared_engine().fanout
        try:
            acked = fanout.sync_batch([i for i, _ in claims], frame, last_txid, self.majority, notice, timeout)
        except ValueError:
            return None  # a link left the engine since its claim: nothing was sent
        if acked >= self.majority:
            for lg in self._remote:
                lg.notice_sent(last_txid)
            return acked, None
        # The links claimed, not the nodes' current ones: a link that failed meanwhile says so.
        deliveries = {lg.name: Delivery(link) for lg, (_, link) in zip(self._remote, claims, strict=True)}
        return acked, LinkBatch(fanout, last_txid, deliveries)

    def announce_committed(self) -> None:
        for lg in self._remote:
            lg.announce_committed()


def open_loggers(uri: JournalURI, config: QJMConfig, hooks: CallHooks | None, life: WriterLife) -> LoggerSet:
    """One ``RemoteLogger`` per node of ``uri``, sharing the writer's ``life``."""
    return RemoteLoggerSet([RemoteLogger(a, uri.journal_id, config=config, hooks=hooks, life=life) for a in uri.nodes])
