/*
 * episodes.c: which frames of a camera file belong to which episode.
 *
 * LeRobot v3 packs many episodes into one MP4 per camera and records each
 * episode's [from_timestamp, to_timestamp) in the metadata. Those times are
 * a float sum of per-episode stream durations, while the real placement
 * follows FFmpeg's concat demuxer (millisecond-rounded container durations),
 * so they drift apart by up to ~1 ms per episode (lerobot-format.md §3.4).
 *
 * Primary rule: when the episodes' lengths add up to the file's frame count,
 * frame k of the i-th episode (in from_timestamp order) is ordinal
 * sum(lengths of earlier episodes) + k. That is exact whatever the drift;
 * the drift is measured and reported, never used.
 *
 * Counts that disagree: only when the file itself shows where the frames
 * are missing. Each episode's time window [from, next from) must hold its
 * frames on its 1/fps grid, and an episode short of frames must show the
 * hole: pts gaps before its last frame (a VFR file, frames dropped with
 * their times kept), or a recorded span that is itself short (LeRobot's
 * streaming encoder). A CFR re-encode that dropped frames mid-file, a
 * truncated file or another recording in its place has none of these: its
 * pts grid is regular, so every frame after the drop sits exactly where the
 * metadata expects a different one, and no frame of the file can be placed
 * with certainty. Such a file is refused as a whole (every episode in it,
 * one FILE_REFUSED record naming the file and both counts), unless the
 * caller opted in to timestamps (VF_VIDEO_MISMATCH_TIMESTAMP, or
 * VF_VIDEO_MISMATCH=timestamp in the environment): then it is matched by
 * time like a located difference, with one warning per file. A file with
 * more frames than its episodes is refused whatever the policy.
 *
 * Matching by time (a located difference, or the opt-in): each frame by
 * time, nearest pts within a tolerance below half a frame, so one video
 * frame can never serve two different data rows. Every unmatched frame is
 * reported as a problem record.
 *
 * Verification (issue 10): in both modes an episode whose frames cannot be
 * matched exactly (a start that jumps against from_timestamp, a broken pts
 * grid, a span that fits neither to_timestamp convention, unmatched frames,
 * a refused file) is UNMATCHED: recorded with
 * its first unmatched frame, and vf_video_episode_frame refuses every frame
 * of it, so no sample of it is ever served.
 */
#include "video/video_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct problem_list {
    vf_video_problem *items;
    size_t len, cap;
} problem_list;

static int add_problem(problem_list *l, vf_video_problem_kind kind, int64_t episode, int64_t frame, int64_t count,
                       double expected_s, double found_s, const char *fmt, ...) VF_PRINTF(8, 9);

static int add_problem(problem_list *l, vf_video_problem_kind kind, int64_t episode, int64_t frame, int64_t count,
                       double expected_s, double found_s, const char *fmt, ...)
{
    if (l->len == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        vf_video_problem *n = vf_realloc(l->items, cap * sizeof *n);
        if (!n)
            return VF_ENOMEM;
        l->items = n;
        l->cap = cap;
    }
    vf_video_problem *p = &l->items[l->len++];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->episode_index = episode;
    p->frame = frame;
    p->count = count;
    p->expected_s = expected_s;
    p->found_s = found_s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->message, sizeof p->message, fmt, ap);
    va_end(ap);
    return 0;
}

void vf_video_map_free(vf_video_map *map, vf_video_episode *episodes, size_t count)
{
    if (map) {
        free(map->problems);
        memset(map, 0, sizeof *map);
    }
    for (size_t i = 0; episodes && i < count; i++) {
        free(episodes[i].frame_ordinals);
        episodes[i].frame_ordinals = NULL;
    }
}

int vf_video_episode_frame(const vf_video_episode *ep, int64_t k, int64_t *ordinal)
{
    *ordinal = -1;
    if (k < 0 || k >= ep->length)
        return vf_error(VF_ERANGE, "episode %lld: frame %lld out of range (length %lld)", (long long)ep->episode_index,
                        (long long)k, (long long)ep->length);
    if (ep->unmatched_frame >= 0)
        return vf_error(VF_ECORRUPT, "episode %lld: refused (its video frames cannot be matched exactly: first "
                                     "unmatched frame %lld: %s)",
                        (long long)ep->episode_index, (long long)ep->unmatched_frame, ep->unmatched_reason);
    int64_t o = ep->frame_ordinals ? ep->frame_ordinals[k] : (ep->first_ordinal >= 0 ? ep->first_ordinal + k : -1);
    if (o < 0)
        return vf_error(VF_ECORRUPT, "episode %lld: frame %lld is missing from the video (dropped or edited)",
                        (long long)ep->episode_index, (long long)k);
    *ordinal = o;
    return 0;
}

/* Marks ep as refused from frame k on, with a problem record (the first
 * reason found is kept). */
static int mark_unmatched(problem_list *l, const vf_video_index *ix, const char *camera, vf_video_episode *ep,
                          int64_t k, double expected_s, double found_s, const char *reason)
{
    if (ep->unmatched_frame >= 0)
        return 0;
    ep->unmatched_frame = k;
    snprintf(ep->unmatched_reason, sizeof ep->unmatched_reason, "%s", reason);
    return add_problem(l, VF_VIDEO_PROBLEM_UNMATCHED, ep->episode_index, k, ep->length - k, expected_s, found_s,
                       "%s%s%s: episode %lld: frame %lld cannot be matched exactly: %s; the episode is refused",
                       ix->name, camera ? ": camera " : "", camera ? camera : "", (long long)ep->episode_index,
                       (long long)k, reason);
}

/* Stable order of episodes by from_timestamp (insertion sort on positions:
 * a camera file holds tens to hundreds of episodes). */
static void order_by_start(const vf_video_episode *eps, size_t *order, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t v = order[i] = i, j = i;
        while (j > 0 && eps[order[j - 1]].from_timestamp > eps[v].from_timestamp) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
}

/* First ordinal with time >= seconds (frame_count if none). */
static int64_t lower_bound(const vf_video_index *ix, double seconds)
{
    int64_t lo = 0, hi = ix->frame_count;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (vf_video_index_seconds(ix, mid) < seconds)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int map_by_timestamp(const vf_video_index *ix, vf_video_episode *ep, double fps, double tol,
                            const char *camera, problem_list *problems)
{
    int64_t n = ep->length;
    if (n > ix->frame_count) {
        /* Cannot fit (and a corrupt length must not size an allocation). */
        char reason[160];
        snprintf(reason, sizeof reason, "the episode has %lld frames, the whole file %lld", (long long)n,
                 (long long)ix->frame_count);
        return mark_unmatched(problems, ix, camera, ep, ix->frame_count, NAN, NAN, reason);
    }
    int64_t *ord = vf_malloc_array((size_t)n, sizeof *ord);
    if (!ord)
        return VF_ENOMEM;
    int64_t start = lower_bound(ix, ep->from_timestamp - 0.5 / fps);
    int64_t found = 0;
    for (int64_t k = 0; k < n; k++) {
        double t = ep->from_timestamp + (double)k / fps;
        int64_t o;
        /* Walk forward from the expected position; fall back to a search. */
        int64_t guess = start + k;
        if (guess < ix->frame_count && fabs(vf_video_index_seconds(ix, guess) - t) <= tol)
            o = guess;
        else
            o = vf_video_index_nearest(ix, t);
        if (o >= 0 && fabs(vf_video_index_seconds(ix, o) - t) <= tol) {
            ord[k] = o;
            found++;
        } else {
            ord[k] = -1;
        }
    }
    /* Report runs of missing frames. */
    for (int64_t k = 0; k < n;) {
        if (ord[k] >= 0) {
            k++;
            continue;
        }
        int64_t end = k;
        while (end < n && ord[end] < 0)
            end++;
        double t = ep->from_timestamp + (double)k / fps;
        int64_t near = vf_video_index_nearest(ix, t);
        double near_s = near >= 0 ? vf_video_index_seconds(ix, near) : NAN;
        int r = add_problem(problems, VF_VIDEO_PROBLEM_MISSING_FRAMES, ep->episode_index, k, end - k, t, near_s,
                            "%s%s%s: episode %lld: frames %lld..%lld (%lld of %lld) have no video frame within %.2f ms "
                            "of their time (first expected at %.6f s, nearest frame at %.6f s)",
                            ix->name, camera ? ": camera " : "", camera ? camera : "", (long long)ep->episode_index,
                            (long long)k, (long long)end - 1, (long long)(end - k), (long long)n, tol * 1000.0, t,
                            near_s);
        if (r < 0) {
            free(ord);
            return r;
        }
        k = end;
    }
    for (int64_t k = 0; k < n; k++) {
        if (ord[k] >= 0)
            continue;
        double t = ep->from_timestamp + (double)k / fps;
        int64_t near = vf_video_index_nearest(ix, t);
        double near_s = near >= 0 ? vf_video_index_seconds(ix, near) : NAN;
        char reason[160];
        snprintf(reason, sizeof reason, "no video frame within %.2f ms of %.6f s (nearest at %.6f s)", tol * 1000.0, t,
                 near_s);
        int r = mark_unmatched(problems, ix, camera, ep, k, t, near_s, reason);
        if (r < 0) {
            free(ord);
            return r;
        }
        break;
    }
    int contiguous = ord[0] >= 0;
    for (int64_t k = 1; contiguous && k < n; k++)
        contiguous = ord[k] == ord[0] + k;
    ep->first_ordinal = ord[0];
    ep->frames_found = found;
    ep->drift_ms = ord[0] >= 0 ? (vf_video_index_seconds(ix, ord[0]) - ep->from_timestamp) * 1000.0 : NAN;
    if (contiguous)
        free(ord);
    else
        ep->frame_ordinals = ord;
    return 0;
}

vf_video_mismatch vf_video_mismatch_resolve(vf_video_mismatch requested)
{
    if (requested == VF_VIDEO_MISMATCH_REFUSE || requested == VF_VIDEO_MISMATCH_TIMESTAMP)
        return requested;
    const char *value = getenv("VF_VIDEO_MISMATCH");
    if (!value || !*value || !strcasecmp(value, "refuse"))
        return VF_VIDEO_MISMATCH_REFUSE;
    if (!strcasecmp(value, "timestamp"))
        return VF_VIDEO_MISMATCH_TIMESTAMP;
    vf_log(VF_LOG_WARN, "VF_VIDEO_MISMATCH=%s is neither \"timestamp\" nor \"refuse\": video files whose frame "
           "count disagrees with their episodes are refused", value);
    return VF_VIDEO_MISMATCH_REFUSE;
}

/* 1 when the file shows where its frames differ from its episodes' (see
 * the file comment), 0 when nothing locates the difference. order: the
 * episodes by from_timestamp. The windows partition the file's frames, so
 * the counts add up exactly when every window passes. O(frames + episodes). */
static int difference_is_located(const vf_video_index *ix, const vf_video_episode *eps, const size_t *order,
                                 size_t count, double fps, double tol)
{
    if (count == 0 || lower_bound(ix, eps[order[0]].from_timestamp - 0.5 / fps) > 0)
        return 0; /* frames before the first episode belong to none */
    for (size_t i = 0; i < count; i++) {
        const vf_video_episode *ep = &eps[order[i]];
        int64_t lo = lower_bound(ix, ep->from_timestamp - 0.5 / fps);
        int64_t hi = i + 1 < count ? lower_bound(ix, eps[order[i + 1]].from_timestamp - 0.5 / fps)
                                   : ix->frame_count;
        int64_t held = hi - lo;
        if (held == ep->length)
            continue;
        if (held > ep->length)
            return 0; /* frames of no episode inside its window */
        /* A span matching neither convention (the episode is refused for
         * it) that records exactly the frames the window holds: the encoder
         * kept fewer frames and the metadata says so. */
        double span = (ep->to_timestamp - ep->from_timestamp) * fps;
        int span_refused = fabs(span - (double)ep->length) >= 0.5 && fabs(span - (double)(ep->length - 1)) >= 0.5;
        if (span_refused && held > 0 && (fabs(span - (double)held) < 0.5 || fabs(span - (double)(held - 1)) < 0.5))
            continue;
        /* Otherwise pts gaps: the window's frames on the episode's 1/fps
         * grid, one per grid point, so that the missing grid points are
         * holes in the file's pts. Those before the first or between two of
         * them are (the window holds every frame of that time). Those after
         * the last are only when a frame follows them beyond the tolerance:
         * frames cut from the end of a file leave no gap, and a next
         * episode starting on them means the frames were never there. */
        int64_t last_k = -1;
        for (int64_t o = lo; o < hi; o++) {
            double k = (vf_video_index_seconds(ix, o) - ep->from_timestamp) * fps;
            double nearest = floor(k + 0.5);
            if (nearest <= (double)last_k || nearest >= (double)ep->length || fabs(k - nearest) / fps > tol)
                return 0;
            last_k = (int64_t)nearest;
        }
        if (last_k < ep->length - 1) {
            double end_s = ep->from_timestamp + (double)(ep->length - 1) / fps;
            if (hi >= ix->frame_count || vf_video_index_seconds(ix, hi) - end_s <= tol)
                return 0;
        }
    }
    return 1;
}

/* Refuses every episode of the file from frame 0: one FILE_REFUSED record
 * naming the file, both counts and the episodes, and an UNMATCHED record
 * per episode (an episode refused already for its own reason keeps that
 * record instead, but its frames now fail with the file's reason). */
static int refuse_file(problem_list *problems, const vf_video_index *ix, const char *camera, vf_video_episode *eps,
                       const size_t *order, size_t count, int64_t sum, vf_video_map *map)
{
    map->method = VF_VIDEO_MAP_REFUSED;
    int more = ix->frame_count > sum;
    char reason[sizeof eps->unmatched_reason];
    snprintf(reason, sizeof reason, "the file holds %lld frames but its %zu episode%s declare%s %lld; %s, so no frame "
             "of this file can be placed", (long long)ix->frame_count, count, count == 1 ? "" : "s",
             count == 1 ? "s" : "", (long long)sum,
             more ? "more frames than its episodes hold (another file in its place?)"
                  : "no pts gap shows where frames are missing");
    char list[120];
    size_t used = 0;
    list[0] = 0;
    for (size_t i = 0; i < count; i++) {
        int n = snprintf(list + used, sizeof list - used, "%s%lld", i ? ", " : "",
                         (long long)eps[order[i]].episode_index);
        if (n < 0 || (size_t)n >= sizeof list - used - 5) {
            snprintf(list + used, sizeof list - used, ", ...");
            break;
        }
        used += (size_t)n;
    }
    int r = add_problem(problems, VF_VIDEO_PROBLEM_FILE_REFUSED, -1, -1, 0, NAN, NAN,
                        "%s%s%s: %s: %s %zu episode%s in it %s refused (%s)%s", ix->name,
                        camera ? ": camera " : "", camera ? camera : "", reason, count == 1 ? "the" : "all", count,
                        count == 1 ? "" : "s", count == 1 ? "is" : "are", list,
                        more ? "" : "; video_mismatch=timestamp (VF_VIDEO_MISMATCH=timestamp) serves them by "
                                    "timestamp instead");
    for (size_t i = 0; i < count && r == 0; i++) {
        vf_video_episode *ep = &eps[order[i]];
        if (ep->unmatched_frame < 0)
            r = add_problem(problems, VF_VIDEO_PROBLEM_UNMATCHED, ep->episode_index, 0, ep->length,
                            ep->from_timestamp, NAN, "%s%s%s: episode %lld: refused with every episode of its file: %s",
                            ix->name, camera ? ": camera " : "", camera ? camera : "", (long long)ep->episode_index,
                            reason);
        ep->unmatched_frame = 0;
        snprintf(ep->unmatched_reason, sizeof ep->unmatched_reason, "%s", reason);
    }
    return r;
}

int vf_video_map_episodes(const vf_video_index *ix, vf_video_episode *eps, size_t count,
                          const vf_video_map_settings *settings, vf_video_map *map)
{
    return vf_video_map_episodes_policy(ix, eps, count, settings, VF_VIDEO_MISMATCH_DEFAULT, map);
}

int vf_video_map_episodes_policy(const vf_video_index *ix, vf_video_episode *eps, size_t count,
                                 const vf_video_map_settings *settings, vf_video_mismatch policy,
                                 vf_video_map *map)
{
    memset(map, 0, sizeof *map);
    double fps = settings ? settings->fps : 0.0;
    const char *camera = settings ? settings->camera : NULL;
    if (!(fps > 0.0) || !isfinite(fps))
        return vf_error(VF_EINVAL, "%s: episode mapping needs a positive fps (got %g)", ix->name, fps);
    if ((unsigned)policy > VF_VIDEO_MISMATCH_TIMESTAMP)
        return vf_error(VF_EINVAL, "%s: unknown video mismatch policy %d", ix->name, (int)policy);
    double tol = settings->tolerance_s > 0.0 ? settings->tolerance_s : 0.45 / fps;
    if (tol >= 0.5 / fps)
        return vf_error(VF_EINVAL, "%s: timestamp tolerance %.6f s must stay below half a frame (%.6f s)", ix->name,
                        tol, 0.5 / fps);
    int64_t sum = 0;
    for (size_t i = 0; i < count; i++) {
        vf_video_episode *ep = &eps[i];
        ep->first_ordinal = -1;
        ep->frames_found = 0;
        ep->drift_ms = NAN;
        ep->frame_ordinals = NULL;
        ep->unmatched_frame = -1;
        ep->unmatched_reason[0] = 0;
        if (!isfinite(ep->from_timestamp) || !isfinite(ep->to_timestamp) || ep->length <= 0 ||
            ep->length > ((int64_t)1 << 40))
            return vf_error(VF_EINVAL, "%s%s%s: episode %lld has invalid metadata (from %g, to %g, length %lld)",
                            ix->name, camera ? ": camera " : "", camera ? camera : "", (long long)ep->episode_index,
                            ep->from_timestamp, ep->to_timestamp, (long long)ep->length);
        sum += ep->length;
    }
    size_t *order = vf_malloc_array(count ? count : 1, sizeof *order);
    if (!order)
        return VF_ENOMEM;
    order_by_start(eps, order, count);

    problem_list problems = {0};
    int r = 0;
    for (size_t i = 0; i < count && r == 0; i++) {
        vf_video_episode *ep = &eps[order[i]];
        double span = (ep->to_timestamp - ep->from_timestamp) * fps;
        /* LeRobot writes to = from + length / fps; some converters write the
         * last frame's time, from + (length - 1) / fps. Both are fine. */
        if (fabs(span - (double)ep->length) >= 0.5 && fabs(span - (double)(ep->length - 1)) >= 0.5)
            r = add_problem(&problems, VF_VIDEO_PROBLEM_SPAN_MISMATCH, ep->episode_index, -1, 0,
                            (double)ep->length / fps, ep->to_timestamp - ep->from_timestamp,
                            "%s%s%s: episode %lld: (to - from) * fps = %.3f matches neither length %lld (to = end) "
                            "nor length - 1 (to = last frame)",
                            ix->name, camera ? ": camera " : "", camera ? camera : "",
                            (long long)ep->episode_index, span, (long long)ep->length);
        if (r == 0 && fabs(span - (double)ep->length) >= 0.5 && fabs(span - (double)(ep->length - 1)) >= 0.5) {
            /* Its frames cannot all lie inside the recorded span: refuse it
             * (a swapped or edited span would otherwise pass the start and
             * grid checks and serve a neighbour's frames). */
            int64_t k = span < (double)ep->length - 1 ? (int64_t)VF_MAX(0.0, floor(span + 0.5)) : ep->length - 1;
            char reason[160];
            snprintf(reason, sizeof reason, "the recorded span [%.6f, %.6f) s holds %.3f frames, not %lld",
                     ep->from_timestamp, ep->to_timestamp, span, (long long)ep->length);
            r = mark_unmatched(&problems, ix, camera, ep, k, ep->from_timestamp + (double)k / fps, NAN, reason);
        }
    }

    if (r == 0 && sum == ix->frame_count) {
        map->method = VF_VIDEO_MAP_BY_ORDINAL;
        int64_t start = 0;
        double previous_drift = 0.0;
        for (size_t i = 0; i < count && r == 0; i++) {
            vf_video_episode *ep = &eps[order[i]];
            ep->first_ordinal = start;
            ep->frames_found = ep->length;
            double real = vf_video_index_seconds(ix, start);
            double drift = real - ep->from_timestamp;
            ep->drift_ms = drift * 1000.0;
            if (fabs(ep->drift_ms) > map->max_abs_drift_ms)
                map->max_abs_drift_ms = fabs(ep->drift_ms);
            /* The drift of a concatenated file grows by under a millisecond
             * per episode; a step of a frame or more means this episode's
             * frames are not where its metadata puts them (episodes swapped,
             * a file of other lengths, frames added or removed). */
            if (fabs(drift - previous_drift) > tol) {
                char reason[160];
                snprintf(reason, sizeof reason,
                         "it starts at frame %lld (pts %.6f s) but from_timestamp says %.6f s (%+.3f ms, %+.3f ms "
                         "from the previous episode's offset)",
                         (long long)start, real, ep->from_timestamp, drift * 1000.0, (drift - previous_drift) * 1000.0);
                r = mark_unmatched(&problems, ix, camera, ep, 0, ep->from_timestamp, real, reason);
                start += ep->length;
                continue;
            }
            previous_drift = drift;
            /* Every frame on the 1/fps grid from the episode's first frame. */
            for (int64_t k = 1; k < ep->length && r == 0; k++) {
                double t = vf_video_index_seconds(ix, start + k) - real;
                if (fabs(t - (double)k / fps) > tol) {
                    char reason[160];
                    snprintf(reason, sizeof reason,
                             "frame ordinal %lld is at +%.6f s from the episode's first frame, expected +%.6f s "
                             "(dropped, duplicated or retimed frames)",
                             (long long)(start + k), t, (double)k / fps);
                    r = mark_unmatched(&problems, ix, camera, ep, k, ep->from_timestamp + (double)k / fps,
                                       ep->from_timestamp + t, reason);
                    break;
                }
            }
            if (r == 0 && fabs(real - ep->from_timestamp) > tol)
                r = add_problem(&problems, VF_VIDEO_PROBLEM_DRIFT, ep->episode_index, 0, 0, ep->from_timestamp, real,
                                "%s%s%s: episode %lld: starts at frame %lld, pts %.6f s, but from_timestamp says %.6f s "
                                "(drift %.3f ms; the frame-ordinal mapping is used)",
                                ix->name, camera ? ": camera " : "", camera ? camera : "",
                                (long long)ep->episode_index, (long long)start, real, ep->from_timestamp,
                                ep->drift_ms);
            start += ep->length;
        }
    } else if (r == 0) {
        policy = vf_video_mismatch_resolve(policy);
        /* (No episodes: nothing to place, nothing to refuse.) */
        int located = count == 0 || (ix->frame_count < sum && difference_is_located(ix, eps, order, count, fps, tol));
        if (!located && (ix->frame_count > sum || policy != VF_VIDEO_MISMATCH_TIMESTAMP)) {
            r = refuse_file(&problems, ix, camera, eps, order, count, sum, map);
        } else {
            map->method = VF_VIDEO_MAP_BY_TIMESTAMP;
            if (located) {
                r = add_problem(&problems, VF_VIDEO_PROBLEM_COUNT_MISMATCH, -1, -1, 0, NAN, NAN,
                                "%s%s%s: the %zu episodes hold %lld frames but the video has %lld; frames are matched "
                                "by timestamp",
                                ix->name, camera ? ": camera " : "", camera ? camera : "", count, (long long)sum,
                                (long long)ix->frame_count);
            } else {
                r = add_problem(&problems, VF_VIDEO_PROBLEM_FILE_BY_TIMESTAMP, -1, -1, 0, NAN, NAN,
                                "%s%s%s: the file holds %lld frames but its %zu episode%s declare%s %lld and no pts "
                                "gap shows where frames are missing; served by timestamp anyway (video_mismatch="
                                "timestamp): after frames dropped mid-file, frames of other times are served",
                                ix->name, camera ? ": camera " : "", camera ? camera : "",
                                (long long)ix->frame_count, count, count == 1 ? "" : "s", count == 1 ? "s" : "",
                                (long long)sum);
                if (r == 0)
                    vf_log(VF_LOG_WARN, "%s", problems.items[problems.len - 1].message);
            }
            for (size_t i = 0; i < count && r == 0; i++) {
                vf_video_episode *ep = &eps[order[i]];
                r = map_by_timestamp(ix, ep, fps, tol, camera, &problems);
                if (r == 0 && isfinite(ep->drift_ms) && fabs(ep->drift_ms) > map->max_abs_drift_ms)
                    map->max_abs_drift_ms = fabs(ep->drift_ms);
            }
        }
    }
    free(order);
    if (r < 0) {
        free(problems.items);
        vf_video_map_free(map, eps, count);
        return r;
    }
    map->problems = problems.items;
    map->problem_count = problems.len;
    return 0;
}
