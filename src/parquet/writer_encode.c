/*
 * writer_encode.c: turns one shredded column (writer_shred.c) into Parquet
 * pages: level and dictionary-index RLE/bit-packed hybrid, PLAIN values,
 * the dictionary with pyarrow's fallback to PLAIN, DATA_PAGE v1 / v2
 * framing, the codecs, and the chunk statistics.
 *
 * Invariants:
 *  - Pages start at row boundaries (rep level 0), which DATA_PAGE_V2
 *    requires and which keeps every page independently decodable. A page is
 *    closed at the first row boundary after its estimated encoded size
 *    reaches settings.page_size (so a page may exceed it by one row).
 *  - Dictionary mode: values are looked up in an open-addressing hash table
 *    keyed on their PLAIN bytes; data pages are buffered because the
 *    dictionary page, written first, is only complete at the end. Once the
 *    dictionary's PLAIN size passes VF_PQ_W_DICT_LIMIT the current page is
 *    closed at the next row boundary and the rest of the chunk is PLAIN.
 *  - BOOLEAN columns are always PLAIN (Parquet has no boolean dictionary).
 *  - Statistics follow the Parquet sort orders: signed for INT8..INT64,
 *    FLOAT, DOUBLE, FLOAT16; unsigned for UINT*, BOOLEAN, byte arrays. NaN
 *    never becomes a bound; a zero minimum is written -0.0 and a zero
 *    maximum +0.0.
 */
#include "parquet/writer_internal.h"

#include <limits.h>
#include <math.h>
#include <snappy-c.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

/* Levels per page are bounded so every page count fits Thrift's i32. */
#define MAX_PAGE_LEVELS (INT64_C(1) << 30)

int vf_pq_w_bit_width(uint64_t max_value)
{
    return max_value ? 64 - __builtin_clzll(max_value) : 0;
}

const char *vf_pq_w_codec_name(vf_pq_codec c)
{
    switch (c) {
    case VF_PQ_UNCOMPRESSED: return "UNCOMPRESSED";
    case VF_PQ_SNAPPY: return "SNAPPY";
    case VF_PQ_GZIP: return "GZIP";
    case VF_PQ_LZO: return "LZO";
    case VF_PQ_BROTLI: return "BROTLI";
    case VF_PQ_LZ4: return "LZ4";
    case VF_PQ_ZSTD: return "ZSTD";
    case VF_PQ_LZ4_RAW: return "LZ4_RAW";
    }
    return "unknown codec";
}

/* ---- RLE / bit-packed hybrid ---- */

static inline uint32_t level_at(const void *values, int is16, int64_t i)
{
    return is16 ? (uint32_t)(uint16_t)((const int16_t *)values)[i] : ((const uint32_t *)values)[i];
}

static int rle_encode(vf_buf *out, const void *values, int is16, int64_t count, int bit_width)
{
    int value_bytes = (bit_width + 7) / 8;
    uint64_t mask = bit_width >= 32 ? 0xFFFFFFFFu : ((UINT64_C(1) << bit_width) - 1);
    int64_t i = 0;
    while (i < count) {
        uint32_t v = level_at(values, is16, i);
        int64_t run = 1;
        while (i + run < count && level_at(values, is16, i + run) == v)
            run++;
        if (run >= 8) {
            int rc = vf_pq_tw_put_uvarint(out, (uint64_t)run << 1);
            if (rc < 0)
                return rc;
            uint8_t le[4];
            for (int b = 0; b < value_bytes; b++)
                le[b] = (uint8_t)(v >> (8 * b));
            if ((rc = vf_buf_append(out, le, (size_t)value_bytes)) < 0)
                return rc;
            i += run;
            continue;
        }
        /* Bit-packed groups of 8 until a run of 8 starts on a group boundary
         * (63 groups keep the header to one byte, as parquet-cpp does). */
        int64_t start = i;
        int groups = 0;
        for (;;) {
            i += 8;
            groups++;
            if (i >= count || groups == 63)
                break;
            uint32_t w = level_at(values, is16, i);
            int64_t k = 1;
            while (k < 8 && i + k < count && level_at(values, is16, i + k) == w)
                k++;
            if (k >= 8)
                break;
        }
        int rc = vf_pq_tw_put_uvarint(out, (uint64_t)groups << 1 | 1);
        if (rc < 0)
            return rc;
        size_t nbytes = (size_t)groups * (size_t)bit_width;
        if ((rc = vf_buf_reserve(out, nbytes + 8)) < 0)
            return rc;
        uint8_t *dst = out->data + out->len;
        uint64_t acc = 0;
        int bits = 0;
        size_t o = 0;
        for (int64_t j = start; j < start + (int64_t)groups * 8; j++) {
            uint64_t x = j < count ? (level_at(values, is16, j) & mask) : 0;
            acc |= x << bits;
            bits += bit_width;
            while (bits >= 8) {
                dst[o++] = (uint8_t)acc;
                acc >>= 8;
                bits -= 8;
            }
        }
        out->len += nbytes; /* groups of 8 always end on a byte boundary */
        if (i > count)
            i = count;
    }
    return 0;
}

int vf_pq_w_rle_encode_u16(vf_buf *out, const int16_t *values, int64_t count, int bit_width)
{
    return rle_encode(out, values, 1, count, bit_width);
}

int vf_pq_w_rle_encode_u32(vf_buf *out, const uint32_t *values, int64_t count, int bit_width)
{
    return rle_encode(out, values, 0, count, bit_width);
}

/* ---- codecs ---- */

int vf_pq_w_compress(vf_pq_codec codec, const uint8_t *data, size_t len, vf_buf *out)
{
    int rc;
    switch (codec) {
    case VF_PQ_UNCOMPRESSED:
        return vf_buf_append(out, data, len);
    case VF_PQ_SNAPPY: {
        size_t cap = snappy_max_compressed_length(len);
        if ((rc = vf_buf_reserve(out, cap)) < 0)
            return rc;
        size_t n = cap;
        if (snappy_compress((const char *)data, len, (char *)out->data + out->len, &n) != SNAPPY_OK)
            return vf_error(VF_EIO, "snappy compression failed");
        out->len += n;
        return 0;
    }
    case VF_PQ_GZIP: {
        if (len > UINT_MAX / 2)
            return vf_error(VF_EUNSUPPORTED, "page of %zu bytes too large for gzip", len);
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        /* windowBits 15 + 16: gzip framing, as parquet-mr and pyarrow write. */
        if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
            return vf_error(VF_ENOMEM, "gzip: deflateInit2 failed");
        size_t cap = deflateBound(&zs, (uLong)len) + 32;
        if ((rc = vf_buf_reserve(out, cap)) < 0) {
            deflateEnd(&zs);
            return rc;
        }
        zs.next_in = (Bytef *)(uintptr_t)data;
        zs.avail_in = (uInt)len;
        zs.next_out = out->data + out->len;
        zs.avail_out = (uInt)cap;
        int zr = deflate(&zs, Z_FINISH);
        size_t produced = cap - zs.avail_out;
        deflateEnd(&zs);
        if (zr != Z_STREAM_END)
            return vf_error(VF_EIO, "gzip compression failed (%d)", zr);
        out->len += produced;
        return 0;
    }
    case VF_PQ_ZSTD: {
        size_t cap = ZSTD_compressBound(len);
        if ((rc = vf_buf_reserve(out, cap)) < 0)
            return rc;
        size_t n = ZSTD_compress(out->data + out->len, cap, data, len, 1);
        if (ZSTD_isError(n))
            return vf_error(VF_EIO, "zstd compression failed: %s", ZSTD_getErrorName(n));
        out->len += n;
        return 0;
    }
    default:
        return vf_error(VF_EUNSUPPORTED, "codec %s is not supported by the writer", vf_pq_w_codec_name(codec));
    }
}

/* ---- dictionary ---- */

typedef struct dict {
    size_t value_size;   /* 0: byte arrays */
    int32_t count;
    vf_buf page;         /* the PLAIN dictionary page body */
    int64_t *entry_off;  /* byte arrays: entry bytes at page.data + off */
    uint32_t *entry_len;
    size_t entry_cap;
    /* Open addressing, linear probing. A slot's tag is the value itself for
     * fixed widths up to 8 bytes (compared without touching the entries),
     * otherwise a 64-bit hash of the bytes. */
    uint64_t *slot_tag;
    int32_t *slot_index; /* index + 1; 0 = empty */
    size_t slot_cap;     /* power of two */
} dict;

static void dict_free(dict *d)
{
    vf_buf_free(&d->page);
    free(d->entry_off);
    free(d->entry_len);
    free(d->slot_tag);
    free(d->slot_index);
    memset(d, 0, sizeof *d);
}

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return x;
}

static inline uint64_t hash_bytes(const uint8_t *p, size_t len)
{
    uint64_t h = UINT64_C(0x9e3779b97f4a7c15) ^ len;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix64(h ^ w);
        p += 8;
        len -= 8;
    }
    if (len) {
        uint64_t w = 0;
        memcpy(&w, p, len);
        h = mix64(h ^ w ^ (uint64_t)len << 56);
    }
    return h;
}

static int dict_grow_slots(dict *d)
{
    size_t cap = d->slot_cap ? d->slot_cap * 2 : 1024;
    uint64_t *tags = vf_malloc_array(cap, sizeof *tags);
    int32_t *slots = vf_calloc(cap, sizeof *slots);
    if (!tags || !slots) {
        free(tags);
        free(slots);
        return VF_ENOMEM;
    }
    for (size_t i = 0; i < d->slot_cap; i++) {
        if (!d->slot_index[i])
            continue;
        size_t p = mix64(d->slot_tag[i]) & (cap - 1);
        while (slots[p])
            p = (p + 1) & (cap - 1);
        slots[p] = d->slot_index[i];
        tags[p] = d->slot_tag[i];
    }
    free(d->slot_tag);
    free(d->slot_index);
    d->slot_tag = tags;
    d->slot_index = slots;
    d->slot_cap = cap;
    return 0;
}

static int dict_add_entry(dict *d, const uint8_t *key, size_t len)
{
    int rc;
    if (d->count == INT32_MAX)
        return vf_error(VF_ERANGE, "dictionary too large");
    if (d->value_size)
        return vf_buf_append(&d->page, key, len);
    if (len > UINT32_MAX)
        return vf_error(VF_ERANGE, "value of %zu bytes too large", len);
    if ((size_t)d->count == d->entry_cap) {
        size_t cap = d->entry_cap ? d->entry_cap * 2 : 256;
        int64_t *offs = vf_realloc(d->entry_off, cap * sizeof *offs);
        if (!offs)
            return VF_ENOMEM;
        d->entry_off = offs;
        uint32_t *lens = vf_realloc(d->entry_len, cap * sizeof *lens);
        if (!lens)
            return VF_ENOMEM;
        d->entry_len = lens;
        d->entry_cap = cap;
    }
    uint8_t le[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16), (uint8_t)(len >> 24)};
    if ((rc = vf_buf_reserve(&d->page, 4 + len)) < 0)
        return rc;
    vf_buf_append(&d->page, le, 4);
    d->entry_off[d->count] = (int64_t)d->page.len;
    d->entry_len[d->count] = (uint32_t)len;
    return vf_buf_append(&d->page, key, len);
}

/* Finds or adds a value; *index gets its dictionary index. */
static int dict_insert(dict *d, const uint8_t *key, size_t len, uint32_t *index)
{
    int rc;
    if ((size_t)d->count * 2 >= d->slot_cap && (rc = dict_grow_slots(d)) < 0)
        return rc;
    size_t mask = d->slot_cap - 1;
    uint64_t tag;
    size_t p;
    if (d->value_size && d->value_size <= 8) {
        tag = 0;
        memcpy(&tag, key, len);
        p = mix64(tag) & mask;
        while (d->slot_index[p]) {
            if (d->slot_tag[p] == tag) {
                *index = (uint32_t)(d->slot_index[p] - 1);
                return 0;
            }
            p = (p + 1) & mask;
        }
    } else {
        tag = hash_bytes(key, len);
        p = mix64(tag) & mask;
        while (d->slot_index[p]) {
            if (d->slot_tag[p] == tag) {
                int32_t i = d->slot_index[p] - 1;
                const uint8_t *e;
                size_t elen;
                if (d->value_size) {
                    elen = d->value_size;
                    e = d->page.data + (size_t)i * elen;
                } else {
                    elen = d->entry_len[i];
                    e = d->page.data + d->entry_off[i];
                }
                if (elen == len && memcmp(e, key, len) == 0) {
                    *index = (uint32_t)i;
                    return 0;
                }
            }
            p = (p + 1) & mask;
        }
    }
    if ((rc = dict_add_entry(d, key, len)) < 0)
        return rc;
    d->slot_index[p] = d->count + 1;
    d->slot_tag[p] = tag;
    *index = (uint32_t)d->count++;
    return 0;
}

/* ---- statistics ---- */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400));
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | (mant & 0x3FF) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static int set_stat_bytes(vf_pq_w_chunk *m, const void *min, size_t min_len, const void *max, size_t max_len)
{
    m->stat_min = vf_malloc(min_len ? min_len : 1);
    m->stat_max = vf_malloc(max_len ? max_len : 1);
    if (!m->stat_min || !m->stat_max)
        return VF_ENOMEM;
    memcpy(m->stat_min, min, min_len);
    memcpy(m->stat_max, max, max_len);
    m->stats.has_min_max = 1;
    m->stats.min_value = m->stat_min;
    m->stats.min_len = min_len;
    m->stats.max_value = m->stat_max;
    m->stats.max_len = max_len;
    return 0;
}

static int byte_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    if (c)
        return c;
    return alen < blen ? -1 : alen > blen;
}

/* The minimum and maximum of n fixed-width values of C type T as the
 * chunk statistics (write_legacy: also as the deprecated min/max). NaN is
 * skipped (only the float types have one, IS_NAN says which); no bound
 * when every value is NaN. Zero bounds take the sign the sort order wants:
 * -0 for a minimum, +0 for a maximum (a no-op for integers). C has no
 * generics, so one definition is stamped out per type. */
#define NEVER_NAN(x) (0)
#define DEFINE_MIN_MAX(name, T, IS_NAN)                                                         \
    static int name(vf_pq_w_chunk *m, const uint8_t *fx, int64_t n, int write_legacy)           \
    {                                                                                           \
        const T *v = (const T *)(const void *)fx;                                               \
        T lo = 0, hi = 0;                                                                       \
        int any = 0;                                                                            \
        for (int64_t i = 0; i < n; i++) {                                                       \
            if (IS_NAN(v[i]))                                                                   \
                continue;                                                                       \
            if (!any || v[i] < lo)                                                              \
                lo = v[i];                                                                      \
            if (!any || v[i] > hi)                                                              \
                hi = v[i];                                                                      \
            any = 1;                                                                            \
        }                                                                                       \
        if (!any)                                                                               \
            return 0;                                                                           \
        if (lo == 0)                                                                            \
            lo = -(T)0;                                                                         \
        if (hi == 0)                                                                            \
            hi = (T)0;                                                                          \
        m->stats.write_legacy = write_legacy;                                                   \
        return set_stat_bytes(m, &lo, sizeof lo, &hi, sizeof hi);                               \
    }

DEFINE_MIN_MAX(min_max_i32, int32_t, NEVER_NAN)
DEFINE_MIN_MAX(min_max_u32, uint32_t, NEVER_NAN)
DEFINE_MIN_MAX(min_max_i64, int64_t, NEVER_NAN)
DEFINE_MIN_MAX(min_max_u64, uint64_t, NEVER_NAN)
DEFINE_MIN_MAX(min_max_float, float, isnan)
DEFINE_MIN_MAX(min_max_double, double, isnan)

static int compute_stats(const vf_pq_w_leaf *lf, const vf_pq_w_column *col, vf_pq_w_chunk *m)
{
    m->has_stats = 1;
    m->stats.has_null_count = 1;
    m->stats.null_count = col->num_levels - col->num_values;
    int64_t n = col->num_values;
    if (n == 0)
        return 0;
    const uint8_t *fx = col->fixed;
    switch (lf->type) {
    case VF_PQ_T_BOOL: {
        uint8_t lo = 1, hi = 0;
        for (int64_t i = 0; i < n; i++) {
            lo &= fx[i];
            hi |= fx[i];
        }
        return set_stat_bytes(m, &lo, 1, &hi, 1);
    }
    case VF_PQ_T_INT8:
    case VF_PQ_T_INT16:
    case VF_PQ_T_INT32: return min_max_i32(m, fx, n, 1);
    case VF_PQ_T_UINT8:
    case VF_PQ_T_UINT16:
    case VF_PQ_T_UINT32: return min_max_u32(m, fx, n, 0);
    case VF_PQ_T_INT64: return min_max_i64(m, fx, n, 1);
    case VF_PQ_T_UINT64: return min_max_u64(m, fx, n, 0);
    case VF_PQ_T_FLOAT: return min_max_float(m, fx, n, 1);
    case VF_PQ_T_DOUBLE: return min_max_double(m, fx, n, 1);
    case VF_PQ_T_FLOAT16: {
        const uint16_t *v = (const uint16_t *)(const void *)fx;
        float lo = INFINITY, hi = -INFINITY;
        uint16_t lo_bits = 0, hi_bits = 0;
        int any = 0;
        for (int64_t i = 0; i < n; i++) {
            float f = half_to_float(v[i]);
            if (isnan(f))
                continue;
            if (!any || f < lo) {
                lo = f;
                lo_bits = v[i];
            }
            if (!any || f > hi) {
                hi = f;
                hi_bits = v[i];
            }
            any = 1;
        }
        if (!any)
            return 0;
        if (lo == 0.0f)
            lo_bits = 0x8000;
        if (hi == 0.0f)
            hi_bits = 0x0000;
        m->stats.write_legacy = 1;
        return set_stat_bytes(m, &lo_bits, 2, &hi_bits, 2);
    }
    case VF_PQ_T_FIXED_BINARY: {
        size_t w = lf->value_size;
        const uint8_t *lo = fx, *hi = fx;
        for (int64_t i = 1; i < n; i++) {
            const uint8_t *x = fx + (size_t)i * w;
            if (memcmp(x, lo, w) < 0)
                lo = x;
            if (memcmp(x, hi, w) > 0)
                hi = x;
        }
        if (w > VF_PQ_W_MAX_STAT_LEN)
            return 0;
        return set_stat_bytes(m, lo, w, hi, w);
    }
    case VF_PQ_T_STRING:
    case VF_PQ_T_BINARY: {
        const int64_t *off = col->leaf->offsets;
        const uint8_t *data = col->leaf->data;
        int64_t lo = col->value_index[0], hi = lo;
        for (int64_t i = 1; i < n; i++) {
            int64_t x = col->value_index[i];
            const uint8_t *xp = data + off[x];
            size_t xl = (size_t)(off[x + 1] - off[x]);
            if (byte_cmp(xp, xl, data + off[lo], (size_t)(off[lo + 1] - off[lo])) < 0)
                lo = x;
            if (byte_cmp(xp, xl, data + off[hi], (size_t)(off[hi + 1] - off[hi])) > 0)
                hi = x;
        }
        size_t lo_len = (size_t)(off[lo + 1] - off[lo]), hi_len = (size_t)(off[hi + 1] - off[hi]);
        if (lo_len > VF_PQ_W_MAX_STAT_LEN || hi_len > VF_PQ_W_MAX_STAT_LEN)
            return 0;
        return set_stat_bytes(m, data + off[lo], lo_len, data + off[hi], hi_len);
    }
    default:
        return 0;
    }
}

void vf_pq_w_chunk_free(vf_pq_w_chunk *c)
{
    free(c->stat_min);
    free(c->stat_max);
    memset(c, 0, sizeof *c);
}

/* ---- pages ---- */

typedef struct chunk_encoder {
    const vf_pq_writer_settings *settings;
    const vf_pq_w_leaf *leaf;
    const vf_pq_w_column *col;
    vf_buf *data_pages;
    vf_pq_w_chunk *meta;
    dict dict;
    uint32_t *indices;    /* dictionary indices of the current page */
    size_t indices_cap;
    vf_buf rep, def, values, body, compressed, header;
    int dict_pages, plain_pages;
} chunk_encoder;

static void put_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static int append_u32le(vf_buf *b, uint32_t v)
{
    uint8_t le[4];
    put_u32le(le, v);
    return vf_buf_append(b, le, 4);
}

/* PLAIN values [v0, v1) of the column into e->values. */
static int plain_values(chunk_encoder *e, int64_t v0, int64_t v1)
{
    const vf_pq_w_leaf *lf = e->leaf;
    const vf_pq_w_column *col = e->col;
    int rc;
    if (lf->physical == VF_PQ_BOOLEAN) {
        size_t nbytes = (size_t)((v1 - v0 + 7) / 8);
        if ((rc = vf_buf_reserve(&e->values, nbytes)) < 0)
            return rc;
        uint8_t *dst = e->values.data + e->values.len;
        memset(dst, 0, nbytes);
        for (int64_t i = v0; i < v1; i++)
            if (col->fixed[i])
                dst[(i - v0) >> 3] |= (uint8_t)(1u << ((i - v0) & 7));
        e->values.len += nbytes;
        return 0;
    }
    if (lf->value_size)
        return vf_buf_append(&e->values, col->fixed + (size_t)v0 * lf->value_size,
                             (size_t)(v1 - v0) * lf->value_size);
    const int64_t *off = col->leaf->offsets;
    const uint8_t *data = col->leaf->data;
    size_t total = 0;
    for (int64_t i = v0; i < v1; i++) {
        int64_t x = col->value_index[i];
        total += 4 + (size_t)(off[x + 1] - off[x]);
    }
    if ((rc = vf_buf_reserve(&e->values, total)) < 0)
        return rc;
    uint8_t *dst = e->values.data + e->values.len;
    for (int64_t i = v0; i < v1; i++) {
        int64_t x = col->value_index[i];
        size_t len = (size_t)(off[x + 1] - off[x]);
        put_u32le(dst, (uint32_t)len);
        memcpy(dst + 4, data + off[x], len);
        dst += 4 + len;
    }
    e->values.len += total;
    return 0;
}

static int dict_index_width(const dict *d)
{
    int w = vf_pq_w_bit_width(d->count > 0 ? (uint64_t)(d->count - 1) : 0);
    return w ? w : 1;
}

/* Compresses `body` (or only its values part for v2) and appends header +
 * page to out; adds to the chunk sizes. */
static int emit_page(chunk_encoder *e, vf_buf *out, vf_pq_tw_page_header *h, const uint8_t *levels,
                     size_t levels_len, const uint8_t *payload, size_t payload_len)
{
    vf_pq_codec codec = e->settings->codec;
    int rc;
    e->compressed.len = 0;
    const uint8_t *stored = payload;
    size_t stored_len = payload_len;
    if (codec != VF_PQ_UNCOMPRESSED && !(h->type == VF_PQ_W_PAGE_DATA_V2 && !h->is_compressed)) {
        if ((rc = vf_pq_w_compress(codec, payload, payload_len, &e->compressed)) < 0)
            return rc;
        stored = e->compressed.data;
        stored_len = e->compressed.len;
    }
    if (levels_len + payload_len > INT32_MAX || levels_len + stored_len > INT32_MAX)
        return vf_error(VF_ERANGE, "page larger than 2 GiB");
    h->uncompressed_page_size = (int32_t)(levels_len + payload_len);
    h->compressed_page_size = (int32_t)(levels_len + stored_len);
    e->header.len = 0;
    if ((rc = vf_pq_tw_write_page_header(&e->header, h)) < 0)
        return rc;
    if ((rc = vf_buf_append(out, e->header.data, e->header.len)) < 0 ||
        (rc = vf_buf_append(out, levels, levels_len)) < 0 || (rc = vf_buf_append(out, stored, stored_len)) < 0)
        return rc;
    e->meta->total_uncompressed_size += (int64_t)(e->header.len + levels_len + payload_len);
    e->meta->total_compressed_size += (int64_t)(e->header.len + levels_len + stored_len);
    return 0;
}

/* Writes the data page of slots [s0, s1) holding values [v0, v1). */
static int flush_data_page(chunk_encoder *e, int64_t s0, int64_t s1, int64_t v0, int64_t v1, int dict_mode,
                           int64_t num_indices)
{
    const vf_pq_w_leaf *lf = e->leaf;
    const vf_pq_w_column *col = e->col;
    int v2 = e->settings->data_page_version == 2;
    int rc;
    int64_t nlev = s1 - s0;
    int64_t rows = nlev;
    e->rep.len = e->def.len = e->values.len = e->body.len = 0;
    if (lf->max_rep > 0) {
        rows = 0;
        for (int64_t s = s0; s < s1; s++)
            rows += col->rep[s] == 0;
        if ((rc = vf_pq_w_rle_encode_u16(&e->rep, col->rep + s0, nlev, vf_pq_w_bit_width((uint64_t)lf->max_rep))) < 0)
            return rc;
    }
    if (lf->max_def > 0 &&
        (rc = vf_pq_w_rle_encode_u16(&e->def, col->def + s0, nlev, vf_pq_w_bit_width((uint64_t)lf->max_def))) < 0)
        return rc;
    if (dict_mode) {
        int width = dict_index_width(&e->dict);
        if ((rc = vf_buf_append_u8(&e->values, (uint8_t)width)) < 0 ||
            (rc = vf_pq_w_rle_encode_u32(&e->values, e->indices, num_indices, width)) < 0)
            return rc;
    } else if ((rc = plain_values(e, v0, v1)) < 0) {
        return rc;
    }

    vf_pq_tw_page_header h;
    memset(&h, 0, sizeof h);
    h.num_values = (int32_t)nlev;
    h.encoding = dict_mode ? VF_PQ_W_ENC_RLE_DICTIONARY : VF_PQ_W_ENC_PLAIN;
    if (!v2) {
        h.type = VF_PQ_W_PAGE_DATA;
        h.def_encoding = VF_PQ_W_ENC_RLE;
        h.rep_encoding = VF_PQ_W_ENC_RLE;
        if (lf->max_rep > 0 && ((rc = append_u32le(&e->body, (uint32_t)e->rep.len)) < 0 ||
                                (rc = vf_buf_append(&e->body, e->rep.data, e->rep.len)) < 0))
            return rc;
        if (lf->max_def > 0 && ((rc = append_u32le(&e->body, (uint32_t)e->def.len)) < 0 ||
                                (rc = vf_buf_append(&e->body, e->def.data, e->def.len)) < 0))
            return rc;
        if ((rc = vf_buf_append(&e->body, e->values.data, e->values.len)) < 0)
            return rc;
        rc = emit_page(e, e->data_pages, &h, NULL, 0, e->body.data, e->body.len);
    } else {
        h.type = VF_PQ_W_PAGE_DATA_V2;
        h.num_nulls = (int32_t)(nlev - (v1 - v0));
        h.num_rows = (int32_t)rows;
        h.rep_levels_byte_length = (int32_t)e->rep.len;
        h.def_levels_byte_length = (int32_t)e->def.len;
        h.is_compressed = e->settings->codec != VF_PQ_UNCOMPRESSED;
        if ((rc = vf_buf_append(&e->body, e->rep.data, e->rep.len)) < 0 ||
            (rc = vf_buf_append(&e->body, e->def.data, e->def.len)) < 0)
            return rc;
        rc = emit_page(e, e->data_pages, &h, e->body.data, e->body.len, e->values.data, e->values.len);
    }
    if (rc < 0)
        return rc;
    if (dict_mode)
        e->dict_pages++;
    else
        e->plain_pages++;
    return 0;
}

/* Looks value v up in the dictionary (adding it) and records its index. */
static int dict_add_value(chunk_encoder *e, int64_t v, int64_t num_indices)
{
    const vf_pq_w_column *col = e->col;
    const uint8_t *key;
    size_t len;
    if (e->leaf->value_size) {
        len = e->leaf->value_size;
        key = col->fixed + (size_t)v * len;
    } else {
        int64_t x = col->value_index[v];
        key = col->leaf->data + col->leaf->offsets[x];
        len = (size_t)(col->leaf->offsets[x + 1] - col->leaf->offsets[x]);
    }
    if ((size_t)num_indices == e->indices_cap) {
        size_t cap = e->indices_cap ? e->indices_cap * 2 : 4096;
        uint32_t *p = vf_realloc(e->indices, cap * sizeof *p);
        if (!p)
            return VF_ENOMEM;
        e->indices = p;
        e->indices_cap = cap;
    }
    return dict_insert(&e->dict, key, len, &e->indices[num_indices]);
}

static int64_t value_bits(const chunk_encoder *e, int64_t v)
{
    const vf_pq_w_leaf *lf = e->leaf;
    if (lf->physical == VF_PQ_BOOLEAN)
        return 1;
    if (lf->value_size)
        return (int64_t)lf->value_size * 8;
    int64_t x = e->col->value_index[v];
    return (4 + e->col->leaf->offsets[x + 1] - e->col->leaf->offsets[x]) * 8;
}

static int encode_pages(chunk_encoder *e)
{
    int rc = 0;
    const vf_pq_w_column *col = e->col;
    const vf_pq_w_leaf *lf = e->leaf;
    int dict_mode = e->settings->dictionary && lf->physical != VF_PQ_BOOLEAN && col->num_values > 0;
    e->dict.value_size = lf->value_size;
    if (dict_mode) {
        /* Size the table for the chunk up front (at most 64 Ki values' worth)
         * so small chunks never rehash. */
        while (e->dict.slot_cap < 2 * (size_t)VF_MIN(col->num_values, 65536) && (rc = dict_grow_slots(&e->dict)) == 0)
            ;
        if (rc < 0)
            return rc;
    }
    int64_t page_bits = (int64_t)(e->settings->page_size > (size_t)(INT64_MAX / 16) ? INT64_MAX / 16
                                                                                     : e->settings->page_size) * 8;
    int64_t level_bits = (lf->max_rep > 0) + (lf->max_def > 0);
    int64_t L = col->num_levels, slot = 0, val = 0;
    if (L == 0)
        return flush_data_page(e, 0, 0, 0, 0, 0, 0);
    while (slot < L) {
        int64_t s0 = slot, v0 = val, num_indices = 0, bits = 0;
        int page_dict = dict_mode;
        for (;;) {
            bits += level_bits;
            if (col->def[slot] == lf->max_def) {
                if (page_dict) {
                    if ((rc = dict_add_value(e, val, num_indices)) < 0)
                        return rc;
                    num_indices++;
                    bits += dict_index_width(&e->dict);
                } else {
                    bits += value_bits(e, val);
                }
                val++;
            }
            slot++;
            if (slot == L)
                break;
            if (col->rep && col->rep[slot] != 0)
                continue;
            if (bits >= page_bits || slot - s0 >= MAX_PAGE_LEVELS ||
                (page_dict && e->dict.page.len > VF_PQ_W_DICT_LIMIT))
                break;
        }
        if (slot - s0 > INT32_MAX)
            return vf_error(VF_ERANGE, "a single row holds more than 2^31 values");
        if ((rc = flush_data_page(e, s0, slot, v0, val, page_dict, num_indices)) < 0)
            return rc;
        if (page_dict && e->dict.page.len > VF_PQ_W_DICT_LIMIT)
            dict_mode = 0; /* fall back to PLAIN for the rest of the chunk */
    }
    return 0;
}

int vf_pq_w_encode_chunk(const vf_pq_writer_settings *s, const vf_pq_w_leaf *lf, const vf_pq_w_column *col,
                         vf_buf *dict_page, vf_buf *data_pages, vf_pq_w_chunk *meta)
{
    memset(meta, 0, sizeof *meta);
    chunk_encoder e;
    memset(&e, 0, sizeof e);
    e.settings = s;
    e.leaf = lf;
    e.col = col;
    e.data_pages = data_pages;
    e.meta = meta;
    size_t dict_start = dict_page->len;
    int rc = encode_pages(&e);
    if (rc == 0 && e.dict_pages > 0) {
        vf_pq_tw_page_header h;
        memset(&h, 0, sizeof h);
        h.type = VF_PQ_W_PAGE_DICTIONARY;
        h.num_values = e.dict.count;
        h.encoding = VF_PQ_W_ENC_PLAIN;
        h.is_sorted = 0;
        rc = emit_page(&e, dict_page, &h, NULL, 0, e.dict.page.data, e.dict.page.len);
    }
    if (rc == 0)
        rc = compute_stats(lf, col, meta);
    if (rc == 0) {
        meta->num_values = col->num_levels;
        meta->has_dictionary_page = e.dict_pages > 0;
        meta->dictionary_page_offset = 0;
        meta->data_page_offset = (int64_t)(dict_page->len - dict_start);
        int page_type = s->data_page_version == 2 ? VF_PQ_W_PAGE_DATA_V2 : VF_PQ_W_PAGE_DATA;
        meta->encodings[meta->num_encodings++] = VF_PQ_W_ENC_PLAIN;
        meta->encodings[meta->num_encodings++] = VF_PQ_W_ENC_RLE;
        if (e.dict_pages > 0) {
            meta->encodings[meta->num_encodings++] = VF_PQ_W_ENC_RLE_DICTIONARY;
            meta->encoding_stats[meta->num_encoding_stats++] =
                (vf_pq_tw_page_encoding_stats){VF_PQ_W_PAGE_DICTIONARY, VF_PQ_W_ENC_PLAIN, 1};
            meta->encoding_stats[meta->num_encoding_stats++] =
                (vf_pq_tw_page_encoding_stats){page_type, VF_PQ_W_ENC_RLE_DICTIONARY, e.dict_pages};
        }
        if (e.plain_pages > 0)
            meta->encoding_stats[meta->num_encoding_stats++] =
                (vf_pq_tw_page_encoding_stats){page_type, VF_PQ_W_ENC_PLAIN, e.plain_pages};
    }
    dict_free(&e.dict);
    free(e.indices);
    vf_buf_free(&e.rep);
    vf_buf_free(&e.def);
    vf_buf_free(&e.values);
    vf_buf_free(&e.body);
    vf_buf_free(&e.compressed);
    vf_buf_free(&e.header);
    if (rc < 0) {
        vf_pq_w_chunk_free(meta);
        return vf_error_context(rc, "column %s", lf->dotted);
    }
    return 0;
}
