/*
 * page.c: decodes one column chunk (its pages) into a vf_pq_column:
 * definition/repetition levels (compactly, see read_internal.h) and the
 * present values densely, already converted to the leaf's vf_pq_type.
 * This file walks the chunk: it fetches pages, checks and parses their
 * headers, decompresses them and hands their levels to page_levels.c and
 * their values to page_values.c.
 *
 * A chunk spans [dictionary_page_offset or data_page_offset,
 * + total_compressed_size) and is read through a window of a few MiB
 * that is reused across pages, chunks and leaves of one read (so a large
 * chunk is never copied whole into fresh memory). Pages are walked until
 * their level counts reach the chunk's num_values. Supported:
 * DICTIONARY_PAGE (PLAIN), DATA_PAGE (v1: levels with a 4-byte length
 * prefix, compressed together with the values) and DATA_PAGE_V2 (levels
 * uncompressed without prefix, is_compressed); codecs UNCOMPRESSED,
 * SNAPPY, GZIP, ZSTD (the value encodings are listed in page_values.c).
 * Everything else fails with VF_EUNSUPPORTED naming what it is.
 *
 * Bounds: every page size is checked against the chunk, the size a
 * compressed page declares against its header before anything is
 * allocated for it, and an optional page CRC against the stored bytes.
 */
#define _GNU_SOURCE
#include "parquet/page_internal.h"

#include <snappy-c.h>
#include <stddef.h>
#include <stdlib.h>
#include <zlib.h>
#include <zstd.h>

#define WINDOW_BYTES ((int64_t)4 << 20)

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
const char *vf_pq_where(vf_pq_chunk_ctx *c)
{
    if (!c->where) {
        char *path = vf_pq_leaf_path_string(c->leaf);
        c->where = vf_asprintf("%s: column '%s', row group %d", c->f->name, path ? path : "?", c->row_group);
        free(path);
    }
    return c->where ? c->where : c->f->name;
}

int vf_pq_fail(vf_pq_chunk_ctx *c, int code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return vf_error(code, "%s, page %d: %s", vf_pq_where(c), c->page, msg);
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

/* Makes [off, off+len) of the file available; *p points at off and
 * *avail counts the bytes available from there up to the chunk end. */
static int fetch(vf_pq_chunk_ctx *c, int64_t off, int64_t len, const uint8_t **p, int64_t *avail)
{
    vf_pq_scratch *s = c->s;
    if (s->view && off >= s->view_start && len <= s->view_start + s->view_len - off) {
        *p = s->view + (off - s->view_start);
        *avail = VF_MIN(s->view_start + s->view_len, c->chunk_end) - off;
        return 0;
    }
    if (!(s->window && off >= s->window_start && off + len <= s->window_start + s->window_len)) {
        int64_t want = VF_MAX(len, VF_MIN(c->window_bytes > 0 ? c->window_bytes : WINDOW_BYTES, c->chunk_end - off));
        if ((size_t)want > s->window_cap) {
            if (want > c->f->max_bytes)
                return vf_pq_fail(c, VF_EUNSUPPORTED, "page of %lld bytes is above the reader limit", (long long)want);
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
            return vf_error_context(r, "%s", vf_pq_where(c));
        }
        s->window_start = off;
        s->window_len = want;
    }
    *p = s->window + (off - s->window_start);
    *avail = VF_MIN(s->window_start + s->window_len, c->chunk_end) - off;
    return 0;
}

/* ---- decompression ------------------------------------------------------------ */

static int ensure_scratch(vf_pq_chunk_ctx *c, size_t n)
{
    if (n <= c->s->page_cap && c->s->page)
        return 0;
    if ((int64_t)n > c->f->max_bytes)
        return vf_pq_fail(c, VF_EUNSUPPORTED, "page of %zu bytes is above the reader limit", n);
    size_t cap = n < 65536 ? 65536 : n;
    uint8_t *s = vf_malloc(cap);
    if (!s)
        return VF_ENOMEM;
    free(c->s->page);
    c->s->page = s;
    c->s->page_cap = cap;
    return 0;
}

static int inflate_gzip(vf_pq_chunk_ctx *c, const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 15 + 32) != Z_OK)
        return vf_pq_fail(c, VF_ENOMEM, "zlib init failed");
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
        return vf_pq_fail(c, VF_ECORRUPT, "GZIP data is corrupt or has the wrong size (%zu of %zu bytes)", produced,
                          dst_len);
    return 0;
}

/* Checks the size the compressed data itself declares, before anything
 * is allocated for what the (untrusted) page header asks. */
static int check_declared_size(vf_pq_chunk_ctx *c, int codec, const uint8_t *src, size_t src_len, size_t dst_len)
{
    size_t n;
    if (codec == VF_PQ_SNAPPY &&
        (snappy_uncompressed_length((const char *)src, src_len, &n) != SNAPPY_OK || n != dst_len))
        return vf_pq_fail(c, VF_ECORRUPT, "SNAPPY page has a bad header or the wrong size");
    if (codec == VF_PQ_ZSTD) {
        unsigned long long declared = ZSTD_getFrameContentSize(src, src_len);
        if (declared == ZSTD_CONTENTSIZE_ERROR || (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared > dst_len))
            return vf_pq_fail(c, VF_ECORRUPT, "ZSTD page has a bad frame header or the wrong size");
    }
    if (codec != VF_PQ_SNAPPY && codec != VF_PQ_GZIP && codec != VF_PQ_ZSTD)
        return vf_pq_fail(c, VF_EUNSUPPORTED, "compression codec %s (%d) is not supported", vf_pq_codec_name(codec),
                          codec);
    return 0;
}

/* Decompresses exactly dst_len bytes into dst (codec already checked). */
static int decompress_into(vf_pq_chunk_ctx *c, int codec, const uint8_t *src, size_t src_len, uint8_t *dst,
                           size_t dst_len)
{
    size_t n = dst_len;
    switch (codec) {
    case VF_PQ_SNAPPY:
        if (snappy_uncompress((const char *)src, src_len, (char *)dst, &n) != SNAPPY_OK || n != dst_len)
            return vf_pq_fail(c, VF_ECORRUPT, "SNAPPY data is corrupt");
        return 0;
    case VF_PQ_GZIP:
        if (src_len > UINT32_MAX || dst_len > UINT32_MAX)
            return vf_pq_fail(c, VF_EUNSUPPORTED, "GZIP page larger than 4 GiB");
        return inflate_gzip(c, src, src_len, dst, dst_len);
    case VF_PQ_ZSTD:
        n = ZSTD_decompress(dst, dst_len, src, src_len);
        if (ZSTD_isError(n) || n != dst_len)
            return vf_pq_fail(c, VF_ECORRUPT, "ZSTD data is corrupt or has the wrong size (%s)",
                              ZSTD_isError(n) ? ZSTD_getErrorName(n) : "size mismatch");
        return 0;
    default:
        return vf_pq_fail(c, VF_EUNSUPPORTED, "compression codec %s (%d) is not supported", vf_pq_codec_name(codec),
                          codec);
    }
}

/* Decompresses [src, src+src_len) into dst_len bytes; *out points at the
 * result (src itself when uncompressed). */
static int decompress(vf_pq_chunk_ctx *c, const uint8_t *src, size_t src_len, size_t dst_len, const uint8_t **out)
{
    int codec = c->meta->codec;
    if (codec == VF_PQ_UNCOMPRESSED) {
        if (src_len != dst_len)
            return vf_pq_fail(c, VF_ECORRUPT, "uncompressed page has %zu bytes but declares %zu", src_len, dst_len);
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

/* ---- pages ------------------------------------------------------------------------ */

static int data_page_v1_levels_values(vf_pq_chunk_ctx *c, const page_header *h, const uint8_t *p, size_t len);

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
static int data_page_v1_direct(vf_pq_chunk_ctx *c, const page_header *h, const uint8_t *payload)
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
        if (total - pos < 4 || vf_pq_load_u32(start + pos) > total - pos - 4) {
            exact = 0;
            break;
        }
        lens[k] = vf_pq_load_u32(start + pos);
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
    if ((r = vf_pq_decode_page_levels(c, n, lv[0], lens[0], VF_PQ_ENC_RLE, lv[1], lens[1], VF_PQ_ENC_RLE, &nv)) < 0)
        return r;
    /* nv values (nv <= n) now sit where they belong. */
    col->num_values += nv;
    return 1;
}

static int data_page_v1(vf_pq_chunk_ctx *c, const page_header *h, const uint8_t *payload)
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
static int v1_level_block(vf_pq_chunk_ctx *c, int k, int encoding, int max_level, int64_t n, const uint8_t **p,
                          size_t *len, const uint8_t **out, size_t *out_len)
{
    size_t used;
    if (encoding == VF_PQ_ENC_RLE) {
        if (*len < 4 || vf_pq_load_u32(*p) > *len - 4)
            return vf_pq_fail(c, VF_ECORRUPT, "%s levels length prefix passes the page end",
                              k ? "definition" : "repetition");
        *out_len = vf_pq_load_u32(*p);
        *out = *p + 4;
        used = 4 + *out_len;
    } else if (encoding == VF_PQ_ENC_BIT_PACKED) {
        uint64_t bytes = ((uint64_t)n * (uint64_t)vf_pq_bit_width(max_level) + 7) / 8;
        if (bytes > *len)
            return vf_pq_fail(c, VF_ECORRUPT, "bit-packed levels pass the page end");
        *out = *p;
        *out_len = used = (size_t)bytes;
    } else {
        return vf_pq_fail(c, VF_EUNSUPPORTED, "level encoding %s (%d) is not supported", vf_pq_encoding_name(encoding),
                          encoding);
    }
    *p += used;
    *len -= used;
    return 0;
}

/* A DATA_PAGE_V2's level blocks (stored uncompressed before its values)
 * must fit in the page. */
static int v2_level_lengths(vf_pq_chunk_ctx *c, const page_header *h)
{
    if (h->rep_len < 0 || h->def_len < 0 || (int64_t)h->rep_len + h->def_len > h->compressed_size ||
        (int64_t)h->rep_len + h->def_len > h->uncompressed_size)
        return vf_pq_fail(c, VF_ECORRUPT, "DATA_PAGE_V2 level lengths (%d, %d) pass the page size", h->rep_len,
                          h->def_len);
    return 0;
}

void vf_pq_set_value_window(vf_pq_chunk_ctx *c, int64_t base_entries, int64_t base_values, int64_t n, int64_t nv)
{
    vf_pq_column *col = c->col;
    int max_rep = c->leaf->max_rep;
    c->keep_values = 0;
    if (!c->ranged_rows || col->def || col->rep || nv != n || base_values != base_entries || max_rep > 1)
        return;
    int64_t lo = VF_MAX(c->keep_row_lo, 0), hi = VF_MAX(c->keep_row_hi, lo);
    /* entries of column rows lo and hi: a row's first entry (one per row
     * without repetition); past the decoded rows, the end */
    int64_t e_lo = lo >= col->rows ? col->num_entries : max_rep == 1 ? col->row_starts[lo] : lo;
    int64_t e_hi = hi >= col->rows ? col->num_entries : max_rep == 1 ? col->row_starts[hi] : hi;
    c->keep_value_lo = e_lo;
    c->keep_value_hi = VF_MAX(e_hi, e_lo);
    c->keep_values = 1;
}

/* The decompressed v1 page at p: levels, then values. */
static int data_page_v1_levels_values(vf_pq_chunk_ctx *c, const page_header *h, const uint8_t *p, size_t len)
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
    int64_t nv, base_entries = c->col->num_entries, base_values = c->col->num_values;
    if ((r = vf_pq_decode_page_levels(c, n, levels[0], lens[0], encs[0], levels[1], lens[1], encs[1], &nv)) < 0)
        return r;
    vf_pq_set_value_window(c, base_entries, base_values, n, nv);
    return vf_pq_decode_values(c, h->encoding, p, len, nv);
}

/* The rows a data page of a repeated column starts (its repetition
 * levels equal to 0), from the levels alone: a v1 page is decompressed
 * (its levels lead the page), a v2 page's levels are stored uncompressed;
 * the values are not decoded (page-level reads). A v2 header's num_rows is
 * not trusted for this: it must agree with the levels. */
static int page_rows(vf_pq_chunk_ctx *c, const page_header *h, const uint8_t *payload, int64_t *rows)
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
    vf_pq_level_reader lr;
    if ((r = vf_pq_level_reader_init(c, &lr, "repetition", encoding, lv, lvlen, max_rep, n)) < 0)
        return r;
    int64_t zeros = 0;
    for (int64_t done = 0; done < n;) {
        int64_t k = VF_MIN(n - done, VF_PQ_LEVEL_BATCH);
        if ((r = vf_pq_level_read(c, &lr, "repetition", max_rep, c->lv, k)) < 0)
            return r;
        for (int64_t i = 0; i < k; i++)
            zeros += c->lv[i] == 0;
        done += k;
    }
    if (h->type == VF_PQ_PAGE_DATA_V2 && zeros != h->num_rows)
        return vf_pq_fail(c, VF_ECORRUPT, "DATA_PAGE_V2 header says %d rows, its repetition levels start %lld",
                          h->num_rows, (long long)zeros);
    *rows = zeros;
    return 0;
}

static int data_page_v2(vf_pq_chunk_ctx *c, const page_header *h, const uint8_t *payload)
{
    int r = v2_level_lengths(c, h);
    if (r < 0)
        return r;
    size_t lv = (size_t)h->rep_len + (size_t)h->def_len;
    int64_t nv, base_entries = c->col->num_entries, base_values = c->col->num_values;
    r = vf_pq_decode_page_levels(c, h->num_values, payload, (size_t)h->rep_len, VF_PQ_ENC_RLE, payload + h->rep_len,
                               (size_t)h->def_len, VF_PQ_ENC_RLE, &nv);
    if (r < 0)
        return r;
    vf_pq_set_value_window(c, base_entries, base_values, h->num_values, nv);
    const uint8_t *src = payload + lv, *p = src;
    size_t src_len = (size_t)h->compressed_size - lv, len = (size_t)h->uncompressed_size - lv;
    if (h->is_compressed) {
        if ((r = decompress(c, src, src_len, len, &p)) < 0)
            return r;
    } else if (src_len != len) {
        return vf_pq_fail(c, VF_ECORRUPT, "uncompressed DATA_PAGE_V2 sizes differ (%zu, %zu)", src_len, len);
    }
    return vf_pq_decode_values(c, h->encoding, p, len, nv);
}

static int dictionary_page(vf_pq_chunk_ctx *c, const page_header *h, const uint8_t *payload)
{
    if (c->has_dict)
        return vf_pq_fail(c, VF_ECORRUPT, "second dictionary page in a column chunk");
    if (c->col->num_entries > c->entries_start && !c->dict_deferred)
        return vf_pq_fail(c, VF_ECORRUPT, "dictionary page after data pages");
    if (h->encoding != VF_PQ_ENC_PLAIN && h->encoding != VF_PQ_ENC_PLAIN_DICTIONARY)
        return vf_pq_fail(c, VF_EUNSUPPORTED, "dictionary page encoding %s (%d) is not supported",
                          vf_pq_encoding_name(h->encoding), h->encoding);
    if (h->num_values < 0)
        return vf_pq_fail(c, VF_ECORRUPT, "dictionary page has %d values", h->num_values);
    const uint8_t *p;
    int r = decompress(c, payload, (size_t)h->compressed_size, (size_t)h->uncompressed_size, &p);
    if (r < 0)
        return r;
    vf_pq_column_init(&c->dict, c->leaf);
    if ((r = vf_pq_reserve_values_ex(c, &c->dict, VF_MIN(h->num_values, (int64_t)h->uncompressed_size), 1)) < 0)
        return r;
    if ((r = vf_pq_decode_plain(c, &c->dict, p, (size_t)h->uncompressed_size, h->num_values)) < 0)
        return r;
    c->has_dict = 1;
    return 0;
}

/* Parses the page header at file offset off; *hlen gets its size. */
static int read_page_header(vf_pq_chunk_ctx *c, int64_t off, page_header *h, int64_t *hlen, const char *what)
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
            return vf_error_context(vf_error_context(t.err, "page %d", c->page), "%s", vf_pq_where(c));
        int64_t more = VF_MIN(c->chunk_end - off, avail * 4 + 4096);
        if ((r = fetch(c, off, more, &p, &avail)) < 0)
            return r;
    }
}

/* The header of the next page, at pos, after `done` of the chunk's values:
 * refused when the chunk ends first or the page would pass its end. */
static int next_page_header(vf_pq_chunk_ctx *c, int64_t pos, int64_t done, page_header *h, int64_t *hlen)
{
    if (pos >= c->chunk_end)
        return vf_pq_fail(c, VF_ECORRUPT, "column chunk ends after %lld of %lld values", (long long)done,
                          (long long)c->meta->num_values);
    int r = read_page_header(c, pos, h, hlen, "page header");
    if (r < 0)
        return r;
    if (h->compressed_size < 0 || h->uncompressed_size < 0 || h->compressed_size > c->chunk_end - pos - *hlen)
        return vf_pq_fail(c, VF_ECORRUPT, "page of %d bytes passes the end of the column chunk", h->compressed_size);
    return 0;
}

/* ---- page index ------------------------------------------------------------------------ */

/* Scans a column chunk's page headers from start (c set up for the chunk)
 * and records where each data page is and the rows and entries before it.
 * A repeated column's v1 page is decompressed for its repetition levels
 * (its rows), once; the other pages' rows are in their headers. */
static int build_page_index(vf_pq_chunk_ctx *c, int64_t start, vf_pq_chunk_pages **out)
{
    const vf_pq_chunk_meta *m = c->meta;
    int cap = 16, n = 0, r = 0, saved_page = c->page;
    vf_pq_chunk_pages *p = vf_malloc(sizeof *p + (size_t)cap * sizeof p->loc[0]);
    if (!p)
        return VF_ENOMEM;
    p->dict = NULL;
    int64_t pos = start, done = 0, rows = 0;
    for (int ordinal = 0; done < m->num_values && r == 0; ordinal++) {
        c->page = ordinal;
        page_header h;
        int64_t hlen = 0;
        if ((r = next_page_header(c, pos, done, &h, &hlen)) < 0)
            break;
        if (h.type == VF_PQ_PAGE_DATA || h.type == VF_PQ_PAGE_DATA_V2) {
            int v2 = h.type == VF_PQ_PAGE_DATA_V2;
            if (!(v2 ? h.has_v2 : h.has_data) || h.num_values < 0 || h.num_values > m->num_values - done) {
                r = vf_pq_fail(c, VF_ECORRUPT, "data page header of %d values does not fit the chunk's %lld",
                               h.num_values, (long long)m->num_values);
                break;
            }
            int64_t prows = h.num_values;
            if (c->leaf->max_rep > 0) {
                const uint8_t *payload;
                int64_t avail;
                if ((r = fetch(c, pos + hlen, h.compressed_size, &payload, &avail)) < 0 ||
                    (r = page_rows(c, &h, payload, &prows)) < 0)
                    break;
            }
            if (n == cap) {
                cap *= 2;
                vf_pq_chunk_pages *grown = vf_realloc(p, sizeof *p + (size_t)cap * sizeof p->loc[0]);
                if (!grown) {
                    r = VF_ENOMEM;
                    break;
                }
                p = grown;
            }
            p->loc[n++] = (vf_pq_page_loc){pos, rows, done, hlen + h.compressed_size, ordinal};
            rows += prows;
            done += h.num_values;
        }
        pos += hlen + h.compressed_size;
    }
    c->page = saved_page;
    if (r < 0) {
        free(p);
        return r;
    }
    p->count = n;
    *out = p;
    return 0;
}

/* The chunk's page index, built on first use (outside the lock; a second
 * builder's copy is dropped). NULL without an error when it cannot be
 * built for lack of memory for the table of chunks. */
static int chunk_page_index(vf_pq_chunk_ctx *c, int64_t start, const vf_pq_chunk_pages **out)
{
    vf_pq_file *f = c->f;
    size_t slot = (size_t)c->row_group * (size_t)f->num_leaves + (size_t)c->leaf->leaf_index;
    *out = NULL;
    pthread_mutex_lock(&f->index_lock);
    if (!f->page_index) {
        f->page_index = vf_calloc((size_t)f->num_row_groups * (size_t)f->num_leaves, sizeof *f->page_index);
        if (f->page_index)
            f->page_index_bytes += (size_t)f->num_row_groups * (size_t)f->num_leaves * sizeof *f->page_index;
    }
    const vf_pq_chunk_pages *have = f->page_index ? f->page_index[slot] : NULL;
    int table = f->page_index != NULL;
    pthread_mutex_unlock(&f->index_lock);
    if (!table || have) {
        *out = have;
        return 0;
    }
    vf_pq_chunk_pages *built;
    int r = build_page_index(c, start, &built);
    if (r < 0)
        return r;
    pthread_mutex_lock(&f->index_lock);
    if (f->page_index[slot]) {
        free(built);
    } else {
        f->page_index[slot] = built;
        f->page_index_bytes += sizeof *built + (size_t)built->count * sizeof built->loc[0];
    }
    *out = f->page_index[slot];
    pthread_mutex_unlock(&f->index_lock);
    return 0;
}

static size_t dict_bytes(const vf_pq_column *d);

/* The page index's dictionary (borrowed into c), or NULL. */
static const vf_pq_column *cached_dict(vf_pq_file *f, const vf_pq_chunk_pages *pages)
{
    pthread_mutex_lock(&f->index_lock);
    const vf_pq_column *d = pages->dict;
    pthread_mutex_unlock(&f->index_lock);
    return d;
}

/* Hands c's freshly decoded dictionary to the page index, which keeps it
 * for the next reads of the chunk (a random read of a big chunk otherwise
 * fetches and decodes a dictionary page of up to 1 MiB for one page of
 * values). Counted in page_index_bytes. */
static void keep_dict(vf_pq_chunk_ctx *c, vf_pq_chunk_pages *pages)
{
    vf_pq_file *f = c->f;
    vf_pq_column *copy = vf_malloc(sizeof *copy);
    if (!copy)
        return; /* not kept: the next read decodes it again */
    *copy = c->dict;
    pthread_mutex_lock(&f->index_lock);
    if (!pages->dict) {
        pages->dict = copy;
        f->page_index_bytes += dict_bytes(copy);
        c->dict_borrowed = 1;
        copy = NULL;
    }
    pthread_mutex_unlock(&f->index_lock);
    free(copy);
}

static size_t dict_bytes(const vf_pq_column *d)
{
    return sizeof *d + (size_t)d->cap_values * d->value_size +
           (d->offsets ? (size_t)(d->num_values + 1) * sizeof(int64_t) : 0) + (size_t)d->data_cap;
}

size_t vf_pq_drop_kept_dictionaries(vf_pq_file *f)
{
    size_t freed = 0;
    pthread_mutex_lock(&f->index_lock);
    for (size_t i = 0; f->page_index && i < (size_t)f->num_row_groups * (size_t)f->num_leaves; i++) {
        vf_pq_chunk_pages *p = f->page_index[i];
        if (p && p->dict) {
            freed += dict_bytes(p->dict);
            vf_pq_column_free(p->dict);
            free(p->dict);
            p->dict = NULL;
        }
    }
    f->page_index_bytes -= VF_MIN(freed, f->page_index_bytes);
    pthread_mutex_unlock(&f->index_lock);
    return freed;
}

void vf_pq_free_page_index(vf_pq_file *f)
{
    if (!f->page_index)
        return;
    for (size_t i = 0; i < (size_t)f->num_row_groups * (size_t)f->num_leaves; i++) {
        if (f->page_index[i] && f->page_index[i]->dict) {
            vf_pq_column_free(f->page_index[i]->dict);
            free(f->page_index[i]->dict);
        }
        free(f->page_index[i]);
    }
    free(f->page_index);
    f->page_index = NULL;
    f->page_index_bytes = 0;
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
static int check_continuations(vf_pq_chunk_ctx *c, int64_t from)
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
            return vf_pq_fail(c, VF_ECORRUPT,
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
    if (!s->chunk_ctx && !(s->chunk_ctx = vf_malloc(sizeof(vf_pq_chunk_ctx))))
        return VF_ENOMEM;
    vf_pq_chunk_ctx *c = s->chunk_ctx;
    memset(c, 0, offsetof(vf_pq_chunk_ctx, idx));
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
        r = vf_error(VF_EUNSUPPORTED, "%s: physical type %s%s is not supported", vf_pq_where(c),
                     vf_pq_physical_name(leaf->physical),
                     leaf->physical == VF_PQ_FIXED_LEN_BYTE_ARRAY ? " with this type_length" : "");
        goto out;
    }
    if (!m->has_meta) {
        r = vf_error(VF_ECORRUPT, "%s: column chunk has no meta_data", vf_pq_where(c));
        goto out;
    }
    if (m->external) {
        r = vf_error(VF_EUNSUPPORTED, "%s: column chunk stored in another file (file_path)", vf_pq_where(c));
        goto out;
    }
    if (m->physical != (int)leaf->physical) {
        r = vf_error(VF_ECORRUPT, "%s: chunk type %s differs from the schema's %s", vf_pq_where(c),
                     vf_pq_physical_name(m->physical), vf_pq_physical_name(leaf->physical));
        goto out;
    }
    if (m->num_values < 0 || (leaf->max_rep == 0 && m->num_values != rg->num_rows)) {
        r = vf_error(VF_ECORRUPT, "%s: %lld values for %lld rows", vf_pq_where(c), (long long)m->num_values,
                     (long long)rg->num_rows);
        goto out;
    }
    if (m->num_values == 0) {
        if (rg->num_rows != 0)
            r = vf_error(VF_ECORRUPT, "%s: no values for %lld rows", vf_pq_where(c), (long long)rg->num_rows);
        goto out;
    }
    int64_t start = m->data_page_offset;
    if (m->dictionary_page_offset > 0 && m->dictionary_page_offset < start)
        start = m->dictionary_page_offset;
    int64_t len = m->total_compressed_size;
    if (start < 4 || len <= 0 || (uint64_t)start > f->size || (uint64_t)len > f->size - (uint64_t)start) {
        r = vf_error(VF_ECORRUPT, "%s: column chunk range [%lld, +%lld) is outside the file (%llu bytes)",
                     vf_pq_where(c), (long long)start, (long long)len, (unsigned long long)f->size);
        goto out;
    }
    c->chunk_end = start + len;
    /* Reserve the values up front (the usual case has no nulls), but no
     * more than the chunk's bytes could plausibly expand to; exactly for
     * the first chunk, geometrically when appending row groups. */
    int64_t guess = VF_MIN(m->num_values, len * 64 + 4096);
    if ((r = vf_pq_reserve_values_ex(c, col, VF_MIN(guess, f->max_entries - col->num_values),
                                     col->num_values == 0)) < 0)
        goto out;
    int64_t pos = start, done = 0;
    int64_t skipped = 0; /* rows of the pages skipped before the first decoded one */
    /* With a page index the dictionary page is decoded only when a data
     * page of the range is dictionary-encoded: a writer falls back to PLAIN
     * once the dictionary is full (a float column's later pages), and a
     * random read then needs no dictionary. */
    page_header dict_h;
    int64_t dict_at = -1;      /* the deferred dictionary page's payload offset */
    int ranged = row_lo > 0 || row_hi < rg->num_rows, stopped = 0;
    /* A big chunk read from past its start: go to the page holding row_lo
     * through the chunk's page index (after the dictionary page, which is
     * read first as always). */
    const vf_pq_chunk_pages *index = NULL;
    if (row_lo > 0 && len >= f->page_index_min && (r = chunk_page_index(c, start, &index)) < 0)
        goto out;
    vf_pq_chunk_pages *pages = (vf_pq_chunk_pages *)index; /* owned by f; its dict under index_lock */
    if (index)
        c->window_bytes = 64 * 1024; /* the dictionary page, then a jump: no read-ahead of the chunk */
    const vf_pq_column *kept_dict = pages ? cached_dict(f, pages) : NULL;
    if (kept_dict) {
        /* Decoded by an earlier read: its page is stepped over unread. */
        c->dict = *kept_dict;
        c->has_dict = 1;
        c->dict_borrowed = 1;
        c->window_bytes = 4096;
    }
    while (done < m->num_values) {
        c->page++;
        page_header h;
        int64_t hlen = 0;
        if ((r = next_page_header(c, pos, done, &h, &hlen)) < 0)
            break;
        pos += hlen;
        if (index && index->count > 0 && (h.type == VF_PQ_PAGE_DATA || h.type == VF_PQ_PAGE_DATA_V2)) {
            /* The last page starting at or before row_lo (its rows are in
             * the index: the rows started before each page ascend). */
            int lo = 0, hi = index->count;
            while (hi - lo > 1) {
                int mid = lo + (hi - lo) / 2;
                if (index->loc[mid].first_row <= row_lo)
                    lo = mid;
                else
                    hi = mid;
            }
            const vf_pq_page_loc *to = &index->loc[lo];
            index = NULL; /* once */
            if (to->offset > pos - hlen && done == 0 && col->rows == rows_start) {
                pos = to->offset;
                done = to->entries_before;
                skipped = to->first_row;
                s->pages_skipped += lo;
                c->page = to->ordinal - 1;
                /* Random reads take a page or two: read each page alone, not
                 * WINDOW_BYTES of the chunk after it. */
                c->window_bytes = VF_MAX(to->span, (int64_t)4096);
                if (leaf->max_rep > 0)
                    c->mid_row = 1; /* the page may continue the row before it */
                continue;
            }
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
        if (h.type == VF_PQ_PAGE_DICTIONARY && c->dict_borrowed && pos - hlen == start) {
            pos += h.compressed_size; /* kept decoded with the page index */
            continue;
        }
        if (h.type == VF_PQ_PAGE_DICTIONARY && c->window_bytes > 0 && h.has_dict && dict_at < 0 && !c->has_dict) {
            dict_h = h; /* deferred (see dict_at) */
            dict_at = pos;
            pos += h.compressed_size;
            continue;
        }
        if (dict_at >= 0 && !c->has_dict && (h.type == VF_PQ_PAGE_DATA || h.type == VF_PQ_PAGE_DATA_V2) &&
            (h.encoding == VF_PQ_ENC_RLE_DICTIONARY || h.encoding == VF_PQ_ENC_PLAIN_DICTIONARY)) {
            const uint8_t *dict;
            int64_t dict_avail;
            if ((r = fetch(c, dict_at, dict_h.compressed_size, &dict, &dict_avail)) < 0)
                break;
            if (dict_h.has_crc && dict_h.compressed_size > 0 &&
                (uint32_t)crc32(0L, dict, (uInt)dict_h.compressed_size) != dict_h.crc) {
                r = vf_pq_fail(c, VF_ECORRUPT, "dictionary page CRC mismatch: the page is damaged");
                break;
            }
            c->dict_deferred = 1;
            r = dictionary_page(c, &dict_h, dict);
            c->dict_deferred = 0;
            if (r < 0)
                break;
            if (pages)
                keep_dict(c, pages);
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
                r = vf_pq_fail(c, VF_ECORRUPT, "page CRC mismatch (stored %08x, computed %08x): the page is damaged",
                               (unsigned)h.crc, (unsigned)crc);
                break;
            }
        }
        if (h.type == VF_PQ_PAGE_DICTIONARY) {
            if (!h.has_dict) {
                r = vf_pq_fail(c, VF_ECORRUPT, "dictionary page without its header");
                break;
            }
            if ((r = dictionary_page(c, &h, payload)) < 0)
                break;
        } else if (h.type == VF_PQ_PAGE_DATA || h.type == VF_PQ_PAGE_DATA_V2) {
            int v2 = h.type == VF_PQ_PAGE_DATA_V2;
            if (!(v2 ? h.has_v2 : h.has_data)) {
                r = vf_pq_fail(c, VF_ECORRUPT, "data page without its header");
                break;
            }
            if (h.num_values < 0 || h.num_values > m->num_values - done) {
                r = vf_pq_fail(c, VF_ECORRUPT, "page has %d values but only %lld of the chunk's %lld remain",
                               h.num_values, (long long)(m->num_values - done), (long long)m->num_values);
                break;
            }
            if (h.num_values > f->max_entries - col->num_entries) {
                r = vf_pq_fail(c, VF_EUNSUPPORTED, "more than %lld level entries in one column (reader limit)",
                               (long long)f->max_entries);
                break;
            }
            /* the rows kept, as rows of the column (see keep_values) */
            c->ranged_rows = ranged && row_hi - row_lo <= rg->num_rows;
            c->keep_row_lo = rows_start + (row_lo - skipped);
            c->keep_row_hi = rows_start + (VF_MIN(row_hi, rg->num_rows) - skipped);
            r = v2 ? data_page_v2(c, &h, payload) : data_page_v1(c, &h, payload);
            c->keep_values = 0;
            if (r < 0)
                break;
            s->pages_decoded++;
            done += h.num_values;
        }
        /* INDEX_PAGE and unknown page types are skipped. */
    }
    if (r == 0 && (stopped ? skipped + col->rows - rows_start > rg->num_rows
                           : skipped + col->rows - rows_start != rg->num_rows))
        r = vf_error(VF_ECORRUPT, "%s: column chunk has %lld rows, the row group %lld", vf_pq_where(c),
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
    if (c->dict_borrowed)
        vf_pq_column_init(&c->dict, leaf); /* the page index's: not freed here */
    else
        vf_pq_column_free(&c->dict);
    free(c->where);
    c->where = NULL; /* c stays in s for the next chunk */
    return r;
}
