/*
 * index.c: the per-file frame index, built once from the container without
 * decoding.
 *
 * Two ways to build it:
 *  - from the MP4 sample table (libavformat's index entries: one per sample,
 *    with its decode timestamp, keyframe flag, byte position and size). No
 *    packet is read beyond the few find_stream_info already buffered. Used
 *    when the stream cannot reorder frames (codecpar video_delay == 0), so
 *    pts == dts; the first packets are checked to confirm it.
 *  - by walking every packet (av_read_frame) and sorting by pts: for streams
 *    with B-frames and for containers without a full sample table.
 *
 * Invariants of a built index: frame_count > 0; pts strictly ascending (so a
 * decoded frame's pts names exactly one ordinal); at least one keyframe;
 * samples flagged "discard" by an edit list are not frames (the decoder never
 * outputs them). A sample table that points past the end of the file is a
 * truncated file and an error here, not a surprise later; so is a table
 * with more samples than the file has bytes, or an empty sample.
 */
#include "video/video_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <libavutil/pixdesc.h>

typedef struct vf_vid_sample {
    int64_t pts, dts;
    int key;
} vf_vid_sample;

typedef struct sample_list {
    vf_vid_sample *items;
    size_t len, cap;
} sample_list;

static int sample_push(sample_list *l, int64_t pts, int64_t dts, int key)
{
    if (l->len == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        vf_vid_sample *n = vf_realloc(l->items, cap * sizeof *n);
        if (!n)
            return VF_ENOMEM;
        l->items = n;
        l->cap = cap;
    }
    l->items[l->len++] = (vf_vid_sample){pts, dts, key};
    return 0;
}

static int cmp_sample_pts(const void *a, const void *b)
{
    const vf_vid_sample *x = a, *y = b;
    return x->pts < y->pts ? -1 : x->pts > y->pts;
}

void vf_video_index_free(vf_video_index *index)
{
    if (!index)
        return;
    free(index->name);
    free(index->pts);
    free(index->keyframe);
    free(index);
}

/* Seeks d to the start of its stream. */
static int seek_to_start(vf_vid_demux *d)
{
    AVStream *st = d->stream;
    int64_t ts = st->start_time != AV_NOPTS_VALUE ? st->start_time : 0;
    if (avformat_index_get_entries_count(st) > 0) {
        const AVIndexEntry *e = avformat_index_get_entry(st, 0);
        if (e && e->timestamp < ts)
            ts = e->timestamp;
    }
    int r = av_seek_frame(d->fmt, d->stream_index, ts, AVSEEK_FLAG_BACKWARD);
    if (r < 0)
        r = av_seek_frame(d->fmt, d->stream_index, ts, AVSEEK_FLAG_BACKWARD | AVSEEK_FLAG_ANY);
    if (r < 0)
        return vf_vid_av_error(d, r, "cannot seek to the start of the video stream");
    return 0;
}

/* Collects the samples from the sample table. Returns 1 when usable, 0 when
 * the packet walk must be used instead, or a negative error. */
static int samples_from_entries(vf_vid_demux *d, sample_list *out)
{
    AVStream *st = d->stream;
    int count = avformat_index_get_entries_count(st);
    if (count <= 0)
        return 0;
    uint64_t file_size = vf_source_size(d->src);
    if ((uint64_t)count > file_size)
        return vf_error(VF_ECORRUPT, "%s: sample table lists %d samples in a %llu-byte file", d->name, count,
                        (unsigned long long)file_size);
    for (int i = 0; i < count; i++) {
        const AVIndexEntry *e = avformat_index_get_entry(st, i);
        if (!e)
            return 0;
        if (e->flags & AVINDEX_DISCARD_FRAME)
            continue;
        if (e->pos < 0 || (uint64_t)e->pos + (uint64_t)e->size > file_size)
            return vf_error(VF_ECORRUPT,
                            "%s: truncated file: sample %d of %d lies at bytes %lld..%lld but the file has %llu bytes",
                            d->name, i, count, (long long)e->pos, (long long)e->pos + e->size,
                            (unsigned long long)file_size);
        if (e->size == 0) /* an empty packet would read as end-of-stream to a decoder */
            return vf_error(VF_EUNSUPPORTED, "%s: video sample %d is empty", d->name, i);
        int r = sample_push(out, e->timestamp, e->timestamp, (e->flags & AVINDEX_KEYFRAME) != 0);
        if (r < 0)
            return r;
    }
    /* Confirm pts == dts on the first packets (a sample table with
     * composition offsets would break the assumption). */
    AVPacket *pkt = av_packet_alloc();
    if (!pkt)
        return VF_ENOMEM;
    int checked = 0, usable = 1;
    for (int reads = 0; checked < 4 && reads < 64; reads++) {
        int r = av_read_frame(d->fmt, pkt);
        if (r < 0)
            break; /* decode will report it; the table itself was consistent */
        if (pkt->stream_index == d->stream_index) {
            if (pkt->pts != AV_NOPTS_VALUE && pkt->pts != pkt->dts)
                usable = 0;
            checked++;
        }
        av_packet_unref(pkt);
    }
    av_packet_free(&pkt);
    return usable;
}

static int samples_from_packets(vf_vid_demux *d, sample_list *out)
{
    int r = seek_to_start(d);
    if (r < 0)
        return r;
    AVPacket *pkt = av_packet_alloc();
    if (!pkt)
        return VF_ENOMEM;
    int64_t corrupt = 0;
    for (;;) {
        int ar = av_read_frame(d->fmt, pkt);
        if (ar == AVERROR_EOF)
            break;
        if (ar < 0) {
            av_packet_free(&pkt);
            return vf_vid_av_error(d, ar, "cannot read packets while indexing");
        }
        if (pkt->stream_index == d->stream_index && !(pkt->flags & AV_PKT_FLAG_DISCARD) && pkt->size > 0) {
            if (pkt->flags & AV_PKT_FLAG_CORRUPT)
                corrupt++;
            int64_t pts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
            int64_t dts = pkt->dts != AV_NOPTS_VALUE ? pkt->dts : pts;
            if (pts == AV_NOPTS_VALUE) {
                av_packet_free(&pkt);
                return vf_error(VF_ECORRUPT, "%s: video packet %zu has no timestamp", d->name, out->len);
            }
            r = sample_push(out, pts, dts, (pkt->flags & AV_PKT_FLAG_KEY) != 0);
            if (r < 0) {
                av_packet_free(&pkt);
                return r;
            }
        }
        av_packet_unref(pkt);
    }
    av_packet_free(&pkt);
    if (corrupt)
        return vf_error(VF_ECORRUPT, "%s: %lld corrupt video packets (truncated file?)", d->name, (long long)corrupt);
    return 0;
}

int vf_vid_index_build(vf_vid_demux *d, int force_packets, vf_video_index **out)
{
    *out = NULL;
    AVStream *st = d->stream;
    AVCodecParameters *par = st->codecpar;
    vf_video_index *idx = vf_calloc(1, sizeof *idx);
    if (!idx)
        return VF_ENOMEM;
    idx->name = vf_strdup(d->name);
    if (!idx->name) {
        free(idx);
        return VF_ENOMEM;
    }
    idx->codec = vf_vid_codec_from_id(par->codec_id);
    snprintf(idx->codec_name, sizeof idx->codec_name, "%s", avcodec_get_name(par->codec_id));
    idx->pixfmt = vf_vid_pixfmt_from_av(par->format);
    const char *pf = par->format >= 0 ? av_get_pix_fmt_name(par->format) : NULL;
    snprintf(idx->pixfmt_name, sizeof idx->pixfmt_name, "%s", pf ? pf : "unknown");
    idx->width = par->width;
    idx->height = par->height;
    idx->time_base_num = st->time_base.num;
    idx->time_base_den = st->time_base.den;
    if (st->avg_frame_rate.num > 0 && st->avg_frame_rate.den > 0)
        idx->avg_fps = av_q2d(st->avg_frame_rate);
    idx->stream_duration = st->duration != AV_NOPTS_VALUE ? st->duration : -1;
    idx->container_duration_us = d->fmt->duration != AV_NOPTS_VALUE ? d->fmt->duration : -1;

    int r = 0;
    if (idx->time_base_num <= 0 || idx->time_base_den <= 0) {
        r = vf_error(VF_ECORRUPT, "%s: video stream has an invalid time base %d/%d", d->name, idx->time_base_num,
                     idx->time_base_den);
        goto fail;
    }

    sample_list samples = {0};
    int from_entries = 0;
    int is_mov = strncmp(d->fmt->iformat->name, "mov", 3) == 0;
    if (!force_packets && is_mov && par->video_delay == 0) {
        r = samples_from_entries(d, &samples);
        if (r < 0)
            goto fail_samples;
        from_entries = r == 1;
        if (from_entries) {
            for (size_t i = 1; i < samples.len; i++) {
                if (samples.items[i].pts <= samples.items[i - 1].pts) {
                    from_entries = 0; /* not monotonic: let the packet walk sort it out */
                    break;
                }
            }
        }
        if (!from_entries)
            samples.len = 0;
    }
    if (!from_entries) {
        r = samples_from_packets(d, &samples);
        if (r < 0)
            goto fail_samples;
        if (samples.len > 1)
            qsort(samples.items, samples.len, sizeof *samples.items, cmp_sample_pts);
    }
    idx->built_from = from_entries ? VF_VIDEO_INDEX_FROM_ENTRIES : VF_VIDEO_INDEX_FROM_PACKETS;

    if (samples.len == 0) {
        r = vf_error(VF_ECORRUPT, "%s: video stream has no frames", d->name);
        goto fail_samples;
    }
    if (st->nb_frames > 0 && (int64_t)samples.len < st->nb_frames && !from_entries) {
        r = vf_error(VF_ECORRUPT, "%s: truncated file: %zu of %lld frames readable", d->name, samples.len,
                     (long long)st->nb_frames);
        goto fail_samples;
    }
    size_t n = samples.len;
    idx->frame_count = (int64_t)n;
    idx->pts = vf_malloc_array(n, sizeof *idx->pts);
    idx->keyframe = vf_malloc_array(n, 1);
    if (!idx->pts || !idx->keyframe) {
        r = VF_ENOMEM;
        goto fail_samples;
    }
    for (size_t i = 0; i < n; i++) {
        idx->pts[i] = samples.items[i].pts;
        idx->keyframe[i] = (uint8_t)samples.items[i].key;
        idx->keyframe_count += samples.items[i].key;
        if (i > 0 && idx->pts[i] == idx->pts[i - 1]) {
            r = vf_error(VF_ECORRUPT, "%s: frames %zu and %zu share pts %lld", d->name, i - 1, i,
                         (long long)idx->pts[i]);
            goto fail_samples;
        }
    }
    if (idx->keyframe_count == 0) {
        r = vf_error(VF_ECORRUPT, "%s: video stream has no keyframe", d->name);
        goto fail_samples;
    }
    free(samples.items);
    *out = idx;
    return 0;

fail_samples:
    free(samples.items);
fail:
    vf_video_index_free(idx);
    return r;
}

int vf_video_index_build(vf_video_index **out, vf_source *src)
{
    *out = NULL;
    vf_vid_demux d;
    vf_vid_demux_options opt = {.probe_bytes = 1 << 20, .find_stream_info = 1};
    int r = vf_vid_demux_open(&d, src, &opt);
    if (r < 0)
        return r;
    r = vf_vid_index_build(&d, 0, out);
    vf_vid_demux_close(&d);
    return r;
}

int vf_video_index_build_file(vf_video_index **out, const char *path)
{
    *out = NULL;
    vf_source *src;
    int r = vf_source_open_file(&src, path);
    if (r < 0)
        return r;
    r = vf_video_index_build(out, src);
    vf_source_close(src);
    return r;
}

int64_t vf_video_index_find_pts(const vf_video_index *index, int64_t pts)
{
    int64_t lo = 0, hi = index->frame_count - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (index->pts[mid] == pts)
            return mid;
        if (index->pts[mid] < pts)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

double vf_video_index_seconds(const vf_video_index *index, int64_t ordinal)
{
    return (double)index->pts[ordinal] * index->time_base_num / index->time_base_den;
}

int64_t vf_video_index_nearest(const vf_video_index *index, double seconds)
{
    int64_t n = index->frame_count;
    if (n <= 0)
        return -1;
    /* First ordinal with time >= seconds. */
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (vf_video_index_seconds(index, mid) < seconds)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == n)
        return n - 1;
    if (lo == 0)
        return 0;
    double after = vf_video_index_seconds(index, lo) - seconds;
    double before = seconds - vf_video_index_seconds(index, lo - 1);
    return before <= after ? lo - 1 : lo;
}

int64_t vf_video_index_keyframe_before(const vf_video_index *index, int64_t ordinal)
{
    if (ordinal >= index->frame_count)
        ordinal = index->frame_count - 1;
    for (int64_t i = ordinal; i >= 0; i--)
        if (index->keyframe[i])
            return i;
    return -1;
}

int vf_video_index_expect_frames(const vf_video_index *index, int64_t expected, const char *camera)
{
    if (index->frame_count >= expected)
        return 0;
    return vf_error(VF_ECORRUPT, "%s%s%s: video has %lld frames, expected at least %lld", index->name,
                    camera ? ": camera " : "", camera ? camera : "", (long long)index->frame_count,
                    (long long)expected);
}
