/*
 * test_video_fixture.c: real LeRobot AV1 footage (the G1 v2.1 fixture,
 * 640x480, libsvtav1, GOP 2).
 *
 *  - the index matches what LeRobot wrote: 393 frames, a keyframe on every
 *    even frame, time base 1/15360, 512 ticks per frame, 13.1 s;
 *  - frames at first, middle, last, odd and even ordinals, read by random
 *    access and by a batch, are byte-identical to the ffmpeg CLI's rgb24
 *    decode with the same swscale flags (run through popen; skipped with a
 *    note when ffmpeg or the fixture is absent);
 *  - the CHW and float layouts of a real frame agree with HWC;
 *  - the single-episode mapping of a v2.1 file (video time = timestamp).
 */
#define _GNU_SOURCE
#include <math.h>

#include "test_video_helpers.h"

static const char *const files[] = {
    "lerobot-g1-v21/videos/chunk-000/observation.images.cam_high/episode_000001.mp4",
    "lerobot-g1-v21/videos/chunk-000/observation.images.cam_high/episode_000002.mp4",
    "lerobot-g1-v21/videos/chunk-000/observation.images.cam_high/episode_000004.mp4",
};

/* The CLI's frames at `ordinals` (ascending) as rgb24 with the given sws
 * flags and extra filters, one decode of the file, into out (count frames
 * of size bytes). */
static int cli_frames(const char *path, const int64_t *ordinals, size_t count, const char *flags, const char *extra,
                      uint8_t *out, size_t size)
{
    vf_buf expr = {0};
    for (size_t i = 0; i < count; i++)
        vf_buf_printf(&expr, "%seq(n\\,%lld)", i ? "+" : "", (long long)ordinals[i]);
    char *sel = vf_buf_take_string(&expr);
    char *cmd = vf_asprintf("ffmpeg -v error -i '%s' -vf 'select=%s%s' -vsync passthrough -sws_flags %s "
                            "-pix_fmt rgb24 -f rawvideo -",
                            path, sel, extra, flags);
    free(sel);
    FILE *p = popen(cmd, "r");
    free(cmd);
    if (!p)
        return -1;
    size_t got = fread(out, 1, size * count, p);
    int rc = pclose(p);
    return got == size * count && rc == 0 ? 0 : -1;
}

static void test_file(const char *path, int first)
{
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_open_file(&r, path, NULL));
    if (!r)
        return;
    const vf_video_index *ix = vf_video_reader_index(r);
    CHECK_EQ_INT(ix->codec, VF_VIDEO_CODEC_AV1);
    CHECK_EQ_INT(ix->pixfmt, VF_VIDEO_PIX_YUV420P);
    CHECK_EQ_INT(ix->width, 640);
    CHECK_EQ_INT(ix->height, 480);
    CHECK_EQ_INT(ix->time_base_den, 15360);
    CHECK_EQ_INT(ix->built_from, VF_VIDEO_INDEX_FROM_ENTRIES);
    int64_t n = ix->frame_count;
    CHECK(n > 100);
    int key_pattern_ok = 1, step_ok = 1;
    for (int64_t i = 0; i < n; i++) {
        key_pattern_ok &= ix->keyframe[i] == (i % 2 == 0);
        step_ok &= ix->pts[i] == i * 512;
    }
    CHECK(key_pattern_ok);
    CHECK(step_ok);
    CHECK_EQ_INT(ix->stream_duration, n * 512);
    double seconds;
    CHECK_OK(vf_video_stream_duration(path, &seconds));
    CHECK(seconds == (double)n / 30.0 || fabs(seconds - (double)n / 30.0) < 1e-12);
    if (first) {
        CHECK_EQ_INT(n, 393);
        CHECK_EQ_INT(ix->keyframe_count, 197);
        CHECK(fabs(seconds - 13.1) < 1e-12);
    }

    /* v2.1: one episode per file, video time = timestamp. */
    vf_video_episode ep = {.episode_index = 1, .from_timestamp = 0, .to_timestamp = (double)n / 30, .length = n};
    vf_video_map map;
    vf_video_map_settings ms = {.fps = 30};
    CHECK_OK(vf_video_map_episodes(ix, &ep, 1, &ms, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_ORDINAL);
    CHECK_EQ_INT(map.problem_count, 0);
    CHECK_EQ_INT(ep.first_ordinal, 0);
    vf_video_map_free(&map, &ep, 1);

    const size_t size = 640 * 480 * 3;
    int have_cli = system("ffmpeg -version > /dev/null 2>&1") == 0;
    if (!have_cli) {
        printf("skip: ffmpeg CLI not found; byte comparison with the CLI not run\n");
    } else {
        /* First, odd, even, middle, last; ascending for the CLI. */
        int64_t ordinals[] = {0, 1, 77, n / 2, n / 2 + 1, n - 2, n - 1};
        const size_t count = VF_ARRAY_LEN(ordinals);
        uint8_t *ours = malloc(size), *ref = malloc(size * count);
        vf_video_request req[VF_ARRAY_LEN(ordinals)];
        uint8_t *batch = malloc(size * count);
        for (size_t i = 0; i < count; i++)
            req[i] = (vf_video_request){.frame_ordinal = ordinals[count - 1 - i], .dest = batch + i * size,
                                        .episode = -1, .frame_in_episode = -1};
        CHECK_OK(vf_video_read_frames(r, req, count, NULL));
        if (cli_frames(path, ordinals, count, "bilinear", "", ref, size) < 0) {
            CHECK(0 && "ffmpeg CLI failed");
        } else {
            for (size_t i = 0; i < count; i++) {
                /* Random access in a scrambled order. */
                size_t slot = (i * 3) % count;
                int64_t k = ordinals[slot];
                CHECK_OK(vf_video_read_frame(r, k, NULL, ours));
                size_t diff = 0;
                for (size_t j = 0; j < size; j++)
                    diff += ours[j] != ref[slot * size + j];
                if (diff)
                    fprintf(stderr, "%s frame %lld: %zu bytes differ from the CLI\n", path, (long long)k, diff);
                CHECK_EQ_INT(diff, 0);
                CHECK(memcmp(batch + (count - 1 - slot) * size, ref + slot * size, size) == 0);
            }
        }
        /* fast_bilinear, and a resize to 224x224, through the same swscale. */
        vf_video_format f;
        vf_video_format_defaults(&f);
        f.scaler = VF_VIDEO_SCALE_FAST_BILINEAR;
        CHECK_OK(vf_video_read_frame(r, 5, &f, ours));
        int64_t five = 5;
        if (cli_frames(path, &five, 1, "fast_bilinear", "", ref, size) == 0)
            CHECK(memcmp(ours, ref, size) == 0);
        else
            CHECK(0 && "ffmpeg CLI failed");
        f.scaler = VF_VIDEO_SCALE_BILINEAR;
        f.width = 224;
        f.height = 224;
        const size_t small = 224 * 224 * 3;
        CHECK_OK(vf_video_read_frame(r, 5, &f, ours));
        if (cli_frames(path, &five, 1, "bilinear", ",scale=224:224", ref, small) == 0)
            CHECK(memcmp(ours, ref, small) == 0);
        else
            CHECK(0 && "ffmpeg CLI failed");
        free(ours);
        free(ref);
        free(batch);
    }

    /* CHW and float agree with HWC on a real frame. */
    uint8_t *hwc = malloc(size), *chw = malloc(size);
    float *f32 = malloc(size * sizeof(float));
    vf_video_format f;
    vf_video_format_defaults(&f);
    CHECK_OK(vf_video_read_frame(r, 101, &f, hwc));
    f.layout = VF_VIDEO_RGB_CHW_U8;
    CHECK_OK(vf_video_read_frame(r, 101, &f, chw));
    f.layout = VF_VIDEO_RGB_CHW_F32;
    CHECK_OK(vf_video_read_frame(r, 101, &f, f32));
    size_t px = 640 * 480, bad = 0;
    for (size_t p = 0; p < px; p++)
        for (size_t c = 0; c < 3; c++)
            bad += chw[c * px + p] != hwc[p * 3 + c] || f32[c * px + p] != (float)hwc[p * 3 + c] / 255.0f;
    CHECK_EQ_INT(bad, 0);
    free(hwc);
    free(chw);
    free(f32);
    vf_video_close(r);
}

int main(void)
{
    vf_video_set_ffmpeg_log_level(vf_log_level() >= VF_LOG_DEBUG ? VF_LOG_INFO : -1);
    int ran = 0;
    for (size_t i = 0; i < VF_ARRAY_LEN(files); i++) {
        char *path = vf_test_fixture(files[i]);
        if (!vf_file_exists(path)) {
            printf("skip: fixture %s not found\n", path);
        } else {
            test_file(path, i == 0);
            ran++;
        }
        free(path);
    }
    printf("fixture videos checked: %d\n", ran);
    return vf_test_finish("test_video_fixture");
}
