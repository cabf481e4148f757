/*
 * filecache.c: the local file cache behind prefetch-on-admit: whole remote
 * files downloaded by worker threads into a private directory, shared by
 * reference count, evicted (deleted) least-recently-used once unreferenced
 * and space is needed.
 *
 * Entry life cycle (all transitions under the cache lock):
 *   SIZING      a worker asks the fetcher for the object's size
 *   PENDING     size known, waiting for space (no worker held)
 *   DOWNLOADING space reserved (bytes += size), a worker fetches to <path>.part
 *   READY       <path> complete; evictable when refs == 0
 *   FAILED      error kept for waiters; removed once unreferenced; a later
 *               acquire starts over
 * Space: `bytes` counts DOWNLOADING + READY entries at their full size and
 * never exceeds max_bytes: schedule() moves PENDING entries (FIFO) to
 * DOWNLOADING only after evicting unreferenced READY entries makes room.
 * Every release, failure and finished download runs schedule() again.
 *
 * An entry is never freed while a worker job points at it (job_running).
 * Waiters sleep on one condition variable, broadcast on every change.
 *
 * Cancellation: the workers' requests watch the cache's token (io.h);
 * vf_file_cache_cancel, and close before it waits for the workers,
 * request it, so a download riding out an outage fails at once (FAILED,
 * "cancelled") instead of holding close for the whole retry budget.
 */
#define _GNU_SOURCE
#include "io/io.h"
#include "io/http_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum entry_state { SIZING, PENDING, DOWNLOADING, READY, FAILED } entry_state;

typedef struct entry {
    struct entry *next;
    vf_file_cache *cache;
    char *url;
    char *path;           /* final local path */
    char *part;           /* download target, renamed to path when complete */
    entry_state state;
    int refs;
    int job_running;
    uint64_t size;        /* known from PENDING on */
    uint64_t lru;         /* last use (READY) */
    uint64_t seq;         /* FIFO order among PENDING */
    int code;             /* FAILED */
    char *error;
} entry;

struct vf_file_cache {
    char *dir;            /* private directory */
    uint64_t max_bytes;
    vf_file_cache_fetcher fetcher;
    vf_http_client *http; /* default fetcher */
    vf_thread_pool *pool;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    entry *entries;
    uint64_t clock, seq, names;
    int closing;
    vf_io_cancel cancel;  /* watched by the workers' requests */
    vf_file_cache_stats stats;
};

/* ---- default fetcher: HTTP/S3 --------------------------------------------- */

static int http_size(void *ctx, const char *url, uint64_t *size) { return vf_http_head(ctx, url, size); }

static int http_fetch(void *ctx, const char *url, const char *dest, uint64_t size)
{
    return vf_http_download(ctx, url, dest, size, NULL);
}

/* ---- entries ---------------------------------------------------------------- */

static entry *find(vf_file_cache *c, const char *url)
{
    for (entry *e = c->entries; e; e = e->next)
        if (!strcmp(e->url, url))
            return e;
    return NULL;
}

static void entry_free(entry *e)
{
    free(e->url);
    free(e->path);
    free(e->part);
    free(e->error);
    free(e);
}

static void remove_entry(vf_file_cache *c, entry *e)
{
    for (entry **p = &c->entries; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    c->stats.entries--;
    entry_free(e);
}

/* "<dir>/<n>-<basename>" with the basename reduced to [A-Za-z0-9._-]. */
static char *local_name(vf_file_cache *c, const char *url, const char *suffix)
{
    const char *base = strrchr(url, '/');
    base = base ? base + 1 : url;
    char clean[65];
    size_t n = 0;
    for (const char *p = base; *p && *p != '?' && n < sizeof clean - 1; p++) {
        char ch = *p;
        int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                 ch == '_' || ch == '-';
        clean[n++] = ok ? ch : '_';
    }
    clean[n] = '\0';
    return vf_asprintf("%s/%llu-%s%s", c->dir, (unsigned long long)c->names, n ? clean : "object", suffix);
}

static void fail_entry(vf_file_cache *c, entry *e, int code, const char *message)
{
    if (e->state == DOWNLOADING)
        c->stats.bytes -= e->size;
    e->state = FAILED;
    e->code = code < 0 ? code : VF_EIO;
    free(e->error);
    e->error = vf_strdup(message);
    c->stats.failures++;
}

static void size_job(void *arg);
static void fetch_job(void *arg);

/* Starts (or restarts) an entry: SIZING with a size job. Under the lock. */
static int start_entry(vf_file_cache *c, entry *e)
{
    e->state = SIZING;
    e->job_running = 1;
    c->stats.misses++;
    int r = vf_thread_pool_submit(c->pool, size_job, e);
    if (r < 0) {
        e->job_running = 0;
        fail_entry(c, e, r, "cannot queue the download (out of memory)");
    }
    return r;
}

static entry *create_entry(vf_file_cache *c, const char *url)
{
    entry *e = vf_calloc(1, sizeof *e);
    if (!e)
        return NULL;
    c->names++;
    e->cache = c;
    e->url = vf_strdup(url);
    e->path = local_name(c, url, "");
    e->part = local_name(c, url, ".part");
    if (!e->url || !e->path || !e->part) {
        entry_free(e);
        return NULL;
    }
    e->next = c->entries;
    c->entries = e;
    c->stats.entries++;
    return e;
}

/* Evicts the least recently used unreferenced READY entry; 0 if none. */
static int evict_one(vf_file_cache *c)
{
    entry *victim = NULL;
    for (entry *e = c->entries; e; e = e->next)
        if (e->state == READY && e->refs == 0 && (!victim || e->lru < victim->lru))
            victim = e;
    if (!victim)
        return 0;
    if (unlink(victim->path) < 0)
        vf_log(VF_LOG_WARN, "file cache: cannot delete %s: %s", victim->path, strerror(errno));
    c->stats.bytes -= victim->size;
    c->stats.evictions++;
    remove_entry(c, victim);
    return 1;
}

/* Moves PENDING entries, oldest first, to DOWNLOADING while space can be
 * made for them. Under the lock. */
static void schedule(vf_file_cache *c)
{
    uint64_t waiting = 0;
    for (;;) {
        if (c->closing)
            return;
        entry *next = NULL;
        waiting = 0;
        for (entry *e = c->entries; e; e = e->next)
            if (e->state == PENDING) {
                waiting++;
                if (!next || e->seq < next->seq)
                    next = e;
            }
        c->stats.waiting_for_space = waiting;
        if (!next)
            return;
        while (c->stats.bytes + next->size > c->max_bytes && evict_one(c))
            ;
        if (c->stats.bytes + next->size > c->max_bytes)
            return; /* strictly FIFO: later entries wait behind it */
        c->stats.bytes += next->size;
        if (c->stats.bytes > c->stats.peak_bytes)
            c->stats.peak_bytes = c->stats.bytes;
        next->state = DOWNLOADING;
        next->job_running = 1;
        int r = vf_thread_pool_submit(c->pool, fetch_job, next);
        if (r < 0) {
            next->job_running = 0;
            fail_entry(c, next, r, "cannot queue the download (out of memory)");
        }
        pthread_cond_broadcast(&c->changed);
    }
}

/* After a job or a release: drop an unreferenced failed entry. */
static void tidy(vf_file_cache *c, entry *e)
{
    if (e->state == FAILED && e->refs == 0 && !e->job_running)
        remove_entry(c, e);
}

/* A job's first step: VF_EIO naming the URL when the cache is closing (the
 * job then fetches nothing), else 0. */
static int check_not_closing(const entry *e)
{
    vf_file_cache *c = e->cache;
    pthread_mutex_lock(&c->lock);
    int closing = c->closing;
    pthread_mutex_unlock(&c->lock);
    return closing ? vf_error(VF_EIO, "%s: the file cache is closing", e->url) : 0;
}

static void size_job(void *arg)
{
    entry *e = arg;
    vf_file_cache *c = e->cache;
    uint64_t size = 0;
    int r = check_not_closing(e);
    if (r == 0) {
        vf_io_cancel *outer = vf_io_cancel_watch(&c->cancel);
        r = c->fetcher.size(c->fetcher.ctx, e->url, &size);
        vf_io_cancel_watch(outer);
    }
    char message[1024];
    if (r < 0)
        snprintf(message, sizeof message, "%s", vf_last_error());
    pthread_mutex_lock(&c->lock);
    e->job_running = 0;
    if (r < 0) {
        fail_entry(c, e, r, message);
    } else if (size > c->max_bytes) {
        snprintf(message, sizeof message,
                 "%s: %llu bytes do not fit the file cache (bound %llu bytes); raise the cache size", e->url,
                 (unsigned long long)size, (unsigned long long)c->max_bytes);
        fail_entry(c, e, VF_ERANGE, message);
    } else {
        e->size = size;
        e->state = PENDING;
        e->seq = ++c->seq;
    }
    schedule(c);
    tidy(c, e);
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

static void fetch_job(void *arg)
{
    entry *e = arg;
    vf_file_cache *c = e->cache;
    /* url, part, path and size do not change while the job runs. */
    int r = check_not_closing(e);
    if (r == 0) {
        vf_io_cancel *outer = vf_io_cancel_watch(&c->cancel);
        r = c->fetcher.fetch(c->fetcher.ctx, e->url, e->part, e->size);
        vf_io_cancel_watch(outer);
    }
    if (r == 0) {
        struct stat st;
        if (stat(e->part, &st) < 0)
            r = vf_error(VF_EIO, "%s: the download left no file at %s", e->url, e->part);
        else if ((uint64_t)st.st_size != e->size)
            r = vf_error(VF_ECORRUPT, "%s: downloaded %lld bytes, expected %llu", e->url, (long long)st.st_size,
                         (unsigned long long)e->size);
        else if (rename(e->part, e->path) < 0)
            r = vf_error(VF_EIO, "%s: cannot move the download into place (%s): %s", e->url, e->path,
                         strerror(errno));
    }
    char message[1024];
    if (r < 0) {
        snprintf(message, sizeof message, "%s", vf_last_error());
        unlink(e->part);
    }
    pthread_mutex_lock(&c->lock);
    e->job_running = 0;
    if (r < 0) {
        fail_entry(c, e, r, message);
    } else {
        e->state = READY;
        e->lru = ++c->clock;
        c->stats.downloads++;
        c->stats.bytes_downloaded += e->size;
    }
    schedule(c);
    tidy(c, e);
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

/* ---- open / close --------------------------------------------------------------- */

void vf_file_cache_defaults(vf_file_cache_settings *s)
{
    memset(s, 0, sizeof *s);
    s->threads = 2;
}

int vf_file_cache_open_with(vf_file_cache **out, const vf_file_cache_settings *s)
{
    *out = NULL;
    if (!s->dir || !*s->dir)
        return vf_error(VF_EINVAL, "file cache: no directory given");
    if (s->max_bytes == 0)
        return vf_error(VF_EINVAL, "file cache: the byte bound must be positive");
    if ((!s->fetcher.size) != (!s->fetcher.fetch))
        return vf_error(VF_EINVAL, "file cache: a custom fetcher needs both size and fetch");
    int r = vf_mkdirs(s->dir);
    if (r < 0)
        return vf_error_context(r, "file cache");
    vf_file_cache *c = vf_calloc(1, sizeof *c);
    if (!c)
        return VF_ENOMEM;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->changed, NULL);
    c->max_bytes = s->max_bytes;
    c->fetcher = s->fetcher;
    char *templ = vf_path_join(s->dir, "vfcache-XXXXXX");
    if (!templ)
        r = VF_ENOMEM;
    else if (!mkdtemp(templ))
        r = vf_error(VF_EIO, "file cache: cannot create a directory in %s: %s", s->dir, strerror(errno));
    c->dir = templ;
    if (r == 0 && !c->fetcher.size) {
        r = vf_http_client_open(&c->http, s->http);
        c->fetcher.size = http_size;
        c->fetcher.fetch = http_fetch;
        c->fetcher.ctx = c->http;
    }
    if (r == 0)
        r = vf_thread_pool_create(&c->pool, s->threads > 0 ? VF_MIN(s->threads, 64) : 2);
    if (r < 0) {
        if (c->dir && r != VF_ENOMEM)
            rmdir(c->dir);
        vf_http_client_close(c->http);
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->changed);
        free(c->dir);
        free(c);
        return r;
    }
    *out = c;
    return 0;
}

int vf_file_cache_open(vf_file_cache **out, const char *dir, uint64_t max_bytes)
{
    vf_file_cache_settings s;
    vf_file_cache_defaults(&s);
    s.dir = dir;
    s.max_bytes = max_bytes;
    return vf_file_cache_open_with(out, &s);
}

void vf_file_cache_cancel(vf_file_cache *c)
{
    if (c)
        vf_io_cancel_request(&c->cancel);
}

void vf_file_cache_close(vf_file_cache *c)
{
    if (!c)
        return;
    vf_file_cache_cancel(c); /* downloads in a retry loop end now, not at the end of their budget */
    pthread_mutex_lock(&c->lock);
    c->closing = 1;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    vf_thread_pool_destroy(c->pool); /* runs what is queued (they see closing) */
    size_t held = 0;
    entry *e = c->entries;
    while (e) {
        entry *next = e->next;
        held += e->refs > 0;
        unlink(e->path);
        unlink(e->part);
        entry_free(e);
        e = next;
    }
    if (held)
        vf_log(VF_LOG_WARN, "file cache: closed with %zu file%s still referenced", held, held == 1 ? "" : "s");
    if (rmdir(c->dir) < 0)
        vf_log(VF_LOG_WARN, "file cache: cannot remove %s: %s", c->dir, strerror(errno));
    vf_http_client_close(c->http);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->changed);
    free(c->dir);
    free(c);
}

/* ---- acquire / release ------------------------------------------------------------ */

/* Finds or creates the entry for url and makes sure it is on its way
 * (restarting a failed one). Under the lock; NULL on ENOMEM. */
static entry *lookup_start(vf_file_cache *c, const char *url)
{
    entry *e = find(c, url);
    if (!e) {
        if (!(e = create_entry(c, url)))
            return NULL;
        start_entry(c, e);
    } else if (e->state == FAILED && !e->job_running) {
        start_entry(c, e);
    } else {
        c->stats.hits++;
    }
    return e;
}

static int acquire(vf_file_cache *c, const char *url, const char **local_path, int wait)
{
    *local_path = NULL;
    if (!url || !*url)
        return vf_error(VF_EINVAL, "file cache: empty URL");
    pthread_mutex_lock(&c->lock);
    if (c->closing) {
        pthread_mutex_unlock(&c->lock);
        return vf_error(VF_EINVAL, "%s: the file cache is closing", url);
    }
    entry *e = lookup_start(c, url);
    if (!e) {
        pthread_mutex_unlock(&c->lock);
        return VF_ENOMEM;
    }
    e->refs++;
    while (wait && e->state != READY && e->state != FAILED && !c->closing)
        pthread_cond_wait(&c->changed, &c->lock);
    int r = 0;
    if (e->state == READY) {
        e->lru = ++c->clock;
        *local_path = e->path;
    } else if (!wait) {
        r = VF_EAGAIN;
        vf_error(r, "%s: download in progress", url);
    } else {
        /* failed (or closing): no reference is kept */
        r = e->state == FAILED ? vf_error(e->code, "%s", e->error ? e->error : "download failed")
                               : vf_error(VF_EIO, "%s: the file cache is closing", url);
        e->refs--;
        tidy(c, e);
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

int vf_file_cache_acquire(vf_file_cache *c, const char *url, const char **local_path)
{
    return acquire(c, url, local_path, 1);
}

int vf_file_cache_acquire_nowait(vf_file_cache *c, const char *url, const char **local_path)
{
    return acquire(c, url, local_path, 0);
}

int vf_file_cache_prefetch(vf_file_cache *c, const char *url)
{
    if (!url || !*url)
        return vf_error(VF_EINVAL, "file cache: empty URL");
    pthread_mutex_lock(&c->lock);
    entry *e = c->closing ? NULL : lookup_start(c, url);
    int closing = c->closing;
    pthread_mutex_unlock(&c->lock);
    if (closing)
        return vf_error(VF_EINVAL, "%s: the file cache is closing", url);
    return e ? 0 : VF_ENOMEM;
}

int vf_file_cache_release(vf_file_cache *c, const char *url)
{
    pthread_mutex_lock(&c->lock);
    entry *e = find(c, url);
    if (!e || e->refs <= 0) {
        pthread_mutex_unlock(&c->lock);
        return vf_error(VF_EINVAL, "%s: released but not acquired in the file cache", url);
    }
    e->refs--;
    if (e->refs == 0 && e->state == READY)
        e->lru = ++c->clock;
    tidy(c, e); /* e may be gone now */
    schedule(c);
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

/* A local file presented under the URL's name, so errors from the readers
 * above (Parquet, demuxer) name what the user asked for. */
static int64_t named_read(void *impl, uint64_t offset, void *buf, size_t len)
{
    return vf_source_read_upto(impl, offset, buf, len);
}

static void named_destroy(void *impl) { vf_source_close(impl); }

int vf_file_cache_open_source(vf_file_cache *c, const char *url, vf_source **out)
{
    *out = NULL;
    pthread_mutex_lock(&c->lock);
    entry *e = find(c, url);
    while (e && (e->state == SIZING || e->state == DOWNLOADING) && !c->closing) {
        e->refs++; /* keeps e alive across the wait */
        pthread_cond_wait(&c->changed, &c->lock);
        e->refs--;
    }
    if (!e || e->state != READY) {
        if (e)
            tidy(c, e);
        pthread_mutex_unlock(&c->lock);
        return VF_ENOENT; /* the caller reads remotely; no message needed */
    }
    e->refs++;
    e->lru = ++c->clock;
    c->stats.hits++;
    char *path = vf_strdup(e->path);
    pthread_mutex_unlock(&c->lock);
    /* The open descriptor keeps the bytes even if the file is evicted later. */
    vf_source *local = NULL;
    int r = path ? vf_source_open_file(&local, path) : VF_ENOMEM;
    free(path);
    if (r == 0) {
        static const vf_source_ops ops = {named_read, named_destroy, NULL, NULL};
        r = vf_source_create(out, url, vf_source_size(local), &ops, local);
        if (r < 0)
            vf_source_close(local);
    }
    pthread_mutex_lock(&c->lock);
    e->refs--;
    schedule(c);
    pthread_mutex_unlock(&c->lock);
    return r;
}

void vf_file_cache_get_stats(vf_file_cache *c, vf_file_cache_stats *out)
{
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    pthread_mutex_unlock(&c->lock);
}

int vf_file_cache_refs(vf_file_cache *c, const char *url)
{
    pthread_mutex_lock(&c->lock);
    entry *e = find(c, url);
    int n = e ? e->refs : 0;
    pthread_mutex_unlock(&c->lock);
    return n;
}

/* ---- node cache: one download per node, shared by processes (see io.h) ---------- */

static pthread_mutex_t node_stats_lock = PTHREAD_MUTEX_INITIALIZER;
static vf_node_cache_stats node_process_stats;

#define NODE_STAT_FIELDS 7
static const char *const node_stat_names[NODE_STAT_FIELDS] = {"fetches", "bytes_fetched", "hits", "bytes_reused",
                                                              "waits", "evictions", "bypassed"};

static uint64_t *node_stat_field(vf_node_cache_stats *st, int i)
{
    uint64_t *f[NODE_STAT_FIELDS] = {&st->fetches, &st->bytes_fetched, &st->hits, &st->bytes_reused,
                                     &st->waits, &st->evictions, &st->bypassed};
    return f[i];
}

const char *vf_node_cache_dir(void)
{
    const char *d = getenv("VF_NODE_CACHE_DIR");
    return d && *d ? d : NULL;
}

uint64_t vf_node_cache_bound(void)
{
    const char *b = getenv("VF_NODE_CACHE_BYTES");
    if (b && *b) {
        char *end;
        unsigned long long v = strtoull(b, &end, 10);
        if (*end == '\0' && v > 0)
            return v;
        vf_log(VF_LOG_WARN, "VF_NODE_CACHE_BYTES=%s is not a positive byte count; using 16 GiB", b);
    }
    return (uint64_t)16 << 30;
}

static int parse_stats(int fd, vf_node_cache_stats *st)
{
    memset(st, 0, sizeof *st);
    char buf[1024];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        char name[32];
        unsigned long long v;
        if (sscanf(line, "%31s %llu", name, &v) != 2)
            continue;
        for (int i = 0; i < NODE_STAT_FIELDS; i++)
            if (!strcmp(name, node_stat_names[i]))
                *node_stat_field(st, i) = v;
    }
    return 0;
}

/* Adds d to this process's counters and to the node's (<dir>/.stats). */
static void node_count(const char *dir, const vf_node_cache_stats *d)
{
    pthread_mutex_lock(&node_stats_lock);
    for (int i = 0; i < NODE_STAT_FIELDS; i++)
        *node_stat_field(&node_process_stats, i) += *node_stat_field((vf_node_cache_stats *)d, i);
    pthread_mutex_unlock(&node_stats_lock);
    char *path = vf_path_join(dir, ".stats");
    int fd = path ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
    free(path);
    if (fd < 0)
        return;
    if (flock(fd, LOCK_EX) == 0) {
        vf_node_cache_stats st;
        if (parse_stats(fd, &st) == 0) {
            char out[1024];
            size_t n = 0;
            for (int i = 0; i < NODE_STAT_FIELDS; i++) {
                *node_stat_field(&st, i) += *node_stat_field((vf_node_cache_stats *)d, i);
                n += (size_t)snprintf(out + n, sizeof out - n, "%s %llu\n", node_stat_names[i],
                                      (unsigned long long)*node_stat_field(&st, i));
            }
            if (pwrite(fd, out, n, 0) != (ssize_t)n || ftruncate(fd, (off_t)n) < 0)
                vf_log(VF_LOG_WARN, "node cache: cannot update %s/.stats: %s", dir, strerror(errno));
        }
        flock(fd, LOCK_UN);
    }
    close(fd);
}

void vf_node_cache_process_stats(vf_node_cache_stats *out)
{
    pthread_mutex_lock(&node_stats_lock);
    *out = node_process_stats;
    pthread_mutex_unlock(&node_stats_lock);
}

int vf_node_cache_node_stats(const char *dir, vf_node_cache_stats *out)
{
    memset(out, 0, sizeof *out);
    char *path = vf_path_join(dir, ".stats");
    if (!path)
        return VF_ENOMEM;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    free(path);
    if (fd < 0)
        return 0;
    flock(fd, LOCK_SH);
    parse_stats(fd, out);
    close(fd);
    return 0;
}

static char *node_file(const char *dir, const char *key, const char *suffix)
{
    return vf_asprintf("%s/%s%s", dir, key, suffix);
}

/* 1 when the lock file of the entry whose file is `path` (any suffix) is held by someone. */
static int node_entry_busy(const char *path)
{
    char *lock = vf_strdup(path);
    if (!lock)
        return 1;
    char *dot = strrchr(lock, '.');
    if (!dot || strlen(dot) < 5) {
        free(lock);
        return 1;
    }
    strcpy(dot, ".lock");
    int fd = open(lock, O_RDONLY | O_CLOEXEC);
    free(lock);
    if (fd < 0)
        return 0;
    int busy = flock(fd, LOCK_EX | LOCK_NB) < 0;
    close(fd);
    return busy;
}

/* Under .evict.lock: deletes least recently used unlocked copies until need
 * more bytes fit in max_bytes; drops reservations of dead processes. 0 when
 * the room is there, 1 when it cannot be made. */
static int node_make_room(const char *dir, const char *own_key, uint64_t need, uint64_t max_bytes,
                          vf_node_cache_stats *d)
{
    for (;;) {
        DIR *dh = opendir(dir);
        if (!dh)
            return 1;
        uint64_t used = 0, oldest_time = UINT64_MAX;
        char *oldest = NULL;
        uint64_t oldest_size = 0;
        struct dirent *de;
        while ((de = readdir(dh))) {
            const char *name = de->d_name;
            size_t n = strlen(name);
            int data = n > 5 && !strcmp(name + n - 5, ".data");
            int part = n > 5 && !strcmp(name + n - 5, ".part");
            if (!data && !part)
                continue;
            if (own_key && !strncmp(name, own_key, strlen(own_key)))
                continue;
            char *full = vf_path_join(dir, name);
            struct stat st;
            if (!full || stat(full, &st) < 0) {
                free(full);
                continue;
            }
            if (part) {
                if (!node_entry_busy(full)) /* its downloader died: not a reservation any more */
                    unlink(full);
                else
                    used += (uint64_t)st.st_size;
                free(full);
                continue;
            }
            used += (uint64_t)st.st_size;
            uint64_t t = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
            if (t < oldest_time && !node_entry_busy(full)) {
                free(oldest);
                oldest = full;
                oldest_time = t;
                oldest_size = (uint64_t)st.st_size;
            } else {
                free(full);
            }
        }
        closedir(dh);
        if (used + need <= max_bytes) {
            free(oldest);
            return 0;
        }
        if (!oldest)
            return 1;
        if (unlink(oldest) == 0) {
            d->evictions++;
            vf_log(VF_LOG_DEBUG, "node cache: evicted %s (%llu bytes)", oldest, (unsigned long long)oldest_size);
        }
        free(oldest);
    }
}

static int node_open_copy(const char *data, int *fd, uint64_t *size)
{
    int f = open(data, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return -1;
    struct stat st;
    if (fstat(f, &st) < 0) {
        close(f);
        return -1;
    }
    futimens(f, NULL); /* least recently used = oldest mtime; best effort */
    *fd = f;
    *size = (uint64_t)st.st_size;
    return 0;
}

int vf_node_cache_fetch(const char *dir, uint64_t max_bytes, const char *url, uint64_t known_size,
                        const vf_file_cache_fetcher *fetcher, int *fd, uint64_t *size)
{
    *fd = -1;
    *size = 0;
    char key[65];
    vf_sha256_hex(url, strlen(url), key);
    char *data = node_file(dir, key, ".data"), *lock = node_file(dir, key, ".lock");
    char *part = node_file(dir, key, ".part"), *tmp = node_file(dir, key, ".tmp");
    char *evict = vf_path_join(dir, ".evict.lock");
    vf_node_cache_stats d = {0};
    int r = 0, lk = -1;
    if (!data || !lock || !part || !tmp || !evict) {
        r = VF_ENOMEM;
        goto done;
    }
    if (node_open_copy(data, fd, size) == 0) { /* a hit: copies only appear complete (rename) */
        d.hits = 1;
        d.bytes_reused = *size;
        goto done;
    }
    if (vf_mkdirs(dir) < 0) {
        vf_log(VF_LOG_WARN, "node cache: cannot create %s; reading remotely", dir);
        d.bypassed = 1;
        r = 1;
        goto done;
    }
    lk = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lk < 0 || flock(lk, LOCK_EX) < 0) {
        vf_log(VF_LOG_WARN, "node cache: cannot lock %s: %s; reading remotely", lock, strerror(errno));
        r = 1;
        goto done;
    }
    if (node_open_copy(data, fd, size) == 0) { /* another process fetched it while we waited */
        d.hits = d.waits = 1;
        d.bytes_reused = *size;
        goto done;
    }
    uint64_t want = known_size;
    if (want == UINT64_MAX && (r = fetcher->size(fetcher->ctx, url, &want)) < 0)
        goto done;
    if (want > max_bytes) {
        d.bypassed = 1;
        r = 1;
        goto done;
    }
    int ev = open(evict, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (ev < 0 || flock(ev, LOCK_EX) < 0) {
        if (ev >= 0)
            close(ev);
        d.bypassed = 1;
        r = 1;
        goto done;
    }
    int room = node_make_room(dir, key, want, max_bytes, &d);
    int pf = room == 0 ? open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    if (pf >= 0) { /* the reservation: a sparse file of the object's size */
        if (ftruncate(pf, (off_t)want) < 0)
            room = 1;
        close(pf);
    } else {
        room = 1;
    }
    flock(ev, LOCK_UN);
    close(ev);
    if (room != 0) {
        unlink(part);
        d.bypassed = 1;
        r = 1;
        goto done;
    }
    r = fetcher->fetch(fetcher->ctx, url, tmp, want);
    if (r == 0) {
        struct stat st;
        if (stat(tmp, &st) < 0 || (uint64_t)st.st_size != want)
            r = vf_error(VF_ECORRUPT, "%s: the node cache's download has %lld bytes, expected %llu", url,
                         (long long)(stat(tmp, &st) < 0 ? -1 : st.st_size), (unsigned long long)want);
        else if (rename(tmp, data) < 0)
            r = vf_error(VF_EIO, "%s: cannot move the download into the node cache (%s): %s", url, data,
                         strerror(errno));
    }
    unlink(part);
    if (r < 0) {
        unlink(tmp);
        goto done;
    }
    d.fetches = 1;
    d.bytes_fetched = want;
    if (node_open_copy(data, fd, size) < 0)
        r = vf_error(VF_EIO, "%s: the node cache's copy %s vanished: %s", url, data, strerror(errno));
done:
    if (lk >= 0) {
        flock(lk, LOCK_UN);
        close(lk);
    }
    if (d.fetches || d.hits || d.evictions || d.bypassed)
        node_count(dir, &d);
    free(data);
    free(lock);
    free(part);
    free(tmp);
    free(evict);
    return r;
}

/* A source over the node cache's copy, named by the URL. */
typedef struct node_source {
    int fd;
} node_source;

static int64_t node_source_read(void *impl, uint64_t offset, void *buf, size_t len)
{
    node_source *ns = impl;
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(ns->fd, (char *)buf + got, len - got, (off_t)(offset + got));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return vf_error(VF_EIO, "node cache read: %s", strerror(errno));
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    return (int64_t)got;
}

static void node_source_destroy(void *impl)
{
    node_source *ns = impl;
    close(ns->fd);
    free(ns);
}

static int node_http_fetch(vf_http_client *c, const char *url, uint64_t known_size, int *fd, uint64_t *size)
{
    const char *dir = vf_node_cache_dir();
    if (!dir)
        return 1;
    vf_file_cache_fetcher f = {http_size, http_fetch, c};
    return vf_node_cache_fetch(dir, vf_node_cache_bound(), url, known_size, &f, fd, size);
}

int vf_node_cache_open_source(vf_http_client *c, const char *url, uint64_t known_size, vf_source **out)
{
    *out = NULL;
    int fd;
    uint64_t size;
    int r = node_http_fetch(c, url, known_size, &fd, &size);
    if (r != 0)
        return r;
    node_source *ns = vf_calloc(1, sizeof *ns);
    char *name = ns ? vf_http_redact_url(url) : NULL;
    if (!name) {
        free(ns);
        close(fd);
        return VF_ENOMEM;
    }
    ns->fd = fd;
    static const vf_source_ops ops = {node_source_read, node_source_destroy, NULL, NULL};
    r = vf_source_create(out, name, size, &ops, ns);
    free(name);
    if (r < 0)
        node_source_destroy(ns);
    return r;
}

int vf_node_cache_get(vf_http_client *c, const char *url, size_t max_bytes, uint8_t **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    int r = node_http_fetch(c, url, UINT64_MAX, &fd, &size);
    if (r != 0)
        return r;
    if (size > max_bytes) {
        close(fd);
        return 1; /* the remote path says so, in its own words */
    }
    uint8_t *buf = vf_malloc((size_t)size + 1);
    if (!buf) {
        close(fd);
        return VF_ENOMEM;
    }
    node_source ns = {fd};
    int64_t n = node_source_read(&ns, 0, buf, (size_t)size);
    close(fd);
    if (n != (int64_t)size) {
        free(buf);
        return n < 0 ? (int)n : vf_error(VF_EIO, "%s: short read from the node cache", url);
    }
    buf[size] = '\0';
    *data = buf;
    *len = (size_t)size;
    return 0;
}
