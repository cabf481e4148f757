/*
 * test_video_encode.c: the writing side and the facts it must reproduce.
 *
 *  - episodes written like LeRobot/PyAV: AV1 GOP 2 (a keyframe every second
 *    frame), track timescale fps * 2^k >= 10000, moov after mdat, duration
 *    = frames / fps; H.264 and HEVC too; libsvtav1's 64-pixel limit;
 *  - SVT-AV1 threads never run at real-time priority, even as root;
 *  - 12-bit gray (depth) round-trips losslessly as uint16 codes;
 *  - concatenation reproduces LeRobot's drift: lengths 373, 374, 372, 373,
 *    37, 41, 100, 55 at 30 fps give real-minus-metadata offsets 0, 0.651,
 *    0.977, 0.977, 1.693, 2.344, 2.669, 3.320 ms (lerobot-format.md §3.4),
 *    and moov comes first;
 *  - identity stamps: exact raw round trip, refusal of damaged or unstamped
 *    pictures, survival through AV1 crf 30 and H.264 from 640x480 to 96x64.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <linux/capability.h>
#include <math.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "test_video_helpers.h"

/* Offsets of the top-level 'moov' and 'mdat' boxes (-1 if absent). */
static void box_offsets(const char *path, long *moov, long *mdat)
{
    *moov = *mdat = -1;
    uint8_t *data;
    size_t len;
    if (vf_read_file(path, &data, &len) < 0)
        return;
    size_t pos = 0;
    while (pos + 8 <= len) {
        uint64_t size = ((uint64_t)data[pos] << 24) | ((uint64_t)data[pos + 1] << 16) | ((uint64_t)data[pos + 2] << 8) |
                        data[pos + 3];
        if (size == 1 && pos + 16 <= len) {
            size = 0;
            for (int i = 0; i < 8; i++)
                size = (size << 8) | data[pos + 8 + (size_t)i];
        } else if (size == 0) {
            size = len - pos;
        }
        if (!memcmp(data + pos + 4, "moov", 4))
            *moov = (long)pos;
        if (!memcmp(data + pos + 4, "mdat", 4))
            *mdat = (long)pos;
        if (size < 8)
            break;
        pos += size;
    }
    free(data);
}

static void test_episode_facts(const char *dir)
{
    char *path = vf_asprintf("%s/ep.mp4", dir);
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_AV1, 96, 64, 2, 0, 13, 0));
    vf_video_index *ix = NULL;
    CHECK_OK(vf_video_index_build_file(&ix, path));
    if (ix) {
        CHECK_EQ_INT(ix->frame_count, 13);
        CHECK_EQ_INT(ix->keyframe_count, 7); /* 0, 2, ..., 12 */
        for (int64_t i = 0; i < 13; i++) {
            CHECK_EQ_INT(ix->keyframe[i], i % 2 == 0);
            CHECK_EQ_INT(ix->pts[i], i * 512);
        }
        CHECK_EQ_INT(ix->time_base_num, 1);
        CHECK_EQ_INT(ix->time_base_den, 15360);
        CHECK_EQ_INT(ix->codec, VF_VIDEO_CODEC_AV1);
        CHECK_EQ_INT(ix->pixfmt, VF_VIDEO_PIX_YUV420P);
        CHECK(!strcmp(ix->codec_name, "av1"));
        CHECK(!strcmp(ix->pixfmt_name, "yuv420p"));
        CHECK_EQ_INT(ix->built_from, VF_VIDEO_INDEX_FROM_ENTRIES);
        CHECK_EQ_INT(ix->stream_duration, 13 * 512);
        CHECK_EQ_INT(ix->container_duration_us, 434000); /* 433.33 ms rounded up */
        CHECK(fabs(ix->avg_fps - 30.0) < 1e-9);
        CHECK_EQ_INT(vf_video_index_keyframe_before(ix, 5), 4);
        CHECK_EQ_INT(vf_video_index_keyframe_before(ix, 4), 4);
        CHECK_EQ_INT(vf_video_index_find_pts(ix, 1024), 2);
        CHECK_EQ_INT(vf_video_index_find_pts(ix, 1000), -1);
        CHECK_EQ_INT(vf_video_index_nearest(ix, 0.070), 2);
        CHECK_EQ_INT(vf_video_index_nearest(ix, 99.0), 12);
        CHECK_EQ_INT(vf_video_index_nearest(ix, -1.0), 0);
        CHECK_OK(vf_video_index_expect_frames(ix, 13, "cam"));
        CHECK_ERR(vf_video_index_expect_frames(ix, 14, "cam_high"), VF_ECORRUPT, "camera cam_high: video has 13 frames, expected at least 14");
        vf_video_index_free(ix);
    }
    double seconds = 0;
    CHECK_OK(vf_video_stream_duration(path, &seconds));
    CHECK(seconds == 13 * 512 / 15360.0);
    long moov, mdat;
    box_offsets(path, &moov, &mdat);
    CHECK(moov > mdat && mdat > 0); /* PyAV-style: moov after mdat */
    remove(path);

    /* Track timescale fps * 2^k >= 10000. */
    static const int fps[] = {10, 15, 24, 30, 50, 60};
    static const int den[] = {10240, 15360, 12288, 15360, 12800, 15360};
    for (size_t i = 0; i < VF_ARRAY_LEN(fps); i++) {
        vf_video_encode_settings s;
        vf_video_encode_defaults(&s);
        s.codec = VF_VIDEO_CODEC_H264;
        s.width = 64;
        s.height = 64;
        s.fps = fps[i];
        s.x26x_preset = "ultrafast";
        stamp_ctx ctx = {64, 64, 1, 1};
        CHECK_OK(vf_video_write_episode(path, &s, 3, stamp_fill, &ctx));
        CHECK_OK(vf_video_index_build_file(&ix, path));
        if (ix) {
            CHECK_EQ_INT(ix->time_base_den, den[i]);
            CHECK_EQ_INT(ix->pts[1] - ix->pts[0], den[i] / fps[i]);
            vf_video_index_free(ix);
        }
        CHECK_OK(vf_video_stream_duration(path, &seconds));
        CHECK(fabs(seconds - 3.0 / fps[i]) < 1e-12);
    }

    /* H.264 GOP 30 and HEVC: keyframes where asked. */
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_H264, 96, 64, 30, 0, 40, 0));
    CHECK_OK(vf_video_index_build_file(&ix, path));
    if (ix) {
        CHECK_EQ_INT(ix->frame_count, 40);
        CHECK_EQ_INT(ix->keyframe_count, 2);
        CHECK(ix->keyframe[0] && ix->keyframe[30]);
        CHECK_EQ_INT(ix->codec, VF_VIDEO_CODEC_H264);
        vf_video_index_free(ix);
    }
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_HEVC, 96, 64, 2, 0, 6, 0));
    CHECK_OK(vf_video_index_build_file(&ix, path));
    if (ix) {
        CHECK_EQ_INT(ix->codec, VF_VIDEO_CODEC_HEVC);
        CHECK_EQ_INT(ix->frame_count, 6);
        CHECK_EQ_INT(ix->keyframe_count, 3);
        vf_video_index_free(ix);
    }
    remove(path);
    free(path);
}

static void test_encode_errors(const char *dir)
{
    char *path = vf_asprintf("%s/bad.mp4", dir);
    stamp_ctx ctx = {96, 48, 0, 0};
    vf_video_encode_settings s;
    vf_video_encode_defaults(&s);
    s.width = 96;
    s.height = 48;
    CHECK_ERR(vf_video_write_episode(path, &s, 4, stamp_fill, &ctx), VF_EINVAL, "smaller than 64x64");
    s.width = 48;
    s.height = 64;
    CHECK_ERR(vf_video_write_episode(path, &s, 4, stamp_fill, &ctx), VF_EINVAL, "smaller than 64x64");
    s.width = 97;
    CHECK_ERR(vf_video_write_episode(path, &s, 4, stamp_fill, &ctx), VF_EINVAL, "even");
    s.width = 96;
    s.height = 64;
    CHECK_ERR(vf_video_write_episode(path, &s, 0, stamp_fill, &ctx), VF_EINVAL, "at least one frame");
    s.pixfmt = VF_VIDEO_PIX_GRAY12;
    CHECK_ERR(vf_video_write_episode(path, &s, 4, stamp_fill, &ctx), VF_EINVAL, "HEVC only");
    vf_video_encode_defaults(&s);
    s.width = 96;
    s.height = 64;
    char *missing = vf_asprintf("%s/no/such/dir/x.mp4", dir);
    CHECK_ERR(vf_video_write_episode(missing, &s, 2, stamp_fill, &ctx), VF_ENOENT, "no/such/dir/x.mp4");
    free(missing);
    /* A failing callback aborts and leaves no file behind. */
    stamp_ctx bad = {96, 64, (int64_t)1 << 30, 0}; /* episode out of stamp range */
    CHECK_ERR(vf_video_write_episode(path, &s, 3, stamp_fill, &bad), VF_ERANGE, "frame 0");
    CHECK(!vf_file_exists(path));
    DIR *d = opendir(dir);
    int leftovers = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        leftovers += strstr(e->d_name, ".tmp-") != NULL;
    if (d)
        closedir(d);
    CHECK_EQ_INT(leftovers, 0);
    CHECK_ERR(vf_video_stream_duration(path, &(double){0}), VF_ENOENT, "bad.mp4");
    free(path);
}

/* ---- real-time priority guard ---- */

typedef struct rt_probe {
    stamp_ctx stamp;
    int rt_threads;
    int max_threads;
} rt_probe;

static void count_threads(rt_probe *p)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        n++;
        int policy = sched_getscheduler((pid_t)atoi(e->d_name));
        if (policy == SCHED_FIFO || policy == SCHED_RR)
            p->rt_threads++;
    }
    closedir(d);
    if (n > p->max_threads)
        p->max_threads = n;
}

static int probe_fill(void *ctx, int64_t frame, uint8_t *pixels, size_t stride)
{
    rt_probe *p = ctx;
    count_threads(p); /* the encoder's threads exist while frames are fed */
    return stamp_fill(&p->stamp, frame, pixels, stride);
}

static int has_sys_nice(void)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) != 0)
        return 0;
    return (data[0].effective >> CAP_SYS_NICE) & 1;
}

static void test_polite_encoder(const char *dir)
{
    char *path = vf_asprintf("%s/polite.mp4", dir);
    int privileged = has_sys_nice();
    rt_probe p = {{128, 96, 1, 0}, 0, 0};
    vf_video_encode_settings s;
    vf_video_encode_defaults(&s);
    s.width = 128;
    s.height = 96;
    CHECK_OK(vf_video_write_episode(path, &s, 6, probe_fill, &p));
    CHECK_EQ_INT(p.rt_threads, 0);
    CHECK(p.max_threads > 1); /* the probe saw the encoder's threads */
    CHECK_EQ_INT(has_sys_nice(), privileged); /* restored afterwards */
    if (!privileged)
        printf("note: not privileged (no CAP_SYS_NICE): real-time guard not exercised\n");
    printf("libsvtav1 with lp=1: %d threads in the process while encoding\n", p.max_threads);
    remove(path);
    free(path);
}

/* ---- depth ---- */

typedef struct depth_ctx {
    int w, h;
} depth_ctx;

static uint16_t depth_code(int x, int y, int64_t frame) { return (uint16_t)((x * 37 + y * 11 + frame * 101) & 4095); }

static int depth_fill(void *ctx, int64_t frame, uint8_t *pixels, size_t stride)
{
    depth_ctx *d = ctx;
    for (int y = 0; y < d->h; y++) {
        uint16_t *row = (uint16_t *)(pixels + (size_t)y * stride);
        for (int x = 0; x < d->w; x++)
            row[x] = depth_code(x, y, frame);
    }
    return 0;
}

static void test_depth(const char *dir)
{
    char *path = vf_asprintf("%s/depth.mp4", dir);
    vf_video_encode_settings s;
    vf_video_encode_defaults(&s);
    s.codec = VF_VIDEO_CODEC_HEVC;
    s.pixfmt = VF_VIDEO_PIX_GRAY12;
    s.width = 64;
    s.height = 48;
    s.x26x_preset = "ultrafast";
    depth_ctx dc = {64, 48};
    CHECK_OK(vf_video_write_episode(path, &s, 4, depth_fill, &dc));
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_open_file(&r, path, NULL));
    if (r) {
        const vf_video_index *ix = vf_video_reader_index(r);
        CHECK_EQ_INT(ix->pixfmt, VF_VIDEO_PIX_GRAY12);
        CHECK(!strcmp(ix->pixfmt_name, "gray12le"));
        vf_video_format f;
        vf_video_format_defaults(&f);
        f.layout = VF_VIDEO_GRAY_U16;
        CHECK_EQ_INT(vf_video_format_bytes(&f, 64, 48), 64 * 48 * 2);
        uint16_t codes[64 * 48];
        for (int64_t k = 3; k >= 0; k--) {
            CHECK_OK(vf_video_read_frame(r, k, &f, codes));
            int bad = 0;
            for (int y = 0; y < 48; y++)
                for (int x = 0; x < 64; x++)
                    bad += codes[y * 64 + x] != depth_code(x, y, k);
            CHECK_EQ_INT(bad, 0);
        }
        /* Resized depth stays within 12 bits. */
        f.width = 32;
        f.height = 24;
        uint16_t small[32 * 24];
        CHECK_OK(vf_video_read_frame(r, 1, &f, small));
        int over = 0;
        for (int i = 0; i < 32 * 24; i++)
            over += small[i] > 4095;
        CHECK_EQ_INT(over, 0);
        /* RGB from depth is refused. */
        uint8_t rgb[64 * 48 * 3];
        CHECK_ERR(vf_video_read_frame(r, 0, NULL, rgb), VF_EINVAL, "depth");
        vf_video_close(r);
    }
    remove(path);
    free(path);
}

/* ---- concatenation drift ---- */

static void test_concat_drift(const char *dir)
{
    static const int64_t lengths[] = {373, 374, 372, 373, 37, 41, 100, 55};
    static const double expected_ms[] = {0, 0.651, 0.977, 0.977, 1.693, 2.344, 2.669, 3.320};
    const size_t n = VF_ARRAY_LEN(lengths);
    char *parts[8];
    vf_video_episode eps[8];
    double t = 0;
    vf_video_encode_settings s;
    vf_video_encode_defaults(&s);
    s.codec = VF_VIDEO_CODEC_H264;
    s.width = 64;
    s.height = 64;
    s.x26x_preset = "ultrafast";
    s.b_frames = 0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        parts[i] = vf_asprintf("%s/drift-%zu.mp4", dir, i);
        stamp_ctx ctx = {64, 64, (int64_t)i, 0};
        int rc = vf_video_write_episode(parts[i], &s, lengths[i], stamp_fill, &ctx);
        CHECK_OK(rc);
        double d = 0;
        CHECK_OK(vf_video_stream_duration(parts[i], &d));
        CHECK(d == (double)lengths[i] * 512 / 15360.0);
        ok &= rc == 0;
        eps[i] = (vf_video_episode){.episode_index = (int64_t)i, .from_timestamp = t, .to_timestamp = t + d,
                                    .length = lengths[i]};
        t += d;
    }
    char *out = vf_asprintf("%s/drift.mp4", dir);
    if (ok)
        CHECK_OK(vf_video_concat((const char *const *)parts, n, out));
    vf_video_index *ix = NULL;
    CHECK_OK(vf_video_index_build_file(&ix, out));
    if (ix) {
        CHECK_EQ_INT(ix->frame_count, 1725);
        vf_video_map map;
        vf_video_map_settings ms = {.fps = 30};
        CHECK_OK(vf_video_map_episodes(ix, eps, n, &ms, &map));
        CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_ORDINAL);
        int64_t start = 0;
        for (size_t i = 0; i < n; i++) {
            CHECK_EQ_INT(eps[i].first_ordinal, start);
            double real_ms = (vf_video_index_seconds(ix, start) - eps[i].from_timestamp) * 1000.0;
            if (fabs(real_ms - expected_ms[i]) > 0.001)
                fprintf(stderr, "episode %zu: offset %.4f ms, expected %.3f\n", i, real_ms, expected_ms[i]);
            CHECK(fabs(real_ms - expected_ms[i]) <= 0.001);
            CHECK(fabs(eps[i].drift_ms - expected_ms[i]) <= 0.001);
            /* Within an episode frames are 512 ticks apart. */
            CHECK_EQ_INT(ix->pts[start + 1] - ix->pts[start], 512);
            start += lengths[i];
        }
        CHECK(fabs(map.max_abs_drift_ms - 3.320) < 0.001);
        CHECK_EQ_INT(map.problem_count, 0); /* 3.3 ms is far below the tolerance */
        /* LeRobot's tolerance_s = 1e-4 would fail from episode 1 on. */
        CHECK(fabs(eps[1].drift_ms) > 0.1);
        vf_video_map_free(&map, eps, n);
        vf_video_index_free(ix);
    }
    long moov, mdat;
    box_offsets(out, &moov, &mdat);
    CHECK(moov >= 0 && mdat > moov); /* faststart */

    /* Spot-check identities across episode boundaries. */
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_open_file(&r, out, NULL));
    if (r) {
        uint8_t buf[64 * 64 * 3];
        int64_t probes[][3] = {{372, 0, 372}, {373, 1, 0}, {746, 1, 373}, {747, 2, 0}, {1724, 7, 54}, {1670, 7, 0}};
        for (size_t i = 0; i < VF_ARRAY_LEN(probes); i++) {
            CHECK_OK(vf_video_read_frame(r, probes[i][0], NULL, buf));
            CHECK(has_identity(buf, 64, 64, probes[i][1], probes[i][2], 0));
        }
        vf_video_close(r);
    }

    /* Pairwise concatenation into the first file, like LeRobot's writer. */
    const char *pair[2] = {parts[0], parts[1]};
    CHECK_OK(vf_video_concat(pair, 2, parts[0]));
    CHECK_OK(vf_video_index_build_file(&ix, parts[0]));
    if (ix) {
        CHECK_EQ_INT(ix->frame_count, 373 + 374);
        CHECK(fabs((vf_video_index_seconds(ix, 373) - 373.0 / 30) * 1000.0 - 0.651) < 0.001);
        vf_video_index_free(ix);
    }
    /* Mismatched inputs are refused. */
    char *other = vf_asprintf("%s/other.mp4", dir);
    CHECK_OK(write_stamped(other, VF_VIDEO_CODEC_H264, 96, 64, 2, 0, 3, 0));
    const char *mixed[2] = {parts[2], other};
    CHECK_ERR(vf_video_concat(mixed, 2, out), VF_EINVAL, "does not match");
    const char *missing[2] = {parts[2], "/nonexistent/file.mp4"};
    CHECK_ERR(vf_video_concat(missing, 2, out), VF_ENOENT, "/nonexistent/file.mp4");
    CHECK_ERR(vf_video_concat(missing, 0, out), VF_EINVAL, "no inputs");
    remove(other);
    free(other);

    for (size_t i = 0; i < n; i++) {
        remove(parts[i]);
        free(parts[i]);
    }
    remove(out);
    free(out);
}

/* vf_video_concat_exact (the recording API's): each file starts where the
 * previous streams end, so every frame keeps pts = ordinal * 512 at 30 fps,
 * also when appending pairwise into the first file as the recorder does, and
 * the frames across the joins are the right ones. */
static void test_concat_exact(const char *dir)
{
    static const int64_t lengths[] = {7, 5, 11};
    const size_t n = VF_ARRAY_LEN(lengths);
    char *parts[3];
    vf_video_encode_settings s;
    vf_video_encode_defaults(&s);
    s.codec = VF_VIDEO_CODEC_H264;
    s.width = 64;
    s.height = 64;
    s.x26x_preset = "ultrafast";
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        parts[i] = vf_asprintf("%s/exact-%zu.mp4", dir, i);
        stamp_ctx ctx = {64, 64, (int64_t)i, 0};
        int rc = vf_video_write_episode(parts[i], &s, lengths[i], stamp_fill, &ctx);
        CHECK_OK(rc);
        ok &= rc == 0;
    }
    for (size_t i = 1; ok && i < n; i++) {
        const char *pair[2] = {parts[0], parts[i]};
        CHECK_OK(vf_video_concat_exact(pair, 2, parts[0]));
    }
    vf_video_index *ix = NULL;
    CHECK_OK(vf_video_index_build_file(&ix, parts[0]));
    if (ix) {
        CHECK_EQ_INT(ix->frame_count, 7 + 5 + 11);
        CHECK_EQ_INT(ix->time_base_den, 15360);
        for (int64_t k = 0; k < ix->frame_count; k++)
            CHECK_EQ_INT(ix->pts[k], k * 512);
        vf_video_index_free(ix);
    }
    double d = 0;
    CHECK_OK(vf_video_stream_duration(parts[0], &d));
    CHECK(fabs(d - 23 * 512 / 15360.0) < 1e-9);
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_open_file(&r, parts[0], NULL));
    if (r) {
        uint8_t buf[64 * 64 * 3];
        int64_t probes[][3] = {{6, 0, 6}, {7, 1, 0}, {11, 1, 4}, {12, 2, 0}, {22, 2, 10}};
        for (size_t i = 0; i < VF_ARRAY_LEN(probes); i++) {
            CHECK_OK(vf_video_read_frame(r, probes[i][0], NULL, buf));
            CHECK(has_identity(buf, 64, 64, probes[i][1], probes[i][2], 0));
        }
        vf_video_close(r);
    }
    const char *missing[2] = {parts[1], "/nonexistent/file.mp4"};
    CHECK_ERR(vf_video_concat_exact(missing, 2, parts[2]), VF_ENOENT, "/nonexistent/file.mp4");
    CHECK_ERR(vf_video_concat_exact(missing, 0, parts[2]), VF_EINVAL, "no inputs");
    for (size_t i = 0; i < n; i++) {
        remove(parts[i]);
        free(parts[i]);
    }
}

/* ---- identity stamps ---- */

static void test_identity_raw(void)
{
    const int w = 96, h = 64;
    uint8_t img[96 * 64 * 3];
    int64_t e, f;
    int c;
    static const int64_t cases[][3] = {{0, 0, 0}, {1, 2, 3}, {16777215, 16777215, 255}, {123456, 7, 200}};
    for (size_t i = 0; i < VF_ARRAY_LEN(cases); i++) {
        CHECK_OK(vf_video_stamp_identity(img, w, h, w * 3, cases[i][0], cases[i][1], (int)cases[i][2]));
        CHECK_OK(vf_video_read_identity(img, w, h, w * 3, &e, &f, &c));
        CHECK_EQ_INT(e, cases[i][0]);
        CHECK_EQ_INT(f, cases[i][1]);
        CHECK_EQ_INT(c, cases[i][2]);
    }
    /* Blank, uniform and noisy pictures are not identities. */
    memset(img, 0, sizeof img);
    CHECK_ERR(vf_video_read_identity(img, w, h, w * 3, &e, &f, &c), VF_ECORRUPT, "checksum");
    CHECK_EQ_INT(e, -1);
    memset(img, 255, sizeof img);
    CHECK_ERR(vf_video_read_identity(img, w, h, w * 3, &e, &f, &c), VF_ECORRUPT, "checksum");
    memset(img, 128, sizeof img);
    CHECK_ERR(vf_video_read_identity(img, w, h, w * 3, &e, &f, &c), VF_ECORRUPT, "ambiguous");
    /* One flipped block is detected, whichever it is. */
    int detected = 0;
    for (int cell = 0; cell < 72; cell++) {
        vf_video_stamp_identity(img, w, h, w * 3, 77, 1234, 5);
        int col = cell % 9, row = cell / 9;
        int x0 = col * w / 9, x1 = (col + 1) * w / 9, y0 = row * h / 8, y1 = (row + 1) * h / 8;
        for (int y = y0; y < y1; y++)
            for (int x = x0; x < x1; x++)
                for (int ch = 0; ch < 3; ch++)
                    img[(y * w + x) * 3 + ch] ^= 0xFF;
        detected += vf_video_read_identity(img, w, h, w * 3, &e, &f, &c) == VF_ECORRUPT;
    }
    CHECK_EQ_INT(detected, 72);
    /* Stamping a sub-rectangle through a stride. */
    uint8_t big[200 * 100 * 3];
    memset(big, 90, sizeof big);
    CHECK_OK(vf_video_stamp_identity(big + (10 * 200 + 20) * 3, 100, 50, 200 * 3, 9, 8, 7));
    CHECK_OK(vf_video_read_identity(big + (10 * 200 + 20) * 3, 100, 50, 200 * 3, &e, &f, &c));
    CHECK(e == 9 && f == 8 && c == 7);
    CHECK_EQ_INT(big[0], 90); /* outside untouched */
    /* Limits. */
    CHECK_ERR(vf_video_stamp_identity(img, w, h, w * 3, -1, 0, 0), VF_ERANGE, "out of range");
    CHECK_ERR(vf_video_stamp_identity(img, w, h, w * 3, 0, 1 << 24, 0), VF_ERANGE, "out of range");
    CHECK_ERR(vf_video_stamp_identity(img, w, h, w * 3, 0, 0, 256), VF_ERANGE, "out of range");
    CHECK_ERR(vf_video_stamp_identity(img, 17, 16, 17 * 3, 0, 0, 0), VF_EINVAL, "too small");
    CHECK_ERR(vf_video_stamp_identity(img, w, h, 10, 0, 0, 0), VF_EINVAL, "too small");
    CHECK_OK(vf_video_stamp_identity(img, 18, 16, 18 * 3, 1, 1, 1));
    CHECK_OK(vf_video_read_identity(img, 18, 16, 18 * 3, &e, &f, &c));
}

static void test_identity_through_codecs(const char *dir)
{
    static const int sizes[][2] = {{640, 480}, {320, 240}, {160, 120}, {96, 64}};
    static const vf_video_codec codecs[] = {VF_VIDEO_CODEC_AV1, VF_VIDEO_CODEC_H264};
    char *path = vf_asprintf("%s/id.mp4", dir);
    for (size_t ci = 0; ci < VF_ARRAY_LEN(codecs); ci++) {
        for (size_t si = 0; si < VF_ARRAY_LEN(sizes); si++) {
            int w = sizes[si][0], h = sizes[si][1];
            CHECK_OK(write_stamped(path, codecs[ci], w, h, 2, 4242 + (int64_t)si, 4, 17));
            vf_video_reader *r = NULL;
            CHECK_OK(vf_video_open_file(&r, path, NULL));
            if (!r)
                continue;
            uint8_t *buf = malloc((size_t)w * h * 3);
            for (int64_t k = 0; k < 4; k++) {
                CHECK_OK(vf_video_read_frame(r, k, NULL, buf));
                CHECK(has_identity(buf, w, h, 4242 + (int64_t)si, k, 17));
            }
            free(buf);
            vf_video_close(r);
        }
    }
    remove(path);
    free(path);
}

int main(void)
{
    vf_video_set_ffmpeg_log_level(vf_log_level() >= VF_LOG_DEBUG ? VF_LOG_INFO : -1);
    setenv("SVT_LOG", "1", 0);
    char *dir = vf_test_tmpdir("video-encode");
    test_episode_facts(dir);
    test_encode_errors(dir);
    test_polite_encoder(dir);
    test_depth(dir);
    test_concat_drift(dir);
    test_concat_exact(dir);
    test_identity_raw();
    test_identity_through_codecs(dir);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_video_encode");
}
