/*
 * test_lerobotv3_join.c: the MP4 joiner of the v2.1 -> v3.0 converter
 * (src/lerobotv3/join.c).
 *
 *  - episodes of lengths that are not multiples of 3 at 30 fps (where
 *    FFmpeg's concat demuxer drifts) are placed exactly: from/to timestamps
 *    are k/30 sums, the video layer maps every episode by ordinal with zero
 *    drift, and every frame decodes with its own identity stamp;
 *  - H.264 with B-frames (decode order != presentation order) joins too;
 *  - an episode with other codec parameters is refused with
 *    VF_LR3_INCOMPATIBLE and nothing written; a frame count that disagrees
 *    with the expected length and a corrupt source fail naming the source;
 *  - abort removes the partial file.
 */
#include <math.h>
#include <unistd.h>

#include "lerobotv3/lerobotv3.h"
#include "test_video_helpers.h"

static int append_file(vf_lr3_join *j, const char *path, int64_t expected, vf_lr3_appended *res)
{
    vf_source *src = NULL;
    int r = vf_source_open_file(&src, path);
    if (r < 0)
        return r;
    r = vf_lr3_join_append(j, src, expected, res);
    vf_source_close(src);
    return r;
}

/* Joins the episodes (lengths[i] frames, episode id i) and checks the file. */
static void join_and_check(const char *dir, vf_video_codec codec, const char *tag)
{
    const int64_t lengths[3] = {13, 7, 10};
    char *eps[3];
    for (int i = 0; i < 3; i++) {
        eps[i] = vf_asprintf("%s/%s-ep%d.mp4", dir, tag, i);
        CHECK_OK(write_stamped(eps[i], codec, 96, 64, 2, i, lengths[i], 1));
    }
    char *out = vf_asprintf("%s/%s-joined.mp4", dir, tag);
    vf_lr3_join *j = NULL;
    CHECK_OK(vf_lr3_join_open(&j, out));
    vf_video_episode mapped[3];
    memset(mapped, 0, sizeof mapped);
    int64_t start = 0;
    for (int i = 0; i < 3 && j; i++) {
        vf_lr3_appended res;
        CHECK_OK(append_file(j, eps[i], lengths[i], &res));
        CHECK_EQ_INT(res.frames, lengths[i]);
        CHECK(fabs(res.from_timestamp - start / 30.0) < 1e-12);
        CHECK(fabs(res.to_timestamp - (start + lengths[i]) / 30.0) < 1e-12);
        mapped[i].episode_index = i;
        mapped[i].from_timestamp = res.from_timestamp;
        mapped[i].to_timestamp = res.to_timestamp;
        mapped[i].length = lengths[i];
        start += lengths[i];
    }
    CHECK_EQ_INT(vf_lr3_join_episodes(j), 3);
    CHECK_EQ_INT(vf_lr3_join_packets(j), 30);
    CHECK_OK(vf_lr3_join_close(j));

    vf_video_index *ix = NULL;
    CHECK_OK(vf_video_index_build_file(&ix, out));
    if (ix) {
        CHECK_EQ_INT(ix->frame_count, 30);
        vf_video_map map;
        vf_video_map_settings ms = {30.0, 0, tag};
        CHECK_OK(vf_video_map_episodes(ix, mapped, 3, &ms, &map));
        CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_ORDINAL);
        CHECK(map.max_abs_drift_ms < 1e-6);
        CHECK_EQ_INT(map.problem_count, 0);
        CHECK_EQ_INT(mapped[1].first_ordinal, 13);
        CHECK_EQ_INT(mapped[2].first_ordinal, 20);
        vf_video_map_free(&map, mapped, 3);
        vf_video_index_free(ix);
    }
    vf_video_reader *rd = NULL;
    CHECK_OK(vf_video_open_file(&rd, out, NULL));
    uint8_t *rgb = malloc(96 * 64 * 3);
    int64_t ordinal = 0;
    for (int i = 0; i < 3 && rd && rgb; i++)
        for (int64_t k = 0; k < lengths[i]; k++, ordinal++) {
            vf_video_format f;
            vf_video_format_defaults(&f);
            CHECK_OK(vf_video_read_frame(rd, ordinal, &f, rgb));
            CHECK(has_identity(rgb, 96, 64, i, k, 1));
        }
    free(rgb);
    vf_video_close(rd);
    for (int i = 0; i < 3; i++) {
        unlink(eps[i]);
        free(eps[i]);
    }
    unlink(out);
    free(out);
}

static void test_refusals(const char *dir)
{
    char *a = vf_asprintf("%s/a.mp4", dir), *wide = vf_asprintf("%s/wide.mp4", dir),
         *junk = vf_asprintf("%s/junk.mp4", dir), *out = vf_asprintf("%s/refusals.mp4", dir);
    CHECK_OK(write_stamped(a, VF_VIDEO_CODEC_AV1, 96, 64, 2, 0, 8, 0));
    CHECK_OK(write_stamped(wide, VF_VIDEO_CODEC_AV1, 128, 64, 2, 1, 8, 0));
    FILE *f = fopen(junk, "wb");
    if (f) {
        for (int i = 0; i < 4096; i++)
            fputc(i * 37, f);
        fclose(f);
    }
    vf_lr3_join *j = NULL;
    vf_lr3_appended res;
    CHECK_OK(vf_lr3_join_open(&j, out));
    /* a frame count that disagrees with the episode, before anything is written */
    CHECK_ERR(append_file(j, a, 9, &res), VF_ECORRUPT, "holds 8 frames, but the episode has 9 rows");
    CHECK_EQ_INT(vf_lr3_join_episodes(j), 0);
    CHECK_OK(append_file(j, a, 8, &res));
    int64_t bytes = vf_lr3_join_bytes(j);
    CHECK(bytes > 0);
    /* another resolution cannot share the track */
    CHECK_EQ_INT(append_file(j, wide, 8, &res), VF_LR3_INCOMPATIBLE);
    CHECK_EQ_INT(vf_lr3_join_bytes(j), bytes);
    CHECK_EQ_INT(vf_lr3_join_episodes(j), 1);
    /* a corrupt source names itself */
    int r = append_file(j, junk, 8, &res);
    CHECK(r < 0 && strstr(vf_last_error(), "junk.mp4"));
    CHECK_EQ_INT(vf_lr3_join_episodes(j), 1);
    vf_lr3_join_abort(j);
    CHECK(access(out, F_OK) != 0);
    /* closing a file that never got an episode is an error and leaves nothing */
    CHECK_OK(vf_lr3_join_open(&j, out));
    CHECK_ERR(vf_lr3_join_close(j), VF_EINVAL, "no episode was written");
    CHECK(access(out, F_OK) != 0);
    unlink(a);
    unlink(wide);
    unlink(junk);
    free(a);
    free(wide);
    free(junk);
    free(out);
}

int main(void)
{
    vf_video_set_ffmpeg_log_level(-1);
    char *dir = vf_test_tmpdir("lr3join");
    join_and_check(dir, VF_VIDEO_CODEC_AV1, "av1");
    join_and_check(dir, VF_VIDEO_CODEC_H264, "h264");
    test_refusals(dir);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_lerobotv3_join");
}
