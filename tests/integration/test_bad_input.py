"""Bad input on real nodes: a typed error or a logged repair, the node keeps serving, nothing committed is lost."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

import grpc
import pytest

import qjm
from qjm._native import framing
from qjm.client.manager import QuorumJournalManager
from qjm.config import QJMConfig
from qjm.errors import ConfigError, JournalIdError, NamespaceMismatchError, NotFormattedError, QuorumError
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol import qjournal_pb2_grpc as pbg
from qjm.protocol import wire
from qjm.protocol.frame import FRAME_HEADER, FRAME_HEADER_CHECKED, MAX_PAYLOAD
from qjm.protocol.messages import NamespaceInfo
from qjm.server.storage import scan_segment_bytes
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import SETTLE_TIMEOUT, ScriptedWriter, eventually, inspect_journal, txn_data, wait_for_every_node


@pytest.fixture
def open_segment(icluster: MiniJournalCluster) -> Iterator[tuple[MiniJournalCluster, ScriptedWriter]]:
    """A formatted journal with txids 1-10 committed in the open segment 1, epoch 1."""
    w = ScriptedWriter(icluster.uri)
    w.qjm.format()
    w.recover()
    w.start(1)
    w.write(1, 10, wait_all=True)
    yield icluster, w
    w.close()


def data_address(c: MiniJournalCluster, i: int) -> tuple[str, int]:
    node = c.nodes[i].inproc
    assert node is not None
    return node.host, node.data_port


def send_raw(c: MiniJournalCluster, payload: bytes, journal_id: str = "test-journal") -> wire.Ack | wire.NodeError:
    """Open a data-plane connection to node 0, send ``payload`` after the hello, return the first reply."""
    with socket.create_connection(data_address(c, 0), timeout=10) as s:
        s.sendall(wire.encode_hello(journal_id) + payload)
        buf = bytearray()
        while True:
            msg, _used = wire.parse_reply(buf)
            if msg is not None:
                return msg
            chunk = s.recv(65536)
            assert chunk, "node closed the connection without a reply"
            buf += chunk


def good_frame(first: int, epoch: int = 1) -> bytes:
    return framing.encode_frame([txn_data(first)], epoch=epoch, segment_txid=1, first_txid=first)


def reseal(header: bytearray) -> bytes:
    """Recompute a tampered header's own checksum, so only the tampered field is wrong."""
    header[FRAME_HEADER_CHECKED:64] = framing.xxh3_64(bytes(header[:FRAME_HEADER_CHECKED])).to_bytes(8, "little")
    return bytes(header)


def assert_still_serving(c: MiniJournalCluster, next_txid: int) -> None:
    reply = send_raw(c, good_frame(next_txid))
    assert isinstance(reply, wire.Ack) and reply.txid == next_txid


def tampered(field: str, value: int) -> bytes:
    f = bytearray(good_frame(11))
    names = ["magic", "version", "flags", "record_count", "payload_len", "epoch", "segment_txid", "first_txid"]
    fields = list(FRAME_HEADER.unpack_from(f))
    fields[names.index(field)] = value
    f[:64] = FRAME_HEADER.pack(*fields)
    return reseal(bytearray(f[:64])) + bytes(f[64:])


@pytest.mark.parametrize(
    ("name", "payload", "code"),
    [
        ("corrupt magic", b"XXXX" + good_frame(11)[4:], "CORRUPT_FRAME"),
        ("corrupt header checksum", good_frame(11)[:60] + b"\0\0\0\0" + good_frame(11)[64:], "CORRUPT_FRAME"),
        ("corrupt payload checksum", good_frame(11)[:-1] + b"\xff", "CORRUPT_FRAME"),
        ("length too short for records", tampered("payload_len", 2), "CORRUPT_FRAME"),
        ("oversized length", tampered("payload_len", MAX_PAYLOAD + 1), "CORRUPT_FRAME"),
        ("txid gap", good_frame(13), "OUT_OF_ORDER"),
        ("duplicate txid", good_frame(10), "OUT_OF_ORDER"),
    ],
)
def test_bad_frame_refused_node_keeps_serving(
    open_segment: tuple[MiniJournalCluster, ScriptedWriter], name: str, payload: bytes, code: str
) -> None:
    c = open_segment[0]
    reply = send_raw(c, payload)
    assert isinstance(reply, wire.NodeError), name
    assert reply.code == code
    assert_still_serving(c, 11)  # node 0 takes the next valid frame: nothing was written for the bad one
    r = qjm.open_reader(c.uri, include_in_progress=True)
    assert list(r) == [(t, txn_data(t)) for t in range(1, 11)]  # 11 is on one node only: not committed
    r.qjm.close()


def test_stale_epoch_frame_is_fenced(open_segment: tuple[MiniJournalCluster, ScriptedWriter]) -> None:
    c = open_segment[0]
    w2 = ScriptedWriter(c.uri)
    w2.recover()  # epoch 2 promised by a majority; the frame goes to node 0, so wait for its promise
    eventually(lambda: inspect_journal(c.journal_dir(0)).promised_epoch == 2, what="node 0 promised epoch 2")
    reply = send_raw(c, good_frame(11, epoch=1))
    assert isinstance(reply, wire.NodeError) and reply.code.startswith("FENCED")
    assert qjm.errors.from_code(reply.code, "x").promised_epoch == 2  # type: ignore[attr-defined]
    w2.close()


def test_unformatted_journal_is_refused(icluster: MiniJournalCluster) -> None:
    uri = icluster.uri_for("never-formatted")
    with pytest.raises(NotFormattedError):
        qjm.open_writer(uri)
    m = QuorumJournalManager(uri, config=QJMConfig().with_timeouts(get_journal_state=5))
    with pytest.raises(QuorumError) as ei:
        m.recover_unfinalized_segments()
    assert all(isinstance(e, NotFormattedError) for e in ei.value.causes.values())
    m.close()


def test_mismatched_namespace_is_refused(icluster: MiniJournalCluster) -> None:
    qjm.open_writer(icluster.uri, create=True).close()
    m = QuorumJournalManager(icluster.uri, namespace=NamespaceInfo(12345, "other-cluster"))
    with pytest.raises(QuorumError) as ei:
        m.recover_unfinalized_segments()
    assert all(isinstance(e, NamespaceMismatchError) for e in ei.value.causes.values())
    m.close()


@pytest.mark.parametrize("jid", ["../x", "a/b", ".hidden", "", "x" * 200, "-rf"])
def test_hostile_journal_id_refused(icluster: MiniJournalCluster, jid: str) -> None:
    with pytest.raises(ConfigError):
        qjm.open_writer("qjournal://" + ";".join(icluster.addresses) + "/" + jid)
    with grpc.insecure_channel(icluster.addresses[0]) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            pbg.QJournalStub(ch).IsFormatted(pb.JournalIdRequest(journal_id=jid), timeout=10)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    reply = send_raw(icluster, b"", journal_id=jid)
    assert isinstance(reply, wire.NodeError) and reply.code == JournalIdError.code
    base = os.path.dirname(icluster.node_dir(0))
    assert sorted(os.listdir(base)) == sorted(["jn0", "jn1", "jn2"])  # nothing created outside the nodes
    assert not os.path.exists(os.path.join(icluster.node_dir(0), "..", "x"))


def test_truncated_finalized_segment_fails_over(cluster: MiniJournalCluster) -> None:
    """A finalized segment cut short on one node: readers get every record from the other replicas."""
    w = qjm.open_writer(cluster.uri, create=True, close_grace=SETTLE_TIMEOUT)  # node 0 finalizes too
    for i in range(1, 501):
        w.append(txn_data(i))
    w.close()
    name = f"edits_{1:019d}-{500:019d}"
    cluster.stop(0)
    path = os.path.join(cluster.journal_dir(0), name)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    cluster.start(0)
    r = qjm.open_reader(cluster.uri)
    assert list(r) == [(i, txn_data(i)) for i in range(1, 501)]
    r.qjm.close()


def test_truncated_inprogress_segment_is_repaired_on_restart(cluster: MiniJournalCluster) -> None:
    """An in-progress file cut mid-frame (a crash): the node cuts back to the last whole frame at start."""
    w = qjm.open_writer(cluster.uri, create=True)
    for i in range(1, 101):
        w.append(txn_data(i))
        if i % 10 == 0:
            w.sync()
    seg = w.segment_txid
    wait_for_every_node(w)  # node 0 holds all ten frames, not only what a majority's sync needed
    cluster.kill(0)
    path = os.path.join(cluster.journal_dir(0), f"edits_inprogress_{seg:019d}")
    with open(path, "rb") as f:
        valid = scan_segment_bytes(f.read(), seg).valid_end  # the file may be preallocated past it
    with open(path, "r+b") as f:
        f.truncate(valid - 7)
    cluster.start(0)
    st = w.qjm.loggers.loggers[0].get_journal_state().result(timeout=SETTLE_TIMEOUT)
    assert 90 <= st.highest_written_txid < 100  # cut back to the last whole frame (the sync at 90 ended one)
    w.close()
    r = qjm.open_reader(cluster.uri)
    assert list(r) == [(i, txn_data(i)) for i in range(1, 101)]
    r.qjm.close()


def test_bad_uri_is_refused() -> None:
    for uri in [
        "http://x/y",
        "qjournal://",
        "qjournal://h:1",
        "qjournal://h:0/j",
        "qjournal://h:x/j",
        "qjournal://h:1;h:1/j",
    ]:
        with pytest.raises(ConfigError):
            qjm.open_writer(uri)


def test_full_disk_refuses_and_keeps_committed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A node whose disk is full refuses to append (StorageError), the others commit; nothing is lost."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    assert r.returncode == 0, f"cannot mount a small tmpfs (need root): {r.stderr!r}"
    try:
        with MiniJournalCluster(3, str(tmp_path / "c"), in_process=True) as c:
            c.stop(2)
            c.nodes[2].data_dir = str(mnt / "jn2")
            c.start(2)
            w = qjm.open_writer(c.uri, create=True, batch_bytes=16 * 1024)
            for i in range(1, 4001):  # ~4 MB: node 2's 2 MB disk fills up midway
                w.append(txn_data(i) + bytes(1000))
            w.sync()
            w.close()
            assert struct.calcsize("<Q") == 8
            r2 = qjm.open_reader(c.uri)
            assert list(r2) == [(i, txn_data(i) + bytes(1000)) for i in range(1, 4001)]
            r2.qjm.close()
            st = os.statvfs(str(mnt))
            assert st.f_bavail * st.f_frsize < 64 * 1024  # node 2 really ran out of space
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
