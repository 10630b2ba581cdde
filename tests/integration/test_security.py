"""Mutual TLS and authorization on the control plane, with real certificates on real nodes
(design §9): who may do what, what a plaintext or badly certified client gets, handshakes that
stall or are garbage, the plaintext-beyond-loopback refusal, peers-only recovery sources, and error
messages that keep the node's paths to itself."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

import qjm
from qjm.errors import (
    InsecureBindError,
    NodeUnavailableError,
    PermissionDeniedError,
    QuorumError,
)
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol.rpcmeta import ERROR_CODE_KEY, GRPC_OPTIONS, make_stub, open_channel
from qjm.security.authz import authorizer_from
from qjm.security.certs import client_cert
from qjm.security.tls import TlsConfig
from qjm.server.limits import NodeLimits
from qjm.server.node import JournalNode, fetch_segment
from qjm.testing.certs import Pki
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import client_hello, closed_by_peer, eventually

JID = "orders"
GRANTS = {
    "alice": {"writer": [JID], "reader": ["*"]},
    "bob": {"reader": [JID]},
    "ops": {"admin": ["*"]},
    **{f"jn{i}": {"reader": ["*"]} for i in range(3)},
}
HANDSHAKE_TIMEOUT = 1.0  # the nodes' hello_timeout: a stalled handshake is closed after it


class Cluster:
    def __init__(self, base: Path, pki: Pki, grants: dict[str, dict[str, list[str]]] | None = GRANTS) -> None:
        authz = authorizer_from(grants, "test") if grants is not None else None
        self.nodes = [
            JournalNode(
                str(base / f"jn{i}"), tls=pki.nodes[i], authz=authz, limits=NodeLimits(hello_timeout=HANDSHAKE_TIMEOUT)
            ).start()
            for i in range(3)
        ]
        self.uri = "qjournal://" + ";".join(f"127.0.0.1:{n.rpc_port}" for n in self.nodes) + f"/{JID}"

    def stop(self) -> None:
        for n in self.nodes:
            n.stop(0)


@pytest.fixture
def tls_cluster(tmp_path: Path, pki: Pki) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", pki)
    yield c
    c.stop()


def read(uri: str, tls: TlsConfig) -> list[tuple[int, bytes]]:
    r = qjm.open_reader(uri, tls=tls)
    try:
        return list(r)
    finally:
        r.qjm.close()


def write(uri: str, tls: TlsConfig, *records: bytes, create: bool = False) -> None:
    w = qjm.open_writer(uri, tls=tls, create=create)
    for rec in records:
        w.append(rec)
    w.close()


def format_journal(uri: str, tls: TlsConfig) -> None:
    with qjm.QuorumJournalManager(uri, config=qjm.QJMConfig(tls=tls)) as m:
        m.format()


def causes(e: QuorumError) -> list[BaseException]:
    return list(e.causes.values())


def test_writer_and_reader_over_mutual_tls_and_node_to_node_downloads(tls_cluster: Cluster, pki: Pki) -> None:
    alice = pki.clients["alice"]
    format_journal(tls_cluster.uri, pki.clients["ops"])
    write(tls_cluster.uri, alice, b"one", b"two")
    write(tls_cluster.uri, alice, b"three")  # a takeover: fencing and recovery over TLS
    assert read(tls_cluster.uri, pki.clients["bob"]) == [(1, b"one"), (2, b"two"), (3, b"three")]
    # a node downloads a segment from another with its own certificate (recovery's path)
    source = f"127.0.0.1:{tls_cluster.nodes[1].rpc_port}"
    assert b"two" in b"".join(fetch_segment(source, JID, 1, 10, tls=pki.nodes[0]))
    with pytest.raises(qjm.errors.NotFoundError):  # no certificate: the node refuses the download
        b"".join(fetch_segment(source, JID, 1, 10))


def test_each_call_needs_its_role_and_a_refusal_changes_nothing(tls_cluster: Cluster, pki: Pki) -> None:
    alice, bob, ops = pki.clients["alice"], pki.clients["bob"], pki.clients["ops"]
    with pytest.raises(QuorumError) as e:  # alice writes but does not format: admin
        qjm.open_writer(tls_cluster.uri, tls=alice, create=True)
    assert any(isinstance(c, PermissionDeniedError) and c.role == "admin" for c in causes(e.value))
    format_journal(tls_cluster.uri, ops)
    w = qjm.open_writer(tls_cluster.uri, tls=alice)
    w.append(b"kept")
    w.sync()
    epoch = w.epoch
    # a reader cannot fence the writer: new_epoch is a write
    with pytest.raises(QuorumError) as e:
        qjm.open_writer(tls_cluster.uri, tls=bob)
    assert all(isinstance(c, PermissionDeniedError) and c.role == "writer" for c in causes(e.value))
    w.append(b"still the writer")
    w.sync()
    w.close()
    assert read(tls_cluster.uri, bob) == [(1, b"kept"), (2, b"still the writer")]
    for n in tls_cluster.nodes:
        st = n.journals.open_journals()[0].peek_state()
        assert st is not None and st.last_promised_epoch == epoch  # bob's attempt promised nothing
    # bob has no role on another journal, not even reading it; ops (admin) reads every journal
    other = tls_cluster.uri.replace(f"/{JID}", "/other")
    with pytest.raises(QuorumError) as e:
        read(other, bob)
    assert all(isinstance(c, PermissionDeniedError) for c in causes(e.value))
    # Counted where refused: a quorum call stops asking once it has failed, so at least a majority
    # counted each refusal (the format: at least one node, as format needs every node).
    denied = [n.metrics.denied() for n in tls_cluster.nodes]
    assert sum(d.get((JID, "writer"), 0) for d in denied) >= 2
    assert sum(d.get((JID, "admin"), 0) for d in denied) >= 1
    assert sum(d.get(("other", "reader"), 0) for d in denied) >= 2
    assert all(set(d) <= {(JID, "writer"), (JID, "admin"), ("other", "reader")} for d in denied)
    node, d = next((n, d) for n, d in zip(tls_cluster.nodes, denied, strict=True) if (JID, "writer") in d)
    text = generate_latest(node.metrics.registry).decode()
    assert f'qjm_authz_denied_total{{journal="{JID}",role="writer"}} {d[(JID, "writer")]}.0' in text


def test_rejoin_needs_the_admin_role_and_carries_the_promise_over_tls(tls_cluster: Cluster, pki: Pki) -> None:
    """qjm rejoin formats, so it needs ``admin`` (design §9.2); a refusal leaves the node empty.
    The journal is formatted on nodes 0 and 1 only, which is what node 2 sees after losing its disk."""
    two = "qjournal://" + ";".join(f"127.0.0.1:{n.rpc_port}" for n in tls_cluster.nodes[:2]) + f"/{JID}"
    format_journal(two, pki.clients["ops"])
    with qjm.QuorumJournalManager(two, config=qjm.QJMConfig(tls=pki.clients["alice"])) as m:
        m.create_new_unique_epoch()  # a writer's promise on nodes 0 and 1 only
        epoch = m.epoch
    lost = f"127.0.0.1:{tls_cluster.nodes[2].rpc_port}"
    for who in ("alice", "bob"):
        with qjm.QuorumJournalManager(tls_cluster.uri, config=qjm.QJMConfig(tls=pki.clients[who])) as m:
            with pytest.raises(PermissionDeniedError) as e:
                m.rejoin_node(lost)
            assert e.value.role == "admin"
    assert not tls_cluster.nodes[2].journals.open_journals()  # nothing was created
    with qjm.QuorumJournalManager(tls_cluster.uri, config=qjm.QJMConfig(tls=pki.clients["ops"])) as m:
        plan = m.rejoin_node(lost)
    assert plan.promised_epoch == epoch
    st = tls_cluster.nodes[2].journals.open_journals()[0].peek_state()
    assert st is not None and st.last_promised_epoch == epoch


def test_plaintext_foreign_expired_and_unknown_clients_are_refused_while_others_are_served(
    tls_cluster: Cluster, pki: Pki
) -> None:
    alice = pki.clients["alice"]
    format_journal(tls_cluster.uri, pki.clients["ops"])
    write(tls_cluster.uri, alice, b"one")
    short = qjm.QJMConfig().with_timeouts(connect=2.0, get_journal_state=5.0, new_epoch=5.0)
    for tls, hint in ((None, "tls_ca"), (pki.foreign, "not of its CA"), (pki.expired, "expired")):
        cfg = short if tls is None else qjm.QJMConfig(tls=tls, timeouts=short.timeouts)
        with pytest.raises(QuorumError) as e:
            qjm.open_writer(tls_cluster.uri, config=cfg)
        assert all(isinstance(c, NodeUnavailableError) and hint in str(c) for c in causes(e.value)), e.value
    # a certificate the CA signed, for an identity with no grant ("expired" aside: pki.clients)
    with pytest.raises(QuorumError) as e:
        read(tls_cluster.uri, _unknown_client(pki))
    assert all(isinstance(c, PermissionDeniedError) for c in causes(e.value))
    write(tls_cluster.uri, alice, b"two")  # the nodes served the others throughout
    assert read(tls_cluster.uri, pki.clients["bob"]) == [(1, b"one"), (2, b"two")]


def test_a_tls_client_against_a_plaintext_node_is_told_so(tmp_path: Path, pki: Pki) -> None:
    node = JournalNode(str(tmp_path / "plain")).start()
    try:
        cfg = qjm.QJMConfig(tls=pki.clients["alice"]).with_timeouts(connect=2.0, get_journal_state=5.0)
        with pytest.raises(QuorumError) as e:
            qjm.open_writer(f"qjournal://127.0.0.1:{node.rpc_port}/{JID}", config=cfg)
        assert all(isinstance(c, NodeUnavailableError) and "serve plaintext" in str(c) for c in causes(e.value))
        assert not (tmp_path / "plain" / JID).exists()  # nothing reached the node
    finally:
        node.stop(0)


def test_the_commands_take_tls_flags_and_environment(tls_cluster: Cluster, pki: Pki, tmp_path: Path) -> None:
    ops = pki.clients["ops"]
    flags = ["--tls-ca", ops.ca_file, "--tls-cert", ops.cert_file, "--tls-key", ops.key_file]

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "qjm", *args], capture_output=True, text=True, timeout=120,
            env={**os.environ, **(env or {})},
        )  # fmt: skip

    assert run("format", tls_cluster.uri, *flags).returncode == 0
    write(tls_cluster.uri, pki.clients["alice"], b"via the API")
    env = {"QJM_TLS_CA": ops.ca_file, "QJM_TLS_CERT": ops.cert_file, "QJM_TLS_KEY": ops.key_file}
    st = run("status", tls_cluster.uri, "--json", env=env)
    assert st.returncode == 0, st.stdout + st.stderr
    tail = run("tail", tls_cluster.uri, *flags)
    assert tail.returncode == 0 and tail.stdout.split("\t") == ["1", "via the API\n"], tail.stderr
    bad = run("status", tls_cluster.uri, "--tls-ca", ops.ca_file)  # a CA alone: refused, one line
    assert bad.returncode == 3 and "missing: certificate, key" in bad.stderr and "Traceback" not in bad.stderr


def _unknown_client(pki: Pki) -> TlsConfig:
    f = client_cert(pki.directory, "mallory")
    return TlsConfig(f.ca_file, f.cert_file, f.key_file)


def test_stalled_and_garbage_handshakes_are_closed_and_the_node_serves_others(tls_cluster: Cluster, pki: Pki) -> None:
    format_journal(tls_cluster.uri, pki.clients["ops"])
    node = tls_cluster.nodes[0]
    hello = client_hello(pki.clients["alice"])
    attackers: dict[str, socket.socket] = {}
    for name, payload in (
        ("silent", b""),
        ("half a ClientHello", hello[: len(hello) // 2]),
        ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256))),
    ):
        s = socket.create_connection(("127.0.0.1", node.rpc_port), timeout=5)
        if payload:
            s.sendall(payload)
        attackers[name] = s
    try:
        write(tls_cluster.uri, pki.clients["alice"], b"served while stalled")  # the node answers others meanwhile
        for name, s in attackers.items():  # each is dropped once the handshake time is up (or at once)
            assert closed_by_peer(s, 30 * HANDSHAKE_TIMEOUT), name
    finally:
        for s in attackers.values():
            s.close()
    assert read(tls_cluster.uri, pki.clients["bob"]) == [(1, b"served while stalled")]
    st = node.journals.open_journals()[0].peek_state()
    assert st is not None and st.highest_written_txid == 1  # nothing else was written


def test_a_node_refuses_plaintext_beyond_loopback(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(InsecureBindError, match=r"0\.0\.0\.0"):
        JournalNode(str(tmp_path / "a"), host="0.0.0.0")
    assert not (tmp_path / "a" / "in_use.lock").exists()  # refused before anything was taken
    for kw in ({"insecure": True}, {"tls": pki.nodes[0]}):
        JournalNode(str(tmp_path / "b"), host="0.0.0.0", **kw).start().stop(0)  # type: ignore[arg-type]
    JournalNode(str(tmp_path / "c"), host="localhost").start().stop(0)  # loopback by name
    r = subprocess.run(
        [sys.executable, "-m", "qjm", "journalnode", "--data-dir", str(tmp_path / "d"), "--bind", "0.0.0.0",
         "--rpc-port", "0", "--data-port", "0", "--http-port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("qjm journalnode:")]
    assert len(lines) == 1 and "--insecure" in lines[0] and "Traceback" not in r.stderr


def test_recovery_downloads_only_from_peers(tmp_path: Path) -> None:
    """accept_recovery naming a source outside ``peers`` is refused before anything is dialled."""
    trap = socket.create_server(("127.0.0.1", 0))
    trap.settimeout(0.5)
    node = JournalNode(str(tmp_path / "jn"), peers=["127.0.0.1:1"]).start()
    try:
        uri = f"qjournal://127.0.0.1:{node.rpc_port}/{JID}"
        qjm.open_writer(uri, create=True).close()
        with open_channel(f"127.0.0.1:{node.rpc_port}", GRPC_OPTIONS, None) as ch:
            stub = make_stub(ch)
            st = stub.GetJournalState(pb.JournalIdRequest(journal_id=JID), timeout=10)
            ns = pb.NamespaceInfoProto(namespace_id=qjm.QJMConfig().namespace_id, cluster_id="qjm")
            epoch = st.last_promised_epoch + 1
            stub.NewEpoch(pb.NewEpochRequest(journal_id=JID, ns=ns, epoch=epoch), timeout=10)
            req = pb.RequestInfoProto(journal_id=JID, epoch=epoch, serial=1, committed_txid=-1)
            state = pb.SegmentStateProto(start_txid=5, end_txid=9, in_progress=True, epoch=epoch)
            from_url = f"127.0.0.1:{trap.getsockname()[1]}"
            with pytest.raises(grpc.RpcError) as e:
                stub.AcceptRecovery(
                    pb.AcceptRecoveryRequest(req=req, state_to_accept=state, from_url=from_url), timeout=10
                )
        assert dict(e.value.trailing_metadata())[ERROR_CODE_KEY] == "PERMISSION_DENIED"  # type: ignore[attr-defined]
        with pytest.raises(TimeoutError):
            trap.accept()  # the node never dialled the named host
    finally:
        node.stop(0)
        trap.close()


def test_errors_sent_to_clients_name_no_local_path(tmp_path: Path) -> None:
    node = JournalNode(str(tmp_path / "secret-dir")).start()
    try:
        (tmp_path / "secret-dir" / JID).mkdir()  # a journal directory, never formatted
        with open_channel(f"127.0.0.1:{node.rpc_port}", GRPC_OPTIONS, None) as ch, pytest.raises(grpc.RpcError) as e:
            make_stub(ch).GetJournalState(pb.JournalIdRequest(journal_id=JID), timeout=10)
        details = e.value.details()  # type: ignore[attr-defined]
        assert dict(e.value.trailing_metadata())[ERROR_CODE_KEY] == "NOT_FORMATTED"  # type: ignore[attr-defined]
        assert "secret-dir" not in details and "<data_dir>" in details
    finally:
        node.stop(0)


def test_an_epoch_far_above_the_promise_and_an_absurd_serial_are_refused(tmp_path: Path) -> None:
    node = JournalNode(str(tmp_path / "jn")).start()
    try:
        uri = f"qjournal://127.0.0.1:{node.rpc_port}/{JID}"
        w = qjm.open_writer(uri, create=True)
        w.append(b"one")
        w.sync()
        with open_channel(f"127.0.0.1:{node.rpc_port}", GRPC_OPTIONS, None) as ch:
            stub = make_stub(ch)
            ns = pb.NamespaceInfoProto(namespace_id=qjm.QJMConfig().namespace_id, cluster_id="qjm")
            for epoch in (2**63 - 1, w.epoch + 2**21):
                with pytest.raises(grpc.RpcError) as e:
                    stub.NewEpoch(pb.NewEpochRequest(journal_id=JID, ns=ns, epoch=epoch), timeout=10)
                assert dict(e.value.trailing_metadata())[ERROR_CODE_KEY] == "EPOCH"  # type: ignore[attr-defined]
            req = pb.RequestInfoProto(journal_id=JID, epoch=w.epoch, serial=2**64 - 1, committed_txid=-1)
            with pytest.raises(grpc.RpcError) as e:
                stub.PurgeLogs(pb.PurgeLogsRequest(req=req, min_txid_to_keep=0), timeout=10)
            assert dict(e.value.trailing_metadata())[ERROR_CODE_KEY] == "OUT_OF_ORDER"  # type: ignore[attr-defined]
        w.append(b"two")  # the writer goes on: its epoch and serials still hold
        w.sync()
        w.close()
        eventually(lambda: qjm.open_writer(uri).close() is None, what="a later writer takes over")
    finally:
        node.stop(0)


def test_recovery_downloads_between_nodes_over_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    """Node processes with TLS: a node that missed a segment gets it in recovery, downloading it from
    another node with its own certificate (accept_recovery's download, design §9.1)."""
    alice = pki.clients["alice"]
    with MiniJournalCluster(3, str(tmp_path / "cluster"), journal_id=JID, pki=pki) as c:
        write(c.uri, alice, b"one", create=True)
        c.stop(2)
        w = qjm.open_writer(c.uri, tls=alice)  # segment 2 on nodes 0 and 1 only
        w.append(b"two")
        w.append(b"three")
        w.sync()
        w.abort()  # left in progress
        c.start(2)
        c.kill(0)
        write(c.uri, alice, b"four")  # recovery on nodes 1 and 2: node 2 downloads segment 2 from node 1
        assert (Path(c.journal_dir(2)) / "edits_0000000000000000002-0000000000000000003").exists()
        assert read(c.uri, alice) == [(1, b"one"), (2, b"two"), (3, b"three"), (4, b"four")]
