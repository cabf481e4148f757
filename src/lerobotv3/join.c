/*
 * join.c: packs per-episode MP4s into one multi-episode MP4 by stream copy
 * (libavformat remux; see lerobotv3.h for the invariants).
 *
 * Why not FFmpeg's concat demuxer (what LeRobot uses): it places each file
 * at the previous file's container duration, which the MP4 muxer rounds up
 * to whole milliseconds, so the real pts drift away from the metadata
 * timestamps (lerobot-format.md §3.4). Here every episode is placed at the
 * exact end of the previous one's last frame in the output time base, and
 * the timestamps reported are those of the written packets.
 *
 * An episode's packets are read whole before any is written (episode MP4s
 * are small), so a corrupt or short source leaves the output untouched.
 *
 * Reading goes through the video layer's demuxer over a vf_source (local
 * files and URLs alike); video_internal.h is included for that one type.
 */
#include "lerobotv3/lerobotv3.h"

#include <string.h>
#include <unistd.h>

#include "video/video_internal.h"

struct vf_lr3_join {
    char *path;
    AVFormatContext *fmt;
    AVStream *stream;
    AVCodecParameters *params;  /* of the first episode (the file's) */
    AVRational src_time_base;   /* of the first episode */
    int header_written;
    int episodes;
    int64_t end_ticks;          /* output time base: end of the last frame written */
    int64_t last_dts;
    int64_t packets;
};

int vf_lr3_join_open(vf_lr3_join **out, const char *path)
{
    *out = NULL;
    vf_lr3_join *j = vf_calloc(1, sizeof *j);
    if (!j || !(j->path = vf_strdup(path))) {
        free(j);
        return VF_ENOMEM;
    }
    int r = avformat_alloc_output_context2(&j->fmt, NULL, "mp4", path);
    if (r < 0 || !j->fmt) {
        free(j->path);
        free(j);
        return vf_vid_av_error_named(path, r < 0 ? r : AVERROR(ENOMEM), "cannot create MP4 muxer");
    }
    r = avio_open(&j->fmt->pb, path, AVIO_FLAG_WRITE);
    if (r < 0) {
        avformat_free_context(j->fmt);
        free(j->path);
        free(j);
        return vf_vid_av_error_named(path, r, "cannot create file");
    }
    j->last_dts = INT64_MIN;
    *out = j;
    return 0;
}

static int same_params(const AVCodecParameters *a, const AVCodecParameters *b)
{
    if (a->codec_id != b->codec_id || a->width != b->width || a->height != b->height)
        return 0;
    if (a->extradata_size != b->extradata_size)
        return 0;
    return a->extradata_size == 0 || !memcmp(a->extradata, b->extradata, (size_t)a->extradata_size);
}

typedef struct packet_list {
    AVPacket **items;
    size_t count, cap;
} packet_list;

static void packet_list_free(packet_list *l)
{
    for (size_t i = 0; i < l->count; i++)
        av_packet_free(&l->items[i]);
    free(l->items);
    memset(l, 0, sizeof *l);
}

static int packet_list_push(packet_list *l, AVPacket *p)
{
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        AVPacket **items = vf_realloc(l->items, cap * sizeof *items);
        if (!items)
            return VF_ENOMEM;
        l->items = items;
        l->cap = cap;
    }
    l->items[l->count++] = p;
    return 0;
}

/* Reads every packet of the demuxer's video stream, with pts, dts and
 * duration filled (duration from the next pts when the container has none). */
static int read_packets(vf_vid_demux *d, packet_list *out)
{
    for (;;) {
        AVPacket *p = av_packet_alloc();
        if (!p)
            return VF_ENOMEM;
        int r = av_read_frame(d->fmt, p);
        if (r == AVERROR_EOF) {
            av_packet_free(&p);
            break;
        }
        if (r < 0) {
            av_packet_free(&p);
            return vf_vid_av_error(d, r, "cannot read packet");
        }
        if (p->stream_index != d->stream_index) {
            av_packet_free(&p);
            continue;
        }
        if (p->pts == AV_NOPTS_VALUE || p->dts == AV_NOPTS_VALUE) {
            av_packet_free(&p);
            return vf_error(VF_ECORRUPT, "%s: packet %zu has no timestamp", d->name, out->count);
        }
        if ((r = packet_list_push(out, p)) < 0) {
            av_packet_free(&p);
            return r;
        }
    }
    /* Fill missing durations from the presentation order. */
    for (size_t i = 0; i < out->count; i++) {
        AVPacket *p = out->items[i];
        if (p->duration > 0)
            continue;
        int64_t next = INT64_MAX;
        for (size_t k = 0; k < out->count; k++)
            if (out->items[k]->pts > p->pts && out->items[k]->pts < next)
                next = out->items[k]->pts;
        if (next == INT64_MAX)
            return vf_error(VF_ECORRUPT, "%s: the last frame has no duration; cannot place the next episode",
                            d->name);
        p->duration = next - p->pts;
    }
    return 0;
}

static int write_header(vf_lr3_join *j, const vf_vid_demux *d)
{
    j->stream = avformat_new_stream(j->fmt, NULL);
    if (!j->stream)
        return vf_error(VF_ENOMEM, "%s: cannot add stream", j->path);
    int r = avcodec_parameters_copy(j->stream->codecpar, d->stream->codecpar);
    if (r < 0)
        return vf_vid_av_error_named(j->path, r, "cannot copy codec parameters");
    j->stream->codecpar->codec_tag = 0;
    j->stream->time_base = d->stream->time_base;
    j->params = avcodec_parameters_alloc();
    if (!j->params || avcodec_parameters_copy(j->params, d->stream->codecpar) < 0)
        return vf_error(VF_ENOMEM, "%s: out of memory", j->path);
    j->src_time_base = d->stream->time_base;
    AVDictionary *opts = NULL;
    av_dict_set(&opts, "movflags", "faststart", 0);
    r = avformat_write_header(j->fmt, &opts);
    av_dict_free(&opts);
    if (r < 0)
        return vf_vid_av_error_named(j->path, r, "cannot write MP4 header");
    j->header_written = 1;
    return 0;
}

int vf_lr3_join_append(vf_lr3_join *j, vf_source *src, int64_t expected_frames, vf_lr3_appended *res)
{
    memset(res, 0, sizeof *res);
    res->bytes_read = (int64_t)vf_source_size(src);
    vf_vid_demux d;
    vf_vid_demux_options opts = {0, 0};
    int r = vf_vid_demux_open(&d, src, &opts);
    if (r < 0)
        return r;
    packet_list packets = {0};
    if (j->params && !same_params(j->params, d.stream->codecpar)) {
        r = VF_LR3_INCOMPATIBLE;
        goto done;
    }
    if ((r = read_packets(&d, &packets)) < 0)
        goto done;
    if (packets.count == 0) {
        r = vf_error(VF_ECORRUPT, "%s: no video packets", d.name);
        goto done;
    }
    if (expected_frames > 0 && (int64_t)packets.count != expected_frames) {
        r = vf_error(VF_ECORRUPT, "%s: holds %zu frames, but the episode has %lld rows", d.name, packets.count,
                     (long long)expected_frames);
        goto done;
    }
    if (!j->header_written && (r = write_header(j, &d)) < 0)
        goto done;
    AVRational in_tb = d.stream->time_base, out_tb = j->stream->time_base;
    int64_t first_pts = INT64_MAX, end = INT64_MIN;
    for (size_t i = 0; i < packets.count; i++) {
        av_packet_rescale_ts(packets.items[i], in_tb, out_tb);
        AVPacket *p = packets.items[i];
        if (p->pts < first_pts)
            first_pts = p->pts;
        if (p->pts + p->duration > end)
            end = p->pts + p->duration;
    }
    int64_t shift = j->end_ticks - first_pts;
    for (size_t i = 0; i < packets.count; i++) {
        AVPacket *p = packets.items[i];
        p->pts += shift;
        p->dts += shift;
        if (j->last_dts != INT64_MIN && p->dts <= j->last_dts) {
            r = vf_error(VF_EUNSUPPORTED,
                         "%s: packet %zu would decode before the previous episode's last frame (dts %lld <= %lld); "
                         "streams with this much frame reordering cannot be joined",
                         d.name, i, (long long)p->dts, (long long)j->last_dts);
            goto done;
        }
    }
    for (size_t i = 0; i < packets.count; i++) {
        AVPacket *p = packets.items[i];
        p->stream_index = j->stream->index;
        p->pos = -1;
        j->last_dts = p->dts;
        /* av_write_frame (not interleaved): one stream, packets already in
         * decode order; the packet stays ours (it is unreferenced). */
        r = av_write_frame(j->fmt, p);
        if (r < 0) {
            r = vf_vid_av_error_named(j->path, r, "cannot write packet");
            goto done;
        }
        j->packets++;
    }
    res->frames = (int64_t)packets.count;
    res->from_timestamp = (double)j->end_ticks * out_tb.num / out_tb.den;
    j->end_ticks += end - first_pts;
    res->to_timestamp = (double)j->end_ticks * out_tb.num / out_tb.den;
    j->episodes++;
    r = 0;
done:
    packet_list_free(&packets);
    vf_vid_demux_close(&d);
    return r;
}

int64_t vf_lr3_join_bytes(const vf_lr3_join *j) { return j->fmt && j->fmt->pb ? avio_tell(j->fmt->pb) : 0; }
int vf_lr3_join_episodes(const vf_lr3_join *j) { return j->episodes; }
int64_t vf_lr3_join_packets(const vf_lr3_join *j) { return j->packets; }

static void join_free(vf_lr3_join *j)
{
    if (j->fmt) {
        if (j->fmt->pb)
            avio_closep(&j->fmt->pb);
        avformat_free_context(j->fmt);
    }
    avcodec_parameters_free(&j->params);
    free(j->path);
    free(j);
}

int vf_lr3_join_close(vf_lr3_join *j)
{
    int r = 0;
    if (!j->header_written)
        r = vf_error(VF_EINVAL, "%s: no episode was written", j->path);
    else if ((r = av_write_trailer(j->fmt)) < 0)
        r = vf_vid_av_error_named(j->path, r, "cannot write MP4 index");
    if (j->fmt->pb) {
        int c = avio_closep(&j->fmt->pb);
        if (c < 0 && r == 0)
            r = vf_vid_av_error_named(j->path, c, "cannot close file");
    }
    if (r < 0)
        unlink(j->path);
    join_free(j);
    return r;
}

void vf_lr3_join_abort(vf_lr3_join *j)
{
    if (j->fmt && j->fmt->pb)
        avio_closep(&j->fmt->pb);
    unlink(j->path);
    join_free(j);
}
