"""``RemoteLoggerSet.sync_lane`` on both engines: the nodes' links are claimed once for a run of
one-call syncs, every node's state change and the writer's crash end the lane, the engine refuses a
batch a node has no room for, and the nodes' states learn the run's commits before the set does
anything else. The
nodes are socket pairs answering as a JournalNode's data plane would; the loggers are stand-ins
that count what the set asks of them. Synchronisation is by joins with a timeout, never by sleeping.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, cast

import pytest

from qjm._native import framing
from qjm.client.channel import RemoteLogger
from qjm.client.fanout_link import Engine
from qjm.client.loggers import WriterLife
from qjm.client.remote import RemoteLoggerSet
from qjm.config import QJMConfig
from qjm.protocol import wire
from qjm.testing.util import recv_exactly

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
BACKENDS = ["py"] if NO_EXTENSIONS else ["py", "native"]
WAIT = 10.0
ROOM = 4096


class _Link:
    """What a ``Delivery`` reads of a link: its acked txid and whether it failed."""

    def __init__(self, engine: Engine, link_id: int) -> None:
        self._engine = engine
        self._id = link_id
        self.failed: BaseException | None = None

    def acked_txid(self) -> int:
        return int(self._engine.fanout.acked(self._id))


class _Node:
    """A ``RemoteLogger`` as far as the set's one-call sync uses one; ``busy``: it has something to decide."""

    def __init__(self, name: str, engine: Engine, life: WriterLife) -> None:
        self.name = name
        self.native_acks = True
        self.life = life
        self.config = QJMConfig(queued_edits_limit_bytes=ROOM)
        mine, self.sock = socket.socketpair()
        self.mine = mine
        self.id = engine.fanout.add_link(mine, report_acks=False)
        self.link = _Link(engine, self.id)
        self.busy = False
        self.claims = 0
        self.noticed: list[int] = []
        self.committed: list[int] = []
        self.on_change: Callable[[], None] = lambda: None

    def watch(self, on_change: Callable[[], None]) -> None:
        self.on_change = on_change

    def quiet_link(self) -> tuple[int, _Link] | None:
        self.claims += 1
        return None if self.busy else (self.id, self.link)

    def commit_noticed(self, txid: int) -> None:
        self.noticed.append(txid)

    def set_committed_txid(self, txid: int) -> None:
        self.committed.append(txid)

    def announce_committed(self) -> None:
        pass

    def get_journal_state(self) -> Future[int]:
        fut: Future[int] = Future()
        fut.set_result(0)
        return fut


def frame(txid: int) -> bytes:
    return framing.encode_frame([b"x" * 100], epoch=1, segment_txid=1, first_txid=txid)


def answer(
    nodes: list[_Node], nbytes: int, txid: int, *, silent: frozenset[int] = frozenset()
) -> list[threading.Thread]:
    """Each node reads ``nbytes`` (a notice kept from the last commit and the batch) and acks ``txid``."""

    def run(node: _Node, ack: bool) -> None:
        recv_exactly(node.sock, nbytes)
        if ack:
            node.sock.sendall(wire.encode_ack(txid))

    threads = [threading.Thread(target=run, args=(n, i not in silent), daemon=True) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    return threads


def joined(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()


def nothing_sent(node: _Node) -> bool:
    node.sock.setblocking(False)
    try:
        node.sock.recv(1)
    except BlockingIOError:
        return True
    finally:
        node.sock.setblocking(True)
    return False


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    eng = Engine(
        importlib.import_module("qjm._native.fanout_c" if request.param == "native" else "qjm._native.fanout_py")
    )
    yield eng
    eng.close()


class Nodes:
    """A set over three stand-in nodes; ``sync`` runs one one-call sync with the nodes answering.

    A commit's notice reaches each node before the next batch (sent at once, or kept for the next
    send on a parked native link): either way a node reads it just ahead of that batch's bytes."""

    def __init__(self, engine: Engine) -> None:
        life = WriterLife()
        self.engine = engine
        self.nodes = [_Node(f"n{i}", engine, life) for i in range(3)]
        self.set = RemoteLoggerSet(cast(list[RemoteLogger], self.nodes), engine=lambda: engine)
        self.notice = b""  # the last commit's notice, not yet read by the nodes
        self.lane: Any = None

    def sync(self, txid: int, *, silent: frozenset[int] = frozenset(), timeout: float = WAIT) -> Any:
        fr = frame(txid)
        threads = answer(self.nodes, len(self.notice) + len(fr), txid, silent=silent)
        out = self.commit(fr, txid, timeout)
        joined(threads)
        self.notice = wire.encode_commit(1, txid) if out is not None and out[1] is None else b""
        return out

    def commit(self, fr: bytes, txid: int, timeout: float = WAIT) -> Any:
        """What the writer does with a lane: (acked, None) at a quorum, (acked, the batch's call)
        short of one, None when nothing was sent."""
        lane = self.lane
        if lane is None or lane.revoked:
            lane = self.lane = self.set.sync_lane()
            if lane is None:
                return None
        acked = lane.commit(fr, txid, 1, timeout)
        if acked < 0:
            return None
        if acked < lane.need:
            return acked, self.set.lane_call(lane, txid)
        return acked, None

    def read_notice(self) -> None:
        """Read the last commit's notice on every node, wherever the engine put it."""
        for n in self.nodes:
            n.sock.settimeout(WAIT)
            assert recv_exactly(n.sock, len(self.notice)) == self.notice
            n.sock.settimeout(None)
        self.notice = b""

    def claims(self) -> list[int]:
        return [n.claims for n in self.nodes]

    def close(self) -> None:
        for n in self.nodes:
            with contextlib.suppress(ValueError):  # a test removed it already
                self.engine.fanout.remove(n.id)
            n.mine.close()
            n.sock.close()


def test_a_run_of_syncs_claims_the_links_once_and_settles_the_nodes_on_the_next_other_call(engine: Engine) -> None:
    ns = Nodes(engine)
    for txid in range(1, 7):
        out = ns.sync(txid)
        assert out is not None and out[0] >= 2 and out[1] is None
        ns.set.set_committed_txid(txid)  # as the writer does after each commit: nothing for the nodes yet
    assert ns.claims() == [1, 1, 1]
    assert all(n.noticed == [] and n.committed == [] for n in ns.nodes)
    ns.set.call(lambda lg: lg.get_journal_state())  # a control call carries the committed txid
    assert all(n.noticed == [6] for n in ns.nodes)
    ns.set.announce_committed()
    ns.set.set_committed_txid(6)
    assert all(n.noticed == [6] and n.committed == [] for n in ns.nodes)  # told once
    ns.close()


def test_a_nodes_change_ends_the_claim_and_a_node_with_something_to_decide_gets_the_usual_way(engine: Engine) -> None:
    ns = Nodes(engine)
    assert ns.sync(1) is not None
    assert ns.sync(2) is not None
    assert ns.claims() == [1, 1, 1]
    ns.nodes[1].busy = True
    ns.nodes[1].on_change()  # e.g. it started a segment
    assert ns.commit(frame(3), 3) is None
    assert all(n.noticed == [2] for n in ns.nodes)  # settled before the nodes were asked again
    assert ns.claims() == [2, 2, 1]
    ns.nodes[1].busy = False
    ns.nodes[1].on_change()
    assert ns.sync(3) is not None
    assert ns.claims() == [3, 3, 2]
    assert ns.sync(4) is not None
    assert ns.claims() == [3, 3, 2]
    ns.close()


def test_a_node_without_room_or_a_link_gone_sends_nothing(engine: Engine) -> None:
    ns = Nodes(engine)
    assert ns.sync(1, silent=frozenset({2})) is not None  # node 2 reads it and never acks
    ns.read_notice()
    big = framing.encode_frame([b"y" * ROOM], epoch=1, segment_txid=1, first_txid=2)
    assert ns.commit(big, 2) is None  # past node 2's room
    assert nothing_sent(ns.nodes[0]) and nothing_sent(ns.nodes[1])  # not even the kept notice
    assert ns.claims() == [1, 1, 1]  # nothing changed: the claim stands, room is the engine's to check
    engine.fanout.remove(ns.nodes[0].id)
    assert ns.commit(frame(2), 2) is None
    assert ns.lane.revoked
    assert nothing_sent(ns.nodes[1])
    assert ns.commit(frame(2), 2) is None
    assert ns.claims() == [2, 2, 2]  # the link that left ended the lane: the nodes were asked again
    ns.close()


def test_short_of_a_quorum_the_batch_is_waited_on_over_the_links_claimed(engine: Engine) -> None:
    ns = Nodes(engine)
    assert ns.sync(1) is not None
    out = ns.sync(2, silent=frozenset({1, 2}), timeout=0.05)
    assert out is not None and out[0] == 1 and out[1] is not None
    ns.nodes[1].sock.sendall(wire.encode_ack(2))
    out[1].wait_for_write_quorum(WAIT, "journal(2-2)")  # counted from the claimed links' acks
    assert ns.claims() == [1, 1, 1]
    assert ns.sync(3) is not None  # the claim ended with the short wait: the nodes are asked again
    assert ns.claims() == [2, 2, 2]
    ns.close()


def test_the_writers_crash_ends_the_lane_and_gives_no_other(engine: Engine) -> None:
    ns = Nodes(engine)
    assert ns.sync(1) is not None
    lane = ns.lane
    ns.nodes[0].life.crash("test")
    assert lane.revoked
    assert ns.commit(frame(2), 2) is None
    assert ns.set.sync_lane() is None
    ns.close()


def test_a_change_between_the_claims_read_and_its_store_ends_the_lane(engine: Engine) -> None:
    ns = Nodes(engine)
    node = ns.nodes[2]
    inner = node.quiet_link

    def changing() -> tuple[int, _Link] | None:
        out = inner()
        node.on_change()  # another thread's change, after the revision was read, before the lane is stored
        return out

    node.quiet_link = changing  # type: ignore[method-assign]
    lane = ns.set.sync_lane()
    assert lane is not None and lane.revoked
    node.quiet_link = inner  # type: ignore[method-assign]
    assert ns.sync(1) is not None
    ns.close()


def test_a_lane_call_names_only_the_current_lane(engine: Engine) -> None:
    ns = Nodes(engine)
    assert ns.sync(1) is not None
    old = ns.lane
    ns.nodes[0].on_change()
    assert ns.sync(2) is not None
    assert ns.lane is not old
    with pytest.raises(ValueError, match="current lane"):
        ns.set.lane_call(old, 2)
    ns.close()
