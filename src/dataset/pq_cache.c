/*
 * pq_cache.c: a bounded cache of a dataset's open data files (Parquet
 * footers decoded once), shared by the threads of one loader (dataset.h).
 *
 * Map mode reads a few rows of a random episode per miss; opening its data
 * file again for each read decoded the whole footer every time (a recorder
 * file with one row group per episode has thousands of row groups: most of
 * the CPU of a random read, growing with the files' sizes). An open
 * vf_pq_file is immutable and safe for concurrent reads, so one per data
 * file serves every thread.
 *
 * With a projection (the loader's table columns) only their footer entries
 * are decoded and kept, so a wide file costs what its used columns cost.
 *
 * Invariants: entries are bounded by count (a quarter of the descriptor
 * limit at most: each keeps its file open) and by estimated bytes
 * (vf_pq_memory_bytes: footer, chunk metadata, page indexes, kept
 * dictionaries); over the bytes, unused entries first lose their kept
 * dictionaries (trim), then whole entries are closed; an entry in
 * use (refs > 0) is never closed, so the bound can be exceeded while
 * readers hold entries; files are opened and closed outside the lock; two
 * threads missing the same file may both open it, the second copy is
 * closed. Lookups are by data file id through a table of slots.
 */
#include "dataset/dataset.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

typedef struct pq_entry {
    size_t file;               /* data file id */
    vf_pq_file *pq;
    size_t bytes;
    int refs;
    int trimmed;               /* its kept dictionaries were dropped since its last use */
    uint64_t last_use;
} pq_entry;

struct vf_ds_pq_cache {
    const vf_dataset *dataset;
    char **fields;             /* the projection (owned), or NULL: every column */
    int num_fields;
    pthread_mutex_t lock;
    size_t max_bytes, max_entries;
    pq_entry *entries;         /* [max_entries] */
    size_t num_entries, bytes;
    int32_t *slot;             /* [num_data_files]: entry index, -1 when not cached */
    size_t num_files;
    uint64_t clock;
    vf_ds_pq_cache_stats stats;
};

/* Each open file keeps a descriptor: the default bound on files is
 * VF_DS_PQ_CACHE_DEFAULT_ENTRIES, but at most a quarter of the process's
 * descriptor limit (at least 16). */
static size_t default_entries(void)
{
    size_t n = VF_DS_PQ_CACHE_DEFAULT_ENTRIES;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        n = VF_MIN(n, VF_MAX((size_t)rl.rlim_cur / 4, (size_t)16));
    return n;
}

int vf_ds_pq_cache_open(vf_ds_pq_cache **out, const vf_dataset *d, size_t max_bytes, size_t max_entries,
                        const char *const *fields, int num_fields)
{
    *out = NULL;
    if (!d->fs.thread_safe)
        return 0; /* the files cannot be shared between threads: reads open their own */
    vf_ds_pq_cache *c = vf_calloc(1, sizeof *c);
    if (!c)
        return VF_ENOMEM;
    c->dataset = d;
    /* The defaults can be changed from the environment (tests use tiny
     * bounds to exercise eviction): VF_TABLE_FILES_BYTES, VF_TABLE_FILES_MAX. */
    const char *env_bytes = getenv("VF_TABLE_FILES_BYTES"), *env_max = getenv("VF_TABLE_FILES_MAX");
    if (!max_bytes && env_bytes && atoll(env_bytes) > 0)
        max_bytes = (size_t)atoll(env_bytes);
    if (!max_entries && env_max && atoll(env_max) > 0)
        max_entries = (size_t)atoll(env_max);
    c->max_bytes = max_bytes ? max_bytes : VF_DS_PQ_CACHE_DEFAULT_BYTES;
    c->max_entries = max_entries ? VF_MIN(max_entries, (size_t)1 << 16) : default_entries();
    c->num_files = d->num_data_files;
    c->entries = vf_calloc(c->max_entries, sizeof *c->entries);
    c->slot = vf_malloc_array(c->num_files ? c->num_files : 1, sizeof *c->slot);
    if (!c->entries || !c->slot || pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c->entries);
        free(c->slot);
        free(c);
        return VF_ENOMEM;
    }
    for (size_t i = 0; i < c->num_files; i++)
        c->slot[i] = -1;
    if (fields) {
        /* The projection, with the columns every read verifies and
         * locates by. */
        static const char *const always[] = {"index", "episode_index"};
        if (!(c->fields = vf_calloc((size_t)num_fields + 2, sizeof *c->fields))) {
            vf_ds_pq_cache_close(c);
            return VF_ENOMEM;
        }
        for (int i = 0; i < num_fields + 2; i++) {
            if (!(c->fields[i] = vf_strdup(i < num_fields ? fields[i] : always[i - num_fields]))) {
                c->num_fields = i;
                vf_ds_pq_cache_close(c);
                return VF_ENOMEM;
            }
        }
        c->num_fields = num_fields + 2;
    }
    *out = c;
    return 0;
}

/* Opens data file `file` keeping the footer entries of the projection only. */
static int open_file(vf_ds_pq_cache *c, size_t file, vf_pq_file **out)
{
    const vf_dataset *d = c->dataset;
    if (!c->fields)
        return vf_ds_open_parquet(d, d->data_files[file].rel, out);
    vf_source *src;
    int r = d->fs.open_source(d->fs.ctx, d->data_files[file].rel, &src);
    if (r < 0)
        return r;
    r = vf_pq_open_projected(out, src, (const char *const *)c->fields, c->num_fields);
    vf_source_close(src);
    if (r == 0 && (d->fs.pq_max_entries || d->fs.pq_max_bytes))
        vf_pq_set_limits(*out, d->fs.pq_max_entries, d->fs.pq_max_bytes);
    return r;
}

void vf_ds_pq_cache_close(vf_ds_pq_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->num_entries; i++)
        vf_pq_close(c->entries[i].pq);
    for (int i = 0; i < c->num_fields; i++)
        free(c->fields[i]);
    free(c->fields);
    pthread_mutex_destroy(&c->lock);
    free(c->entries);
    free(c->slot);
    free(c);
}

/* Removes entry i (lock held), moving the last entry into its place;
 * returns the file to close outside the lock. */
static vf_pq_file *remove_entry(vf_ds_pq_cache *c, size_t i)
{
    pq_entry *e = &c->entries[i];
    vf_pq_file *pq = e->pq;
    c->slot[e->file] = -1;
    c->bytes -= e->bytes;
    c->stats.evictions++;
    c->num_entries--;
    if (i != c->num_entries) {
        *e = c->entries[c->num_entries];
        c->slot[e->file] = (int32_t)i;
    }
    return pq;
}

/* The least recently used unreferenced entry, or SIZE_MAX (lock held). */
static size_t victim(const vf_ds_pq_cache *c)
{
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < c->num_entries; i++)
        if (c->entries[i].refs == 0 && (best == SIZE_MAX || c->entries[i].last_use < c->entries[best].last_use))
            best = i;
    return best;
}

/* Over the byte bound, the kept dictionaries of unreferenced files go
 * first, least recently used first: they are most of a converter file's
 * bytes (up to 1 MiB per column chunk) and a read decodes one again from
 * a single page, while closing the file loses its footer and page indexes,
 * which cost a pass over the file's pages to rebuild. Lock held. */
static void trim(vf_ds_pq_cache *c)
{
    while (c->bytes > c->max_bytes) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < c->num_entries; i++) {
            const pq_entry *e = &c->entries[i];
            if (e->refs == 0 && !e->trimmed && (best == SIZE_MAX || e->last_use < c->entries[best].last_use))
                best = i;
        }
        if (best == SIZE_MAX)
            return;
        pq_entry *e = &c->entries[best];
        size_t freed = vf_pq_drop_kept_dictionaries(e->pq);
        e->trimmed = 1;
        freed = VF_MIN(freed, e->bytes);
        e->bytes -= freed;
        c->bytes -= freed;
        if (freed)
            c->stats.trims++;
    }
}

/* Evicts until within the bounds, with room for one more entry when
 * `room`; the files evicted go to *closing (up to cap). Lock held. */
static size_t evict(vf_ds_pq_cache *c, int room, vf_pq_file **closing, size_t cap)
{
    size_t n = 0;
    trim(c);
    while (n < cap && (c->bytes > c->max_bytes || c->num_entries + (room ? 1 : 0) > c->max_entries)) {
        size_t v = victim(c);
        if (v == SIZE_MAX)
            break;
        closing[n++] = remove_entry(c, v);
    }
    return n;
}

static void close_all(vf_pq_file **files, size_t n)
{
    for (size_t i = 0; i < n; i++)
        vf_pq_close(files[i]);
}

int vf_ds_pq_cache_get(vf_ds_pq_cache *c, size_t file, vf_pq_file **out)
{
    *out = NULL;
    if (file >= c->num_files)
        return vf_error(VF_ERANGE, "data file %zu out of range (%zu files)", file, c->num_files);
    pthread_mutex_lock(&c->lock);
    int32_t s = c->slot[file];
    if (s >= 0) {
        pq_entry *e = &c->entries[s];
        e->refs++;
        e->last_use = ++c->clock;
        e->trimmed = 0;
        c->stats.hits++;
        *out = e->pq;
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    c->stats.misses++;
    pthread_mutex_unlock(&c->lock);

    vf_pq_file *pq;
    int r = open_file(c, file, &pq);
    if (r < 0)
        return r;
    size_t bytes = vf_pq_memory_bytes(pq);
    vf_pq_file *closing[8];
    size_t nclose = 0;
    pthread_mutex_lock(&c->lock);
    s = c->slot[file];
    if (s >= 0) { /* another thread opened it meanwhile: use theirs */
        pq_entry *e = &c->entries[s];
        e->refs++;
        e->last_use = ++c->clock;
        *out = e->pq;
        pthread_mutex_unlock(&c->lock);
        vf_pq_close(pq);
        return 0;
    }
    nclose = evict(c, 1, closing, VF_ARRAY_LEN(closing));
    if (c->num_entries < c->max_entries) {
        pq_entry *e = &c->entries[c->num_entries];
        *e = (pq_entry){file, pq, bytes, 1, 0, ++c->clock};
        c->slot[file] = (int32_t)c->num_entries++;
        c->bytes += bytes;
    } else {
        /* Every entry is in use: serve this read uncached (closed on release). */
        c->stats.uncached++;
    }
    pthread_mutex_unlock(&c->lock);
    close_all(closing, nclose);
    *out = pq;
    return 0;
}

void vf_ds_pq_cache_release(vf_ds_pq_cache *c, vf_pq_file *pq)
{
    if (!pq)
        return;
    vf_pq_file *closing[8];
    size_t nclose = 0;
    pthread_mutex_lock(&c->lock);
    size_t i = 0;
    while (i < c->num_entries && c->entries[i].pq != pq)
        i++;
    if (i == c->num_entries) {
        pthread_mutex_unlock(&c->lock);
        vf_pq_close(pq); /* an uncached one */
        return;
    }
    pq_entry *e = &c->entries[i];
    e->refs--;
    /* Page indexes built by the read make the file bigger. */
    size_t now = vf_pq_memory_bytes(pq);
    c->bytes += now - e->bytes;
    e->bytes = now;
    nclose = evict(c, 0, closing, VF_ARRAY_LEN(closing));
    pthread_mutex_unlock(&c->lock);
    close_all(closing, nclose);
}

void vf_ds_pq_cache_get_stats(vf_ds_pq_cache *c, vf_ds_pq_cache_stats *out)
{
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    out->entries = c->num_entries;
    out->bytes = c->bytes;
    pthread_mutex_unlock(&c->lock);
}
