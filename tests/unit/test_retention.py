"""The retention decisions (qjm.client.retention): bounds, limits and refusals, without nodes."""

from __future__ import annotations

import pytest

from qjm.client.retention import PurgeRequest, check_bound, parse_age, purge_limit, requested_bound
from qjm.errors import ConfigError, PurgeRefusedError
from qjm.protocol.messages import RemoteEditLog
from qjm.testing.bugs import ProtocolBugs

SEGS = [RemoteEditLog(1, 50, False, 100.0), RemoteEditLog(51, 100, False, 200.0), RemoteEditLog(101, 150, False, 300.0)]
OPEN = RemoteEditLog(151, 160, True)


@pytest.mark.parametrize(("text", "seconds"), [("7d", 604800.0), ("12h", 43200.0), ("30m", 1800.0), ("90", 90.0)])
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "0d", "-1h", "7 fortnights", "d"])
def test_parse_age_refuses(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_age(text)


def test_requested_bound_per_criterion() -> None:
    assert requested_bound(PurgeRequest(before_txid=77), committed=160, segments=SEGS, now=0) == 77
    assert requested_bound(PurgeRequest(keep_txids=60), committed=160, segments=SEGS, now=0) == 101
    assert requested_bound(PurgeRequest(older_than=50), committed=160, segments=[*SEGS, OPEN], now=260) == 101
    # both criteria: only what both let go
    both = PurgeRequest(keep_txids=100, older_than=50)
    assert requested_bound(both, committed=160, segments=SEGS, now=400) == 61


def test_age_takes_the_youngest_copy_and_a_run_from_the_oldest() -> None:
    copies = [*SEGS, RemoteEditLog(1, 50, False, 0.0)]  # a node that does not know the age of 1-50
    assert requested_bound(PurgeRequest(older_than=1), committed=160, segments=copies, now=1000) == 1
    purged = [SEGS[1], SEGS[2]]  # 1-50 already purged: the run starts at 51
    assert requested_bound(PurgeRequest(older_than=1), committed=160, segments=purged, now=1000) == 151
    assert requested_bound(PurgeRequest(older_than=1), committed=160, segments=purged, now=250) == 101


def test_purge_limit_is_the_open_segment_and_the_floor() -> None:
    assert purge_limit(newest_segment=151, committed=160, min_retained_txids=0) == 151
    assert purge_limit(newest_segment=151, committed=160, min_retained_txids=30) == 131
    assert purge_limit(newest_segment=0, committed=160, min_retained_txids=0) == 161
    bugged = ProtocolBugs(purge_ignores_open_segment=True)
    assert purge_limit(newest_segment=151, committed=160, min_retained_txids=0, bugs=bugged) == 161
    bugged = ProtocolBugs(purge_ignores_retention_floor=True)
    assert purge_limit(newest_segment=151, committed=160, min_retained_txids=100, bugs=bugged) == 151


def test_check_bound_lowers_to_whole_segments_and_refuses_past_a_limit() -> None:
    kw = {"segments": [*SEGS, OPEN], "newest_segment": 151, "committed": 160}
    assert check_bound(120, min_retained_txids=60, **kw) == 101  # 101-150 stays whole
    with pytest.raises(PurgeRefusedError, match="open segment"):
        check_bound(152, min_retained_txids=0, **kw)
    with pytest.raises(PurgeRefusedError, match="retention floor"):
        check_bound(151, min_retained_txids=20, **kw)  # would remove 101-150, the floor is 141
