# cython: auto_pickle=False, autotestdict=False
# Cython framing: build, verify and scan frames (twin of framing_py, same API, bytes and errors).
#
# Layout comes from include/qjm/frame.h through framing_c.pxd. Checks run in nogil C helpers that
# return an error code; the Python layer turns the code into the same qjm.errors exception (same
# reason, offset and message) that framing_py raises. The GIL is released around byte loops once
# they are at least NOGIL_MIN bytes long: below that, the release costs more than it frees.

from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS,
    PyBUF_FORMAT,
    PyBUF_SIMPLE,
    PyBUF_WRITABLE,
    PyBuffer_Release,
    PyObject_CheckBuffer,
    PyObject_GetBuffer,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.stdint cimport UINT64_MAX, int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy, memset

import operator
from array import array as _array

_ZERO_OFFSET = (0,)
import struct

from qjm.errors import CorruptFrameError, TornTailError
from qjm.protocol.frame import FrameHeader, SegmentHeader
from qjm._native.framing_py import ScanResult

cdef extern from *:
    """
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    #error "qjm framing_c stores the little-endian layout of frame.h with native loads and stores"
    #endif
    """

cdef enum:
    HDR = 64                 # QJM_FRAME_HEADER_SIZE, as a Py_ssize_t-friendly constant
    PREFIX = 4               # QJM_RECORD_PREFIX_SIZE
    CHUNK = 64               # record buffers held before a GIL-free copy
    NOGIL_MIN = 16384
    INITIAL_CAPACITY = 65536
    KEEP_CAPACITY = 4 * 1024 * 1024   # take() frees a larger buffer instead of keeping it

cdef Py_ssize_t MAX_PAYLOAD = QJM_MAX_PAYLOAD
cdef Py_ssize_t MAX_RECORDS = QJM_MAX_RECORDS

assert HDR == QJM_FRAME_HEADER_SIZE and PREFIX == QJM_RECORD_PREFIX_SIZE
assert sizeof(qjm_frame_header) == QJM_FRAME_HEADER_SIZE
assert sizeof(qjm_segment_header) == QJM_SEGMENT_HEADER_SIZE

cdef enum Err:
    E_OK = 0
    E_SHORT_HEADER
    E_MAGIC
    E_HEADER_CHECKSUM
    E_VERSION
    E_RESERVED
    E_LENGTH
    E_RECORD_COUNT
    E_TXID
    E_SHORT_PAYLOAD
    E_PAYLOAD_CHECKSUM
    E_REC_PREFIX
    E_REC_LENGTH
    E_REC_STRAY

ctypedef struct fhdr:
    uint64_t epoch
    uint64_t segment_txid
    uint64_t first_txid
    uint64_t payload_xxh3
    uint32_t record_count
    uint32_t payload_len
    # facts for error messages
    uint32_t magic
    uint16_t version
    Py_ssize_t have          # bytes available after a short header or payload
    uint64_t n               # overrunning record length, or stray byte count

ctypedef struct scan_state:
    Py_ssize_t pos
    Py_ssize_t count
    uint64_t first
    uint64_t expected
    bint expected_over       # first_txid + record_count of the last frame passed 2**64 - 1
    uint64_t last_epoch
    uint64_t last_first      # first_txid and record_count of the last valid frame
    uint32_t last_count
    int stop                 # 0 end or zero tail, 1 corrupt frame, 2 txid, 3 epoch
    int rc
    fhdr h


# ---------------------------------------------------------------------------------------------
# nogil helpers

cdef inline uint64_t _hash(const void *p, Py_ssize_t n) noexcept:
    cdef uint64_t h
    if n >= NOGIL_MIN:
        with nogil:
            h = XXH3_64bits(p, <size_t>n)
        return h
    return XXH3_64bits(p, <size_t>n)


cdef int _check_header(const unsigned char *p, Py_ssize_t size, Py_ssize_t off, fhdr *h) noexcept nogil:
    cdef const qjm_frame_header *fh
    if size - off < HDR:
        h.have = size - off
        return E_SHORT_HEADER
    fh = <const qjm_frame_header *>(p + off)
    h.magic = fh.magic
    h.version = fh.version
    h.record_count = fh.record_count
    h.payload_len = fh.payload_len
    h.epoch = fh.epoch
    h.segment_txid = fh.segment_txid
    h.first_txid = fh.first_txid
    h.payload_xxh3 = fh.payload_xxh3
    if h.magic != QJM_FRAME_MAGIC:
        return E_MAGIC
    if XXH3_64bits(p + off, QJM_FRAME_HEADER_CHECKED) != fh.header_xxh3:
        return E_HEADER_CHECKSUM
    if h.version != QJM_FORMAT_VERSION:
        return E_VERSION
    if fh.flags != 0 or fh.reserved != 0:
        return E_RESERVED
    if h.payload_len > QJM_MAX_PAYLOAD:
        return E_LENGTH
    if (h.record_count == 0 or h.record_count > QJM_MAX_RECORDS
            or <uint64_t>h.record_count * PREFIX > h.payload_len):
        return E_RECORD_COUNT
    if h.first_txid < 1 or h.segment_txid < 1 or h.first_txid < h.segment_txid or h.epoch < 1:
        return E_TXID
    return E_OK


cdef int _check_sum(const unsigned char *p, Py_ssize_t size, Py_ssize_t off, fhdr *h) noexcept nogil:
    # After _check_header passed: the payload is there and matches its checksum.
    cdef Py_ssize_t start = off + HDR
    if size - start < <Py_ssize_t>h.payload_len:
        h.have = size - start
        return E_SHORT_PAYLOAD
    if XXH3_64bits(p + start, <size_t>h.payload_len) != h.payload_xxh3:
        return E_PAYLOAD_CHECKSUM
    return E_OK


cdef inline int _next_record(const unsigned char *pl, Py_ssize_t end, Py_ssize_t *pos, uint32_t *n,
                             fhdr *h) noexcept nogil:
    # The record whose prefix is at pos: its length in n, pos moved past the prefix; E_OK, or the
    # error of a prefix or a length the payload cannot hold (the one walk of both layouts below).
    if end - pos[0] < PREFIX:
        return E_REC_PREFIX
    memcpy(n, pl + pos[0], PREFIX)
    pos[0] += PREFIX
    if n[0] > end - pos[0]:
        h.n = n[0]
        return E_REC_LENGTH
    return E_OK


cdef inline int _layout_end(Py_ssize_t end, Py_ssize_t pos, fhdr *h) noexcept nogil:
    # After the last record: the payload must end there.
    if pos != end:
        h.n = <uint64_t>(end - pos)
        return E_REC_STRAY
    return E_OK


cdef int _check_layout(const unsigned char *pl, fhdr *h) noexcept nogil:
    # After _check_sum passed: record_count length-prefixed records fill the payload exactly.
    cdef Py_ssize_t end = h.payload_len
    cdef Py_ssize_t pos = 0
    cdef uint32_t left = h.record_count
    cdef uint32_t n = 0
    cdef int rc
    while left:
        left -= 1
        rc = _next_record(pl, end, &pos, &n, h)
        if rc != E_OK:
            return rc
        pos += n
    return _layout_end(end, pos, h)


cdef int _check_payload(const unsigned char *p, Py_ssize_t size, Py_ssize_t off, fhdr *h) noexcept nogil:
    cdef int rc = _check_sum(p, size, off, h)
    if rc != E_OK:
        return rc
    return _check_layout(p + off + HDR, h)


cdef int _pack_layout(const unsigned char *pl, fhdr *h, Py_ssize_t skip, int64_t *offs,
                      char *dst, Py_ssize_t room, Py_ssize_t *total) noexcept nogil:
    # _check_layout and the packing in one walk: record i >= skip is copied to dst and its end
    # written to offs[i - skip + 1]. room (payload_len - PREFIX * record_count) is what the
    # records of a valid layout hold; a record that would pass it means the layout is bad, and
    # _check_layout then names the error exactly as verify_frame would.
    cdef Py_ssize_t end = h.payload_len
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t got = 0
    cdef Py_ssize_t i
    cdef uint32_t n = 0
    cdef int rc
    for i in range(h.record_count):
        rc = _next_record(pl, end, &pos, &n, h)
        if rc != E_OK:
            return rc
        if i >= skip:
            if n > room - got:
                rc = _check_layout(pl, h)
                return rc if rc != E_OK else -1  # cannot pass: -1 is reported as a bug, not packed
            memcpy(dst + got, pl + pos, n)
            got += n
            offs[i - skip + 1] = got
        pos += n
    rc = _layout_end(end, pos, h)
    if rc == E_OK:
        total[0] = got
    return rc


cdef int _pack_payload(const unsigned char *p, Py_ssize_t size, Py_ssize_t off, fhdr *h, Py_ssize_t skip,
                       int64_t *offs, char *dst, Py_ssize_t room, Py_ssize_t *total) noexcept nogil:
    # _check_payload that packs the records as it checks their layout (_pack_layout)
    cdef int rc = _check_sum(p, size, off, h)
    if rc != E_OK:
        return rc
    return _pack_layout(p + off + HDR, h, skip, offs, dst, room, total)


cdef inline bint _all_zero(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    return n == 0 or (p[0] == 0 and memcmp(p, p + 1, <size_t>(n - 1)) == 0)


cdef void _scan(const unsigned char *p, Py_ssize_t size, uint64_t st, bint st_bad, scan_state *s) noexcept nogil:
    cdef int rc
    while s.pos < size:
        # Like the twin: a zero tail of fewer than 4 bytes is not "clean" (it cannot be a header).
        if size - s.pos >= 4 and _all_zero(p + s.pos, size - s.pos):
            break
        rc = _check_header(p, size, s.pos, &s.h)
        if rc == E_OK:
            rc = _check_payload(p, size, s.pos, &s.h)
        if rc != E_OK:
            s.stop = 1
            s.rc = rc
            break
        if st_bad or s.h.segment_txid != st or s.expected_over or s.h.first_txid != s.expected:
            s.stop = 2
            break
        if s.h.epoch < s.last_epoch:
            s.stop = 3
            break
        if s.count == 0:
            s.first = s.h.first_txid
        s.count += 1
        s.last_first = s.h.first_txid
        s.last_count = s.h.record_count
        if s.h.first_txid > UINT64_MAX - s.h.record_count:
            s.expected_over = True
        else:
            s.expected = s.h.first_txid + s.h.record_count
        s.last_epoch = s.h.epoch
        s.pos += HDR + s.h.payload_len


cdef void _copy_views(unsigned char *out, const Py_buffer *views, Py_ssize_t k) noexcept nogil:
    cdef Py_ssize_t i
    cdef uint32_t n
    for i in range(k):
        n = <uint32_t>views[i].len
        memcpy(out, &n, PREFIX)
        out += PREFIX
        if n:
            memcpy(out, views[i].buf, n)
            out += n


cdef void _copy_rows(unsigned char *out, const unsigned char *base, Py_ssize_t nrows,
                     Py_ssize_t width) noexcept nogil:
    cdef Py_ssize_t i
    cdef uint32_t n = <uint32_t>width
    for i in range(nrows):
        memcpy(out, &n, PREFIX)
        out += PREFIX
        if n:
            memcpy(out, base + i * width, n)
            out += n


cdef inline int64_t _offset_at(const offsets_t *o, Py_ssize_t i) noexcept nogil:
    # An unsigned 64-bit entry past INT64_MAX reads as negative: refused as out of range.
    if o.size == 8:
        return (<const int64_t *>o.p)[i]
    if o.size == 4:
        return (<const int32_t *>o.p)[i] if o.signed else <int64_t>(<const uint32_t *>o.p)[i]
    if o.size == 2:
        return (<const int16_t *>o.p)[i] if o.signed else <int64_t>(<const uint16_t *>o.p)[i]
    return (<const int8_t *>o.p)[i] if o.signed else <int64_t>(<const uint8_t *>o.p)[i]


cdef int _get_offsets(object offsets, Py_buffer *ov, offsets_t *o) except -1:
    """Borrow ``offsets`` as native integers (the caller releases ``ov``); the twin checks the same."""
    cdef bytes fmt
    if not PyObject_CheckBuffer(offsets):
        raise TypeError(f"offsets must be a buffer of integers, not {type(offsets).__name__}")
    try:
        PyObject_GetBuffer(offsets, ov, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)
    except (BufferError, ValueError, TypeError):
        raise ValueError("offsets must be one C-contiguous buffer of integers") from None
    fmt = (ov.format if ov.format != NULL else b"B").lstrip(b"@=<")
    if ov.ndim != 1 or len(fmt) != 1 or fmt not in b"bBhHiIlLqQnN" or ov.itemsize not in (1, 2, 4, 8):
        PyBuffer_Release(ov)
        raise ValueError("offsets must be a 1-D buffer of native integers (numpy int64, array('q'), ...)")
    if ov.shape[0] < 1:
        PyBuffer_Release(ov)
        raise ValueError("offsets must hold at least one entry (n records need n + 1)")
    o.p = <const char *>ov.buf
    o.n = ov.shape[0]
    o.size = <int>ov.itemsize
    o.signed = fmt.islower()
    return 0


cdef int _get_data(object records, Py_buffer *v) except -1:
    if not PyObject_CheckBuffer(records):
        raise TypeError(f"records with offsets must be one buffer, not {type(records).__name__}")
    try:
        PyObject_GetBuffer(records, v, PyBUF_SIMPLE)
    except (BufferError, ValueError, TypeError):
        raise ValueError("records with offsets must be one C-contiguous buffer") from None
    return 0


# ---------------------------------------------------------------------------------------------
# Python-side helpers

cdef uint64_t _u64(object v) except? 0:
    # Same errors as struct.pack("<Q", v), which the twin uses.
    try:
        v = operator.index(v)
    except TypeError:
        raise struct.error("required argument is not an integer") from None
    if v < 0 or v > 0xFFFFFFFFFFFFFFFF:
        raise struct.error("argument out of range")
    return <uint64_t>v


cdef object _frame_error(int rc, const fhdr *h, Py_ssize_t offset):
    # The exception framing_py raises for the same fault, message text included (scan reports it).
    if rc == E_SHORT_HEADER:
        return TornTailError(
            f"frame header at offset {offset} is cut short ({h.have} of {HDR} bytes)",
            reason="short_header", offset=offset)
    if rc == E_MAGIC:
        return CorruptFrameError(f"bad frame magic {<object>h.magic:#010x} at offset {offset}",
                                 reason="magic", offset=offset)
    if rc == E_HEADER_CHECKSUM:
        return CorruptFrameError(f"frame header checksum mismatch at offset {offset}",
                                 reason="header_checksum", offset=offset)
    if rc == E_VERSION:
        return CorruptFrameError(f"unsupported frame version {h.version} at offset {offset}",
                                 reason="version", offset=offset)
    if rc == E_RESERVED:
        return CorruptFrameError(f"reserved frame fields set at offset {offset}", reason="reserved", offset=offset)
    if rc == E_LENGTH:
        return CorruptFrameError(
            f"frame payload length {h.payload_len} exceeds the limit {MAX_PAYLOAD} at offset {offset}",
            reason="length", offset=offset)
    if rc == E_RECORD_COUNT:
        return CorruptFrameError(
            f"frame record count {h.record_count} impossible for {h.payload_len} payload bytes at offset {offset}",
            reason="record_count", offset=offset)
    if rc == E_TXID:
        return CorruptFrameError(
            f"frame txids/epoch out of range (segment {h.segment_txid}, first {h.first_txid}, "
            f"epoch {h.epoch}) at offset {offset}",
            reason="txid", offset=offset)
    if rc == E_SHORT_PAYLOAD:
        return TornTailError(
            f"frame at offset {offset} is cut short ({h.have} of {h.payload_len} payload bytes)",
            reason="short_payload", offset=offset)
    if rc == E_PAYLOAD_CHECKSUM:
        return CorruptFrameError(f"frame payload checksum mismatch at offset {offset}",
                                 reason="payload_checksum", offset=offset)
    if rc == E_REC_PREFIX:
        return CorruptFrameError(f"record prefix overruns the payload in frame at {offset}",
                                 reason="records", offset=offset)
    if rc == E_REC_LENGTH:
        return CorruptFrameError(f"record length {h.n} overruns the payload in frame at {offset}",
                                 reason="records", offset=offset)
    if rc == E_REC_STRAY:
        return CorruptFrameError(f"{h.n} stray bytes after the last record in frame at {offset}",
                                 reason="records", offset=offset)
    return AssertionError(f"qjm framing_c: unknown check result {rc}")


cdef object _header_obj(const fhdr *h):
    return FrameHeader(epoch=h.epoch, segment_txid=h.segment_txid, first_txid=h.first_txid,
                       record_count=h.record_count, payload_len=h.payload_len, payload_xxh3=h.payload_xxh3)


cdef inline int _check_offset(Py_ssize_t offset) except -1:
    if offset < 0:
        raise ValueError(f"offset must be >= 0, not {offset}")
    return 0


cdef int _verify(const unsigned char *p, Py_ssize_t size, Py_ssize_t offset, fhdr *h, bint full) except -1:
    cdef int rc = _check_header(p, size, offset, h)
    if rc == E_OK and full:
        if h.payload_len >= NOGIL_MIN:
            with nogil:
                rc = _check_payload(p, size, offset, h)
        else:
            rc = _check_payload(p, size, offset, h)
    if rc != E_OK:
        raise _frame_error(rc, h, offset)
    return 0


cdef Py_ssize_t frame_length(const unsigned char *p) except -1:
    # For the data plane's receiver, which sizes each frame from its header before the payload is
    # there: decode_header's checks without a bytes copy of the header or a FrameHeader.
    cdef fhdr h
    _verify(p, HDR, 0, &h, False)
    return HDR + <Py_ssize_t>h.payload_len


cdef int frame_ids(const unsigned char *p, Py_ssize_t n, uint64_t *epoch, uint64_t *segment_txid,
                   uint64_t *first_txid, uint64_t *record_count) noexcept nogil:
    # For the node's write gate, which checks each received frame in the receive buffer.
    cdef fhdr h
    cdef int rc = _check_header(p, n, 0, &h)
    if rc == E_OK:
        rc = _check_payload(p, n, 0, &h)
    if rc == E_OK:
        epoch[0] = h.epoch
        segment_txid[0] = h.segment_txid
        first_txid[0] = h.first_txid
        record_count[0] = h.record_count
    return rc


# ---------------------------------------------------------------------------------------------
# Public API

def xxh3_64(data):
    """XXH3-64 with seed 0, the checksum of every header and payload."""
    cdef Py_buffer v
    cdef uint64_t h
    PyObject_GetBuffer(data, &v, PyBUF_SIMPLE)
    try:
        h = _hash(v.buf, v.len)
    finally:
        PyBuffer_Release(&v)
    return h


def encode_frame(records, *, epoch, segment_txid, first_txid):
    """Frame a batch of records; txids are implicit from ``first_txid``."""
    cdef Py_ssize_t n
    cdef Py_ssize_t total
    cdef FrameBuilder b
    if not records:
        raise ValueError("a frame holds at least one record")
    n = len(records)
    if n > MAX_RECORDS:
        raise ValueError(f"{n} records exceed the limit of {MAX_RECORDS} per frame")
    b = FrameBuilder.__new__(FrameBuilder)
    b._add_many(records, False)
    total = b._used - HDR + b._overflow
    if total > MAX_PAYLOAD:
        raise ValueError(f"batch of {total} bytes exceeds the frame limit of {MAX_PAYLOAD}")
    e = _u64(epoch)
    s = _u64(segment_txid)
    f = _u64(first_txid)
    return b._take(e, s, f)


cdef object _END = object()  # FrameBuilder.fill: the iterator ended


cdef class FrameBuilder:
    """Accumulates records of the open batch; ``take`` frames them and starts a new batch."""

    def __cinit__(self, *args, **kwargs):
        # Cython would silently ignore constructor arguments; the twin's __init__ takes none.
        if args or kwargs:
            raise TypeError("FrameBuilder() takes no arguments")
        self._buf = NULL
        self._cap = 0
        self._used = HDR
        self._count = 0
        self._nviews = 0
        self._pending = 0
        self._overflow = 0
        self._busy = False
        self._views = <Py_buffer *>PyMem_Malloc(CHUNK * sizeof(Py_buffer))
        if self._views == NULL:
            raise MemoryError()

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self._views != NULL:
            for i in range(self._nviews):
                PyBuffer_Release(&self._views[i])
            PyMem_Free(self._views)
            self._views = NULL
        free(self._buf)
        self._buf = NULL

    @property
    def count(self):
        return self._count + self._nviews

    @property
    def nbytes(self):
        """Payload bytes so far (record prefixes included)."""
        return self._used - HDR + self._pending

    cdef int _enter(self) except -1:
        # One caller at a time: a builder is not shared between threads, and this says so if it is.
        if self._busy:
            raise RuntimeError("FrameBuilder is already in use (by another thread or a re-entrant call)")
        self._busy = True
        return 0

    cdef int _reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t need = self._used + extra
        cdef Py_ssize_t cap
        cdef unsigned char *nb
        if need <= self._cap:
            return 0
        cap = max(self._cap * 2, <Py_ssize_t>INITIAL_CAPACITY)
        if cap < need:
            cap = need
        nb = <unsigned char *>realloc(self._buf, <size_t>cap)
        if nb == NULL:
            raise MemoryError(f"FrameBuilder: cannot grow the batch buffer to {cap} bytes")
        self._buf = nb
        self._cap = cap
        return 0

    cdef int _flush(self) except -1:
        # Copy the held record buffers into the batch (without the GIL when large), then release them.
        cdef Py_ssize_t i
        cdef Py_ssize_t k = self._nviews
        cdef Py_ssize_t need = self._pending
        cdef unsigned char *out
        if k == 0:
            return 0
        try:
            self._reserve(need)
            out = self._buf + self._used
            if need >= NOGIL_MIN:
                with nogil:
                    _copy_views(out, self._views, k)
            else:
                _copy_views(out, self._views, k)
            self._used += need
            self._count += k
        finally:
            for i in range(k):
                PyBuffer_Release(&self._views[i])
            self._nviews = 0
            self._pending = 0
        return 0

    cdef int _push(self, object record, bint limit) except -1:
        # Hold one record's buffer for the next _flush. `limit`: refuse a record that does not fit
        # (FrameBuilder); otherwise only count the excess (encode_frame reports the batch size).
        cdef Py_buffer *v = &self._views[self._nviews]
        cdef Py_ssize_t n
        try:
            PyObject_GetBuffer(record, v, PyBUF_SIMPLE)
        except (TypeError, BufferError, ValueError):
            # The twin frames len(record) and bytes(record): same fallback for non-contiguous
            # buffers and sequences of ints, and the same TypeError for everything else.
            len(record)
            PyObject_GetBuffer(bytes(record), v, PyBUF_SIMPLE)
        n = v.len
        if self._overflow or self._used - HDR + self._pending + PREFIX + n > MAX_PAYLOAD:
            PyBuffer_Release(v)
            if limit:
                raise ValueError(f"record of {n} bytes does not fit in a frame (limit {MAX_PAYLOAD} bytes)")
            self._overflow += PREFIX + n
            return 0
        self._nviews += 1
        self._pending += PREFIX + n
        if self._nviews == CHUNK:
            self._flush()
        return 0

    cdef int _add_rows(self, const unsigned char *base, Py_ssize_t nrows, Py_ssize_t width,
                       bint limit) except -1:
        # Rows of a 2-D C-contiguous byte array: one record per row, no Python object per record.
        cdef Py_ssize_t per = PREFIX + width
        cdef Py_ssize_t room = MAX_PAYLOAD - (self._used - HDR)
        cdef Py_ssize_t fit = nrows
        cdef unsigned char *out
        if nrows == 0:
            return 0
        if nrows > room // per:
            if not limit:
                self._overflow += nrows * per
                return 0
            fit = room // per
        if fit:
            self._reserve(fit * per)
            out = self._buf + self._used
            if fit * per >= NOGIL_MIN:
                with nogil:
                    _copy_rows(out, base, fit, width)
            else:
                _copy_rows(out, base, fit, width)
            self._used += fit * per
            self._count += fit
        if fit < nrows:
            raise ValueError(f"record of {width} bytes does not fit in a frame (limit {MAX_PAYLOAD} bytes)")
        return 0

    cdef int _add_many(self, object records, bint limit) except -1:
        cdef Py_buffer v
        cdef bint rows = False
        self._enter()
        try:
            if PyObject_CheckBuffer(records):
                try:
                    PyObject_GetBuffer(records, &v, PyBUF_C_CONTIGUOUS)
                except (BufferError, ValueError):
                    pass
                else:
                    try:
                        if v.ndim == 2 and v.itemsize == 1:
                            rows = True
                            self._add_rows(<const unsigned char *>v.buf, v.shape[0], v.shape[1], limit)
                    finally:
                        PyBuffer_Release(&v)
            if not rows:
                try:
                    for r in records:
                        self._push(r, limit)
                finally:
                    self._flush()
        finally:
            self._busy = False
        return 0

    cdef bytes _take(self, uint64_t epoch, uint64_t segment_txid, uint64_t first_txid):
        cdef qjm_frame_header *h
        cdef Py_ssize_t plen
        cdef bytes out
        cdef char *dst
        if self._buf == NULL:  # callers check _count first; this guards the pointer
            raise ValueError("no records to frame")
        plen = self._used - HDR
        h = <qjm_frame_header *>self._buf
        memset(h, 0, HDR)
        h.magic = QJM_FRAME_MAGIC
        h.version = QJM_FORMAT_VERSION
        h.record_count = <uint32_t>self._count
        h.payload_len = <uint32_t>plen
        h.epoch = epoch
        h.segment_txid = segment_txid
        h.first_txid = first_txid
        h.payload_xxh3 = _hash(self._buf + HDR, plen)
        h.header_xxh3 = XXH3_64bits(h, QJM_FRAME_HEADER_CHECKED)
        out = PyBytes_FromStringAndSize(NULL, self._used)
        dst = PyBytes_AS_STRING(out)
        if self._used >= NOGIL_MIN:
            with nogil:
                memcpy(dst, self._buf, <size_t>self._used)
        else:
            memcpy(dst, self._buf, <size_t>self._used)
        self._reset()
        return out

    cdef void _reset(self) noexcept:
        self._used = HDR
        self._count = 0
        self._overflow = 0
        if self._cap > KEEP_CAPACITY:
            free(self._buf)
            self._buf = NULL
            self._cap = 0

    def add(self, record):
        self._enter()
        try:
            self._push(record, True)
            self._flush()
        finally:
            self._busy = False

    cdef Py_ssize_t _add_packed(self, const unsigned char *data, Py_ssize_t dlen, const offsets_t *o,
                                Py_ssize_t start, Py_ssize_t limit) except -1:
        # Records start.. of data (record i = data[o[i]:o[i+1]]) while the payload is below `limit`
        # (< 0: all of them); returns the first record not added. No Python object per record.
        cdef Py_ssize_t i = start
        cdef Py_ssize_t nrec = o.n - 1
        cdef int64_t a, b
        cdef uint32_t n
        cdef unsigned char *out
        while i < nrec and (limit < 0 or self._used - HDR < limit):
            a = _offset_at(o, i)
            b = _offset_at(o, i + 1)
            if a < 0 or b < a or b > dlen:
                raise ValueError(f"offsets[{i}:{i + 2}] = [{a}, {b}] is not a range of the {dlen}-byte records buffer")
            if self._used - HDR + PREFIX + (b - a) > MAX_PAYLOAD:
                raise ValueError(f"record of {b - a} bytes does not fit in a frame (limit {MAX_PAYLOAD} bytes)")
            self._reserve(PREFIX + (b - a))
            out = self._buf + self._used
            n = <uint32_t>(b - a)
            memcpy(out, &n, PREFIX)
            if n:
                memcpy(out + PREFIX, data + a, n)
            self._used += PREFIX + n
            self._count += 1
            i += 1
        return i

    cdef Py_ssize_t _packed(self, object records, object offsets, Py_ssize_t start, Py_ssize_t limit) except -1:
        cdef Py_buffer v
        cdef Py_buffer ov
        cdef offsets_t o
        _get_data(records, &v)
        try:
            _get_offsets(offsets, &ov, &o)
            try:
                if start < 0 or start > o.n - 1:
                    raise ValueError(f"start {start} is outside the {o.n - 1} records")
                return self._add_packed(<const unsigned char *>v.buf, v.len, &o, start, limit)
            finally:
                PyBuffer_Release(&ov)
        finally:
            PyBuffer_Release(&v)

    def add_many(self, records, offsets=None):
        """Add every record of an iterable of buffers, or every row of a 2-D C-contiguous uint8 array,
        or, with ``offsets``, every record packed back to back in the one buffer ``records``: record
        i is ``records[offsets[i]:offsets[i + 1]]`` (``offsets``: n + 1 non-decreasing integers in a
        1-D buffer, such as a numpy int64 array or ``array('q')``).

        Returns the number of records in the open batch.
        """
        if offsets is None:
            self._add_many(records, True)
            return self._count
        self._enter()
        try:
            self._packed(records, offsets, 0, -1)
        finally:
            self._busy = False
        return self._count

    def fill_packed(self, records, Py_ssize_t start, Py_ssize_t limit, offsets=None):
        """From record ``start`` of a packed input (the rows of a 2-D C-contiguous uint8 array, or
        ``records`` + ``offsets`` as in ``add_many``), add records while the batch holds fewer than
        ``limit`` payload bytes; returns the index of the first record not added.

        The writer closes batches at ``batch_bytes`` this way with no Python object per record.
        """
        cdef Py_buffer v
        cdef Py_ssize_t per, k, nrows
        if limit < 0:
            raise ValueError(f"limit must be >= 0, not {limit}")
        self._enter()
        try:
            if offsets is not None:
                return self._packed(records, offsets, start, limit)
            if not PyObject_CheckBuffer(records):
                raise TypeError(f"packed records must be a 2-D buffer or come with offsets, not {type(records).__name__}")
            try:
                PyObject_GetBuffer(records, &v, PyBUF_C_CONTIGUOUS)
            except (BufferError, ValueError, TypeError):
                raise ValueError("rows must be one C-contiguous 2-D buffer of bytes") from None
            try:
                if v.ndim != 2 or v.itemsize != 1:
                    raise ValueError("rows must be one C-contiguous 2-D buffer of bytes")
                nrows = v.shape[0]
                if start < 0 or start > nrows:
                    raise ValueError(f"start {start} is outside the {nrows} records")
                per = PREFIX + v.shape[1]
                k = 0
                if self._used - HDR < limit:
                    k = min(nrows - start, (limit - (self._used - HDR) + per - 1) // per)
                self._add_rows(<const unsigned char *>v.buf + start * v.shape[1], k, v.shape[1], True)
                return start + k
            finally:
                PyBuffer_Release(&v)
        finally:
            self._busy = False

    def fill(self, records, Py_ssize_t limit):
        """Add records from the iterator ``records`` while the batch holds fewer than ``limit``
        payload bytes; returns True once the iterator is exhausted.

        The writer closes a batch at ``batch_bytes``: this keeps that per-record decision out of a
        Python loop. A record refused as too large has been taken from the iterator.
        """
        cdef object end = _END
        cdef object r
        cdef bint done = False
        self._enter()
        try:
            while self._used - HDR + self._pending < limit:
                r = next(records, end)
                if r is end:
                    done = True
                    break
                self._push(r, True)
        finally:
            try:
                self._flush()
            finally:
                self._busy = False
        return done

    def take(self, *, epoch, segment_txid, first_txid):
        if self._busy:
            raise RuntimeError("FrameBuilder is already in use (by another thread or a re-entrant call)")
        if self._count == 0:
            raise ValueError("no records to frame")
        e = _u64(epoch)
        s = _u64(segment_txid)
        f = _u64(first_txid)
        return self._take(e, s, f)


cdef int _verify_at(object buf, Py_ssize_t offset, fhdr *h, bint whole) except -1:
    # The frame at ``offset`` of any buffer: its header, and with ``whole`` its payload too.
    cdef Py_buffer v
    _check_offset(offset)
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        _verify(<const unsigned char *>v.buf, v.len, offset, h, whole)
    finally:
        PyBuffer_Release(&v)
    return 0


def decode_header(buf, Py_ssize_t offset=0):
    """Parse and check a frame header (magic, version, checksum, bounds); not the payload."""
    cdef fhdr h
    _verify_at(buf, offset, &h, False)
    return _header_obj(&h)


def verify_frame(buf, Py_ssize_t offset=0):
    """Check a whole frame at ``offset``: header, payload checksum and record layout."""
    cdef fhdr h
    _verify_at(buf, offset, &h, True)
    return _header_obj(&h)


def verify_frame_ids(buf, Py_ssize_t offset=0):
    """``verify_frame``'s checks, returning ``(epoch, segment_txid, first_txid, last_txid)``."""
    # A tuple, not a FrameHeader: a node checks these four of every frame it appends, and building
    # the frozen dataclass costs more than the checks of a small frame.
    cdef fhdr h
    _verify_at(buf, offset, &h, True)
    first = h.first_txid  # a Python int: first + count - 1 must not wrap at 2**64
    return (h.epoch, h.segment_txid, first, first + h.record_count - 1)


def decode_records(buf, Py_ssize_t offset=0):
    """The records of the verified frame at ``offset``, in txid order."""
    cdef Py_buffer v
    cdef fhdr h
    cdef const unsigned char *p
    cdef uint32_t left
    cdef uint32_t n = 0
    cdef list out = []
    _check_offset(offset)
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        p = <const unsigned char *>v.buf
        _verify(p, v.len, offset, &h, True)
        p += offset + HDR
        left = h.record_count
        while left:
            left -= 1
            memcpy(&n, p, PREFIX)
            p += PREFIX
            out.append(PyBytes_FromStringAndSize(<const char *>p, n))
            p += n
    finally:
        PyBuffer_Release(&v)
    return out


def pack_records(buf, Py_ssize_t offset=0, Py_ssize_t skip=0):
    """The records of the verified frame at ``offset`` from the ``skip``-th on, back to back:
    ``(data, offsets)``, record i being ``data[offsets[i]:offsets[i + 1]]`` (``offsets``: an
    ``array('q')`` of n + 1 entries, the layout of an Arrow large-binary array)."""
    # One walk over the records checks the layout and packs them (verify_frame's checks, in its
    # order, so the same frame gives the same error); the checksum pass before it is the only other.
    cdef Py_buffer v
    cdef Py_buffer ov
    cdef fhdr h
    cdef const unsigned char *p
    cdef int rc
    cdef Py_ssize_t kept
    cdef Py_ssize_t room
    cdef Py_ssize_t total = 0
    cdef bytes data
    cdef char *dst
    cdef int64_t *offs
    _check_offset(offset)
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        p = <const unsigned char *>v.buf
        rc = _check_header(p, v.len, offset, &h)
        if rc == E_OK and v.len - (offset + HDR) < <Py_ssize_t>h.payload_len:
            rc = _check_sum(p, v.len, offset, &h)  # a short payload, before allocating for it
        if rc != E_OK:
            raise _frame_error(rc, &h, offset)
        kept = h.record_count - skip if skip < h.record_count else 0
        room = <Py_ssize_t>h.payload_len - <Py_ssize_t>h.record_count * PREFIX
        offsets = _array("q", _ZERO_OFFSET) * (kept + 1)
        data = PyBytes_FromStringAndSize(NULL, room)
        dst = PyBytes_AS_STRING(data)
        PyObject_GetBuffer(offsets, &ov, PyBUF_WRITABLE)
        try:
            offs = <int64_t *>ov.buf
            # data and offsets are this call's alone until it returns, so no other thread sees
            # them; one GIL release for the checksum and the walk, as verify_frame's one
            if h.payload_len >= NOGIL_MIN:
                with nogil:
                    rc = _pack_payload(p, v.len, offset, &h, skip, offs, dst, room, &total)
            else:
                rc = _pack_payload(p, v.len, offset, &h, skip, offs, dst, room, &total)
        finally:
            PyBuffer_Release(&ov)
        if rc != E_OK:
            raise _frame_error(rc, &h, offset)
    finally:
        PyBuffer_Release(&v)
    if total != room:  # records skipped
        data = data[:total]
    return data, offsets


def encode_segment_header(start_txid, epoch):
    cdef qjm_segment_header sh
    st = _u64(start_txid)
    ep = _u64(epoch)
    memset(&sh, 0, sizeof(sh))
    sh.magic = QJM_SEGMENT_MAGIC
    sh.version = QJM_FORMAT_VERSION
    sh.start_txid = st
    sh.epoch = ep
    sh.header_xxh3 = XXH3_64bits(&sh, QJM_SEGMENT_HEADER_CHECKED)
    return PyBytes_FromStringAndSize(<const char *>&sh, sizeof(sh))


def decode_segment_header(buf):
    cdef Py_buffer v
    cdef const qjm_segment_header *sh
    cdef uint32_t magic
    cdef uint16_t version
    cdef uint64_t start, epoch, hx
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        if v.len < QJM_SEGMENT_HEADER_SIZE:
            raise TornTailError(f"segment header cut short ({v.len} of {QJM_SEGMENT_HEADER_SIZE} bytes)",
                                reason="short_header", offset=0)
        sh = <const qjm_segment_header *>v.buf
        magic = sh.magic
        version = sh.version
        start = sh.start_txid
        epoch = sh.epoch
        hx = XXH3_64bits(v.buf, QJM_SEGMENT_HEADER_CHECKED)
        if magic != QJM_SEGMENT_MAGIC:
            raise CorruptFrameError(f"bad segment magic {<object>magic:#010x}", reason="magic", offset=0)
        if hx != sh.header_xxh3:
            raise CorruptFrameError("segment header checksum mismatch", reason="header_checksum", offset=0)
        if version != QJM_FORMAT_VERSION:
            raise CorruptFrameError(f"unsupported segment version {version}", reason="version", offset=0)
    finally:
        PyBuffer_Release(&v)
    return SegmentHeader(start_txid=start, epoch=epoch)


cdef object _scan_obj(object buf, object start_txid, Py_ssize_t offset, scan_state *s,
                      object expected_txid=None, object last_epoch=0, Py_ssize_t base=0):
    # Run the nogil scan loop over buf; returns the ScanResult. `s` keeps where it stopped.
    cdef Py_buffer v
    cdef uint64_t st = 0
    cdef bint st_bad = False
    _check_offset(offset)
    if base < 0:
        raise ValueError(f"base must be >= 0, not {base}")
    start = operator.index(start_txid)
    if 0 <= start <= 0xFFFFFFFFFFFFFFFF:
        st = <uint64_t>start
    else:
        st_bad = True   # no frame can belong to it: the first valid frame is a txid mismatch
    memset(s, 0, sizeof(scan_state))
    s.pos = offset
    s.expected = st
    if expected_txid is not None:
        expected_txid = operator.index(expected_txid)
        if expected_txid < 0:
            raise ValueError(f"expected_txid must be >= 0, not {expected_txid}")
        if expected_txid > 0xFFFFFFFFFFFFFFFF:
            s.expected_over = True   # past the last txid: no frame can continue
        else:
            s.expected = <uint64_t>expected_txid
    else:
        expected_txid = start
    last_epoch = operator.index(last_epoch)
    if not 0 <= last_epoch <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError(f"last_epoch out of range: {last_epoch}")
    s.last_epoch = <uint64_t>last_epoch
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        if base > PY_SSIZE_T_MAX - max(v.len, offset):  # file offsets base + pos must not overflow
            raise ValueError(f"base {base} plus the buffer's {v.len} bytes is past the largest file offset")
        if v.len - offset >= NOGIL_MIN:
            with nogil:
                _scan(<const unsigned char *>v.buf, v.len, st, st_bad, s)
        else:
            _scan(<const unsigned char *>v.buf, v.len, st, st_bad, s)
    finally:
        PyBuffer_Release(&v)
    if s.count:
        expected = <object>s.last_first + <object>s.last_count
        first = s.first
    else:
        expected = expected_txid
        first = 0
    at = base + s.pos
    error = ""
    if s.stop == 1:
        e = _frame_error(s.rc, &s.h, at)
        error = f"{e.reason}: {e}"
    elif s.stop == 2:
        error = (
            f"txid: frame at offset {at} holds segment {s.h.segment_txid} txids {s.h.first_txid}.. "
            f"but {expected} was expected in segment {start_txid}"
        )
    elif s.stop == 3:
        error = f"epoch: frame at offset {at} has epoch {s.h.epoch} below the previous frame's {s.last_epoch}"
    return ScanResult(valid_end=at, frame_count=s.count, first_txid=first, last_txid=expected - 1,
                      last_epoch=s.last_epoch, tail="torn" if error else "clean", error=error)


def scan(buf, start_txid, Py_ssize_t offset=QJM_SEGMENT_HEADER_SIZE, *, expected_txid=None, last_epoch=0,
         Py_ssize_t base=0):
    """Walk the frames of a segment from ``offset``: each must verify and continue the txids.

    To scan a large file a window at a time: ``buf`` holds the bytes from file offset ``base``,
    ``expected_txid`` and ``last_epoch`` carry on from the previous window; offsets in the result
    and its error are file offsets.
    """
    cdef scan_state s
    return _scan_obj(buf, start_txid, offset, &s, expected_txid, last_epoch, base)


def iter_frames(buf, start_txid, Py_ssize_t offset=QJM_SEGMENT_HEADER_SIZE):
    """(header, offset) of every valid frame, stopping where ``scan`` would stop."""
    cdef scan_state s
    cdef Py_buffer v
    cdef fhdr h
    cdef Py_ssize_t pos = offset
    cdef list out = []
    _scan_obj(buf, start_txid, offset, &s)
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        while pos < s.pos:
            _check_header(<const unsigned char *>v.buf, v.len, pos, &h)
            out.append((_header_obj(&h), pos))
            pos += HDR + h.payload_len
    finally:
        PyBuffer_Release(&v)
    return out


def layout():
    """Field offsets and sizes of the frame and segment headers, and the constants, from frame.h."""
    cdef qjm_frame_header f
    cdef qjm_segment_header g
    cdef char *fb = <char *>&f
    cdef char *gb = <char *>&g
    frame = {
        "magic": <char *>&f.magic - fb,
        "version": <char *>&f.version - fb,
        "flags": <char *>&f.flags - fb,
        "record_count": <char *>&f.record_count - fb,
        "payload_len": <char *>&f.payload_len - fb,
        "epoch": <char *>&f.epoch - fb,
        "segment_txid": <char *>&f.segment_txid - fb,
        "first_txid": <char *>&f.first_txid - fb,
        "payload_xxh3": <char *>&f.payload_xxh3 - fb,
        "reserved": <char *>&f.reserved - fb,
        "header_xxh3": <char *>&f.header_xxh3 - fb,
        "size": sizeof(qjm_frame_header),
    }
    segment = {
        "magic": <char *>&g.magic - gb,
        "version": <char *>&g.version - gb,
        "flags": <char *>&g.flags - gb,
        "start_txid": <char *>&g.start_txid - gb,
        "epoch": <char *>&g.epoch - gb,
        "reserved": <char *>&g.reserved[0] - gb,
        "header_xxh3": <char *>&g.header_xxh3 - gb,
        "size": sizeof(qjm_segment_header),
    }
    constants = {
        "FRAME_MAGIC": QJM_FRAME_MAGIC,
        "SEGMENT_MAGIC": QJM_SEGMENT_MAGIC,
        "FORMAT_VERSION": QJM_FORMAT_VERSION,
        "FRAME_HEADER_SIZE": QJM_FRAME_HEADER_SIZE,
        "SEGMENT_HEADER_SIZE": QJM_SEGMENT_HEADER_SIZE,
        "RECORD_PREFIX_SIZE": QJM_RECORD_PREFIX_SIZE,
        "FRAME_HEADER_CHECKED": QJM_FRAME_HEADER_CHECKED,
        "SEGMENT_HEADER_CHECKED": QJM_SEGMENT_HEADER_CHECKED,
        "MAX_PAYLOAD": QJM_MAX_PAYLOAD,
        "MAX_RECORDS": QJM_MAX_RECORDS,
    }
    return {"frame": frame, "segment": segment, "constants": constants}
