/* What one TLS record costs libssl, apart from the bytes it carries: a client session encrypts
 * records of SIZE bytes into a memory BIO and a server session decrypts them, TLS 1.3 with the
 * cipher suite qjm's data plane offers first, and each call is timed alone. With THRASH = 1 an
 * 8 MiB walk runs before every call, as the other processes of a commit (the writer, three nodes,
 * two cores) leave the caches between one commit's records and the next.
 *
 *   gcc -O2 bench/tls_record.c -o /tmp/tls_record -lssl -lcrypto
 *   openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=x \
 *       -keyout /tmp/k.pem -out /tmp/c.pem
 *   /tmp/tls_record /tmp/c.pem /tmp/k.pem SIZE THRASH [SUITE]
 *
 * docs/performance.md (172fc8f) gives what it printed. */
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pump(BIO *from, BIO *to) {
    char buf[65536];
    int n;
    while ((n = BIO_read(from, buf, sizeof buf)) > 0)
        BIO_write(to, buf, n);
}

static void walk(volatile char *big, size_t n) {
    for (size_t j = 0; j < n; j += 64)
        big[j]++;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s CERT KEY SIZE THRASH [SUITE]\n", argv[0]);
        return 2;
    }
    int size = atoi(argv[3]), thrash = atoi(argv[4]);
    const char *suite = argc > 5 ? argv[5] : "TLS_AES_128_GCM_SHA256";
    if (size <= 0 || size > 16384) {
        fprintf(stderr, "SIZE must be 1..16384 (one record)\n");
        return 2;
    }
    SSL_CTX *sc = SSL_CTX_new(TLS_server_method()), *cc = SSL_CTX_new(TLS_client_method());
    if (SSL_CTX_use_certificate_file(sc, argv[1], SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_use_PrivateKey_file(sc, argv[2], SSL_FILETYPE_PEM) != 1) {
        ERR_print_errors_fp(stderr);
        return 1;
    }
    SSL_CTX_set_min_proto_version(sc, TLS1_3_VERSION);
    SSL_CTX_set_min_proto_version(cc, TLS1_3_VERSION);
    SSL_CTX_set_ciphersuites(sc, suite);
    SSL_CTX_set_ciphersuites(cc, suite);
    SSL_CTX_set_num_tickets(sc, 0);
    SSL *s = SSL_new(sc), *c = SSL_new(cc);
    BIO *s_in = BIO_new(BIO_s_mem()), *s_out = BIO_new(BIO_s_mem());
    BIO *c_in = BIO_new(BIO_s_mem()), *c_out = BIO_new(BIO_s_mem());
    SSL_set_bio(s, s_in, s_out);
    SSL_set_bio(c, c_in, c_out);
    SSL_set_accept_state(s);
    SSL_set_connect_state(c);
    for (int i = 0; i < 10 && !(SSL_is_init_finished(c) && SSL_is_init_finished(s)); i++) {
        SSL_do_handshake(c);
        pump(c_out, s_in);
        SSL_do_handshake(s);
        pump(s_out, c_in);
    }
    if (!SSL_is_init_finished(c) || !SSL_is_init_finished(s)) {
        fprintf(stderr, "the handshake did not finish\n");
        ERR_print_errors_fp(stderr);
        return 1;
    }
    const size_t bign = 8 << 20;
    char *msg = malloc(size), *big = calloc(bign, 1);
    static char got[16384];
    memset(msg, 7, size);
    const int rounds = 20000;
    double tw = 0, tr = 0;
    for (int i = 0; i < rounds; i++) {
        if (thrash)
            walk(big, bign);
        double t0 = now();
        int w = SSL_write(c, msg, size);
        double t1 = now();
        pump(c_out, s_in);
        if (thrash)
            walk(big, bign);
        double t2 = now();
        int r = SSL_read(s, got, sizeof got);
        double t3 = now();
        if (w != size || r != size) {
            fprintf(stderr, "round %d: wrote %d, read %d\n", i, w, r);
            return 1;
        }
        tw += t1 - t0;
        tr += t3 - t2;
    }
    printf("%s, %d-byte records, %s: SSL_write %.2f us, SSL_read %.2f us\n", suite, size,
           thrash ? "caches walked before each call" : "warm", tw / rounds * 1e6, tr / rounds * 1e6);
    return 0;
}
