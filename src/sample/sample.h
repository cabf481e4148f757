/*
 * sample.h: the sample layer of vlafeed, its whole interface to the engine.
 *
 * Owns: what one sample is and how it is built, with LeRobot's semantics
 * (lerobot-format.md §7):
 *  - delta_timestamps -> frame offsets (round(d * fps), checked against the
 *    1/fps grid within tolerance_s), clamped to the episode with
 *    `<key>_is_pad` masks (padded steps repeat the boundary frame);
 *  - the column layout of a batch (names, types, per-sample shapes, in
 *    LeRobot's order: video keys, data columns, pad masks, task);
 *  - the tabular gather from in-memory columns (every selected episode's
 *    numeric columns are read once when the spec is built);
 *  - frame requests: every camera and window step of every sample of a
 *    batch, grouped per video file and served by one vf_video_read_frames
 *    call per file (sorted; each forward decode run decoded once), written
 *    straight into the batch memory in the output format (resize, float32
 *    CHW in [0,1], uint8 CHW, uint8 HWC);
 *  - normalization of vectors (and float32 images) from the dataset stats.
 *
 * Depends on: base, video, dataset (internal header: episodes, video
 * locations, table reads), and the public loader.h types.
 *
 * Invariants:
 *  - A position is a row of the selected episodes' frames, 0..num_positions-1,
 *    in ascending episode order (the table row of that frame).
 *  - A spec is immutable after vf_sample_spec_build except for the per-file
 *    episode maps, which are built lazily once under the file's lock and
 *    read-only afterwards; any number of threads may assemble at once.
 *  - Frames are located by ordinal through vf_video_map_episodes over every
 *    episode stored in the camera file (selected or not), so the mapping is
 *    exact whatever LeRobot's timestamp drift.
 */
#ifndef VF_SAMPLE_H
#define VF_SAMPLE_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/base.h"
#include "dataset/dataset.h"
#include "dataset/meta_cache.h"
#include "video/video.h"
#include "vlafeed/loader.h"

/* ---- delta windows ---------------------------------------------------------- */

/* LeRobot's default tolerance for the delta grid check. */
#define VF_SAMPLE_DEFAULT_TOLERANCE_S 1e-4

/* Converts a key's delta_timestamps (seconds) to frame offsets:
 * offsets[i] = round(seconds[i] * fps), ties to even. Each value must lie on
 * the 1/fps grid: |d*fps - round(d*fps)| / fps <= tolerance_s, else VF_EINVAL
 * naming the key and the value. Non-finite values and count 0 are errors. */
int vf_sample_delta_offsets(const char *key, const double *seconds, size_t count, double fps, double tolerance_s,
                            int64_t *offsets);

/* The rows a window reads for the frame at position a of an episode covering
 * positions [first, end): rows[i] = clamp(a + offsets[i], first, end - 1),
 * pad[i] = 1 when a + offsets[i] falls outside [first, end). */
void vf_sample_window(int64_t a, int64_t first, int64_t end, const int64_t *offsets, size_t count, int64_t *rows,
                      uint8_t *pad);

/* ---- the sample specification ------------------------------------------- */

typedef enum vf_sample_source {
    VF_SAMPLE_SRC_VIDEO = 0, /* frames of a camera */
    VF_SAMPLE_SRC_TABLE = 1, /* a numeric or string data column */
    VF_SAMPLE_SRC_PAD = 2,   /* <key>_is_pad of a window */
    VF_SAMPLE_SRC_TASK = 3,  /* the task string of the current frame */
} vf_sample_source;

/* One output column. Shapes exclude the batch dimension. */
typedef struct vf_sample_column {
    char *name;                /* output name (after renames) */
    vf_sample_source source;
    const vf_feature *feature; /* VIDEO, TABLE: the dataset feature; else NULL */
    int camera;                /* VIDEO: camera index, else -1 */
    int table_column;          /* TABLE: column of spec->table, else -1 */
    int window;                /* index into spec->windows (VIDEO, TABLE, PAD), -1: current frame only */
    vf_column_type type;
    int ndim;
    int64_t shape[7];
    size_t sample_bytes;       /* bytes of one sample of this column */
    int64_t values_per_step;   /* TABLE: values per row; VIDEO: bytes per frame */
    vf_video_format format;    /* VIDEO: layout and output size (always explicit: the
                                * declared size, or the resize), so a stream whose real
                                * size differs can never overrun the batch slot */
    /* Normalization: y = (x - shift[i]) / scale[i], then (min/max) 2y - 1.
     * Per element for vectors, per channel for float32 CHW images. */
    vf_normalization norm;
    float *norm_shift, *norm_scale;
} vf_sample_column;

typedef struct vf_sample_window_spec {
    char *key;                 /* the dataset key of delta_timestamps */
    size_t count;
    int64_t *offsets;
} vf_sample_window_spec;

/* The episodes of one camera file and their frame ordinals, mapped lazily. */
typedef struct vf_sample_video_file {
    const char *path;          /* owned by the dataset */
    const char *camera_key;
    int camera;
    size_t id;                 /* unique over all cameras' files */
    pthread_mutex_t lock;
    pthread_mutex_t reader_lock; /* held by the one thread using this file's reader (assemble.c) */
    atomic_int state;          /* 0 not mapped yet, 1 mapped, < 0 mapping failed (that code) */
    char *error;               /* message of a failed mapping */
    vf_video_episode *episodes;/* every episode of the metadata stored in this file: built when the
                                * file is first mapped (NULL before), from file_order */
    size_t num_episodes, cap_episodes;
    size_t list_start, list_count; /* this file's run of the camera's file_order */
    vf_video_map map;
    int64_t frame_count;
} vf_sample_video_file;

/* Where a selected episode's frames of one camera are. */
typedef struct vf_sample_video_slot {
    uint32_t file;             /* index into the camera's files (8 bytes a slot: one per episode and
                                * camera, so it counts at a million episodes) */
    uint32_t episode;          /* index into that file's episodes */
} vf_sample_video_slot;

/* One episode's rows of the spec's table columns, loaded on demand. */
typedef struct vf_sample_rows {
    vf_ds_table t;                 /* one episode: rows = its length, columns = the spec's table columns */
    char **strings;                /* per table column: NUL-terminated copies of STRING columns (else NULL) */
    size_t bytes;
    int refs;                      /* batches being assembled from it */
    uint64_t last_use;
    size_t slot;                   /* index in the loaded list */
    struct vf_sample_rows *newer, *older; /* the recency list (rows.c: evict takes from its old end) */
} vf_sample_rows;

typedef struct vf_sample_note {
    char *text;
    int global;                    /* the same on every rank (from the metadata), not from a file read */
} vf_sample_note;

typedef struct vf_sample_spec {
    const vf_dataset *dataset;
    double fps;
    vf_sample_column *columns;
    size_t num_columns;
    vf_sample_window_spec *windows;
    size_t num_windows;
    /* Tabular data, read lazily per episode (rows.c): an episode's rows of
     * the needed columns are read when a batch first needs them (with the
     * wanted episodes of the same data file that follow it, so a big row
     * group is decoded once for many episodes), kept in a cache bounded by
     * table_cache_bytes (least recently used, unreferenced episodes go
     * first), and never for episodes the loader does not emit. */
    const char **table_names;      /* [num_table]: feature names (dataset-owned) */
    size_t num_table;
    int task_index_column;         /* table column holding task_index, -1 when no task column */
    vf_sample_rows **rows;         /* [num_episodes]: loaded episodes, else NULL */
    size_t *loaded;                /* episodes with rows, in no order (slot = index) */
    size_t num_loaded;
    const uint8_t *wanted;         /* [num_episodes] or NULL: episodes the loader will emit (read-ahead hint) */
    uint8_t *loading;              /* [num_episodes]: being read by some thread */
    /* Map mode (no wanted list): the row-group boundaries of each data file
     * (cumulative row ends), learnt from its footer on the first miss in
     * it, so that a miss also takes the other episodes lying inside the row
     * groups it decodes anyway: a bounded row-group cache at episode
     * granularity (under rows_lock; rg_known: 0 unknown, 1 known, 2 not
     * available, 3 being read). */
    int share_readers;             /* 1: one reader per video file serves every thread in turn (the default;
                                    * assemble.c); 0: each thread checks out its own */
    vf_ds_pq_cache *data_files;    /* the open data files (footers decoded once), shared by the threads;
                                    * NULL: each read opens its files */
    int64_t map_table_rows;        /* map mode: rows of the loader's episodes (0: not counted yet) */
    int64_t map_samples;           /* map mode: samples the loader draws this epoch (set by its plan) */
    int64_t **rg_ends;             /* [num_data_files] */
    int *rg_count;
    uint8_t *rg_known;
    size_t num_data_files;
    pthread_mutex_t rows_lock;
    pthread_cond_t rows_cond;      /* signalled when reads finish */
    size_t rows_bytes, rows_max_bytes;
    uint64_t rows_clock;
    vf_sample_rows *rows_newest, *rows_oldest; /* loaded episodes by last use (under rows_lock) */
    char **kept_strings;           /* string copies of evicted episodes (batches may point into them) */
    size_t num_kept_strings, cap_kept_strings;
    /* Map mode: the table cache on disk (meta_cache.h, rows.c): per data
     * file, the decoded columns of all its episodes, built on the first
     * miss in the file and opened (under rows_lock; tdisk_state: 0 unknown,
     * 1 being built or opened, 2 open, 3 not available). */
    int tdisk_mode;                /* -1 auto (the default), 0 off, 1 on in map mode */
    int tdisk_decided;             /* 0 not yet; 1 on; -1 off */
    vf_ds_meta_cache *tdisk;
    vf_ds_table_cache_file *tdisk_files; /* [num_data_files] */
    uint8_t *tdisk_state;
    uint8_t *tdisk_checked;        /* [num_episodes]: 1 CRC checked once by this loader; 2 not on the disk
                                    * cache as the model says, or damaged there: read from Parquet */
    int *tdisk_types;              /* [num_table] */
    int64_t *tdisk_widths;
    uint64_t table_disk_episodes, table_disk_builds, table_disk_files;
    size_t table_disk_bytes;       /* bytes of the cache files open */
    /* Counters (under rows_lock). */
    uint64_t table_reads, table_row_groups, table_rows, table_episodes, table_evictions;
    uint64_t table_pages_decoded, table_pages_skipped; /* data pages of the groups read: decoded / skipped */
    /* Episodes: positions [episode_start[i], episode_start[i+1]) belong to selected episode i. */
    size_t num_episodes;
    int64_t *episode_start;
    int64_t num_positions;
    /* Video: files per camera, and (episode, camera) -> slot. */
    size_t num_cameras;
    vf_sample_video_file **files;  /* [camera] -> array of num_files[camera] */
    size_t *num_files;
    vf_sample_video_slot *slots;   /* [episode * num_cameras + camera] */
    uint32_t **file_order;         /* [camera]: metadata episodes sorted by file (stable) */
    /* Notes: what is left out of the samples or served otherwise than the
     * metadata says (a feature with no supported values, a constant
     * normalization element, a stream whose frame size differs from
     * info.json, a mapped file's problems). Added at build or when a file is
     * first mapped, each text once, under notes_lock; the loader reports
     * them as its warnings (vf_loader_warning), so they reach the caller's
     * report instead of stderr only. */
    pthread_mutex_t notes_lock;
    vf_sample_note *notes;
    size_t num_notes;
} vf_sample_spec;

/* Builds the spec for the dataset's selected episodes from the sample
 * settings: checks keys (delta_timestamps, renames, normalize, keys) against
 * the features with messages naming the key, converts the deltas, lays out
 * the columns and reads the table. *out is owned by the caller
 * (vf_sample_spec_free). The dataset must outlive the spec. */
int vf_sample_spec_build(vf_sample_spec **out, const vf_dataset *dataset, const vf_sample_settings *settings);
void vf_sample_spec_free(vf_sample_spec *spec);

/* Adds a note (takes text, a heap string; a text already noted is freed).
 * Thread-safe. */
void vf_sample_spec_note(vf_sample_spec *spec, int global, char *text);

/* Default bound of the table row cache. */
#define VF_SAMPLE_DEFAULT_TABLE_CACHE_BYTES ((size_t)256 << 20)

/* The rows of episodes eps[0..n) (selected-episode indices, distinct),
 * loaded if missing (one vf_ds_read_table call for all of them and their
 * read-ahead), each referenced once: out[i] stays valid until
 * vf_sample_rows_release. Errors name the file, episode and column. */
int vf_sample_rows_acquire(vf_sample_spec *spec, const size_t *eps, size_t n, vf_sample_rows **out);
void vf_sample_rows_release(vf_sample_spec *spec, vf_sample_rows **rows, size_t n);
/* Drops every unreferenced episode's rows (e.g. at a new epoch). */
void vf_sample_rows_trim(vf_sample_spec *spec);
void vf_sample_rows_free_all(vf_sample_spec *spec);

/* The selected episode (0..num_episodes-1) holding a position; position must
 * be in range. */
size_t vf_sample_episode_of(const vf_sample_spec *spec, int64_t position);

/* ---- assembly ------------------------------------------------------------ */

/* Counters shared by the assemblers of one loader (atomics: any thread). */
typedef struct vf_sample_counters {
    atomic_uint_fast64_t frames_decoded;   /* frames that came out of decoders */
    atomic_uint_fast64_t frames_delivered; /* frames written into batches */
    atomic_uint_fast64_t samples;          /* samples assembled */
} vf_sample_counters;

/* Where assembled samples go: per spec column, the base of its
 * [capacity, per-sample shape...] memory (numeric columns) or of its string
 * pointer array (STRING columns). Sample i of the call is written at index
 * first + i. */
typedef struct vf_sample_dest {
    void *const *data;
    const char **const *strings;
    size_t first;
} vf_sample_dest;

/* Runs `fn(arg, i)` for i in [0, n) on helper threads while the caller works
 * too; returns when every call is done. NULL: run everything on the caller. */
typedef struct vf_sample_parallel {
    void (*run)(void *pool_ctx, size_t n, void (*fn)(void *arg, size_t i), void *arg);
    void *pool_ctx;
} vf_sample_parallel;

/* Assembles the samples at positions[0..n) into dest: table values,
 * windows, pad masks, task strings, and every frame of every camera and
 * window step, the frame requests grouped per video file (one reader
 * checkout and one vf_video_read_frames call per file). parallel, when
 * given, spreads the per-file groups over threads. Errors name the file,
 * camera and episode (and the position for out-of-range ones: VF_ERANGE). */
int vf_sample_assemble(vf_sample_spec *spec, vf_video_cache *cache, vf_sample_counters *counters,
                       const int64_t *positions, size_t n, const vf_sample_dest *dest,
                       const vf_sample_parallel *parallel);

/* Where a failed vf_sample_assemble_ex call failed: the file it could not
 * read (a video file, or the episode's data file for table rows) and the
 * output column (a camera's column; NULL for table rows). Both are copies
 * the caller frees; NULL when unknown (e.g. out of memory). */
typedef struct vf_sample_failure {
    char *file;
    char *column;
} vf_sample_failure;

/* vf_sample_assemble, and on failure fills *failure (when not NULL). */
int vf_sample_assemble_ex(vf_sample_spec *spec, vf_video_cache *cache, vf_sample_counters *counters,
                          const int64_t *positions, size_t n, const vf_sample_dest *dest,
                          const vf_sample_parallel *parallel, vf_sample_failure *failure);

#endif
