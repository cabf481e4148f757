/*
 * capabilities.c: which decoders are present (CPU software decoders opened
 * by name, and NVDEC through FFmpeg's CUDA hwdevice), for
 * `vlafeed decode-check` and the benchmark's machine description.
 */
#include <jansson.h>
#include <libavcodec/avcodec.h>
#include <libavutil/hwcontext.h>
#include <libavutil/log.h>

#include "video/video.h"

static json_t *decoder_name(const char *name)
{
    const AVCodec *c = avcodec_find_decoder_by_name(name);
    return c ? json_string(c->name) : json_null();
}

char *vf_video_capabilities_json(void)
{
    json_t *cpu = json_pack("{s:o,s:o,s:o}", "av1", decoder_name("libdav1d"), "h264", decoder_name("h264"), "hevc",
                            decoder_name("hevc"));
    AVBufferRef *device = NULL;
    /* Probing prints "Cannot load libcuda.so.1" on machines without a GPU;
     * the reason goes into the report instead. */
    int level = av_log_get_level();
    av_log_set_level(AV_LOG_QUIET);
    int r = av_hwdevice_ctx_create(&device, AV_HWDEVICE_TYPE_CUDA, NULL, NULL, 0);
    av_log_set_level(level);
    char reason[160];
    if (r >= 0) {
        snprintf(reason, sizeof reason, "CUDA device opened through FFmpeg");
        av_buffer_unref(&device);
    } else {
        char err[96];
        av_strerror(r, err, sizeof err);
        snprintf(reason, sizeof reason, "no CUDA device (%s)", err);
    }
    json_t *nvdec = json_pack("{s:b,s:s,s:{s:o,s:o,s:o},s:s}", "available", r >= 0, "reason", reason, "decoders",
                              "h264", decoder_name("h264_cuvid"), "hevc", decoder_name("hevc_cuvid"), "av1",
                              decoder_name("av1_cuvid"), "note",
                              "A100/H100/H200 have no AV1 NVDEC: AV1 decodes on the CPU there");
    json_t *root = json_pack("{s:o,s:o}", "cpu", cpu, "nvdec", nvdec);
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return text;
}
