"""The segment appender on both backends: preallocation, the partial last block, group commit,
truncation, errors; the native io_uring and pwrite paths and the O_DIRECT fallback; DiskStorage on top.
"""

from __future__ import annotations

import errno
import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from qjm._native import framing
from qjm.errors import StorageError
from qjm.protocol.messages import NamespaceInfo, RequestInfo
from qjm.server.journal import Journal
from qjm.server.storage import DiskStorage, inprogress_name, scan_segment_bytes

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
BACKENDS = ["py"] if NO_EXTENSIONS else ["py", "native"]
HEADER = bytes(range(64))
CHUNK = 16384


@pytest.fixture(params=BACKENDS)
def sio(request: pytest.FixtureRequest) -> ModuleType:
    """The segment_io module under test; a native module that fails to import fails the test."""
    return importlib.import_module(
        "qjm._native.segment_io_c" if request.param == "native" else "qjm._native.segment_io_py"
    )


def native() -> ModuleType:
    return importlib.import_module("qjm._native.segment_io_c")


def expected(logical: bytes, allocated: int) -> bytes:
    return logical + bytes(allocated - len(logical))


def test_create_writes_header_and_zero_preallocation(sio: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "seg"
    a = sio.Appender(str(path), HEADER, prealloc=CHUNK)
    try:
        assert (a.size, a.allocated, a.closed, a.path) == (64, CHUNK, False, str(path))
        assert path.read_bytes() == expected(HEADER, CHUNK)
    finally:
        a.close()
    assert a.closed


def test_append_is_staged_until_sync(sio: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "seg"
    a = sio.Appender(str(path), HEADER, prealloc=CHUNK)
    a.append(b"abc")
    a.append(bytearray(b"de"))
    a.append(memoryview(b"xfx")[1:2])
    assert a.size == 64 + 6
    assert path.read_bytes() == expected(HEADER, CHUNK)  # staged: not in the file yet
    a.sync()
    assert path.read_bytes() == expected(HEADER + b"abcdef", CHUNK)
    a.close()


def test_partial_last_block_is_rewritten_correctly(sio: ModuleType, tmp_path: Path) -> None:
    """Many small synced appends: each rewrites the partial last block with the old bytes kept."""
    path = tmp_path / "seg"
    a = sio.Appender(str(path), HEADER, prealloc=CHUNK)
    logical = HEADER
    for i in range(300):
        rec = bytes([i % 251 + 1]) * (i % 97 + 1)
        a.append(rec)
        logical += rec
        if i % 3 == 0:
            a.sync()
            assert a.size == len(logical)
            assert path.read_bytes() == expected(logical, a.allocated)
    a.sync()
    assert path.read_bytes() == expected(logical, a.allocated)
    a.close()


def test_preallocation_grows_in_steps_with_zeros(sio: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "seg"
    a = sio.Appender(str(path), HEADER, prealloc=CHUNK)
    a.append(b"\x01" * (CHUNK - 64))  # exactly fills the first step
    a.sync()
    assert a.allocated == CHUNK
    a.append(b"\x02")
    a.sync()
    assert a.allocated == 2 * CHUNK
    a.append(b"\x03" * (3 * CHUNK))  # one append spanning several steps
    a.sync()
    assert a.allocated == 5 * CHUNK
    assert path.read_bytes() == expected(HEADER + b"\x01" * (CHUNK - 64) + b"\x02" + b"\x03" * (3 * CHUNK), 5 * CHUNK)
    a.close()


def test_default_preallocation_starts_small_and_doubles(sio: ModuleType, tmp_path: Path) -> None:
    """64 KiB for a new segment (cheap to create), doubling up to DEFAULT_PREALLOC, then its multiples."""
    a = sio.Appender(str(tmp_path / "seg"), HEADER)
    assert a.allocated == 64 * 1024
    seen = []
    for end in (100_000, 300_000, 3 << 20, 5 << 20, 9 << 20):
        while a.size < end:  # in write-outs below EXTEND_RUN: each preallocates ahead
            a.append(b"\x05" * min(end - a.size, sio.EXTEND_RUN - 1))
            a.sync()
        seen.append(a.allocated)
    assert sio.DEFAULT_PREALLOC == 4 << 20
    assert seen == [128 << 10, 512 << 10, 4 << 20, 8 << 20, 12 << 20]
    assert os.path.getsize(tmp_path / "seg") == 12 << 20
    a.close()


def test_a_large_write_out_extends_the_file_without_zeros_ahead(sio: ModuleType, tmp_path: Path) -> None:
    """A write-out of EXTEND_RUN bytes or more (a group commit under load) writes no zeros past its
    own last block; the next small one preallocates ahead again. Either way the file is the log
    followed by zeros, as a scanner expects."""
    path = tmp_path / "seg"
    a = sio.Appender(str(path), HEADER)
    big = os.urandom(sio.EXTEND_RUN + 100)
    a.append(big)
    a.sync()
    end = 64 + len(big)
    assert a.allocated == -(-end // 4096) * 4096
    assert path.read_bytes() == expected(HEADER + big, a.allocated)
    a.append(b"small")
    a.sync()
    assert a.allocated == 512 * 1024  # the ladder's next step at or above the end
    assert path.read_bytes() == expected(HEADER + big + b"small", 512 * 1024)
    a.append(os.urandom(sio.EXTEND_RUN - 1))  # just below: preallocates ahead as before
    a.sync()
    assert a.allocated == 1024 * 1024
    a.close()


def test_close_drops_what_was_never_synced(sio: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "seg"
    a = sio.Appender(str(path), HEADER, prealloc=CHUNK)
    a.append(b"durable")
    a.sync()
    a.append(b"lost in the crash")
    a.close()
    a.close()  # idempotent
    assert path.read_bytes() == expected(HEADER + b"durable", CHUNK)


def test_large_runs_are_written_before_sync(sio: ModuleType, tmp_path: Path) -> None:
    """Past FLUSH_BYTES staged, an append writes (without fdatasync) so memory stays bounded."""
    path = tmp_path / "seg"
    a = sio.Appender(str(path), HEADER, prealloc=CHUNK)
    big = os.urandom(sio.FLUSH_BYTES)
    a.append(big)
    data = path.read_bytes()
    assert data[: 64 + len(big)] == HEADER + big
    assert len(data) == a.allocated and not any(data[64 + len(big) :])
    a.close()


def test_truncate(sio: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "seg"
    a = sio.Appender(str(path), HEADER, prealloc=CHUNK)
    a.append(b"a" * 5000)
    a.sync()
    a.append(b"b" * 100)
    a.truncate(64 + 5050)  # inside the staged bytes
    assert path.read_bytes() == expected(HEADER + b"a" * 5000 + b"b" * 50, CHUNK)
    a.truncate(64 + 10)  # inside what is on disk, across a block boundary
    assert a.size == 74
    assert path.read_bytes() == expected(HEADER + b"a" * 10, CHUNK)
    a.append(b"c" * 5)
    a.sync()
    assert path.read_bytes() == expected(HEADER + b"a" * 10 + b"c" * 5, CHUNK)
    for bad in (-1, a.size + 1):
        with pytest.raises(ValueError):
            a.truncate(bad)
    a.close()


def test_closed_appender_refuses_io(sio: ModuleType, tmp_path: Path) -> None:
    a = sio.Appender(str(tmp_path / "seg"), HEADER, prealloc=CHUNK)
    a.close()
    for op in (lambda: a.append(b"x"), a.sync, lambda: a.truncate(0)):
        with pytest.raises(ValueError):
            op()


@pytest.mark.parametrize("prealloc", [0, 100, 4097, -4096])
def test_prealloc_must_be_whole_blocks(sio: ModuleType, tmp_path: Path, prealloc: int) -> None:
    with pytest.raises(ValueError):
        sio.Appender(str(tmp_path / "seg"), HEADER, prealloc=prealloc)
    assert not (tmp_path / "seg").exists()


def test_kernel_errors_are_oserror_with_errno_and_path(sio: ModuleType, tmp_path: Path) -> None:
    path = str(tmp_path / "missing" / "seg")
    with pytest.raises(FileNotFoundError) as ei:
        sio.Appender(path, HEADER)
    assert (ei.value.errno, ei.value.filename) == (2, path)


def test_empty_header_still_preallocates(sio: ModuleType, tmp_path: Path) -> None:
    a = sio.Appender(str(tmp_path / "seg"), b"", prealloc=CHUNK)
    assert (a.size, a.allocated) == (0, CHUNK)
    a.close()
    assert (tmp_path / "seg").read_bytes() == bytes(CHUNK)


# -- native paths -----------------------------------------------------------------------------


@pytest.mark.native
@pytest.mark.parametrize(("direct", "io_uring"), [(True, True), (True, False), (False, True), (False, False)])
def test_native_paths_write_the_same_bytes(tmp_path: Path, direct: bool, io_uring: bool) -> None:
    c = native()
    py = importlib.import_module("qjm._native.segment_io_py")
    files = []
    for name, mod, kw in (("c", c, {"direct": direct, "io_uring": io_uring}), ("py", py, {})):
        a = mod.Appender(str(tmp_path / name), HEADER, prealloc=CHUNK, **kw)
        if mod is c:
            assert a.io == ("io_uring" if io_uring and c.io_uring_available() else "pwrite")
            assert a.direct == (direct and c.direct_supported(str(tmp_path)))
        for i in range(50):
            a.append(bytes([i + 1]) * (i * 37 % 1500))
            if i % 7 == 0:
                a.sync()
        a.sync()
        a.close()
        files.append((tmp_path / name).read_bytes())
    assert files[0] == files[1]


@pytest.mark.native
def test_native_io_uring_is_available_where_the_kernel_allows_and_taken_when_asked(tmp_path: Path) -> None:
    """pwrite + fdatasync by default (it measured faster here); io_uring when an Appender asks."""
    c = native()
    assert c.io_uring_available() == (c.URING_BUILT and _kernel_allows_io_uring())
    assert c.io_uring_default() is (os.environ.get("QJM_IO_URING", "") in ("1", "true", "yes"))
    a = c.Appender(str(tmp_path / "seg"), HEADER)
    assert a.io == ("io_uring" if c.io_uring_default() else "pwrite")
    a.close()
    a = c.Appender(str(tmp_path / "seg2"), HEADER, io_uring=True)
    assert a.io == ("io_uring" if c.io_uring_available() else "pwrite")
    a.close()


def _append_in_a_child(tmp_path: Path, **env: str) -> dict[str, str]:
    """A fresh interpreter with ``env`` appends 5,000 bytes and says which path it took."""
    code = (
        "import sys, qjm._native as n\n"
        "from qjm._native import segment_io_c as c\n"
        "a = c.Appender(sys.argv[1], bytes(range(64)), prealloc=16384)\n"
        "a.append(b'y' * 5000); a.sync(); io = a.io; a.close()\n"
        "cap = n.capabilities(sys.argv[2])\n"
        "print(c.io_uring_available(), c.io_uring_default(), io, cap['io_uring'], cap['append_io'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "seg"), str(tmp_path)],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert (tmp_path / "seg").read_bytes() == expected(HEADER + b"y" * 5000, CHUNK)
    return dict(zip(["available", "default", "io", "cap_io_uring", "cap_append_io"], out, strict=True))


@pytest.mark.native
def test_qjm_io_uring_makes_io_uring_the_default(tmp_path: Path) -> None:
    uring = native().io_uring_available()
    path = "io_uring" if uring else "pwrite"
    assert _append_in_a_child(tmp_path, QJM_IO_URING="1") == {
        "available": str(uring),
        "default": str(uring),
        "io": path,
        "cap_io_uring": str(uring),
        "cap_append_io": path,
    }


def _kernel_allows_io_uring() -> bool:
    try:
        with open("/proc/sys/kernel/io_uring_disabled") as f:
            return f.read().strip() == "0"
    except FileNotFoundError:
        return True


@pytest.mark.native
def test_native_falls_back_to_pwrite_when_io_uring_is_refused_at_run_time(tmp_path: Path) -> None:
    """QJM_NO_URING=1 makes the run-time probe fail as a seccomp'd kernel would: pwrite path, same file."""
    got = _append_in_a_child(tmp_path, QJM_NO_URING="1", QJM_IO_URING="1")  # asked for, and refused
    assert got == {"available": "False", "default": "False", "io": "pwrite", "cap_io_uring": "False",
                   "cap_append_io": "pwrite"}  # fmt: skip


@pytest.fixture
def ramfs(tmp_path: Path) -> Iterator[Path]:
    """A ramfs mount: it refuses O_DIRECT, like some filesystems and FUSE mounts do (needs root)."""
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mnt)], capture_output=True, check=False)
    assert r.returncode == 0, f"cannot mount a ramfs (need root): {r.stderr!r}"
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_o_direct_refused_falls_back_to_buffered_writes(sio: ModuleType, ramfs: Path) -> None:
    assert not sio.direct_supported(str(ramfs))
    a = sio.Appender(str(ramfs / "seg"), HEADER, prealloc=CHUNK)
    assert not a.direct
    a.append(b"y" * 100)
    a.sync()
    a.close()
    assert (ramfs / "seg").read_bytes() == expected(HEADER + b"y" * 100, CHUNK)


def test_direct_supported_on_the_temp_disk(sio: ModuleType, tmp_path: Path) -> None:
    assert sio.direct_supported(str(tmp_path))  # ext4 here; tmpfs also takes O_DIRECT on Linux >= 6.6
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".qjm-direct-probe")]


# -- DiskStorage on top -------------------------------------------------------------------------

NS = NamespaceInfo(7, "cluster", 0)


def test_disk_storage_segment_has_clean_zero_tail_and_finalize_cuts_it(tmp_path: Path) -> None:
    st = DiskStorage(str(tmp_path), "j")
    try:
        j = Journal(st)
        j.format(NS)
        j.new_epoch(NS, 1)
        j.start_log_segment(RequestInfo("j", 1, 1, -1), 1)
        frames = [framing.encode_frame([b"r%d" % t], epoch=1, segment_txid=1, first_txid=t) for t in range(1, 6)]
        assert j.journal(frames[:3]) == 3
        assert j.journal(frames[3:]) == 5
        path = tmp_path / "j" / "current" / inprogress_name(1)
        data = path.read_bytes()
        valid = 64 + sum(map(len, frames))
        assert len(data) > valid and not any(data[valid:])  # preallocated, zero-filled
        res = scan_segment_bytes(data, 1)
        assert (res.valid_end, res.last_txid, res.tail) == (valid, 5, "clean")
        j.finalize_log_segment(RequestInfo("j", 1, 2, -1), 1, 5)
        done = tmp_path / "j" / "current" / f"edits_{1:019d}-{5:019d}"
        assert done.stat().st_size == valid
        j.close()
    finally:
        st.close()


def test_disk_storage_maps_kernel_errors_to_storage_error(tmp_path: Path) -> None:
    """A full disk (a small tmpfs, needs root) fails sync with StorageError(ENOSPC); so does a create."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1600k", "tmpfs", str(mnt)], capture_output=True, check=False
    )
    assert r.returncode == 0, f"cannot mount a small tmpfs (need root): {r.stderr!r}"
    try:
        st = DiskStorage(str(mnt), "j")
        try:
            app = st.create_segment(1, framing.encode_segment_header(1, 1))  # 64 KiB preallocated
            app.append(b"z" * (1024 * 1024))  # 1 MiB in one write-out fits: it preallocates nothing ahead
            app.sync()
            app.append(b"z")  # a small one grows the preallocation to 2 MiB, which does not fit
            with pytest.raises(StorageError) as ei:
                app.sync()
            assert ei.value.errno == errno.ENOSPC
            app.close()
            with pytest.raises(StorageError) as ei:
                st.create_segment(2, framing.encode_segment_header(2, 1))
            assert ei.value.errno == errno.ENOSPC
        finally:
            st.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
