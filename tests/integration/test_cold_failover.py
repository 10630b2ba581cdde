"""A cold process's failover (its code imported, nothing else) loads no module on the way: every
import it needs happens with the client's own modules, before the takeover is timed; and a taking
over writer connects its first data links while it recovers (design §1.4)."""

from __future__ import annotations

import json
import subprocess
import sys

import qjm
from qjm.client.channel import RemoteLogger
from qjm.client.loggers import CallHooks
from qjm.client.manager import QuorumJournalManager
from qjm.client.writer import Writer
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import eventually, read_all

TAKEOVER = r"""
import json, sys
from qjm.client.writer import open_writer
before = set(sys.modules)
w = open_writer(sys.argv[1])
w.append(b"x" * 1024)
w.sync()
print(json.dumps({"imported": sorted(set(sys.modules) - before), "epoch": w.epoch}))
w.abort()
"""


def test_a_cold_takeover_imports_nothing_more(icluster: MiniJournalCluster) -> None:
    old = qjm.open_writer(icluster.uri, create=True)
    old.append(b"a")
    old.sync()  # the old writer holds an open segment with a committed record
    done = subprocess.run([sys.executable, "-c", TAKEOVER, icluster.uri], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["epoch"] > old.epoch
    assert out["imported"] == []
    old.abort()


class _LinksAtStart(CallHooks):
    """Records, as each node's start_log_segment is about to be sent, whether that node already
    holds a data-plane connection (waiting, bounded, for one to arrive)."""

    def __init__(self, cluster: MiniJournalCluster) -> None:
        self.servers = {}
        for n in cluster.nodes:
            assert n.inproc is not None
            self.servers[f"127.0.0.1:{n.rpc_port}"] = n.inproc.data_server
        self.connected: dict[str, bool] = {}

    def before(self, node: str, op: str) -> None:
        if op == "start_log_segment" and node not in self.connected:
            server = self.servers[node]
            try:
                eventually(lambda: server.connection_count() >= 1, timeout=10.0)
            except AssertionError:
                self.connected[node] = False
            else:
                self.connected[node] = True


def test_a_takeover_connects_the_data_links_while_it_recovers(icluster: MiniJournalCluster) -> None:
    """The first segment's links are connected during the recovery's last round, not inside the
    start (design §1.4): each node holds the new writer's connection before start_log_segment
    reaches it."""
    old = qjm.open_writer(icluster.uri, create=True)
    old.append(b"a")
    old.sync()
    old.close()
    hooks = _LinksAtStart(icluster)
    eventually(lambda: all(s.connection_count() == 0 for s in hooks.servers.values()), what="old links gone")
    w = qjm.open_writer(icluster.uri, hooks=hooks)
    try:
        assert hooks.connected == {name: True for name in hooks.servers}
        w.append(b"b")
        w.sync()
        assert all(s.connection_count() == 1 for s in hooks.servers.values())  # the early link is the one used
        assert all(not lg.out_of_sync for lg in w.qjm.loggers.loggers)
    finally:
        w.close()
    assert [r for _, r in read_all(icluster.uri)] == [b"a", b"b"]


def test_a_manager_that_recovers_and_closes_leaves_no_link_behind(icluster: MiniJournalCluster) -> None:
    """Links connected for a first segment that never starts are closed with the manager."""
    old = qjm.open_writer(icluster.uri, create=True)
    old.append(b"a")
    old.close()  # a finalized segment: the takeover's recovery has a finalize round
    servers = [n.inproc.data_server for n in icluster.nodes if n.inproc is not None]
    m = QuorumJournalManager(icluster.uri)
    try:
        m.recover_unfinalized_segments()
        eventually(lambda: all(s.connection_count() == 1 for s in servers), what="links connected while recovering")
    finally:
        m.close()
    eventually(lambda: all(s.connection_count() == 0 for s in servers), what="links closed with the manager")


def test_a_link_connected_early_that_ended_is_replaced_at_the_start(icluster: MiniJournalCluster) -> None:
    """A node may drop the connection made during recovery before the segment starts: the start
    connects again, and the node takes the segment's batches."""
    old = qjm.open_writer(icluster.uri, create=True)
    old.append(b"a")
    old.sync()
    old.close()
    m = QuorumJournalManager(icluster.uri)
    last = m.recover_unfinalized_segments()
    loggers = [lg for lg in m.loggers.loggers if isinstance(lg, RemoteLogger)]
    # a node outside every quorum so far connects once its reply (with its data address) is in
    eventually(lambda: all(lg._early is not None for lg in loggers), what="every node's link connecting")
    early = []
    for lg in loggers:
        assert lg._early is not None
        link = lg._early.result(timeout=30)
        link.close()  # as a node closing it would: the link has failed
        early.append(link)
    w = Writer(m, last)
    try:
        w.append(b"b")
        w.sync()
        assert all(lg.current_link is not None for lg in m.loggers.loggers if isinstance(lg, RemoteLogger))
        assert not any(
            lg.current_link is link for lg in m.loggers.loggers if isinstance(lg, RemoteLogger) for link in early
        )
        assert all(not lg.out_of_sync for lg in m.loggers.loggers)
    finally:
        w.close()
    assert [r for _, r in read_all(icluster.uri)] == [b"a", b"b"]
