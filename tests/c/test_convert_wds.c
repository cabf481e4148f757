/*
 * test_convert_wds.c: the convert layer (src/convert/) in C, also run under
 * ASan/UBSan: the .npy header numpy expects, the spill's torn-tail cut and
 * (unit, run) filtering inputs, and vf_wds_convert() end to end on a
 * make-sample dataset read locally and over HTTP (the two outputs must be
 * byte-identical), with its argument errors. The Python tests
 * (tests/python/test_convert_wds.py) check the values against pyarrow, the
 * frame stamps and the webdataset library.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/convert.h"
#include "testutil.h"
#include "test_http_helpers.h"
#include "vlafeed/convert.h"
#include "vlafeed/make_sample.h"

static void test_npy_header(void)
{
    float values[6] = {1, 2, 3, 4, 5, 6};
    vf_cv_array a = {"observation.state", "<f4", 2, {3, 2}, values, sizeof values};
    vf_buf b = {0};
    CHECK_OK(vf_cv_npy_encode(&a, &b));
    CHECK(b.len == 128 + sizeof values); /* 10 + 61 header bytes padded to a multiple of 64 */
    CHECK(!memcmp(b.data, "\x93NUMPY\x01\x00", 8));
    CHECK(strstr((char *)b.data + 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }") != NULL);
    CHECK(b.data[127] == '\n' && b.data[126] == ' ');
    CHECK(!memcmp(b.data + 128, values, sizeof values));
    b.len = 0;
    uint8_t mask[3] = {1, 0, 1};
    vf_cv_array m = {"past_mask", "|b1", 1, {3}, mask, 3};
    CHECK_OK(vf_cv_npy_encode(&m, &b));
    CHECK(strstr((char *)b.data + 10, "'shape': (3,), }") != NULL);
    vf_cv_array bad = {"x", "<f4", 5, {1, 1, 1, 1}, values, 4};
    CHECK_ERR(vf_cv_npy_encode(&bad, &b), VF_EINVAL, "5 dimensions");
    b.len = 0;
    vf_cv_array two[2] = {a, m};
    CHECK_OK(vf_cv_npz_write(two, 2, &b));
    CHECK(b.len > 30 && !memcmp(b.data, "PK\x03\x04", 4));
    vf_buf_free(&b);
}

static void test_spill(const char *tmp)
{
    char *dir = vf_path_join(tmp, "spill");
    vf_cv_spill *s = NULL;
    CHECK_OK(vf_cv_spill_open(&s, dir, 2));
    vf_cv_record h = {VF_CV_RECORD_MAGIC, 3, 1, 0, 5, 2, 0, 4, 7, 11};
    CHECK_OK(vf_cv_spill_put(s, 1, &h, "abcd"));
    h.pos = 6;
    CHECK_OK(vf_cv_spill_put(s, 1, &h, "efgh"));
    vf_cv_spill_close(s);
    /* a torn tail: half a record appended, as a killed writer leaves it */
    char *bucket = vf_path_join(dir, "bucket_00001.bin");
    int fd = open(bucket, O_WRONLY | O_APPEND);
    CHECK(fd >= 0);
    CHECK(write(fd, &h, 10) == 10);
    close(fd);
    CHECK_OK(vf_cv_spill_open(&s, dir, 2));
    vf_cv_record_ref *refs = NULL;
    size_t n = 0;
    CHECK_OK(vf_cv_spill_scan(s, 1, &refs, &n));
    CHECK_EQ_INT(n, 2);
    if (n == 2) {
        char data[5] = {0};
        CHECK_OK(vf_cv_spill_read(s, 1, refs[1].offset, data, 4));
        CHECK(!strcmp(data, "efgh") && refs[1].head.pos == 6 && refs[0].head.episode_index == 7);
    }
    free(refs);
    CHECK_OK(vf_cv_spill_scan(s, 0, &refs, &n));
    CHECK_EQ_INT(n, 0);
    free(refs);
    vf_cv_spill_close(s);
    /* garbage in a bucket is an error naming it, not a silent skip */
    fd = open(bucket, O_WRONLY | O_TRUNC);
    CHECK(write(fd, "this is not a spill record at all, not at all.....", 50) == 50);
    close(fd);
    CHECK_ERR(vf_cv_spill_open(&s, dir, 2), VF_ECORRUPT, "bucket_00001.bin");
    free(bucket);
    free(dir);
}

static uint8_t *slurp(const char *dir, const char *name, size_t *len)
{
    char *p = vf_path_join(dir, name);
    uint8_t *data = NULL;
    *len = 0;
    if (vf_read_file(p, &data, len) < 0)
        data = NULL;
    free(p);
    return data;
}

static void test_convert(const char *tmp)
{
    char *local = vf_path_join(tmp, "ds");
    vf_make_sample_settings ms;
    vf_make_sample_defaults(&ms);
    ms.num_episodes = 3;
    ms.codec = "h264";
    ms.width = 96;
    ms.height = 64;
    ms.fps = 10;
    ms.min_length = 8;
    ms.max_length = 16;
    ms.max_video_mb = 0.001; /* a file per episode and camera */
    CHECK_OK(vf_make_sample(local, &ms));

    vf_wds_convert_settings s;
    vf_wds_convert_defaults(&s);
    s.samples_per_shard = 5;
    s.seed = 9;
    s.threads = 2;
    char *out_local = vf_path_join(tmp, "out_local"), *out_http = vf_path_join(tmp, "out_http");
    char *summary = NULL;
    CHECK_OK(vf_wds_convert(local, out_local, &s, &summary));
    CHECK(summary && strstr(summary, "\"ok\":true"));
    /* several files per camera (the Python tests cover episodes sharing one): one decode per frame used */
    json_t *js = summary ? json_loads(summary, 0, NULL) : NULL;
    CHECK(js != NULL);
    if (js) {
        json_int_t needed = json_integer_value(json_object_get(js, "frames_needed"));
        json_int_t decoded = json_integer_value(json_object_get(js, "frames_decoded"));
        json_int_t samples = json_integer_value(json_object_get(js, "samples"));
        CHECK(needed > 0 && decoded == needed && needed == 2 * samples);
        CHECK(json_integer_value(json_object_get(js, "units")) > 3); /* > 1 file per camera */
        json_decref(js);
    }
    free(summary);

    canned_files files = {.root = tmp, .count_suffix = ".mp4"};
    canned_server server;
    CHECK(canned_start(&server, canned_serve_files, &files, 100000) == 0);
    char *url = vf_asprintf("http://127.0.0.1:%d/ds", server.port);
    s.threads = 1;
    summary = NULL;
    CHECK_OK(vf_wds_convert(url, out_http, &s, &summary));
    free(summary);
    canned_stop(&server);
    CHECK(atomic_load(&files.counted_gets) > 0);

    const char *names[] = {"shards/manifest.jsonl", "shards/stats.json", "shards/shard_000000.tar",
                           "shards/shard_000003.tar", "shards/preprocessing_config.yaml"};
    for (size_t i = 0; i < VF_ARRAY_LEN(names); i++) {
        size_t la = 0, lb = 0;
        uint8_t *a = slurp(out_local, names[i], &la), *b = slurp(out_http, names[i], &lb);
        CHECK(a && b && la == lb && la > 0 && !memcmp(a, b, la));
        free(a);
        free(b);
    }

    /* argument errors name the option */
    vf_wds_convert_settings bad = s;
    bad.jpeg_quality = 0;
    char *out_bad = vf_path_join(tmp, "out_bad");
    CHECK_ERR(vf_wds_convert(local, out_bad, &bad, NULL), VF_EINVAL, "jpeg_quality");
    bad = s;
    bad.resize_width = 10;
    CHECK_ERR(vf_wds_convert(local, out_bad, &bad, NULL), VF_EINVAL, "resize");
    bad = s;
    const char *cams[] = {"nope"};
    bad.cameras = cams;
    bad.num_cameras = 1;
    CHECK_ERR(vf_wds_convert(local, out_bad, &bad, NULL), VF_ENOENT, "no camera 'nope'");
    bad = s;
    bad.seed = 10; /* the complete output was made with seed 9 */
    CHECK_ERR(vf_wds_convert(local, out_local, &bad, NULL), VF_EINVAL, "seed was 9, now 10");
    free(out_bad);
    free(url);
    free(out_local);
    free(out_http);
    free(local);
}

int main(void)
{
    vf_set_log_level(0);
    char *tmp = vf_test_tmpdir("convert_wds");
    test_npy_header();
    test_spill(tmp);
    test_convert(tmp);
    vf_test_rmtree(tmp);
    free(tmp);
    return vf_test_finish("test_convert_wds");
}
