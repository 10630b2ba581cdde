"""Python mirror of ``include/qjm/frame.h``: constants and struct formats, no behaviour.

The C header is the source of truth; ``tests/unit/test_frame_layout.py`` checks that the
offsets reported by the native module equal the ones below.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

FRAME_MAGIC: Final = 0x464D4A51  # b"QJMF" as little-endian u32
SEGMENT_MAGIC: Final = 0x534D4A51  # b"QJMS"
FORMAT_VERSION: Final = 1

FRAME_HEADER_SIZE: Final = 64
SEGMENT_HEADER_SIZE: Final = 64
RECORD_PREFIX_SIZE: Final = 4
FRAME_HEADER_CHECKED: Final = 56
SEGMENT_HEADER_CHECKED: Final = 56

MAX_PAYLOAD: Final = 64 * 1024 * 1024
MAX_RECORDS: Final = 16 * 1024 * 1024

# magic, version, flags, record_count, payload_len, epoch, segment_txid, first_txid,
# payload_xxh3, reserved, header_xxh3
FRAME_HEADER: Final = struct.Struct("<IHHIIQQQQQQ")
# magic, version, flags, start_txid, epoch, reserved[32], header_xxh3
SEGMENT_HEADER: Final = struct.Struct("<IHHQQ32sQ")
RECORD_PREFIX: Final = struct.Struct("<I")

FRAME_FIELD_OFFSETS: Final = {
    "magic": 0,
    "version": 4,
    "flags": 6,
    "record_count": 8,
    "payload_len": 12,
    "epoch": 16,
    "segment_txid": 24,
    "first_txid": 32,
    "payload_xxh3": 40,
    "reserved": 48,
    "header_xxh3": 56,
}
SEGMENT_FIELD_OFFSETS: Final = {
    "magic": 0,
    "version": 4,
    "flags": 6,
    "start_txid": 8,
    "epoch": 16,
    "reserved": 24,
    "header_xxh3": 56,
}

assert FRAME_HEADER.size == FRAME_HEADER_SIZE
assert SEGMENT_HEADER.size == SEGMENT_HEADER_SIZE


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """A verified frame header: what a node needs to check epoch and txid continuity."""

    epoch: int
    segment_txid: int
    first_txid: int
    record_count: int
    payload_len: int
    payload_xxh3: int

    @property
    def last_txid(self) -> int:
        return self.first_txid + self.record_count - 1

    @property
    def frame_len(self) -> int:
        return FRAME_HEADER_SIZE + self.payload_len


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """The header at offset 0 of every segment file."""

    start_txid: int
    epoch: int
