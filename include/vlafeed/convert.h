/*
 * convert.h: the public API of vlafeed's dataset conversion: a LeRobot
 * v3.0 or v2.1 dataset (local folder or http(s)/s3 URL) into WebDataset
 * shards in VLA Foundry's robotics layout (docs: docs/wds.md, "Converting to
 * WebDataset shards").
 *
 *   vf_wds_convert_settings s;  vf_wds_convert_defaults(&s);
 *   s.samples_per_shard = 100;  s.seed = 7;
 *   char *summary = NULL;
 *   if (vf_wds_convert("/data/ds", "/data/ds-wds", &s, &summary) < 0)
 *       fprintf(stderr, "%s\n", vf_last_error());
 *   free(summary);
 *
 * Output: OUT/shards/shard_NNNNNN.tar, manifest.jsonl, stats.json,
 * processing_metadata.json, preprocessing_config.yaml. One sample per
 * (episode, anchor frame); samples are placed in shards in a global order
 * that is a pure function of the seed. Every video frame that some sample
 * uses is decoded exactly once (one forward pass per camera file) and
 * JPEG-encoded once; records go through an on-disk spill under
 * OUT/shards/.vlafeed-convert/ and shards are assembled from it.
 *
 * Memory: bounded by the threads, never by the dataset size (see
 * vf_wds_convert()).
 *
 * Resume: an interrupted run leaves the spill and the finished shards; the
 * same call with the same options continues (finished units of work and
 * verified shards are kept). Different options are refused with VF_EINVAL
 * naming the first option that differs.
 */
#ifndef VLAFEED_CONVERT_H
#define VLAFEED_CONVERT_H

#include "vlafeed/vlafeed.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VF_WDS_MAX_OFFSETS 64

typedef struct vf_wds_convert_settings {
    int64_t samples_per_shard;   /* default 100 */
    int past;                    /* lowdim steps before the anchor; default 1 */
    int future;                  /* lowdim steps after the anchor; default 14 */
    int image_offsets[VF_WDS_MAX_OFFSETS]; /* frame offsets of the images, default {-1, 0} */
    int num_image_offsets;       /* sorted and de-duplicated by the converter */
    /* Camera keys (e.g. "observation.images.top", or "top"), or NULL for
     * every non-depth video camera. The caller keeps the strings. */
    const char *const *cameras;
    size_t num_cameras;
    /* Episode indices to convert, or NULL for all. The caller keeps them. */
    const int64_t *episodes;
    size_t num_episodes;
    int resize_width, resize_height; /* 0 x 0 (default): the source size; else scale to
                                      * cover, then centre crop (VLA Foundry's center_crop) */
    int jpeg_quality;            /* 1..100, default 95 */
    uint64_t seed;               /* default 0 */
    int threads;                 /* worker threads; <= 0: the number of cores */
    /* Called (from one thread at a time) as work finishes; may be NULL.
     * phase is "decode", "assemble" or "done". */
    void (*progress)(void *ctx, int64_t done, int64_t total, const char *phase);
    void *progress_ctx;
} vf_wds_convert_settings;

void vf_wds_convert_defaults(vf_wds_convert_settings *s);

/* Converts the dataset at source into out_dir/shards/. settings may be
 * NULL (defaults). On success *summary (if summary is not NULL) is a newly
 * allocated one-line JSON object (free()) with the counts and timings of
 * this run. On failure the message names the file, episode, camera or
 * option; what was finished stays on disk for a resume.
 *
 * Memory bound: per worker thread, one decoded batch of up to 16 frames at
 * the source size plus their JPEGs, one data-table slice of the numeric
 * columns (65,536 rows, or one episode if it is longer), and while
 * assembling one member at a time; plus 256 open spill files and O(episodes + cameras x video files) of
 * plan. Disk: the spill holds about the size of the output until the
 * shards are written, then it is removed. */
int vf_wds_convert(const char *source, const char *out_dir, const vf_wds_convert_settings *settings,
                   char **summary);

#ifdef __cplusplus
}
#endif

#endif
