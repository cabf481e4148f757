/*
 * rows.c: the spec's table rows, read lazily per episode (sample.h).
 *
 * A batch acquires the rows of the episodes it draws from. Missing
 * episodes are read together in one vf_ds_read_table call (each data file
 * taken from the spec's cache of open data files, its footer decoded once
 * per loader, each needed row group read once, `index` and
 * `episode_index` verified), together with read-ahead: the episodes that
 * follow a missing one in the same data file and that the loader will emit
 * this epoch (spec->wanted), up to a row budget, so a data file written
 * with one big row group is decoded once for a run of episodes rather than
 * once per episode. In map mode (no wanted list: positions are random) the
 * read takes instead the episodes lying inside the row groups the miss
 * decodes anyway (known from the data file's footer), nearest first, up to
 * the same row budget: a row-group cache at episode granularity. Loaded episodes stay in a cache bounded by
 * rows_max_bytes; the least recently used unreferenced ones are evicted.
 *
 * Threads: any number of assemblers; the cache is under rows_lock, the
 * read itself runs outside it (two threads missing the same episode may
 * both read it; the second copy is dropped).
 */
#include "sample/sample.h"

#include <stdlib.h>
#include <string.h>

/* Rows read ahead at most per miss, beyond the episodes asked for. */
#define READ_AHEAD_ROWS 65536

static size_t rows_bytes(const vf_ds_table *t)
{
    size_t b = sizeof(vf_sample_rows);
    for (size_t i = 0; i < t->num_columns; i++) {
        const vf_ds_column *c = &t->columns[i];
        if (c->type == VF_DS_STRING)
            b += (size_t)(c->rows + 1) * sizeof(int64_t) + 2 * (size_t)c->offsets[c->rows] + (size_t)c->rows;
        else
            b += (size_t)c->rows * (size_t)c->width * (c->type == VF_DS_F32 ? sizeof(float) : sizeof(int64_t));
    }
    return b;
}

static void rows_free(vf_sample_rows *r, size_t ncols)
{
    if (!r)
        return;
    if (r->strings) {
        for (size_t i = 0; i < ncols; i++)
            free(r->strings[i]);
        free(r->strings);
    }
    vf_ds_table_free(&r->t);
    free(r);
}

/* Splits a table of several episodes (in request order) into per-episode
 * rows, checks task_index, makes NUL-terminated string copies. */
static int split_table(const vf_sample_spec *s, const vf_ds_table *t, const size_t *eps, size_t n,
                       vf_sample_rows **out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    size_t ntasks = vf_dataset_num_tasks(s->dataset);
    for (size_t i = 0; i < n; i++) {
        int64_t lo = t->episode_start[i], rows = t->episode_start[i + 1] - lo;
        vf_sample_rows *r = vf_calloc(1, sizeof *r);
        if (!r)
            return VF_ENOMEM;
        out[i] = r;
        r->t.rows = rows;
        r->t.num_columns = t->num_columns;
        r->t.num_episodes = 1;
        if (!(r->t.columns = vf_calloc(t->num_columns ? t->num_columns : 1, sizeof *r->t.columns)))
            return VF_ENOMEM;
        for (size_t ci = 0; ci < t->num_columns; ci++) {
            const vf_ds_column *src = &t->columns[ci];
            vf_ds_column *c = &r->t.columns[ci];
            c->feature = src->feature;
            c->type = src->type;
            c->width = src->width;
            c->rows = rows;
            if (src->type == VF_DS_STRING) {
                int64_t b0 = src->offsets[lo], b1 = src->offsets[lo + rows];
                c->offsets = vf_malloc_array((size_t)rows + 1, sizeof *c->offsets);
                c->data = vf_malloc((size_t)(b1 - b0) + 1);
                if (!c->offsets || !c->data)
                    return VF_ENOMEM;
                for (int64_t k = 0; k <= rows; k++)
                    c->offsets[k] = src->offsets[lo + k] - b0;
                memcpy(c->data, src->data + b0, (size_t)(b1 - b0));
                if (!r->strings && !(r->strings = vf_calloc(t->num_columns, sizeof *r->strings)))
                    return VF_ENOMEM;
                /* Row k lives at copy + offsets[k] + k, followed by its NUL. */
                char *copy = vf_malloc((size_t)(b1 - b0 + rows) + 1);
                if (!copy)
                    return VF_ENOMEM;
                for (int64_t k = 0; k < rows; k++) {
                    int64_t a = c->offsets[k], len = c->offsets[k + 1] - a;
                    memcpy(copy + a + k, c->data + a, (size_t)len);
                    copy[a + k + len] = 0;
                }
                r->strings[ci] = copy;
            } else {
                size_t elem = src->type == VF_DS_F32 ? sizeof(float) : sizeof(int64_t);
                size_t bytes = (size_t)rows * (size_t)src->width * elem;
                if (!(c->values = vf_malloc(bytes ? bytes : 1)))
                    return VF_ENOMEM;
                memcpy(c->values, (const uint8_t *)src->values + (size_t)lo * (size_t)src->width * elem, bytes);
            }
        }
        if (s->task_index_column >= 0) {
            const int64_t *v = r->t.columns[s->task_index_column].values;
            for (int64_t k = 0; k < rows; k++)
                if (v[k] < 0 || (uint64_t)v[k] >= ntasks)
                    return vf_error(VF_ECORRUPT, "%s: episode %lld frame %lld: task_index %lld is not one of the %zu "
                                                 "tasks",
                                    vf_dataset_root(s->dataset),
                                    (long long)vf_dataset_episode(s->dataset, eps[i])->episode_index, (long long)k,
                                    (long long)v[k], ntasks);
        }
        r->bytes = rows_bytes(&r->t);
    }
    return 0;
}

/* Evicts unreferenced episodes, least recently used first, until the cache
 * fits its bound (rows_lock held). */
static void evict(vf_sample_spec *s)
{
    while (s->rows_bytes > s->rows_max_bytes) {
        size_t best = SIZE_MAX;
        uint64_t oldest = UINT64_MAX;
        for (size_t i = 0; i < s->num_loaded; i++) {
            const vf_sample_rows *r = s->rows[s->loaded[i]];
            if (r->refs == 0 && r->last_use < oldest) {
                oldest = r->last_use;
                best = i;
            }
        }
        if (best == SIZE_MAX)
            return; /* everything is in use: over the bound until released */
        size_t ep = s->loaded[best];
        vf_sample_rows *r = s->rows[ep];
        s->rows[ep] = NULL;
        s->loaded[best] = s->loaded[--s->num_loaded];
        if (best < s->num_loaded)
            s->rows[s->loaded[best]]->slot = best;
        s->rows_bytes -= r->bytes;
        s->table_evictions++;
        /* Batches may still point at the strings: keep them for the spec's life. */
        for (size_t ci = 0; r->strings && ci < s->num_table; ci++) {
            if (!r->strings[ci])
                continue;
            if (s->num_kept_strings == s->cap_kept_strings) {
                size_t cap = s->cap_kept_strings ? s->cap_kept_strings * 2 : 64;
                char **nk = vf_realloc(s->kept_strings, cap * sizeof *nk);
                if (!nk)
                    break; /* keep r's strings leaking rather than dangling */
                s->kept_strings = nk;
                s->cap_kept_strings = cap;
            }
            s->kept_strings[s->num_kept_strings++] = r->strings[ci];
            r->strings[ci] = NULL;
        }
        rows_free(r, s->num_table);
    }
}

static int insert(vf_sample_spec *s, size_t ep, vf_sample_rows *r)
{
    if (s->num_loaded % 64 == 0) {
        size_t *nl = vf_realloc(s->loaded, (s->num_loaded + 64) * sizeof *nl);
        if (!nl)
            return VF_ENOMEM;
        s->loaded = nl;
    }
    r->slot = s->num_loaded;
    s->loaded[s->num_loaded++] = ep;
    s->rows[ep] = r;
    s->rows_bytes += r->bytes;
    s->table_episodes++;
    s->table_rows += (uint64_t)r->t.rows;
    return 0;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static int push(size_t **v, size_t *k, size_t *cap, size_t e)
{
    if (*k == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        size_t *nv = vf_realloc(*v, nc * sizeof *nv);
        if (!nv)
            return VF_ENOMEM;
        *v = nv;
        *cap = nc;
    }
    (*v)[(*k)++] = e;
    return 0;
}

/* Map mode: learns the row-group ends of the data files of eps that are
 * not known yet (footers read outside rows_lock; a file whose footer cannot
 * be read gets no co-reading, and its read reports the error). */
static void learn_row_groups(vf_sample_spec *s, const size_t *eps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        vf_data_span ds;
        if (vf_dataset_episode_data(s->dataset, eps[i], &ds) < 0 || ds.file >= s->num_data_files)
            continue;
        pthread_mutex_lock(&s->rows_lock);
        int known = s->rg_known[ds.file];
        if (!known)
            s->rg_known[ds.file] = 3;
        pthread_mutex_unlock(&s->rows_lock);
        if (known)
            continue;
        int64_t *ends = NULL;
        int count = 0;
        int r = vf_ds_data_file_row_groups_cached(s->dataset, s->data_files, ds.file, &ends, &count);
        pthread_mutex_lock(&s->rows_lock);
        if (r == 0) {
            s->rg_ends[ds.file] = ends;
            s->rg_count[ds.file] = count;
        } else {
            free(ends);
        }
        s->rg_known[ds.file] = r == 0 ? 1 : 2;
        pthread_mutex_unlock(&s->rows_lock);
    }
}

/* The first row group whose cumulative end is past row (ends ascending). */
static int group_of_row(const int64_t *ends, int n, int64_t row)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (ends[mid] > row)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Decoded bytes of one table row (an estimate from the features). */
static size_t table_row_bytes(const vf_sample_spec *s)
{
    size_t b = 0;
    for (size_t i = 0; i < s->num_table; i++) {
        const vf_feature *f = vf_dataset_find_feature(s->dataset, s->table_names[i]);
        int vt = f ? vf_ds_feature_value_type(f) : -1;
        b += vt == VF_DS_STRING ? 64 : (size_t)(f && f->size > 0 ? f->size : 1) * (vt == VF_DS_F32 ? 4 : 8);
    }
    return b ? b : 8;
}

/* Map mode: whether the rows of all the loader's episodes fit in three
 * quarters of the row cache, and the loader draws at least 4 samples per
 * episode this epoch, so that its random positions touch nearly every
 * episode anyway (an episode of average length is missed with probability
 * about e^-4): reading the whole table then costs no episode it would not
 * read (rows_lock held). A rank of a large world drawing a few samples
 * per episode reads only the episodes it draws. */
static int table_fits(vf_sample_spec *s)
{
    if (s->map_samples < 4 * (int64_t)s->num_episodes)
        return 0;
    if (s->map_table_rows == 0) {
        int64_t rows = 0;
        for (size_t e = 0; e < s->num_episodes; e++)
            rows += VF_MAX(vf_dataset_episode(s->dataset, e)->length, 0);
        s->map_table_rows = rows > 0 ? rows : -1;
    }
    return s->map_table_rows > 0 &&
           (uint64_t)s->map_table_rows <= s->rows_max_bytes / 4 * 3 / table_row_bytes(s);
}

/* Map mode: the unloaded episodes lying entirely inside the row groups that
 * reading e0 decodes anyway, when all of them fit: at most READ_AHEAD_ROWS
 * rows and a quarter of the cache bound. A bigger row group (a whole file
 * written as one) is not taken whole: random batches over a dataset larger
 * than the cache would only churn it, so such a miss reads its own episode
 * as before. When the loader's whole table fits in the cache, whatever
 * the row groups, the miss takes instead the episodes around e0 in its
 * file, up to *file_budget
 * rows for the whole call (READ_AHEAD_ROWS per batch), read in one run
 * like stream mode's, so the table is loaded in file order in a few dozen
 * batches instead of one random episode (a page decode per column) at a
 * time, and every later sample hits. Marked in flight (rows_lock held). */
static int co_resident(vf_sample_spec *s, size_t e0, size_t **v, size_t *k, size_t *cap, int64_t *file_budget)
{
    vf_data_span base;
    if (vf_dataset_episode_data(s->dataset, e0, &base) < 0 || base.file >= s->num_data_files ||
        s->rg_known[base.file] != 1)
        return 0;
    const int64_t *ends = s->rg_ends[base.file];
    int n = s->rg_count[base.file];
    int g0 = group_of_row(ends, n, base.row_offset), g1 = group_of_row(ends, n, base.row_offset + base.length - 1);
    if (base.length <= 0 || g0 >= n || g1 >= n)
        return 0;
    int64_t lo = g0 ? ends[g0 - 1] : 0, hi = ends[g1];
    int64_t budget = hi - lo, *spend = &budget;
    if (*file_budget > 0 && table_fits(s)) {
        lo = 0; /* the whole file */
        hi = INT64_MAX;
        spend = file_budget;
    } else if (hi - lo > READ_AHEAD_ROWS || (uint64_t)(hi - lo) * table_row_bytes(s) > s->rows_max_bytes / 4) {
        return 0;
    }
    int r = 0;
    for (int dir = 1; dir >= -1 && r == 0; dir -= 2) {
        for (size_t e = e0; *spend > 0 && r == 0;) {
            if (dir < 0 ? e == 0 : e + 1 >= s->num_episodes)
                break;
            e = dir < 0 ? e - 1 : e + 1;
            vf_data_span ds;
            if (vf_dataset_episode_data(s->dataset, e, &ds) < 0 || ds.file != base.file || ds.row_offset < lo ||
                ds.row_offset + ds.length > hi)
                break;
            if (s->rows[e] || s->loading[e])
                continue;
            s->loading[e] = 1;
            r = push(v, k, cap, e);
            *spend -= ds.length;
        }
    }
    return r;
}

/* The episodes this call reads: each missing episode that no other thread
 * is reading, then the wanted, unloaded, not-in-flight episodes that
 * follow it in the same data file, up to READ_AHEAD_ROWS rows per missing
 * episode; all marked in flight (rows_lock held). */
static int claim(vf_sample_spec *s, const size_t *eps, size_t n, int extras, size_t **out, size_t *count,
                 size_t *asked)
{
    size_t cap = 0, k = 0;
    size_t *v = NULL;
    int r = 0;
    int64_t file_budget = READ_AHEAD_ROWS; /* map mode, when the table fits: for the whole call */
    *asked = 0;
    for (size_t i = 0; i < n && r == 0; i++) {
        size_t e0 = eps[i];
        if (s->rows[e0] || s->loading[e0])
            continue;
        s->loading[e0] = 1;
        r = push(&v, &k, &cap, e0);
        ++*asked;
        if (!extras)
            continue;
        if (!s->wanted) {
            if (r == 0)
                r = co_resident(s, e0, &v, &k, &cap, &file_budget);
            continue;
        }
        vf_data_span base;
        if (vf_dataset_episode_data(s->dataset, e0, &base) < 0)
            continue;
        int64_t budget = READ_AHEAD_ROWS;
        for (size_t e = e0 + 1; e < s->num_episodes && budget > 0 && r == 0; e++) {
            vf_data_span ds;
            if (vf_dataset_episode_data(s->dataset, e, &ds) < 0 || ds.file != base.file)
                break;
            if (!s->wanted[e] || s->rows[e] || s->loading[e])
                continue;
            s->loading[e] = 1;
            r = push(&v, &k, &cap, e);
            budget -= vf_dataset_episode(s->dataset, e)->length;
        }
    }
    if (r == 0 && k > 1)
        qsort(v, k, sizeof *v, cmp_size);
    if (r < 0)
        for (size_t i = 0; i < k; i++)
            s->loading[v[i]] = 0;
    *out = v;
    *count = r < 0 ? 0 : k;
    return r;
}

int vf_sample_rows_acquire(vf_sample_spec *s, const size_t *eps, size_t n, vf_sample_rows **out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    if (s->num_table == 0)
        return 0;
    int r = 0;
    pthread_mutex_lock(&s->rows_lock);
    int map_mode = !s->wanted;
    pthread_mutex_unlock(&s->rows_lock);
    if (map_mode)
        learn_row_groups(s, eps, n);
    pthread_mutex_lock(&s->rows_lock);
    /* extras: read-ahead / row-group neighbours join the read; after a read
     * with extras fails, it is retried without them, so that a damaged
     * neighbour never fails (or names itself in) a read of good episodes. */
    int extras = 1;
    for (;;) {
        size_t *want = NULL, nw = 0, asked = 0;
        if ((r = claim(s, eps, n, extras, &want, &nw, &asked)) < 0)
            break;
        if (nw > 0) {
            /* Read outside the lock; other threads wait for these episodes. */
            pthread_mutex_unlock(&s->rows_lock);
            vf_sample_rows **got = vf_calloc(nw, sizeof *got);
            vf_ds_table t;
            uint64_t groups = 0, pages_decoded = 0, pages_skipped = 0;
            r = got ? vf_ds_read_table_cached(s->dataset, s->data_files, want, nw, s->table_names, s->num_table,
                                              VF_DS_VERIFY_INDEX, &t)
                    : VF_ENOMEM;
            if (r == 0) {
                groups = (uint64_t)t.row_groups_read;
                pages_decoded = (uint64_t)t.pages_decoded;
                pages_skipped = (uint64_t)t.pages_skipped;
                r = split_table(s, &t, want, nw, got);
                vf_ds_table_free(&t);
            }
            pthread_mutex_lock(&s->rows_lock);
            s->table_reads += got != NULL;
            s->table_row_groups += groups;
            s->table_pages_decoded += pages_decoded;
            s->table_pages_skipped += pages_skipped;
            for (size_t i = 0; i < nw; i++) {
                s->loading[want[i]] = 0;
                if (r == 0 && (r = insert(s, want[i], got[i])) == 0)
                    got[i] = NULL;
                if (got)
                    rows_free(got[i], s->num_table);
            }
            free(got);
            pthread_cond_broadcast(&s->rows_cond);
        }
        free(want);
        if (r < 0 && extras && nw > asked) {
            extras = 0;
            r = 0;
            continue;
        }
        if (r < 0)
            break;
        /* Wait for episodes other threads are reading; claim again any
         * whose read failed there. */
        int pending = 0, missing = 0;
        for (size_t i = 0; i < n; i++) {
            pending |= s->loading[eps[i]];
            missing |= !s->rows[eps[i]] && !s->loading[eps[i]];
        }
        if (!pending && !missing)
            break;
        if (pending && !missing)
            pthread_cond_wait(&s->rows_cond, &s->rows_lock);
    }
    s->rows_clock++;
    for (size_t i = 0; r == 0 && i < n; i++) {
        out[i] = s->rows[eps[i]];
        out[i]->refs++;
        out[i]->last_use = s->rows_clock;
    }
    if (r == 0)
        evict(s);
    pthread_mutex_unlock(&s->rows_lock);
    if (r < 0)
        for (size_t i = 0; i < n; i++)
            out[i] = NULL;
    return r;
}

void vf_sample_rows_release(vf_sample_spec *s, vf_sample_rows **rows, size_t n)
{
    if (s->num_table == 0)
        return;
    pthread_mutex_lock(&s->rows_lock);
    for (size_t i = 0; i < n; i++)
        if (rows[i])
            rows[i]->refs--;
    evict(s);
    pthread_mutex_unlock(&s->rows_lock);
}

void vf_sample_rows_trim(vf_sample_spec *s)
{
    if (!s->rows)
        return;
    pthread_mutex_lock(&s->rows_lock);
    size_t keep = s->rows_max_bytes;
    s->rows_max_bytes = 0;
    evict(s);
    s->rows_max_bytes = keep;
    pthread_mutex_unlock(&s->rows_lock);
}

void vf_sample_rows_free_all(vf_sample_spec *s)
{
    for (size_t i = 0; s->rows && i < s->num_loaded; i++) {
        rows_free(s->rows[s->loaded[i]], s->num_table);
        s->rows[s->loaded[i]] = NULL;
    }
    s->num_loaded = 0;
    free(s->loaded);
    free(s->rows);
    s->loaded = NULL;
    s->rows = NULL;
    for (size_t i = 0; i < s->num_kept_strings; i++)
        free(s->kept_strings[i]);
    free(s->kept_strings);
    s->kept_strings = NULL;
    free(s->loading);
    s->loading = NULL;
}
