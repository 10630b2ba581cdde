"""LinkBatch: a batch's quorum counted from the links' acks, with QuorumCall's rules.

The links are stand-ins with the two things LinkBatch reads (``acked_txid`` and ``failed``); the
news source is the pure engine's real counter, so a waiting thread is woken exactly as the writer
is. Synchronisation is by events and queues with timeouts, never by sleeping.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, cast

import pytest

from qjm._native.fanout_py import Fanout
from qjm.client.link_batch import Delivery, LinkBatch
from qjm.errors import FencedError, InvariantViolation, NodeUnavailableError, OutOfSyncError, QuorumError

WAIT = 10.0


class FakeLink:
    def __init__(self) -> None:
        self.acked = 0
        self.failed: BaseException | None = None

    def acked_txid(self) -> int:
        return self.acked


def delivered(link: FakeLink) -> Delivery:
    return Delivery(cast(Any, link))


def batch(news: Fanout, last: int, **deliveries: Delivery) -> LinkBatch:
    return LinkBatch(news, last, deliveries)


def in_thread(fn: Any) -> queue.Queue[object]:
    """Run ``fn`` in a thread; its result (or exception) lands in the returned queue."""
    out: queue.Queue[object] = queue.Queue()

    def run() -> None:
        try:
            out.put(fn())
        except BaseException as e:
            out.put(e)

    threading.Thread(target=run, daemon=True).start()
    return out


def test_a_majority_that_acked_the_last_txid_commits_it() -> None:
    news = Fanout()
    a, b, c = FakeLink(), FakeLink(), FakeLink()
    lb = batch(news, 10, a=delivered(a), b=delivered(b), c=delivered(c))
    a.acked = 10
    b.acked = 9  # not yet: an ack below the batch's last txid does not count
    assert lb.outcome() == ({"a": 10}, {})
    result = in_thread(lambda: lb.wait_for_write_quorum(WAIT, "journal(1-10)"))
    b.acked = 12  # cumulative: a later ack covers this batch too
    news.notify()
    assert result.get(timeout=WAIT) == {"a": 10, "b": 12}


def test_a_node_that_acked_then_failed_still_holds_the_batch() -> None:
    news = Fanout()
    a, b, c = FakeLink(), FakeLink(), FakeLink()
    a.acked, a.failed = 10, OutOfSyncError("a: data link closed")
    b.acked = 10
    c.failed = NodeUnavailableError("c: gone")
    lb = batch(news, 10, a=delivered(a), b=delivered(b), c=delivered(c))
    assert lb.wait_for_write_quorum(WAIT, "journal") == {"a": 10, "b": 10}
    with pytest.raises(QuorumError) as e:
        lb.wait_for_all(WAIT, "journal")
    assert set(e.value.causes) == {"c"}


def test_a_lost_majority_fails_at_once_with_every_cause() -> None:
    news = Fanout()
    a, b = FakeLink(), FakeLink()
    fenced = FencedError("b: fenced", request_epoch=1, promised_epoch=2)
    lb = batch(news, 5, a=delivered(a), b=delivered(b), c=Delivery(error=OutOfSyncError("c: out of sync")))
    result = in_thread(lambda: lb.wait_for_write_quorum(WAIT, "journal(1-5)"))
    b.failed = fenced
    news.notify()
    err = result.get(timeout=WAIT)
    assert isinstance(err, QuorumError)
    assert err.causes["b"] is fenced and isinstance(err.causes["c"], OutOfSyncError)
    assert err.successes == {}
    assert "0 of 3 nodes succeeded, 2 needed" in str(err)


def test_a_segment_still_starting_is_neither_lost_nor_counted_until_its_delivery_resolves() -> None:
    news = Fanout()
    a, b = FakeLink(), FakeLink()
    pending = Delivery()
    lb = batch(news, 7, a=delivered(a), b=delivered(b), c=pending)
    b.failed = NodeUnavailableError("b: gone")
    a.acked = 7
    assert lb.outcome() == ({"a": 7}, {"b": b.failed})
    result = in_thread(lambda: lb.wait_for_write_quorum(WAIT, "journal"))
    late = FakeLink()
    late.acked = 7
    pending.link = cast(Any, late)  # what RemoteLogger does once the start succeeded
    news.notify()
    assert result.get(timeout=WAIT) == {"a": 7, "c": 7}
    # ...and a start that failed loses the node for the batch.
    other = Delivery()
    lb2 = batch(news, 8, a=delivered(a), b=delivered(b), c=other)
    other.error = OutOfSyncError("c: start failed")
    with pytest.raises(QuorumError):
        lb2.wait_for_write_quorum(WAIT, "journal")


def test_an_invariant_violation_is_never_outvoted() -> None:
    news = Fanout()
    a, b, c = FakeLink(), FakeLink(), FakeLink()
    a.acked = b.acked = 3
    c.failed = InvariantViolation("c: committed txid moving backward")
    lb = batch(news, 3, a=delivered(a), b=delivered(b), c=delivered(c))
    with pytest.raises(InvariantViolation):
        lb.wait_for_write_quorum(WAIT, "journal")


def test_a_timeout_says_how_far_it_got_and_no_nodes_is_an_error() -> None:
    news = Fanout()
    a, b, c = FakeLink(), FakeLink(), FakeLink()
    a.acked = 4
    lb = batch(news, 4, a=delivered(a), b=delivered(b), c=delivered(c))
    with pytest.raises(QuorumError, match=r"timed out .* \(1 succeeded, 0 failed of 3\)") as e:
        lb.wait_for_write_quorum(0.05, "journal")
    assert e.value.successes == {"a": 4}
    with pytest.raises(QuorumError, match="no nodes"):
        batch(news, 1).wait_for_write_quorum(WAIT, "journal")


def test_a_pause_past_the_deadline_does_not_fail_a_batch_acked_right_after() -> None:
    """The waiting thread stopped for 100 s (the clock jumps) while two nodes were acking: the batch
    is committed, as QuorumCall's would be (the shared Deadline extends past a pause)."""
    news = Fanout()
    a, b, c = FakeLink(), FakeLink(), FakeLink()
    reads = [0]

    def clock() -> float:
        reads[0] += 1
        if reads[0] == 2:  # the first look at the deadline: the thread was stopped before it
            a.acked = b.acked = 6
            threading.Thread(target=news.notify, daemon=True).start()
            return time.monotonic() + 100.0
        return time.monotonic() + (100.0 if reads[0] > 2 else 0.0)

    lb = LinkBatch(news, 6, {"a": delivered(a), "b": delivered(b), "c": delivered(c)}, clock=clock)
    assert lb.wait_for_write_quorum(WAIT, "journal") == {"a": 6, "b": 6}
