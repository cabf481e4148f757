/*
 * fuzz_mp4.c: libFuzzer target for the video layer's input side.
 *
 * The input is an MP4 (or Matroska) file held in memory and read through
 * the vf_source AVIO path, exactly as files and HTTP objects are. It is
 * opened (demux + find_stream_info + frame index), the episode mapping runs
 * on a made-up split of its frames, and a few frames are decoded by random
 * access and by a batch. Memory and time are bounded by the reader settings:
 * a small probe size, at most 1024x1024 pixels per frame, and outputs
 * resized to 32x32 (source size only for small frames) so no input can make
 * the harness allocate much.
 * Everything must end in 0 or a clean error; crashes, leaks, hangs and
 * sanitizer reports are findings.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "video/video.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void exercise(vf_video_reader *r)
{
    const vf_video_index *ix = vf_video_reader_index(r);
    int64_t n = ix->frame_count;

    /* Episode mapping over a made-up split into two episodes. */
    vf_video_episode eps[2] = {
        {.episode_index = 0, .from_timestamp = 0.0, .to_timestamp = (double)(n / 2) / 30.0, .length = n / 2 + 1},
        {.episode_index = 1, .from_timestamp = (double)(n / 2) / 30.0, .to_timestamp = (double)n / 30.0,
         .length = n - n / 2},
    };
    vf_video_map map;
    vf_video_map_settings ms = {.fps = 30.0};
    if (n >= 2 && n < 100000 && vf_video_map_episodes(ix, eps, 2, &ms, &map) == 0) {
        int64_t o;
        vf_video_episode_frame(&eps[1], 0, &o);
        vf_video_map_free(&map, eps, 2);
    }

    vf_video_format f;
    vf_video_format_defaults(&f);
    f.width = 32;
    f.height = 32;
    f.layout = ix->pixfmt == VF_VIDEO_PIX_GRAY12 ? VF_VIDEO_GRAY_U16 : VF_VIDEO_RGB_CHW_F32;
    size_t bytes = vf_video_format_bytes(&f, ix->width, ix->height);
    uint8_t *buf = malloc(bytes * 3);
    if (!buf)
        return;
    int64_t targets[3] = {n - 1, 0, n / 2};
    for (int i = 0; i < 3; i++)
        vf_video_read_frame(r, targets[i], &f, buf);
    vf_video_request req[3];
    for (int i = 0; i < 3; i++)
        req[i] = (vf_video_request){.frame_ordinal = (targets[i] + 1) % (n > 0 ? n : 1), .dest = buf + (size_t)i * bytes,
                                    .episode = -1, .frame_in_episode = -1};
    vf_video_read_frames(r, req, 3, &f);
    free(buf);

    /* At the source size too, when small: the output must stay inside the
     * buffer sized from the index whatever the decoder produces. */
    if ((int64_t)ix->width * ix->height <= 256 * 256) {
        vf_video_format_defaults(&f);
        f.layout = ix->pixfmt == VF_VIDEO_PIX_GRAY12 ? VF_VIDEO_GRAY_U16 : VF_VIDEO_RGB_HWC_U8;
        uint8_t *full = malloc(vf_video_format_bytes(&f, ix->width, ix->height) + 1);
        if (full) {
            vf_video_read_frame(r, n > 1 ? 1 : 0, &f, full);
            free(full);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        vf_video_set_ffmpeg_log_level(-1);
        quiet = 1;
    }
    vf_source *src;
    if (vf_source_open_memory(&src, "fuzz.mp4", data, size, 0) < 0)
        return 0;
    vf_video_settings s;
    vf_video_defaults(&s);
    s.probe_bytes = 256 * 1024;
    s.max_pixels = 1024 * 1024;
    vf_video_reader *r = NULL;
    if (vf_video_open(&r, src, &s) == 0) {
        exercise(r);
        vf_video_close(r);
    }
    vf_source_close(src);
    return 0;
}
