"""Choosing the recovery source for an unclosed segment (design §2.9, HDFS-3845) — pure functions.

When a new writer takes over, the newest segment may differ in length between nodes, and an earlier
recovery attempt may have been cut short. The writer asks a quorum to ``prepare_recovery`` and must
then pick, from those replies alone, the one replica whose copy

* holds every transaction a quorum ever acknowledged to any earlier writer (committed is forever), and
* equals whatever an earlier, possibly half-finished recovery already decided (Paxos: a value that
  may have been chosen must be proposed again),

so that every node finalizes the segment to the same length and contents (design §2.8).

The order below is Hadoop's ``SegmentRecoveryComparator`` (reference §3.6), including the HDFS-3845
writer-epoch rule: an in-progress replica is ranked by ``max(accepted_in_epoch, last_writer_epoch)``
*before* its length. Without the writer epoch, an old accepted proposal ("101-101 accepted in epoch
2") would beat a longer log that a later writer (epoch 3) wrote and committed, truncating committed
transactions.

Nothing here does I/O: the callers (``qjm.client``'s recovery flow, the simulator, the tests) pass
the replies in.
"""

from __future__ import annotations

from collections.abc import Mapping

from qjm.errors import InvariantViolation
from qjm.protocol.messages import NO_TXID, PrepareRecoveryResponse, SegmentState

__all__ = ["check_no_committed_loss", "choose_recovery_source", "compare_responses", "in_sync_copy", "seen_epoch"]


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def seen_epoch(r: PrepareRecoveryResponse, bugs: object | None = None) -> int:
    """``maxSeenEpoch`` of design §2.9 rule 3a with HDFS-3845: max(accepted epoch or 0, writer epoch).

    ``bugs`` (a ``qjm.testing.bugs.ProtocolBugs``, tests only) can drop either term on purpose.
    """
    accepted = 0 if getattr(bugs, "ignore_accepted_epoch", False) else (r.accepted_in_epoch or 0)
    writer = 0 if getattr(bugs, "ignore_writer_epoch_rule", False) else r.last_writer_epoch
    return max(accepted, writer)


def compare_responses(a: PrepareRecoveryResponse, b: PrepareRecoveryResponse, *, bugs: object | None = None) -> int:
    """Order two prepare replies for the same segment; the greater one is the better recovery source.

    Returns a negative number, zero or a positive number as ``a`` is worse than, as good as, or
    better than ``b``. Raises ``InvariantViolation`` when the two replies cannot both be true of
    one segment. ``bugs`` (tests only, default None = the correct protocol) breaks rules 3a-3c on
    purpose so the fault search can show it would notice.
    """
    sa, sb = a.segment_state, b.segment_state
    # Rule 1 (design §2.9.1, reference §3.6.1): a node without the segment is no source at all.
    if sa is None or sb is None:
        return (sa is not None) - (sb is not None)
    # Reference §3.6.2: both replies must describe the same segment.
    if sa.start_txid != sb.start_txid:
        raise InvariantViolation(f"recovery replies describe different segments: {sa} and {sb}")
    # Rule 2 (design §2.9.2, reference §3.6.3): a finalized copy wins whatever its length, because
    # a quorum already agreed on it (the QJM design's invariant 3, design §2.7).
    if sa.in_progress != sb.in_progress:
        return 1 if not sa.in_progress else -1
    if not sa.in_progress:
        # Reference §3.6.4: two finalized copies of one segment must agree (invariant 2).
        if sa.end_txid != sb.end_txid:
            raise InvariantViolation(f"finalized segments with different lengths: {sa} and {sb}")
        return 0
    # Rule 3a/3b (design §2.9.3, HDFS-3845, reference §3.6.5): the copy touched by the later
    # writer or the later accepted proposal wins, even when it is shorter (examples 2.10.6, 2.10.7).
    by_epoch = _sign(seen_epoch(a, bugs) - seen_epoch(b, bugs))
    if by_epoch:
        return by_epoch
    # Rule 3c: same epoch, so both copies are prefixes of one writer's log; the longer holds more.
    if getattr(bugs, "pick_shortest_log", False):
        return _sign(sb.end_txid - sa.end_txid)
    return _sign(sa.end_txid - sb.end_txid)


def choose_recovery_source(
    responses: Mapping[str, PrepareRecoveryResponse],
    *,
    bugs: object | None = None,
) -> tuple[str, PrepareRecoveryResponse] | None:
    """The best reply under ``compare_responses`` and its node (reference §3.5 step 3).

    Equally good replies are interchangeable (design §2.9, last paragraph); the first node name in
    sorted order is taken so that the choice is deterministic. Returns None when no responder has
    the segment (reference §3.5 step 4: nothing to recover).
    """
    best: tuple[str, PrepareRecoveryResponse] | None = None
    for name in sorted(responses):
        r = responses[name]
        if best is None or compare_responses(r, best[1], bugs=bugs) > 0:
            best = (name, r)
    if best is None or best[1].segment_state is None:
        return None
    return best


def check_no_committed_loss(chosen: SegmentState, responses: Mapping[str, PrepareRecoveryResponse]) -> None:
    """Refuse a decision that would drop a txid some node saw committed (reference §3.5 step 6).

    Invariant 1 (design §2.7): "committed is forever". If the chosen copy ends before a committed txid,
    choosing it would silently lose acknowledged transactions, so this is an invariant violation.
    """
    for name in sorted(responses):
        committed = responses[name].last_committed_txid
        if committed != NO_TXID and committed > chosen.end_txid:
            raise InvariantViolation(
                f"decided to synchronize segment {chosen.start_txid} to {chosen}, "
                f"but node {name} had seen txid {committed} committed"
            )


def in_sync_copy(responses: Mapping[str, PrepareRecoveryResponse], node_count: int) -> SegmentState | None:
    """The in-progress copy every one of ``node_count`` nodes reported, or None.

    When all nodes answered phase 1 (after promising the new epoch) with one and the same
    in-progress copy, no other value for the segment exists anywhere: the old writer can no longer
    change any copy, and every later recovery can only see this one, so it will choose it again.
    Paxos phase 2 (accept_recovery), whose job is to make a quorum remember the choice, then has
    nothing to protect, and the writer may finalize directly. A copy is identified by its end and
    the epoch of its last frame, the identity accept_recovery itself uses to skip a download
    (design §2.9, last paragraph). Every node, not a quorum: a node that did not answer may hold
    a longer copy that a later recovery would prefer.
    """
    if node_count < 1 or len(responses) < node_count:
        return None
    states = {r.segment_state for r in responses.values()}
    if len(states) != 1:
        return None
    (state,) = states
    if state is None or not state.in_progress or state.epoch == 0:
        return None
    return state
