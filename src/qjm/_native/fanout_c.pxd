# Declarations of the native data plane (fanout_c.pyx): epoll, sockets, a mutex, the link table.

from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint16_t, uint32_t, uint64_t


# The data-plane messages (include/qjm/wire.h, the one declaration of them).
cdef extern from "qjm/wire.h" nogil:
    unsigned int QJM_HELLO_MAGIC
    unsigned int QJM_COMMIT_MAGIC
    unsigned int QJM_ACK_MAGIC
    unsigned int QJM_ERROR_MAGIC
    unsigned int QJM_WIRE_VERSION
    unsigned int QJM_MAX_ERROR_CODE
    unsigned int QJM_MAX_ERROR_TEXT

    # Packed in the header (#pragma pack 1): read in place from any offset of a receive buffer.
    ctypedef struct qjm_hello:
        uint32_t magic
        uint16_t version
        uint16_t journal_id_len

    ctypedef struct qjm_commit:
        uint32_t magic
        uint32_t reserved
        uint64_t epoch
        int64_t committed_txid

    ctypedef struct qjm_ack:
        uint32_t magic
        uint32_t reserved
        uint64_t txid

    ctypedef struct qjm_error:
        uint32_t magic
        uint16_t code_len
        uint16_t reserved
        uint32_t message_len
        int64_t durable_txid


cdef extern from "<sys/epoll.h>" nogil:
    ctypedef union epoll_data_t:
        void *ptr
        int fd
        unsigned int u32
        unsigned long long u64
    struct epoll_event:
        unsigned int events
        epoll_data_t data
    int epoll_create1(int flags)
    int epoll_ctl(int epfd, int op, int fd, epoll_event *event)
    int epoll_wait(int epfd, epoll_event *events, int maxevents, int timeout)
    unsigned int EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP, EPOLLRDHUP
    int EPOLL_CTL_ADD, EPOLL_CTL_MOD, EPOLL_CTL_DEL, EPOLL_CLOEXEC

cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initval, int flags)
    int EFD_CLOEXEC, EFD_NONBLOCK

cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void *iov_base
        size_t iov_len

cdef extern from "<sys/socket.h>" nogil:
    struct msghdr:
        void *msg_name
        unsigned int msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    ssize_t sendmsg(int fd, const msghdr *msg, int flags)
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    ssize_t recv(int fd, void *buf, size_t n, int flags)
    int MSG_NOSIGNAL, MSG_DONTWAIT

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *m, const void *attr)
    int pthread_mutex_destroy(pthread_mutex_t *m)
    int pthread_mutex_lock(pthread_mutex_t *m)
    int pthread_mutex_unlock(pthread_mutex_t *m)
    ctypedef struct pthread_cond_t:
        pass
    ctypedef struct pthread_condattr_t:
        pass
    int pthread_condattr_init(pthread_condattr_t *a)
    int pthread_condattr_setclock(pthread_condattr_t *a, int clock)
    int pthread_condattr_destroy(pthread_condattr_t *a)
    int pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a)
    int pthread_cond_destroy(pthread_cond_t *c)
    int pthread_cond_broadcast(pthread_cond_t *c)
    int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const void *abstime)


ctypedef struct qent:               # one buffer queued for sending; owns a reference to obj
    PyObject *obj
    const char *p
    Py_ssize_t len
    Py_ssize_t off

ctypedef struct fent:               # one frame in flight, until a cumulative ack covers it
    uint64_t last_txid
    Py_ssize_t nbytes

ctypedef struct link_t:
    int state                       # L_FREE, L_OPEN, L_FAILED
    unsigned int gen                # bumped on reuse: stale ids and epoll events are ignored
    int fd
    pthread_mutex_t mu
    qent *q
    Py_ssize_t qhead, qlen, qcap
    PyObject **rel                  # sent buffers whose references wait for the GIL to be dropped
    Py_ssize_t nrel, relcap
    fent *fl
    Py_ssize_t flhead, fllen, flcap
    Py_ssize_t inflight_bytes
    Py_ssize_t max_count, max_bytes
    uint64_t acked
    uint64_t reported
    bint out_armed
    bint news                       # acked advanced or a failure to report
    bint registered
    unsigned char *rbuf
    Py_ssize_t rlen
    int fail_kind                   # F_NONE, F_ERROR, F_EOF, F_OSERROR, F_PROTOCOL
    int fail_errno
    unsigned char *fail_detail
    Py_ssize_t fail_len
    bint fail_reported
    bint quiet                      # acks wake wait_news() waiters only; failures are still reported


cdef class Fanout:
    cdef link_t *_links
    cdef int _nslots                # slots ever used: [0, _nslots)
    cdef int _ep
    cdef int _wake
    cdef bint _stop
    cdef bint _running
    cdef dict _socks                # slot -> socket object, keeps each fd alive while registered
    cdef pthread_mutex_t _nmu       # guards the news counter below
    cdef pthread_cond_t _ncv
    cdef unsigned long long _news   # bumped when any link's acked advances or a link fails
    cdef int _nwaiters
    cdef bint _ninit

    cdef void _bump_news(self) noexcept nogil

    cdef link_t *_get(self, object link, int *slot) except NULL
    cdef int _report(self, int s, object callback) except -1


cdef class Receiver:
    cdef object _sock
    cdef int _fd
    cdef unsigned char *_buf
    cdef Py_ssize_t _len
    cdef Py_ssize_t _cap
    cdef bint _eof
    cdef Py_ssize_t _max_frame
    cdef object _memory

    cdef int _fill(self, Py_ssize_t need) except -1
    cdef void _consume(self, Py_ssize_t n) noexcept
    cdef int _shrink(self) except -1
