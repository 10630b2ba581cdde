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


# TLS inside the native loop (OpenSSL's libssl): each link's SSL object reads and writes through
# BIOs of qjm's own, so the epoll loop keeps moving bytes with plain send/recv (design §9.4).
cdef extern from "<openssl/ssl.h>" nogil:
    ctypedef struct SSL_CTX:
        pass
    ctypedef struct SSL:
        pass
    ctypedef struct SSL_METHOD:
        pass
    ctypedef struct BIO:
        pass
    ctypedef struct BIO_METHOD:
        pass
    ctypedef struct X509_VERIFY_PARAM:
        pass
    ctypedef struct X509:
        pass
    const SSL_METHOD *TLS_client_method()
    const SSL_METHOD *TLS_server_method()
    unsigned long long SSL_CTX_set_options(SSL_CTX *ctx, unsigned long long op)
    int SSL_CTX_set_num_tickets(SSL_CTX *ctx, size_t n)
    int SSL_CTX_set_ciphersuites(SSL_CTX *ctx, const char *suites)
    void SSL_set_accept_state(SSL *ssl)
    X509 *SSL_get1_peer_certificate(const SSL *ssl)
    void X509_free(X509 *x)
    int i2d_X509(X509 *x, unsigned char **out)
    unsigned long long SSL_OP_IGNORE_UNEXPECTED_EOF
    SSL_CTX *SSL_CTX_new(const SSL_METHOD *method)
    void SSL_CTX_free(SSL_CTX *ctx)
    int SSL_CTX_use_certificate_chain_file(SSL_CTX *ctx, const char *path)
    int SSL_CTX_use_PrivateKey_file(SSL_CTX *ctx, const char *path, int kind)
    int SSL_CTX_check_private_key(const SSL_CTX *ctx)
    int SSL_CTX_load_verify_locations(SSL_CTX *ctx, const char *cafile, const char *capath)
    void SSL_CTX_set_verify(SSL_CTX *ctx, int mode, void *callback)
    long SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int version)
    SSL *SSL_new(SSL_CTX *ctx)
    void SSL_free(SSL *ssl)
    void SSL_set_bio(SSL *ssl, BIO *rbio, BIO *wbio)
    void SSL_set0_rbio(SSL *ssl, BIO *rbio)
    void SSL_set0_wbio(SSL *ssl, BIO *wbio)
    void SSL_CTX_set_read_ahead(SSL_CTX *ctx, int yes)
    void SSL_CTX_set_default_read_buffer_len(SSL_CTX *ctx, size_t n)
    int SSL_ERROR_SYSCALL
    BIO *SSL_get_rbio(const SSL *ssl)
    BIO *SSL_get_wbio(const SSL *ssl)
    void SSL_set_connect_state(SSL *ssl)
    int SSL_do_handshake(SSL *ssl)
    int SSL_get_error(const SSL *ssl, int ret)
    int SSL_read(SSL *ssl, void *buf, int n)
    int SSL_has_pending(const SSL *s)
    int SSL_write(SSL *ssl, const void *buf, int n)
    int SSL_set1_host(SSL *ssl, const char *host)
    long SSL_set_tlsext_host_name(SSL *ssl, const char *host)
    X509_VERIFY_PARAM *SSL_get0_param(SSL *ssl)
    long SSL_get_verify_result(const SSL *ssl)
    int SSL_FILETYPE_PEM, SSL_VERIFY_PEER, SSL_VERIFY_FAIL_IF_NO_PEER_CERT, TLS1_3_VERSION
    int SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE, SSL_ERROR_ZERO_RETURN

cdef extern from "<openssl/bio.h>" nogil:
    const BIO_METHOD *BIO_s_mem()
    BIO *BIO_new(const BIO_METHOD *method)
    int BIO_free(BIO *b)
    int BIO_write(BIO *b, const void *buf, int n)
    int BIO_read(BIO *b, void *buf, int n)
    size_t BIO_ctrl_pending(BIO *b)
    long BIO_get_mem_data(BIO *b, char **pp)
    # A BIO of qjm's own (the ciphertext goes straight to or from the link's buffer or socket).
    int BIO_TYPE_SOURCE_SINK, BIO_CTRL_FLUSH, BIO_CTRL_EOF
    int BIO_get_new_index()
    BIO_METHOD *BIO_meth_new(int kind, const char *name)
    int BIO_meth_set_write(BIO_METHOD *m, int (*write)(BIO *, const char *, int) noexcept nogil)
    int BIO_meth_set_read(BIO_METHOD *m, int (*read)(BIO *, char *, int) noexcept nogil)
    int BIO_meth_set_ctrl(BIO_METHOD *m, long (*ctrl)(BIO *, int, long, void *) noexcept nogil)
    int BIO_meth_set_create(BIO_METHOD *m, int (*create)(BIO *) noexcept nogil)
    void BIO_set_data(BIO *b, void *data)
    void *BIO_get_data(BIO *b)
    void BIO_set_init(BIO *b, int init)
    void BIO_set_retry_read(BIO *b)
    void BIO_clear_retry_flags(BIO *b)
    int BIO_up_ref(BIO *b)

cdef extern from "<openssl/x509_vfy.h>" nogil:
    int X509_V_OK
    int X509_VERIFY_PARAM_set1_ip_asc(X509_VERIFY_PARAM *param, const char *ip)
    const char *X509_verify_cert_error_string(long n)

cdef extern from "<openssl/err.h>" nogil:
    unsigned long ERR_get_error()
    void ERR_clear_error()
    void ERR_error_string_n(unsigned long e, char *buf, size_t n)

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    short POLLIN, POLLOUT, POLLNVAL


cdef enum:
    MAX_LAT_BOUNDS = 32             # latency_bounds an engine takes (qjm.histogram's has 16)


ctypedef struct qent:               # one buffer queued for sending; owns a reference to obj
    PyObject *obj
    const char *p
    Py_ssize_t len
    Py_ssize_t off

ctypedef struct fent:               # one frame in flight, until a cumulative ack covers it
    uint64_t last_txid
    Py_ssize_t nbytes
    long long sent_ns               # CLOCK_MONOTONIC when it was queued: its ack is timed from here

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
    bint held                       # a sync_batch reads this link's input: the loop does not watch it
    bint parked                     # held between sync_batch calls; released when idle or sent to
    long long parked_ns             # CLOCK_MONOTONIC when it was parked
    PyObject *notice                # a commit notice kept for the link's next send (a reference), or NULL
    const char *notice_p            # its bytes
    Py_ssize_t notice_n
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
    SSL *ssl                        # NULL: plaintext; else the TLS session, which owns the two BIOs
    BIO *rbio                       # ciphertext received, for SSL_read
    BIO *wbio                       # qjm's sink BIO: what SSL_write produces goes straight to cbuf
    unsigned char *cbuf             # ciphertext waiting to be sent: [chead, clen)
    Py_ssize_t chead, clen, ccap
    const long long *lat_bounds     # the engine's latency bounds (ns), nlat of them
    int nlat
    uint64_t lat[MAX_LAT_BOUNDS + 1]  # frames acked per bound since take_latencies (+Inf last)
    long long lat_sum_ns


cdef enum:
    MAX_SYNCERS = 64                # sync_batch calls woken by eventfd at once; more look every 5 ms

cdef class Fanout:
    cdef link_t *_links
    cdef int _nslots                # slots ever used: [0, _nslots)
    cdef int _ep
    cdef int _wake
    cdef int _sfds[MAX_SYNCERS]     # eventfds of the sync_batch calls polling their links, or -1 (_nmu)
    cdef int _efree[MAX_SYNCERS]    # eventfds no sync_batch is using, kept for the next one (_nmu)
    cdef int _nefree
    cdef bint _stop
    cdef bint _running
    cdef dict _socks                # slot -> socket object, keeps each fd alive while registered
    cdef pthread_mutex_t _nmu       # guards the news counter below
    cdef pthread_cond_t _ncv
    cdef unsigned long long _news   # bumped when any link's acked advances or a link fails
    cdef unsigned long long _notified  # bumped by notify() alone: Python's own state changed
    cdef int _nwaiters
    cdef int _syncers               # how many _sfds are set (_nmu): _bump_news scans them only then
    cdef long long _park_ns         # how long a link stays parked after its last sync_batch (0: never)
    cdef long long _keep_ns         # a parked link keeps a notice if its sync_batches come this close
    cdef int _nheld                 # links a sync_batch holds or has parked (_nmu; counted after the
                                    # link's own mutex is let go): the loop's wait is timed while > 0
    cdef bint _timed                # the loop waits with a timeout, to release parked links (_nmu)
    cdef bint _ninit
    cdef long long _lat_bounds[MAX_LAT_BOUNDS]  # upper bounds (ns) of the ack latencies timed per link
    cdef int _nlat

    cdef void _bump_news(self, int skip=*) noexcept nogil

    cdef link_t *_get(self, object link, int *slot) except NULL
    cdef object _send(self, object link, bytes frame, unsigned long long last_txid, bytes prefix, bint release)
    cdef void _held_delta(self, int d, bint wake_loop) noexcept nogil
    cdef void _close_spare_eventfds(self) noexcept nogil
    cdef void _release_idle(self, long long now) noexcept nogil
    cdef int _report(self, int s, object callback) except -1
    cdef int _sync_batch(self, object links, bytes frame, unsigned long long last_txid, int need, bytes notice,
                         double timeout, Py_ssize_t room) except -3


cdef class Lane:
    cdef Fanout _fanout
    cdef tuple _links
    cdef readonly int need
    cdef Py_ssize_t _room
    cdef readonly bint revoked
    cdef readonly unsigned long long committed  # the highest last_txid a commit made durable
    cdef uint64_t _times[MAX_LAT_BOUNDS + 1]  # commits per latency bound of the engine, +Inf last
    cdef long long _times_ns


cdef class TlsClient:
    cdef SSL_CTX *_ctx

    cdef SSL *_session(self, int fd, str server_name, double timeout) except NULL


cdef class TlsServer:
    cdef SSL_CTX *_ctx


ctypedef struct rx_io_t:           # the Receiver's source BIO: SSL_read takes ciphertext from here
    int fd
    bint block                      # wait (SO_RCVTIMEO) for the first bytes, or take only what is there
    int err                         # the errno of the last recv that failed (EAGAIN: nothing there)
    bint eof                        # the peer hung up
    bint drained                    # the last recv took less than asked: the socket held no more
    BIO *rest                       # ciphertext that came with the handshake, read before the socket


cdef class Receiver:
    cdef object _sock
    cdef rx_io_t _io
    cdef SSL *_ssl                  # NULL: plaintext; else the session on the socket (after handshake())
    cdef int _fd
    cdef unsigned char *_buf
    cdef Py_ssize_t _len
    cdef Py_ssize_t _cap
    cdef bint _eof
    cdef Py_ssize_t _max_frame
    cdef object _memory
    # Plaintext bytes a non-waiting ack could not send yet (with TLS they wait in the session's BIO).
    cdef char _unsent[64]
    cdef Py_ssize_t _nunsent
    cdef uint64_t _acked            # the highest txid acked

    cdef int _fill(self, Py_ssize_t need) except -1
    cdef void _consume(self, Py_ssize_t n) noexcept
    cdef int _shrink(self) except -1
    cdef int _write(self, const char *p, Py_ssize_t n, bint wait=*) except -1
    cdef int _send_unsent(self) except -1
    cdef int _fill_tls(self) except -1
    cdef Py_ssize_t _message_at(self, Py_ssize_t pos, uint32_t *magic) except -1
    cdef int _ack(self, uint64_t txid, bint wait) except -1
