"""Stub of the compiled framing module; same API as ``framing_py`` (checked by mypy.stubtest)."""

from array import array
from collections.abc import Iterable, Iterator, Sequence

from typing_extensions import Buffer, disjoint_base

from qjm._native.framing_py import ScanResult as ScanResult
from qjm.protocol.frame import FrameHeader, SegmentHeader

# The C functions other native modules cimport (fanout_c's receiver sizes frames with
# frame_length): Cython publishes them as capsules here. Not for Python callers.
__pyx_capi__: dict[str, object]

def xxh3_64(data: Buffer) -> int:
    """XXH3-64 with seed 0, the checksum of every header and payload."""

def encode_frame(records: Sequence[Buffer], *, epoch: int, segment_txid: int, first_txid: int) -> bytes:
    """Frame a batch of records; txids are implicit from ``first_txid``."""

@disjoint_base
class FrameBuilder:
    """Accumulates records of the open batch; ``take`` frames them and starts a new batch."""

    @property
    def count(self) -> int: ...
    @property
    def nbytes(self) -> int:
        """Payload bytes so far (record prefixes included)."""

    def add(self, record: Buffer) -> None: ...
    def add_many(self, records: Iterable[Buffer] | Buffer, offsets: Buffer | None = None) -> int:
        """Add every record of an iterable of buffers, or every row of a 2-D C-contiguous uint8 array,
        or, with ``offsets``, every record packed back to back in the one buffer ``records``: record
        i is ``records[offsets[i]:offsets[i + 1]]`` (``offsets``: n + 1 non-decreasing integers in a
        1-D buffer, such as a numpy int64 array or ``array('q')``).

        Returns the number of records in the open batch.
        """

    def fill_packed(self, records: Buffer, start: int, limit: int, offsets: Buffer | None = None) -> int:
        """From record ``start`` of a packed input (the rows of a 2-D C-contiguous uint8 array, or
        ``records`` + ``offsets`` as in ``add_many``), add records while the batch holds fewer than
        ``limit`` payload bytes; returns the index of the first record not added.

        The writer closes batches at ``batch_bytes`` this way with no Python object per record.
        """

    def fill(self, records: Iterator[Buffer], limit: int) -> bool:
        """Add records from the iterator ``records`` while the batch holds fewer than ``limit``
        payload bytes; returns True once the iterator is exhausted.

        The writer closes a batch at ``batch_bytes``: this keeps that per-record decision out of a
        Python loop. A record refused as too large has been taken from the iterator.
        """

    def take(self, *, epoch: int, segment_txid: int, first_txid: int) -> bytes: ...

def decode_header(buf: Buffer, offset: int = 0) -> FrameHeader:
    """Parse and check a frame header (magic, version, checksum, bounds); not the payload."""

def verify_frame(buf: Buffer, offset: int = 0) -> FrameHeader:
    """Check a whole frame at ``offset``: header, payload checksum and record layout."""

def verify_frame_ids(buf: Buffer, offset: int = 0) -> tuple[int, int, int, int]:
    """``verify_frame``'s checks, returning ``(epoch, segment_txid, first_txid, last_txid)``."""

def decode_records(buf: Buffer, offset: int = 0) -> list[bytes]:
    """The records of the verified frame at ``offset``, in txid order."""

def pack_records(buf: Buffer, offset: int = 0, skip: int = 0) -> tuple[bytes, array[int]]:
    """The records of the verified frame at ``offset`` from the ``skip``-th on, back to back:
    ``(data, offsets)``, record i being ``data[offsets[i]:offsets[i + 1]]`` (``offsets``: an
    ``array('q')`` of n + 1 entries, the layout of an Arrow large-binary array)."""

def encode_segment_header(start_txid: int, epoch: int) -> bytes: ...
def decode_segment_header(buf: Buffer) -> SegmentHeader: ...
def scan(
    buf: Buffer,
    start_txid: int,
    offset: int = 64,
    *,
    expected_txid: int | None = None,
    last_epoch: int = 0,
    base: int = 0,
) -> ScanResult:
    """Walk the frames of a segment from ``offset``: each must verify and continue the txids.

    To scan a large file a window at a time: ``buf`` holds the bytes from file offset ``base``,
    ``expected_txid`` and ``last_epoch`` carry on from the previous window; offsets in the result
    and its error are file offsets.
    """

def iter_frames(buf: Buffer, start_txid: int, offset: int = 64) -> list[tuple[FrameHeader, int]]:
    """(header, offset) of every valid frame, stopping where ``scan`` would stop."""

def layout() -> dict[str, dict[str, int]]:
    """Field offsets and sizes of the frame and segment headers, and the constants, from frame.h."""
