"""Catch-up (design §4.4) and the streaming scan under it, on MemoryStorage and DiskStorage alike:
what a node copies from a peer, what it refuses, and what a download must be to be taken."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from qjm._native import framing
from qjm.errors import CorruptFrameError, NodeUnavailableError
from qjm.protocol.messages import NamespaceInfo, RemoteEditLog, RequestInfo
from qjm.server.journal import Journal
from qjm.server.storage import DiskStorage, JournalStorage, SegmentStreamScan, scan_segment_bytes
from qjm.server.syncer import JournalSyncer, RateLimit
from qjm.testing.bugs import ProtocolBugs
from qjm.testing.memstore import MemoryStorage

JID = "j"
NS = NamespaceInfo(42, "c")


def frame(first: int, n: int, *, epoch: int = 1, seg: int = 1, tag: bytes = b"t") -> bytes:
    records = [tag + str(t).encode() for t in range(first, first + n)]
    return bytes(framing.encode_frame(records, epoch=epoch, segment_txid=seg, first_txid=first))


class Nodes:
    """Journals of one storage kind, by name, and the fetch/manifest functions catch-up uses."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind, self.tmp_path = kind, tmp_path
        self.j: dict[str, Journal] = {}
        self.serial = 0
        self._disks: list[DiskStorage] = []

    def add(self, name: str, bugs: ProtocolBugs | None = None) -> Journal:
        st: JournalStorage
        if self.kind == "memory":
            st = MemoryStorage(JID)
        else:
            st = DiskStorage(str(self.tmp_path / name), JID)
            self._disks.append(st)
        j = self.j[name] = Journal(st, bugs=bugs)
        j.format(NS)
        return j

    def req(self, epoch: int) -> RequestInfo:
        self.serial += 1
        return RequestInfo(JID, epoch, self.serial)

    def write(self, names: list[str], seg: int, end: int, *, finalize: bool = True, epoch: int = 1) -> None:
        """Segment ``seg``-``end`` on ``names`` (one txid a frame), finalized unless told not to."""
        for n in names:
            j = self.j[n]
            if j.get_journal_state().last_promised_epoch < epoch:
                j.new_epoch(NS, epoch)
            j.start_log_segment(self.req(epoch), seg)
            j.journal([frame(t, 1, epoch=epoch, seg=seg) for t in range(seg, end + 1)])
            if finalize:
                j.finalize_log_segment(self.req(epoch), seg, end)

    def fetch(self, source: str, journal_id: str, segment: int) -> Iterator[bytes]:
        return self.j[source].open_download(segment).chunks(100)

    def manifest(self, peer: str, journal_id: str, in_progress_ok: bool) -> list[RemoteEditLog]:
        return list(self.j[peer].get_edit_log_manifest(1, in_progress_ok).logs)

    def syncer(self, name: str, peers: list[str], bugs: ProtocolBugs | None = None) -> JournalSyncer:
        return JournalSyncer(self.j[name], peers, self.manifest, self.fetch, bugs=bugs)

    def bytes_of(self, name: str, seg: int) -> bytes:
        return self.j[name].read_segment_file(seg)[0]

    def close(self) -> None:
        for j in self.j.values():
            j.close()
        for d in self._disks:
            d.close()


@pytest.fixture(params=["memory", "disk"])
def nodes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Nodes]:
    n = Nodes(request.param, tmp_path)
    yield n
    n.close()


# -- the streaming scan ---------------------------------------------------------------------------


def segment_bytes(n: int = 20) -> bytes:
    return framing.encode_segment_header(1, 1) + b"".join(frame(t, 1) for t in range(1, n + 1))


@pytest.mark.parametrize("size", [1, 7, 64, 65, 100, 4096])
def test_a_download_in_chunks_of_any_size_scans_as_the_whole_file(size: int) -> None:
    data = segment_bytes()
    scan = SegmentStreamScan(1)
    passed = b"".join(scan.passing(data[i : i + size] for i in range(0, len(data), size)))
    assert passed == data and scan.finish() == scan_segment_bytes(data, 1)


def test_a_damaged_frame_stops_the_download_before_any_later_byte_is_passed_on() -> None:
    data = bytearray(segment_bytes())
    offsets = [off for _h, off in framing.iter_frames(bytes(data), 1)]
    bad = offsets[10] + 70  # inside the payload of frame 11
    bad_frame_end = offsets[11]
    data[bad] ^= 0xFF
    scan = SegmentStreamScan(1)
    got = bytearray()
    with pytest.raises(CorruptFrameError, match="arrived damaged"):
        for chunk in scan.passing(bytes(data[i : i + 50]) for i in range(0, len(data), 50)):
            got += chunk
    assert len(got) < bad_frame_end  # the chunk completing the damaged frame was not passed on


@pytest.mark.parametrize("tail", [b"\0" * 70, frame(21, 1)[:-3], b""], ids=["zeros", "cut frame", "header only"])
def test_a_download_must_end_on_a_frame_boundary(tail: bytes) -> None:
    data = segment_bytes() + tail if tail else framing.encode_segment_header(1, 1)[:40]
    scan = SegmentStreamScan(1)
    with pytest.raises(CorruptFrameError):
        for _ in scan.passing([data]):
            pass
        scan.finish()


# -- catch-up ------------------------------------------------------------------------------------


def test_a_node_copies_the_finalized_segments_it_lacks_byte_for_byte(nodes: Nodes) -> None:
    a, b = nodes.add("a"), nodes.add("b")
    nodes.write(["a", "b"], 1, 3)
    nodes.write(["a"], 4, 9)
    nodes.write(["a"], 10, 12)
    nodes.write(["a"], 13, 14, finalize=False)  # open on a: never copied
    s = nodes.syncer("b", ["a"])
    assert s.run_once() == 2
    assert [x.start_txid for x in nodes.manifest("b", JID, True)] == [1, 4, 10]
    for seg in (4, 10):
        assert nodes.bytes_of("b", seg) == nodes.bytes_of("a", seg)
    assert b.sync_stats.segments_downloaded == 2 and b.sync_stats.bytes > 0
    assert b.get_journal_state().highest_written_txid == 12
    assert s.run_once() == 0  # nothing more to take
    assert a.sync_stats.runs == 0


def test_an_unfinished_copy_is_moved_aside_for_the_finalized_segment(nodes: Nodes) -> None:
    nodes.add("a")
    b = nodes.add("b")
    nodes.write(["a", "b"], 1, 5, finalize=False)
    nodes.j["a"].finalize_log_segment(nodes.req(1), 1, 5)
    b.close()  # b restarts: its copy of segment 1 is no longer open there
    b2 = nodes.j["b"] = Journal(b.storage)
    assert nodes.syncer("b", ["a"]).run_once() == 1
    assert nodes.bytes_of("b", 1) == nodes.bytes_of("a", 1)
    assert b2.sync_need(1, 5) == "have"
    if isinstance(b2.storage, MemoryStorage):
        assert "edits_inprogress_0000000000000000001.stale" in b2.storage.file_names()


def test_a_segment_open_here_is_left_to_its_writer(nodes: Nodes) -> None:
    nodes.add("a"), nodes.add("b")
    nodes.write(["a", "b"], 1, 5, finalize=False)
    nodes.j["a"].finalize_log_segment(nodes.req(1), 1, 5)
    assert nodes.j["b"].sync_need(1, 5) == "busy"
    assert nodes.syncer("b", ["a"]).run_once() == 0


def different_finalized_copies(nodes: Nodes, bugs: ProtocolBugs | None = None) -> tuple[Journal, Journal]:
    """a holds finalized 1-5, b finalized 1-4: two histories, which catch-up must not merge."""
    a, b = nodes.add("a"), nodes.add("b", bugs)
    nodes.write(["a"], 1, 5)
    nodes.write(["b"], 1, 4)
    return a, b


def test_a_different_finalized_copy_is_refused_and_counted_as_a_divergence(nodes: Nodes) -> None:
    _a, b = different_finalized_copies(nodes)
    before = nodes.bytes_of("b", 1)
    assert nodes.syncer("b", ["a"]).run_once() == 0
    assert b.sync_stats.divergences == 1 and nodes.bytes_of("b", 1) == before
    assert [(x.start_txid, x.end_txid) for x in nodes.manifest("b", JID, False)] == [(1, 4)]


def test_tooth_catch_up_replacing_a_different_finalized_copy_changes_a_finalized_segment(nodes: Nodes) -> None:
    """The search cannot reach this switch: two different finalized copies never arise in the
    correct protocol, so only a node that holds one (damage, another bug) would show it."""
    different_finalized_copies(nodes, ProtocolBugs.only("sync_replaces_finalized_copy"))
    assert nodes.syncer("b", ["a"]).run_once() == 1
    assert [(x.start_txid, x.end_txid) for x in nodes.manifest("b", JID, False)] == [(1, 5)]


def test_a_peers_in_progress_segment_is_never_taken(nodes: Nodes) -> None:
    nodes.add("a"), nodes.add("b")
    nodes.write(["a"], 1, 5, finalize=False)
    assert nodes.syncer("b", ["a"]).run_once() == 0
    bugged = nodes.syncer("b", ["a"], bugs=ProtocolBugs.only("sync_takes_in_progress"))
    assert bugged.run_once() == 1  # the switch copies what may still change, as finalized


def test_a_finalize_racing_the_download_wins(nodes: Nodes) -> None:
    """catch-up decided to take segment 1 from a; before it installs it, the writer's finalize
    reaches b (a catch-up racing a finalize): the download is discarded, nothing replaced."""
    nodes.add("a"), nodes.add("b")
    nodes.write(["a", "b"], 1, 5, finalize=False)
    nodes.j["a"].finalize_log_segment(nodes.req(1), 1, 5)
    b = nodes.j["b"]
    chunks = nodes.fetch("a", JID, 1)

    def finalize_midway() -> Iterator[bytes]:
        for i, c in enumerate(chunks):
            if i == 1:
                b.finalize_log_segment(nodes.req(1), 1, 5)
            yield c

    assert b.install_synced(1, 5, finalize_midway()) == "have"
    assert [(x.start_txid, x.end_txid) for x in nodes.manifest("b", JID, False)] == [(1, 5)]


def test_a_failed_download_is_counted_and_leaves_no_file(nodes: Nodes) -> None:
    nodes.add("a")
    b = nodes.add("b")
    nodes.write(["a"], 1, 5)

    def broken(source: str, journal_id: str, segment: int) -> Iterator[bytes]:
        yield from list(nodes.fetch(source, journal_id, segment))[:2]
        raise NodeUnavailableError("peer went away")

    s = JournalSyncer(b, ["a"], nodes.manifest, broken)
    assert s.run_once() == 0
    assert b.sync_stats.failures == 1 and "peer went away" in b.sync_stats.last_error
    names = b.storage.file_names() if isinstance(b.storage, MemoryStorage) else []
    assert not any(n.endswith(".sync") for n in names)
    assert nodes.manifest("b", JID, False) == []


def test_the_rate_limit_sleeps_for_what_is_over_a_seconds_worth() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    lim = RateLimit(1000, clock=lambda: now[0], sleep=sleep)
    lim.take(1000)  # the first second's burst
    assert slept == []
    lim.take(500)
    assert slept == [pytest.approx(0.5)]
    RateLimit(0, clock=lambda: now[0], sleep=sleep).take(10**9)
    assert len(slept) == 1
