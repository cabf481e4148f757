/*
 * hwdecode.c: decoding on NVDEC through FFmpeg's CUDA hwaccel, and the
 * choice of decode device.
 *
 * What it offers the reader (reader.c): a shared CUDA device
 * (vf_video_hwdevice, one av_hwdevice_ctx_create per loader, not per file:
 * a CUDA context costs hundreds of MB of GPU memory), an attempt to open a
 * stream's decoder on it (vf_vid_hw_open) and the download of a decoded
 * surface into host memory (vf_vid_hw_download), repacked from NV12 / P010
 * to the planar layout the CPU decoders output (yuv420p / yuv420p10le),
 * after which the reader's usual swscale path converts it. The repack is
 * not cosmetic: at the source size swscale converts yuv420p with its
 * unscaled converter but NV12 through its scaler, whose chroma
 * interpolation differs (up to ~100 levels at sharp colour edges,
 * test_video_hw), so without it NVDEC frames would not match CPU frames.
 *
 * Invariants:
 *  - An attempt either hands back an opened decoder that has decoded the
 *    stream's first frame on the GPU and copied it to host memory, or
 *    nothing plus a one-line reason without the file's name (the caller
 *    names the file, and logs a reason as a notice once per process). A
 *    failure after avcodec_open2 (AV1 on a GPU without AV1 NVDEC, a profile
 *    NVDEC refuses) shows only when the first frame is decoded, hence the
 *    trial decode.
 *  - The get_format callback accepts AV_PIX_FMT_CUDA only: FFmpeg must not
 *    fall back to its software path silently inside a "GPU" decoder.
 *  - Frame ordinals come from pts through the index, exactly as on the CPU:
 *    nothing here knows which frame is which.
 *
 * Depends on: libavcodec, libavutil's hwcontext (FFmpeg 5.1), demux.c.
 * The test hook VF_TEST_NVDEC (video.h) is read here only.
 */
#include "video/video_internal.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <libavutil/hwcontext.h>

struct vf_video_hwdevice {
    AVBufferRef *cuda;          /* the device, NULL when unavailable */
    int simulate_open_failure;  /* VF_TEST_NVDEC=open-fails */
    char unavailable[224];      /* why there is no device ("" when there is one) */
};

static const char *test_hook(void)
{
    const char *v = getenv("VF_TEST_NVDEC");
    return v && *v ? v : NULL;
}

const char *vf_decode_device_name(vf_decode_device device)
{
    switch (device) {
    case VF_DECODE_DEVICE_DEFAULT: return "default";
    case VF_DECODE_DEVICE_AUTO: return "auto";
    case VF_DECODE_DEVICE_CPU: return "cpu";
    case VF_DECODE_DEVICE_CUDA: return "cuda";
    }
    return NULL;
}

int vf_decode_device_parse(const char *name, vf_decode_device *out)
{
    static const vf_decode_device all[] = {VF_DECODE_DEVICE_DEFAULT, VF_DECODE_DEVICE_AUTO, VF_DECODE_DEVICE_CPU,
                                           VF_DECODE_DEVICE_CUDA};
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (!strcasecmp(name, vf_decode_device_name(all[i]))) {
            *out = all[i];
            return 0;
        }
    return vf_error(VF_EINVAL, "decode_device must be \"auto\", \"cpu\" or \"cuda\", not \"%s\"", name ? name : "");
}

vf_decode_device vf_video_decode_device_resolve(vf_decode_device requested)
{
    if (requested == VF_DECODE_DEVICE_AUTO || requested == VF_DECODE_DEVICE_CPU ||
        requested == VF_DECODE_DEVICE_CUDA)
        return requested;
    const char *value = getenv("VF_DECODE_DEVICE");
    vf_decode_device device;
    if (!value || !*value)
        return VF_DECODE_DEVICE_CPU;
    if (vf_decode_device_parse(value, &device) == 0 && device != VF_DECODE_DEVICE_DEFAULT)
        return device;
    vf_log(VF_LOG_WARN, "VF_DECODE_DEVICE=%s is not \"auto\", \"cpu\" or \"cuda\": videos decode on the CPU", value);
    return VF_DECODE_DEVICE_CPU;
}

/* 1 when the FFmpeg linked at run time was built with CUDA device support. */
static int ffmpeg_has_cuda(void)
{
    for (enum AVHWDeviceType t = av_hwdevice_iterate_types(AV_HWDEVICE_TYPE_NONE); t != AV_HWDEVICE_TYPE_NONE;
         t = av_hwdevice_iterate_types(t))
        if (t == AV_HWDEVICE_TYPE_CUDA)
            return 1;
    return 0;
}

int vf_video_hwdevice_open(vf_video_hwdevice **out)
{
    vf_video_hwdevice *dev = vf_calloc(1, sizeof *dev);
    *out = NULL;
    if (!dev)
        return VF_ENOMEM;
    const char *hook = test_hook();
    if (hook && !strcmp(hook, "absent")) {
        snprintf(dev->unavailable, sizeof dev->unavailable, "no CUDA device (simulated: VF_TEST_NVDEC=absent)");
    } else if (hook && !strcmp(hook, "open-fails")) {
        dev->simulate_open_failure = 1;
    } else {
        /* Without a GPU FFmpeg logs "Cannot load libcuda.so.1"; the reason
         * goes into the handle instead. */
        int level = av_log_get_level();
        av_log_set_level(AV_LOG_QUIET);
        int ar = av_hwdevice_ctx_create(&dev->cuda, AV_HWDEVICE_TYPE_CUDA, NULL, NULL, 0);
        av_log_set_level(level);
        if (ar < 0) {
            char err[128];
            av_strerror(ar, err, sizeof err);
            snprintf(dev->unavailable, sizeof dev->unavailable, "%s (%s)",
                     ffmpeg_has_cuda() ? "no CUDA device" : "the linked FFmpeg was built without CUDA", err);
            dev->cuda = NULL;
        }
    }
    *out = dev;
    return 0;
}

void vf_video_hwdevice_close(vf_video_hwdevice *dev)
{
    if (!dev)
        return;
    av_buffer_unref(&dev->cuda);
    free(dev);
}

const char *vf_video_hwdevice_unavailable(const vf_video_hwdevice *dev)
{
    if (!dev)
        return "no CUDA device opened";
    return dev->unavailable[0] ? dev->unavailable : NULL;
}

/* The decoder FFmpeg can run on CUDA for id (its native decoder: libdav1d,
 * vlafeed's AV1 decoder on the CPU, has no hwaccel), or NULL with why. */
static const AVCodec *cuda_decoder(enum AVCodecID id, char *why, size_t why_size)
{
    const AVCodec *codec = id == AV_CODEC_ID_AV1 ? avcodec_find_decoder_by_name("av1") : avcodec_find_decoder(id);
    const char *name = avcodec_get_name(id);
    if (!codec) {
        snprintf(why, why_size, "the linked FFmpeg has no native %s decoder to run on NVDEC", name);
        return NULL;
    }
    for (int i = 0;; i++) {
        const AVCodecHWConfig *config = avcodec_get_hw_config(codec, i);
        if (!config)
            break;
        if (config->device_type == AV_HWDEVICE_TYPE_CUDA && (config->methods & AV_CODEC_HW_CONFIG_METHOD_HW_DEVICE_CTX))
            return codec;
    }
    snprintf(why, why_size, "the linked FFmpeg has no CUDA hwaccel (NVDEC) for %s", name);
    return NULL;
}

/* Only NVDEC surfaces: a list without AV_PIX_FMT_CUDA means FFmpeg could
 * not start the hwaccel for this stream (codec, profile, size or chroma
 * format the GPU lacks) and would otherwise decode in software. */
static enum AVPixelFormat only_cuda(AVCodecContext *ctx, const enum AVPixelFormat *offered)
{
    (void)ctx;
    for (const enum AVPixelFormat *p = offered; *p != AV_PIX_FMT_NONE; p++)
        if (*p == AV_PIX_FMT_CUDA)
            return AV_PIX_FMT_CUDA;
    return AV_PIX_FMT_NONE;
}

int vf_vid_hw_planar(const AVFrame *semi, AVFrame *planar)
{
    int ten_bit = semi->format == AV_PIX_FMT_P010LE;
    if (semi->format != AV_PIX_FMT_NV12 && !ten_bit)
        return 1;
    av_frame_unref(planar);
    planar->format = ten_bit ? AV_PIX_FMT_YUV420P10LE : AV_PIX_FMT_YUV420P;
    planar->width = semi->width;
    planar->height = semi->height;
    int ar = av_frame_get_buffer(planar, 64);
    if (ar >= 0)
        ar = av_frame_copy_props(planar, semi);
    if (ar < 0) {
        av_frame_unref(planar);
        return VF_ENOMEM;
    }
    int cw = (semi->width + 1) / 2, ch = (semi->height + 1) / 2;
    for (int y = 0; y < semi->height; y++) {
        const uint8_t *from = semi->data[0] + (size_t)y * semi->linesize[0];
        uint8_t *to = planar->data[0] + (size_t)y * planar->linesize[0];
        if (!ten_bit) {
            memcpy(to, from, (size_t)semi->width);
            continue;
        }
        for (int x = 0; x < semi->width; x++) /* P010: the 10 bits are the high ones */
            ((uint16_t *)to)[x] = (uint16_t)(((const uint16_t *)from)[x] >> 6);
    }
    for (int y = 0; y < ch; y++) {
        const uint8_t *from = semi->data[1] + (size_t)y * semi->linesize[1];
        uint8_t *u = planar->data[1] + (size_t)y * planar->linesize[1];
        uint8_t *v = planar->data[2] + (size_t)y * planar->linesize[2];
        for (int x = 0; x < cw; x++) {
            if (ten_bit) {
                ((uint16_t *)u)[x] = (uint16_t)(((const uint16_t *)from)[2 * x] >> 6);
                ((uint16_t *)v)[x] = (uint16_t)(((const uint16_t *)from)[2 * x + 1] >> 6);
            } else {
                u[x] = from[2 * x];
                v[x] = from[2 * x + 1];
            }
        }
    }
    return 0;
}

int vf_vid_hw_download(const AVFrame *surface, AVFrame *host, AVFrame *staging, const char *name)
{
    av_frame_unref(staging);
    int ar = av_hwframe_transfer_data(staging, surface, 0);
    if (ar >= 0)
        ar = av_frame_copy_props(staging, surface);
    if (ar < 0) {
        av_frame_unref(staging);
        return vf_vid_av_error_named(name, ar, "cannot copy an NVDEC frame to host memory");
    }
    int rc = vf_vid_hw_planar(staging, host);
    if (rc == 1) { /* another layout (4:4:4): swscale takes it as it is */
        av_frame_unref(host);
        av_frame_move_ref(host, staging);
        rc = 0;
    }
    av_frame_unref(staging);
    return rc;
}

/* Decodes packets from start_pts until one frame comes out, and copies it
 * to host memory. 0, or an AVERROR (AVERROR_EOF: no frame at all). */
static int trial_decode(vf_vid_demux *d, AVCodecContext *dec, int64_t start_pts)
{
    AVPacket *pkt = av_packet_alloc();
    AVFrame *surface = av_frame_alloc(), *host = av_frame_alloc();
    int ar = pkt && surface && host ? av_seek_frame(d->fmt, d->stream_index, start_pts, AVSEEK_FLAG_BACKWARD)
                                    : AVERROR(ENOMEM);
    /* Enough packets for any reorder delay; a stream that yields no frame
     * in that many is no stream to decode on the GPU either. */
    int got = 0;
    for (int packets = 0; ar >= 0 && packets < 64 + dec->has_b_frames;) {
        ar = avcodec_receive_frame(dec, surface);
        if (ar == 0) {
            got = 1;
            break;
        }
        if (ar != AVERROR(EAGAIN))
            break;
        ar = av_read_frame(d->fmt, pkt);
        if (ar == AVERROR_EOF) {
            ar = avcodec_send_packet(dec, NULL);
            continue;
        }
        if (ar < 0)
            break;
        if (pkt->stream_index == d->stream_index && pkt->size > 0) {
            ar = avcodec_send_packet(dec, pkt);
            packets++;
        }
        av_packet_unref(pkt);
        if (ar == AVERROR(EAGAIN))
            ar = 0;
    }
    if (ar >= 0 && !got)
        ar = AVERROR_INVALIDDATA; /* no frame from the first packets */
    if (ar == 0 && surface->format != AV_PIX_FMT_CUDA)
        ar = AVERROR(ENOSYS); /* a software frame: the hwaccel is not in use */
    if (ar == 0)
        ar = av_hwframe_transfer_data(host, surface, 0);
    avcodec_flush_buffers(dec);
    av_packet_free(&pkt);
    av_frame_free(&surface);
    av_frame_free(&host);
    return ar < 0 ? ar : 0;
}

int vf_vid_hw_open(AVCodecContext **out, vf_vid_demux *d, const vf_video_hwdevice *dev, const vf_video_settings *s,
                   int64_t start_pts, char *why, size_t why_size)
{
    *out = NULL;
    AVCodecParameters *par = d->stream->codecpar;
    const char *codec_name = avcodec_get_name(par->codec_id);
    const char *unavailable = vf_video_hwdevice_unavailable(dev);
    if (unavailable) {
        snprintf(why, why_size, "%s", unavailable);
        return 1;
    }
    const AVCodec *codec = cuda_decoder(par->codec_id, why, why_size);
    if (!codec)
        return 1;
    if (dev->simulate_open_failure) {
        snprintf(why, why_size, "NVDEC could not open the %s decoder (simulated: VF_TEST_NVDEC=open-fails)",
                 codec_name);
        return 1;
    }
    AVCodecContext *dec = avcodec_alloc_context3(codec);
    if (!dec)
        return VF_ENOMEM;
    int ar = avcodec_parameters_to_context(dec, par);
    const char *stage = "configure the decoder for";
    if (ar >= 0) {
        dec->pkt_timebase = d->stream->time_base;
        dec->thread_count = 1; /* the GPU decodes; CPU threads would only add frame delay */
        dec->max_pixels = s->max_pixels;
        dec->get_format = only_cuda;
        dec->hw_device_ctx = av_buffer_ref(dev->cuda);
        ar = dec->hw_device_ctx ? avcodec_open2(dec, codec, NULL) : AVERROR(ENOMEM);
        stage = "open the decoder for";
    }
    if (ar >= 0) {
        /* FFmpeg prints "Failed setup for format cuda" and the like here;
         * the reason goes into why. */
        int level = av_log_get_level();
        av_log_set_level(AV_LOG_QUIET);
        ar = trial_decode(d, dec, start_pts);
        av_log_set_level(level);
        stage = "decode the first frame of";
    }
    if (ar == AVERROR(ENOMEM)) {
        avcodec_free_context(&dec);
        return VF_ENOMEM;
    }
    if (ar < 0) {
        char err[128];
        av_strerror(ar, err, sizeof err);
        snprintf(why, why_size, "NVDEC could not %s %s (%s)%s", stage, codec_name, err,
                 par->codec_id == AV_CODEC_ID_AV1 ? "; A100, H100 and H200 have no AV1 NVDEC" : "");
        avcodec_free_context(&dec);
        return 1;
    }
    *out = dec;
    return 0;
}
