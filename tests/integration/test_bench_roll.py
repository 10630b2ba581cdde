"""``qjm bench``'s roll variant on a real cluster: pairs of phases with and without the writer's
own rolls, each rolling phase one whole roll period, the pairs alternating which half runs first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qjm.bench import workers
from qjm.bench.workload import SMOKE, roll_every
from qjm.client.writer import Writer, open_writer
from qjm.testing.minicluster import MiniJournalCluster


def test_each_rolling_phase_holds_one_roll_and_the_pairs_alternate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    intervals: list[float | None] = []

    def recording_open_writer(uri: str, **kw: Any) -> Writer:
        intervals.append(kw.get("roll_interval"))
        return open_writer(uri, **kw)

    monkeypatch.setattr(workers, "open_writer", recording_open_writer)
    cfg = dict(SMOKE, roll_pairs=3)
    every = roll_every(cfg)
    out: dict[str, Any] = {}
    with MiniJournalCluster(3, str(tmp_path)) as c:
        w = workers.roll_variant(c.uri, open_writer(c.uri, create=True), cfg, out)
        w.append(b"after the variant")
        last = w.sync()
        w.close()
        assert last > 0
    assert intervals == [0.0, every, every, 0.0, 0.0, every, None]  # the last: the defaults again
    assert out["rolls"] == 3  # one in each rolling phase, none in the others
    assert len(out["tput_roll"]) == len(out["tput_noroll"]) == 3
    assert all(r > 0 for r in out["tput_roll"] + out["tput_noroll"])
    assert out["roll_every"] == every and out["roll_in_sync"] in (2, 3) and out["roll_nodes"] == 3
