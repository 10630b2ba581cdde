# cython: auto_pickle=False, autotestdict=False
# Native appender of in-progress segments (twin of segment_io_py: same API, same bytes, same errors).
#
# append() stages bytes in an aligned buffer; sync() writes them with one O_DIRECT pwrite and an
# fdatasync, or (QJM_IO_URING=1, where io_uring is compiled in and allowed) one O_DIRECT write
# linked to an fdatasync on io_uring (IOSQE_IO_LINK). The plain path is the default because it
# measured faster here: io_uring runs the fdatasync on a kernel worker, two more thread switches
# per sync. The buffer starts with the partial last block already in the file, so each write
# starts on a block boundary and rewrites that block (same bytes plus the new ones); the padding
# after the logical end is zeros. The file is preallocated with written zeros (64 KiB at first,
# doubling up to `prealloc`, then steps of `prealloc`), so an fdatasync of an overwrite has no
# metadata to commit, a new segment costs little, and a scanner sees a clean zero tail. A
# write-out of at least EXTEND_RUN bytes (a node's group commit under a stream of batches) extends
# the file with its own blocks instead: zeros written ahead would be written over at once,
# doubling the disk's bytes, and one metadata commit is nothing beside a write that large. The GIL
# is released around every syscall; `_busy` keeps other threads out.

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.errno cimport EINTR, EINVAL, EIO, errno
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memmove, memset
from posix.fcntl cimport F_GETFL, F_SETFL, O_CLOEXEC, O_CREAT, O_DIRECT, O_RDWR, O_TRUNC, fcntl, open as c_open
from posix.types cimport off_t
from posix.unistd cimport close as c_close, fdatasync, fsync, pread, pwrite

import os

cdef extern from "<stdlib.h>" nogil:
    int posix_memalign(void **memptr, size_t alignment, size_t size)

cdef extern from "<errno.h>" nogil:
    int ECANCELED

cdef enum:
    _BLOCK = 4096
    _ZBUF = 1024 * 1024                 # zeros written per syscall when preallocating
    _MIN_CAP = 64 * 1024
    _FIRST_STEP = 64 * 1024             # a new segment starts with this much preallocated
    _EXTEND_RUN = 256 * 1024            # a write-out at least this large preallocates nothing ahead

BLOCK = _BLOCK
DEFAULT_PREALLOC = 4 * 1024 * 1024     # the largest preallocation step
FLUSH_BYTES = 8 * 1024 * 1024           # staged bytes that are written out before sync()
EXTEND_RUN = _EXTEND_RUN                # a write-out this large extends the file, no zeros ahead
URING_BUILT = bool(QJM_URING_BUILT)

cdef unsigned char *_zeros = NULL
cdef bint _uring_ok = False
cdef bint _uring_default = False


cdef inline Py_ssize_t _up(Py_ssize_t n, Py_ssize_t step) noexcept nogil:
    return (n + step - 1) // step * step


cdef inline Py_ssize_t _down(Py_ssize_t n, Py_ssize_t step) noexcept nogil:
    return n // step * step


cdef Py_ssize_t _prealloc_target(Py_ssize_t end, Py_ssize_t cap) noexcept nogil:
    # Smallest step of the ladder at or above `end`: FIRST_STEP, doubling up to `cap`, then
    # multiples of `cap`. A monotone function of `end`, so the file length never depends on when
    # writes happened: only on the furthest logical end.
    cdef Py_ssize_t v = _FIRST_STEP if _FIRST_STEP < cap else cap
    if end < 1:
        end = 1
    while v < end and v < cap:
        v = v * 2 if v * 2 < cap else cap
    if v >= end:
        return v
    return _up(end, cap)


cdef io_uring *_new_ring() noexcept:
    return <io_uring *>calloc(1, sizeof(io_uring))


cdef int _pwrite_all(int fd, const unsigned char *p, Py_ssize_t n, Py_ssize_t off) noexcept nogil:
    # 0 or an errno; retries EINTR and short writes.
    cdef ssize_t r
    while n > 0:
        r = pwrite(fd, p, <size_t>n, <off_t>off)
        if r < 0:
            if errno == EINTR:
                continue
            return errno
        if r == 0:
            return EIO
        p += r
        off += r
        n -= r
    return 0


cdef int _write_zeros(int fd, Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    cdef Py_ssize_t n
    cdef int err
    while start < end:
        n = end - start
        if n > _ZBUF:
            n = _ZBUF
        err = _pwrite_all(fd, _zeros, n, start)
        if err:
            return err
        start += n
    return 0


cdef int _datasync(int fd) noexcept nogil:
    while fdatasync(fd) != 0:
        if errno != EINTR:
            return errno
    return 0


cdef int _uring_write(io_uring *ring, int fd, const unsigned char *p, Py_ssize_t n, Py_ssize_t off,
                      bint sync) noexcept nogil:
    # One write, linked to an fdatasync when `sync`; 0 or an errno. A short write (the linked
    # fsync then completes with -ECANCELED) is finished with pwrite + fdatasync.
    cdef io_uring_sqe *sqe
    cdef io_uring_cqe *cqe = NULL
    cdef int want = 2 if sync else 1
    cdef int got = 0
    cdef int ret
    cdef int wres = -EIO
    cdef int fres = 0
    sqe = io_uring_get_sqe(ring)
    if sqe == NULL:
        return EIO
    io_uring_prep_write(sqe, fd, p, <unsigned>n, <unsigned long long>off)
    io_uring_sqe_set_data64(sqe, 1)
    if sync:
        io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK)
        sqe = io_uring_get_sqe(ring)
        io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC)
        io_uring_sqe_set_data64(sqe, 2)
    ret = io_uring_submit_and_wait(ring, <unsigned>want)
    while ret == -EINTR:
        ret = io_uring_submit_and_wait(ring, <unsigned>want)
    if ret < 0:
        return -ret
    while got < want:
        ret = io_uring_wait_cqe(ring, &cqe)
        if ret == -EINTR:
            continue
        if ret < 0:
            return -ret
        if cqe.user_data == 1:
            wres = cqe.res
        else:
            fres = cqe.res
        io_uring_cqe_seen(ring, cqe)
        got += 1
    if wres < 0:
        return -wres
    if wres < n:
        ret = _pwrite_all(fd, p + wres, n - wres, off + wres)
        if ret == 0 and sync:
            ret = _datasync(fd)
        return ret
    if sync and fres < 0 and fres != -ECANCELED:
        return -fres
    return 0


cdef object _oserror(int err, object path):
    return OSError(err, os.strerror(err), path)


def io_uring_available():
    """True when io_uring is compiled in and the kernel lets this process set up a ring."""
    return bool(_uring_ok)


def io_uring_default():
    """Whether an Appender not told otherwise writes through io_uring: only with QJM_IO_URING=1.

    Measured on this project's machine, the plain path is faster: io_uring runs the linked
    fdatasync on a kernel worker thread, two more thread switches per sync on two vCPUs.
    """
    return bool(_uring_default)


def direct_supported(directory):
    """True when files in ``directory`` accept O_DIRECT writes of aligned blocks."""
    cdef bytes name = os.fsencode(os.path.join(os.fspath(directory), f".qjm-direct-probe-{os.getpid()}"))
    cdef const char *cname = name
    cdef int fd
    cdef int err = 0
    with nogil:
        fd = c_open(cname, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0o600)
        if fd >= 0:
            err = _pwrite_all(fd, _zeros, _BLOCK, 0)
            c_close(fd)
    if fd < 0:
        return False
    os.unlink(name)
    return err == 0


cdef class Appender:
    """An in-progress segment file opened for appending: created with ``header``, preallocated.

    ``append`` stages bytes, ``sync`` writes them and makes them durable (one fdatasync for
    everything appended since the last sync: group commit). ``size`` is the logical end.
    """

    def __cinit__(self):
        self._fd = -1
        self._buf = NULL
        self._cap = 0
        self._uring = False
        self._ring = NULL

    def __init__(self, path, header, *, Py_ssize_t prealloc=DEFAULT_PREALLOC, bint direct=True,
                 io_uring=None):
        cdef Py_buffer v
        cdef bytes bpath
        cdef const char *cpath
        cdef int fd = -1
        cdef int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC
        cdef int err = 0
        if self._buf != NULL:
            raise RuntimeError("Appender is already initialised")
        if prealloc < _BLOCK or prealloc % _BLOCK:
            raise ValueError(f"prealloc must be a positive multiple of {_BLOCK}, not {prealloc}")
        PyObject_GetBuffer(header, &v, PyBUF_SIMPLE)
        try:
            self._chunk = prealloc
            self._reserve(v.len)
            memcpy(self._buf, v.buf, <size_t>v.len)
            self._size = v.len
        finally:
            PyBuffer_Release(&v)
        self.path = os.fspath(path)
        bpath = os.fsencode(self.path)
        cpath = bpath
        with nogil:
            if direct:
                fd = c_open(cpath, flags | O_DIRECT, 0o600)
                if fd < 0 and errno == EINVAL:
                    direct = False
            if not direct:
                fd = c_open(cpath, flags, 0o600)
            if fd < 0:
                err = errno
        if fd < 0:
            raise _oserror(err, self.path)
        self._fd = fd
        self._direct = direct
        if (_uring_default if io_uring is None else io_uring) and _uring_ok:
            self._ring = _new_ring()
            self._uring = self._ring != NULL and io_uring_queue_init(8, self._ring, 0) == 0
        try:
            self._write_out(False)
            with nogil:
                err = 0
                while fsync(fd) != 0:
                    if errno != EINTR:
                        err = errno
                        break
            if err:
                raise _oserror(err, self.path)
        except BaseException:
            self.close()
            raise

    def __dealloc__(self):
        if self._fd >= 0:
            c_close(self._fd)
            self._fd = -1
        if self._uring:
            io_uring_queue_exit(self._ring)
            self._uring = False
        free(self._ring)
        self._ring = NULL
        free(self._buf)
        self._buf = NULL

    @property
    def size(self):
        """Logical end: header plus every byte appended (written or still staged)."""
        return self._size

    @property
    def allocated(self):
        """File length: zeros from the logical end up to the next preallocation step."""
        return self._alloc

    @property
    def direct(self):
        """O_DIRECT is in effect (False where the filesystem refused it)."""
        return bool(self._direct)

    @property
    def io(self):
        """The write path: ``"io_uring"`` (write linked to fdatasync) or ``"pwrite"``."""
        return "io_uring" if self._uring else "pwrite"

    @property
    def closed(self):
        return self._fd < 0

    cdef int _reserve(self, Py_ssize_t need) except -1:
        # Room for `need` bytes from _base, rounded to whole blocks (O_DIRECT writes the padding too).
        cdef Py_ssize_t cap
        cdef void *nb = NULL
        need = _up(need, _BLOCK)
        if need <= self._cap and self._buf != NULL:
            return 0
        cap = self._cap * 2
        if cap < need:
            cap = need
        if cap < _MIN_CAP:
            cap = _MIN_CAP
        if posix_memalign(&nb, _BLOCK, <size_t>cap) != 0:
            raise MemoryError(f"Appender: cannot allocate {cap} aligned bytes")
        if self._buf != NULL:
            memcpy(nb, self._buf, <size_t>(self._size - self._base))
            free(self._buf)
        self._buf = <unsigned char *>nb
        self._cap = cap
        return 0

    cdef int _fail_direct(self) except -1:
        # The filesystem took O_DIRECT at open but refuses the writes: go on buffered.
        cdef int fl = fcntl(self._fd, F_GETFL)
        if fl < 0 or fcntl(self._fd, F_SETFL, fl & ~O_DIRECT) < 0:
            raise _oserror(errno, self.path)
        self._direct = False
        return 0

    cdef int _write_out(self, bint sync) except -1:
        cdef Py_ssize_t end = self._size
        cdef Py_ssize_t base = self._base
        cdef Py_ssize_t wend = _up(end, _BLOCK)
        cdef Py_ssize_t alloc = self._alloc
        cdef Py_ssize_t target = _prealloc_target(end, self._chunk)
        cdef Py_ssize_t zfrom = alloc if alloc > wend else wend
        cdef Py_ssize_t keep
        cdef bint data = end > self._written
        cdef bint zeros
        cdef int fd = self._fd
        cdef int err = 0
        cdef int attempt
        if end - self._written >= _EXTEND_RUN and target > wend:
            target = wend                   # a large run extends the file itself: no zeros ahead
        if target < alloc:
            target = alloc
        zeros = zfrom < target
        if not data and not zeros and not (sync and self._dirty):
            return 0
        if data:
            memset(self._buf + (end - base), 0, <size_t>(wend - end))
        self._busy = True
        try:
            for attempt in range(2):
                with nogil:
                    err = 0
                    if zeros:
                        err = _write_zeros(fd, zfrom, target)
                    if err == 0 and data:
                        if self._uring:
                            err = _uring_write(self._ring, fd, self._buf, wend - base, base, sync)
                        else:
                            err = _pwrite_all(fd, self._buf, wend - base, base)
                            if err == 0 and sync:
                                err = _datasync(fd)
                    elif err == 0 and sync:
                        err = _datasync(fd)
                if err == EINVAL and self._direct and attempt == 0:
                    self._fail_direct()
                    continue
                break
        finally:
            self._busy = False
        if err:
            raise _oserror(err, self.path)
        self._alloc = target
        self._written = end
        self._dirty = not sync
        # Keep the partial last block at the front of the buffer: the next write starts there.
        keep = _down(end, _BLOCK)
        if keep > base:
            memmove(self._buf, self._buf + (keep - base), <size_t>(end - keep))
            self._base = keep
        return 0

    cdef int _check(self) except -1:
        if self._fd < 0:
            raise ValueError("I/O operation on a closed appender")
        if self._busy:
            raise RuntimeError("Appender is in use by another thread")
        return 0

    cdef Py_ssize_t stage(self, const unsigned char *p, Py_ssize_t n) except -1:
        cdef Py_ssize_t at = self._size
        self._check()
        if n:
            self._reserve(self._size + n - self._base)
            memcpy(self._buf + (self._size - self._base), p, <size_t>n)
            self._size += n
        return at

    def append(self, data):
        """Stage ``data`` at the logical end; written by ``sync`` (or early, past FLUSH_BYTES)."""
        cdef Py_buffer v
        self._check()
        PyObject_GetBuffer(data, &v, PyBUF_SIMPLE)
        try:
            if v.len:
                self._reserve(self._size + v.len - self._base)
                memcpy(self._buf + (self._size - self._base), v.buf, <size_t>v.len)
                self._size += v.len
        finally:
            PyBuffer_Release(&v)
        if self._size - self._written >= FLUSH_BYTES:
            self._write_out(False)

    def sync(self):
        """Write what is staged and fdatasync: everything appended so far is durable on return."""
        self._check()
        self._write_out(True)

    def truncate(self, Py_ssize_t size):
        """Cut the logical end back to ``size``: later bytes become zeros on disk; durable on return."""
        cdef Py_ssize_t old
        cdef Py_ssize_t blk
        cdef ssize_t r = 0
        cdef int err = 0
        cdef int fd = self._fd
        self._check()
        if size < 0 or size > self._size:
            raise ValueError(f"cannot truncate to {size}: the segment holds {self._size} bytes")
        if size >= self._written:
            self._size = size
            self._write_out(True)
            return
        old = self._written
        blk = _down(size, _BLOCK)
        self._busy = True
        try:
            with nogil:
                if blk < self._base:
                    r = pread(fd, self._buf, _BLOCK, <off_t>blk)
                    if r < 0:
                        err = errno
                    elif r < _BLOCK:
                        memset(self._buf + r, 0, <size_t>(_BLOCK - r))
                if err == 0:
                    memset(self._buf + (size - blk), 0, <size_t>(_BLOCK - (size - blk)))
                    err = _pwrite_all(fd, self._buf, _BLOCK, blk)
                if err == 0:
                    err = _write_zeros(fd, blk + _BLOCK, _up(old, _BLOCK))
                if err == 0:
                    err = _datasync(fd)
        finally:
            self._busy = False
        if err:
            raise _oserror(err, self.path)
        self._base = blk
        self._size = self._written = size
        self._dirty = False

    def close(self):
        """Close the file; bytes staged since the last sync are dropped (they were never durable)."""
        if self._busy:
            raise RuntimeError("Appender is in use by another thread")
        if self._fd >= 0:
            c_close(self._fd)
            self._fd = -1
        if self._uring:
            io_uring_queue_exit(self._ring)
            self._uring = False


cdef int _init() except -1:
    global _zeros, _uring_ok, _uring_default
    cdef void *z = NULL
    cdef io_uring ring
    if posix_memalign(&z, _BLOCK, _ZBUF) != 0:
        raise MemoryError("segment_io_c: cannot allocate the zero buffer")
    memset(z, 0, _ZBUF)
    _zeros = <unsigned char *>z
    if QJM_URING_BUILT and os.environ.get("QJM_NO_URING", "") not in ("1", "true", "yes"):
        if io_uring_queue_init(2, &ring, 0) == 0:
            io_uring_queue_exit(&ring)
            _uring_ok = True
    _uring_default = _uring_ok and os.environ.get("QJM_IO_URING", "") in ("1", "true", "yes")
    return 0


_init()
