"""DiskStorage's cached segment listing: every method that changes ``current/`` drops it, and a
change made behind the node's back is seen once the directory's mtime moves."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from qjm._native import framing
from qjm.protocol.frame import SEGMENT_HEADER_SIZE
from qjm.protocol.messages import NamespaceInfo
from qjm.server.storage import DiskStorage, SegmentFile, finalized_name, inprogress_name

NS = NamespaceInfo(7, "cluster", 0)
PINNED = 1_000_000_000_123_456_789  # a directory mtime no real change produces


@pytest.fixture
def st(tmp_path: Path) -> Iterator[DiskStorage]:
    s = DiskStorage(str(tmp_path), "j")
    s.format(NS)
    yield s
    s.close()


def pin(st: DiskStorage, ns: int = PINNED) -> None:
    """Set current/'s mtime to a fixed value, so only the storage's own cache drops can refresh a listing."""
    os.utime(st.current, ns=(ns, ns))


def names(st: DiskStorage) -> list[str]:
    pin(st)
    return [s.name for s in st.list_segments()]


def segment(st: DiskStorage, start: int, txids: int) -> int:
    """An in-progress segment holding ``txids`` records; returns its valid end."""
    app = st.create_segment(start, framing.encode_segment_header(start, 1))
    for t in range(start, start + txids):
        app.append(framing.encode_frame([b"r%d" % t], epoch=1, segment_txid=start, first_txid=t))
    app.sync()
    size = app.size
    app.close()
    return size


def changed(st: DiskStorage, action: Callable[[], object]) -> list[str]:
    """The listing right after ``action``, with the mtime guard out of play (same pinned value)."""
    names(st)  # cached at the pinned mtime
    action()
    return names(st)


def test_listing_follows_every_change_the_storage_makes(st: DiskStorage) -> None:
    ip1, ip4, ip9 = inprogress_name(1), inprogress_name(4), inprogress_name(9)
    assert names(st) == []
    valid = 0

    def make1() -> None:
        nonlocal valid
        valid = segment(st, 1, 3)

    assert changed(st, make1) == [ip1]
    assert changed(st, lambda: st.finalize_segment(1, 3, valid)) == [finalized_name(1, 3)]
    assert changed(st, lambda: segment(st, 4, 2)) == [finalized_name(1, 3), ip4]
    assert changed(st, lambda: st.truncate_inprogress(4, SEGMENT_HEADER_SIZE)) == [finalized_name(1, 3), ip4]
    assert changed(st, lambda: st.move_aside(SegmentFile(4, None, ip4), ".empty")) == [finalized_name(1, 3)]
    assert changed(st, lambda: st.write_temp_segment(4, 2, [framing.encode_segment_header(4, 2)])) == [
        finalized_name(1, 3)
    ]
    assert changed(st, lambda: st.promote_temp_segment(4, 2)) == [finalized_name(1, 3), ip4]
    assert changed(st, lambda: st.write_sync_segment(20, 30, [b"x"])) == [finalized_name(1, 3), ip4]
    assert changed(st, lambda: st.install_sync_segment(20, 30)) == [finalized_name(1, 3), ip4, finalized_name(20, 30)]
    assert changed(st, lambda: st.delete_segment(SegmentFile(20, 30, finalized_name(20, 30)))) == [
        finalized_name(1, 3),
        ip4,
    ]
    assert changed(st, lambda: segment(st, 9, 1)) == [finalized_name(1, 3), ip4, ip9]
    assert changed(st, lambda: st.delete_segment(SegmentFile(9, None, ip9))) == [finalized_name(1, 3), ip4]
    assert changed(st, lambda: st.delete_aside_before(10)) == [finalized_name(1, 3), ip4]
    assert f"{ip4}.empty" not in os.listdir(st.current)
    assert changed(st, lambda: st.format(NS)) == []


def test_a_failed_change_still_drops_the_cache(st: DiskStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rename happened, the directory fsync after it failed: the listing must show the rename."""
    segment(st, 1, 1)
    names(st)

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", broken)
        with pytest.raises(OSError):
            st.move_aside(SegmentFile(1, None, inprogress_name(1)), ".stale")
    assert names(st) == []


def test_the_cache_is_used_while_the_directory_is_unchanged(st: DiskStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    segment(st, 1, 1)
    names(st)
    calls = 0
    real = os.listdir

    def counting(path: str) -> list[str]:
        nonlocal calls
        calls += 1
        return real(path)

    monkeypatch.setattr(os, "listdir", counting)
    for _ in range(5):
        assert names(st) == [inprogress_name(1)]
    assert calls == 0


def test_callers_cannot_change_the_cache(st: DiskStorage) -> None:
    segment(st, 1, 1)
    pin(st)
    first = st.list_segments()
    first.clear()
    assert [s.name for s in st.list_segments()] == [inprogress_name(1)]


def test_a_change_behind_the_storage_is_seen_when_the_mtime_moves(st: DiskStorage) -> None:
    ip1, ip5 = inprogress_name(1), inprogress_name(5)
    segment(st, 1, 1)
    assert names(st) == [ip1]
    # another process drops a segment file in (and its mtime happens to land on the same tick)
    with open(os.path.join(st.current, ip5), "wb") as f:
        f.write(framing.encode_segment_header(5, 1))
    pin(st)
    assert [s.name for s in st.list_segments()] == [ip1]  # the documented blind spot of the guard
    pin(st, PINNED + 1)
    assert [s.name for s in st.list_segments()] == [ip1, ip5]
    os.unlink(os.path.join(st.current, ip1))  # and removes one: the kernel moves the mtime
    assert [s.name for s in st.list_segments()] == [ip5]


def test_a_new_storage_on_the_same_directory_lists_fresh(tmp_path: Path) -> None:
    st = DiskStorage(str(tmp_path), "j")
    try:
        segment(st, 1, 1)
        assert [s.name for s in st.list_segments()] == [inprogress_name(1)]
    finally:
        st.close()
    os.rename(
        os.path.join(tmp_path, "j", "current", inprogress_name(1)),
        os.path.join(tmp_path, "j", "current", finalized_name(1, 1)),
    )
    st2 = DiskStorage(str(tmp_path), "j")
    try:
        assert [s.name for s in st2.list_segments()] == [finalized_name(1, 1)]
    finally:
        st2.close()
