"""Pure-Python framing: build, verify and scan frames (twin of ``framing_c``).

Written independently of the Cython module as the simplest correct code, so that the parity
tests cross-check two implementations rather than one (style-anchors R4).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import xxhash

from qjm.errors import CorruptFrameError, TornTailError
from qjm.protocol.frame import (
    FORMAT_VERSION,
    FRAME_FIELD_OFFSETS,
    FRAME_HEADER,
    FRAME_HEADER_CHECKED,
    FRAME_HEADER_SIZE,
    FRAME_MAGIC,
    MAX_PAYLOAD,
    MAX_RECORDS,
    RECORD_PREFIX,
    RECORD_PREFIX_SIZE,
    SEGMENT_FIELD_OFFSETS,
    SEGMENT_HEADER,
    SEGMENT_HEADER_CHECKED,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    FrameHeader,
    SegmentHeader,
)

Buffer = bytes | bytearray | memoryview

_xxh3 = xxhash.xxh3_64_intdigest
_END = object()  # FrameBuilder.fill: the iterator ended


def xxh3_64(data: Buffer) -> int:
    """XXH3-64 with seed 0, the checksum of every header and payload."""
    return _xxh3(data)


def encode_frame(records: Sequence[Buffer], *, epoch: int, segment_txid: int, first_txid: int) -> bytes:
    """Frame a batch of records; txids are implicit from ``first_txid``."""
    if not records:
        raise ValueError("a frame holds at least one record")
    if len(records) > MAX_RECORDS:
        raise ValueError(f"{len(records)} records exceed the limit of {MAX_RECORDS} per frame")
    parts: list[bytes] = []
    for r in records:
        b = memoryview(r).tobytes()  # raw bytes: len() of a memoryview counts items, not bytes
        parts.append(RECORD_PREFIX.pack(len(b)))
        parts.append(b)
    payload = b"".join(parts)
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"batch of {len(payload)} bytes exceeds the frame limit of {MAX_PAYLOAD}")
    return _with_header(payload, len(records), epoch, segment_txid, first_txid)


def _with_header(payload: bytes, count: int, epoch: int, segment_txid: int, first_txid: int) -> bytes:
    head = FRAME_HEADER.pack(
        FRAME_MAGIC, FORMAT_VERSION, 0, count, len(payload), epoch, segment_txid, first_txid, _xxh3(payload), 0, 0
    )
    checked = head[:FRAME_HEADER_CHECKED]
    return checked + _xxh3(checked).to_bytes(8, "little") + payload


class FrameBuilder:
    """Accumulates records of the open batch; ``take`` frames them and starts a new batch."""

    __slots__ = ("_count", "_nbytes", "_parts")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._count = 0
        self._nbytes = 0

    @property
    def count(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """Payload bytes so far (record prefixes included)."""
        return self._nbytes

    def add(self, record: Buffer) -> None:
        record = memoryview(record).tobytes()
        n = len(record)
        if self._nbytes + RECORD_PREFIX_SIZE + n > MAX_PAYLOAD:
            raise ValueError(f"record of {n} bytes does not fit in a frame (limit {MAX_PAYLOAD} bytes)")
        self._parts.append(RECORD_PREFIX.pack(n))
        self._parts.append(bytes(record))
        self._count += 1
        self._nbytes += RECORD_PREFIX_SIZE + n

    def add_many(self, records: Iterable[Buffer] | Buffer, offsets: Buffer | None = None) -> int:
        """Add every record of an iterable of buffers, or every row of a 2-D C-contiguous uint8 array,
        or, with ``offsets``, every record packed back to back in the one buffer ``records``: record
        i is ``records[offsets[i]:offsets[i + 1]]`` (``offsets``: n + 1 non-decreasing integers in a
        1-D buffer, such as a numpy int64 array or ``array('q')``).

        Returns the number of records in the open batch.
        """
        if offsets is not None:
            self._add_packed(records, offsets, 0, -1)
            return self._count
        rows = _rows(records)
        if rows is not None:
            flat, nrows, width = rows
            for i in range(nrows):
                self.add(flat[i * width : (i + 1) * width])
            return self._count
        for r in cast(Iterable[Buffer], records):
            self.add(r)
        return self._count

    def fill_packed(self, records: Buffer, start: int, limit: int, offsets: Buffer | None = None) -> int:
        """From record ``start`` of a packed input (the rows of a 2-D C-contiguous uint8 array, or
        ``records`` + ``offsets`` as in ``add_many``), add records while the batch holds fewer than
        ``limit`` payload bytes; returns the index of the first record not added."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, not {limit}")
        if offsets is not None:
            return self._add_packed(records, offsets, start, limit)
        try:
            mv = memoryview(records)
        except TypeError:
            raise TypeError(
                f"packed records must be a 2-D buffer or come with offsets, not {type(records).__name__}"
            ) from None
        rows = _rows(mv)
        if rows is None:
            raise ValueError("rows must be one C-contiguous 2-D buffer of bytes")
        flat, nrows, width = rows
        if not 0 <= start <= nrows:
            raise ValueError(f"start {start} is outside the {nrows} records")
        i = start
        while i < nrows and self._nbytes < limit:
            self.add(flat[i * width : (i + 1) * width])
            i += 1
        return i

    def _add_packed(self, records: object, offsets: object, start: int, limit: int) -> int:
        try:
            data = memoryview(records)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"records with offsets must be one buffer, not {type(records).__name__}") from None
        if not data.c_contiguous:
            raise ValueError("records with offsets must be one C-contiguous buffer")
        data = data.cast("B")
        try:
            off = memoryview(offsets)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"offsets must be a buffer of integers, not {type(offsets).__name__}") from None
        fmt = off.format.lstrip("@=<")
        if not off.c_contiguous:
            raise ValueError("offsets must be one C-contiguous buffer of integers")
        if off.ndim != 1 or len(fmt) != 1 or fmt not in "bBhHiIlLqQnN" or off.itemsize not in (1, 2, 4, 8):
            raise ValueError("offsets must be a 1-D buffer of native integers (numpy int64, array('q'), ...)")
        if len(off) < 1:
            raise ValueError("offsets must hold at least one entry (n records need n + 1)")
        wide = off.itemsize == 8 and fmt.isupper()  # read as signed 64-bit, as the native twin does
        nrec = len(off) - 1
        if not 0 <= start <= nrec:
            raise ValueError(f"start {start} is outside the {nrec} records")
        i = start
        while i < nrec and (limit < 0 or self._nbytes < limit):
            a, b = _signed(off[i], wide), _signed(off[i + 1], wide)
            if a < 0 or b < a or b > len(data):
                raise ValueError(
                    f"offsets[{i}:{i + 2}] = [{a}, {b}] is not a range of the {len(data)}-byte records buffer"
                )
            self.add(data[a:b])
            i += 1
        return i

    def fill(self, records: Iterator[Buffer], limit: int) -> bool:
        """Add records from the iterator ``records`` while the batch holds fewer than ``limit``
        payload bytes; returns True once the iterator is exhausted."""
        while self._nbytes < limit:
            r = next(records, _END)
            if r is _END:
                return True
            self.add(r)  # type: ignore[arg-type]
        return False

    def take(self, *, epoch: int, segment_txid: int, first_txid: int) -> bytes:
        if self._count == 0:
            raise ValueError("no records to frame")
        payload = b"".join(self._parts)
        frame = _with_header(payload, self._count, epoch, segment_txid, first_txid)
        self._parts = []
        self._count = 0
        self._nbytes = 0
        return frame


def _rows(records: object) -> tuple[memoryview, int, int] | None:
    """(bytes, rows, width) of a 2-D C-contiguous buffer of single bytes; None for anything else."""
    try:
        mv = memoryview(records)  # type: ignore[arg-type]
    except TypeError:
        return None
    if mv.ndim != 2 or mv.itemsize != 1 or not mv.c_contiguous:
        return None
    nrows, width = mv.shape  # type: ignore[misc]
    return (mv.cast("B") if nrows and width else memoryview(b"")), nrows, width


def _signed(v: int, wide: bool) -> int:
    return v - (1 << 64) if wide and v >= 1 << 63 else v


_SSIZE_MAX = 2**63 - 1


def _check_ssize(v: int) -> None:
    """The compiled twin takes offsets as C ``Py_ssize_t``: the same error for one out of its range."""
    if not -_SSIZE_MAX - 1 <= v <= _SSIZE_MAX:
        raise OverflowError("Python int too large to convert to C ssize_t")


def _check_offset(offset: int) -> None:
    # A negative offset would index from the end of the buffer here, not in the compiled twin.
    _check_ssize(offset)
    if offset < 0:
        raise ValueError(f"offset must be >= 0, not {offset}")


def decode_header(buf: Buffer, offset: int = 0) -> FrameHeader:
    """Parse and check a frame header (magic, version, checksum, bounds); not the payload."""
    _check_offset(offset)
    return _decode_header(memoryview(buf), offset, offset)


def _decode_header(mv: memoryview, pos: int, offset: int) -> FrameHeader:
    """``decode_header`` at ``pos`` of ``mv``, naming ``offset`` (the file offset) in its errors."""
    if len(mv) - pos < FRAME_HEADER_SIZE:
        raise TornTailError(
            f"frame header at offset {offset} is cut short ({len(mv) - pos} of {FRAME_HEADER_SIZE} bytes)",
            reason="short_header",
            offset=offset,
        )
    (magic, version, flags, count, plen, epoch, seg, first, pxxh, reserved, hxxh) = FRAME_HEADER.unpack_from(mv, pos)
    if magic != FRAME_MAGIC:
        raise CorruptFrameError(f"bad frame magic {magic:#010x} at offset {offset}", reason="magic", offset=offset)
    if _xxh3(mv[pos : pos + FRAME_HEADER_CHECKED]) != hxxh:
        raise CorruptFrameError(
            f"frame header checksum mismatch at offset {offset}", reason="header_checksum", offset=offset
        )
    if version != FORMAT_VERSION:
        raise CorruptFrameError(
            f"unsupported frame version {version} at offset {offset}", reason="version", offset=offset
        )
    if flags != 0 or reserved != 0:
        raise CorruptFrameError(f"reserved frame fields set at offset {offset}", reason="reserved", offset=offset)
    if plen > MAX_PAYLOAD:
        raise CorruptFrameError(
            f"frame payload length {plen} exceeds the limit {MAX_PAYLOAD} at offset {offset}",
            reason="length",
            offset=offset,
        )
    if count == 0 or count > MAX_RECORDS or count * RECORD_PREFIX_SIZE > plen:
        raise CorruptFrameError(
            f"frame record count {count} impossible for {plen} payload bytes at offset {offset}",
            reason="record_count",
            offset=offset,
        )
    if first < 1 or seg < 1 or first < seg or epoch < 1:
        raise CorruptFrameError(
            f"frame txids/epoch out of range (segment {seg}, first {first}, epoch {epoch}) at offset {offset}",
            reason="txid",
            offset=offset,
        )
    return FrameHeader(
        epoch=epoch, segment_txid=seg, first_txid=first, record_count=count, payload_len=plen, payload_xxh3=pxxh
    )


def _prefix_overrun(offset: int) -> CorruptFrameError:
    return CorruptFrameError(
        f"record prefix overruns the payload in frame at {offset}", reason="records", offset=offset
    )


def _length_overrun(n: int, offset: int) -> CorruptFrameError:
    return CorruptFrameError(
        f"record length {n} overruns the payload in frame at {offset}", reason="records", offset=offset
    )


def _stray_bytes(k: int, offset: int) -> CorruptFrameError:
    return CorruptFrameError(
        f"{k} stray bytes after the last record in frame at {offset}", reason="records", offset=offset
    )


def _check_records(payload: memoryview, count: int, offset: int) -> None:
    pos = 0
    end = len(payload)
    for _ in range(count):
        if end - pos < RECORD_PREFIX_SIZE:
            raise _prefix_overrun(offset)
        (n,) = RECORD_PREFIX.unpack_from(payload, pos)
        pos += RECORD_PREFIX_SIZE
        if n > end - pos:
            raise _length_overrun(n, offset)
        pos += n
    if pos != end:
        raise _stray_bytes(end - pos, offset)


def verify_frame(buf: Buffer, offset: int = 0) -> FrameHeader:
    """Check a whole frame at ``offset``: header, payload checksum and record layout."""
    _check_offset(offset)
    return _verify_frame(memoryview(buf), offset, offset)


def verify_frame_ids(buf: Buffer, offset: int = 0) -> tuple[int, int, int, int]:
    """``verify_frame``'s checks, returning ``(epoch, segment_txid, first_txid, last_txid)``."""
    h = verify_frame(buf, offset)
    return h.epoch, h.segment_txid, h.first_txid, h.last_txid


def _verify_frame(mv: memoryview, pos: int, offset: int) -> FrameHeader:
    """``verify_frame`` at ``pos`` of ``mv``, naming ``offset`` (the file offset) in its errors."""
    h, payload = _checked_payload(mv, pos, offset)
    _check_records(payload, h.record_count, offset)
    return h


def _checked_payload(mv: memoryview, pos: int, offset: int) -> tuple[FrameHeader, memoryview]:
    """The header and payload of the frame at ``pos``, both checked but not the record layout."""
    h = _decode_header(mv, pos, offset)
    start = pos + FRAME_HEADER_SIZE
    if len(mv) - start < h.payload_len:
        raise TornTailError(
            f"frame at offset {offset} is cut short ({len(mv) - start} of {h.payload_len} payload bytes)",
            reason="short_payload",
            offset=offset,
        )
    payload = mv[start : start + h.payload_len]
    if _xxh3(payload) != h.payload_xxh3:
        raise CorruptFrameError(
            f"frame payload checksum mismatch at offset {offset}", reason="payload_checksum", offset=offset
        )
    return h, payload


def decode_records(buf: Buffer, offset: int = 0) -> list[bytes]:
    """The records of the verified frame at ``offset``, in txid order."""
    h = verify_frame(buf, offset)
    mv = memoryview(buf)
    pos = offset + FRAME_HEADER_SIZE
    out: list[bytes] = []
    for _ in range(h.record_count):
        (n,) = RECORD_PREFIX.unpack_from(mv, pos)
        pos += RECORD_PREFIX_SIZE
        out.append(bytes(mv[pos : pos + n]))
        pos += n
    return out


def pack_records(buf: Buffer, offset: int = 0, skip: int = 0) -> tuple[bytes, array[int]]:
    """The records of the verified frame at ``offset`` from the ``skip``-th on, back to back:
    ``(data, offsets)``, record i being ``data[offsets[i]:offsets[i + 1]]`` (``offsets``: an
    ``array('q')`` of n + 1 entries, the layout of an Arrow large-binary array)."""
    _check_offset(offset)
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    h, payload = _checked_payload(memoryview(buf), offset, offset)
    # the layout check of verify_frame and the packing in one walk, with its errors in its order
    parts: list[memoryview] = []
    offsets = array("q", [0])
    total = 0
    pos = 0
    end = len(payload)
    for i in range(h.record_count):
        if end - pos < RECORD_PREFIX_SIZE:
            raise _prefix_overrun(offset)
        (n,) = RECORD_PREFIX.unpack_from(payload, pos)
        pos += RECORD_PREFIX_SIZE
        if n > end - pos:
            raise _length_overrun(n, offset)
        if i >= skip:
            parts.append(payload[pos : pos + n])
            total += n
            offsets.append(total)
        pos += n
    if pos != end:
        raise _stray_bytes(end - pos, offset)
    return b"".join(parts), offsets


def encode_segment_header(start_txid: int, epoch: int) -> bytes:
    head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0, start_txid, epoch, bytes(32), 0)
    checked = head[:SEGMENT_HEADER_CHECKED]
    return checked + _xxh3(checked).to_bytes(8, "little")


def decode_segment_header(buf: Buffer) -> SegmentHeader:
    mv = memoryview(buf)
    if len(mv) < SEGMENT_HEADER_SIZE:
        raise TornTailError(
            f"segment header cut short ({len(mv)} of {SEGMENT_HEADER_SIZE} bytes)", reason="short_header", offset=0
        )
    magic, version, _flags, start, epoch, _res, hxxh = SEGMENT_HEADER.unpack_from(mv, 0)
    if magic != SEGMENT_MAGIC:
        raise CorruptFrameError(f"bad segment magic {magic:#010x}", reason="magic", offset=0)
    if _xxh3(mv[:SEGMENT_HEADER_CHECKED]) != hxxh:
        raise CorruptFrameError("segment header checksum mismatch", reason="header_checksum", offset=0)
    if version != FORMAT_VERSION:
        raise CorruptFrameError(f"unsupported segment version {version}", reason="version", offset=0)
    return SegmentHeader(start_txid=start, epoch=epoch)


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What a scan of a segment's bytes found.

    ``valid_end`` is the offset just past the last valid frame; ``tail`` is ``"clean"`` when
    nothing but zeros (preallocation) or nothing at all follows it, ``"torn"`` otherwise, in which
    case ``error`` says why the next bytes are not a frame.
    """

    valid_end: int
    frame_count: int
    first_txid: int  # 0 when there is no frame
    last_txid: int  # start_txid - 1 when there is no frame
    last_epoch: int  # epoch of the last valid frame, 0 when none
    tail: str
    error: str


def _all_zero(mv: memoryview) -> bool:
    return not any(mv.tobytes()) if len(mv) <= 1 << 16 else mv.tobytes().count(0) == len(mv)


def scan(
    buf: Buffer,
    start_txid: int,
    offset: int = SEGMENT_HEADER_SIZE,
    *,
    expected_txid: int | None = None,
    last_epoch: int = 0,
    base: int = 0,
) -> ScanResult:
    """Walk the frames of a segment from ``offset``: each must verify and continue the txids.

    Stops at the first thing that is not the next valid frame; the caller decides what to do
    with a torn tail (the node truncates in-progress segments, never finalized ones).

    To scan a large file a window at a time: ``buf`` holds the bytes from file offset ``base``,
    ``expected_txid`` and ``last_epoch`` carry on from the previous window; offsets in the result
    and its error are file offsets.
    """
    mv = memoryview(buf)
    _check_ssize(base)
    _check_offset(offset)
    if base < 0:
        raise ValueError(f"base must be >= 0, not {base}")
    if expected_txid is not None and expected_txid < 0:
        raise ValueError(f"expected_txid must be >= 0, not {expected_txid}")
    if not 0 <= last_epoch <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError(f"last_epoch out of range: {last_epoch}")
    if base > _SSIZE_MAX - max(len(mv), offset):
        raise ValueError(f"base {base} plus the buffer's {len(mv)} bytes is past the largest file offset")
    pos = offset
    count = 0
    first = 0
    expected = start_txid if expected_txid is None else expected_txid
    error = ""
    while pos < len(mv):
        if mv[pos : pos + 4].tobytes() == b"\0\0\0\0" and _all_zero(mv[pos:]):
            break
        try:
            h = _verify_frame(mv, pos, base + pos)
        except CorruptFrameError as e:
            error = f"{e.reason}: {e}"
            break
        if h.segment_txid != start_txid or h.first_txid != expected:
            error = (
                f"txid: frame at offset {base + pos} holds segment {h.segment_txid} txids {h.first_txid}.. "
                f"but {expected} was expected in segment {start_txid}"
            )
            break
        if h.epoch < last_epoch:
            error = f"epoch: frame at offset {base + pos} has epoch {h.epoch} below the previous frame's {last_epoch}"
            break
        if count == 0:
            first = h.first_txid
        count += 1
        expected = h.last_txid + 1
        last_epoch = h.epoch
        pos += h.frame_len
    tail = "clean" if not error else "torn"
    return ScanResult(
        valid_end=base + pos,
        frame_count=count,
        first_txid=first,
        last_txid=expected - 1,
        last_epoch=last_epoch,
        tail=tail,
        error=error,
    )


def iter_frames(buf: Buffer, start_txid: int, offset: int = SEGMENT_HEADER_SIZE) -> list[tuple[FrameHeader, int]]:
    """(header, offset) of every valid frame, stopping where ``scan`` would stop."""
    mv = memoryview(buf)
    out: list[tuple[FrameHeader, int]] = []
    res = scan(mv, start_txid, offset)
    pos = offset
    while pos < res.valid_end:
        h = decode_header(mv, pos)
        out.append((h, pos))
        pos += h.frame_len
    return out


def layout() -> dict[str, dict[str, int]]:
    """Field offsets and sizes of both headers, and the constants, as ``protocol.frame`` declares them.

    ``framing_c.layout()`` reports the same dict computed from ``include/qjm/frame.h``.
    """
    return {
        "frame": {**FRAME_FIELD_OFFSETS, "size": FRAME_HEADER_SIZE},
        "segment": {**SEGMENT_FIELD_OFFSETS, "size": SEGMENT_HEADER_SIZE},
        "constants": {
            "FRAME_MAGIC": FRAME_MAGIC,
            "SEGMENT_MAGIC": SEGMENT_MAGIC,
            "FORMAT_VERSION": FORMAT_VERSION,
            "FRAME_HEADER_SIZE": FRAME_HEADER_SIZE,
            "SEGMENT_HEADER_SIZE": SEGMENT_HEADER_SIZE,
            "RECORD_PREFIX_SIZE": RECORD_PREFIX_SIZE,
            "FRAME_HEADER_CHECKED": FRAME_HEADER_CHECKED,
            "SEGMENT_HEADER_CHECKED": SEGMENT_HEADER_CHECKED,
            "MAX_PAYLOAD": MAX_PAYLOAD,
            "MAX_RECORDS": MAX_RECORDS,
        },
    }
