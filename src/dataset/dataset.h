/*
 * dataset.h: the dataset layer's interface to the engine (loader, sample
 * assembly, planner). The public, opaque view of the same objects is
 * include/vlafeed/dataset.h; this header adds what the engine needs and
 * users do not: the file-access hooks (so metadata can come from memory or,
 * later, remote storage), the Parquet row-group locator and columnar table
 * reads of the data files.
 *
 * Depends on: base, io, json, parquet.
 *
 * Model invariants (after a successful open):
 *  - Every episode listed by the metadata is in d->episodes, in metadata
 *    row order; the selection (d->selected) holds positions into it in
 *    ascending episode_index order. Public positions index d->selected.
 *  - from_index/to_index are the global `index` range: from the metadata
 *    for v3.0, cumulative lengths in episodes.jsonl order for v2.x.
 *  - row_offset = from_index - (smallest from_index of any episode stored
 *    in the same data file); for v2.x it is 0 (one file per episode).
 *  - Data and video file ids are assigned only to selected episodes' files.
 *  - Every string and array hanging off the dataset lives in its arena and
 *    is freed by vf_dataset_close().
 */
#ifndef VF_DATASET_INTERNAL_H
#define VF_DATASET_INTERNAL_H

#include "vlafeed/dataset.h"

#include <pthread.h>

#include "io/io.h"
#include "json/json.h"
#include "parquet/parquet.h"
#include "video/video.h"

/* ---- file access ------------------------------------------------------ */

/* How the dataset layer reaches files, by path relative to the root. The
 * default (vf_ds_fs_local) is the local file system; the metadata fuzzer
 * plugs in memory. Every hook sets the error message on failure. */
typedef struct vf_ds_fs {
    void *ctx;
    /* Whole file into a newly allocated NUL-terminated buffer (free());
     * VF_ENOENT when absent. */
    int (*read_all)(void *ctx, const char *rel, uint8_t **data, size_t *len);
    /* A byte source over the file (for Parquet); VF_ENOENT when absent. */
    int (*open_source)(void *ctx, const char *rel, vf_source **out);
    /* 1 if a regular file exists, 0 if it does not; a remote fs also
     * returns a negative code when it cannot tell (refused, unreachable),
     * with the message naming the URL and the last status. */
    int (*exists)(void *ctx, const char *rel);
    /* Names in a directory (not . or ..), each and the array newly
     * allocated (free each, then the array); VF_ENOENT when absent. */
    int (*list_dir)(void *ctx, const char *rel, char ***names, size_t *count);
    /* Decode caps applied to every Parquet file opened through this fs
     * (vf_pq_set_limits; 0 keeps the reader's defaults). The fuzzer lowers
     * them so hostile files cannot ask for gigabytes. */
    int64_t pq_max_entries, pq_max_bytes;
    /* 1: the hooks may be called from several threads at once (local and
     * remote fs); the v3.0 backend then reads episodes files in parallel. */
    int thread_safe;
    /* Frees ctx (NULL: ctx is borrowed). vf_ds_open_fs takes ownership of
     * a ctx with a destroy hook, on failure too; vf_dataset_close frees it. */
    void (*destroy)(void *ctx);
} vf_ds_fs;

/* Opens the Parquet file at rel through d's fs, with its decode caps. */
int vf_ds_open_parquet(const vf_dataset *d, const char *rel, vf_pq_file **out);

/* The local file system under root (the hooks borrow root; keep it alive
 * while the fs is used). */
void vf_ds_fs_local(vf_ds_fs *fs, const char *root);

/* Opens through fs; root is used for messages and for absolute paths.
 * vf_dataset_open() is vf_ds_fs_local() + this (vf_ds_fs_remote() + this
 * for URL roots). */
int vf_ds_open_fs(vf_dataset **out, const char *root, const vf_ds_fs *fs, const vf_dataset_settings *settings);

/* ---- remote roots and the file cache (remote.c) ---------------------------- */

/* The fs of a dataset whose root is an http://, https:// or s3:// URL
 * (metadata fetched once, existence by HEAD, data files as range-read
 * sources, v3.0 episodes files listed through S3 or found by probing over
 * HTTP). Owns its ctx (fs->destroy). settings may be NULL. */
int vf_ds_fs_remote(vf_ds_fs *fs, const char *root, const vf_http_settings *settings);

/* A byte source over one of d's files given by its absolute path (the
 * `path` of a vf_ds_file: "<root>/<rel>"): through d's fs for remote roots,
 * the local file otherwise. */
int vf_ds_open_path(const vf_dataset *d, const char *path, vf_source **out);

/* The decoder cache's open hook for a dataset's video files
 * (vf_video_cache_settings.open_source = vf_ds_opener_open, open_source_ctx
 * = a vf_ds_opener that outlives the cache): a prefetched local copy from
 * file_cache when there is one (file_cache may be NULL), else
 * vf_ds_open_path. */
typedef struct vf_ds_opener {
    const vf_dataset *dataset;
    vf_file_cache *file_cache;
} vf_ds_opener;
int vf_ds_opener_open(void *opener, const char *key, vf_source **out);

/* Prefetch-on-admit, for the episode pool's admit/evict hook. on_admit
 * takes one file-cache reference on each remote video file of the episode
 * at public position pos and starts the downloads without waiting (all or
 * nothing: on failure no reference is kept); on_evict drops them. Several
 * episodes in one file share it; the file is evictable after the last
 * on_evict. Local files are skipped; cache NULL is a no-op. */
int vf_prefetch_on_admit(vf_file_cache *cache, const vf_dataset *d, size_t pos);
void vf_prefetch_on_evict(vf_file_cache *cache, const vf_dataset *d, size_t pos);

/* ---- internal model ------------------------------------------------------ */

typedef struct vf_ds_arena_block vf_ds_arena_block;

/* Chunk and file indices are stored in 32 bits (the loaders reject larger
 * ones, naming the file, episode and column): at 1M episodes x 3 cameras
 * that keeps the model 32 MB smaller. */
typedef struct vf_ds_video_loc {
    int32_t chunk_index;   /* videos/<key>/chunk_index (v2.x: episode_chunk) */
    int32_t file_index;    /* videos/<key>/file_index (v2.x: episode_index) */
    int file;              /* id in the camera's file list, -1 when not selected */
    double from_timestamp;
    double to_timestamp;
} vf_ds_video_loc;

typedef struct vf_ds_episode {
    vf_episode pub;
    int32_t data_chunk;    /* data/chunk_index (v2.x: episode_chunk) */
    int32_t data_file;     /* data/file_index (v2.x: episode_index) */
    int64_t row_offset;
    int data_file_id;      /* id in d->data_files, -1 when not selected */
    int meta_file;         /* v3.0: index into d->meta_files (the episodes file of its row); -1 for v2.x */
    vf_ds_video_loc *video; /* one per camera (a slice of one block when reserved) */
} vf_ds_episode;

typedef struct vf_ds_file {
    const char *rel;       /* relative to the root */
    const char *path;      /* absolute */
    int64_t chunk_index, file_index;
    int exists;            /* -1 unknown (not checked), 0, 1 */
    size_t *episodes;      /* public positions of the selected episodes using it, ascending */
    size_t num_episodes;
    int64_t expected_rows; /* data files: Σ length of ALL episodes stored there */
} vf_ds_file;

typedef struct vf_ds_camera {
    vf_camera pub;
    vf_ds_file *files;
    size_t num_files;
} vf_ds_camera;

struct vf_dataset {
    vf_ds_arena_block *arena;
    const char *root;
    vf_ds_fs fs;
    int local_fs;                 /* fs is vf_ds_fs_local over root */

    /* info.json */
    const char *version;          /* "v3.0", "v2.1", "v2.0" */
    int major, minor;
    const char *robot_type;       /* NULL when null/absent */
    double fps;
    int64_t total_episodes, total_frames, total_tasks, chunks_size;
    const char *data_path;        /* templates */
    const char *video_path;       /* NULL when null/absent */

    vf_feature *features;
    size_t num_features;
    vf_ds_camera *cameras;
    size_t num_cameras;

    vf_ds_episode *episodes;      /* every episode of the metadata (malloc'd) */
    size_t num_all_episodes, cap_episodes;
    vf_ds_video_loc *video_block; /* vf_ds_reserve_episodes: cameras x reserved episodes */
    size_t video_block_used, video_block_cap; /* in episodes */
    const char **meta_files;      /* v3.0: meta/episodes files (relative), in read order */
    size_t num_meta_files;
    size_t *selected;             /* positions into episodes */
    size_t num_selected;

    vf_ds_file *data_files;       /* used by the selected episodes */
    size_t num_data_files;

    const char **tasks;
    size_t num_tasks;

    vf_stat *stats;
    size_t num_stats, cap_stats;

    vf_problem *problems;
    size_t num_problems, cap_problems, num_errors;
    const char **missing;
    size_t num_missing, cap_missing;

    /* Computed on first use (vf_dataset_fingerprint): hashing every
     * episode costs ~0.13 s at 1M episodes, which a loader's open does not
     * need (only its state does). */
    pthread_mutex_t fingerprint_lock;
    int fingerprint_ready;
    uint64_t fingerprint;
    vf_file_checks file_checks;   /* what the open did (vf_dataset_file_checks) */
    vf_meta_cache_stats meta_cache; /* enabled: wanted at open, then whether it was used (v3.c) */
    vf_video_mismatch video_mismatch; /* settings.video_mismatch, resolved at open (never _DEFAULT) */
};

/* Arena allocation (zeroed; NULL with ENOMEM set on failure). */
void *vf_ds_alloc(vf_dataset *d, size_t count, size_t size);
char *vf_ds_strdup(vf_dataset *d, const char *s);
char *vf_ds_strndup(vf_dataset *d, const char *s, size_t n);
char *vf_ds_printf(vf_dataset *d, const char *fmt, ...) VF_PRINTF(2, 3);

/* Appends a zeroed episode (video locations allocated, file ids -1);
 * NULL with ENOMEM set on failure. The pointer is valid until the next
 * call. */
vf_ds_episode *vf_ds_add_episode(vf_dataset *d);
/* Reserves room for n episodes in all (the array, grown geometrically,
 * and one block for the video locations of those not yet added), so
 * adding them neither reallocates nor allocates per episode. More
 * episodes may still be added. n must come from data actually read. */
int vf_ds_reserve_episodes(vf_dataset *d, size_t n);

/* Records a problem (strings copied). Returns 0 or VF_ENOMEM. */
int vf_ds_problem(vf_dataset *d, vf_severity severity, const char *file, int64_t episode, const char *column,
                  const char *fmt, ...) VF_PRINTF(6, 7);
int vf_ds_missing_file(vf_dataset *d, const char *rel);

/* Absolute path of rel ("<root>/<rel>") in the arena. */
const char *vf_ds_abs(vf_dataset *d, const char *rel);

/* Formats a path template the way Python's str.format does for the
 * placeholders LeRobot uses: {chunk_index}, {file_index}, {episode_chunk},
 * {episode_index} (integers, optional ":0Nd" spec) and {video_key}. Any
 * other placeholder or spec is VF_ECORRUPT naming the template. The result
 * is newly allocated (free()). */
typedef struct vf_ds_template_vars {
    int64_t chunk_index, file_index, episode_chunk, episode_index;
    const char *video_key;        /* NULL: {video_key} is an error */
} vf_ds_template_vars;
int vf_ds_format_template(const char *templ, const vf_ds_template_vars *vars, char **out);

/* Backends: fill d->episodes, d->tasks, d->stats from the metadata files
 * (after info.json has been parsed into d). Fatal problems return < 0. */
int vf_ds_load_info(vf_dataset *d, const char *text, size_t len);
int vf_ds_load_v3(vf_dataset *d);
int vf_ds_load_v2(vf_dataset *d);
/* Parses stats.json text into d->stats (NaN values are reported). */
int vf_ds_load_stats_json(vf_dataset *d, const char *rel, const char *text, size_t len);
/* Aggregates meta/episodes_stats.jsonl text into d->stats (v2.1). */
int vf_ds_aggregate_episode_stats(vf_dataset *d, const char *rel, const char *text, size_t len);
/* Checks the model and files; records problems (never fails but ENOMEM). */
int vf_ds_validate(vf_dataset *d, const vf_dataset_settings *s);

/* Writes meta/tasks.parquet as LeRobot does (task_index, task; pandas
 * metadata naming "task" as the index) to path (make_sample.c; the v2.1 ->
 * v3.0 converter writes it too). */
int vf_ds_write_tasks_parquet(const char *path, const char *const *tasks, size_t n);

/* ---- Parquet locator ---------------------------------------------------- */

/* A run of an episode's rows inside one row group of its data file. */
typedef struct vf_ds_rg_span {
    int row_group;
    int64_t first_row;     /* within the row group */
    int64_t count;
    int64_t episode_row;   /* position of the first of these rows within the episode */
} vf_ds_rg_span;

/* The row groups of f (the episode's data file, opened by the caller)
 * holding the episode at public position pos, from the row-group row
 * counts, cross-checked against the `index` (else `episode_index`) column
 * statistics through vf_pq_select_row_groups(). *spans is newly allocated
 * (free()). Errors name the file and episode. */
int vf_ds_locate_row_groups(const vf_dataset *d, size_t pos, const vf_pq_file *f, vf_ds_rg_span **spans,
                            int *count);

/* The cumulative row ends of the row groups of data file `file` (index
 * into d->data_files), from its footer: ends[g] = rows in groups 0..g.
 * *ends is newly allocated (free()). Errors name the file. */
int vf_ds_data_file_row_groups(const vf_dataset *d, size_t file, int64_t **ends, int *count);

/* ---- table access ------------------------------------------------------- */

typedef enum vf_ds_value_type {
    VF_DS_F32 = 0,     /* float features (float16/32/64) -> float */
    VF_DS_I64 = 1,     /* integer and bool features -> int64_t */
    VF_DS_STRING = 2,  /* string features -> offsets + bytes */
} vf_ds_value_type;

typedef struct vf_ds_column {
    const vf_feature *feature;
    vf_ds_value_type type;
    int64_t width;         /* values per row: the feature's size (1 for strings) */
    int64_t rows;
    void *values;          /* F32: float[rows*width]; I64: int64_t[rows*width] */
    int64_t *offsets;      /* STRING: rows+1 entries into data */
    char *data;            /* STRING: bytes */
} vf_ds_column;

typedef struct vf_ds_table {
    int64_t rows;
    size_t num_columns;
    vf_ds_column *columns;     /* in the order requested */
    size_t num_episodes;
    int64_t *episode_start;    /* num_episodes+1: row range of each requested episode */
    int64_t row_groups_read;   /* (data file, row group) pairs decoded by the read */
    int64_t pages_decoded;     /* data pages of those groups decoded */
    int64_t pages_skipped;     /* data pages of those groups not decoded (page-level reads) */
} vf_ds_table;

enum {
    /* Also read the `index` and `episode_index` columns and check that
     * index runs from_index, from_index+1, ... and episode_index is the
     * episode on every row (names file, episode and row on mismatch). */
    VF_DS_VERIFY_INDEX = 1,
};

/* Reads the named feature columns (projection; numeric, string) of the
 * episodes at the given public positions into contiguous arrays, the
 * episodes' rows back to back in the order given. Each data file is opened
 * once and each needed row group read once per column. A vector row whose
 * element count differs from the feature's size, a null, a missing column
 * or a type that cannot convert fails with a message naming file, episode
 * and column. *out is overwritten; release it with vf_ds_table_free(). */
int vf_ds_read_table(const vf_dataset *d, const size_t *positions, size_t num_positions,
                     const char *const *columns, size_t num_columns, int flags, vf_ds_table *out);
void vf_ds_table_free(vf_ds_table *t);

/* ---- data file cache (pq_cache.c) ------------------------------------------ */

/* A bounded cache of open data files (their Parquet footers decoded once)
 * for the table reads of one loader; thread-safe. Bounded by entries and
 * by estimated bytes (vf_pq_memory_bytes), least recently used first; an
 * entry in use is never closed. The dataset must outlive it. */
typedef struct vf_ds_pq_cache vf_ds_pq_cache;
#define VF_DS_PQ_CACHE_DEFAULT_BYTES ((size_t)256 << 20)
#define VF_DS_PQ_CACHE_DEFAULT_ENTRIES 1024 /* and at most a quarter of RLIMIT_NOFILE */
typedef struct vf_ds_pq_cache_stats {
    uint64_t hits, misses, evictions, uncached; /* uncached: opened while every entry was in use */
    uint64_t trims;            /* files whose kept dictionaries were dropped to stay within the bytes */
    size_t entries, bytes;
} vf_ds_pq_cache_stats;
/* max_bytes / max_entries 0: the defaults. fields (num_fields names, or
 * NULL for every column): the columns reads will use; only their footer
 * entries are kept (`index` and `episode_index` are added: reads locate
 * and verify by them). *out is NULL (and the result 0) when d's file hooks
 * are not thread-safe: callers then read uncached. */
int vf_ds_pq_cache_open(vf_ds_pq_cache **out, const vf_dataset *d, size_t max_bytes, size_t max_entries,
                        const char *const *fields, int num_fields);
void vf_ds_pq_cache_close(vf_ds_pq_cache *c);
/* Data file `file` (index into d->data_files), opened on a miss; the
 * caller reads it (concurrently with others) and gives it back with
 * vf_ds_pq_cache_release. Errors name the file. */
int vf_ds_pq_cache_get(vf_ds_pq_cache *c, size_t file, vf_pq_file **out);
void vf_ds_pq_cache_release(vf_ds_pq_cache *c, vf_pq_file *pq);
void vf_ds_pq_cache_get_stats(vf_ds_pq_cache *c, vf_ds_pq_cache_stats *out);

/* vf_ds_read_table and vf_ds_data_file_row_groups through a cache of the
 * data files (NULL: each read opens its files, as the functions above). */
int vf_ds_read_table_cached(const vf_dataset *d, vf_ds_pq_cache *cache, const size_t *positions,
                            size_t num_positions, const char *const *columns, size_t num_columns, int flags,
                            vf_ds_table *out);
int vf_ds_data_file_row_groups_cached(const vf_dataset *d, vf_ds_pq_cache *cache, size_t file, int64_t **ends,
                                      int *count);

/* Value type a feature reads as (VF_DS_F32 / I64 / STRING), or -1 for
 * features that have no table column (video, image, language, unknown). */
int vf_ds_feature_value_type(const vf_feature *f);

/* ---- video locator (frames.c) ------------------------------------------- */

/* One camera file's frame index and the mapping of EVERY episode stored in
 * it (selected or not: ordinals are cumulative over all of them) to frame
 * ordinals, as vf_video_map_episodes computes it (exact by frame counts,
 * robust to LeRobot's concatenation drift; problems recorded, never a
 * silently wrong frame). */
typedef struct vf_ds_video_map {
    size_t camera, file;             /* camera index, file id in the camera's list */
    const char *path;                /* absolute (owned by the dataset) */
    vf_video_index *index;           /* owned */
    vf_video_episode *episodes;      /* owned; sorted by from_timestamp */
    size_t num_episodes;
    vf_video_map map;                /* owned */
} vf_ds_video_map;

/* Builds the index (reading the file's sample table, no decoding) and the
 * mapping. Errors name the file and camera. Free with vf_ds_video_map_free. */
int vf_ds_video_map_build(const vf_dataset *d, size_t camera, size_t file, vf_ds_video_map *out);
void vf_ds_video_map_free(vf_ds_video_map *m);
/* The frame ordinal of frame k of episode_index in the mapped file.
 * VF_ENOENT if the episode is not stored there, VF_ERANGE for k outside the
 * episode, VF_ECORRUPT if that frame is missing from the file; the message
 * names file, camera and episode. */
int vf_ds_video_map_ordinal(const vf_ds_video_map *m, const vf_dataset *d, int64_t episode_index, int64_t k,
                            int64_t *ordinal);

#endif
