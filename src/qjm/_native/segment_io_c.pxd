# Declarations of the native segment appender (segment_io_c.pyx): the io_uring shim and the class.
#
# setup.py defines QJM_HAVE_LIBURING when liburing links; without it the shim below declares an
# empty ring whose init fails with -ENOSYS, so the module builds and runs on pwritev + fdatasync.

cdef extern from *:
    """
    #ifdef QJM_HAVE_LIBURING
    #include <liburing.h>
    #define QJM_URING_BUILT 1
    #else
    #include <errno.h>
    #define QJM_URING_BUILT 0
    struct io_uring { int unused; };
    struct io_uring_sqe { int unused; };
    struct io_uring_cqe { unsigned long long user_data; int res; unsigned flags; };
    #define IOSQE_IO_LINK 0u
    #define IORING_FSYNC_DATASYNC 0u
    static inline int io_uring_queue_init(unsigned e, struct io_uring *r, unsigned f)
    { (void)e; (void)r; (void)f; return -ENOSYS; }
    static inline void io_uring_queue_exit(struct io_uring *r) { (void)r; }
    static inline struct io_uring_sqe *io_uring_get_sqe(struct io_uring *r) { (void)r; return 0; }
    static inline void io_uring_prep_write(struct io_uring_sqe *s, int fd, const void *b, unsigned n,
                                           unsigned long long off) { (void)s; (void)fd; (void)b; (void)n; (void)off; }
    static inline void io_uring_prep_fsync(struct io_uring_sqe *s, int fd, unsigned f) { (void)s; (void)fd; (void)f; }
    static inline void io_uring_sqe_set_flags(struct io_uring_sqe *s, unsigned f) { (void)s; (void)f; }
    static inline void io_uring_sqe_set_data64(struct io_uring_sqe *s, unsigned long long d) { (void)s; (void)d; }
    static inline int io_uring_submit_and_wait(struct io_uring *r, unsigned n) { (void)r; (void)n; return -ENOSYS; }
    static inline int io_uring_wait_cqe(struct io_uring *r, struct io_uring_cqe **c)
    { (void)r; (void)c; return -ENOSYS; }
    static inline void io_uring_cqe_seen(struct io_uring *r, struct io_uring_cqe *c) { (void)r; (void)c; }
    #endif
    """
    int QJM_URING_BUILT
    struct io_uring:
        pass
    struct io_uring_sqe:
        pass
    struct io_uring_cqe:
        unsigned long long user_data
        int res
        unsigned flags
    unsigned IOSQE_IO_LINK
    unsigned IORING_FSYNC_DATASYNC
    int io_uring_queue_init(unsigned entries, io_uring *ring, unsigned flags) nogil
    void io_uring_queue_exit(io_uring *ring) nogil
    io_uring_sqe *io_uring_get_sqe(io_uring *ring) nogil
    void io_uring_prep_write(io_uring_sqe *sqe, int fd, const void *buf, unsigned nbytes,
                             unsigned long long offset) nogil
    void io_uring_prep_fsync(io_uring_sqe *sqe, int fd, unsigned fsync_flags) nogil
    void io_uring_sqe_set_flags(io_uring_sqe *sqe, unsigned flags) nogil
    void io_uring_sqe_set_data64(io_uring_sqe *sqe, unsigned long long data) nogil
    int io_uring_submit_and_wait(io_uring *ring, unsigned wait_nr) nogil
    int io_uring_wait_cqe(io_uring *ring, io_uring_cqe **cqe_ptr) nogil
    void io_uring_cqe_seen(io_uring *ring, io_uring_cqe *cqe) nogil


cdef class Appender:
    cdef int _fd
    cdef readonly str path
    cdef Py_ssize_t _size          # logical end: header + frames appended (staged or written)
    cdef Py_ssize_t _written       # bytes [0, _written) are in the file
    cdef Py_ssize_t _alloc         # file length: zeros from the logical end up to here
    cdef Py_ssize_t _chunk         # largest preallocation step, a multiple of BLOCK
    cdef Py_ssize_t _base          # file offset of _buf[0]: _written rounded down to BLOCK
    # Aligned staging buffer: the partial last block already in the file, then staged appends.
    cdef unsigned char *_buf
    cdef Py_ssize_t _cap
    cdef bint _direct              # O_DIRECT is in effect on _fd
    cdef bint _uring               # _ring is initialised and used for write + linked fdatasync
    cdef bint _dirty               # written without a sync since the last fdatasync
    cdef bint _busy
    # A pointer, so that the class's layout is the same to a module built without liburing.h
    cdef io_uring *_ring

    cdef Py_ssize_t stage(self, const unsigned char *p, Py_ssize_t n) except -1
    # append's staging of n bytes at p, without a buffer object and without the early write-out
    # (the caller syncs right after); returns the offset they start at.
    cdef int _reserve(self, Py_ssize_t need) except -1
    cdef int _write_out(self, bint sync) except -1
    cdef int _fail_direct(self) except -1
    cdef int _check(self) except -1
