"""A JournalNode's resource bounds, each pushed past on a real node (real sockets, real disks).

The bounds are set small for these tests (``NodeLimits``); one test lowers RLIMIT_NOFILE in a node
process instead and probes many journal ids, which must not exhaust its descriptors.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

import qjm
from qjm._native import framing
from qjm.client.manager import QuorumJournalManager
from qjm.errors import ResourceExhaustedError
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol import wire
from qjm.protocol.rpcmeta import ERROR_CODE_KEY, GRPC_OPTIONS, make_stub, rpc_code
from qjm.server.limits import NodeLimits
from qjm.server.node import JournalNode
from qjm.testing.util import eventually, txn_data

NS = pb.NamespaceInfoProto(namespace_id=7, cluster_id="bounds", ctime=0)


@pytest.fixture
def node_factory(tmp_path) -> Iterator[object]:  # type: ignore[no-untyped-def]
    nodes: list[JournalNode] = []

    def make(limits: NodeLimits, name: str = "jn") -> JournalNode:
        n = JournalNode(str(tmp_path / name), limits=limits).start()
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        n.stop(0)


def fmt(uri: str) -> None:
    with QuorumJournalManager(uri) as m:
        m.format()


def uri_of(node: JournalNode, journal_id: str) -> str:
    return f"qjournal://{node.rpc_address}/{journal_id}"


def error_code(e: grpc.RpcError) -> str:
    return dict(e.trailing_metadata() or ()).get(ERROR_CODE_KEY, "")  # type: ignore[attr-defined]


def read_reply(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the node sends until it closes the connection."""
    sock.settimeout(timeout)
    out = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return out
        out += chunk


def test_read_only_calls_on_unknown_journals_create_nothing(node_factory) -> None:  # type: ignore[no-untyped-def]
    node = node_factory(NodeLimits())
    before = sorted(os.listdir(node.data_dir))
    with grpc.insecure_channel(node.rpc_address, options=GRPC_OPTIONS) as ch:
        stub = make_stub(ch)
        for i in range(50):
            jid = pb.JournalIdRequest(journal_id=f"probe{i}")
            assert stub.IsFormatted(jid, timeout=10).formatted is False
            assert "probe" in stub.Status(jid, timeout=10).json
            for call, req in (
                (stub.GetJournalState, jid),
                (stub.GetEditLogManifest, pb.ManifestRequest(journal_id=f"probe{i}", since_txid=1)),
                (stub.GetJournaledEdits, pb.JournaledEditsRequest(journal_id=f"probe{i}", since_txid=1)),
            ):
                with pytest.raises(grpc.RpcError) as ei:
                    call(req, timeout=10)
                assert error_code(ei.value) == "NOT_FORMATTED"
            with pytest.raises(grpc.RpcError):
                list(stub.DownloadSegment(pb.SegmentRequest(journal_id=f"probe{i}", segment_txid=1), timeout=10))
            # a mutating call on an unknown journal is refused the same way, and creates nothing either
            with pytest.raises(grpc.RpcError) as ei:
                stub.NewEpoch(pb.NewEpochRequest(journal_id=f"probe{i}", ns=NS, epoch=1), timeout=10)
            assert error_code(ei.value) == "NOT_FORMATTED"
    # the data plane: a hello naming an unknown journal is refused and creates nothing
    host, port = node.data_address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(wire.encode_hello("probe-data"))
        assert b"NOT_FORMATTED" in read_reply(s)
    assert sorted(os.listdir(node.data_dir)) == before
    assert node.journals.open_count() == 0


def test_open_journals_are_bounded_idle_ones_closed_busy_ones_kept(node_factory) -> None:  # type: ignore[no-untyped-def]
    node = node_factory(NodeLimits(max_open_journals=3))
    w = qjm.open_writer(uri_of(node, "real"), create=True)  # an open segment: never closed
    w.append(txn_data(1))
    w.sync()
    for i in range(12):  # formats (and opens) more journals than the bound: idle ones are closed
        fmt(uri_of(node, f"other{i}"))
        assert node.journals.open_count() <= 3
    assert node.journals.evictions >= 10
    for t in range(2, 21):
        w.append(txn_data(t))
        if t % 5 == 0:
            w.roll()
    w.sync()
    # two more busy journals fill the bound; a fourth journal is refused with a typed error
    busy = [qjm.open_writer(uri_of(node, f"other{i}")) for i in (0, 1)]
    for b in busy:
        b.append(b"x")
        b.sync()
    with grpc.insecure_channel(node.rpc_address, options=GRPC_OPTIONS) as ch, pytest.raises(grpc.RpcError) as ei:
        make_stub(ch).GetJournalState(pb.JournalIdRequest(journal_id="other5"), timeout=10)
    assert error_code(ei.value) == ResourceExhaustedError.code
    assert rpc_code(ei.value) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_open_journals" in str(ei.value.details())  # type: ignore[attr-defined]
    # the busy journals kept working throughout
    for b in busy:
        b.append(b"y")
        b.sync()
        b.close()
    w.append(txn_data(21))
    w.sync()
    w.close()
    r = qjm.open_reader(uri_of(node, "real"))
    assert list(r) == [(t, txn_data(t)) for t in range(1, 22)]
    r.qjm.close()


def _partial_frame(total_payload: int) -> tuple[bytes, int]:
    """A valid frame with about ``total_payload`` bytes of records, and its length."""
    rec = bytes(64 * 1024)
    n = max(1, total_payload // len(rec))
    frame = framing.encode_frame([rec] * n, first_txid=1, epoch=1, segment_txid=1)
    return frame, len(frame)


def test_frame_memory_is_bounded_per_connection_and_per_node(node_factory) -> None:  # type: ignore[no-untyped-def]
    mib = 1024 * 1024
    limits = NodeLimits(max_frame_bytes=3 * mib, frame_memory=4 * mib, frame_memory_wait=0.3)
    node = node_factory(limits)
    fmt(uri_of(node, "j"))
    host, port = node.data_address.rsplit(":", 1)
    addr = (host, int(port))
    # per connection: a frame declaring more than max_frame_bytes is refused from its header
    big, _ = _partial_frame(5 * mib)
    with socket.create_connection(addr) as s:
        s.sendall(wire.encode_hello("j") + big[:4096])
        reply = read_reply(s)
    assert b"RESOURCE_EXHAUSTED" in reply and b"max_frame_bytes" in reply
    # per node: unfinished frames on many connections never hold more than frame_memory
    frame, flen = _partial_frame(int(2.5 * mib))
    conns = [socket.create_connection(addr) for _ in range(4)]
    try:
        for c in conns:
            c.sendall(wire.encode_hello("j") + frame[: flen - 1024])  # all but the last KiB
        for c in conns:
            c.settimeout(0.05)
            try:
                data = c.recv(65536)
            except TimeoutError:
                continue
            assert b"RESOURCE_EXHAUSTED" in data
            assert node.data_server.frame_memory.used <= limits.frame_memory
        eventually(lambda: node.data_server.frame_memory.refusals >= 2, what="connections refused memory")
        assert node.data_server.frame_memory.used <= limits.frame_memory
    finally:
        for c in conns:
            c.close()
    # everything is given back once the connections are gone
    eventually(lambda: node.data_server.frame_memory.used == 0, what="frame memory given back")


def test_data_connections_are_bounded_and_idle_ones_closed(node_factory) -> None:  # type: ignore[no-untyped-def]
    node = node_factory(NodeLimits(max_data_connections=4, hello_timeout=1.0, idle_timeout=1.5))
    fmt(uri_of(node, "j"))
    host, port = node.data_address.rsplit(":", 1)
    addr = (host, int(port))
    silent = [socket.create_connection(addr) for _ in range(4)]
    eventually(lambda: node.data_server.connection_count() == 4, what="four connections served")
    with socket.create_connection(addr) as fifth:  # past the bound: refused at once, no thread
        assert b"RESOURCE_EXHAUSTED" in read_reply(fifth, timeout=5)
    assert node.metrics.registry.get_sample_value("qjm_node_data_connections_refused_total", {"reason": "limit"}) == 1
    # a connection that never says hello is closed after hello_timeout
    for s in silent:
        assert read_reply(s, timeout=10) == b""
        s.close()
    eventually(lambda: node.data_server.connection_count() == 0, what="silent connections closed")
    # after its hello, a connection idle past idle_timeout is closed; keepalive is on
    with socket.create_connection(addr) as idle:
        idle.sendall(wire.encode_hello("j"))
        eventually(lambda: node.data_server.connection_count() == 1, what="idle connection served")
        ss = subprocess.run(
            ["ss", "-tnoH", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True
        )
        if ss.returncode == 0:
            assert "keepalive" in ss.stdout, ss.stdout
        assert read_reply(idle, timeout=10) == b""
    eventually(lambda: node.data_server.connection_count() == 0, what="idle connection closed")


def _lower_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_probing_many_journals_cannot_exhaust_a_nodes_descriptors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A node process limited to 256 descriptors: 1,100 read-only probes and 60 formatted journals
    (past the open-journal bound it derives from the limit) leave the real journal's roll and a new
    writer's start working, and create no directory for the probes."""
    from qjm.testing.ports import free_port

    rpc, data = free_port(), free_port()
    data_dir = tmp_path / "jn"
    cmd = [sys.executable, "-m", "qjm", "journalnode", "--data-dir", str(data_dir), "--rpc-port", str(rpc),
           "--data-port", str(data), "--ready-line"]  # fmt: skip
    log = open(tmp_path / "jn.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, preexec_fn=_lower_nofile)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith(b"READY")
        uri = f"qjournal://127.0.0.1:{rpc}/real"
        w = qjm.open_writer(uri, create=True)
        w.append(txn_data(1))
        w.sync()
        with grpc.insecure_channel(f"127.0.0.1:{rpc}", options=GRPC_OPTIONS) as ch:
            stub = make_stub(ch)
            for i in range(1100):
                assert not stub.IsFormatted(pb.JournalIdRequest(journal_id=f"probe{i}"), timeout=10).formatted
        for i in range(60):
            fmt(f"qjournal://127.0.0.1:{rpc}/other{i}")
        w.append(txn_data(2))
        w.roll()
        w.append(txn_data(3))
        w.close()
        w2 = qjm.open_writer(uri)
        w2.append(txn_data(4))
        w2.close()
        r = qjm.open_reader(uri)
        assert list(r) == [(t, txn_data(t)) for t in range(1, 5)]
        r.qjm.close()
        assert not [n for n in os.listdir(data_dir) if n.startswith("probe")]
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
