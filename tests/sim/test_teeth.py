"""The fault search has teeth: each test-only protocol bug is caught by both searches.

Each ``ProtocolBugs`` switch breaks one rule of the protocol. For every switch, the random search
must find a violation within the stated number of seeds, and the exhaustive search must find one
in the stated small world. A hit counts only if the switch caused it: the same seed (or choice
path) passes without the switch, or breaks a different invariant there.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from qjm.testing.bugs import BUG_NAMES, ProtocolBugs
from qjm.testing.exhaustive import World, explore, small_worlds, teeth_worlds
from qjm.testing.faultsim import first_violation
from qjm.testing.sim import run_seed

pytestmark = pytest.mark.sim

# switch → (random seeds within which the first caused violation lies, the exhaustive world that
# shows it, or None when no small world does within the test's time). Hits per 2,000 seeds in
# brackets: the bounds leave room for the seeds to shift when the simulator changes.
BOUNDS: dict[str, tuple[int, str | None]] = {
    "ignore_writer_epoch_rule": (500, "2.10.6"),  # first hit: seed 6 [73]
    "ignore_accepted_epoch": (500, "2.10.7"),  # first hit: seed 5 [108]
    "ack_before_fsync": (100, "2.10.6"),  # first hit: seed 0 [1563] (the direct check of invariant 4)
    "skip_data_plane_epoch_check": (1_000, "2.10.6"),  # first hit: seed 47 [28]
    "pick_shortest_log": (1_000, "race"),  # first hit: seed 70 [36]
    "skip_accept_on_quorum_copy": (1_000, None),  # first hit: seed 30 [25]
    "finalize_any_same_length_copy": (500, None),  # first hit: seed 6 [117]
    "purge_ignores_open_segment": (1_000, None),  # first hit: seed 143 [20 in the first 1,000]
    "purge_ignores_retention_floor": (100, None),  # first hit: seed 2 [225 in the first 1,000]
    "sync_takes_in_progress": (1_000, None),  # first hit: seed 187
    "accept_txid_gap": (500, None),  # first hit: seed 20 [4 in the first 300]
    "retry_reuses_serial": (100, None),  # first hit: seed 5 [33 in the first 300]
    "failed_start_never_cleared": (200, None),  # first hit: seed 18 [27 in the first 300]
    "fenced_refusal_counts_as_ack": (200, None),  # first hit: seed 8 [13 in the first 300]
    "rejoined_node_votes": (2_000, None),  # first hit: seed 787 [4 in the first 4,000]
}
# rejoined_node_votes needs a lost disk (one seed in DISK_SEEDS), a rejoin, a lagging node and a
# crash of the node that held the lost disk's records with it: the exhaustive worlds lose no disk.
# The transport switches and the txid gap need the simulated network's retries, gaps and
# refusals, which the exhaustive worlds (single faults, no retries) leave out.
# The purge switches: the random search's writers roll by size and age and purge after each roll
# and sync (RANDOM_WORKLOAD); the exhaustive worlds run fixed plans without purges.
# finalize_any_same_length_copy: the same-length world, searched completely, does not show it
# with the simulator's per-node client state (NodeState, as on the real path); the shapes profile
# does, and the world stays among the worlds searched clean for the correct protocol.
# skip_accept_on_quorum_copy needs three faults in a row (a longer copy on one node that misses
# the next writer's promise, that writer dying while finalizing on one node only): more than a
# small world searches completely in its time, so the shapes profile's roles find it instead.
# Switches the simulator does not reach, each with the directed test that shows its harm: a
# repeated start of a segment that holds the writer's frames needs a StartLogSegment repeated after
# its batches, which the serial check refuses.
# Catch-up replacing a different finalized copy needs two different finalized copies of one
# segment, which the correct protocol never makes (invariants 2 and 5): only damage or another bug
# would give the switch something to replace, so its directed test builds such a pair.
DIRECTED_ONLY: dict[str, str] = {
    "restart_segment_of_own_epoch": "tests/unit/test_journal.py::"
    "test_tooth_restarting_a_segment_of_the_writers_own_epoch_loses_committed_txids",
    "sync_replaces_finalized_copy": "tests/unit/test_syncer.py::"
    "test_tooth_catch_up_replacing_a_different_finalized_copy_changes_a_finalized_segment",
}
# Switches no search reaches: each drops a guard that another rule covers in every execution the
# protocol allows, so no search of the correct protocol's executions can show its loss (defence in
# depth). tests/unit/test_redundant_guards.py shows what each guard refuses and what else refuses it.
UNREACHED: dict[str, str] = {
    "skip_serial_check": "a copy of an earlier writer's call is fenced by its epoch before its serial "
    "is read, so the check only sees a writer's own late or repeated calls; those are idempotent at the "
    "node (retries rely on it) or refused by the segment rules, and at worst close the node's open "
    "segment, which costs availability and no acknowledged txid. 0 hits in 20,000 seeds with duplicated "
    "and late control requests, on both data paths, though the switch changes executions there (55,980 "
    "txids acknowledged against 56,033 without it)",
    "skip_committed_loss_check": "a committed txid is on a quorum, so on a prepare responder whose copy "
    "the recovery choice ranks first, and the client refuses a decision below a committed txid any "
    "responder reports (check_no_committed_loss): the correct client never sends such an accept. "
    "0 hits in 20,000 seeds",
}
SEARCHED = tuple(n for n in BUG_NAMES if n not in DIRECTED_ONLY and n not in UNREACHED)
# ack_before_fsync is caught at once by the direct check of invariant 4 (acknowledged only when
# durable); without that check the loss must still surface end to end, after a node crash.
END_TO_END_BOUND = 500  # first hit: seed 35


def test_every_switch_has_a_bound() -> None:
    assert set(BOUNDS) | set(DIRECTED_ONLY) | set(UNREACHED) == set(BUG_NAMES)
    assert not set(BOUNDS) & set(DIRECTED_ONLY) and not set(BOUNDS) & set(UNREACHED)


def test_each_unreached_switch_has_directed_tests() -> None:
    guards = (Path(__file__).parents[1] / "unit" / "test_redundant_guards.py").read_text()
    for name in UNREACHED:
        assert f'ProtocolBugs.only("{name}")' in guards, name


@pytest.mark.parametrize("name", SEARCHED)
def test_random_search_catches(name: str) -> None:
    bound, _ = BOUNDS[name]
    hit = first_violation(range(bound), bugs=ProtocolBugs.only(name))
    assert hit is not None, f"{name}: no violation in {bound} seeds"
    seed, violation, trace = hit
    assert violation and trace
    again = run_seed(seed, bugs=ProtocolBugs.only(name))
    assert again.violation == violation  # the hit replays
    clean = run_seed(seed)
    assert clean.violation != violation  # and the switch caused it


def test_random_search_catches_unsynced_acks_end_to_end() -> None:
    hit = first_violation(range(END_TO_END_BOUND), bugs=ProtocolBugs.only("ack_before_fsync"), check_durable_ack=False)
    assert hit is not None
    assert "durable before acknowledged" not in hit[1]


# No time limit of explore's own, as in test_sim_exhaustive: a search found on an idle machine is
# found on a loaded one; the pytest timeout bounds a hang.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", [n for n in SEARCHED if BOUNDS[n][1] is not None])
def test_exhaustive_search_catches(name: str) -> None:
    worlds: dict[str, World] = {w.name: w for w in teeth_worlds()}
    world_name = BOUNDS[name][1]
    assert world_name is not None
    world = worlds[world_name]
    e = explore(world, bugs=ProtocolBugs.only(name), differential=True, time_limit=math.inf)
    assert e.violations, f"{name}: {world.name} searched {e.states} states ({e.complete=}) without a violation"


def test_teeth_worlds_are_searched_for_the_correct_protocol_too() -> None:
    """The worlds that catch the switches are among the small worlds searched clean in test_sim_exhaustive."""
    assert {BOUNDS[n][1] for n in SEARCHED} - {None} <= {w.name for w in small_worlds()}
