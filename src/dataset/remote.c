/*
 * remote.c: datasets whose root is a URL (http://, https://, s3://), and
 * the glue between datasets and the local file cache (prefetch-on-admit).
 *
 * The remote vf_ds_fs:
 *  - read_all: the whole object, fetched once: files under meta/ are kept
 *    in memory for the dataset's life and served as copies afterwards;
 *  - exists: HEAD, the answer (and the object's size) remembered, so the
 *    later open of the same file needs no second HEAD. Unlike a local
 *    fs, it can answer neither yes nor no: a negative code when the
 *    server could not say (an outage outlasting the retries, a refusal),
 *    which the file checks report as such, never as a missing file;
 *  - open_source: a vf_http source (range reads + read-ahead blocks); the
 *    last few sources are kept open (with their blocks) because the table
 *    reader opens the same data file once per read;
 *  - list_dir: S3 lists (ListObjectsV2); plain HTTP has no listing, so the
 *    only listing the format needs, meta/episodes/chunk-N/file-M.parquet
 *    (v3.0), is found by probing chunk-000/file-000, file-001, ... with
 *    HEAD until one is missing (LeRobot numbers files densely from 0 in
 *    every chunk, lerobot-format.md §1).
 * The fs is thread-safe (engine threads read tables concurrently): caches
 * are under one lock, network calls run outside it.
 *
 * Opening video files (vf_ds_opener_open): the decoder cache's open hook.
 * A local dataset opens its files directly (unchanged behaviour); a remote
 * one prefers the file cache's local copy when the file was prefetched and
 * otherwise reads through the dataset's fs.
 *
 * Prefetch-on-admit: vf_prefetch_on_admit takes one file-cache reference
 * per camera file of the episode (downloads start in the background) and
 * vf_prefetch_on_evict drops them; files shared by several episodes stay
 * until the last of them is evicted.
 */
#define _GNU_SOURCE
#include "dataset/dataset.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define META_MAX_BYTES ((size_t)1 << 30) /* one metadata file */
#define KEEP_SOURCES 8
#define MAX_PROBES 100000

typedef struct meta_file {
    struct meta_file *next;
    char *rel;
    uint8_t *data;
    size_t len;
} meta_file;

typedef struct known_size {
    struct known_size *next;
    char *rel;
    int exists;
    uint64_t size;
} known_size;

typedef struct kept_source {
    char *rel;
    vf_source *src;
    uint64_t stamp;
} kept_source;

typedef struct remote_fs {
    vf_http_client *client;
    char *root;            /* no trailing '/' */
    int s3;
    pthread_mutex_t lock;
    meta_file *meta;
    known_size *sizes;
    kept_source kept[KEEP_SOURCES];
    uint64_t clock;
} remote_fs;

static char *url_of(const remote_fs *fs, const char *rel) { return vf_asprintf("%s/%s", fs->root, rel); }

/* ---- caches (under the lock) ------------------------------------------------- */

static known_size *find_size(remote_fs *fs, const char *rel)
{
    for (known_size *k = fs->sizes; k; k = k->next)
        if (!strcmp(k->rel, rel))
            return k;
    return NULL;
}

static void remember_size(remote_fs *fs, const char *rel, int exists, uint64_t size)
{
    pthread_mutex_lock(&fs->lock);
    known_size *k = find_size(fs, rel);
    if (!k && (k = vf_calloc(1, sizeof *k)) != NULL) {
        if (!(k->rel = vf_strdup(rel))) {
            free(k);
            k = NULL;
        } else {
            k->next = fs->sizes;
            fs->sizes = k;
        }
    }
    if (k) {
        k->exists = exists;
        k->size = size;
    }
    pthread_mutex_unlock(&fs->lock);
}

/* ---- hooks --------------------------------------------------------------------- */

static int remote_read_all(void *ctx, const char *rel, uint8_t **data, size_t *len)
{
    remote_fs *fs = ctx;
    *data = NULL;
    *len = 0;
    pthread_mutex_lock(&fs->lock);
    for (meta_file *m = fs->meta; m; m = m->next) {
        if (strcmp(m->rel, rel) != 0)
            continue;
        uint8_t *copy = vf_malloc(m->len + 1);
        if (copy) {
            memcpy(copy, m->data, m->len + 1);
            *data = copy;
            *len = m->len;
        }
        pthread_mutex_unlock(&fs->lock);
        return copy ? 0 : VF_ENOMEM;
    }
    pthread_mutex_unlock(&fs->lock);
    char *url = url_of(fs, rel);
    if (!url)
        return VF_ENOMEM;
    int r = vf_http_get(fs->client, url, META_MAX_BYTES, data, len);
    free(url);
    if (r < 0 || strncmp(rel, "meta/", 5) != 0)
        return r;
    /* Keep a copy: metadata is fetched once per dataset. */
    meta_file *m = vf_calloc(1, sizeof *m);
    uint8_t *copy = m ? vf_malloc(*len + 1) : NULL;
    char *name = copy ? vf_strdup(rel) : NULL;
    if (!name) {
        free(copy);
        free(m);
        return 0; /* not cached, still a success */
    }
    memcpy(copy, *data, *len + 1);
    m->rel = name;
    m->data = copy;
    m->len = *len;
    pthread_mutex_lock(&fs->lock);
    m->next = fs->meta;
    fs->meta = m;
    pthread_mutex_unlock(&fs->lock);
    return 0;
}

/* The one reading of a HEAD that every existence check of a remote root
 * uses (the file checks, the listing probes): 1 if rel is there, 0 if the
 * server says it is not (404, 410: the HTTP layer's VF_ENOENT), else the
 * error, its message saying which of the two other cases it is:
 *  - "refused: <url>: HTTP 403 ..." (401, 403; *refused set): the server
 *    would not say; S3 answers 403 for a missing key too when the caller
 *    may not list the bucket;
 *  - "unreachable: <url>: HTTP 503 ... (gave up after N attempts in S s
 *    ...)": any other failure, no answer either way (5xx or 429 until the
 *    retries ran out, reset or refused connections, timeouts, a cancelled
 *    request, another 4xx).
 * Answers are remembered (the later open needs no second HEAD); a server
 * that could not say is asked again next time. */
static int remote_probe(remote_fs *fs, const char *rel, int *refused)
{
    *refused = 0;
    pthread_mutex_lock(&fs->lock);
    known_size *k = find_size(fs, rel);
    int known = k ? k->exists : -1;
    pthread_mutex_unlock(&fs->lock);
    if (known >= 0)
        return known;
    char *url = url_of(fs, rel);
    if (!url)
        return VF_ENOMEM;
    uint64_t size = 0;
    long status = 0;
    int r = vf_http_head_status(fs->client, url, &size, &status);
    free(url);
    if (r == 0 || r == VF_ENOENT) {
        remember_size(fs, rel, r == 0, size);
        return r == 0;
    }
    if (r == VF_ENOMEM)
        return r;
    *refused = status == 401 || status == 403;
    return vf_error_context(r, *refused ? "refused" : "unreachable");
}

static int remote_exists(void *ctx, const char *rel)
{
    int refused;
    return remote_probe(ctx, rel, &refused);
}

static int remote_open_source(void *ctx, const char *rel, vf_source **out)
{
    remote_fs *fs = ctx;
    *out = NULL;
    uint64_t size = UINT64_MAX;
    pthread_mutex_lock(&fs->lock);
    for (int i = 0; i < KEEP_SOURCES; i++)
        if (fs->kept[i].src && !strcmp(fs->kept[i].rel, rel)) {
            fs->kept[i].stamp = ++fs->clock;
            *out = vf_source_ref(fs->kept[i].src);
            pthread_mutex_unlock(&fs->lock);
            return 0;
        }
    known_size *k = find_size(fs, rel);
    if (k && k->exists == 1)
        size = k->size;
    int missing = k && k->exists == 0;
    pthread_mutex_unlock(&fs->lock);
    char *url = url_of(fs, rel);
    if (!url)
        return VF_ENOMEM;
    if (missing) {
        int r = vf_error(VF_ENOENT, "%s: not found (HEAD answered 404)", url);
        free(url);
        return r;
    }
    vf_source *src = NULL;
    int r = vf_http_open_source(fs->client, url, size, &src);
    free(url);
    if (r < 0)
        return r;
    if (size == UINT64_MAX)
        remember_size(fs, rel, 1, vf_source_size(src));
    char *name = vf_strdup(rel);
    pthread_mutex_lock(&fs->lock);
    kept_source *slot = &fs->kept[0];
    for (int i = 0; i < KEEP_SOURCES; i++) {
        if (!fs->kept[i].src) {
            slot = &fs->kept[i];
            break;
        }
        if (fs->kept[i].stamp < slot->stamp)
            slot = &fs->kept[i];
    }
    vf_source *old = NULL;
    char *old_name = NULL;
    if (name) {
        old = slot->src;
        old_name = slot->rel;
        slot->src = vf_source_ref(src);
        slot->rel = name;
        slot->stamp = ++fs->clock;
    }
    pthread_mutex_unlock(&fs->lock);
    vf_source_close(old);
    free(old_name);
    *out = src;
    return 0;
}

static int add_name(char ***names, size_t *count, const char *fmt, long long n)
{
    char **grown = vf_realloc(*names, (*count + 1) * sizeof *grown);
    if (!grown)
        return VF_ENOMEM;
    *names = grown;
    if (!(grown[*count] = vf_asprintf(fmt, n)))
        return VF_ENOMEM;
    (*count)++;
    return 0;
}

/* Probing for the next numbered file: 1 there, 0 the end of the list, or
 * the error. A server that could not answer (an outage outlasting the
 * retries: "HTTP 503 ... gave up after N attempts") fails the listing
 * with its own message rather than cut it short or call the directory
 * missing. A refusal (401/403) ends the list as before: servers in front
 * of private buckets answer 403 for a key that does not exist. */
static int probe_next(remote_fs *fs, const char *rel)
{
    int refused;
    int r = remote_probe(fs, rel, &refused);
    if (r < 0 && refused) {
        vf_log(VF_LOG_WARN, "%s (taken as the end of the listing)", vf_last_error());
        return 0;
    }
    return r;
}

/* HTTP: the v3.0 episodes-metadata layout, found by probing. */
static int probe_list(remote_fs *fs, const char *rel, char ***names, size_t *count)
{
    int r = 0;
    if (!strcmp(rel, "meta/episodes")) {
        for (long long chunk = 0; chunk < MAX_PROBES && r == 0; chunk++) {
            char probe[96];
            snprintf(probe, sizeof probe, "meta/episodes/chunk-%03lld/file-000.parquet", chunk);
            int there = probe_next(fs, probe);
            if (there <= 0) {
                r = there;
                break;
            }
            r = add_name(names, count, "chunk-%03lld", chunk);
        }
    } else if (!strncmp(rel, "meta/episodes/chunk-", 20) && !strchr(rel + 20, '/')) {
        for (long long file = 0; file < MAX_PROBES && r == 0; file++) {
            char *probe = vf_asprintf("%s/file-%03lld.parquet", rel, file);
            if (!probe) {
                r = VF_ENOMEM;
                break;
            }
            int there = probe_next(fs, probe);
            free(probe);
            if (there <= 0) {
                r = there;
                break;
            }
            r = add_name(names, count, "file-%03lld.parquet", file);
        }
    } else {
        return vf_error(VF_EUNSUPPORTED, "%s/%s: HTTP servers cannot list directories", fs->root, rel);
    }
    if (r == 0 && *count == 0)
        r = vf_error(VF_ENOENT, "%s/%s: nothing found (probed for chunk-000/file-000.parquet)", fs->root, rel);
    return r;
}

static int remote_list_dir(void *ctx, const char *rel, char ***names, size_t *count)
{
    remote_fs *fs = ctx;
    *names = NULL;
    *count = 0;
    int r;
    if (fs->s3) {
        char *url = url_of(fs, rel);
        if (!url)
            return VF_ENOMEM;
        r = vf_http_list(fs->client, url, names, count);
        free(url);
        return r;
    }
    r = probe_list(fs, rel, names, count);
    if (r < 0) {
        for (size_t i = 0; i < *count; i++)
            free((*names)[i]);
        free(*names);
        *names = NULL;
        *count = 0;
    }
    return r;
}

static void remote_destroy(void *ctx)
{
    remote_fs *fs = ctx;
    if (!fs)
        return;
    for (meta_file *m = fs->meta, *next; m; m = next) {
        next = m->next;
        free(m->rel);
        free(m->data);
        free(m);
    }
    for (known_size *k = fs->sizes, *next; k; k = next) {
        next = k->next;
        free(k->rel);
        free(k);
    }
    for (int i = 0; i < KEEP_SOURCES; i++) {
        vf_source_close(fs->kept[i].src);
        free(fs->kept[i].rel);
    }
    pthread_mutex_destroy(&fs->lock);
    vf_http_client_close(fs->client);
    free(fs->root);
    free(fs);
}

int vf_ds_fs_remote(vf_ds_fs *out, const char *root, const vf_http_settings *settings)
{
    memset(out, 0, sizeof *out);
    vf_url u;
    int r = vf_url_parse(root, &u);
    if (r < 0)
        return r;
    int s3 = !strcmp(u.scheme, "s3");
    vf_url_free(&u);
    remote_fs *fs = vf_calloc(1, sizeof *fs);
    if (!fs)
        return VF_ENOMEM;
    pthread_mutex_init(&fs->lock, NULL);
    fs->s3 = s3;
    size_t len = strlen(root);
    while (len && root[len - 1] == '/')
        len--;
    fs->root = vf_strndup(root, len);
    r = fs->root ? vf_http_client_open(&fs->client, settings) : VF_ENOMEM;
    if (r < 0) {
        remote_destroy(fs);
        return r;
    }
    out->ctx = fs;
    out->read_all = remote_read_all;
    out->open_source = remote_open_source;
    out->exists = remote_exists;
    out->list_dir = remote_list_dir;
    out->destroy = remote_destroy;
    out->thread_safe = 1; /* every hook takes fs->lock around shared state */
    return 0;
}

/* ---- opening a dataset's files by path --------------------------------------------- */

int vf_ds_open_path(const vf_dataset *d, const char *path, vf_source **out)
{
    *out = NULL;
    if (d->local_fs || !vf_is_url(d->root))
        return vf_source_open_file(out, path);
    size_t lr = strlen(d->root);
    while (lr > 1 && d->root[lr - 1] == '/')
        lr--;
    if (!strncmp(path, d->root, lr) && path[lr] == '/')
        return d->fs.open_source(d->fs.ctx, path + lr + 1, out);
    return vf_is_url(path) ? vf_source_open_url(out, path, NULL) : vf_source_open_file(out, path);
}

int vf_ds_opener_open(void *opener, const char *key, vf_source **out)
{
    const vf_ds_opener *o = opener;
    *out = NULL;
    if (o->file_cache && vf_is_url(key)) {
        int r = vf_file_cache_open_source(o->file_cache, key, out);
        if (r == 0)
            return 0;
        if (r != VF_ENOENT)
            return r;
    }
    return vf_ds_open_path(o->dataset, key, out);
}

/* ---- prefetch-on-admit -------------------------------------------------------------- */

int vf_prefetch_on_admit(vf_file_cache *cache, const vf_dataset *d, size_t pos)
{
    if (!cache)
        return 0;
    if (pos >= d->num_selected)
        return vf_error(VF_ERANGE, "%s: prefetch: episode position %zu out of range (%zu selected)", d->root, pos,
                        d->num_selected);
    const vf_ds_episode *e = &d->episodes[d->selected[pos]];
    for (size_t c = 0; c < d->num_cameras; c++) {
        int file = e->video[c].file;
        if (file < 0)
            continue;
        const char *url = d->cameras[c].files[file].path;
        if (!vf_is_url(url))
            continue; /* local files need no copy */
        const char *local;
        int r = vf_file_cache_acquire_nowait(cache, url, &local);
        if (r < 0 && r != VF_EAGAIN) {
            /* undo what this call took, so admit is all-or-nothing */
            for (size_t k = 0; k < c; k++) {
                int f = e->video[k].file;
                if (f >= 0 && vf_is_url(d->cameras[k].files[f].path))
                    vf_file_cache_release(cache, d->cameras[k].files[f].path);
            }
            return vf_error_context(r, "prefetch of episode %lld", (long long)e->pub.episode_index);
        }
    }
    return 0;
}

void vf_prefetch_on_evict(vf_file_cache *cache, const vf_dataset *d, size_t pos)
{
    if (!cache || pos >= d->num_selected)
        return;
    const vf_ds_episode *e = &d->episodes[d->selected[pos]];
    for (size_t c = 0; c < d->num_cameras; c++) {
        int file = e->video[c].file;
        if (file >= 0 && vf_is_url(d->cameras[c].files[file].path) &&
            vf_file_cache_release(cache, d->cameras[c].files[file].path) < 0)
            vf_log(VF_LOG_WARN, "%s", vf_last_error());
    }
}
