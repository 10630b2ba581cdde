# Declarations of the native write gate (gate_c.pyx), which fanout_c's Receiver stages into.

from libc.stdint cimport int64_t, uint64_t

from qjm._native.segment_io_c cimport Appender


cdef enum:
    MAX_GATE_BOUNDS = 32            # sync-time bounds a gate takes (qjm.histogram's has 16)


ctypedef struct gent:               # one frame: (first, last, offset, length)
    uint64_t first
    uint64_t last
    int64_t offset
    int64_t length


cdef class WriteGate:
    cdef object _appender           # the segment's SegmentAppender: its sync, and append without a stager
    cdef Appender _stager           # the native appender frames are copied into in place, or None
    cdef uint64_t _start
    cdef uint64_t _next
    cdef uint64_t _last_epoch
    cdef public uint64_t epoch
    cdef public int64_t committed
    cdef public object hook
    cdef public bint sync_data
    cdef public int64_t noticed
    cdef gent *_staged
    cdef Py_ssize_t _nstaged, _capstaged
    cdef uint64_t _staged_epoch
    cdef gent *_index
    cdef Py_ssize_t _nindex, _capindex
    cdef double _bounds[MAX_GATE_BOUNDS]
    cdef int _nb
    cdef uint64_t _counts[MAX_GATE_BOUNDS + 1]
    cdef double _total
    cdef double _last_time
    cdef uint64_t _batches, _txns, _bytes, _lagging

    cdef int stage_at(self, const unsigned char *p, Py_ssize_t n) except -1
    # Stage the n-byte frame at p if it passes (1), else 0 with nothing staged.
    cdef uint64_t staged_last(self) noexcept
    # The last txid staged and not yet durable; 0 when nothing is.
    cdef int note_at(self, uint64_t epoch, int64_t txid) noexcept
    # A commit notice: 1 taken (of the admitted epoch), 0 left to the journal.
    cdef double write_durable(self) except -1.0
    # Sync what is staged (there is some); returns the seconds the sync took.
    cdef void fold(self, double seconds) noexcept
    # After the ack (write_durable made room): the staged frames go to the index and the counters.
    cdef int _grow(self, gent **arr, Py_ssize_t *cap, Py_ssize_t need) except -1
    cdef int _stage_bytes(self, const unsigned char *p, Py_ssize_t n, uint64_t epoch, uint64_t first,
                          uint64_t last) except -1
