/*
 * test_make_sample.c: `vlafeed make-sample` datasets read back through the
 * dataset locator and the video layer: EVERY frame of every episode and
 * camera carries its own identity (AV1 GOP 2 and H.264 GOP 30, several
 * files per camera, LeRobot's drift present), every table value equals the
 * ground-truth functions, and the frame/decode-check paths report bad input
 * by file, camera and episode.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "dataset/dataset.h"
#include "testutil.h"
#include "vlafeed/make_sample.h"

static vf_dataset *open_dataset(const char *root)
{
    vf_dataset *d = NULL;
    CHECK_OK(vf_dataset_open(&d, root, NULL));
    return d;
}

/* Every frame of every file by ordinal, in one batched request per file. */
static void check_every_frame(vf_dataset *d, int *files_seen, double *max_drift_ms)
{
    for (size_t c = 0; c < vf_dataset_num_cameras(d); c++) {
        for (size_t f = 0; f < vf_dataset_num_video_files(d, c); f++) {
            vf_ds_video_map m;
            CHECK_OK(vf_ds_video_map_build(d, c, f, &m));
            if (!m.index)
                continue;
            CHECK_EQ_INT(m.map.method, VF_VIDEO_MAP_BY_ORDINAL);
            *max_drift_ms = fmax(*max_drift_ms, m.map.max_abs_drift_ms);
            (*files_seen)++;
            vf_video_reader *reader = NULL;
            CHECK_OK(vf_video_open_file(&reader, m.path, NULL));
            const vf_video_index *ix = vf_video_reader_index(reader);
            vf_video_format fmt;
            vf_video_format_defaults(&fmt);
            size_t frame_bytes = vf_video_format_bytes(&fmt, ix->width, ix->height);
            int64_t total = 0;
            for (size_t e = 0; e < m.num_episodes; e++)
                total += m.episodes[e].length;
            vf_video_request *req = calloc((size_t)total, sizeof *req);
            uint8_t *pixels = malloc((size_t)total * frame_bytes);
            size_t n = 0;
            for (size_t e = 0; e < m.num_episodes; e++) {
                for (int64_t k = 0; k < m.episodes[e].length; k++) {
                    int64_t ordinal = -1;
                    CHECK_OK(vf_ds_video_map_ordinal(&m, d, m.episodes[e].episode_index, k, &ordinal));
                    req[n].frame_ordinal = ordinal;
                    req[n].dest = pixels + n * frame_bytes;
                    req[n].episode = m.episodes[e].episode_index;
                    req[n].frame_in_episode = k;
                    n++;
                }
            }
            CHECK_OK(vf_video_read_frames(reader, req, n, &fmt));
            int stamp_h = ix->height >= 128 ? ix->height / 2 : ix->height;
            int wrong = 0;
            for (size_t i = 0; i < n; i++) {
                int64_t episode = -1, frame = -1;
                int camera = -1;
                int r = vf_video_read_identity(req[i].dest, ix->width, stamp_h, (size_t)ix->width * 3, &episode,
                                               &frame, &camera);
                if (r < 0 || episode != req[i].episode || frame != req[i].frame_in_episode || camera != (int)c) {
                    if (wrong++ < 5)
                        fprintf(stderr, "%s: episode %lld frame %lld: read (%lld, %lld, cam %d) r=%d\n", m.path,
                                (long long)req[i].episode, (long long)req[i].frame_in_episode,
                                (long long)episode, (long long)frame, camera, r);
                }
            }
            CHECK_EQ_INT(wrong, 0);
            free(req);
            free(pixels);
            vf_video_close(reader);
            vf_ds_video_map_free(&m);
        }
    }
}

static void check_tables(vf_dataset *d, const vf_make_sample_settings *s)
{
    size_t n = vf_dataset_num_episodes(d);
    size_t *positions = malloc(n * sizeof *positions);
    for (size_t i = 0; i < n; i++)
        positions[i] = i;
    const char *cols[] = {"observation.state", "action", "timestamp", "frame_index", "episode_index", "index",
                          "task_index"};
    vf_ds_table t;
    CHECK_OK(vf_ds_read_table(d, positions, n, cols, 7, VF_DS_VERIFY_INDEX, &t));
    int bad = 0;
    for (size_t e = 0; e < n && t.columns; e++) {
        for (int64_t row = t.episode_start[e]; row < t.episode_start[e + 1]; row++) {
            int k = (int)(row - t.episode_start[e]);
            const float *state = (const float *)t.columns[0].values + row * s->state_dim;
            const float *action = (const float *)t.columns[1].values + row * s->state_dim;
            for (int dim = 0; dim < s->state_dim; dim++) {
                bad += state[dim] != vf_make_sample_state((int)e, k, dim);
                bad += action[dim] != vf_make_sample_action((int)e, k, dim);
            }
            bad += ((const float *)t.columns[2].values)[row] != (float)((double)k / s->fps);
            bad += ((const int64_t *)t.columns[3].values)[row] != k;
            bad += ((const int64_t *)t.columns[4].values)[row] != (int64_t)e;
            bad += ((const int64_t *)t.columns[6].values)[row] != (int64_t)e % s->num_tasks;
        }
        CHECK_EQ_INT(vf_dataset_episode(d, e)->length, vf_make_sample_episode_length(s, (int)e));
    }
    CHECK_EQ_INT(bad, 0);
    vf_ds_table_free(&t);
    free(positions);
}

static void roundtrip(const char *codec, int gop, int width, int height, double max_video_mb)
{
    char *dir = vf_test_tmpdir("sample");
    char *root = vf_path_join(dir, "ds");
    vf_make_sample_settings s;
    vf_make_sample_defaults(&s);
    s.codec = codec;
    s.gop = gop;
    s.num_episodes = 7;
    s.num_cameras = 2;
    s.width = width;
    s.height = height;
    s.min_length = 20;
    s.max_length = 44;
    s.max_video_mb = max_video_mb; /* a few episodes per file, so files roll over */
    s.max_data_mb = 0.003; /* and data files too */
    CHECK_OK(vf_make_sample(root, &s));
    vf_dataset *d = open_dataset(root);
    if (d) {
        CHECK_EQ_INT(vf_dataset_num_problems(d), 0);
        CHECK_EQ_INT(vf_dataset_num_episodes(d), 7);
        CHECK(vf_dataset_num_data_files(d) > 1);
        int files = 0;
        double drift = 0;
        check_every_frame(d, &files, &drift);
        CHECK(vf_dataset_num_video_files(d, 0) > 1);
        CHECK(drift > 0.3 && drift < 5.0);      /* LeRobot's concatenation drift is present */
        check_tables(d, &s);
        vf_dataset_close(d);
    }
    /* make-sample refuses to overwrite a dataset */
    CHECK_ERR(vf_make_sample(root, &s), VF_EINVAL, "already holds a dataset");
    vf_test_rmtree(dir);
    free(root);
    free(dir);
}

static void errors(void)
{
    vf_make_sample_settings s;
    vf_make_sample_defaults(&s);
    s.codec = "vp9";
    CHECK_ERR(vf_make_sample("/tmp/never-written", &s), VF_EINVAL, "--codec");
    vf_make_sample_defaults(&s);
    s.height = 48;
    CHECK_ERR(vf_make_sample("/tmp/never-written", &s), VF_EINVAL, "64 px");
    vf_make_sample_defaults(&s);
    s.min_length = 10;
    s.max_length = 5;
    CHECK_ERR(vf_make_sample("/tmp/never-written", &s), VF_EINVAL, "lengths");
    CHECK(!vf_dir_exists("/tmp/never-written"));

    /* a dataset with damaged videos: errors name file, camera and episode */
    char *dir = vf_test_tmpdir("sample-bad");
    char *root = vf_path_join(dir, "ds");
    vf_make_sample_defaults(&s);
    s.codec = "h264";
    s.num_episodes = 3;
    s.num_cameras = 2;
    s.width = 96;
    s.height = 64;
    s.min_length = 10;
    s.max_length = 12;
    CHECK_OK(vf_make_sample(root, &s));
    char *cam0 = vf_path_join(root, "videos/observation.images.cam0/chunk-000/file-000.mp4");
    char *cam1 = vf_path_join(root, "videos/observation.images.cam1/chunk-000/file-000.mp4");
    CHECK(unlink(cam0) == 0);
    FILE *f = fopen(cam1, "r+b");
    CHECK(f != NULL);
    if (f) {
        CHECK(ftruncate(fileno(f), 900) == 0);
        fclose(f);
    }
    vf_dataset *d = NULL;
    CHECK_OK(vf_dataset_open(&d, root, NULL));
    if (d) {
        CHECK(vf_dataset_num_missing_files(d) == 1);
        uint8_t *rgb = NULL;
        int w, h;
        CHECK_ERR(vf_dataset_read_frame(d, 1, 0, "observation.images.cam0", &rgb, &w, &h), VF_ENOENT,
                  "file-000.mp4: video file missing (camera observation.images.cam0, episode 1)");
        CHECK(vf_dataset_read_frame(d, 1, 0, "observation.images.cam1", &rgb, &w, &h) < 0);
        CHECK(strstr(vf_last_error(), "observation.images.cam1/chunk-000/file-000.mp4") != NULL);
        CHECK_ERR(vf_dataset_read_frame(d, 1, 0, "observation.images.nope", &rgb, &w, &h), VF_ENOENT,
                  "no camera 'observation.images.nope'");
        CHECK_ERR(vf_dataset_read_frame(d, 1, 99, "observation.images.cam1", &rgb, &w, &h), VF_ERANGE,
                  "frame 99 is out of range");
        CHECK_ERR(vf_dataset_read_frame(d, 7, 0, "observation.images.cam1", &rgb, &w, &h), VF_ENOENT, "7");
        char *report = NULL;
        size_t nerr = 0;
        CHECK_OK(vf_dataset_decode_check(d, NULL, &report, &nerr));
        CHECK(nerr >= 2);
        CHECK(report && strstr(report, "\"missing_file\"") && strstr(report, "observation.images.cam1"));
        free(report);
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(cam0);
    free(cam1);
    free(root);
    free(dir);
}

int main(void)
{
    vf_set_log_level(0);
    roundtrip("av1", 2, 128, 96, 0.08);
    roundtrip("h264", 30, 96, 64, 0.012);
    errors();
    return vf_test_finish("test_make_sample");
}
