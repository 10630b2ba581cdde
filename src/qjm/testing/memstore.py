"""MemoryStorage: the ``JournalStorage`` of the deterministic simulation, with crash semantics.

It keeps the same names and meanings as ``qjm.server.storage.DiskStorage`` and models what an
fsync guarantees, so that a simulated crash loses exactly what a real one may lose:

* A segment file is a byte array plus ``durable_len``: bytes past ``durable_len`` were appended
  but not yet synced by the appender's ``sync()``.
* Everything ``DiskStorage`` writes with an fsync (format, ``write_long(durable=True)``, paxos
  records, segment headers, recovery copies, renames, truncations) is durable at once.
* ``write_long(durable=False)`` (the best-effort committed txid) is lost by a crash, which restores
  the last durably written value (or no file).
* ``crash()`` cuts every segment file back to its durable prefix; ``crash(rng)`` instead keeps a
  random prefix of the unsynced bytes, which usually leaves a partially written last frame (a torn
  write). Open appenders die with the "process" and refuse further use.

Not thread-safe on its own: ``Journal`` serialises every call with its lock.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qjm.config import validate_journal_id
from qjm.errors import NotFoundError, StorageError
from qjm.protocol.messages import NamespaceInfo, PersistedPaxosData
from qjm.server.storage import (
    SYNC_SUFFIX,
    SegmentFile,
    aside_start,
    finalized_name,
    inprogress_name,
    segments_from_names,
)

if TYPE_CHECKING:
    from qjm.server.storage import JournalStorage, SegmentAppender, SegmentReader

__all__ = ["MemoryStorage"]


@dataclass(eq=False)
class _File:
    """A segment-like file: ``data[:durable_len]`` is what survives a crash."""

    data: bytearray
    durable_len: int

    @classmethod
    def durable(cls, data: bytes) -> _File:
        return cls(bytearray(data), len(data))

    def sync(self) -> None:
        self.durable_len = len(self.data)

    def truncate(self, size: int) -> None:
        """Truncate and fsync, as ``DiskStorage`` does."""
        del self.data[size:]
        self.sync()


class _MemReader:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, offset: int, length: int) -> bytes:
        return self._data[offset : offset + length]

    def close(self) -> None:
        pass


class _MemAppender:
    """The open in-progress segment; like an fd it follows the file through renames."""

    def __init__(self, owner: MemoryStorage, name: str, file: _File) -> None:
        self._owner = owner
        self._name = name
        self._file: _File | None = file

    def _live(self) -> _File:
        if self._file is None:
            raise StorageError(f"append to {self._owner.describe()}/{self._name}: appender is closed")
        return self._file

    @property
    def size(self) -> int:
        return len(self._live().data)

    @property
    def stager(self) -> None:
        return None

    def append(self, data: bytes) -> None:
        self._live().data += data

    def sync(self) -> None:
        self._live().sync()

    def truncate(self, size: int) -> None:
        self._live().truncate(size)

    def close(self) -> None:
        self._file = None
        self._owner._appenders.discard(self)


class MemoryStorage:
    """One journal's storage in memory; ``crash()`` drops what was never made durable."""

    def __init__(self, journal_id: str) -> None:
        self.journal_id = validate_journal_id(journal_id)
        self._ns: NamespaceInfo | None = None
        self._longs: dict[str, int] = {}  # what a reader sees now
        self._durable_longs: dict[str, int] = {}  # what a crash leaves
        self._paxos: dict[int, PersistedPaxosData] = {}
        self._files: dict[str, _File] = {}  # segment files by name, moved-aside ones included
        self._appenders: set[_MemAppender] = set()
        self.crashes = 0

    def describe(self) -> str:
        return f"mem:{self.journal_id}"

    def close(self) -> None:
        """Nothing to unlock; present so callers can treat it like ``DiskStorage``."""

    # -- crash model --------------------------------------------------------------------------

    def crash(self, rng: random.Random | None = None) -> None:
        """Lose every byte that was not durable, as a power cut would.

        With ``rng``, each file keeps a random prefix of its unsynced bytes (a torn write: the disk
        may have persisted part of what was in flight). What survives a crash is then on disk.
        """
        for app in list(self._appenders):
            app.close()
        for f in self._files.values():
            unsynced = len(f.data) - f.durable_len
            keep = rng.randint(0, unsynced) if rng is not None and unsynced > 0 else 0
            f.truncate(f.durable_len + keep)
        self._longs = dict(self._durable_longs)
        self.crashes += 1

    def file_names(self) -> list[str]:
        """Every segment-like file, moved-aside ones (``.empty``, ``.corrupt-tail-*``...) included."""
        return sorted(self._files)

    def read_file(self, name: str) -> bytes:
        return bytes(self._file(name).data)

    def durable_size(self, name: str) -> int:
        return self._file(name).durable_len

    def _file(self, name: str) -> _File:
        try:
            return self._files[name]
        except KeyError:
            raise NotFoundError(f"file {name} is not in {self.describe()}") from None

    # -- small durable files ------------------------------------------------------------------

    def read_namespace(self) -> NamespaceInfo | None:
        return self._ns

    def format(self, ns: NamespaceInfo, longs: Mapping[str, int] | None = None) -> None:
        for app in list(self._appenders):
            app.close()
        self._longs.clear()
        self._durable_longs.clear()
        self._paxos.clear()
        self._files.clear()
        for name, value in (longs or {}).items():
            self.write_long(name, value)
        self._ns = ns

    def has_data(self) -> bool:
        return self._ns is not None or bool(self._longs) or bool(self._files)

    def durable_longs(self) -> dict[str, int]:
        """The values of ``write_long`` a crash would keep (a copy)."""
        return dict(self._durable_longs)

    def read_long(self, name: str) -> int | None:
        return self._longs.get(name)

    def write_long(self, name: str, value: int, *, durable: bool = True) -> None:
        self._longs[name] = value
        if durable:
            self._durable_longs[name] = value

    def read_paxos(self, segment: int) -> PersistedPaxosData | None:
        return self._paxos.get(segment)

    def write_paxos(self, segment: int, data: PersistedPaxosData) -> None:
        self._paxos[segment] = data

    def delete_paxos(self, segment: int) -> None:
        self._paxos.pop(segment, None)

    def list_paxos(self) -> list[int]:
        return sorted(self._paxos)

    # -- segments -----------------------------------------------------------------------------

    def list_segments(self) -> list[SegmentFile]:
        return segments_from_names(self._files)

    def read_segment(self, seg: SegmentFile, offset: int = 0, length: int = -1) -> bytes:
        f = self._files.get(seg.name)
        if f is None:
            raise NotFoundError(f"segment file {seg.name} is gone from {self.describe()}")
        end = len(f.data) if length < 0 else offset + length
        return bytes(f.data[offset:end])

    def open_segment(self, seg: SegmentFile) -> SegmentReader:
        f = self._files.get(seg.name)
        if f is None:
            raise NotFoundError(f"segment file {seg.name} is gone from {self.describe()}")
        return _MemReader(bytes(f.data))  # like an fd: later renames and appends do not reach it

    def create_segment(self, start: int, header: bytes) -> SegmentAppender:
        name = inprogress_name(start)
        f = _File.durable(header)  # O_TRUNC + header + fsync of file and directory
        self._files[name] = f
        app = _MemAppender(self, name, f)
        self._appenders.add(app)
        return app

    def truncate_inprogress(self, start: int, valid_end: int) -> None:
        """Cut a torn tail, first keeping the cut bytes in ``<name>.corrupt-tail-<offset>``."""
        name = inprogress_name(start)
        f = self._file(name)
        if len(f.data) <= valid_end:
            return
        tail = bytes(f.data[valid_end:])
        if any(tail):
            self._files[f"{name}.corrupt-tail-{valid_end}"] = _File.durable(tail)
        f.truncate(valid_end)

    def finalize_segment(self, start: int, end: int, valid_end: int) -> None:
        src, dst = inprogress_name(start), finalized_name(start, end)
        if dst in self._files:
            raise StorageError(f"cannot finalize {src}: {dst} already exists")
        f = self._files.get(src)
        if f is None:
            raise StorageError(f"finalize {src}: no such file in {self.describe()}")
        f.truncate(valid_end)
        self._files[dst] = self._files.pop(src)

    def move_aside(self, seg: SegmentFile, suffix: str) -> None:
        self._files[seg.name + suffix] = self._file(seg.name)
        del self._files[seg.name]

    def delete_segment(self, seg: SegmentFile) -> int:
        f = self._files.pop(seg.name, None)
        return 0 if f is None else len(f.data)

    def segment_mtime(self, seg: SegmentFile) -> float:
        return 0.0  # the simulation purges by txid only

    def delete_aside_before(self, min_txid: int) -> int:
        doomed = [n for n in self._files if (start := aside_start(n)) is not None and start < min_txid]
        for n in doomed:
            del self._files[n]
        return len(doomed)

    @staticmethod
    def _temp_name(start: int, epoch: int) -> str:
        return f"{inprogress_name(start)}.epoch={epoch}"

    def write_temp_segment(self, start: int, epoch: int, chunks: Iterable[bytes]) -> None:
        self._files[self._temp_name(start, epoch)] = _File.durable(b"".join(chunks))

    def has_temp_segment(self, start: int, epoch: int) -> bool:
        return self._temp_name(start, epoch) in self._files

    def promote_temp_segment(self, start: int, epoch: int) -> None:
        self._files[inprogress_name(start)] = self._file(self._temp_name(start, epoch))
        del self._files[self._temp_name(start, epoch)]

    def discard_temp_segment(self, start: int, epoch: int) -> None:
        self._files.pop(self._temp_name(start, epoch), None)

    def write_sync_segment(self, start: int, end: int, chunks: Iterable[bytes]) -> None:
        self._files[finalized_name(start, end) + SYNC_SUFFIX] = _File.durable(b"".join(chunks))

    def install_sync_segment(self, start: int, end: int) -> None:
        dst = finalized_name(start, end)
        if dst in self._files:
            raise StorageError(f"cannot install a catch-up copy: {dst} already exists")
        self._files[dst] = self._file(dst + SYNC_SUFFIX)
        del self._files[dst + SYNC_SUFFIX]

    def discard_sync_segment(self, start: int, end: int) -> None:
        self._files.pop(finalized_name(start, end) + SYNC_SUFFIX, None)

    def disk_bytes(self) -> int:
        return sum(len(f.data) for f in self._files.values())


if TYPE_CHECKING:
    _conforms: JournalStorage = MemoryStorage("type-check")
