/*
 * cache.c: a bounded LRU of open readers (demuxer + decoder + index), keyed
 * by path or URL.
 *
 * Several readers may exist for one key (two threads decoding the same file
 * each get their own). An entry is either busy (checked out by exactly one
 * thread) or idle. Invariants:
 *  - a busy entry is never evicted or closed under its user;
 *  - after every return/insert, idle entries are evicted least recently used
 *    first while the entry count or the estimated bytes exceed the bounds
 *    (busy entries can hold the cache above its bounds until returned);
 *  - readers are opened and closed outside the lock, so a slow open or
 *    close never blocks other threads' hits.
 * Entries form one doubly linked list, most recently used at the head;
 * lookups scan it (the entry bound is small). The cache also keeps the
 * converters of vf_video_cache_convert (held frames converted after their
 * reader was given back), one per thread converting at a time.
 */
#include "video/video_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct cache_entry {
    char *key;
    vf_video_reader *reader;
    size_t bytes;
    int busy;
    struct cache_entry *prev, *next;
} cache_entry;

/* A converter for held frames, free or in use by one thread. */
typedef struct cache_converter {
    vf_vid_converter conv;
    struct cache_converter *next;
} cache_converter;

struct vf_video_cache {
    pthread_mutex_t lock;
    cache_converter *free_converters; /* vf_video_cache_convert's, not in use */
    vf_video_cache_settings settings;
    char *camera;               /* copy of settings.video.camera */
    cache_entry *head, *tail;   /* MRU .. LRU */
    size_t entries, busy, bytes;
    uint64_t hits, misses, evictions;
};

void vf_video_cache_defaults(vf_video_cache_settings *s)
{
    memset(s, 0, sizeof *s);
    s->max_entries = 32;
    s->max_bytes = (size_t)1 << 30;
    vf_video_defaults(&s->video);
}

int vf_video_cache_open(vf_video_cache **out, const vf_video_cache_settings *settings)
{
    *out = NULL;
    vf_video_cache *c = vf_calloc(1, sizeof *c);
    if (!c)
        return VF_ENOMEM;
    if (settings)
        c->settings = *settings;
    else
        vf_video_cache_defaults(&c->settings);
    if (c->settings.max_entries == 0)
        c->settings.max_entries = 1;
    if (c->settings.video.camera) {
        c->camera = vf_strdup(c->settings.video.camera);
        if (!c->camera) {
            free(c);
            return VF_ENOMEM;
        }
        c->settings.video.camera = c->camera;
    }
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c->camera);
        free(c);
        return vf_error(VF_ENOMEM, "decoder cache: cannot create a mutex");
    }
    *out = c;
    return 0;
}

static void unlink_entry(vf_video_cache *c, cache_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(vf_video_cache *c, cache_entry *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (!c->tail)
        c->tail = e;
}

static void free_entry(cache_entry *e)
{
    vf_video_close(e->reader);
    free(e->key);
    free(e);
}

/* Detaches idle LRU entries while over a bound; returns them as a list
 * (linked through next) for closing outside the lock. Caller holds lock. */
static cache_entry *collect_victims(vf_video_cache *c)
{
    cache_entry *victims = NULL;
    cache_entry *e = c->tail;
    while (e && (c->entries > c->settings.max_entries || c->bytes > c->settings.max_bytes)) {
        cache_entry *prev = e->prev;
        if (!e->busy) {
            unlink_entry(c, e);
            c->entries--;
            c->bytes -= e->bytes;
            c->evictions++;
            e->next = victims;
            victims = e;
        }
        e = prev;
    }
    return victims;
}

static void close_victims(cache_entry *victims)
{
    while (victims) {
        cache_entry *next = victims->next;
        free_entry(victims);
        victims = next;
    }
}

int vf_video_cache_checkout(vf_video_cache *c, const char *key, vf_video_reader **reader)
{
    *reader = NULL;
    pthread_mutex_lock(&c->lock);
    for (cache_entry *e = c->head; e; e = e->next) {
        if (!e->busy && strcmp(e->key, key) == 0) {
            e->busy = 1;
            c->busy++;
            c->hits++;
            unlink_entry(c, e);
            push_front(c, e);
            *reader = e->reader;
            pthread_mutex_unlock(&c->lock);
            return 0;
        }
    }
    c->misses++;
    pthread_mutex_unlock(&c->lock);

    cache_entry *e = vf_calloc(1, sizeof *e);
    if (!e)
        return VF_ENOMEM;
    e->key = vf_strdup(key);
    if (!e->key) {
        free(e);
        return VF_ENOMEM;
    }
    vf_source *src = NULL;
    int r = c->settings.open_source ? c->settings.open_source(c->settings.open_source_ctx, key, &src)
                                    : vf_source_open_file(&src, key);
    if (r == 0) {
        vf_video_settings vs = c->settings.video;
        if (c->settings.device_for)
            vs.device = c->settings.device_for(c->settings.hooks_ctx, key);
        r = vf_video_open(&e->reader, src, &vs);
        vf_source_close(src);
        if (r == 0 && c->settings.opened)
            c->settings.opened(c->settings.hooks_ctx, key, e->reader);
    } else if (c->camera) {
        vf_error_context(r, "camera %s", c->camera);
    }
    if (r < 0) {
        free(e->key);
        free(e);
        return r;
    }
    e->busy = 1;
    e->bytes = vf_video_reader_memory(e->reader);

    pthread_mutex_lock(&c->lock);
    push_front(c, e);
    c->entries++;
    c->busy++;
    c->bytes += e->bytes;
    cache_entry *victims = collect_victims(c);
    pthread_mutex_unlock(&c->lock);
    close_victims(victims);
    *reader = e->reader;
    return 0;
}

static cache_entry *find_reader(vf_video_cache *c, const vf_video_reader *reader)
{
    for (cache_entry *e = c->head; e; e = e->next)
        if (e->reader == reader)
            return e;
    return NULL;
}

/* Locks the cache and finds the entry of a checked-out reader; returns
 * it with the lock held, or NULL (lock released, the misuse logged: the
 * reader was `what`, "returned" or "discarded", while not checked out). */
static cache_entry *lock_checked_out(vf_video_cache *c, const vf_video_reader *reader, const char *what)
{
    pthread_mutex_lock(&c->lock);
    cache_entry *e = find_reader(c, reader);
    if (!e || !e->busy) {
        pthread_mutex_unlock(&c->lock);
        vf_log(VF_LOG_ERROR, "decoder cache: a reader was %s that is not checked out", what);
        return NULL;
    }
    return e;
}

void vf_video_cache_return(vf_video_cache *c, vf_video_reader *reader)
{
    cache_entry *e = reader ? lock_checked_out(c, reader, "returned") : NULL;
    if (!e)
        return;
    e->busy = 0;
    c->busy--;
    size_t bytes = vf_video_reader_memory(reader); /* scratch may have grown */
    c->bytes = c->bytes - e->bytes + bytes;
    e->bytes = bytes;
    unlink_entry(c, e);
    push_front(c, e);
    cache_entry *victims = collect_victims(c);
    pthread_mutex_unlock(&c->lock);
    close_victims(victims);
}

void vf_video_cache_discard(vf_video_cache *c, vf_video_reader *reader)
{
    cache_entry *e = reader ? lock_checked_out(c, reader, "discarded") : NULL;
    if (!e)
        return;
    unlink_entry(c, e);
    c->entries--;
    c->busy--;
    c->bytes -= e->bytes;
    pthread_mutex_unlock(&c->lock);
    free_entry(e);
}

int vf_video_cache_convert(vf_video_cache *c, vf_video_held *held)
{
    if (!held)
        return 0;
    pthread_mutex_lock(&c->lock);
    cache_converter *k = c->free_converters;
    if (k)
        c->free_converters = k->next;
    pthread_mutex_unlock(&c->lock);
    if (!k) {
        if (!(k = vf_malloc(sizeof *k)))
            return VF_ENOMEM;
        vf_vid_converter_init(&k->conv);
    }
    int rc = vf_vid_held_convert(held, &k->conv);
    pthread_mutex_lock(&c->lock);
    k->next = c->free_converters;
    c->free_converters = k;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void vf_video_cache_get_stats(vf_video_cache *c, vf_video_cache_stats *s)
{
    pthread_mutex_lock(&c->lock);
    s->hits = c->hits;
    s->misses = c->misses;
    s->evictions = c->evictions;
    s->entries = c->entries;
    s->busy = c->busy;
    s->bytes = c->bytes;
    pthread_mutex_unlock(&c->lock);
}

void vf_video_cache_close(vf_video_cache *c)
{
    if (!c)
        return;
    if (c->busy)
        vf_log(VF_LOG_ERROR, "decoder cache: closed with %zu readers still checked out (closed anyway)", c->busy);
    cache_entry *e = c->head;
    while (e) {
        cache_entry *next = e->next;
        free_entry(e);
        e = next;
    }
    while (c->free_converters) {
        cache_converter *next = c->free_converters->next;
        vf_vid_converter_free(&c->free_converters->conv);
        free(c->free_converters);
        c->free_converters = next;
    }
    pthread_mutex_destroy(&c->lock);
    free(c->camera);
    free(c);
}
