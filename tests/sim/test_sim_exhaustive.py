"""Exhaustive search on the simulator: Hadoop's double-failure sweep and small-world model checking."""

from __future__ import annotations

import math

import pytest

from qjm.testing.exhaustive import ExploreChooser, double_failure_sweep, explore, small_worlds

pytestmark = pytest.mark.sim


def test_double_failure_sweep_loses_nothing_acknowledged() -> None:
    """Every pair (i-th call to one node, j-th to another) lost or its reply lost: recovery keeps all."""
    r = double_failure_sweep()
    assert min(r.calls_per_node.values()) >= 8  # format, fencing, two segments: the bounds were learnt
    n = r.calls_per_node
    pairs = n[0] * n[1] + n[0] * n[2] + n[1] * n[2]
    assert r.runs == 1 + 4 * pairs  # every pair, with both fault kinds on both sides
    assert r.acked_txids > r.runs  # most runs still acknowledge writes
    assert r.ok, "\n".join(f"faults {plan}: {res.violation}" for plan, res in r.violations[:5])


WORLDS = {w.name: w for w in small_worlds()}


# CPU-bound, one parametrized case per world so that the suite's xdist workers share the worlds:
# 30-65 s each on one CPU of an idle machine, several times that on a loaded one. No time limit
# of explore's own: whether a search completes must not depend on how busy the machine is (a
# search is deterministic); the pytest timeout bounds a hang.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", list(WORLDS))
def test_small_worlds_are_searched_completely_without_violations(name: str) -> None:
    w = WORLDS[name]
    e = explore(w, time_limit=math.inf)
    assert e.ok, f"{w.name}: {e.violations[0][1].violation}\n" + "\n".join(e.violations[0][1].trace[-25:])
    assert e.complete, f"{w.name}: the bounded search did not finish ({e.states} states, {e.seconds:.0f}s)"
    assert e.states > 1000


def test_a_state_is_pruned_only_when_reached_before_with_as_much_left() -> None:
    seen: dict[bytes, list[tuple[int, int]]] = {}

    def visit(budget: int, delays: int) -> bool:
        return ExploreChooser([], seen, budget, frozenset(), delays).at_state(lambda: ("the same state",))

    assert visit(1, 1)  # new
    assert not visit(1, 1) and not visit(0, 1) and not visit(1, 0) and not visit(0, 0)
    assert visit(2, 0) and visit(0, 2)  # more faults, or more delays, left than any visit had
    assert not visit(2, 0) and not visit(0, 2) and not visit(1, 1)
    assert visit(2, 1)  # beyond every visit so far: it replaces the ones it covers
    assert list(seen.values()) == [[(0, 2), (2, 1)]]
    assert not visit(2, 1) and not visit(1, 1) and not visit(0, 2)
    assert visit(0, 3)
