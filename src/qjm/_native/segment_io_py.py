"""Pure-Python appender of in-progress segments (twin of ``segment_io_c``).

Written independently as the simplest correct code (style-anchors R4): buffered ``os.pwrite`` at
the logical end and ``os.fdatasync``, no O_DIRECT and no io_uring. The files it leaves are byte
for byte those of the native appender: the same header, frames and zero-filled preallocation.
"""

from __future__ import annotations

import mmap
import os
import tempfile

Buffer = bytes | bytearray | memoryview

BLOCK = 4096
DEFAULT_PREALLOC = 4 * 1024 * 1024
FIRST_STEP = 64 * 1024
FLUSH_BYTES = 8 * 1024 * 1024
EXTEND_RUN = 256 * 1024  # a write-out this large extends the file, no zeros ahead (native's comment says why)
URING_BUILT = False
_ZEROS = bytes(1024 * 1024)


def io_uring_available() -> bool:
    """Always False: the pure twin writes with os.pwrite."""
    return False


def io_uring_default() -> bool:
    """Always False: the pure twin writes with os.pwrite."""
    return False


def direct_supported(directory: str) -> bool:
    """True when files in ``directory`` accept O_DIRECT writes of aligned blocks."""
    fd, name = tempfile.mkstemp(prefix=".qjm-direct-probe-", dir=directory)
    os.close(fd)
    try:
        fd = os.open(name, os.O_RDWR | os.O_DIRECT)
        try:
            with mmap.mmap(-1, BLOCK) as block:  # page-aligned, as O_DIRECT wants
                os.pwritev(fd, [block], 0)
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        os.unlink(name)
    return True


def _up(n: int, step: int) -> int:
    return -(-n // step) * step


def preallocated(end: int, cap: int) -> int:
    """File length for a logical end: 64 KiB, doubling up to ``cap``, then multiples of ``cap``."""
    steps = [min(FIRST_STEP, cap)]
    while steps[-1] < cap:
        steps.append(min(steps[-1] * 2, cap))
    for v in steps:
        if v >= max(end, 1):
            return v
    return _up(end, cap)


class Appender:
    """An in-progress segment file opened for appending: created with ``header``, preallocated.

    ``append`` stages bytes, ``sync`` writes them and makes them durable (one fdatasync for
    everything appended since the last sync: group commit). ``size`` is the logical end.
    """

    def __init__(
        self,
        path: str,
        header: Buffer,
        *,
        prealloc: int = DEFAULT_PREALLOC,
        direct: bool = True,
        io_uring: bool | None = None,
    ) -> None:
        self._fd = -1
        if prealloc < BLOCK or prealloc % BLOCK:
            raise ValueError(f"prealloc must be a positive multiple of {BLOCK}, not {prealloc}")
        self._chunk = prealloc
        self._staged: list[bytes] = [bytes(memoryview(header))]
        self._size = len(self._staged[0])
        self._written = 0
        self._alloc = 0
        self._dirty = False
        self.path = os.fspath(path)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise self._oserror(e) from None
        try:
            self._write_out(sync=False)
            try:
                os.fsync(self._fd)
            except OSError as e:
                raise self._oserror(e) from None
        except BaseException:
            self.close()
            raise

    @property
    def size(self) -> int:
        """Logical end: header plus every byte appended (written or still staged)."""
        return self._size

    @property
    def allocated(self) -> int:
        """File length: zeros from the logical end up to the next preallocation step."""
        return self._alloc

    @property
    def direct(self) -> bool:
        """O_DIRECT is in effect: never, in the pure twin."""
        return False

    @property
    def io(self) -> str:
        """The write path: always ``"pwrite"`` here."""
        return "pwrite"

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def _oserror(self, e: OSError) -> OSError:
        return OSError(e.errno, os.strerror(e.errno or 0), self.path)

    def _pwrite(self, data: bytes, offset: int) -> None:
        view = memoryview(data)
        try:
            while view:
                n = os.pwrite(self._fd, view, offset)
                view = view[n:]
                offset += n
        except OSError as e:
            raise self._oserror(e) from None

    def _datasync(self) -> None:
        try:
            os.fdatasync(self._fd)
        except OSError as e:
            raise self._oserror(e) from None

    def _write_out(self, *, sync: bool) -> None:
        target = preallocated(self._size, self._chunk)
        if self._size - self._written >= EXTEND_RUN:
            target = min(target, _up(self._size, BLOCK))  # a large run extends the file itself
        target = max(self._alloc, target)
        if self._alloc < target:
            start = max(self._alloc, self._size)
            while start < target:
                n = min(target - start, len(_ZEROS))
                self._pwrite(_ZEROS[:n], start)
                start += n
            self._alloc = target
            self._dirty = True
        if self._size > self._written:
            self._pwrite(b"".join(self._staged), self._written)
            self._staged = []
            self._written = self._size
            self._dirty = True
        if sync and self._dirty:
            self._datasync()
            self._dirty = False

    def _check(self) -> None:
        if self._fd < 0:
            raise ValueError("I/O operation on a closed appender")

    def append(self, data: Buffer) -> None:
        """Stage ``data`` at the logical end; written by ``sync`` (or early, past FLUSH_BYTES)."""
        self._check()
        b = bytes(memoryview(data))
        if b:
            self._staged.append(b)
            self._size += len(b)
        if self._size - self._written >= FLUSH_BYTES:
            self._write_out(sync=False)

    def sync(self) -> None:
        """Write what is staged and fdatasync: everything appended so far is durable on return."""
        self._check()
        self._write_out(sync=True)

    def truncate(self, size: int) -> None:
        """Cut the logical end back to ``size``: later bytes become zeros on disk; durable on return."""
        self._check()
        if size < 0 or size > self._size:
            raise ValueError(f"cannot truncate to {size}: the segment holds {self._size} bytes")
        if size >= self._written:
            keep = b"".join(self._staged)[: size - self._written]
            self._staged = [keep]
            self._size = size
            self._write_out(sync=True)
            return
        self._staged = []
        self._pwrite(bytes(self._written - size), size)
        self._datasync()
        self._size = self._written = size
        self._dirty = False

    def close(self) -> None:
        """Close the file; bytes staged since the last sync are dropped (they were never durable)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
