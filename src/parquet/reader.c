/*
 * reader.c: the public reader API of parquet.h: open (magics, footer),
 * schema and metadata accessors, statistics and row-group selection, and
 * the read entry points that decode a field's leaves (page.c) and
 * assemble them (assemble.c).
 *
 * A vf_pq_file is immutable after open, so reads of different fields or
 * row groups may run on several threads at once (the source is read
 * positionally).
 */
#include "parquet/read_internal.h"

#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX_ENTRIES ((int64_t)1 << 34)
#define DEFAULT_MAX_BYTES ((int64_t)1 << 38)

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

int vf_pq_open(vf_pq_file **out, vf_source *src) { return vf_pq_open_projected(out, src, NULL, 0); }

int vf_pq_open_projected(vf_pq_file **out, vf_source *src, const char *const *fields, int num_fields)
{
    *out = NULL;
    const char *name = vf_source_name(src);
    uint64_t size = vf_source_size(src);
    if (size < 12)
        return vf_error(VF_ECORRUPT, "%s: %llu bytes is too small for a Parquet file", name, (unsigned long long)size);
    uint8_t head[4], tail[8];
    int r = vf_source_read_at(src, 0, head, 4);
    if (r == 0)
        r = vf_source_read_at(src, size - 8, tail, 8);
    if (r < 0)
        return r;
    if (memcmp(head, "PAR1", 4) != 0)
        return vf_error(VF_ECORRUPT, "%s: not a Parquet file (no PAR1 magic at the start)", name);
    if (memcmp(tail + 4, "PARE", 4) == 0)
        return vf_error(VF_EUNSUPPORTED, "%s: encrypted Parquet footers are not supported", name);
    if (memcmp(tail + 4, "PAR1", 4) != 0)
        return vf_error(VF_ECORRUPT, "%s: no PAR1 magic at the end (truncated or not Parquet)", name);
    uint32_t footer_len = le32(tail);
    if (footer_len == 0 || footer_len > size - 12)
        return vf_error(VF_ECORRUPT, "%s: footer length %u does not fit in the file (%llu bytes)", name, footer_len,
                        (unsigned long long)size);
    /* A big footer (a wide file with many row groups: tens of MB) is parsed
     * in place from a view of the file when the source gives one. */
    void *view_token = NULL;
    const uint8_t *view = vf_source_view(src, size - 8 - footer_len, footer_len, 1, &view_token);
    uint8_t *footer = NULL;
    if (!view) {
        if (!(footer = vf_malloc(footer_len)))
            return VF_ENOMEM;
        if ((r = vf_source_read_at(src, size - 8 - footer_len, footer, footer_len)) < 0) {
            free(footer);
            return r;
        }
    }
    vf_pq_file *f = vf_calloc(1, sizeof *f);
    if (!f) {
        free(footer);
        vf_source_unview(src, view_token);
        return VF_ENOMEM;
    }
    if (pthread_mutex_init(&f->index_lock, NULL) != 0) {
        free(f);
        free(footer);
        vf_source_unview(src, view_token);
        return vf_error(VF_ENOMEM, "%s: cannot create a mutex", name);
    }
    f->src = vf_source_ref(src);
    f->name = vf_source_name(src);
    f->footer_len = footer_len;
    /* VF_PQ_PAGE_INDEX_MIN_BYTES in the environment lowers (or raises) the
     * size from which chunks get a page index: tests reach the index with
     * small files written by pyarrow. */
    const char *env = getenv("VF_PQ_PAGE_INDEX_MIN_BYTES");
    f->page_index_min = env && atoll(env) > 0 ? (int64_t)atoll(env) : VF_PQ_PAGE_INDEX_MIN_BYTES;
    f->size = size;
    f->max_entries = DEFAULT_MAX_ENTRIES;
    f->max_bytes = DEFAULT_MAX_BYTES;
    r = vf_pq_parse_metadata(f, view ? view : footer, footer_len, fields, fields ? num_fields : 0);
    free(footer);
    vf_source_unview(src, view_token);
    if (r < 0) {
        vf_pq_close(f);
        return r;
    }
    *out = f;
    return 0;
}

int vf_pq_open_path(vf_pq_file **out, const char *path)
{
    *out = NULL;
    vf_source *src;
    int r = vf_source_open_file(&src, path);
    if (r < 0)
        return r;
    r = vf_pq_open(out, src);
    vf_source_close(src);
    return r;
}

void vf_pq_close(vf_pq_file *f)
{
    if (!f)
        return;
    vf_pq_free_page_index(f);
    pthread_mutex_destroy(&f->index_lock);
    vf_pq_free_metadata(f);
    vf_source_close(f->src);
    free(f);
}

void vf_pq_set_page_index_min(vf_pq_file *f, int64_t bytes)
{
    f->page_index_min = bytes > 0 ? bytes : VF_PQ_PAGE_INDEX_MIN_BYTES;
}

size_t vf_pq_memory_bytes(vf_pq_file *f)
{
    /* The decoded footer: nodes, chunk metadata, about a third of the
     * footer's bytes for names, statistics and key-value metadata. */
    size_t b = sizeof *f + (size_t)f->num_nodes * sizeof *f->nodes, kept = 0, listed = 0;
    for (int g = 0; g < f->num_row_groups; g++) {
        b += sizeof *f->row_groups + (size_t)f->row_groups[g].num_columns * sizeof(vf_pq_chunk_meta);
        kept += (size_t)f->row_groups[g].num_columns;
        listed += (size_t)f->row_groups[g].num_chunks;
    }
    b += listed ? (size_t)((double)f->footer_len / 3.0 * (double)kept / (double)listed) : f->footer_len / 3;
    pthread_mutex_lock(&f->index_lock);
    b += f->page_index_bytes;
    pthread_mutex_unlock(&f->index_lock);
    return b;
}

void vf_pq_set_limits(vf_pq_file *f, int64_t max_entries, int64_t max_bytes)
{
    f->max_entries = max_entries > 0 ? max_entries : DEFAULT_MAX_ENTRIES;
    f->max_bytes = max_bytes > 0 ? max_bytes : DEFAULT_MAX_BYTES;
}

const char *vf_pq_name(const vf_pq_file *f) { return f->name; }
int64_t vf_pq_num_rows(const vf_pq_file *f) { return f->num_rows; }
int vf_pq_num_row_groups(const vf_pq_file *f) { return f->num_row_groups; }
const char *vf_pq_created_by(const vf_pq_file *f) { return f->created_by ? f->created_by : ""; }

int64_t vf_pq_row_group_rows(const vf_pq_file *f, int row_group)
{
    if (row_group < 0 || row_group >= f->num_row_groups)
        return 0;
    return f->row_groups[row_group].num_rows;
}

int vf_pq_row_group_of_row(const vf_pq_file *f, int64_t row, int64_t *first_row)
{
    if (!f->rg_first_row || row < 0 || row >= f->rg_first_row[f->num_row_groups])
        return -1;
    /* The last row group starting at or before row (empty groups are
     * skipped: the search lands on the non-empty one holding the row). */
    int lo = 0, hi = f->num_row_groups - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (f->rg_first_row[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (first_row)
        *first_row = f->rg_first_row[lo];
    return lo;
}

const vf_pq_node *vf_pq_schema(const vf_pq_file *f) { return f->nodes; }
int vf_pq_num_fields(const vf_pq_file *f) { return f->nodes ? f->nodes[0].num_children : 0; }

const vf_pq_node *vf_pq_field(const vf_pq_file *f, int field_index)
{
    if (field_index < 0 || field_index >= vf_pq_num_fields(f))
        return NULL;
    return f->nodes[0].children[field_index];
}

int vf_pq_field_index(const vf_pq_file *f, const char *name)
{
    for (int i = 0; name && i < vf_pq_num_fields(f); i++)
        if (!strcmp(f->nodes[0].children[i]->name, name))
            return i;
    return -1;
}

int vf_pq_num_leaves(const vf_pq_file *f) { return f->num_leaves; }

const vf_pq_node *vf_pq_leaf(const vf_pq_file *f, int leaf_index)
{
    if (leaf_index < 0 || leaf_index >= f->num_leaves)
        return NULL;
    return f->leaves[leaf_index];
}

const char *vf_pq_kv(const vf_pq_file *f, const char *key)
{
    for (int i = 0; key && i < f->num_kv; i++)
        if (!strcmp(f->kv_keys[i], key))
            return f->kv_values[i];
    return NULL;
}

int vf_pq_num_kv(const vf_pq_file *f) { return f->num_kv; }

void vf_pq_kv_at(const vf_pq_file *f, int i, const char **key, const char **value)
{
    if (i < 0 || i >= f->num_kv) {
        *key = *value = NULL;
        return;
    }
    *key = f->kv_keys[i];
    *value = f->kv_values[i];
}

static const vf_pq_chunk_meta *chunk(const vf_pq_file *f, int row_group, int leaf_index)
{
    if (row_group < 0 || row_group >= f->num_row_groups || leaf_index < 0 || leaf_index >= f->num_leaves)
        return NULL;
    return vf_pq_chunk_at(f, row_group, leaf_index);
}

/* VF_EINVAL naming the field when a projected open skipped its chunks. */
static int check_projected(const vf_pq_file *f, int leaf_index)
{
    if (!f->leaf_slot || leaf_index < 0 || leaf_index >= f->num_leaves || f->leaf_slot[leaf_index] >= 0)
        return 0;
    char *p = vf_pq_leaf_path_string(f->leaves[leaf_index]);
    int r = vf_error(VF_EINVAL, "%s: column '%s' was not loaded (the file was opened with a projection)", f->name,
                     p ? p : "?");
    free(p);
    return r;
}

/* VF_ERANGE for a field index the file does not have; VF_EINVAL when a
 * projected open skipped the field's chunks. */
static int check_field(const vf_pq_file *f, int field_index)
{
    if (field_index < 0 || field_index >= vf_pq_num_fields(f))
        return vf_error(VF_ERANGE, "%s: field index %d out of range (%d fields)", f->name, field_index,
                        vf_pq_num_fields(f));
    const vf_pq_plan *plan = &f->fields[field_index];
    for (int i = 0; i < plan->num_leaves; i++) {
        int r = check_projected(f, plan->first_leaf + i);
        if (r < 0)
            return r;
    }
    return 0;
}

vf_pq_codec vf_pq_column_codec(const vf_pq_file *f, int row_group, int leaf_index)
{
    const vf_pq_chunk_meta *m = chunk(f, row_group, leaf_index);
    return m ? (vf_pq_codec)m->codec : VF_PQ_UNCOMPRESSED;
}

/* The metadata of a column chunk that was loaded: VF_EINVAL naming the
 * field when a projected open skipped it, VF_ERANGE when there is none. */
static int loaded_chunk(const vf_pq_file *f, int row_group, int leaf_index, const vf_pq_chunk_meta **out)
{
    int r = check_projected(f, leaf_index);
    if (r < 0)
        return r;
    *out = chunk(f, row_group, leaf_index);
    if (!*out)
        return vf_error(VF_ERANGE, "%s: no column chunk for row group %d, leaf %d", f->name, row_group, leaf_index);
    return 0;
}

int vf_pq_column_chunk(const vf_pq_file *f, int row_group, int leaf_index, vf_pq_chunk_info *out)
{
    memset(out, 0, sizeof *out);
    const vf_pq_chunk_meta *m;
    int r = loaded_chunk(f, row_group, leaf_index, &m);
    if (r < 0)
        return r;
    out->codec = (vf_pq_codec)m->codec;
    out->num_values = m->num_values;
    out->compressed_size = m->total_compressed_size;
    out->uncompressed_size = m->total_uncompressed_size;
    out->data_page_offset = m->data_page_offset;
    out->dictionary_page_offset = m->dictionary_page_offset;
    out->null_count = m->null_count;
    out->min = m->has_min ? m->stat_min : NULL;
    out->min_len = m->stat_min_len;
    out->max = m->has_max ? m->stat_max : NULL;
    out->max_len = m->stat_max_len;
    out->stats_deprecated = m->stats_deprecated;
    return 0;
}

static int is_unsigned(vf_pq_type t)
{
    return t == VF_PQ_T_UINT8 || t == VF_PQ_T_UINT16 || t == VF_PQ_T_UINT32 || t == VF_PQ_T_UINT64;
}

static int stat_value(const vf_pq_file *f, const vf_pq_node *leaf, const uint8_t *p, uint32_t len, int64_t *v)
{
    if (leaf->physical == VF_PQ_INT32) {
        if (len != 4)
            return vf_error(VF_ECORRUPT, "%s: INT32 statistic of %u bytes", f->name, len);
        uint32_t u = le32(p);
        *v = is_unsigned(leaf->type) ? (int64_t)u : (int64_t)(int32_t)u;
        return 0;
    }
    if (len != 8)
        return vf_error(VF_ECORRUPT, "%s: INT64 statistic of %u bytes", f->name, len);
    uint64_t u = (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
    if (leaf->type == VF_PQ_T_UINT64 && u > (uint64_t)INT64_MAX)
        return vf_error(VF_ERANGE, "%s: uint64 statistic above the int64 range", f->name);
    *v = (int64_t)u;
    return 0;
}

int vf_pq_stats_i64(const vf_pq_file *f, int row_group, int leaf_index, int64_t *min, int64_t *max)
{
    const vf_pq_chunk_meta *m;
    int r = loaded_chunk(f, row_group, leaf_index, &m);
    if (r < 0)
        return r;
    const vf_pq_node *leaf = f->leaves[leaf_index];
    if (leaf->physical != VF_PQ_INT32 && leaf->physical != VF_PQ_INT64)
        return vf_error(VF_EINVAL, "%s: leaf '%s' is not an integer column", f->name, leaf->name);
    /* The deprecated min/max were written with signed ordering: useless
     * for unsigned columns. */
    if (!m->has_min || !m->has_max || (m->stats_deprecated && is_unsigned(leaf->type)))
        return vf_error(VF_ENOENT, "%s: leaf '%s' has no statistics in row group %d", f->name, leaf->name, row_group);
    r = stat_value(f, leaf, m->stat_min, m->stat_min_len, min);
    if (r == 0)
        r = stat_value(f, leaf, m->stat_max, m->stat_max_len, max);
    return r;
}

int vf_pq_select_row_groups(const vf_pq_file *f, const char *name, int64_t lo, int64_t hi, int **row_groups,
                            int *count)
{
    *row_groups = NULL;
    *count = 0;
    int fi = vf_pq_field_index(f, name);
    if (fi < 0)
        return vf_error(VF_ENOENT, "%s: no column '%s'", f->name, name ? name : "(null)");
    const vf_pq_node *n = vf_pq_field(f, fi);
    if (!n->is_leaf || n->repetition == VF_PQ_REPEATED ||
        (n->physical != VF_PQ_INT32 && n->physical != VF_PQ_INT64))
        return vf_error(VF_EINVAL, "%s: column '%s' is not an integer scalar", f->name, name);
    int pr = check_projected(f, n->leaf_index);
    if (pr < 0)
        return pr;
    int *out = vf_malloc_array(f->num_row_groups ? (size_t)f->num_row_groups : 1, sizeof *out);
    if (!out)
        return VF_ENOMEM;
    int k = 0;
    for (int g = 0; g < f->num_row_groups; g++) {
        if (f->row_groups[g].num_rows == 0)
            continue;
        int64_t mn, mx;
        int r = vf_pq_stats_i64(f, g, n->leaf_index, &mn, &mx);
        if (r < 0 || (mx >= lo && mn <= hi))
            out[k++] = g; /* without usable statistics a row group is kept */
    }
    *row_groups = out;
    *count = k;
    return 0;
}

/* Decodes every leaf of the field over the given row groups, then
 * assembles. num_rows >= 0 (one row group): only rows [first_row,
 * first_row + num_rows) of it, through page-level reads: each leaf decodes
 * the pages over the range (their boundaries differ from leaf to leaf),
 * then keeps exactly the range's rows. */
static int read_field_groups(vf_pq_file *f, int field_index, int first_group, int num_groups, int64_t first_row,
                             int64_t num_rows, vf_pq_array *out, vf_pq_page_counts *pages)
{
    memset(out, 0, sizeof *out);
    int r = check_field(f, field_index);
    if (r < 0)
        return r;
    const vf_pq_plan *plan = &f->fields[field_index];
    vf_pq_column *cols = vf_calloc(plan->num_leaves ? (size_t)plan->num_leaves : 1, sizeof *cols);
    if (!cols)
        return VF_ENOMEM;
    int64_t rows = 0;
    vf_pq_scratch scratch;
    memset(&scratch, 0, sizeof scratch);
    for (int i = 0; i < plan->num_leaves; i++)
        vf_pq_column_init(&cols[i], f->leaves[plan->first_leaf + i]);
    for (int g = first_group; g < first_group + num_groups && r == 0 && num_rows < 0; g++) {
        rows += f->row_groups[g].num_rows;
        for (int i = 0; i < plan->num_leaves && r == 0; i++)
            r = vf_pq_decode_chunk(f, g, plan->first_leaf + i, &cols[i], &scratch);
    }
    for (int i = 0; i < plan->num_leaves && r == 0 && num_rows >= 0; i++) {
        int64_t first = 0;
        rows = num_rows;
        r = vf_pq_decode_chunk_rows(f, first_group, plan->first_leaf + i, &cols[i], &scratch, first_row,
                                    first_row + num_rows, &first);
        if (r == 0 && (first > first_row || cols[i].rows < first_row + num_rows - first))
            r = vf_error(VF_ECORRUPT, "%s: row group %d: the pages of leaf %d hold rows [%lld, %lld), not [%lld, %lld)",
                         f->name, first_group, plan->first_leaf + i, (long long)first,
                         (long long)(first + cols[i].rows), (long long)first_row, (long long)(first_row + num_rows));
        if (r == 0)
            r = vf_pq_column_keep_rows(&cols[i], first_row - first, first_row - first + num_rows);
    }
    if (pages) {
        pages->decoded = scratch.pages_decoded;
        pages->skipped = scratch.pages_skipped;
    }
    vf_pq_scratch_free(&scratch);
    if (r == 0)
        r = vf_pq_assemble(f, plan, cols, rows, out);
    for (int i = 0; i < plan->num_leaves; i++)
        vf_pq_column_free(&cols[i]);
    free(cols);
    return r;
}

int vf_pq_read_field(vf_pq_file *f, int row_group, int field_index, vf_pq_array *out)
{
    if (row_group < 0 || row_group >= f->num_row_groups) {
        memset(out, 0, sizeof *out);
        return vf_error(VF_ERANGE, "%s: row group %d out of range (%d row groups)", f->name, row_group,
                        f->num_row_groups);
    }
    return read_field_groups(f, field_index, row_group, 1, 0, -1, out, NULL);
}

int vf_pq_read_field_rows(vf_pq_file *f, int row_group, int field_index, int64_t first_row, int64_t num_rows,
                          vf_pq_array *out, vf_pq_page_counts *pages)
{
    memset(out, 0, sizeof *out);
    if (pages)
        pages->decoded = pages->skipped = 0;
    if (row_group < 0 || row_group >= f->num_row_groups)
        return vf_error(VF_ERANGE, "%s: row group %d out of range (%d row groups)", f->name, row_group,
                        f->num_row_groups);
    int64_t group_rows = f->row_groups[row_group].num_rows;
    if (first_row < 0 || num_rows < 0 || first_row > group_rows || num_rows > group_rows - first_row)
        return vf_error(VF_ERANGE, "%s: rows [%lld, +%lld) outside row group %d (%lld rows)", f->name,
                        (long long)first_row, (long long)num_rows, row_group, (long long)group_rows);
    int whole = first_row == 0 && num_rows == group_rows;
    return read_field_groups(f, field_index, row_group, 1, first_row, whole ? -1 : num_rows, out, pages);
}

int vf_pq_read_field_all(vf_pq_file *f, int field_index, vf_pq_array *out)
{
    return read_field_groups(f, field_index, 0, f->num_row_groups, 0, -1, out, NULL);
}

/* Byte range of a leaf's chunk in a row group ([*lo, *hi)), 0 when it has
 * no usable range (then the decoder reads and reports it itself). */
static int chunk_range(const vf_pq_file *f, int g, int leaf, int64_t *lo, int64_t *hi)
{
    const vf_pq_chunk_meta *m = vf_pq_chunk_at(f, g, leaf);
    if (!m || !m->has_meta)
        return 0;
    int64_t start = m->data_page_offset;
    if (m->dictionary_page_offset > 0 && m->dictionary_page_offset < start)
        start = m->dictionary_page_offset;
    int64_t len = m->total_compressed_size;
    if (start < 4 || len <= 0 || (uint64_t)start > f->size || (uint64_t)len > f->size - (uint64_t)start)
        return 0;
    *lo = start;
    *hi = start + len;
    return 1;
}

#define PREFETCH_BYTES ((int64_t)4 << 20)

/* Widens the byte range [*lo, *hi) to cover the chunks that the fields'
 * leaves have in row group g. */
static void widen_to_chunks(const vf_pq_file *f, int g, const int *field_index, int num_fields, int64_t *lo,
                            int64_t *hi)
{
    for (int k = 0; k < num_fields; k++) {
        const vf_pq_plan *plan = &f->fields[field_index[k]];
        for (int i = 0; i < plan->num_leaves; i++) {
            int64_t a, b;
            if (chunk_range(f, g, plan->first_leaf + i, &a, &b)) {
                *lo = VF_MIN(*lo, a);
                *hi = VF_MAX(*hi, b);
            }
        }
    }
}

int vf_pq_read_fields_all(vf_pq_file *f, const int *field_index, int num_fields, vf_pq_array *out)
{
    for (int k = 0; k < num_fields; k++)
        memset(&out[k], 0, sizeof out[k]);
    int total_leaves = 0;
    for (int k = 0; k < num_fields; k++) {
        int r = check_field(f, field_index[k]);
        if (r < 0)
            return r;
        total_leaves += f->fields[field_index[k]].num_leaves;
    }
    vf_pq_column *cols = vf_calloc(total_leaves ? (size_t)total_leaves : 1, sizeof *cols);
    if (!cols)
        return VF_ENOMEM;
    for (int k = 0, at = 0; k < num_fields; k++) {
        const vf_pq_plan *plan = &f->fields[field_index[k]];
        for (int i = 0; i < plan->num_leaves; i++)
            vf_pq_column_init(&cols[at++], f->leaves[plan->first_leaf + i]);
    }
    vf_pq_scratch scratch;
    memset(&scratch, 0, sizeof scratch);
    int r = 0;
    /* Where the source can view the file (a local file: mmap), the chunks
     * are decoded in place from one view of the span they occupy. */
    int64_t span_lo = INT64_MAX, span_hi = 0, wanted = 0;
    for (int g = 0; g < f->num_row_groups; g++) {
        int64_t lo = INT64_MAX, hi = 0;
        widen_to_chunks(f, g, field_index, num_fields, &lo, &hi);
        if (hi > lo) {
            wanted += hi - lo;
            span_lo = VF_MIN(span_lo, lo);
            span_hi = VF_MAX(span_hi, hi);
        }
    }
    /* A view of a span mostly made of other columns' chunks (a wide file's
     * small row groups: LeRobot's episodes files, whose 100 stats columns
     * are never read) costs a page fault per row group and the unmapping
     * of pages never used: one read per row group then does less. */
    if (span_hi > span_lo && wanted * 4 >= span_hi - span_lo)
        scratch.view = vf_source_view(f->src, (uint64_t)span_lo, (size_t)(span_hi - span_lo), 0, &scratch.view_token);
    if (scratch.view) {
        scratch.view_src = f->src;
        scratch.view_start = span_lo;
        scratch.view_len = span_hi - span_lo;
    }
    for (int g = 0; g < f->num_row_groups && r == 0; g++) {
        /* One read for the row group's wanted chunks when they lie close
         * together (a wide file's small row groups: one pread instead of
         * one per column); the decoder finds them in the window. */
        int64_t lo = INT64_MAX, hi = 0;
        widen_to_chunks(f, g, field_index, num_fields, &lo, &hi);
        if (!scratch.view && hi > lo && hi - lo <= PREFETCH_BYTES) {
            size_t want = (size_t)(hi - lo);
            if (want > scratch.window_cap) {
                free(scratch.window);
                scratch.window = vf_malloc(want);
                scratch.window_cap = scratch.window ? want : 0;
            }
            scratch.window_len = 0;
            if (scratch.window && vf_source_read_at(f->src, (uint64_t)lo, scratch.window, want) == 0) {
                scratch.window_start = lo;
                scratch.window_len = hi - lo;
            }
        }
        for (int k = 0, at = 0; k < num_fields && r == 0; k++) {
            const vf_pq_plan *plan = &f->fields[field_index[k]];
            for (int i = 0; i < plan->num_leaves && r == 0; i++)
                r = vf_pq_decode_chunk(f, g, plan->first_leaf + i, &cols[at + i], &scratch);
            at += plan->num_leaves;
        }
    }
    vf_pq_scratch_free(&scratch);
    for (int k = 0, at = 0; k < num_fields && r == 0; k++) {
        const vf_pq_plan *plan = &f->fields[field_index[k]];
        r = vf_pq_assemble(f, plan, cols + at, f->rg_first_row ? f->rg_first_row[f->num_row_groups] : 0, &out[k]);
        at += plan->num_leaves;
    }
    if (r < 0)
        for (int k = 0; k < num_fields; k++)
            vf_pq_array_free(&out[k]);
    for (int i = 0; i < total_leaves; i++)
        vf_pq_column_free(&cols[i]);
    free(cols);
    return r;
}
