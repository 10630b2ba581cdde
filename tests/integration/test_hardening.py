"""A JournalNode no client can wedge: bad hints, bad epochs, failed opens and failed starts, on real nodes."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import qjm
from qjm.client.loggers import CallHooks
from qjm.client.manager import QuorumJournalManager
from qjm.errors import NodeUnavailableError, StorageError
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol.rpcmeta import ERROR_CODE_KEY, GRPC_OPTIONS, make_stub, rpc_code
from qjm.server.node import JournalNode
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.ports import free_port
from qjm.testing.util import ScriptedWriter, eventually, txn_data


def error_code(e: grpc.RpcError) -> str:
    return dict(e.trailing_metadata() or ()).get(ERROR_CODE_KEY, "")  # type: ignore[attr-defined]


def node_status(address: str, journal_id: str) -> dict[str, object]:
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as ch:
        reply = make_stub(ch).Status(pb.JournalIdRequest(journal_id=journal_id), timeout=10)
    return dict(json.loads(reply.json))


@pytest.fixture
def single_node(tmp_path) -> Iterator[JournalNode]:  # type: ignore[no-untyped-def]
    node = JournalNode(str(tmp_path / "jn")).start()
    yield node
    node.stop(0)


# -- item 3: a committed txid is a hint ------------------------------------------------------


def test_one_nodes_bad_committed_txid_never_blocks_a_takeover(cluster: MiniJournalCluster) -> None:
    """Node 2's committed txid is set far past its log (a bare decimal, then garbage, then a request
    carrying 2**62): every takeover recovers, and every synced record is read back."""
    expected: list[int] = []
    txid = 0

    def takeover_and_write() -> None:
        nonlocal txid
        w = qjm.open_writer(cluster.uri, create=not expected)
        for _ in range(3):
            txid = w.append(txn_data(txid + 1))
            expected.append(txid)
        w.sync()
        w.abort()  # crash: the next writer must recover the open segment

    takeover_and_write()
    committed_file = os.path.join(cluster.journal_dir(2), "committed-txid")
    cluster.stop(2)
    with open(committed_file, "wb") as f:
        f.write(b"%d\n" % 2**62)
    cluster.start(2)
    for _ in range(4):
        takeover_and_write()
    assert int(str(node_status(cluster.addresses[2], cluster.journal_id)["committed_hints_dropped"])) >= 1
    cluster.stop(2)
    with open(committed_file, "r+b") as f:  # damage both checksummed slots
        f.write(b"\xff" * 64)
        f.seek(4096)
        f.write(b"\xff" * 64)
    cluster.start(2)
    for _ in range(2):
        takeover_and_write()
    # any client with the current epoch sends a request carrying a huge committed txid
    w = qjm.open_writer(cluster.uri)
    txid = w.append(txn_data(txid + 1))
    expected.append(txid)
    w.sync()
    with grpc.insecure_channel(cluster.addresses[2], options=GRPC_OPTIONS) as ch:
        req = pb.RequestInfoProto(journal_id=cluster.journal_id, epoch=w.epoch, serial=10**9, committed_txid=2**62)
        make_stub(ch).PurgeLogs(pb.PurgeLogsRequest(req=req, min_txid_to_keep=0), timeout=10)
    w.abort()
    assert int(str(node_status(cluster.addresses[2], cluster.journal_id)["committed_txid"])) <= txid
    for _ in range(2):
        takeover_and_write()
    w = qjm.open_writer(cluster.uri)
    w.close()
    r = qjm.open_reader(cluster.uri)
    assert list(r) == [(t, txn_data(t)) for t in expected]
    r.qjm.close()


# -- item 4: a failed open keeps no lock -----------------------------------------------------


def test_a_journal_that_failed_to_open_works_once_repaired(single_node: JournalNode) -> None:
    uri = f"qjournal://{single_node.rpc_address}/j"
    w = qjm.open_writer(uri, create=True)
    w.append(b"one")
    w.close()
    version = os.path.join(single_node.data_dir, "j", "current", "VERSION")
    good = Path(version).read_bytes()
    single_node.stop(0)
    with open(version, "wb") as f:
        f.write(b"namespaceID=not-a-number\n")
    node = JournalNode(single_node.data_dir).start()
    try:
        with grpc.insecure_channel(node.rpc_address, options=GRPC_OPTIONS) as ch:
            stub = make_stub(ch)
            for _ in range(2):
                with pytest.raises(grpc.RpcError) as ei:
                    stub.GetJournalState(pb.JournalIdRequest(journal_id="j"), timeout=10)
                assert error_code(ei.value) == StorageError.code
                assert "unreadable VERSION" in str(ei.value.details())  # type: ignore[attr-defined]
            with open(version, "wb") as f:
                f.write(good)
            assert stub.GetJournalState(pb.JournalIdRequest(journal_id="j"), timeout=10).last_writer_epoch == 1
        w = qjm.open_writer(f"qjournal://{node.rpc_address}/j")
        w.append(b"two")
        w.close()
    finally:
        node.stop(0)


# -- item 5: epochs past the signed 64-bit range ---------------------------------------------


def test_epochs_past_the_signed_range_are_refused_typed(
    single_node: JournalNode, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"qjournal://{single_node.rpc_address}/j"
    qjm.open_writer(uri, create=True).close()
    version = dict(
        line.split("=", 1) for line in Path(single_node.data_dir, "j", "current", "VERSION").read_text().split()
    )
    ns = pb.NamespaceInfoProto(namespace_id=int(version["namespaceID"]), cluster_id=version["clusterID"])
    caplog.set_level(logging.ERROR, logger="qjm")
    with grpc.insecure_channel(single_node.rpc_address, options=GRPC_OPTIONS) as ch:
        stub = make_stub(ch)
        for epoch in (2**63, 2**64 - 1):
            with pytest.raises(grpc.RpcError) as ei:
                stub.NewEpoch(pb.NewEpochRequest(journal_id="j", ns=ns, epoch=epoch), timeout=10)
            assert error_code(ei.value) == "EPOCH" and "out of range" in str(ei.value.details())  # type: ignore[attr-defined]
            req = pb.RequestInfoProto(journal_id="j", epoch=epoch, serial=1, committed_txid=-1)
            with pytest.raises(grpc.RpcError) as ei:
                stub.StartLogSegment(pb.StartLogSegmentRequest(req=req, txid=2), timeout=10)
            assert error_code(ei.value) == "EPOCH"
            assert rpc_code(ei.value) != grpc.StatusCode.INTERNAL
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    w = qjm.open_writer(uri)  # nothing was persisted: the next writer gets epoch 2
    assert w.epoch == 2
    w.close()


# -- item 7: a failed start releases what it took --------------------------------------------


def test_a_node_that_fails_to_start_releases_its_ports_and_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    rpc_port = free_port()
    try:
        # The error is kept (as a caller that logs it would): what the failed node took must be
        # released by the failure itself, not by garbage collection of the half-built node.
        with pytest.raises(OSError) as failed:
            JournalNode(str(tmp_path / "jn"), rpc_port=rpc_port, data_port=taken.getsockname()[1])
        with socket.socket() as probe:  # the control port is free again
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", rpc_port))
            probe.listen()
        assert failed.value is not None
    finally:
        taken.close()
    node = JournalNode(str(tmp_path / "jn"), rpc_port=rpc_port).start()  # and the directory's lock
    node.stop(0)


def test_a_second_node_on_a_data_directory_refuses_to_start(single_node: JournalNode) -> None:
    with pytest.raises(StorageError, match="in use by another JournalNode"):
        JournalNode(single_node.data_dir)


# -- item 9: restarting a segment that holds only an older epoch's frames ---------------------


class _Fail(CallHooks):
    """Fails the named operations to one node before they are sent."""

    def __init__(self, node: str, ops: set[str]) -> None:
        self.node = node
        self.ops = ops

    def before(self, node: str, op: str) -> None:
        if node == self.node and op in self.ops:
            raise NodeUnavailableError(f"{node}: {op} failed on purpose")


def writing_segment_1(cluster: MiniJournalCluster) -> ScriptedWriter:
    """A formatted journal whose epoch-1 writer has txids 1-3 of segment 1 on every node."""
    with QuorumJournalManager(cluster.uri) as m:
        m.format()
    w = ScriptedWriter(cluster.uri)
    w.recover()
    w.start(1)
    w.write(1, 3, wait_all=True)
    return w


def test_a_writer_restarts_a_segment_holding_an_uncommitted_older_frame(cluster: MiniJournalCluster) -> None:
    """Hadoop's testNewerVersionOfSegmentWins2 shape: node 0 alone holds txid 4 of epoch 1 in an
    open segment 4; the epoch-2 writer recovers without node 0 (to txid 3) and starts segment 4 on
    all three. Node 0 moves its stale copy aside and takes the segment, so with node 2 down the
    writer still has a quorum."""
    w1 = writing_segment_1(cluster)
    w1.finalize(1, 3)
    w1.start(4)
    cluster.kill(1)
    cluster.kill(2)
    with pytest.raises(qjm.QuorumError):
        w1.write(4, 4)
    eventually(lambda: node_status(cluster.addresses[0], cluster.journal_id)["highest_written_txid"] == 4)
    w1.close(grace=0)
    cluster.start(1)
    cluster.start(2)
    w2 = ScriptedWriter(
        cluster.uri, hooks=_Fail(cluster.name(0), {"get_journal_state", "new_epoch", "prepare_recovery"})
    )
    assert w2.recover() == 3
    w2.start(4)
    cluster.kill(2)
    w2.write(4, 6)
    w2.finalize(4, 6)
    w2.close()
    aside = [n for n in os.listdir(cluster.journal_dir(0)) if ".superseded-epoch1" in n]
    assert aside, os.listdir(cluster.journal_dir(0))  # kept, never deleted
    cluster.start(2)
    r = qjm.open_reader(cluster.uri)
    assert list(r) == [(t, txn_data(t)) for t in range(1, 7)]
    r.qjm.close()


def test_a_writer_cannot_restart_a_segment_holding_its_own_frames(cluster: MiniJournalCluster) -> None:
    """The unsafe variant: frames of the writer's own epoch may be committed, so a repeated start
    of their segment is refused and they stay."""
    w = writing_segment_1(cluster)
    with pytest.raises(qjm.QuorumError):
        w.start(1)
    w.close()
    r = qjm.open_reader(cluster.uri, include_in_progress=True)
    assert [t for t, _ in r] == [1, 2, 3]
    r.qjm.close()


# -- item 8: a reader never ends short silently ----------------------------------------------


def test_reader_returns_committed_records_after_two_nodes_restart(cluster: MiniJournalCluster) -> None:
    """The issue's scenario: 10 records synced, two of three nodes restarted (their segment is no
    longer open): the reader streams the in-progress segment from disk and returns 1..10."""
    w = qjm.open_writer(cluster.uri, create=True)
    for t in range(1, 11):
        w.append(txn_data(t))
    w.sync()
    cluster.restart(1)
    cluster.restart(2)
    r = qjm.open_reader(cluster.uri, include_in_progress=True)
    assert list(r) == [(t, txn_data(t)) for t in range(1, 11)]
    r.qjm.close()
    # with two nodes down, nothing can say what is committed: the reader raises, saying why
    cluster.kill(1)
    cluster.kill(2)
    r = qjm.open_reader(cluster.uri, 11, include_in_progress=True)
    with pytest.raises(qjm.QuorumError):
        list(r)
    r.qjm.close()
    w.abort()
