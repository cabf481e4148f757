/*
 * thrift_read.c: bounded decoder for the Thrift compact protocol (see
 * thrift.h for the invariants: sticky errors, every count checked against
 * the remaining bytes, nesting depth limited).
 *
 * Wire format in short: integers are zigzag varints (ULEB128), except I8
 * which is one raw byte; a field header is one byte, high nibble = id delta
 * (1..15) and low nibble = type, or a zero delta followed by the id as a
 * zigzag varint; booleans live in the field type (1 true, 2 false); a list
 * header is one byte, high nibble = size (15: a varint size follows) and
 * low nibble = element type; binary is a varint length then the bytes; a
 * map is a varint size then (if non-zero) a byte of key/value types.
 */
#include "parquet/thrift.h"

#include <stdlib.h>
#include <string.h>

void vf_pq_tr_init(vf_pq_tr *t, const void *data, size_t len, const char *what)
{
    t->start = data;
    t->p = data;
    t->end = (const uint8_t *)data + len;
    t->depth = 0;
    t->err = 0;
    t->what = what ? what : "thrift";
}

int vf_pq_tr_fail(vf_pq_tr *t, const char *reason)
{
    if (!t->err) {
        t->err = vf_error(VF_ECORRUPT, "%s: %s at byte %zu", t->what, reason, vf_pq_tr_consumed(t));
        t->p = t->end;
    }
    return t->err;
}

static inline int remaining_at_least(vf_pq_tr *t, size_t n)
{
    if ((size_t)(t->end - t->p) < n) {
        vf_pq_tr_fail(t, "truncated thrift data");
        return 0;
    }
    return 1;
}

uint64_t vf_pq_tr_varint(vf_pq_tr *t)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (t->p >= t->end) {
            vf_pq_tr_fail(t, "truncated varint");
            return 0;
        }
        uint8_t b = *t->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    vf_pq_tr_fail(t, "varint longer than 10 bytes");
    return 0;
}

static inline int64_t unzigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

int32_t vf_pq_tr_i32(vf_pq_tr *t)
{
    int64_t v = unzigzag(vf_pq_tr_varint(t));
    if (v < INT32_MIN || v > INT32_MAX) {
        vf_pq_tr_fail(t, "i32 out of range");
        return 0;
    }
    return (int32_t)v;
}

int64_t vf_pq_tr_i64(vf_pq_tr *t) { return unzigzag(vf_pq_tr_varint(t)); }

double vf_pq_tr_double(vf_pq_tr *t)
{
    double d = 0;
    if (!remaining_at_least(t, 8))
        return 0;
    memcpy(&d, t->p, 8); /* little-endian host (x86-64, aarch64) */
    t->p += 8;
    return d;
}

int vf_pq_tr_list_bool(vf_pq_tr *t)
{
    if (!remaining_at_least(t, 1))
        return 0;
    return *t->p++ == 1;
}

const uint8_t *vf_pq_tr_binary(vf_pq_tr *t, uint32_t *len)
{
    *len = 0;
    uint64_t n = vf_pq_tr_varint(t);
    if (t->err)
        return NULL;
    if (n > (uint64_t)(t->end - t->p)) {
        vf_pq_tr_fail(t, "binary length past the end");
        return NULL;
    }
    const uint8_t *p = t->p;
    t->p += n;
    *len = (uint32_t)n;
    return p;
}

char *vf_pq_tr_string(vf_pq_tr *t)
{
    uint32_t n;
    const uint8_t *p = vf_pq_tr_binary(t, &n);
    if (!p)
        return NULL;
    char *s = vf_strndup((const char *)p, n);
    if (!s && !t->err) {
        t->err = VF_ENOMEM;
        t->p = t->end;
    }
    return s;
}

uint32_t vf_pq_tr_list_begin(vf_pq_tr *t, int *elem_type)
{
    *elem_type = VF_TC_STOP;
    if (!remaining_at_least(t, 1))
        return 0;
    uint8_t h = *t->p++;
    uint64_t n = h >> 4;
    if (n == 15)
        n = vf_pq_tr_varint(t);
    if (t->err)
        return 0;
    /* Every element takes at least one byte, so a count larger than what
     * remains is corrupt (and would otherwise drive huge allocations). */
    if (n > (uint64_t)(t->end - t->p)) {
        vf_pq_tr_fail(t, "list size larger than the remaining data");
        return 0;
    }
    *elem_type = h & 0x0f;
    return (uint32_t)n;
}

void vf_pq_tr_struct_begin(vf_pq_tr *t)
{
    if (++t->depth > VF_PQ_THRIFT_MAX_DEPTH)
        vf_pq_tr_fail(t, "thrift structs nested too deeply");
}

void vf_pq_tr_struct_end(vf_pq_tr *t)
{
    if (t->depth > 0)
        t->depth--;
}

int vf_pq_tr_field(vf_pq_tr *t, int16_t *last_id, int16_t *id, int *type)
{
    if (t->err || !remaining_at_least(t, 1))
        return 0;
    uint8_t h = *t->p++;
    if (h == VF_TC_STOP)
        return 0;
    int delta = h >> 4;
    *type = h & 0x0f;
    if (*type > VF_TC_STRUCT) {
        vf_pq_tr_fail(t, "unknown thrift field type");
        return 0;
    }
    if (delta) {
        *id = (int16_t)(*last_id + delta);
    } else {
        int64_t v = unzigzag(vf_pq_tr_varint(t));
        if (t->err)
            return 0;
        if (v < INT16_MIN || v > INT16_MAX) {
            vf_pq_tr_fail(t, "field id out of range");
            return 0;
        }
        *id = (int16_t)v;
    }
    *last_id = *id;
    return 1;
}

int64_t vf_pq_tr_int_field(vf_pq_tr *t, int type, int *ok)
{
    *ok = 1;
    switch (type) {
    case VF_TC_I8:
        if (!remaining_at_least(t, 1))
            break;
        return (int8_t)*t->p++;
    case VF_TC_I16:
    case VF_TC_I32:
        return vf_pq_tr_i32(t);
    case VF_TC_I64:
        return vf_pq_tr_i64(t);
    default:
        vf_pq_tr_skip(t, type);
        break;
    }
    *ok = 0;
    return 0;
}

/* The skipper used for whole unknown or unwanted values: it checks
 * bounds, element types, varint length and depth, iteratively over an
 * explicit stack and on local cursors, because a projected footer open
 * skips almost all of a wide file's footer (tens of MB per LeRobot
 * episodes file with small row groups). */
/* A bounds-checked varint at *pp (at most 10 bytes), advancing *pp past
 * what it read; NULL, or what is wrong. */
static const char *skip_read_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    const uint8_t *p = *pp;
    uint64_t v = 0;
    const char *why = NULL;
    for (int k = 0;; k++) {
        if (p >= end) {
            why = "truncated thrift data";
            break;
        }
        if (k == 10) {
            why = "varint longer than 10 bytes";
            break;
        }
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * k);
        if (!(b & 0x80))
            break;
    }
    *pp = p;
    if (out)
        *out = v;
    return why;
}

/* A varint with at least 10 readable bytes at p: its value and length
 * (1..10), or 0 when it runs past 10 bytes. */
static inline int fast_varint(const uint8_t *p, uint64_t *v)
{
    uint64_t x = 0;
    for (int k = 0; k < 10; k++) {
        x |= (uint64_t)(p[k] & 0x7f) << (7 * k);
        if (!(p[k] & 0x80)) {
            *v = x;
            return k + 1;
        }
    }
    return 0;
}

typedef struct skip_frame {
    uint8_t kind;              /* VF_TC_STRUCT, VF_TC_LIST or VF_TC_MAP */
    uint8_t elem, val;         /* list element type; map key and value types */
    uint64_t left;             /* list elements, or map keys + values, still to skip */
} skip_frame;

/* Pseudo type for skip_values: no value of its own (the run of structs
 * is on the stack already). */
#define SKIP_NOTHING (-1)

/* Skips one value of type `type`, or (type SKIP_NOTHING) `structs`
 * structs in a row. */
static void skip_values(vf_pq_tr *t, int type, uint32_t structs)
{
    if (t->err)
        return;
    skip_frame st[VF_PQ_THRIFT_MAX_DEPTH + 1];
    int sp = -1;
    int limit = VF_PQ_THRIFT_MAX_DEPTH - t->depth; /* frames allowed on top of the current depth */
    const uint8_t *p = t->p, *end = t->end;
    const char *why = NULL;
    int cur = type, in_container = 0;
    if (type == SKIP_NOTHING) {
        if (limit < 2) { /* the list frame and a struct in it */
            why = "thrift structs nested too deeply";
            goto fail;
        }
        st[++sp] = (skip_frame){.kind = VF_TC_LIST, .elem = VF_TC_STRUCT, .left = structs};
    }
    for (;;) {
        /* Skip one value of type cur. */
        switch (cur) {
        case SKIP_NOTHING:
            break;
        case VF_TC_TRUE:
        case VF_TC_FALSE:
            if (in_container) {
                if (p >= end)
                    goto truncated;
                p++;
            }
            break;
        case VF_TC_I8:
            if (p >= end)
                goto truncated;
            p++;
            break;
        case VF_TC_I16:
        case VF_TC_I32:
        case VF_TC_I64:
            if ((why = skip_read_varint(&p, end, NULL)))
                goto fail;
            break;
        case VF_TC_DOUBLE:
            if (end - p < 8)
                goto truncated;
            p += 8;
            break;
        case VF_TC_BINARY:
        case VF_TC_LIST:
        case VF_TC_SET:
        case VF_TC_MAP: {
            uint64_t n = 0;
            uint8_t h = 0;
            if (cur == VF_TC_LIST || cur == VF_TC_SET) {
                if (p >= end)
                    goto truncated;
                h = *p++;
                n = h >> 4;
            }
            if (((cur != VF_TC_LIST && cur != VF_TC_SET) || n == 15) && (why = skip_read_varint(&p, end, &n)))
                goto fail;
            if (n > (uint64_t)(end - p)) {
                why = cur == VF_TC_BINARY ? "binary length past the end"
                      : cur == VF_TC_MAP  ? "map size larger than the remaining data"
                                          : "list size larger than the remaining data";
                goto fail;
            }
            if (cur == VF_TC_BINARY) {
                p += n;
                break;
            }
            skip_frame f = {.kind = VF_TC_LIST, .left = n};
            if (cur == VF_TC_MAP) {
                if (n == 0)
                    break;
                if (p >= end)
                    goto truncated;
                uint8_t kv = *p++;
                f.kind = VF_TC_MAP;
                f.elem = kv >> 4;
                f.val = kv & 0x0f;
                f.left = 2 * n;
                if (f.elem == VF_TC_STOP || f.elem > VF_TC_STRUCT || f.val == VF_TC_STOP || f.val > VF_TC_STRUCT) {
                    why = "bad map element type";
                    goto fail;
                }
            } else {
                f.elem = h & 0x0f;
                if (n && (f.elem == VF_TC_STOP || f.elem > VF_TC_STRUCT)) {
                    why = "bad list element type";
                    goto fail;
                }
            }
            if (sp + 1 >= limit) {
                why = "thrift structs nested too deeply";
                goto fail;
            }
            st[++sp] = f;
            break;
        }
        case VF_TC_STRUCT:
            if (sp + 1 >= limit) {
                why = "thrift structs nested too deeply";
                goto fail;
            }
            st[++sp] = (skip_frame){.kind = VF_TC_STRUCT};
            break;
        default:
            why = "unknown thrift type";
            goto fail;
        }
        /* The next value to skip, from the innermost open container. */
        for (;;) {
            if (sp < 0) {
                t->p = p;
                return;
            }
            skip_frame *f = &st[sp];
        fast_struct:
            if (f->kind == VF_TC_STRUCT) {
                /* Fast path: scalar fields of the struct (the bulk of a
                 * footer: integers, binaries, booleans) are skipped here
                 * while at least 24 bytes remain, so that a varint (at
                 * most 10 bytes) needs no bounds check per byte. */
                while (end - p >= 24) {
                    uint8_t h = *p;
                    int ft = h & 0x0f;
                    if ((unsigned)(ft - VF_TC_I16) <= VF_TC_I64 - VF_TC_I16 && (h >> 4)) {
                        /* The commonest field first: an integer (short
                         * form header), skipped by its varint's last byte. */
                        const uint8_t *q = p + 1;
                        while ((*q & 0x80) && q - p < 10)
                            q++;
                        if (*q & 0x80) {
                            p = q + 1;
                            why = "varint longer than 10 bytes";
                            goto fail;
                        }
                        p = q + 1;
                        continue;
                    }
                    if (h == VF_TC_STOP) {
                        /* The struct ends: back to its parent here when
                         * that is a struct, or a list of structs with
                         * elements left (a column chunk's meta_data,
                         * statistics and encoding_stats). */
                        p++;
                        if (--sp < 0) {
                            t->p = p;
                            return;
                        }
                        f = &st[sp];
                        if (f->kind == VF_TC_LIST && f->elem == VF_TC_STRUCT && f->left > 0 && sp + 1 < limit) {
                            f->left--;
                            st[++sp] = (skip_frame){.kind = VF_TC_STRUCT};
                            f = &st[sp];
                            continue;
                        }
                        goto fast_struct;
                    }
                    if (ft == VF_TC_STRUCT && (h >> 4)) {
                        if (sp + 1 >= limit) {
                            why = "thrift structs nested too deeply";
                            goto fail;
                        }
                        p++;
                        st[++sp] = (skip_frame){.kind = VF_TC_STRUCT};
                        f = &st[sp];
                        continue;
                    }
                    if ((ft == VF_TC_LIST || ft == VF_TC_SET) && (h >> 4) && (p[1] & 0x0f) == VF_TC_STRUCT &&
                        (p[1] >> 4) != 15) {
                        /* A short list of structs: its elements are
                         * skipped by this loop, one struct frame each. */
                        uint32_t n = p[1] >> 4;
                        if (sp + 1 + (n > 0) >= limit) {
                            why = "thrift structs nested too deeply";
                            goto fail;
                        }
                        p += 2;
                        st[++sp] = (skip_frame){.kind = VF_TC_LIST, .elem = VF_TC_STRUCT, .left = n};
                        if (n > 0) {
                            st[sp].left--;
                            st[++sp] = (skip_frame){.kind = VF_TC_STRUCT};
                        }
                        f = &st[sp];
                        if (n == 0)
                            goto fast_struct;
                        continue;
                    }
                    if ((ft == VF_TC_LIST || ft == VF_TC_SET) && (h >> 4)) {
                        /* A short list of integers or binaries (a column
                         * chunk's encodings and path_in_schema): skipped
                         * here too; anything else goes the general way. */
                        uint8_t lh = p[1];
                        uint32_t n = lh >> 4;
                        int et = lh & 0x0f;
                        if (n == 15 || (et != VF_TC_I16 && et != VF_TC_I32 && et != VF_TC_I64 && et != VF_TC_BINARY))
                            break;
                        const uint8_t *q = p + 2;
                        uint32_t i = 0;
                        for (; i < n && end - q >= 11; i++) {
                            uint64_t v;
                            int len = fast_varint(q, &v);
                            if (!len)
                                break; /* the general path reports it */
                            q += len;
                            if (et == VF_TC_BINARY) {
                                if (v > (uint64_t)(end - q))
                                    break;
                                q += v;
                            }
                        }
                        if (i < n)
                            break; /* not consumed: the general path takes the whole field */
                        p = q;
                        continue;
                    }
                    if (h == VF_TC_STOP || !(h >> 4) || ft > VF_TC_BINARY || ft == VF_TC_DOUBLE)
                        break;
                    p++;
                    if (ft == VF_TC_TRUE || ft == VF_TC_FALSE)
                        continue;
                    if (ft == VF_TC_I8) {
                        p++;
                        continue;
                    }
                    /* a BINARY length (integers were taken above) */
                    uint64_t v;
                    int len = fast_varint(p, &v);
                    if (!len) {
                        p += 10;
                        why = "varint longer than 10 bytes";
                        goto fail;
                    }
                    p += len;
                    if (v > (uint64_t)(end - p)) {
                        why = "binary length past the end";
                        goto fail;
                    }
                    p += v;
                }
                if (p >= end)
                    goto truncated;
                uint8_t h = *p++;
                if (h == VF_TC_STOP) {
                    sp--;
                    continue;
                }
                cur = h & 0x0f;
                if (cur > VF_TC_STRUCT) {
                    why = "unknown thrift field type";
                    goto fail;
                }
                if (!(h >> 4) && (why = skip_read_varint(&p, end, NULL))) /* long-form field id: a varint */
                    goto fail;
                in_container = 0;
                break;
            }
            if (f->left == 0) {
                sp--;
                continue;
            }
            f->left--;
            cur = f->kind == VF_TC_MAP && (f->left & 1) == 0 ? f->val : f->elem;
            in_container = 1;
            break;
        }
    }
truncated:
    why = "truncated thrift data";
fail:
    t->p = p;
    vf_pq_tr_fail(t, why);
}

void vf_pq_tr_skip(vf_pq_tr *t, int type) { skip_values(t, type, 0); }

void vf_pq_tr_skip_structs(vf_pq_tr *t, uint32_t count)
{
    if (count)
        skip_values(t, SKIP_NOTHING, count);
}
