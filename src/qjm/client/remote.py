"""A journal's nodes over the network: one ``RemoteLogger`` each, and how a batch goes out to them.

``QuorumJournalManager`` asks ``open_loggers`` for its nodes and hands every batch to the set's
``send_batch``; it knows no transport class. On a native build with plain hooks every node's link
is quiet, and a batch is counted at its quorum by the waiting thread (``LinkBatch``); otherwise
each node answers with a future (``QuorumCall``). Either way every node is paced first.
"""

from __future__ import annotations

from collections.abc import Sequence

from qjm.client.channel import RemoteLogger
from qjm.client.fanout_link import shared_engine
from qjm.client.link_batch import LinkBatch
from qjm.client.loggers import CallHooks, LoggerSet, WriterLife
from qjm.client.quorum import BatchCall
from qjm.config import JournalURI, QJMConfig

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

    def announce_committed(self) -> None:
        for lg in self._remote:
            lg.announce_committed()


def open_loggers(uri: JournalURI, config: QJMConfig, hooks: CallHooks | None, life: WriterLife) -> LoggerSet:
    """One ``RemoteLogger`` per node of ``uri``, sharing the writer's ``life``."""
    return RemoteLoggerSet([RemoteLogger(a, uri.journal_id, config=config, hooks=hooks, life=life) for a in uri.nodes])
