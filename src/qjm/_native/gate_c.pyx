# cython: auto_pickle=False, autotestdict=False
"""The write gate of a node's open segment, in Cython (twin of ``gate_py``; its docstring says what
a gate is). Called by the data plane's ``Receiver.journal_run`` on frames still in the receive
buffer: each frame is checked and copied into the segment's native appender without a Python
object, and after the ack a durable run costs an index entry and a few counters, which the journal
takes when it needs them (design §1.3). Every call holds the GIL: the journal's lock serialises
the writer's calls, and the GIL makes ``take_stats`` atomic with them for a scrape that does not
take that lock.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport UINT64_MAX, int64_t, uint64_t
from libc.stdlib cimport free, realloc
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec

from qjm._native.framing_c cimport frame_ids
from qjm._native.segment_io_c cimport Appender

import time

cdef enum:
    KEEP_ENTRIES = 4096             # take_index frees a larger array instead of keeping it


cdef inline double _now(int clock) noexcept nogil:
    cdef timespec t
    clock_gettime(clock, &t)
    return <double>t.tv_sec + <double>t.tv_nsec * 1e-9


cdef class WriteGate:
    """The write side of one open segment (``qjm._native.gate_py.WriteGate``'s twin).

    ``stager``, a native ``segment_io.Appender`` behind ``appender``, takes the frames in place;
    without one they go through ``appender.append``. This twin times syncs with CLOCK_MONOTONIC and
    ignores ``clock``; it counts them per bound as ``qjm.histogram.Histogram.observe`` does.
    """

    def __cinit__(self):
        self._staged = NULL
        self._index = NULL

    def __init__(self, appender, start, *, stager=None, bounds=(), clock=time.monotonic):
        cdef int i
        if start < 1:
            raise ValueError(f"a segment starts at txid 1 or later, not {start}")
        bounds = tuple(bounds)
        if len(bounds) > MAX_GATE_BOUNDS:
            raise ValueError(f"a gate takes at most {MAX_GATE_BOUNDS} bounds, not {len(bounds)}")
        self._appender = appender
        self._stager = stager if isinstance(stager, Appender) else None
        self._start = start
        self._next = start
        self._last_epoch = 0
        self.epoch = 0
        self.committed = 0
        self.hook = None
        self.sync_data = True
        self.noticed = 0
        self._nb = len(bounds)
        for i in range(self._nb):
            self._bounds[i] = bounds[i]
        for i in range(self._nb + 1):
            self._counts[i] = 0

    def __dealloc__(self):
        free(self._staged)
        free(self._index)

    @property
    def start(self):
        return self._start

    @property
    def next_txid(self):
        """The txid the next frame must start at once everything staged is durable."""
        return self._next

    @property
    def last_epoch(self):
        """The epoch of the last durable frame (the segment's, as far as this gate wrote it)."""
        return self._last_epoch

    @property
    def staged_txid(self):
        """The last txid staged and not yet durable; 0 when nothing is."""
        return self.staged_last()

    cdef uint64_t staged_last(self) noexcept:
        return self._staged[self._nstaged - 1].last if self._nstaged else 0

    cdef int _grow(self, gent **arr, Py_ssize_t *cap, Py_ssize_t need) except -1:
        cdef Py_ssize_t ncap = cap[0] if cap[0] else 64
        cdef gent *grown
        if need <= cap[0]:
            return 0
        while ncap < need:
            ncap *= 2
        grown = <gent *>realloc(arr[0], <size_t>ncap * sizeof(gent))
        if grown == NULL:
            raise MemoryError()
        arr[0] = grown
        cap[0] = ncap
        return 0

    cdef int _stage_bytes(self, const unsigned char *p, Py_ssize_t n, uint64_t epoch, uint64_t first,
                          uint64_t last) except -1:
        cdef gent e
        if self.hook is not None:
            self.hook(first)
        if self._stager is not None:
            e.offset = self._stager.stage(p, n)
        else:
            e.offset = self._appender.size
            self._appender.append(PyBytes_FromStringAndSize(<const char *>p, n))
        e.first = first
        e.last = last
        e.length = n
        self._grow(&self._staged, &self._capstaged, self._nstaged + 1)
        self._staged[self._nstaged] = e
        self._nstaged += 1
        self._staged_epoch = epoch
        return 0

    cdef int stage_at(self, const unsigned char *p, Py_ssize_t n) except -1:
        cdef uint64_t epoch = 0, segment = 0, first = 0, count = 0
        cdef uint64_t expected = self._staged[self._nstaged - 1].last + 1 if self._nstaged else self._next
        if frame_ids(p, n, &epoch, &segment, &first, &count) != 0:
            return 0
        if self.epoch == 0 or epoch != self.epoch or segment != self._start or first != expected:
            return 0
        if first > UINT64_MAX - count + 1:  # its last txid would pass 2**64 - 1: the journal says so
            return 0
        self._stage_bytes(p, n, epoch, first, first + count - 1)
        return 1

    def stage(self, frame):
        """Stage ``frame`` if it passes: whole and intact, of the admitted epoch, of this segment, at
        the next txid. False (nothing staged) otherwise; the journal's checks then say why."""
        cdef Py_buffer v
        PyObject_GetBuffer(frame, &v, PyBUF_SIMPLE)
        try:
            return self.stage_at(<const unsigned char *>v.buf, v.len) == 1
        finally:
            PyBuffer_Release(&v)

    def stage_checked(self, frame, uint64_t epoch, uint64_t first, uint64_t last):
        """Stage ``frame``, which the journal checked itself (``stage`` refused it)."""
        cdef Py_buffer v
        PyObject_GetBuffer(frame, &v, PyBUF_SIMPLE)
        try:
            self._stage_bytes(<const unsigned char *>v.buf, v.len, epoch, first, last)
        finally:
            PyBuffer_Release(&v)

    cdef int note_at(self, uint64_t epoch, int64_t txid) noexcept:
        if self.epoch == 0 or epoch != self.epoch:
            return 0
        if txid > self.noticed:
            self.noticed = txid
        return 1

    def note(self, uint64_t epoch, int64_t txid):
        """A commit notice: taken (True) if of the admitted epoch, else left to the journal (False)."""
        return self.note_at(epoch, txid) == 1

    cdef double write_durable(self) except -1.0:
        cdef double started
        # Room in the index first: after the ack nothing may fail.
        self._grow(&self._index, &self._capindex, self._nindex + self._nstaged)
        started = _now(CLOCK_MONOTONIC)
        if self.sync_data:
            self._appender.sync()
        return _now(CLOCK_MONOTONIC) - started

    cdef void fold(self, double seconds) noexcept:
        cdef Py_ssize_t i
        cdef int b = 0
        cdef gent *staged = self._staged
        cdef Py_ssize_t n = self._nstaged
        if n == 0:
            return
        for i in range(n):
            self._index[self._nindex + i] = staged[i]
            if self.committed >= 0 and staged[i].last <= <uint64_t>self.committed:
                self._lagging += 1
        self._nindex += n
        self._nstaged = 0
        self._next = staged[n - 1].last + 1
        self._last_epoch = self._staged_epoch
        self._batches += n
        self._txns += staged[n - 1].last - staged[0].first + 1
        self._bytes += <uint64_t>(staged[n - 1].offset + staged[n - 1].length - staged[0].offset)
        while b < self._nb and seconds > self._bounds[b]:
            b += 1
        self._counts[b] += 1
        self._total += seconds
        self._last_time = _now(CLOCK_REALTIME)

    def sync(self, ack=None):
        """Make everything staged durable with one sync, ``ack`` its last txid, then keep its index
        and counters; returns the durable txid (``next_txid - 1``). A failed sync raises with the
        frames still staged: the journal then drops the open segment."""
        cdef double seconds
        cdef uint64_t durable
        if not self._nstaged:
            return self._next - 1
        seconds = self.write_durable()
        durable = self._staged[self._nstaged - 1].last
        try:
            if ack is not None:
                ack(durable)
        finally:
            self.fold(seconds)
        return durable

    def take_index(self):
        """The durable frames since the last call, (first, last, offset, length) each, in order."""
        cdef Py_ssize_t i
        cdef list out = [(self._index[i].first, self._index[i].last, self._index[i].offset, self._index[i].length)
                         for i in range(self._nindex)]
        self._nindex = 0
        if self._capindex > KEEP_ENTRIES:
            free(self._index)
            self._index = NULL
            self._capindex = 0
        return out

    def take_stats(self):
        """The counters since the last call, (batches, txns, bytes, lagging batches, sync-time
        counts per bound (+Inf last), their sum, wall clock of the last), and zero them."""
        cdef int i
        out = (self._batches, self._txns, self._bytes, self._lagging,
               [self._counts[i] for i in range(self._nb + 1)], self._total, self._last_time)
        self._batches = self._txns = self._bytes = self._lagging = 0
        for i in range(self._nb + 1):
            self._counts[i] = 0
        self._total = 0.0
        self._last_time = 0.0
        return out
