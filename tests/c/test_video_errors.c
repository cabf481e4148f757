/*
 * test_video_errors.c: bad input ends in a clear error, never a crash, a
 * hang or a wrong frame.
 *
 *  - truncation at many offsets, of a PyAV-style file (moov at the end) and
 *    of a faststart concatenation (moov first): open fails with
 *    VF_ECORRUPT naming the file, or every frame served is the right one;
 *  - garbage bytes, an empty file, a fake 'ftyp', damaged sample data;
 *  - missing file, a directory, a byte source whose reads fail (the
 *    source's own message is reported);
 *  - unsupported codec, pixel format, a file without video (made with the
 *    ffmpeg CLI; skipped with a note when it is absent), Matroska input
 *    (indexed by walking packets);
 *  - a file with fewer frames than the metadata expects.
 */
#define _GNU_SOURCE
#include <sys/stat.h>

#include "test_video_helpers.h"

#define W 96
#define H 64

static int write_bytes(const char *path, const uint8_t *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t n = len ? fwrite(data, 1, len, f) : 0;
    fclose(f);
    return n == len ? 0 : -1;
}

/* Opens path and reads every frame: either open fails with VF_ECORRUPT
 * naming the file, or each frame is right (episodes of per_episode frames
 * from `episode` on) or fails with a named error.
 * Returns 1 if the open failed. */
static int open_and_check(const char *path, int64_t episode, int64_t per_episode, int64_t frames_written,
                          const char *what)
{
    vf_video_reader *r = NULL;
    int rc = vf_video_open_file(&r, path, NULL);
    if (rc < 0) {
        CHECK(rc == VF_ECORRUPT);
        CHECK(strstr(vf_last_error(), path) != NULL);
        if (rc != VF_ECORRUPT || !strstr(vf_last_error(), path))
            fprintf(stderr, "  %s: %d %s\n", what, rc, vf_last_error());
        return 1;
    }
    const vf_video_index *ix = vf_video_reader_index(r);
    CHECK(ix->frame_count <= frames_written);
    uint8_t *buf = malloc(W * H * 3);
    for (int64_t k = 0; k < ix->frame_count; k++) {
        rc = vf_video_read_frame(r, k, NULL, buf);
        if (rc == 0)
            CHECK(has_identity(buf, W, H, episode + k / per_episode, k % per_episode, 0));
        else
            CHECK(strstr(vf_last_error(), path) != NULL);
    }
    free(buf);
    vf_video_close(r);
    return 0;
}

static void test_truncation(const char *dir)
{
    char *plain = vf_asprintf("%s/plain.mp4", dir);
    char *cut = vf_asprintf("%s/cut.mp4", dir);
    CHECK_OK(write_stamped(plain, VF_VIDEO_CODEC_AV1, W, H, 2, 4, 12, 0));
    static const int64_t lengths[] = {6, 6};
    camera_file cf;
    CHECK_OK(build_camera_file(&cf, dir, "fast", VF_VIDEO_CODEC_AV1, W, H, 2, lengths, 2, 4, 0));

    const char *files[2] = {plain, cf.path};
    for (int fi = 0; fi < 2; fi++) {
        uint8_t *data;
        size_t len;
        if (vf_read_file(files[fi], &data, &len) < 0) {
            CHECK(0);
            continue;
        }
        size_t cuts[] = {0, 4, 8, 24, 100, len / 8, len / 4, len / 3, len / 2, 2 * len / 3, 3 * len / 4,
                         len - 200, len - 50, len - 9, len - 1};
        int failed_open = 0;
        for (size_t i = 0; i < VF_ARRAY_LEN(cuts); i++) {
            CHECK_OK(write_bytes(cut, data, cuts[i]));
            char what[64];
            snprintf(what, sizeof what, "file %d cut at %zu of %zu", fi, cuts[i], len);
            int failed = open_and_check(cut, 4, fi == 0 ? 12 : 6, 12, what);
            /* Cuts before the last 100 bytes remove sample data or sample
             * tables: the open must fail. (The very end of a PyAV-style file
             * is the moov's trailing 'udta' tag; without it the file is still
             * whole, and open_and_check has verified every frame.) */
            if (cuts[i] + 100 < len && !failed)
                fprintf(stderr, "  %s: opened\n", what);
            failed_open += failed || cuts[i] + 100 >= len;
        }
        CHECK_EQ_INT(failed_open, VF_ARRAY_LEN(cuts));
        /* The untouched file is fine. */
        CHECK_OK(write_bytes(cut, data, len));
        CHECK_EQ_INT(open_and_check(cut, 4, fi == 0 ? 12 : 6, 12, "whole"), 0);
        free(data);
    }
    /* A truncated sample table is named precisely. */
    uint8_t *data;
    size_t len;
    if (vf_read_file(cf.path, &data, &len) == 0) {
        CHECK_OK(write_bytes(cut, data, len - 10));
        vf_video_reader *r = NULL;
        CHECK_ERR(vf_video_open_file(&r, cut, NULL), VF_ECORRUPT, "truncated file: sample 11 of 12");
        free(data);
    }
    remove(cf.path);
    free_camera_file(&cf);
    remove(plain);
    remove(cut);
    free(plain);
    free(cut);
}

static void test_garbage(const char *dir)
{
    char *path = vf_asprintf("%s/garbage.mp4", dir);
    uint8_t junk[4096];
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < sizeof junk; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        junk[i] = (uint8_t)x;
    }
    vf_video_reader *r = NULL;
    CHECK_OK(write_bytes(path, junk, sizeof junk));
    CHECK_ERR(vf_video_open_file(&r, path, NULL), VF_ECORRUPT, "garbage.mp4");
    CHECK(r == NULL);
    /* Something that claims to be MP4. */
    static const uint8_t ftyp[] = {0, 0, 0, 24, 'f', 't', 'y', 'p', 'i', 's', 'o', 'm', 0, 0, 2, 0,
                                   'i', 's', 'o', 'm', 'm', 'p', '4', '1'};
    memcpy(junk, ftyp, sizeof ftyp);
    CHECK_OK(write_bytes(path, junk, sizeof junk));
    CHECK_ERR(vf_video_open_file(&r, path, NULL), VF_ECORRUPT, "garbage.mp4");
    CHECK_OK(write_bytes(path, junk, 0));
    CHECK_ERR(vf_video_open_file(&r, path, NULL), VF_ECORRUPT, "empty file");
    vf_video_index *ix = NULL;
    CHECK_ERR(vf_video_index_build_file(&ix, path), VF_ECORRUPT, "garbage.mp4");

    /* Damaged sample data: every call returns, nothing crashes; frames
     * that do come back are either right or detected by their stamp. */
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_AV1, W, H, 2, 1, 10, 0));
    uint8_t *data;
    size_t len;
    if (vf_read_file(path, &data, &len) == 0) {
        for (size_t i = 200; i < len / 2; i += 7)
            data[i] ^= 0x5A;
        CHECK_OK(write_bytes(path, data, len));
        free(data);
        int rc = vf_video_open_file(&r, path, NULL);
        if (rc == 0) {
            uint8_t *buf = malloc(W * H * 3);
            int served = 0, refused = 0;
            for (int64_t k = 9; k >= 0; k--) {
                if (vf_video_read_frame(r, k, NULL, buf) == 0)
                    served++;
                else
                    refused++;
            }
            CHECK_EQ_INT(served + refused, 10);
            free(buf);
            vf_video_close(r);
        }
    }
    remove(path);
    free(path);
}

static void test_missing(const char *dir)
{
    vf_video_reader *r = NULL;
    char *path = vf_asprintf("%s/nope.mp4", dir);
    CHECK_ERR(vf_video_open_file(&r, path, NULL), VF_ENOENT, "nope.mp4");
    vf_video_settings vs;
    vf_video_defaults(&vs);
    vs.camera = "observation.images.wrist";
    CHECK_ERR(vf_video_open_file(&r, path, &vs), VF_ENOENT, "camera observation.images.wrist");
    CHECK_ERR(vf_video_open_file(&r, dir, NULL), VF_EIO, "not a regular file");
    vf_video_index *ix = NULL;
    CHECK_ERR(vf_video_index_build_file(&ix, path), VF_ENOENT, "nope.mp4");
    double d;
    CHECK_ERR(vf_video_stream_duration(path, &d), VF_ENOENT, "nope.mp4");
    free(path);
}

/* A byte source whose bytes from `limit` on fail, like a dropped connection
 * (a read that reaches it returns what lies before it). */
typedef struct flaky {
    const uint8_t *data;
    size_t len, limit;
} flaky;

static int64_t flaky_read(void *impl, uint64_t offset, void *buf, size_t len)
{
    flaky *f = impl;
    if (offset >= f->limit)
        return vf_error(VF_EIO, "simulated network failure at byte %llu", (unsigned long long)offset);
    if (offset >= f->len)
        return 0;
    size_t n = VF_MIN(len, VF_MIN(f->len, f->limit) - (size_t)offset);
    memcpy(buf, f->data + offset, n);
    return (int64_t)n;
}

static void flaky_destroy(void *impl) { (void)impl; }

static void test_sources(const char *dir)
{
    static const int64_t lengths[] = {5, 7};
    camera_file cf;
    CHECK_OK(build_camera_file(&cf, dir, "src", VF_VIDEO_CODEC_AV1, W, H, 2, lengths, 2, 20, 3));
    uint8_t *data = NULL;
    size_t len = 0;
    CHECK_OK(vf_read_file(cf.path, &data, &len));
    if (!data) {
        free_camera_file(&cf);
        return;
    }
    /* A memory source works like a file. */
    vf_source *mem = NULL;
    CHECK_OK(vf_source_open_memory(&mem, "memory:camera", data, len, 0));
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_open(&r, mem, NULL));
    vf_source_close(mem); /* the reader holds its own reference */
    uint8_t buf[W * H * 3];
    if (r) {
        CHECK(!strcmp(vf_video_reader_name(r), "memory:camera"));
        CHECK_OK(vf_video_read_frame(r, 7, NULL, buf));
        CHECK(has_identity(buf, W, H, 21, 2, 3));
        vf_video_close(r);
    }
    /* Failing early: the open reports the source's message. */
    static const vf_source_ops ops = {flaky_read, flaky_destroy, NULL, NULL};
    flaky f = {data, len, 300};
    vf_source *src = NULL;
    CHECK_OK(vf_source_create(&src, "https://example.invalid/cam.mp4", len, &ops, &f));
    CHECK_ERR(vf_video_open(&r, src, NULL), VF_EIO, "simulated network failure");
    CHECK(strstr(vf_last_error(), "https://example.invalid/cam.mp4") != NULL);
    vf_source_close(src);
    /* Failing in the sample data (moov first, so the open succeeds): the
     * frames before the failure are served, later ones fail with the
     * source's message. */
    f.limit = len - 400;
    CHECK_OK(vf_source_create(&src, "https://example.invalid/cam.mp4", len, &ops, &f));
    int rc = vf_video_open(&r, src, NULL);
    CHECK_OK(rc);
    vf_source_close(src);
    if (rc == 0) {
        CHECK_OK(vf_video_read_frame(r, 0, NULL, buf));
        CHECK(has_identity(buf, W, H, 20, 0, 3));
        CHECK_ERR(vf_video_read_frame(r, 11, NULL, buf), VF_EIO, "simulated network failure");
        /* The reader recovers for frames it can reach. */
        CHECK_OK(vf_video_read_frame(r, 1, NULL, buf));
        CHECK(has_identity(buf, W, H, 20, 1, 3));
        vf_video_close(r);
    }
    free(data);
    remove(cf.path);
    free_camera_file(&cf);
}

static int have_ffmpeg(void) { return system("ffmpeg -version > /dev/null 2>&1") == 0; }

static int run_ffmpeg(const char *args, const char *out)
{
    char *cmd = vf_asprintf("ffmpeg -v error -y %s '%s' > /dev/null 2>&1", args, out);
    int rc = system(cmd);
    free(cmd);
    return rc;
}

static void test_unsupported(const char *dir)
{
    if (!have_ffmpeg()) {
        printf("skip: ffmpeg CLI not found; unsupported-codec cases not run\n");
        return;
    }
    char *path = vf_asprintf("%s/mpeg4.mp4", dir);
    vf_video_reader *r = NULL;
    vf_video_settings vs;
    vf_video_defaults(&vs);
    vs.camera = "cam_low";
    CHECK_EQ_INT(run_ffmpeg("-f lavfi -i testsrc=s=64x64:r=30 -frames:v 3 -c:v mpeg4", path), 0);
    /* Any codec the linked FFmpeg decodes opens (issue 10): MPEG-4 Part 2. */
    CHECK_OK(vf_video_open_file(&r, path, &vs));
    if (r) {
        const vf_video_index *ix = vf_video_reader_index(r);
        CHECK_EQ_INT(ix->codec, VF_VIDEO_CODEC_OTHER);
        CHECK(!strcmp(ix->codec_name, "mpeg4"));
        CHECK_EQ_INT(ix->frame_count, 3);
        uint8_t buf[64 * 64 * 3];
        CHECK_OK(vf_video_read_frame(r, 2, NULL, buf));
        vf_video_close(r);
        r = NULL;
    }
    remove(path);
    free(path);

    /* Any pixel format swscale converts: yuv444p through the generic path. */
    path = vf_asprintf("%s/yuv444.mp4", dir);
    CHECK_EQ_INT(run_ffmpeg("-f lavfi -i testsrc=s=64x64:r=30 -frames:v 3 -c:v libx264 -pix_fmt yuv444p", path), 0);
    CHECK_OK(vf_video_open_file(&r, path, NULL));
    if (r) {
        CHECK_EQ_INT(vf_video_reader_index(r)->pixfmt, VF_VIDEO_PIX_OTHER);
        uint8_t buf[64 * 64 * 3];
        CHECK_OK(vf_video_read_frame(r, 1, NULL, buf));
        vf_video_close(r);
        r = NULL;
    }
    remove(path);
    free(path);

    path = vf_asprintf("%s/audio.mp4", dir);
    CHECK_EQ_INT(run_ffmpeg("-f lavfi -i sine=d=0.2 -c:a aac", path), 0);
    CHECK_ERR(vf_video_open_file(&r, path, NULL), VF_ECORRUPT, "no video stream");
    remove(path);
    free(path);

    /* Matroska: no sample table, so the index walks the packets. With
     * B-frames (x264 default) the order is sorted by pts. */
    path = vf_asprintf("%s/clip.mkv", dir);
    CHECK_EQ_INT(run_ffmpeg("-f lavfi -i testsrc=s=64x64:r=25 -frames:v 20 -c:v libx264 -pix_fmt yuv420p -g 5", path), 0);
    CHECK_OK(vf_video_open_file(&r, path, NULL));
    if (r) {
        const vf_video_index *ix = vf_video_reader_index(r);
        CHECK_EQ_INT(ix->built_from, VF_VIDEO_INDEX_FROM_PACKETS);
        CHECK_EQ_INT(ix->frame_count, 20);
        CHECK_EQ_INT(ix->keyframe_count, 4);
        uint8_t buf[64 * 64 * 3];
        for (int64_t k = 19; k >= 0; k -= 3)
            CHECK_OK(vf_video_read_frame(r, k, NULL, buf));
        vf_video_close(r);
    }
    remove(path);
    free(path);
}

static void test_too_few_frames(const char *dir)
{
    char *path = vf_asprintf("%s/short.mp4", dir);
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_H264, W, H, 2, 0, 5, 0));
    vf_video_index *ix = NULL;
    CHECK_OK(vf_video_index_build_file(&ix, path));
    if (ix) {
        CHECK_ERR(vf_video_index_expect_frames(ix, 6, "observation.images.top"), VF_ECORRUPT,
                  "camera observation.images.top: video has 5 frames, expected at least 6");
        CHECK(strstr(vf_last_error(), "short.mp4") != NULL);
        /* The episode map refuses the file: its last frame is missing and
         * no pts gap says where (a cut end looks like a CFR re-encode that
         * dropped a frame anywhere). */
        vf_video_episode ep = {.episode_index = 3, .from_timestamp = 0, .to_timestamp = 0.2, .length = 6};
        vf_video_map map;
        vf_video_map_settings ms = {.fps = 30, .camera = "observation.images.top"};
        CHECK_OK(vf_video_map_episodes_policy(ix, &ep, 1, &ms, VF_VIDEO_MISMATCH_REFUSE, &map));
        CHECK_EQ_INT(map.method, VF_VIDEO_MAP_REFUSED);
        CHECK_EQ_INT(ep.frames_found, 0);
        int64_t o;
        CHECK_ERR(vf_video_episode_frame(&ep, 4, &o), VF_ECORRUPT, "episode 3: refused");
        CHECK_ERR(vf_video_episode_frame(&ep, 0, &o), VF_ECORRUPT,
                  "first unmatched frame 0: the file holds 5 frames but its 1 episode declares 6; no pts gap shows "
                  "where frames are missing, so no frame of this file can be placed");
        vf_video_map_free(&map, &ep, 1);
        /* The timestamp opt-in: matched by time, the missing frame refused. */
        CHECK_OK(vf_video_map_episodes_policy(ix, &ep, 1, &ms, VF_VIDEO_MISMATCH_TIMESTAMP, &map));
        CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_TIMESTAMP);
        CHECK_EQ_INT(ep.frames_found, 0); /* longer than the whole file: refused before matching */
        CHECK_ERR(vf_video_episode_frame(&ep, 5, &o), VF_ECORRUPT, "first unmatched frame 5");
        vf_video_map_free(&map, &ep, 1);
        vf_video_index_free(ix);
    }
    remove(path);
    free(path);
}

int main(void)
{
    vf_video_set_ffmpeg_log_level(vf_log_level() >= VF_LOG_DEBUG ? VF_LOG_INFO : -1);
    setenv("SVT_LOG", "1", 0);
    char *dir = vf_test_tmpdir("video-errors");
    test_truncation(dir);
    test_garbage(dir);
    test_missing(dir);
    test_sources(dir);
    test_unsupported(dir);
    test_too_few_frames(dir);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_video_errors");
}
