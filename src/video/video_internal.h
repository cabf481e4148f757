/*
 * video_internal.h: declarations shared by the files of the video layer and
 * nothing else (the layer's interface is video.h). FFmpeg types live here.
 *
 * Pieces:
 *  - vf_vid_demux: an AVFormatContext reading through a vf_source with a
 *    custom AVIOContext (demux.c). The source's own error message survives
 *    FFmpeg's generic error codes through io_error / io_message.
 *  - index building over an open demuxer (index.c).
 *  - the converter: swscale context + scratch, frame -> caller memory
 *    (convert.c).
 */
#ifndef VF_VIDEO_INTERNAL_H
#define VF_VIDEO_INTERNAL_H

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/frame.h>
#include <libswscale/swscale.h>

#include "video/video.h"

/* ---- demux.c ---- */

typedef struct vf_vid_demux {
    vf_source *src;             /* one reference, owned */
    const char *name;           /* the source's name */
    uint64_t pos;               /* AVIO cursor */
    int io_error;               /* last vf_source failure (0 if none) */
    char io_message[256];       /* its message */
    AVIOContext *avio;
    AVFormatContext *fmt;
    int stream_index;
    AVStream *stream;
} vf_vid_demux;

typedef struct vf_vid_demux_options {
    int64_t probe_bytes;        /* <= 0: FFmpeg default */
    int find_stream_info;       /* run avformat_find_stream_info */
} vf_vid_demux_options;

/* Opens src (takes a new reference) and selects the first video stream.
 * On failure d is left closed and the message names the source. */
int vf_vid_demux_open(vf_vid_demux *d, vf_source *src, const vf_vid_demux_options *options);
void vf_vid_demux_close(vf_vid_demux *d);
/* Turns an FFmpeg error into a VF code with a message "<name>: <what>:
 * <reason>"; the reason is the byte source's message when the failure came
 * from it. */
int vf_vid_av_error(const vf_vid_demux *d, int averror, const char *what);
/* The same for callers without a demuxer. */
int vf_vid_av_error_named(const char *name, int averror, const char *what);

/* libdav1d for AV1 (FFmpeg 5.1's native av1 decoder needs hardware),
 * otherwise FFmpeg's default decoder for the id. NULL if absent. */
const AVCodec *vf_vid_find_decoder(enum AVCodecID id);
vf_video_codec vf_vid_codec_from_id(enum AVCodecID id);
vf_video_pixfmt vf_vid_pixfmt_from_av(int av_pix_fmt);

/* ---- index.c ---- */

/* Builds the index of d's stream. Leaves the demuxer at an unknown
 * position (callers seek before decoding). force_packets skips the
 * sample-table path. */
int vf_vid_index_build(vf_vid_demux *d, int force_packets, vf_video_index **out);

/* ---- convert.c ---- */

typedef struct vf_vid_converter {
    struct SwsContext *sws;
    uint8_t *scratch;           /* HWC RGB24 staging for CHW layouts */
    size_t scratch_size;
    float lut[256];             /* v / 255.0f, exact like torch's uint8 / 255 */
    int fma_exact;              /* the FMA float kernel equals lut here (checked at init) */
} vf_vid_converter;

void vf_vid_converter_init(vf_vid_converter *c);
void vf_vid_converter_free(vf_vid_converter *c);
/* Converts a decoded frame into dest in format. name is used in messages. */
int vf_vid_convert(vf_vid_converter *c, const AVFrame *frame, const vf_video_format *format, void *dest,
                   const char *name);
int vf_vid_sws_flags(vf_video_scaler scaler);
/* vf_video_held_convert with the caller's converter (reader.c). */
int vf_vid_held_convert(vf_video_held *held, vf_vid_converter *conv);

/* ---- hwdecode.c ---- */

/* Tries to open d's stream on NVDEC (device dev; settings s for limits):
 * the decoder, then a trial decode of the first frame from start_pts (a
 * keyframe's pts) into host memory. 0: *out is the opened decoder (owned by
 * the caller), the demuxer at an unknown position. 1: not possible, why
 * says so in one line without the file's name. VF_ENOMEM. */
int vf_vid_hw_open(AVCodecContext **out, vf_vid_demux *d, const vf_video_hwdevice *dev, const vf_video_settings *s,
                   int64_t start_pts, char *why, size_t why_size);
/* Copies an NVDEC surface (AV_PIX_FMT_CUDA) into host with the surface's
 * properties (pts, colour): NV12 / P010 repacked as yuv420p / yuv420p10le
 * (what the CPU decoders give swscale), another layout as it is. staging
 * is scratch for the transfer. host and staging are unreferenced first.
 * The message names name. */
int vf_vid_hw_download(const AVFrame *surface, AVFrame *host, AVFrame *staging, const char *name);
/* The planar copy of a semi-planar picture: NV12 -> yuv420p, P010 ->
 * yuv420p10le, properties kept; 0, 1 when semi is neither (planar
 * untouched), VF_ENOMEM. */
int vf_vid_hw_planar(const AVFrame *semi, AVFrame *planar);

#endif
