/*
 * netfloor: the lowest latency of a 2-of-3 durable commit on this machine, with and without the
 * network hop, no protocol at all.
 *
 *   netfloor local     DIR ROUNDS   three threads, one file each, commit = 2nd fdatasync to return
 *   netfloor net       DIR ROUNDS   writer + 3 forked receivers on loopback TCP, commit = 2nd ack
 *   netfloor netnosync DIR ROUNDS   as net, receivers write but skip the fdatasync
 *   netfloor netnodisk DIR ROUNDS   as net, receivers neither write nor fdatasync (network only)
 *   netfloor serve     DIR ROUNDS   net's receivers alone, for a writer of another process
 *
 * The disk code is the same in every mode and follows the node appender's pattern
 * (src/qjm/_native/segment_io_c.pyx): O_DIRECT (buffered if refused), preallocated by writing
 * zeros in 4 MiB steps ahead of the write position, records appended back to back, each append
 * rewriting the partial last 4 KiB block from an aligned buffer holding the tail, then fdatasync.
 * (The appender also has an io_uring path linking the write to the fdatasync; this uses pwrite.)
 *
 * Output: one JSON line on stdout. The first WARMUP rounds are not counted.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WARMUP 200
#define BLOCK 4096
#define PREALLOC_STEP (4L * 1024 * 1024)
#define ZBUF (1024 * 1024)
#define FILE_HEADER 64
#define MSG_HEADER 64
#define PAYLOAD 1024
#define MSG_SIZE (MSG_HEADER + PAYLOAD) /* 1,088 bytes: what is sent and what is written */
#define ACK_SIZE 16
#define MAGIC 0x514a4d4eu /* "QJMN" */
#define BUF_CAP (64 * 1024)

/* ---------------------------------------------------------------- errors, time, helpers ---- */

static void die(const char *what, int err)
{
    fprintf(stderr, "netfloor[%d]: %s: %s\n", (int)getpid(), what, strerror(err));
    exit(1);
}

static void die_msg(const char *what)
{
    fprintf(stderr, "netfloor[%d]: %s\n", (int)getpid(), what);
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        die("clock_gettime", errno);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static off_t up(off_t n, off_t step) { return (n + step - 1) / step * step; }
static off_t down(off_t n, off_t step) { return n / step * step; }

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void fill_random(unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("getrandom", errno);
        }
        p += r;
        n -= (size_t)r;
    }
}

/* All of buf to a pipe (write) or a socket (send, no SIGPIPE), retried on EINTR; dies on error. */
static void out_all(int fd, const void *buf, size_t n, int sock, const char *what)
{
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = sock ? send(fd, p, n, MSG_NOSIGNAL) : write(fd, p, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die(what, errno);
        }
        p += r;
        n -= (size_t)r;
    }
}

static void write_all(int fd, const void *buf, size_t n, const char *what) { out_all(fd, buf, n, 0, what); }
static void send_all(int fd, const void *buf, size_t n, const char *what) { out_all(fd, buf, n, 1, what); }

/* 1 on success, 0 on EOF before the first byte; dies on error or EOF mid-message. */
static int recv_all(int fd, void *buf, size_t n, const char *what)
{
    unsigned char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, p + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die(what, errno);
        }
        if (r == 0) {
            if (got == 0)
                return 0;
            die_msg("unexpected EOF in the middle of a message");
        }
        got += (size_t)r;
    }
    return 1;
}

/* One read from a pipe, retried on EINTR; the caller checks the length it got. */
static ssize_t read_pipe(int fd, void *buf, size_t n, const char *what)
{
    ssize_t r;
    do
        r = read(fd, buf, n);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        die(what, errno);
    return r;
}

/* A TCP socket and the address 127.0.0.1:port (0: any port, to bind). */
static int loopback_socket(struct sockaddr_in *sa, uint16_t port)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        die("socket", errno);
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa->sin_port = htons(port);
    return s;
}

static void set_nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        die("setsockopt(TCP_NODELAY)", errno);
}

/* ------------------------------------------------------------------------ the appender ---- */

static unsigned char *zeros; /* ZBUF aligned zero bytes, for preallocation */

struct appender {
    int fd;
    int direct;          /* O_DIRECT in effect */
    unsigned char *buf;  /* BLOCK aligned; holds the file from `base` to `size` */
    off_t base;          /* file offset of buf[0], a multiple of BLOCK */
    off_t size;          /* logical end: where the next record goes */
    off_t alloc;         /* zeros written (and made durable) up to here */
    long extends;        /* appends that had to preallocate more first */
    const char *path;
};

static int pwrite_all(int fd, const unsigned char *p, size_t n, off_t off)
{
    while (n > 0) {
        ssize_t r = pwrite(fd, p, n, off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (r == 0)
            return EIO;
        p += r;
        off += r;
        n -= (size_t)r;
    }
    return 0;
}

static void datasync(struct appender *a)
{
    while (fdatasync(a->fd) != 0) {
        if (errno != EINTR)
            die("fdatasync", errno);
    }
}

/* A pwrite that drops O_DIRECT once if the filesystem took it at open but refuses the write. */
static void app_pwrite(struct appender *a, const unsigned char *p, size_t n, off_t off)
{
    int err = pwrite_all(a->fd, p, n, off);
    if (err == EINVAL && a->direct) {
        int fl = fcntl(a->fd, F_GETFL);
        if (fl < 0)
            die("fcntl(F_GETFL)", errno);
        if (fcntl(a->fd, F_SETFL, fl & ~O_DIRECT) != 0)
            die("fcntl(F_SETFL)", errno);
        a->direct = 0;
        fprintf(stderr, "netfloor: %s: O_DIRECT write refused, buffered I/O\n", a->path);
        err = pwrite_all(a->fd, p, n, off);
    }
    if (err)
        die("pwrite", err);
}

/* Preallocate (zeros) up to at least `end`, in PREALLOC_STEP steps; not synced here. */
static int prealloc_to(struct appender *a, off_t end)
{
    if (end <= a->alloc)
        return 0;
    off_t target = up(end, PREALLOC_STEP);
    for (off_t o = a->alloc; o < target;) {
        size_t n = (size_t)(target - o < ZBUF ? target - o : ZBUF);
        app_pwrite(a, zeros, n, o);
        o += (off_t)n;
    }
    a->alloc = target;
    return 1;
}

static void app_open(struct appender *a, const char *path)
{
    memset(a, 0, sizeof *a);
    a->path = path;
    int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
    a->fd = open(path, flags | O_DIRECT, 0600);
    a->direct = 1;
    if (a->fd < 0 && errno == EINVAL) {
        fprintf(stderr, "netfloor: %s: O_DIRECT refused at open, buffered I/O\n", path);
        a->fd = open(path, flags, 0600);
        a->direct = 0;
    }
    if (a->fd < 0)
        die(path, errno);
    int err = posix_memalign((void **)&a->buf, BLOCK, BUF_CAP);
    if (err)
        die("posix_memalign", err);
    memset(a->buf, 0, BUF_CAP);
    /* The first step of zeros and the file header, made durable before any timed round. */
    prealloc_to(a, PREALLOC_STEP);
    memset(a->buf, 0xAB, FILE_HEADER);
    put_u32(a->buf, MAGIC);
    a->size = FILE_HEADER;
    app_pwrite(a, a->buf, BLOCK, 0);
    datasync(a);
}

/* Append one record and make it durable: the aligned block(s) covering [down(size), size+len). */
static void app_append(struct appender *a, const unsigned char *rec, size_t len, int sync)
{
    if ((off_t)len + (a->size - a->base) + BLOCK > BUF_CAP)
        die_msg("record too large for the staging buffer");
    memcpy(a->buf + (a->size - a->base), rec, len);
    a->size += (off_t)len;
    off_t wend = up(a->size, BLOCK);
    memset(a->buf + (a->size - a->base), 0, (size_t)(wend - a->size));
    /* Keep the zeros ahead of the data, so fdatasync never has size or extents to commit; the
     * rare append that crosses the preallocated end extends it first (counted: `extends`). */
    if (prealloc_to(a, wend))
        a->extends++;
    app_pwrite(a, a->buf, (size_t)(wend - a->base), a->base);
    if (sync)
        datasync(a);
    off_t keep = down(a->size, BLOCK);
    if (keep > a->base) {
        memmove(a->buf, a->buf + (keep - a->base), (size_t)(a->size - keep));
        a->base = keep;
    }
}

static void app_close(struct appender *a)
{
    if (close(a->fd) != 0)
        die("close", errno);
    free(a->buf);
}

/* ----------------------------------------------------------------------------- results ---- */

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

static double pct_us(const uint64_t *sorted, long n, double p)
{
    long i = (long)((double)n * p);
    if (i > n - 1)
        i = n - 1;
    return (double)sorted[i] / 1000.0;
}

static void report(const char *mode, uint64_t *lat, long rounds, int direct, long extends)
{
    long n = rounds - WARMUP;
    qsort(lat + WARMUP, (size_t)n, sizeof *lat, cmp_u64);
    const uint64_t *s = lat + WARMUP;
    printf("{\"mode\":\"%s\",\"rounds\":%ld,\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,"
           "\"max_us\":%.1f,\"o_direct\":%s,\"extends\":%ld}\n",
           mode, n, pct_us(s, n, 0.50), pct_us(s, n, 0.90), pct_us(s, n, 0.99),
           (double)s[n - 1] / 1000.0, direct ? "true" : "false", extends);
    if (fflush(stdout) != 0)
        die("stdout", errno);
}

/* --------------------------------------------------------------------------- the record ---- */

static unsigned char message[MSG_SIZE]; /* random, fixed per run; header carries the round */

static void init_message(void)
{
    fill_random(message, sizeof message);
    put_u32(message, MSG_SIZE); /* the length prefix */
    put_u32(message + 4, MAGIC);
}

static void set_round(unsigned char *msg, uint64_t round) { put_u64(msg + 8, round); }

/* ------------------------------------------------------------------------------- local ---- */

struct local_ctx {
    const char *dir;
    long rounds;
    pthread_barrier_t barrier;
    uint64_t *lat[3];
    int direct[3];
    long extends[3];
};

struct local_arg {
    struct local_ctx *c;
    int i;
};

static void *local_thread(void *p)
{
    struct local_arg *arg = p;
    struct local_ctx *c = arg->c;
    char path[4096];
    struct appender a;
    unsigned char msg[MSG_SIZE];
    memcpy(msg, message, sizeof msg);
    snprintf(path, sizeof path, "%s/local-%d", c->dir, arg->i);
    app_open(&a, path);
    for (long r = 0; r < c->rounds; r++) {
        int e = pthread_barrier_wait(&c->barrier);
        if (e != 0 && e != PTHREAD_BARRIER_SERIAL_THREAD)
            die("pthread_barrier_wait", e);
        uint64_t t0 = now_ns();
        set_round(msg, (uint64_t)r);
        app_append(&a, msg, sizeof msg, 1);
        c->lat[arg->i][r] = now_ns() - t0;
    }
    c->direct[arg->i] = a.direct;
    c->extends[arg->i] = a.extends;
    app_close(&a);
    return NULL;
}

static void run_local(const char *dir, long rounds)
{
    struct local_ctx c;
    memset(&c, 0, sizeof c);
    c.dir = dir;
    c.rounds = rounds;
    int e = pthread_barrier_init(&c.barrier, NULL, 3);
    if (e)
        die("pthread_barrier_init", e);
    for (int i = 0; i < 3; i++) {
        c.lat[i] = calloc((size_t)rounds, sizeof(uint64_t));
        if (!c.lat[i])
            die("calloc", errno);
    }
    pthread_t th[3];
    struct local_arg args[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (struct local_arg){&c, i};
        e = pthread_create(&th[i], NULL, local_thread, &args[i]);
        if (e)
            die("pthread_create", e);
    }
    for (int i = 0; i < 3; i++) {
        e = pthread_join(th[i], NULL);
        if (e)
            die("pthread_join", e);
    }
    pthread_barrier_destroy(&c.barrier);
    uint64_t *lat = calloc((size_t)rounds, sizeof(uint64_t));
    if (!lat)
        die("calloc", errno);
    for (long r = 0; r < rounds; r++) {
        uint64_t v[3] = {c.lat[0][r], c.lat[1][r], c.lat[2][r]};
        qsort(v, 3, sizeof v[0], cmp_u64);
        lat[r] = v[1];
    }
    report("local", lat, rounds, c.direct[0] && c.direct[1] && c.direct[2],
           c.extends[0] + c.extends[1] + c.extends[2]);
    for (int i = 0; i < 3; i++)
        free(c.lat[i]);
    free(lat);
}

/* --------------------------------------------------------------------------------- net ---- */

enum disk_mode { DISK_SYNC, DISK_NOSYNC, DISK_NONE };

struct ready {      /* receiver -> writer through the pipe, one write each (< PIPE_BUF) */
    int32_t index;
    int32_t port;
    int32_t direct;
};

struct ready_done { /* receiver -> writer at exit, through a second pipe */
    int32_t index;
    int32_t direct;
    int64_t extends;
    int64_t messages;
};

static void receiver(int index, const char *dir, enum disk_mode dm, int ready_fd, int done_fd)
{
    char path[4096];
    struct appender a;
    int have_file = dm != DISK_NONE;
    if (have_file) {
        snprintf(path, sizeof path, "%s/net-%d", dir, index);
        app_open(&a, path);
    }
    struct sockaddr_in sa;
    int ls = loopback_socket(&sa, 0);
    if (bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0)
        die("bind", errno);
    if (listen(ls, 1) != 0)
        die("listen", errno);
    socklen_t sl = sizeof sa;
    if (getsockname(ls, (struct sockaddr *)&sa, &sl) != 0)
        die("getsockname", errno);
    struct ready rd = {index, ntohs(sa.sin_port), have_file ? a.direct : 1};
    write_all(ready_fd, &rd, sizeof rd, "write(ready pipe)");
    if (close(ready_fd) != 0)
        die("close(ready pipe)", errno);
    int s;
    for (;;) {
        s = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (s >= 0)
            break;
        if (errno != EINTR)
            die("accept", errno);
    }
    if (close(ls) != 0)
        die("close(listener)", errno);
    set_nodelay(s);

    unsigned char msg[MSG_SIZE];
    unsigned char ack[ACK_SIZE];
    int64_t messages = 0;
    while (recv_all(s, msg, MSG_HEADER, "recv")) {
        uint32_t len = get_u32(msg);
        if (len != MSG_SIZE || get_u32(msg + 4) != MAGIC)
            die_msg("bad message header");
        if (!recv_all(s, msg + MSG_HEADER, len - MSG_HEADER, "recv"))
            die_msg("unexpected EOF in the middle of a message");
        if (have_file)
            app_append(&a, msg, len, dm == DISK_SYNC);
        put_u64(ack, get_u64(msg + 8));     /* the round */
        put_u64(ack + 8, (uint64_t)index);  /* 8 more bytes: who acks */
        send_all(s, ack, sizeof ack, "send(ack)");
        messages++;
    }
    struct ready_done dn = {index, have_file ? a.direct : 1, have_file ? a.extends : 0, messages};
    write_all(done_fd, &dn, sizeof dn, "write(done pipe)");
    if (have_file)
        app_close(&a);
    if (close(s) != 0)
        die("close(socket)", errno);
    exit(0);
}

struct conn {
    int fd;
    unsigned char ack[ACK_SIZE];
    size_t have;        /* bytes of a partial ack */
    uint64_t next;      /* the round this receiver's next ack must carry */
};

/* Read whatever acks are there (non-blocking); counts those for `round` in *got. */
static void drain_acks(struct conn *c, uint64_t round, int *got)
{
    for (;;) {
        ssize_t r = recv(c->fd, c->ack + c->have, ACK_SIZE - c->have, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            die("recv(ack)", errno);
        }
        if (r == 0)
            die_msg("a receiver closed its connection early");
        c->have += (size_t)r;
        if (c->have < ACK_SIZE)
            continue;
        c->have = 0;
        uint64_t ar = get_u64(c->ack);
        /* Acks arrive in order per receiver: anything else is a bug, not a late ack. */
        if (ar != c->next)
            die_msg("ack out of order");
        c->next++;
        if (ar == round)
            (*got)++;
        /* else: a late ack of an earlier round (the third receiver's): drained, not counted */
    }
}

/* One epoll_wait (blocking), then the acks of every connection it names. */
static void poll_acks(int ep, struct conn *conns, uint64_t round, int *got)
{
    struct epoll_event evs[3];
    int n = epoll_wait(ep, evs, 3, -1);
    if (n < 0) {
        if (errno == EINTR)
            return;
        die("epoll_wait", errno);
    }
    for (int k = 0; k < n; k++)
        drain_acks(&conns[evs[k].data.u32], round, got);
}

/* Fork the three receivers; each one's listening port in ports[index]. Returns the read end of
 * the pipe each writes to when it finishes (reap_receivers reads it). */
static int spawn_receivers(const char *dir, enum disk_mode dm, pid_t pids[3], int ports[3], int *direct)
{
    int ready[2], done[2];
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(done, O_CLOEXEC) != 0)
        die("pipe2", errno);
    if (fflush(stdout) != 0)
        die("fflush", errno);
    for (int i = 0; i < 3; i++) {
        pids[i] = fork();
        if (pids[i] < 0)
            die("fork", errno);
        if (pids[i] == 0) {
            if (close(ready[0]) != 0 || close(done[0]) != 0)
                die("close(pipe)", errno);
            receiver(i, dir, dm, ready[1], done[1]);
        }
    }
    if (close(ready[1]) != 0 || close(done[1]) != 0)
        die("close(pipe)", errno);
    *direct = 1;
    for (int k = 0; k < 3; k++) {
        struct ready rd;
        ssize_t r = read_pipe(ready[0], &rd, sizeof rd, "read(ready pipe)");
        if (r != (ssize_t)sizeof rd || rd.index < 0 || rd.index > 2)
            die_msg("a receiver failed to start");
        *direct = *direct && rd.direct;
        ports[rd.index] = rd.port;
    }
    if (close(ready[0]) != 0)
        die("close(ready pipe)", errno);
    return done[0];
}

/* Wait for the three receivers to finish, each having seen `rounds` messages; their appends'
 * O_DIRECT and file extensions are folded into *direct and *extends. */
static void reap_receivers(const pid_t pids[3], int done_fd, long rounds, int *direct, long *extends)
{
    for (int k = 0; k < 3; k++) {
        struct ready_done dn;
        ssize_t r = read_pipe(done_fd, &dn, sizeof dn, "read(done pipe)");
        if (r != (ssize_t)sizeof dn)
            die_msg("a receiver did not finish cleanly");
        if (dn.messages != rounds)
            die_msg("a receiver saw a different number of messages");
        *direct = *direct && dn.direct;
        *extends += (long)dn.extends;
    }
    for (int i = 0; i < 3; i++) {
        int st;
        pid_t w;
        do
            w = waitpid(pids[i], &st, 0);
        while (w < 0 && errno == EINTR);
        if (w < 0)
            die("waitpid", errno);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            die_msg("a receiver exited with an error");
    }
    if (close(done_fd) != 0)
        die("close(done pipe)", errno);
}

static void run_net(const char *mode, const char *dir, long rounds, enum disk_mode dm)
{
    pid_t pids[3];
    int ports[3], direct;
    int done_fd = spawn_receivers(dir, dm, pids, ports, &direct);
    struct conn conns[3];
    for (int i = 0; i < 3; i++) {
        struct sockaddr_in sa;
        int s = loopback_socket(&sa, (uint16_t)ports[i]);
        if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0)
            die("connect", errno);
        set_nodelay(s);
        conns[i] = (struct conn){.fd = s, .have = 0, .next = 0};
    }

    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1", errno);
    for (int i = 0; i < 3; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &ev) != 0)
            die("epoll_ctl", errno);
    }

    uint64_t *lat = calloc((size_t)rounds, sizeof(uint64_t));
    if (!lat)
        die("calloc", errno);
    unsigned char msg[MSG_SIZE];
    memcpy(msg, message, sizeof msg);
    for (long r = 0; r < rounds; r++) {
        uint64_t t0 = now_ns();
        set_round(msg, (uint64_t)r);
        for (int i = 0; i < 3; i++)
            send_all(conns[i].fd, msg, sizeof msg, "send");
        int got = 0;
        while (got < 2)
            poll_acks(ep, conns, (uint64_t)r, &got);
        lat[r] = now_ns() - t0;
    }
    /* Every receiver must have acked every round: wait for the stragglers, then say EOF. */
    for (int i = 0; i < 3; i++) {
        while (conns[i].next < (uint64_t)rounds) {
            int dummy = 0;
            poll_acks(ep, conns, UINT64_MAX, &dummy);
        }
    }
    for (int i = 0; i < 3; i++)
        if (shutdown(conns[i].fd, SHUT_WR) != 0)
            die("shutdown", errno);
    long extends = 0;
    reap_receivers(pids, done_fd, rounds, &direct, &extends);
    for (int i = 0; i < 3; i++)
        if (close(conns[i].fd) != 0)
            die("close(socket)", errno);
    if (close(ep) != 0)
        die("close", errno);
    report(mode, lat, rounds, dm == DISK_NONE ? 0 : direct, extends);
    free(lat);
}

/* The receivers alone, for a writer of another process (bench/gap_ladder.py's Python writer): one
 * line {"ports":[...]} on stdout once they listen, then, when each has seen `rounds` messages and
 * its connection's end, one line {"mode":"serve","direct":...,"extends":...}. A message is this
 * program's: a 64-byte header (length 1088 and "QJMN" as little-endian u32s, the round as a u64),
 * then 1,024 bytes; each is acked with 16 bytes (the round, the receiver's index). */
static void run_serve(const char *dir, long rounds)
{
    pid_t pids[3];
    int ports[3], direct;
    int done_fd = spawn_receivers(dir, DISK_SYNC, pids, ports, &direct);
    printf("{\"ports\":[%d,%d,%d]}\n", ports[0], ports[1], ports[2]);
    if (fflush(stdout) != 0)
        die("fflush", errno);
    long extends = 0;
    reap_receivers(pids, done_fd, rounds, &direct, &extends);
    printf("{\"mode\":\"serve\",\"direct\":%d,\"extends\":%ld}\n", direct, extends);
}

/* -------------------------------------------------------------------------------- main ---- */

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s local|net|netnosync|netnodisk|serve DIR ROUNDS\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1], *dir = argv[2];
    char *end;
    errno = 0;
    long rounds = strtol(argv[3], &end, 10);
    if (errno || *end || rounds <= WARMUP || rounds > 100000000L) {
        fprintf(stderr, "netfloor: ROUNDS must be an integer > %d\n", WARMUP);
        return 2;
    }
    struct stat st;
    if (stat(dir, &st) != 0)
        die(dir, errno);
    if (!S_ISDIR(st.st_mode))
        die(dir, ENOTDIR);
    int err = posix_memalign((void **)&zeros, BLOCK, ZBUF);
    if (err)
        die("posix_memalign", err);
    memset(zeros, 0, ZBUF);
    init_message();
    if (strcmp(mode, "local") == 0)
        run_local(dir, rounds);
    else if (strcmp(mode, "net") == 0)
        run_net(mode, dir, rounds, DISK_SYNC);
    else if (strcmp(mode, "serve") == 0)
        run_serve(dir, rounds);
    else if (strcmp(mode, "netnosync") == 0)
        run_net(mode, dir, rounds, DISK_NOSYNC);
    else if (strcmp(mode, "netnodisk") == 0)
        run_net(mode, dir, rounds, DISK_NONE);
    else {
        fprintf(stderr, "netfloor: unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
