"""Catch-up on real nodes (design §4.4, Hadoop's JournalNodeSyncer): a node that was down while
segments were finalized copies them from its peers, byte for byte, and says so in its status and
metrics."""

from __future__ import annotations

import json
import urllib.request

import qjm
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.prometheus import scrape
from qjm.testing.util import eventually

INTERVAL = 0.3
DEADLINE = 60.0  # a few intervals, stretched for a loaded 2-core machine


def status(cluster: MiniJournalCluster, i: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{cluster.http_address(i)}/status?format=json", timeout=10) as r:
        st: dict[str, object] = json.loads(r.read())
    return st


def test_a_node_down_for_three_segments_holds_them_byte_identical_soon_after_it_returns(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with MiniJournalCluster(3, str(tmp_path / "c"), sync_interval=INTERVAL) as c:
        w = qjm.open_writer(c.uri, create=True)
        w.append_many(b"before-%d" % i for i in range(100))
        w.sync()
        w.roll()
        c.stop(2)
        for seg in range(3):
            w.append_many(b"seg%d-%d" % (seg, i) + bytes(500) for i in range(2000))
            w.sync()
            w.roll()
        # The writer goes before node 2 returns: none of its queued calls (a restarted node is waited
        # for) can reach node 2, so what node 2 gains, catch-up copied.
        w.close()
        missed = {n: b for n, b in c.finalized_segments(0).items() if n not in c.finalized_segments(2)}
        assert len(missed) >= 3, (sorted(c.finalized_segments(0)), sorted(c.finalized_segments(2)))
        c.start(2)
        eventually(
            lambda: all(c.finalized_segments(2).get(n) == b for n, b in missed.items()),
            timeout=DEADLINE,
            what="node 2 holds the segments it missed, byte for byte",
        )
        assert c.finalized_segments(2) == c.finalized_segments(0) == c.finalized_segments(1)
        sync = next(j for j in status(c, 2)["journals"] if j["journal_id"] == c.journal_id)["sync"]  # type: ignore[union-attr, index]
        assert sync["segments_downloaded"] >= 3 and sync["divergences"] == 0  # type: ignore[index]
        assert sync["bytes"] >= sum(len(b) for b in missed.values())  # type: ignore[index]
        m = scrape(c.http_address(2))
        label = f'{{journal="{c.journal_id}"}}'
        assert m[f"qjm_sync_segments_downloaded_total{label}"] >= 3
        assert m[f"qjm_sync_last_run_timestamp_seconds{label}"] > 0
