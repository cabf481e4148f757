/*
 * test_video_mismatch.c: a camera file whose frame count disagrees with the
 * lengths of its episodes (docs/reliability.md, "Frame counts that
 * disagree").
 *
 *  - On hand-built indexes: a CFR re-encode that dropped frames mid-file, a
 *    cut end, a two-episode file replaced by a shorter recording and frames
 *    before the first episode are refused as a whole file (every episode,
 *    one FILE_REFUSED record with both counts); the opt-in
 *    (VF_VIDEO_MISMATCH_TIMESTAMP, or VF_VIDEO_MISMATCH=timestamp in the
 *    environment) matches them by time with one warning record per file;
 *    pts gaps (frames dropped with their times kept, at the start or in
 *    the middle) and short recorded spans (LeRobot's streaming encoder)
 *    still locate the difference and are mapped exactly around it.
 *  - On a make-sample dataset whose first MP4 (two episodes) is replaced by
 *    a CFR re-encode without 10 frames: the open refuses both episodes
 *    naming the file and both counts, read_frame and decode-check agree,
 *    a SKIP loader serves every other episode exactly and none of these;
 *    the opt-in (setting and environment) serves them by timestamp.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>

#include "test_loader_helpers.h"
#include "test_video_helpers.h"
#include "vlafeed/dataset.h"

#define TICKS 512 /* one frame at 30 fps in 1/15360 */

/* An index of the frames of n slots at 30 fps, without the slots listed in
 * drop (their pts are kept: a gap) or, with retime, re-timed onto a
 * regular grid (a CFR re-encode: no gap). */
static vf_video_index *make_index(int64_t n, int64_t drop_from, int64_t drop_count, int retime)
{
    vf_video_index *ix = calloc(1, sizeof *ix);
    ix->name = strdup("cam.mp4");
    ix->time_base_num = 1;
    ix->time_base_den = 15360;
    ix->pts = malloc((size_t)n * sizeof *ix->pts);
    ix->keyframe = calloc((size_t)n, 1);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i >= drop_from && i < drop_from + drop_count)
            continue;
        ix->pts[m] = (retime ? m : i) * TICKS;
        ix->keyframe[m] = m % 2 == 0;
        m++;
    }
    ix->frame_count = m;
    return ix;
}

/* Episodes back to back from 0, LeRobot's metadata (to = end of the last
 * frame), episode_index 100, 101, ... */
static void set_episodes(vf_video_episode *eps, const int64_t *lengths, size_t n)
{
    double t = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)lengths[i] / 30.0;
        eps[i] = (vf_video_episode){.episode_index = 100 + (int64_t)i, .from_timestamp = t, .to_timestamp = t + d,
                                    .length = lengths[i]};
        t += d;
    }
}

/* Every frame of every episode is refused with the file's reason. */
static void check_all_refused(const vf_video_episode *eps, size_t n, const char *reason)
{
    for (size_t i = 0; i < n; i++)
        for (int64_t k = 0; k < eps[i].length; k++) {
            int64_t o;
            CHECK_ERR(vf_video_episode_frame(&eps[i], k, &o), VF_ECORRUPT, reason);
            CHECK_EQ_INT(o, -1);
        }
}

static const vf_video_map_settings MS = {.fps = 30, .camera = "cam0"};

static void test_cfr_drop_refused(void)
{
    /* 90 frames, 10 dropped mid-file (slots 40..49, in episode 101) and the
     * rest re-timed at 30 fps: episodes 102 and 103 would be served 10
     * frames late by time, and only 103's end looks missing. */
    static const int64_t lengths[] = {30, 25, 20, 15};
    vf_video_index *ix = make_index(90, 40, 10, 1);
    vf_video_episode eps[4];
    set_episodes(eps, lengths, 4);
    vf_video_map map;
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 4, &MS, VF_VIDEO_MISMATCH_REFUSE, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_REFUSED);
    CHECK_EQ_INT(map.problem_count, 5);
    if (map.problem_count == 5) {
        CHECK_EQ_INT(map.problems[0].kind, VF_VIDEO_PROBLEM_FILE_REFUSED);
        CHECK_EQ_INT(map.problems[0].episode_index, -1);
        CHECK(strstr(map.problems[0].message,
                     "cam.mp4: camera cam0: the file holds 80 frames but its 4 episodes declare 90; no pts gap "
                     "shows where frames are missing, so no frame of this file can be placed: all 4 episodes in it "
                     "are refused (100, 101, 102, 103)") != NULL);
        for (int i = 1; i < 5; i++) {
            CHECK_EQ_INT(map.problems[i].kind, VF_VIDEO_PROBLEM_UNMATCHED);
            CHECK_EQ_INT(map.problems[i].episode_index, 99 + i);
            CHECK_EQ_INT(map.problems[i].frame, 0);
        }
    }
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(eps[i].first_ordinal, -1);
        CHECK_EQ_INT(eps[i].frames_found, 0);
    }
    check_all_refused(eps, 4, "the file holds 80 frames but its 4 episodes declare 90");
    vf_video_map_free(&map, eps, 4);

    /* The opt-in: matched by time as before the rule, one warning record. */
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 4, &MS, VF_VIDEO_MISMATCH_TIMESTAMP, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_TIMESTAMP);
    size_t warnings = 0;
    for (size_t p = 0; p < map.problem_count; p++)
        warnings += map.problems[p].kind == VF_VIDEO_PROBLEM_FILE_BY_TIMESTAMP;
    CHECK_EQ_INT(warnings, 1);
    CHECK(strstr(map.problems[0].message, "cam.mp4: camera cam0: the file holds 80 frames but its 4 episodes "
                                          "declare 90 and no pts gap shows where frames are missing; served by "
                                          "timestamp anyway") != NULL);
    int64_t o;
    CHECK_OK(vf_video_episode_frame(&eps[2], 0, &o));
    CHECK_EQ_INT(o, 55); /* slot 65's frame: the shift the opt-in accepts */
    CHECK_ERR(vf_video_episode_frame(&eps[3], 0, &o), VF_ECORRUPT, "first unmatched frame 5");
    vf_video_map_free(&map, eps, 4);
    vf_video_index_free(ix);
}

static void test_environment_opt_in(void)
{
    static const int64_t lengths[] = {30, 25, 20, 15};
    vf_video_index *ix = make_index(90, 40, 10, 1);
    vf_video_episode eps[4];
    set_episodes(eps, lengths, 4);
    vf_video_map map;
    struct {
        const char *value;
        vf_video_mismatch policy;
        int method;
    } cases[] = {
        {NULL, VF_VIDEO_MISMATCH_DEFAULT, VF_VIDEO_MAP_REFUSED},
        {"", VF_VIDEO_MISMATCH_DEFAULT, VF_VIDEO_MAP_REFUSED},
        {"timestamp", VF_VIDEO_MISMATCH_DEFAULT, VF_VIDEO_MAP_BY_TIMESTAMP},
        {"TIMESTAMP", VF_VIDEO_MISMATCH_DEFAULT, VF_VIDEO_MAP_BY_TIMESTAMP},
        {"refuse", VF_VIDEO_MISMATCH_DEFAULT, VF_VIDEO_MAP_REFUSED},
        {"sometimes", VF_VIDEO_MISMATCH_DEFAULT, VF_VIDEO_MAP_REFUSED}, /* unknown: refused, logged */
        {"timestamp", VF_VIDEO_MISMATCH_REFUSE, VF_VIDEO_MAP_REFUSED},  /* an explicit policy wins */
        {"refuse", VF_VIDEO_MISMATCH_TIMESTAMP, VF_VIDEO_MAP_BY_TIMESTAMP},
    };
    for (size_t i = 0; i < VF_ARRAY_LEN(cases); i++) {
        if (cases[i].value)
            setenv("VF_VIDEO_MISMATCH", cases[i].value, 1);
        else
            unsetenv("VF_VIDEO_MISMATCH");
        if (cases[i].policy == VF_VIDEO_MISMATCH_DEFAULT)
            CHECK_OK(vf_video_map_episodes(ix, eps, 4, &MS, &map));
        else
            CHECK_OK(vf_video_map_episodes_policy(ix, eps, 4, &MS, cases[i].policy, &map));
        if (map.method != cases[i].method)
            fprintf(stderr, "  case %zu: VF_VIDEO_MISMATCH=%s policy %d\n", i,
                    cases[i].value ? cases[i].value : "(unset)", (int)cases[i].policy);
        CHECK_EQ_INT(map.method, cases[i].method);
        vf_video_map_free(&map, eps, 4);
    }
    unsetenv("VF_VIDEO_MISMATCH");
    CHECK_ERR(vf_video_map_episodes_policy(ix, eps, 4, &MS, (vf_video_mismatch)7, &map), VF_EINVAL,
              "unknown video mismatch policy 7");
    vf_video_index_free(ix);
}

static void test_other_unlocated_files(void)
{
    vf_video_map map;
    vf_video_episode eps[3];
    /* The end cut off: looks exactly like a CFR drop anywhere. */
    static const int64_t lengths[] = {30, 25, 20};
    vf_video_index *ix = make_index(70, 0, 0, 0);
    ix->frame_count = 66;
    set_episodes(eps, lengths, 3);
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 3, &MS, VF_VIDEO_MISMATCH_REFUSE, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_REFUSED);
    check_all_refused(eps, 3, "the file holds 66 frames but its 3 episodes declare 75; no pts gap");
    vf_video_map_free(&map, eps, 3);
    /* ... and so does a gap plus a cut end: the gap explains 3 of 9. */
    vf_video_index_free(ix);
    ix = make_index(72, 40, 3, 0);
    set_episodes(eps, lengths, 3);
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 3, &MS, VF_VIDEO_MISMATCH_REFUSE, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_REFUSED);
    vf_video_map_free(&map, eps, 3);
    vf_video_index_free(ix);

    /* A file of two episodes (40 + 30 frames) replaced by a shorter
     * recording of another episode (35 frames from pts 0): by time, episode
     * 100 would be served the other recording's first 35 frames. */
    static const int64_t two[] = {40, 30};
    ix = make_index(35, 0, 0, 0);
    set_episodes(eps, two, 2);
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 2, &MS, VF_VIDEO_MISMATCH_REFUSE, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_REFUSED);
    check_all_refused(eps, 2, "the file holds 35 frames but its 2 episodes declare 70; no pts gap shows where frames "
                              "are missing, so no frame of this file can be placed");
    CHECK(strstr(map.problems[0].message, "(100, 101)") != NULL);
    vf_video_map_free(&map, eps, 2);
    vf_video_index_free(ix);

    /* Frames before the first episode belong to none of them, even when a
     * gap would explain the rest: slots 5..39 and 40..69 are the episodes,
     * slots 20..29 a gap, slots 0..4 nobody's. */
    static const int64_t late[] = {35, 30};
    ix = make_index(70, 20, 10, 0);
    set_episodes(eps, late, 2);
    for (int i = 0; i < 2; i++) {
        eps[i].from_timestamp += 5 / 30.0;
        eps[i].to_timestamp += 5 / 30.0;
    }
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 2, &MS, VF_VIDEO_MISMATCH_REFUSE, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_REFUSED);
    vf_video_map_free(&map, eps, 2);
    vf_video_index_free(ix);

    /* A one-frame streaming-encoder drop cannot be told from the to = last
     * frame convention: the short span does not locate it. */
    static const int64_t three[] = {20, 15, 10};
    ix = make_index(44, 0, 0, 0);
    set_episodes(eps, three, 3);
    eps[1].to_timestamp -= 1 / 30.0;
    eps[2].from_timestamp -= 1 / 30.0;
    eps[2].to_timestamp -= 1 / 30.0;
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 3, &MS, VF_VIDEO_MISMATCH_REFUSE, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_REFUSED);
    vf_video_map_free(&map, eps, 3);
    vf_video_index_free(ix);
}

static void test_located_differences_unchanged(void)
{
    vf_video_map map;
    vf_video_episode eps[4];
    int64_t o;
    /* Slots 40..49 dropped with their pts kept (a gap inside episode 101,
     * frames 10..19): matched by time around the gap, whatever the policy. */
    static const int64_t lengths[] = {30, 25, 20, 15};
    vf_video_index *ix = make_index(90, 40, 10, 0);
    for (int policy = VF_VIDEO_MISMATCH_REFUSE; policy <= VF_VIDEO_MISMATCH_TIMESTAMP; policy++) {
        set_episodes(eps, lengths, 4);
        CHECK_OK(vf_video_map_episodes_policy(ix, eps, 4, &MS, (vf_video_mismatch)policy, &map));
        CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_TIMESTAMP);
        CHECK_EQ_INT(map.problems[0].kind, VF_VIDEO_PROBLEM_COUNT_MISMATCH);
        for (size_t p = 0; p < map.problem_count; p++)
            CHECK(map.problems[p].kind != VF_VIDEO_PROBLEM_FILE_REFUSED &&
                  map.problems[p].kind != VF_VIDEO_PROBLEM_FILE_BY_TIMESTAMP);
        CHECK_OK(vf_video_episode_frame(&eps[0], 29, &o));
        CHECK_EQ_INT(o, 29);
        CHECK_ERR(vf_video_episode_frame(&eps[1], 0, &o), VF_ECORRUPT, "first unmatched frame 10");
        CHECK_OK(vf_video_episode_frame(&eps[2], 0, &o));
        CHECK_EQ_INT(o, 45); /* slot 55, the 10 dropped slots before it */
        CHECK_OK(vf_video_episode_frame(&eps[3], 14, &o));
        CHECK_EQ_INT(o, 79);
        vf_video_map_free(&map, eps, 4);
    }
    vf_video_index_free(ix);

    /* The first 3 frames dropped, pts kept: the leading gap locates them. */
    ix = make_index(90, 0, 3, 0);
    set_episodes(eps, lengths, 4);
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 4, &MS, VF_VIDEO_MISMATCH_REFUSE, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_TIMESTAMP);
    CHECK_ERR(vf_video_episode_frame(&eps[0], 5, &o), VF_ECORRUPT, "first unmatched frame 0");
    CHECK_OK(vf_video_episode_frame(&eps[1], 0, &o));
    CHECK_EQ_INT(o, 27);
    vf_video_map_free(&map, eps, 4);
    vf_video_index_free(ix);

    /* LeRobot's streaming encoder: episode 101 kept 20 of its 25 frames,
     * its recorded span says so, and episode 102 starts right after them.
     * 101 is refused for its span, the others are placed exactly. */
    ix = make_index(85, 0, 0, 0);
    set_episodes(eps, lengths, 4);
    eps[1].to_timestamp = eps[1].from_timestamp + 20 / 30.0;
    for (int i = 2; i < 4; i++) {
        eps[i].from_timestamp -= 5 / 30.0;
        eps[i].to_timestamp -= 5 / 30.0;
    }
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 4, &MS, VF_VIDEO_MISMATCH_REFUSE, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_TIMESTAMP);
    CHECK_ERR(vf_video_episode_frame(&eps[1], 0, &o), VF_ECORRUPT, "recorded span");
    CHECK_OK(vf_video_episode_frame(&eps[2], 0, &o));
    CHECK_EQ_INT(o, 50);
    CHECK_OK(vf_video_episode_frame(&eps[3], 14, &o));
    CHECK_EQ_INT(o, 84);
    vf_video_map_free(&map, eps, 4);
    vf_video_index_free(ix);
}

/* ---- a real dataset ------------------------------------------------------ */

typedef struct cfr_ctx {
    int width, height;
    int64_t *episode, *frame; /* per output frame: the source frame's identity */
} cfr_ctx;

static int cfr_fill(void *ctx, int64_t k, uint8_t *pixels, size_t stride)
{
    cfr_ctx *c = ctx;
    return vf_video_stamp_identity(pixels, c->width, c->height, stride, c->episode[k], c->frame[k], 0);
}

/* Replaces the camera's file 0 by a CFR encode of its episodes' frames
 * without frames [drop_from, drop_from + drop_count) of the file: what
 * `ffmpeg -vf select='not(between(n,...))',setpts=N/FRAME_RATE/TB` makes. */
static int64_t replace_with_cfr_drop(const vf_dataset *d, int64_t drop_from, int64_t drop_count)
{
    const char *path = vf_dataset_video_file(d, 0, 0);
    int64_t total = 0;
    for (size_t pos = 0; pos < vf_dataset_num_episodes(d); pos++) {
        vf_video_span span;
        if (vf_dataset_episode_video(d, pos, 0, &span) == 0 && span.file == 0)
            total += span.length;
    }
    cfr_ctx c = {96, 64, calloc((size_t)total, sizeof(int64_t)), calloc((size_t)total, sizeof(int64_t))};
    int64_t n = 0, slot = 0;
    for (size_t pos = 0; pos < vf_dataset_num_episodes(d); pos++) {
        vf_video_span span;
        if (vf_dataset_episode_video(d, pos, 0, &span) < 0 || span.file != 0)
            continue;
        for (int64_t k = 0; k < span.length; k++, slot++) {
            if (slot >= drop_from && slot < drop_from + drop_count)
                continue;
            c.episode[n] = vf_dataset_episode(d, pos)->episode_index;
            c.frame[n] = k;
            n++;
        }
    }
    vf_video_encode_settings es;
    vf_video_encode_defaults(&es);
    es.codec = VF_VIDEO_CODEC_H264;
    es.width = 96;
    es.height = 64;
    es.fps = 30;
    CHECK_OK(vf_video_write_episode(path, &es, n, cfr_fill, &c));
    free(c.episode);
    free(c.frame);
    return total;
}

static size_t count_problems(const vf_dataset *d, vf_severity severity, const char *file_suffix, int64_t episode,
                             const char *needle)
{
    size_t n = 0;
    for (size_t i = 0; i < vf_dataset_num_problems(d); i++) {
        const vf_problem *p = vf_dataset_problem(d, i);
        size_t fl = strlen(p->file), sl = strlen(file_suffix);
        n += p->severity == severity && p->episode == episode && fl >= sl && !strcmp(p->file + fl - sl, file_suffix) &&
             strstr(p->message, needle) != NULL;
    }
    return n;
}

static void test_dataset(void)
{
    unsetenv("VF_VIDEO_MISMATCH");
    char *root = make_dataset("mismatch", 6, 30, 0.008, NULL);
    vf_dataset *d = open_dataset(root, NULL, 0);
    /* The layout this needs: camera 0's file 0 holds two or more episodes
     * (the first ones), other files the rest. */
    size_t in_file0 = 0;
    for (size_t pos = 0; pos < vf_dataset_num_episodes(d); pos++) {
        vf_video_span span;
        CHECK_OK(vf_dataset_episode_video(d, pos, 0, &span));
        in_file0 += span.file == 0;
    }
    if (in_file0 < 2 || in_file0 == vf_dataset_num_episodes(d) || vf_dataset_episode(d, 0)->length < 16) {
        fprintf(stderr, "  unexpected make-sample layout: %zu episodes in file 0\n", in_file0);
        CHECK(0);
        vf_dataset_close(d);
        remove_dataset(root);
        return;
    }
    int64_t total = replace_with_cfr_drop(d, 5, 10);
    const char *rel = "videos/observation.images.cam0/chunk-000/file-000.mp4";
    char counts[96];
    snprintf(counts, sizeof counts, "the file holds %lld frames but its %zu episodes declare %lld",
             (long long)total - 10, in_file0, (long long)total);
    vf_dataset_close(d);

    /* Refused at open: the file with both counts, then each episode. */
    d = open_dataset(root, NULL, 0);
    CHECK_EQ_INT(vf_dataset_video_mismatch(d), VF_VIDEO_MISMATCH_REFUSE);
    CHECK_EQ_INT(count_problems(d, VF_SEVERITY_ERROR, rel, -1, counts), 1);
    CHECK_EQ_INT(count_problems(d, VF_SEVERITY_ERROR, rel, -1, "no pts gap shows where frames are missing, so no "
                                                               "frame of this file can be placed"), 1);
    for (int64_t e = 0; e < (int64_t)in_file0; e++)
        CHECK_EQ_INT(count_problems(d, VF_SEVERITY_ERROR, rel, e, counts), 1);
    CHECK_EQ_INT(vf_dataset_num_errors(d), 1 + in_file0);
    uint8_t *rgb = NULL;
    int w, h;
    for (int64_t e = 0; e < (int64_t)in_file0; e++) {
        CHECK_ERR(vf_dataset_read_frame(d, e, 0, "observation.images.cam0", &rgb, &w, &h), VF_ECORRUPT, counts);
        CHECK(strstr(vf_last_error(), "file-000.mp4") != NULL);
    }
    CHECK_OK(vf_dataset_read_frame(d, (int64_t)in_file0, 3, "observation.images.cam0", &rgb, &w, &h));
    CHECK(rgb && frame_is(rgb, w, h, (int64_t)in_file0, 3, 0));
    free(rgb);
    char *report = NULL;
    size_t errors = 0;
    vf_decode_check_settings cs;
    vf_decode_check_defaults(&cs);
    cs.thorough = 1;
    cs.decode = 0;
    CHECK_OK(vf_dataset_decode_check(d, &cs, &report, &errors));
    CHECK_EQ_INT(errors, 1 + in_file0);
    CHECK(report && strstr(report, "\"mapping\": \"refused\"") && strstr(report, "\"kind\": \"file_refused\""));
    free(report);

    /* A SKIP loader: every frame of the other episodes, exactly; none of these. */
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_STREAM;
    ls.batch_size = 7;
    ls.threads = 2;
    ls.on_error = VF_ON_ERROR_SKIP;
    ls.log_warnings = 0;
    ls.sample.image_format = VF_IMAGE_UINT8_HWC;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    int64_t served = 0, dataset_frames = 0;
    for (size_t pos = 0; pos < vf_dataset_num_episodes(d); pos++)
        dataset_frames += vf_dataset_episode(d, pos)->length;
    vf_batch *b;
    while (l && vf_loader_next(l, &b) == 0) {
        const vf_column *cam = col(b, "observation.images.cam0");
        const int64_t *positions = vf_batch_positions(b);
        for (size_t i = 0; cam && i < vf_batch_size(b); i++) {
            int64_t ep, fr;
            locate(d, positions[i], &ep, &fr);
            CHECK(ep >= (int64_t)in_file0);
            CHECK(frame_is((const uint8_t *)cam->data + i * 96 * 64 * 3, 96, 64, ep, fr, 0));
            served++;
        }
        vf_batch_release(b);
    }
    if (l) {
        vf_loader_stats st;
        vf_loader_get_stats(l, &st);
        CHECK_EQ_INT(st.skipped, total);
        CHECK_EQ_INT(served, dataset_frames - total);
        CHECK(vf_loader_num_skips(l) > 0 && strstr(vf_loader_get_skip(l, 0)->message, counts));
        vf_loader_close(l);
    }
    vf_dataset_close(d);

    /* The opt-in, as a setting and from the environment: one warning for
     * the file, frames by timestamp (after the drop, other frames). */
    for (int how = 0; how < 2; how++) {
        vf_dataset_settings ds;
        vf_dataset_defaults(&ds);
        if (how == 0)
            ds.video_mismatch = VF_VIDEO_MISMATCH_TIMESTAMP;
        else
            setenv("VF_VIDEO_MISMATCH", "timestamp", 1);
        d = NULL;
        CHECK_OK(vf_dataset_open(&d, root, &ds));
        unsetenv("VF_VIDEO_MISMATCH");
        if (!d)
            continue;
        CHECK_EQ_INT(vf_dataset_video_mismatch(d), VF_VIDEO_MISMATCH_TIMESTAMP);
        CHECK_EQ_INT(count_problems(d, VF_SEVERITY_WARNING, rel, -1, "served by timestamp anyway"), 1);
        CHECK_EQ_INT(count_problems(d, VF_SEVERITY_ERROR, rel, -1, counts), 0);
        CHECK_OK(vf_dataset_read_frame(d, 0, 4, "observation.images.cam0", &rgb, &w, &h));
        CHECK(rgb && frame_is(rgb, w, h, 0, 4, 0));
        free(rgb);
        /* Frame 5 of episode 0 is served: it is the source's frame 15. */
        CHECK_OK(vf_dataset_read_frame(d, 0, 5, "observation.images.cam0", &rgb, &w, &h));
        CHECK(rgb && frame_is(rgb, w, h, 0, 15, 0));
        free(rgb);
        vf_dataset_close(d);
    }
    vf_dataset_settings bad;
    vf_dataset_defaults(&bad);
    bad.video_mismatch = (vf_video_mismatch)3;
    d = NULL;
    CHECK_ERR(vf_dataset_open(&d, root, &bad), VF_EINVAL, "settings.video_mismatch is 3");
    CHECK(d == NULL);
    remove_dataset(root);
}

int main(void)
{
    vf_video_set_ffmpeg_log_level(-1);
    setenv("SVT_LOG", "1", 0);
    test_cfr_drop_refused();
    test_environment_opt_in();
    test_other_unlocated_files();
    test_located_differences_unchanged();
    test_dataset();
    return vf_test_finish("test_video_mismatch");
}
