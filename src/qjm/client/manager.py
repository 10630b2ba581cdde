"""QuorumJournalManager: fencing, recovery and the segment lifecycle over a ``LoggerSet`` (design §2.2).

All waits go through ``QuorumCall``; all decisions that need thought live in the pure
``qjm.client.recovery`` module. This class only sequences the calls.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

from qjm.client.loggers import CallHooks, Logger, LoggerSet, SyncLane, WriterLife
from qjm.client.quorum import BatchCall, QuorumCall
from qjm.client.recovery import check_no_committed_loss, choose_recovery_source, in_sync_copy
from qjm.client.rejoin import RejoinPlan, plan_rejoin
from qjm.client.remote import open_loggers
from qjm.client.retention import PurgeRequest, check_bound, requested_bound
from qjm.client.shared import EPOCH_HINTS, EpochHints
from qjm.config import JournalURI, QJMConfig, as_config, parse_uri
from qjm.errors import EpochError, NodeUnavailableError, NotFormattedError, PurgeRefusedError, QJMError, QuorumError
from qjm.protocol.messages import (
    NO_TXID,
    EditLogManifest,
    JournalState,
    NamespaceInfo,
    NewEpochResponse,
    PrepareRecoveryResponse,
    SegmentState,
)

log = logging.getLogger("qjm.manager")


@dataclass(frozen=True, slots=True)
class PurgeOutcome:
    """What an admin purge did: its bound, the finalized segments below it that the nodes listed,
    the nodes that purged and those that failed (each with its error)."""

    min_txid_to_keep: int
    segments: tuple[tuple[int, int], ...]
    purged: tuple[str, ...]
    failed: dict[str, BaseException]


def _log_purge(node: str, min_txid_to_keep: int, fut: Future[None]) -> None:
    e = fut.exception()
    if e is not None:  # a refusal says the retention settings ask too much; the rest come and go
        level = logging.WARNING if isinstance(e, PurgeRefusedError) else logging.INFO
        log.log(level, "%s: purge below txid %d failed: %s: %s", node, min_txid_to_keep, type(e).__name__, e)


class QuorumJournalManager:
    """One writer's (or reader's) handle on a replicated journal.

    A manager gets at most one epoch in its life (reference §3.4): to write again after losing
    the journal, make a new manager.
    """

    def __init__(
        self,
        uri: str | JournalURI,
        *,
        config: QJMConfig | None = None,
        hooks: CallHooks | None = None,
        loggers: Sequence[Logger] | None = None,
        namespace: NamespaceInfo | None = None,
        epoch_hints: EpochHints | None = None,
    ) -> None:
        if isinstance(uri, str):
            self.uri = parse_uri(uri)
        elif isinstance(uri, JournalURI):
            self.uri = uri
        else:
            raise TypeError(f"uri: expected a qjournal:// URI string, got {type(uri).__name__}")
        self.config = as_config(config).validate()
        self.life = WriterLife()
        self.loggers = open_loggers(self.uri, self.config, hooks, self.life) if loggers is None else LoggerSet(loggers)
        self.namespace = namespace or NamespaceInfo(self.config.namespace_id, self.config.cluster_id)
        self.epoch = 0
        self.active = False
        self.committed_txid = NO_TXID
        self._hints = EPOCH_HINTS if epoch_hints is None else epoch_hints
        self._hint_key = (tuple(sorted(str(a) for a in self.uri.nodes)), self.uri.journal_id)

    @property
    def journal_id(self) -> str:
        return self.uri.journal_id

    # -- formatting --------------------------------------------------------------------------

    def format(self, force: bool = False) -> None:
        """Format the journal on every node; all must succeed (design §4.2)."""
        self.loggers.call(lambda lg: lg.format(self.namespace, force)).wait_for_all(
            self.config.timeouts.operations, "format"
        )

    def is_formatted(self) -> bool:
        """True if any of the first majority of nodes to answer holds a formatted copy (Hadoop ``hasSomeData``).

        A majority is enough: a journal is formatted on all nodes at once, and waiting for every node
        would let one dead node block every new writer.
        """
        call = self.loggers.call(lambda lg: lg.is_formatted())
        call.wait_for(
            self.loggers.majority,
            0,
            self.loggers.size - self.loggers.majority,
            self.config.timeouts.operations,
            "is_formatted",
        )
        if len(call.successes) + len(call.exceptions) < self.loggers.majority or (
            len(call.exceptions) > self.loggers.size - self.loggers.majority
        ):
            raise QuorumError("is_formatted: too few nodes answered", successes=call.successes, causes=call.exceptions)
        return any(call.successes.values())

    # -- fencing and recovery (design §2.5, §2.8) ---------------------------------------------

    def note_epoch(self, epoch: int) -> None:
        """Remember an epoch seen in this journal (a promise, a frame, a refusal): the next writer
        of this process proposes above it without asking the nodes first (qjm.client.shared)."""
        self._hints.note(self._hint_key, epoch)

    def create_new_unique_epoch(self) -> int:
        if self.epoch:
            raise QJMError(f"this manager already holds epoch {self.epoch}; make a new one to write again")
        hint = self._hints.get(self._hint_key)
        proposed = hint + 1
        replies = self._propose_epoch(proposed, guessed=True) if hint else None
        if replies is None:
            states = self.loggers.call(lambda lg: lg.get_journal_state()).wait_for_write_quorum(
                self.config.timeouts.get_journal_state, "get_journal_state"
            )
            proposed = max(s.last_promised_epoch for s in states.values()) + 1
            self.note_epoch(proposed - 1)
            replies = self._propose_epoch(proposed, guessed=False)
            assert replies is not None
        self.epoch = proposed
        self._new_epoch_replies = replies
        self.loggers.set_epoch(self.epoch)
        self.note_epoch(self.epoch)
        log.info("journal %s: won epoch %d", self.journal_id, self.epoch)
        return self.epoch

    def _propose_epoch(self, proposed: int, *, guessed: bool) -> dict[str, NewEpochResponse] | None:
        """new_epoch(proposed) at a quorum; the replies, with every node's when they come at once.

        A ``guessed`` proposal (from the epoch hint) that nodes refuse as too low, or that finds
        the journal unformatted, returns None: the caller asks the nodes for their promises, as
        Hadoop always does. Any other failure is the caller's to see.
        """
        call = self.loggers.call(lambda lg: lg.new_epoch(self.namespace, proposed))
        try:
            replies = call.wait_for_write_quorum(self.config.timeouts.new_epoch, f"new_epoch({proposed})")
        except QuorumError as e:
            if guessed and any(isinstance(c, EpochError | NotFormattedError) for c in e.causes.values()):
                log.info(
                    "journal %s: epoch %d guessed from the hint was refused; asking the nodes",
                    self.journal_id,
                    proposed,
                )
                return None
            raise
        if 0 < len(replies) < self.loggers.size and self.config.in_sync_wait > 0 and _same_open_copy(replies):
            # Every node's phase 1 would spare recovery its accept round (in_sync_copy); the rest
            # of the nodes usually answer within a fraction of a millisecond, a dead one never.
            replies = call.wait_for_stragglers(self.config.in_sync_wait, f"new_epoch({proposed})")
        return replies

    def recover_unfinalized_segments(self) -> int:
        """Fence older writers, then recover and finalize the newest segment.

        Returns the last txid of the log: the next segment starts right after it.
        """
        if self.active:
            raise QJMError("already the active writer")
        self.create_new_unique_epoch()
        replies = self._new_epoch_replies
        starts = [r.last_segment_txid for r in replies.values() if r.last_segment_txid is not None]
        last = 0
        if starts:
            segment = max(starts)
            last = self.recover_unclosed_segment(segment, prepared_from_new_epoch(replies, segment))
        self.active = True
        return last

    def recover_unclosed_segment(
        self, segment: int, prepared: Mapping[str, PrepareRecoveryResponse] | None = None
    ) -> int:
        """Paxos over one segment (reference §3.5): prepare, choose, accept, finalize.

        The accept round is skipped when every node reported the same in-progress copy
        (``in_sync_copy``): no other value exists, so there is no choice for a quorum to remember.

        ``prepared``: phase-1 answers a quorum already gave with its promise (``new_epoch``); the
        prepare round is then skipped. (Starting the next segment right behind the finalize would
        save another round, but a node could then start segment N before a quorum finalized the
        segment ending at N-1: design invariant 6.)
        """
        if prepared is None:
            prepared = self.loggers.call(lambda lg: lg.prepare_recovery(segment)).wait_for_write_quorum(
                self.config.timeouts.prepare_recovery, f"prepare_recovery({segment})"
            )
        best = self._choose_source(prepared)
        if best is None:
            # Nobody in this quorum has the segment: it never reached a quorum, and by invariant 2
            # a quorum holds a finalized segment ending right before it.
            log.info("journal %s: none of the responders has segment %d; nothing to recover", self.journal_id, segment)
            return segment - 1
        source, reply = best
        state = reply.segment_state
        assert state is not None
        check_no_committed_loss(state, prepared)
        if self.config.in_sync_wait > 0 and self._in_sync_copy(prepared) == state:
            log.info(
                "journal %s: every node holds segment %s; finalizing it without an accept round", self.journal_id, state
            )
        else:
            how = f"accepted in epoch {reply.accepted_in_epoch}" if reply.accepted_in_epoch else "best on disk"
            log.info("journal %s: recovering segment %s from %s (%s)", self.journal_id, state, source, how)
            url = self.loggers.by_name(source).source_url
            self.loggers.call(lambda lg: lg.accept_recovery(state, url)).wait_for_write_quorum(
                self.config.timeouts.accept_recovery, f"accept_recovery({state})"
            )
        # Naming the copy (its last frame's epoch) lets a node that missed the accept but holds the
        # very same copy finalize it, and refuses any other copy of the same length.
        self.loggers.call(
            lambda lg: lg.finalize_log_segment(state.start_txid, state.end_txid, state.epoch)
        ).wait_for_write_quorum(
            self.config.timeouts.finalize_segment, f"finalize_log_segment({state.start_txid}, {state.end_txid})"
        )
        return state.end_txid

    def _choose_source(
        self, prepared: Mapping[str, PrepareRecoveryResponse]
    ) -> tuple[str, PrepareRecoveryResponse] | None:
        """The recovery source (a seam for the simulator's protocol-bug switches)."""
        return choose_recovery_source(prepared)

    def _in_sync_copy(self, prepared: Mapping[str, PrepareRecoveryResponse]) -> SegmentState | None:
        """The copy that spares recovery its accept round (a seam like ``_choose_source``)."""
        return in_sync_copy(prepared, self.loggers.size)

    # -- segments ----------------------------------------------------------------------------

    def _require_active(self) -> None:
        if not self.active:
            raise QJMError("not the active writer: call recover_unfinalized_segments() first")

    def start_log_segment(self, txid: int) -> None:
        self.begin_log_segment(txid).wait_for_write_quorum(
            self.config.timeouts.start_segment, f"start_log_segment({txid})"
        )

    def begin_log_segment(self, txid: int) -> QuorumCall[None]:
        """Send start_log_segment to every node; the caller waits on the call when it needs to.

        Batches of the segment sent meanwhile wait behind the start on each node's channel, so a
        node sees the start before any frame of the segment either way (design §2.12).
        """
        self._require_active()
        return self.loggers.call(lambda lg: lg.start_log_segment(txid))

    def finalize_log_segment(self, start: int, end: int) -> None:
        self._require_active()
        self.loggers.call(lambda lg: lg.finalize_log_segment(start, end)).wait_for_write_quorum(
            self.config.timeouts.finalize_segment, f"finalize_log_segment({start}, {end})"
        )

    def purge_logs_older_than(self, min_txid_to_keep: int) -> None:
        """Fire and forget, as in Hadoop: a node that misses it purges at a later call."""
        self._require_active()
        for lg in self.loggers.loggers:
            lg.purge_logs(min_txid_to_keep).add_done_callback(partial(_log_purge, lg.name, min_txid_to_keep))

    def admin_purge(self, request: PurgeRequest, *, min_retained_txids: int, now: float) -> PurgeOutcome:
        """An operator's purge beside the writer (design §2.12): plan it from a quorum's view, then
        ask every node to purge in the epoch it promised, without fencing the writer.

        Refused whole (``PurgeRefusedError``, nothing sent) when the request reaches the newest
        segment or the retention floor.
        """
        answers = self.get_journal_states()
        states = {n: s for n, s in answers.items() if isinstance(s, JournalState)}
        if len(states) < self.loggers.majority:
            raise QuorumError(f"admin purge: only {len(states)} node(s) answered, {self.loggers.majority} needed")
        manifests = self.get_edit_log_manifest(0, in_progress_ok=True)
        logs = [x for m in manifests.values() for x in m.logs]
        committed = max(
            [m.committed_txid for m in manifests.values()] + [s.committed_txid for s in states.values()] + [0]
        )
        newest = max([x.start_txid for x in logs] + [s.open_segment_txid for s in states.values()] + [0])
        bound = check_bound(
            requested_bound(request, committed=committed, segments=logs, now=now),
            segments=logs,
            newest_segment=newest,
            committed=committed,
            min_retained_txids=min_retained_txids,
        )
        doomed = tuple(sorted({(x.start_txid, x.end_txid) for x in logs if not x.in_progress and x.end_txid < bound}))
        if not doomed:
            return PurgeOutcome(bound, (), (), {})
        futures = {
            lg.name: lg.admin_purge_logs(states[lg.name].last_promised_epoch, bound)
            for lg in self.loggers.loggers
            if lg.name in states
        }
        done: list[str] = []
        failed = {n: a for n, a in answers.items() if not isinstance(a, JournalState)}
        for lg in self.loggers.loggers:
            if lg.name not in answers:
                failed[lg.name] = NodeUnavailableError(f"{lg.name} did not answer in time")
        for name, fut in futures.items():
            try:
                fut.result(timeout=self.config.timeouts.operations)
                done.append(name)
            except Exception as e:  # each node's failure is reported, the others' purges stand
                failed[name] = e
        return PurgeOutcome(bound, doomed, tuple(done), failed)

    def rejoin_node(self, node: str) -> RejoinPlan:
        """Format ``node``, which lost its copy of the journal, with its peers' namespace and
        highest promise (design §4.5); the plan it followed. Fences nobody: the writer goes on,
        and the node takes its segments from the writer's next one. Refused, with nothing
        changed, as ``plan_rejoin`` says."""
        names = [lg.name for lg in self.loggers.loggers]
        if node not in names:
            plan_rejoin(self.journal_id, node, names, {})  # raises: not one of the journal's nodes
        asked = self.loggers.call(lambda lg: lg.status())
        # Every node's answer, or as many as come in time: a node that does not answer counts as one.
        answers: dict[str, Mapping[str, object] | BaseException] = {
            **asked.wait_for_stragglers(2 * self.config.timeouts.connect, "status"),
            **asked.exceptions,
        }
        plan = plan_rejoin(self.journal_id, node, names, answers)

        def format_one(lg: Logger) -> Future[None]:
            if lg.name == node:
                return lg.format(plan.namespace, False, plan.promised_epoch)
            skipped: Future[None] = Future()
            skipped.set_result(None)
            return skipped

        done = self.loggers.call(format_one)
        done.wait_for_stragglers(self.config.timeouts.operations, "format")
        failed = done.exceptions.get(node)
        if failed is not None:
            raise failed
        if node not in done.successes:
            raise NodeUnavailableError(f"{node}: no answer to format in {self.config.timeouts.operations:g} s")
        log.info(
            "journal %s: node %s rejoined with promised epoch %d (from %s)",
            self.journal_id, node, plan.promised_epoch, ", ".join(plan.peers),
        )  # fmt: skip
        return plan

    def send_batch(self, frame: bytes, first_txid: int, last_txid: int) -> BatchCall:
        """Send one batch to every node; wait on the result for its quorum."""
        return self.loggers.send_batch(frame, first_txid, last_txid)

    def sync_lane(self) -> SyncLane | None:
        """A lane for sync commits in one call (``LoggerSet.sync_lane``); None: ``send_batch``."""
        return self.loggers.sync_lane()

    def lane_call(self, lane: SyncLane, last_txid: int) -> BatchCall:
        """The quorum call of a batch ``lane.commit`` left short of a quorum."""
        return self.loggers.lane_call(lane, last_txid)

    def set_committed_txid(self, txid: int) -> None:
        self.committed_txid = txid
        self.loggers.set_committed_txid(txid)

    def announce_committed(self) -> None:
        self.loggers.announce_committed()

    # -- reading -----------------------------------------------------------------------------

    def get_edit_log_manifest(self, since: int, in_progress_ok: bool = False) -> dict[str, EditLogManifest]:
        return self.loggers.call(lambda lg: lg.get_edit_log_manifest(since, in_progress_ok)).wait_for_write_quorum(
            self.config.timeouts.select_input_streams, "get_edit_log_manifest"
        )

    def get_journal_states(self) -> dict[str, JournalState | BaseException]:
        call = self.loggers.call(lambda lg: lg.get_journal_state())
        try:
            call.wait_for(self.loggers.size, 0, -1, self.config.timeouts.connect, "get_journal_state")
        except QuorumError:
            pass
        out: dict[str, JournalState | BaseException] = dict(call.successes)
        out.update(call.exceptions)
        return out

    def close(self, grace: float = 0.0) -> None:
        self.loggers.close(grace)

    def __enter__(self) -> QuorumJournalManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prepared_from_new_epoch(
    replies: Mapping[str, NewEpochResponse], segment: int
) -> dict[str, PrepareRecoveryResponse] | None:
    """The quorum's phase-1 answers for ``segment``, taken from its new_epoch replies.

    A node whose newest segment is older than ``segment`` has neither that segment nor a proposal
    for it (a proposal is accepted only with its segment, and new_epoch rolls half-renamed ones
    forward first): its answer is "nothing" with its own writer epoch and committed txid. None if
    a node did not send phase 1 (an older node): then a prepare round is needed.
    """
    out: dict[str, PrepareRecoveryResponse] = {}
    for name, r in replies.items():
        if r.recovery is None:
            return None
        if r.last_segment_txid == segment:
            out[name] = r.recovery
        else:
            out[name] = PrepareRecoveryResponse(
                None, None, r.recovery.last_writer_epoch, r.recovery.last_committed_txid
            )
    return out


def _same_open_copy(replies: Mapping[str, NewEpochResponse]) -> bool:
    """The replies name one newest segment and report one in-progress copy of it."""
    prepared = prepared_from_new_epoch(replies, max(r.last_segment_txid or 0 for r in replies.values()))
    return prepared is not None and in_sync_copy(prepared, len(prepared)) is not None
