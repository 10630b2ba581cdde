"""The data plane on both backends: the writer's fan-out engine, the node's receiver, and the
FanoutLink that plugs the engine into RemoteLogger. Synchronisation is by queues and events
(blocking gets with a timeout), never by sleeping.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

from qjm import errors
from qjm._native import framing
from qjm.client.fanout_link import Engine, FanoutLink
from qjm.client.quorum import majority
from qjm.errors import CorruptFrameError, FencedError, NodeTooFarBehindError, NodeUnavailableError, OutOfSyncError
from qjm.histogram import LATENCY_BUCKETS
from qjm.protocol import wire
from qjm.testing.util import recv_exactly

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
BACKENDS = ["py"] if NO_EXTENSIONS else ["py", "native"]
WAIT = 10.0
T = TypeVar("T")


@pytest.fixture(params=BACKENDS)
def fo(request: pytest.FixtureRequest) -> ModuleType:
    """The fanout module under test; a native module that fails to import fails the test."""
    return importlib.import_module("qjm._native.fanout_c" if request.param == "native" else "qjm._native.fanout_py")


def frame(first: int, n: int = 1, size: int = 10) -> bytes:
    return framing.encode_frame(
        [bytes([t % 256]) * size for t in range(first, first + n)], epoch=1, segment_txid=1, first_txid=first
    )


@dataclass
class Loop:
    """A Fanout whose loop runs in a thread; every report lands in ``events``."""

    fanout: Any
    events: queue.Queue[tuple[int, int, str, object]]
    thread: threading.Thread

    def next(self) -> tuple[int, int, str, object]:
        return self.events.get(timeout=WAIT)

    def until(self, link: int, pred: Callable[[tuple[int, int, str, object]], bool]) -> tuple[int, int, str, object]:
        while True:
            ev = self.next()
            if ev[0] == link and pred(ev):
                return ev


@contextlib.contextmanager
def running(f: Any) -> Iterator[Loop]:
    """``f`` with its loop running in a thread; stopped, joined and closed after."""
    events: queue.Queue[tuple[int, int, str, object]] = queue.Queue()
    t = threading.Thread(target=f.run, args=(lambda *a: events.put(a),), daemon=True)
    t.start()
    yield Loop(f, events, t)
    f.stop()
    t.join(WAIT)
    assert not t.is_alive()
    f.close()
    assert f.closed


@pytest.fixture
def loop(fo: ModuleType) -> Iterator[Loop]:
    with running(fo.Fanout()) as lp:
        yield lp


def acked_is(txid: int) -> Callable[[tuple[int, int, str, object]], bool]:
    return lambda e: e[1] == txid


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def hang_up(f: Any, link: int, *socks: socket.socket) -> None:
    """End a test's link the documented way: remove it from the engine, then close the sockets
    (closing a socket under a live link races the loop thread)."""
    f.remove(link)
    for s in socks:
        s.close()


# -- the engine --------------------------------------------------------------------------------


def test_send_delivers_prefix_then_frame_in_order(loop: Loop) -> None:
    f = loop.fanout
    mine, node = pair()
    link = f.add_link(mine)
    sent = []
    for t in range(1, 51):
        commit = wire.encode_commit(1, t - 1) if t % 5 == 0 else None
        fr = frame(t)
        assert f.send(link, fr, t, commit) == 0
        sent.append((commit or b"") + fr)
    want = b"".join(sent)
    assert recv_exactly(node, len(want)) == want
    assert f.inflight(link) == (50, sum(len(frame(t)) for t in range(1, 51)))
    hang_up(f, link, node, mine)


def test_cumulative_acks_are_reported_and_shrink_the_window(loop: Loop) -> None:
    f = loop.fanout
    mine, node = pair()
    link = f.add_link(mine)
    for t in range(1, 11):
        f.send(link, frame(t), t)
    node.sendall(wire.encode_ack(3))
    assert loop.until(link, lambda e: e[1] == 3) == (link, 3, "", None)
    assert f.inflight(link)[0] == 7
    node.sendall(wire.encode_ack(9)[:7])  # an ack split across reads
    node.sendall(wire.encode_ack(9)[7:] + wire.encode_ack(10))
    assert loop.until(link, lambda e: e[1] == 10)[2] == ""
    assert f.inflight(link) == (0, 0)
    assert f.acked(link) == 10
    node.sendall(wire.encode_ack(4))  # an older ack never moves it back
    node.sendall(wire.encode_ack(11))
    assert loop.until(link, lambda e: e[1] >= 11)[1] == 11
    hang_up(f, link, node, mine)


def test_error_reply_fails_the_link_after_its_durable_txid(loop: Loop) -> None:
    f = loop.fanout
    mine, node = pair()
    link = f.add_link(mine)
    for t in range(1, 6):
        f.send(link, frame(t), t)
    err = wire.encode_error("FENCED", "epoch 1 is below 2", 2)
    node.sendall(err)
    ev = loop.until(link, lambda e: e[2] != "")
    assert ev == (link, 2, "reply", err)
    assert f.send(link, frame(6), 6) == -1
    hang_up(f, link, node, mine)


@pytest.mark.parametrize(
    ("reply", "detail"),
    [
        (b"XXXXjunk", b"XXXX"),
        (struct.pack("<4sHHIq", b"QJME", 1, 0, 70000, 0), struct.pack("<4sHHIq", b"QJME", 1, 0, 70000, 0)),
    ],
)
def test_garbage_reply_fails_the_link(loop: Loop, reply: bytes, detail: bytes) -> None:
    f = loop.fanout
    mine, node = pair()
    link = f.add_link(mine)
    node.sendall(reply)
    assert loop.until(link, lambda e: e[2] != "") == (link, 0, "reply", detail)
    with pytest.raises(CorruptFrameError):
        wire.parse_reply(bytearray(detail))  # what FanoutLink makes of it
    hang_up(f, link, node, mine)


def test_peer_hangup_is_eof(loop: Loop) -> None:
    f = loop.fanout
    mine, node = pair()
    link = f.add_link(mine)
    node.close()
    assert loop.until(link, lambda e: e[2] != "") == (link, 0, "eof", None)
    hang_up(f, link, mine)


@pytest.mark.parametrize(("max_count", "max_bytes", "refused_at"), [(3, 1 << 40, 4), (100, 3 * len(frame(1)) + 1, 4)])
def test_window_full_refuses_and_fails_the_link(loop: Loop, max_count: int, max_bytes: int, refused_at: int) -> None:
    f = loop.fanout
    mine, node = pair()
    link = f.add_link(mine, max_count=max_count, max_bytes=max_bytes)
    for t in range(1, refused_at):
        assert f.send(link, frame(t), t) == 0
    assert f.send(link, frame(refused_at), refused_at) == 1
    assert loop.until(link, lambda e: e[2] != "") == (link, 0, "window", None)
    assert f.send(link, frame(refused_at + 1), refused_at + 1) == -1
    hang_up(f, link, node, mine)


def test_window_counts_only_unacked_frames(loop: Loop) -> None:
    f = loop.fanout
    mine, node = pair()
    link = f.add_link(mine, max_count=2)
    assert f.send(link, wire.encode_hello("j")) == 0  # not a frame: no window
    for t in range(1, 21):
        assert f.send(link, frame(t), t) == 0
        node.sendall(wire.encode_ack(t))
        loop.until(link, acked_is(t))
    assert f.inflight(link) == (0, 0)
    hang_up(f, link, node, mine)


def test_big_frames_to_a_slow_reader_arrive_whole_and_in_order(loop: Loop) -> None:
    """Megabytes queued past the socket buffer: the loop finishes the writes on EPOLLOUT."""
    f = loop.fanout
    mine, node = pair()
    link = f.add_link(mine)
    frames = [framing.encode_frame([os.urandom(300_000)], epoch=1, segment_txid=1, first_txid=t) for t in range(1, 21)]
    for t, fr in enumerate(frames, 1):
        assert f.send(link, fr, t) == 0
    want = b"".join(frames)
    # more than both socket buffers hold: send() left bytes queued for the loop
    assert len(want) > mine.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) + node.getsockopt(
        socket.SOL_SOCKET, socket.SO_RCVBUF
    )
    got = recv_exactly(node, len(want))
    assert got == want
    hang_up(f, link, node, mine)


def test_remove_stops_reports_and_unknown_links_are_refused(loop: Loop) -> None:
    f = loop.fanout
    a_mine, a_node = pair()
    b_mine, b_node = pair()
    a = f.add_link(a_mine)
    b = f.add_link(b_mine)
    f.send(a, frame(1), 1)
    f.remove(a)
    a_mine.close()
    ops: list[Callable[[], object]] = [
        lambda: f.send(a, frame(2), 2),
        lambda: f.acked(a),
        lambda: f.remove(a),
        lambda: f.inflight(12345),
    ]
    for op in ops:
        with pytest.raises(ValueError):
            op()
    b_node.sendall(wire.encode_ack(7))
    a_node.close()  # a removed link's peer hanging up is not reported
    assert loop.next() == (b, 7, "", None)
    assert loop.events.empty()
    hang_up(f, b, b_node, b_mine)


def test_quorum_txid_is_the_majority_acked_txid(loop: Loop) -> None:
    f = loop.fanout
    socks = [pair() for _ in range(5)]
    links = [f.add_link(m) for m, _ in socks]
    for link, (_, node), ack in zip(links, socks, [9, 4, 7, 0, 12], strict=True):
        if ack:
            node.sendall(wire.encode_ack(ack))
            loop.until(link, acked_is(ack))
    acks = [9, 4, 7, 0, 12]
    for k in range(1, 6):
        want = sorted(acks[:k], reverse=True)[majority(k) - 1]
        assert f.quorum_txid(links[:k]) == want
    assert f.quorum_txid([]) == 0
    for link, (m, n) in zip(links, socks, strict=True):
        hang_up(f, link, m, n)


def wait_acked(f: Any, link: int, txid: int) -> int:
    """Wait the documented way (news, then look, then wait on what was seen) until ``link`` acked ``txid``."""
    while True:
        seen = f.news()
        if f.acked(link) >= txid:
            return seen
        assert f.wait_news(seen, WAIT), f"no news within {WAIT}s; acked {f.acked(link)}"


def test_a_quiet_link_wakes_news_waiters_instead_of_reporting_acks(loop: Loop) -> None:
    f = loop.fanout
    quiet_mine, quiet_node = pair()
    loud_mine, loud_node = pair()
    quiet = f.add_link(quiet_mine, report_acks=False)
    loud = f.add_link(loud_mine)
    for t in range(1, 4):
        f.send(quiet, frame(t), t)
        f.send(loud, frame(t), t)
    before = f.news()
    quiet_node.sendall(wire.encode_ack(2))
    wait_acked(f, quiet, 2)
    assert f.news() > before
    assert f.inflight(quiet)[0] == 1  # the window still shrinks
    # The loud link's ack is reported; the quiet one's never was (events come in loop order).
    loud_node.sendall(wire.encode_ack(3))
    assert loop.next() == (loud, 3, "", None)
    assert loop.events.empty()
    # A quiet link's failure is still reported, with what it had acked, and is news too.
    recv_exactly(quiet_node, sum(len(frame(t)) for t in range(1, 4)))  # closing with unread bytes would reset
    seen = f.news()
    quiet_node.close()
    assert loop.until(quiet, lambda e: e[2] != "") == (quiet, 2, "eof", None)
    assert f.wait_news(seen, 0) is True
    hang_up(f, quiet, quiet_mine)
    hang_up(f, loud, loud_node, loud_mine)


def test_wait_news_times_out_returns_at_once_on_stale_counts_and_wakes_on_notify(fo: ModuleType) -> None:
    f = fo.Fanout()
    seen = f.news()
    assert f.wait_news(seen, 0.01) is False  # nothing happened: the timeout ends it
    assert f.wait_news(seen, 0) is False
    with pytest.raises(ValueError):
        f.wait_news(seen, float("nan"))
    woke: queue.Queue[bool] = queue.Queue()
    t = threading.Thread(target=lambda: woke.put(f.wait_news(seen, WAIT)))
    t.start()
    f.notify()
    assert woke.get(timeout=WAIT) is True
    t.join(WAIT)
    assert f.news() == seen + 1
    assert f.wait_news(seen, WAIT) is True  # news since the caller looked: no wait at all
    f.close()


def _nodes(f: Any, n: int = 3) -> tuple[list[int], list[socket.socket], list[socket.socket]]:
    pairs = [pair() for _ in range(n)]
    return [f.add_link(mine, report_acks=False) for mine, _ in pairs], [m for m, _ in pairs], [n for _, n in pairs]


def _hang_up_all(f: Any, links: list[int], mine: list[socket.socket], nodes: list[socket.socket]) -> None:
    for link, m, n in zip(links, mine, nodes, strict=True):
        hang_up(f, link, m, n)


def _answer(node: socket.socket, nbytes: int, ack: int | None) -> threading.Thread:
    """A node that reads ``nbytes`` (the batch), then acks ``ack`` (None: never)."""

    def run() -> None:
        recv_exactly(node, nbytes)
        if ack is not None:
            node.sendall(wire.encode_ack(ack))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _nothing_more(node: socket.socket) -> bool:
    node.setblocking(False)
    try:
        return node.recv(1) == b""
    except BlockingIOError:
        return True
    finally:
        node.setblocking(True)


def test_sync_batch_returns_at_the_quorum_and_sends_the_notice_on_every_link(loop: Loop) -> None:
    f = loop.fanout
    links, mine, nodes = _nodes(f)
    fr, notice = frame(1), wire.encode_commit(3, 1)
    answers = [_answer(n, len(fr), 1 if i < 2 else None) for i, n in enumerate(nodes)]
    assert f.sync_batch(links, fr, 1, 2, notice, WAIT) >= 2
    for t in answers:
        t.join(WAIT)
    for n in nodes:  # the node that never acked gets it too: it is still taking batches
        assert recv_exactly(n, len(notice)) == notice
    _hang_up_all(f, links, mine, nodes)


def test_sync_batch_short_of_a_quorum_times_out_and_sends_no_notice(loop: Loop) -> None:
    f = loop.fanout
    links, mine, nodes = _nodes(f)
    fr = frame(1)
    answers = [_answer(n, len(fr), 1 if i == 0 else None) for i, n in enumerate(nodes)]
    t0 = time.monotonic()
    assert f.sync_batch(links, fr, 1, 2, wire.encode_commit(3, 1), 0.2) == 1
    assert time.monotonic() - t0 >= 0.19
    for t in answers:
        t.join(WAIT)  # every node read the batch
    for n in nodes:
        assert _nothing_more(n)  # no notice: nothing was committed
    with pytest.raises(ValueError):
        f.sync_batch(links, frame(2), 2, 2, None, float("nan"))
    _hang_up_all(f, links, mine, nodes)


def test_sync_batch_ends_early_when_a_link_fails_or_on_notify(loop: Loop) -> None:
    f = loop.fanout
    links, mine, nodes = _nodes(f)
    fr = frame(1)
    first = _answer(nodes[0], len(fr), 1)

    def hang_up_node() -> None:
        recv_exactly(nodes[1], len(fr))
        nodes[1].close()

    threading.Thread(target=hang_up_node, daemon=True).start()
    t0 = time.monotonic()
    assert f.sync_batch(links, fr, 1, 2, None, WAIT) < 2
    assert time.monotonic() - t0 < WAIT / 2
    first.join(WAIT)
    # notify(): the caller's own state changed, so the wait ends for it to look (link 2 only here).
    recv_exactly(nodes[2], len(fr))
    timer = threading.Timer(0.1, f.notify)
    timer.start()
    t0 = time.monotonic()
    assert f.sync_batch(links[2:], frame(2), 2, 1, None, WAIT) == 0
    assert time.monotonic() - t0 < WAIT / 2
    timer.join()
    hang_up(f, links[0], mine[0], nodes[0])
    hang_up(f, links[1], mine[1])
    hang_up(f, links[2], mine[2], nodes[2])


def test_sync_batch_reads_its_own_acks_with_no_loop_running(fo: ModuleType) -> None:
    # The waiting thread reads the acks itself, so an ack wakes it and nothing else (no loop here).
    # With no loop to release the parked links, the native engine keeps the commit notice for each
    # link's next send; either way each node reads the notice before the next batch.
    f = fo.Fanout()
    links, mine, nodes = _nodes(f)
    fr, notice = frame(1), wire.encode_commit(3, 1)
    answers = [_answer(n, len(fr), 1 if i < 2 else None) for i, n in enumerate(nodes)]
    assert f.sync_batch(links, fr, 1, 2, notice, WAIT) == 2
    assert sorted(f.acked(link) for link in links) == [0, 1, 1]
    for t in answers:
        t.join(WAIT)
    fr2, notice2 = frame(2), wire.encode_commit(3, 2)
    answers = [_answer(n, len(notice) + len(fr2), 2) for n in nodes]
    assert f.sync_batch(links, fr2, 2, 3, notice2, WAIT) == 3
    for t in answers:
        t.join(WAIT)
    f.send(links[0], frame(3), 3)
    assert recv_exactly(nodes[0], len(notice2)) == notice2  # the second notice before the next batch
    _hang_up_all(f, links, mine, nodes)
    f.close()


def test_a_kept_notice_goes_ahead_of_the_next_send_in_order(fo: ModuleType) -> None:
    """A writer syncing batch after batch: the native engine keeps each sync_batch's commit notice on
    its parked links until they next send, and the node reads it just ahead of that send's bytes
    (the pure engine, which parks nothing, sends it at once: the same bytes in the same order)."""
    forever = PARKED_FOR_GOOD
    with running(fo.Fanout(park_seconds=forever, keep_notice_seconds=forever)) as lp:
        f = lp.fanout
        links, mine, nodes = _nodes(f)
        for t in (1, 2):  # the first parks the links, the second comes soon enough to keep its notice
            fr = frame(t)
            want = len(fr) + (len(wire.encode_commit(3, 1)) if t == 2 else 0)
            answers = [_answer(n, want, t) for n in nodes]
            assert f.sync_batch(links, fr, t, 3, wire.encode_commit(3, t), WAIT) == 3
            for a in answers:
                a.join(WAIT)
        if fo.__name__.endswith("fanout_c"):
            assert all(_nothing_more(n) for n in nodes)  # kept: not sent
        late = frame(3)
        for link, n in zip(links, nodes, strict=True):
            assert f.send(link, late, 3) == 0
            assert recv_exactly(n, len(late) + 24) == wire.encode_commit(3, 2) + late
        _hang_up_all(f, links, mine, nodes)


def test_a_notice_of_a_writer_syncing_now_and_then_goes_at_once(
    parked: tuple[Any, list[int], list[socket.socket]],
) -> None:
    """Its followers wait for it: a sync_batch that did not come within keep_notice_seconds (here
    the first, and a second after a pause) sends its notice at once, even on links parked for good."""
    f, links, nodes = parked
    for t in (1, 2):
        fr, notice = frame(t), wire.encode_commit(3, t)
        answers = [_answer(n, len(fr), t) for n in nodes]
        if t == 2:
            time.sleep(0.001)  # a pause past keep_notice_seconds (0.2 ms), not synchronisation
        assert f.sync_batch(links, fr, t, 3, notice, WAIT) == 3
        for a in answers:
            a.join(WAIT)
        for n in nodes:
            assert recv_exactly(n, len(notice)) == notice


def _wait_acked(f: Any, link: int, txid: int) -> None:
    deadline = time.monotonic() + WAIT
    while True:
        seen = f.news()
        if f.acked(link) >= txid:
            return
        assert time.monotonic() < deadline, f"link {link} never saw ack {txid}"
        f.wait_news(seen, deadline - time.monotonic())


def test_after_sync_batch_the_loop_reads_the_late_acks_again(loop: Loop) -> None:
    # While sync_batch waits the loop does not watch its links for input; it must again after
    # (on the native engine once the links have been parked idle for park_seconds).
    f = loop.fanout
    links, mine, nodes = _nodes(f)
    fr = frame(1)
    answers = [_answer(n, len(fr), 1 if i < 2 else None) for i, n in enumerate(nodes)]
    assert f.sync_batch(links, fr, 1, 2, None, WAIT) == 2
    for t in answers:
        t.join(WAIT)
    assert f.acked(links[2]) == 0
    nodes[2].sendall(wire.encode_ack(1))  # the slow node's ack, after the call returned
    _wait_acked(f, links[2], 1)
    late = frame(2)
    assert f.send(links[0], late, 2) == 0  # and a batch sent the usual way is acked through the loop
    assert recv_exactly(nodes[0], len(late)) == late
    nodes[0].sendall(wire.encode_ack(2))
    _wait_acked(f, links[0], 2)
    _hang_up_all(f, links, mine, nodes)


PARKED_FOR_GOOD = 3600.0  # longer than any test: only a send or a sync_batch releases a parked link


@pytest.fixture
def parked(fo: ModuleType) -> Iterator[tuple[Any, list[int], list[socket.socket]]]:
    """(engine, links, nodes): three links on an engine whose parked links stay parked for good,
    its loop running; hung up after the test."""
    with running(fo.Fanout(park_seconds=PARKED_FOR_GOOD)) as lp:
        links, mine, nodes = _nodes(lp.fanout)
        yield lp.fanout, links, nodes
        _hang_up_all(lp.fanout, links, mine, nodes)


def _sync_then_slowest_acks(f: Any, links: list[int], nodes: list[socket.socket]) -> None:
    """A sync_batch of txid 1 that nodes 0 and 1 ack; node 2 acks it once the call has returned."""
    fr = frame(1)
    answers = [_answer(n, len(fr), 1 if i < 2 else None) for i, n in enumerate(nodes)]
    assert f.sync_batch(links, fr, 1, 2, None, WAIT) == 2
    for t in answers:
        t.join(WAIT)
    nodes[2].sendall(wire.encode_ack(1))


def test_a_send_on_a_parked_link_gives_it_back_to_the_loop_at_once(
    parked: tuple[Any, list[int], list[socket.socket]],
) -> None:
    # At its quorum a sync_batch leaves its links parked: the slowest node's ack stays unread for
    # the next sync_batch. A batch sent the usual way must not wait for that: its acks come
    # through the loop, the one held back included.
    f, links, nodes = parked
    _sync_then_slowest_acks(f, links, nodes)
    late = frame(2)
    assert f.send(links[2], late, 2) == 0
    assert recv_exactly(nodes[2], len(late)) == late
    _wait_acked(f, links[2], 1)
    nodes[2].sendall(wire.encode_ack(2))
    _wait_acked(f, links[2], 2)


def test_a_sync_batch_short_of_its_quorum_leaves_its_links_to_the_loop(
    parked: tuple[Any, list[int], list[socket.socket]],
) -> None:
    # The caller then waits on the loop for the acks still to come: nothing may stay parked.
    f, links, nodes = parked
    fr = frame(1)
    answers = [_answer(n, len(fr), 1 if i == 0 else None) for i, n in enumerate(nodes)]
    assert f.sync_batch(links, fr, 1, 2, None, 0.2) == 1
    for t in answers:
        t.join(WAIT)
    nodes[1].sendall(wire.encode_ack(1))
    _wait_acked(f, links[1], 1)
    assert f.quorum_txid(links) == 1


def test_the_next_sync_batch_reads_the_ack_a_parked_link_held_back(
    parked: tuple[Any, list[int], list[socket.socket]],
) -> None:
    # The parked link's late ack and its next one are read by the next call: its quorum needs them.
    f, links, nodes = parked
    _sync_then_slowest_acks(f, links, nodes)
    fr2 = frame(2)
    answers = [_answer(n, len(fr2), 2 if i != 1 else None) for i, n in enumerate(nodes)]
    assert f.sync_batch(links, fr2, 2, 2, None, WAIT) == 2
    assert [f.acked(link) for link in links] == [2, 1, 2]
    for t in answers:
        t.join(WAIT)


def test_park_seconds_must_be_a_duration(fo: ModuleType) -> None:
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="park_seconds"):
            fo.Fanout(park_seconds=bad)
        with pytest.raises(ValueError, match="keep_notice_seconds"):
            fo.Fanout(keep_notice_seconds=bad)
    fo.Fanout(park_seconds=0).close()  # 0: never parked


def test_each_acked_frame_is_timed_once_from_its_send_to_its_ack(fo: ModuleType) -> None:
    """The per-node write latency with no Python per ack: counts per bound, taken and reset."""
    with running(fo.Fanout(latency_bounds=(1e-9, 3600.0))) as lp:
        f = lp.fanout
        mine, node = pair()
        link = f.add_link(mine)
        f.send(link, wire.encode_hello("j"))  # no last_txid: nothing to time
        started = time.monotonic()
        for t in range(1, 6):
            f.send(link, frame(t), t)
        node.sendall(wire.encode_ack(3))
        lp.until(link, acked_is(3))
        elapsed = time.monotonic() - started
        counts, seconds = f.take_latencies(link)
        # Three frames, each longer than 1 ns and shorter than an hour: the middle bucket.
        assert counts == [0, 3, 0]
        assert 0 < seconds <= 3 * elapsed
        assert f.take_latencies(link) == ([0, 0, 0], 0.0)  # taken: counted again from zero
        node.sendall(wire.encode_ack(5))
        lp.until(link, acked_is(5))
        assert f.take_latencies(link)[0] == [0, 2, 0]  # the two left, each once
        hang_up(f, link, node, mine)


def _one_acked_frame_counts(f: Any) -> list[int]:
    """The latency counts of one frame sent and acknowledged on a fresh link of ``f``."""
    with running(f) as lp:
        mine, node = pair()
        link = f.add_link(mine)
        f.send(link, frame(1), 1)
        node.sendall(wire.encode_ack(1))
        lp.until(link, acked_is(1))
        counts: list[int] = f.take_latencies(link)[0]
        hang_up(f, link, node, mine)
    return counts


def test_latencies_above_every_bound_land_in_the_last_count(fo: ModuleType) -> None:
    assert _one_acked_frame_counts(fo.Fanout(latency_bounds=(1e-9,))) == [0, 1]
    assert _one_acked_frame_counts(fo.Fanout()) == [1]  # no bounds: one count for every frame


def test_latency_bounds_must_be_ascending_durations(fo: ModuleType) -> None:
    for bad in ((0.0,), (-1.0,), (float("nan"),), (0.5, 0.5), (2.0, 1.0), tuple(float(i + 1) for i in range(33))):
        with pytest.raises(ValueError, match="latency_bounds"):
            fo.Fanout(latency_bounds=bad)
    fo.Fanout(latency_bounds=tuple(float(i + 1) for i in range(32))).close()


def test_a_refusal_that_sync_batch_reads_is_reported_by_the_loop(loop: Loop) -> None:
    f = loop.fanout
    links, mine, nodes = _nodes(f)
    fr = frame(1)
    refusal = wire.encode_error("FENCED", "epoch 3 is older than the promised 4", 0)

    def refuse() -> None:
        recv_exactly(nodes[1], len(fr))
        nodes[1].sendall(refusal)

    answers = [_answer(nodes[0], len(fr), 1), threading.Thread(target=refuse, daemon=True)]
    answers[1].start()
    assert f.sync_batch(links, fr, 1, 2, None, WAIT) < 2  # it ends at the refusal, not the timeout
    _, _, code, detail = loop.until(links[1], lambda e: e[2] != "")
    assert (code, detail) == ("reply", refusal)
    for t in answers:
        t.join(WAIT)
    _hang_up_all(f, links, mine, nodes)


def _notify_until_all_end(f: Any, out: queue.Queue[T], calls: int, t0: float) -> list[T]:
    """Call notify() until ``calls`` sync_batch calls have put their results in ``out``, within
    WAIT / 2 of ``t0``: a notify before a call began waiting is not news to it, so one is not enough."""
    ended: list[T] = []
    while len(ended) < calls:
        f.notify()
        try:
            ended.append(out.get(timeout=0.05))
        except queue.Empty:
            pass
        assert time.monotonic() - t0 < WAIT / 2
    return ended


def test_concurrent_sync_batches_each_see_their_quorum_and_notify(loop: Loop) -> None:
    # Writers sharing one engine: each call waits on its own links with a wake-up of its own.
    f = loop.fanout
    groups = [_nodes(f) for _ in range(3)]
    out: queue.Queue[tuple[int, int]] = queue.Queue()

    def sync(k: int, txid: int) -> None:
        out.put((k, f.sync_batch(groups[k][0], frame(txid), txid, 2, None, WAIT)))

    for txid in (1, 2, 3):  # every node acks: each call returns at its quorum
        answers = [_answer(n, len(frame(txid)), txid) for _, _, nodes in groups for n in nodes]
        callers = [threading.Thread(target=sync, args=(k, txid)) for k in range(len(groups))]
        for t in callers:
            t.start()
        got = sorted(out.get(timeout=WAIT) for _ in groups)
        assert [k for k, _ in got] == list(range(len(groups)))
        assert all(count >= 2 for _, count in got)
        for t in callers + answers:
            t.join(WAIT)
    # No node acks: each call ends when notify() says the writer's state changed, not at WAIT.
    t0 = time.monotonic()
    callers = [threading.Thread(target=sync, args=(k, 4)) for k in range(len(groups))]
    for t in callers:
        t.start()
    for _, _, nodes in groups:
        for n in nodes:
            recv_exactly(n, len(frame(4)))
    ended = _notify_until_all_end(f, out, len(groups), t0)
    assert sorted(ended) == [(k, 0) for k in range(len(groups))]
    for t in callers:
        t.join(WAIT)
    for links, mine, nodes in groups:
        _hang_up_all(f, links, mine, nodes)


def test_more_concurrent_sync_batches_than_wake_up_slots_still_end_on_notify(loop: Loop) -> None:
    # Past MAX_SYNCERS (64) a call has no eventfd of its own and looks again every few ms.
    f = loop.fanout
    groups = [_nodes(f, 1) for _ in range(70)]
    out: queue.Queue[int] = queue.Queue()
    callers = [
        threading.Thread(target=lambda g=g: out.put(f.sync_batch(g[0], frame(1), 1, 1, None, WAIT))) for g in groups
    ]
    t0 = time.monotonic()
    for t in callers:
        t.start()
    for _, _, nodes in groups:
        recv_exactly(nodes[0], len(frame(1)))
    ended = _notify_until_all_end(f, out, len(groups), t0)
    assert ended == [0] * len(groups)
    for t in callers:
        t.join(WAIT)
    for links, mine, nodes in groups:
        _hang_up_all(f, links, mine, nodes)


def test_sync_batch_leaves_no_descriptor_behind(fo: ModuleType) -> None:
    # The native engine keeps a call's eventfd for the next call (no more than one per call at
    # once): the count may grow by that one, and not again; close gives everything back.
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = fds()
    f = fo.Fanout()
    links, mine, nodes = _nodes(f)
    during = fds()
    for txid in range(1, 51):
        answers = [_answer(n, len(frame(txid)), txid) for n in nodes]
        assert f.sync_batch(links, frame(txid), txid, 2, None, WAIT) >= 2
        for t in answers:
            t.join(WAIT)
        assert during <= fds() <= during + 1
    _hang_up_all(f, links, mine, nodes)
    f.close()
    assert fds() == before


def test_sync_batch_with_an_unknown_link_sends_nothing(loop: Loop) -> None:
    f = loop.fanout
    links, mine, nodes = _nodes(f, 2)
    with pytest.raises(ValueError):
        f.sync_batch([links[0], 999_999, links[1]], frame(1), 1, 2, None, WAIT)
    for n in nodes:
        assert _nothing_more(n)
    _hang_up_all(f, links, mine, nodes)


def test_sync_batch_without_room_on_a_link_sends_nothing(fo: ModuleType) -> None:
    # room: the writer's queue limit. A link whose unacknowledged bytes a batch would take past it,
    # or whose window's frames are all in flight, makes the call send nothing and return -1.
    f = fo.Fanout()
    pairs = [pair() for _ in range(3)]
    links = [f.add_link(m, report_acks=False, max_count=2 if i == 2 else 64) for i, (m, _) in enumerate(pairs)]
    mine, nodes = [m for m, _ in pairs], [n for _, n in pairs]
    fr = frame(1)
    answers = [_answer(n, len(fr), 1 if i < 2 else None) for i, n in enumerate(nodes)]  # node 2 never acks
    assert f.sync_batch(links, fr, 1, 2, None, WAIT, len(fr)) == 2
    for t in answers:
        t.join(WAIT)
    assert f.inflight(links[2]) == (1, len(fr))
    assert f.sync_batch(links, frame(2), 2, 2, None, WAIT, 2 * len(fr) - 1) == -1  # 2 * len(fr) bytes > room
    for n in nodes:
        assert _nothing_more(n)
    assert f.inflight(links[0]) == (0, 0)
    answers = [_answer(n, len(fr), 2 if i < 2 else None) for i, n in enumerate(nodes)]
    assert f.sync_batch(links, frame(2), 2, 2, None, WAIT, 2 * len(fr)) == 2  # room for it: sent
    for t in answers:
        t.join(WAIT)
    assert f.inflight(links[2]) == (2, 2 * len(fr))
    # Node 2's window holds two frames, both in flight: no room, however many bytes are allowed.
    assert f.sync_batch(links, frame(3), 3, 2, None, WAIT, 1 << 40) == -1
    for n in nodes:
        assert _nothing_more(n)
    _hang_up_all(f, links, mine, nodes)
    f.close()


def _lane_engine(
    fo: ModuleType, n: int = 3, **link: Any
) -> tuple[Any, list[int], list[socket.socket], list[socket.socket]]:
    # No parking: each commit's notice leaves at once, so a node reads it right behind the batch.
    f = fo.Fanout(park_seconds=0, latency_bounds=LATENCY_BUCKETS)
    pairs = [pair() for _ in range(n)]
    links = [f.add_link(m, report_acks=False, **link) for m, _ in pairs]
    return f, links, [m for m, _ in pairs], [nd for _, nd in pairs]


def test_a_lane_commits_encodes_the_notice_and_times_each_commit(fo: ModuleType) -> None:
    f, links, mine, nodes = _lane_engine(fo)
    lane = f.lane(links, 2)
    assert (lane.links, lane.need, lane.revoked, lane.committed, lane.times()[0]) == (
        tuple(links),
        2,
        False,
        0,
        [0] * (len(LATENCY_BUCKETS) + 1),
    )
    notice_size = len(wire.encode_commit(0, 0))
    for txid in (1, 2):
        fr = frame(txid)
        answers = [_answer(nd, len(fr), txid) for nd in nodes]
        assert lane.commit(fr, txid, 7, WAIT) >= 2
        for t in answers:
            t.join(WAIT)
            assert not t.is_alive()
        for nd in nodes:  # the commit's notice, as the writer's own encoding would have it
            nd.settimeout(WAIT)
            assert recv_exactly(nd, notice_size) == wire.encode_commit(7, txid)
    assert (lane.committed, lane.revoked) == (2, False)
    counts, seconds = lane.times()
    assert len(counts) == len(LATENCY_BUCKETS) + 1 and sum(counts) == 2 and 0 < seconds < 2 * WAIT
    _hang_up_all(f, links, mine, nodes)
    f.close()


def test_a_lane_checks_its_links_and_quorum_when_made_and_a_revoked_one_sends_nothing(fo: ModuleType) -> None:
    f, links, mine, nodes = _lane_engine(fo)
    with pytest.raises(ValueError):
        f.lane([links[0], 999_999], 1)
    for need in (0, 4):
        with pytest.raises(ValueError, match="need"):
            f.lane(links, need)
    lane = f.lane(links, 2)
    lane.revoke()
    assert lane.commit(frame(1), 1, 1, WAIT) == -2
    assert all(_nothing_more(nd) for nd in nodes)
    _hang_up_all(f, links, mine, nodes)
    f.close()


def test_a_lane_with_a_link_gone_sends_nothing_and_ends(fo: ModuleType) -> None:
    f, links, mine, nodes = _lane_engine(fo)
    lane = f.lane(links, 2)
    hang_up(f, links[0], mine[0], nodes[0])
    assert lane.commit(frame(1), 1, 1, WAIT) == -2
    assert lane.revoked and sum(lane.times()[0]) == 0
    assert all(_nothing_more(nd) for nd in nodes[1:])
    _hang_up_all(f, links[1:], mine[1:], nodes[1:])
    f.close()


def test_a_lane_refuses_ids_past_a_commit_notices_fields_alike_and_sends_nothing(fo: ModuleType) -> None:
    f, links, mine, nodes = _lane_engine(fo)
    lane = f.lane(links, 2)
    for epoch, txid in ((1, 1 << 63), (-1, 1), (1 << 64, 1), (1, -1)):
        with pytest.raises(OverflowError):
            lane.commit(frame(1), txid, epoch, WAIT)
    assert not lane.revoked and all(_nothing_more(nd) for nd in nodes)
    _hang_up_all(f, links, mine, nodes)
    f.close()


def test_a_lane_short_of_a_quorum_ends_and_one_without_room_sends_nothing(fo: ModuleType) -> None:
    f, links, mine, nodes = _lane_engine(fo, max_count=1)
    lane = f.lane(links, 2, room=1 << 20)
    fr = frame(1)
    answers = [_answer(nd, len(fr), 1 if i == 0 else None) for i, nd in enumerate(nodes)]
    assert lane.commit(fr, 1, 1, 0.05) == 1  # one ack of the two needed: the wait ends at the timeout
    for t in answers:
        t.join(WAIT)
    assert lane.revoked and lane.committed == 0
    assert sum(lane.times()[0]) == 0
    assert all(_nothing_more(nd) for nd in nodes)  # no notice for a batch short of its quorum
    # Nodes 1 and 2 hold frame 1 unacknowledged in windows of one frame: a new lane has no room.
    lane = f.lane(links, 2, room=1 << 20)
    assert lane.commit(frame(2), 2, 1, WAIT) == -1
    assert not lane.revoked
    assert all(_nothing_more(nd) for nd in nodes)
    _hang_up_all(f, links, mine, nodes)
    f.close()


def test_run_twice_and_closed_engine(fo: ModuleType) -> None:
    f = fo.Fanout()
    started = threading.Event()

    def first_report(*a: object) -> None:
        started.set()

    mine, node = pair()
    link = f.add_link(mine)
    t = threading.Thread(target=f.run, args=(first_report,), daemon=True)
    t.start()
    node.sendall(wire.encode_ack(1))
    assert started.wait(WAIT)
    with pytest.raises(RuntimeError):
        f.run(lambda *a: None)
    with pytest.raises(RuntimeError):
        f.close()
    f.stop()
    t.join(WAIT)
    f.close()
    with pytest.raises(ValueError):
        f.send(link, frame(1), 1)
    with pytest.raises(ValueError):
        f.add_link(mine)
    mine.close()
    node.close()


def test_a_stop_before_run_makes_it_return_at_once(fo: ModuleType) -> None:
    """A thread told to run may start after the stop meant for it (a writer closed at once)."""
    f = fo.Fanout()
    f.stop()
    t = threading.Thread(target=f.run, args=(lambda *a: None,), daemon=True)
    t.start()
    t.join(WAIT)
    assert not t.is_alive()
    t = threading.Thread(target=f.run, args=(lambda *a: None,), daemon=True)
    t.start()  # the stop was honoured: this run ends only at the next one
    f.stop()
    t.join(WAIT)
    assert not t.is_alive()
    f.close()


def test_send_type_checks(fo: ModuleType) -> None:
    f = fo.Fanout()
    mine, node = pair()
    link = f.add_link(mine)
    for bad in (bytearray(b"x"), memoryview(b"x"), None, "x"):
        with pytest.raises(TypeError):
            f.send(link, bad, 1)
    with pytest.raises(TypeError):
        f.send(link, b"x", 1, bytearray(b"p"))
    f.close()
    mine.close()
    node.close()


# -- the receiver ------------------------------------------------------------------------------


def test_receiver_hello_runs_and_acks(fo: ModuleType) -> None:
    writer, mine = pair()
    rx = fo.Receiver(mine)
    frames = [frame(t, 3, 100) for t in (1, 4, 7)]
    stream = wire.encode_hello("journal-1") + frames[0] + wire.encode_commit(2, 3) + frames[1] + frames[2]

    def feed() -> None:
        for i in range(0, len(stream), 7):  # every message split across reads
            writer.sendall(stream[i : i + 7])
        writer.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=feed)
    t.start()
    assert rx.hello() == "journal-1"
    got_frames: list[bytes] = []
    got_commits: list[tuple[int, int]] = []
    while (run := rx.next_run()) is not None:
        got_frames += run[0]
        got_commits += run[1]
        assert run[0] or run[1]
    t.join(WAIT)
    assert got_frames == frames
    assert got_commits == [(2, 3)]
    rx.ack(9)
    assert recv_exactly(writer, 16) == wire.encode_ack(9)
    writer.close()
    mine.close()


def test_a_non_waiting_ack_never_blocks_and_the_rest_follows_in_order(fo: ModuleType) -> None:
    """The node acks under its journal's lock: a writer that reads no acks must not hold it."""
    writer, mine = pair()
    mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    rx = fo.Receiver(mine)

    def fill(first: int) -> list[int]:
        """Ack from ``first`` on until the socket, which the writer does not read, takes no more."""
        acks = [first]
        while rx.ack(acks[-1], False):
            acks.append(acks[-1] + 1)
            assert len(acks) < 1_000_000, "the socket never filled up"
        return acks  # the last refused whole or in part: kept for later

    acks = fill(1)
    sent = threading.Event()

    def flush() -> None:
        rx.flush()
        sent.set()

    t = threading.Thread(target=flush)
    t.start()
    assert not sent.wait(0.05), "flush returned with the socket full and the writer reading nothing"
    got = recv_exactly(writer, 16 * len(acks))
    t.join(WAIT)
    assert sent.is_set()
    assert got == b"".join(wire.encode_ack(i) for i in acks)
    rx.flush()  # nothing left: no wait
    # Without a flush between, acks left unsent pile up to four (64 bytes), then are refused.
    more = fill(acks[-1] + 1)
    kept = [more[-1] + 1 + i for i in range(3)]
    for t in kept:
        assert not rx.ack(t, False)
    with pytest.raises(RuntimeError, match="flush between runs"):
        rx.ack(kept[-1] + 1, False)
    t = threading.Thread(target=rx.flush)
    t.start()
    got = recv_exactly(writer, 16 * (len(more) + len(kept)))
    t.join(WAIT)
    assert got == b"".join(wire.encode_ack(i) for i in more + kept)  # nothing lost, in order
    acks = [kept[-1]]
    assert rx.ack(acks[-1] + 1, False)
    assert recv_exactly(writer, 16) == wire.encode_ack(acks[-1] + 1)
    # An ERROR message sent after an ack the socket refused goes after it.
    acks = fill(acks[-1] + 2)
    out: list[bytes] = []
    t = threading.Thread(target=lambda: out.append(recv_exactly(writer, 16 * len(acks) + 5)))
    t.start()
    rx.send(b"ERROR")
    t.join(WAIT)
    assert out == [b"".join(wire.encode_ack(i) for i in acks) + b"ERROR"]
    writer.close()
    mine.close()


def test_receiver_bad_hello_and_early_hangup(fo: ModuleType) -> None:
    writer, mine = pair()
    writer.sendall(b"QJMX\x01\x00\x01\x00j")
    with pytest.raises(CorruptFrameError) as ei:
        fo.Receiver(mine).hello()
    assert ei.value.reason == "wire"
    writer.close()
    mine.close()
    writer, mine = pair()
    writer.sendall(wire.encode_hello("abc")[:5])
    writer.close()
    assert fo.Receiver(mine).hello() is None
    mine.close()


def test_receiver_returns_good_messages_before_raising_on_bad_ones(fo: ModuleType) -> None:
    writer, mine = pair()
    rx = fo.Receiver(mine)
    good = frame(1, 2)
    corrupt = bytearray(frame(3))
    corrupt[20] ^= 1  # the header checksum no longer matches
    writer.sendall(wire.encode_hello("j") + good + bytes(corrupt))
    assert rx.hello() == "j"
    run = rx.next_run()
    while run is not None and run[0] == [] and run[1] == []:
        run = rx.next_run()
    assert run == ([good], [])
    with pytest.raises(CorruptFrameError) as ei:
        rx.next_run()
    assert ei.value.reason == "header_checksum"
    writer.sendall(b"")
    writer.close()
    mine.close()


def test_receiver_unknown_message_magic(fo: ModuleType) -> None:
    writer, mine = pair()
    rx = fo.Receiver(mine)
    writer.sendall(wire.encode_hello("j") + b"WHAT" + bytes(60))
    assert rx.hello() == "j"
    with pytest.raises(CorruptFrameError) as ei:
        rx.next_run()
    assert ei.value.reason == "magic"
    writer.close()
    mine.close()


def test_receiver_eof_mid_frame_ends_the_stream(fo: ModuleType) -> None:
    writer, mine = pair()
    rx = fo.Receiver(mine)
    writer.sendall(wire.encode_hello("j") + frame(1, 5, 1000)[:-10])
    writer.close()
    assert rx.hello() == "j"
    assert rx.next_run() is None
    mine.close()


# -- FanoutLink --------------------------------------------------------------------------------


class FakeNode:
    """A data-plane listener on loopback whose replies the test scripts."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.conn: socket.socket | None = None
        self.accepted = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            self.conn, _ = self.server.accept()
        except OSError:  # closed by a test that never connected: on a loaded machine close may come first
            return
        self.accepted.set()

    def sock(self) -> socket.socket:
        assert self.accepted.wait(WAIT) and self.conn is not None
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.close()


@pytest.fixture
def engine(fo: ModuleType) -> Iterator[Engine]:
    e = Engine(fo)
    yield e
    e.close()


def open_link(engine: Engine, node: FakeNode, **kw: int) -> tuple[FanoutLink, queue.Queue[BaseException]]:
    failures: queue.Queue[BaseException] = queue.Queue()
    link = FanoutLink("n1", node.address, "jid", WAIT, on_fail=lambda lk, e: failures.put(e), engine=engine, **kw)
    return link, failures


def test_link_completes_futures_on_cumulative_acks(engine: Engine) -> None:
    node = FakeNode()
    link, failures = open_link(engine, node)
    sock = node.sock()
    assert recv_exactly(sock, len(wire.encode_hello("jid"))) == wire.encode_hello("jid")
    futs: list[Future[int]] = [Future() for _ in range(5)]
    for t, fut in enumerate(futs, 1):
        link.send(frame(t), t, fut, (1, t - 1) if t == 3 else None)
    assert link.unacked_bytes() == sum(len(frame(t)) for t in range(1, 6))
    sock.sendall(wire.encode_ack(3))
    assert [f.result(WAIT) for f in futs[:3]] == [3, 3, 3]
    assert not futs[3].done()
    sock.sendall(wire.encode_ack(5))
    assert futs[4].result(WAIT) == 5
    assert link.unacked_bytes() == 0
    link.close()
    assert isinstance(failures.get(timeout=WAIT), OutOfSyncError)  # closed on purpose: reported, ignored upstream
    assert link.closed
    node.close()


def test_a_link_hands_its_ack_latencies_over_when_folded_and_when_it_leaves(engine: Engine) -> None:
    node = FakeNode()
    got: queue.Queue[tuple[list[int], float]] = queue.Queue()
    link = FanoutLink("n1", node.address, "jid", WAIT, on_fail=lambda lk, e: None, engine=engine,
                      on_latencies=lambda counts, seconds: got.put((counts, seconds)))  # fmt: skip
    sock = node.sock()
    futs: list[Future[int]] = [Future() for _ in range(4)]
    for t, fut in enumerate(futs, 1):
        link.send(frame(t), t, fut, None)
    sock.sendall(wire.encode_ack(2))
    assert futs[1].result(WAIT) == 2
    link.fold_latencies()
    counts, seconds = got.get(timeout=WAIT)
    assert sum(counts) == 2 and seconds > 0 and len(counts) == len(LATENCY_BUCKETS) + 1
    sock.sendall(wire.encode_ack(4))
    assert futs[3].result(WAIT) == 4
    link.close()  # the two acked since the fold come with the link's leaving
    assert sum(got.get(timeout=WAIT)[0]) == 2
    link.fold_latencies()  # gone from the engine: nothing more
    assert got.empty()
    node.close()


def test_link_node_error_becomes_its_typed_error(engine: Engine) -> None:
    node = FakeNode()
    link, failures = open_link(engine, node)
    sock = node.sock()
    futs: list[Future[int]] = [Future() for _ in range(3)]
    for t, fut in enumerate(futs, 1):
        link.send(frame(t), t, fut, None)
    sock.sendall(wire.encode_error(FencedError.code, "fenced by epoch 9", 1))
    assert futs[0].result(WAIT) == 1
    for fut in futs[1:]:
        assert isinstance(fut.exception(WAIT), FencedError)
    e = failures.get(timeout=WAIT)
    assert isinstance(e, FencedError) and link.failed is e
    late: Future[int] = Future()
    link.send(frame(4), 4, late, None)
    assert late.exception(0) is e
    node.close()


def test_link_window_overflow_is_node_too_far_behind(engine: Engine) -> None:
    node = FakeNode()
    link, failures = open_link(engine, node, max_count=2)
    futs: list[Future[int]] = [Future() for _ in range(3)]
    for t, fut in enumerate(futs, 1):
        link.send(frame(t), t, fut, None)
    assert isinstance(failures.get(timeout=WAIT), NodeTooFarBehindError)
    assert all(isinstance(f.exception(WAIT), NodeTooFarBehindError) for f in futs)
    node.close()


def test_link_node_hangup_is_unavailable(engine: Engine) -> None:
    node = FakeNode()
    link, failures = open_link(engine, node)
    fut: Future[int] = Future()
    link.send(frame(1), 1, fut, None)
    node.sock().close()
    assert isinstance(failures.get(timeout=WAIT), NodeUnavailableError)
    assert isinstance(fut.exception(WAIT), NodeUnavailableError)
    node.close()


def test_link_connect_refused_is_oserror(engine: Engine) -> None:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(OSError):
        FanoutLink("n", f"127.0.0.1:{port}", "j", WAIT, on_fail=lambda lk, e: None, engine=engine)


def test_error_codes_round_trip_through_the_link(engine: Engine) -> None:
    """Every error type a node may send comes back as the same type."""
    for cls in (
        errors.FencedError,
        errors.OutOfOrderError,
        errors.OutOfSyncError,
        errors.StorageError,
        errors.CorruptFrameError,
    ):
        node = FakeNode()
        _, failures = open_link(engine, node)
        node.sock().sendall(wire.encode_error(cls.code, "x", 0))
        assert type(failures.get(timeout=WAIT)) is cls
        node.close()


def test_writer_links_follow_the_backend_switch(tmp_path: Path) -> None:
    """RemoteLogger opens a FanoutLink on the native backend and a ThreadedLink on the pure one."""
    import qjm
    from qjm._native import backend_of
    from qjm.client.channel import RemoteLogger
    from qjm.client.threaded_link import ThreadedLink
    from qjm.testing.minicluster import MiniJournalCluster

    with MiniJournalCluster(3, str(tmp_path), in_process=True) as c:
        w = qjm.open_writer(c.uri, create=True)
        for i in range(100):
            w.append(b"r%d" % i)
        assert w.sync() == 100
        # sync returns once a majority acked: the third node's link may still be opening.
        links = [lg._link for lg in w.qjm.loggers.loggers if isinstance(lg, RemoteLogger) and lg._link is not None]
        assert len(links) >= 2
        want = FanoutLink if backend_of("fanout") == "native" else ThreadedLink
        assert [type(link) for link in links] == [want] * len(links)
        w.close()
        r = qjm.open_reader(c.uri)
        assert [t for t, _ in r] == list(range(1, 101))
        r.qjm.close()
