/*
 * test_video_hw.c: the decode device (NVDEC through FFmpeg's CUDA hwaccel)
 * on a machine without a GPU: everything that chooses, falls back and
 * reports runs here; the decode on a GPU itself does not.
 *
 *  - VF_DECODE_DEVICE and the device names: unset -> cpu, a setting wins
 *    over the environment, a bad value -> cpu with a warning;
 *  - the real CUDA device open on this machine: unavailable, with why
 *    (skipped with a note where a device exists);
 *  - AUTO without a device (VF_TEST_NVDEC=absent and the real absence):
 *    H.264 and AV1 open on the CPU, the reason kept, one notice per reason
 *    and process, every frame the right one;
 *  - CUDA without a device: the open fails naming file, camera, codec and
 *    why;
 *  - "device present but the NVDEC open fails" (VF_TEST_NVDEC=open-fails):
 *    AUTO falls back to the CPU decoder (libdav1d for AV1), CUDA fails;
 *  - the cache's hooks: the device chosen per key, every open reported;
 *  - the colour path of the NVDEC frames: software-decoded H.264 pictures
 *    repacked as NV12 (what av_hwframe_transfer_data hands over, NVDEC
 *    being bit-exact), then back to planar by vf_vid_hw_planar as the
 *    download does, convert to exactly the same RGB as the originals; NV12
 *    given to swscale directly would not (measured and printed).
 */
#define _GNU_SOURCE
#include "test_video_helpers.h"
#include "video/video_internal.h"

#define W 96
#define H 64
#define FRAMES 6

/* Reads every frame and checks its identity. */
static void check_frames(vf_video_reader *r, int camera)
{
    uint8_t *buf = malloc(W * H * 3);
    for (int64_t k = 0; k < FRAMES; k++) {
        CHECK_OK(vf_video_read_frame(r, k, NULL, buf));
        CHECK(has_identity(buf, W, H, 0, k, camera));
    }
    free(buf);
}

static void test_names_and_environment(void)
{
    vf_decode_device d = VF_DECODE_DEVICE_DEFAULT;
    CHECK_OK(vf_decode_device_parse("CUDA", &d));
    CHECK_EQ_INT(d, VF_DECODE_DEVICE_CUDA);
    CHECK(!strcmp(vf_decode_device_name(VF_DECODE_DEVICE_AUTO), "auto"));
    CHECK(vf_decode_device_name((vf_decode_device)42) == NULL);
    CHECK_ERR(vf_decode_device_parse("gpu", &d), VF_EINVAL, "\"gpu\"");

    unsetenv("VF_DECODE_DEVICE");
    CHECK_EQ_INT(vf_video_decode_device_resolve(VF_DECODE_DEVICE_DEFAULT), VF_DECODE_DEVICE_CPU);
    setenv("VF_DECODE_DEVICE", "auto", 1);
    CHECK_EQ_INT(vf_video_decode_device_resolve(VF_DECODE_DEVICE_DEFAULT), VF_DECODE_DEVICE_AUTO);
    CHECK_EQ_INT(vf_video_decode_device_resolve(VF_DECODE_DEVICE_CPU), VF_DECODE_DEVICE_CPU);
    setenv("VF_DECODE_DEVICE", "Cuda", 1);
    CHECK_EQ_INT(vf_video_decode_device_resolve(VF_DECODE_DEVICE_DEFAULT), VF_DECODE_DEVICE_CUDA);
    setenv("VF_DECODE_DEVICE", "nvdec", 1);
    char err[512];
    vf_test_capture_stderr_begin();
    vf_decode_device bad = vf_video_decode_device_resolve(VF_DECODE_DEVICE_DEFAULT);
    vf_test_capture_stderr_end(err, sizeof err);
    CHECK_EQ_INT(bad, VF_DECODE_DEVICE_CPU);
    CHECK(strstr(err, "VF_DECODE_DEVICE=nvdec") != NULL);
    unsetenv("VF_DECODE_DEVICE");
}

/* 1 when this machine really has a CUDA device (then the no-device cases
 * use the hook only). */
static int real_device_present(void)
{
    unsetenv("VF_TEST_NVDEC");
    vf_video_hwdevice *dev = NULL;
    CHECK_OK(vf_video_hwdevice_open(&dev));
    const char *why = dev ? vf_video_hwdevice_unavailable(dev) : "";
    int present = why == NULL;
    if (present)
        fprintf(stderr, "note: a CUDA device is present; the real no-device case is skipped\n");
    else
        CHECK(strstr(why, "CUDA") != NULL); /* "no CUDA device (...)" or "...built without CUDA" */
    vf_video_hwdevice_close(dev);
    return present;
}

static void test_no_device(const char *h264, const char *av1, int real_device)
{
    vf_video_settings vs;
    vf_video_defaults(&vs);
    vs.camera = "observation.images.top";
    const char *reason;
    vf_video_reader *r = NULL;
    char err[2048];

    /* AUTO: on the CPU, the reason kept, a notice printed once. */
    setenv("VF_TEST_NVDEC", "absent", 1);
    vs.device = VF_DECODE_DEVICE_AUTO;
    vf_test_capture_stderr_begin();
    int rc = vf_video_open_file(&r, h264, &vs);
    vf_video_reader *again = NULL;
    int rc2 = vf_video_open_file(&again, h264, &vs);
    vf_test_capture_stderr_end(err, sizeof err);
    CHECK_OK(rc);
    CHECK_OK(rc2);
    if (r) {
        CHECK_EQ_INT(vf_video_reader_device(r, &reason), VF_DECODE_DEVICE_CPU);
        CHECK(strstr(reason, "h264: no CUDA device") != NULL);
        check_frames(r, 1);
    }
    char *first = strstr(err, "decode_device auto: no CUDA device");
    CHECK(first != NULL);
    CHECK(first && strstr(first + 1, "decode_device auto: no CUDA device") == NULL); /* once per process */
    vf_video_close(r);
    vf_video_close(again);

    /* AV1 too: libdav1d, as before. */
    CHECK_OK(vf_video_open_file(&r, av1, &vs));
    if (r) {
        CHECK_EQ_INT(vf_video_reader_device(r, &reason), VF_DECODE_DEVICE_CPU);
        CHECK(strstr(reason, "av1: ") == reason);
        check_frames(r, 2);
    }
    vf_video_close(r);

    /* CUDA required: the open fails, naming file, camera, codec and why. */
    vs.device = VF_DECODE_DEVICE_CUDA;
    rc = vf_video_open_file(&r, h264, &vs);
    CHECK_ERR(rc, VF_EUNSUPPORTED, "decode_device cuda: cannot decode h264 on NVDEC: no CUDA device");
    CHECK(strstr(vf_last_error(), h264) && strstr(vf_last_error(), "camera observation.images.top"));
    CHECK(r == NULL);

    /* The same without the hook, on this machine's real FFmpeg. */
    unsetenv("VF_TEST_NVDEC");
    if (!real_device) {
        rc = vf_video_open_file(&r, av1, &vs);
        CHECK_ERR(rc, VF_EUNSUPPORTED, "cannot decode av1 on NVDEC");
        vs.device = VF_DECODE_DEVICE_AUTO;
        vf_test_capture_stderr_begin();
        rc = vf_video_open_file(&r, av1, &vs);
        vf_test_capture_stderr_end(err, sizeof err);
        CHECK_OK(rc);
        if (r)
            CHECK_EQ_INT(vf_video_reader_device(r, NULL), VF_DECODE_DEVICE_CPU);
        vf_video_close(r);
    }

    /* The environment decides when the setting does not. */
    setenv("VF_TEST_NVDEC", "absent", 1);
    setenv("VF_DECODE_DEVICE", "cuda", 1);
    vs.device = VF_DECODE_DEVICE_DEFAULT;
    CHECK_ERR(vf_video_open_file(&r, h264, &vs), VF_EUNSUPPORTED, "decode_device cuda");
    vs.device = VF_DECODE_DEVICE_CPU; /* the setting wins */
    CHECK_OK(vf_video_open_file(&r, h264, &vs));
    if (r) {
        CHECK_EQ_INT(vf_video_reader_device(r, &reason), VF_DECODE_DEVICE_CPU);
        CHECK(!strcmp(reason, "")); /* asked for the CPU: nothing to explain */
    }
    vf_video_close(r);
    unsetenv("VF_DECODE_DEVICE");
    unsetenv("VF_TEST_NVDEC");
}

/* A device that opens, decoders that do not: the fallback path. */
static void test_open_fails(const char *h264, const char *av1)
{
    setenv("VF_TEST_NVDEC", "open-fails", 1);
    vf_video_hwdevice *dev = NULL;
    CHECK_OK(vf_video_hwdevice_open(&dev));
    CHECK(dev && vf_video_hwdevice_unavailable(dev) == NULL);
    vf_video_settings vs;
    vf_video_defaults(&vs);
    vs.hwdevice = dev;
    vs.device = VF_DECODE_DEVICE_AUTO;
    const char *reason;
    vf_video_reader *r = NULL;
    char err[2048];
    vf_test_capture_stderr_begin();
    int rc = vf_video_open_file(&r, h264, &vs);
    int rc_av1 = 0;
    vf_video_reader *r_av1 = NULL;
    rc_av1 = vf_video_open_file(&r_av1, av1, &vs);
    vf_test_capture_stderr_end(err, sizeof err);
    CHECK_OK(rc);
    CHECK_OK(rc_av1);
    CHECK(strstr(err, "NVDEC could not open the h264 decoder (simulated") != NULL);
    if (r) {
        CHECK_EQ_INT(vf_video_reader_device(r, &reason), VF_DECODE_DEVICE_CPU);
        CHECK(strstr(reason, "NVDEC could not open the h264 decoder") != NULL);
        check_frames(r, 1);
    }
    if (r_av1) {
        CHECK_EQ_INT(vf_video_reader_device(r_av1, &reason), VF_DECODE_DEVICE_CPU);
        check_frames(r_av1, 2);
    }
    vf_video_close(r);
    vf_video_close(r_av1);

    vs.device = VF_DECODE_DEVICE_CUDA;
    vs.camera = "observation.images.wrist";
    rc = vf_video_open_file(&r, av1, &vs);
    CHECK_ERR(rc, VF_EUNSUPPORTED, "camera observation.images.wrist: decode_device cuda: cannot decode av1 on NVDEC");
    CHECK(strstr(vf_last_error(), av1) != NULL);
    vf_video_hwdevice_close(dev);
    unsetenv("VF_TEST_NVDEC");
}

typedef struct hook_log {
    const char *cuda_key;      /* the key asked to decode on CUDA */
    int asked, opened_cpu, opened_cuda;
} hook_log;

static vf_decode_device device_for(void *ctx, const char *key)
{
    hook_log *log = ctx;
    log->asked++;
    return strcmp(key, log->cuda_key) ? VF_DECODE_DEVICE_CPU : VF_DECODE_DEVICE_CUDA;
}

static void opened(void *ctx, const char *key, const vf_video_reader *reader)
{
    hook_log *log = ctx;
    (void)key;
    if (vf_video_reader_device(reader, NULL) == VF_DECODE_DEVICE_CUDA)
        log->opened_cuda++;
    else
        log->opened_cpu++;
}

static void test_cache_hooks(const char *h264, const char *av1)
{
    setenv("VF_TEST_NVDEC", "absent", 1);
    hook_log log = {av1, 0, 0, 0};
    vf_video_cache_settings cs;
    vf_video_cache_defaults(&cs);
    cs.device_for = device_for;
    cs.opened = opened;
    cs.hooks_ctx = &log;
    vf_video_cache *cache = NULL;
    CHECK_OK(vf_video_cache_open(&cache, &cs));
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_cache_checkout(cache, h264, &r));
    if (r)
        vf_video_cache_return(cache, r);
    CHECK_ERR(vf_video_cache_checkout(cache, av1, &r), VF_EUNSUPPORTED, "decode_device cuda");
    CHECK_EQ_INT(log.asked, 2);
    CHECK_EQ_INT(log.opened_cpu, 1);
    CHECK_EQ_INT(log.opened_cuda, 0);
    vf_video_cache_close(cache);
    unsetenv("VF_TEST_NVDEC");
}

/* Colourful, smooth content (chroma that matters, unlike the stamps). */
static int colour_fill(void *ctx, int64_t frame, uint8_t *pixels, size_t stride)
{
    const int *size = ctx;
    for (int y = 0; y < size[1]; y++)
        for (int x = 0; x < size[0]; x++) {
            uint8_t *p = pixels + (size_t)y * stride + (size_t)x * 3;
            p[0] = (uint8_t)(x * 255 / size[0]);
            p[1] = (uint8_t)(y * 255 / size[1]);
            p[2] = (uint8_t)((x * 3 + y * 5 + frame * 17) & 255);
        }
    return 0;
}

/* The same picture with chroma interleaved (NV12), as a download gives it. */
static int to_nv12(const AVFrame *yuv, AVFrame *nv12)
{
    nv12->format = AV_PIX_FMT_NV12;
    nv12->width = yuv->width;
    nv12->height = yuv->height;
    if (av_frame_get_buffer(nv12, 0) < 0 || av_frame_copy_props(nv12, yuv) < 0)
        return -1;
    for (int y = 0; y < yuv->height; y++)
        memcpy(nv12->data[0] + (size_t)y * nv12->linesize[0], yuv->data[0] + (size_t)y * yuv->linesize[0],
               (size_t)yuv->width);
    for (int y = 0; y < (yuv->height + 1) / 2; y++)
        for (int x = 0; x < (yuv->width + 1) / 2; x++) {
            nv12->data[1][(size_t)y * nv12->linesize[1] + 2 * x] = yuv->data[1][(size_t)y * yuv->linesize[1] + x];
            nv12->data[1][(size_t)y * nv12->linesize[1] + 2 * x + 1] =
                yuv->data[2][(size_t)y * yuv->linesize[2] + x];
        }
    return 0;
}

/* Largest |RGB(x) - RGB(yuv420p)| over every frame of path, through
 * vf_vid_convert at the source size (scaled: to half size), x being the
 * NV12 repack (repacked: then back to planar by vf_vid_hw_planar). */
static int nv12_difference(const char *path, int scaled, int repacked)
{
    AVFormatContext *fmt = NULL;
    int worst = -1;
    if (avformat_open_input(&fmt, path, NULL, NULL) < 0 || avformat_find_stream_info(fmt, NULL) < 0)
        return -1;
    int si = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    const AVCodec *codec = avcodec_find_decoder(fmt->streams[si]->codecpar->codec_id);
    AVCodecContext *dec = avcodec_alloc_context3(codec);
    avcodec_parameters_to_context(dec, fmt->streams[si]->codecpar);
    avcodec_open2(dec, codec, NULL);
    AVPacket *pkt = av_packet_alloc();
    AVFrame *yuv = av_frame_alloc();
    vf_vid_converter a, b;
    vf_vid_converter_init(&a);
    vf_vid_converter_init(&b);
    int w = dec->width, h = dec->height;
    vf_video_format f = {VF_VIDEO_RGB_HWC_U8, scaled ? w / 2 : 0, scaled ? h / 2 : 0, VF_VIDEO_SCALE_BILINEAR, 0};
    size_t bytes = vf_video_format_bytes(&f, w, h);
    uint8_t *ra = malloc(bytes), *rb = malloc(bytes);
    int eof = 0;
    while (!eof) {
        if (av_read_frame(fmt, pkt) < 0) {
            avcodec_send_packet(dec, NULL);
            eof = 1;
        } else {
            if (pkt->stream_index == si)
                avcodec_send_packet(dec, pkt);
            av_packet_unref(pkt);
        }
        while (avcodec_receive_frame(dec, yuv) == 0) {
            AVFrame *nv12 = av_frame_alloc(), *planar = av_frame_alloc();
            int ok = yuv->format == AV_PIX_FMT_YUV420P && to_nv12(yuv, nv12) == 0;
            if (ok && repacked)
                ok = vf_vid_hw_planar(nv12, planar) == 0 && planar->format == AV_PIX_FMT_YUV420P;
            if (ok && vf_vid_convert(&a, yuv, &f, ra, path) == 0 &&
                vf_vid_convert(&b, repacked ? planar : nv12, &f, rb, path) == 0) {
                worst = worst < 0 ? 0 : worst;
                for (size_t i = 0; i < bytes; i++) {
                    int d = abs((int)ra[i] - (int)rb[i]);
                    worst = d > worst ? d : worst;
                }
            }
            av_frame_free(&nv12);
            av_frame_free(&planar);
            av_frame_unref(yuv);
        }
    }
    free(ra);
    free(rb);
    vf_vid_converter_free(&a);
    vf_vid_converter_free(&b);
    av_frame_free(&yuv);
    av_packet_free(&pkt);
    avcodec_free_context(&dec);
    avformat_close_input(&fmt);
    return worst;
}

/* Also the converter's padded-row path with an av_frame_get_buffer frame:
 * swscale stored past its scratch there before the padding was widened
 * (found by valgrind on this test). */
static void test_nv12_tolerance(const char *dir)
{
    static const int sizes[][2] = {{128, 96}, {100, 76}}; /* swscale's direct and padded-row paths */
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/colour%zu.mp4", dir, i);
        vf_video_encode_settings es;
        vf_video_encode_defaults(&es);
        es.codec = VF_VIDEO_CODEC_H264;
        es.width = sizes[i][0];
        es.height = sizes[i][1];
        es.fps = 30;
        CHECK_OK(vf_video_write_episode(path, &es, 8, colour_fill, (void *)sizes[i]));
        for (int scaled = 0; scaled < 2; scaled++) {
            CHECK_EQ_INT(nv12_difference(path, scaled, 1), 0);
            fprintf(stderr, "note: NV12 given to swscale as it is, %dx%d%s: max abs diff %d from yuv420p\n",
                    sizes[i][0], sizes[i][1], scaled ? " scaled to half" : "", nv12_difference(path, scaled, 0));
        }
    }
}

int main(void)
{
    vf_video_set_ffmpeg_log_level(vf_log_level() >= VF_LOG_DEBUG ? VF_LOG_INFO : -1);
    setenv("SVT_LOG", "1", 0);
    char *dir = vf_test_tmpdir("video-hw");
    char h264[1024], av1[1024];
    snprintf(h264, sizeof h264, "%s/h264.mp4", dir);
    snprintf(av1, sizeof av1, "%s/av1.mp4", dir);
    CHECK_OK(write_stamped(h264, VF_VIDEO_CODEC_H264, W, H, 2, 0, FRAMES, 1));
    CHECK_OK(write_stamped(av1, VF_VIDEO_CODEC_AV1, W, H, 2, 0, FRAMES, 2));
    test_names_and_environment();
    int real_device = real_device_present();
    test_no_device(h264, av1, real_device);
    test_open_fails(h264, av1);
    test_cache_hooks(h264, av1);
    test_nv12_tolerance(dir);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_video_hw");
}
