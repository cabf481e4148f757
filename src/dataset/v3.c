/*
 * v3.c: the LeRobot v3.0 backend: meta/episodes/chunk-N/file-M.parquet,
 * meta/tasks.parquet and meta/stats.json (lerobot-format.md §1, §3-§5).
 *
 * Invariants and choices:
 *  - Episodes files are found by listing meta/episodes/ and sorted by the
 *    NUMBERS in chunk-N/file-M (LeRobot's lexicographic glob breaks at
 *    chunk-1000); their rows are concatenated in that order.
 *  - Columns are found by name, and only the needed ones are read
 *    (projection): the stats/<feature>/<stat> columns are never decoded,
 *    and their footer entries are skipped without being materialised
 *    (vf_pq_open_projected), which is what keeps a 1M-episode file set
 *    with 10-row row groups cheap. Files are read in parallel on a local
 *    file system and appended in file order. Extra columns
 *    (pandas __index_level_0__, meta/episodes/chunk_index ...) are ignored.
 *  - Integer columns may be any Parquet integer width; timestamps FLOAT or
 *    DOUBLE. A null in a needed column is fatal (the row cannot be used).
 *  - tasks.parquet: the task string column is `task`, else
 *    `__index_level_0__`, else the single string column named in the pandas
 *    metadata's index_columns. Row position is the task_index (verified).
 */
#include "dataset/dataset.h"
#include "dataset/meta_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EPISODE_FILES 100000

/* ---- discovery ------------------------------------------------------------ */

/* Parses "<prefix><digits><suffix>" exactly; -1 if it does not match. */
static int64_t parse_numbered(const char *name, const char *prefix, const char *suffix)
{
    size_t lp = strlen(prefix), ls = strlen(suffix), ln = strlen(name);
    if (ln <= lp + ls || strncmp(name, prefix, lp) || strcmp(name + ln - ls, suffix))
        return -1;
    int64_t v = 0;
    for (size_t i = lp; i < ln - ls; i++) {
        if (name[i] < '0' || name[i] > '9' || i - lp >= 15)
            return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

typedef struct episodes_file {
    int64_t chunk, file;
    char *rel;
} episodes_file;

static int cmp_episodes_file(const void *a, const void *b)
{
    const episodes_file *x = a, *y = b;
    if (x->chunk != y->chunk)
        return x->chunk < y->chunk ? -1 : 1;
    return (x->file > y->file) - (x->file < y->file);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static int list_episodes_files(vf_dataset *d, episodes_file **out, size_t *out_count)
{
    *out = NULL;
    *out_count = 0;
    char **chunks;
    size_t nchunks;
    int r = d->fs.list_dir(d->fs.ctx, "meta/episodes", &chunks, &nchunks);
    if (r == VF_ENOENT)
        return vf_error(VF_ENOENT, "%s/meta/episodes: missing (required for v3.0 datasets)", d->root);
    if (r < 0)
        return r;
    episodes_file *files = NULL;
    size_t n = 0, cap = 0;
    for (size_t c = 0; c < nchunks && r == 0; c++) {
        int64_t chunk = parse_numbered(chunks[c], "chunk-", "");
        if (chunk < 0)
            continue;
        char *dir = vf_asprintf("meta/episodes/%s", chunks[c]);
        char **names = NULL;
        size_t nnames = 0;
        r = dir ? d->fs.list_dir(d->fs.ctx, dir, &names, &nnames) : VF_ENOMEM;
        if (r == VF_ENOENT) /* a file named chunk-N: not a directory */
            r = 0;
        for (size_t i = 0; i < nnames && r == 0; i++) {
            int64_t file = parse_numbered(names[i], "file-", ".parquet");
            if (file < 0)
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                if (cap > MAX_EPISODE_FILES) {
                    r = vf_error(VF_ECORRUPT, "%s/meta/episodes: more than %d files", d->root, MAX_EPISODE_FILES);
                    break;
                }
                episodes_file *grown = vf_realloc(files, cap * sizeof *grown);
                if (!grown) {
                    r = VF_ENOMEM;
                    break;
                }
                files = grown;
            }
            files[n].chunk = chunk;
            files[n].file = file;
            files[n].rel = vf_asprintf("%s/%s", dir, names[i]);
            if (!files[n].rel)
                r = VF_ENOMEM;
            else
                n++;
        }
        free_names(names, nnames);
        free(dir);
    }
    free_names(chunks, nchunks);
    if (r == 0 && n == 0)
        r = vf_error(VF_ENOENT, "%s/meta/episodes: no chunk-*/file-*.parquet files", d->root);
    if (r < 0) {
        for (size_t i = 0; i < n; i++)
            free(files[i].rel);
        free(files);
        return r;
    }
    qsort(files, n, sizeof *files, cmp_episodes_file);
    *out = files;
    *out_count = n;
    return 0;
}

/* ---- column conversion ------------------------------------------------- */

/* Reads a whole integer column as int64. Absent: VF_ENOENT (message set
 * only when required). */
static int convert_i64(vf_pq_array *array, const char *file, const char *name, int64_t **out, int64_t *len);

static int read_i64_column(vf_pq_file *f, const char *file, const char *name, int required, int64_t **out, int64_t *len)
{
    *out = NULL;
    int idx = vf_pq_field_index(f, name);
    if (idx < 0)
        return required ? vf_error(VF_ENOENT, "%s: missing column '%s'", file, name) : VF_ENOENT;
    vf_pq_array a;
    memset(&a, 0, sizeof a);
    int r = vf_pq_read_field_all(f, idx, &a);
    if (r < 0)
        return vf_error_context(r, "%s: column '%s'", file, name);
    return convert_i64(&a, file, name, out, len);
}

/* Element i of an integer array (any width) as int64; 0 for another type. */
static int int_at(const vf_pq_array *a, int64_t i, int64_t *out)
{
    switch (a->type) {
    case VF_PQ_T_INT8: *out = ((const int8_t *)a->values)[i]; return 1;
    case VF_PQ_T_INT16: *out = ((const int16_t *)a->values)[i]; return 1;
    case VF_PQ_T_INT32: *out = ((const int32_t *)a->values)[i]; return 1;
    case VF_PQ_T_INT64: *out = ((const int64_t *)a->values)[i]; return 1;
    case VF_PQ_T_UINT8: *out = ((const uint8_t *)a->values)[i]; return 1;
    case VF_PQ_T_UINT16: *out = ((const uint16_t *)a->values)[i]; return 1;
    case VF_PQ_T_UINT32: *out = ((const uint32_t *)a->values)[i]; return 1;
    case VF_PQ_T_UINT64: *out = (int64_t)((const uint64_t *)a->values)[i]; return 1;
    default: return 0;
    }
}

/* Element i of a FLOAT or DOUBLE array as double; 0 for another type. */
static int double_at(const vf_pq_array *a, int64_t i, double *out)
{
    if (a->type == VF_PQ_T_DOUBLE)
        *out = ((const double *)a->values)[i];
    else if (a->type == VF_PQ_T_FLOAT)
        *out = ((const float *)a->values)[i];
    else
        return 0;
    return 1;
}

/* A whole column as 8-byte values: int64 from any integer type, or (as_double)
 * double from FLOAT or DOUBLE. Takes the array (frees it, zeroes *array);
 * *out is newly allocated, NULL on failure. */
static int convert_column(vf_pq_array *array, const char *file, const char *name, int as_double, void **out,
                          int64_t *len)
{
    *out = NULL;
    vf_pq_array a = *array;
    memset(array, 0, sizeof *array);
    int r = 0;
    _Static_assert(sizeof(int64_t) == sizeof(double), "one buffer serves both");
    void *vals = vf_malloc_array(a.length ? (size_t)a.length : 1, sizeof(int64_t));
    if (!vals) {
        vf_pq_array_free(&a);
        return VF_ENOMEM;
    }
    for (int64_t i = 0; i < a.length && r == 0; i++) {
        if (a.valid && !a.valid[i])
            r = vf_error(VF_ECORRUPT, "%s: column '%s': null in row %lld", file, name, (long long)i);
        else if (as_double ? !double_at(&a, i, (double *)vals + i) : !int_at(&a, i, (int64_t *)vals + i))
            r = vf_error(VF_ECORRUPT, "%s: column '%s': expected %s, found %s", file, name,
                         as_double ? "floating point" : "integers", vf_pq_type_name(a.type));
    }
    *len = a.length;
    vf_pq_array_free(&a);
    if (r < 0) {
        free(vals);
        return r;
    }
    *out = vals;
    return 0;
}

/* An integer column read as int64 (any width); frees the array. */
static int convert_i64(vf_pq_array *array, const char *file, const char *name, int64_t **out, int64_t *len)
{
    void *vals;
    int r = convert_column(array, file, name, 0, &vals, len);
    *out = vals;
    return r;
}

/* A FLOAT or DOUBLE column as double; frees the array. */
static int convert_f64(vf_pq_array *array, const char *file, const char *name, double **out, int64_t *len)
{
    void *vals;
    int r = convert_column(array, file, name, 1, &vals, len);
    *out = vals;
    return r;
}

/* String view of element i of a STRING/BINARY array; 0 if null. */
static int string_at(const vf_pq_array *a, int64_t i, const char **s, size_t *n)
{
    if (i < 0 || i >= a->length || (a->valid && !a->valid[i]))
        return 0;
    int64_t lo = a->offsets[i], hi = a->offsets[i + 1];
    if (lo < 0 || hi < lo || hi > a->data_len)
        return 0;
    *s = (const char *)a->data + lo;
    *n = (size_t)(hi - lo);
    return 1;
}

/* ---- episodes ------------------------------------------------------------ */

/* The columns of one meta/episodes file, read without touching the
 * dataset (so several files can be read at once), from the metadata cache
 * (meta_cache.c) or the file itself, then appended to it in file order by
 * add_episodes(). */
enum { EP = VF_DS_EP_INDEX, LEN = VF_DS_EP_LENGTH, DCHUNK = VF_DS_EP_DATA_CHUNK, DFILE = VF_DS_EP_DATA_FILE,
       FROM = VF_DS_EP_FROM, TO = VF_DS_EP_TO, NFIXED = VF_DS_EP_NFIXED };
static const char *const fixed_columns[NFIXED] = {"episode_index", "length", "data/chunk_index", "data/file_index",
                                                  "dataset_from_index", "dataset_to_index"};

typedef struct episodes_cols {
    const vf_dataset *d;
    const char *rel;
    char *file;                /* absolute, for messages */
    vf_ds_episodes_columns cols;
    int cache_hit, cache_written;
    int r;
    char *error;               /* the message of a failure on a worker thread */
} episodes_cols;

static void free_episodes_cols(episodes_cols *c)
{
    vf_ds_episodes_columns_free(&c->cols);
    free(c->file);
    free(c->error);
    const vf_dataset *d = c->d;
    const char *rel = c->rel;
    memset(c, 0, sizeof *c);
    c->d = d;
    c->rel = rel;
}

/* The columns the model needs; everything else (the stats columns, often
 * most of the file) is skipped while the footer is decoded. */
static char **needed_columns(const vf_dataset *d, int *count)
{
    size_t n = NFIXED + 1 + 4 * d->num_cameras;
    char **names = vf_calloc(n, sizeof *names);
    if (!names)
        return NULL;
    size_t k = 0;
    int ok = 1;
    for (int i = 0; i < NFIXED; i++)
        ok &= (names[k++] = vf_strdup(fixed_columns[i])) != NULL;
    ok &= (names[k++] = vf_strdup("tasks")) != NULL;
    static const char *const vcols[4] = {"chunk_index", "file_index", "from_timestamp", "to_timestamp"};
    for (size_t c = 0; c < d->num_cameras; c++)
        for (int i = 0; i < 4; i++)
            ok &= (names[k++] = vf_asprintf("videos/%s/%s", d->cameras[c].pub.key, vcols[i])) != NULL;
    if (!ok) {
        for (size_t i = 0; i < n; i++)
            free(names[i]);
        free(names);
        return NULL;
    }
    *count = (int)n;
    return names;
}

static int read_episodes_cols(episodes_cols *ec, char *const *needed, int num_needed)
{
    const vf_dataset *d = ec->d;
    const char *file = ec->file;
    vf_ds_episodes_columns *c = &ec->cols;
    c->num_cameras = d->num_cameras;
    vf_source *src;
    int r = d->fs.open_source(d->fs.ctx, ec->rel, &src);
    if (r < 0)
        return r;
    vf_pq_file *f;
    r = vf_pq_open_projected(&f, src, (const char *const *)needed, num_needed);
    vf_source_close(src);
    if (r < 0)
        return r;
    if (d->fs.pq_max_entries || d->fs.pq_max_bytes)
        vf_pq_set_limits(f, d->fs.pq_max_entries, d->fs.pq_max_bytes);
    int64_t rows = c->rows = vf_pq_num_rows(f);
    size_t nc = d->num_cameras;
    c->vchunk = vf_calloc(nc ? nc : 1, sizeof *c->vchunk);
    c->vfile = vf_calloc(nc ? nc : 1, sizeof *c->vfile);
    c->vfrom = vf_calloc(nc ? nc : 1, sizeof *c->vfrom);
    c->vto = vf_calloc(nc ? nc : 1, sizeof *c->vto);
    /* All needed columns in one pass over the row groups: needed[0..5]
     * fixed, [6] tasks (optional), then 4 per camera. */
    int *fields = vf_calloc((size_t)num_needed, sizeof *fields);
    vf_pq_array *arrays = vf_calloc((size_t)num_needed, sizeof *arrays);
    if (!c->vchunk || !c->vfile || !c->vfrom || !c->vto || !fields || !arrays)
        r = VF_ENOMEM;
    int nf = 0, tasks_at = -1;
    for (int k = 0; k < num_needed && r == 0; k++) {
        int idx = vf_pq_field_index(f, needed[k]);
        if (idx < 0 && k == NFIXED)
            continue; /* no tasks column: episodes without tasks */
        if (idx < 0) {
            r = vf_error(VF_ENOENT, "%s: missing column '%s'", file, needed[k]);
            break;
        }
        if (k == NFIXED)
            tasks_at = nf;
        fields[nf++] = idx;
    }
    if (r == 0 && (r = vf_pq_read_fields_all(f, fields, nf, arrays)) < 0)
        r = vf_error_context(r, "%s", file);
    for (int k = 0, at = 0; k < num_needed && r == 0; k++) {
        if (k == NFIXED) {
            if (tasks_at >= 0)
                at++;
            continue;
        }
        int64_t len = 0;
        int cam = k > NFIXED ? (k - NFIXED - 1) / 4 : -1, what = k > NFIXED ? (k - NFIXED - 1) % 4 : -1;
        if (k < NFIXED)
            r = convert_i64(&arrays[at], file, needed[k], &c->fixed[k], &len);
        else if (what == 0)
            r = convert_i64(&arrays[at], file, needed[k], &c->vchunk[cam], &len);
        else if (what == 1)
            r = convert_i64(&arrays[at], file, needed[k], &c->vfile[cam], &len);
        else
            r = convert_f64(&arrays[at], file, needed[k], what == 2 ? &c->vfrom[cam] : &c->vto[cam], &len);
        at++;
        if (r == 0 && len != rows)
            r = vf_error(VF_ECORRUPT, "%s: column '%s' has %lld rows, the file %lld", file, needed[k],
                         (long long)len, (long long)rows);
    }
    if (r == 0 && tasks_at >= 0) {
        c->tasks = arrays[tasks_at];
        memset(&arrays[tasks_at], 0, sizeof arrays[tasks_at]);
        const vf_pq_array *a = &c->tasks;
        if (a->type != VF_PQ_T_LIST || a->num_children != 1 ||
            (a->children[0].type != VF_PQ_T_STRING && a->children[0].type != VF_PQ_T_BINARY) || a->length != rows)
            r = vf_error(VF_ECORRUPT, "%s: column 'tasks': expected %lld lists of strings", file, (long long)rows);
    }
    for (int k = 0; arrays && k < num_needed; k++)
        vf_pq_array_free(&arrays[k]);
    free(arrays);
    free(fields);
    vf_pq_close(f);
    return r;
}

typedef struct episodes_job {
    episodes_cols *cols;
    char *const *needed;
    int num_needed;
    vf_ds_meta_cache *cache; /* NULL: no metadata cache */
    /* completion, for the reader that appends files in order */
    pthread_mutex_t *lock;
    pthread_cond_t *cond;
    int done;
} episodes_job;

static void episodes_job_run(void *arg)
{
    episodes_job *j = arg;
    episodes_cols *c = j->cols;
    c->file = vf_path_join(c->d->root, c->rel);
    vf_ds_meta_key key;
    memset(&key, 0, sizeof key);
    if (!c->file)
        c->r = VF_ENOMEM;
    else if (j->cache && vf_ds_meta_cache_load(j->cache, c->file, c->d->num_cameras, &key, &c->cols))
        c->cache_hit = 1;
    else if ((c->r = read_episodes_cols(c, j->needed, j->num_needed)) == 0 && j->cache)
        c->cache_written = vf_ds_meta_cache_store(j->cache, &key, &c->cols);
    vf_ds_meta_key_free(&key);
    if (c->r < 0)
        c->error = vf_strdup(vf_last_error());
    if (j->lock) {
        pthread_mutex_lock(j->lock);
        j->done = 1;
        pthread_cond_broadcast(j->cond);
        pthread_mutex_unlock(j->lock);
    } else {
        j->done = 1;
    }
}

static inline int fits_i32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

/* The model keeps chunk and file indices in 32 bits. */
static int index_too_large(const char *file, int64_t row, const vf_ds_episode *e, const char *prefix, int64_t chunk,
                           int64_t fidx)
{
    int chunk_bad = !fits_i32(chunk);
    return vf_error(VF_ECORRUPT, "%s: row %lld (episode %lld): column '%s/%s' is %lld, outside the supported range "
                    "(32-bit signed)", file, (long long)row, (long long)e->pub.episode_index, prefix,
                    chunk_bad ? "chunk_index" : "file_index", (long long)(chunk_bad ? chunk : fidx));
}

/* Appends the episodes of one file to the model; `prev` carries the last
 * episode's task list so that runs of identical lists share one copy. */
static int add_episodes(vf_dataset *d, const episodes_cols *ec, size_t file_id)
{
    const char *file = ec->file;
    const vf_ds_episodes_columns *c = &ec->cols;
    size_t nc = d->num_cameras;
    const vf_pq_array *a = c->tasks.type == VF_PQ_T_LIST ? &c->tasks : NULL;
    const vf_pq_array *items = a ? &a->children[0] : NULL;
    int r = 0;
    for (int64_t i = 0; i < c->rows && r == 0; i++) {
        vf_ds_episode *e = vf_ds_add_episode(d);
        if (!e)
            return VF_ENOMEM;
        e->pub.episode_index = c->fixed[EP][i];
        e->pub.length = c->fixed[LEN][i];
        e->pub.from_index = c->fixed[FROM][i];
        e->pub.to_index = c->fixed[TO][i];
        if (!fits_i32(c->fixed[DCHUNK][i]) || !fits_i32(c->fixed[DFILE][i]))
            return index_too_large(file, i, e, "data", c->fixed[DCHUNK][i], c->fixed[DFILE][i]);
        e->data_chunk = (int32_t)c->fixed[DCHUNK][i];
        e->data_file = (int32_t)c->fixed[DFILE][i];
        e->meta_file = (int)file_id;
        for (size_t k = 0; k < nc; k++) {
            if (!fits_i32(c->vchunk[k][i]) || !fits_i32(c->vfile[k][i])) {
                char *what = vf_asprintf("videos/%s", d->cameras[k].pub.key);
                r = index_too_large(file, i, e, what ? what : "videos", c->vchunk[k][i], c->vfile[k][i]);
                free(what);
                return r;
            }
            e->video[k].chunk_index = (int32_t)c->vchunk[k][i];
            e->video[k].file_index = (int32_t)c->vfile[k][i];
            e->video[k].from_timestamp = c->vfrom[k][i];
            e->video[k].to_timestamp = c->vto[k][i];
        }
        if (!a || (a->valid && !a->valid[i]))
            continue;
        int64_t lo = a->offsets[i], hi = a->offsets[i + 1];
        if (lo < 0 || hi < lo || hi > items->length)
            return vf_error(VF_ECORRUPT, "%s: column 'tasks': bad list offsets in row %lld", file, (long long)i);
        /* The same list as the episode before (the usual case): share it. */
        const vf_ds_episode *p = d->num_all_episodes > 1 ? &d->episodes[d->num_all_episodes - 2] : NULL;
        size_t n = 0;
        int same = p != NULL;
        for (int64_t k = lo; k < hi && same; k++) {
            const char *s;
            size_t len;
            if (!string_at(items, k, &s, &len))
                continue;
            same = n < p->pub.num_tasks && strlen(p->pub.tasks[n]) == len && !memcmp(p->pub.tasks[n], s, len);
            n++;
        }
        if (same && n == p->pub.num_tasks) {
            e->pub.tasks = p->pub.tasks;
            e->pub.num_tasks = p->pub.num_tasks;
            continue;
        }
        const char **tasks = vf_ds_alloc(d, (size_t)(hi - lo), sizeof *tasks);
        if (!tasks)
            return VF_ENOMEM;
        n = 0;
        for (int64_t k = lo; k < hi; k++) {
            const char *s;
            size_t len;
            if (!string_at(items, k, &s, &len))
                continue;
            if (!(tasks[n++] = vf_ds_strndup(d, s, len)))
                return VF_ENOMEM;
        }
        e->pub.tasks = tasks;
        e->pub.num_tasks = n;
    }
    return r;
}

/* Reads the episodes files, several at once on a local (thread-safe) file
 * system, and appends them to the model in file order. A sliding window:
 * as soon as the oldest file in flight is read, it is appended and freed
 * and the next file is submitted, so the threads keep reading while this
 * one appends (a window with a barrier left them idle during every append
 * at 1M episodes), and at most a window's columns are held besides the
 * model. */
static int load_episodes(vf_dataset *d, const episodes_file *files, size_t n)
{
    int num_needed = 0;
    char **needed = needed_columns(d, &num_needed);
    if (!needed)
        return VF_ENOMEM;
    d->meta_files = vf_ds_alloc(d, n, sizeof *d->meta_files);
    int r = d->meta_files ? 0 : VF_ENOMEM;
    for (size_t i = 0; i < n && r == 0; i++)
        if (!(d->meta_files[i] = vf_ds_strdup(d, files[i].rel)))
            r = VF_ENOMEM;
    d->num_meta_files = n;
    int threads = d->fs.thread_safe && n > 1 ? (int)VF_MIN((size_t)vf_cpu_count(), n) : 1;
    if (threads > 8)
        threads = 8;
    vf_thread_pool *pool = NULL;
    if (r == 0 && threads > 1 && vf_thread_pool_create(&pool, threads) < 0)
        pool = NULL; /* read serially */
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    size_t window = pool ? (size_t)threads * 2 : 1;
    /* The metadata cache: local roots only (a remote file's stat data is
     * not available to validate an entry). */
    vf_ds_meta_cache *cache = NULL;
    if (r == 0 && d->meta_cache.enabled && d->local_fs)
        r = vf_ds_meta_cache_open(&cache, needed, num_needed);
    d->meta_cache.enabled = cache != NULL;
    if (r == 0 && cache && !(d->meta_cache.dir = vf_ds_strdup(d, vf_ds_meta_cache_dir(cache))))
        r = VF_ENOMEM;
    episodes_cols *cols = vf_calloc(window, sizeof *cols);
    episodes_job *jobs = vf_calloc(window, sizeof *jobs);
    if (r == 0 && (!cols || !jobs))
        r = VF_ENOMEM;
    size_t submitted = 0;
    for (size_t i = 0; i < n && r == 0; i++) {
        /* keep the window full: files i .. i + window - 1 in flight */
        while (r == 0 && submitted < n && submitted < i + window) {
            size_t k = submitted % window;
            cols[k].d = d;
            cols[k].rel = files[submitted].rel;
            jobs[k] = (episodes_job){.cols = &cols[k], .needed = needed, .num_needed = num_needed, .cache = cache,
                                     .lock = pool ? &lock : NULL, .cond = pool ? &cond : NULL};
            if (!pool || vf_thread_pool_submit(pool, episodes_job_run, &jobs[k]) < 0) {
                jobs[k].lock = NULL;
                episodes_job_run(&jobs[k]);
            }
            submitted++;
        }
        size_t k = i % window;
        pthread_mutex_lock(&lock);
        while (!jobs[k].done)
            pthread_cond_wait(&cond, &lock);
        pthread_mutex_unlock(&lock);
        /* Room for the file's episodes, from the rows actually read
         * (info.json's total_episodes is not trusted for allocation). */
        if (cols[k].r < 0)
            r = cols[k].r == VF_ENOMEM ? VF_ENOMEM : vf_error(cols[k].r, "%s", cols[k].error ? cols[k].error : "?");
        if (r == 0)
            r = vf_ds_reserve_episodes(d, d->num_all_episodes + (size_t)cols[k].cols.rows);
        if (r == 0)
            r = add_episodes(d, &cols[k], i);
        if (cache) {
            d->meta_cache.hits += cols[k].cache_hit;
            d->meta_cache.misses += !cols[k].cache_hit;
            d->meta_cache.written += cols[k].cache_written;
        }
        free_episodes_cols(&cols[k]);
    }
    /* On an error, the files still in flight finish before their columns go. */
    if (pool)
        vf_thread_pool_destroy(pool);
    for (size_t k = 0; cols && k < window; k++)
        if (cols[k].d) /* a slot that was used */
            free_episodes_cols(&cols[k]);
    pthread_mutex_destroy(&lock);
    pthread_cond_destroy(&cond);
    if (cache && d->meta_cache.written)
        vf_ds_meta_cache_prune(cache); /* an open that wrote entries also drops the useless ones */
    vf_ds_meta_cache_close(cache);
    free(cols);
    free(jobs);
    for (int i = 0; i < num_needed; i++)
        free(needed[i]);
    free(needed);
    return r;
}

/* ---- tasks ----------------------------------------------------------------- */

/* The pandas metadata's single index column name, if it is a string. */
static char *pandas_index_column(const vf_pq_file *f)
{
    const char *meta = vf_pq_kv(f, "pandas");
    if (!meta)
        return NULL;
    json_error_t err;
    json_t *root = json_loads(meta, 0, &err);
    char *name = NULL;
    json_t *cols = vf_json_member(root, "index_columns");
    if (json_is_array(cols) && json_array_size(cols) == 1 && json_is_string(json_array_get(cols, 0)))
        name = vf_strdup(json_string_value(json_array_get(cols, 0)));
    json_decref(root);
    return name;
}

static int load_tasks(vf_dataset *d)
{
    const char *rel = "meta/tasks.parquet";
    const char *file = vf_ds_abs(d, rel);
    if (!file)
        return VF_ENOMEM;
    vf_pq_file *f;
    int r = vf_ds_open_parquet(d, rel, &f);
    if (r == VF_ENOENT && d->total_tasks == 0)
        return 0; /* LeRobot does not load tasks when there are none */
    if (r < 0)
        return r;
    int idx = vf_pq_field_index(f, "task");
    const char *used = "task";
    if (idx < 0) {
        idx = vf_pq_field_index(f, "__index_level_0__");
        used = "__index_level_0__";
    }
    char *pandas_name = NULL;
    if (idx < 0 && (pandas_name = pandas_index_column(f)) != NULL) {
        idx = vf_pq_field_index(f, pandas_name);
        used = pandas_name;
    }
    if (idx < 0) {
        r = vf_error(VF_ECORRUPT, "%s: no task string column ('task', '__index_level_0__' or the pandas index column)",
                     file);
        goto done;
    }
    vf_pq_array a;
    memset(&a, 0, sizeof a);
    if ((r = vf_pq_read_field_all(f, idx, &a)) < 0) {
        r = vf_error_context(r, "%s: column '%s'", file, used);
        goto done;
    }
    if (a.type != VF_PQ_T_STRING && a.type != VF_PQ_T_BINARY) {
        r = vf_error(VF_ECORRUPT, "%s: column '%s': expected strings, found %s", file, used, vf_pq_type_name(a.type));
        vf_pq_array_free(&a);
        goto done;
    }
    d->tasks = vf_ds_alloc(d, (size_t)a.length, sizeof *d->tasks);
    if (!d->tasks)
        r = VF_ENOMEM;
    for (int64_t i = 0; i < a.length && r == 0; i++) {
        const char *s;
        size_t n;
        if (!string_at(&a, i, &s, &n)) {
            r = vf_error(VF_ECORRUPT, "%s: column '%s': null task in row %lld", file, used, (long long)i);
            break;
        }
        if (!(d->tasks[i] = vf_ds_strndup(d, s, n)))
            r = VF_ENOMEM;
    }
    if (r == 0)
        d->num_tasks = (size_t)a.length;
    vf_pq_array_free(&a);
    if (r < 0)
        goto done;
    /* Row position is the task_index LeRobot uses; verify the column. */
    int64_t *ti = NULL, len = 0;
    r = read_i64_column(f, file, "task_index", 0, &ti, &len);
    if (r == VF_ENOENT) {
        r = vf_ds_problem(d, VF_SEVERITY_WARNING, rel, -1, "task_index", "no task_index column; row position used");
    } else if (r == 0) {
        for (int64_t i = 0; i < len && r == 0; i++)
            if (ti[i] != i) {
                r = vf_ds_problem(d, VF_SEVERITY_ERROR, rel, -1, "task_index",
                                  "row %lld holds task_index %lld; LeRobot maps task_index to row position",
                                  (long long)i, (long long)ti[i]);
                break;
            }
        free(ti);
    }
done:
    free(pandas_name);
    vf_pq_close(f);
    return r;
}

/* ---- stats ----------------------------------------------------------------- */

static int load_stats(vf_dataset *d)
{
    const char *rel = "meta/stats.json";
    uint8_t *text;
    size_t len;
    int r = d->fs.read_all(d->fs.ctx, rel, &text, &len);
    if (r == VF_ENOENT)
        return 0; /* allowed: LeRobot's load_stats returns None */
    if (r < 0)
        return r == VF_ENOMEM ? r : vf_ds_problem(d, VF_SEVERITY_ERROR, rel, -1, "", "%s", vf_last_error());
    r = vf_ds_load_stats_json(d, rel, (const char *)text, len);
    free(text);
    return r;
}

/* Episodes files must list the episodes in ascending order, and each
 * file must start after the previous one ends: otherwise a row position
 * no longer identifies an episode (LeRobot indexes by it). Recorded as
 * errors naming the episodes file and the episode (and the other file for
 * an overlap), like every metadata inconsistency: the dataset still opens
 * and `vlafeed info` lists them all. Global index ranges that overlap are
 * reported by validation (not contiguous). */
static int check_episodes_order(vf_dataset *d)
{
    int r = 0;
    for (size_t i = 1; i < d->num_all_episodes && r == 0; i++) {
        const vf_ds_episode *e = &d->episodes[i], *prev = &d->episodes[i - 1];
        if (e->pub.episode_index > prev->pub.episode_index)
            continue;
        const char *file = d->meta_files[e->meta_file], *pfile = d->meta_files[prev->meta_file];
        if (e->pub.episode_index == prev->pub.episode_index)
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, file, e->pub.episode_index, "episode_index",
                              "episode %lld is listed twice%s%s (the metadata lists %zu episodes)",
                              (long long)e->pub.episode_index, prev->meta_file == e->meta_file ? "" : ", also in ",
                              prev->meta_file == e->meta_file ? "" : pfile, d->num_all_episodes);
        else if (prev->meta_file == e->meta_file)
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, file, e->pub.episode_index, "episode_index",
                              "episode %lld comes after episode %lld in the same file: rows out of order (an "
                              "episodes file must list its episodes in ascending order)",
                              (long long)e->pub.episode_index, (long long)prev->pub.episode_index);
        else
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, file, e->pub.episode_index, "episode_index",
                              "episode %lld overlaps the episodes of %s (which ends with episode %lld): episodes "
                              "files must not overlap",
                              (long long)e->pub.episode_index, pfile, (long long)prev->pub.episode_index);
    }
    return r;
}

int vf_ds_load_v3(vf_dataset *d)
{
    episodes_file *files;
    size_t n;
    int r = list_episodes_files(d, &files, &n);
    if (r < 0)
        return r;
    r = load_episodes(d, files, n);
    if (r == 0)
        r = check_episodes_order(d);
    for (size_t i = 0; i < n; i++)
        free(files[i].rel);
    free(files);
    if (r == 0 && d->num_all_episodes == 0)
        r = vf_error(VF_ECORRUPT, "%s/meta/episodes: no episodes", d->root);
    if (r == 0)
        r = load_tasks(d);
    if (r == 0)
        r = load_stats(d);
    return r;
}
