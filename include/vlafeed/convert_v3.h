/*
 * convert_v3.h: LeRobot v2.1 -> v3.0 dataset conversion (the engine behind
 * `vlafeed convert SRC OUT --to lerobot-v3`).
 *
 *   vf_convert_v3_settings s;  vf_convert_v3_defaults(&s);
 *   vf_convert_v3_report rep;
 *   if (vf_convert_v3("/data/v21", "/data/v30", &s, &rep) < 0)
 *       fprintf(stderr, "%s\n", vf_last_error());
 *
 * What is written (lerobot-format.md §1-§6, §10.2), under OUT:
 *  - data/chunk-XXX/file-YYY.parquet: the source's per-episode rows, every
 *    column and value as the source holds it (one row group per episode),
 *    many episodes per file, a new file when the file would pass
 *    data_files_size_in_mb (estimated from the source files' sizes);
 *  - videos/<key>/chunk-XXX/file-YYY.mp4: per camera, the source's
 *    per-episode MP4s joined by stream copy (packets remuxed, never
 *    re-encoded), each episode placed exactly at the end of the previous
 *    one (no concatenation drift), a new file when the file would pass
 *    video_files_size_in_mb or when an episode's codec parameters differ
 *    from the file's; from/to timestamps are the written packets' times;
 *  - meta/episodes/chunk-000/file-000.parquet (LeRobot's columns: index
 *    ranges, data and per-camera video file indices and timestamps, the
 *    per-episode stats of meta/episodes_stats.jsonl), meta/tasks.parquet,
 *    meta/stats.json (aggregated as LeRobot aggregates), meta/info.json
 *    (codebase_version v3.0, v3 templates and size limits).
 * Episodes are numbered 0..N-1 in source order: with an episode subset the
 * `episode_index` and `index` columns are renumbered (and their stats);
 * with the whole of a contiguous source they are unchanged.
 *
 * Checks: every episode's row count against its length, every source MP4's
 * frame count against the length (errors name file, episode and camera),
 * and every written video file against the engine's own frame index (each
 * episode's frames exactly at from_timestamp + k/fps).
 *
 * The output is built in OUT.partial and renamed to OUT at the end, so OUT
 * is either absent or complete. An existing OUT is refused unless force.
 */
#ifndef VLAFEED_CONVERT_V3_H
#define VLAFEED_CONVERT_V3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vf_convert_v3_settings {
    double data_files_size_in_mb;  /* data Parquet rollover, default 100 (LeRobot) */
    double video_files_size_in_mb; /* per-camera MP4 rollover, default 200 (LeRobot since 2025-11) */
    int chunks_size;               /* files per chunk-XXX folder, default 1000 */
    const int64_t *episodes;       /* source episode indices to convert, NULL for all */
    size_t num_episodes;
    int force;                     /* 1: replace an existing OUT */
    int verify;                    /* 1 (default): check every written video against its frame index */
    int threads;                   /* the data and each camera are converted as parallel jobs on up to
                                    * this many threads; 0 (default): the number of cores; 1: in order */
    /* Called after each step (one episode's data, or one episode of one
     * camera), from the job threads one at a time (serialised); may be NULL. */
    void (*progress)(void *ctx, int64_t done, int64_t total, const char *what);
    void *progress_ctx;
} vf_convert_v3_settings;

typedef struct vf_convert_v3_report {
    int64_t episodes, frames;
    int64_t cameras;
    int64_t data_files;            /* data Parquet files written */
    int64_t video_files;           /* MP4 files written, all cameras */
    int64_t video_packets;         /* packets copied */
    int64_t bytes_read;            /* source data + video bytes */
    int64_t bytes_written;         /* output data + video bytes */
    double seconds;                /* wall time of the whole conversion */
    double max_abs_drift_ms;       /* over the written videos' frame index (0 when exact) */
} vf_convert_v3_report;

void vf_convert_v3_defaults(vf_convert_v3_settings *s);

/* Converts the LeRobot v2.1 (or v2.0 with meta/stats.json) dataset at src
 * (a folder, or an http(s):// or s3:// URL) into a v3.0 dataset at out (a
 * local folder). report may be NULL. Returns 0 or a negative VF_E* code
 * with vf_last_error() naming the file, episode and column or camera. On
 * failure nothing is left at out (OUT.partial is removed). */
int vf_convert_v3(const char *src, const char *out, const vf_convert_v3_settings *settings,
                  vf_convert_v3_report *report);

#ifdef __cplusplus
}
#endif

#endif
