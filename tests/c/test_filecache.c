/*
 * test_filecache.c: the local file cache with a fake fetcher (objects are
 * named "obj:<size>:<tag>", their bytes a pattern of the tag): reference
 * counts keep shared files until the last release, eviction is LRU among
 * unreferenced files and deletes them, the byte bound is never exceeded
 * (downloads wait for space; a file alone larger than the bound fails
 * naming the URL), in-flight downloads answer EAGAIN / make acquire wait,
 * failures name the URL and are retried by a later acquire, counters add
 * up, concurrent users stay within the bound, and the default HTTP fetcher
 * downloads from a loopback server.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io.h"
#include "testutil.h"
#include "test_http_helpers.h"

typedef struct fake {
    atomic_int fetches, sizes;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int gate_closed;          /* fetches of "gated" objects wait while set */
    atomic_uint_fast64_t max_seen_on_disk;
} fake;

static int parse_obj(const char *url, uint64_t *size, char *tag)
{
    unsigned long long n;
    char t = 0;
    if (sscanf(url, "obj:%llu:%c", &n, &t) != 2)
        return -1;
    *size = n;
    *tag = t;
    return 0;
}

static int fake_size(void *ctx, const char *url, uint64_t *size)
{
    fake *f = ctx;
    atomic_fetch_add(&f->sizes, 1);
    char tag;
    if (!strncmp(url, "fail:", 5))
        return vf_error(VF_EIO, "%s: HTTP 503 Service Unavailable (gave up after 3 attempts)", url);
    if (parse_obj(url, size, &tag) < 0)
        return vf_error(VF_ENOENT, "%s: HTTP 404 Not Found", url);
    return 0;
}

static int fake_fetch(void *ctx, const char *url, const char *dest, uint64_t size)
{
    fake *f = ctx;
    atomic_fetch_add(&f->fetches, 1);
    if (strstr(url, "gated")) {
        pthread_mutex_lock(&f->lock);
        while (f->gate_closed)
            pthread_cond_wait(&f->cond, &f->lock);
        pthread_mutex_unlock(&f->lock);
    }
    uint64_t n = 0;
    char tag = 'x';
    parse_obj(url, &n, &tag);
    FILE *fp = fopen(dest, "wb");
    if (!fp)
        return vf_error(VF_EIO, "%s: cannot create %s", url, dest);
    for (uint64_t i = 0; i < size; i++)
        fputc(tag + (int)(i % 7), fp);
    fclose(fp);
    return 0;
}

static void open_gate(fake *f)
{
    pthread_mutex_lock(&f->lock);
    f->gate_closed = 0;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

static void fake_init(fake *f)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cond, NULL);
}

static vf_file_cache *open_cache(fake *f, const char *dir, uint64_t max_bytes, int threads)
{
    vf_file_cache_settings s;
    vf_file_cache_defaults(&s);
    s.dir = dir;
    s.max_bytes = max_bytes;
    s.threads = threads;
    s.fetcher.size = fake_size;
    s.fetcher.fetch = fake_fetch;
    s.fetcher.ctx = f;
    vf_file_cache *c = NULL;
    CHECK_OK(vf_file_cache_open_with(&c, &s));
    return c;
}

static int file_ok(const char *path, uint64_t size, char tag)
{
    uint8_t *data;
    size_t len;
    if (vf_read_file(path, &data, &len) < 0)
        return 0;
    int ok = len == size;
    for (size_t i = 0; ok && i < len; i++)
        ok = data[i] == (uint8_t)(tag + (int)(i % 7));
    free(data);
    return ok;
}

static void test_refcount_and_eviction(const char *dir)
{
    fake f;
    fake_init(&f);
    vf_file_cache *c = open_cache(&f, dir, 250, 2);
    const char *pa, *pa2, *pb, *pc;
    CHECK_OK(vf_file_cache_acquire(c, "obj:100:a", &pa));
    CHECK(pa && file_ok(pa, 100, 'a'));
    CHECK_OK(vf_file_cache_acquire(c, "obj:100:a", &pa2)); /* a second episode shares the file */
    CHECK(pa2 && pa && !strcmp(pa, pa2));
    CHECK_EQ_INT(vf_file_cache_refs(c, "obj:100:a"), 2);
    vf_file_cache_stats st;
    vf_file_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.misses, 1);
    CHECK_EQ_INT(st.hits, 1);
    CHECK_EQ_INT(st.downloads, 1);
    CHECK_EQ_INT(st.bytes, 100);
    CHECK_EQ_INT(atomic_load(&f.fetches), 1);

    char *path_a = vf_strdup(pa);
    CHECK_OK(vf_file_cache_release(c, "obj:100:a"));
    CHECK(vf_file_exists(path_a)); /* still referenced once */
    CHECK_OK(vf_file_cache_release(c, "obj:100:a"));
    CHECK(vf_file_exists(path_a)); /* unreferenced: cached, evictable, not deleted yet */
    CHECK_ERR(vf_file_cache_release(c, "obj:100:a"), VF_EINVAL, "obj:100:a: released but not acquired");
    CHECK_ERR(vf_file_cache_release(c, "obj:1:zz"), VF_EINVAL, "not acquired");

    CHECK_OK(vf_file_cache_acquire(c, "obj:100:b", &pb));
    CHECK_OK(vf_file_cache_acquire(c, "obj:100:c", &pc)); /* 300 > 250: a goes */
    CHECK(file_ok(pb, 100, 'b') && file_ok(pc, 100, 'c'));
    CHECK(!vf_file_exists(path_a));
    vf_file_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.evictions, 1);
    CHECK_EQ_INT(st.bytes, 200);
    CHECK(st.peak_bytes <= 250);
    CHECK_EQ_INT(vf_file_cache_refs(c, "obj:100:a"), 0);

    /* Re-acquiring an evicted file downloads it again. */
    CHECK_OK(vf_file_cache_release(c, "obj:100:b"));
    CHECK_OK(vf_file_cache_acquire(c, "obj:100:a", &pa));
    CHECK(file_ok(pa, 100, 'a'));
    CHECK_EQ_INT(atomic_load(&f.fetches), 4);
    vf_file_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.evictions, 2); /* b (unreferenced, least recent) made room */
    CHECK(st.peak_bytes <= 250);
    CHECK_OK(vf_file_cache_release(c, "obj:100:a"));
    CHECK_OK(vf_file_cache_release(c, "obj:100:c"));
    free(path_a);
    vf_file_cache_close(c);
}

typedef struct acquire_arg {
    vf_file_cache *cache;
    const char *url;
    int rc;
    const char *path;
} acquire_arg;

static void *acquire_thread(void *p)
{
    acquire_arg *a = p;
    a->rc = vf_file_cache_acquire(a->cache, a->url, &a->path);
    return NULL;
}

static void test_bound_waits_for_space(const char *dir)
{
    fake f;
    fake_init(&f);
    vf_file_cache *c = open_cache(&f, dir, 250, 2);
    const char *p;
    CHECK_OK(vf_file_cache_acquire(c, "obj:100:b", &p));
    CHECK_OK(vf_file_cache_acquire(c, "obj:100:c", &p));
    /* Both held: d cannot fit; nowait keeps a reference and queues it. */
    CHECK_ERR(vf_file_cache_acquire_nowait(c, "obj:100:d", &p), VF_EAGAIN, "obj:100:d");
    CHECK_EQ_INT(vf_file_cache_refs(c, "obj:100:d"), 1);
    /* The size job has run once d is PENDING; wait for that through a
     * blocking acquirer started in a thread after releasing b. */
    acquire_arg arg = {c, "obj:100:d", -1, NULL};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, acquire_thread, &arg) == 0);
    CHECK_OK(vf_file_cache_release(c, "obj:100:b")); /* makes room */
    pthread_join(t, NULL);
    CHECK_OK(arg.rc);
    CHECK(arg.path && file_ok(arg.path, 100, 'd'));
    CHECK_EQ_INT(vf_file_cache_refs(c, "obj:100:d"), 2);
    vf_file_cache_stats st;
    vf_file_cache_get_stats(c, &st);
    CHECK(st.peak_bytes <= 250);
    CHECK_EQ_INT(st.bytes, 200);
    CHECK_EQ_INT(st.waiting_for_space, 0);

    /* One file larger than the bound: a clear error, no reference kept. */
    CHECK_ERR(vf_file_cache_acquire(c, "obj:300:e", &p), VF_ERANGE,
              "obj:300:e: 300 bytes do not fit the file cache (bound 250 bytes)");
    CHECK_EQ_INT(vf_file_cache_refs(c, "obj:300:e"), 0);

    /* Failures name the URL; a later acquire tries again. */
    CHECK_ERR(vf_file_cache_acquire(c, "fail:x", &p), VF_EIO, "fail:x: HTTP 503");
    int sizes = atomic_load(&f.sizes);
    CHECK_ERR(vf_file_cache_acquire(c, "fail:x", &p), VF_EIO, "fail:x");
    CHECK_EQ_INT(atomic_load(&f.sizes), sizes + 1);
    CHECK_ERR(vf_file_cache_acquire(c, "missing", &p), VF_ENOENT, "missing: HTTP 404");
    vf_file_cache_get_stats(c, &st);
    CHECK(st.failures >= 4);

    CHECK_OK(vf_file_cache_release(c, "obj:100:c"));
    CHECK_OK(vf_file_cache_release(c, "obj:100:d"));
    CHECK_OK(vf_file_cache_release(c, "obj:100:d"));
    vf_file_cache_close(c);
}

static void test_in_flight(const char *dir)
{
    fake f;
    fake_init(&f);
    f.gate_closed = 1;
    vf_file_cache *c = open_cache(&f, dir, 1000, 2);
    const char *p;
    CHECK_OK(vf_file_cache_prefetch(c, "obj:50:gated"));
    CHECK_EQ_INT(vf_file_cache_refs(c, "obj:50:gated"), 0); /* prefetch takes no reference */
    CHECK_ERR(vf_file_cache_acquire_nowait(c, "obj:50:gated", &p), VF_EAGAIN, "in progress");
    CHECK(p == NULL);
    acquire_arg arg = {c, "obj:50:gated", -1, NULL};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, acquire_thread, &arg) == 0);
    open_gate(&f);
    pthread_join(t, NULL);
    CHECK_OK(arg.rc);
    CHECK(arg.path && file_ok(arg.path, 50, 'g'));
    CHECK_EQ_INT(atomic_load(&f.fetches), 1); /* one download for all three calls */
    CHECK_OK(vf_file_cache_acquire_nowait(c, "obj:50:gated", &p));
    CHECK(p && !strcmp(p, arg.path));
    CHECK_EQ_INT(vf_file_cache_refs(c, "obj:50:gated"), 3);

    /* open_source reads the local bytes under the URL's name. */
    vf_source *src;
    CHECK_OK(vf_file_cache_open_source(c, "obj:50:gated", &src));
    CHECK(!strcmp(vf_source_name(src), "obj:50:gated"));
    CHECK_EQ_INT(vf_source_size(src), 50);
    uint8_t b[3];
    CHECK_OK(vf_source_read_at(src, 7, b, 3));
    CHECK(b[0] == 'g' && b[1] == 'g' + 1 && b[2] == 'g' + 2);
    vf_source_close(src);
    CHECK_EQ_INT(vf_file_cache_open_source(c, "obj:5:absent", &src), VF_ENOENT);
    for (int i = 0; i < 3; i++)
        CHECK_OK(vf_file_cache_release(c, "obj:50:gated"));
    char *dir_of = vf_strdup(arg.path);
    *strrchr(dir_of, '/') = '\0';
    CHECK(vf_dir_exists(dir_of));
    vf_file_cache_close(c);
    CHECK(!vf_dir_exists(dir_of)); /* close removes the private directory */
    free(dir_of);
}

typedef struct stress_arg {
    vf_file_cache *cache;
    int id;
    int errors;
} stress_arg;

static void *stress_thread(void *p)
{
    stress_arg *a = p;
    vf_rng rng;
    vf_rng_init(&rng, vf_rng_derive(7, (uint64_t)a->id, 0, 0, 0));
    for (int i = 0; i < 60; i++) {
        char url[32];
        unsigned k = (unsigned)vf_rng_below(&rng, 6);
        snprintf(url, sizeof url, "obj:%u:%c", 40 + 10 * k, 'a' + k);
        const char *path;
        if (vf_file_cache_acquire(a->cache, url, &path) < 0 || !file_ok(path, 40 + 10 * k, (char)('a' + k)))
            a->errors++;
        if (vf_file_cache_release(a->cache, url) < 0)
            a->errors++;
    }
    return NULL;
}

static void test_concurrent_within_bound(const char *dir)
{
    fake f;
    fake_init(&f);
    vf_file_cache *c = open_cache(&f, dir, 4 * 90, 3); /* four of the largest */
    stress_arg args[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (stress_arg){c, i, 0};
        CHECK(pthread_create(&t[i], NULL, stress_thread, &args[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ_INT(args[i].errors, 0);
    }
    vf_file_cache_stats st;
    vf_file_cache_get_stats(c, &st);
    CHECK(st.peak_bytes <= 360);
    CHECK(st.bytes <= 360);
    CHECK_EQ_INT(st.hits + st.misses, 240);
    CHECK_EQ_INT(st.failures, 0);
    CHECK_EQ_INT(st.bytes_downloaded >= st.bytes, 1);
    vf_file_cache_close(c);
}

static void respond_object(canned_server *s, int n, const char *req, int fd)
{
    static const char body[] = "a small remote video file";
    if (!strncmp(req, "HEAD", 4))
        canned_printf(fd, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", sizeof body - 1);
    else
        canned_printf(fd, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s", sizeof body - 1,
                      body);
}

static void test_http_fetcher(const char *dir)
{
    canned_server s;
    CHECK(canned_start(&s, respond_object, NULL, 4) == 0);
    vf_file_cache *c = NULL;
    CHECK_OK(vf_file_cache_open(&c, dir, 1 << 20));
    char *url = vf_asprintf("http://127.0.0.1:%d/ds/videos/cam/file-000.mp4", s.port);
    const char *p;
    CHECK_OK(vf_file_cache_acquire(c, url, &p));
    uint8_t *data = NULL;
    size_t len = 0;
    CHECK_OK(vf_read_file(p, &data, &len));
    CHECK(len == 25 && data && !memcmp(data, "a small remote video file", 25));
    CHECK(strstr(p, "file-000.mp4") != NULL);
    free(data);
    CHECK_OK(vf_file_cache_release(c, url));
    vf_file_cache_close(c);
    canned_stop(&s);
    free(url);

    CHECK_ERR(vf_file_cache_open(&c, dir, 0), VF_EINVAL, "positive");
}

int main(void)
{
    char *dir = vf_test_tmpdir("filecache");
    test_refcount_and_eviction(dir);
    test_bound_waits_for_space(dir);
    test_in_flight(dir);
    test_concurrent_within_bound(dir);
    test_http_fetcher(dir);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_filecache");
}
