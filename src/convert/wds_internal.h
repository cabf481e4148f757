/*
 * wds_internal.h: what the three files of vf_wds_convert share; the
 * convert layer's interface stays convert.h.
 *
 *  - wds.c: the job (settings, plan, permutation and keys, the run: pools of
 *    units then of buckets, the summary);
 *  - wds_units.c: the units of work that fill the spill: lowdim slices
 *    (npz windows, metadata, per-unit statistics) and camera files (decode,
 *    JPEG, one record per sample and offset that uses a frame);
 *  - wds_output.c: what lands on disk: the state directory (journals,
 *    options, per-unit statistics), shards assembled from the spill, and the
 *    final files.
 *
 * Invariants: the plan (episodes, cameras, fields, units, shard count and
 * permutation keys) is fixed before any unit runs and read-only while the
 * pools run; what units and buckets share at run time is behind j->lock
 * (the first error, progress) or atomic (counters, abort), and each unit
 * or bucket writes only its own done_run / shard entries.
 */
#ifndef VF_CONVERT_WDS_INTERNAL_H
#define VF_CONVERT_WDS_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "convert/convert.h"
#include "dataset/dataset.h"
#include "vlafeed/convert.h"

/* The metadata columns copied into metadata.json (wds.c). */
#define VF_CV_NUM_META 5
extern const char *const vf_cv_meta_columns[VF_CV_NUM_META];

typedef struct vf_cv_episode {
    size_t pos;
    int64_t episode_index, length, base;
    const char *task;
} vf_cv_episode;

typedef struct vf_cv_field {
    const vf_feature *feature;
    const char *descr;
    size_t elem;          /* bytes per element in the npz */
    int64_t width;        /* values per row */
} vf_cv_field;

typedef struct vf_cv_camera {
    size_t index;         /* dataset camera index */
    const char *key;
    char *name;           /* key without "observation.images." */
    int src_width, src_height;
    int scaled_width, scaled_height; /* decode size (cover size when resizing) */
    int out_width, out_height;
    int crop_x, crop_y;
} vf_cv_camera;

enum { VF_CV_UNIT_LOWDIM = 0, VF_CV_UNIT_VIDEO = 1 };

typedef struct vf_cv_unit {
    int kind;
    size_t first, count;  /* lowdim: episodes [first, first+count) of j->eps */
    size_t cam, file;     /* video: j->cams[cam], file index in the camera's list */
    int64_t work;         /* progress weight: samples or frames */
    uint32_t done_run;    /* run in which it finished, 0 if not */
} vf_cv_unit;

typedef struct vf_cv_stats {
    /* per field: count[T], then mean, m2, min, max [T*width] */
    double **count, **mean, **m2, **min, **max;
} vf_cv_stats;

typedef struct vf_cv_job {
    const vf_wds_convert_settings *s;
    vf_dataset *d;
    const char *source;
    int T, past, future;
    int offsets[VF_WDS_MAX_OFFSETS];
    int num_offsets;
    int64_t sps;

    vf_cv_episode *eps;
    size_t num_eps;
    uint64_t N;
    uint64_t num_shards, shards_per_bucket;
    size_t num_buckets;
    int half_bits;
    uint64_t round_keys[6];

    vf_cv_camera *cams;
    size_t num_cams;
    vf_cv_field *fields;
    size_t num_fields;
    const vf_feature **left_out;   /* table features with no npz form (strings, images, unknown dtypes, > 3 dims) */
    const char **left_out_why;
    size_t num_left_out;
    const vf_feature *meta[VF_CV_NUM_META];
    size_t num_members;    /* images + 3 */

    vf_cv_unit *units;
    size_t num_units, num_lowdim_units;

    char *shards_dir, *state_dir;
    uint32_t run;
    vf_cv_spill *spill;
    uint8_t *shard_done;
    uint64_t *shard_bytes;
    uint32_t *shard_crc;
    int journal_units_fd, journal_shards_fd, lock_fd;

    pthread_mutex_t lock;
    int err;
    char err_msg[1024];
    _Atomic int abort;
    int64_t progress_done, progress_total;

    _Atomic uint64_t units_finished, frames_needed, frames_decoded, jpegs, records, shards_written;
    uint64_t shards_kept, units_skipped, spill_bytes;
} vf_cv_job;

/* What one pool task works on: unit `index` (vf_cv_unit_job) or spill bucket
 * `index` (vf_cv_bucket_job) of job j. */
typedef struct vf_cv_work {
    vf_cv_job *j;
    size_t index;
} vf_cv_work;

/* ---- wds.c ---------------------------------------------------------------- */

/* Records the first error (its message from vf_last_error) and asks every
 * unit to stop. */
void vf_cv_job_fail(vf_cv_job *j, int r);
/* Adds amount to the progress and reports it (when the caller asked). */
void vf_cv_job_progress(vf_cv_job *j, int64_t amount, const char *phase);
/* The test hook VF_CONVERT_KILL_AFTER (see wds.c). */
void vf_cv_maybe_kill_for_test(const char *phase, uint64_t done);
/* The sample key of (episode, frame): 32 hex digits from the seed. */
void vf_cv_sample_key(const vf_cv_job *j, int64_t episode_index, int64_t frame, char out[33]);
/* Samples in a shard (the last one may be short). */
uint64_t vf_cv_shard_samples(const vf_cv_job *j, uint64_t shard);
/* Spills member `member` of the sample (episode e, anchor t) to the bucket
 * of its shard (nothing when that shard is already done). */
int vf_cv_put_record(vf_cv_job *j, uint32_t unit, const vf_cv_episode *e, int64_t t, int member, const void *data,
                     size_t len);

/* ---- wds_units.c ---------------------------------------------------------- */

/* Per-field statistics arrays for the job's fields, zeroed. */
int vf_cv_stats_alloc(const vf_cv_job *j, vf_cv_stats *st);
void vf_cv_stats_free(const vf_cv_job *j, vf_cv_stats *st);
/* A pool task: runs one unit (a vf_cv_work), then journals it. */
void vf_cv_unit_job(void *p);

/* ---- wds_output.c --------------------------------------------------------- */

/* A file name under the state directory, formatted (caller frees). */
char *vf_cv_state_path(const vf_cv_job *j, const char *fmt, ...) VF_PRINTF(2, 3);
/* Writes data to path through path.tmp, fsync and rename. */
int vf_cv_write_atomic(const char *path, const void *data, size_t len);
/* Appends one line to a journal. */
int vf_cv_journal_append(int fd, const char *line);
/* A pool task: assembles the unfinished shards of one spill bucket (a
 * vf_cv_work). */
void vf_cv_bucket_job(void *p);
/* The options that decide the output, as saved in options.json. */
json_t *vf_cv_options_json(const vf_cv_job *j);
/* VF_EINVAL naming the first option whose value differs. */
int vf_cv_compare_options(const char *where, json_t *saved, json_t *now);
/* Loads the resume state (units finished, shards verified) of an earlier run. */
int vf_cv_load_state(vf_cv_job *j);
/* manifest.jsonl, stats.json, preprocessing_config.yaml, then
 * processing_metadata.json last. */
int vf_cv_write_final_files(vf_cv_job *j, json_t *options);
/* Removes the state directory and its files. */
void vf_cv_remove_state_dir(const char *dir);
/* Verifies the shards of a complete conversion against its metadata. */
int vf_cv_verify_complete(vf_cv_job *j, json_t *pm);

#endif
