"""Framing on both backends: build, verify, decode and scan, including every kind of torn or corrupt tail."""

from __future__ import annotations

import importlib
import os
import struct
from collections.abc import Iterator
from types import ModuleType

import pytest
import xxhash

from qjm.errors import CorruptFrameError, TornTailError
from qjm.protocol.frame import (
    FORMAT_VERSION,
    FRAME_HEADER,
    FRAME_HEADER_CHECKED,
    FRAME_HEADER_SIZE,
    FRAME_MAGIC,
    MAX_PAYLOAD,
    MAX_RECORDS,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    FrameHeader,
    SegmentHeader,
)

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
BACKENDS = ["py"] if NO_EXTENSIONS else ["py", "native"]


@pytest.fixture(params=BACKENDS)
def framing(request: pytest.FixtureRequest) -> ModuleType:
    """The framing module under test. A native module that fails to import fails the test (no skip)."""
    name = "framing_c" if request.param == "native" else "framing_py"
    return importlib.import_module(f"qjm._native.{name}")


def _xxh3(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data)


def craft_frame(
    payload: bytes = b"\x00\x00\x00\x00",
    *,
    magic: int = FRAME_MAGIC,
    version: int = FORMAT_VERSION,
    flags: int = 0,
    count: int = 1,
    plen: int | None = None,
    epoch: int = 1,
    seg: int = 1,
    first: int = 1,
    pxxh: int | None = None,
    reserved: int = 0,
) -> bytes:
    """A frame with any field set by hand, whose header checksum is nevertheless valid."""
    plen = len(payload) if plen is None else plen
    pxxh = _xxh3(payload) if pxxh is None else pxxh
    head = FRAME_HEADER.pack(magic, version, flags, count, plen, epoch, seg, first, pxxh, reserved, 0)
    checked = head[:FRAME_HEADER_CHECKED]
    return checked + _xxh3(checked).to_bytes(8, "little") + payload


def records_of(n: int, start: int = 0) -> list[bytes]:
    return [f"rec-{start + i}".encode() * (i % 3 + 1) for i in range(n)]


def segment(framing: ModuleType, batches: list[int], *, start_txid: int = 1, epoch: int = 1) -> tuple[bytes, list[int]]:
    """A segment with one frame per batch size; returns its bytes and the offset of each frame."""
    out = bytearray(framing.encode_segment_header(start_txid, epoch))
    offsets = []
    txid = start_txid
    for n in batches:
        offsets.append(len(out))
        out += framing.encode_frame(records_of(n, txid), epoch=epoch, segment_txid=start_txid, first_txid=txid)
        txid += n
    return bytes(out), offsets


def expect_error(exc: pytest.ExceptionInfo[CorruptFrameError], reason: str, offset: int) -> None:
    assert exc.value.reason == reason
    assert exc.value.offset == offset


# --- checksums and the basic round trip ---------------------------------------------------------


def test_xxh3_reference_values(framing: ModuleType) -> None:
    assert framing.xxh3_64(b"") == 0x2D06800538D394C2
    assert framing.xxh3_64(b"abc") == 0x78AF5F94892F3950
    big = bytes(range(256)) * 1000
    assert framing.xxh3_64(big) == _xxh3(big)
    assert framing.xxh3_64(bytearray(big)) == framing.xxh3_64(memoryview(big)) == _xxh3(big)


def test_round_trip(framing: ModuleType) -> None:
    recs = [b"", b"a", b"hello world", bytes(range(256)) * 10]
    frame = framing.encode_frame(recs, epoch=7, segment_txid=100, first_txid=103)
    payload_len = sum(4 + len(r) for r in recs)
    assert len(frame) == FRAME_HEADER_SIZE + payload_len
    h = framing.verify_frame(frame)
    assert h == FrameHeader(
        epoch=7,
        segment_txid=100,
        first_txid=103,
        record_count=4,
        payload_len=payload_len,
        payload_xxh3=_xxh3(frame[FRAME_HEADER_SIZE:]),
    )
    assert h.last_txid == 106
    assert h.frame_len == len(frame)
    assert framing.decode_header(frame) == h
    assert framing.decode_records(frame) == recs


def test_layout_of_encoded_frame(framing: ModuleType) -> None:
    frame = framing.encode_frame([b"xy", b"z"], epoch=2, segment_txid=5, first_txid=6)
    fields = FRAME_HEADER.unpack_from(frame)
    assert fields[:9] == (FRAME_MAGIC, FORMAT_VERSION, 0, 2, 11, 2, 5, 6, _xxh3(frame[64:]))
    assert fields[9] == 0
    assert fields[10] == _xxh3(frame[:FRAME_HEADER_CHECKED])
    assert frame[64:] == b"\x02\x00\x00\x00xy\x01\x00\x00\x00z"


def test_buffer_kinds_accepted(framing: ModuleType) -> None:
    recs: list[bytes | bytearray | memoryview] = [b"abc", bytearray(b"def"), memoryview(b"xghix")[1:4]]
    frame = framing.encode_frame(recs, epoch=1, segment_txid=1, first_txid=1)
    assert framing.decode_records(frame) == [b"abc", b"def", b"ghi"]
    assert framing.decode_records(bytearray(frame)) == framing.decode_records(memoryview(frame))


def test_decode_records_at_offset(framing: ModuleType) -> None:
    seg, offsets = segment(framing, [3, 1, 5])
    txid = 1
    for off, n in zip(offsets, [3, 1, 5], strict=True):
        assert framing.decode_records(seg, off) == records_of(n, txid)
        assert framing.verify_frame(seg, off).first_txid == txid
        txid += n


def test_empty_frame_refused(framing: ModuleType) -> None:
    with pytest.raises(ValueError):
        framing.encode_frame([], epoch=1, segment_txid=1, first_txid=1)
    with pytest.raises(ValueError):
        framing.FrameBuilder().take(epoch=1, segment_txid=1, first_txid=1)


def test_too_many_records_refused(framing: ModuleType) -> None:
    class Huge:
        """Claims more records than a frame may hold; must be refused before iterating."""

        def __len__(self) -> int:
            return MAX_RECORDS + 1

        def __iter__(self) -> Iterator[bytes]:
            raise AssertionError("iterated")

    with pytest.raises(ValueError):
        framing.encode_frame(Huge(), epoch=1, segment_txid=1, first_txid=1)


def test_batch_too_large_refused(framing: ModuleType) -> None:
    half = bytes(MAX_PAYLOAD // 2)
    with pytest.raises(ValueError):
        framing.encode_frame([half, half], epoch=1, segment_txid=1, first_txid=1)


def test_record_too_large_refused(framing: ModuleType) -> None:
    b = framing.FrameBuilder()
    with pytest.raises(ValueError):
        b.add(bytes(MAX_PAYLOAD - 3))
    assert (b.count, b.nbytes) == (0, 0)
    b.add(bytes(MAX_PAYLOAD - 8))  # exactly fills the frame with the next empty record
    b.add(b"")
    assert b.nbytes == MAX_PAYLOAD
    with pytest.raises(ValueError):
        b.add(b"")
    with pytest.raises(ValueError):
        b.add_many([b""])
    assert b.count == 2
    frame = b.take(epoch=1, segment_txid=1, first_txid=1)
    assert framing.verify_frame(frame).payload_len == MAX_PAYLOAD


def test_add_many_keeps_records_before_a_refused_one(framing: ModuleType) -> None:
    b = framing.FrameBuilder()
    big = bytes(MAX_PAYLOAD // 2)
    with pytest.raises(ValueError):
        b.add_many([b"a", big, big, b"c"])
    assert b.count == 2
    assert b.nbytes == 4 + 1 + 4 + len(big)
    with pytest.raises(TypeError):
        b.add_many([b"x", 5])  # type: ignore[list-item]
    assert b.count == 3


def test_non_integer_and_out_of_range_fields(framing: ModuleType) -> None:
    for bad in (-1, 2**64, 1.5, "1"):
        with pytest.raises(struct.error):
            framing.encode_frame([b"x"], epoch=bad, segment_txid=1, first_txid=1)
        with pytest.raises(struct.error):
            framing.encode_segment_header(bad, 1)
    b = framing.FrameBuilder()
    b.add(b"x")
    with pytest.raises(struct.error):
        b.take(epoch=1, segment_txid=1, first_txid=-1)
    assert b.count == 1  # a failed take leaves the batch open
    assert b.take(epoch=1, segment_txid=1, first_txid=2) == framing.encode_frame(
        [b"x"], epoch=1, segment_txid=1, first_txid=2
    )


# --- FrameBuilder -------------------------------------------------------------------------------


def test_frame_builder(framing: ModuleType) -> None:
    b = framing.FrameBuilder()
    assert (b.count, b.nbytes) == (0, 0)
    b.add(b"one")
    assert b.add_many([b"two", bytearray(b"three")]) == 3
    assert b.add_many(iter([memoryview(b"four")])) == 4
    assert (b.count, b.nbytes) == (4, 4 * 4 + 3 + 3 + 5 + 4)
    frame = b.take(epoch=3, segment_txid=10, first_txid=12)
    assert frame == framing.encode_frame([b"one", b"two", b"three", b"four"], epoch=3, segment_txid=10, first_txid=12)
    assert (b.count, b.nbytes) == (0, 0)
    b.add(b"again")
    assert framing.decode_records(b.take(epoch=3, segment_txid=10, first_txid=16)) == [b"again"]


def test_frame_builder_many_records_and_reuse(framing: ModuleType) -> None:
    recs = [bytes([i % 256]) * (i % 200) for i in range(5000)]
    b = framing.FrameBuilder()
    for _ in range(3):
        assert b.add_many(recs) == len(recs)
        frame = b.take(epoch=1, segment_txid=1, first_txid=1)
        assert frame == framing.encode_frame(recs, epoch=1, segment_txid=1, first_txid=1)
    assert framing.decode_records(frame) == recs


def test_frame_builder_refuses_arguments(framing: ModuleType) -> None:
    with pytest.raises(TypeError):
        framing.FrameBuilder(1)


def test_add_many_numpy_rows(framing: ModuleType) -> None:
    np = pytest.importorskip("numpy")
    rows = np.arange(40 * 13, dtype=np.uint8).reshape(40, 13)
    b = framing.FrameBuilder()
    b.add(b"head")
    assert b.add_many(rows) == 41
    frame = b.take(epoch=1, segment_txid=1, first_txid=1)
    expected = [b"head"] + [bytes(r) for r in rows]
    assert frame == framing.encode_frame(expected, epoch=1, segment_txid=1, first_txid=1)
    # Non-contiguous rows and zero-width rows take the generic path and give the same bytes.
    b.add_many(rows[:, ::2])
    assert framing.decode_records(b.take(epoch=1, segment_txid=1, first_txid=1)) == [bytes(r) for r in rows[:, ::2]]
    b.add_many(np.zeros((3, 0), dtype=np.uint8))
    assert framing.decode_records(b.take(epoch=1, segment_txid=1, first_txid=1)) == [b"", b"", b""]


# --- header and record checks -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"magic": 0x12345678}, "magic"),
        ({"version": 2}, "version"),
        ({"flags": 1}, "reserved"),
        ({"reserved": 1}, "reserved"),
        ({"plen": MAX_PAYLOAD + 1}, "length"),
        ({"count": 0}, "record_count"),
        ({"count": 2}, "record_count"),  # 2 prefixes cannot fit in 4 payload bytes
        ({"count": MAX_RECORDS + 1, "plen": MAX_PAYLOAD}, "record_count"),
        ({"first": 0, "seg": 0}, "txid"),
        ({"seg": 0}, "txid"),
        ({"first": 4, "seg": 5}, "txid"),
        ({"epoch": 0}, "txid"),
    ],
)
def test_bad_header_fields(framing: ModuleType, fields: dict[str, int], reason: str) -> None:
    frame = craft_frame(**fields)
    for fn in (framing.decode_header, framing.verify_frame):
        with pytest.raises(CorruptFrameError) as exc:
            fn(b"\xff" * 8 + frame, 8)
        expect_error(exc, reason, 8)
        assert not isinstance(exc.value, TornTailError)


def test_header_checksum(framing: ModuleType) -> None:
    frame = bytearray(framing.encode_frame([b"abc"], epoch=1, segment_txid=1, first_txid=1))
    frame[20] ^= 0x01  # epoch byte
    with pytest.raises(CorruptFrameError) as exc:
        framing.decode_header(frame)
    expect_error(exc, "header_checksum", 0)


def test_payload_checksum_checked_by_verify_not_by_decode_header(framing: ModuleType) -> None:
    frame = bytearray(framing.encode_frame([b"abc"], epoch=1, segment_txid=1, first_txid=1))
    frame[-1] ^= 0x40
    assert framing.decode_header(frame).record_count == 1
    with pytest.raises(CorruptFrameError) as exc:
        framing.verify_frame(frame)
    expect_error(exc, "payload_checksum", 0)
    with pytest.raises(CorruptFrameError):
        framing.decode_records(frame)


@pytest.mark.parametrize(
    ("payload", "count"),
    [
        (b"\x05\x00\x00\x00abc", 1),  # record longer than the payload
        (b"\x01\x00\x00\x00abc", 1),  # stray bytes after the last record
        (b"\x00\x00\x00\x00\x01\x00", 1),  # stray bytes
        (b"\x01\x00\x00\x00a\x00\x00\x00", 2),  # second prefix overruns
        (b"\x04\x00\x00\x00abcd", 2),  # 2 records claimed, 1 present
        (b"\x0c\x00\x00\x00abcd\x00\x00\x00\x00efgh", 2),  # the first record spans the second's prefix
    ],
)
def test_bad_record_layout(framing: ModuleType, payload: bytes, count: int) -> None:
    frame = craft_frame(payload, count=count)
    with pytest.raises(CorruptFrameError) as exc:
        framing.verify_frame(frame)
    expect_error(exc, "records", 0)
    # pack_records checks the layout as it packs: the same error, whichever records it keeps
    for skip in (0, 1, count + 1):
        with pytest.raises(CorruptFrameError) as packed:
            framing.pack_records(frame, 0, skip)
        assert str(packed.value) == str(exc.value)
        expect_error(packed, "records", 0)


def test_short_header_and_payload_are_torn(framing: ModuleType) -> None:
    frame = framing.encode_frame([b"abcdef"], epoch=1, segment_txid=1, first_txid=1)
    with pytest.raises(TornTailError) as exc:
        framing.decode_header(frame[:63])
    expect_error(exc, "short_header", 0)
    with pytest.raises(TornTailError) as exc:
        framing.verify_frame(frame, len(frame))
    expect_error(exc, "short_header", len(frame))
    with pytest.raises(TornTailError) as exc:
        framing.verify_frame(frame[:-1])
    expect_error(exc, "short_payload", 0)
    with pytest.raises(TornTailError) as exc:
        framing.pack_records(frame[:-1])
    expect_error(exc, "short_payload", 0)
    assert framing.decode_header(frame[:64]).payload_len == 10


# --- segment header -----------------------------------------------------------------------------


def test_segment_header(framing: ModuleType) -> None:
    raw = framing.encode_segment_header(1001, 9)
    assert len(raw) == SEGMENT_HEADER_SIZE
    magic, version, flags, start, epoch, reserved, hx = SEGMENT_HEADER.unpack(raw)
    assert (magic, version, flags, start, epoch, reserved) == (SEGMENT_MAGIC, 1, 0, 1001, 9, bytes(32))
    assert hx == _xxh3(raw[:56])
    assert framing.decode_segment_header(raw) == SegmentHeader(start_txid=1001, epoch=9)
    assert framing.decode_segment_header(raw + b"trailing frames") == SegmentHeader(start_txid=1001, epoch=9)
    max_u64 = 2**64 - 1
    assert framing.decode_segment_header(framing.encode_segment_header(max_u64, max_u64)).epoch == max_u64


def test_segment_header_errors(framing: ModuleType) -> None:
    raw = framing.encode_segment_header(1, 1)
    with pytest.raises(TornTailError) as exc:
        framing.decode_segment_header(raw[:63])
    expect_error(exc, "short_header", 0)
    bad = bytearray(raw)
    bad[0] ^= 1
    with pytest.raises(CorruptFrameError) as exc:
        framing.decode_segment_header(bad)
    expect_error(exc, "magic", 0)
    bad = bytearray(raw)
    bad[9] ^= 1
    with pytest.raises(CorruptFrameError) as exc:
        framing.decode_segment_header(bad)
    expect_error(exc, "header_checksum", 0)
    head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, 2, 0, 1, 1, bytes(32), 0)[:56]
    with pytest.raises(CorruptFrameError) as exc:
        framing.decode_segment_header(head + _xxh3(head).to_bytes(8, "little"))
    expect_error(exc, "version", 0)


# --- scan ---------------------------------------------------------------------------------------


def test_scan_clean(framing: ModuleType) -> None:
    seg, offsets = segment(framing, [3, 1, 4], start_txid=10, epoch=2)
    res = framing.scan(seg, 10)
    assert res == framing.ScanResult(
        valid_end=len(seg), frame_count=3, first_txid=10, last_txid=17, last_epoch=2, tail="clean", error=""
    )
    assert [(h.first_txid, off) for h, off in framing.iter_frames(seg, 10)] == list(
        zip([10, 13, 14], offsets, strict=True)
    )


def test_scan_empty_segment(framing: ModuleType) -> None:
    seg = framing.encode_segment_header(5, 1)
    res = framing.scan(seg, 5)
    assert (res.valid_end, res.frame_count, res.first_txid, res.last_txid, res.last_epoch) == (64, 0, 0, 4, 0)
    assert (res.tail, res.error) == ("clean", "")
    assert framing.scan(seg + bytes(4096), 5) == res
    assert framing.iter_frames(seg, 5) == []


def test_scan_zero_padded(framing: ModuleType) -> None:
    seg, _ = segment(framing, [2, 2])
    res = framing.scan(seg + bytes(1 << 20), 1)
    assert (res.valid_end, res.frame_count, res.last_txid, res.tail) == (len(seg), 2, 4, "clean")


def test_scan_zero_tail_shorter_than_a_prefix_is_torn(framing: ModuleType) -> None:
    seg, _ = segment(framing, [2])
    res = framing.scan(seg + bytes(3), 1)
    assert (res.valid_end, res.frame_count, res.tail) == (len(seg), 1, "torn")
    assert res.error.startswith("short_header: ")


def test_scan_nonzero_after_zeros_is_torn(framing: ModuleType) -> None:
    seg, _ = segment(framing, [2])
    res = framing.scan(seg + bytes(100) + b"\x01", 1)
    assert (res.valid_end, res.tail) == (len(seg), "torn")
    assert res.error.startswith("magic: ")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("short_header", "short_header"),
        ("short_payload", "short_payload"),
        ("payload", "payload_checksum"),
        ("magic", "magic"),
        ("header", "header_checksum"),
        ("length", "length"),
    ],
)
def test_scan_torn_tail(framing: ModuleType, damage: str, reason: str) -> None:
    seg, offsets = segment(framing, [3, 2, 4])
    last = offsets[-1]
    buf = bytearray(seg)
    if damage == "short_header":
        buf = buf[: last + 30]
    elif damage == "short_payload":
        buf = buf[:-3]
    elif damage == "payload":
        buf[-2] ^= 0xFF
    elif damage == "magic":
        buf[last] ^= 0xFF
    elif damage == "header":
        buf[last + 33] ^= 0x10
    elif damage == "length":
        buf[last:] = craft_frame(plen=MAX_PAYLOAD + 1, first=6)
    res = framing.scan(bytes(buf), 1)
    assert (res.valid_end, res.frame_count, res.first_txid, res.last_txid, res.last_epoch) == (last, 2, 1, 5, 1)
    assert res.tail == "torn"
    assert res.error.startswith(f"{reason}: ")
    assert len(framing.iter_frames(bytes(buf), 1)) == 2


def test_scan_txid_gap_and_duplicate(framing: ModuleType) -> None:
    head = framing.encode_segment_header(1, 1)
    f1 = framing.encode_frame(records_of(3), epoch=1, segment_txid=1, first_txid=1)
    gap = framing.encode_frame(records_of(2), epoch=1, segment_txid=1, first_txid=5)
    dup = framing.encode_frame(records_of(2), epoch=1, segment_txid=1, first_txid=3)
    other_segment = framing.encode_frame(records_of(2), epoch=1, segment_txid=4, first_txid=4)
    for bad in (gap, dup, f1, other_segment):
        res = framing.scan(head + f1 + bad, 1)
        assert (res.valid_end, res.frame_count, res.last_txid, res.tail) == (64 + len(f1), 1, 3, "torn")
        assert res.error.startswith("txid: ")
    res = framing.scan(head + gap, 1)
    assert (res.frame_count, res.first_txid, res.last_txid, res.error[:6]) == (0, 0, 0, "txid: ")


def test_scan_epoch_regression(framing: ModuleType) -> None:
    head = framing.encode_segment_header(1, 1)
    f1 = framing.encode_frame([b"a"], epoch=5, segment_txid=1, first_txid=1)
    same = framing.encode_frame([b"b"], epoch=5, segment_txid=1, first_txid=2)
    older = framing.encode_frame([b"c"], epoch=4, segment_txid=1, first_txid=3)
    res = framing.scan(head + f1 + same + older, 1)
    assert (res.frame_count, res.last_txid, res.last_epoch, res.tail) == (2, 2, 5, "torn")
    assert res.error.startswith("epoch: ")


def test_scan_custom_offset(framing: ModuleType) -> None:
    frame = framing.encode_frame([b"a", b"b"], epoch=1, segment_txid=7, first_txid=7)
    res = framing.scan(frame, 7, 0)
    assert (res.valid_end, res.frame_count, res.last_txid, res.tail) == (len(frame), 1, 8, "clean")
    assert framing.scan(frame, 7, len(frame) + 10).valid_end == len(frame) + 10


def test_large_records(framing: ModuleType) -> None:
    """Records and batches above the size where the native module copies and hashes without the GIL."""
    recs = [bytes([i]) * (i * 7919 % 70_000) for i in range(40)]
    b = framing.FrameBuilder()
    b.add(recs[0])
    b.add_many(recs[1:20])
    for r in recs[20:]:
        b.add(r)
    frame = b.take(epoch=2, segment_txid=1, first_txid=1)
    assert frame == framing.encode_frame(recs, epoch=2, segment_txid=1, first_txid=1)
    assert framing.decode_records(frame) == recs
    for skip in (0, 7, 40):
        data, offsets = framing.pack_records(frame, 0, skip)
        assert [data[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)] == recs[skip:]
        assert len(data) == sum(map(len, recs[skip:]))
    seg = framing.encode_segment_header(1, 2) + frame + frame
    res = framing.scan(seg, 1)
    assert (res.frame_count, res.last_txid, res.tail) == (1, 40, "torn")
    assert res.error.startswith("txid: ")


def test_threads_share_a_segment(framing: ModuleType) -> None:
    from concurrent.futures import ThreadPoolExecutor

    seg, _ = segment(framing, [50] * 40)
    want = framing.scan(seg, 1)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: framing.scan(seg, 1), range(32)))
    assert results == [want] * 32


def test_fill_stops_at_the_limit_and_says_when_the_records_ran_out(framing: ModuleType) -> None:
    b = framing.FrameBuilder()
    it = iter([b"a" * 10, b"b" * 10, b"c" * 10, b"d"])
    assert b.fill(it, 20) is False  # 14 bytes < 20: a second record; 28 >= 20: stop there
    assert (b.count, b.nbytes) == (2, 28)
    assert b.fill(it, 20) is False  # already at the limit: takes nothing
    assert b.count == 2
    first = b.take(epoch=1, segment_txid=1, first_txid=1)
    assert framing.decode_records(first) == [b"a" * 10, b"b" * 10]
    assert b.fill(it, 1 << 20) is True
    assert framing.decode_records(b.take(epoch=1, segment_txid=1, first_txid=3)) == [b"c" * 10, b"d"]
    assert b.fill(it, 1 << 20) is True  # an exhausted iterator adds nothing
    assert b.count == 0


def test_fill_refuses_a_record_that_does_not_fit_and_keeps_the_others(framing: ModuleType) -> None:
    b = framing.FrameBuilder()
    big = bytes(MAX_PAYLOAD // 2)
    it = iter([b"x", big, big, b"after"])
    with pytest.raises(ValueError):
        b.fill(it, MAX_PAYLOAD + 1)
    assert b.count == 2  # x and the first big one; the refused one was taken from the iterator
    assert list(it) == [b"after"]
    b = framing.FrameBuilder()
    with pytest.raises(TypeError):
        b.fill([b"not", b"an iterator"], 100)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        b.fill(iter([b"ok", 5]), 100)  # type: ignore[list-item]
    assert b.count == 1


# --- packed records: one buffer + offsets, or the rows of a 2-D array -----------------------------


def test_add_many_with_offsets_reads_records_in_place(framing: ModuleType) -> None:
    import array

    np = pytest.importorskip("numpy")
    recs = [b"alpha", b"", b"gamma-delta", b"e"]
    data = b"SKIP" + b"".join(recs) + b"TAIL"  # offsets need not start at 0 nor end at the end
    ends = np.cumsum([4] + [len(r) for r in recs])
    for offsets in (
        np.concatenate([[4], ends[1:]]).astype(np.int64),
        np.concatenate([[4], ends[1:]]).astype(np.uint32),
        array.array("q", [4, *ends[1:].tolist()]),
        array.array("H", [4, *ends[1:].tolist()]),
    ):
        b = framing.FrameBuilder()
        b.add(b"head")
        assert b.add_many(data, offsets) == 5
        assert framing.decode_records(b.take(epoch=1, segment_txid=1, first_txid=1)) == [b"head", *recs]
    b = framing.FrameBuilder()
    assert b.add_many(bytearray(data), array.array("q", [0])) == 0  # no records: one offset


def test_bad_offsets_are_refused_and_the_records_before_them_kept(framing: ModuleType) -> None:
    import array

    np = pytest.importorskip("numpy")
    data = b"0123456789"
    cases: list[tuple[object, object, type[Exception]]] = [
        (data, array.array("q", [0, 4, 2]), ValueError),  # going backwards
        (data, array.array("q", [0, 4, 11]), ValueError),  # past the end of the data
        (data, array.array("q", [-1, 4]), ValueError),  # negative
        (data, array.array("Q", [0, 4, 2**64 - 1]), ValueError),  # past INT64_MAX reads as negative
        (data, array.array("d", [0.0, 4.0]), ValueError),  # not integers
        (data, np.zeros((2, 2), dtype=np.int64), ValueError),  # not 1-D
        (data, np.arange(8, dtype=np.int64)[::2], ValueError),  # not contiguous
        (data, array.array("q"), ValueError),  # not even one entry
        (data, [0, 4], TypeError),  # not a buffer
        ([b"0123", b"4567"], array.array("q", [0, 4]), TypeError),  # records not one buffer
        (np.arange(20, dtype=np.uint8)[::2], array.array("q", [0, 4]), ValueError),  # records not contiguous
    ]
    for records, offsets, exc in cases:
        b = framing.FrameBuilder()
        with pytest.raises(exc):
            b.add_many(records, offsets)  # type: ignore[arg-type]
        if exc is ValueError and isinstance(offsets, array.array) and len(offsets) == 3:
            assert framing.decode_records(b.take(epoch=1, segment_txid=1, first_txid=1)) == [b"0123"]
        else:
            assert b.count == 0
    with pytest.raises(ValueError, match="does not fit"):
        framing.FrameBuilder().add_many(bytes(MAX_PAYLOAD), array.array("q", [0, MAX_PAYLOAD]))


def test_fill_packed_stops_at_the_limit_from_any_start(framing: ModuleType) -> None:
    import array

    np = pytest.importorskip("numpy")
    data = b"".join(bytes([i]) * 6 for i in range(10))
    offsets = array.array("q", range(0, 61, 6))
    b = framing.FrameBuilder()
    assert b.fill_packed(data, 0, 25, offsets) == 3  # 10 bytes a record: 30 >= 25
    assert b.nbytes == 30
    assert b.fill_packed(data, 3, 25, offsets) == 3  # at the limit already: nothing taken
    b.take(epoch=1, segment_txid=1, first_txid=1)
    assert b.fill_packed(data, 3, 1000, offsets) == 10
    assert framing.decode_records(b.take(epoch=1, segment_txid=1, first_txid=4)) == [
        bytes([i]) * 6 for i in range(3, 10)
    ]
    rows = np.arange(30, dtype=np.uint8).reshape(10, 3)
    assert b.fill_packed(rows, 4, 14) == 6  # 7 bytes a row
    assert framing.decode_records(b.take(epoch=1, segment_txid=1, first_txid=1)) == [bytes(r) for r in rows[4:6]]
    assert b.fill_packed(rows, 10, 100) == 10 and b.count == 0
    for bad_start in (-1, 11):
        with pytest.raises(ValueError):
            b.fill_packed(rows, bad_start, 100)
        with pytest.raises(ValueError):
            b.fill_packed(data, bad_start, 100, offsets)
    with pytest.raises(ValueError):
        b.fill_packed(rows, 0, -1)
    with pytest.raises(ValueError):
        b.fill_packed(data, 0, 100)  # 1-D without offsets: not rows
    with pytest.raises(ValueError):
        b.fill_packed(rows[:, ::2], 0, 100)  # rows not contiguous
    with pytest.raises(TypeError):
        b.fill_packed([b"x"], 0, 100)  # type: ignore[arg-type]
    assert b.count == 0


@pytest.mark.skipif(NO_EXTENSIONS, reason="about the compiled module")
def test_the_native_module_hashes_with_the_baseline_xxh3_not_the_avx512_dispatcher() -> None:
    """On an AVX-512 CPU the dispatcher's 512-bit multiplies slow every commit of the core that ran
    them (framing_c.pxd); the dynamic symbols name the XXH3 the module calls."""
    with open(importlib.import_module("qjm._native.framing_c").__file__ or "", "rb") as f:
        image = f.read()
    assert b"XXH3_64bits\0" in image
    assert b"XXH3_64bits_dispatch" not in image
