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
#define _GNU_SOURCE /* O_CLOEXEC, flock */
#include "sample/sample.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

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

/* Every task_index of an episode's rows names one of the dataset's tasks. */
static int check_task_index(const vf_sample_spec *s, const vf_sample_rows *r, size_t ep)
{
    if (s->task_index_column < 0)
        return 0;
    size_t ntasks = vf_dataset_num_tasks(s->dataset);
    const int64_t *v = r->t.columns[s->task_index_column].values;
    for (int64_t k = 0; k < r->t.rows; k++)
        if (v[k] < 0 || (uint64_t)v[k] >= ntasks)
            return vf_error(VF_ECORRUPT, "%s: episode %lld frame %lld: task_index %lld is not one of the %zu tasks",
                            vf_dataset_root(s->dataset), (long long)vf_dataset_episode(s->dataset, ep)->episode_index,
                            (long long)k, (long long)v[k], ntasks);
    return 0;
}

/* Splits a table of several episodes (in request order) into per-episode
 * rows, checks task_index, makes NUL-terminated string copies. */
static int split_table(const vf_sample_spec *s, const vf_ds_table *t, const size_t *eps, size_t n,
                       vf_sample_rows **out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
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
        int rc = check_task_index(s, r, eps[i]);
        if (rc < 0)
            return rc;
        r->bytes = rows_bytes(&r->t);
    }
    return 0;
}

/* The recency list: newest first; a use moves an episode to the front, an
 * eviction takes from the back (O(1) per step, rather than a scan of every
 * loaded episode: with thousands loaded, that scan was most of a map-mode
 * sample's CPU). rows_lock held. */
static void lru_unlink(vf_sample_spec *s, vf_sample_rows *r)
{
    if (r->newer)
        r->newer->older = r->older;
    else
        s->rows_newest = r->older;
    if (r->older)
        r->older->newer = r->newer;
    else
        s->rows_oldest = r->newer;
    r->newer = r->older = NULL;
}

static void lru_push_newest(vf_sample_spec *s, vf_sample_rows *r)
{
    r->older = s->rows_newest;
    r->newer = NULL;
    if (s->rows_newest)
        s->rows_newest->newer = r;
    s->rows_newest = r;
    if (!s->rows_oldest)
        s->rows_oldest = r;
}

/* Evicts unreferenced episodes, least recently used first, until the cache
 * fits its bound (rows_lock held). */
static void evict(vf_sample_spec *s)
{
    vf_sample_rows *r = s->rows_oldest;
    while (s->rows_bytes > s->rows_max_bytes && r) {
        if (r->refs > 0) { /* in use: the next newer one */
            r = r->newer;
            continue;
        }
        vf_sample_rows *next = r->newer;
        size_t best = r->slot;
        size_t ep = s->loaded[best];
        lru_unlink(s, r);
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
        r = next;
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
    lru_push_newest(s, r);
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
        int known = s->rows[eps[i]] ? 1 : s->rg_known[ds.file]; /* served (the disk cache): nothing to learn */
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
/* Whether the rows of all the loader's episodes fit in three quarters of
 * the row cache (rows_lock held). */
static int table_rows_fit(vf_sample_spec *s)
{
    if (s->map_table_rows == 0) {
        int64_t rows = 0;
        for (size_t e = 0; e < s->num_episodes; e++)
            rows += VF_MAX(vf_dataset_episode(s->dataset, e)->length, 0);
        s->map_table_rows = rows > 0 ? rows : -1;
    }
    return s->map_table_rows > 0 &&
           (uint64_t)s->map_table_rows <= s->rows_max_bytes / 4 * 3 / table_row_bytes(s);
}

static int table_fits(vf_sample_spec *s)
{
    if (s->map_samples < 4 * (int64_t)s->num_episodes)
        return 0;
    return table_rows_fit(s);
}

/* ---- map mode: the table cache on disk --------------------------------------------
 *
 * When the table does not fit in the row cache, a miss in map mode would
 * decode a Parquet page per column for one episode, again after every
 * eviction. With the table cache (meta_cache.h), the first miss in a data
 * file decodes the rows of all the file's episodes once (checked as any
 * read is), stores them under the cache folder and opens the stored file;
 * every later miss in that file, in this run or a later one, in this
 * process or another, reads the episode's slice of each column (pread).
 */

/* Upper bound of one file's decoded rows built in memory before the store. */
#define TDISK_MAX_FILE_BYTES ((uint64_t)1 << 30)

/* Whether the disk cache serves this loader (rows_lock held): map mode
 * only; auto (the default) when the table does not fit in the row cache
 * and the loader draws at least one sample per episode this epoch, so
 * that decoding a whole data file costs no more than the episodes it will
 * draw anyway; local datasets and numeric columns only. */
static int tdisk_on(vf_sample_spec *s)
{
    if (s->tdisk_decided)
        return s->tdisk_decided > 0;
    s->tdisk_decided = -1;
    const vf_dataset *d = s->dataset;
    if (s->tdisk_mode == 0 || s->wanted || !d->local_fs || s->num_data_files == 0)
        return 0;
    if (s->tdisk_mode < 0 && (s->map_samples < (int64_t)s->num_episodes || table_rows_fit(s)))
        return 0;
    int *types = vf_calloc(s->num_table, sizeof *types);
    int64_t *widths = vf_calloc(s->num_table, sizeof *widths);
    vf_ds_table_cache_file *files = vf_calloc(s->num_data_files, sizeof *files);
    uint8_t *state = vf_calloc(s->num_data_files, 1);
    uint8_t *checked = vf_calloc(s->num_episodes ? s->num_episodes : 1, 1);
    int ok = types && widths && files && state && checked;
    for (size_t i = 0; ok && i < s->num_table; i++) {
        const vf_feature *f = vf_dataset_find_feature(d, s->table_names[i]);
        types[i] = f ? vf_ds_feature_value_type(f) : -1;
        widths[i] = f && f->size > 0 ? f->size : 1;
        ok = types[i] == VF_DS_F32 || types[i] == VF_DS_I64;
    }
    if (ok && (vf_ds_file_cache_open(&s->tdisk, VF_DS_CACHE_TABLE, (char *const *)s->table_names,
                                     (int)s->num_table) < 0 ||
               !s->tdisk))
        ok = 0;
    if (!ok) {
        free(types);
        free(widths);
        free(files);
        free(state);
        free(checked);
        return 0;
    }
    s->tdisk_checked = checked;
    s->tdisk_types = types;
    s->tdisk_widths = widths;
    s->tdisk_files = files;
    s->tdisk_state = state;
    s->tdisk_decided = 1;
    return 1;
}

typedef struct ep_at {
    size_t pos;
    int64_t row_offset;
} ep_at;

static int cmp_ep_at(const void *a, const void *b)
{
    int64_t x = ((const ep_at *)a)->row_offset, y = ((const ep_at *)b)->row_offset;
    return x < y ? -1 : x > y;
}

/* Decodes the rows of every selected episode of data file `file` (one
 * checked read, in file order) and stores them; 1 stored. */
static int tdisk_build(vf_sample_spec *s, size_t file, vf_ds_meta_key *key)
{
    const vf_dataset *d = s->dataset;
    const vf_ds_file *df = &d->data_files[file];
    size_t n = df->num_episodes;
    if (n == 0)
        return 0;
    ep_at *at = vf_malloc_array(n, sizeof *at);
    size_t *pos = vf_malloc_array(n, sizeof *pos);
    int64_t *offs = vf_malloc_array(n, sizeof *offs), *epi = vf_malloc_array(n, sizeof *epi),
            *from = vf_malloc_array(n, sizeof *from);
    int r = at && pos && offs && epi && from ? 0 : VF_ENOMEM;
    int64_t rows = 0;
    for (size_t i = 0; r == 0 && i < n; i++) {
        vf_data_span ds;
        if (vf_dataset_episode_data(d, df->episodes[i], &ds) < 0 || ds.file != file)
            r = VF_EINVAL;
        at[i] = (ep_at){df->episodes[i], ds.row_offset};
        rows += ds.length;
    }
    if (r == 0 && (uint64_t)rows * table_row_bytes(s) > TDISK_MAX_FILE_BYTES)
        r = VF_EINVAL; /* not built: the rows would not fit in memory comfortably */
    int stored = 0;
    if (r == 0) {
        qsort(at, n, sizeof *at, cmp_ep_at);
        for (size_t i = 0; i < n; i++) {
            const vf_episode *ep = vf_dataset_episode(d, at[i].pos);
            pos[i] = at[i].pos;
            offs[i] = at[i].row_offset;
            epi[i] = ep->episode_index;
            from[i] = ep->from_index;
        }
        vf_ds_table t;
        if (vf_ds_read_table_cached(d, s->data_files, pos, n, s->table_names, s->num_table, VF_DS_VERIFY_INDEX,
                                    &t) == 0) {
            const char *delay = getenv("VF_TEST_TABLE_BUILD_DELAY_MS"); /* tests: make builders overlap */
            if (delay && atoi(delay) > 0)
                nanosleep(&(struct timespec){atoi(delay) / 1000, (long)(atoi(delay) % 1000) * 1000000L}, NULL);
            stored = vf_ds_table_cache_store(s->tdisk, key, &t, offs, epi, from) > 0;
            pthread_mutex_lock(&s->rows_lock); /* the decode counts as any read does */
            s->table_reads++;
            s->table_row_groups += (uint64_t)t.row_groups_read;
            s->table_pages_decoded += (uint64_t)t.pages_decoded;
            s->table_pages_skipped += (uint64_t)t.pages_skipped;
            pthread_mutex_unlock(&s->rows_lock);
            vf_ds_table_free(&t);
        } else {
            /* A damaged episode in the file: its own reads report it. */
            vf_log(VF_LOG_DEBUG, "%s: not cached on disk: %s", df->path, vf_last_error());
        }
    }
    free(at);
    free(pos);
    free(offs);
    free(epi);
    free(from);
    return stored;
}

/* Episode pos's entry in f when it holds the episode as the model
 * describes it (rows at ds's offset, its length, episode_index and
 * from_index), else NULL. */
static const int64_t *tdisk_entry(const vf_sample_spec *s, const vf_ds_table_cache_file *f, size_t pos,
                                  const vf_data_span *ds)
{
    const int64_t *x = vf_ds_table_cache_find(f, ds->row_offset);
    const vf_episode *ep = vf_dataset_episode(s->dataset, pos);
    return x && x[1] == ds->length && x[3] == ep->episode_index && x[4] == ep->from_index ? x : NULL;
}

/* Opens data file `file`'s cache entry (*key: the file's identity now):
 * 1 when it holds every selected episode of the file; an entry built by a
 * loader that selected other episodes is closed and counts as a miss (0),
 * so that it is built again for this selection (the newest is kept). */
static int tdisk_open_entry(vf_sample_spec *s, size_t file, vf_ds_meta_key *key, vf_ds_table_cache_file *f)
{
    const vf_ds_file *df = &s->dataset->data_files[file];
    int hit = vf_ds_table_cache_open(s->tdisk, df->path, s->tdisk_types, s->tdisk_widths, s->num_table, key, f);
    for (size_t i = 0; hit > 0 && i < df->num_episodes; i++) {
        vf_data_span ds;
        if (vf_dataset_episode_data(s->dataset, df->episodes[i], &ds) < 0 || !tdisk_entry(s, f, df->episodes[i], &ds)) {
            vf_ds_table_cache_close(f);
            hit = 0;
        }
    }
    return hit;
}

/* Opens data file `file`'s cache entry, building it first when missing
 * (outside rows_lock; the caller set its state to 1). */
static void tdisk_prepare(vf_sample_spec *s, size_t file)
{
    vf_ds_table_cache_file f;
    vf_ds_meta_key key;
    int built = 0;
    int hit = tdisk_open_entry(s, file, &key, &f);
    if (hit == 0 && key.valid && vf_ds_file_cache_writable(s->tdisk)) {
        /* One builder per entry across processes (DataLoader workers, ranks
         * of a node): the others wait on the entry's lock file, then find
         * the entry built. */
        char *entry = vf_ds_file_cache_entry(s->tdisk, &key);
        char *lock_path = entry ? vf_asprintf("%s.lock", entry) : NULL;
        int lock_fd = lock_path ? open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
        if (lock_fd >= 0 && flock(lock_fd, LOCK_EX) == 0) {
            vf_ds_meta_key_free(&key);
            hit = tdisk_open_entry(s, file, &key, &f);
        }
        if (hit == 0 && key.valid && tdisk_build(s, file, &key)) {
            built = 1;
            vf_ds_meta_key_free(&key);
            hit = vf_ds_table_cache_open(s->tdisk, s->dataset->data_files[file].path, s->tdisk_types,
                                         s->tdisk_widths, s->num_table, &key, &f);
        }
        if (lock_fd >= 0)
            close(lock_fd); /* releases the lock; the file stays (pruned after an hour) */
        free(lock_path);
        free(entry);
    }
    vf_ds_meta_key_free(&key);
    pthread_mutex_lock(&s->rows_lock);
    if (hit > 0) {
        s->tdisk_files[file] = f;
        s->table_disk_files++;
        s->table_disk_bytes += (size_t)f.file_len;
    }
    s->table_disk_builds += built;
    s->tdisk_state[file] = hit > 0 ? 2 : 3;
    pthread_cond_broadcast(&s->rows_cond);
    pthread_mutex_unlock(&s->rows_lock);
}

/* Episode e's rows from its file's cache entry, or NULL when the entry
 * does not hold it as the model describes it, or cannot be read (then
 * Parquet is read, and a damaged entry is reported once). */
static vf_sample_rows *tdisk_rows(vf_sample_spec *s, size_t e, const vf_data_span *ds)
{
    const vf_ds_table_cache_file *f = &s->tdisk_files[ds->file];
    const int64_t *x = tdisk_entry(s, f, e, ds);
    if (!x)
        return NULL;
    vf_sample_rows *r = vf_calloc(1, sizeof *r);
    void **dest = vf_calloc(s->num_table ? s->num_table : 1, sizeof *dest);
    int ok = r && dest && (r->t.columns = vf_calloc(s->num_table ? s->num_table : 1, sizeof *r->t.columns));
    if (ok) {
        r->t.rows = ds->length;
        r->t.num_columns = s->num_table;
        r->t.num_episodes = 1;
    }
    for (size_t i = 0; ok && i < s->num_table; i++) {
        vf_ds_column *c = &r->t.columns[i];
        size_t elem = s->tdisk_types[i] == VF_DS_F32 ? sizeof(float) : sizeof(int64_t);
        size_t bytes = (size_t)ds->length * (size_t)s->tdisk_widths[i] * elem;
        c->feature = vf_dataset_find_feature(s->dataset, s->table_names[i]);
        c->type = (vf_ds_value_type)s->tdisk_types[i];
        c->width = s->tdisk_widths[i];
        c->rows = ds->length;
        ok = (dest[i] = c->values = vf_malloc(bytes ? bytes : 1)) != NULL;
    }
    if (ok) {
        pthread_mutex_lock(&s->rows_lock);
        int checked = s->tdisk_checked[e];
        pthread_mutex_unlock(&s->rows_lock);
        int rc = vf_ds_table_cache_read(f, s->tdisk_types, s->tdisk_widths, x, dest, !checked);
        if (rc == 0 && !checked) {
            pthread_mutex_lock(&s->rows_lock);
            s->tdisk_checked[e] = 1;
            pthread_mutex_unlock(&s->rows_lock);
        }
        if (rc < 0) {
            /* Names the episode; the warning adds the data file. */
            vf_error(rc, "episode %lld: %s", (long long)vf_dataset_episode(s->dataset, e)->episode_index,
                     vf_last_error());
            vf_ds_file_cache_damaged(s->tdisk, "table cache", ds->path);
            ok = 0;
        }
    }
    ok = ok && check_task_index(s, r, e) == 0; /* else the Parquet read reports it */
    free(dest);
    if (!ok) {
        rows_free(r, s->num_table);
        return NULL;
    }
    r->bytes = rows_bytes(&r->t);
    return r;
}

/* Serves the missing episodes of eps that the disk cache holds, opening
 * or building their files' entries first. A thread that needs a file
 * another is preparing waits for it (each file is prepared once). */
static void tdisk_fill(vf_sample_spec *s, const size_t *eps, size_t n, uint8_t *pinned)
{
    pthread_mutex_lock(&s->rows_lock);
    int on = tdisk_on(s);
    pthread_mutex_unlock(&s->rows_lock);
    if (!on)
        return;
    for (size_t i = 0; i < n; i++) {
        size_t e = eps[i];
        vf_data_span ds;
        if (vf_dataset_episode_data(s->dataset, e, &ds) < 0 || ds.file >= s->num_data_files)
            continue;
        pthread_mutex_lock(&s->rows_lock);
        int st;
        for (;;) {
            if (s->rows[e] && !pinned[i]) { /* loaded: pinned too, so that no eviction drops it before the
                                             * caller's reference */
                s->rows[e]->refs++;
                pinned[i] = 1;
            }
            if (s->rows[e] || s->loading[e] || s->tdisk_checked[e] == 2) {
                st = -1;
                break;
            }
            st = s->tdisk_state[ds.file];
            if (st == 1) { /* another thread opens or builds it: wait (once per file), then look again */
                pthread_cond_wait(&s->rows_cond, &s->rows_lock);
                continue;
            }
            if (st != 0)
                break;
            s->tdisk_state[ds.file] = 1;
            pthread_mutex_unlock(&s->rows_lock);
            tdisk_prepare(s, ds.file);
            pthread_mutex_lock(&s->rows_lock);
        }
        if (st != 2) {
            pthread_mutex_unlock(&s->rows_lock);
            continue;
        }
        s->loading[e] = 1;
        pthread_mutex_unlock(&s->rows_lock);
        vf_sample_rows *r = tdisk_rows(s, e, &ds);
        pthread_mutex_lock(&s->rows_lock);
        s->loading[e] = 0;
        if (r && insert(s, e, r) == 0) {
            /* Pinned until the caller takes its own reference: another
             * thread's eviction must not drop it before that. */
            r->refs++;
            pinned[i] = 1;
            s->table_disk_episodes++;
            r = NULL;
        } else {
            s->tdisk_checked[e] = 2; /* not served from the disk cache: Parquet from now on */
        }
        pthread_cond_broadcast(&s->rows_cond);
        pthread_mutex_unlock(&s->rows_lock);
        rows_free(r, s->num_table);
    }
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
        vf_data_span ds0;
        if (s->tdisk_decided > 0 && vf_dataset_episode_data(s->dataset, e0, &ds0) == 0 &&
            ds0.file < s->num_data_files && s->tdisk_state[ds0.file] == 2 && s->tdisk_checked[e0] != 2)
            continue; /* its file is on the disk cache: the caller's next round reads it from there */
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
    uint8_t *pinned = NULL;
    if (map_mode) {
        if (!(pinned = vf_calloc(n ? n : 1, 1)))
            return VF_ENOMEM;
        tdisk_fill(s, eps, n, pinned);
        learn_row_groups(s, eps, n);
    }
    pthread_mutex_lock(&s->rows_lock);
    /* extras: read-ahead / row-group neighbours join the read; after a read
     * with extras fails, it is retried without them, so that a damaged
     * neighbour never fails (or names itself in) a read of good episodes. */
    int extras = 1;
    for (int round = 0;; round++) {
        size_t *want = NULL, nw = 0, asked = 0;
        if (round > 0 && map_mode && s->tdisk_decided > 0) {
            /* Episodes another thread had in flight and that were evicted
             * before this one took them come off the disk cache again. */
            pthread_mutex_unlock(&s->rows_lock);
            tdisk_fill(s, eps, n, pinned);
            pthread_mutex_lock(&s->rows_lock);
        }
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
        lru_unlink(s, out[i]);
        lru_push_newest(s, out[i]);
    }
    for (size_t i = 0; pinned && i < n; i++)
        if (pinned[i])
            s->rows[eps[i]]->refs--; /* loaded since: a pinned episode is never evicted */
    if (r == 0)
        evict(s);
    pthread_mutex_unlock(&s->rows_lock);
    free(pinned);
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
    s->rows_newest = s->rows_oldest = NULL;
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
