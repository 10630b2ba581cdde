# Declarations other native modules cimport: the frame layout (include/qjm/frame.h, the one
# declaration of it), XXH3 and the FrameBuilder buffer.

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "qjm/frame.h" nogil:
    unsigned int QJM_FRAME_MAGIC
    unsigned int QJM_SEGMENT_MAGIC
    unsigned int QJM_FORMAT_VERSION
    unsigned int QJM_FRAME_HEADER_SIZE
    unsigned int QJM_SEGMENT_HEADER_SIZE
    unsigned int QJM_RECORD_PREFIX_SIZE
    unsigned int QJM_FRAME_HEADER_CHECKED
    unsigned int QJM_SEGMENT_HEADER_CHECKED
    unsigned int QJM_MAX_PAYLOAD
    unsigned int QJM_MAX_RECORDS

    # Packed in the header (#pragma pack 1): fields may sit at any address, gcc emits safe loads.
    ctypedef struct qjm_frame_header:
        uint32_t magic
        uint16_t version
        uint16_t flags
        uint32_t record_count
        uint32_t payload_len
        uint64_t epoch
        uint64_t segment_txid
        uint64_t first_txid
        uint64_t payload_xxh3
        uint64_t reserved
        uint64_t header_xxh3

    ctypedef struct qjm_segment_header:
        uint32_t magic
        uint16_t version
        uint16_t flags
        uint64_t start_txid
        uint64_t epoch
        uint8_t reserved[32]
        uint64_t header_xxh3


# The plain XXH3_64bits, which Debian builds for the SSE2 baseline, and not libxxhash's x86
# dispatcher: on a CPU with AVX-512 the dispatcher runs 512-bit multiplies, which lower the core's
# clock for a while after each use; a node verifying, and a writer sealing, one frame per commit
# then runs its whole commit slower (about 30 us of a 350 us sync, docs/performance.md). SSE2 still
# hashes 14 GB/s here, about 4% of a core at the disk's ceiling.
cdef extern from "xxhash.h" nogil:
    ctypedef unsigned long long XXH64_hash_t
    XXH64_hash_t XXH3_64bits(const void *data, size_t length)


cdef Py_ssize_t frame_length(const unsigned char *p) except -1
# The whole length (header and payload) of the frame whose header is at p (QJM_FRAME_HEADER_SIZE
# bytes there), after decode_header's checks of it, raising its errors (offset 0).


cdef int frame_ids(const unsigned char *p, Py_ssize_t n, uint64_t *epoch, uint64_t *segment_txid,
                   uint64_t *first_txid, uint64_t *record_count) noexcept nogil
# verify_frame's checks of the frame at p (n bytes there): 0 and its ids when it passes, else
# nonzero (verify_frame_ids raises the error that says why).


cdef struct offsets_t:             # a 1-D buffer of record offsets, read in place
    const char *p
    Py_ssize_t n                    # entries: records + 1
    int size                        # bytes per entry
    bint signed


cdef class FrameBuilder:
    # One malloc'd buffer: QJM_FRAME_HEADER_SIZE bytes reserved for the header, then the payload.
    cdef unsigned char *_buf
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _used          # header + payload bytes written
    cdef Py_ssize_t _count         # records written
    # Records whose buffers are held but not yet copied (copied in chunks without the GIL).
    cdef Py_buffer *_views
    cdef Py_ssize_t _nviews
    cdef Py_ssize_t _pending       # payload bytes (prefixes included) of the held views
    cdef Py_ssize_t _overflow      # encode_frame only: bytes offered beyond QJM_MAX_PAYLOAD
    cdef bint _busy

    cdef int _enter(self) except -1
    cdef int _reserve(self, Py_ssize_t extra) except -1
    cdef int _flush(self) except -1
    cdef int _push(self, object record, bint limit) except -1
    cdef int _add_rows(self, const unsigned char *base, Py_ssize_t nrows, Py_ssize_t width, bint limit) except -1
    cdef int _add_many(self, object records, bint limit) except -1
    cdef Py_ssize_t _add_packed(self, const unsigned char *data, Py_ssize_t dlen, const offsets_t *o,
                                Py_ssize_t start, Py_ssize_t limit) except -1
    cdef Py_ssize_t _packed(self, object records, object offsets, Py_ssize_t start, Py_ssize_t limit) except -1
    cdef bytes _take(self, uint64_t epoch, uint64_t segment_txid, uint64_t first_txid)
    cdef void _reset(self) noexcept
