/*
 * encode.c: the writing side of the video layer, used by the sample writer
 * (`vlafeed make-sample`): per-episode MP4 encoding, LeRobot's duration
 * helper, and concatenation that reproduces LeRobot's v3 file layout.
 *
 * Encoding follows LeRobot's PyAV path: libsvtav1 (yuv420p, GOP 2, crf 30,
 * preset 12, svtav1-params fast-decode=0) or libx264 / libx265; codec time
 * base 1/fps, pts = frame index; the MP4 muxer turns 1/fps into a track
 * timescale fps * 2^k >= 10000; no faststart (moov after mdat).
 *
 * Politeness: SVT-AV1 creates its threads with SCHED_FIFO priority 99 and
 * falls back to normal threads only when that is refused (EPERM). Run as
 * root it would get real-time threads that can starve a small machine. So
 * while the encoder starts its threads we drop CAP_SYS_NICE from the calling
 * thread's effective set (capabilities are per thread on Linux and are
 * inherited by the threads it creates); the request is then refused and the
 * threads run at normal priority. lp=<threads> and pin=0 cap and unpin them.
 *
 * Concatenation follows FFmpeg's concat demuxer, which LeRobot uses: file i
 * starts at the sum of the previous files' container durations
 * (AVFormatContext.duration, from the MP4 mvhd box in whole milliseconds,
 * rounded up when written), and timestamps are shifted by that offset
 * rescaled to the stream time base. Output has moov first (faststart).
 *
 * Re-encoding (vf_video_transcode, the converter's --codec; declared in
 * lerobotv3/lerobotv3.h): every frame of a file decoded and encoded again
 * with its presentation timestamp unchanged, in the source's time base, and
 * decoded once more to measure the loss against the source frame.
 *
 * Every output is written to "<path>.tmp-XXXXXX" and renamed into place,
 * so a failure never leaves a partial file under the final name.
 */
#define _GNU_SOURCE
#include "video/video_internal.h"

#include <linux/capability.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>

#include "lerobotv3/lerobotv3.h" /* vf_video_transcode's declaration */

void vf_video_encode_defaults(vf_video_encode_settings *s)
{
    memset(s, 0, sizeof *s);
    s->codec = VF_VIDEO_CODEC_AV1;
    s->pixfmt = VF_VIDEO_PIX_YUV420P;
    s->fps = 30;
    s->gop = 2;
    s->crf = 30;
    s->preset = 12;
    s->x26x_preset = NULL;
    s->fast_decode = 0;
    s->threads = 1;
    s->b_frames = -1;
}

/* ---- CAP_SYS_NICE guard ---- */

typedef struct nice_guard {
    int dropped;
} nice_guard;

static void nice_guard_begin(nice_guard *g)
{
    g->dropped = 0;
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) != 0)
        return;
    if (!(data[0].effective & (1u << CAP_SYS_NICE)))
        return; /* already unprivileged: nothing to do */
    data[0].effective &= ~(1u << CAP_SYS_NICE);
    if (syscall(SYS_capset, &hdr, data) == 0)
        g->dropped = 1;
    else
        vf_log(VF_LOG_WARN, "encoder: cannot drop CAP_SYS_NICE; SVT-AV1 threads may run at real-time priority");
}

static void nice_guard_end(nice_guard *g)
{
    if (!g->dropped)
        return;
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) != 0)
        return;
    data[0].effective |= 1u << CAP_SYS_NICE;
    if (syscall(SYS_capset, &hdr, data) != 0)
        vf_log(VF_LOG_WARN, "encoder: could not restore CAP_SYS_NICE on the calling thread");
    g->dropped = 0;
}

/* ---- temporary output names ---- */

/* Creates a fresh file "<path>.tmp-XXXXXX" next to path (same filesystem,
 * so the final rename is atomic); *out is its newly allocated name. */
static int temp_name(const char *path, char **out)
{
    *out = vf_asprintf("%s.tmp-XXXXXX", path);
    if (!*out)
        return VF_ENOMEM;
    int fd = mkstemp(*out);
    if (fd < 0) {
        int e = errno;
        free(*out);
        *out = NULL;
        return vf_error(e == ENOENT ? VF_ENOENT : VF_EIO, "%s: cannot create the output file: %s", path,
                        strerror(e));
    }
    /* mkstemp makes 0600; a dataset file should get the usual 0666 & ~umask. */
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) != 0)
        vf_log(VF_LOG_WARN, "%s: could not set the file mode: %s", *out, strerror(errno));
    close(fd);
    return 0;
}

static int finish_file(const char *tmp, const char *path)
{
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return vf_error(VF_EIO, "%s: cannot move the finished file into place: %s", path, strerror(e));
    }
    return 0;
}

/* ---- writing an episode ---- */

typedef struct encoder {
    const char *path;
    AVFormatContext *oc;
    AVStream *st;
    AVCodecContext *enc;
    AVPacket *pkt;
    int header_written;
    int open;                   /* encoder opened and not yet flushed */
    int64_t frames_sent;
} encoder;

/* Ends an encoder that is being abandoned. libsvtav1 (FFmpeg 5.1 + SVT-AV1
 * 1.4) deadlocks in deinit unless it has seen end-of-stream, and deadlocks
 * on end-of-stream if it never saw a frame. So feed it one blank frame when
 * it has none, then end-of-stream, and discard what comes out (bounded). */
static void abandon_encoder(encoder *e)
{
    if (!e->open)
        return;
    e->open = 0;
    if (e->frames_sent == 0) {
        AVFrame *blank = av_frame_alloc();
        if (!blank)
            return;
        blank->format = e->enc->pix_fmt;
        blank->width = e->enc->width;
        blank->height = e->enc->height;
        int ok = av_frame_get_buffer(blank, 0) == 0;
        if (ok) {
            for (int p = 0; p < 4 && blank->data[p]; p++) {
                int rows = p == 0 ? blank->height : (blank->height + 1) / 2;
                memset(blank->data[p], p == 0 ? 16 : 128, (size_t)blank->linesize[p] * (size_t)rows);
            }
            blank->pts = 0;
            ok = avcodec_send_frame(e->enc, blank) == 0;
        }
        av_frame_free(&blank);
        if (!ok)
            return;
    }
    if (avcodec_send_frame(e->enc, NULL) < 0)
        return;
    AVPacket *pkt = av_packet_alloc();
    if (!pkt)
        return;
    for (int i = 0; i < 100000; i++) {
        if (avcodec_receive_packet(e->enc, pkt) < 0)
            break;
        av_packet_unref(pkt);
    }
    av_packet_free(&pkt);
}

/* Writes the packet the encoder handed out (e->pkt) into the muxer, in the
 * stream's time base, and releases it. */
static int write_packet(encoder *e)
{
    av_packet_rescale_ts(e->pkt, e->enc->time_base, e->st->time_base);
    e->pkt->stream_index = e->st->index;
    int ar = av_interleaved_write_frame(e->oc, e->pkt);
    av_packet_unref(e->pkt);
    return ar < 0 ? vf_vid_av_error_named(e->path, ar, "writing a packet failed") : 0;
}

static int drain_packets(encoder *e)
{
    for (;;) {
        int ar = avcodec_receive_packet(e->enc, e->pkt);
        if (ar == AVERROR(EAGAIN) || ar == AVERROR_EOF)
            return 0;
        if (ar < 0)
            return vf_vid_av_error_named(e->path, ar, "encoding failed");
        if ((ar = write_packet(e)) < 0)
            return ar;
    }
}

static int check_encode_settings(const char *path, const vf_video_encode_settings *s, int64_t num_frames)
{
    if (s->width <= 0 || s->height <= 0 || s->width % 2 || s->height % 2)
        return vf_error(VF_EINVAL, "%s: frame size %dx%d must be positive and even", path, s->width, s->height);
    if (s->fps <= 0 || s->fps > 1000)
        return vf_error(VF_EINVAL, "%s: fps %d out of range", path, s->fps);
    if (num_frames <= 0)
        return vf_error(VF_EINVAL, "%s: an episode needs at least one frame", path);
    if (s->gop <= 0 || s->crf < 0 || s->crf > 63 || s->threads < 1)
        return vf_error(VF_EINVAL, "%s: invalid encoder settings (gop %d, crf %d, threads %d)", path, s->gop, s->crf,
                        s->threads);
    if (s->codec == VF_VIDEO_CODEC_AV1 && (s->width < 64 || s->height < 64))
        return vf_error(VF_EINVAL, "%s: libsvtav1 cannot encode frames smaller than 64x64 pixels (got %dx%d)", path,
                        s->width, s->height);
    if (s->pixfmt == VF_VIDEO_PIX_GRAY12 && s->codec != VF_VIDEO_CODEC_HEVC)
        return vf_error(VF_EINVAL, "%s: gray12le (depth) video is encoded with HEVC only", path);
    if (s->pixfmt != VF_VIDEO_PIX_YUV420P && s->pixfmt != VF_VIDEO_PIX_GRAY12)
        return vf_error(VF_EINVAL, "%s: unsupported output pixel format", path);
    return 0;
}

/* The encoder FFmpeg registers under name, or NULL. VF_ENCODERS_HIDE (a
 * comma-separated list of encoder names, for tests) makes those look absent,
 * so the "encoder missing" path can be tested on a build that has them. */
static const AVCodec *find_encoder(const char *name)
{
    const char *hide = getenv("VF_ENCODERS_HIDE");
    size_t n = strlen(name);
    for (const char *p = hide; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return NULL;
        p = comma ? comma + 1 : p + len;
    }
    return avcodec_find_encoder_by_name(name);
}

static const char *encoder_name(vf_video_codec codec)
{
    return codec == VF_VIDEO_CODEC_AV1    ? "libsvtav1"
           : codec == VF_VIDEO_CODEC_H264 ? "libx264"
           : codec == VF_VIDEO_CODEC_HEVC ? "libx265"
                                          : NULL;
}

static int configure_encoder(encoder *e, const vf_video_encode_settings *s, AVDictionary **opts)
{
    const char *name = encoder_name(s->codec);
    if (!name)
        return vf_error(VF_EUNSUPPORTED, "%s: unsupported codec for encoding", e->path);
    const AVCodec *codec = find_encoder(name);
    if (!codec)
        return vf_error(VF_EUNSUPPORTED, "%s: encoder %s is not available in this FFmpeg build", e->path, name);
    e->enc = avcodec_alloc_context3(codec);
    if (!e->enc)
        return VF_ENOMEM;
    AVCodecContext *c = e->enc;
    c->width = s->width;
    c->height = s->height;
    c->pix_fmt = s->pixfmt == VF_VIDEO_PIX_GRAY12 ? AV_PIX_FMT_GRAY12LE : AV_PIX_FMT_YUV420P;
    c->time_base = (AVRational){1, s->fps};
    c->framerate = (AVRational){s->fps, 1};
    c->gop_size = s->gop;
    c->thread_count = s->threads;
    if (s->b_frames >= 0)
        c->max_b_frames = s->b_frames;
    if (e->oc->oformat->flags & AVFMT_GLOBALHEADER)
        c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;

    char buf[256];
    snprintf(buf, sizeof buf, "%d", s->crf);
    av_dict_set(opts, "crf", buf, 0);
    if (s->codec == VF_VIDEO_CODEC_AV1) {
        if (s->preset >= 0) {
            snprintf(buf, sizeof buf, "%d", s->preset);
            av_dict_set(opts, "preset", buf, 0);
        }
        int fd = s->fast_decode < 0 ? 0 : s->fast_decode > 2 ? 2 : s->fast_decode;
        snprintf(buf, sizeof buf, "fast-decode=%d:lp=%d:pin=0", fd, s->threads);
        av_dict_set(opts, "svtav1-params", buf, 0);
    } else {
        if (s->x26x_preset)
            av_dict_set(opts, "preset", s->x26x_preset, 0);
        if (s->fast_decode > 0)
            av_dict_set(opts, "tune", "fastdecode", 0);
        if (s->codec == VF_VIDEO_CODEC_HEVC) {
            snprintf(buf, sizeof buf, "log-level=error:pools=%d:frame-threads=1%s", s->threads,
                     s->pixfmt == VF_VIDEO_PIX_GRAY12 ? ":lossless=1" : "");
            av_dict_set(opts, "x265-params", buf, 0);
        }
    }
    return 0;
}

/* A frame of the given pixel format and size with its buffers allocated.
 * *frame is set even on failure, for the caller to free. */
static int alloc_frame(AVFrame **frame, int format, int width, int height, const char *path)
{
    AVFrame *f = *frame = av_frame_alloc();
    if (!f)
        return VF_ENOMEM;
    f->format = format;
    f->width = width;
    f->height = height;
    int ar = av_frame_get_buffer(f, 0);
    return ar < 0 ? vf_vid_av_error_named(path, ar, "cannot allocate a frame") : 0;
}

int vf_video_write_episode(const char *path, const vf_video_encode_settings *settings, int64_t num_frames,
                           vf_video_fill_fn fill, void *ctx)
{
    vf_video_encode_settings s;
    if (settings)
        s = *settings;
    else
        vf_video_encode_defaults(&s);
    int rc = check_encode_settings(path, &s, num_frames);
    if (rc < 0)
        return rc;
    if (!fill)
        return vf_error(VF_EINVAL, "%s: no frame callback", path);

    char *tmp;
    rc = temp_name(path, &tmp);
    if (rc < 0)
        return rc;
    encoder e = {.path = path};
    AVDictionary *opts = NULL;
    AVFrame *input = NULL, *yuv = NULL;
    struct SwsContext *sws = NULL;
    int wrote_file = 1; /* the temporary file exists from here on */

    int ar = avformat_alloc_output_context2(&e.oc, NULL, "mp4", tmp);
    if (ar < 0 || !e.oc) {
        rc = vf_vid_av_error_named(path, ar, "cannot create an MP4 muxer");
        goto done;
    }
    rc = configure_encoder(&e, &s, &opts);
    if (rc < 0)
        goto done;
    {
        nice_guard guard;
        nice_guard_begin(&guard);
        ar = avcodec_open2(e.enc, e.enc->codec, &opts);
        nice_guard_end(&guard);
    }
    if (ar < 0) {
        rc = vf_vid_av_error_named(path, ar, "cannot open the encoder");
        goto done;
    }
    e.open = 1;
    if (av_dict_count(opts) > 0) {
        const AVDictionaryEntry *unused = av_dict_get(opts, "", NULL, AV_DICT_IGNORE_SUFFIX);
        vf_log(VF_LOG_WARN, "%s: encoder ignored option %s", path, unused ? unused->key : "?");
    }
    e.st = avformat_new_stream(e.oc, NULL);
    if (!e.st) {
        rc = VF_ENOMEM;
        goto done;
    }
    e.st->time_base = e.enc->time_base;
    e.st->avg_frame_rate = e.enc->framerate;
    ar = avcodec_parameters_from_context(e.st->codecpar, e.enc);
    if (ar < 0) {
        rc = vf_vid_av_error_named(path, ar, "cannot set stream parameters");
        goto done;
    }
    ar = avio_open(&e.oc->pb, tmp, AVIO_FLAG_WRITE);
    if (ar < 0) {
        rc = vf_vid_av_error_named(path, ar, "cannot create the output file");
        if (ar == AVERROR(ENOENT))
            rc = vf_error(VF_ENOENT, "%s: cannot create the output file (missing directory?)", path);
        goto done;
    }
    ar = avformat_write_header(e.oc, NULL);
    if (ar < 0) {
        rc = vf_vid_av_error_named(path, ar, "cannot write the MP4 header");
        goto done;
    }
    e.header_written = 1;
    e.pkt = av_packet_alloc();
    if (!e.pkt) {
        rc = VF_ENOMEM;
        goto done;
    }
    int gray = s.pixfmt == VF_VIDEO_PIX_GRAY12;
    rc = alloc_frame(&input, gray ? AV_PIX_FMT_GRAY12LE : AV_PIX_FMT_RGB24, s.width, s.height, path);
    if (rc < 0)
        goto done;
    if (!gray) {
        rc = alloc_frame(&yuv, AV_PIX_FMT_YUV420P, s.width, s.height, path);
        if (rc < 0)
            goto done;
        sws = sws_getContext(s.width, s.height, AV_PIX_FMT_RGB24, s.width, s.height, AV_PIX_FMT_YUV420P,
                             SWS_BILINEAR, NULL, NULL, NULL);
        if (!sws) {
            rc = vf_error(VF_EUNSUPPORTED, "%s: cannot set up RGB -> yuv420p conversion", path);
            goto done;
        }
    }
    for (int64_t i = 0; i < num_frames; i++) {
        ar = av_frame_make_writable(input);
        if (ar < 0) {
            rc = vf_vid_av_error_named(path, ar, "cannot allocate a frame");
            goto done;
        }
        rc = fill(ctx, i, input->data[0], (size_t)input->linesize[0]);
        if (rc < 0) {
            vf_error_context(rc, "%s: frame %lld", path, (long long)i);
            goto done;
        }
        AVFrame *send = input;
        if (!gray) {
            ar = av_frame_make_writable(yuv);
            if (ar < 0) {
                rc = vf_vid_av_error_named(path, ar, "cannot allocate a frame");
                goto done;
            }
            sws_scale(sws, (const uint8_t *const *)input->data, input->linesize, 0, s.height, yuv->data,
                      yuv->linesize);
            send = yuv;
        }
        send->pts = i;
        ar = avcodec_send_frame(e.enc, send);
        if (ar == 0)
            e.frames_sent++;
        if (ar < 0) {
            rc = vf_vid_av_error_named(path, ar, "encoding failed");
            goto done;
        }
        rc = drain_packets(&e);
        if (rc < 0)
            goto done;
    }
    ar = avcodec_send_frame(e.enc, NULL);
    e.open = 0;
    if (ar < 0 && ar != AVERROR_EOF) {
        rc = vf_vid_av_error_named(path, ar, "encoder flush failed");
        goto done;
    }
    rc = drain_packets(&e);
    if (rc < 0)
        goto done;
    ar = av_write_trailer(e.oc);
    e.header_written = 0;
    if (ar < 0) {
        rc = vf_vid_av_error_named(path, ar, "cannot finish the MP4");
        goto done;
    }
    ar = avio_closep(&e.oc->pb);
    if (ar < 0) {
        rc = vf_vid_av_error_named(path, ar, "cannot close the output file");
        goto done;
    }
    rc = finish_file(tmp, path);
    wrote_file = 0;

done:
    abandon_encoder(&e);
    if (e.header_written)
        av_write_trailer(e.oc);
    if (e.oc) {
        if (e.oc->pb)
            avio_closep(&e.oc->pb);
        avformat_free_context(e.oc);
    }
    if (wrote_file)
        unlink(tmp);
    avcodec_free_context(&e.enc);
    av_packet_free(&e.pkt);
    av_frame_free(&input);
    av_frame_free(&yuv);
    sws_freeContext(sws);
    av_dict_free(&opts);
    free(tmp);
    return rc;
}

/* ---- duration ---- */

int vf_video_stream_duration(const char *path, double *seconds)
{
    *seconds = 0.0;
    vf_source *src;
    int r = vf_source_open_file(&src, path);
    if (r < 0)
        return r;
    vf_vid_demux d;
    vf_vid_demux_options opt = {.probe_bytes = 0, .find_stream_info = 1};
    r = vf_vid_demux_open(&d, src, &opt);
    vf_source_close(src);
    if (r < 0)
        return r;
    if (d.stream->duration != AV_NOPTS_VALUE && d.stream->duration > 0)
        *seconds = (double)d.stream->duration * av_q2d(d.stream->time_base);
    else if (d.fmt->duration != AV_NOPTS_VALUE && d.fmt->duration > 0)
        *seconds = (double)d.fmt->duration / AV_TIME_BASE;
    else
        r = vf_error(VF_ECORRUPT, "%s: video has no duration", path);
    vf_vid_demux_close(&d);
    return r;
}

/* ---- concatenation ---- */

/* stream_durations: 0 places each file at the summed container durations
 * (whole milliseconds: the drift of FFmpeg 5's concat demuxer), 1 at the summed
 * stream durations in the streams' own time base (no drift, as PyAV's current
 * FFmpeg does for LeRobot 0.6's recorder). */
static int concat_files(const char *const *inputs, size_t count, const char *out, int stream_durations)
{
    if (count == 0 || !inputs || !out)
        return vf_error(VF_EINVAL, "concat: no inputs");
    vf_vid_demux *in = vf_calloc(count, sizeof *in);
    if (!in)
        return VF_ENOMEM;
    size_t opened = 0;
    int rc = 0;
    char *tmp = NULL;
    AVFormatContext *oc = NULL;
    AVPacket *pkt = NULL;
    int header_written = 0, wrote_file = 0;

    for (size_t i = 0; i < count; i++) {
        vf_source *src;
        rc = vf_source_open_file(&src, inputs[i]);
        if (rc < 0)
            goto done;
        vf_vid_demux_options opt = {.probe_bytes = 0, .find_stream_info = 1};
        rc = vf_vid_demux_open(&in[i], src, &opt);
        vf_source_close(src);
        if (rc < 0)
            goto done;
        opened = i + 1;
        AVCodecParameters *a = in[0].stream->codecpar, *b = in[i].stream->codecpar;
        if (a->codec_id != b->codec_id || a->width != b->width || a->height != b->height || a->format != b->format)
            {
            rc = vf_error(VF_EINVAL, "concat: %s (%s %dx%d) does not match %s (%s %dx%d)", inputs[i],
                          avcodec_get_name(b->codec_id), b->width, b->height, inputs[0],
                          avcodec_get_name(a->codec_id), a->width, a->height);
            goto done;
        }
        if (in[i].fmt->duration == AV_NOPTS_VALUE || in[i].fmt->duration <= 0) {
            rc = vf_error(VF_ECORRUPT, "concat: %s has no container duration", inputs[i]);
            goto done;
        }
    }

    rc = temp_name(out, &tmp);
    if (rc < 0)
        goto done;
    wrote_file = 1;
    int ar = avformat_alloc_output_context2(&oc, NULL, "mp4", tmp);
    if (ar < 0 || !oc) {
        rc = vf_vid_av_error_named(out, ar, "cannot create an MP4 muxer");
        goto done;
    }
    AVStream *ost = avformat_new_stream(oc, NULL);
    if (!ost) {
        rc = VF_ENOMEM;
        goto done;
    }
    ar = avcodec_parameters_copy(ost->codecpar, in[0].stream->codecpar);
    if (ar < 0) {
        rc = vf_vid_av_error_named(out, ar, "cannot copy stream parameters");
        goto done;
    }
    ost->codecpar->codec_tag = 0;
    ost->time_base = in[0].stream->time_base;
    ost->avg_frame_rate = in[0].stream->avg_frame_rate;
    ar = avio_open(&oc->pb, tmp, AVIO_FLAG_WRITE);
    if (ar < 0) {
        rc = vf_vid_av_error_named(out, ar, "cannot create the output file");
        goto done;
    }
    AVDictionary *mux_opts = NULL;
    av_dict_set(&mux_opts, "movflags", "+faststart", 0);
    ar = avformat_write_header(oc, &mux_opts);
    av_dict_free(&mux_opts);
    if (ar < 0) {
        rc = vf_vid_av_error_named(out, ar, "cannot write the MP4 header");
        goto done;
    }
    header_written = 1;
    pkt = av_packet_alloc();
    if (!pkt) {
        rc = VF_ENOMEM;
        goto done;
    }

    int64_t start_us = 0; /* where the current file begins, concat demuxer style */
    int64_t start_ts = 0; /* the same in the first input's time base (stream_durations) */
    AVRational tb0 = in[0].stream->time_base;
    for (size_t i = 0; i < count; i++) {
        vf_vid_demux *d = &in[i];
        AVRational itb = d->stream->time_base;
        int64_t file_start = d->fmt->start_time != AV_NOPTS_VALUE ? d->fmt->start_time : 0;
        int64_t delta = av_rescale_q(start_us - file_start, AV_TIME_BASE_Q, itb);
        if (stream_durations) {
            if (d->stream->duration == AV_NOPTS_VALUE || d->stream->duration <= 0) {
                rc = vf_error(VF_ECORRUPT, "concat: %s has no stream duration", inputs[i]);
                goto done;
            }
            delta = av_rescale_q(start_ts, tb0, itb) - av_rescale_q(file_start, AV_TIME_BASE_Q, itb);
            start_ts += av_rescale_q(d->stream->duration, itb, tb0);
        }
        for (;;) {
            ar = av_read_frame(d->fmt, pkt);
            if (ar == AVERROR_EOF)
                break;
            if (ar < 0) {
                rc = vf_vid_av_error(d, ar, "cannot read a packet");
                goto done;
            }
            if (pkt->stream_index != d->stream_index) {
                av_packet_unref(pkt);
                continue;
            }
            if (pkt->pts != AV_NOPTS_VALUE)
                pkt->pts += delta;
            if (pkt->dts != AV_NOPTS_VALUE)
                pkt->dts += delta;
            av_packet_rescale_ts(pkt, itb, ost->time_base);
            pkt->stream_index = ost->index;
            pkt->pos = -1;
            ar = av_interleaved_write_frame(oc, pkt);
            av_packet_unref(pkt);
            if (ar < 0) {
                rc = vf_vid_av_error_named(out, ar, "writing a packet failed");
                goto done;
            }
        }
        start_us += d->fmt->duration;
    }
    ar = av_write_trailer(oc);
    header_written = 0;
    if (ar < 0) {
        rc = vf_vid_av_error_named(out, ar, "cannot finish the MP4");
        goto done;
    }
    ar = avio_closep(&oc->pb);
    if (ar < 0) {
        rc = vf_vid_av_error_named(out, ar, "cannot close the output file");
        goto done;
    }
    /* Inputs are closed before the rename so out may replace one of them. */
    for (size_t i = 0; i < opened; i++)
        vf_vid_demux_close(&in[i]);
    opened = 0;
    rc = finish_file(tmp, out);
    wrote_file = 0;

done:
    if (header_written)
        av_write_trailer(oc);
    if (oc) {
        if (oc->pb)
            avio_closep(&oc->pb);
        avformat_free_context(oc);
    }
    if (wrote_file && tmp)
        unlink(tmp);
    av_packet_free(&pkt);
    for (size_t i = 0; i < opened; i++)
        vf_vid_demux_close(&in[i]);
    free(in);
    free(tmp);
    return rc;
}

int vf_video_concat(const char *const *inputs, size_t count, const char *out)
{
    return concat_files(inputs, count, out, 0);
}

int vf_video_concat_exact(const char *const *inputs, size_t count, const char *out)
{
    return concat_files(inputs, count, out, 1);
}

/* ---- re-encoding a whole file (the converter's --codec) ----
 *
 * Pipeline: demux -> decode -> (swscale only when the source is neither
 * yuv420p nor gray12le) -> encode -> mux, plus a check decoder fed the same
 * packets, whose frames are compared with the source frames queued in
 * display order (the queue is bounded by the encoder's delay). Frames keep
 * their pts, in the source stream's time base, which is also the output
 * track's, so timestamps survive to the tick. */

const char *vf_video_encoder_name(vf_video_codec codec)
{
    return encoder_name(codec);
}

int vf_video_encoder_check(vf_video_codec codec)
{
    static const char *const codec_names[] = {"?", "av1", "h264", "hevc", "?"};
    const char *name = encoder_name(codec);
    if (!name)
        return vf_error(VF_EUNSUPPORTED, "no encoder for this codec");
    if (!find_encoder(name))
        return vf_error(VF_EUNSUPPORTED, "encoder %s (for codec %s) is not available in this FFmpeg build",
                        name, codec_names[codec]);
    return 0;
}

double vf_video_transcode_psnr(const vf_video_transcode_report *rep)
{
    if (!rep->measured || rep->samples <= 0)
        return NAN;
    double mse = rep->sum_sq_err / (double)rep->samples;
    return mse > 0 ? 10.0 * log10(255.0 * 255.0 / mse) : INFINITY;
}

typedef struct frame_queue {
    AVFrame **frames;
    size_t head, count, cap;
} frame_queue;

static int queue_push(frame_queue *q, AVFrame *f)
{
    if (q->count == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 16;
        AVFrame **n = vf_malloc_array(cap, sizeof *n);
        if (!n)
            return VF_ENOMEM;
        for (size_t i = 0; i < q->count; i++)
            n[i] = q->frames[(q->head + i) % q->cap];
        free(q->frames);
        q->frames = n;
        q->head = 0;
        q->cap = cap;
    }
    q->frames[(q->head + q->count) % q->cap] = f;
    q->count++;
    return 0;
}

static AVFrame *queue_pop(frame_queue *q)
{
    if (!q->count)
        return NULL;
    AVFrame *f = q->frames[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    return f;
}

static void queue_free(frame_queue *q)
{
    AVFrame *f;
    while ((f = queue_pop(q)))
        av_frame_free(&f);
    free(q->frames);
    memset(q, 0, sizeof *q);
}

typedef struct transcoder {
    encoder e;                  /* output side (e.path: the final path, for messages) */
    const char *src_name;
    AVRational src_tb;
    int64_t frame_duration;     /* one nominal frame in src_tb ticks */
    AVCodecContext *check;      /* decodes the output again; NULL when not measuring */
    AVFrame *check_frame;
    frame_queue pending;        /* source frames awaiting their re-decoded twin */
    int64_t packets;
    vf_video_transcode_report *rep;
} transcoder;

/* Compares a re-decoded frame with the source frame of the same pts. */
static int compare_frames(transcoder *t, const AVFrame *out)
{
    AVFrame *in = queue_pop(&t->pending);
    if (!in)
        return vf_error(VF_ECORRUPT, "%s: the re-encoded stream has more frames than the source", t->e.path);
    int r = 0;
    if (in->pts != out->pts || in->width != out->width || in->height != out->height || out->format != in->format) {
        r = vf_error(VF_ECORRUPT, "%s: re-encoded frame at pts %lld does not match source frame at pts %lld",
                     t->e.path, (long long)out->pts, (long long)in->pts);
    } else {
        double sq = 0, abs_sum = 0;
        int64_t n = 0;
        int mx = 0;
        for (int p = 0; p < 3; p++) {
            int w = p ? (in->width + 1) / 2 : in->width, h = p ? (in->height + 1) / 2 : in->height;
            for (int y = 0; y < h; y++) {
                const uint8_t *a = in->data[p] + (size_t)y * (size_t)in->linesize[p];
                const uint8_t *b = out->data[p] + (size_t)y * (size_t)out->linesize[p];
                int64_t row_sq = 0, row_abs = 0;
                for (int x = 0; x < w; x++) {
                    int d = (int)a[x] - (int)b[x];
                    int ad = d < 0 ? -d : d;
                    row_sq += d * d;
                    row_abs += ad;
                    if (ad > mx)
                        mx = ad;
                }
                sq += (double)row_sq;
                abs_sum += (double)row_abs;
                n += w;
            }
        }
        vf_video_transcode_report *rep = t->rep;
        rep->sum_sq_err += sq;
        rep->sum_abs_err += abs_sum;
        rep->samples += n;
        if (mx > rep->max_abs_diff)
            rep->max_abs_diff = mx;
        double psnr = sq > 0 ? 10.0 * log10(255.0 * 255.0 * (double)n / sq) : INFINITY;
        if (psnr < rep->min_frame_psnr)
            rep->min_frame_psnr = psnr;
    }
    av_frame_free(&in);
    return r;
}

/* Feeds pkt (or NULL: flush) to the check decoder and compares what comes out. */
static int check_packet(transcoder *t, const AVPacket *pkt)
{
    if (!t->check)
        return 0;
    int ar = avcodec_send_packet(t->check, pkt);
    if (ar < 0 && ar != AVERROR_EOF)
        return vf_vid_av_error_named(t->e.path, ar, "decoding the re-encoded stream failed");
    for (;;) {
        ar = avcodec_receive_frame(t->check, t->check_frame);
        if (ar == AVERROR(EAGAIN) || ar == AVERROR_EOF)
            return 0;
        if (ar < 0)
            return vf_vid_av_error_named(t->e.path, ar, "decoding the re-encoded stream failed");
        t->check_frame->pts = t->check_frame->best_effort_timestamp;
        int r = compare_frames(t, t->check_frame);
        av_frame_unref(t->check_frame);
        if (r < 0)
            return r;
    }
}

/* Writes every packet the encoder has ready: pts kept (encoder time base ==
 * source stream time base), nominal duration, then the check decoder. */
static int transcode_drain(transcoder *t)
{
    encoder *e = &t->e;
    for (;;) {
        int ar = avcodec_receive_packet(e->enc, e->pkt);
        if (ar == AVERROR(EAGAIN) || ar == AVERROR_EOF)
            return 0;
        if (ar < 0)
            return vf_vid_av_error_named(e->path, ar, "encoding failed");
        if (e->pkt->duration <= 0)
            e->pkt->duration = t->frame_duration;
        t->packets++;
        int r = check_packet(t, e->pkt);
        if (r < 0) {
            av_packet_unref(e->pkt);
            return r;
        }
        if ((ar = write_packet(e)) < 0)
            return ar;
    }
}

/* Opens the encoder, the muxer (on tmp) and the check decoder once the
 * first frame gives the size and pixel format. */
static int transcode_start(transcoder *t, const vf_video_encode_settings *base, const AVFrame *first,
                           const char *tmp, AVDictionary **opts)
{
    encoder *e = &t->e;
    vf_video_encode_settings s = *base;
    s.width = first->width;
    s.height = first->height;
    s.pixfmt = first->format == AV_PIX_FMT_GRAY12LE ? VF_VIDEO_PIX_GRAY12 : VF_VIDEO_PIX_YUV420P;
    if (s.pixfmt == VF_VIDEO_PIX_GRAY12 && s.codec != VF_VIDEO_CODEC_HEVC)
        return vf_error(VF_EINVAL, "%s: a gray12le (depth) video can only be re-encoded as hevc (lossless)",
                        t->src_name);
    int rc = check_encode_settings(e->path, &s, 1);
    if (rc < 0)
        return rc;
    int ar = avformat_alloc_output_context2(&e->oc, NULL, "mp4", tmp);
    if (ar < 0 || !e->oc)
        return vf_vid_av_error_named(e->path, ar, "cannot create an MP4 muxer");
    if ((rc = configure_encoder(e, &s, opts)) < 0)
        return rc;
    e->enc->time_base = t->src_tb; /* pts pass through unchanged */
    {
        nice_guard guard;
        nice_guard_begin(&guard);
        ar = avcodec_open2(e->enc, e->enc->codec, opts);
        nice_guard_end(&guard);
    }
    if (ar < 0)
        return vf_vid_av_error_named(e->path, ar, "cannot open the encoder");
    e->open = 1;
    if (av_dict_count(*opts) > 0) {
        const AVDictionaryEntry *unused = av_dict_get(*opts, "", NULL, AV_DICT_IGNORE_SUFFIX);
        vf_log(VF_LOG_WARN, "%s: encoder ignored option %s", e->path, unused ? unused->key : "?");
    }
    if (!(e->st = avformat_new_stream(e->oc, NULL)))
        return VF_ENOMEM;
    e->st->time_base = t->src_tb;
    e->st->avg_frame_rate = e->enc->framerate;
    if ((ar = avcodec_parameters_from_context(e->st->codecpar, e->enc)) < 0)
        return vf_vid_av_error_named(e->path, ar, "cannot set stream parameters");
    if ((ar = avio_open(&e->oc->pb, tmp, AVIO_FLAG_WRITE)) < 0)
        return vf_vid_av_error_named(e->path, ar, "cannot create the output file");
    /* moov first, like the joined files */
    AVDictionary *mux = NULL;
    av_dict_set(&mux, "movflags", "+faststart", 0);
    ar = avformat_write_header(e->oc, &mux);
    av_dict_free(&mux);
    if (ar < 0)
        return vf_vid_av_error_named(e->path, ar, "cannot write the MP4 header");
    e->header_written = 1;
    if (!(e->pkt = av_packet_alloc()))
        return VF_ENOMEM;
    if (s.pixfmt == VF_VIDEO_PIX_YUV420P) {
        const AVCodec *dec = vf_vid_find_decoder(e->enc->codec_id);
        if (!dec)
            return vf_error(VF_EUNSUPPORTED, "%s: no decoder for %s to check the re-encoded frames", e->path,
                            e->enc->codec->name);
        if (!(t->check = avcodec_alloc_context3(dec)) || !(t->check_frame = av_frame_alloc()))
            return VF_ENOMEM;
        if ((ar = avcodec_parameters_to_context(t->check, e->st->codecpar)) < 0)
            return vf_vid_av_error_named(e->path, ar, "cannot set up the check decoder");
        t->check->pkt_timebase = t->src_tb;
        t->check->thread_count = 1;
        if ((ar = avcodec_open2(t->check, dec, NULL)) < 0)
            return vf_vid_av_error_named(e->path, ar, "cannot open the check decoder");
        t->rep->measured = 1;
    }
    return 0;
}

/* Sends one decoded source frame (already in the output's pixel format). */
static int transcode_frame(transcoder *t, AVFrame *frame)
{
    if (t->check) {
        AVFrame *keep = av_frame_clone(frame);
        if (!keep || queue_push(&t->pending, keep) < 0) {
            av_frame_free(&keep);
            return VF_ENOMEM;
        }
    }
    frame->pict_type = AV_PICTURE_TYPE_NONE;
    int ar = avcodec_send_frame(t->e.enc, frame);
    if (ar < 0)
        return vf_vid_av_error_named(t->e.path, ar, "encoding failed");
    t->e.frames_sent++;
    return transcode_drain(t);
}

int vf_video_transcode(vf_source *src, const char *path, const vf_video_encode_settings *settings,
                       int64_t expected_frames, vf_video_transcode_frame_fn on_frame, void *ctx,
                       vf_video_transcode_report *rep)
{
    memset(rep, 0, sizeof *rep);
    rep->min_frame_psnr = INFINITY;
    rep->bytes_read = (int64_t)vf_source_size(src);
    vf_vid_demux dm;
    vf_vid_demux_options dopts = {0, 0};
    int rc = vf_vid_demux_open(&dm, src, &dopts);
    if (rc < 0)
        return rc;
    transcoder t;
    memset(&t, 0, sizeof t);
    t.e.path = path;
    t.src_name = dm.name;
    t.src_tb = dm.stream->time_base;
    t.rep = rep;
    int fps = settings->fps > 0 ? settings->fps : 30;
    t.frame_duration = av_rescale_q(1, (AVRational){1, fps}, t.src_tb);
    char *tmp = NULL;
    int wrote_file = 0;
    AVCodecContext *dec = NULL;
    AVPacket *pkt = av_packet_alloc();
    AVFrame *frame = av_frame_alloc(), *yuv = NULL;
    struct SwsContext *sws = NULL;
    AVDictionary *opts = NULL;
    int64_t frames = 0, last_pts = INT64_MIN;
    if (!pkt || !frame) {
        rc = VF_ENOMEM;
        goto done;
    }
    const AVCodec *codec = vf_vid_find_decoder(dm.stream->codecpar->codec_id);
    if (!codec) {
        rc = vf_error(VF_EUNSUPPORTED, "%s: no decoder for codec %s", dm.name,
                      avcodec_get_name(dm.stream->codecpar->codec_id));
        goto done;
    }
    if (!(dec = avcodec_alloc_context3(codec))) {
        rc = VF_ENOMEM;
        goto done;
    }
    int ar = avcodec_parameters_to_context(dec, dm.stream->codecpar);
    dec->pkt_timebase = t.src_tb;
    dec->thread_count = settings->threads > 0 ? settings->threads : 1;
    if (ar >= 0)
        ar = avcodec_open2(dec, codec, NULL);
    if (ar < 0) {
        rc = vf_vid_av_error_named(dm.name, ar, "cannot open the decoder");
        goto done;
    }
    if ((rc = temp_name(path, &tmp)) < 0)
        goto done;
    wrote_file = 1;
    int draining = 0, have_packet = 0;
    while (rc == 0) {
        if (!draining && !have_packet) {
            ar = av_read_frame(dm.fmt, pkt);
            if (ar == AVERROR_EOF) {
                draining = 1;
                ar = avcodec_send_packet(dec, NULL);
                if (ar < 0 && ar != AVERROR_EOF) {
                    rc = vf_vid_av_error(&dm, ar, "decoder flush failed");
                    break;
                }
            } else if (ar < 0) {
                rc = vf_vid_av_error(&dm, ar, "reading a packet failed");
                break;
            } else if (pkt->stream_index != dm.stream_index) {
                av_packet_unref(pkt);
                continue;
            } else {
                have_packet = 1;
            }
        }
        if (have_packet) {
            /* EAGAIN: the decoder wants its frames taken first; the same
             * packet is sent again on the next turn (none is dropped) */
            ar = avcodec_send_packet(dec, pkt);
            if (ar == 0) {
                av_packet_unref(pkt);
                have_packet = 0;
            } else if (ar != AVERROR(EAGAIN)) {
                rc = vf_vid_av_error(&dm, ar, "decoding failed");
                break;
            }
        }
        for (;;) {
            ar = avcodec_receive_frame(dec, frame);
            if (ar == AVERROR(EAGAIN) || ar == AVERROR_EOF)
                break;
            if (ar < 0) {
                rc = vf_vid_av_error(&dm, ar, "decoding failed");
                break;
            }
            int64_t pts = frame->best_effort_timestamp;
            if (pts == AV_NOPTS_VALUE || pts <= last_pts) {
                rc = vf_error(VF_ECORRUPT, "%s: frame %lld has %s timestamp; cannot keep the frame times", dm.name,
                              (long long)frames, pts == AV_NOPTS_VALUE ? "no" : "a non-increasing");
                break;
            }
            last_pts = pts;
            frame->pts = pts;
            if (!t.e.enc && (rc = transcode_start(&t, settings, frame, tmp, &opts)) < 0)
                break;
            AVFrame *send = frame;
            if (frame->format != AV_PIX_FMT_YUV420P && frame->format != AV_PIX_FMT_GRAY12LE) {
                if (!yuv && (rc = alloc_frame(&yuv, AV_PIX_FMT_YUV420P, frame->width, frame->height, path)) < 0)
                    break;
                sws = sws_getCachedContext(sws, frame->width, frame->height, frame->format, yuv->width, yuv->height,
                                           AV_PIX_FMT_YUV420P, SWS_BICUBIC, NULL, NULL, NULL);
                if (!sws || av_frame_make_writable(yuv) < 0) {
                    rc = vf_error(VF_EUNSUPPORTED, "%s: cannot convert %s frames to yuv420p", dm.name,
                                  av_get_pix_fmt_name(frame->format));
                    break;
                }
                sws_scale(sws, (const uint8_t *const *)frame->data, frame->linesize, 0, frame->height, yuv->data,
                          yuv->linesize);
                yuv->pts = pts;
                send = yuv;
            } else if (frame->width != t.e.enc->width || frame->height != t.e.enc->height ||
                       (frame->format == AV_PIX_FMT_GRAY12LE) != (t.e.enc->pix_fmt == AV_PIX_FMT_GRAY12LE)) {
                rc = vf_error(VF_EUNSUPPORTED, "%s: frame %lld changes size or pixel format", dm.name,
                              (long long)frames);
                break;
            }
            rc = transcode_frame(&t, send);
            av_frame_unref(frame);
            frames++;
            if (rc == 0 && on_frame)
                rc = on_frame(ctx, frames);
            if (rc < 0)
                break;
        }
        if (draining && (ar == AVERROR_EOF || rc < 0))
            break;
    }
    if (rc < 0)
        goto done;
    if (frames == 0) {
        rc = vf_error(VF_ECORRUPT, "%s: no video frames", dm.name);
        goto done;
    }
    if (expected_frames > 0 && frames != expected_frames) {
        rc = vf_error(VF_ECORRUPT, "%s: holds %lld frames, expected %lld", dm.name, (long long)frames,
                      (long long)expected_frames);
        goto done;
    }
    ar = avcodec_send_frame(t.e.enc, NULL);
    t.e.open = 0;
    if (ar < 0 && ar != AVERROR_EOF) {
        rc = vf_vid_av_error_named(path, ar, "encoder flush failed");
        goto done;
    }
    if ((rc = transcode_drain(&t)) < 0 || (rc = check_packet(&t, NULL)) < 0)
        goto done;
    if (t.packets != frames) {
        rc = vf_error(VF_ECORRUPT, "%s: the encoder wrote %lld packets for %lld frames", path, (long long)t.packets,
                      (long long)frames);
        goto done;
    }
    if (t.check && t.pending.count) {
        rc = vf_error(VF_ECORRUPT, "%s: %zu re-encoded frames could not be decoded back", path, t.pending.count);
        goto done;
    }
    ar = av_write_trailer(t.e.oc);
    t.e.header_written = 0;
    if (ar < 0) {
        rc = vf_vid_av_error_named(path, ar, "cannot finish the MP4");
        goto done;
    }
    if ((ar = avio_closep(&t.e.oc->pb)) < 0) {
        rc = vf_vid_av_error_named(path, ar, "cannot close the output file");
        goto done;
    }
    struct stat st;
    rep->bytes_written = stat(tmp, &st) == 0 ? (int64_t)st.st_size : 0;
    rep->frames = frames;
    rc = finish_file(tmp, path);
    wrote_file = 0;
done:
    abandon_encoder(&t.e);
    if (t.e.header_written)
        av_write_trailer(t.e.oc);
    if (t.e.oc) {
        if (t.e.oc->pb)
            avio_closep(&t.e.oc->pb);
        avformat_free_context(t.e.oc);
    }
    if (wrote_file)
        unlink(tmp);
    free(tmp);
    avcodec_free_context(&t.e.enc);
    av_packet_free(&t.e.pkt);
    avcodec_free_context(&t.check);
    av_frame_free(&t.check_frame);
    queue_free(&t.pending);
    avcodec_free_context(&dec);
    av_packet_free(&pkt);
    av_frame_free(&frame);
    av_frame_free(&yuv);
    sws_freeContext(sws);
    av_dict_free(&opts);
    vf_vid_demux_close(&dm);
    return rc;
}
