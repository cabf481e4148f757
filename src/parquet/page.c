/*
 * page.c: decodes one column chunk (its pages) into a vf_pq_column:
 * definition/repetition levels (compactly, see read_internal.h) and the
 * present values densely, already converted to the leaf's vf_pq_type.
 *
 * A chunk spans [dictionary_page_offset or data_page_offset,
 * + total_compressed_size) and is read through a window of a few MiB
 * that is reused across pages, chunks and leaves of one read (so a large
 * chunk is never copied whole into fresh memory). Pages are walked until
 * their level counts reach the chunk's num_values. Supported:
 * DICTIONARY_PAGE (PLAIN), DATA_PAGE (v1: levels with a 4-byte length
 * prefix, compressed together with the values) and DATA_PAGE_V2 (levels
 * uncompressed without prefix, is_compressed); value encodings PLAIN,
 * PLAIN_DICTIONARY/RLE_DICTIONARY (dictionary and PLAIN pages may alternate
 * inside a chunk, as after pyarrow's dictionary fallback), RLE booleans and
 * BYTE_STREAM_SPLIT; codecs UNCOMPRESSED, SNAPPY, GZIP, ZSTD. Everything
 * else fails with VF_EUNSUPPORTED naming what it is.
 *
 * Speed: levels are decoded in small batches into a cache-resident
 * buffer; a batch of all-max definition levels is not stored at all, and
 * for max_rep == 1 only the row starts are kept. Values are written once
 * into their final buffer (memcpy for PLAIN, a typed gather for
 * dictionaries), reserved up front from the chunk's num_values.
 *
 * Bounds: every page size is checked against the chunk, every value
 * count against the bytes of its page, every level against its maximum
 * and every dictionary index against the dictionary size. The entries
 * and bytes one column may decode are capped (vf_pq_set_limits), because
 * RLE runs let a few bytes claim billions of values.
 */
#define _GNU_SOURCE
#include "parquet/read_internal.h"

#include <snappy-c.h>
#include <stddef.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#define IDX_BATCH 2048
#define LEVEL_BATCH 4096
#define WINDOW_BYTES ((int64_t)4 << 20)
#define HUGE_ALLOC_MIN ((size_t)8 << 20)

typedef struct chunk_ctx {
    vf_pq_file *f;
    const vf_pq_node *leaf;
    const vf_pq_chunk_meta *meta;
    vf_pq_column *col;
    vf_pq_scratch *s;
    int row_group;
    int page;
    int64_t entries_start;     /* col->num_entries when this chunk began */
    int64_t chunk_end;         /* file offset one past the chunk */
    char *where;               /* "file: column 'x', row group g", formatted on first use (where()) */
    vf_pq_column dict;
    int has_dict;
    int maxbuf_len;            /* leading bytes of maxbuf filled so far */
    int mid_row;               /* pages of a repeated column were skipped: the first decoded page may
                                  continue the row before it (page-level reads) */
    /* Scratch arrays (not zeroed: each chunk writes before it reads). */
    uint32_t idx[IDX_BATCH];
    uint8_t lv[LEVEL_BATCH];
    uint8_t maxbuf[LEVEL_BATCH]; /* LEVEL_BATCH copies of max_def */
} chunk_ctx;

typedef struct page_header {
    int type;
    int32_t uncompressed_size, compressed_size;
    int has_crc;
    uint32_t crc; /* CRC-32 (zlib) of the page's bytes as stored, when has_crc */
    int has_data, has_dict, has_v2;
    int32_t num_values;
    int encoding, def_encoding, rep_encoding;
    int32_t num_nulls, num_rows;
    int32_t def_len, rep_len;
    int is_compressed;
} page_header;

/* The chunk's name for messages: formatted only when a message needs it
 * (a wide file with small row groups decodes hundreds of thousands of
 * chunks; formatting eagerly was a tenth of the time). */
static const char *where(chunk_ctx *c)
{
    if (!c->where) {
        char *path = vf_pq_leaf_path_string(c->leaf);
        c->where = vf_asprintf("%s: column '%s', row group %d", c->f->name, path ? path : "?", c->row_group);
        free(path);
    }
    return c->where ? c->where : c->f->name;
}

static int fail(chunk_ctx *c, int code, const char *fmt, ...) VF_PRINTF(3, 4);
static int fail(chunk_ctx *c, int code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return vf_error(code, "%s, page %d: %s", where(c), c->page, msg);
}

/* ---- buffers ---------------------------------------------------------------- */

void vf_pq_scratch_free(vf_pq_scratch *s)
{
    if (s->view_src)
        vf_source_unview(s->view_src, s->view_token);
    free(s->saved);
    free(s->levels);
    free(s->window);
    free(s->page);
    free(s->split);
    free(s->chunk_ctx);
    memset(s, 0, sizeof *s);
}

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

static int64_t grow_to(int64_t cap, int64_t need)
{
    int64_t n = cap < 1024 ? 1024 : cap + cap / 2;
    return n < need ? need : n;
}

/* Makes room for `need` bytes in *buf (capacity *cap). */
static int grow_bytes(chunk_ctx *c, uint8_t **buf, int64_t *cap, int64_t need)
{
    if (need <= *cap && *buf)
        return 0;
    if (need > c->f->max_entries)
        return fail(c, VF_EUNSUPPORTED, "more than %lld level entries in one column (reader limit)",
                    (long long)c->f->max_entries);
    int64_t n = grow_to(*cap, need);
    uint8_t *p = vf_realloc(*buf, (size_t)n);
    if (!p)
        return VF_ENOMEM;
    *buf = p;
    *cap = n;
    return 0;
}

static int64_t column_bytes(const vf_pq_column *col, int64_t values)
{
    if (is_byte_array(col))
        return values * 8 + col->data_len;
    return values * (int64_t)col->value_size;
}

/* Room for `extra` more values; `exact` reserves no more than asked. */
static int reserve_values_ex(chunk_ctx *c, vf_pq_column *col, int64_t extra, int exact)
{
    int64_t need = col->num_values + extra;
    if (extra < 0 || need > c->f->max_entries ||
        (col->value_size && need > c->f->max_bytes / (int64_t)col->value_size) ||
        column_bytes(col, need) > c->f->max_bytes)
        return fail(c, VF_EUNSUPPORTED, "column decodes to more than the reader limit (%lld values, %lld bytes)",
                    (long long)c->f->max_entries, (long long)c->f->max_bytes);
    if (need <= col->cap_values && (col->values || col->offsets))
        return 0;
    int64_t cap = exact ? need : grow_to(col->cap_values, need);
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

static int reserve_values(chunk_ctx *c, vf_pq_column *col, int64_t extra)
{
    return reserve_values_ex(c, col, extra, 0);
}

static int reserve_data(chunk_ctx *c, vf_pq_column *col, int64_t extra)
{
    int64_t need = col->data_len + extra;
    if (extra < 0 || need > c->f->max_bytes)
        return fail(c, VF_EUNSUPPORTED, "column decodes to more than %lld bytes (reader limit)",
                    (long long)c->f->max_bytes);
    if (need <= col->data_cap && col->data)
        return 0;
    int64_t cap = grow_to(col->data_cap, need);
    if (cap > c->f->max_bytes)
        cap = need;
    uint8_t *d = vf_realloc(col->data, (size_t)(cap ? cap : 1));
    if (!d)
        return VF_ENOMEM;
    col->data = d;
    col->data_cap = cap;
    return 0;
}

/* Makes [off, off+len) of the file available; *p points at off and
 * *avail counts the bytes available from there up to the chunk end. */
static int fetch(chunk_ctx *c, int64_t off, int64_t len, const uint8_t **p, int64_t *avail)
{
    vf_pq_scratch *s = c->s;
    if (s->view && off >= s->view_start && len <= s->view_start + s->view_len - off) {
        *p = s->view + (off - s->view_start);
        *avail = VF_MIN(s->view_start + s->view_len, c->chunk_end) - off;
        return 0;
    }
    if (!(s->window && off >= s->window_start && off + len <= s->window_start + s->window_len)) {
        int64_t want = VF_MAX(len, VF_MIN(WINDOW_BYTES, c->chunk_end - off));
        if ((size_t)want > s->window_cap) {
            if (want > c->f->max_bytes)
                return fail(c, VF_EUNSUPPORTED, "page of %lld bytes is above the reader limit", (long long)want);
            free(s->window);
            s->window_len = 0;
            s->window = vf_malloc((size_t)want);
            s->window_cap = s->window ? (size_t)want : 0;
            if (!s->window)
                return VF_ENOMEM;
        }
        int r = vf_source_read_at(c->f->src, (uint64_t)off, s->window, (size_t)want);
        if (r < 0) {
            s->window_len = 0;
            return vf_error_context(r, "%s", where(c));
        }
        s->window_start = off;
        s->window_len = want;
    }
    *p = s->window + (off - s->window_start);
    *avail = VF_MIN(s->window_start + s->window_len, c->chunk_end) - off;
    return 0;
}

/* ---- PLAIN ------------------------------------------------------------------- */

static inline uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Appends nv PLAIN values from [p, p+len) to col (also used for the
 * dictionary page). */
static int decode_plain(chunk_ctx *c, vf_pq_column *col, const uint8_t *p, size_t len, int64_t nv)
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
        return fail(c, VF_ECORRUPT, "%lld PLAIN %s values need more than the %zu bytes present", (long long)nv,
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
                return fail(c, VF_ECORRUPT, "BYTE_ARRAY value %lld truncated", (long long)i);
            uint32_t n = load_u32(p);
            p += 4;
            if (n > (size_t)(end - p))
                return fail(c, VF_ECORRUPT, "BYTE_ARRAY value %lld of %u bytes passes the page end", (long long)i, n);
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
            return fail(c, VF_ECORRUPT, "%lld BOOLEAN values need more than the %zu bytes present", (long long)nv,
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
            return fail(c, VF_ECORRUPT, "%lld %s values need more than the %zu bytes present", (long long)nv,
                        vf_pq_physical_name(physical), len);
        if (col->value_size == in_size) {
            memcpy(out, p, (size_t)nv * in_size);
        } else if (col->value_size == 2) { /* INT32 -> 16-bit */
            uint16_t *o = (uint16_t *)(void *)out;
            for (int64_t i = 0; i < nv; i++)
                o[i] = (uint16_t)load_u32(p + 4 * i);
        } else if (col->value_size == 1) { /* INT32 -> 8-bit */
            for (int64_t i = 0; i < nv; i++)
                out[i] = (uint8_t)load_u32(p + 4 * i);
        } else {
            return fail(c, VF_EUNSUPPORTED, "cannot convert %s to %s", vf_pq_physical_name(physical),
                        vf_pq_type_name(col->type));
        }
        break;
    }
    default:
        return fail(c, VF_EUNSUPPORTED, "physical type %s is not supported", vf_pq_physical_name(physical));
    }
    col->num_values += nv;
    return 0;
}

/* BYTE_STREAM_SPLIT: value i's byte k is at k*nv + i. Reassembled into
 * PLAIN order, then decoded as PLAIN. */
static int decode_byte_stream_split(chunk_ctx *c, const uint8_t *p, size_t len, int64_t nv)
{
    int physical = c->leaf->physical;
    size_t w = physical == VF_PQ_INT32 || physical == VF_PQ_FLOAT ? 4
               : physical == VF_PQ_INT64 || physical == VF_PQ_DOUBLE ? 8
               : physical == VF_PQ_FIXED_LEN_BYTE_ARRAY ? (size_t)c->leaf->type_length
                                                        : 0;
    if (w == 0)
        return fail(c, VF_EUNSUPPORTED, "BYTE_STREAM_SPLIT for %s", vf_pq_physical_name(physical));
    if ((uint64_t)nv > len / w)
        return fail(c, VF_ECORRUPT, "BYTE_STREAM_SPLIT page too short for %lld values", (long long)nv);
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
    return decode_plain(c, c->col, c->s->split, total, nv);
}

/* ---- dictionary ---------------------------------------------------------------- */

/* Fails naming the largest index when one is out of range. */
static int check_indices(chunk_ctx *c, const uint32_t *idx, int64_t k, uint32_t dict_n)
{
    uint32_t mx = 0;
    for (int64_t i = 0; i < k; i++)
        mx = idx[i] > mx ? idx[i] : mx;
    if (mx >= dict_n)
        return fail(c, VF_ECORRUPT, "dictionary index %u out of range (dictionary has %u entries)", mx, dict_n);
    return 0;
}

static int decode_dict_indices(chunk_ctx *c, const uint8_t *p, size_t len, int64_t nv)
{
    vf_pq_column *col = c->col;
    const vf_pq_column *dict = &c->dict;
    if (!c->has_dict)
        return fail(c, VF_ECORRUPT, "dictionary-encoded data page without a dictionary page");
    if (len < 1)
        return fail(c, VF_ECORRUPT, "dictionary-encoded page has no bit width");
    int width = p[0];
    if (width > 32)
        return fail(c, VF_ECORRUPT, "dictionary index bit width %d is larger than 32", width);
    vf_pq_rle d;
    vf_pq_rle_init(&d, p + 1, len - 1, width);
    int r;
    if ((r = reserve_values(c, col, nv)) < 0)
        return r;
    uint32_t dict_n = (uint32_t)dict->num_values;
    int need_check = width >= 32 || dict_n < (1u << width);
    for (int64_t done = 0; done < nv;) {
        int64_t k = VF_MIN(nv - done, IDX_BATCH);
        if (vf_pq_rle_read_u32(&d, c->idx, k) < 0)
            return fail(c, VF_ECORRUPT, "dictionary indices are truncated or malformed");
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
            case 4: {
                uint32_t *o = (uint32_t *)(void *)out;
                const uint32_t *dv = (const uint32_t *)(const void *)dict->values;
                if (!need_check) {
                    for (int64_t i = 0; i < k; i++)
                        o[i] = dv[idx[i]];
                    break;
                }
                uint32_t bad = 0;
                for (int64_t i = 0; i < k; i++) {
                    uint32_t j = idx[i];
                    bad |= j >= dict_n;
                    o[i] = dv[j < dict_n ? j : 0];
                }
                if (bad)
                    return check_indices(c, idx, k, dict_n);
                break;
            }
            case 8: {
                uint64_t *o = (uint64_t *)(void *)out;
                const uint64_t *dv = (const uint64_t *)(const void *)dict->values;
                if (!need_check) {
                    for (int64_t i = 0; i < k; i++)
                        o[i] = dv[idx[i]];
                    break;
                }
                uint32_t bad = 0;
                for (int64_t i = 0; i < k; i++) {
                    uint32_t j = idx[i];
                    bad |= j >= dict_n;
                    o[i] = dv[j < dict_n ? j : 0];
                }
                if (bad)
                    return check_indices(c, idx, k, dict_n);
                break;
            }
            default:
                for (int64_t i = 0; i < k; i++)
                    memcpy(out + (size_t)i * w, dict->values + (size_t)idx[i] * w, w);
                break;
            }
        }
        col->num_values += k;
        done += k;
    }
    return 0;
}

/* ---- decompression ------------------------------------------------------------ */

static int ensure_scratch(chunk_ctx *c, size_t n)
{
    if (n <= c->s->page_cap && c->s->page)
        return 0;
    if ((int64_t)n > c->f->max_bytes)
        return fail(c, VF_EUNSUPPORTED, "page of %zu bytes is above the reader limit", n);
    size_t cap = n < 65536 ? 65536 : n;
    uint8_t *s = vf_malloc(cap);
    if (!s)
        return VF_ENOMEM;
    free(c->s->page);
    c->s->page = s;
    c->s->page_cap = cap;
    return 0;
}

static int inflate_gzip(chunk_ctx *c, const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 15 + 32) != Z_OK)
        return fail(c, VF_ENOMEM, "zlib init failed");
    zs.next_in = (Bytef *)(uintptr_t)src;
    zs.avail_in = (uInt)src_len;
    zs.next_out = dst;
    zs.avail_out = (uInt)dst_len;
    int r;
    for (;;) {
        r = inflate(&zs, Z_FINISH);
        /* Concatenated gzip members continue after a stream end. */
        if (r == Z_STREAM_END && zs.avail_in > 0 && zs.avail_out > 0) {
            if (inflateReset(&zs) != Z_OK)
                break;
            continue;
        }
        break;
    }
    size_t produced = dst_len - zs.avail_out;
    inflateEnd(&zs);
    if (r != Z_STREAM_END || produced != dst_len)
        return fail(c, VF_ECORRUPT, "GZIP data is corrupt or has the wrong size (%zu of %zu bytes)", produced, dst_len);
    return 0;
}

/* Checks the size the compressed data itself declares, before anything
 * is allocated for what the (untrusted) page header asks. */
static int check_declared_size(chunk_ctx *c, int codec, const uint8_t *src, size_t src_len, size_t dst_len)
{
    size_t n;
    if (codec == VF_PQ_SNAPPY &&
        (snappy_uncompressed_length((const char *)src, src_len, &n) != SNAPPY_OK || n != dst_len))
        return fail(c, VF_ECORRUPT, "SNAPPY page has a bad header or the wrong size");
    if (codec == VF_PQ_ZSTD) {
        unsigned long long declared = ZSTD_getFrameContentSize(src, src_len);
        if (declared == ZSTD_CONTENTSIZE_ERROR || (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared > dst_len))
            return fail(c, VF_ECORRUPT, "ZSTD page has a bad frame header or the wrong size");
    }
    if (codec != VF_PQ_SNAPPY && codec != VF_PQ_GZIP && codec != VF_PQ_ZSTD)
        return fail(c, VF_EUNSUPPORTED, "compression codec %s (%d) is not supported", vf_pq_codec_name(codec), codec);
    return 0;
}

/* Decompresses exactly dst_len bytes into dst (codec already checked). */
static int decompress_into(chunk_ctx *c, int codec, const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len)
{
    size_t n = dst_len;
    switch (codec) {
    case VF_PQ_SNAPPY:
        if (snappy_uncompress((const char *)src, src_len, (char *)dst, &n) != SNAPPY_OK || n != dst_len)
            return fail(c, VF_ECORRUPT, "SNAPPY data is corrupt");
        return 0;
    case VF_PQ_GZIP:
        if (src_len > UINT32_MAX || dst_len > UINT32_MAX)
            return fail(c, VF_EUNSUPPORTED, "GZIP page larger than 4 GiB");
        return inflate_gzip(c, src, src_len, dst, dst_len);
    case VF_PQ_ZSTD:
        n = ZSTD_decompress(dst, dst_len, src, src_len);
        if (ZSTD_isError(n) || n != dst_len)
            return fail(c, VF_ECORRUPT, "ZSTD data is corrupt or has the wrong size (%s)",
                        ZSTD_isError(n) ? ZSTD_getErrorName(n) : "size mismatch");
        return 0;
    default:
        return fail(c, VF_EUNSUPPORTED, "compression codec %s (%d) is not supported", vf_pq_codec_name(codec), codec);
    }
}

/* Decompresses [src, src+src_len) into dst_len bytes; *out points at the
 * result (src itself when uncompressed). */
static int decompress(chunk_ctx *c, const uint8_t *src, size_t src_len, size_t dst_len, const uint8_t **out)
{
    int codec = c->meta->codec;
    if (codec == VF_PQ_UNCOMPRESSED) {
        if (src_len != dst_len)
            return fail(c, VF_ECORRUPT, "uncompressed page has %zu bytes but declares %zu", src_len, dst_len);
        *out = src;
        return 0;
    }
    int r = check_declared_size(c, codec, src, src_len, dst_len);
    if (r < 0 || (r = ensure_scratch(c, dst_len)) < 0 ||
        (r = decompress_into(c, codec, src, src_len, c->s->page, dst_len)) < 0)
        return r;
    *out = c->s->page;
    return 0;
}

/* ---- page headers --------------------------------------------------------------- */

static int32_t i32_field(vf_pq_tr *t, int type)
{
    int ok;
    int64_t v = vf_pq_tr_int_field(t, type, &ok);
    if (ok && (v < INT32_MIN || v > INT32_MAX))
        vf_pq_tr_fail(t, "integer out of range");
    return (int32_t)v;
}

static void parse_sub_header(vf_pq_tr *t, page_header *h, int which)
{
    int16_t last = 0, id;
    int type;
    vf_pq_tr_struct_begin(t);
    while (vf_pq_tr_field(t, &last, &id, &type)) {
        if (which == 5) { /* DataPageHeader */
            switch (id) {
            case 1: h->num_values = i32_field(t, type); break;
            case 2: h->encoding = i32_field(t, type); break;
            case 3: h->def_encoding = i32_field(t, type); break;
            case 4: h->rep_encoding = i32_field(t, type); break;
            default: vf_pq_tr_skip(t, type); break;
            }
        } else if (which == 7) { /* DictionaryPageHeader */
            switch (id) {
            case 1: h->num_values = i32_field(t, type); break;
            case 2: h->encoding = i32_field(t, type); break;
            default: vf_pq_tr_skip(t, type); break;
            }
        } else { /* DataPageHeaderV2 */
            switch (id) {
            case 1: h->num_values = i32_field(t, type); break;
            case 2: h->num_nulls = i32_field(t, type); break;
            case 3: h->num_rows = i32_field(t, type); break;
            case 4: h->encoding = i32_field(t, type); break;
            case 5: h->def_len = i32_field(t, type); break;
            case 6: h->rep_len = i32_field(t, type); break;
            case 7:
                if (type == VF_TC_TRUE || type == VF_TC_FALSE)
                    h->is_compressed = type == VF_TC_TRUE;
                else
                    vf_pq_tr_skip(t, type);
                break;
            default: vf_pq_tr_skip(t, type); break;
            }
        }
    }
    vf_pq_tr_struct_end(t);
}

static void parse_page_header(vf_pq_tr *t, page_header *h)
{
    int16_t last = 0, id;
    int type;
    memset(h, 0, sizeof *h);
    h->type = -1;
    h->def_encoding = h->rep_encoding = VF_PQ_ENC_RLE;
    h->is_compressed = 1;
    vf_pq_tr_struct_begin(t);
    while (vf_pq_tr_field(t, &last, &id, &type)) {
        switch (id) {
        case 1: h->type = i32_field(t, type); break;
        case 2: h->uncompressed_size = i32_field(t, type); break;
        case 3: h->compressed_size = i32_field(t, type); break;
        case 4:
            h->has_crc = type == VF_TC_I32;
            h->crc = (uint32_t)i32_field(t, type);
            break;
        case 5:
        case 7:
        case 8:
            if (type != VF_TC_STRUCT) {
                vf_pq_tr_skip(t, type);
                break;
            }
            if (id == 5)
                h->has_data = 1;
            else if (id == 7)
                h->has_dict = 1;
            else
                h->has_v2 = 1;
            parse_sub_header(t, h, id);
            break;
        default: vf_pq_tr_skip(t, type); break;
        }
    }
    vf_pq_tr_struct_end(t);
}

/* ---- levels ---------------------------------------------------------------- */

static int bit_width(int v)
{
    int w = 0;
    while (v >> w)
        w++;
    return w;
}

/* A stream of levels: the RLE/bit-packed hybrid, or the deprecated
 * BIT_PACKED encoding (MSB-first, no run headers). */
typedef struct level_reader {
    int encoding;
    int width;
    vf_pq_rle rle;
    const uint8_t *p;
    size_t len;
    uint64_t bit;
} level_reader;

static int level_reader_init(chunk_ctx *c, level_reader *lr, const char *kind, int encoding, const uint8_t *p,
                             size_t len, int max_level, int64_t n)
{
    memset(lr, 0, sizeof *lr);
    lr->encoding = encoding;
    lr->width = bit_width(max_level);
    lr->p = p;
    lr->len = len;
    if (encoding == VF_PQ_ENC_RLE) {
        vf_pq_rle_init(&lr->rle, p, len, lr->width);
        return 0;
    }
    if (encoding == VF_PQ_ENC_BIT_PACKED) {
        if ((uint64_t)n > (uint64_t)len * 8 / (uint64_t)(lr->width ? lr->width : 1))
            return fail(c, VF_ECORRUPT, "%s levels are truncated", kind);
        return 0;
    }
    return fail(c, VF_EUNSUPPORTED, "%s level encoding %s (%d) is not supported", kind, vf_pq_encoding_name(encoding),
                encoding);
}

static int level_read(chunk_ctx *c, level_reader *lr, const char *kind, int max_level, uint8_t *out, int64_t k)
{
    if (lr->encoding == VF_PQ_ENC_RLE) {
        if (vf_pq_rle_read_u8(&lr->rle, out, k) < 0)
            return fail(c, VF_ECORRUPT, "%s levels are truncated or malformed", kind);
    } else {
        for (int64_t i = 0; i < k; i++) {
            int v = 0;
            for (int b = 0; b < lr->width; b++, lr->bit++)
                v = (v << 1) | ((lr->p[lr->bit >> 3] >> (7 - (lr->bit & 7))) & 1);
            out[i] = (uint8_t)v;
        }
    }
    /* Values above the maximum fit in the bit width only when max+1 is
     * not a power of two. */
    if (((max_level + 1) & max_level) != 0) {
        uint8_t bad = 0;
        for (int64_t i = 0; i < k; i++)
            bad |= out[i] > max_level;
        if (bad)
            return fail(c, VF_ECORRUPT, "%s level above the maximum %d", kind, max_level);
    }
    return 0;
}

/* Appends the positions of the zero levels of lv[0..k) (values 0/1) to
 * row_starts, 8 levels per step. */
static int64_t append_row_starts(const uint8_t *lv, int64_t k, int64_t base, int64_t *out)
{
    int64_t n = 0, i = 0;
    const uint64_t ones = 0x0101010101010101ull;
    for (; i + 8 <= k; i += 8) {
        uint64_t w;
        memcpy(&w, lv + i, 8);
        uint64_t zeros = ~w & ones; /* a 1 in each byte whose level is 0 */
        while (zeros) {
            out[n++] = base + i + (__builtin_ctzll(zeros) >> 3);
            zeros &= zeros - 1;
        }
    }
    for (; i < k; i++)
        if (lv[i] == 0)
            out[n++] = base + i;
    return n;
}

/* Decodes the levels of a page of n entries into the column; *nv gets the
 * number of present values (def == max_def). */
static int decode_page_levels(chunk_ctx *c, int64_t n, const uint8_t *rep_p, size_t rep_len, int rep_enc,
                              const uint8_t *def_p, size_t def_len, int def_enc, int64_t *nv)
{
    vf_pq_column *col = c->col;
    const vf_pq_node *leaf = c->leaf;
    const int64_t base = col->num_entries;
    int64_t rows = n, present = n;
    level_reader lr;
    int r;
    if (leaf->max_rep > 0) {
        if ((r = level_reader_init(c, &lr, "repetition", rep_enc, rep_p, rep_len, leaf->max_rep, n)) < 0)
            return r;
        rows = 0;
        if (leaf->max_rep == 1) {
            if (col->rows + n + 1 > col->cap_rows) {
                int64_t cap = grow_to(col->cap_rows, col->rows + n + 1);
                int64_t *rs = vf_realloc(col->row_starts, (size_t)cap * sizeof *rs);
                if (!rs)
                    return VF_ENOMEM;
                col->row_starts = rs;
                col->cap_rows = cap;
            }
        } else if ((r = grow_bytes(c, &col->rep, &col->cap_rep, base + n)) < 0) {
            return r;
        }
        if (leaf->max_rep == 1 && lr.encoding == VF_PQ_ENC_RLE) {
            /* Straight from the runs to row starts. */
            rows = vf_pq_rle_zero_positions(&lr.rle, n, base, col->row_starts + col->rows);
            if (rows < 0)
                return fail(c, VF_ECORRUPT, "repetition levels are truncated or malformed");
            if (base == c->entries_start && n > 0 && !c->mid_row && (rows == 0 || col->row_starts[col->rows] != base))
                return fail(c, VF_ECORRUPT, "first repetition level of the column chunk is not 0");
        }
        for (int64_t done = 0; done < n && !(leaf->max_rep == 1 && lr.encoding == VF_PQ_ENC_RLE);) {
            int64_t k = VF_MIN(n - done, LEVEL_BATCH);
            if ((r = level_read(c, &lr, "repetition", leaf->max_rep, c->lv, k)) < 0)
                return r;
            if (base + done == c->entries_start && c->lv[0] != 0 && !c->mid_row)
                return fail(c, VF_ECORRUPT, "first repetition level of the column chunk is %d, not 0", c->lv[0]);
            if (leaf->max_rep == 1) {
                rows += append_row_starts(c->lv, k, base + done, col->row_starts + col->rows + rows);
            } else {
                memcpy(col->rep + base + done, c->lv, (size_t)k);
                for (int64_t i = 0; i < k; i++)
                    rows += c->lv[i] == 0;
            }
            done += k;
        }
    }
    if (leaf->max_def > 0) {
        if ((r = level_reader_init(c, &lr, "definition", def_enc, def_p, def_len, leaf->max_def, n)) < 0)
            return r;
        present = 0;
        const uint8_t m = (uint8_t)leaf->max_def;
        for (int64_t done = 0; done < n;) {
            if (!col->def && lr.encoding == VF_PQ_ENC_RLE) {
                /* A run of max_def: all present, nothing to store. */
                int64_t k = vf_pq_rle_skip_run(&lr.rle, m, n - done);
                if (k > 0) {
                    present += k;
                    done += k;
                    continue;
                }
            }
            int64_t k = VF_MIN(n - done, LEVEL_BATCH);
            if ((r = level_read(c, &lr, "definition", leaf->max_def, c->lv, k)) < 0)
                return r;
            done += k;
            if (!col->def && k > c->maxbuf_len) {
                memset(c->maxbuf + c->maxbuf_len, leaf->max_def, (size_t)(k - c->maxbuf_len));
                c->maxbuf_len = (int)k;
            }
            if (!col->def && memcmp(c->lv, c->maxbuf, (size_t)k) == 0) {
                present += k; /* all present: nothing to store */
                continue;
            }
            if (!col->def) {
                /* First non-max level: materialise the levels so far. */
                if ((r = grow_bytes(c, &col->def, &col->cap_def, base + n)) < 0)
                    return r;
                memset(col->def, m, (size_t)(base + done - k));
            } else if ((r = grow_bytes(c, &col->def, &col->cap_def, base + n)) < 0) {
                return r;
            }
            memcpy(col->def + base + done - k, c->lv, (size_t)k);
            for (int64_t i = 0; i < k; i++)
                present += c->lv[i] == m;
        }
    }
    col->num_entries += n;
    col->rows += rows;
    *nv = present;
    return 0;
}

/* ---- pages ------------------------------------------------------------------------ */

static int decode_values(chunk_ctx *c, int encoding, const uint8_t *p, size_t len, int64_t nv)
{
    if (nv == 0)
        return 0;
    switch (encoding) {
    case VF_PQ_ENC_PLAIN: return decode_plain(c, c->col, p, len, nv);
    case VF_PQ_ENC_PLAIN_DICTIONARY:
    case VF_PQ_ENC_RLE_DICTIONARY: return decode_dict_indices(c, p, len, nv);
    case VF_PQ_ENC_BYTE_STREAM_SPLIT: return decode_byte_stream_split(c, p, len, nv);
    case VF_PQ_ENC_RLE:
        if (c->leaf->physical == VF_PQ_BOOLEAN) {
            if (len < 4 || load_u32(p) > len - 4)
                return fail(c, VF_ECORRUPT, "RLE boolean values have a bad length prefix");
            vf_pq_rle d;
            vf_pq_rle_init(&d, p + 4, load_u32(p), 1);
            int r = reserve_values(c, c->col, nv);
            if (r < 0)
                return r;
            if (vf_pq_rle_read_u8(&d, c->col->values + c->col->num_values, nv) < 0)
                return fail(c, VF_ECORRUPT, "RLE boolean values are truncated or malformed");
            c->col->num_values += nv;
            return 0;
        }
        break;
    default: break;
    }
    return fail(c, VF_EUNSUPPORTED, "value encoding %s (%d) is not supported for %s", vf_pq_encoding_name(encoding),
                encoding, vf_pq_physical_name(c->leaf->physical));
}

static int data_page_v1_levels_values(chunk_ctx *c, const page_header *h, const uint8_t *p, size_t len);

static int grow_scratch(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap && *buf)
        return 0;
    uint8_t *p = vf_realloc(*buf, need ? need : 1);
    if (!p)
        return VF_ENOMEM;
    *buf = p;
    *cap = need;
    return 0;
}

/* A compressed v1 PLAIN page of fixed-width values without nulls, whose
 * values need no conversion, is decompressed straight into the column:
 * the page is [levels][values], so it is written to end exactly where the
 * page's values belong. The level bytes land on earlier values, which are
 * saved first and put back once the levels have been copied out. Returns
 * 1 when done, 0 when the page does not qualify (nothing changed), or an
 * error. */
static int data_page_v1_direct(chunk_ctx *c, const page_header *h, const uint8_t *payload)
{
    vf_pq_column *col = c->col;
    const vf_pq_node *leaf = c->leaf;
    int codec = c->meta->codec;
    size_t w = col->value_size;
    int physical = leaf->physical;
    size_t phys_size = physical == VF_PQ_INT32 || physical == VF_PQ_FLOAT ? 4
                       : physical == VF_PQ_INT64 || physical == VF_PQ_DOUBLE ? 8
                       : physical == VF_PQ_FIXED_LEN_BYTE_ARRAY ? (size_t)leaf->type_length
                                                                : 0;
    if (codec == VF_PQ_UNCOMPRESSED || h->encoding != VF_PQ_ENC_PLAIN || phys_size == 0 || w != phys_size ||
        (leaf->max_rep && h->rep_encoding != VF_PQ_ENC_RLE) || (leaf->max_def && h->def_encoding != VF_PQ_ENC_RLE))
        return 0;
    int64_t n = h->num_values;
    size_t total = (size_t)h->uncompressed_size;
    if ((uint64_t)n > total / w)
        return 0;
    size_t prefix = total - (size_t)n * w;
    if ((size_t)col->num_values * w < prefix || col->cap_values - col->num_values < n)
        return 0;
    int r = check_declared_size(c, codec, payload, (size_t)h->compressed_size, total);
    if (r < 0)
        return r;
    vf_pq_scratch *s = c->s;
    if ((r = grow_scratch(&s->saved, &s->saved_cap, prefix)) < 0 ||
        (r = grow_scratch(&s->levels, &s->levels_cap, prefix)) < 0)
        return r;
    uint8_t *dest = col->values + (size_t)col->num_values * w, *start = dest - prefix;
    memcpy(s->saved, start, prefix);
    r = decompress_into(c, codec, payload, (size_t)h->compressed_size, start, total);
    /* Walk the level prefixes in place to find where the values start. */
    const uint8_t *lv[2] = {NULL, NULL};
    size_t lens[2] = {0, 0}, pos = 0;
    int maxes[2] = {leaf->max_rep, leaf->max_def};
    int exact = r == 0;
    for (int k = 0; k < 2 && exact; k++) {
        if (maxes[k] == 0)
            continue;
        if (total - pos < 4 || load_u32(start + pos) > total - pos - 4) {
            exact = 0;
            break;
        }
        lens[k] = load_u32(start + pos);
        lv[k] = s->levels + pos + 4;
        pos += 4 + lens[k];
    }
    exact = exact && pos == prefix;
    if (exact)
        memcpy(s->levels, start, prefix);
    else if (r == 0 && (r = ensure_scratch(c, total)) == 0)
        memcpy(s->page, start, total); /* nulls or odd sizes: take the usual path */
    memcpy(start, s->saved, prefix);
    if (r < 0)
        return r;
    if (!exact) {
        r = data_page_v1_levels_values(c, h, s->page, total);
        return r < 0 ? r : 1;
    }
    int64_t nv;
    if ((r = decode_page_levels(c, n, lv[0], lens[0], VF_PQ_ENC_RLE, lv[1], lens[1], VF_PQ_ENC_RLE, &nv)) < 0)
        return r;
    /* nv values (nv <= n) now sit where they belong. */
    col->num_values += nv;
    return 1;
}

static int data_page_v1(chunk_ctx *c, const page_header *h, const uint8_t *payload)
{
    int r = data_page_v1_direct(c, h, payload);
    if (r != 0)
        return r < 0 ? r : 0;
    const uint8_t *p;
    r = decompress(c, payload, (size_t)h->compressed_size, (size_t)h->uncompressed_size, &p);
    if (r < 0)
        return r;
    return data_page_v1_levels_values(c, h, p, (size_t)h->uncompressed_size);
}

/* The level block of kind k (0: repetition, 1: definition) that starts a
 * decompressed v1 page's remaining bytes (*p, *len): *out and *out_len get
 * it, and *p / *len move past it. */
static int v1_level_block(chunk_ctx *c, int k, int encoding, int max_level, int64_t n, const uint8_t **p,
                          size_t *len, const uint8_t **out, size_t *out_len)
{
    size_t used;
    if (encoding == VF_PQ_ENC_RLE) {
        if (*len < 4 || load_u32(*p) > *len - 4)
            return fail(c, VF_ECORRUPT, "%s levels length prefix passes the page end", k ? "definition" : "repetition");
        *out_len = load_u32(*p);
        *out = *p + 4;
        used = 4 + *out_len;
    } else if (encoding == VF_PQ_ENC_BIT_PACKED) {
        uint64_t bytes = ((uint64_t)n * (uint64_t)bit_width(max_level) + 7) / 8;
        if (bytes > *len)
            return fail(c, VF_ECORRUPT, "bit-packed levels pass the page end");
        *out = *p;
        *out_len = used = (size_t)bytes;
    } else {
        return fail(c, VF_EUNSUPPORTED, "level encoding %s (%d) is not supported", vf_pq_encoding_name(encoding),
                    encoding);
    }
    *p += used;
    *len -= used;
    return 0;
}

/* A DATA_PAGE_V2's level blocks (stored uncompressed before its values)
 * must fit in the page. */
static int v2_level_lengths(chunk_ctx *c, const page_header *h)
{
    if (h->rep_len < 0 || h->def_len < 0 || (int64_t)h->rep_len + h->def_len > h->compressed_size ||
        (int64_t)h->rep_len + h->def_len > h->uncompressed_size)
        return fail(c, VF_ECORRUPT, "DATA_PAGE_V2 level lengths (%d, %d) pass the page size", h->rep_len, h->def_len);
    return 0;
}

/* The decompressed v1 page at p: levels, then values. */
static int data_page_v1_levels_values(chunk_ctx *c, const page_header *h, const uint8_t *p, size_t len)
{
    int r;
    int64_t n = h->num_values;
    const uint8_t *levels[2] = {NULL, NULL};
    size_t lens[2] = {0, 0};
    int encs[2] = {h->rep_encoding, h->def_encoding};
    int maxes[2] = {c->leaf->max_rep, c->leaf->max_def};
    for (int k = 0; k < 2; k++)
        if (maxes[k] > 0 && (r = v1_level_block(c, k, encs[k], maxes[k], n, &p, &len, &levels[k], &lens[k])) < 0)
            return r;
    int64_t nv;
    if ((r = decode_page_levels(c, n, levels[0], lens[0], encs[0], levels[1], lens[1], encs[1], &nv)) < 0)
        return r;
    return decode_values(c, h->encoding, p, len, nv);
}

/* The rows a data page of a repeated column starts (its repetition
 * levels equal to 0), from the levels alone: a v1 page is decompressed
 * (its levels lead the page), a v2 page's levels are stored uncompressed;
 * the values are not decoded (page-level reads). A v2 header's num_rows is
 * not trusted for this: it must agree with the levels. */
static int page_rows(chunk_ctx *c, const page_header *h, const uint8_t *payload, int64_t *rows)
{
    const uint8_t *page, *lv;
    size_t len, lvlen;
    int64_t n = h->num_values;
    int max_rep = c->leaf->max_rep, r, encoding = h->rep_encoding;
    if (h->type == VF_PQ_PAGE_DATA_V2) {
        if ((r = v2_level_lengths(c, h)) < 0)
            return r;
        lv = payload;
        lvlen = (size_t)h->rep_len;
        encoding = VF_PQ_ENC_RLE;
    } else if ((r = decompress(c, payload, (size_t)h->compressed_size, (size_t)h->uncompressed_size, &page)) < 0 ||
               (len = (size_t)h->uncompressed_size,
                r = v1_level_block(c, 0, encoding, max_rep, n, &page, &len, &lv, &lvlen)) < 0) {
        return r;
    }
    level_reader lr;
    if ((r = level_reader_init(c, &lr, "repetition", encoding, lv, lvlen, max_rep, n)) < 0)
        return r;
    int64_t zeros = 0;
    for (int64_t done = 0; done < n;) {
        int64_t k = VF_MIN(n - done, LEVEL_BATCH);
        if ((r = level_read(c, &lr, "repetition", max_rep, c->lv, k)) < 0)
            return r;
        for (int64_t i = 0; i < k; i++)
            zeros += c->lv[i] == 0;
        done += k;
    }
    if (h->type == VF_PQ_PAGE_DATA_V2 && zeros != h->num_rows)
        return fail(c, VF_ECORRUPT, "DATA_PAGE_V2 header says %d rows, its repetition levels start %lld",
                    h->num_rows, (long long)zeros);
    *rows = zeros;
    return 0;
}

static int data_page_v2(chunk_ctx *c, const page_header *h, const uint8_t *payload)
{
    int r = v2_level_lengths(c, h);
    if (r < 0)
        return r;
    size_t lv = (size_t)h->rep_len + (size_t)h->def_len;
    int64_t nv;
    r = decode_page_levels(c, h->num_values, payload, (size_t)h->rep_len, VF_PQ_ENC_RLE, payload + h->rep_len,
                               (size_t)h->def_len, VF_PQ_ENC_RLE, &nv);
    if (r < 0)
        return r;
    const uint8_t *src = payload + lv, *p = src;
    size_t src_len = (size_t)h->compressed_size - lv, len = (size_t)h->uncompressed_size - lv;
    if (h->is_compressed) {
        if ((r = decompress(c, src, src_len, len, &p)) < 0)
            return r;
    } else if (src_len != len) {
        return fail(c, VF_ECORRUPT, "uncompressed DATA_PAGE_V2 sizes differ (%zu, %zu)", src_len, len);
    }
    return decode_values(c, h->encoding, p, len, nv);
}

static int dictionary_page(chunk_ctx *c, const page_header *h, const uint8_t *payload)
{
    if (c->has_dict)
        return fail(c, VF_ECORRUPT, "second dictionary page in a column chunk");
    if (c->col->num_entries > c->entries_start)
        return fail(c, VF_ECORRUPT, "dictionary page after data pages");
    if (h->encoding != VF_PQ_ENC_PLAIN && h->encoding != VF_PQ_ENC_PLAIN_DICTIONARY)
        return fail(c, VF_EUNSUPPORTED, "dictionary page encoding %s (%d) is not supported",
                    vf_pq_encoding_name(h->encoding), h->encoding);
    if (h->num_values < 0)
        return fail(c, VF_ECORRUPT, "dictionary page has %d values", h->num_values);
    const uint8_t *p;
    int r = decompress(c, payload, (size_t)h->compressed_size, (size_t)h->uncompressed_size, &p);
    if (r < 0)
        return r;
    vf_pq_column_init(&c->dict, c->leaf);
    if ((r = reserve_values_ex(c, &c->dict, VF_MIN(h->num_values, (int64_t)h->uncompressed_size), 1)) < 0)
        return r;
    if ((r = decode_plain(c, &c->dict, p, (size_t)h->uncompressed_size, h->num_values)) < 0)
        return r;
    c->has_dict = 1;
    return 0;
}

/* Parses the page header at file offset off; *hlen gets its size. */
static int read_page_header(chunk_ctx *c, int64_t off, page_header *h, int64_t *hlen, const char *what)
{
    const uint8_t *p;
    int64_t avail;
    int r = fetch(c, off, VF_MIN(64, c->chunk_end - off), &p, &avail);
    if (r < 0)
        return r;
    for (;;) {
        vf_pq_tr t;
        vf_pq_tr_init(&t, p, (size_t)avail, what);
        parse_page_header(&t, h);
        if (!t.err) {
            *hlen = (int64_t)vf_pq_tr_consumed(&t);
            return 0;
        }
        /* Maybe only the window ended: retry with more bytes (headers with
         * large statistics), up to the chunk end. */
        if (off + avail >= c->chunk_end || t.err != VF_ECORRUPT)
            return vf_error_context(vf_error_context(t.err, "page %d", c->page), "%s", where(c));
        int64_t more = VF_MIN(c->chunk_end - off, avail * 4 + 4096);
        if ((r = fetch(c, off, more, &p, &avail)) < 0)
            return r;
    }
}

/* ---- chunk --------------------------------------------------------------------------- */

/* The first k with row_starts[k] >= entry (col->rows when none): row
 * starts ascend. */
static int64_t row_start_at_or_after(const vf_pq_column *col, int64_t entry)
{
    int64_t lo = 0, hi = col->rows;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (col->row_starts[mid] < entry)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* A repetition level r > 0 continues the list at depth r of the entry
 * before it, which must then hold an element there (its definition level
 * reaches that list's). A file where it does not (an empty or null list
 * "continued") has no meaning; assembling it anyway attached the value to
 * some earlier list, so it is refused. Only entries from `from` on are
 * checked; columns without stored definition levels cannot break it. */
static int check_continuations(chunk_ctx *c, int64_t from)
{
    vf_pq_column *col = c->col;
    const vf_pq_node *leaf = c->leaf;
    if (leaf->max_rep == 0 || !col->def || leaf->max_rep > 15)
        return 0;
    const vf_pq_node *path[64];
    int depth = 0;
    for (const vf_pq_node *n = leaf; n && n->parent && depth < 64; n = n->parent)
        path[depth++] = n;
    int16_t need[16] = {0};
    int def = 0, rep = 0;
    for (int k = depth - 1; k >= 0; k--) {
        if (path[k]->repetition == VF_PQ_OPTIONAL)
            def++;
        else if (path[k]->repetition == VF_PQ_REPEATED && rep < 15)
            need[++rep] = (int16_t)++def;
    }
    if (rep != leaf->max_rep)
        return 0; /* not the path the levels were decoded for: nothing to check against */
    /* max_rep 1: the next row start at or after i (the column may already
     * hold earlier row groups: found by bisection, not by a scan) */
    int64_t k = col->rep ? 0 : row_start_at_or_after(col, from);
    for (int64_t i = VF_MAX(from, 1); i < col->num_entries; i++) {
        int r;
        if (col->rep) {
            r = col->rep[i];
        } else {
            while (k < col->rows && col->row_starts[k] < i)
                k++;
            r = k < col->rows && col->row_starts[k] == i ? 0 : 1;
        }
        if (r > 0 && col->def[i - 1] < need[r])
            return fail(c, VF_ECORRUPT,
                        "level entry %lld continues a list (repetition level %d) that the entry before it left "
                        "empty or null (definition level %d)",
                        (long long)(i - c->entries_start), r, col->def[i - 1]);
    }
    return 0;
}

int vf_pq_decode_chunk(vf_pq_file *f, int row_group, int leaf_index, vf_pq_column *col, vf_pq_scratch *s)
{
    return vf_pq_decode_chunk_rows(f, row_group, leaf_index, col, s, 0, INT64_MAX, NULL);
}

/* Page-level reads: a data page whose row count its header gives (every
 * page of a non-repeated column: one entry per row; v2 pages: num_rows,
 * and a v2 page starts a row) is skipped without being fetched,
 * decompressed or decoded when it ends at or before row_lo, and the chunk
 * stops at the first page starting at or after row_hi (after row_hi for a
 * repeated column: a v1 page may continue the row before it). Pages of a
 * repeated column in v1 pages are decoded from the chunk's start. */
int vf_pq_decode_chunk_rows(vf_pq_file *f, int row_group, int leaf_index, vf_pq_column *col, vf_pq_scratch *s,
                            int64_t row_lo, int64_t row_hi, int64_t *first_row)
{
    if (first_row)
        *first_row = 0;
    const vf_pq_node *leaf = f->leaves[leaf_index];
    const vf_pq_row_group_meta *rg = &f->row_groups[row_group];
    const vf_pq_chunk_meta *m = vf_pq_chunk_at(f, row_group, leaf_index);
    if (!m)
        return vf_error(VF_EINVAL, "%s: leaf %d was not loaded (projected open)", f->name, leaf_index);
    /* ~16 KiB of scratch arrays, kept in s across chunks (a wide file with
     * small row groups decodes millions of chunks); only the header is
     * zeroed. */
    if (!s->chunk_ctx && !(s->chunk_ctx = vf_malloc(sizeof(chunk_ctx))))
        return VF_ENOMEM;
    chunk_ctx *c = s->chunk_ctx;
    memset(c, 0, offsetof(chunk_ctx, idx));
    c->f = f;
    c->leaf = leaf;
    c->meta = m;
    c->col = col;
    c->s = s;
    c->row_group = row_group;
    c->page = -1;
    c->entries_start = col->num_entries;
    int r = 0;
    int64_t rows_start = col->rows;
    if (leaf->type == VF_PQ_T_NULL) {
        r = vf_error(VF_EUNSUPPORTED, "%s: physical type %s%s is not supported", where(c),
                     vf_pq_physical_name(leaf->physical),
                     leaf->physical == VF_PQ_FIXED_LEN_BYTE_ARRAY ? " with this type_length" : "");
        goto out;
    }
    if (!m->has_meta) {
        r = vf_error(VF_ECORRUPT, "%s: column chunk has no meta_data", where(c));
        goto out;
    }
    if (m->external) {
        r = vf_error(VF_EUNSUPPORTED, "%s: column chunk stored in another file (file_path)", where(c));
        goto out;
    }
    if (m->physical != (int)leaf->physical) {
        r = vf_error(VF_ECORRUPT, "%s: chunk type %s differs from the schema's %s", where(c),
                     vf_pq_physical_name(m->physical), vf_pq_physical_name(leaf->physical));
        goto out;
    }
    if (m->num_values < 0 || (leaf->max_rep == 0 && m->num_values != rg->num_rows)) {
        r = vf_error(VF_ECORRUPT, "%s: %lld values for %lld rows", where(c), (long long)m->num_values,
                     (long long)rg->num_rows);
        goto out;
    }
    if (m->num_values == 0) {
        if (rg->num_rows != 0)
            r = vf_error(VF_ECORRUPT, "%s: no values for %lld rows", where(c), (long long)rg->num_rows);
        goto out;
    }
    int64_t start = m->data_page_offset;
    if (m->dictionary_page_offset > 0 && m->dictionary_page_offset < start)
        start = m->dictionary_page_offset;
    int64_t len = m->total_compressed_size;
    if (start < 4 || len <= 0 || (uint64_t)start > f->size || (uint64_t)len > f->size - (uint64_t)start) {
        r = vf_error(VF_ECORRUPT, "%s: column chunk range [%lld, +%lld) is outside the file (%llu bytes)", where(c),
                     (long long)start, (long long)len, (unsigned long long)f->size);
        goto out;
    }
    c->chunk_end = start + len;
    /* Reserve the values up front (the usual case has no nulls), but no
     * more than the chunk's bytes could plausibly expand to; exactly for
     * the first chunk, geometrically when appending row groups. */
    int64_t guess = VF_MIN(m->num_values, len * 64 + 4096);
    if ((r = reserve_values_ex(c, col, VF_MIN(guess, f->max_entries - col->num_values), col->num_values == 0)) < 0)
        goto out;
    int64_t pos = start, done = 0;
    int64_t skipped = 0; /* rows of the pages skipped before the first decoded one */
    int ranged = row_lo > 0 || row_hi < rg->num_rows, stopped = 0;
    while (done < m->num_values) {
        c->page++;
        if (pos >= c->chunk_end) {
            r = fail(c, VF_ECORRUPT, "column chunk ends after %lld of %lld values", (long long)done,
                     (long long)m->num_values);
            break;
        }
        page_header h;
        int64_t hlen = 0;
        if ((r = read_page_header(c, pos, &h, &hlen, "page header")) < 0)
            break;
        pos += hlen;
        if (h.compressed_size < 0 || h.uncompressed_size < 0 || h.compressed_size > c->chunk_end - pos) {
            r = fail(c, VF_ECORRUPT, "page of %d bytes passes the end of the column chunk", h.compressed_size);
            break;
        }
        if (ranged && (h.type == VF_PQ_PAGE_DATA || h.type == VF_PQ_PAGE_DATA_V2)) {
            int v2 = h.type == VF_PQ_PAGE_DATA_V2;
            int64_t at = skipped + (col->rows - rows_start); /* the page's first row */
            if (at > row_hi || (at == row_hi && leaf->max_rep == 0)) {
                stopped = 1;
                break;
            }
            /* a non-repeated column: one entry per row */
            int64_t prows = (v2 ? h.has_v2 : h.has_data) && leaf->max_rep == 0 ? h.num_values : -1;
            if (prows >= 0 && col->rows == rows_start && at + prows <= row_lo && h.num_values <= m->num_values - done) {
                skipped += prows;
                done += h.num_values;
                pos += h.compressed_size;
                s->pages_skipped++;
                continue;
            }
            if (prows < 0 && (v2 ? h.has_v2 : h.has_data) && leaf->max_rep > 0 && col->rows == rows_start &&
                at < row_lo && h.num_values >= 0 && h.num_values <= m->num_values - done) {
                /* A repeated column's page: its rows come from its
                 * repetition levels; its last row may go on in the next
                 * page (older writers split rows across v1 pages), which
                 * is then decoded from mid-row (the rows kept start at
                 * row_lo, after it). */
                const uint8_t *payload;
                int64_t avail, rows = 0;
                if ((r = fetch(c, pos, h.compressed_size, &payload, &avail)) < 0 ||
                    (r = page_rows(c, &h, payload, &rows)) < 0)
                    break;
                if (at + rows <= row_lo) {
                    skipped += rows;
                    done += h.num_values;
                    pos += h.compressed_size;
                    s->pages_skipped++;
                    c->mid_row = 1;
                    continue;
                }
            }
        }
        const uint8_t *payload;
        int64_t avail;
        if ((r = fetch(c, pos, h.compressed_size, &payload, &avail)) < 0)
            break;
        pos += h.compressed_size;
        /* The optional page CRC covers the page as stored (compressed,
         * levels included for v2 pages); a mismatch means the bytes on disk
         * are not the ones written, so no value of the page is trusted. */
        if (h.has_crc && h.compressed_size > 0) {
            uint32_t crc = (uint32_t)crc32(0L, payload, (uInt)h.compressed_size);
            if (crc != h.crc) {
                r = fail(c, VF_ECORRUPT, "page CRC mismatch (stored %08x, computed %08x): the page is damaged",
                         (unsigned)h.crc, (unsigned)crc);
                break;
            }
        }
        if (h.type == VF_PQ_PAGE_DICTIONARY) {
            if (!h.has_dict) {
                r = fail(c, VF_ECORRUPT, "dictionary page without its header");
                break;
            }
            if ((r = dictionary_page(c, &h, payload)) < 0)
                break;
        } else if (h.type == VF_PQ_PAGE_DATA || h.type == VF_PQ_PAGE_DATA_V2) {
            int v2 = h.type == VF_PQ_PAGE_DATA_V2;
            if (!(v2 ? h.has_v2 : h.has_data)) {
                r = fail(c, VF_ECORRUPT, "data page without its header");
                break;
            }
            if (h.num_values < 0 || h.num_values > m->num_values - done) {
                r = fail(c, VF_ECORRUPT, "page has %d values but only %lld of the chunk's %lld remain", h.num_values,
                         (long long)(m->num_values - done), (long long)m->num_values);
                break;
            }
            if (h.num_values > f->max_entries - col->num_entries) {
                r = fail(c, VF_EUNSUPPORTED, "more than %lld level entries in one column (reader limit)",
                         (long long)f->max_entries);
                break;
            }
            r = v2 ? data_page_v2(c, &h, payload) : data_page_v1(c, &h, payload);
            if (r < 0)
                break;
            s->pages_decoded++;
            done += h.num_values;
        }
        /* INDEX_PAGE and unknown page types are skipped. */
    }
    if (r == 0 && (stopped ? skipped + col->rows - rows_start > rg->num_rows
                           : skipped + col->rows - rows_start != rg->num_rows))
        r = vf_error(VF_ECORRUPT, "%s: column chunk has %lld rows, the row group %lld", where(c),
                     (long long)(skipped + col->rows - rows_start), (long long)rg->num_rows);
    if (r == 0) {
        /* A range read may start mid-row: its leading entries continue a
         * row whose start was skipped. */
        int64_t from = c->entries_start;
        if (c->mid_row) {
            from = col->num_entries;
            if (col->rep) {
                for (int64_t i = c->entries_start; i < col->num_entries; i++)
                    if (col->rep[i] == 0) {
                        from = i;
                        break;
                    }
            } else {
                int64_t k = row_start_at_or_after(col, c->entries_start);
                if (k < col->rows)
                    from = col->row_starts[k];
            }
        }
        r = check_continuations(c, from + 1);
    }
    if (r == 0 && first_row)
        *first_row = skipped;
out:
    vf_pq_column_free(&c->dict);
    free(c->where);
    c->where = NULL; /* c stays in s for the next chunk */
    return r;
}
