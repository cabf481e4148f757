/*
 * page_values.c: the values of a column chunk: the vf_pq_column's buffers
 * (reserved within the reader's limits, kept rows, derived repetition
 * levels) and the value encodings of data and dictionary pages: PLAIN,
 * PLAIN_DICTIONARY/RLE_DICTIONARY (dictionary and PLAIN pages may
 * alternate inside a chunk, as after pyarrow's dictionary fallback), RLE
 * booleans and BYTE_STREAM_SPLIT.
 *
 * Speed: values are written once into their final buffer (memcpy for
 * PLAIN, a typed gather for dictionaries), reserved up front from the
 * chunk's num_values; large buffers are 2 MiB aligned and advised as huge
 * pages.
 *
 * Bounds: every value count is checked against the bytes of its page
 * before anything is reserved for it, and every dictionary index against
 * the dictionary size. The entries and bytes one column may decode are
 * capped (vf_pq_set_limits), because RLE runs let a few bytes claim
 * billions of values.
 */
#define _GNU_SOURCE
#include "parquet/page_internal.h"

#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_ALLOC_MIN ((size_t)8 << 20)

/* ---- buffers ---------------------------------------------------------------- */

void vf_pq_column_init(vf_pq_column *c, const vf_pq_node *leaf)
{
    memset(c, 0, sizeof *c);
    c->leaf = leaf;
    c->type = leaf ? leaf->type : VF_PQ_T_NULL;
    c->value_size = vf_pq_type_size(c->type);
    if (c->type == VF_PQ_T_FIXED_BINARY)
        c->value_size = (size_t)leaf->type_length;
}

void vf_pq_column_free(vf_pq_column *c)
{
    free(c->def);
    free(c->rep);
    free(c->row_starts);
    free(c->values);
    free(c->offsets);
    free(c->data);
    const vf_pq_node *leaf = c->leaf;
    vf_pq_column_init(c, leaf);
}

int vf_pq_column_derive_rep(vf_pq_column *c)
{
    if (c->rep || c->leaf->max_rep != 1)
        return 0;
    uint8_t *rep = vf_malloc(c->num_entries ? (size_t)c->num_entries : 1);
    if (!rep)
        return VF_ENOMEM;
    memset(rep, 1, (size_t)c->num_entries);
    for (int64_t i = 0; i < c->rows; i++)
        rep[c->row_starts[i]] = 0;
    c->rep = rep;
    c->cap_rep = c->num_entries;
    return 0;
}

static int is_byte_array(const vf_pq_column *col)
{
    return col->type == VF_PQ_T_STRING || col->type == VF_PQ_T_BINARY;
}

int vf_pq_column_keep_rows(vf_pq_column *c, int64_t a, int64_t b)
{
    if (a < 0 || b < a || b > c->rows)
        return vf_error(VF_ERANGE, "rows [%lld, %lld) outside the decoded %lld", (long long)a, (long long)b,
                        (long long)c->rows);
    const int max_rep = c->leaf->max_rep;
    int64_t e0 = a, e1 = b; /* entry range */
    if (max_rep == 1 && !c->rep) {
        e0 = a < c->rows ? c->row_starts[a] : c->num_entries;
        e1 = b < c->rows ? c->row_starts[b] : c->num_entries;
    } else if (max_rep >= 1) {
        int64_t row = -1;
        e0 = e1 = c->num_entries;
        for (int64_t i = 0; i < c->num_entries; i++) {
            if (c->rep[i] != 0)
                continue;
            row++;
            if (row == a)
                e0 = i;
            if (row == b) {
                e1 = i;
                break;
            }
        }
    }
    if (e0 == 0 && e1 == c->num_entries)
        return 0;
    /* value range: the present entries (def == max_def) before e0 and e1 */
    int64_t v0 = e0, v1 = e1;
    if (c->def) {
        const uint8_t m = (uint8_t)c->leaf->max_def;
        v0 = 0;
        for (int64_t i = 0; i < e0; i++)
            v0 += c->def[i] == m;
        v1 = v0;
        for (int64_t i = e0; i < e1; i++)
            v1 += c->def[i] == m;
        memmove(c->def, c->def + e0, (size_t)(e1 - e0));
    }
    if (c->rep)
        memmove(c->rep, c->rep + e0, (size_t)(e1 - e0));
    if (max_rep == 1 && c->row_starts) {
        for (int64_t k = 0; k < b - a; k++)
            c->row_starts[k] = c->row_starts[a + k] - e0;
    }
    if (is_byte_array(c)) {
        if (c->offsets) {
            int64_t o0 = c->offsets[v0], o1 = c->offsets[v1];
            for (int64_t k = 0; k <= v1 - v0; k++)
                c->offsets[k] = c->offsets[v0 + k] - o0;
            if (c->data && o1 > o0)
                memmove(c->data, c->data + o0, (size_t)(o1 - o0));
            c->data_len = o1 - o0;
        }
    } else if (c->values && c->value_size) {
        memmove(c->values, c->values + (size_t)v0 * c->value_size, (size_t)(v1 - v0) * c->value_size);
    }
    c->num_entries = e1 - e0;
    c->rows = b - a;
    c->num_values = v1 - v0;
    return 0;
}

static int64_t column_bytes(const vf_pq_column *col, int64_t values)
{
    if (is_byte_array(col))
        return values * 8 + col->data_len;
    return values * (int64_t)col->value_size;
}

/* Room for `extra` more values; `exact` reserves no more than asked. */
int vf_pq_reserve_values_ex(vf_pq_chunk_ctx *c, vf_pq_column *col, int64_t extra, int exact)
{
    int64_t need = col->num_values + extra;
    if (extra < 0 || need > c->f->max_entries ||
        (col->value_size && need > c->f->max_bytes / (int64_t)col->value_size) ||
        column_bytes(col, need) > c->f->max_bytes)
        return vf_pq_fail(c, VF_EUNSUPPORTED, "column decodes to more than the reader limit (%lld values, %lld bytes)",
                          (long long)c->f->max_entries, (long long)c->f->max_bytes);
    if (need <= col->cap_values && (col->values || col->offsets))
        return 0;
    int64_t cap = exact ? need : vf_pq_grow_to(col->cap_values, need);
    if (is_byte_array(col)) {
        int64_t *o = vf_realloc(col->offsets, (size_t)(cap + 1) * sizeof *o);
        if (!o)
            return VF_ENOMEM;
        if (!col->offsets)
            o[0] = 0;
        col->offsets = o;
    } else {
        size_t bytes = (size_t)(cap ? cap : 1) * (col->value_size ? col->value_size : 1);
        uint8_t *v;
        if (!col->values && bytes >= HUGE_ALLOC_MIN) {
            void *mem = NULL;
            if (posix_memalign(&mem, (size_t)2 << 20, bytes) != 0)
                return vf_error(VF_ENOMEM, "out of memory (%zu bytes)", bytes);
            madvise(mem, bytes, MADV_HUGEPAGE);
            v = mem;
        } else {
            v = vf_realloc(col->values, bytes);
        }
        if (!v)
            return VF_ENOMEM;
        col->values = v;
    }
    col->cap_values = cap;
    return 0;
}

static int reserve_values(vf_pq_chunk_ctx *c, vf_pq_column *col, int64_t extra)
{
    return vf_pq_reserve_values_ex(c, col, extra, 0);
}

static int reserve_data(vf_pq_chunk_ctx *c, vf_pq_column *col, int64_t extra)
{
    int64_t need = col->data_len + extra;
    if (extra < 0 || need > c->f->max_bytes)
        return vf_pq_fail(c, VF_EUNSUPPORTED, "column decodes to more than %lld bytes (reader limit)",
                          (long long)c->f->max_bytes);
    if (need <= col->data_cap && col->data)
        return 0;
    int64_t cap = vf_pq_grow_to(col->data_cap, need);
    if (cap > c->f->max_bytes)
        cap = need;
    uint8_t *d = vf_realloc(col->data, (size_t)(cap ? cap : 1));
    if (!d)
        return VF_ENOMEM;
    col->data = d;
    col->data_cap = cap;
    return 0;
}

/* ---- PLAIN ------------------------------------------------------------------- */

/* Appends nv PLAIN values from [p, p+len) to col (also used for the
 * dictionary page). */
int vf_pq_decode_plain(vf_pq_chunk_ctx *c, vf_pq_column *col, const uint8_t *p, size_t len, int64_t nv)
{
    int r;
    int physical = col->leaf->physical;
    /* Every value takes bytes on the page: check the count first, so a
     * hostile count cannot drive the reservation. */
    size_t min_size = physical == VF_PQ_BYTE_ARRAY ? 4
                      : physical == VF_PQ_BOOLEAN  ? 0
                      : physical == VF_PQ_INT32 || physical == VF_PQ_FLOAT ? 4
                      : physical == VF_PQ_FIXED_LEN_BYTE_ARRAY ? (size_t)VF_MAX(col->leaf->type_length, 1)
                                                               : 8;
    if (nv < 0 || (min_size ? (uint64_t)nv > len / min_size : (uint64_t)nv > (uint64_t)len * 8))
        return vf_pq_fail(c, VF_ECORRUPT, "%lld PLAIN %s values need more than the %zu bytes present", (long long)nv,
                          vf_pq_physical_name(physical), len);
    if ((r = reserve_values(c, col, nv)) < 0)
        return r;
    if (physical == VF_PQ_BYTE_ARRAY) {
        /* Lengths are checked one by one; the bytes can never exceed the
         * page, so one reservation of len covers them. */
        if ((r = reserve_data(c, col, (int64_t)len)) < 0)
            return r;
        int64_t *off = col->offsets + col->num_values;
        uint8_t *dst = col->data;
        int64_t pos = col->data_len;
        const uint8_t *end = p + len;
        for (int64_t i = 0; i < nv; i++) {
            if (end - p < 4)
                return vf_pq_fail(c, VF_ECORRUPT, "BYTE_ARRAY value %lld truncated", (long long)i);
            uint32_t n = vf_pq_load_u32(p);
            p += 4;
            if (n > (size_t)(end - p))
                return vf_pq_fail(c, VF_ECORRUPT, "BYTE_ARRAY value %lld of %u bytes passes the page end",
                                  (long long)i, n);
            memcpy(dst + pos, p, n);
            p += n;
            pos += n;
            off[i + 1] = pos;
        }
        col->data_len = pos;
        col->num_values += nv;
        return 0;
    }
    uint8_t *out = col->values + (size_t)col->num_values * col->value_size;
    switch (physical) {
    case VF_PQ_BOOLEAN: {
        if ((uint64_t)nv > (uint64_t)len * 8)
            return vf_pq_fail(c, VF_ECORRUPT, "%lld BOOLEAN values need more than the %zu bytes present", (long long)nv,
                              len);
        int64_t groups = nv / 8;
        vf_pq_unpack_u8(p, out, groups, 1);
        for (int64_t i = groups * 8; i < nv; i++)
            out[i] = (p[i >> 3] >> (i & 7)) & 1;
        break;
    }
    case VF_PQ_INT32:
    case VF_PQ_INT64:
    case VF_PQ_FLOAT:
    case VF_PQ_DOUBLE:
    case VF_PQ_FIXED_LEN_BYTE_ARRAY: {
        size_t in_size = physical == VF_PQ_INT32 || physical == VF_PQ_FLOAT ? 4
                         : physical == VF_PQ_FIXED_LEN_BYTE_ARRAY   ? (size_t)col->leaf->type_length
                                                                    : 8;
        if (in_size == 0 || (uint64_t)nv > len / in_size)
            return vf_pq_fail(c, VF_ECORRUPT, "%lld %s values need more than the %zu bytes present", (long long)nv,
                              vf_pq_physical_name(physical), len);
        if (col->value_size == in_size) {
            memcpy(out, p, (size_t)nv * in_size);
        } else if (col->value_size == 2) { /* INT32 -> 16-bit */
            uint16_t *o = (uint16_t *)(void *)out;
            for (int64_t i = 0; i < nv; i++)
                o[i] = (uint16_t)vf_pq_load_u32(p + 4 * i);
        } else if (col->value_size == 1) { /* INT32 -> 8-bit */
            for (int64_t i = 0; i < nv; i++)
                out[i] = (uint8_t)vf_pq_load_u32(p + 4 * i);
        } else {
            return vf_pq_fail(c, VF_EUNSUPPORTED, "cannot convert %s to %s", vf_pq_physical_name(physical),
                              vf_pq_type_name(col->type));
        }
        break;
    }
    default:
        return vf_pq_fail(c, VF_EUNSUPPORTED, "physical type %s is not supported", vf_pq_physical_name(physical));
    }
    col->num_values += nv;
    return 0;
}

/* BYTE_STREAM_SPLIT: value i's byte k is at k*nv + i. Reassembled into
 * PLAIN order, then decoded as PLAIN. */
static int decode_byte_stream_split(vf_pq_chunk_ctx *c, const uint8_t *p, size_t len, int64_t nv)
{
    int physical = c->leaf->physical;
    size_t w = physical == VF_PQ_INT32 || physical == VF_PQ_FLOAT ? 4
               : physical == VF_PQ_INT64 || physical == VF_PQ_DOUBLE ? 8
               : physical == VF_PQ_FIXED_LEN_BYTE_ARRAY ? (size_t)c->leaf->type_length
                                                        : 0;
    if (w == 0)
        return vf_pq_fail(c, VF_EUNSUPPORTED, "BYTE_STREAM_SPLIT for %s", vf_pq_physical_name(physical));
    if ((uint64_t)nv > len / w)
        return vf_pq_fail(c, VF_ECORRUPT, "BYTE_STREAM_SPLIT page too short for %lld values", (long long)nv);
    size_t total = (size_t)nv * w;
    if (total > c->s->split_cap) {
        uint8_t *s = vf_realloc(c->s->split, total);
        if (!s)
            return VF_ENOMEM;
        c->s->split = s;
        c->s->split_cap = total;
    }
    for (size_t k = 0; k < w; k++) {
        const uint8_t *stream = p + k * (size_t)nv;
        for (int64_t i = 0; i < nv; i++)
            c->s->split[(size_t)i * w + k] = stream[i];
    }
    return vf_pq_decode_plain(c, c->col, c->s->split, total, nv);
}

/* ---- dictionary ---------------------------------------------------------------- */

/* Fails naming the largest index when one is out of range. */
static int check_indices(vf_pq_chunk_ctx *c, const uint32_t *idx, int64_t k, uint32_t dict_n)
{
    uint32_t mx = 0;
    for (int64_t i = 0; i < k; i++)
        mx = idx[i] > mx ? idx[i] : mx;
    if (mx >= dict_n)
        return vf_pq_fail(c, VF_ECORRUPT, "dictionary index %u out of range (dictionary has %u entries)", mx, dict_n);
    return 0;
}

/* The 4- and 8-byte dictionary gathers, one definition for both widths:
 * o[i] = dictionary[idx[i]] for k indices. Under need_check an index past
 * the dictionary reads entry 0 and makes the result nonzero (the caller
 * then fails the batch), so the range check adds no branch per value. */
#define DEFINE_GATHER(name, T)                                                                                \
    static uint32_t name(uint8_t *out, const uint8_t *values, const uint32_t *idx, int64_t k, uint32_t dict_n, \
                         int need_check)                                                                      \
    {                                                                                                         \
        T *o = (T *)(void *)out;                                                                              \
        const T *dv = (const T *)(const void *)values;                                                        \
        if (!need_check) {                                                                                    \
            for (int64_t i = 0; i < k; i++)                                                                   \
                o[i] = dv[idx[i]];                                                                            \
            return 0;                                                                                         \
        }                                                                                                     \
        uint32_t bad = 0;                                                                                     \
        for (int64_t i = 0; i < k; i++) {                                                                     \
            uint32_t j = idx[i];                                                                              \
            bad |= j >= dict_n;                                                                               \
            o[i] = dv[j < dict_n ? j : 0];                                                                    \
        }                                                                                                     \
        return bad;                                                                                           \
    }
DEFINE_GATHER(gather_u32, uint32_t)
DEFINE_GATHER(gather_u64, uint64_t)
#undef DEFINE_GATHER

static int decode_dict_indices(vf_pq_chunk_ctx *c, const uint8_t *p, size_t len, int64_t nv)
{
    vf_pq_column *col = c->col;
    const vf_pq_column *dict = &c->dict;
    if (!c->has_dict)
        return vf_pq_fail(c, VF_ECORRUPT, "dictionary-encoded data page without a dictionary page");
    if (len < 1)
        return vf_pq_fail(c, VF_ECORRUPT, "dictionary-encoded page has no bit width");
    int width = p[0];
    if (width > 32)
        return vf_pq_fail(c, VF_ECORRUPT, "dictionary index bit width %d is larger than 32", width);
    vf_pq_rle d;
    vf_pq_rle_init(&d, p + 1, len - 1, width);
    int r;
    if ((r = reserve_values(c, col, nv)) < 0)
        return r;
    uint32_t dict_n = (uint32_t)dict->num_values;
    int need_check = width >= 32 || dict_n < (1u << width);
    /* Page-level reads: only the values of the rows kept (their window),
     * the indices before it stepped over and the ones after it not read;
     * the other values are left unwritten (the caller drops them). */
    int64_t first = 0, last = nv, base = col->num_values;
    if (c->keep_values && !is_byte_array(col)) {
        first = VF_MIN(VF_MAX(c->keep_value_lo - base, 0), nv);
        last = VF_MIN(VF_MAX(c->keep_value_hi - base, first), nv);
        if (first > 0 && vf_pq_rle_skip(&d, first) < 0)
            return vf_pq_fail(c, VF_ECORRUPT, "dictionary indices are truncated or malformed");
        col->num_values += first;
    }
    for (int64_t done = first; done < last;) {
        int64_t k = VF_MIN(last - done, VF_PQ_IDX_BATCH);
        if (vf_pq_rle_read_u32(&d, c->idx, k) < 0)
            return vf_pq_fail(c, VF_ECORRUPT, "dictionary indices are truncated or malformed");
        /* Indices need a range check unless the bit width cannot express
         * one past the dictionary; 4- and 8-byte gathers fuse it below. */
        size_t w = col->value_size;
        int fused = !is_byte_array(col) && (w == 4 || w == 8) && dict_n > 0;
        if (need_check && !fused && (r = check_indices(c, c->idx, k, dict_n)) < 0)
            return r;
        if (is_byte_array(col)) {
            int64_t bytes = 0;
            for (int64_t i = 0; i < k; i++)
                bytes += dict->offsets[c->idx[i] + 1] - dict->offsets[c->idx[i]];
            if ((r = reserve_data(c, col, bytes)) < 0)
                return r;
            int64_t *off = col->offsets + col->num_values;
            int64_t pos = col->data_len;
            for (int64_t i = 0; i < k; i++) {
                int64_t s = dict->offsets[c->idx[i]], n = dict->offsets[c->idx[i] + 1] - s;
                memcpy(col->data + pos, dict->data + s, (size_t)n);
                pos += n;
                off[i + 1] = pos;
            }
            col->data_len = pos;
        } else {
            uint8_t *out = col->values + (size_t)col->num_values * w;
            const uint32_t *idx = c->idx;
            switch (w) {
            case 1:
                for (int64_t i = 0; i < k; i++)
                    out[i] = dict->values[idx[i]];
                break;
            case 2: {
                uint16_t *o = (uint16_t *)(void *)out;
                const uint16_t *dv = (const uint16_t *)(const void *)dict->values;
                for (int64_t i = 0; i < k; i++)
                    o[i] = dv[idx[i]];
                break;
            }
            case 4:
                if (gather_u32(out, dict->values, idx, k, dict_n, need_check))
                    return check_indices(c, idx, k, dict_n);
                break;
            case 8:
                if (gather_u64(out, dict->values, idx, k, dict_n, need_check))
                    return check_indices(c, idx, k, dict_n);
                break;
            default:
                for (int64_t i = 0; i < k; i++)
                    memcpy(out + (size_t)i * w, dict->values + (size_t)idx[i] * w, w);
                break;
            }
        }
        col->num_values += k;
        done += k;
    }
    col->num_values = base + nv;
    return 0;
}

int vf_pq_decode_values(vf_pq_chunk_ctx *c, int encoding, const uint8_t *p, size_t len, int64_t nv)
{
    if (nv == 0)
        return 0;
    switch (encoding) {
    case VF_PQ_ENC_PLAIN: return vf_pq_decode_plain(c, c->col, p, len, nv);
    case VF_PQ_ENC_PLAIN_DICTIONARY:
    case VF_PQ_ENC_RLE_DICTIONARY: return decode_dict_indices(c, p, len, nv);
    case VF_PQ_ENC_BYTE_STREAM_SPLIT: return decode_byte_stream_split(c, p, len, nv);
    case VF_PQ_ENC_RLE:
        if (c->leaf->physical == VF_PQ_BOOLEAN) {
            if (len < 4 || vf_pq_load_u32(p) > len - 4)
                return vf_pq_fail(c, VF_ECORRUPT, "RLE boolean values have a bad length prefix");
            vf_pq_rle d;
            vf_pq_rle_init(&d, p + 4, vf_pq_load_u32(p), 1);
            int r = reserve_values(c, c->col, nv);
            if (r < 0)
                return r;
            if (vf_pq_rle_read_u8(&d, c->col->values + c->col->num_values, nv) < 0)
                return vf_pq_fail(c, VF_ECORRUPT, "RLE boolean values are truncated or malformed");
            c->col->num_values += nv;
            return 0;
        }
        break;
    default: break;
    }
    return vf_pq_fail(c, VF_EUNSUPPORTED, "value encoding %s (%d) is not supported for %s",
                      vf_pq_encoding_name(encoding), encoding, vf_pq_physical_name(c->leaf->physical));
}
