/*
 * make_sample.h: writes a complete synthetic LeRobot v3.0 dataset (the
 * embedded default of vlafeed, and the ground truth of its exactness tests).
 *
 * The dataset is laid out exactly as LeRobot's recorder writes it:
 * meta/info.json, meta/episodes/chunk-000/file-000.parquet, meta/tasks.parquet,
 * meta/stats.json (real statistics), data/chunk-XXX/file-YYY.parquet (one row
 * group per episode, rollover by size) and, per camera, MP4 files holding many
 * episodes concatenated the way LeRobot concatenates them (so the known
 * timestamp drift is reproduced) with per-camera rollover by size.
 *
 * Ground truth: every frame carries its identity (episode, frame index,
 * camera) in large pixel blocks (vf_video_read_identity reads it back), and
 * every tabular value is the pure function documented below, so a test can
 * prove that what a loader returns for (episode, frame, camera) is right.
 */
#ifndef VLAFEED_MAKE_SAMPLE_H
#define VLAFEED_MAKE_SAMPLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vf_make_sample_settings {
    int num_episodes;        /* default 8 */
    int num_cameras;         /* default 2: observation.images.cam0, cam1, ... */
    int fps;                 /* default 30 */
    int width, height;       /* default 320x240 (SVT-AV1 needs height >= 64) */
    const char *codec;       /* "av1" (libsvtav1, default), "h264", "hevc" */
    int gop;                 /* keyframe interval, default 2 (LeRobot) */
    int crf;                 /* default 30 (LeRobot) */
    double max_video_mb;     /* per-camera MP4 rollover, default 200 */
    double max_data_mb;      /* data Parquet rollover, default 100 */
    uint64_t seed;           /* episode lengths and task assignment, default 0 */
    int min_length;          /* frames per episode, default 40 */
    int max_length;          /* default 100 */
    int num_tasks;           /* default 3 */
    int state_dim;           /* observation.state and action width, default 6 */
    int encoder_threads;     /* per encoder, default 1 */
    /* Called after each (episode, camera) is written; may be NULL. */
    void (*progress)(void *ctx, int done, int total, const char *what);
    void *progress_ctx;
} vf_make_sample_settings;

void vf_make_sample_defaults(vf_make_sample_settings *s);

/* Writes the dataset under out_dir (created; must not already hold a
 * dataset). Returns 0 or a negative code with vf_last_error() set. */
int vf_make_sample(const char *out_dir, const vf_make_sample_settings *s);

/* The ground-truth functions (also documented in docs/engine.md):
 *   length(e)              = min + splitmix64(seed*1000003 + e) % (max-min+1)
 *   observation.state[d]   = sin(0.05*k + 0.3*d + e)           (float32)
 *   action[d]              = sin(0.05*(k+1) + 0.3*d + e)       (the next state)
 *   task_index             = e % num_tasks
 * for episode e and frame index k. */
int vf_make_sample_episode_length(const vf_make_sample_settings *s, int episode);
float vf_make_sample_state(int episode, int frame, int dim);
float vf_make_sample_action(int episode, int frame, int dim);

#ifdef __cplusplus
}
#endif

#endif
