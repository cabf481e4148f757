/*
 * test_video_cache.c: the decoder cache.
 *
 *  - hits, misses and LRU eviction under the entry bound;
 *  - busy readers are never evicted (the cache may stand above its bound
 *    while they are out) and come back to be evicted later;
 *  - two checkouts of one key give two distinct readers;
 *  - the byte bound evicts every idle reader when tiny;
 *  - discard closes a reader; open failures leave no entry and name the key;
 *  - a custom source opener (how HTTP plugs in) is used for every miss;
 *  - four threads hammering a small cache always get the right frames.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "test_video_helpers.h"

#define W 96
#define H 64
#define FILES 4
#define FRAMES 8

static char *paths[FILES];

static int read_check(vf_video_reader *r, int file, int64_t k)
{
    uint8_t buf[W * H * 3];
    if (vf_video_read_frame(r, k, NULL, buf) < 0)
        return 0;
    return has_identity(buf, W, H, file, k, 0);
}

static void test_lru(void)
{
    vf_video_cache_settings cs;
    vf_video_cache_defaults(&cs);
    cs.max_entries = 2;
    vf_video_cache *c = NULL;
    CHECK_OK(vf_video_cache_open(&c, &cs));
    if (!c)
        return;
    vf_video_reader *a = NULL, *b = NULL, *a2 = NULL, *x = NULL;
    vf_video_cache_stats st;

    CHECK_OK(vf_video_cache_checkout(c, paths[0], &a));
    CHECK(a && read_check(a, 0, 3));
    vf_video_cache_return(c, a);
    CHECK_OK(vf_video_cache_checkout(c, paths[0], &a2));
    CHECK(a2 == a); /* hit: the same reader, still positioned */
    CHECK(read_check(a2, 0, 4));
    vf_video_stats vs;
    vf_video_get_stats(a2, &vs);
    CHECK_EQ_INT(vs.seeks, 1); /* 3 then 4: continued without a second seek */
    vf_video_cache_return(c, a2);
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.hits, 1);
    CHECK_EQ_INT(st.misses, 1);
    CHECK_EQ_INT(st.entries, 1);
    CHECK_EQ_INT(st.busy, 0);
    CHECK(st.bytes > (size_t)W * H);

    CHECK_OK(vf_video_cache_checkout(c, paths[1], &b));
    vf_video_cache_return(c, b);
    /* Use 0 again so 1 becomes least recently used, then bring in 2. */
    CHECK_OK(vf_video_cache_checkout(c, paths[0], &x));
    vf_video_cache_return(c, x);
    CHECK_OK(vf_video_cache_checkout(c, paths[2], &x));
    CHECK(read_check(x, 2, 7));
    vf_video_cache_return(c, x);
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.entries, 2);
    CHECK_EQ_INT(st.evictions, 1);
    CHECK_EQ_INT(st.misses, 3);
    CHECK_EQ_INT(st.hits, 2);
    /* 0 survived (hit), 1 was evicted (miss). */
    CHECK_OK(vf_video_cache_checkout(c, paths[0], &x));
    vf_video_cache_return(c, x);
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.hits, 3);
    CHECK_OK(vf_video_cache_checkout(c, paths[1], &x));
    vf_video_cache_return(c, x);
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.misses, 4);
    CHECK_EQ_INT(st.evictions, 2);
    vf_video_cache_close(c);
}

static void test_busy_never_evicted(void)
{
    vf_video_cache_settings cs;
    vf_video_cache_defaults(&cs);
    cs.max_entries = 2;
    vf_video_cache *c = NULL;
    CHECK_OK(vf_video_cache_open(&c, &cs));
    if (!c)
        return;
    vf_video_reader *r[FILES] = {0};
    for (int i = 0; i < FILES; i++)
        CHECK_OK(vf_video_cache_checkout(c, paths[i], &r[i]));
    vf_video_cache_stats st;
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.entries, FILES); /* above the bound: all busy */
    CHECK_EQ_INT(st.busy, FILES);
    CHECK_EQ_INT(st.evictions, 0);
    for (int i = 0; i < FILES; i++)
        CHECK(r[i] && read_check(r[i], i, FRAMES - 1 - i)); /* all still usable */
    /* Two checkouts of one key: two readers. */
    vf_video_reader *again = NULL;
    CHECK_OK(vf_video_cache_checkout(c, paths[0], &again));
    CHECK(again && again != r[0]);
    CHECK(again && read_check(again, 0, 1));
    vf_video_cache_return(c, again);
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.evictions, 1); /* the idle second reader went at once */
    for (int i = 0; i < FILES; i++)
        vf_video_cache_return(c, r[i]);
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.entries, 2);
    CHECK_EQ_INT(st.busy, 0);
    CHECK_EQ_INT(st.evictions, 3);
    /* The two most recently returned remain. */
    vf_video_reader *x = NULL;
    CHECK_OK(vf_video_cache_checkout(c, paths[FILES - 1], &x));
    CHECK(x == r[FILES - 1]);
    vf_video_cache_discard(c, x);
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.entries, 1);
    vf_video_cache_close(c);
}

static void test_byte_bound(void)
{
    vf_video_cache_settings cs;
    vf_video_cache_defaults(&cs);
    cs.max_bytes = 1;
    vf_video_cache *c = NULL;
    CHECK_OK(vf_video_cache_open(&c, &cs));
    if (!c)
        return;
    vf_video_reader *a = NULL, *b = NULL;
    CHECK_OK(vf_video_cache_checkout(c, paths[0], &a));
    CHECK_OK(vf_video_cache_checkout(c, paths[1], &b));
    vf_video_cache_stats st;
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.entries, 2);
    CHECK_EQ_INT(st.bytes, vf_video_reader_memory(a) + vf_video_reader_memory(b));
    vf_video_cache_return(c, a);
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.entries, 1); /* a evicted at once, b busy */
    CHECK_EQ_INT(st.evictions, 1);
    CHECK(read_check(b, 1, 2));
    vf_video_cache_return(c, b);
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.entries, 0);
    CHECK_EQ_INT(st.bytes, 0);
    vf_video_cache_close(c);
}

static void test_failures(const char *dir)
{
    vf_video_cache_settings cs;
    vf_video_cache_defaults(&cs);
    cs.video.camera = "observation.images.front";
    vf_video_cache *c = NULL;
    CHECK_OK(vf_video_cache_open(&c, &cs));
    if (!c)
        return;
    char *missing = vf_asprintf("%s/missing.mp4", dir);
    vf_video_reader *r = (vf_video_reader *)1;
    CHECK_ERR(vf_video_cache_checkout(c, missing, &r), VF_ENOENT, "missing.mp4");
    CHECK(strstr(vf_last_error(), "observation.images.front") != NULL);
    CHECK(r == NULL);
    vf_video_cache_stats st;
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.entries, 0);
    CHECK_EQ_INT(st.misses, 1);
    free(missing);
    vf_video_cache_close(c);
}

/* A source opener that maps "cam://<i>" to the i-th test file. */
typedef struct opener {
    int calls;
} opener;

static int open_cam(void *ctx, const char *key, vf_source **out)
{
    opener *o = ctx;
    o->calls++;
    if (strncmp(key, "cam://", 6) != 0)
        return vf_error(VF_ENOENT, "%s: unknown scheme", key);
    int i = atoi(key + 6);
    if (i < 0 || i >= FILES)
        return vf_error(VF_ENOENT, "%s: no such camera file", key);
    return vf_source_open_file(out, paths[i]);
}

static void test_custom_opener(void)
{
    opener o = {0};
    vf_video_cache_settings cs;
    vf_video_cache_defaults(&cs);
    cs.open_source = open_cam;
    cs.open_source_ctx = &o;
    vf_video_cache *c = NULL;
    CHECK_OK(vf_video_cache_open(&c, &cs));
    if (!c)
        return;
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_cache_checkout(c, "cam://2", &r));
    CHECK(r && read_check(r, 2, 5));
    vf_video_cache_return(c, r);
    CHECK_OK(vf_video_cache_checkout(c, "cam://2", &r));
    vf_video_cache_return(c, r);
    CHECK_EQ_INT(o.calls, 1);
    CHECK_ERR(vf_video_cache_checkout(c, "cam://9", &r), VF_ENOENT, "no such camera file");
    vf_video_cache_close(c);
}

typedef struct worker {
    vf_video_cache *cache;
    int id;
    int ok, bad;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    uint64_t x = (uint64_t)w->id * 7919 + 1;
    for (int i = 0; i < 60; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int file = (int)(x % FILES);
        int64_t k = (int64_t)((x >> 8) % FRAMES);
        vf_video_reader *r = NULL;
        if (vf_video_cache_checkout(w->cache, paths[file], &r) < 0) {
            w->bad++;
            continue;
        }
        if (read_check(r, file, k))
            w->ok++;
        else
            w->bad++;
        vf_video_cache_return(w->cache, r);
    }
    return NULL;
}

static void test_threads(void)
{
    vf_video_cache_settings cs;
    vf_video_cache_defaults(&cs);
    cs.max_entries = 3;
    vf_video_cache *c = NULL;
    CHECK_OK(vf_video_cache_open(&c, &cs));
    if (!c)
        return;
    pthread_t t[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){c, i, 0, 0};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    int ok = 0, bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        ok += w[i].ok;
        bad += w[i].bad;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(ok, 240);
    vf_video_cache_stats st;
    vf_video_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.hits + st.misses, 240);
    CHECK(st.entries <= 3);
    CHECK_EQ_INT(st.busy, 0);
    CHECK_EQ_INT(st.misses - st.evictions, st.entries);
    vf_video_cache_close(c);
}

int main(void)
{
    vf_video_set_ffmpeg_log_level(vf_log_level() >= VF_LOG_DEBUG ? VF_LOG_INFO : -1);
    setenv("SVT_LOG", "1", 0);
    char *dir = vf_test_tmpdir("video-cache");
    for (int i = 0; i < FILES; i++) {
        paths[i] = vf_asprintf("%s/file%d.mp4", dir, i);
        CHECK_OK(write_stamped(paths[i], i % 2 ? VF_VIDEO_CODEC_H264 : VF_VIDEO_CODEC_AV1, W, H, 2, i, FRAMES, 0));
    }
    test_lru();
    test_busy_never_evicted();
    test_byte_bound();
    test_failures(dir);
    test_custom_opener();
    test_threads();
    for (int i = 0; i < FILES; i++)
        free(paths[i]);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_video_cache");
}
