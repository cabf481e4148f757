/*
 * page_levels.c: the definition and repetition levels of a data page
 * (the RLE/bit-packed hybrid, or the deprecated BIT_PACKED encoding), kept
 * compactly in the vf_pq_column (see read_internal.h).
 *
 * Speed: levels are decoded in small batches into a cache-resident
 * buffer; a batch (or an RLE run) of all-max definition levels is not
 * stored at all, and for max_rep == 1 only the row starts are kept, taken
 * straight from RLE runs where the page has them.
 *
 * Bounds: every level is checked against its maximum (where the bit width
 * can express more), a bit-packed block against its page, and the first
 * repetition level of a chunk must be 0 unless the read starts mid-row.
 */
#include "parquet/page_internal.h"

#include <stdlib.h>

/* Makes room for `need` bytes in *buf (capacity *cap). */
static int grow_bytes(vf_pq_chunk_ctx *c, uint8_t **buf, int64_t *cap, int64_t need)
{
    if (need <= *cap && *buf)
        return 0;
    if (need > c->f->max_entries)
        return vf_pq_fail(c, VF_EUNSUPPORTED, "more than %lld level entries in one column (reader limit)",
                          (long long)c->f->max_entries);
    int64_t n = vf_pq_grow_to(*cap, need);
    uint8_t *p = vf_realloc(*buf, (size_t)n);
    if (!p)
        return VF_ENOMEM;
    *buf = p;
    *cap = n;
    return 0;
}

/* ---- levels ---------------------------------------------------------------- */

int vf_pq_bit_width(int v)
{
    int w = 0;
    while (v >> w)
        w++;
    return w;
}

int vf_pq_level_reader_init(vf_pq_chunk_ctx *c, vf_pq_level_reader *lr, const char *kind, int encoding,
                            const uint8_t *p, size_t len, int max_level, int64_t n)
{
    memset(lr, 0, sizeof *lr);
    lr->encoding = encoding;
    lr->width = vf_pq_bit_width(max_level);
    lr->p = p;
    lr->len = len;
    if (encoding == VF_PQ_ENC_RLE) {
        vf_pq_rle_init(&lr->rle, p, len, lr->width);
        return 0;
    }
    if (encoding == VF_PQ_ENC_BIT_PACKED) {
        if ((uint64_t)n > (uint64_t)len * 8 / (uint64_t)(lr->width ? lr->width : 1))
            return vf_pq_fail(c, VF_ECORRUPT, "%s levels are truncated", kind);
        return 0;
    }
    return vf_pq_fail(c, VF_EUNSUPPORTED, "%s level encoding %s (%d) is not supported", kind,
                      vf_pq_encoding_name(encoding), encoding);
}

int vf_pq_level_read(vf_pq_chunk_ctx *c, vf_pq_level_reader *lr, const char *kind, int max_level, uint8_t *out,
                     int64_t k)
{
    if (lr->encoding == VF_PQ_ENC_RLE) {
        if (vf_pq_rle_read_u8(&lr->rle, out, k) < 0)
            return vf_pq_fail(c, VF_ECORRUPT, "%s levels are truncated or malformed", kind);
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
            return vf_pq_fail(c, VF_ECORRUPT, "%s level above the maximum %d", kind, max_level);
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
int vf_pq_decode_page_levels(vf_pq_chunk_ctx *c, int64_t n, const uint8_t *rep_p, size_t rep_len, int rep_enc,
                             const uint8_t *def_p, size_t def_len, int def_enc, int64_t *nv)
{
    vf_pq_column *col = c->col;
    const vf_pq_node *leaf = c->leaf;
    const int64_t base = col->num_entries;
    int64_t rows = n, present = n;
    vf_pq_level_reader lr;
    int r;
    if (leaf->max_rep > 0) {
        if ((r = vf_pq_level_reader_init(c, &lr, "repetition", rep_enc, rep_p, rep_len, leaf->max_rep, n)) < 0)
            return r;
        rows = 0;
        if (leaf->max_rep == 1) {
            if (col->rows + n + 1 > col->cap_rows) {
                int64_t cap = vf_pq_grow_to(col->cap_rows, col->rows + n + 1);
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
                return vf_pq_fail(c, VF_ECORRUPT, "repetition levels are truncated or malformed");
            if (base == c->entries_start && n > 0 && !c->mid_row && (rows == 0 || col->row_starts[col->rows] != base))
                return vf_pq_fail(c, VF_ECORRUPT, "first repetition level of the column chunk is not 0");
        }
        for (int64_t done = 0; done < n && !(leaf->max_rep == 1 && lr.encoding == VF_PQ_ENC_RLE);) {
            int64_t k = VF_MIN(n - done, VF_PQ_LEVEL_BATCH);
            if ((r = vf_pq_level_read(c, &lr, "repetition", leaf->max_rep, c->lv, k)) < 0)
                return r;
            if (base + done == c->entries_start && c->lv[0] != 0 && !c->mid_row)
                return vf_pq_fail(c, VF_ECORRUPT, "first repetition level of the column chunk is %d, not 0", c->lv[0]);
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
        if ((r = vf_pq_level_reader_init(c, &lr, "definition", def_enc, def_p, def_len, leaf->max_def, n)) < 0)
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
            int64_t k = VF_MIN(n - done, VF_PQ_LEVEL_BATCH);
            if ((r = vf_pq_level_read(c, &lr, "definition", leaf->max_def, c->lv, k)) < 0)
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
