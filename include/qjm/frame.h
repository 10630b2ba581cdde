/* qjm on-disk and on-wire layout: the one declaration (design.md §1).
 *
 * Everything is little-endian. A segment file is one segment header followed
 * by frames; a frame is one header followed by `payload_len` payload bytes.
 * The payload is `record_count` records, each a u32 length and that many
 * bytes; txids are implicit: first_txid, first_txid + 1, ...
 *
 * src/qjm/protocol/frame.py mirrors this file; tests/unit/test_frame_layout.py
 * checks the two agree (offsets reported by the native module).
 */
#ifndef QJM_FRAME_H
#define QJM_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define QJM_FRAME_MAGIC 0x464d4a51u   /* "QJMF" read as little-endian u32 */
#define QJM_SEGMENT_MAGIC 0x534d4a51u /* "QJMS" */
#define QJM_FORMAT_VERSION 1u

#define QJM_FRAME_HEADER_SIZE 64u
#define QJM_SEGMENT_HEADER_SIZE 64u
#define QJM_RECORD_PREFIX_SIZE 4u
/* Bytes of the frame header covered by header_xxh3 (all but the checksum). */
#define QJM_FRAME_HEADER_CHECKED 56u
#define QJM_SEGMENT_HEADER_CHECKED 56u

/* Refuse anything larger: a corrupt length must not make a node allocate GiBs. */
#define QJM_MAX_PAYLOAD (64u * 1024u * 1024u)
#define QJM_MAX_RECORDS (16u * 1024u * 1024u)

#pragma pack(push, 1)
typedef struct qjm_frame_header {
    uint32_t magic;        /*  0 QJM_FRAME_MAGIC */
    uint16_t version;      /*  4 QJM_FORMAT_VERSION */
    uint16_t flags;        /*  6 reserved, 0 */
    uint32_t record_count; /*  8 >= 1 */
    uint32_t payload_len;  /* 12 bytes after the header */
    uint64_t epoch;        /* 16 writer epoch that framed the batch */
    uint64_t segment_txid; /* 24 first txid of the segment the batch belongs to */
    uint64_t first_txid;   /* 32 txid of the first record */
    uint64_t payload_xxh3; /* 40 XXH3_64bits(payload) */
    uint64_t reserved;     /* 48 0 */
    uint64_t header_xxh3;  /* 56 XXH3_64bits(bytes 0..55 of this header) */
} qjm_frame_header;

typedef struct qjm_segment_header {
    uint32_t magic;        /*  0 QJM_SEGMENT_MAGIC */
    uint16_t version;      /*  4 QJM_FORMAT_VERSION */
    uint16_t flags;        /*  6 reserved, 0 */
    uint64_t start_txid;   /*  8 first txid of the segment */
    uint64_t epoch;        /* 16 writer epoch that started it */
    uint8_t  reserved[32]; /* 24 zeros */
    uint64_t header_xxh3;  /* 56 XXH3_64bits(bytes 0..55) */
} qjm_segment_header;
#pragma pack(pop)

_Static_assert(sizeof(qjm_frame_header) == QJM_FRAME_HEADER_SIZE, "frame header size");
_Static_assert(sizeof(qjm_segment_header) == QJM_SEGMENT_HEADER_SIZE, "segment header size");
_Static_assert(offsetof(qjm_frame_header, header_xxh3) == QJM_FRAME_HEADER_CHECKED, "frame checksum offset");
_Static_assert(offsetof(qjm_segment_header, header_xxh3) == QJM_SEGMENT_HEADER_CHECKED, "segment checksum offset");

#endif
