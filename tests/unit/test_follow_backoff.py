"""The follower's wait between rounds in which every node failed (qjm.client.follow.retry_delay)."""

from __future__ import annotations

from qjm.client.follow import retry_delay


def test_the_wait_doubles_from_10_ms_to_half_a_second() -> None:
    assert [retry_delay(n) for n in range(7)] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5]


def test_an_outage_of_any_length_keeps_the_wait_at_its_cap() -> None:
    # 2**1100 overflows a float: an uncapped exponent raised OverflowError in the follower's thread
    assert retry_delay(1100) == 0.5
    assert retry_delay(10**9) == 0.5
