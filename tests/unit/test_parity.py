"""Hypothesis: the Cython framing and its pure twin agree byte for byte, decision for decision.

Every property runs both modules on the same input and compares what they return or raise
(type, ``reason``, ``offset`` and message, since ``scan`` reports the message in ``error``).
"""

from __future__ import annotations

import importlib
import itertools
from typing import Any

import numpy as np
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from qjm.protocol.frame import FRAME_HEADER, FRAME_HEADER_SIZE, SEGMENT_HEADER_SIZE
from qjm.server.storage import scan_segment_bytes, scan_segment_windows
from qjm.testing.twins import outcome

py = importlib.import_module("qjm._native.framing_py")
c = importlib.import_module("qjm._native.framing_c")  # an import failure is an error, not a skip

PARITY = settings(max_examples=200, deadline=None)
U64 = 2**64 - 1

records_st = st.lists(st.binary(max_size=300), min_size=1, max_size=30)
txid_st = st.integers(min_value=1, max_value=U64)


@st.composite
def frame_ids(draw: st.DrawFn) -> tuple[int, int, int]:
    """(epoch, segment_txid, first_txid) a frame header accepts."""
    seg = draw(txid_st)
    first = draw(st.integers(min_value=seg, max_value=U64))
    return draw(txid_st), seg, first


@PARITY
@given(records=records_st, ids=frame_ids())
def test_encode_frame(records: list[bytes], ids: tuple[int, int, int]) -> None:
    epoch, seg, first = ids
    a = c.encode_frame(records, epoch=epoch, segment_txid=seg, first_txid=first)
    b = py.encode_frame(records, epoch=epoch, segment_txid=seg, first_txid=first)
    assert a == b
    assert c.verify_frame(a) == py.verify_frame(a)
    h = py.verify_frame(a)
    assert c.verify_frame_ids(a) == py.verify_frame_ids(a) == (h.epoch, h.segment_txid, h.first_txid, h.last_txid)
    assert c.decode_records(a) == py.decode_records(a) == records


@PARITY
@given(
    batches=st.lists(st.tuples(st.booleans(), records_st), min_size=1, max_size=5),
    ids=frame_ids(),
)
def test_frame_builder(batches: list[tuple[bool, list[bytes]]], ids: tuple[int, int, int]) -> None:
    epoch, seg, first = ids
    bc, bp = c.FrameBuilder(), py.FrameBuilder()
    for one_by_one, recs in batches:
        if one_by_one:
            for r in recs:
                bc.add(r)
                bp.add(r)
        else:
            assert bc.add_many(recs) == bp.add_many(recs)
        assert (bc.count, bc.nbytes) == (bp.count, bp.nbytes)
    a = bc.take(epoch=epoch, segment_txid=seg, first_txid=first)
    assert a == bp.take(epoch=epoch, segment_txid=seg, first_txid=first)
    assert (bc.count, bc.nbytes) == (bp.count, bp.nbytes) == (0, 0)


@PARITY
@given(start=st.integers(min_value=0, max_value=U64), epoch=st.integers(min_value=0, max_value=U64))
def test_segment_header(start: int, epoch: int) -> None:
    raw = c.encode_segment_header(start, epoch)
    assert raw == py.encode_segment_header(start, epoch)
    assert c.decode_segment_header(raw) == py.decode_segment_header(raw)


@PARITY
@given(
    value=st.one_of(
        st.integers(min_value=-(2**65), max_value=2**65), st.floats(allow_nan=False), st.text(max_size=2), st.none()
    )
)
def test_field_conversion_errors(value: object) -> None:
    assert outcome(c.encode_segment_header, value, 1) == outcome(py.encode_segment_header, value, 1)
    a = outcome(c.encode_frame, [b"x"], epoch=value, segment_txid=1, first_txid=1)
    b = outcome(py.encode_frame, [b"x"], epoch=value, segment_txid=1, first_txid=1)
    assert a == b


@st.composite
def segments(draw: st.DrawFn) -> tuple[bytes, int]:
    """A valid segment (sometimes with bent txids, epochs or zero padding), and its start txid."""
    start = draw(st.integers(min_value=1, max_value=2**40))
    epoch = draw(st.integers(min_value=1, max_value=100))
    out = bytearray(py.encode_segment_header(start, epoch))
    txid = start
    for recs in draw(st.lists(st.lists(st.binary(max_size=80), min_size=1, max_size=8), min_size=1, max_size=6)):
        first, seg = txid, start
        bend = draw(st.sampled_from(["none"] * 8 + ["gap", "dup", "segment", "epoch"]))
        if bend == "gap":
            first += draw(st.integers(min_value=1, max_value=3))
        elif bend == "dup":
            first = max(start, first - draw(st.integers(min_value=1, max_value=3)))
        elif bend == "segment":
            seg = max(1, start - 1)
        elif bend == "epoch":
            epoch = max(1, epoch - 1)
        else:
            epoch += draw(st.integers(min_value=0, max_value=1))
        out += py.encode_frame(recs, epoch=epoch, segment_txid=seg, first_txid=first)
        txid = first + len(recs)
    out += bytes(draw(st.sampled_from([0, 0, 2, 3, 4, 100])))
    return bytes(out), start


def damage(draw: st.DrawFn, buf: bytes) -> bytes:
    """Maybe truncate (mostly near the end), maybe flip one byte."""
    if draw(st.integers(min_value=0, max_value=2)) == 0:
        buf = buf[: len(buf) - draw(st.integers(min_value=0, max_value=min(len(buf), 200)))]
    if buf and draw(st.booleans()):
        pos = draw(st.integers(min_value=0, max_value=len(buf) - 1))
        flip = draw(st.integers(min_value=1, max_value=255))
        buf = buf[:pos] + bytes([buf[pos] ^ flip]) + buf[pos + 1 :]
    return buf


@PARITY
@given(data=st.data(), seg=segments())
def test_scan(data: st.DataObject, seg: tuple[bytes, int]) -> None:
    buf, start = seg
    buf = damage(data.draw, buf)
    offset = data.draw(st.sampled_from([64] * 6 + [0, len(buf)]))
    claimed_start = data.draw(st.sampled_from([start] * 6 + [start + 1, 0]))
    a = c.scan(buf, claimed_start, offset)
    assert a == py.scan(buf, claimed_start, offset)
    assert type(a) is py.ScanResult
    assert c.iter_frames(buf, claimed_start, offset) == py.iter_frames(buf, claimed_start, offset)


@PARITY
@given(data=st.data(), seg=segments())
def test_scan_carrying_on_from_an_earlier_window(data: st.DataObject, seg: tuple[bytes, int]) -> None:
    """``expected_txid``, ``last_epoch`` and ``base`` (a window of a larger file) in both twins."""
    buf, start = seg
    buf = damage(data.draw, buf)
    offset = data.draw(st.sampled_from([64, 0, len(buf)]))
    expected = data.draw(st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 + 5), st.just(start)))
    last_epoch = data.draw(st.integers(min_value=0, max_value=200))
    base = data.draw(st.integers(min_value=0, max_value=2**40))
    kw = {"expected_txid": expected, "last_epoch": last_epoch, "base": base}
    a = outcome(c.scan, buf, start, offset, **kw)
    assert a == outcome(py.scan, buf, start, offset, **kw)
    plain = c.scan(buf, start, offset)
    if expected in (None, start) and last_epoch == 0:  # the defaults: the same walk, shifted by base
        assert a.value.valid_end == plain.valid_end + base
        assert (a.value.frame_count, a.value.last_txid, a.value.tail) == (
            plain.frame_count,
            plain.last_txid,
            plain.tail,
        )
    for bad in ({"base": -1}, {"expected_txid": -1}, {"last_epoch": -1}, {"last_epoch": 2**64}):
        assert outcome(c.scan, buf, start, offset, **bad).exc_type is ValueError
        assert outcome(py.scan, buf, start, offset, **bad).exc_type is ValueError


@PARITY
@given(data=st.data(), records=records_st, ids=frame_ids())
def test_verify_frame_on_damaged_input(data: st.DataObject, records: list[bytes], ids: tuple[int, int, int]) -> None:
    epoch, seg, first = ids
    frame = py.encode_frame(records, epoch=epoch, segment_txid=seg, first_txid=first)
    pad = data.draw(st.integers(min_value=0, max_value=8))
    buf = damage(data.draw, bytes(pad) + frame)
    for fn in ("decode_header", "verify_frame", "verify_frame_ids", "decode_records", "pack_records"):
        assert outcome(getattr(c, fn), buf, pad) == outcome(getattr(py, fn), buf, pad), fn
    assert outcome(c.decode_segment_header, buf) == outcome(py.decode_segment_header, buf)


@PARITY
@given(records=records_st, ids=frame_ids(), skip=st.integers(min_value=-2, max_value=35), pad=st.integers(0, 8))
def test_pack_records(records: list[bytes], ids: tuple[int, int, int], skip: int, pad: int) -> None:
    """Both pack the same bytes and offsets, equal to the records ``decode_records`` gives."""
    epoch, seg, first = ids
    buf = bytes(pad) + py.encode_frame(records, epoch=epoch, segment_txid=seg, first_txid=first)
    a, b = outcome(c.pack_records, buf, pad, skip), outcome(py.pack_records, buf, pad, skip)
    assert a == b
    if skip < 0:
        assert a.exc_type is ValueError
        return
    data, offsets = a.value
    assert offsets.typecode == "q" and offsets[0] == 0
    assert [data[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)] == records[skip:]


FIELDS = ("magic", "version", "flags", "reserved", "count", "plen", "seg", "first", "epoch", "pxxh", "payload")


@st.composite
def crafted_frames(draw: st.DrawFn) -> bytes:
    """A frame whose header checksum is valid and where at most one chosen field is bent."""
    records = draw(st.lists(st.binary(max_size=12), min_size=1, max_size=5))
    payload = b"".join(len(r).to_bytes(4, "little") + r for r in records)
    seg = draw(txid_st)
    f: dict[str, Any] = {
        "magic": 0x464D4A51,
        "version": 1,
        "flags": 0,
        "reserved": 0,
        "count": len(records),
        "seg": seg,
        "first": draw(st.integers(min_value=seg, max_value=U64)),
        "epoch": draw(txid_st),
    }
    bent = draw(st.sampled_from((None, *FIELDS)))
    if bent == "payload":
        payload = draw(
            st.sampled_from([payload[:-1], payload + b"\x00", payload[:3] + b"\xff" + payload[4:]])
            | st.binary(max_size=40)
        )
    elif bent in ("magic", "version", "flags", "reserved"):
        f[bent] = draw(st.integers(min_value=0, max_value=2**32 - 1 if bent == "magic" else 3))
    elif bent == "count":
        f["count"] = draw(st.sampled_from([0, len(records) - 1, len(records) + 1, 2**24, 2**24 + 1, 2**32 - 1]))
    elif bent in ("seg", "first", "epoch"):
        f[bent] = draw(st.sampled_from([0, 1, max(seg - 1, 0), U64]))
    f["plen"] = (
        draw(st.sampled_from([2**26, 2**26 + 1, 2**32 - 1, len(payload) + 1])) if bent == "plen" else len(payload)
    )
    pxxh = xxhash.xxh3_64_intdigest(payload) ^ (draw(st.integers(min_value=1, max_value=U64)) if bent == "pxxh" else 0)
    head = FRAME_HEADER.pack(
        f["magic"],
        f["version"],
        f["flags"],
        f["count"],
        f["plen"],
        f["epoch"],
        f["seg"],
        f["first"],
        pxxh,
        f["reserved"],
        0,
    )[:56]
    return head + xxhash.xxh3_64_intdigest(head).to_bytes(8, "little") + payload


@PARITY
@given(frame=crafted_frames())
def test_crafted_frames(frame: bytes) -> None:
    """Headers with valid checksums but any field values, over arbitrary payload bytes."""
    for fn in ("decode_header", "verify_frame", "verify_frame_ids", "decode_records", "pack_records"):
        assert outcome(getattr(c, fn), frame) == outcome(getattr(py, fn), frame), fn
    seg = int.from_bytes(frame[24:32], "little")
    buf = py.encode_segment_header(seg, 1) + frame
    assert c.scan(buf, seg) == py.scan(buf, seg)


@PARITY
@given(
    rows=st.integers(min_value=0, max_value=50),
    width=st.integers(min_value=0, max_value=40),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    head=st.lists(st.binary(max_size=20), max_size=3),
)
def test_add_many_numpy_equals_list(rows: int, width: int, seed: int, head: list[bytes]) -> None:
    arr = np.random.default_rng(seed).integers(0, 256, size=(rows, width), dtype=np.uint8)
    as_list = [bytes(r) for r in arr]
    frames = []
    for mod, arg in ((c, arr), (c, as_list), (py, arr), (py, as_list)):
        b = mod.FrameBuilder()
        b.add_many(head)
        assert b.add_many(arg) == len(head) + rows
        if b.count == 0:
            continue
        frames.append(b.take(epoch=1, segment_txid=1, first_txid=1))
    assert len(set(frames)) <= 1


def test_large_inputs() -> None:
    """Sizes above the native module's GIL-release threshold, on every entry point."""
    recs = [bytes([i % 251]) * (i * 7919 % 50_000) for i in range(60)]
    a = c.encode_frame(recs, epoch=3, segment_txid=9, first_txid=9)
    assert a == py.encode_frame(recs, epoch=3, segment_txid=9, first_txid=9)
    rows = np.random.default_rng(1).integers(0, 256, size=(3000, 37), dtype=np.uint8)
    bc, bp = c.FrameBuilder(), py.FrameBuilder()
    for b in (bc, bp):
        b.add_many(recs)
        b.add_many(rows)
    assert bc.take(epoch=3, segment_txid=9, first_txid=9) == bp.take(epoch=3, segment_txid=9, first_txid=9)
    seg = py.encode_segment_header(9, 3) + a + py.encode_frame(recs[:5], epoch=3, segment_txid=9, first_txid=69)
    for cut in (len(seg), len(seg) - 1, len(seg) - 40_000, 100_000):
        assert c.scan(seg[:cut], 9) == py.scan(seg[:cut], 9)
        assert c.iter_frames(seg[:cut], 9) == py.iter_frames(seg[:cut], 9)
    big = bytes(range(256)) * 100_000
    assert c.xxh3_64(big) == py.xxh3_64(big)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), seg=segments())
def test_a_file_scanned_a_window_at_a_time_scans_as_a_whole(data: st.DataObject, seg: tuple[bytes, int]) -> None:
    """``scan_segment_windows`` (the node's scan of a file that may be gigabytes) returns what a
    scan of the whole file does, errors included, and never reads more than a window or a frame."""
    buf, start = seg
    tail = data.draw(st.sampled_from(["none", "none", "zeros", "zeros_then_garbage", "garbage"]))
    if tail != "none":
        buf += bytes(data.draw(st.integers(min_value=0, max_value=700)))
    if tail in ("zeros_then_garbage", "garbage"):
        buf += data.draw(st.binary(min_size=1, max_size=90))
    buf = damage(data.draw, buf)
    window = data.draw(st.integers(min_value=1, max_value=700))
    claimed = data.draw(st.sampled_from([start] * 6 + [start + 1]))
    reads: list[int] = []

    def read(offset: int, length: int) -> bytes:
        assert offset >= 0 and length > 0
        reads.append(length)
        return buf[offset : offset + length]

    assert outcome(scan_segment_windows, read, claimed, window) == outcome(scan_segment_bytes, buf, claimed)
    largest_frame = FRAME_HEADER_SIZE + 8 * (4 + 80)  # segments(): up to 8 records of up to 80 bytes
    assert max(reads) <= max(window, SEGMENT_HEADER_SIZE + FRAME_HEADER_SIZE, largest_frame)


@PARITY
@given(
    recs=st.lists(st.one_of(st.binary(max_size=300), st.integers(0, 3)), max_size=40),
    limits=st.lists(st.integers(min_value=0, max_value=2000), min_size=1, max_size=6),
)
def test_fill_parity(recs: list[bytes | int], limits: list[int]) -> None:
    """fill: the same batches, the same stopping points and the same errors on both twins."""
    bc, bp = c.FrameBuilder(), py.FrameBuilder()
    ic, ip = iter(recs), iter(recs)
    for limit in limits:
        a, b = outcome(bc.fill, ic, limit), outcome(bp.fill, ip, limit)
        assert a == b
        assert (bc.count, bc.nbytes) == (bp.count, bp.nbytes)
        if bc.count:
            assert bc.take(epoch=1, segment_txid=1, first_txid=1) == bp.take(epoch=1, segment_txid=1, first_txid=1)
    assert list(ic) == list(ip)


@st.composite
def packed(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """(data, offsets): records back to back after a random lead, the offsets sometimes broken (a
    step back, one past the end, a negative one)."""
    recs = draw(st.lists(st.binary(max_size=200), max_size=30))
    lead = draw(st.binary(max_size=8))
    offsets = [len(lead)]
    for r in recs:
        offsets.append(offsets[-1] + len(r))
    data = lead + b"".join(recs) + draw(st.binary(max_size=8))
    if offsets and draw(st.booleans()):
        i = draw(st.integers(0, len(offsets) - 1))
        offsets[i] = draw(st.sampled_from([-1, len(data) + 1, max(0, offsets[i] - 1)]))
    return data, offsets


@PARITY
@given(p=packed(), width=st.sampled_from([8, 4, 2]), limits=st.lists(st.integers(0, 3000), min_size=1, max_size=5))
def test_packed_parity(p: tuple[bytes, list[int]], width: int, limits: list[int]) -> None:
    """add_many with offsets and fill_packed: the same bytes, stopping points and errors on both
    twins, and the same frames as the records given one by one when the offsets are sound."""
    data, offsets = p
    dtype = {8: np.int64, 4: np.int32, 2: np.uint16}[width]
    if width == 2 and (min(offsets) < 0 or max(offsets) >= 2**16):
        dtype = np.int64
    off = np.array(offsets, dtype=dtype)
    bc, bp = c.FrameBuilder(), py.FrameBuilder()
    assert outcome(bc.add_many, data, off) == outcome(bp.add_many, data, off)
    fc = outcome(bc.take, epoch=1, segment_txid=1, first_txid=1)
    assert fc == outcome(bp.take, epoch=1, segment_txid=1, first_txid=1)
    sound = all(0 <= a <= b <= len(data) for a, b in itertools.pairwise(offsets)) and offsets[0] >= 0
    if sound and len(offsets) > 1:
        expected = [data[a:b] for a, b in itertools.pairwise(offsets)]
        assert fc.value == c.encode_frame(expected, epoch=1, segment_txid=1, first_txid=1)
    sc = sp = 0
    for limit in limits:
        a, b = outcome(bc.fill_packed, data, sc, limit, off), outcome(bp.fill_packed, data, sp, limit, off)
        assert a == b
        if a.exc_type is not None:
            break
        sc, sp = a.value, b.value
        assert (bc.count, bc.nbytes) == (bp.count, bp.nbytes)
        if bc.count:
            assert bc.take(epoch=1, segment_txid=1, first_txid=1) == bp.take(epoch=1, segment_txid=1, first_txid=1)


@PARITY
@given(
    rows=st.integers(0, 40),
    width=st.integers(0, 50),
    starts=st.lists(st.tuples(st.integers(-1, 45), st.integers(0, 600)), min_size=1, max_size=5),
)
def test_fill_packed_rows_parity(rows: int, width: int, starts: list[tuple[int, int]]) -> None:
    arr = np.arange(rows * width, dtype=np.uint8).reshape(rows, width)
    bc, bp = c.FrameBuilder(), py.FrameBuilder()
    for start, limit in starts:
        assert outcome(bc.fill_packed, arr, start, limit) == outcome(bp.fill_packed, arr, start, limit)
        assert (bc.count, bc.nbytes) == (bp.count, bp.nbytes)
    if bc.count:
        assert bc.take(epoch=1, segment_txid=1, first_txid=1) == bp.take(epoch=1, segment_txid=1, first_txid=1)
