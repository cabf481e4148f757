/*
 * table.c: the Parquet side of the locator and the columnar reads of the
 * data files for the loader.
 *
 * Locating an episode (lerobot-format.md §3.3): its rows are
 * [row_offset, row_offset + length) of its data file. Row groups are found
 * by binary search over their cumulative num_rows; the `index` (else
 * `episode_index`) column statistics of each found group confirm the
 * choice, so a file whose
 * rows are not where the metadata says is reported instead of silently
 * read. Recorder-written files have one row group per episode; converted
 * files have one big row group in which an episode starts mid-group; both
 * work the same way here.
 *
 * Reading: each data file of the requested episodes is opened once (or
 * taken from the loader's cache of open data files, pq_cache.c), each
 * needed row group is read per requested column in runs of nearby
 * episodes (only the pages holding the rows they need:
 * vf_pq_read_field_rows, which finds them from a page index), and the rows are
 * copied (with conversion: float features -> float32, integer and bool
 * features -> int64) into contiguous [rows, width] arrays. Every vector row
 * must hold exactly the feature's size (product of shape) elements, nested
 * lists level by level for multi-dimensional shapes.
 */
#include "dataset/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- locator -------------------------------------------------------------- */

int vf_ds_locate_row_groups(const vf_dataset *d, size_t pos, const vf_pq_file *f, vf_ds_rg_span **spans, int *count)
{
    *spans = NULL;
    *count = 0;
    if (pos >= d->num_selected)
        return vf_error(VF_ERANGE, "%s: episode position %zu out of range", d->root, pos);
    const vf_ds_episode *e = &d->episodes[d->selected[pos]];
    const char *name = vf_pq_name(f);
    int64_t ep = e->pub.episode_index;
    int64_t start = e->row_offset, end = e->row_offset + e->pub.length;
    if (start < 0 || e->pub.length <= 0 || end > vf_pq_num_rows(f))
        return vf_error(VF_ECORRUPT, "%s: episode %lld: rows [%lld, %lld) are outside the file's %lld rows", name,
                        (long long)ep, (long long)start, (long long)end, (long long)vf_pq_num_rows(f));
    /* First and last row groups by binary search over the cumulative row
     * counts: O(log G) per episode, not O(G) (one row group per episode
     * made whole-file reads quadratic). */
    int64_t group_start = 0, last_start = 0;
    int g0 = vf_pq_row_group_of_row(f, start, &group_start);
    int g1 = vf_pq_row_group_of_row(f, end - 1, &last_start);
    if (g0 < 0 || g1 < g0)
        return vf_error(VF_ECORRUPT, "%s: episode %lld: rows [%lld, %lld) not found in the row groups", name,
                        (long long)ep, (long long)start, (long long)end);
    vf_ds_rg_span *out = vf_malloc_array((size_t)(g1 - g0 + 1), sizeof *out);
    if (!out)
        return VF_ENOMEM;
    int n = 0;
    int64_t covered = 0;
    for (int g = g0; g <= g1; g++) {
        int64_t rows = vf_pq_row_group_rows(f, g);
        int64_t lo = VF_MAX(start, group_start), hi = VF_MIN(end, group_start + rows);
        if (hi > lo) {
            out[n].row_group = g;
            out[n].first_row = lo - group_start;
            out[n].count = hi - lo;
            out[n].episode_row = lo - start;
            covered += hi - lo;
            n++;
        }
        group_start += rows;
    }
    if (covered != e->pub.length) {
        free(out);
        return vf_error(VF_ECORRUPT, "%s: episode %lld: row groups cover %lld of its %lld rows", name, (long long)ep,
                        (long long)covered, (long long)e->pub.length);
    }
    /* Cross-check each of these row groups with its footer statistics of
     * `index` (else `episode_index`): they must overlap the episode's
     * values. A group without usable statistics (absent, or not an
     * integer column) is taken on its row count alone. */
    const char *col = "index";
    int64_t lo = e->pub.from_index, hi = e->pub.to_index - 1;
    int field = vf_pq_field_index(f, col);
    if (field < 0) {
        col = "episode_index";
        lo = hi = ep;
        field = vf_pq_field_index(f, col);
    }
    const vf_pq_node *node = field >= 0 ? vf_pq_field(f, field) : NULL;
    if (node && node->is_leaf && node->repetition != VF_PQ_REPEATED &&
        (node->physical == VF_PQ_INT32 || node->physical == VF_PQ_INT64)) {
        for (int i = 0; i < n; i++) {
            int64_t mn, mx;
            int r = vf_pq_stats_i64(f, out[i].row_group, node->leaf_index, &mn, &mx);
            if (r == VF_ENOMEM) {
                free(out);
                return r;
            }
            if (r == 0 && (mx < lo || mn > hi)) {
                r = vf_error(VF_ECORRUPT,
                             "%s: episode %lld: row group %d should hold its rows (%s %lld..%lld) but the "
                             "column statistics say %lld..%lld; the metadata and the data file disagree",
                             name, (long long)ep, out[i].row_group, col, (long long)lo, (long long)hi,
                             (long long)mn, (long long)mx);
                free(out);
                return r;
            }
        }
    }
    *spans = out;
    *count = n;
    return 0;
}

/* ---- conversion helpers -------------------------------------------------- */

int vf_ds_feature_value_type(const vf_feature *f)
{
    if (f->kind == VF_FEATURE_STRING)
        return VF_DS_STRING;
    if (f->kind != VF_FEATURE_VECTOR && f->kind != VF_FEATURE_SCALAR)
        return -1;
    switch (f->type) {
    case VF_DTYPE_FLOAT16:
    case VF_DTYPE_FLOAT32:
    case VF_DTYPE_FLOAT64: return VF_DS_F32;
    case VF_DTYPE_OTHER: return -1;
    default: return VF_DS_I64;
    }
}

static float half_to_float(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexpf((float)(mant | 0x400), exp - 25);
    return sign ? -v : v;
}

static int is_numeric_leaf(vf_pq_type t)
{
    return t >= VF_PQ_T_BOOL && t <= VF_PQ_T_DOUBLE;
}

/* Element k of a numeric leaf array, as double and as int64. */
static void leaf_value(const vf_pq_array *a, int64_t k, double *dv, int64_t *iv)
{
    const void *p = a->values;
    switch (a->type) {
    case VF_PQ_T_BOOL: *iv = ((const uint8_t *)p)[k] != 0; *dv = (double)*iv; return;
    case VF_PQ_T_INT8: *iv = ((const int8_t *)p)[k]; break;
    case VF_PQ_T_INT16: *iv = ((const int16_t *)p)[k]; break;
    case VF_PQ_T_INT32: *iv = ((const int32_t *)p)[k]; break;
    case VF_PQ_T_INT64: *iv = ((const int64_t *)p)[k]; break;
    case VF_PQ_T_UINT8: *iv = ((const uint8_t *)p)[k]; break;
    case VF_PQ_T_UINT16: *iv = ((const uint16_t *)p)[k]; break;
    case VF_PQ_T_UINT32: *iv = ((const uint32_t *)p)[k]; break;
    case VF_PQ_T_UINT64: *iv = (int64_t)((const uint64_t *)p)[k]; break;
    case VF_PQ_T_FLOAT16: *dv = half_to_float(((const uint16_t *)p)[k]); *iv = (int64_t)*dv; return;
    case VF_PQ_T_FLOAT: *dv = ((const float *)p)[k]; *iv = isfinite(*dv) && fabs(*dv) < 9e18 ? (int64_t)*dv : 0; return;
    case VF_PQ_T_DOUBLE: *dv = ((const double *)p)[k]; *iv = isfinite(*dv) && fabs(*dv) < 9e18 ? (int64_t)*dv : 0; return;
    default: *dv = 0; *iv = 0; return;
    }
    *dv = (double)*iv;
}

/* Context for error messages. */
typedef struct read_ctx {
    const char *file;
    int64_t episode;
    const char *column;
    int64_t episode_row;    /* row within the episode of the first row copied */
} read_ctx;

/* Copies rows [first, first+count) of array a (one row group of the
 * column) into column c at output row out_row. */
static int copy_rows(const read_ctx *x, const vf_pq_array *a, int64_t first, int64_t count, vf_ds_column *c,
                     int64_t out_row)
{
    if (first < 0 || first + count > a->length)
        return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': row group has %lld rows, need rows up to %lld",
                        x->file, (long long)x->episode, x->column, (long long)a->length, (long long)(first + count));
    const vf_feature *f = c->feature;
    if (c->type == VF_DS_STRING) {
        if (a->type != VF_PQ_T_STRING && a->type != VF_PQ_T_BINARY)
            return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': expected strings, found %s", x->file,
                            (long long)x->episode, x->column, vf_pq_type_name(a->type));
        for (int64_t i = 0; i < count; i++) {
            int64_t k = first + i;
            int64_t lo = a->offsets[k], hi = a->offsets[k + 1];
            if ((a->valid && !a->valid[k]) || lo < 0 || hi < lo || hi > a->data_len)
                return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': null or bad string in row %lld",
                                x->file, (long long)x->episode, x->column, (long long)(x->episode_row + i));
            /* Strings are appended in output order, so out rows are
             * filled strictly in sequence per episode (see caller). */
            c->offsets[out_row + i + 1] = hi - lo; /* length for now; prefix-summed later */
        }
        return 0;
    }
    /* Walk down the list levels to the leaf, checking shape. */
    const vf_pq_array *level = a;
    int64_t lo = first, hi = first + count;
    int dims = f->ndim;
    /* A scalar feature (shape [1]) may be stored as a plain value or as a
     * one-element list. */
    int list_levels = 0;
    for (const vf_pq_array *p = a; p->type == VF_PQ_T_LIST && p->num_children == 1; p = &p->children[0])
        list_levels++;
    if (!(list_levels == dims || (dims == 1 && f->shape[0] == 1 && list_levels == 0)))
        return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': stored with %d list levels, info.json shape has %d dimensions",
                        x->file, (long long)x->episode, x->column, list_levels, dims);
    for (int level_i = 0; level_i < list_levels; level_i++) {
        int64_t expect = f->shape[level_i];
        for (int64_t k = lo; k < hi; k++) {
            if (level->valid && !level->valid[k]) {
                if (level_i == 0)
                    return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': null list in row %lld", x->file,
                                    (long long)x->episode, x->column, (long long)(x->episode_row + (k - first)));
                return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': null nested list at level %d", x->file,
                                (long long)x->episode, x->column, level_i);
            }
            int64_t n = level->offsets[k + 1] - level->offsets[k];
            if (n != expect) {
                if (level_i == 0)
                    return vf_error(VF_ECORRUPT,
                                    "%s: episode %lld: column '%s': row %lld has %lld elements, shape says %lld",
                                    x->file, (long long)x->episode, x->column, (long long)(x->episode_row + (k - first)),
                                    (long long)n, (long long)expect);
                return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': nested list of %lld elements at level %d, shape says %lld",
                                x->file, (long long)x->episode, x->column, (long long)n, level_i, (long long)expect);
            }
        }
        int64_t nlo = level->offsets[lo], nhi = level->offsets[hi];
        level = &level->children[0];
        if (nlo < 0 || nhi < nlo || nhi > level->length)
            return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': bad list offsets", x->file,
                            (long long)x->episode, x->column);
        lo = nlo;
        hi = nhi;
    }
    if (!is_numeric_leaf(level->type))
        return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': expected numbers, found %s", x->file,
                        (long long)x->episode, x->column, vf_pq_type_name(level->type));
    if (c->type == VF_DS_I64 &&
        (level->type == VF_PQ_T_FLOAT || level->type == VF_PQ_T_DOUBLE || level->type == VF_PQ_T_FLOAT16))
        return vf_error(VF_ECORRUPT,
                        "%s: episode %lld: column '%s': info.json declares dtype %s, but the file holds %s values "
                        "(they would be truncated to integers)",
                        x->file, (long long)x->episode, x->column, c->feature ? c->feature->dtype : "integer",
                        vf_pq_type_name(level->type));
    if (hi - lo != count * c->width)
        return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': %lld values for %lld rows of %lld", x->file,
                        (long long)x->episode, x->column, (long long)(hi - lo), (long long)count, (long long)c->width);
    for (int64_t k = lo; k < hi; k++) {
        if (level->valid && !level->valid[k])
            return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s': null value in row %lld", x->file,
                            (long long)x->episode, x->column, (long long)(x->episode_row + (k - lo) / c->width));
        double dv;
        int64_t iv;
        leaf_value(level, k, &dv, &iv);
        int64_t o = out_row * c->width + (k - lo);
        if (c->type == VF_DS_F32)
            ((float *)c->values)[o] = (float)dv;
        else
            ((int64_t *)c->values)[o] = iv;
    }
    return 0;
}

/* Second pass for strings: the bytes, once every length is known. */
static int copy_string_bytes(const vf_pq_array *a, int64_t first, int64_t count, vf_ds_column *c, int64_t out_row)
{
    for (int64_t i = 0; i < count; i++) {
        int64_t k = first + i;
        int64_t lo = a->offsets[k], hi = a->offsets[k + 1];
        memcpy(c->data + c->offsets[out_row + i], a->data + lo, (size_t)(hi - lo));
    }
    return 0;
}

/* Checks a span's rows of the `index` column (first_index >= 0: values
 * first_index, first_index+1, ...) or of `episode_index` (first_index < 0:
 * every value is the episode). */
static int verify_rows(const read_ctx *x, const vf_pq_array *a, const vf_ds_rg_span *sp, int64_t first_index)
{
    const char *what = first_index >= 0 ? "index" : "episode_index";
    if (!is_numeric_leaf(a->type) || a->type == VF_PQ_T_FLOAT || a->type == VF_PQ_T_DOUBLE ||
        a->type == VF_PQ_T_FLOAT16)
        return vf_error(VF_ECORRUPT, "%s: column '%s': expected integers, found %s", x->file, what,
                        vf_pq_type_name(a->type));
    if (sp->first_row < 0 || sp->first_row + sp->count > a->length)
        return vf_error(VF_ECORRUPT, "%s: column '%s': row group shorter than its row count", x->file, what);
    for (int64_t k = 0; k < sp->count; k++) {
        int64_t row = sp->first_row + k, got;
        double unused;
        if (a->valid && !a->valid[row])
            return vf_error(VF_ECORRUPT, "%s: episode %lld: row %lld of the episode has a null %s", x->file,
                            (long long)x->episode, (long long)(sp->episode_row + k), what);
        leaf_value(a, row, &unused, &got);
        int64_t want = first_index >= 0 ? first_index + k : x->episode;
        if (got != want)
            return vf_error(VF_ECORRUPT,
                            "%s: episode %lld: row %lld of the episode has %s %lld, expected %lld "
                            "(metadata and data file disagree)",
                            x->file, (long long)x->episode, (long long)(sp->episode_row + k), what, (long long)got,
                            (long long)want);
    }
    return 0;
}

/* ---- table reads ------------------------------------------------------------ */

void vf_ds_table_free(vf_ds_table *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->num_columns; i++) {
        free(t->columns[i].values);
        free(t->columns[i].offsets);
        free(t->columns[i].data);
    }
    free(t->columns);
    free(t->episode_start);
    memset(t, 0, sizeof *t);
}

typedef struct ep_plan {
    size_t pos;             /* public position */
    int file;               /* data file id */
    int64_t out_row;        /* first output row */
    vf_ds_rg_span *spans;
    int num_spans;
} ep_plan;

static int cmp_plan_file(const void *a, const void *b)
{
    const ep_plan *x = *(const ep_plan *const *)a, *y = *(const ep_plan *const *)b;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    return (x > y) - (x < y); /* request order */
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Reads one data file's share of the table. pass 0: values (and string
 * lengths), pass 1: string bytes. */
/* Spans of one row group nearer than this many rows are read as one run
 * (a page holds thousands of rows: two reads of one page cost two
 * decodes of it). */
#define RUN_GAP 4096

typedef struct run {
    int group;
    int64_t lo, hi;            /* rows of the row group */
} run;

static int cmp_run(const void *a, const void *b)
{
    const run *x = a, *y = b;
    if (x->group != y->group)
        return x->group < y->group ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The runs of rows to read: every span of the plans, sorted by (group,
 * first row), neighbours nearer than RUN_GAP merged. *runs newly
 * allocated. */
static int make_runs(ep_plan **plans, size_t num_plans, run **runs, size_t *count)
{
    size_t n = 0;
    for (size_t i = 0; i < num_plans; i++)
        n += (size_t)plans[i]->num_spans;
    run *v = vf_malloc_array(n ? n : 1, sizeof *v);
    if (!v)
        return VF_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < num_plans; i++)
        for (int s = 0; s < plans[i]->num_spans; s++) {
            const vf_ds_rg_span *sp = &plans[i]->spans[s];
            if (sp->count > 0)
                v[k++] = (run){sp->row_group, sp->first_row, sp->first_row + sp->count};
        }
    qsort(v, k, sizeof *v, cmp_run);
    size_t out = 0;
    for (size_t i = 0; i < k; i++) {
        if (out > 0 && v[out - 1].group == v[i].group && v[i].lo - v[out - 1].hi <= RUN_GAP)
            v[out - 1].hi = VF_MAX(v[out - 1].hi, v[i].hi);
        else
            v[out++] = v[i];
    }
    *runs = v;
    *count = out;
    return 0;
}

static int open_data_file(const vf_dataset *d, vf_ds_pq_cache *cache, size_t file_id, vf_pq_file **f)
{
    if (cache)
        return vf_ds_pq_cache_get(cache, file_id, f);
    return vf_ds_open_parquet(d, d->data_files[file_id].rel, f);
}

static void close_data_file(vf_ds_pq_cache *cache, vf_pq_file *f)
{
    if (cache)
        vf_ds_pq_cache_release(cache, f);
    else
        vf_pq_close(f);
}

static int read_file_part(const vf_dataset *d, vf_ds_pq_cache *cache, size_t file_id, ep_plan **plans,
                          size_t num_plans, vf_ds_table *t, int flags, int pass)
{
    vf_pq_file *f;
    int r = open_data_file(d, cache, file_id, &f);
    if (r < 0)
        return r;
    /* The row groups this file's episodes need. */
    size_t total_spans = 0;
    for (size_t i = 0; i < num_plans && r == 0; i++) {
        if (!plans[i]->spans)
            r = vf_ds_locate_row_groups(d, plans[i]->pos, f, &plans[i]->spans, &plans[i]->num_spans);
        total_spans += (size_t)plans[i]->num_spans;
    }
    int *groups = r == 0 ? vf_malloc_array(total_spans ? total_spans : 1, sizeof *groups) : NULL;
    if (r == 0 && !groups)
        r = VF_ENOMEM;
    size_t ng = 0;
    for (size_t i = 0; i < num_plans && r == 0; i++)
        for (int s = 0; s < plans[i]->num_spans; s++)
            groups[ng++] = plans[i]->spans[s].row_group;
    if (r == 0) {
        qsort(groups, ng, sizeof *groups, cmp_int);
        size_t u = 0;
        for (size_t i = 0; i < ng; i++)
            if (u == 0 || groups[u - 1] != groups[i])
                groups[u++] = groups[i];
        ng = u;
        if (pass == 0)
            t->row_groups_read += (int64_t)ng;
    }
    /* The rows each of those groups must give, as runs [lo, hi) of the
     * episodes' spans: spans closer than RUN_GAP rows join one run, farther
     * ones are read apart, so only the pages holding rows the episodes need
     * are read (page-level reads; a converter's file is one row group of
     * hundreds of episodes, and a map-mode miss takes a few random episodes
     * of it: one range from the first to the last decoded most of the file
     * for each of them). */
    run *runs = NULL;
    size_t nruns = 0;
    if (r == 0)
        r = make_runs(plans, num_plans, &runs, &nruns);
    /* Columns: the requested ones, plus `index` and `episode_index` for
     * verification (verify = 1 and 2). */
    size_t ncols = t->num_columns + ((flags & VF_DS_VERIFY_INDEX) && pass == 0 ? 2 : 0);
    for (size_t ci = 0; ci < ncols && r == 0; ci++) {
        int verify = ci < t->num_columns ? 0 : (int)(ci - t->num_columns) + 1;
        vf_ds_column *c = verify ? NULL : &t->columns[ci];
        if (pass == 1 && c->type != VF_DS_STRING)
            continue;
        const char *cname = verify == 1 ? "index" : verify == 2 ? "episode_index" : c->feature->name;
        int field = vf_pq_field_index(f, cname);
        if (field < 0) {
            if (verify)
                continue; /* nothing to verify against */
            r = vf_error(VF_ENOENT, "%s: missing column '%s' (declared in info.json)", vf_pq_name(f), cname);
            break;
        }
        for (size_t ri = 0; ri < nruns && r == 0; ri++) {
            int group = runs[ri].group;
            int64_t lo = runs[ri].lo, hi = runs[ri].hi;
            vf_pq_array a;
            memset(&a, 0, sizeof a);
            vf_pq_page_counts pages = {0, 0};
            r = vf_pq_read_field_rows(f, group, field, lo, hi - lo, &a, &pages);
            if (r < 0) {
                r = vf_error_context(r, "column '%s', row group %d", cname, group);
                break;
            }
            t->pages_decoded += pages.decoded;
            t->pages_skipped += pages.skipped;
            for (size_t i = 0; i < num_plans && r == 0; i++) {
                const vf_ds_episode *e = &d->episodes[d->selected[plans[i]->pos]];
                read_ctx x = {vf_pq_name(f), e->pub.episode_index, cname, 0};
                for (int s = 0; s < plans[i]->num_spans && r == 0; s++) {
                    const vf_ds_rg_span *sp = &plans[i]->spans[s];
                    if (sp->row_group != group || sp->first_row < lo || sp->first_row + sp->count > hi)
                        continue;
                    int64_t out_row = plans[i]->out_row + sp->episode_row;
                    x.episode_row = sp->episode_row;
                    vf_ds_rg_span in_a = *sp; /* rows of a start at the group's row lo */
                    in_a.first_row -= lo;
                    if (verify) {
                        r = verify_rows(&x, &a, &in_a, verify == 1 ? e->pub.from_index + sp->episode_row : -1);
                    } else if (pass == 0) {
                        r = copy_rows(&x, &a, in_a.first_row, sp->count, c, out_row);
                    } else {
                        r = copy_string_bytes(&a, in_a.first_row, sp->count, c, out_row);
                    }
                }
            }
            vf_pq_array_free(&a);
        }
    }
    free(runs);
    free(groups);
    close_data_file(cache, f);
    return r;
}

int vf_ds_data_file_row_groups(const vf_dataset *d, size_t file, int64_t **ends, int *count)
{
    return vf_ds_data_file_row_groups_cached(d, NULL, file, ends, count);
}

int vf_ds_data_file_row_groups_cached(const vf_dataset *d, vf_ds_pq_cache *cache, size_t file, int64_t **ends,
                                      int *count)
{
    *ends = NULL;
    *count = 0;
    if (file >= d->num_data_files)
        return vf_error(VF_ERANGE, "%s: data file %zu out of range (%zu files)", d->root, file, d->num_data_files);
    vf_pq_file *f;
    int r = open_data_file(d, cache, file, &f);
    if (r < 0)
        return r;
    int n = vf_pq_num_row_groups(f);
    int64_t *e = vf_malloc_array(n > 0 ? (size_t)n : 1, sizeof *e);
    if (!e) {
        close_data_file(cache, f);
        return VF_ENOMEM;
    }
    int64_t acc = 0;
    for (int g = 0; g < n; g++) {
        acc += vf_pq_row_group_rows(f, g);
        e[g] = acc;
    }
    close_data_file(cache, f);
    *ends = e;
    *count = n;
    return 0;
}

int vf_ds_read_table(const vf_dataset *d, const size_t *positions, size_t num_positions, const char *const *columns,
                     size_t num_columns, int flags, vf_ds_table *out)
{
    return vf_ds_read_table_cached(d, NULL, positions, num_positions, columns, num_columns, flags, out);
}

int vf_ds_read_table_cached(const vf_dataset *d, vf_ds_pq_cache *cache, const size_t *positions,
                            size_t num_positions, const char *const *columns, size_t num_columns, int flags,
                            vf_ds_table *out)
{
    memset(out, 0, sizeof *out);
    ep_plan *plans = vf_calloc(num_positions ? num_positions : 1, sizeof *plans);
    out->columns = vf_calloc(num_columns ? num_columns : 1, sizeof *out->columns);
    out->episode_start = vf_calloc(num_positions + 1, sizeof *out->episode_start);
    int r = plans && out->columns && out->episode_start ? 0 : VF_ENOMEM;
    int64_t rows = 0;
    for (size_t i = 0; i < num_positions && r == 0; i++) {
        if (positions[i] >= d->num_selected) {
            r = vf_error(VF_ERANGE, "%s: episode position %zu out of range (%zu selected)", d->root, positions[i],
                         d->num_selected);
            break;
        }
        const vf_ds_episode *e = &d->episodes[d->selected[positions[i]]];
        plans[i].pos = positions[i];
        plans[i].file = e->data_file_id;
        plans[i].out_row = rows;
        out->episode_start[i] = rows;
        if (e->pub.length < 0 || rows > (INT64_C(1) << 40) - e->pub.length) {
            r = vf_error(VF_ERANGE, "%s: too many rows requested", d->root);
            break;
        }
        rows += e->pub.length;
    }
    if (r == 0) {
        out->episode_start[num_positions] = rows;
        out->num_episodes = num_positions;
        out->rows = rows;
    }
    for (size_t ci = 0; ci < num_columns && r == 0; ci++) {
        const vf_feature *f = vf_dataset_find_feature(d, columns[ci]);
        if (!f) {
            r = vf_error(VF_ENOENT, "%s: no feature named '%s' in meta/info.json", d->root, columns[ci]);
            break;
        }
        int vt = vf_ds_feature_value_type(f);
        if (vt < 0) {
            r = vf_error(VF_EINVAL, "%s: feature '%s' (dtype %s) has no table values", d->root, f->name, f->dtype);
            break;
        }
        vf_ds_column *c = &out->columns[ci];
        out->num_columns = ci + 1;
        c->feature = f;
        c->type = (vf_ds_value_type)vt;
        c->width = vt == VF_DS_STRING ? 1 : f->size;
        c->rows = rows;
        if (vt == VF_DS_STRING) {
            c->offsets = vf_calloc((size_t)rows + 1, sizeof *c->offsets);
            if (!c->offsets)
                r = VF_ENOMEM;
        } else {
            size_t elem = vt == VF_DS_F32 ? sizeof(float) : sizeof(int64_t);
            if ((uint64_t)c->width > SIZE_MAX / elem / (rows ? (uint64_t)rows : 1))
                r = vf_error(VF_ENOMEM, "%s: column '%s': %lld rows of %lld values do not fit in memory", d->root,
                             f->name, (long long)rows, (long long)c->width);
            else if (!(c->values = vf_malloc_array(rows > 0 ? (size_t)rows * (size_t)c->width : 1, elem)))
                r = VF_ENOMEM;
        }
    }
    /* Plans grouped by data file (stable: request order within a file). */
    ep_plan **by_file = r == 0 ? vf_malloc_array(num_positions ? num_positions : 1, sizeof *by_file) : NULL;
    if (r == 0 && !by_file)
        r = VF_ENOMEM;
    for (size_t i = 0; r == 0 && i < num_positions; i++)
        by_file[i] = &plans[i];
    if (r == 0)
        qsort(by_file, num_positions, sizeof *by_file, cmp_plan_file);
    int has_strings = 0;
    for (size_t ci = 0; ci < out->num_columns; ci++)
        has_strings |= out->columns[ci].type == VF_DS_STRING;
    for (int pass = 0; pass < (has_strings ? 2 : 1) && r == 0; pass++) {
        if (pass == 1) {
            /* Prefix-sum the string lengths into offsets, then allocate. */
            for (size_t ci = 0; ci < out->num_columns && r == 0; ci++) {
                vf_ds_column *c = &out->columns[ci];
                if (c->type != VF_DS_STRING)
                    continue;
                c->offsets[0] = 0;
                for (int64_t i = 0; i < rows; i++)
                    c->offsets[i + 1] += c->offsets[i];
                if (!(c->data = vf_malloc((size_t)c->offsets[rows] + 1)))
                    r = VF_ENOMEM;
            }
        }
        /* One data file at a time, its episodes in request order. */
        for (size_t i = 0; i < num_positions && r == 0;) {
            size_t j = i;
            while (j < num_positions && by_file[j]->file == by_file[i]->file)
                j++;
            r = read_file_part(d, cache, (size_t)by_file[i]->file, by_file + i, j - i, out, flags, pass);
            i = j;
        }
    }
    free(by_file);
    for (size_t i = 0; plans && i < num_positions; i++)
        free(plans[i].spans);
    free(plans);
    if (r < 0)
        vf_ds_table_free(out);
    return r;
}
