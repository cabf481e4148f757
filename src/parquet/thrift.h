/*
 * thrift.h: the Thrift compact protocol as Parquet uses it (footer
 * FileMetaData and page headers). This header holds the wire type codes
 * shared by the encoder and the decoder, and the decoder (thrift_read.c).
 *
 * Decoder invariants:
 *  - It reads from one bounded byte range and never past its end; every
 *    length and count is checked against the bytes that remain before it
 *    is used (a list of n elements needs at least n bytes, since every
 *    element type takes at least one byte on the wire).
 *  - Errors are sticky: the first failure sets `err` (and the thread-local
 *    message, naming `what`), moves the cursor to the end, and every later
 *    read returns zero/empty. Callers decode a whole struct and check
 *    `err` once at the end, which keeps the field loops short.
 *  - Struct nesting (including generic skipping of unknown fields, which
 *    recurses through structs, lists, sets and maps) is limited to
 *    VF_PQ_THRIFT_MAX_DEPTH levels, so a nesting bomb fails cleanly.
 */
#ifndef VF_PQ_THRIFT_H
#define VF_PQ_THRIFT_H

#include "base/base.h"

/* Compact protocol type codes (field headers and list element types). */
enum {
    VF_TC_STOP = 0,
    VF_TC_TRUE = 1,  /* BOOLEAN_TRUE in a field header; BOOL as list element type */
    VF_TC_FALSE = 2, /* BOOLEAN_FALSE in a field header; also BOOL as element type */
    VF_TC_I8 = 3,
    VF_TC_I16 = 4,
    VF_TC_I32 = 5,
    VF_TC_I64 = 6,
    VF_TC_DOUBLE = 7,
    VF_TC_BINARY = 8,
    VF_TC_LIST = 9,
    VF_TC_SET = 10,
    VF_TC_MAP = 11,
    VF_TC_STRUCT = 12,
};

#define VF_PQ_THRIFT_MAX_DEPTH 32

typedef struct vf_pq_tr {
    const uint8_t *p;   /* cursor */
    const uint8_t *start;
    const uint8_t *end; /* one past the last readable byte */
    int depth;          /* struct nesting depth */
    int err;            /* 0, or the first error code (sticky) */
    const char *what;   /* context for messages, e.g. "f.parquet: footer" */
} vf_pq_tr;

void vf_pq_tr_init(vf_pq_tr *t, const void *data, size_t len, const char *what);

/* Records a decoding error (first one wins) and returns t->err. */
int vf_pq_tr_fail(vf_pq_tr *t, const char *reason);

/* Struct framing. begin checks the depth limit; each struct decoder keeps
 * its own `last_id` (start at 0) for the field-id deltas. */
void vf_pq_tr_struct_begin(vf_pq_tr *t);
void vf_pq_tr_struct_end(vf_pq_tr *t);
/* Next field header of the current struct: returns 1 with *id and *type
 * set, or 0 at STOP (or on error). For booleans *type is VF_TC_TRUE or
 * VF_TC_FALSE and the value is the type itself (no payload). */
int vf_pq_tr_field(vf_pq_tr *t, int16_t *last_id, int16_t *id, int *type);

/* Values. */
uint64_t vf_pq_tr_varint(vf_pq_tr *t);
int32_t vf_pq_tr_i32(vf_pq_tr *t);  /* I8/I16/I32 payloads alike */
int64_t vf_pq_tr_i64(vf_pq_tr *t);
double vf_pq_tr_double(vf_pq_tr *t);
int vf_pq_tr_list_bool(vf_pq_tr *t); /* a bool element of a list: one byte */
/* A BINARY payload: a pointer into the buffer (not NUL-terminated) and
 * its length; NULL/0 on error. */
const uint8_t *vf_pq_tr_binary(vf_pq_tr *t, uint32_t *len);
/* The same, as a newly allocated NUL-terminated string (NULL on error). */
char *vf_pq_tr_string(vf_pq_tr *t);
/* List/set header: element count (checked against the remaining bytes)
 * and element type. */
uint32_t vf_pq_tr_list_begin(vf_pq_tr *t, int *elem_type);

/* Reads an integer field value given its wire type (I8, I16, I32, I64);
 * any other type is skipped and yields 0 with *ok = 0. */
int64_t vf_pq_tr_int_field(vf_pq_tr *t, int type, int *ok);

/* Skips one value of the given wire type, recursing into containers. */
void vf_pq_tr_skip(vf_pq_tr *t, int type);
/* Skips `count` structs one after the other, as vf_pq_tr_skip(t,
 * VF_TC_STRUCT) `count` times but in one pass (the unprojected column
 * chunks of a row group: most of a wide file's footer). */
void vf_pq_tr_skip_structs(vf_pq_tr *t, uint32_t count);

/* Bytes consumed so far. */
static inline size_t vf_pq_tr_consumed(const vf_pq_tr *t) { return (size_t)(t->p - t->start); }

#endif
