"""On-disk layout of one journal (Hadoop JNStorage, reference §2): files, atomic updates, the lock.

``Journal`` holds the protocol; this module only stores. Every durable update is atomic. Files are
replaced whole (write a temporary file, fsync it, rename it over the target, fsync the directory),
except the two epoch files on the failover path: they are updated in place, one page of two, with
one fdatasync (``qjm.server.durable_long``), which costs a fraction of a rename.

Layout under ``<data-dir>/<journal-id>/``::

    in_use.lock                      exclusive flock while a node serves the journal
    current/VERSION                  namespace info (key=value lines)
    current/last-promised-epoch      8192 bytes: two 4 KiB slots, each one checksummed line
                                     "qjm-long1 <value:20> <seq:20> <crc32:08x>\n" + zeros; the
                                     valid slot with the highest seq wins (qjm.server.durable_long).
                                     A bare decimal is read too, and replaced on the first
                                     write.
    current/last-writer-epoch        same as last-promised-epoch
    current/committed-txid           same slots as last-promised-epoch, best effort: updated in
                                     place without an fdatasync; a hint (Journal lowers it to the
                                     node's log end, ignores it if unreadable)
    current/paxos/<segment>          accepted recovery: "start end inprogress accepted_epoch frames_epoch"
    current/edits_inprogress_<19 digits>
    current/edits_<19 digits>-<19 digits>
    current/edits_inprogress_<n>.epoch=<E>   recovery download, renamed in after paxos commit
    current/edits_<n>-<m>.sync       catch-up download (design §4.4), renamed to edits_<n>-<m> once whole
    current/<name>.empty|.stale|.corrupt-tail-<offset>   moved-aside files, never deleted by repair
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from qjm._native import framing, segment_io
from qjm.config import validate_journal_id
from qjm.errors import CorruptFrameError, NotFoundError, QJMError, StorageError
from qjm.protocol.frame import FRAME_HEADER_SIZE, SEGMENT_HEADER_SIZE
from qjm.protocol.messages import NamespaceInfo, PersistedPaxosData, SegmentState
from qjm.server.durable_long import DurableLong, read_long_file
from qjm.server.durable_long import fsync_dir as _fsync_dir
from qjm.server.durable_long import storage_error as _storage_error

log = logging.getLogger("qjm.storage")

_INPROGRESS = re.compile(r"edits_inprogress_(\d{19})")
_FINALIZED = re.compile(r"edits_(\d{19})-(\d{19})")
# a moved-aside or temporary segment file: .empty, .stale, .corrupt, .corrupt-tail-N, .epoch=E
_ASIDE = re.compile(r"edits_(?:inprogress_)?(\d{19})(?:-\d{19})?\..+")


@functools.lru_cache(maxsize=1 << 16)
def _segment_of(name: str) -> SegmentFile | None:
    """A file name parsed once: a journal lists the same thousands of names on every change."""
    m = _INPROGRESS.fullmatch(name)
    if m:
        return SegmentFile(int(m.group(1)), None, name)
    m = _FINALIZED.fullmatch(name)
    if m:
        return SegmentFile(int(m.group(1)), int(m.group(2)), name)
    return None


def segments_from_names(names: Iterable[str]) -> list[SegmentFile]:
    """The plain-named segment files among ``names``, ordered by start txid."""
    out = [seg for seg in map(_segment_of, names) if seg is not None]
    out.sort(key=_order)
    return out


def _order(seg: SegmentFile) -> tuple[int, bool]:
    return (seg.start, seg.end is None)


def aside_start(name: str) -> int | None:
    """The start txid of a moved-aside segment file's name, None for any other name."""
    m = _ASIDE.fullmatch(name)
    return int(m.group(1)) if m else None


def inprogress_name(start: int) -> str:
    return f"edits_inprogress_{start:019d}"


def finalized_name(start: int, end: int) -> str:
    return f"edits_{start:019d}-{end:019d}"


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """A plain-named segment file: ``end`` is None while it is in progress."""

    start: int
    end: int | None
    name: str

    @property
    def in_progress(self) -> bool:
        return self.end is None


class SegmentAppender(Protocol):
    """An open in-progress segment: appends go to the end, ``sync`` makes them durable."""

    @property
    def size(self) -> int: ...

    @property
    def stager(self) -> object | None:
        """The ``qjm._native.segment_io.Appender`` behind this one, which the native write gate
        copies received frames into in place; None where there is none (memory)."""
        ...

    def append(self, data: bytes) -> None: ...

    def sync(self) -> None: ...

    def truncate(self, size: int) -> None: ...

    def close(self) -> None: ...


class SegmentReader(Protocol):
    """An open segment file: it keeps reading the same file through a rename (a finalize) or an
    unlink (a purge), so a download started before either one completes."""

    def read(self, offset: int, length: int) -> bytes: ...

    def close(self) -> None: ...


class JournalStorage(Protocol):
    """What ``Journal`` needs from a disk; ``DiskStorage`` here, an in-memory one for the simulation."""

    journal_id: str

    def describe(self) -> str: ...

    def read_namespace(self) -> NamespaceInfo | None: ...

    def format(self, ns: NamespaceInfo, longs: Mapping[str, int] | None = None) -> None:
        """Wipe the journal and stamp ``ns``; ``longs`` are value files written durably before the
        stamp, so a crash never leaves a formatted journal without them."""
        ...

    def has_data(self) -> bool: ...

    def read_long(self, name: str) -> int | None: ...

    def write_long(self, name: str, value: int, *, durable: bool = True) -> None: ...

    def read_paxos(self, segment: int) -> PersistedPaxosData | None: ...

    def write_paxos(self, segment: int, data: PersistedPaxosData) -> None: ...

    def delete_paxos(self, segment: int) -> None: ...

    def list_paxos(self) -> list[int]: ...

    def list_segments(self) -> list[SegmentFile]: ...

    def read_segment(self, seg: SegmentFile, offset: int = 0, length: int = -1) -> bytes: ...

    def open_segment(self, seg: SegmentFile) -> SegmentReader: ...

    def create_segment(self, start: int, header: bytes) -> SegmentAppender: ...

    def truncate_inprogress(self, start: int, valid_end: int) -> None: ...

    def finalize_segment(self, start: int, end: int, valid_end: int) -> None: ...

    def move_aside(self, seg: SegmentFile, suffix: str) -> None: ...

    def delete_segment(self, seg: SegmentFile) -> int:
        """Remove a segment file; returns the bytes it held (0 if it was already gone)."""
        ...

    def segment_mtime(self, seg: SegmentFile) -> float:
        """When the file was last changed (seconds since the epoch; 0.0 if unknown): a finalized
        segment's finalize time, which age-based retention reads."""
        ...

    def delete_aside_before(self, min_txid: int) -> int:
        """Delete moved-aside files of segments starting below ``min_txid``; returns how many."""
        ...

    def write_temp_segment(self, start: int, epoch: int, chunks: Iterable[bytes]) -> None:
        """Write a recovery copy from ``chunks`` as they arrive (durable when this returns); an
        error from ``chunks`` removes the partial file and propagates."""
        ...

    def has_temp_segment(self, start: int, epoch: int) -> bool: ...

    def promote_temp_segment(self, start: int, epoch: int) -> None: ...

    def discard_temp_segment(self, start: int, epoch: int) -> None: ...

    def write_sync_segment(self, start: int, end: int, chunks: Iterable[bytes]) -> None:
        """Write a catch-up copy of finalized segment ``start``-``end`` beside the segments, as
        ``write_temp_segment`` does."""
        ...

    def install_sync_segment(self, start: int, end: int) -> None:
        """Rename the catch-up copy to the finalized segment's name."""
        ...

    def discard_sync_segment(self, start: int, end: int) -> None: ...

    def disk_bytes(self) -> int:
        """Bytes the journal's files take (segments, moved-aside files, small files), for metrics."""
        ...


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _changes_segments(method: Callable[Concatenate[DiskStorage, _P], _R]) -> Callable[Concatenate[DiskStorage, _P], _R]:
    """Marks a ``DiskStorage`` method that creates, renames or deletes files in ``current/``: the
    cached segment listing is dropped when it returns or raises (a rename may have happened even
    if the directory fsync after it failed)."""

    @functools.wraps(method)
    def wrapper(self: DiskStorage, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        finally:
            self._invalidate_segments()

    return wrapper


class _FileAppender:
    """An in-progress segment on ``qjm._native.segment_io``: preallocated with zeros, written with
    O_DIRECT (pwrite, or an io_uring write linked to fdatasync with QJM_IO_URING=1), one fdatasync
    per ``sync`` (group commit). ``size`` is the logical end; kernel errors become ``StorageError``.
    """

    def __init__(self, path: str, app: segment_io.Appender) -> None:
        self._path = path
        self._app = app

    @property
    def size(self) -> int:
        return self._app.size

    @property
    def stager(self) -> segment_io.Appender:
        return self._app

    def append(self, data: bytes) -> None:
        try:
            self._app.append(data)
        except OSError as e:
            raise _storage_error(f"append to {self._path}", e) from e

    def sync(self) -> None:
        try:
            self._app.sync()
        except OSError as e:
            raise _storage_error(f"fdatasync {self._path}", e) from e

    def truncate(self, size: int) -> None:
        try:
            self._app.truncate(size)
        except OSError as e:
            raise _storage_error(f"truncate {self._path}", e) from e

    def close(self) -> None:
        self._app.close()


def journal_ids_on_disk(data_dir: str) -> list[str]:
    """The journals a node's data directory holds: each valid id with a ``current/`` directory."""
    try:
        names = sorted(os.listdir(data_dir))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        try:
            validate_journal_id(name)
        except QJMError:
            continue
        if os.path.isdir(os.path.join(data_dir, name, "current")):
            out.append(name)
    return out


class DiskStorage:
    """One journal's directory on a local disk, locked for the life of this object."""

    def __init__(self, data_dir: str, journal_id: str) -> None:
        self.journal_id = validate_journal_id(journal_id)
        self.root = os.path.join(os.path.abspath(data_dir), journal_id)
        self.current = os.path.join(self.root, "current")
        self.paxos_dir = os.path.join(self.current, "paxos")
        try:
            os.makedirs(self.current, mode=0o700, exist_ok=True)
            self._lock_fd = os.open(os.path.join(self.root, "in_use.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise _storage_error(f"cannot create journal directory {self.root}", e) from e
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self._lock_fd)
            raise StorageError(
                f"cannot lock storage {self.root}: another JournalNode is using this directory ({e.strerror})"
            ) from e
        self._durable_longs: dict[str, DurableLong] = {}
        # list_segments cache: (mtime_ns of current/ when listed, segments). The node owns the directory
        # (flock) and every method that changes its files drops the cache; the mtime is only a guard
        # against changes behind its back (it ticks coarsely, so one in the same tick can go unseen).
        self._segments: tuple[int, tuple[SegmentFile, ...]] | None = None
        self._segments_gen = 0  # bumped on every drop, so a listing raced by a change is not cached
        os.ftruncate(self._lock_fd, 0)
        os.write(self._lock_fd, f"{os.getpid()}\n".encode())

    def describe(self) -> str:
        return self.root

    def close(self) -> None:
        self._close_small_files()
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _close_small_files(self) -> None:
        for dl in self._durable_longs.values():
            dl.close()
        self._durable_longs.clear()

    # -- small durable files ---------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.current, name)

    def _atomic_write(self, path: str, data: bytes, *, durable: bool = True) -> None:
        tmp = path + ".tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            if durable:
                _fsync_dir(os.path.dirname(path))
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise _storage_error(f"write {path}", e) from e

    def read_namespace(self) -> NamespaceInfo | None:
        try:
            with open(self._path("VERSION"), encoding="utf-8") as f:
                kv = dict(line.strip().split("=", 1) for line in f if "=" in line)
            return NamespaceInfo(int(kv["namespaceID"]), kv["clusterID"], int(kv.get("cTime", "0")))
        except FileNotFoundError:
            return None
        except (KeyError, ValueError) as e:
            raise StorageError(f"unreadable VERSION in {self.current}: {e}") from e

    def has_data(self) -> bool:
        return any(n != "paxos" for n in os.listdir(self.current))

    @_changes_segments
    def format(self, ns: NamespaceInfo, longs: Mapping[str, int] | None = None) -> None:
        self._close_small_files()
        for name in os.listdir(self.current):
            p = self._path(name)
            if name == "paxos":
                for q in os.listdir(p):
                    os.unlink(os.path.join(p, q))
            else:
                os.unlink(p)
        os.makedirs(self.paxos_dir, exist_ok=True)
        for name, value in (longs or {}).items():
            self.write_long(name, value)
        body = (
            f"namespaceID={ns.namespace_id}\nclusterID={ns.cluster_id}\ncTime={ns.ctime}\n"
            f"storageType=JOURNAL_NODE\nlayoutVersion=1\n"
        )
        self._atomic_write(self._path("VERSION"), body.encode())

    def read_long(self, name: str) -> int | None:
        """Either kind of value file: slotted durable, legacy or best-effort decimal; None if absent."""
        return read_long_file(self._path(name))

    # No segment-cache drop here: the files write_long creates are never segment files.
    def write_long(self, name: str, value: int, *, durable: bool = True) -> None:
        # Best-effort values (the committed txid, reference §2.2) change on every batch: the same
        # checksummed slots as the epochs, updated in place without an fdatasync.
        dl = self._durable_longs.get(name)
        if dl is None:
            dl = self._durable_longs[name] = DurableLong(self._path(name), replace_unreadable=not durable)
        dl.write(value, sync=durable)

    def read_paxos(self, segment: int) -> PersistedPaxosData | None:
        try:
            with open(os.path.join(self.paxos_dir, str(segment)), encoding="ascii") as f:
                start, end, inprog, accepted, *rest = f.readline().split()
            epoch = int(rest[0]) if rest else 0
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise StorageError(f"unreadable paxos record {segment} in {self.paxos_dir}: {e}") from e
        return PersistedPaxosData(SegmentState(int(start), int(end), inprog == "1", epoch), int(accepted))

    def write_paxos(self, segment: int, data: PersistedPaxosData) -> None:
        os.makedirs(self.paxos_dir, exist_ok=True)  # reference §2.1: recreate a missing paxos/
        s = data.segment_state
        line = f"{s.start_txid} {s.end_txid} {int(s.in_progress)} {data.accepted_in_epoch} {s.epoch}\n"
        human = f"# accepted recovery of segment {segment}: {s} in epoch {data.accepted_in_epoch}\n"
        self._atomic_write(os.path.join(self.paxos_dir, str(segment)), (line + human).encode())

    def delete_paxos(self, segment: int) -> None:
        try:
            os.unlink(os.path.join(self.paxos_dir, str(segment)))
            _fsync_dir(self.paxos_dir)
        except FileNotFoundError:
            pass

    def list_paxos(self) -> list[int]:
        try:
            return sorted(int(n) for n in os.listdir(self.paxos_dir) if n.isdigit())
        except FileNotFoundError:
            return []

    # -- segments -------------------------------------------------------------------------

    def _invalidate_segments(self) -> None:
        self._segments = None
        self._segments_gen += 1

    def list_segments(self) -> list[SegmentFile]:
        """The plain segment files, from a cache kept while ``current/`` is unchanged (a fresh list)."""
        mtime = os.stat(self.current).st_mtime_ns  # before listing: a change after it shows as a new mtime
        cached = self._segments
        if cached is not None and cached[0] == mtime:
            return list(cached[1])
        gen = self._segments_gen
        segments = tuple(segments_from_names(os.listdir(self.current)))
        if gen == self._segments_gen:
            self._segments = (mtime, segments)
        return list(segments)

    def read_segment(self, seg: SegmentFile, offset: int = 0, length: int = -1) -> bytes:
        try:
            with open(self._path(seg.name), "rb") as f:
                f.seek(offset)
                return f.read(length if length >= 0 else -1)
        except FileNotFoundError:
            raise NotFoundError(f"segment file {seg.name} is gone from {self.current}") from None
        except OSError as e:
            raise _storage_error(f"read {seg.name}", e) from e

    def open_segment(self, seg: SegmentFile) -> SegmentReader:
        path = self._path(seg.name)
        try:
            return _FileReader(path, os.open(path, os.O_RDONLY))
        except FileNotFoundError:
            raise NotFoundError(f"segment file {seg.name} is gone from {self.current}") from None
        except OSError as e:
            raise _storage_error(f"open {seg.name}", e) from e

    @_changes_segments
    def create_segment(self, start: int, header: bytes) -> SegmentAppender:
        path = self._path(inprogress_name(start))
        try:
            app = segment_io.Appender(path, header)  # header written, zeros preallocated, fsynced
        except OSError as e:
            raise _storage_error(f"create {path}", e) from e
        try:
            _fsync_dir(self.current)
        except OSError as e:
            app.close()
            raise _storage_error(f"create {path}", e) from e
        return _FileAppender(path, app)

    @_changes_segments
    def truncate_inprogress(self, start: int, valid_end: int) -> None:
        """Cut a torn tail, first copying the cut bytes aside so that nothing is ever destroyed."""
        path = self._path(inprogress_name(start))
        size = os.path.getsize(path)
        if size <= valid_end:
            return
        with open(path, "rb") as f:
            f.seek(valid_end)
            tail = f.read()
        tail = tail.rstrip(b"\0")  # zeros past the data are preallocation, not data
        if tail:
            self._atomic_write(path + f".corrupt-tail-{valid_end}", tail)
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, valid_end)
            os.fsync(fd)
        finally:
            os.close(fd)

    @_changes_segments
    def finalize_segment(self, start: int, end: int, valid_end: int) -> None:
        src = self._path(inprogress_name(start))
        dst = self._path(finalized_name(start, end))
        if os.path.exists(dst):
            raise StorageError(f"cannot finalize {src}: {dst} already exists")
        try:
            fd = os.open(src, os.O_RDWR)
            try:
                if os.fstat(fd).st_size != valid_end:
                    os.ftruncate(fd, valid_end)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(src, dst)
            _fsync_dir(self.current)
        except OSError as e:
            raise _storage_error(f"finalize {src}", e) from e

    @_changes_segments
    def move_aside(self, seg: SegmentFile, suffix: str) -> None:
        os.replace(self._path(seg.name), self._path(seg.name + suffix))
        _fsync_dir(self.current)

    @_changes_segments
    def delete_segment(self, seg: SegmentFile) -> int:
        path = self._path(seg.name)
        try:
            size = os.stat(path).st_size
            os.unlink(path)
        except FileNotFoundError:
            return 0
        _fsync_dir(self.current)
        return size

    def segment_mtime(self, seg: SegmentFile) -> float:
        try:
            return os.stat(self._path(seg.name)).st_mtime
        except FileNotFoundError:
            return 0.0

    @_changes_segments
    def delete_aside_before(self, min_txid: int) -> int:
        n = 0
        for name in os.listdir(self.current):
            start = aside_start(name)
            if start is not None and start < min_txid:
                try:
                    os.unlink(self._path(name))
                    n += 1
                except FileNotFoundError:
                    pass
        if n:
            _fsync_dir(self.current)
        return n

    def _temp_name(self, start: int, epoch: int) -> str:
        return self._path(f"{inprogress_name(start)}.epoch={epoch}")

    def _write_staged(self, path: str, chunks: Iterable[bytes], what: str) -> None:
        """Write ``chunks`` to ``path`` as they arrive, then fsync it and the directory; on any
        error (the download's included) the partial file is removed."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(self.current)
        except BaseException as e:
            try:
                os.unlink(path)
            except OSError:
                pass
            if isinstance(e, OSError):
                raise _storage_error(f"write {what} {path}", e) from e
            raise

    @_changes_segments
    def write_temp_segment(self, start: int, epoch: int, chunks: Iterable[bytes]) -> None:
        self._write_staged(self._temp_name(start, epoch), chunks, "recovery copy")

    def has_temp_segment(self, start: int, epoch: int) -> bool:
        return os.path.exists(self._temp_name(start, epoch))

    @_changes_segments
    def promote_temp_segment(self, start: int, epoch: int) -> None:
        os.replace(self._temp_name(start, epoch), self._path(inprogress_name(start)))
        _fsync_dir(self.current)

    @_changes_segments
    def discard_temp_segment(self, start: int, epoch: int) -> None:
        _unlink_quietly(self._temp_name(start, epoch))

    def _sync_name(self, start: int, end: int) -> str:
        return self._path(finalized_name(start, end) + SYNC_SUFFIX)

    @_changes_segments
    def write_sync_segment(self, start: int, end: int, chunks: Iterable[bytes]) -> None:
        self._write_staged(self._sync_name(start, end), chunks, "catch-up copy")

    @_changes_segments
    def install_sync_segment(self, start: int, end: int) -> None:
        dst = self._path(finalized_name(start, end))
        if os.path.exists(dst):
            raise StorageError(f"cannot install a catch-up copy: {dst} already exists")
        try:
            os.rename(self._sync_name(start, end), dst)
            _fsync_dir(self.current)
        except OSError as e:
            raise _storage_error(f"install catch-up copy {dst}", e) from e

    @_changes_segments
    def discard_sync_segment(self, start: int, end: int) -> None:
        _unlink_quietly(self._sync_name(start, end))

    def disk_bytes(self) -> int:
        total = 0
        for top in (self.current, self.paxos_dir):
            try:
                with os.scandir(top) as it:
                    for entry in it:
                        try:
                            if entry.is_file(follow_symlinks=False):
                                total += entry.stat(follow_symlinks=False).st_size
                        except OSError:
                            continue  # deleted while listed
            except OSError:
                continue
        return total


SYNC_SUFFIX = ".sync"


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _FileReader:
    """``SegmentReader`` on an fd: pread, so that several downloads may share nothing but the file."""

    def __init__(self, path: str, fd: int) -> None:
        self._path = path
        self._fd = fd

    def read(self, offset: int, length: int) -> bytes:
        try:
            return os.pread(self._fd, length, offset)
        except OSError as e:
            raise _storage_error(f"read {self._path}", e) from e

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def scan_segment_bytes(data: bytes, start: int) -> framing.ScanResult:
    """Scan a whole segment file's bytes: header first, then frames."""
    h = framing.decode_segment_header(data)
    if h.start_txid != start:
        raise CorruptFrameError(f"segment file header says start {h.start_txid}, name says {start}", reason="segment")
    return framing.scan(data, start, SEGMENT_HEADER_SIZE)


SCAN_WINDOW = 8 * 1024 * 1024


def scan_segment_windows(
    read: Callable[[int, int], bytes], start: int, window: int | None = None
) -> framing.ScanResult:
    """``scan_segment_bytes`` of a file read ``window`` bytes at a time (``read(offset, length)``,
    short only at the end of the file): the same result, errors included, holding one window (or
    one frame, up to 64 MiB) in memory instead of the whole file, which can be gigabytes."""
    window = need = max(window or SCAN_WINDOW, SEGMENT_HEADER_SIZE + FRAME_HEADER_SIZE)  # a whole header in any
    buf, base = read(0, need), 0
    if len(buf) < need:
        return scan_segment_bytes(buf, start)
    h = framing.decode_segment_header(buf)
    if h.start_txid != start:
        raise CorruptFrameError(f"segment file header says start {h.start_txid}, name says {start}", reason="segment")
    count, first, expected, last_epoch, offset = 0, 0, start, 0, SEGMENT_HEADER_SIZE
    while True:
        r = framing.scan(buf, start, offset, expected_txid=expected, last_epoch=last_epoch, base=base)
        count += r.frame_count
        first = first or r.first_txid
        expected, last_epoch = r.last_txid + 1, r.last_epoch
        done = r
        if (
            len(buf) == need
            and r.valid_end == base + offset
            and r.tail == "torn"
            and r.error.startswith("short_payload:")
        ):
            # A frame longer than what is left of the window: read it whole.
            need = max(window, FRAME_HEADER_SIZE + framing.decode_header(buf, offset).payload_len)
        elif len(buf) == need and r.valid_end == base + offset and r.tail == "clean":
            # Zeros to the end of the window: clean only if zeros run to the end of the file.
            pos, nonzero = base + len(buf), False
            while not nonzero:
                chunk = read(pos, window)
                nonzero = chunk.count(0) != len(chunk)
                pos += len(chunk)
                if len(chunk) < window:
                    break
            if nonzero:  # what a scan of the whole file says of a frame of zeros at this offset
                done = framing.scan(
                    bytes(FRAME_HEADER_SIZE) + b"\1",
                    start,
                    0,
                    expected_txid=expected,
                    last_epoch=last_epoch,
                    base=r.valid_end,
                )
            return _scanned(done, count, first)
        elif len(buf) < need or r.valid_end == base + offset:
            return _scanned(done, count, first)  # the end of the file, or a fault that is one
        else:
            need = window
        base, offset = r.valid_end, 0
        buf = read(base, need)


def _scanned(r: framing.ScanResult, count: int, first: int) -> framing.ScanResult:
    return framing.ScanResult(
        valid_end=r.valid_end,
        frame_count=count,
        first_txid=first,
        last_txid=r.last_txid,
        last_epoch=r.last_epoch,
        tail=r.tail,
        error=r.error,
    )


class SegmentStreamScan:
    """The framing scan of a segment arriving in chunks of any size (design §4.3): each frame is
    verified (checksum, txids, epochs) as soon as its last byte arrives, holding one chunk and at
    most one unfinished frame, and a download that is not whole frames up to its last byte is
    refused. ``passing(chunks)`` checks each chunk before passing it on, so a writer of the chunks
    never stores a byte past the first bad frame."""

    def __init__(self, start: int) -> None:
        self.start = start
        self._buf = bytearray()
        self._base = 0  # file offset of _buf[0]
        self._header_done = False
        self._count = 0
        self._first = 0
        self._expected = start
        self._last_epoch = 0

    def feed(self, chunk: bytes) -> None:
        buf = self._buf
        buf += chunk
        offset = 0
        if not self._header_done:
            if len(buf) < SEGMENT_HEADER_SIZE:
                return
            h = framing.decode_segment_header(buf)
            if h.start_txid != self.start:
                raise CorruptFrameError(f"segment header says start {h.start_txid}, not {self.start}", reason="segment")
            self._header_done = True
            offset = SEGMENT_HEADER_SIZE
        r = framing.scan(
            buf, self.start, offset, expected_txid=self._expected, last_epoch=self._last_epoch, base=self._base
        )
        waiting = r.tail != "clean" and r.error.startswith(("short_header:", "short_payload:"))
        if r.valid_end < self._base + len(buf) and not waiting:  # a bad frame, or zeros: never a frame's start
            raise CorruptFrameError(
                f"segment {self.start} arrived damaged at offset {r.valid_end}: {r.error or 'zeros'}", reason="download"
            )
        if r.frame_count:
            self._count += r.frame_count
            self._first = self._first or r.first_txid
            self._expected, self._last_epoch = r.last_txid + 1, r.last_epoch
        del buf[: r.valid_end - self._base]  # a frame cut by the chunk's end waits for the next chunk
        self._base = r.valid_end

    def passing(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self.feed(chunk)
            yield chunk

    def finish(self) -> framing.ScanResult:
        """The scan of the whole download; raises ``CorruptFrameError`` if it did not end on a
        frame boundary (or held no whole segment header)."""
        if not self._header_done:
            raise CorruptFrameError(
                f"segment {self.start} arrived without a whole header ({len(self._buf)} bytes)", reason="short_header"
            )
        if self._buf:
            raise CorruptFrameError(
                f"segment {self.start} arrived with {len(self._buf)} bytes past its last whole frame "
                f"(offset {self._base})",
                reason="download",
            )
        return framing.ScanResult(
            valid_end=self._base,
            frame_count=self._count,
            first_txid=self._first,
            last_txid=self._expected - 1,
            last_epoch=self._last_epoch,
            tail="clean",
            error="",
        )
