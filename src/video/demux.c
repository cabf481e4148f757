/*
 * demux.c: libavformat reading through vlafeed's byte sources.
 *
 * A custom AVIOContext whose read and seek callbacks call
 * vf_source_read_upto() at a private cursor, so a local file, a memory
 * buffer or (later) an HTTP range reader all plug in the same way. Only MP4
 * (mov family) and Matroska/WebM demuxers are allowed: anything else is
 * rejected as "not a supported video container" instead of being probed as
 * some raw format.
 *
 * Invariants: the demuxer owns one reference to its source; when a read
 * fails, the source's message is kept (io_message) so the error reported to
 * the caller says what really went wrong rather than FFmpeg's generic EIO.
 */
#include "video/video_internal.h"

#include <string.h>

#include <libavutil/avstring.h>
#include <libavutil/pixdesc.h>

/* Allowed demuxers (names as FFmpeg lists them). */
#define VF_VID_FORMATS "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm"
#define VF_VID_AVIO_BUFFER (64 * 1024)

static int avio_read_cb(void *opaque, uint8_t *buf, int size)
{
    vf_vid_demux *d = opaque;
    if (size <= 0)
        return 0;
    int64_t n = vf_source_read_upto(d->src, d->pos, buf, (size_t)size);
    if (n < 0) {
        d->io_error = (int)n;
        snprintf(d->io_message, sizeof d->io_message, "%s", vf_last_error());
        return AVERROR(EIO);
    }
    if (n == 0)
        return AVERROR_EOF;
    d->pos += (uint64_t)n;
    return (int)n;
}

static int64_t avio_seek_cb(void *opaque, int64_t offset, int whence)
{
    vf_vid_demux *d = opaque;
    uint64_t size = vf_source_size(d->src);
    whence &= ~AVSEEK_FORCE;
    if (whence == AVSEEK_SIZE)
        return (int64_t)size;
    int64_t base;
    switch (whence) {
    case SEEK_SET: base = 0; break;
    case SEEK_CUR: base = (int64_t)d->pos; break;
    case SEEK_END: base = (int64_t)size; break;
    default: return AVERROR(EINVAL);
    }
    if ((offset > 0 && base > INT64_MAX - offset) || base + offset < 0)
        return AVERROR(EINVAL);
    d->pos = (uint64_t)(base + offset);
    return (int64_t)d->pos;
}

int vf_vid_av_error_named(const char *name, int averror, const char *what)
{
    char reason[AV_ERROR_MAX_STRING_SIZE];
    av_strerror(averror, reason, sizeof reason);
    int code;
    if (averror == AVERROR(ENOMEM))
        /* FFmpeg sizes its tables from the file: an allocation that fails
         * while reading one is almost always an absurd count or size in a
         * damaged file, so it is reported as such (naming the file), not as
         * a bare out-of-memory. */
        return vf_error(VF_ECORRUPT, "%s: %s: FFmpeg could not allocate memory for it (a corrupt count or size in "
                        "the file?)", name, what);
    else if (averror == AVERROR(EPERM))
        /* AVERROR(EPERM) is -1, FFmpeg's generic failure (e.g. a seek the
         * container's index cannot serve): errno's "Operation not permitted"
         * would mislead. */
        return vf_error(VF_ECORRUPT, "%s: %s: the container's index cannot serve it (corrupt or inconsistent sample "
                        "table in the moov box?)", name, what);
    else if (averror == AVERROR_INVALIDDATA || averror == AVERROR_EOF || averror == AVERROR(EIO))
        code = VF_ECORRUPT;
    else if (averror == AVERROR_DECODER_NOT_FOUND || averror == AVERROR_DEMUXER_NOT_FOUND ||
             averror == AVERROR_PATCHWELCOME || averror == AVERROR(ENOSYS))
        code = VF_EUNSUPPORTED;
    else if (averror == AVERROR(ENOENT))
        code = VF_ENOENT;
    else
        code = VF_ECORRUPT;
    if (averror == AVERROR_EOF)
        return vf_error(code, "%s: %s: unexpected end of data (truncated file?)", name, what);
    return vf_error(code, "%s: %s: %s", name, what, reason);
}

int vf_vid_av_error(const vf_vid_demux *d, int averror, const char *what)
{
    if (d->io_error < 0)
        return vf_error(d->io_error, "%s: %s: %s", d->name, what, d->io_message);
    return vf_vid_av_error_named(d->name, averror, what);
}

const AVCodec *vf_vid_find_decoder(enum AVCodecID id)
{
    if (id == AV_CODEC_ID_AV1)
        return avcodec_find_decoder_by_name("libdav1d");
    return avcodec_find_decoder(id);
}

vf_video_codec vf_vid_codec_from_id(enum AVCodecID id)
{
    switch (id) {
    case AV_CODEC_ID_AV1: return VF_VIDEO_CODEC_AV1;
    case AV_CODEC_ID_H264: return VF_VIDEO_CODEC_H264;
    case AV_CODEC_ID_HEVC: return VF_VIDEO_CODEC_HEVC;
    case AV_CODEC_ID_NONE: return VF_VIDEO_CODEC_UNKNOWN;
    default: return vf_vid_find_decoder(id) ? VF_VIDEO_CODEC_OTHER : VF_VIDEO_CODEC_UNKNOWN;
    }
}

vf_video_pixfmt vf_vid_pixfmt_from_av(int av_pix_fmt)
{
    switch (av_pix_fmt) {
    case AV_PIX_FMT_YUV420P:
    case AV_PIX_FMT_YUVJ420P: return VF_VIDEO_PIX_YUV420P;
    case AV_PIX_FMT_GRAY12LE: return VF_VIDEO_PIX_GRAY12;
    case AV_PIX_FMT_NONE: return VF_VIDEO_PIX_UNKNOWN;
    default: return sws_isSupportedInput(av_pix_fmt) ? VF_VIDEO_PIX_OTHER : VF_VIDEO_PIX_UNKNOWN;
    }
}

void vf_video_set_ffmpeg_log_level(int level)
{
    int av = level < 0                ? AV_LOG_QUIET
             : level == VF_LOG_ERROR ? AV_LOG_ERROR
             : level == VF_LOG_WARN  ? AV_LOG_WARNING
             : level == VF_LOG_INFO  ? AV_LOG_INFO
                                     : AV_LOG_DEBUG;
    av_log_set_level(av);
}

const char *vf_video_codec_name(vf_video_codec codec)
{
    switch (codec) {
    case VF_VIDEO_CODEC_AV1: return "av1";
    case VF_VIDEO_CODEC_H264: return "h264";
    case VF_VIDEO_CODEC_HEVC: return "hevc";
    case VF_VIDEO_CODEC_OTHER: return "other";
    default: return "unknown";
    }
}

void vf_vid_demux_close(vf_vid_demux *d)
{
    if (d->fmt)
        avformat_close_input(&d->fmt);
    if (d->avio) {
        av_freep(&d->avio->buffer);
        avio_context_free(&d->avio);
    }
    if (d->src)
        vf_source_close(d->src);
    memset(d, 0, sizeof *d);
    d->stream_index = -1;
}

int vf_vid_demux_open(vf_vid_demux *d, vf_source *src, const vf_vid_demux_options *options)
{
    memset(d, 0, sizeof *d);
    d->stream_index = -1;
    d->src = vf_source_ref(src);
    d->name = vf_source_name(src);

    if (vf_source_size(src) == 0) {
        int r = vf_error(VF_ECORRUPT, "%s: empty file (not an MP4)", d->name);
        vf_vid_demux_close(d);
        return r;
    }
    uint8_t *buffer = av_malloc(VF_VID_AVIO_BUFFER);
    if (!buffer) {
        vf_vid_demux_close(d);
        return vf_error(VF_ENOMEM, "%s: out of memory", vf_source_name(src));
    }
    d->avio = avio_alloc_context(buffer, VF_VID_AVIO_BUFFER, 0, d, avio_read_cb, NULL, avio_seek_cb);
    if (!d->avio) {
        av_free(buffer);
        vf_vid_demux_close(d);
        return vf_error(VF_ENOMEM, "%s: out of memory", vf_source_name(src));
    }
    d->fmt = avformat_alloc_context();
    if (!d->fmt) {
        vf_vid_demux_close(d);
        return vf_error(VF_ENOMEM, "%s: out of memory", vf_source_name(src));
    }
    d->fmt->pb = d->avio;
    d->fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
    d->fmt->format_whitelist = av_strdup(VF_VID_FORMATS);
    if (options && options->probe_bytes > 0)
        d->fmt->probesize = options->probe_bytes;

    int ar = avformat_open_input(&d->fmt, d->name, NULL, NULL);
    if (ar < 0) {
        /* avformat_open_input freed fmt on failure. */
        int r;
        if (d->io_error < 0)
            r = vf_vid_av_error(d, ar, "cannot open");
        else if (ar == AVERROR_INVALIDDATA)
            r = vf_error(VF_ECORRUPT, "%s: not a supported video container (MP4 or Matroska expected) or "
                                      "corrupt header",
                         d->name);
        else
            r = vf_vid_av_error(d, ar, "cannot open container");
        vf_vid_demux_close(d);
        return r;
    }

    if (d->io_error < 0) {
        /* The container parser may have carried on with what it had. */
        int r = vf_vid_av_error(d, AVERROR(EIO), "cannot read the container");
        vf_vid_demux_close(d);
        return r;
    }
    int si = av_find_best_stream(d->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    if (si < 0) {
        int r = vf_error(VF_ECORRUPT, "%s: no video stream", d->name);
        vf_vid_demux_close(d);
        return r;
    }
    for (unsigned i = 0; i < d->fmt->nb_streams; i++)
        d->fmt->streams[i]->discard = (int)i == si ? AVDISCARD_DEFAULT : AVDISCARD_ALL;
    d->stream_index = si;
    d->stream = d->fmt->streams[si];

    if (options && options->find_stream_info) {
        /* Probe with the decoder we will use: FFmpeg 5.1's native av1
         * decoder produces nothing without hardware, which would make the
         * probe read far into the file looking for a picture. */
        if (d->stream->codecpar->codec_id == AV_CODEC_ID_AV1)
            d->fmt->video_codec = vf_vid_find_decoder(AV_CODEC_ID_AV1);
        ar = avformat_find_stream_info(d->fmt, NULL);
        if (ar >= 0 && d->io_error < 0)
            ar = AVERROR(EIO);
        if (ar < 0) {
            int r = vf_vid_av_error(d, ar, "cannot read stream parameters");
            vf_vid_demux_close(d);
            return r;
        }
    }
    return 0;
}
