"""qjm.server.durable_long on a real disk: two checksummed slots updated in place, the legacy decimal
format, torn and corrupt slots, failed syncs; and DiskStorage's epoch files on top of it."""

from __future__ import annotations

import errno
import itertools
import os
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qjm.errors import StorageError
from qjm.protocol.messages import NamespaceInfo
from qjm.server.durable_long import (
    FILE_SIZE,
    LINE_SIZE,
    MAGIC,
    MAX_VALUE,
    MIN_VALUE,
    PAGE_SIZE,
    DurableLong,
    parse_slot,
    read_long_file,
    render_line,
)
from qjm.server.storage import DiskStorage
from qjm.testing.util import inspect_journal

NS = NamespaceInfo(7, "cluster", 0)


def slots(path: Path) -> list[tuple[int, int] | None]:
    data = path.read_bytes()
    return [parse_slot(data[i * PAGE_SIZE : (i + 1) * PAGE_SIZE], i) for i in (0, 1)]


def newest_slot(path: Path) -> int:
    """The index of the slot written last (the valid one with the highest seq)."""
    return max((rec[1], i) for i, rec in enumerate(slots(path)) if rec is not None)[1]


def corrupt(path: Path, slot: int, start: int = 20, data: bytes = b"\xffgarbage\x00") -> None:
    """Overwrite bytes of one slot's record line (a torn write or a bad sector)."""
    with open(path, "r+b") as f:
        f.seek(slot * PAGE_SIZE + start)
        f.write(data)


def write_all(path: Path, values: list[int]) -> DurableLong:
    dl = DurableLong(str(path))
    for v in values:
        dl.write(v)
    return dl


# -- format --------------------------------------------------------------------------------------


def test_record_line_is_pinned() -> None:
    """The exact bytes on disk: changing them would make existing journals unreadable."""
    line = render_line(5, 3)
    head = b"qjm-long1" + b" " * 20 + b"5" + b" " * 20 + b"3 "
    assert line == head + b"%08x\n" % zlib.crc32(head)
    assert line == b"qjm-long1                    5                    3 f2742bc9\n"
    assert len(line) == len(render_line(MIN_VALUE, MAX_VALUE)) == LINE_SIZE == 61


def test_round_trip_and_file_shape(tmp_path: Path) -> None:
    p = tmp_path / "v"
    dl = write_all(p, [42])
    try:
        assert dl.read() == read_long_file(str(p)) == 42
        data = p.read_bytes()
        assert len(data) == FILE_SIZE == 8192
        # created whole: the value in both slots (seq 0 and 1), zeros after each line
        assert slots(p) == [(42, 0), (42, 1)]
        for i in (0, 1):
            assert not any(data[i * PAGE_SIZE + LINE_SIZE : (i + 1) * PAGE_SIZE])
        assert not (tmp_path / "v.tmp").exists()
    finally:
        dl.close()


def test_missing_file_reads_as_none(tmp_path: Path) -> None:
    assert read_long_file(str(tmp_path / "nope")) is None
    assert DurableLong(str(tmp_path / "nope")).read() is None


def test_updates_alternate_slots_in_place(tmp_path: Path) -> None:
    p = tmp_path / "v"
    dl = write_all(p, [0])
    try:
        inode = p.stat().st_ino
        for k in range(1, 50):
            dl.write(k * 10)
            seq = k + 1
            assert slots(p)[seq % 2] == (k * 10, seq)
            assert slots(p)[1 - seq % 2] == ((k - 1) * 10 if k > 1 else 0, seq - 1)
            assert read_long_file(str(p)) == k * 10
        assert p.stat().st_ino == inode  # in place: never replaced after creation
        assert p.stat().st_size == FILE_SIZE
    finally:
        dl.close()


def test_values_at_the_edges_of_the_range(tmp_path: Path) -> None:
    p = tmp_path / "v"
    dl = write_all(p, [MIN_VALUE, MAX_VALUE, -1, 0])
    try:
        for v in (MIN_VALUE, MAX_VALUE, -1):
            dl.write(v)
            assert read_long_file(str(p)) == v
        for bad in (MAX_VALUE + 1, MIN_VALUE - 1):
            with pytest.raises(ValueError):
                dl.write(bad)
        assert read_long_file(str(p)) == -1
    finally:
        dl.close()


# -- damage --------------------------------------------------------------------------------------


def test_corrupt_latest_slot_reads_the_previous_value(tmp_path: Path) -> None:
    p = tmp_path / "v"
    write_all(p, [10, 20, 30]).close()
    corrupt(p, newest_slot(p))
    assert read_long_file(str(p)) == 20


def test_corrupt_older_slot_still_reads_the_latest_value(tmp_path: Path) -> None:
    p = tmp_path / "v"
    write_all(p, [10, 20, 30]).close()
    corrupt(p, 1 - newest_slot(p))
    assert read_long_file(str(p)) == 30


@pytest.mark.parametrize("written", [0, 1, 9, 10, 30, 51, 52, 59, 60, 61])
def test_torn_update_reads_the_previous_value(tmp_path: Path, written: int) -> None:
    """An update torn after ``written`` bytes: the slot holds the new prefix over the old record.
    From 60 bytes on the whole new line has landed (the old line ends in the same newline)."""
    p = tmp_path / "v"
    write_all(p, [10, 20, 30]).close()  # seqs 1 (10), 2 (20), 3 (30): slot 1 holds 30, slot 0 holds 20
    new = render_line(40, 4)  # the next update goes to slot 0
    corrupt(p, 0, 0, new[:written])
    assert read_long_file(str(p)) == (30 if written < LINE_SIZE - 1 else 40)


def test_slot_in_the_wrong_place_is_invalid(tmp_path: Path) -> None:
    """A valid page copied to the other slot (seq parity) does not count."""
    p = tmp_path / "v"
    write_all(p, [10, 20]).close()  # slot 0: (20, seq 2), slot 1: (10, seq 1)
    data = p.read_bytes()
    bogus = render_line(99, 5).ljust(PAGE_SIZE, b"\0")  # seq 5 belongs in slot 1
    p.write_bytes(bogus + data[PAGE_SIZE:])
    assert read_long_file(str(p)) == 10


def test_both_slots_corrupt_is_an_error_naming_the_file(tmp_path: Path) -> None:
    p = tmp_path / "v"
    write_all(p, [10, 20]).close()
    corrupt(p, 0)
    corrupt(p, 1)
    before = p.read_bytes()
    with pytest.raises(StorageError) as ei:
        read_long_file(str(p))
    assert str(p) in str(ei.value)
    dl = DurableLong(str(p))
    with pytest.raises(StorageError):  # never guesses: the file is left for a human
        dl.write(30)
    assert p.read_bytes() == before
    for data in (b"", b"\0" * FILE_SIZE, b"5x\n", b"qjm-long1 "):
        p.write_bytes(data)
        with pytest.raises(StorageError):
            read_long_file(str(p))


# -- legacy and restart -----------------------------------------------------------------------------


@pytest.mark.parametrize("legacy", [b"5\n", b"5", b"  5 \n", b"%20d\n" % 5, b"+5\n"])
def test_legacy_decimal_is_read_then_upgraded_on_first_write(tmp_path: Path, legacy: bytes) -> None:
    p = tmp_path / "v"
    p.write_bytes(legacy)
    assert read_long_file(str(p)) == 5
    dl = DurableLong(str(p))
    try:
        assert dl.read() == 5
        dl.write(6)
        assert p.stat().st_size == FILE_SIZE
        assert read_long_file(str(p)) == 6
        dl.write(7)  # now in place
        assert read_long_file(str(p)) == 7
    finally:
        dl.close()
    fresh = DurableLong(str(p))
    try:
        assert fresh.read() == 7
        fresh.write(8)
        assert read_long_file(str(p)) == 8
    finally:
        fresh.close()


def test_negative_legacy_value(tmp_path: Path) -> None:
    p = tmp_path / "v"
    p.write_bytes(b"-1\n")
    assert read_long_file(str(p)) == -1


def test_fresh_object_reads_what_another_wrote(tmp_path: Path) -> None:
    p = tmp_path / "v"
    a = write_all(p, [1, 2, 3])
    b = DurableLong(str(p))
    assert b.read() == 3
    a.write(4)
    assert b.read() == 4
    a.close()


def test_seq_continues_across_reopen(tmp_path: Path) -> None:
    p = tmp_path / "v"
    write_all(p, [1, 2, 3]).close()  # seq 1 (created), 2, 3
    assert slots(p) == [(2, 2), (3, 3)]
    b = DurableLong(str(p))
    try:
        b.write(4)  # seq 4: slot 0, over the older record
        assert slots(p) == [(4, 4), (3, 3)]
        assert read_long_file(str(p)) == 4
        b.write(5)
        assert slots(p) == [(4, 4), (5, 5)]
    finally:
        b.close()
    corrupt(p, 1)
    assert read_long_file(str(p)) == 4


def test_failed_sync_drops_the_fd_and_the_next_write_replaces_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "v"
    dl = write_all(p, [1, 2])
    inode = p.stat().st_ino

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(os, "fdatasync", full)
        with pytest.raises(StorageError) as ei:
            dl.write(3)
    assert ei.value.errno == errno.ENOSPC
    assert "disk full" in str(ei.value)
    dl.write(4)
    try:
        assert read_long_file(str(p)) == 4
        assert p.stat().st_ino != inode  # replaced whole: nothing relies on what the failed sync left
        assert slots(p) == [(4, 0), (4, 1)]
        dl.write(5)
        assert p.stat().st_ino != inode
        assert read_long_file(str(p)) == 5
    finally:
        dl.close()


def test_failed_create_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "v"
    p.write_bytes(b"5\n")

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    dl = DurableLong(str(p))
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", broken)
        with pytest.raises(StorageError) as ei:
            dl.write(6)
    assert ei.value.errno == errno.EIO
    assert sorted(os.listdir(tmp_path)) == ["v"]
    assert read_long_file(str(p)) == 5
    dl.write(6)
    assert read_long_file(str(p)) == 6
    dl.close()


# -- property -----------------------------------------------------------------------------------

_dirs = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    writes=st.lists(
        st.tuples(st.integers(MIN_VALUE, MAX_VALUE), st.booleans()),  # (value, reopen before writing)
        min_size=1,
        max_size=12,
    ),
    legacy=st.none() | st.integers(-(10**6), 10**6),
    damage=st.tuples(st.integers(0, LINE_SIZE - 1), st.binary(min_size=1, max_size=LINE_SIZE)),
)
def test_any_writes_then_damage_to_the_last_written_slot(
    tmp_path: Path, writes: list[tuple[int, bool]], legacy: int | None, damage: tuple[int, bytes]
) -> None:
    """Whatever the writes (and reopens), damaging the slot last written reads the value before the
    last write; when the last write was the one that created the file (both slots hold its value),
    it reads that value. Damage to the other slot never changes the result."""
    d = Path(tempfile.mkdtemp(dir=tmp_path, prefix=f"p{next(_dirs)}-"))
    p = d / "v"
    if legacy is not None:
        p.write_bytes(b"%d\n" % legacy)
    dl = DurableLong(str(p))
    for value, reopen in writes:
        if reopen:
            dl.close()
            dl = DurableLong(str(p))
        dl.write(value)
    dl.close()
    values = [v for v, _ in writes]
    assert read_long_file(str(p)) == values[-1]
    expected = values[-2] if len(values) >= 2 else values[-1]
    intact = p.read_bytes()
    last = newest_slot(p)
    start, junk = damage
    junk = junk[: LINE_SIZE - start]
    corrupt(p, last, start, junk)
    if p.read_bytes() == intact:  # the junk happened to equal what was there
        assert read_long_file(str(p)) == values[-1]
    else:
        assert read_long_file(str(p)) == expected
    p.write_bytes(intact)
    corrupt(p, 1 - last, start, junk)
    assert read_long_file(str(p)) == values[-1]


# -- DiskStorage on top -------------------------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_disk_storage_epoch_survives_a_restart(tmp_path: Path) -> None:
    st = DiskStorage(str(tmp_path), "j")
    try:
        st.write_long("last-promised-epoch", 3)
        st.write_long("last-promised-epoch", 4)
        st.write_long("last-writer-epoch", 2)
        assert st.read_long("last-promised-epoch") == 4
    finally:
        st.close()
    current = tmp_path / "j" / "current"
    assert (current / "last-promised-epoch").stat().st_size == FILE_SIZE
    view = inspect_journal(str(current))
    assert (view.promised_epoch, view.writer_epoch) == (4, 2)
    st2 = DiskStorage(str(tmp_path), "j")
    try:
        assert st2.read_long("last-promised-epoch") == 4
        assert st2.read_long("last-writer-epoch") == 2
        st2.write_long("last-promised-epoch", 5)  # in place, continuing the seq
        assert slots(current / "last-promised-epoch")[1] == (5, 3)
    finally:
        st2.close()
    assert read_long_file(str(current / "last-promised-epoch")) == 5


def test_disk_storage_reads_and_upgrades_legacy_epoch_files(tmp_path: Path) -> None:
    current = tmp_path / "j" / "current"
    current.mkdir(parents=True)
    (current / "last-promised-epoch").write_bytes(b"7\n")
    (current / "last-writer-epoch").write_bytes(b"6\n")
    assert (inspect_journal(str(current)).promised_epoch, inspect_journal(str(current)).writer_epoch) == (7, 6)
    st = DiskStorage(str(tmp_path), "j")
    try:
        assert (st.read_long("last-promised-epoch"), st.read_long("last-writer-epoch")) == (7, 6)
        st.write_long("last-promised-epoch", 8)
        assert (current / "last-promised-epoch").stat().st_size == FILE_SIZE
        assert (current / "last-writer-epoch").read_bytes() == b"6\n"
        assert st.read_long("last-promised-epoch") == 8
    finally:
        st.close()


def test_disk_storage_corrupt_epoch_file_is_an_error(tmp_path: Path) -> None:
    st = DiskStorage(str(tmp_path), "j")
    try:
        st.write_long("last-promised-epoch", 3)
        path = tmp_path / "j" / "current" / "last-promised-epoch"
        corrupt(path, 0)
        corrupt(path, 1)
        with pytest.raises(StorageError) as ei:
            st.read_long("last-promised-epoch")
        assert str(path) in str(ei.value)
    finally:
        st.close()


def test_disk_storage_best_effort_value_is_checksummed_like_the_epochs(tmp_path: Path) -> None:
    st = DiskStorage(str(tmp_path), "j")
    try:
        st.write_long("committed-txid", 123456, durable=False)
        st.write_long("committed-txid", 5, durable=False)
        data = (tmp_path / "j" / "current" / "committed-txid").read_bytes()
        assert len(data) == FILE_SIZE and data.startswith(MAGIC)
        assert st.read_long("committed-txid") == 5
    finally:
        st.close()
    # a legacy bare decimal is still read, and replaced by the slotted form on the next write
    (tmp_path / "j" / "current" / "committed-txid").write_bytes(b"%20d\n" % 7)
    st = DiskStorage(str(tmp_path), "j")
    try:
        assert st.read_long("committed-txid") == 7
        st.write_long("committed-txid", 8, durable=False)
        assert (tmp_path / "j" / "current" / "committed-txid").stat().st_size == FILE_SIZE
    finally:
        st.close()


def test_disk_storage_mixing_durable_and_best_effort_on_one_name(tmp_path: Path) -> None:
    st = DiskStorage(str(tmp_path), "j")
    try:
        st.write_long("x", 1, durable=False)
        st.write_long("x", 2)  # replaces the best-effort file
        st.write_long("x", 3, durable=False)  # a durable file stays durable
        assert st.read_long("x") == 3
    finally:
        st.close()
    st = DiskStorage(str(tmp_path), "j")
    try:
        assert st.read_long("x") == 3
        st.write_long("x", 4, durable=False)  # after a restart too: the slotted format is kept
        assert (tmp_path / "j" / "current" / "x").stat().st_size == FILE_SIZE
        assert st.read_long("x") == 4
    finally:
        st.close()


def test_disk_storage_closes_kept_fds_on_close_and_format(tmp_path: Path) -> None:
    before = _open_fds()
    st = DiskStorage(str(tmp_path), "j")
    st.write_long("last-promised-epoch", 3)
    st.write_long("last-writer-epoch", 3)
    st.write_long("committed-txid", 3, durable=False)
    assert _open_fds() == before + 4  # the lock and three kept files
    st.format(NS)
    assert _open_fds() == before + 1
    assert st.read_long("last-promised-epoch") is None
    st.write_long("last-promised-epoch", 1)  # recreated after format deleted it
    assert st.read_long("last-promised-epoch") == 1
    st.close()
    assert _open_fds() == before
