/*
 * fuzz_parquet.c: libFuzzer target for the Parquet reader. Opens the
 * input as an in-memory Parquet file, reads every field of every row
 * group and of the whole file, touches the schema and statistics APIs,
 * opens it again projected on every other field and reads those, and
 * frees everything. Decode limits are lowered so a few bytes of RLE
 * cannot legitimately ask for gigabytes (that is a limit, not a bug).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/parquet.h"

static void consume(const vf_pq_array *a, volatile uint64_t *sink)
{
    /* Walk the structure so out-of-bounds offsets would be caught. */
    if (a->offsets && a->length > 0)
        *sink += (uint64_t)a->offsets[a->length];
    if (a->valid && a->length > 0)
        *sink += a->valid[a->length - 1];
    for (int i = 0; i < a->num_children; i++)
        consume(&a->children[i], sink);
}

/* Rows [ai, ai + n) of a equal rows [bi, bi + n) of b (nulls, values,
 * strings, lists and struct children). */
static int same_rows(const vf_pq_array *a, int64_t ai, const vf_pq_array *b, int64_t bi, int64_t n)
{
    if (a->type != b->type || a->num_children != b->num_children || ai < 0 || bi < 0 || ai + n > a->length ||
        bi + n > b->length)
        return 0;
    for (int64_t k = 0; k < n; k++) {
        int va = !a->valid || a->valid[ai + k], vb = !b->valid || b->valid[bi + k];
        if (va != vb)
            return 0;
    }
    switch (a->type) {
    case VF_PQ_T_STRING:
    case VF_PQ_T_BINARY:
        for (int64_t k = 0; k < n; k++) {
            int64_t la = a->offsets[ai + k + 1] - a->offsets[ai + k], lb = b->offsets[bi + k + 1] - b->offsets[bi + k];
            if (la != lb || (la && memcmp(a->data + a->offsets[ai + k], b->data + b->offsets[bi + k], (size_t)la)))
                return 0;
        }
        return 1;
    case VF_PQ_T_LIST:
        for (int64_t k = 0; k < n; k++) {
            int64_t la = a->offsets[ai + k + 1] - a->offsets[ai + k], lb = b->offsets[bi + k + 1] - b->offsets[bi + k];
            if (la != lb || !same_rows(&a->children[0], a->offsets[ai + k], &b->children[0], b->offsets[bi + k], la))
                return 0;
        }
        return 1;
    case VF_PQ_T_STRUCT:
        for (int c = 0; c < a->num_children; c++)
            if (!same_rows(&a->children[c], ai, &b->children[c], bi, n))
                return 0;
        return 1;
    default: {
        size_t w = a->type == VF_PQ_T_FIXED_BINARY ? (size_t)a->width : vf_pq_type_size(a->type);
        if (a->width != b->width)
            return 0;
        if (!w || n == 0)
            return 1;
        if (!a->values || !b->values)
            return a->values == b->values;
        return memcmp((const uint8_t *)a->values + (size_t)ai * w, (const uint8_t *)b->values + (size_t)bi * w,
                      (size_t)n * w) == 0;
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    vf_source *src;
    if (vf_source_open_memory(&src, "fuzz.parquet", data, size, 0) < 0)
        return 0;
    vf_pq_file *f;
    int r = vf_pq_open(&f, src);
    vf_source_close(src);
    if (r < 0)
        return 0;
    vf_pq_set_limits(f, (int64_t)1 << 22, (int64_t)1 << 26);
    /* Every chunk gets a page index on its first read past row 0 (the
     * reads below then jump through it; they must still agree with the
     * whole row group's). */
    vf_pq_set_page_index_min(f, 1);
    volatile uint64_t sink = 0;
    for (int l = 0; l < vf_pq_num_leaves(f); l++) {
        const vf_pq_node *leaf = vf_pq_leaf(f, l);
        sink += (uint64_t)leaf->max_def + (uint64_t)leaf->max_rep;
        for (int g = 0; g < vf_pq_num_row_groups(f); g++) {
            int64_t mn, mx;
            if (vf_pq_stats_i64(f, g, l, &mn, &mx) == 0)
                sink += (uint64_t)(mn ^ mx);
        }
    }
    for (int i = 0; i < vf_pq_num_kv(f); i++) {
        const char *k, *v;
        vf_pq_kv_at(f, i, &k, &v);
        sink += (uint64_t)k[0] + (uint64_t)v[0];
    }
    for (int i = 0; i < vf_pq_num_fields(f); i++) {
        vf_pq_array a;
        for (int g = 0; g < vf_pq_num_row_groups(f); g++) {
            int full = vf_pq_read_field(f, g, i, &a) == 0;
            if (full)
                consume(&a, &sink);
            /* Page-level reads of a middle and a last range: whenever both
             * reads succeed they must agree row for row. */
            int64_t rows = vf_pq_row_group_rows(f, g);
            int64_t ranges[2][2] = {{rows / 3, rows / 3 + 1}, {rows > 2 ? rows - 2 : 0, rows > 2 ? 2 : rows}};
            for (int k = 0; k < 2 && rows > 0; k++) {
                int64_t lo = ranges[k][0], n = ranges[k][1] < rows - lo ? ranges[k][1] : rows - lo;
                vf_pq_array part;
                vf_pq_page_counts pages;
                if (n > 0 && vf_pq_read_field_rows(f, g, i, lo, n, &part, &pages) == 0) {
                    consume(&part, &sink);
                    if (part.length != n || (full && a.length == rows && !same_rows(&a, lo, &part, 0, n)))
                        abort();
                }
                vf_pq_array_free(&part);
            }
            vf_pq_array_free(&a);
        }
        if (vf_pq_read_field_all(f, i, &a) == 0)
            consume(&a, &sink);
        vf_pq_array_free(&a);
        int *groups, count;
        if (vf_pq_select_row_groups(f, vf_pq_field(f, i)->name, 0, 100, &groups, &count) == 0)
            free(groups);
    }
    /* A projected open (every other field: their footer entries skipped)
     * and the row-group-major read of the kept fields. */
    int nf = vf_pq_num_fields(f);
    const char **names = calloc(nf ? (size_t)nf : 1, sizeof *names);
    int *kept = calloc(nf ? (size_t)nf : 1, sizeof *kept);
    int nk = 0;
    for (int i = 0; names && i < nf; i += 2)
        names[nk++] = vf_pq_field(f, i)->name;
    vf_pq_file *g = NULL;
    if (names && kept && vf_source_open_memory(&src, "fuzz.parquet", data, size, 0) == 0) {
        if (vf_pq_open_projected(&g, src, names, nk) == 0) {
            vf_pq_set_limits(g, (int64_t)1 << 22, (int64_t)1 << 26);
            for (int i = 0; i < nk; i++)
                kept[i] = 2 * i;
            vf_pq_array *arrays = calloc(nk ? (size_t)nk : 1, sizeof *arrays);
            if (arrays && vf_pq_read_fields_all(g, kept, nk, arrays) == 0)
                for (int i = 0; i < nk; i++) {
                    consume(&arrays[i], &sink);
                    vf_pq_array_free(&arrays[i]);
                }
            free(arrays);
            vf_pq_array a; /* a field not kept (refused unless the footer put row groups first) */
            memset(&a, 0, sizeof a); /* not read at all when there is a single field */
            if (nf > 1 && vf_pq_read_field_all(g, 1, &a) == 0)
                consume(&a, &sink);
            vf_pq_array_free(&a);
            vf_pq_close(g);
        }
        vf_source_close(src);
    }
    free(names);
    free(kept);
    vf_pq_close(f);
    return 0;
}
