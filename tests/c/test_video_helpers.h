/*
 * test_video_helpers.h: shared pieces of the video tests (header-only, each
 * test_video*.c includes it): synthetic episodes with identity stamps, a
 * LeRobot-style concatenated camera file, and identity checks.
 */
#ifndef VF_TEST_VIDEO_HELPERS_H
#define VF_TEST_VIDEO_HELPERS_H

#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "video/video.h"

/* LeakSanitizer hook (used only in sanitizer builds): libx265 3.5 leaks a
 * few allocations per encoder it opens; those are not ours to fix. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libx265.so\n"; }

typedef struct stamp_ctx {
    int width, height;
    int64_t episode;
    int camera;
} stamp_ctx;

static int stamp_fill(void *ctx, int64_t frame, uint8_t *pixels, size_t stride)
{
    stamp_ctx *s = ctx;
    return vf_video_stamp_identity(pixels, s->width, s->height, stride, s->episode, frame, s->camera);
}

/* Encodes one episode of `frames` stamped frames (episode, k, camera). */
static VF_UNUSED int write_stamped(const char *path, vf_video_codec codec, int w, int h, int gop, int64_t episode,
                                   int64_t frames, int camera)
{
    vf_video_encode_settings s;
    vf_video_encode_defaults(&s);
    s.codec = codec;
    s.width = w;
    s.height = h;
    s.gop = gop;
    if (codec == VF_VIDEO_CODEC_HEVC)
        s.x26x_preset = "ultrafast"; /* x264 keeps its default: B-frames, like LeRobot */
    stamp_ctx ctx = {w, h, episode, camera};
    return vf_video_write_episode(path, &s, frames, stamp_fill, &ctx);
}

/* 1 when the RGB HWC image carries exactly (episode, frame, camera). */
static VF_UNUSED int has_identity(const uint8_t *rgb, int w, int h, int64_t episode, int64_t frame, int camera)
{
    int64_t e, f;
    int c;
    if (vf_video_read_identity(rgb, w, h, (size_t)w * 3, &e, &f, &c) < 0) {
        fprintf(stderr, "  identity unreadable (wanted %lld/%lld/%d): %s\n", (long long)episode, (long long)frame,
                camera, vf_last_error());
        return 0;
    }
    if (e != episode || f != frame || c != camera) {
        fprintf(stderr, "  identity %lld/%lld/%d, wanted %lld/%lld/%d\n", (long long)e, (long long)f, c,
                (long long)episode, (long long)frame, camera);
        return 0;
    }
    return 1;
}

/* A LeRobot-style camera file: episodes encoded one by one, metadata times
 * from the per-episode stream durations (float sums, like LeRobot), then
 * concatenated. eps[i].episode_index = first_episode + i. */
typedef struct camera_file {
    char *path;
    size_t count;
    vf_video_episode eps[16];
    int64_t total_frames;
} camera_file;

static VF_UNUSED int build_camera_file(camera_file *cf, const char *dir, const char *name, vf_video_codec codec,
                                       int w, int h, int gop, const int64_t *lengths, size_t count,
                                       int64_t first_episode, int camera)
{
    memset(cf, 0, sizeof *cf);
    if (count > 16)
        return VF_EINVAL;
    char *parts[16] = {0};
    double t = 0.0;
    int r = 0;
    for (size_t i = 0; i < count && r == 0; i++) {
        parts[i] = vf_asprintf("%s/%s-part%zu.mp4", dir, name, i);
        r = write_stamped(parts[i], codec, w, h, gop, first_episode + (int64_t)i, lengths[i], camera);
        double d = 0;
        if (r == 0)
            r = vf_video_stream_duration(parts[i], &d);
        cf->eps[i].episode_index = first_episode + (int64_t)i;
        cf->eps[i].from_timestamp = t;
        cf->eps[i].to_timestamp = t + d;
        cf->eps[i].length = lengths[i];
        cf->total_frames += lengths[i];
        t += d;
    }
    cf->count = count;
    cf->path = vf_asprintf("%s/%s.mp4", dir, name);
    if (r == 0)
        r = vf_video_concat((const char *const *)parts, count, cf->path);
    for (size_t i = 0; i < count; i++) {
        if (parts[i])
            remove(parts[i]);
        free(parts[i]);
    }
    return r;
}

static VF_UNUSED void free_camera_file(camera_file *cf)
{
    free(cf->path);
    cf->path = NULL;
}

/* Deterministic shuffle (xorshift) for request orders. */
static VF_UNUSED void shuffle_i64(int64_t *a, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = n; i > 1; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t j = (size_t)(x % i);
        int64_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

#endif
