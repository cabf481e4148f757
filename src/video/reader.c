/*
 * reader.c: one file's demuxer + decoder, with random and batched access by
 * frame ordinal.
 *
 * Position tracking: next_ordinal is the ordinal of the next frame the
 * decoder will output, or -1 when unknown (fresh reader, after an error,
 * after draining). To reach a target the reader either keeps decoding
 * forward (when it is already positioned at or before the target and no
 * keyframe worth seeking to lies in between) or seeks to the last keyframe at
 * or before the target, flushes the decoder and decodes forward. Every
 * decoded frame is mapped to its ordinal by pts through the index; frames
 * before the target are dropped, a frame past the target means the target
 * never came out, which is an error (or, right after a seek that landed too
 * late, a retry from an earlier keyframe). Open GOPs: damaged pictures
 * before the target are dropped, and a target that never comes out after a
 * seek onto a non-IDR keyframe (the decoder waits for a recovery point) is
 * retried from earlier keyframes, at last from the first.
 *
 * Bounds: a decode run reads at most frame_count + 64 packets and receives
 * at most as many frames, so corrupt input cannot loop forever.
 *
 * The last decoded frame is kept, so asking again for the same ordinal
 * (delta windows clamp at episode edges) converts it again without decoding.
 *
 * Early drain (settings.early_drain, map mode): decoders with a reorder
 * delay (H.264/HEVC that allow B-frames, x264's default even at GOP 2) hold
 * a decoded picture back until more packets come. For the last target of a
 * read call, once its packet has been sent (its pts is among the last
 * SENT_RING packets since the flush), the reader sends the end-of-stream
 * packet instead of decoding the next ones: the held pictures come out in
 * order, decoded exactly as before, and the packets after the target are
 * never decoded. The position is then unknown (the next call seeks). It is
 * not done while calls follow on from one another (the first target of a
 * call continues the previous call's run: sequential map access), nor when
 * the target did not come out of a drain (then the run is decoded again
 * without it).
 *
 * Non-reference pictures before the target (settings.skip_nonref, map
 * mode): their packets are sent with skip_frame = NONREF, so H.264/HEVC
 * non-reference pictures and MPEG-4 B-VOPs shown before the target are not
 * decoded (and do not come out); no other picture references them.
 *
 * Decode device (settings.device, hwdecode.c): on NVDEC the decoder
 * outputs GPU surfaces; everything above (positioning, pts -> ordinal,
 * retries) is the same code, and a surface is copied to host memory only
 * when it is delivered (frames decoded on the way to a target never are).
 * When NVDEC cannot take the stream, AUTO opens the CPU decoder and keeps
 * the reason; CUDA fails the open.
 */
#include "video/video_internal.h"

#include <stdlib.h>
#include <string.h>

#include <libavutil/pixdesc.h>

/* Packets remembered for the early drain: more than the largest reorder
 * delay (H.264 and HEVC allow 16). */
#define SENT_RING 16

struct vf_video_reader {
    vf_vid_demux demux;
    AVCodecContext *dec;
    AVPacket *pkt;
    AVFrame *frame;             /* the last decoded frame (ordinal frame_ordinal) */
    AVFrame *tmp;
    int64_t frame_ordinal;      /* -1 when frame holds nothing */
    int64_t next_ordinal;       /* -1 when the position is unknown */
    int draining;               /* NULL packet sent: decoder must be flushed before reuse */
    vf_video_index *index;
    vf_vid_converter conv;
    vf_video_settings settings;
    char *camera;
    vf_video_stats stats;
    int debug;                  /* VF_LOG=debug: trace decoded frames and seeks */
    vf_decode_device device;    /* where it decodes: _CPU or _CUDA */
    char device_reason[320];    /* why the CPU although AUTO asked for NVDEC, or "" */
    vf_video_hwdevice *own_hwdevice; /* the device opened for this reader (none was given), or NULL */
    AVFrame *host;              /* NVDEC: `frame` copied to host memory */
    AVFrame *staging;           /* NVDEC: the transfer before the planar repack */
    int64_t host_ordinal;       /* the ordinal host holds, -1 when none */
    /* Early drain (see the top of the file). */
    int64_t drain_target;       /* the ordinal whose reorder delay may be cut, or -1 */
    int64_t last_call_end;      /* the last target of the previous read call, or -1 */
    int64_t sent_pts[SENT_RING]; /* pts of the last packets sent since the flush (a ring) */
    unsigned sent_count;        /* packets sent since the flush */
    int early_drained;          /* the decoder was drained early: position unknown afterwards */
};

void vf_video_defaults(vf_video_settings *s)
{
    memset(s, 0, sizeof *s);
    s->decode_threads = 1;
    s->forward_skip_frames = 0;
    s->probe_bytes = 1 << 20;
    s->max_pixels = (int64_t)8192 * 8192;
}

const vf_video_index *vf_video_reader_index(const vf_video_reader *r) { return r->index; }
const char *vf_video_reader_name(const vf_video_reader *r) { return r->index->name; }

void vf_video_get_stats(const vf_video_reader *r, vf_video_stats *stats) { *stats = r->stats; }

size_t vf_video_reader_memory(const vf_video_reader *r)
{
    const vf_video_index *ix = r->index;
    size_t bytes = sizeof *r + (size_t)ix->frame_count * (sizeof(int64_t) + 1);
    size_t bytes_per_sample = ix->pixfmt == VF_VIDEO_PIX_GRAY12 ? 2 : 1;
    size_t planes = ix->pixfmt == VF_VIDEO_PIX_GRAY12 ? 2 : 3; /* in halves of a luma plane */
    size_t picture = (size_t)ix->width * (size_t)ix->height * bytes_per_sample * planes / 2;
    /* Reference pictures (AV1 keeps up to 8) plus one in flight per thread. */
    bytes += picture * (size_t)(8 + r->settings.decode_threads);
    bytes += r->conv.scratch_size + 64 * 1024 /* AVIO buffer */ + 256 * 1024 /* contexts */;
    return bytes;
}

/* "<file>: camera X" prefix for messages. */
static const char *cam_sep(const vf_video_reader *r) { return r->camera ? ": camera " : ""; }
static const char *cam_name(const vf_video_reader *r) { return r->camera ? r->camera : ""; }

void vf_video_close(vf_video_reader *r)
{
    if (!r)
        return;
    avcodec_free_context(&r->dec);
    av_packet_free(&r->pkt);
    av_frame_free(&r->frame);
    av_frame_free(&r->tmp);
    av_frame_free(&r->host);
    av_frame_free(&r->staging);
    vf_video_hwdevice_close(r->own_hwdevice);
    vf_vid_converter_free(&r->conv);
    vf_video_index_free(r->index);
    vf_vid_demux_close(&r->demux);
    free(r->camera);
    free(r);
}

/* Opens the decoder on NVDEC when the settings ask for it and it works.
 * 0: done (on NVDEC); 1: decode on the CPU (device_reason says why when
 * AUTO asked); < 0: an error (CUDA required and impossible, ENOMEM). */
static int try_nvdec(vf_video_reader *r)
{
    vf_decode_device wanted = vf_video_decode_device_resolve(r->settings.device);
    r->device = VF_DECODE_DEVICE_CPU;
    if (wanted == VF_DECODE_DEVICE_CPU)
        return 1;
    vf_vid_demux *d = &r->demux;
    const vf_video_hwdevice *dev = r->settings.hwdevice;
    if (!dev) {
        if (vf_video_hwdevice_open(&r->own_hwdevice) < 0)
            return VF_ENOMEM;
        dev = r->own_hwdevice;
    }
    int64_t first_key = vf_video_index_keyframe_before(r->index, 0);
    int64_t start_pts = r->index->pts[first_key >= 0 ? first_key : 0];
    char why[sizeof r->device_reason - 64];
    int rc = vf_vid_hw_open(&r->dec, d, dev, &r->settings, start_pts, why, sizeof why);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        r->device = VF_DECODE_DEVICE_CUDA;
        r->host_ordinal = -1;
        r->host = av_frame_alloc();
        r->staging = av_frame_alloc();
        return r->host && r->staging ? 0 : VF_ENOMEM;
    }
    if (wanted == VF_DECODE_DEVICE_CUDA)
        return vf_error(VF_EUNSUPPORTED, "%s%s%s: decode_device cuda: cannot decode %s on NVDEC: %s", d->name,
                        cam_sep(r), cam_name(r), r->index->codec_name, why);
    /* The reason carries no file name, so each one is logged once per
     * process however many files it concerns. */
    vf_log(VF_LOG_WARN, "decode_device auto: %s; decoding on the CPU instead", why);
    snprintf(r->device_reason, sizeof r->device_reason, "%s: %s", r->index->codec_name, why);
    return 1;
}

vf_decode_device vf_video_reader_device(const vf_video_reader *r, const char **reason)
{
    if (reason)
        *reason = r->device_reason;
    return r->device;
}

static int open_decoder(vf_video_reader *r)
{
    vf_vid_demux *d = &r->demux;
    AVCodecParameters *par = d->stream->codecpar;
    const vf_video_index *ix = r->index;
    if (ix->codec == VF_VIDEO_CODEC_UNKNOWN)
        return vf_error(VF_EUNSUPPORTED, "%s%s%s: no decoder for video codec %s in the linked FFmpeg", d->name,
                        cam_sep(r), cam_name(r), ix->codec_name);
    if (par->format >= 0 && ix->pixfmt == VF_VIDEO_PIX_UNKNOWN)
        return vf_error(VF_EUNSUPPORTED, "%s%s%s: pixel format %s cannot be converted to RGB by the linked swscale",
                        d->name, cam_sep(r), cam_name(r), ix->pixfmt_name);
    if (ix->width <= 0 || ix->height <= 0)
        return vf_error(VF_ECORRUPT, "%s: video stream has no valid size (%dx%d)", d->name, ix->width, ix->height);
    if ((int64_t)ix->width * ix->height > r->settings.max_pixels)
        return vf_error(VF_EUNSUPPORTED, "%s: frame size %dx%d exceeds the limit of %lld pixels", d->name, ix->width,
                        ix->height, (long long)r->settings.max_pixels);
    int rc = try_nvdec(r);
    if (rc <= 0)
        return rc;
    const AVCodec *codec = vf_vid_find_decoder(par->codec_id);
    if (!codec)
        return vf_error(VF_EUNSUPPORTED, "%s: no decoder for %s in this FFmpeg build%s", d->name, ix->codec_name,
                        par->codec_id == AV_CODEC_ID_AV1 ? " (libdav1d needed)" : "");
    r->dec = avcodec_alloc_context3(codec);
    if (!r->dec)
        return VF_ENOMEM;
    int ar = avcodec_parameters_to_context(r->dec, par);
    if (ar < 0)
        return vf_vid_av_error(d, ar, "cannot configure the decoder");
    r->dec->pkt_timebase = d->stream->time_base;
    r->dec->thread_count = r->settings.decode_threads;
    r->dec->max_pixels = r->settings.max_pixels;
    /* libdav1d derives its thread pool from thread_count (and, with more than
     * one thread, its frame delay); nothing else to set for it. h264/hevc
     * use frame+slice threads when thread_count > 1. */
    ar = avcodec_open2(r->dec, codec, NULL);
    if (ar < 0)
        return vf_vid_av_error(d, ar, "cannot open the decoder");
    return 0;
}

int vf_video_open(vf_video_reader **out, vf_source *src, const vf_video_settings *settings)
{
    *out = NULL;
    vf_video_reader *r = vf_calloc(1, sizeof *r);
    if (!r)
        return VF_ENOMEM;
    if (settings)
        r->settings = *settings;
    else
        vf_video_defaults(&r->settings);
    if (r->settings.decode_threads < 1)
        r->settings.decode_threads = 1;
    if (r->settings.forward_skip_frames < 0)
        r->settings.forward_skip_frames = 0;
    if (r->settings.max_pixels <= 0)
        r->settings.max_pixels = (int64_t)8192 * 8192;
    if (r->settings.camera) {
        r->camera = vf_strdup(r->settings.camera);
        if (!r->camera) {
            free(r);
            return VF_ENOMEM;
        }
    }
    r->settings.camera = r->camera;
    r->frame_ordinal = -1;
    r->next_ordinal = -1;
    r->drain_target = -1;
    r->last_call_end = -1;
    r->debug = vf_log_level() >= VF_LOG_DEBUG;
    vf_vid_converter_init(&r->conv);
    r->demux.stream_index = -1;

    vf_vid_demux_options opt = {.probe_bytes = r->settings.probe_bytes, .find_stream_info = 1};
    int rc = vf_vid_demux_open(&r->demux, src, &opt);
    if (rc < 0)
        goto fail;
    rc = vf_vid_index_build(&r->demux, 0, &r->index);
    if (rc < 0)
        goto fail;
    rc = open_decoder(r);
    if (rc < 0)
        goto fail;
    r->pkt = av_packet_alloc();
    r->frame = av_frame_alloc();
    r->tmp = av_frame_alloc();
    if (!r->pkt || !r->frame || !r->tmp) {
        rc = VF_ENOMEM;
        goto fail;
    }
    *out = r;
    return 0;
fail:
    if (r->camera && rc != VF_ENOMEM && !strstr(vf_last_error(), r->camera))
        vf_error_context(rc, "camera %s", r->camera);
    vf_video_close(r);
    return rc;
}

int vf_video_open_file(vf_video_reader **out, const char *path, const vf_video_settings *settings)
{
    *out = NULL;
    vf_source *src;
    int r = vf_source_open_file(&src, path);
    if (r < 0) {
        if (settings && settings->camera)
            vf_error_context(r, "camera %s", settings->camera);
        return r;
    }
    r = vf_video_open(out, src, settings);
    vf_source_close(src);
    return r;
}

/* ---- positioning ---- */

static void forget_position(vf_video_reader *r)
{
    r->next_ordinal = -1;
}

static int seek_to(vf_video_reader *r, int64_t key_ordinal)
{
    vf_vid_demux *d = &r->demux;
    const vf_video_index *ix = r->index;
    int64_t ts;
    int flags = AVSEEK_FLAG_BACKWARD;
    if (key_ordinal < 0) {
        /* No keyframe at or before the target: start of the stream. */
        ts = ix->pts[0];
        flags |= AVSEEK_FLAG_ANY;
    } else {
        /* Demuxers seek by presentation time (FFmpeg's mov maps it onto its
         * decode-time sample table itself). */
        ts = ix->pts[key_ordinal];
    }
    avcodec_flush_buffers(r->dec);
    r->draining = 0;
    r->early_drained = 0;
    r->sent_count = 0;
    r->next_ordinal = -1;
    r->stats.seeks++;
    d->io_error = 0;
    if (VF_UNLIKELY(r->debug))
        vf_log(VF_LOG_DEBUG, "%s: seek to keyframe %lld (ts %lld)", d->name, (long long)key_ordinal, (long long)ts);
    int ar = av_seek_frame(d->fmt, d->stream_index, ts, flags);
    if (ar < 0)
        return vf_vid_av_error(d, ar, "seek failed");
    return 0;
}

/* Whether a packet with this pts went to the decoder among the last
 * SENT_RING since the flush (a picture held back by a reorder delay was
 * sent at most the delay, <= 16, packets ago). */
static int target_was_sent(const vf_video_reader *r, int64_t pts)
{
    unsigned n = r->sent_count < SENT_RING ? r->sent_count : SENT_RING;
    for (unsigned i = 0; i < n; i++)
        if (r->sent_pts[(r->sent_count - 1 - i) % SENT_RING] == pts)
            return 1;
    return 0;
}

/* Receives the next decoded frame into r->frame and sets its ordinal.
 * Returns 0, or VF_EOF when the decoder is fully drained, or an error.
 *
 * A frame the decoder flags as damaged is an error only when it is the
 * target or later; before the target it is dropped: right after a seek into
 * an open GOP, the leading pictures that reference the previous GOP come out
 * damaged (or not at all), and they are never the frame asked for, because
 * the seek goes to the last keyframe at or before the target in
 * presentation order and those leading pictures precede that keyframe. */
static int decode_next(vf_video_reader *r, int64_t target, int64_t *packets_left)
{
    vf_vid_demux *d = &r->demux;
    const vf_video_index *ix = r->index;
    for (;;) {
        int ar = avcodec_receive_frame(r->dec, r->tmp);
        if (ar == 0) {
            int64_t pts = r->tmp->pts != AV_NOPTS_VALUE ? r->tmp->pts : r->tmp->best_effort_timestamp;
            int64_t ordinal = pts != AV_NOPTS_VALUE ? vf_video_index_find_pts(ix, pts) : -1;
            if (r->tmp->decode_error_flags || (r->tmp->flags & AV_FRAME_FLAG_CORRUPT)) {
                av_frame_unref(r->tmp);
                if (ordinal >= 0 && ordinal < target) {
                    r->stats.frames_decoded++;
                    continue;
                }
                return vf_error(VF_ECORRUPT, "%s%s%s: decoder reported a damaged frame (frame %lld)", d->name,
                                cam_sep(r), cam_name(r), (long long)(ordinal >= 0 ? ordinal : target));
            }
            if (ordinal < 0) {
                av_frame_unref(r->tmp);
                return vf_error(VF_ECORRUPT, "%s%s%s: decoded frame with pts %lld matches no frame of the index",
                                d->name, cam_sep(r), cam_name(r), (long long)pts);
            }
            av_frame_unref(r->frame);
            av_frame_move_ref(r->frame, r->tmp);
            r->frame_ordinal = ordinal;
            r->host_ordinal = -1;
            r->next_ordinal = ordinal + 1;
            r->stats.frames_decoded++;
            if (VF_UNLIKELY(r->debug))
                vf_log(VF_LOG_DEBUG, "%s: decoded frame %lld (pts %lld)", d->name, (long long)ordinal, (long long)pts);
            return 0;
        }
        if (ar == AVERROR_EOF)
            return VF_EOF;
        if (ar != AVERROR(EAGAIN))
            return vf_vid_av_error(d, ar, "decoding failed");
        if (r->draining)
            return VF_EOF; /* EAGAIN while draining should not happen; end the run */
        /* The decoder wants input. */
        if (target == r->drain_target && target_was_sent(r, ix->pts[target])) {
            /* The target is inside the decoder, held back by its reorder
             * delay: let it out without decoding the packets after it. */
            ar = avcodec_send_packet(r->dec, NULL);
            if (ar < 0 && ar != AVERROR_EOF)
                return vf_vid_av_error(d, ar, "decoder flush failed");
            r->draining = 1;
            r->early_drained = 1;
            continue;
        }
        for (;;) {
            if (*packets_left <= 0)
                return vf_error(VF_ECORRUPT, "%s%s%s: decoder produced no frame after too many packets", d->name,
                                cam_sep(r), cam_name(r));
            (*packets_left)--;
            ar = av_read_frame(d->fmt, r->pkt);
            if (ar == AVERROR_EOF) {
                if (d->io_error < 0)
                    return vf_vid_av_error(d, ar, "read failed");
                ar = avcodec_send_packet(r->dec, NULL);
                r->draining = 1;
                if (ar < 0 && ar != AVERROR_EOF)
                    return vf_vid_av_error(d, ar, "decoder flush failed");
                break;
            }
            if (ar < 0)
                return vf_vid_av_error(d, ar, "cannot read a packet");
            if (r->pkt->stream_index != d->stream_index || r->pkt->size == 0) {
                /* (an empty packet would tell the decoder the stream ended;
                 * the index does not count such packets as frames either) */
                av_packet_unref(r->pkt);
                continue;
            }
            r->stats.packets_read++;
            if (VF_UNLIKELY(r->debug))
                vf_log(VF_LOG_DEBUG, "%s: packet pts %lld dts %lld flags %d", d->name, (long long)r->pkt->pts,
                       (long long)r->pkt->dts, r->pkt->flags);
            if (r->pkt->flags & AV_PKT_FLAG_CORRUPT) {
                av_packet_unref(r->pkt);
                if (d->io_error < 0) /* a short read: the source's own error (HTTP status, ...) is the cause */
                    return vf_vid_av_error(d, AVERROR(EIO), "cannot read a video packet");
                return vf_error(VF_ECORRUPT, "%s%s%s: corrupt (truncated?) video packet", d->name, cam_sep(r),
                                cam_name(r));
            }
            r->sent_pts[r->sent_count++ % SENT_RING] = r->pkt->pts;
            if (r->settings.skip_nonref) {
                /* Set per packet: the decoder reads it while decoding the
                 * packet (within send_packet, nothing being buffered then;
                 * frame threads copy it at submission). */
                enum AVDiscard want = r->pkt->pts != AV_NOPTS_VALUE && r->pkt->pts < ix->pts[target]
                                          ? AVDISCARD_NONREF
                                          : AVDISCARD_DEFAULT;
                r->dec->skip_frame = want;
            }
            ar = avcodec_send_packet(r->dec, r->pkt);
            av_packet_unref(r->pkt);
            if (ar < 0 && ar != AVERROR(EAGAIN))
                return vf_vid_av_error(d, ar, "decoding failed");
            break;
        }
    }
}

/* Leaves r->frame holding frame `target`. */
static int reach(vf_video_reader *r, int64_t target)
{
    const vf_video_index *ix = r->index;
    vf_vid_demux *d = &r->demux;
    if (r->frame_ordinal == target && r->frame->data[0]) {
        r->stats.reused++;
        return 0;
    }
    int64_t key = vf_video_index_keyframe_before(ix, target);
    /* Continuing is allowed while draining too: the frames still inside the
     * decoder (reorder delay at the end of the file) come out without input. */
    int continuing = r->next_ordinal >= 0 && r->next_ordinal <= target &&
                     (key < 0 || r->next_ordinal >= key ||
                      key - r->next_ordinal <= (int64_t)r->settings.forward_skip_frames);
    int rc;
    if (continuing) {
        r->stats.continued++;
    } else {
        rc = seek_to(r, key);
        if (rc < 0)
            goto fail;
    }
    int retries = 0;
    int first_after_seek = !continuing;
    int seeked = !continuing;
    int64_t packets_left = ix->frame_count + 64;
    for (;;) {
        rc = decode_next(r, target, &packets_left);
        if (rc == VF_EOF && r->early_drained) {
            /* The drain ended the run without the target (a decoder that
             * waits for a recovery point): decode the run again, this time
             * through the packets after it. */
            r->drain_target = -1;
            if ((rc = seek_to(r, key)) < 0)
                goto fail;
            packets_left = ix->frame_count + 64;
            first_after_seek = 1;
            seeked = 1;
            continue;
        }
        if (rc == VF_EOF && seeked && key > 0 && retries < 4) {
            /* After a seek to a keyframe that is not an IDR picture (open
             * GOPs), H.264 decoders hold back pictures until a recovery
             * point; near the end of a file that may never come. Start
             * from an earlier keyframe, and at last from the first one. */
            retries++;
            key = retries < 4 ? vf_video_index_keyframe_before(ix, key - 1) : vf_video_index_keyframe_before(ix, 0);
            if ((rc = seek_to(r, key)) < 0)
                goto fail;
            packets_left = ix->frame_count + 64;
            first_after_seek = 1;
            continue;
        }
        if (rc == VF_EOF) {
            rc = vf_error(VF_ECORRUPT, "%s%s%s: frame %lld never came out of the decoder (the file ends early or "
                                       "is damaged)",
                          d->name, cam_sep(r), cam_name(r), (long long)target);
            goto fail;
        }
        if (rc < 0)
            goto fail;
        if (r->frame_ordinal == target) {
            if (r->early_drained) {
                r->stats.early_drains++;
                forget_position(r); /* drained: the next target needs a seek */
            }
            return 0;
        }
        if (r->frame_ordinal > target) {
            if (first_after_seek && retries < 3 && key > 0) {
                /* The seek landed after the target: start from an earlier keyframe. */
                retries++;
                key = vf_video_index_keyframe_before(ix, key - 1);
                rc = seek_to(r, key);
                if (rc < 0)
                    goto fail;
                packets_left = ix->frame_count + 64;
                continue;
            }
            rc = vf_error(VF_ECORRUPT, "%s%s%s: frame %lld was skipped by the decoder (got frame %lld)", d->name,
                          cam_sep(r), cam_name(r), (long long)target, (long long)r->frame_ordinal);
            goto fail;
        }
        first_after_seek = 0;
    }
fail:
    forget_position(r);
    r->frame_ordinal = -1;
    av_frame_unref(r->frame);
    return rc;
}

static int check_format(const vf_video_reader *r, const vf_video_format *format)
{
    if (!format)
        return 0;
    if ((unsigned)format->layout > VF_VIDEO_GRAY_U16 || format->width < 0 || format->height < 0 ||
        (format->width == 0) != (format->height == 0) || (unsigned)format->scaler > VF_VIDEO_SCALE_POINT)
        return vf_error(VF_EINVAL, "%s: invalid output format (layout %d, %dx%d, scaler %d)", r->index->name,
                        (int)format->layout, format->width, format->height, (int)format->scaler);
    return 0;
}

static int deliver(vf_video_reader *r, const vf_video_format *format, void *dest)
{
    /* The caller sized dest from the index's width and height
     * (vf_video_format_bytes), so "source size" means that size even if a
     * decoded picture disagrees with the container (it is then scaled to
     * fit rather than written past the end of dest). */
    vf_video_format resolved;
    if (format)
        resolved = *format;
    else
        vf_video_format_defaults(&resolved);
    if (resolved.width == 0 || resolved.height == 0) {
        resolved.width = r->index->width;
        resolved.height = r->index->height;
    }
    if (VF_UNLIKELY(r->frame->width != r->index->width || r->frame->height != r->index->height))
        vf_log(VF_LOG_WARN, "%s: decoded frame is %dx%d but the container says %dx%d", r->index->name,
               r->frame->width, r->frame->height, r->index->width, r->index->height);
    const AVFrame *picture = r->frame;
    int rc = 0;
    if (r->frame->format == AV_PIX_FMT_CUDA) {
        if (r->host_ordinal != r->frame_ordinal) {
            r->host_ordinal = -1;
            rc = vf_vid_hw_download(r->frame, r->host, r->staging, r->index->name);
            if (rc == 0)
                r->host_ordinal = r->frame_ordinal;
        }
        picture = r->host;
    }
    if (rc == 0)
        rc = vf_vid_convert(&r->conv, picture, &resolved, dest, r->index->name);
    if (rc < 0) {
        if (r->camera)
            vf_error_context(rc, "camera %s", r->camera);
        return rc;
    }
    r->stats.frames_delivered++;
    return 0;
}

/* Called at the start of a read call whose targets span [first, last]:
 * sets drain_target to `last` when early drain is on and this call does
 * not follow on from the previous one (random access), else to -1. */
static void plan_early_drain(vf_video_reader *r, int64_t first, int64_t last)
{
    int64_t prev = r->last_call_end;
    int follows = prev >= 0 && first >= prev &&
                  (first == prev + 1 || vf_video_index_keyframe_before(r->index, first) <= prev);
    r->drain_target = r->settings.early_drain && !follows ? last : -1;
    r->last_call_end = last;
}

int vf_video_read_frame(vf_video_reader *r, int64_t ordinal, const vf_video_format *format, void *dest)
{
    int rc = check_format(r, format);
    if (rc < 0)
        return rc;
    if (ordinal < 0 || ordinal >= r->index->frame_count)
        return vf_error(VF_ERANGE, "%s%s%s: frame %lld out of range (the file has %lld frames)", r->index->name,
                        cam_sep(r), cam_name(r), (long long)ordinal, (long long)r->index->frame_count);
    plan_early_drain(r, ordinal, ordinal);
    rc = reach(r, ordinal);
    r->drain_target = -1;
    if (rc < 0)
        return rc;
    return deliver(r, format, dest);
}

/* Sorts request positions by ordinal, stable (qsort has no context argument
 * in C11 and is not stable; a merge sort needs neither globals nor ties). */
static void sort_positions(const vf_video_request *req, size_t *pos, size_t *tmp, size_t n)
{
    if (n < 2)
        return;
    size_t half = n / 2;
    sort_positions(req, pos, tmp, half);
    sort_positions(req, pos + half, tmp, n - half);
    size_t i = 0, j = half, k = 0;
    while (i < half && j < n) {
        const vf_video_request *a = &req[pos[i]], *b = &req[pos[j]];
        if (b->frame_ordinal < a->frame_ordinal)
            tmp[k++] = pos[j++];
        else
            tmp[k++] = pos[i++];
    }
    while (i < half)
        tmp[k++] = pos[i++];
    while (j < n)
        tmp[k++] = pos[j++];
    memcpy(pos, tmp, n * sizeof *pos);
}

static void name_request(const vf_video_reader *r, const vf_video_request *q, int rc)
{
    if (q->episode >= 0 && q->frame_in_episode >= 0)
        vf_error_context(rc, "episode %lld frame %lld", (long long)q->episode, (long long)q->frame_in_episode);
    else if (q->episode >= 0)
        vf_error_context(rc, "episode %lld", (long long)q->episode);
    (void)r;
}

/* Frames decoded for vf_video_read_frames_held, converted later without the
 * reader: one reference per distinct ordinal (the decoder's picture, not a
 * copy), the destinations in ordinal order. */
/* Decoded pictures one read call keeps for a later conversion, in bytes: the
 * decoder's picture pool grows by what is held, so past this the frames are
 * converted at once (under the caller's lock) instead. 320x180 4:2:0 holds
 * ~380 pictures, 1080p ten. */
#define HELD_MAX_BYTES ((size_t)32 << 20)

struct vf_video_held {
    size_t max_frames;          /* pictures to hold at most (HELD_MAX_BYTES), at least 4 */
    size_t num_frames;          /* pictures held */
    char *name;                 /* the file's name (the reader may be closed before the conversion) */
    char *camera;               /* or NULL */
    vf_video_format format;     /* resolved: width and height set */
    int src_width, src_height;  /* the index's size */
    size_t bytes;               /* per destination */
    size_t num_runs;
    AVFrame **frames;           /* [num_runs]: the picture, or NULL (already delivered, or failed) */
    size_t *run_start, *run_end; /* [num_runs]: each run's [start, end) in dests */
    void **dests;               /* [requests], by ordinal */
    vf_video_request **reqs;    /* [requests], by ordinal: status of a failed conversion */
};

void vf_video_held_free(vf_video_held *h)
{
    if (!h)
        return;
    for (size_t i = 0; h->frames && i < h->num_runs; i++)
        av_frame_free(&h->frames[i]);
    free(h->frames);
    free(h->run_start);
    free(h->run_end);
    free(h->dests);
    free(h->reqs);
    free(h->name);
    free(h->camera);
    free(h);
}

static vf_video_held *held_new(const vf_video_reader *r, const vf_video_format *format, size_t count)
{
    vf_video_held *h = vf_calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->name = vf_strdup(r->index->name);
    h->camera = r->camera ? vf_strdup(r->camera) : NULL;
    h->frames = vf_calloc(count, sizeof *h->frames);
    h->run_start = vf_malloc_array(count, sizeof *h->run_start);
    h->run_end = vf_malloc_array(count, sizeof *h->run_end);
    h->dests = vf_malloc_array(count, sizeof *h->dests);
    h->reqs = vf_malloc_array(count, sizeof *h->reqs);
    if (!h->name || (r->camera && !h->camera) || !h->frames || !h->run_start || !h->run_end || !h->dests || !h->reqs) {
        vf_video_held_free(h);
        return NULL;
    }
    h->format = *format;
    if (h->format.width == 0 || h->format.height == 0) {
        h->format.width = r->index->width;
        h->format.height = r->index->height;
    }
    h->src_width = r->index->width;
    h->src_height = r->index->height;
    h->bytes = vf_video_format_bytes(format, r->index->width, r->index->height);
    /* A picture's planes: 4:2:0 8-bit is 1.5 bytes per pixel; others up to 6 (4:4:4 16-bit). */
    size_t picture = (size_t)VF_MAX(r->index->width, 1) * (size_t)VF_MAX(r->index->height, 1) *
                     (r->index->pixfmt == VF_VIDEO_PIX_YUV420P ? 3 : 12) / 2;
    h->max_frames = VF_MAX(HELD_MAX_BYTES / picture, (size_t)4);
    return h;
}

/* Keeps the reader's current picture for a later conversion (a new
 * reference). A GPU surface is delivered now instead (its download uses
 * the reader's staging frames), and so is a picture past max_frames. */
static int hold(vf_video_reader *r, vf_video_held *h, const vf_video_format *format, void *dest)
{
    if (r->frame->format == AV_PIX_FMT_CUDA || h->num_frames >= h->max_frames)
        return deliver(r, format, dest);
    if (VF_UNLIKELY(r->frame->width != r->index->width || r->frame->height != r->index->height))
        vf_log(VF_LOG_WARN, "%s: decoded frame is %dx%d but the container says %dx%d", r->index->name,
               r->frame->width, r->frame->height, r->index->width, r->index->height);
    AVFrame *f = av_frame_alloc();
    if (!f || av_frame_ref(f, r->frame) < 0) {
        av_frame_free(&f);
        return VF_ENOMEM;
    }
    h->frames[h->num_runs] = f;
    h->num_frames++;
    r->stats.frames_delivered++;
    return 0;
}

/* Serves sorted requests: delivers each run's frame (held NULL) or keeps
 * a reference to it in held. */
static int read_frames(vf_video_reader *r, vf_video_request *requests, size_t count, const vf_video_format *format,
                       vf_video_held *held)
{
    int rc = check_format(r, format);
    if (rc < 0)
        return rc;
    if (count == 0)
        return 0;
    size_t *pos = vf_malloc_array(count, 2 * sizeof *pos);
    if (!pos)
        return VF_ENOMEM;
    for (size_t i = 0; i < count; i++)
        pos[i] = i;
    sort_positions(requests, pos, pos + count, count);

    vf_video_format def;
    if (!format) {
        vf_video_format_defaults(&def);
        format = &def;
    }
    size_t bytes = vf_video_format_bytes(format, r->index->width, r->index->height);
    plan_early_drain(r, requests[pos[0]].frame_ordinal, requests[pos[count - 1]].frame_ordinal);
    int first_error = 0;
    char first_message[512] = "";
    for (size_t i = 0; i < count;) {
        size_t j = i + 1;
        int64_t ordinal = requests[pos[i]].frame_ordinal;
        while (j < count && requests[pos[j]].frame_ordinal == ordinal)
            j++;
        vf_video_request *lead = &requests[pos[i]];
        if (ordinal < 0 || ordinal >= r->index->frame_count)
            rc = vf_error(VF_ERANGE, "%s%s%s: frame %lld out of range (the file has %lld frames)", r->index->name,
                          cam_sep(r), cam_name(r), (long long)ordinal, (long long)r->index->frame_count);
        else
            rc = reach(r, ordinal);
        if (rc == 0)
            rc = held ? hold(r, held, format, lead->dest) : deliver(r, format, lead->dest);
        if (rc == 0 && held) {
            held->run_start[held->num_runs] = i;
            held->run_end[held->num_runs] = j;
            for (size_t k = i; k < j; k++) {
                held->dests[k] = requests[pos[k]].dest;
                held->reqs[k] = &requests[pos[k]];
                if (k > i)
                    r->stats.frames_delivered++;
            }
            held->num_runs++;
        } else if (rc == 0) {
            for (size_t k = i + 1; k < j; k++) {
                vf_video_request *q = &requests[pos[k]];
                if (q->dest != lead->dest)
                    memcpy(q->dest, lead->dest, bytes);
                r->stats.frames_delivered++;
            }
        } else {
            name_request(r, lead, rc);
            if (!first_error) {
                first_error = rc;
                snprintf(first_message, sizeof first_message, "%s", vf_last_error());
            }
        }
        for (size_t k = i; k < j; k++)
            requests[pos[k]].status = rc;
        i = j;
    }
    r->drain_target = -1;
    free(pos);
    if (first_error)
        return vf_error(first_error, "%s", first_message);
    return 0;
}

int vf_video_read_frames(vf_video_reader *r, vf_video_request *requests, size_t count,
                         const vf_video_format *format)
{
    return read_frames(r, requests, count, format, NULL);
}

int vf_video_read_frames_held(vf_video_reader *r, vf_video_request *requests, size_t count,
                              const vf_video_format *format, vf_video_held **held)
{
    *held = NULL;
    vf_video_format def;
    if (!format) {
        vf_video_format_defaults(&def);
        format = &def;
    }
    vf_video_held *h = held_new(r, format, count ? count : 1);
    if (!h)
        return VF_ENOMEM;
    int rc = read_frames(r, requests, count, format, h);
    *held = h; /* the frames that did come out are converted even when some failed */
    return rc;
}

int vf_video_held_convert(vf_video_held *h)
{
    if (!h)
        return 0;
    vf_vid_converter conv;
    vf_vid_converter_init(&conv);
    int rc = vf_vid_held_convert(h, &conv);
    vf_vid_converter_free(&conv);
    return rc;
}

int vf_vid_held_convert(vf_video_held *h, vf_vid_converter *conv)
{
    if (!h)
        return 0;
    int first_error = 0;
    char first_message[512] = "";
    for (size_t i = 0; i < h->num_runs; i++) {
        size_t a = h->run_start[i], b = h->run_end[i];
        int rc = 0;
        if (h->frames[i])
            rc = vf_vid_convert(conv, h->frames[i], &h->format, h->dests[a], h->name);
        av_frame_free(&h->frames[i]);
        if (rc < 0) {
            if (h->camera)
                vf_error_context(rc, "camera %s", h->camera);
            const vf_video_request *q = h->reqs[a];
            if (q->episode >= 0 && q->frame_in_episode >= 0)
                vf_error_context(rc, "episode %lld frame %lld", (long long)q->episode, (long long)q->frame_in_episode);
            if (!first_error) {
                first_error = rc;
                snprintf(first_message, sizeof first_message, "%s", vf_last_error());
            }
            for (size_t k = a; k < b; k++)
                h->reqs[k]->status = rc;
            continue;
        }
        for (size_t k = a + 1; k < b; k++)
            if (h->dests[k] != h->dests[a])
                memcpy(h->dests[k], h->dests[a], h->bytes);
    }
    if (first_error)
        return vf_error(first_error, "%s", first_message);
    return 0;
}
