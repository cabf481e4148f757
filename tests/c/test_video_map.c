/*
 * test_video_map.c: episode -> frame-ordinal mapping on hand-built indexes.
 *
 *  - lengths that sum to the frame count: ordinal mapping, exact under
 *    drift (even drift beyond a frame), drift measured per episode and
 *    reported beyond the tolerance; episodes passed in any order;
 *  - dropped frames shown by pts gaps: timestamp fallback, the missing
 *    frames reported as a run and refused by vf_video_episode_frame, later
 *    frames still found;
 *  - extra frames in the file, an episode past the end (the whole file
 *    refused; by timestamp on the opt-in), a span that does not match its
 *    length; invalid arguments. The counts-disagree rule in depth:
 *    test_video_mismatch.c.
 */
#define _GNU_SOURCE
#include <math.h>

#include "test_video_helpers.h"

/* An index of n frames at 30 fps (512 ticks of 1/15360), with `gap_ticks`
 * added before each frame listed in shifts (episode starts in a
 * concatenated file), and without the frames listed in drop. */
static vf_video_index *make_index(int64_t n, const int64_t *shift_at, const int64_t *shift_ticks, size_t shifts,
                                  const int64_t *drop, size_t drops)
{
    vf_video_index *ix = calloc(1, sizeof *ix);
    ix->name = strdup("synthetic.mp4");
    ix->time_base_num = 1;
    ix->time_base_den = 15360;
    ix->pts = malloc((size_t)n * sizeof *ix->pts);
    ix->keyframe = calloc((size_t)n, 1);
    int64_t t = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        for (size_t s = 0; s < shifts; s++)
            if (shift_at[s] == i)
                t += shift_ticks[s];
        int dropped = 0;
        for (size_t d = 0; d < drops; d++)
            dropped |= drop[d] == i;
        if (!dropped) {
            ix->pts[m] = t;
            ix->keyframe[m] = m % 2 == 0;
            m++;
        }
        t += 512;
    }
    ix->frame_count = m;
    return ix;
}

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

static void test_ordinal_with_drift(void)
{
    /* LeRobot's placement: episode starts pushed late by 10 ticks each. */
    static const int64_t lengths[] = {7, 11, 5, 9};
    static const int64_t at[] = {7, 18, 23};
    static const int64_t ticks[] = {10, 10, 10};
    vf_video_index *ix = make_index(32, at, ticks, 3, NULL, 0);
    vf_video_episode eps[4];
    set_episodes(eps, lengths, 4);
    /* Shuffle the input order: the mapping sorts by from_timestamp. */
    vf_video_episode shuffled[4] = {eps[2], eps[0], eps[3], eps[1]};
    vf_video_map map;
    vf_video_map_settings ms = {.fps = 30, .camera = "front"};
    CHECK_OK(vf_video_map_episodes(ix, shuffled, 4, &ms, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_ORDINAL);
    CHECK_EQ_INT(map.problem_count, 0);
    CHECK_EQ_INT(shuffled[1].first_ordinal, 0);
    CHECK_EQ_INT(shuffled[3].first_ordinal, 7);
    CHECK_EQ_INT(shuffled[0].first_ordinal, 18);
    CHECK_EQ_INT(shuffled[2].first_ordinal, 23);
    CHECK(fabs(shuffled[2].drift_ms - 30 * 1000.0 / 15360) < 1e-9);
    CHECK(fabs(map.max_abs_drift_ms - 30 * 1000.0 / 15360) < 1e-9);
    int64_t o;
    CHECK_OK(vf_video_episode_frame(&shuffled[0], 4, &o));
    CHECK_EQ_INT(o, 22);
    CHECK_ERR(vf_video_episode_frame(&shuffled[0], 5, &o), VF_ERANGE, "episode 102: frame 5 out of range");
    CHECK_ERR(vf_video_episode_frame(&shuffled[0], -1, &o), VF_ERANGE, "out of range");
    CHECK(shuffled[0].frame_ordinals == NULL);
    vf_video_map_free(&map, shuffled, 4);
    vf_video_index_free(ix);

    /* Drift beyond a frame (many episodes into a file), grown by under a
     * millisecond per episode: ordinal mapping stays exact; the late starts
     * are reported as DRIFT (informational). */
    enum { MANY = 60 };
    int64_t at_many[MANY], ticks_many[MANY], lengths_many[MANY];
    for (int i = 0; i < MANY; i++) {
        at_many[i] = 2 * i + 2;
        ticks_many[i] = 10; /* 0.65 ms per episode, 38 ms after 59 */
        lengths_many[i] = 2;
    }
    ix = make_index(2 * MANY, at_many, ticks_many, MANY - 1, NULL, 0);
    vf_video_episode many[MANY];
    set_episodes(many, lengths_many, MANY);
    CHECK_OK(vf_video_map_episodes(ix, many, MANY, &ms, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_ORDINAL);
    CHECK(map.problem_count > 0);
    for (size_t p = 0; p < map.problem_count; p++)
        CHECK_EQ_INT(map.problems[p].kind, VF_VIDEO_PROBLEM_DRIFT);
    CHECK(map.max_abs_drift_ms > 1000.0 / 30);
    CHECK_OK(vf_video_episode_frame(&many[MANY - 1], 1, &o));
    CHECK_EQ_INT(o, 2 * MANY - 1);
    vf_video_map_free(&map, many, MANY);
    vf_video_index_free(ix);

    /* A jump of more than the tolerance from one episode to the next: the
     * frames are not where the metadata says (a swapped or replaced file):
     * the episode is refused as a whole, the earlier one is served. */
    static const int64_t at2[] = {7};
    static const int64_t ticks2[] = {700}; /* 45.6 ms: more than a frame */
    ix = make_index(12, at2, ticks2, 1, NULL, 0);
    static const int64_t lengths2[] = {7, 5};
    set_episodes(eps, lengths2, 2);
    CHECK_OK(vf_video_map_episodes(ix, eps, 2, &ms, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_ORDINAL);
    CHECK_EQ_INT(map.problem_count, 1);
    if (map.problem_count == 1) {
        CHECK_EQ_INT(map.problems[0].kind, VF_VIDEO_PROBLEM_UNMATCHED);
        CHECK_EQ_INT(map.problems[0].episode_index, 101);
        CHECK_EQ_INT(map.problems[0].frame, 0);
        CHECK(strstr(map.problems[0].message, "+45.573 ms") != NULL);
        CHECK(strstr(map.problems[0].message, "camera front") != NULL);
    }
    CHECK_OK(vf_video_episode_frame(&eps[0], 6, &o));
    CHECK_ERR(vf_video_episode_frame(&eps[1], 3, &o), VF_ECORRUPT, "episode 101: refused");
    vf_video_map_free(&map, eps, 2);
    vf_video_index_free(ix);

    /* Same count, but frames retimed inside an episode (one dropped, one
     * added at the end): the pts grid check refuses that episode. */
    static const int64_t at3[] = {3};
    static const int64_t ticks3[] = {512};
    ix = make_index(12, at3, ticks3, 1, NULL, 0);
    static const int64_t lengths3[] = {12};
    set_episodes(eps, lengths3, 1);
    CHECK_OK(vf_video_map_episodes(ix, eps, 1, &ms, &map));
    CHECK_EQ_INT(map.problem_count, 1);
    CHECK_EQ_INT(map.problems[0].kind, VF_VIDEO_PROBLEM_UNMATCHED);
    CHECK_EQ_INT(map.problems[0].frame, 3);
    CHECK_ERR(vf_video_episode_frame(&eps[0], 0, &o), VF_ECORRUPT, "first unmatched frame 3");
    vf_video_map_free(&map, eps, 1);
    vf_video_index_free(ix);
}

static void test_dropped_frames(void)
{
    /* Episode 1 (frames 7..17) lost its frames 3 and 4 (ordinals 10, 11). */
    static const int64_t lengths[] = {7, 11, 5};
    static const int64_t drop[] = {10, 11};
    vf_video_index *ix = make_index(23, NULL, NULL, 0, drop, 2);
    CHECK_EQ_INT(ix->frame_count, 21);
    vf_video_episode eps[3];
    set_episodes(eps, lengths, 3);
    vf_video_map map;
    vf_video_map_settings ms = {.fps = 30};
    CHECK_OK(vf_video_map_episodes(ix, eps, 3, &ms, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_TIMESTAMP);
    CHECK_EQ_INT(map.problem_count, 3);
    if (map.problem_count == 3) {
        CHECK_EQ_INT(map.problems[0].kind, VF_VIDEO_PROBLEM_COUNT_MISMATCH);
        CHECK(strstr(map.problems[0].message, "hold 23 frames but the video has 21") != NULL);
        CHECK_EQ_INT(map.problems[1].kind, VF_VIDEO_PROBLEM_MISSING_FRAMES);
        CHECK_EQ_INT(map.problems[1].episode_index, 101);
        CHECK_EQ_INT(map.problems[1].frame, 3);
        CHECK_EQ_INT(map.problems[1].count, 2);
        CHECK_EQ_INT(map.problems[2].kind, VF_VIDEO_PROBLEM_UNMATCHED);
        CHECK_EQ_INT(map.problems[2].episode_index, 101);
        CHECK_EQ_INT(map.problems[2].frame, 3);
    }
    CHECK_EQ_INT(eps[0].first_ordinal, 0);
    CHECK(eps[0].frame_ordinals == NULL);
    CHECK_EQ_INT(eps[0].frames_found, 7);
    CHECK_EQ_INT(eps[1].frames_found, 9);
    CHECK(eps[1].frame_ordinals != NULL);
    int64_t o;
    /* No frame of an episode with unmatched frames is handed out. */
    CHECK_ERR(vf_video_episode_frame(&eps[1], 2, &o), VF_ECORRUPT, "episode 101: refused");
    CHECK_ERR(vf_video_episode_frame(&eps[1], 3, &o), VF_ECORRUPT, "first unmatched frame 3");
    CHECK_ERR(vf_video_episode_frame(&eps[1], 5, &o), VF_ECORRUPT, "no video frame within 15.00 ms");
    CHECK_OK(vf_video_episode_frame(&eps[0], 6, &o));
    CHECK_EQ_INT(o, 6);
    CHECK_OK(vf_video_episode_frame(&eps[2], 0, &o));
    CHECK_EQ_INT(o, 16);
    CHECK(eps[2].frame_ordinals == NULL);
    CHECK(fabs(eps[2].drift_ms) < 1e-9);
    vf_video_map_free(&map, eps, 3);
    CHECK(eps[1].frame_ordinals == NULL);
    vf_video_index_free(ix);
}

static void test_other_mismatches(void)
{
    vf_video_map map;
    vf_video_map_settings ms = {.fps = 30};
    vf_video_episode eps[2];
    int64_t o;
    /* The file holds frames of an episode not listed: timestamps locate the
     * listed ones exactly. */
    vf_video_index *ix = make_index(20, NULL, NULL, 0, NULL, 0);
    static const int64_t lengths[] = {8, 6};
    set_episodes(eps, lengths, 2);
    eps[1].from_timestamp += 6 / 30.0; /* frames 8..13 belong to an unlisted episode */
    eps[1].to_timestamp += 6 / 30.0;
    /* ... but a file with more frames than its episodes is not the file the
     * metadata describes: every episode in it is refused, whatever the
     * mismatch policy. */
    for (int policy = VF_VIDEO_MISMATCH_REFUSE; policy <= VF_VIDEO_MISMATCH_TIMESTAMP; policy++) {
        CHECK_OK(vf_video_map_episodes_policy(ix, eps, 2, &ms, (vf_video_mismatch)policy, &map));
        CHECK_EQ_INT(map.method, VF_VIDEO_MAP_REFUSED);
        CHECK_EQ_INT(map.problem_count, 3);
        CHECK_EQ_INT(map.problems[0].kind, VF_VIDEO_PROBLEM_FILE_REFUSED);
        CHECK_EQ_INT(map.problems[1].kind, VF_VIDEO_PROBLEM_UNMATCHED);
        CHECK_ERR(vf_video_episode_frame(&eps[1], 5, &o), VF_ECORRUPT, "the file holds 20 frames but its 2 "
                                                                       "episodes declare 14; more frames than its "
                                                                       "episodes hold (another file in its place?)");
        CHECK_ERR(vf_video_episode_frame(&eps[0], 0, &o), VF_ECORRUPT, "episode 100: refused");
        vf_video_map_free(&map, eps, 2);
    }

    /* An episode reaching past the end of the file: no pts gap locates the
     * 5 missing frames, so the file is refused; by timestamp (the opt-in)
     * the first episode is served and the second refused from frame 5. */
    static const int64_t long_lengths[] = {15, 10};
    set_episodes(eps, long_lengths, 2);
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 2, &ms, VF_VIDEO_MISMATCH_REFUSE, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_REFUSED);
    CHECK_ERR(vf_video_episode_frame(&eps[0], 0, &o), VF_ECORRUPT, "holds 20 frames but its 2 episodes declare 25");
    vf_video_map_free(&map, eps, 2);
    CHECK_OK(vf_video_map_episodes_policy(ix, eps, 2, &ms, VF_VIDEO_MISMATCH_TIMESTAMP, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_TIMESTAMP);
    CHECK_EQ_INT(map.problems[0].kind, VF_VIDEO_PROBLEM_FILE_BY_TIMESTAMP);
    CHECK_EQ_INT(eps[1].frames_found, 5);
    CHECK_OK(vf_video_episode_frame(&eps[0], 14, &o));
    CHECK_ERR(vf_video_episode_frame(&eps[1], 4, &o), VF_ECORRUPT, "first unmatched frame 5");
    CHECK_EQ_INT(map.problems[map.problem_count - 1].kind, VF_VIDEO_PROBLEM_UNMATCHED);
    CHECK_EQ_INT(map.problems[map.problem_count - 2].count, 5);
    vf_video_map_free(&map, eps, 2);

    /* (to - from) * fps disagreeing with length is reported, and the
     * episode refused (its frames cannot all lie in the recorded span). */
    static const int64_t even[] = {10, 10};
    set_episodes(eps, even, 2);
    eps[0].to_timestamp -= 2 / 30.0;
    CHECK_OK(vf_video_map_episodes(ix, eps, 2, &ms, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_ORDINAL);
    CHECK_EQ_INT(map.problem_count, 2);
    CHECK_EQ_INT(map.problems[1].kind, VF_VIDEO_PROBLEM_UNMATCHED);
    CHECK_EQ_INT(map.problems[0].kind, VF_VIDEO_PROBLEM_SPAN_MISMATCH);
    CHECK(strstr(map.problems[0].message, "episode 100") != NULL);
    CHECK_ERR(vf_video_episode_frame(&eps[0], 0, &o), VF_ECORRUPT, "first unmatched frame 8");
    CHECK_OK(vf_video_episode_frame(&eps[1], 0, &o));
    vf_video_map_free(&map, eps, 2);
    /* to = the last frame's time (from + (length - 1) / fps) is accepted. */
    set_episodes(eps, even, 2);
    eps[0].to_timestamp -= 1 / 30.0;
    eps[1].to_timestamp -= 1 / 30.0;
    CHECK_OK(vf_video_map_episodes(ix, eps, 2, &ms, &map));
    CHECK_EQ_INT(map.problem_count, 0);
    vf_video_map_free(&map, eps, 2);

    /* Invalid arguments. */
    set_episodes(eps, even, 2);
    eps[1].length = 0;
    CHECK_ERR(vf_video_map_episodes(ix, eps, 2, &ms, &map), VF_EINVAL, "episode 101 has invalid metadata");
    eps[1].length = 10;
    eps[1].from_timestamp = NAN;
    CHECK_ERR(vf_video_map_episodes(ix, eps, 2, &ms, &map), VF_EINVAL, "invalid metadata");
    set_episodes(eps, even, 2);
    vf_video_map_settings bad = {.fps = 0};
    CHECK_ERR(vf_video_map_episodes(ix, eps, 2, &bad, &map), VF_EINVAL, "positive fps");
    vf_video_map_settings wide = {.fps = 30, .tolerance_s = 0.02};
    CHECK_ERR(vf_video_map_episodes(ix, eps, 2, &wide, &map), VF_EINVAL, "below half a frame");
    /* No episodes at all: valid, nothing mapped. */
    CHECK_OK(vf_video_map_episodes(ix, eps, 0, &ms, &map));
    CHECK(map.method != VF_VIDEO_MAP_REFUSED);
    vf_video_map_free(&map, eps, 0);
    vf_video_index_free(ix);
}

int main(void)
{
    test_ordinal_with_drift();
    test_dropped_frames();
    test_other_mismatches();
    return vf_test_finish("test_video_map");
}
