"""Recovery-source choice: the worked examples of design §2.10 and HDFS-3845, and order properties."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qjm.client.recovery import check_no_committed_loss, choose_recovery_source, compare_responses
from qjm.errors import InvariantViolation
from qjm.protocol.messages import NO_TXID, PrepareRecoveryResponse, SegmentState

R = PrepareRecoveryResponse


def inprog(start: int, end: int, *, lwe: int, accepted: int | None = None, committed: int = NO_TXID) -> R:
    return R(SegmentState(start, end, True), accepted, lwe, committed)


def final(start: int, end: int, *, lwe: int = 1, committed: int = NO_TXID) -> R:
    return R(SegmentState(start, end, False), None, lwe, committed)


def absent(*, lwe: int = 1) -> R:
    return R(None, None, lwe)


def quorums(names: list[str]) -> list[tuple[str, ...]]:
    """Every majority subset of the nodes: the responders a recovering writer may hear from."""
    need = len(names) // 2 + 1
    return [c for k in range(need, len(names) + 1) for c in combinations(names, k)]


def choose_end(state: Mapping[str, R], subset: tuple[str, ...]) -> tuple[str, int] | None:
    chosen = choose_recovery_source({n: state[n] for n in subset})
    if chosen is None:
        return None
    name, resp = chosen
    assert resp is state[name]
    assert resp.segment_state is not None
    return name, resp.segment_state.end_txid


# -- the design's examples (design §2.10) --------------------------------------------------------

# §2.10.1: a batch reached JN2 and JN3 only; every quorum contains one of them -> 153.
S_2_10_1 = {
    "JN1": inprog(101, 150, lwe=1),
    "JN2": inprog(101, 153, lwe=1),
    "JN3": inprog(101, 153, lwe=1),
}
# §2.10.2: only JN2 got the last batch; JN3 lags. 150 or 153 are both correct, never 125.
S_2_10_2 = {
    "JN1": inprog(101, 150, lwe=1),
    "JN2": inprog(101, 153, lwe=1),
    "JN3": inprog(101, 125, lwe=1),
}
# §2.10.3: finalize reached JN1 and JN2.
S_2_10_3 = {
    "JN1": final(101, 150),
    "JN2": final(101, 150),
    "JN3": inprog(101, 145, lwe=1),
}
# §2.10.4: finalize reached JN1 only.
S_2_10_4 = {
    "JN1": final(101, 150),
    "JN2": inprog(101, 150, lwe=1),
    "JN3": inprog(101, 125, lwe=1),
}
# §2.10.5: startLogSegment(151) reached JN1 only; its empty file is moved aside, so for segment
# 151 nobody has anything, and segment 101 is finalized everywhere.
S_2_10_5_SEG151 = {"JN1": absent(), "JN2": absent(), "JN3": absent()}
S_2_10_5_SEG101 = {"JN1": final(101, 150), "JN2": final(101, 150), "JN3": final(101, 150)}
# §2.10.6 first state: 151-153 reached JN1 only (JN2/JN3 moved their empty 151 aside).
S_2_10_6_BEFORE = {"JN1": inprog(151, 153, lwe=1), "JN2": absent(), "JN3": absent()}
# §2.10.6 second state: writer epoch 2 recovered with JN2+JN3 and committed 151 there.
S_2_10_6 = {
    "JN1": inprog(151, 153, lwe=1),
    "JN2": inprog(151, 151, lwe=2),
    "JN3": inprog(151, 151, lwe=2),
}
# §2.10.7: after a recovery (epoch 2) with JN1+JN3 accepted 150 and finalized JN3 only.
S_2_10_7 = {
    "JN1": inprog(101, 150, lwe=1, accepted=2),
    "JN2": inprog(101, 153, lwe=1),
    "JN3": final(101, 150),
}
# Seed 004 (HDFS-3845): JN0 accepted 101-101 in epoch 2 but a later writer (epoch 3) wrote and
# committed 101-150 on JN1 and JN2.
S_004 = {
    "JN0": inprog(101, 101, lwe=1, accepted=2),
    "JN1": inprog(101, 150, lwe=3),
    "JN2": inprog(101, 150, lwe=3),
}
# Seed 004, the step before: 101 reached JN0 only; the epoch-2 recovery then accepted 101-101 on JN0.
S_004_FIRST_PREPARE = {"JN0": inprog(101, 101, lwe=1), "JN1": absent(), "JN2": absent()}
S_004_AFTER_ACCEPT = {"JN0": inprog(101, 101, lwe=1, accepted=2), "JN1": absent(), "JN2": absent()}


CASES: list[tuple[str, Mapping[str, R], tuple[str, ...], set[str] | None, int | None]] = [
    # (example, state, responders, acceptable sources (None: no recovery), decided end txid)
    ("2.10.1", S_2_10_1, ("JN1", "JN2"), {"JN2"}, 153),
    ("2.10.1", S_2_10_1, ("JN1", "JN3"), {"JN3"}, 153),
    ("2.10.1", S_2_10_1, ("JN2", "JN3"), {"JN2", "JN3"}, 153),
    ("2.10.1", S_2_10_1, ("JN1", "JN2", "JN3"), {"JN2", "JN3"}, 153),
    ("2.10.2", S_2_10_2, ("JN1", "JN2"), {"JN2"}, 153),
    ("2.10.2", S_2_10_2, ("JN1", "JN3"), {"JN1"}, 150),
    ("2.10.2", S_2_10_2, ("JN2", "JN3"), {"JN2"}, 153),
    ("2.10.2", S_2_10_2, ("JN1", "JN2", "JN3"), {"JN2"}, 153),
    ("2.10.3", S_2_10_3, ("JN1", "JN2"), {"JN1", "JN2"}, 150),
    ("2.10.3", S_2_10_3, ("JN1", "JN3"), {"JN1"}, 150),
    ("2.10.3", S_2_10_3, ("JN2", "JN3"), {"JN2"}, 150),
    ("2.10.3", S_2_10_3, ("JN1", "JN2", "JN3"), {"JN1", "JN2"}, 150),
    ("2.10.4", S_2_10_4, ("JN1", "JN2"), {"JN1"}, 150),
    ("2.10.4", S_2_10_4, ("JN1", "JN3"), {"JN1"}, 150),
    ("2.10.4", S_2_10_4, ("JN2", "JN3"), {"JN2"}, 150),
    ("2.10.4", S_2_10_4, ("JN1", "JN2", "JN3"), {"JN1"}, 150),
    ("2.10.5 seg 151", S_2_10_5_SEG151, ("JN1", "JN2"), None, None),
    ("2.10.5 seg 151", S_2_10_5_SEG151, ("JN1", "JN2", "JN3"), None, None),
    ("2.10.5 seg 101", S_2_10_5_SEG101, ("JN2", "JN3"), {"JN2", "JN3"}, 150),
    ("2.10.5 seg 101", S_2_10_5_SEG101, ("JN1", "JN2", "JN3"), {"JN1", "JN2", "JN3"}, 150),
    ("2.10.6 before", S_2_10_6_BEFORE, ("JN2", "JN3"), None, None),
    ("2.10.6 before", S_2_10_6_BEFORE, ("JN1", "JN2"), {"JN1"}, 153),
    ("2.10.6", S_2_10_6, ("JN1", "JN2"), {"JN2"}, 151),
    ("2.10.6", S_2_10_6, ("JN1", "JN3"), {"JN3"}, 151),
    ("2.10.6", S_2_10_6, ("JN2", "JN3"), {"JN2", "JN3"}, 151),
    ("2.10.6", S_2_10_6, ("JN1", "JN2", "JN3"), {"JN2", "JN3"}, 151),
    ("2.10.7 first", S_2_10_2, ("JN1", "JN3"), {"JN1"}, 150),
    ("2.10.7", S_2_10_7, ("JN1", "JN2"), {"JN1"}, 150),
    ("2.10.7", S_2_10_7, ("JN1", "JN3"), {"JN3"}, 150),
    ("2.10.7", S_2_10_7, ("JN2", "JN3"), {"JN3"}, 150),
    ("2.10.7", S_2_10_7, ("JN1", "JN2", "JN3"), {"JN3"}, 150),
    ("004 first prepare", S_004_FIRST_PREPARE, ("JN0", "JN1", "JN2"), {"JN0"}, 101),
    ("004 after accept", S_004_AFTER_ACCEPT, ("JN1", "JN2"), None, None),
    ("004", S_004, ("JN0", "JN1"), {"JN1"}, 150),
    ("004", S_004, ("JN0", "JN2"), {"JN2"}, 150),
    ("004", S_004, ("JN1", "JN2"), {"JN1", "JN2"}, 150),
    ("004", S_004, ("JN0", "JN1", "JN2"), {"JN1", "JN2"}, 150),
]


@pytest.mark.parametrize(
    ("example", "state", "responders", "sources", "end"),
    CASES,
    ids=[f"{c[0]}:{'+'.join(c[2])}" for c in CASES],
)
def test_design_examples(
    example: str,
    state: Mapping[str, R],
    responders: tuple[str, ...],
    sources: set[str] | None,
    end: int | None,
) -> None:
    got = choose_end(state, responders)
    if sources is None:
        assert got is None, example
    else:
        assert got is not None, example
        name, got_end = got
        assert name in sources, example
        assert got_end == end, example


@pytest.mark.parametrize(
    ("state", "ends"),
    [
        (S_2_10_1, {153}),
        (S_2_10_2, {150, 153}),  # design: either is correct, 125 never
        (S_2_10_3, {150}),
        (S_2_10_4, {150}),
        (S_2_10_6, {151}),
        (S_2_10_7, {150}),
        (S_004, {150}),
    ],
)
def test_every_quorum_decides_a_correct_length(state: Mapping[str, R], ends: set[int]) -> None:
    """Whatever quorum answers, the decision is one the design calls correct."""
    for q in quorums(sorted(state)):
        got = choose_end(state, q)
        assert got is not None, q
        assert got[1] in ends, q


def test_ties_are_broken_by_node_name() -> None:
    same = inprog(101, 153, lwe=1)
    assert choose_recovery_source({"c": same, "a": same, "b": same}) == ("a", same)
    assert choose_recovery_source({"z": final(101, 150), "y": final(101, 150)}) == ("y", final(101, 150))


def test_no_responses_means_no_source() -> None:
    assert choose_recovery_source({}) is None


def test_without_writer_epoch_seed_004_would_truncate() -> None:
    """The pre-HDFS-3845 rule (accepted epoch only) picks JN0's 101-101; ours must not."""

    def old_key(r: R) -> tuple[int, int]:
        assert r.segment_state is not None
        return (r.accepted_in_epoch or 0, r.segment_state.end_txid)

    old_choice = max(S_004.values(), key=old_key)
    assert old_choice.segment_state is not None and old_choice.segment_state.end_txid == 101
    chosen = choose_recovery_source(S_004)
    assert chosen is not None and chosen[1].segment_state == SegmentState(101, 150, True)


# -- the comparator's rules one by one (reference §3.6) --------------------------------------------


def test_has_segment_beats_none() -> None:
    assert compare_responses(inprog(101, 101, lwe=1), absent(lwe=9)) > 0
    assert compare_responses(absent(lwe=9), inprog(101, 101, lwe=1)) < 0
    assert compare_responses(absent(lwe=1), absent(lwe=5)) == 0


def test_different_segments_are_an_invariant_violation() -> None:
    with pytest.raises(InvariantViolation):
        compare_responses(inprog(101, 150, lwe=1), inprog(151, 160, lwe=1))
    with pytest.raises(InvariantViolation):
        compare_responses(final(101, 150), inprog(102, 160, lwe=1))


def test_finalized_beats_in_progress_whatever_the_length_or_epoch() -> None:
    assert compare_responses(final(101, 120, lwe=1), inprog(101, 500, lwe=7, accepted=9)) > 0
    assert compare_responses(inprog(101, 500, lwe=7, accepted=9), final(101, 120, lwe=1)) < 0


def test_finalized_pair_must_agree() -> None:
    assert compare_responses(final(101, 150, lwe=1), final(101, 150, lwe=4)) == 0
    with pytest.raises(InvariantViolation):
        compare_responses(final(101, 150), final(101, 151))


def test_in_progress_seen_epoch_then_length() -> None:
    # higher max(accepted, writer) wins over a longer log
    assert compare_responses(inprog(101, 101, lwe=2), inprog(101, 150, lwe=1)) > 0
    assert compare_responses(inprog(101, 101, lwe=1, accepted=3), inprog(101, 150, lwe=2)) > 0
    # the writer epoch counts even when an older proposal was accepted (HDFS-3845)
    assert compare_responses(inprog(101, 150, lwe=3), inprog(101, 101, lwe=1, accepted=2)) > 0
    # equal seen epochs, whichever way they were reached: longer wins, equal lengths tie
    assert compare_responses(inprog(101, 150, lwe=2), inprog(101, 140, lwe=1, accepted=2)) > 0
    assert compare_responses(inprog(101, 140, lwe=2), inprog(101, 140, lwe=1, accepted=2)) == 0


# -- the safety check of reference §3.5 step 6 ---------------------------------------------------


def test_check_no_committed_loss() -> None:
    chosen = SegmentState(101, 150, True)
    fine = {"a": inprog(101, 150, lwe=1, committed=150), "b": inprog(101, 140, lwe=1, committed=NO_TXID)}
    check_no_committed_loss(chosen, fine)
    check_no_committed_loss(chosen, {"a": absent()})
    with pytest.raises(InvariantViolation, match="151"):
        check_no_committed_loss(chosen, {**fine, "c": inprog(101, 153, lwe=1, committed=151)})


# -- properties over random replies for one segment -----------------------------------------------

START = 101


@st.composite
def replies(draw: st.DrawFn, finalized_end: int) -> R:
    kind = draw(st.sampled_from(["none", "finalized", "inprogress"]))
    lwe = draw(st.integers(0, 5))
    committed = draw(st.sampled_from([NO_TXID, START, START + 10]))
    if kind == "none":
        return R(None, None, lwe, committed)
    if kind == "finalized":
        return R(SegmentState(START, finalized_end, False), None, lwe, committed)
    end = draw(st.integers(START, START + 20))
    accepted = draw(st.none() | st.integers(1, 5))
    return R(SegmentState(START, end, True), accepted, lwe, committed)


def sign(x: int) -> int:
    return (x > 0) - (x < 0)


@st.composite
def reply_sets(draw: st.DrawFn) -> dict[str, R]:
    fin = draw(st.integers(START, START + 20))
    names = draw(st.lists(st.sampled_from(list("abcdefg")), min_size=1, max_size=7, unique=True))
    return {n: draw(replies(fin)) for n in names}


@given(reply_sets())
def test_compare_is_a_total_preorder(rs: dict[str, R]) -> None:
    vals = list(rs.values())
    for a in vals:
        assert compare_responses(a, a) == 0
        for b in vals:
            ab = sign(compare_responses(a, b))
            assert ab == -sign(compare_responses(b, a))
            for c in vals:
                if ab >= 0 and compare_responses(b, c) >= 0:
                    assert compare_responses(a, c) >= 0


def dumb_key(r: R) -> tuple[int, int, int]:
    """Independent restatement of design §2.9: (has segment, finalized, seen epoch, length)."""
    s = r.segment_state
    if s is None:
        return (0, 0, 0)
    if not s.in_progress:
        return (2, 0, 0)
    return (1, max(r.accepted_in_epoch or 0, r.last_writer_epoch), s.end_txid)


@given(reply_sets())
def test_choose_matches_a_dumb_reimplementation(rs: dict[str, R]) -> None:
    names = sorted(rs)
    best = max(names, key=lambda n: dumb_key(rs[n]))  # max keeps the first of equals
    expected = None if rs[best].segment_state is None else (best, rs[best])
    assert choose_recovery_source(rs) == expected


def test_phase_one_from_new_epoch_replies() -> None:
    """The prepare answers a quorum gave with its promise: a node whose newest segment is older
    than the quorum's newest answers "nothing" with its own writer epoch and committed txid; a
    reply without phase 1 (an older node) asks for the separate prepare round."""
    from qjm.client.manager import prepared_from_new_epoch
    from qjm.protocol.messages import NewEpochResponse

    seg = SegmentState(101, 103, True, 3)
    replies = {
        "a": NewEpochResponse(101, PrepareRecoveryResponse(seg, 2, 3, 100)),
        "b": NewEpochResponse(1, PrepareRecoveryResponse(SegmentState(1, 100, False, 1), None, 1, 90)),
        "c": NewEpochResponse(None, PrepareRecoveryResponse(None, None, 0, NO_TXID)),
    }
    got = prepared_from_new_epoch(replies, 101)
    assert got == {
        "a": PrepareRecoveryResponse(seg, 2, 3, 100),
        "b": PrepareRecoveryResponse(None, None, 1, 90),
        "c": PrepareRecoveryResponse(None, None, 0, NO_TXID),
    }
    assert choose_recovery_source(got) == ("a", got["a"])
    assert prepared_from_new_epoch({**replies, "d": NewEpochResponse(101)}, 101) is None


def test_in_sync_copy_needs_every_node_and_one_in_progress_copy() -> None:
    """The accept round may be skipped only when every node reported the same in-progress copy."""
    from qjm.client.recovery import in_sync_copy

    s = SegmentState(101, 150, True, 3)
    same = {n: R(s, None, 3, 140) for n in "abc"}
    assert in_sync_copy(same, 3) == s
    assert in_sync_copy({n: same[n] for n in "ab"}, 3) is None  # a node did not answer: it may hold more
    assert in_sync_copy({**same, "c": R(SegmentState(101, 153, True, 3), None, 3, 140)}, 3) is None
    assert in_sync_copy({**same, "c": R(SegmentState(101, 150, True, 2), None, 2, 140)}, 3) is None
    assert in_sync_copy({**same, "c": R(None, None, 3, 140)}, 3) is None
    # the same copy accepted by an earlier recovery on one node is still the same copy
    assert in_sync_copy({**same, "c": R(s, 2, 3, 140)}, 3) == s
    finalized = SegmentState(101, 150, False, 3)
    assert in_sync_copy({n: R(finalized, None, 3, 150) for n in "abc"}, 3) is None  # nothing to recover
    assert in_sync_copy({n: R(SegmentState(101, 150, True, 0), None, 0) for n in "abc"}, 3) is None  # epoch unknown
    assert in_sync_copy({}, 0) is None


def written(end: int, epoch: int, accepted: int | None = None) -> R:
    """An in-progress copy through ``end`` whose frames the writer of ``epoch`` wrote."""
    return R(SegmentState(101, end, True, epoch), accepted, epoch)


@given(
    st.dictionaries(
        st.sampled_from("abcde"),
        st.sampled_from(
            [written(150, 3), written(153, 3), written(150, 2), written(150, 3, 4), absent(), final(101, 150)]
        ),
        min_size=1,
    )
)
def test_in_sync_copy_is_what_every_recovery_would_choose(rs: dict[str, R]) -> None:
    """Whenever the shortcut applies, every quorum of the nodes chooses that very copy: skipping
    the accept round cannot let a later recovery decide differently."""
    from qjm.client.recovery import in_sync_copy

    state = in_sync_copy(rs, len(rs))
    if state is None:
        return
    for q in quorums(sorted(rs)):
        chosen = choose_recovery_source({n: rs[n] for n in q})
        assert chosen is not None and chosen[1].segment_state == state
