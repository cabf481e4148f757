/*
 * bench_video.c: decode throughput of the video layer on one MP4.
 *
 *   bench_video [FILE] [--seconds S] [--threads N] [--seed N]
 *
 * FILE defaults to a fixture video. Each measurement runs for about S
 * seconds (default 2) and prints one line "name value unit (extra)". The
 * value is frames per CPU second of this process (the wall-clock rate is in
 * the extra part), so a busy machine does not distort it:
 *   seq_rgb          sequential decode + RGB24 HWC (decoder reused), frames/s
 *   seq_chw_f32      the same into float32 CHW (LeRobot's tensor layout)
 *   random_rgb       uniform random single frames, decoder reused, frames/s
 *                    (extra: decoded frames per delivered frame)
 *   random_reopen    the same but opening the file for every frame
 *   batch64_rgb      random frames in batches of 64 sorted per batch
 *   convert_*        conversion alone (the same decoded frame again), frames/s
 *   chw_via_hwc / chw_via_gbrp: swscale -> HWC then de-interleave, versus
 *                    swscale straight to planar GBRP (how the CHW path was chosen)
 * bench/video_bench.sh runs this next to the ffmpeg CLI and prints ratios.
 * Timings are wall clock on whatever else the machine runs: compare ratios
 * taken in the same run, not absolute numbers across machines.
 */
#define _GNU_SOURCE
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libswscale/swscale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "video/video.h"

#define DEFAULT_FILE "../shared/fixtures/lerobot-g1-v21/videos/chunk-000/observation.images.cam_high/episode_000001.mp4"

/* CPU seconds used by the process: on a shared machine, frames per CPU
 * second is the figure that does not depend on what else runs. */
static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int die(const char *what)
{
    fprintf(stderr, "bench_video: %s: %s\n", what, vf_last_error());
    return 1;
}

static int bench_sequential(const char *path, const vf_video_settings *vs, double seconds, vf_video_layout layout,
                            const char *name)
{
    vf_video_reader *r;
    if (vf_video_open_file(&r, path, vs) < 0)
        return die("open");
    const vf_video_index *ix = vf_video_reader_index(r);
    vf_video_format f;
    vf_video_format_defaults(&f);
    f.layout = layout;
    void *buf = malloc(vf_video_format_bytes(&f, ix->width, ix->height));
    int64_t frames = 0;
    double t0 = vf_now_seconds(), c0 = cpu_seconds(), t;
    do {
        for (int64_t k = 0; k < ix->frame_count; k++) {
            if (vf_video_read_frame(r, k, &f, buf) < 0) {
                free(buf);
                vf_video_close(r);
                return die("read");
            }
            frames++;
        }
        t = vf_now_seconds() - t0;
    } while (t < seconds);
    double c = cpu_seconds() - c0;
    printf("%s %.1f frames/cpu-s (%.1f frames/s wall, %lld frames)\n", name, frames / c, frames / t,
           (long long)frames);
    free(buf);
    vf_video_close(r);
    return 0;
}

static int bench_random(const char *path, const vf_video_settings *vs, double seconds, int reopen, int batch)
{
    vf_video_reader *r = NULL;
    if (vf_video_open_file(&r, path, vs) < 0)
        return die("open");
    const vf_video_index *ix = vf_video_reader_index(r);
    int64_t n = ix->frame_count;
    int w = ix->width, h = ix->height;
    size_t bytes = (size_t)w * h * 3;
    int slots = batch > 0 ? batch : 1;
    uint8_t *buf = malloc(bytes * (size_t)slots);
    vf_video_request *req = calloc((size_t)slots, sizeof *req);
    int64_t frames = 0;
    uint64_t decoded = 0;
    double t0 = vf_now_seconds(), c0 = cpu_seconds(), t;
    do {
        for (int rep = 0; rep < 16; rep++) {
            if (batch > 0) {
                for (int i = 0; i < batch; i++)
                    req[i] = (vf_video_request){.frame_ordinal = (int64_t)(next_rand() % (uint64_t)n),
                                                .dest = buf + (size_t)i * bytes, .episode = -1,
                                                .frame_in_episode = -1};
                if (vf_video_read_frames(r, req, (size_t)batch, NULL) < 0)
                    return die("read batch");
                frames += batch;
                continue;
            }
            int64_t k = (int64_t)(next_rand() % (uint64_t)n);
            if (reopen) {
                vf_video_stats st;
                vf_video_get_stats(r, &st);
                decoded += st.frames_decoded;
                vf_video_close(r);
                if (vf_video_open_file(&r, path, vs) < 0)
                    return die("open");
            }
            if (vf_video_read_frame(r, k, NULL, buf) < 0)
                return die("read");
            frames++;
        }
        t = vf_now_seconds() - t0;
    } while (t < seconds);
    vf_video_stats st;
    vf_video_get_stats(r, &st);
    decoded += st.frames_decoded;
    const char *name = batch > 0 ? "batch64_rgb" : reopen ? "random_reopen" : "random_rgb";
    double c = cpu_seconds() - c0;
    printf("%s %.1f frames/cpu-s (%.1f frames/s wall, %lld frames, %.2f decoded per delivered)\n", name, frames / c,
           frames / t, (long long)frames, (double)decoded / (double)frames);
    free(buf);
    free(req);
    vf_video_close(r);
    return 0;
}

static int bench_convert(const char *path, double seconds)
{
    vf_video_reader *r;
    if (vf_video_open_file(&r, path, NULL) < 0)
        return die("open");
    const vf_video_index *ix = vf_video_reader_index(r);
    struct {
        const char *name;
        vf_video_layout layout;
        int w, h;
    } cases[] = {
        {"convert_rgb_hwc", VF_VIDEO_RGB_HWC_U8, 0, 0},
        {"convert_rgb_chw", VF_VIDEO_RGB_CHW_U8, 0, 0},
        {"convert_chw_f32", VF_VIDEO_RGB_CHW_F32, 0, 0},
        {"convert_resize224_hwc", VF_VIDEO_RGB_HWC_U8, 224, 224},
        {"convert_resize224_chw_f32", VF_VIDEO_RGB_CHW_F32, 224, 224},
    };
    void *buf = malloc((size_t)ix->width * ix->height * 3 * sizeof(float));
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        vf_video_format f;
        vf_video_format_defaults(&f);
        f.layout = cases[c].layout;
        f.width = cases[c].w;
        f.height = cases[c].h;
        int64_t frames = 0;
        double t0 = vf_now_seconds(), c0 = cpu_seconds(), t;
        do {
            for (int i = 0; i < 50; i++) {
                if (vf_video_read_frame(r, 1, &f, buf) < 0) /* decoded once, then reused */
                    return die("convert");
                frames++;
            }
            t = vf_now_seconds() - t0;
        } while (t < seconds / 4);
        double cpu = cpu_seconds() - c0;
        printf("%s %.1f frames/cpu-s (%.3f ms cpu/frame)\n", cases[c].name, frames / cpu, 1000.0 * cpu / frames);
    }
    free(buf);
    vf_video_close(r);
    return 0;
}

/* The CHW design choice: swscale to HWC + de-interleave, or swscale to
 * planar GBRP with plane pointers reordered to R, G, B. Uses libavcodec
 * directly to get one decoded yuv420p frame. */
static int bench_chw_paths(const char *path, double seconds)
{
    AVFormatContext *fmt = NULL;
    if (avformat_open_input(&fmt, path, NULL, NULL) < 0 || avformat_find_stream_info(fmt, NULL) < 0)
        return fprintf(stderr, "bench_video: cannot open %s\n", path), 1;
    int si = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    AVCodecParameters *par = fmt->streams[si]->codecpar;
    const AVCodec *codec = par->codec_id == AV_CODEC_ID_AV1 ? avcodec_find_decoder_by_name("libdav1d")
                                                            : avcodec_find_decoder(par->codec_id);
    AVCodecContext *dec = avcodec_alloc_context3(codec);
    avcodec_parameters_to_context(dec, par);
    dec->thread_count = 1;
    avcodec_open2(dec, codec, NULL);
    AVPacket *pkt = av_packet_alloc();
    AVFrame *frame = av_frame_alloc();
    int got = 0;
    while (!got && av_read_frame(fmt, pkt) >= 0) {
        if (pkt->stream_index == si && avcodec_send_packet(dec, pkt) >= 0)
            got = avcodec_receive_frame(dec, frame) == 0;
        av_packet_unref(pkt);
    }
    if (!got) {
        avcodec_send_packet(dec, NULL);
        got = avcodec_receive_frame(dec, frame) == 0;
    }
    if (!got)
        return fprintf(stderr, "bench_video: no frame decoded\n"), 1;
    int w = frame->width, h = frame->height;
    size_t px = (size_t)w * h;
    uint8_t *hwc = malloc(px * 3), *chw = malloc(px * 3), *chw2 = malloc(px * 3);
    struct SwsContext *to_rgb = sws_getContext(w, h, frame->format, w, h, AV_PIX_FMT_RGB24, SWS_BILINEAR, 0, 0, 0);
    struct SwsContext *to_gbrp = sws_getContext(w, h, frame->format, w, h, AV_PIX_FMT_GBRP, SWS_BILINEAR, 0, 0, 0);
    double t0 = vf_now_seconds(), c0 = cpu_seconds(), t;
    int64_t n = 0;
    do {
        uint8_t *d[4] = {hwc};
        int s[4] = {w * 3};
        sws_scale(to_rgb, (const uint8_t *const *)frame->data, frame->linesize, 0, h, d, s);
        for (size_t i = 0; i < px; i++) {
            chw[i] = hwc[3 * i];
            chw[px + i] = hwc[3 * i + 1];
            chw[2 * px + i] = hwc[3 * i + 2];
        }
        n++;
        t = vf_now_seconds() - t0;
    } while (t < seconds / 4);
    double cpu = cpu_seconds() - c0;
    printf("chw_via_hwc %.1f frames/cpu-s (%.3f ms cpu/frame; scalar de-interleave)\n", n / cpu, 1000.0 * cpu / n);
    t0 = vf_now_seconds();
    c0 = cpu_seconds();
    n = 0;
    do {
        uint8_t *d[4] = {chw2 + px, chw2 + 2 * px, chw2}; /* GBRP planes: G, B, R */
        int s[4] = {w, w, w};
        sws_scale(to_gbrp, (const uint8_t *const *)frame->data, frame->linesize, 0, h, d, s);
        n++;
        t = vf_now_seconds() - t0;
    } while (t < seconds / 4);
    size_t differ = 0;
    for (size_t i = 0; i < px * 3; i++)
        differ += chw[i] != chw2[i];
    cpu = cpu_seconds() - c0;
    printf("chw_via_gbrp %.1f frames/cpu-s (%.3f ms cpu/frame; %.1f%% of values differ from the rgb24 path)\n",
           n / cpu, 1000.0 * cpu / n, 100.0 * (double)differ / (double)(px * 3));
    sws_freeContext(to_rgb);
    sws_freeContext(to_gbrp);
    free(hwc);
    free(chw);
    free(chw2);
    av_frame_free(&frame);
    av_packet_free(&pkt);
    avcodec_free_context(&dec);
    avformat_close_input(&fmt);
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    double seconds = 2.0;
    vf_video_settings vs;
    vf_video_defaults(&vs);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            vs.decode_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            rng_state ^= strtoull(argv[++i], NULL, 10) * 0x2545F4914F6CDD1Dull;
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: bench_video [FILE] [--seconds S] [--threads N] [--seed N]\n");
            return 2;
        } else
            path = argv[i];
    }
    if (!path)
        path = DEFAULT_FILE;
    vf_video_set_ffmpeg_log_level(VF_LOG_ERROR);
    vf_video_index *ix;
    if (vf_video_index_build_file(&ix, path) < 0)
        return die("index");
    printf("file %s\n", path);
    printf("video %s %s %dx%d %lld frames, %lld keyframes, decode threads %d\n", ix->codec_name, ix->pixfmt_name,
           ix->width, ix->height, (long long)ix->frame_count, (long long)ix->keyframe_count, vs.decode_threads);
    vf_video_index_free(ix);
    int rc = 0;
    rc |= bench_sequential(path, &vs, seconds, VF_VIDEO_RGB_HWC_U8, "seq_rgb");
    rc |= bench_sequential(path, &vs, seconds, VF_VIDEO_RGB_CHW_F32, "seq_chw_f32");
    rc |= bench_random(path, &vs, seconds, 0, 0);
    rc |= bench_random(path, &vs, seconds, 1, 0);
    rc |= bench_random(path, &vs, seconds, 0, 64);
    rc |= bench_convert(path, seconds);
    rc |= bench_chw_paths(path, seconds);
    return rc;
}
