"""Stub of the compiled segment appender; same API as ``segment_io_py`` (checked by mypy.stubtest)."""

from typing import Final

from typing_extensions import Buffer, disjoint_base

BLOCK: Final[int]
DEFAULT_PREALLOC: Final[int]
FLUSH_BYTES: Final[int]
EXTEND_RUN: Final[int]
URING_BUILT: Final[bool]

def io_uring_available() -> bool:
    """True when io_uring is compiled in and the kernel lets this process set up a ring."""

def io_uring_default() -> bool:
    """Whether an Appender not told otherwise writes through io_uring: only with QJM_IO_URING=1.

    Measured on this project's machine, the plain path is faster: io_uring runs the linked
    fdatasync on a kernel worker thread, two more thread switches per sync on two vCPUs.
    """

def direct_supported(directory: str) -> bool:
    """True when files in ``directory`` accept O_DIRECT writes of aligned blocks."""

@disjoint_base
class Appender:
    """An in-progress segment file opened for appending: created with ``header``, preallocated.

    ``append`` stages bytes, ``sync`` writes them and makes them durable (one fdatasync for
    everything appended since the last sync: group commit). ``size`` is the logical end.
    """

    @property
    def path(self) -> str: ...
    def __init__(
        self,
        path: str,
        header: Buffer,
        *,
        prealloc: int = 4194304,
        direct: bool = True,
        io_uring: bool | None = None,
    ) -> None: ...
    @property
    def size(self) -> int:
        """Logical end: header plus every byte appended (written or still staged)."""

    @property
    def allocated(self) -> int:
        """File length: zeros from the logical end up to the next preallocation step."""

    @property
    def direct(self) -> bool:
        """O_DIRECT is in effect (False where the filesystem refused it)."""

    @property
    def io(self) -> str:
        """The write path: ``"io_uring"`` (write linked to fdatasync) or ``"pwrite"``."""

    @property
    def closed(self) -> bool: ...
    def append(self, data: Buffer) -> None:
        """Stage ``data`` at the logical end; written by ``sync`` (or early, past FLUSH_BYTES)."""

    def sync(self) -> None:
        """Write what is staged and fdatasync: everything appended so far is durable on return."""

    def truncate(self, size: int) -> None:
        """Cut the logical end back to ``size``: later bytes become zeros on disk; durable on return."""

    def close(self) -> None:
        """Close the file; bytes staged since the last sync are dropped (they were never durable)."""
