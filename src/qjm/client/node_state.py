"""One writer's view of one node, without I/O: what ``RemoteLogger`` decides before it sends.

``NodeState`` holds the per-node rules of Hadoop's IPCLoggerChannel (reference §3.2) and of design
§4: the epoch and the request serials; in sync, out of sync (until the next segment) or fenced;
the committed txid and the notice that carries it on the data plane; and the backlog of batches
sent while the node starts a segment, with its limit. It never blocks, sends or reads a clock;
the caller holds one lock around every call and does the sending the answers ask for. The real
channel and the simulator's run the same object, so the two cannot drift apart.

Serials. Each request, and each retry of one, takes a fresh serial (``request``): the node refuses
a serial at or below the last it accepted (``OutOfOrderError``), which is what keeps a delayed
duplicate of an old call from running after a newer one. A retry goes out only after the first
attempt failed without a reply; if the node had executed it (the reply was lost), the retry is a
second, newer call of the same operation, and every mutating control call is safe to run twice in
a row at a node: a start of the segment it just started (still empty) starts it again, a finalize
of the segment it just finalized finds it finalized, an accept of the proposal it just accepted
accepts it again, a purge purges nothing more. Hadoop stamps every RequestInfo with the next
serial the same way; its IPC client retries only the connection, before a request is sent.

Starts. A start is registered (``start_begun``) before its call is queued, so the batches sent
meanwhile wait for it in the backlog rather than reach the node before the segment does. Every
way the call can end must then end the start: ``start_succeeded`` (the backlog goes out, the node
is back in sync) or ``start_failed``, also when the call failed before it reached the node, so the
node is out of sync for that segment at once and its batches fail with the reason
(Hadoop's testMissFinalizeAndNextStart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from qjm import errors
from qjm.errors import FencedError, NodeTooFarBehindError, NodeUnavailableError, OutOfSyncError, QJMError
from qjm.protocol.messages import NO_TXID, RequestInfo

__all__ = ["CommitNotice", "Held", "NodeState", "NodeStateView", "Refusal", "Route"]

P = TypeVar("P")  # what the caller tracks a held batch by (a future, a native delivery)

CommitNotice = tuple[int, int]
"""(writer epoch, committed txid): the COMMIT message to send ahead of a batch."""


@dataclass(slots=True)
class Held(Generic[P]):
    """A batch kept while its node starts the segment."""

    frame: bytes
    last_txid: int
    ticket: P
    commit: CommitNotice | None


class Route:
    """Where an admitted batch goes."""

    SEND = "send"  # on the node's data link now
    HOLD = "hold"  # into the backlog of the segment being started


@dataclass(frozen=True, slots=True)
class Refusal(Generic[P]):
    """A batch the node cannot take. ``dropped``: batches of segments being started that fail with
    it; ``close_link``: the node is dropped for being too far behind, its link goes."""

    error: QJMError
    dropped: list[Held[P]]
    close_link: bool


class NodeState(Generic[P]):
    """Serials, sync state, start backlog and commit notices of one writer's channel to one node."""

    def __init__(self, name: str, journal_id: str, queue_limit: int) -> None:
        self.name = name
        self.journal_id = journal_id
        self.queue_limit = queue_limit
        self.epoch = -1
        self.serial = 0
        self.committed = NO_TXID
        self.committed_sent = NO_TXID
        self.out_of_sync = False
        self.fenced: FencedError | None = None  # what put the node out of sync, when it was fencing
        self.unreachable: NodeUnavailableError | None = None  # ... when the node stopped answering
        self.highest_acked = 0
        self._starting: dict[int, list[Held[P]]] = {}  # segment whose start is queued or running → batches
        self.starting = False
        """A start is queued or running: batches wait for it (read once per batch: a plain attribute)."""
        self.backlog_bytes = 0
        self.on_change: Callable[[], None] | None = None
        """Called after every change that can keep a batch from going straight out on the link (the
        epoch, the committed txid, sync, starts): a logger set's standing claim on its nodes' links
        (``qjm.client.remote``) ends on it."""

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def snapshot(self) -> tuple[object, ...]:
        """Everything that decides this state's next answers (the simulator's exhaustive search
        compares states by it)."""
        return (
            self.epoch,
            self.serial,
            self.committed,
            self.committed_sent,
            self.out_of_sync,
            self.fenced is not None,
            self.unreachable is not None,
            tuple((txid, len(held)) for txid, held in self._starting.items()),
        )

    # -- epoch, serials, committed txid -------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._changed()

    def set_committed(self, txid: int) -> None:
        if txid < self.committed:
            raise errors.InvariantViolation(f"committed txid moving backward: {txid} < {self.committed}")
        self.committed = txid
        self._changed()

    def request(self) -> RequestInfo:
        """The stamp of one attempt of a control call: a serial no attempt had before."""
        if self.epoch <= 0:
            raise QJMError(f"{self.name}: no epoch yet; fence (recover) before writing")
        self.serial += 1
        return RequestInfo(self.journal_id, self.epoch, self.serial, self.committed)

    def commit_notice(self) -> CommitNotice | None:
        """The committed txid to send ahead of the next batch, if it moved since the last notice."""
        if self.committed <= self.committed_sent:
            return None
        self.committed_sent = self.committed
        return (self.epoch, self.committed)

    def notice_sent(self, txid: int) -> None:
        """A notice of ``txid`` went out without ``commit_notice`` (sent with the batch's quorum)."""
        self.committed_sent = max(self.committed_sent, txid)

    def acked(self, txid: int) -> None:
        self.highest_acked = max(self.highest_acked, txid)

    # -- sync --------------------------------------------------------------------------------

    def lose_sync(self, e: BaseException) -> None:
        """The node takes no more batches this segment; remember whether fencing or an unreachable
        node did it, so that later refusals say so."""
        self.out_of_sync = True
        if isinstance(e, FencedError):
            self.fenced = e
        elif isinstance(e, NodeUnavailableError) and self.unreachable is None:
            self.unreachable = e
        self._changed()

    def not_in_sync(self, detail: str = "") -> QJMError:
        """The error for a batch or finalize this node cannot take. A node out of sync because it
        fenced this writer says so: told only "out of sync", a writer whose batch reached a majority
        before the fencing would report a lost quorum, not that a newer writer holds the journal."""
        f = self.fenced
        if f is not None:
            return FencedError(
                f"{self.name}: fenced earlier in this segment ({f}){detail}",
                request_epoch=f.request_epoch,
                promised_epoch=f.promised_epoch,
            )
        u = self.unreachable
        if u is not None:
            return NodeUnavailableError(
                f"{self.name}: unreachable ({u}); no batches to it until the next segment{detail}"
            )
        return OutOfSyncError(f"{self.name}: out of sync until the next segment{detail}")

    # -- segment starts ----------------------------------------------------------------------

    def start_begun(self, txid: int) -> None:
        """From now on batches belong to segment ``txid``."""
        self._starting[txid] = []
        self.starting = True
        self._changed()

    def start_succeeded(self, txid: int) -> list[Held[P]] | None:
        """The node started ``txid``: it is back in sync (reference §3.2); the backlog to send now.

        None if the start was dropped meanwhile (its backlog passed the limit): the node sits this
        segment out, like a node dropped on a full send queue."""
        if txid not in self._starting:
            return None
        self.out_of_sync = False
        self.fenced = None
        self.unreachable = None
        return self._take(txid)

    def start_failed(self, txid: int, e: QJMError) -> list[Held[P]]:
        """The start of ``txid`` failed, wherever it failed: out of sync for it at once; the batches
        kept for it, which fail with ``e``. Ending a start twice is harmless."""
        if txid in self._starting:
            self.lose_sync(e)
        return self._take(txid)

    def drop_starting(self, e: QJMError) -> list[Held[P]]:
        """The node sits the segments being started out: the batches kept for them, to fail."""
        out: list[Held[P]] = []
        for txid in list(self._starting):
            out += self.start_failed(txid, e)
        return out

    def _take(self, txid: int) -> list[Held[P]]:
        backlog = self._starting.pop(txid, [])
        self.starting = bool(self._starting)
        self.backlog_bytes -= sum(len(h.frame) for h in backlog)
        self._changed()
        return backlog

    # -- batches -----------------------------------------------------------------------------

    def route(self, nbytes: int, in_flight: int, has_link: bool) -> str | Refusal[P]:
        """Admit a batch of ``nbytes`` or refuse it (the refusal is already recorded here).

        ``in_flight``: bytes sent on the link and not acknowledged (0 where the link bounds them
        itself). A node that would pass the queue limit is dropped, as Hadoop drops it (HDFS-14693),
        whether the bytes sit on the link or in the backlog of a segment it is starting.
        """
        if self.out_of_sync and not self.starting:  # a pending start may bring the node back
            return Refusal(self.not_in_sync(), [], False)
        limit = self.queue_limit
        if in_flight > 0 and in_flight + nbytes > limit:
            return self._too_far(
                f"{self.name}: {in_flight} bytes unacknowledged; a batch of {nbytes} would pass the limit of {limit}"
            )
        if self.starting:
            if self.backlog_bytes > 0 and self.backlog_bytes + nbytes > limit:
                return self._too_far(
                    f"{self.name}: {self.backlog_bytes} bytes kept while the node starts segment "
                    f"{next(reversed(self._starting))}; a batch of {nbytes} would pass the limit of {limit}"
                )
            return Route.HOLD
        if not has_link:
            e = OutOfSyncError(f"{self.name}: no data link; out of sync until the next segment")
            self.lose_sync(e)
            return Refusal(e, [], False)
        return Route.SEND

    def _too_far(self, message: str) -> Refusal[P]:
        e = NodeTooFarBehindError(message)
        self.lose_sync(e)
        return Refusal(e, self.drop_starting(e), True)

    def hold(self, held: Held[P]) -> None:
        """Keep a batch routed ``HOLD`` for the newest segment being started."""
        self._starting[next(reversed(self._starting))].append(held)
        self.backlog_bytes += len(held.frame)


class NodeStateView(Generic[P]):
    """The ``Logger`` members that only read or set a ``NodeState``: identity, sync state, epoch.

    ``RemoteLogger`` inherits them. A subclass keeps its ``NodeState`` in ``_state``
    and takes its own lock around the calls that change it; the writer's thread alone sets the
    epoch and the committed txid (once per epoch, once per commit), and other threads read plain
    attributes, so these members take no lock.
    """

    _state: NodeState[P]

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def source_url(self) -> str:
        return self._state.name

    @property
    def out_of_sync(self) -> bool:
        return self._state.out_of_sync

    @property
    def fenced(self) -> bool:
        """Out of sync because this node fenced the writer (a newer writer holds the journal)."""
        return self._state.fenced is not None

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def highest_acked_txid(self) -> int:
        """The highest txid this node has acknowledged as durable to this writer."""
        return self._state.highest_acked

    def set_epoch(self, epoch: int) -> None:
        self._state.set_epoch(epoch)

    def watch(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` after every change of this node's state (``NodeState.on_change``)."""
        self._state.on_change = on_change

    def set_committed_txid(self, txid: int) -> None:
        self._state.set_committed(txid)
