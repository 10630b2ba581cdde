"""Process-level chaos (design §7.4): writers and JournalNodes SIGKILLed and SIGSTOPped, a TCP proxy
delaying, resetting and partitioning the control plane; then every acknowledged txid is verified."""

from __future__ import annotations

from pathlib import Path

import pytest

from qjm.testing.chaos import ChaosConfig, run_chaos

pytestmark = [pytest.mark.sim, pytest.mark.integration]


def test_bounded_chaos_run_loses_nothing(tmp_path: Path) -> None:
    rep = run_chaos(ChaosConfig(duration=60.0, seed=20261122, base_dir=str(tmp_path / "chaos")))
    c = rep.counts
    assert rep.ok, rep.summary()
    assert c["acked"] > 100
    assert c["verified"] == c["acked_claims"] >= c["acked"]
    assert c["final_txids"] >= c["acked"]
    assert c["writers_fenced"] >= 1 and c["takeovers"] >= 2
    assert c["node_kills"] >= 1 and c.get("writer_kills", 0) >= 1
    assert c["segments_compared"] >= 1 and c["segment_copies"] > c["segments_compared"]
