/* qjm data-plane messages other than frames: the one declaration.
 *
 * A writer opens one TCP connection per node and sends a hello (which
 * journal: the header, then journal_id_len bytes of the id), then frames
 * (include/qjm/frame.h, sent as they will be stored) and commit notices,
 * pipelined. The node answers cumulatively with acks ("durable through txid
 * N") or, once, with an error (the header, then code_len bytes of its code
 * and message_len bytes of its text) and closes. Every message starts with a
 * 4-byte magic so a confused peer is detected at once. Little-endian.
 *
 * src/qjm/protocol/wire.py declares the same layout for Python;
 * tests/unit/test_wire_layout.py checks the two agree (offsets reported by
 * the native data plane, fanout_c.wire_layout()).
 */
#ifndef QJM_WIRE_H
#define QJM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define QJM_HELLO_MAGIC 0x484d4a51u  /* "QJMH" read as little-endian u32 */
#define QJM_COMMIT_MAGIC 0x434d4a51u /* "QJMC" */
#define QJM_ACK_MAGIC 0x414d4a51u    /* "QJMA" */
#define QJM_ERROR_MAGIC 0x454d4a51u  /* "QJME" */
#define QJM_WIRE_VERSION 1u

/* A node truncates its error code and text to these; a writer refuses a longer text. */
#define QJM_MAX_ERROR_CODE 255u
#define QJM_MAX_ERROR_TEXT (64u * 1024u)

#pragma pack(push, 1)
typedef struct qjm_hello {
    uint32_t magic;          /* 0 QJM_HELLO_MAGIC */
    uint16_t version;        /* 4 QJM_WIRE_VERSION */
    uint16_t journal_id_len; /* 6 bytes of the journal id after the header */
} qjm_hello;

typedef struct qjm_commit {
    uint32_t magic;         /*  0 QJM_COMMIT_MAGIC */
    uint32_t reserved;      /*  4 0 */
    uint64_t epoch;         /*  8 the writer's epoch */
    int64_t committed_txid; /* 16 a quorum holds everything through this txid */
} qjm_commit;

typedef struct qjm_ack {
    uint32_t magic;    /* 0 QJM_ACK_MAGIC */
    uint32_t reserved; /* 4 0 */
    uint64_t txid;     /* 8 durable on this node through this txid */
} qjm_ack;

typedef struct qjm_error {
    uint32_t magic;       /*  0 QJM_ERROR_MAGIC */
    uint16_t code_len;    /*  4 <= QJM_MAX_ERROR_CODE */
    uint16_t reserved;    /*  6 0 */
    uint32_t message_len; /*  8 <= QJM_MAX_ERROR_TEXT */
    int64_t durable_txid; /* 12 durable on this node through this txid despite the error */
} qjm_error;
#pragma pack(pop)

_Static_assert(sizeof(qjm_hello) == 8, "hello size");
_Static_assert(sizeof(qjm_commit) == 24, "commit size");
_Static_assert(sizeof(qjm_ack) == 16, "ack size");
_Static_assert(sizeof(qjm_error) == 20, "error size");

#endif
