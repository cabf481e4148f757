/*
 * page_internal.h: what the column-chunk decoder's three files share
 * (page.c: the chunk and its pages; page_values.c: the column's buffers and
 * the value encodings; page_levels.c: definition and repetition levels).
 * Only these files include it; the reader's interface is read_internal.h.
 *
 * Invariants: one vf_pq_chunk_ctx decodes one chunk at a time and lives in
 * the read's vf_pq_scratch between chunks (only its header is reset per
 * chunk: the scratch arrays are written before they are read). Every error
 * names the chunk (file, column, row group: vf_pq_where), and an error
 * inside a page also the page (vf_pq_fail).
 */
#ifndef VF_PQ_PAGE_INTERNAL_H
#define VF_PQ_PAGE_INTERNAL_H

#include <string.h>

#include "parquet/read_internal.h"

#define VF_PQ_IDX_BATCH 2048
#define VF_PQ_LEVEL_BATCH 4096

/* The decoder's state for one column chunk. */
typedef struct vf_pq_chunk_ctx {
    vf_pq_file *f;
    const vf_pq_node *leaf;
    const vf_pq_chunk_meta *meta;
    vf_pq_column *col;
    vf_pq_scratch *s;
    int row_group;
    int page;
    int64_t entries_start;     /* col->num_entries when this chunk began */
    int64_t chunk_end;         /* file offset one past the chunk */
    char *where;               /* "file: column 'x', row group g", formatted on first use (vf_pq_where()) */
    vf_pq_column dict;
    int has_dict;
    int maxbuf_len;            /* leading bytes of maxbuf filled so far */
    int mid_row;               /* pages of a repeated column were skipped: the first decoded page may
                                  continue the row before it (page-level reads) */
    int dict_deferred;         /* decoding a dictionary page deferred past data pages (page index reads) */
    /* Page-level reads of a row range: the column rows [keep_row_lo,
     * keep_row_hi) are the ones the caller keeps (ranged_rows set); a
     * dictionary-encoded page then decodes only the values of those rows
     * (value ordinals [keep_value_lo, keep_value_hi) when keep_values) and
     * leaves the others unwritten: they are dropped by
     * vf_pq_column_keep_rows before anything reads them. */
    int dict_borrowed;         /* dict is the page index's copy (not freed with the chunk) */
    int ranged_rows, keep_values;
    int64_t keep_row_lo, keep_row_hi, keep_value_lo, keep_value_hi;
    int64_t window_bytes;      /* bytes one fetch reads ahead (0: WINDOW_BYTES); a read that jumped to a
                                  page through the page index reads page by page */
    /* Scratch arrays (not zeroed: each chunk writes before it reads). */
    uint32_t idx[VF_PQ_IDX_BATCH];
    uint8_t lv[VF_PQ_LEVEL_BATCH];
    uint8_t maxbuf[VF_PQ_LEVEL_BATCH]; /* VF_PQ_LEVEL_BATCH copies of max_def */
} vf_pq_chunk_ctx;

/* A stream of levels: the RLE/bit-packed hybrid, or the deprecated
 * BIT_PACKED encoding (MSB-first, no run headers). */
typedef struct vf_pq_level_reader {
    int encoding;
    int width;
    vf_pq_rle rle;
    const uint8_t *p;
    size_t len;
    uint64_t bit;
} vf_pq_level_reader;

/* The 4 bytes at p as a uint32_t in host order (an unaligned load). */
static inline uint32_t vf_pq_load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The next capacity when growing from cap to at least need (x1.5, at
 * least 1024). */
static inline int64_t vf_pq_grow_to(int64_t cap, int64_t need)
{
    int64_t n = cap < 1024 ? 1024 : cap + cap / 2;
    return n < need ? need : n;
}

/* ---- page.c ---------------------------------------------------------------- */

/* After a data page's levels are decoded (its n entries, nv values, the
 * column holding base_entries entries and base_values values before it):
 * sets the value window of the rows kept (see keep_values), when the
 * values line up with the entries (no nulls so far, at most one level of
 * repetition). */
void vf_pq_set_value_window(vf_pq_chunk_ctx *c, int64_t base_entries, int64_t base_values, int64_t n, int64_t nv);

/* The chunk's name for messages, formatted on first use. */
const char *vf_pq_where(vf_pq_chunk_ctx *c);
/* vf_error(code) with the chunk's name, the page and the formatted text;
 * returns code. */
int vf_pq_fail(vf_pq_chunk_ctx *c, int code, const char *fmt, ...) VF_PRINTF(3, 4);

/* ---- page_values.c --------------------------------------------------------- */

/* Room for `extra` more values in col (within the reader's limits);
 * `exact` reserves no more than asked. */
int vf_pq_reserve_values_ex(vf_pq_chunk_ctx *c, vf_pq_column *col, int64_t extra, int exact);
/* Appends nv PLAIN values from [p, p+len) to col (data and dictionary
 * pages). */
int vf_pq_decode_plain(vf_pq_chunk_ctx *c, vf_pq_column *col, const uint8_t *p, size_t len, int64_t nv);
/* Appends a data page's nv present values, stored in `encoding` in
 * [p, p+len), to the chunk's column. */
int vf_pq_decode_values(vf_pq_chunk_ctx *c, int encoding, const uint8_t *p, size_t len, int64_t nv);

/* ---- page_levels.c --------------------------------------------------------- */

/* Bits needed for levels up to v. */
int vf_pq_bit_width(int v);
/* A reader of n levels (at most max_level) in `encoding` from [p, p+len);
 * kind ("repetition", "definition") names them in messages. */
int vf_pq_level_reader_init(vf_pq_chunk_ctx *c, vf_pq_level_reader *lr, const char *kind, int encoding,
                            const uint8_t *p, size_t len, int max_level, int64_t n);
/* Reads k levels into out, each checked against max_level. */
int vf_pq_level_read(vf_pq_chunk_ctx *c, vf_pq_level_reader *lr, const char *kind, int max_level, uint8_t *out,
                     int64_t k);
/* Decodes the levels of a page of n entries into the chunk's column; *nv
 * gets the number of present values (def == max_def). */
int vf_pq_decode_page_levels(vf_pq_chunk_ctx *c, int64_t n, const uint8_t *rep_p, size_t rep_len, int rep_enc,
                             const uint8_t *def_p, size_t def_len, int def_enc, int64_t *nv);

#endif
