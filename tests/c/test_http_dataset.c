/*
 * test_http_dataset.c: a make-sample dataset served over loopback HTTP and
 * opened by URL: the model equals the local one (episodes, files,
 * fingerprint), single frames decode the same (frames.c through the fs),
 * metadata is fetched once, and prefetch-on-admit: admitting two episodes
 * that share a video file takes two references on it, the decoder-cache
 * opener then reads the local copy (no further video requests), the file
 * survives the first evict and is only evictable after the second; a cache
 * too small for a file makes the opener fall back to remote range reads.
 * A video file whose HEAD answers 503 until the retries run out is an
 * error problem saying "unreachable" with the URL and the status, and is
 * not listed as missing (only 404/410 means missing).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "io/io.h"
#include "testutil.h"
#include "test_http_helpers.h"
#include "vlafeed/make_sample.h"

static char *root_url(canned_server *s) { return vf_asprintf("http://127.0.0.1:%d/ds", s->port); }

/* Two selected episodes (positions) whose camera-0 video is the same file. */
static int find_shared(const vf_dataset *d, size_t *p0, size_t *p1)
{
    size_t n = vf_dataset_num_episodes(d);
    for (size_t i = 0; i + 1 < n; i++) {
        vf_video_span a, b;
        if (vf_dataset_episode_video(d, i, 0, &a) == 0 && vf_dataset_episode_video(d, i + 1, 0, &b) == 0 &&
            a.file == b.file) {
            *p0 = i;
            *p1 = i + 1;
            return 1;
        }
    }
    return 0;
}

static int same_bytes(vf_source *src, const char *local_path)
{
    uint8_t *want = NULL;
    size_t len = 0;
    if (vf_read_file(local_path, &want, &len) < 0 || vf_source_size(src) != len) {
        free(want);
        return 0;
    }
    uint8_t *got = vf_malloc(len ? len : 1);
    int ok = got && vf_source_read_at(src, 0, got, len) == 0 && !memcmp(got, want, len);
    free(got);
    free(want);
    return ok;
}

static void test_open_and_frames(const char *local, canned_server *s, canned_files *files)
{
    vf_dataset *ld = NULL, *rd = NULL;
    CHECK_OK(vf_dataset_open(&ld, local, NULL));
    char *url = root_url(s);
    int before = atomic_load(&s->num_requests);
    CHECK_OK(vf_dataset_open(&rd, url, NULL));
    if (!ld || !rd) {
        vf_dataset_close(ld);
        vf_dataset_close(rd);
        free(url);
        return;
    }
    CHECK(atomic_load(&s->num_requests) > before);
    CHECK_EQ_INT(vf_dataset_num_episodes(rd), vf_dataset_num_episodes(ld));
    CHECK(vf_dataset_fingerprint(rd) == vf_dataset_fingerprint(ld));
    CHECK_EQ_INT(vf_dataset_num_errors(rd), 0);
    CHECK_EQ_INT(vf_dataset_num_problems(rd), vf_dataset_num_problems(ld));
    CHECK(!strcmp(vf_dataset_root(rd), url));
    CHECK_EQ_INT(vf_dataset_num_video_files(rd, 0), vf_dataset_num_video_files(ld, 0));
    const char *v = vf_dataset_video_file(rd, 0, 0);
    CHECK(v && !strncmp(v, url, strlen(url)) && !strcmp(v + strlen(url), vf_dataset_video_file(ld, 0, 0) + strlen(local)));

    /* One frame, through frames.c (index + decode over range reads). */
    const vf_episode *e = vf_dataset_episode(ld, 1);
    uint8_t *a = NULL, *b = NULL;
    int wa = 0, ha = 0, wb = 0, hb = 0;
    CHECK_OK(vf_dataset_read_frame(ld, e->episode_index, 3, "observation.images.cam1", &a, &wa, &ha));
    CHECK_OK(vf_dataset_read_frame(rd, e->episode_index, 3, "observation.images.cam1", &b, &wb, &hb));
    CHECK(a && b && wa == wb && ha == hb && !memcmp(a, b, (size_t)wa * (size_t)ha * 3));
    free(a);
    free(b);

    /* A missing file through the fs: VF_ENOENT naming the URL. */
    vf_source *src = NULL;
    char *gone = vf_asprintf("%s/videos/none.mp4", url);
    CHECK_ERR(vf_ds_open_path(rd, gone, &src), VF_ENOENT, gone);
    free(gone);
    (void)files;
    vf_dataset_close(rd);
    vf_dataset_close(ld);
    free(url);
}

static void test_prefetch_on_admit(const char *local, canned_server *s, canned_files *files, const char *tmp)
{
    vf_dataset *rd = NULL;
    char *url = root_url(s);
    CHECK_OK(vf_dataset_open(&rd, url, NULL));
    free(url);
    if (!rd)
        return;
    size_t p0 = 0, p1 = 0;
    CHECK(find_shared(rd, &p0, &p1));
    vf_video_span span;
    CHECK_OK(vf_dataset_episode_video(rd, p0, 0, &span));
    const char *shared = span.path;
    char *cache_dir = vf_path_join(tmp, "cache");
    vf_file_cache *cache = NULL;
    CHECK_OK(vf_file_cache_open(&cache, cache_dir, 64u << 20));
    if (!cache) {
        vf_dataset_close(rd);
        free(cache_dir);
        return;
    }

    CHECK_OK(vf_prefetch_on_admit(cache, rd, p0));
    CHECK_OK(vf_prefetch_on_admit(cache, rd, p1));
    CHECK_EQ_INT(vf_file_cache_refs(cache, shared), 2);
    const char *local_copy = NULL;
    CHECK_OK(vf_file_cache_acquire(cache, shared, &local_copy)); /* waits for the download */
    CHECK_OK(vf_file_cache_release(cache, shared));
    char *copy_path = local_copy ? vf_strdup(local_copy) : NULL;
    vf_video_span cam1;
    CHECK_OK(vf_dataset_episode_video(rd, p0, 1, &cam1));
    CHECK_OK(vf_file_cache_acquire(cache, cam1.path, &local_copy));
    CHECK_OK(vf_file_cache_release(cache, cam1.path));

    /* The decoder cache's opener reads the local copy: no more video GETs. */
    vf_ds_opener opener = {rd, cache};
    int gets = atomic_load(&files->counted_gets);
    vf_source *src = NULL;
    CHECK_OK(vf_ds_opener_open(&opener, shared, &src));
    if (src) {
        CHECK(!strcmp(vf_source_name(src), shared));
        size_t lr = strlen(vf_dataset_root(rd));
        char *local_file = vf_path_join(local, shared + lr + 1);
        CHECK(same_bytes(src, local_file));
        free(local_file);
        vf_source_close(src);
    }
    CHECK_EQ_INT(atomic_load(&files->counted_gets), gets);

    /* Evicting one of the two episodes keeps the shared file. */
    vf_prefetch_on_evict(cache, rd, p0);
    CHECK_EQ_INT(vf_file_cache_refs(cache, shared), 1);
    CHECK(copy_path && vf_file_exists(copy_path));
    vf_prefetch_on_evict(cache, rd, p1);
    CHECK_EQ_INT(vf_file_cache_refs(cache, shared), 0);
    vf_file_cache_stats st;
    vf_file_cache_get_stats(cache, &st);
    CHECK(st.downloads >= 2); /* both cameras' files */
    CHECK(st.peak_bytes <= (64u << 20));
    CHECK_EQ_INT(st.failures, 0);
    CHECK_ERR(vf_prefetch_on_admit(cache, rd, 1000), VF_ERANGE, "out of range");
    vf_file_cache_close(cache);
    CHECK(copy_path && !vf_file_exists(copy_path));
    free(copy_path);

    /* A cache too small for any file: admit still succeeds (the download
     * fails in the background), and the opener reads remotely. */
    CHECK_OK(vf_file_cache_open(&cache, cache_dir, 100));
    if (cache) {
        CHECK_OK(vf_prefetch_on_admit(cache, rd, p0));
        const char *p = NULL;
        CHECK_ERR(vf_file_cache_acquire(cache, shared, &p), VF_ERANGE, "do not fit the file cache (bound 100 bytes)");
        opener.file_cache = cache;
        gets = atomic_load(&files->counted_gets);
        CHECK_OK(vf_ds_opener_open(&opener, shared, &src));
        if (src) {
            uint8_t head[8];
            CHECK_OK(vf_source_read_at(src, 0, head, 8));
            vf_source_close(src);
        }
        CHECK(atomic_load(&files->counted_gets) > gets);
        vf_prefetch_on_evict(cache, rd, p0);
        vf_file_cache_close(cache);
    }
    free(cache_dir);
    vf_dataset_close(rd);
}

/* canned_serve_files, but every request for `failing` (a path under the
 * served root) answers 503. The files member comes first: the responder
 * reads the context as canned_files. */
typedef struct failing_files {
    canned_files files;
    const char *failing;
} failing_files;

static void serve_failing(canned_server *s, int n, const char *req, int fd)
{
    failing_files *ff = s->ctx;
    const char *sp = strchr(req, ' ');
    size_t len = strlen(ff->failing);
    if (sp && sp[1] == '/' && !strncmp(sp + 2, ff->failing, len) && sp[2 + len] == ' ') {
        canned_printf(fd, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    }
    canned_serve_files(s, n, req, fd);
}

static void test_unreachable_is_not_missing(const char *tmp, const char *local)
{
    vf_dataset *ld = NULL;
    CHECK_OK(vf_dataset_open(&ld, local, NULL));
    if (!ld)
        return;
    const char *video = vf_dataset_video_file(ld, 1, 0);
    char *failing = vf_asprintf("ds/%s", video + strlen(local) + 1);
    vf_dataset_close(ld);
    failing_files ff = {{.root = tmp}, failing};
    canned_server s;
    CHECK(canned_start(&s, serve_failing, &ff, 100000) == 0);
    char *url = root_url(&s);
    char *failing_url = vf_asprintf("http://127.0.0.1:%d/%s", s.port, failing);
    vf_dataset *rd = NULL;
    CHECK_OK(vf_dataset_open(&rd, url, NULL));
    if (rd) {
        CHECK_EQ_INT(vf_dataset_num_missing_files(rd), 0);
        CHECK_EQ_INT(vf_dataset_num_errors(rd), 1);
        const vf_problem *found = NULL;
        for (size_t i = 0; i < vf_dataset_num_problems(rd); i++)
            if (vf_dataset_problem(rd, i)->severity == VF_SEVERITY_ERROR)
                found = vf_dataset_problem(rd, i);
        CHECK(found && !strcmp(found->file, failing + 3)); /* relative to the root */
        CHECK(found && strstr(found->message, "video file unreachable: "));
        CHECK(found && strstr(found->message, failing_url));
        CHECK(found && strstr(found->message, "HTTP 503"));
        CHECK(found && strstr(found->message, "gave up after 2 attempts"));
        CHECK(found && !strstr(found->message, "missing"));
        if (found)
            printf("unreachable video file: %s\n", found->message);
    }
    vf_dataset_close(rd);
    canned_stop(&s);
    free(failing_url);
    free(url);
    free(failing);
}

int main(void)
{
    vf_set_log_level(0); /* the encoder's chatter */
    char *tmp = vf_test_tmpdir("http_dataset");
    char *local = vf_path_join(tmp, "ds");
    vf_make_sample_settings ms;
    vf_make_sample_defaults(&ms);
    ms.num_episodes = 6;
    ms.codec = "h264";
    ms.width = 96;
    ms.height = 64;
    ms.fps = 10;
    ms.min_length = 10;
    ms.max_length = 20;
    ms.max_video_mb = 0.012; /* a few files per camera, some shared by episodes */
    CHECK_OK(vf_make_sample(local, &ms));

    canned_files files = {.root = tmp, .count_suffix = ".mp4"};
    canned_server s;
    CHECK(canned_start(&s, canned_serve_files, &files, 100000) == 0);
    setenv("VF_HTTP_ATTEMPTS", "2", 1);
    test_open_and_frames(local, &s, &files);
    test_prefetch_on_admit(local, &s, &files, tmp);
    canned_stop(&s);
    test_unreachable_is_not_missing(tmp, local);
    vf_test_rmtree(tmp);
    free(local);
    free(tmp);
    return vf_test_finish("test_http_dataset");
}
