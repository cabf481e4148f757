/*
 * test_http_cancel.c: remote reads stop promptly when cancelled, with the
 * retry budget far from spent (60 s here, minutes by default); built and
 * run under ThreadSanitizer too (make test-tsan).
 *
 *  - a request retrying a 503 on a thread watching a token fails "cancelled"
 *    within a second of the request, naming the URL and the last status;
 *  - a transfer stalled mid-body is aborted (libcurl's progress callback);
 *  - a request whose token is already requested sends nothing;
 *  - the file cache's close does not wait for a download riding out a 503
 *    storm, and a thread waiting for that download gets the failure;
 *  - a loader over an HTTP root whose videos answer 503: close returns at
 *    once while the engine threads retry, and vf_loader_cancel from another
 *    thread makes a vf_loader_next in flight fail "cancelled" (no batch).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataset/dataset.h"
#include "io/io.h"
#include "testutil.h"
#include "test_http_helpers.h"
#include "vlafeed/loader.h"
#include "vlafeed/make_sample.h"

#define PROMPT_S 1.5 /* "promptly": well under the 60 s budget, above libcurl's ~1 s progress interval */

static void respond_503(canned_server *s, int n, const char *req, int fd)
{
    (void)s, (void)n, (void)req;
    canned_printf(fd, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
}

/* Headers and 10 of 1000 bytes, then nothing until the server stops (at
 * most 10 s). */
static void respond_stall(canned_server *s, int n, const char *req, int fd)
{
    (void)n, (void)req;
    canned_printf(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n0123456789");
    for (int i = 0; i < 1000 && !atomic_load(&s->stop); i++)
        usleep(10000);
}

typedef struct request_call {
    vf_http_client *client;
    const char *url;
    vf_io_cancel *token;
    int rc;
    char message[1024];
    double took;
} request_call;

static void *request_thread(void *arg)
{
    request_call *c = arg;
    vf_io_cancel_watch(c->token);
    uint8_t buf[1000];
    double t0 = vf_now_seconds();
    c->rc = vf_http_get_range(c->client, c->url, 0, buf, sizeof buf);
    c->took = vf_now_seconds() - t0;
    snprintf(c->message, sizeof c->message, "%s", vf_last_error());
    vf_io_cancel_watch(NULL);
    return NULL;
}

/* Starts a range GET on another thread, cancels it after `after_s` and
 * checks it ended within prompt_s, "cancelled", naming the URL. */
static void cancel_request(canned_respond_fn respond, double after_s, double prompt_s, const char *also)
{
    canned_server s;
    CHECK(canned_start(&s, respond, NULL, 100000) == 0);
    vf_http_client *client = NULL;
    CHECK_OK(vf_http_client_open(&client, NULL));
    char *url = vf_asprintf("http://127.0.0.1:%d/object.bin", s.port);
    vf_io_cancel token = {0};
    request_call c = {client, url, &token, 0, "", 0};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, request_thread, &c) == 0);
    usleep((useconds_t)(after_s * 1e6));
    double t0 = vf_now_seconds();
    vf_io_cancel_request(&token);
    pthread_join(t, NULL);
    double late = vf_now_seconds() - t0;
    CHECK(late < prompt_s);
    CHECK(c.took < after_s + prompt_s);
    CHECK_EQ_INT(c.rc, VF_EIO);
    CHECK(strstr(c.message, url) && strstr(c.message, ": cancelled after "));
    CHECK(!also || strstr(c.message, also));
    printf("cancelled %.2f s after the request (%.3f s after the cancel): %s\n", c.took, late, c.message);

    /* A request on a thread whose token is requested sends nothing. */
    int before = atomic_load(&s.num_requests);
    c.rc = 0;
    request_thread(&c);
    CHECK_EQ_INT(c.rc, VF_EIO);
    CHECK(strstr(c.message, ": cancelled after 0 attempts"));
    CHECK_EQ_INT(atomic_load(&s.num_requests), before);

    free(url);
    vf_http_client_close(client);
    canned_stop(&s);
}

typedef struct acquire_call {
    vf_file_cache *cache;
    const char *url;
    int rc;
    char message[1024];
} acquire_call;

static void *acquire_thread(void *arg)
{
    acquire_call *a = arg;
    const char *path = NULL;
    a->rc = vf_file_cache_acquire(a->cache, a->url, &path);
    snprintf(a->message, sizeof a->message, "%s", vf_last_error());
    if (a->rc == 0)
        vf_file_cache_release(a->cache, a->url);
    return NULL;
}

static void test_file_cache(const char *tmp)
{
    canned_server s;
    CHECK(canned_start(&s, respond_503, NULL, 100000) == 0);
    char *dir = vf_path_join(tmp, "cache");
    char *url = vf_asprintf("http://127.0.0.1:%d/video.mp4", s.port);
    vf_file_cache *cache = NULL;
    CHECK_OK(vf_file_cache_open(&cache, dir, 1 << 20));
    if (cache) {
        /* cancel: the download waiting out the 503s fails, and so does the
         * thread waiting for it */
        acquire_call a = {cache, url, 0, ""};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, acquire_thread, &a) == 0);
        usleep(300000);
        double t0 = vf_now_seconds();
        vf_file_cache_cancel(cache);
        pthread_join(t, NULL);
        CHECK(vf_now_seconds() - t0 < PROMPT_S);
        CHECK_EQ_INT(a.rc, VF_EIO);
        CHECK(strstr(a.message, url) && strstr(a.message, "cancelled") && strstr(a.message, "HTTP 503"));
        vf_file_cache_close(cache);
    }
    /* close alone, with a download in its retry loop */
    CHECK_OK(vf_file_cache_open(&cache, dir, 1 << 20));
    if (cache) {
        CHECK_OK(vf_file_cache_prefetch(cache, url));
        usleep(300000);
        double t0 = vf_now_seconds();
        vf_file_cache_close(cache);
        CHECK(vf_now_seconds() - t0 < PROMPT_S);
    }
    free(url);
    free(dir);
    canned_stop(&s);
}

/* The dataset's files, but every GET of an .mp4 answers 503 (HEAD works,
 * so the dataset opens). */
static void serve_videos_503(canned_server *s, int n, const char *req, int fd)
{
    const char *end = strstr(req, " HTTP/");
    if (!strncmp(req, "GET ", 4) && end && end - req > 4 && !strncmp(end - 4, ".mp4", 4)) {
        respond_503(s, n, req, fd);
        return;
    }
    canned_serve_files(s, n, req, fd);
}

static vf_loader *open_stream_loader(vf_dataset *d)
{
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_STREAM;
    ls.threads = 2;
    ls.batch_size = 4;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    return l;
}

typedef struct next_call {
    vf_loader *loader;
    int rc;
    vf_batch *batch;
    char message[1024];
} next_call;

static void *next_thread(void *arg)
{
    next_call *c = arg;
    c->rc = vf_loader_next(c->loader, &c->batch);
    snprintf(c->message, sizeof c->message, "%s", vf_last_error());
    return NULL;
}

static void test_loader(const char *tmp)
{
    char *local = vf_path_join(tmp, "ds");
    vf_make_sample_settings ms;
    vf_make_sample_defaults(&ms);
    ms.num_episodes = 3;
    ms.codec = "h264";
    ms.width = 64;
    ms.height = 48;
    ms.fps = 10;
    ms.min_length = 10;
    ms.max_length = 12;
    CHECK_OK(vf_make_sample(local, &ms));
    canned_files files = {.root = tmp};
    canned_server s;
    CHECK(canned_start(&s, serve_videos_503, &files, 1000000) == 0);
    char *url = vf_asprintf("http://127.0.0.1:%d/ds", s.port);
    vf_dataset *d = NULL;
    CHECK_OK(vf_dataset_open(&d, url, NULL));
    if (d) {
        /* close while the engine threads retry the videos */
        vf_loader *l = open_stream_loader(d);
        usleep(500000);
        double t0 = vf_now_seconds();
        vf_loader_close(l);
        double took = vf_now_seconds() - t0;
        CHECK(took < PROMPT_S);
        printf("loader closed in %.3f s while its reads retried\n", took);

        /* cancel from another thread while vf_loader_next waits */
        l = open_stream_loader(d);
        next_call c = {l, 0, NULL, ""};
        pthread_t t;
        CHECK(l && pthread_create(&t, NULL, next_thread, &c) == 0);
        if (l) {
            usleep(500000);
            t0 = vf_now_seconds();
            vf_loader_cancel(l);
            pthread_join(t, NULL);
            took = vf_now_seconds() - t0;
            CHECK(took < PROMPT_S);
            CHECK_EQ_INT(c.rc, VF_EIO);
            CHECK(c.batch == NULL);
            CHECK(strstr(c.message, "cancelled") && strstr(c.message, ".mp4"));
            printf("next failed %.3f s after the cancel: %s\n", took, c.message);
            vf_batch *b = NULL;
            CHECK_ERR(vf_loader_next(l, &b), VF_EIO, "loader: cancelled");
            t0 = vf_now_seconds();
            vf_loader_close(l);
            CHECK(vf_now_seconds() - t0 < PROMPT_S);
        }
        vf_dataset_close(d);
    }
    canned_stop(&s);
    free(url);
    free(local);
}

int main(void)
{
    vf_set_log_level(0); /* the encoder's chatter, the retry warnings */
    /* A budget far beyond the test's bounds, short waits between attempts. */
    setenv("VF_HTTP_BUDGET_S", "60", 1);
    setenv("VF_HTTP_ATTEMPTS", "10000", 1);
    setenv("VF_HTTP_BACKOFF_S", "0.05", 1);
    setenv("VF_HTTP_BACKOFF_MAX_S", "0.5", 1);
    char *tmp = vf_test_tmpdir("http_cancel");
    cancel_request(respond_503, 0.3, PROMPT_S, "HTTP 503");
    /* libcurl calls the progress callback about once a second while no byte arrives */
    cancel_request(respond_stall, 0.3, PROMPT_S + 1.0, NULL);
    test_file_cache(tmp);
    test_loader(tmp);
    vf_test_rmtree(tmp);
    free(tmp);
    return vf_test_finish("test_http_cancel");
}
