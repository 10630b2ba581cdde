"""A durable integer updated in place: two checksummed slots, one fdatasync per update.

Why: the node persists ``last-promised-epoch`` on every new_epoch and ``last-writer-epoch`` on
every start_log_segment, both on the failover path. Replacing the file (temp, fsync, rename, fsync
of the directory) costs two filesystem journal commits; overwriting a page of a file whose blocks
and size are already on disk, then fdatasync, costs one data write and no metadata.

File layout (``FILE_SIZE`` = 8192 bytes, written in full when the file is created)::

    offset    0  slot 0: one record line, then zeros up to 4096
    offset 4096  slot 1: one record line, then zeros up to 8192

A record line is exactly 61 ASCII bytes::

    b"qjm-long1 %20d %20d %08x\\n" % (value, seq, crc)
    crc = zlib.crc32(b"qjm-long1 %20d %20d " % (value, seq))   # the 52 bytes before the crc field

A slot is valid when its line is byte for byte the rendering of the value and seq it parses to
(so the crc matches and the form is canonical) and ``seq % 2`` is the slot's index; bytes after
the line are ignored. The value is the one in the valid slot with the highest seq. An update
writes seq = highest + 1 into slot ``seq % 2`` (the slot holding the older record) and fdatasyncs:
a torn write damages only that slot, and the other still holds the previous value, which is right
because an update that did not return was never acknowledged.

Creation (first durable write to a missing or legacy file, or after a failed update) writes the
new value into both slots (seq 0 and seq 1) and moves the file into place atomically, so a damaged
page right after creation still reads the created value, never an older one.

A file holding a bare decimal, such as ``b"5\\n"`` or the ``b"%20d\\n"`` line of the best-effort
``committed-txid``, is read too, so a data directory whose epoch files hold a plain number still
opens; the first durable write replaces it with the slot format.
"""

from __future__ import annotations

import errno
import os
import re
import zlib
from typing import Final

from qjm.errors import StorageError

PAGE_SIZE: Final = 4096
FILE_SIZE: Final = 2 * PAGE_SIZE
MAGIC: Final = b"qjm-long1 "
LINE_SIZE: Final = 61  # magic 10 + value 20 + " " + seq 20 + " " + crc 8 + "\n"
_CRC_COVERS: Final = 52  # bytes of the line before the crc field
MIN_VALUE: Final = -(2**63)
MAX_VALUE: Final = 2**63 - 1

_LEGACY = re.compile(rb"\s*([+-]?[0-9]+)\s*")


def storage_error(what: str, e: OSError) -> StorageError:
    """A kernel error as a ``StorageError`` that keeps its errno; ENOSPC says so in words."""
    hint = " (disk full)" if e.errno == errno.ENOSPC else ""
    err = StorageError(f"{what}: {e.strerror or e}{hint}")
    err.errno = e.errno
    return err


def fsync_dir(path: str) -> None:
    """Make a create, rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def render_line(value: int, seq: int) -> bytes:
    """The exact record line for ``value`` at ``seq`` (61 bytes for in-range numbers)."""
    head = b"%s%20d %20d " % (MAGIC, value, seq)
    return head + b"%08x\n" % zlib.crc32(head)


def render_slot(value: int, seq: int) -> bytes:
    """The whole page written for ``value`` at ``seq``: the line, then zeros."""
    return render_line(value, seq).ljust(PAGE_SIZE, b"\0")


def parse_slot(page: bytes, index: int) -> tuple[int, int] | None:
    """``(value, seq)`` of a valid slot ``index``, None for a torn, corrupt or empty one."""
    if len(page) < LINE_SIZE or not page.startswith(MAGIC):
        return None
    try:
        value = int(page[10:30])
        seq = int(page[31:51])
    except ValueError:
        return None
    if seq < 0 or seq % 2 != index or page[:LINE_SIZE] != render_line(value, seq):
        return None
    return value, seq


def decode(data: bytes, path: str) -> tuple[int, int | None]:
    """``(value, seq)`` of a file's contents; seq is None for a legacy decimal file.

    Raises ``StorageError`` when neither slot is valid and the file is not a legacy decimal:
    guessing a value for an epoch could break the promises the node made.
    """
    best: tuple[int, int] | None = None
    for index in (0, 1):
        rec = parse_slot(data[index * PAGE_SIZE : (index + 1) * PAGE_SIZE], index)
        if rec is not None and (best is None or rec[1] > best[1]):
            best = rec
    if best is not None:
        return best
    m = _LEGACY.fullmatch(data)
    if m is not None:
        return int(m.group(1)), None
    raise StorageError(
        f"unreadable durable integer file {path}: neither of its two slots holds a valid record and it is "
        f"not a legacy decimal ({len(data)} bytes, starting {data[:24]!r}); refusing to guess its value"
    )


def _read_fd(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, FILE_SIZE, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def read_long_file(path: str) -> int | None:
    """The integer stored in ``path`` in either format; None when the file does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise storage_error(f"open {path}", e) from e
    try:
        data = _read_fd(fd)
    except OSError as e:
        raise storage_error(f"read {path}", e) from e
    finally:
        os.close(fd)
    return decode(data, path)[0]


class DurableLong:
    """One durable integer file, kept open after the first write so that updates are in place.

    Not thread-safe: the owner (``DiskStorage`` under the journal's lock) serialises calls.
    """

    def __init__(self, path: str, *, replace_unreadable: bool = False) -> None:
        """``replace_unreadable``: a file whose slots are both invalid is replaced by the first
        write instead of refused (for a hint such as the committed txid, never for an epoch)."""
        self.path = path
        self._replace_unreadable = replace_unreadable
        self._fd: int | None = None
        self._seq = -1  # seq of the newest record in the open file
        self._failed = False  # the last update failed: its slot's state on disk is unknown

    def read(self) -> int | None:
        return read_long_file(self.path)

    def write(self, value: int, *, sync: bool = True) -> None:
        """Store ``value`` durably: it is on disk when this returns, or ``StorageError`` is raised.

        ``sync=False`` (a best-effort value such as the committed txid) skips the fdatasync of an
        in-place update: a crash may lose it, and the checksums still tell a torn slot from a value.
        """
        if not MIN_VALUE <= value <= MAX_VALUE:
            raise ValueError(f"durable integer {value} is outside the signed 64-bit range")
        if self._fd is None and self._open(value):
            return  # (re)created holding value
        fd = self._fd
        assert fd is not None
        seq = self._seq + 1
        try:
            n = os.pwrite(fd, render_slot(value, seq), (seq % 2) * PAGE_SIZE)
            if n != PAGE_SIZE:
                raise OSError(errno.EIO, f"short write ({n} of {PAGE_SIZE} bytes)")
            if sync:
                os.fdatasync(fd)
        except OSError as e:
            # After a failed fdatasync the page cache may claim bytes the disk never got: forget the
            # fd, and let the next write re-read the file and replace it whole (see ``_open``).
            self.close()
            self._failed = True
            raise storage_error(f"write {self.path}", e) from e
        self._seq = seq

    def _open(self, value: int) -> bool:
        """Open the file for in-place updates; returns True if it had to be (re)created holding ``value``.

        A missing file, a legacy decimal, a slotted file of the wrong size, or any file after a failed
        update is replaced atomically; a file whose slots are both invalid raises ``StorageError``.
        """
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            self._create(value)
            return True
        except OSError as e:
            raise storage_error(f"open {self.path}", e) from e
        try:
            data = _read_fd(fd)
            _, seq = decode(data, self.path)
        except OSError as e:
            os.close(fd)
            if isinstance(e, StorageError) and self._replace_unreadable:
                self._create(value)
                return True
            if isinstance(e, StorageError):
                raise
            raise storage_error(f"read {self.path}", e) from e
        if seq is None or len(data) != FILE_SIZE or self._failed:
            os.close(fd)
            self._create(value)
            return True
        self._fd, self._seq = fd, seq
        return False

    def _create(self, value: int) -> None:
        """Write a complete file holding ``value`` in both slots next to the target, then rename it in."""
        tmp = self.path + ".tmp"
        fd = -1
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            data = render_slot(value, 0) + render_slot(value, 1)
            if os.pwrite(fd, data, 0) != FILE_SIZE:
                raise OSError(errno.EIO, f"short write to {tmp}")
            os.fsync(fd)
            os.replace(tmp, self.path)
            fsync_dir(os.path.dirname(self.path) or ".")
        except OSError as e:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self._failed = True  # the rename may have happened without the directory fsync: redo it all
            raise storage_error(f"create {self.path}", e) from e
        self._fd, self._seq, self._failed = fd, 1, False

    def close(self) -> None:
        """Release the kept fd; the next write re-reads the file."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
