# cython: auto_pickle=False, autotestdict=False
# Native data plane (twin of fanout_py: same API, same bytes, same reports).
#
# Fanout: the writer's side. One epoll loop (run() in a thread of its own, GIL released while it
# waits and moves bytes) serves many links, one non-blocking TCP connection per node. send() queues
# a frame and writes it at once from the caller's thread when the link's queue was empty; the loop
# writes the rest on EPOLLOUT and parses the node's cumulative acks. Each link has an in-flight
# window bounded in frames and bytes: send() refuses a frame past it and Python decides what that
# means. The loop takes the GIL only to report facts (acked through N, or why the link failed) and
# to drop references to buffers it has sent. A link added with report_acks=False is quiet: its acks
# only bump a news counter and wake the threads blocked in wait_news() (which waits without the
# GIL), so a writer waiting for a quorum is woken straight from this loop and no Python runs per
# ack (the writer counts the quorum itself from acked()). sync_batch() goes further: the thread
# waiting for a quorum reads its links' acks itself, so no other thread runs per ack.
#
# Receiver: the node's side, one blocking connection: splits the stream into frames and commit
# notices without the GIL, hands them to Python in runs (one group commit per run), sends acks.
#
# TLS (design §9.4): a link added with a TlsClient runs its session inside this loop. The handshake
# runs over two memory BIOs; then the session writes through qjm's sink BIO: send() encrypts
# straight into the link's ciphertext buffer (the caller's thread, without the GIL for large
# frames), the loop sends that and feeds what it receives to SSL_read, so the loop's syscalls are
# those of plaintext and no Python runs per ack. A Receiver whose handshake() ran with a TlsServer
# reads through qjm's source BIO (SSL_read's read-ahead takes the socket's bytes directly) and acks
# through its session, still without the GIL.
#
# Locking: each link has a pthread mutex. A thread never waits for the GIL while holding one, so a
# holder of the GIL may block on a mutex.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.errno cimport EAGAIN, EBADF, ECONNRESET, EINTR, ENOMEM, ETIMEDOUT, errno
from libc.stdint cimport INT64_MAX, int64_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memmove, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.unistd cimport close as c_close, read as c_read, write as c_write


from qjm._native.framing_c cimport QJM_FRAME_HEADER_SIZE, QJM_FRAME_MAGIC, frame_length
from qjm._native.gate_c cimport WriteGate

import os
import traceback

from qjm.errors import ConfigError, CorruptFrameError, ResourceExhaustedError, TlsError
from qjm.protocol.frame import MAX_PAYLOAD as _MAX_PAYLOAD

cdef enum:
    MAX_LINKS = 1024
    SLOT_BITS = 10
    MAX_IOV = 64
    RBUF = 131072                   # > the largest reply: an error with its code and its text (wire.h)
    RECV_CHUNK = 1048576
    NOGIL_SEND = 16384              # frames at least this long are queued without the GIL
    MAX_EVENTS = 64

cdef enum:
    L_FREE = 0
    L_OPEN = 1
    L_FAILED = 2

cdef enum:
    F_NONE = 0
    F_REPLY = 1                     # an ERROR reply, or a reply that is not ACK/ERROR: detail = bytes
    F_EOF = 2
    F_OSERROR = 3
    F_WINDOW = 4                    # send() found the in-flight window full
    F_TLS = 5                       # the TLS session failed (an alert, a bad record): detail = text

cdef enum:
    TLS_CHUNK = 16384               # ciphertext moved per recv / BIO step (the fan-out loop)
    TLS_RECV = 65536                # ciphertext per recv on the node's side
    TLS_ERRTEXT = 256

cdef unsigned long long WAKE = 0xFFFFFFFFFFFFFFFFULL
cdef double SLICE = 0.005           # a sync_batch with no eventfd of its own looks again this often

ACK_SIZE = sizeof(qjm_ack)


cdef inline uint32_t _magic(const unsigned char *p) noexcept nogil:
    cdef uint32_t m
    memcpy(&m, p, 4)
    return m
MAX_WINDOW_COUNT = 1 << 20


# ---------------------------------------------------------------------------------------------
# nogil helpers on one link; the caller holds l.mu

cdef void _rel_push(link_t *l, PyObject *o) noexcept nogil:
    cdef Py_ssize_t cap
    cdef PyObject **nr
    if l.nrel == l.relcap:
        cap = l.relcap * 2 if l.relcap else 64
        nr = <PyObject **>realloc(l.rel, <size_t>cap * sizeof(PyObject *))
        if nr == NULL:
            return                  # out of memory: leak the reference rather than crash
        l.rel = nr
        l.relcap = cap
    l.rel[l.nrel] = o
    l.nrel += 1


cdef void _drop_queue(link_t *l) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(l.qhead, l.qlen):
        _rel_push(l, l.q[i].obj)
    if l.notice != NULL:
        _rel_push(l, l.notice)
        l.notice = NULL
    l.qhead = l.qlen = 0
    l.chead = l.clen = 0
    l.flhead = l.fllen = 0
    l.inflight_bytes = 0


cdef void _deregister(int ep, link_t *l) noexcept nogil:
    if l.registered:
        epoll_ctl(ep, EPOLL_CTL_DEL, l.fd, NULL)
        l.registered = False


cdef void _fail(int ep, link_t *l, int kind, int err, const unsigned char *detail, Py_ssize_t n) noexcept nogil:
    if l.state != L_OPEN:
        return
    l.state = L_FAILED
    l.fail_kind = kind
    l.fail_errno = err
    if n > 0:
        l.fail_detail = <unsigned char *>malloc(<size_t>n)
        if l.fail_detail != NULL:
            memcpy(l.fail_detail, detail, <size_t>n)
            l.fail_len = n
    l.news = True
    _drop_queue(l)
    _deregister(ep, l)


cdef Py_ssize_t _tls_error(char *buf) noexcept nogil:
    # The text of the thread's oldest OpenSSL error (the root cause), the queue cleared; its length.
    cdef unsigned long e = ERR_get_error()
    cdef Py_ssize_t n = 0
    if e:
        ERR_error_string_n(e, buf, TLS_ERRTEXT)
    else:
        memcpy(buf, b"TLS session failed", 19)
    ERR_clear_error()
    while n < TLS_ERRTEXT and buf[n] != 0:
        n += 1
    return n


cdef void _fail_tls(int ep, link_t *l) noexcept nogil:
    cdef char text[TLS_ERRTEXT]
    cdef Py_ssize_t n = _tls_error(text)
    _fail(ep, l, F_TLS, 0, <const unsigned char *>text, n)


cdef void _bio_skip(BIO *b, Py_ssize_t n) noexcept nogil:
    # Drop the first n bytes of a memory BIO (they have been sent from its buffer in place).
    cdef char scratch[TLS_CHUNK]
    cdef int k
    while n > 0:
        k = BIO_read(b, scratch, <int>(n if n < TLS_CHUNK else TLS_CHUNK))
        if k <= 0:
            return
        n -= k


cdef int _flush_tls(link_t *l) noexcept nogil:
    # Send the waiting ciphertext until the socket would block; 0 or an errno.
    cdef ssize_t r
    while l.clen > l.chead:
        r = send(l.fd, l.cbuf + l.chead, <size_t>(l.clen - l.chead), MSG_NOSIGNAL | MSG_DONTWAIT)
        if r < 0:
            if errno == EINTR:
                continue
            if errno == EAGAIN:
                return 0
            return errno
        l.chead += r
    l.chead = l.clen = 0
    return 0


cdef bint _cipher_room(link_t *l, Py_ssize_t n) noexcept nogil:
    # Room for n more bytes of ciphertext at the end of cbuf. cbuf is compacted only once the bytes
    # sent from its front outnumber those left, and otherwise doubles: amortised O(1) per byte.
    cdef Py_ssize_t live, cap
    cdef unsigned char *nb
    if l.clen + n <= l.ccap:
        return True
    live = l.clen - l.chead
    if l.chead and l.chead >= live and live + n <= l.ccap:
        memmove(l.cbuf, l.cbuf + l.chead, <size_t>live)
        l.clen = live
        l.chead = 0
        return True
    cap = l.ccap * 2 if l.ccap else 65536
    while cap < l.clen + n:
        cap *= 2
    nb = <unsigned char *>realloc(l.cbuf, <size_t>cap)
    if nb == NULL:
        return False
    l.cbuf = nb
    l.ccap = cap
    return True


# The session's BIOs once its handshake is done (design §9.4). A memory BIO would cost a copy more
# per byte each way: SSL_write's records are copied into it and out again to the socket's buffer,
# and SSL_read's ciphertext into it and out again to the session's. qjm's own BIOs skip that: the
# sink appends a link's records to its cbuf, from which the loop sends them; the source lets the
# node's SSL_read recv straight into the session's read-ahead buffer.
cdef BIO_METHOD *_SINK = NULL
cdef BIO_METHOD *_SOURCE = NULL


cdef int _bio_create(BIO *b) noexcept nogil:
    BIO_set_init(b, 1)
    return 1


cdef long _bio_ctrl(BIO *b, int cmd, long num, void *ptr) noexcept nogil:
    return 1 if cmd == BIO_CTRL_FLUSH else 0


cdef int _sink_write(BIO *b, const char *data, int n) noexcept nogil:
    cdef link_t *l = <link_t *>BIO_get_data(b)
    BIO_clear_retry_flags(b)
    if n <= 0:
        return 0
    if not _cipher_room(l, n):
        return -1
    memcpy(l.cbuf + l.clen, data, <size_t>n)
    l.clen += n
    return n


cdef long _source_ctrl(BIO *b, int cmd, long num, void *ptr) noexcept nogil:
    # BIO_eof tells the session that a read of 0 was the peer hanging up (SSL_ERROR_ZERO_RETURN).
    if cmd == BIO_CTRL_EOF:
        return (<rx_io_t *>BIO_get_data(b)).eof
    return 1 if cmd == BIO_CTRL_FLUSH else 0


cdef int _source_read(BIO *b, char *out, int n) noexcept nogil:
    # recv for SSL_read: blocking (up to SO_RCVTIMEO) while io.block, else only what is there;
    # EAGAIN is "retry later" (SSL_ERROR_WANT_READ), any other error the session's end.
    cdef rx_io_t *io = <rx_io_t *>BIO_get_data(b)
    cdef ssize_t r
    BIO_clear_retry_flags(b)
    if io.rest != NULL:
        if BIO_ctrl_pending(io.rest) > 0:
            io.drained = False      # the socket may hold more behind what the handshake left
            return BIO_read(io.rest, out, n)
        BIO_free(io.rest)
        io.rest = NULL
    while True:
        r = recv(io.fd, out, <size_t>n, 0 if io.block else MSG_DONTWAIT)
        if r >= 0:
            io.eof = r == 0
            io.drained = r < n
            return <int>r
        if errno != EINTR:
            break
    io.err = errno
    if io.err == EAGAIN:
        BIO_set_retry_read(b)
    return -1


cdef int _init_bio_methods() except -1:
    global _SINK, _SOURCE
    _SINK = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, b"qjm link ciphertext")
    _SOURCE = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, b"qjm receiver socket")
    if _SINK == NULL or _SOURCE == NULL:
        raise MemoryError()
    BIO_meth_set_create(_SINK, _bio_create)
    BIO_meth_set_ctrl(_SINK, _bio_ctrl)
    BIO_meth_set_write(_SINK, _sink_write)
    BIO_meth_set_create(_SOURCE, _bio_create)
    BIO_meth_set_ctrl(_SOURCE, _source_ctrl)
    BIO_meth_set_read(_SOURCE, _source_read)
    return 0


_init_bio_methods()


cdef bint _tls_write(link_t *l, const char *p, Py_ssize_t n) noexcept nogil:
    # Encrypt into cbuf (through the sink BIO): all of it is taken, or the session failed.
    cdef int k
    while n > 0:
        ERR_clear_error()
        k = SSL_write(l.ssl, p, <int>(n if n < (1 << 30) else (1 << 30)))
        if k <= 0:
            return False
        p += k
        n -= k
    return True


cdef bint _tls_write_parts(link_t *l, const char **p, Py_ssize_t *n, int k) noexcept nogil:
    # Encrypt the k parts as one stream, the small ones gathered with the head of the last into
    # one record: a record costs libssl more than encrypting a kilobyte does, and a commit notice
    # sent ahead of a small frame would otherwise double the records a commit costs both ends.
    # The last part's rest goes straight from its buffer. False if the session failed.
    cdef char stage[TLS_CHUNK]
    cdef Py_ssize_t used = 0
    cdef Py_ssize_t take
    cdef int i
    for i in range(k - 1):
        if n[i] > TLS_CHUNK - used:
            if (used and not _tls_write(l, stage, used)) or not _tls_write(l, p[i], n[i]):
                return False
            used = 0
        else:
            memcpy(stage + used, p[i], <size_t>n[i])
            used += n[i]
    if used == 0:
        return _tls_write(l, p[k - 1], n[k - 1])
    take = n[k - 1] if n[k - 1] < TLS_CHUNK - used else TLS_CHUNK - used
    memcpy(stage + used, p[k - 1], <size_t>take)
    return _tls_write(l, stage, used + take) and _tls_write(l, p[k - 1] + take, n[k - 1] - take)


cdef inline bint _nothing_out(link_t *l) noexcept nogil:
    # Nothing waits to go out on the link: no queued buffer (plaintext), no ciphertext (TLS).
    return l.qhead == l.qlen and l.chead == l.clen


cdef int _flush(int ep, link_t *l, unsigned long long token) noexcept nogil:
    # Write queued buffers until the socket would block; 0 or an errno.
    cdef iovec iov[MAX_IOV]
    cdef msghdr msg
    cdef Py_ssize_t i, k, left
    cdef ssize_t r
    cdef epoll_event ev
    cdef bint want
    cdef int e
    if l.ssl != NULL:
        e = _flush_tls(l)
        if e:
            return e
    while l.qhead < l.qlen:
        k = 0
        i = l.qhead
        while i < l.qlen and k < MAX_IOV:
            iov[k].iov_base = <void *>(l.q[i].p + l.q[i].off)
            iov[k].iov_len = <size_t>(l.q[i].len - l.q[i].off)
            k += 1
            i += 1
        memset(&msg, 0, sizeof(msg))
        msg.msg_iov = iov
        msg.msg_iovlen = <size_t>k
        r = sendmsg(l.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT)
        if r < 0:
            if errno == EINTR:
                continue
            if errno == EAGAIN:
                break
            return errno
        while r > 0:
            left = l.q[l.qhead].len - l.q[l.qhead].off
            if r >= left:
                r -= left
                _rel_push(l, l.q[l.qhead].obj)
                l.qhead += 1
            else:
                l.q[l.qhead].off += r
                r = 0
    if l.qhead == l.qlen:
        l.qhead = l.qlen = 0
    elif l.qhead * 2 > l.qcap:
        memmove(l.q, l.q + l.qhead, <size_t>(l.qlen - l.qhead) * sizeof(qent))
        l.qlen -= l.qhead
        l.qhead = 0
    want = not _nothing_out(l)
    if want != l.out_armed and l.registered:
        ev.events = (0 if l.held else EPOLLIN) | EPOLLRDHUP | (EPOLLOUT if want else 0)
        ev.data.u64 = token
        if epoll_ctl(ep, EPOLL_CTL_MOD, l.fd, &ev) != 0:
            return errno
        l.out_armed = want
    return 0


cdef bint _push(link_t *l, PyObject *o, const char *p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t cap
    cdef qent *nq
    if l.qlen == l.qcap:
        cap = l.qcap * 2 if l.qcap else 64
        nq = <qent *>realloc(l.q, <size_t>cap * sizeof(qent))
        if nq == NULL:
            return False
        l.q = nq
        l.qcap = cap
    l.q[l.qlen].obj = o
    l.q[l.qlen].p = p
    l.q[l.qlen].len = n
    l.q[l.qlen].off = 0
    l.qlen += 1
    return True


cdef long long _now_ns() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return <long long>t.tv_sec * 1000000000 + t.tv_nsec


cdef bint _push_inflight(link_t *l, uint64_t last, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t cap
    cdef fent *nf
    if l.flhead and l.fllen == l.flcap:
        memmove(l.fl, l.fl + l.flhead, <size_t>(l.fllen - l.flhead) * sizeof(fent))
        l.fllen -= l.flhead
        l.flhead = 0
    if l.fllen == l.flcap:
        cap = l.flcap * 2 if l.flcap else 64
        nf = <fent *>realloc(l.fl, <size_t>cap * sizeof(fent))
        if nf == NULL:
            return False
        l.fl = nf
        l.flcap = cap
    l.fl[l.fllen].last_txid = last
    l.fl[l.fllen].nbytes = n
    l.fl[l.fllen].sent_ns = _now_ns()
    l.fllen += 1
    l.inflight_bytes += n
    return True


cdef void _acked(link_t *l, uint64_t txid) noexcept nogil:
    # Each frame the ack covers is timed here, from its send, into the link's latency counts: the
    # writer's per-node write latency, with no Python per ack.
    cdef long long now = 0
    cdef long long d
    cdef int b
    if txid > l.acked:
        l.acked = txid
        l.news = True
    while l.flhead < l.fllen and l.fl[l.flhead].last_txid <= l.acked:
        if now == 0:
            now = _now_ns()
        d = now - l.fl[l.flhead].sent_ns
        b = 0
        while b < l.nlat and d > l.lat_bounds[b]:
            b += 1
        l.lat[b] += 1
        l.lat_sum_ns += d
        l.inflight_bytes -= l.fl[l.flhead].nbytes
        l.flhead += 1
    if l.flhead == l.fllen:
        l.flhead = l.fllen = 0


cdef void _parse(int ep, link_t *l) noexcept nogil:
    # Consume the complete replies in rbuf: cumulative ACKs, or one ERROR (or garbage) that fails the link.
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t need
    cdef const unsigned char *p
    cdef const qjm_error *e
    cdef uint32_t magic
    while l.rlen - pos >= 4:
        p = l.rbuf + pos
        magic = _magic(p)
        if magic == QJM_ACK_MAGIC:
            if l.rlen - pos < <Py_ssize_t>sizeof(qjm_ack):
                break
            _acked(l, (<const qjm_ack *>p).txid)
            pos += sizeof(qjm_ack)
        elif magic == QJM_ERROR_MAGIC:
            if l.rlen - pos < <Py_ssize_t>sizeof(qjm_error):
                break
            e = <const qjm_error *>p
            if e.message_len > QJM_MAX_ERROR_TEXT:
                _fail(ep, l, F_REPLY, 0, p, sizeof(qjm_error))
                return
            need = sizeof(qjm_error) + <Py_ssize_t>e.code_len + <Py_ssize_t>e.message_len
            if l.rlen - pos < need:
                break
            if e.durable_txid > 0:
                _acked(l, <uint64_t>e.durable_txid)
            _fail(ep, l, F_REPLY, 0, p, need)
            return
        else:
            _fail(ep, l, F_REPLY, 0, p, 4)
            return
    if pos:
        memmove(l.rbuf, l.rbuf + pos, <size_t>(l.rlen - pos))
        l.rlen -= pos


cdef void _tls_drain(int ep, link_t *l) noexcept nogil:
    # Decrypt what the incoming BIO holds into rbuf and parse it.
    cdef int k
    while l.state == L_OPEN:
        if l.rlen == RBUF:
            _fail(ep, l, F_REPLY, 0, l.rbuf, 4)
            return
        ERR_clear_error()
        k = SSL_read(l.ssl, l.rbuf + l.rlen, <int>(RBUF - l.rlen))
        if k > 0:
            l.rlen += k
            _parse(ep, l)
            if BIO_ctrl_pending(l.rbio) == 0 and not SSL_has_pending(l.ssl):
                return          # all of it read: another SSL_read would only say WANT_READ
            continue
        k = SSL_get_error(l.ssl, k)
        if k == SSL_ERROR_WANT_READ:
            return
        if k == SSL_ERROR_ZERO_RETURN:
            _fail(ep, l, F_EOF, 0, NULL, 0)
        else:
            _fail_tls(ep, l)
        return


cdef void _read_tls(int ep, link_t *l, unsigned long long token) noexcept nogil:
    cdef unsigned char cbuf[TLS_CHUNK]
    cdef ssize_t r
    cdef int e
    cdef Py_ssize_t waiting = l.clen
    while l.state == L_OPEN:
        r = recv(l.fd, cbuf, TLS_CHUNK, MSG_DONTWAIT)
        if r > 0:
            if BIO_write(l.rbio, cbuf, <int>r) != r:
                _fail(ep, l, F_OSERROR, ENOMEM, NULL, 0)
                return
            _tls_drain(ep, l)
            if r < TLS_CHUNK:
                break           # nothing more for now: as _read, readiness is level-triggered
        elif r == 0:
            _fail(ep, l, F_EOF, 0, NULL, 0)
        elif errno == EINTR:
            continue
        elif errno == EAGAIN:
            break
        else:
            _fail(ep, l, F_OSERROR, errno, NULL, 0)
    if l.state == L_OPEN and l.clen > waiting:
        # The session answered something (a key update): send it with the rest.
        e = _flush(ep, l, token)
        if e:
            _fail(ep, l, F_OSERROR, e, NULL, 0)


cdef void _read(int ep, link_t *l, unsigned long long token) noexcept nogil:
    cdef ssize_t r
    cdef Py_ssize_t room
    if l.ssl != NULL:
        _read_tls(ep, l, token)
        return
    while l.state == L_OPEN:
        if l.rlen == RBUF:
            _fail(ep, l, F_REPLY, 0, l.rbuf, 4)
            return
        room = RBUF - l.rlen
        r = recv(l.fd, l.rbuf + l.rlen, <size_t>room, MSG_DONTWAIT)
        if r > 0:
            l.rlen += r
            _parse(ep, l)
            if r < room:
                # Nothing more for now: readiness is level-triggered (poll, and epoll without
                # EPOLLET), so what arrives next wakes its reader again; a recv to see EAGAIN would
                # cost a system call per link and commit.
                return
        elif r == 0:
            _fail(ep, l, F_EOF, 0, NULL, 0)
        elif errno == EINTR:
            continue
        elif errno == EAGAIN:
            return
        else:
            _fail(ep, l, F_OSERROR, errno, NULL, 0)


cdef inline unsigned long long _token(link_t *links, link_t *l) noexcept nogil:
    return (<unsigned long long>l.gen << SLOT_BITS) | <unsigned long long>(l - links)


cdef void _hold(int ep, link_t *links, link_t *l, bint held) noexcept nogil:
    # A link held by a sync_batch is read by that call's thread: the loop stops watching it for
    # input (a hang-up still wakes it) until the call lets go, or, parked, until it is released
    # (_unpark). The caller holds l.mu.
    cdef epoll_event ev
    if l.held == held or l.state != L_OPEN:
        return
    l.held = held
    if l.registered:
        ev.events = (0 if held else EPOLLIN) | EPOLLRDHUP | (EPOLLOUT if l.out_armed else 0)
        ev.data.u64 = _token(links, l)
        epoll_ctl(ep, EPOLL_CTL_MOD, l.fd, &ev)


cdef bint _unpark(int ep, link_t *links, link_t *l) noexcept nogil:
    # Give a parked link back to the loop, which reads whatever input waits (level-triggered).
    # The caller holds l.mu; True if it was parked (the caller then counts it out, _held_delta).
    if not l.parked:
        return False
    l.parked = False
    _hold(ep, links, l, False)
    return True


cdef bint _take_notice(int ep, link_t *l) noexcept nogil:
    # Put the commit notice a sync_batch kept for the link's next send on its way out (queued, or
    # encrypted into the link's buffer), ahead of anything sent after it; True if it was. The caller
    # holds l.mu and flushes. A notice that cannot be queued is dropped: notices are hints, and the
    # next one says more.
    cdef PyObject *o = l.notice
    cdef bint ok = True
    if o == NULL:
        return False
    l.notice = NULL
    if l.state != L_OPEN:
        ok = False
    elif l.ssl != NULL:
        if not _tls_write(l, l.notice_p, l.notice_n):
            _fail_tls(ep, l)
            ok = False
    elif _push(l, o, l.notice_p, l.notice_n):
        return True
    else:
        ok = False
    _rel_push(l, o)     # encrypted (or dropped): the buffer is let go
    return ok


cdef int _enqueue(int ep, link_t *links, link_t *l, PyObject *pre, const char *prep, Py_ssize_t npre,
                  PyObject *fr, const char *frp, Py_ssize_t n, uint64_t last, PyObject ***rel,
                  Py_ssize_t *nrel, bint release, bint *released) noexcept nogil:
    # 0 queued, 1 window full (nothing queued; the link fails), -1 link failed (nothing queued),
    # -2 out of memory (nothing queued), -3 queued but the write failed (the link fails; the queue,
    # this frame included, went to *rel).
    # With ``release``, a parked link is first given back to the loop (*released says whether it
    # was: the caller counts it out once the link's mutex is let go).
    # A failure is reported by the loop (the caller wakes it when the link has news), never here:
    # the caller may hold locks its on-failure handler needs.
    cdef int rc = 0
    cdef bint was_empty
    cdef int e
    cdef PyObject *kept = NULL
    cdef const char *parts[3]
    cdef Py_ssize_t sizes[3]
    cdef int nparts = 0
    pthread_mutex_lock(&l.mu)
    released[0] = release and _unpark(ep, links, l)
    was_empty = _nothing_out(l)
    if l.notice != NULL:
        if l.ssl != NULL and l.state == L_OPEN:
            kept = l.notice     # encrypted with this send (below), in its first record
            l.notice = NULL
            parts[0] = l.notice_p
            sizes[0] = l.notice_n
            nparts = 1
        else:
            _take_notice(ep, l)     # the commit notice held back for this send goes first
    if l.state != L_OPEN:
        rc = -1
    elif last and (l.fllen - l.flhead >= l.max_count
                   or (l.inflight_bytes > 0 and l.inflight_bytes + n > l.max_bytes)):
        _fail(ep, l, F_WINDOW, 0, NULL, 0)
        rc = 1
    elif l.ssl != NULL:
        # Encrypted at once (through the sink BIO, into cbuf); the buffers are let go.
        if pre != NULL:
            parts[nparts] = prep
            sizes[nparts] = npre
            nparts += 1
        parts[nparts] = frp
        sizes[nparts] = n
        nparts += 1
        if not _tls_write_parts(l, parts, sizes, nparts):
            _fail_tls(ep, l)
            rc = -1
        elif last and not _push_inflight(l, last, n):
            _fail(ep, l, F_OSERROR, ENOMEM, NULL, 0)   # encrypted already: the stream is lost
            rc = -1
        else:
            if pre != NULL:
                _rel_push(l, pre)
            _rel_push(l, fr)
            if was_empty:
                e = _flush(ep, l, _token(links, l))
                if e:
                    _fail(ep, l, F_OSERROR, e, NULL, 0)
                    rc = -3
    else:
        if pre != NULL and not _push(l, pre, prep, npre):
            rc = -2
        elif not _push(l, fr, frp, n):
            rc = -2
            if pre != NULL:
                l.qlen -= 1
        elif last and not _push_inflight(l, last, n):
            rc = -2
            l.qlen -= 2 if pre != NULL else 1
        if rc == 0 and was_empty:
            e = _flush(ep, l, _token(links, l))
            if e:
                _fail(ep, l, F_OSERROR, e, NULL, 0)
                rc = -3
    if kept != NULL:
        _rel_push(l, kept)      # encrypted, or dropped with a link that failed
    rel[0] = l.rel
    nrel[0] = l.nrel
    l.rel = NULL
    l.nrel = l.relcap = 0
    pthread_mutex_unlock(&l.mu)
    return rc


cdef bint _send_kept_notice(int ep, link_t *links, link_t *l) noexcept nogil:
    # Send the notice kept for a parked link's next send now (the caller holds l.mu); True if the
    # link failed doing so.
    cdef bint was_empty = _nothing_out(l)
    cdef int e
    if _take_notice(ep, l) and was_empty:
        e = _flush(ep, l, _token(links, l))
        if e:
            _fail(ep, l, F_OSERROR, e, NULL, 0)
    return l.state != L_OPEN


cdef int _poll_until(pollfd *fds, Py_ssize_t n, timespec *deadline) noexcept nogil:
    # poll until one of fds is ready or the deadline: 0 ready, ETIMEDOUT, or an errno.
    cdef timespec now
    cdef long long us
    cdef int r
    while True:
        clock_gettime(CLOCK_MONOTONIC, &now)
        us = (deadline.tv_sec - now.tv_sec) * 1000000 + (deadline.tv_nsec - now.tv_nsec) // 1000
        if us <= 0:
            return ETIMEDOUT
        us = (us + 999) // 1000     # whole milliseconds, rounded up: never wakes early for good
        r = poll(fds, <unsigned long>n, <int>(us if us < 2000000000 else 2000000000))
        if r > 0:
            return 0
        if r == 0:
            continue                # the deadline is looked at again above
        if errno != EINTR:
            return errno


cdef int _wait_fd(int fd, short events, timespec *deadline) noexcept nogil:
    # poll until fd is ready or the deadline: 1 ready, 0 timed out, -1 an error (errno).
    cdef pollfd p
    cdef int rc
    p.fd = fd
    p.events = events
    p.revents = 0
    rc = _poll_until(&p, 1, deadline)
    if rc == 0:
        return 1
    if rc == ETIMEDOUT:
        return 0
    errno = rc
    return -1


cdef int _handshake(SSL *ssl, BIO *rbio, BIO *wbio, int fd, double timeout) noexcept nogil:
    # The handshake (either side) over the memory BIOs on fd, within `timeout` seconds in all:
    # 0 done, -1 the TLS layer refused (the thread's error queue says why), else an errno
    # (ETIMEDOUT, ECONNRESET when the peer hung up).
    cdef timespec deadline
    cdef unsigned char buf[TLS_CHUNK]
    cdef char *p = NULL
    cdef long n
    cdef ssize_t r
    cdef int rc, k
    clock_gettime(CLOCK_MONOTONIC, &deadline)
    deadline.tv_sec += <long>timeout
    deadline.tv_nsec += <long>((timeout - <long>timeout) * 1e9)
    if deadline.tv_nsec >= 1000000000:
        deadline.tv_sec += 1
        deadline.tv_nsec -= 1000000000
    while True:
        ERR_clear_error()
        rc = SSL_do_handshake(ssl)
        k = 0 if rc == 1 else SSL_get_error(ssl, rc)
        while BIO_ctrl_pending(wbio) > 0:      # what the handshake wrote, alerts included
            n = BIO_get_mem_data(wbio, &p)
            r = send(fd, p, <size_t>n, MSG_NOSIGNAL | MSG_DONTWAIT)
            if r < 0:
                if errno == EINTR:
                    continue
                if errno != EAGAIN:
                    return errno
                r = _wait_fd(fd, POLLOUT, &deadline)
                if r <= 0:
                    return errno if r < 0 else ETIMEDOUT
                continue
            _bio_skip(wbio, r)
        if rc == 1:
            return 0
        if k != SSL_ERROR_WANT_READ:
            return -1
        r = _wait_fd(fd, POLLIN, &deadline)
        if r <= 0:
            return errno if r < 0 else ETIMEDOUT
        r = recv(fd, buf, TLS_CHUNK, MSG_DONTWAIT)
        if r == 0:
            return ECONNRESET
        if r < 0:
            if errno == EINTR or errno == EAGAIN:
                continue
            return errno
        if BIO_write(rbio, buf, <int>r) != r:
            return ENOMEM


cdef void _drop_refs(PyObject **rel, Py_ssize_t n):
    cdef Py_ssize_t i
    for i in range(n):
        Py_DECREF(<object>rel[i])
    free(rel)


# ---------------------------------------------------------------------------------------------

cdef inline void _deadline(timespec *ts, double timeout) noexcept nogil:
    """``timeout`` seconds from now on CLOCK_MONOTONIC, as pthread_cond_timedwait wants it
    (the condition variables here are made with that clock)."""
    cdef long long whole = <long long>timeout
    clock_gettime(CLOCK_MONOTONIC, ts)
    ts.tv_sec += whole
    ts.tv_nsec += <long>((timeout - whole) * 1e9)
    if ts.tv_nsec >= 1000000000:
        ts.tv_sec += 1
        ts.tv_nsec -= 1000000000


cdef class Fanout:
    """Pipelined sender to many nodes: one epoll loop, one non-blocking connection per link.

    ``park_seconds``: after a ``sync_batch`` that reached its quorum, its links stay held by the
    syncing side (parked) for that long, so that a writer syncing batch after batch does not hand
    them to the loop and take them back each time, nor wake the loop for the slowest node's ack:
    the next ``sync_batch`` reads it. A ``send`` on a parked link releases it at once; the loop
    releases links idle that long (0: never parked). A hang-up still reaches the loop at once.

    ``keep_notice_seconds``: a parked link whose ``sync_batch`` came within that of the one before
    on it keeps the commit notice for its next send (in the same system call, ahead of its bytes),
    or until the loop releases it idle: a writer syncing batch after batch saves a system call per
    node on each commit's path, and each node a wake-up; one syncing now and then sends it at once,
    as its followers wait for it.

    ``latency_bounds``: ascending upper bounds in seconds (at most 32) of the ack latencies each
    link counts, every frame sent with a ``last_txid`` timed from its send to the ack covering it
    (``take_latencies``).
    """

    def __cinit__(self):
        cdef int i
        cdef epoll_event ev
        self._park_ns = 2000000
        self._keep_ns = 200000
        self._nlat = 0
        self._nheld = 0
        self._timed = False
        self._ep = -1
        self._wake = -1
        for i in range(MAX_SYNCERS):
            self._sfds[i] = -1
            self._efree[i] = -1
        self._nefree = 0
        self._links = <link_t *>calloc(MAX_LINKS, sizeof(link_t))
        if self._links == NULL:
            raise MemoryError()
        for i in range(MAX_LINKS):
            pthread_mutex_init(&self._links[i].mu, NULL)
        self._nslots = 0
        self._socks = {}
        cdef pthread_condattr_t ca
        pthread_mutex_init(&self._nmu, NULL)
        pthread_condattr_init(&ca)
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC)
        pthread_cond_init(&self._ncv, &ca)
        pthread_condattr_destroy(&ca)
        self._news = 0
        self._nwaiters = 0
        self._ninit = True
        self._ep = epoll_create1(EPOLL_CLOEXEC)
        if self._ep < 0:
            raise OSError(errno, os.strerror(errno))
        self._wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)
        if self._wake < 0:
            raise OSError(errno, os.strerror(errno))
        ev.events = EPOLLIN
        ev.data.u64 = WAKE
        if epoll_ctl(self._ep, EPOLL_CTL_ADD, self._wake, &ev) != 0:
            raise OSError(errno, os.strerror(errno))

    def __init__(self, double park_seconds=0.002, latency_bounds=(), double keep_notice_seconds=0.0002):
        cdef list bounds = [float(b) for b in latency_bounds]
        cdef int i
        if not (park_seconds >= 0):
            raise ValueError(f"park_seconds must be >= 0, got {park_seconds}")
        if not (keep_notice_seconds >= 0):
            raise ValueError(f"keep_notice_seconds must be >= 0, got {keep_notice_seconds}")
        if len(bounds) > MAX_LAT_BOUNDS:
            raise ValueError(f"at most {MAX_LAT_BOUNDS} latency_bounds, got {len(bounds)}")
        if not all(0 < b < 1e9 for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"latency_bounds must be ascending seconds in (0, 1e9), got {tuple(latency_bounds)}")
        if self._running or self._nslots:
            raise RuntimeError("Fanout.__init__ on an engine in use")
        self._park_ns = <long long>(min(park_seconds, 3600.0) * 1e9)
        self._keep_ns = <long long>(min(keep_notice_seconds, 3600.0) * 1e9)
        for i in range(len(bounds)):
            self._lat_bounds[i] = <long long>round(bounds[i] * 1e9)
        self._nlat = len(bounds)

    def __dealloc__(self):
        cdef int i
        cdef link_t *l
        if self._links != NULL:
            for i in range(self._nslots):
                l = &self._links[i]
                _drop_queue(l)
                _drop_refs(l.rel, l.nrel)   # the GIL is held in __dealloc__
                l.rel = NULL
                free(l.q)
                free(l.fl)
                free(l.rbuf)
                free(l.fail_detail)
                if l.ssl != NULL:
                    SSL_free(l.ssl)
                    l.ssl = NULL
                free(l.cbuf)
                l.cbuf = NULL
            for i in range(MAX_LINKS):
                pthread_mutex_destroy(&self._links[i].mu)
            free(self._links)
            self._links = NULL
        if self._ep >= 0:
            c_close(self._ep)
        if self._wake >= 0:
            c_close(self._wake)
        self._close_spare_eventfds()
        if self._ninit:
            pthread_cond_destroy(&self._ncv)
            pthread_mutex_destroy(&self._nmu)
            self._ninit = False

    cdef void _bump_news(self, int skip=-1) noexcept nogil:
        # Wakes every wait_news and every sync_batch polling its links (but the one whose eventfd
        # is ``skip``: a sync_batch telling of what it read itself). The eventfds are written
        # under _nmu, so none is closed meanwhile: a sync_batch takes its own out under _nmu first.
        cdef unsigned long long one = 1
        cdef int i
        pthread_mutex_lock(&self._nmu)
        self._news += 1
        if self._nwaiters:
            pthread_cond_broadcast(&self._ncv)
        if self._syncers:
            for i in range(MAX_SYNCERS):
                if self._sfds[i] >= 0 and self._sfds[i] != skip:
                    <void>c_write(self._sfds[i], &one, 8)
        pthread_mutex_unlock(&self._nmu)

    cdef void _held_delta(self, int d, bint wake_loop) noexcept nogil:
        # Count the links a sync_batch holds or has parked (d > 0: taken, d < 0: given back to the
        # loop). Parking while the loop waits with no timeout wakes it once (wake_loop), so that it
        # starts timing their release.
        cdef unsigned long long one = 1
        cdef bint wake = False
        if d == 0 and not wake_loop:
            return
        pthread_mutex_lock(&self._nmu)
        self._nheld += d
        wake = wake_loop and not self._timed
        if wake:
            self._timed = True
        pthread_mutex_unlock(&self._nmu)
        if wake:
            <void>c_write(self._wake, &one, 8)

    cdef void _release_idle(self, long long now) noexcept nogil:
        # The loop's round: release every link parked for _park_ns or more (or failed meanwhile),
        # sending the commit notice kept for its next send: none came.
        cdef int s
        cdef int released = 0
        cdef link_t *l
        cdef bint failed = False
        cdef unsigned long long one = 1
        for s in range(self._nslots):
            l = &self._links[s]
            pthread_mutex_lock(&l.mu)
            if l.parked and (l.state != L_OPEN or now - l.parked_ns >= self._park_ns):
                if l.notice != NULL and _send_kept_notice(self._ep, self._links, l):
                    failed = True
                if _unpark(self._ep, self._links, l):
                    released += 1
            pthread_mutex_unlock(&l.mu)
        self._held_delta(-released, False)
        if failed:
            <void>c_write(self._wake, &one, 8)   # the next round reports it

    cdef link_t *_get(self, object link, int *slot) except NULL:
        cdef long long v = link
        cdef int s = <int>(v & (MAX_LINKS - 1))
        if self._links == NULL or self._ep < 0:
            raise ValueError("Fanout is closed")
        if v < 0 or s >= self._nslots or self._links[s].state == L_FREE or \
                self._links[s].gen != <unsigned int>(v >> SLOT_BITS):
            raise ValueError(f"unknown link {link}")
        slot[0] = s
        return &self._links[s]

    def add_link(self, sock, *, Py_ssize_t max_count=MAX_WINDOW_COUNT, Py_ssize_t max_bytes=1 << 62,
                 bint report_acks=True, TlsClient tls=None, str server_name="", double timeout=30.0):
        """Register a connected socket (made non-blocking); returns the link id.

        With ``report_acks=False`` the link is quiet: ``run``'s callback hears only of its failure,
        and its acks just wake ``wait_news`` (read them with ``acked``). With ``tls`` the link is
        encrypted: the TLS handshake runs here first (at most ``timeout`` seconds), the node's
        certificate checked against ``tls``'s CA and ``server_name`` (a host name or an IP
        address); a refusal raises TlsError, a timeout or a hang-up OSError.
        """
        cdef int s = 0
        cdef int fd
        cdef link_t *l = NULL
        cdef epoll_event ev
        cdef int err
        cdef SSL *ssl = NULL
        cdef BIO *sink = NULL
        if self._links == NULL or self._ep < 0:
            raise ValueError("Fanout is closed")
        if max_count < 1 or max_bytes < 1:
            raise ValueError("max_count and max_bytes must be >= 1")
        if timeout != timeout or timeout <= 0:
            raise ValueError("timeout must be > 0")
        if tls is not None and not server_name:
            raise ValueError("a TLS link needs the node's server_name to check its certificate against")
        sock.setblocking(False)
        fd = sock.fileno()
        if tls is not None:
            ssl = tls._session(fd, server_name, timeout)
        for s in range(self._nslots):
            if self._links[s].state == L_FREE:
                l = &self._links[s]
                break
        if l == NULL:
            if self._nslots == MAX_LINKS:
                if ssl != NULL:
                    SSL_free(ssl)
                raise RuntimeError(f"Fanout: more than {MAX_LINKS} links")
            s = self._nslots
            l = &self._links[s]
            self._nslots += 1
        if l.rbuf == NULL:
            l.rbuf = <unsigned char *>malloc(RBUF)
            if l.rbuf == NULL:
                if ssl != NULL:
                    SSL_free(ssl)
                raise MemoryError()
        if ssl != NULL:
            # The handshake sent all it wrote: from here the session writes into this link's cbuf.
            sink = BIO_new(_SINK)
            if sink == NULL:
                SSL_free(ssl)
                raise MemoryError()
            BIO_set_data(sink, l)
            SSL_set0_wbio(ssl, sink)
        pthread_mutex_lock(&l.mu)
        l.fd = fd
        l.ssl = ssl
        l.chead = l.clen = 0
        l.rbio = SSL_get_rbio(ssl) if ssl != NULL else NULL
        l.wbio = SSL_get_wbio(ssl) if ssl != NULL else NULL
        l.qhead = l.qlen = 0
        l.flhead = l.fllen = 0
        l.inflight_bytes = 0
        l.max_count = max_count
        l.max_bytes = max_bytes
        l.acked = l.reported = 0
        l.lat_bounds = self._lat_bounds
        l.nlat = self._nlat
        memset(l.lat, 0, sizeof(l.lat))
        l.lat_sum_ns = 0
        l.out_armed = False
        l.held = False
        l.parked = False
        l.news = False
        l.rlen = 0
        l.fail_kind = F_NONE
        l.fail_errno = 0
        l.fail_len = 0
        l.fail_reported = False
        l.quiet = not report_acks
        l.state = L_OPEN
        l.registered = True
        pthread_mutex_unlock(&l.mu)
        ev.events = EPOLLIN | EPOLLRDHUP
        ev.data.u64 = _token(self._links, l)
        if epoll_ctl(self._ep, EPOLL_CTL_ADD, fd, &ev) != 0:
            err = errno
            l.state = L_FREE
            l.registered = False
            l.gen += 1
            if l.ssl != NULL:
                SSL_free(l.ssl)
                l.ssl = NULL
            raise OSError(err, os.strerror(err))
        self._socks[<int>(l - self._links)] = sock
        return <long long>_token(self._links, l)

    def send(self, link, bytes frame not None, unsigned long long last_txid=0, bytes prefix=None):
        """Queue ``prefix`` (if any) then ``frame``; a frame with ``last_txid`` > 0 awaits its ack.

        Returns 0 when queued, 1 when the link's window was full (nothing queued; the link fails),
        -1 when the link has failed. Failures (a full window, a write error) are reported by
        ``run``'s callback, never raised here. A parked link is released first: the loop reads
        its acks from here on.
        """
        return self._send(link, frame, last_txid, prefix, True)

    cdef object _send(self, object link, bytes frame, unsigned long long last_txid, bytes prefix, bint release):
        cdef int s = 0
        cdef link_t *l = self._get(link, &s)
        cdef PyObject *pre = NULL
        cdef const char *prep = NULL
        cdef PyObject *fr = <PyObject *>frame
        cdef const char *frp = PyBytes_AS_STRING(frame)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(frame)
        cdef Py_ssize_t npre = 0
        cdef int rc
        cdef PyObject **rel = NULL
        cdef Py_ssize_t nrel = 0
        cdef int ep = self._ep
        cdef link_t *links = self._links
        cdef unsigned long long one = 1
        cdef bint released = False
        if prefix is not None:
            pre = <PyObject *>prefix
            prep = PyBytes_AS_STRING(prefix)
            npre = PyBytes_GET_SIZE(prefix)
            Py_INCREF(prefix)
        Py_INCREF(frame)
        if n + npre >= NOGIL_SEND:
            with nogil:
                rc = _enqueue(ep, links, l, pre, prep, npre, fr, frp, n, last_txid, &rel, &nrel, release, &released)
        else:
            rc = _enqueue(ep, links, l, pre, prep, npre, fr, frp, n, last_txid, &rel, &nrel, release, &released)
        if released:
            self._held_delta(-1, False)
        if rc != 0 and rc != -3:
            Py_DECREF(frame)
            if prefix is not None:
                Py_DECREF(prefix)
        _drop_refs(rel, nrel)
        if rc == -2:
            raise MemoryError()
        if rc != 0:
            <void>c_write(self._wake, &one, 8)    # let the loop report the failure
        return -1 if rc == -3 else rc

    def remove(self, link):
        """Forget a link: stop watching its socket and drop what is queued. The caller closes the socket."""
        cdef int s = 0
        cdef link_t *l = self._get(link, &s)
        cdef PyObject **rel
        cdef Py_ssize_t nrel
        cdef bint was_parked
        pthread_mutex_lock(&l.mu)
        was_parked = l.parked
        l.parked = False
        _deregister(self._ep, l)
        _drop_queue(l)
        rel = l.rel
        nrel = l.nrel
        l.rel = NULL
        l.nrel = l.relcap = 0
        free(l.fail_detail)
        l.fail_detail = NULL
        l.fail_len = 0
        if l.ssl != NULL:
            SSL_free(l.ssl)
            l.ssl = NULL
        free(l.cbuf)            # a large backlog is not kept for the slot's next link
        l.cbuf = NULL
        l.chead = l.clen = l.ccap = 0
        l.state = L_FREE
        l.gen += 1
        pthread_mutex_unlock(&l.mu)
        self._held_delta(-1 if was_parked else 0, False)
        _drop_refs(rel, nrel)
        self._socks.pop(s, None)

    def acked(self, link):
        """Highest txid the node has acknowledged as durable on this link."""
        # These reads keep the GIL: a link's mutex is held for short stretches (one send or read of
        # its socket at most) and no thread takes the GIL while holding it, whereas handing the GIL
        # over and taking it back can cost a thread switch each time, and a writer reads these for
        # every node on every sync.
        cdef int s = 0
        cdef link_t *l = self._get(link, &s)
        cdef uint64_t a
        pthread_mutex_lock(&l.mu)
        a = l.acked
        pthread_mutex_unlock(&l.mu)
        return a

    def take_latencies(self, link):
        """``(counts, seconds)``: how many frames the node acknowledged since the last call, per
        ``latency_bounds`` bound their ack latency fell under (one more count, last, for those
        above every bound), and the sum of those latencies; the counts start again from zero."""
        cdef int s = 0
        cdef link_t *l = self._get(link, &s)
        cdef int i
        cdef int n
        cdef uint64_t c[MAX_LAT_BOUNDS + 1]
        cdef long long total
        pthread_mutex_lock(&l.mu)  # with the GIL, as acked()
        n = l.nlat + 1
        for i in range(n):
            c[i] = l.lat[i]
            l.lat[i] = 0
        total = l.lat_sum_ns
        l.lat_sum_ns = 0
        pthread_mutex_unlock(&l.mu)
        return [c[i] for i in range(n)], total / 1e9

    def inflight(self, link):
        """(frames, bytes) sent or queued on this link and not yet acknowledged."""
        cdef int s = 0
        cdef link_t *l = self._get(link, &s)
        cdef Py_ssize_t c, b
        pthread_mutex_lock(&l.mu)  # with the GIL, as acked()
        c = l.fllen - l.flhead
        b = l.inflight_bytes
        pthread_mutex_unlock(&l.mu)
        return c, b

    def quorum_txid(self, links):
        """Highest txid acknowledged by a majority of ``links`` (0 when none or no majority has one)."""
        cdef list acks = []
        for link in links:
            acks.append(self.acked(link))
        if not acks:
            return 0
        acks.sort(reverse=True)
        return acks[len(acks) // 2]

    def news(self):
        """A counter that grows whenever a link's acked advances, a link fails, or ``notify`` runs."""
        cdef unsigned long long v
        pthread_mutex_lock(&self._nmu)  # with the GIL, as acked()
        v = self._news
        pthread_mutex_unlock(&self._nmu)
        return v

    def wait_news(self, unsigned long long seen, double timeout):
        """Block (without the GIL) until ``news()`` differs from ``seen``, at most ``timeout`` seconds.

        Returns whether it differs. Read ``news()`` before looking at the state you wait on, then
        pass it here: news that arrived in between is never missed.
        """
        cdef timespec ts
        cdef int rc = 0
        cdef bint got
        if timeout != timeout:
            raise ValueError("timeout is NaN")
        if timeout > 1e6:
            timeout = 1e6
        with nogil:
            pthread_mutex_lock(&self._nmu)
            if self._news == seen and timeout > 0:
                _deadline(&ts, timeout)
                self._nwaiters += 1
                while self._news == seen and rc == 0:
                    rc = pthread_cond_timedwait(&self._ncv, &self._nmu, &ts)
                self._nwaiters -= 1
            got = self._news != seen
            pthread_mutex_unlock(&self._nmu)
        return got

    def notify(self):
        """Bump ``news()`` and wake every ``wait_news`` (Python calls it when its own state changed)."""
        with nogil:
            pthread_mutex_lock(&self._nmu)
            self._notified += 1
            pthread_mutex_unlock(&self._nmu)
            self._bump_news()

    def sync_batch(self, links, bytes frame not None, unsigned long long last_txid, int need, bytes notice,
                   double timeout, Py_ssize_t room=0):
        """Send ``frame`` on each of ``links`` (as ``send`` does, awaiting ``last_txid``), wait without
        the GIL until ``need`` of them have acknowledged ``last_txid``, then queue ``notice`` (if not
        None) on each of them. Returns how many had acknowledged it. A link left parked keeps the
        notice for its next send (the node reads it just ahead of that send's bytes), or until the
        loop releases the link idle.

        ``room`` > 0: a link with unacknowledged bytes that ``frame`` would take past ``room``, or
        with its window's frames all in flight, makes it return -1 having sent nothing (its caller
        waits for room the usual way): the writer's queue limit checked here rather than by a call
        per link before this one.

        The wait also ends, with fewer than ``need``, when one of the links is no longer open, when
        ``notify`` runs (the caller's own state changed) or after ``timeout`` seconds; the caller
        then looks at the links itself. An unknown link raises ValueError before anything is sent.
        Why one call: a writer syncing every record otherwise runs Python per node and per ack
        between closing its batch and returning (docs/performance.md). While it waits, this thread
        polls the links and reads their acks itself (under each link's mutex, as the loop does), so
        an ack wakes it directly instead of waking the loop, which then wakes it, and it needs no
        loop running to see its quorum; the loop stops watching those links for input meanwhile. A
        failure it finds is reported by the loop, as any other."""
        return self._sync_batch(links, frame, last_txid, need, notice, timeout, room)

    def lane(self, links, int need, Py_ssize_t room=0):
        """A ``Lane``: ``sync_batch`` over ``links`` for a writer committing batch after batch.
        An unknown link raises ValueError."""
        return Lane(self, links, need, room)

    cdef int _sync_batch(self, object links, bytes frame, unsigned long long last_txid, int need, bytes notice,
                         double timeout, Py_ssize_t room) except -3:
        cdef Py_ssize_t n = len(links)
        cdef int s = 0
        cdef Py_ssize_t i
        cdef link_t *l
        cdef link_t *arr
        cdef int *slots
        cdef unsigned int *gens
        cdef timespec ts
        cdef int rc = 0
        cdef unsigned long long notified
        cdef int count = 0
        cdef int gone = 0
        cdef pollfd *pfds
        cdef int efd = -1
        cdef int slot = -1
        cdef timespec sl
        cdef bint changed
        cdef bint failed = False
        cdef uint64_t acked0
        cdef unsigned long long junk = 0
        cdef unsigned long long one = 1
        cdef int ep = self._ep
        cdef int taken = 0
        cdef int parked = 0
        cdef int let_go = 0
        cdef bint *mine
        cdef bint park = False
        cdef long long now = 0
        cdef bint kept
        cdef bint *quick
        cdef long long started
        cdef long long keep_ns = self._keep_ns
        cdef const char *nbytes
        cdef Py_ssize_t nlen
        cdef bint full
        if timeout != timeout:
            raise ValueError("timeout is NaN")
        if timeout > 1e6:
            timeout = 1e6
        if n == 0:
            return 0
        started = _now_ns()
        slots = <int *>malloc(n * sizeof(int))
        gens = <unsigned int *>malloc(n * sizeof(unsigned int))
        pfds = <pollfd *>malloc((n + 1) * sizeof(pollfd))
        mine = <bint *>malloc(2 * n * sizeof(bint))
        if slots == NULL or gens == NULL or pfds == NULL or mine == NULL:
            free(slots)
            free(gens)
            free(pfds)
            free(mine)
            raise MemoryError()
        quick = mine + n
        try:
            for i in range(n):
                l = self._get(links[i], &s)
                slots[i] = s
                gens[i] = l.gen
                if room > 0:
                    pthread_mutex_lock(&l.mu)  # with the GIL, as inflight()
                    full = l.inflight_bytes > 0 and (
                        l.inflight_bytes + PyBytes_GET_SIZE(frame) > room or l.fllen - l.flhead >= l.max_count)
                    pthread_mutex_unlock(&l.mu)
                    if full:
                        return -1
            for i in range(n):
                try:
                    self._send(links[i], frame, last_txid, None, False)
                except ValueError:
                    pass  # it left the engine while a large send ran without the GIL: gone, below
            arr = self._links
            for i in range(n):
                pfds[i].fd = arr[slots[i]].fd
                pfds[i].events = POLLIN
            # Its own eventfd, so that no other sync_batch drains a wake-up meant for this one; if
            # none can be had (or MAX_SYNCERS are polling), it looks again every SLICE instead.
            # One a call before this one left is taken first: two system calls less a commit. It
            # may hold a wake-up written before that call left _sfds, which costs one more look.
            pthread_mutex_lock(&self._nmu)
            if self._nefree > 0:
                self._nefree -= 1
                efd = self._efree[self._nefree]
            pthread_mutex_unlock(&self._nmu)
            if efd < 0:
                efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)
            pfds[n].fd = efd
            pfds[n].events = POLLIN
            with nogil:
                for i in range(n):
                    l = &arr[slots[i]]
                    mine[i] = False
                    quick[i] = False
                    pthread_mutex_lock(&l.mu)
                    if l.gen == gens[i]:
                        if l.parked:
                            l.parked = False    # this call's now: held (and counted) already, no syscall
                            mine[i] = True
                            quick[i] = started - l.parked_ns < keep_ns
                        elif not l.held:
                            _hold(ep, arr, l, True)
                            if l.held:
                                mine[i] = True
                                taken += 1
                    pthread_mutex_unlock(&l.mu)
                self._held_delta(taken, False)
                pthread_mutex_lock(&self._nmu)
                notified = self._notified
                if efd >= 0:
                    for i in range(MAX_SYNCERS):
                        if self._sfds[i] < 0:
                            self._sfds[i] = efd     # from here news wakes the poll below
                            slot = <int>i
                            self._syncers += 1
                            break
                pthread_mutex_unlock(&self._nmu)
                _deadline(&ts, timeout)
                while True:
                    count = 0
                    gone = 0
                    for i in range(n):
                        l = &arr[slots[i]]
                        pthread_mutex_lock(&l.mu)
                        if l.gen != gens[i] or l.state != L_OPEN:
                            gone += 1
                        elif l.acked >= last_txid:
                            count += 1
                        pthread_mutex_unlock(&l.mu)
                    if count >= need or gone or rc != 0 or timeout <= 0:
                        break
                    pthread_mutex_lock(&self._nmu)
                    changed = self._notified != notified
                    pthread_mutex_unlock(&self._nmu)
                    if changed:
                        break
                    # Read the acks here, not through the loop: the reply wakes this thread
                    # directly, one wake-up a commit instead of the loop's then this one's.
                    for i in range(n + 1):
                        pfds[i].revents = 0
                    if slot >= 0:
                        rc = _poll_until(pfds, n + 1, &ts)
                    else:
                        _deadline(&sl, SLICE)
                        if sl.tv_sec > ts.tv_sec or (sl.tv_sec == ts.tv_sec and sl.tv_nsec > ts.tv_nsec):
                            sl = ts
                        rc = _poll_until(pfds, n + 1, &sl)
                        if rc == ETIMEDOUT and (sl.tv_sec != ts.tv_sec or sl.tv_nsec != ts.tv_nsec):
                            rc = 0          # a slice, not the deadline: look again
                    if rc != 0:
                        break
                    changed = False
                    for i in range(n):
                        if pfds[i].revents == 0:
                            continue
                        if pfds[i].revents & POLLNVAL:
                            pfds[i].fd = -1     # closed under it: its link's state says why, above
                            continue
                        l = &arr[slots[i]]
                        pthread_mutex_lock(&l.mu)
                        if l.gen == gens[i] and l.state == L_OPEN:
                            acked0 = l.acked
                            _read(ep, l, _token(arr, l))
                            if l.acked != acked0 or l.state != L_OPEN:
                                changed = True
                            if l.state != L_OPEN:
                                failed = True  # the loop reports it: woken below
                            elif l.quiet:
                                l.news = False
                        pthread_mutex_unlock(&l.mu)
                    if pfds[n].revents:
                        <void>c_read(efd, &junk, 8)
                    if changed:
                        self._bump_news(efd)
                pthread_mutex_lock(&self._nmu)
                if slot >= 0:
                    self._sfds[slot] = -1
                    self._syncers -= 1
                if efd >= 0 and self._nefree < MAX_SYNCERS and self._ep >= 0:
                    self._efree[self._nefree] = efd     # out of _sfds: nothing writes it now
                    self._nefree += 1
                    efd = -1
                pthread_mutex_unlock(&self._nmu)
                if efd >= 0:
                    c_close(efd)
                # At a quorum the links stay held (parked) for the next sync_batch, the slowest
                # node's ack unread until then; otherwise the loop takes them back at once, and
                # reads what is left (the caller waits on the loop for the rest).
                park = count >= need and self._park_ns > 0
                now = _now_ns() if park else 0
                for i in range(n):
                    if not mine[i]:
                        continue
                    l = &arr[slots[i]]
                    pthread_mutex_lock(&l.mu)
                    if l.gen == gens[i] and park and l.state == L_OPEN:
                        l.parked = True
                        l.parked_ns = now
                        parked += 1
                    else:
                        if l.gen == gens[i]:
                            _hold(ep, arr, l, False)  # input left unread wakes the loop at once
                        let_go += 1                   # (a link removed meanwhile is counted out too)
                    pthread_mutex_unlock(&l.mu)
                self._held_delta(-let_go, parked > 0)
                if failed:
                    <void>c_write(self._wake, &one, 8)
            if count >= need and notice is not None:
                # A parked link of a writer syncing batch after batch keeps the notice for its next
                # send (the next sync_batch's frame, in the same system call), or until the loop
                # releases it idle: sent now, it costs a system call per node on the commit's path,
                # and each node a wake-up for it while the writer needs the CPU.
                nbytes = PyBytes_AS_STRING(notice)
                nlen = PyBytes_GET_SIZE(notice)
                for i in range(n):
                    kept = False
                    if park and mine[i] and quick[i]:
                        l = &arr[slots[i]]
                        Py_INCREF(notice)
                        pthread_mutex_lock(&l.mu)
                        if l.gen == gens[i] and l.parked and l.state == L_OPEN:
                            if l.notice != NULL:
                                _rel_push(l, l.notice)
                            l.notice = <PyObject *>notice
                            l.notice_p = nbytes
                            l.notice_n = nlen
                            kept = True
                        pthread_mutex_unlock(&l.mu)
                        if not kept:
                            Py_DECREF(notice)
                    if not kept:
                        try:
                            self._send(links[i], notice, 0, None, False)
                        except ValueError:
                            pass  # the link left the engine meanwhile: its node is out of sync already
        finally:
            free(slots)
            free(gens)
            free(pfds)
            free(mine)
        return count

    def run(self, callback):
        """Serve every link until ``stop``; ``callback(link, acked, code, detail)`` reports news.

        ``code`` is ``""`` (acked advanced), ``"reply"`` (the node sent an ERROR or something
        unparseable: ``detail`` holds those bytes), ``"eof"``, ``"oserror"`` (``detail`` = errno) or
        ``"window"`` (a send found the in-flight window full), ``"tls"`` (the link's TLS session
        failed: ``detail`` is OpenSSL's reason, as text).
        """
        cdef epoll_event evs[MAX_EVENTS]
        cdef int n, i, s
        cdef int ep = self._ep
        cdef int wake = self._wake
        cdef link_t *links = self._links
        cdef link_t *l
        cdef unsigned long long tok
        cdef unsigned long long junk = 0
        cdef int touched[MAX_EVENTS]
        cdef int ntouched
        cdef bint woke
        cdef bint changed
        cdef uint64_t acked0
        cdef int e
        cdef int wait_ms
        cdef long long next_round = 0
        cdef long long now
        cdef long long park_ns = self._park_ns
        cdef int park_ms = <int>((park_ns + 999999) // 1000000) if park_ns < 3600000000000 else 3600000
        if links == NULL or ep < 0:
            raise ValueError("Fanout is closed")
        if self._running:
            raise RuntimeError("Fanout.run is already running")
        self._running = True
        try:
            while not self._stop:
                ntouched = 0
                woke = False
                changed = False
                with nogil:
                    # While links are parked the wait is timed, to release the idle ones.
                    pthread_mutex_lock(&self._nmu)
                    self._timed = self._nheld > 0 and park_ns > 0
                    wait_ms = park_ms if self._timed else -1
                    pthread_mutex_unlock(&self._nmu)
                    n = epoll_wait(ep, evs, MAX_EVENTS, wait_ms)
                    if wait_ms >= 0:
                        now = _now_ns()
                        if now >= next_round:
                            self._release_idle(now)
                            next_round = now + park_ns // 2
                    for i in range(n):
                        tok = evs[i].data.u64
                        if tok == WAKE:
                            e = <int>c_read(wake, &junk, 8)
                            woke = True
                            continue
                        s = <int>(tok & (MAX_LINKS - 1))
                        l = &links[s]
                        pthread_mutex_lock(&l.mu)
                        if l.state == L_OPEN and l.gen == <unsigned int>(tok >> SLOT_BITS):
                            acked0 = l.acked
                            if evs[i].events & (EPOLLOUT | EPOLLERR):
                                e = _flush(ep, l, tok)
                                if e:
                                    _fail(ep, l, F_OSERROR, e, NULL, 0)
                            if l.state == L_OPEN and evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP):
                                _read(ep, l, tok)
                            if l.acked != acked0 or l.state != L_OPEN:
                                changed = True
                            if l.quiet and l.state == L_OPEN:
                                l.news = False      # acks only: the waiters hear of them below
                        if l.news or l.nrel:
                            touched[ntouched] = s
                            ntouched += 1
                        pthread_mutex_unlock(&l.mu)
                    if changed:
                        self._bump_news()
                if woke:
                    for s in range(self._nslots):
                        self._report(s, callback)
                else:
                    for i in range(ntouched):
                        self._report(touched[i], callback)
        finally:
            self._stop = False  # honoured: a stop that came before this run, too
            self._running = False

    cdef int _report(self, int s, object callback) except -1:
        # With the GIL: drop the references the loop released, then report news to Python.
        cdef link_t *l = &self._links[s]
        cdef PyObject **rel
        cdef Py_ssize_t nrel
        cdef bint news
        cdef uint64_t acked
        cdef int kind = F_NONE
        cdef int err = 0
        cdef object detail = None
        cdef unsigned int gen
        pthread_mutex_lock(&l.mu)
        if l.state == L_FREE:
            pthread_mutex_unlock(&l.mu)
            return 0
        rel = l.rel
        nrel = l.nrel
        l.rel = NULL
        l.nrel = l.relcap = 0
        news = l.news
        l.news = False
        acked = l.acked
        gen = l.gen
        if l.state == L_FAILED and not l.fail_reported:
            l.fail_reported = True
            kind = l.fail_kind
            err = l.fail_errno
            if l.fail_len:
                detail = PyBytes_FromStringAndSize(<const char *>l.fail_detail, l.fail_len)
        pthread_mutex_unlock(&l.mu)
        _drop_refs(rel, nrel)
        if not news:
            return 0
        if kind == F_REPLY:
            code = "reply"
        elif kind == F_EOF:
            code = "eof"
        elif kind == F_OSERROR:
            code = "oserror"
            detail = err
        elif kind == F_WINDOW:
            code = "window"
        elif kind == F_TLS:
            code = "tls"
            detail = detail.decode(errors="replace") if detail is not None else ""
        else:
            code = ""
        try:
            callback((<long long>gen << SLOT_BITS) | s, acked, code, detail)
        except Exception:
            traceback.print_exc()
        return 0

    def stop(self):
        """Make ``run`` return (from any thread); a stop before ``run`` makes it return at once."""
        cdef unsigned long long one = 1
        cdef ssize_t r
        self._stop = True
        if self._wake >= 0:
            r = c_write(self._wake, &one, 8)
            if r < 0:
                raise OSError(errno, os.strerror(errno))

    def close(self):
        """Remove every link and release the epoll instance; ``run`` must have returned."""
        cdef int s
        if self._running:
            raise RuntimeError("Fanout.close while run is running; stop it first")
        if self._links == NULL or self._ep < 0:
            return
        for s in range(self._nslots):
            if self._links[s].state != L_FREE:
                self.remove((<long long>self._links[s].gen << SLOT_BITS) | s)
        c_close(self._ep)
        c_close(self._wake)
        self._ep = self._wake = -1
        self._close_spare_eventfds()

    cdef void _close_spare_eventfds(self) noexcept nogil:
        cdef int i
        if not self._ninit:
            return
        pthread_mutex_lock(&self._nmu)
        for i in range(self._nefree):
            c_close(self._efree[i])
        self._nefree = 0
        pthread_mutex_unlock(&self._nmu)

    @property
    def closed(self):
        return self._ep < 0


# ---------------------------------------------------------------------------------------------

cdef str _reason():
    cdef char text[TLS_ERRTEXT]
    cdef Py_ssize_t n = _tls_error(text)
    return PyBytes_FromStringAndSize(text, n).decode(errors="replace")


cdef SSL *_new_session(SSL_CTX *ctx, BIO **rbio, BIO **wbio) except NULL:
    """A TLS session of ``ctx`` over two memory BIOs (ciphertext in, ciphertext out), which the
    session owns: the socket I/O stays plain send/recv in the callers' loops."""
    ERR_clear_error()
    cdef SSL *ssl = SSL_new(ctx)
    if ssl == NULL:
        raise MemoryError()
    rbio[0] = BIO_new(BIO_s_mem())
    wbio[0] = BIO_new(BIO_s_mem())
    if rbio[0] == NULL or wbio[0] == NULL:
        if rbio[0] != NULL:
            BIO_free(rbio[0])
        if wbio[0] != NULL:
            BIO_free(wbio[0])
        SSL_free(ssl)
        raise MemoryError()
    SSL_set_bio(ssl, rbio[0], wbio[0])
    return ssl


cdef SSL_CTX *_new_ctx(const SSL_METHOD *method, int verify, ca_file, cert_file, key_file) except NULL:
    # TLS 1.3 only (as qjm.security.tls), this end's certificate and key, the CA to verify the peer.
    cdef bytes ca = os.fsencode(ca_file)
    cdef bytes cert = os.fsencode(cert_file)
    cdef bytes key = os.fsencode(key_file)
    ERR_clear_error()
    cdef SSL_CTX *ctx = SSL_CTX_new(method)
    if ctx == NULL:
        raise MemoryError()
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION)
    SSL_CTX_set_verify(ctx, verify, NULL)
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF)  # a hang-up without close_notify is EOF
    try:
        if SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1:
            raise ConfigError(f"cannot load the CA certificates from {ca_file}: {_reason()}")
        if SSL_CTX_use_certificate_chain_file(ctx, cert) != 1:
            raise ConfigError(f"cannot load the certificate from {cert_file}: {_reason()}")
        if SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1:
            raise ConfigError(f"cannot load the private key from {key_file}: {_reason()}")
        if SSL_CTX_check_private_key(ctx) != 1:
            raise ConfigError(f"the key in {key_file} does not match the certificate in {cert_file}: {_reason()}")
    except ConfigError:
        SSL_CTX_free(ctx)
        raise
    return ctx


cdef class Lane:
    """``Fanout.sync_batch`` bound to one writer's links, quorum and queue limit, for a writer that
    syncs batch after batch: each ``commit`` encodes the batch's commit notice, sends, waits and
    times the commit in one call, with no Python between the writer's frame and the engine.

    Why: the writer's Python around one ``sync_batch`` (the logger set's checks, the notice's
    encoding, the commit's timing) runs on caches the wait has cooled, and costs a sync commit
    several microseconds (``bench/writer_split.py``, docs/performance.md). The lane is good until
    ``revoke`` (its owner saw a node's state change) or until a commit finds it wanting: a link
    gone from the engine, or a wait short of a quorum, revokes it."""

    def __init__(self, Fanout fanout not None, links, int need, Py_ssize_t room=0):
        cdef int s = 0
        cdef int i
        self._fanout = fanout
        self._links = tuple(int(x) for x in links)
        for link in self._links:
            fanout._get(link, &s)      # an unknown link: ValueError now, not at the first commit
        if need < 1 or need > len(self._links):
            raise ValueError(f"need must be in [1, {len(self._links)}], got {need}")
        self.need = need
        self._room = room
        self.revoked = False
        self.committed = 0
        for i in range(MAX_LAT_BOUNDS + 1):
            self._times[i] = 0
        self._times_ns = 0

    @property
    def links(self):
        return self._links

    def revoke(self):
        """End the lane: every later ``commit`` returns -2 having done nothing."""
        self.revoked = True

    def commit(self, bytes frame not None, unsigned long long last_txid, unsigned long long epoch, double timeout):
        """``sync_batch`` of ``frame`` (awaiting ``last_txid``) with the commit notice of ``epoch`` and
        ``last_txid``. Returns how many links acknowledged it (at least ``need``: committed and
        timed; fewer: the wait ended short, and the lane is revoked), -1 having sent nothing when a
        link has no room, -2 having sent nothing when the lane is revoked or a link left the engine
        (which revokes it)."""
        cdef bytes notice
        cdef qjm_commit *c
        cdef int acked
        cdef long long started
        cdef long long took
        cdef int i
        if self.revoked:
            return -2
        if self._fanout is None:
            raise RuntimeError("Lane.__init__ was not called")  # (Lane.__new__ alone)
        if last_txid > <unsigned long long>INT64_MAX:
            raise OverflowError(f"last_txid {last_txid} does not fit a commit notice (signed 64 bits)")
        notice = PyBytes_FromStringAndSize(NULL, sizeof(qjm_commit))
        c = <qjm_commit *>PyBytes_AS_STRING(notice)
        c.magic = QJM_COMMIT_MAGIC
        c.reserved = 0
        c.epoch = epoch
        c.committed_txid = <int64_t>last_txid
        started = _now_ns()
        try:
            acked = self._fanout._sync_batch(self._links, frame, last_txid, self.need, notice, timeout, self._room)
        except ValueError:
            self.revoked = True     # raised before anything was sent: a link left the engine
            return -2
        if acked >= self.need:
            took = _now_ns() - started
            i = 0
            while i < self._fanout._nlat and took > self._fanout._lat_bounds[i]:
                i += 1
            self._times[i] += 1
            self._times_ns += took
            if last_txid > self.committed:
                self.committed = last_txid
        elif acked >= 0:
            self.revoked = True
        return acked

    def times(self):
        """``(counts, seconds)`` of every commit so far: how many took at most each of the engine's
        ``latency_bounds`` (one more count, last, for those above every bound), and their sum."""
        return [self._times[i] for i in range(self._fanout._nlat + 1)], self._times_ns / 1e9


cdef class TlsServer:
    """A node's side of data-plane TLS: its certificate chain and key (PEM files) and the CA whose
    certificates it accepts; TLS 1.3, a client certificate signed by that CA required."""

    def __cinit__(self):
        self._ctx = NULL

    def __init__(self, ca_file, cert_file, key_file):
        if self._ctx != NULL:
            raise RuntimeError("TlsServer is already initialised")
        self._ctx = _new_ctx(TLS_server_method(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                             ca_file, cert_file, key_file)
        SSL_CTX_set_num_tickets(self._ctx, 0)   # no resumption: a writer's link lives for a segment
        # One recv takes up to TLS_RECV of records, not a record header and then its body.
        SSL_CTX_set_read_ahead(self._ctx, 1)
        SSL_CTX_set_default_read_buffer_len(self._ctx, TLS_RECV)

    def __dealloc__(self):
        if self._ctx != NULL:
            SSL_CTX_free(self._ctx)
            self._ctx = NULL


cdef class TlsClient:
    """A writer's side of data-plane TLS: its certificate chain and key (PEM files) and the CA
    certificates it trusts; TLS 1.3 (as ``qjm.security.tls``), the node's certificate always verified."""

    def __cinit__(self):
        self._ctx = NULL

    def __init__(self, ca_file, cert_file, key_file):
        if self._ctx != NULL:
            raise RuntimeError("TlsClient is already initialised")
        self._ctx = _new_ctx(TLS_client_method(), SSL_VERIFY_PEER, ca_file, cert_file, key_file)
        # AES-128-GCM first: the node (TlsServer) takes the writer's order, and it costs the writer,
        # which encrypts every batch once per node, about a third less CPU than AES-256-GCM.
        SSL_CTX_set_ciphersuites(self._ctx, b"TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256")

    def __dealloc__(self):
        if self._ctx != NULL:
            SSL_CTX_free(self._ctx)
            self._ctx = NULL

    cdef SSL *_session(self, int fd, str server_name, double timeout) except NULL:
        # A client session on memory BIOs, its handshake done over fd (non-blocking).
        cdef SSL *ssl
        cdef BIO *rbio
        cdef BIO *wbio
        cdef bytes name = server_name.encode()
        cdef const char *np = name
        cdef int rc
        cdef long verify
        if self._ctx == NULL:
            raise ValueError("TlsClient is not initialised")
        ssl = _new_session(self._ctx, &rbio, &wbio)
        SSL_set_connect_state(ssl)
        # The node's address is checked against its certificate: an IP address against its IP
        # SANs, a host name against its DNS names (and sent as SNI).
        if name and X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), np) != 1:
            ERR_clear_error()
            if SSL_set1_host(ssl, np) != 1 or SSL_set_tlsext_host_name(ssl, np) != 1:
                SSL_free(ssl)
                raise ConfigError(f"cannot check the node's certificate against the name {server_name!r}")
        with nogil:
            rc = _handshake(ssl, rbio, wbio, fd, timeout)
        if rc == 0:
            return ssl
        if rc == -1:
            text = _reason()
            verify = SSL_get_verify_result(ssl)
            if verify != X509_V_OK:
                text = f"{text}: {(<bytes>X509_verify_cert_error_string(verify)).decode()}"
            SSL_free(ssl)
            raise TlsError(f"TLS handshake with {server_name or 'the node'} failed: {text}")
        SSL_free(ssl)
        if rc == ECONNRESET:
            raise TlsError(f"{server_name or 'the node'} hung up during the TLS handshake (is its data plane TLS?)")
        raise OSError(rc, f"TLS handshake with {server_name or 'the node'}: {os.strerror(rc)}")


cdef class Receiver:
    """The node's end of one data-plane connection: hello, then runs of frames and commit notices."""

    def __cinit__(self):
        self._buf = NULL
        self._ssl = NULL
        self._io.rest = NULL

    def __init__(self, sock, max_frame=QJM_FRAME_HEADER_SIZE + _MAX_PAYLOAD, memory=None):
        if self._buf != NULL:
            raise RuntimeError("Receiver is already initialised")
        self._nunsent = 0
        self._acked = 0
        self._sock = sock
        self._fd = sock.fileno()
        self._max_frame = max_frame
        self._memory = memory
        self._cap = RECV_CHUNK
        self._buf = <unsigned char *>malloc(<size_t>self._cap)
        if self._buf == NULL:
            raise MemoryError()
        self._len = 0
        self._eof = False

    def __dealloc__(self):
        free(self._buf)
        self._buf = NULL
        if self._ssl != NULL:
            SSL_free(self._ssl)
            self._ssl = NULL
        if self._io.rest != NULL:
            BIO_free(self._io.rest)
            self._io.rest = NULL

    def handshake(self, TlsServer tls not None, double timeout):
        """Run the node's side of the TLS handshake first, within ``timeout`` seconds in all; the
        connection is then read and answered through the session. A peer the session refuses (no
        certificate, another CA, expired, not TLS) raises TlsError; a timeout or a hang-up OSError."""
        cdef SSL *ssl
        cdef BIO *rbio
        cdef BIO *wbio
        cdef BIO *source
        cdef int rc
        if self._buf == NULL:
            raise OSError(EBADF, "receiver is closed")
        if self._ssl != NULL:
            raise RuntimeError("the TLS handshake already ran")
        if timeout != timeout or timeout <= 0:
            raise ValueError("timeout must be > 0")
        ssl = _new_session(tls._ctx, &rbio, &wbio)
        SSL_set_accept_state(ssl)
        with nogil:
            rc = _handshake(ssl, rbio, wbio, self._fd, timeout)
        if rc == 0:
            # From here SSL_read takes ciphertext from the socket itself (the source BIO), after
            # what came in with the handshake and still waits in the memory BIO.
            source = BIO_new(_SOURCE)
            if source == NULL:
                SSL_free(ssl)
                raise MemoryError()
            BIO_up_ref(rbio)
            self._io.rest = rbio
            self._io.fd = self._fd
            self._io.eof = False
            BIO_set_data(source, &self._io)
            SSL_set0_rbio(ssl, source)
            self._ssl = ssl
            return
        text = _reason() if rc == -1 else ""
        SSL_free(ssl)
        if rc == -1:
            raise TlsError(f"TLS handshake failed: {text}")
        if rc == ECONNRESET:
            raise TlsError("the peer hung up during the TLS handshake")
        raise OSError(rc, f"TLS handshake: {os.strerror(rc)}")

    def peer_certificate(self):
        """The peer's verified certificate (DER) after ``handshake``; None on a plaintext connection."""
        cdef X509 *x
        cdef int n
        cdef unsigned char *p
        if self._ssl == NULL:
            return None
        x = SSL_get1_peer_certificate(self._ssl)
        if x == NULL:
            return None
        try:
            n = i2d_X509(x, NULL)
            if n <= 0:
                raise TlsError("the peer's certificate cannot be encoded")
            der = PyBytes_FromStringAndSize(NULL, n)
            p = <unsigned char *>PyBytes_AS_STRING(der)
            i2d_X509(x, &p)
            return der
        finally:
            X509_free(x)

    cdef int _write(self, const char *p, Py_ssize_t n, bint wait=True) except -1:
        # All of p to the peer (encrypted first, with a session), without the GIL, after whatever
        # an earlier write left unsent. Not ``wait``: only what the socket takes at once; returns 1
        # if some is left (plaintext in _unsent, TLS in the session's BIO) for a later write.
        cdef ssize_t r = 0
        cdef int err = 0
        cdef bint refused = False
        cdef int fd = self._fd
        cdef SSL *ssl = self._ssl
        cdef BIO *wbio = NULL
        cdef char *c = NULL
        cdef int flags = MSG_NOSIGNAL if wait else MSG_NOSIGNAL | MSG_DONTWAIT
        cdef bint held = False
        if ssl == NULL and not wait and n > <Py_ssize_t>sizeof(self._unsent) - self._nunsent:
            raise RuntimeError("more left unsent than a receiver keeps (64 bytes of acks): flush between runs")
        if ssl == NULL and self._nunsent:
            if not wait:
                memcpy(self._unsent + self._nunsent, p, <size_t>n)
                self._nunsent += n
                return 1
            self._send_unsent()
        with nogil:
            if ssl != NULL:
                wbio = SSL_get_wbio(ssl)
                ERR_clear_error()
                while n > 0:
                    r = SSL_write(ssl, p, <int>(n if n < (1 << 30) else (1 << 30)))
                    if r <= 0:
                        refused = True
                        break
                    p += r
                    n -= r
                n = 0 if refused else BIO_get_mem_data(wbio, &c)
                p = c
            while n > 0:
                r = send(fd, p, <size_t>n, flags)
                if r < 0:
                    err = errno
                    if err == EINTR:
                        continue
                    if not wait and err == EAGAIN:
                        held = True
                    break
                p += r
                n -= r
                if wbio != NULL:
                    _bio_skip(wbio, r)
        if refused:
            raise TlsError(f"TLS write failed: {_reason()}")
        if held:
            if ssl == NULL:
                memcpy(self._unsent, p, <size_t>n)
                self._nunsent = n
            return 1
        if n > 0:
            raise OSError(err, os.strerror(err))
        return 0

    cdef int _send_unsent(self) except -1:
        # Send _unsent whole, waiting (plaintext).
        cdef Py_ssize_t off = 0
        cdef Py_ssize_t n = self._nunsent
        cdef ssize_t r = 0
        cdef int err = 0
        cdef int fd = self._fd
        cdef char *b = self._unsent
        with nogil:
            while off < n:
                r = send(fd, b + off, <size_t>(n - off), MSG_NOSIGNAL)
                if r < 0:
                    err = errno
                    if err == EINTR:
                        continue
                    break
                off += r
        if off:
            memmove(self._unsent, self._unsent + off, <size_t>(n - off))
            self._nunsent = n - off
        if self._nunsent:
            raise OSError(err, os.strerror(err))
        return 0

    def flush(self):
        """Send, waiting, what ``ack(..., wait=False)`` left unsent (nothing to do: no system call)."""
        if self._ssl != NULL:
            if BIO_ctrl_pending(SSL_get_wbio(self._ssl)):
                self._write(NULL, 0)
        elif self._nunsent:
            self._write(NULL, 0)

    def send(self, bytes data not None):
        """Send ``data`` whole to the peer (an ERROR message), through the session if any."""
        self._write(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))

    def close(self):
        """Give back the memory held past the base buffer (idempotent)."""
        if self._buf != NULL and self._cap > RECV_CHUNK:
            if self._memory is not None:
                self._memory.give(self._cap - RECV_CHUNK)
            self._cap = RECV_CHUNK
        free(self._buf)
        self._buf = NULL
        self._len = 0
        self._cap = 0
        if self._ssl != NULL:
            SSL_free(self._ssl)
            self._ssl = NULL
        if self._io.rest != NULL:
            BIO_free(self._io.rest)
            self._io.rest = NULL

    cdef int _shrink(self) except -1:
        # Back to the base buffer once a large frame is consumed, and its memory back to the node.
        cdef unsigned char *nb
        if self._cap > RECV_CHUNK and self._len <= RECV_CHUNK // 2:
            nb = <unsigned char *>realloc(self._buf, <size_t>RECV_CHUNK)
            if nb == NULL:
                return 0  # keep the larger buffer (and its share of the budget)
            self._buf = nb
            if self._memory is not None:
                self._memory.give(self._cap - RECV_CHUNK)
            self._cap = RECV_CHUNK
        return 0

    cdef int _fill(self, Py_ssize_t need) except -1:
        # Block (without the GIL) until the peer sends more bytes or closes; grow to hold `need`,
        # and no more than it: the growth past the base buffer is taken from the node's budget.
        cdef Py_ssize_t cap = self._cap
        cdef unsigned char *nb
        cdef ssize_t r = 0
        cdef int fd = self._fd
        if self._buf == NULL:
            raise OSError(EBADF, "receiver is closed")
        if cap < need or cap - self._len < RECV_CHUNK // 4:
            cap = max(need, self._len + RECV_CHUNK)
            cap = (cap + 65535) & ~65535
        if cap != self._cap:
            if self._memory is not None:
                self._memory.take(cap - self._cap)
            nb = <unsigned char *>realloc(self._buf, <size_t>cap)
            if nb == NULL:
                if self._memory is not None:
                    self._memory.give(cap - self._cap)
                raise MemoryError()
            self._buf = nb
            self._cap = cap
        if self._ssl != NULL:
            return self._fill_tls()
        with nogil:
            while True:
                r = recv(fd, self._buf + self._len, <size_t>(self._cap - self._len), 0)
                if r >= 0 or errno != EINTR:
                    break
        if r < 0:
            raise OSError(errno, os.strerror(errno))
        if r == 0:
            self._eof = True
        self._len += r
        return 0

    cdef int _fill_tls(self) except -1:
        # Decrypt what has arrived, without the GIL: wait (SO_RCVTIMEO: EAGAIN) only while nothing
        # has, then take whatever else the socket holds already, as the plaintext path's one large
        # recv does, so that a run (one group commit) covers everything received. The session
        # reads the socket through the source BIO (_source_read), its read-ahead buffer TLS_RECV.
        cdef SSL *ssl = self._ssl
        cdef unsigned char *buf = self._buf + self._len
        cdef Py_ssize_t room = self._cap - self._len
        cdef Py_ssize_t got = 0
        cdef int k
        cdef int err = 0
        cdef bint eof = False
        cdef bint refused = False
        cdef rx_io_t *io = &self._io
        with nogil:
            ERR_clear_error()
            io.err = 0
            io.drained = False
            while got < room:
                io.block = got == 0
                k = SSL_read(ssl, buf + got, <int>(room - got if room - got < (1 << 30) else (1 << 30)))
                if k > 0:
                    got += k
                    if got < TLS_RECV and io.drained and not SSL_has_pending(ssl):
                        # A small run (a sync commit's) has all the socket held: another SSL_read
                        # would only find EAGAIN, a system call a commit where plaintext's one
                        # recv took it all. A larger one reads on while bytes come: decrypting
                        # takes long enough for more to arrive, and a larger run is a larger
                        # group commit.
                        break
                    continue
                k = SSL_get_error(ssl, k)
                if k == SSL_ERROR_ZERO_RETURN or (k == SSL_ERROR_SYSCALL and io.eof):
                    eof = True
                elif k == SSL_ERROR_WANT_READ:
                    err = io.err        # EAGAIN: nothing more there (or SO_RCVTIMEO passed)
                elif k == SSL_ERROR_SYSCALL and io.err:
                    err = io.err
                else:
                    refused = True
                break
        if got == 0:
            if refused:
                raise TlsError(f"TLS session failed: {_reason()}")
            if err:
                raise OSError(err, os.strerror(err))
        self._eof = eof and got == 0
        self._len += got
        return 0

    cdef void _consume(self, Py_ssize_t n) noexcept:
        if n:
            memmove(self._buf, self._buf + n, <size_t>(self._len - n))
            self._len -= n

    def hello(self):
        """The journal id the writer names, or None if it hung up first."""
        cdef const qjm_hello *h
        cdef Py_ssize_t size = sizeof(qjm_hello)
        cdef Py_ssize_t jlen = 0
        while True:
            if self._len >= size:
                h = <const qjm_hello *>self._buf
                jlen = h.journal_id_len
                if h.magic != QJM_HELLO_MAGIC or h.version != QJM_WIRE_VERSION:
                    raise CorruptFrameError(
                        f"bad data-plane hello {PyBytes_FromStringAndSize(<char *>self._buf, size)!r}",
                        reason="wire")
                if self._len >= size + jlen:
                    jid = PyBytes_FromStringAndSize(<char *>self._buf + size, jlen).decode(errors="replace")
                    self._consume(size + jlen)
                    return jid
            if self._eof:
                return None
            self._fill(size + jlen)

    cdef Py_ssize_t _message_at(self, Py_ssize_t pos, uint32_t *magic) except -1:
        # The whole length of the message at pos (4 bytes there), which may pass the buffer's end;
        # a frame's header counts until it is all there. Raises CorruptFrameError (a bad magic or
        # frame header) or ResourceExhaustedError (a frame past max_frame_bytes).
        cdef const unsigned char *p = self._buf + pos
        cdef Py_ssize_t flen
        magic[0] = _magic(p)
        if magic[0] == QJM_FRAME_MAGIC:
            if self._len - pos < QJM_FRAME_HEADER_SIZE:
                return QJM_FRAME_HEADER_SIZE
            flen = frame_length(p)
            if flen > self._max_frame:
                raise ResourceExhaustedError(
                    f"a frame of {flen} bytes is larger than this node takes ({self._max_frame} bytes, "
                    "max_frame_bytes)")
            return flen
        if magic[0] == QJM_COMMIT_MAGIC:
            return sizeof(qjm_commit)
        raise CorruptFrameError(
            f"unexpected data-plane message magic {PyBytes_FromStringAndSize(<const char *>p, 4)!r}",
            reason="magic", offset=0)

    def next_run(self):
        """Every complete frame and commit notice received so far, waiting for at least one.

        Returns ``(frames, commits)`` with ``commits`` as (epoch, txid) pairs, or None once the
        writer has hung up. A malformed message raises CorruptFrameError, after the messages
        before it have been returned.
        """
        cdef list frames = []
        cdef list commits = []
        cdef Py_ssize_t pos
        cdef Py_ssize_t need
        cdef Py_ssize_t n
        cdef const qjm_commit *c
        cdef uint32_t magic = 0
        while True:
            pos = 0
            need = 0
            try:
                while self._len - pos >= 4:
                    n = self._message_at(pos, &magic)
                    if self._len - pos < n:
                        need = pos + n
                        break
                    if magic == QJM_FRAME_MAGIC:
                        frames.append(PyBytes_FromStringAndSize(<const char *>self._buf + pos, n))
                    else:
                        c = <const qjm_commit *>(self._buf + pos)
                        commits.append((c.epoch, c.committed_txid))
                    pos += n
            except (CorruptFrameError, ResourceExhaustedError):
                self._consume(pos)
                if frames or commits:
                    return frames, commits
                raise
            self._consume(pos)
            if frames or commits:
                self._shrink()
                return frames, commits
            if self._eof:
                return None
            self._fill(need - pos)

    def wait_run(self):
        """Wait (the GIL released) until a whole message, or a malformed one, has been received;
        False once the writer has hung up without one. ``journal_run`` then takes what it can."""
        cdef Py_ssize_t need
        cdef uint32_t magic = 0
        while True:
            need = 4
            if self._len >= 4:
                try:
                    need = self._message_at(0, &magic)
                except (CorruptFrameError, ResourceExhaustedError):
                    return True  # for next_run to raise
            if self._len >= need:
                return True
            if self._eof:
                return False
            self._fill(need)

    def journal_run(self, WriteGate gate):
        """The messages received so far that ``gate`` passes, in order: frames staged, then written,
        fdatasynced and acked (not waiting, as ``ack(txid, False)``) in one sync; commit notices
        noted in the gate. Never waits for the socket. Returns 1 when it took every whole message,
        0 when it stopped at one the gate does not pass (or a malformed one), which ``next_run``
        then returns (or raises) for the journal's own checks. Called under the journal's lock."""
        cdef Py_ssize_t pos = 0
        cdef Py_ssize_t n
        cdef const qjm_commit *c
        cdef uint32_t magic = 0
        cdef int status = 1
        cdef int taken
        cdef double seconds
        cdef uint64_t durable
        try:
            while self._len - pos >= 4:
                try:
                    n = self._message_at(pos, &magic)
                except (CorruptFrameError, ResourceExhaustedError):
                    status = 0
                    break
                if self._len - pos < n:
                    break
                if magic == QJM_FRAME_MAGIC:
                    taken = gate.stage_at(self._buf + pos, n)
                else:
                    c = <const qjm_commit *>(self._buf + pos)
                    taken = gate.note_at(c.epoch, c.committed_txid)
                if not taken:
                    status = 0
                    break
                pos += n
        finally:
            self._consume(pos)
        durable = gate.staged_last()
        if durable:
            seconds = gate.write_durable()
            try:
                self._ack(durable, False)  # under the journal's lock: never waits
            finally:
                gate.fold(seconds)
        if status:
            self._shrink()
        return status

    @property
    def acked(self):
        """The highest txid acked on this connection (0: none)."""
        return self._acked

    def ack(self, unsigned long long txid, bint wait=True):
        """Tell the writer everything through ``txid`` is durable; True once all of it is sent.

        ``wait=False`` never blocks (a caller holding the journal's lock must not wait on a peer
        that does not read): what the socket does not take at once is sent by ``flush``, or before
        anything sent after it, and False says so; more than 64 bytes (four acks) left unsent over
        plaintext is refused (RuntimeError): flush between runs."""
        return self._ack(txid, wait) == 1

    cdef int _ack(self, uint64_t txid, bint wait) except -1:
        # ack(): 1 once all of it is sent, 0 when some waits for flush (not wait).
        cdef qjm_ack msg
        cdef const char *b = <const char *>&msg
        cdef Py_ssize_t off = 0
        cdef ssize_t r = 0
        cdef int fd = self._fd
        msg.magic = QJM_ACK_MAGIC
        msg.reserved = 0
        msg.txid = txid
        if txid > self._acked:
            self._acked = txid
        if self._ssl != NULL or self._nunsent or not wait:
            return 1 if self._write(b, sizeof(qjm_ack), wait) == 0 else 0
        with nogil:
            while off < <Py_ssize_t>sizeof(qjm_ack):
                r = send(fd, b + off, sizeof(qjm_ack) - <size_t>off, MSG_NOSIGNAL)
                if r < 0:
                    if errno == EINTR:
                        continue
                    break
                off += r
        if r < 0:
            raise OSError(errno, os.strerror(errno))
        return 1


def wire_layout():
    """Field offsets and sizes of the data-plane message headers, and the constants, from wire.h."""
    cdef qjm_hello h
    cdef qjm_commit c
    cdef qjm_ack a
    cdef qjm_error e
    cdef char *hb = <char *>&h
    cdef char *cb = <char *>&c
    cdef char *ab = <char *>&a
    cdef char *eb = <char *>&e
    return {
        "hello": {
            "magic": <char *>&h.magic - hb,
            "version": <char *>&h.version - hb,
            "journal_id_len": <char *>&h.journal_id_len - hb,
            "size": sizeof(qjm_hello),
        },
        "commit": {
            "magic": <char *>&c.magic - cb,
            "reserved": <char *>&c.reserved - cb,
            "epoch": <char *>&c.epoch - cb,
            "committed_txid": <char *>&c.committed_txid - cb,
            "size": sizeof(qjm_commit),
        },
        "ack": {
            "magic": <char *>&a.magic - ab,
            "reserved": <char *>&a.reserved - ab,
            "txid": <char *>&a.txid - ab,
            "size": sizeof(qjm_ack),
        },
        "error": {
            "magic": <char *>&e.magic - eb,
            "code_len": <char *>&e.code_len - eb,
            "reserved": <char *>&e.reserved - eb,
            "message_len": <char *>&e.message_len - eb,
            "durable_txid": <char *>&e.durable_txid - eb,
            "size": sizeof(qjm_error),
        },
        "constants": {
            "HELLO_MAGIC": QJM_HELLO_MAGIC,
            "COMMIT_MAGIC": QJM_COMMIT_MAGIC,
            "ACK_MAGIC": QJM_ACK_MAGIC,
            "ERROR_MAGIC": QJM_ERROR_MAGIC,
            "WIRE_VERSION": QJM_WIRE_VERSION,
            "MAX_ERROR_CODE": QJM_MAX_ERROR_CODE,
            "MAX_ERROR_TEXT": QJM_MAX_ERROR_TEXT,
        },
    }
