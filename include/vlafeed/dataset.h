/*
 * dataset.h: the public dataset API of vlafeed: open a LeRobot dataset
 * (v3.0, v2.1, or v2.0 read like v2.1) from a local folder, describe it,
 * locate an episode's rows and video frames, and list every problem found.
 *
 *   vf_dataset_settings s;  vf_dataset_defaults(&s);
 *   vf_dataset *d;
 *   if (vf_dataset_open(&d, "/data/my-dataset", &s) < 0)
 *       fprintf(stderr, "%s\n", vf_last_error());
 *   for (size_t i = 0; i < vf_dataset_num_problems(d); i++) ...
 *   vf_dataset_close(d);
 *
 * Ownership: a vf_dataset owns everything its accessors return (strings,
 * structs, arrays). Those stay valid and unchanged until vf_dataset_close().
 * A dataset is immutable after open, so any number of threads may call the
 * accessors concurrently.
 *
 * Episodes: the dataset exposes the episodes SELECTED at open
 * (settings.episodes, or all of them) by POSITION 0..num_episodes-1, in
 * ascending episode_index order. vf_dataset_find_episode() maps an
 * episode_index to its position.
 *
 * Problems: open fails (returns < 0, message naming file and key) only when
 * the dataset cannot be used at all: unreadable or malformed info.json, an
 * unsupported codebase_version, unreadable episodes or tasks metadata, or a
 * selected episode that does not exist. Everything else (inconsistent
 * totals, non-contiguous indices, missing data or video files, NaN stats,
 * ...) is collected as a list of vf_problem, and the dataset opens. The
 * metadata checks cover all episodes; the file checks (existence, data
 * file footers) cover only the selected episodes' files.
 */
#ifndef VLAFEED_DATASET_H
#define VLAFEED_DATASET_H

#include "vlafeed/vlafeed.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vf_dataset vf_dataset;

/* What to do with a video file whose frame count disagrees with the
 * lengths of the episodes stored in it when nothing in the file shows
 * where the frames are missing (no pts gap, no short recorded span): a CFR
 * re-encode that dropped frames mid-file, a truncated file, another
 * recording in its place. Its frames after the missing ones sit exactly
 * where the metadata's timestamps expect other frames, so no frame of it
 * can be placed with certainty (docs/reliability.md, "Frame counts that
 * disagree"). A file whose pts gaps locate the difference is mapped around
 * them exactly whatever the policy; a file with more frames than its
 * episodes is refused whatever the policy. */
typedef enum vf_video_mismatch {
    /* The environment variable VF_VIDEO_MISMATCH ("timestamp" or "refuse",
     * read at open), else VF_VIDEO_MISMATCH_REFUSE. */
    VF_VIDEO_MISMATCH_DEFAULT = 0,
    /* Every episode of the file is refused (an error problem naming the
     * file, both frame counts and each episode; on_error="skip" skips them). */
    VF_VIDEO_MISMATCH_REFUSE = 1,
    /* Opt-in: frames are matched by timestamp as if the file were right,
     * with one warning problem per file (and one logged warning). Frames
     * after a dropped run are then other frames than the rows describe. */
    VF_VIDEO_MISMATCH_TIMESTAMP = 2,
} vf_video_mismatch;

typedef struct vf_dataset_settings {
    /* Episode indices to select (any order, no duplicates), or NULL for
     * all. Read during vf_dataset_open() only (the caller keeps it). An
     * index that is not in the dataset fails the open with VF_ENOENT. */
    const int64_t *episodes;
    size_t num_episodes;
    /* Existence checks of the data and video files of the selected
     * episodes (one stat, or one HEAD for a remote root, per file):
     *  VF_CHECK_FILES_AUTO (1, default): at open, unless the selected
     *    episodes use more than VF_LAZY_FILE_CHECKS files; then nothing is
     *    checked at open (nor check_data_files) and a missing file is
     *    reported when it is first opened (the error names it), so opening
     *    a 1M-episode dataset costs no stat per file.
     *    vf_dataset_file_checks() says which happened.
     *  VF_CHECK_FILES_ALL (2): at open, whatever the number of files.
     *  VF_CHECK_FILES_OFF (0): never at open (e.g. for remote data). */
    int check_files;
    /* 1: also open the footer of each selected episode's data Parquet
     * file and check its row count, its columns against info.json and
     * that the episode's rows are where the metadata says. Default 0
     * (vlafeed info turns it on). Only when the existence checks ran. */
    int check_data_files;
    /* 1 (default): for a local root, build the frame index of each video
     * file of the selected episodes at open (the container's sample table;
     * no frame is decoded) and check it against the metadata: codec,
     * resolution and pixel format against info.json (a mismatch is a
     * warning, and the file's resolution is used when all files of a
     * camera agree on it), and every episode's frames (start, 1/fps pts
     * grid, count; see vf_video_map_episodes): an episode whose frames
     * cannot be matched exactly is an error problem naming file, episode
     * and first unmatched frame. Only while the selected episodes use at
     * most VF_EAGER_VIDEO_CHECKS video files (every rank opens the
     * dataset: indexing thousands of MP4s at open would cost each rank the
     * whole dataset's headers); above, each file is checked the same way
     * when a loader first maps it. 2: always, remote roots too (downloads
     * every video's header). 0: skip. */
    int check_videos;
    /* A video file whose frame count disagrees with its episodes and whose
     * pts do not show where (vf_video_mismatch above). Default
     * VF_VIDEO_MISMATCH_DEFAULT: the environment's VF_VIDEO_MISMATCH, else
     * refuse every episode of the file. Applies to the open-time video
     * check, vf_dataset_read_frame and vf_dataset_decode_check. */
    vf_video_mismatch video_mismatch;
    /* 1 (default): for a local v3.0 root, keep the columns decoded from
     * each meta/episodes file in a persistent cache and reuse them while
     * the file is unchanged (validated by its stat data, a hash of its
     * footer tail and a checksum of the entry), so that opens after the
     * first skip the Parquet decoding of the episodes metadata. The folder
     * is $VF_CACHE_DIR/meta, else $XDG_CACHE_HOME/vlafeed/meta, else
     * ~/.cache/vlafeed/meta; VF_META_CACHE=0 in the environment turns it
     * off. A cache that cannot be read or written is never an error
     * (docs/scale.md, "Opening big metadata"). 0: off. */
    int meta_cache;
} vf_dataset_settings;

enum { VF_CHECK_FILES_OFF = 0, VF_CHECK_FILES_AUTO = 1, VF_CHECK_FILES_ALL = 2 };
/* check_videos = 1 indexes the video files at open up to this many. */
#define VF_EAGER_VIDEO_CHECKS 256
/* Above this many data + video files (of the selected episodes),
 * VF_CHECK_FILES_AUTO defers the existence checks to first use. */
#define VF_LAZY_FILE_CHECKS 10000

/* The mismatch policy the dataset was opened with, resolved (never
 * VF_VIDEO_MISMATCH_DEFAULT): what loaders over it apply when they map a
 * video file. */
vf_video_mismatch vf_dataset_video_mismatch(const vf_dataset *d);

/* What the open did about file existence. */
typedef enum vf_file_checks {
    VF_FILES_NOT_CHECKED = 0, /* check_files was VF_CHECK_FILES_OFF */
    VF_FILES_CHECKED = 1,     /* every file was checked at open (missing ones are problems) */
    VF_FILES_DEFERRED = 2,    /* more than VF_LAZY_FILE_CHECKS files: checked when first opened */
} vf_file_checks;
vf_file_checks vf_dataset_file_checks(const vf_dataset *d);

/* How the open read the episodes metadata through the metadata cache
 * (settings.meta_cache). */
typedef struct vf_meta_cache_stats {
    int enabled;          /* 1: the cache was consulted (local v3.0 root, not turned off) */
    const char *dir;      /* its folder (owned by the dataset), NULL when not enabled */
    size_t hits;          /* episodes files whose columns came from the cache */
    size_t misses;        /* episodes files decoded from Parquet */
    size_t written;       /* cache entries written by this open */
} vf_meta_cache_stats;
void vf_dataset_meta_cache_stats(const vf_dataset *d, vf_meta_cache_stats *out);

/* Fills s with the defaults (all episodes, check_files VF_CHECK_FILES_AUTO,
 * meta_cache 1). */
void vf_dataset_defaults(vf_dataset_settings *s);

/* Opens the dataset at root: a local folder holding meta/info.json, or a
 * URL of such a folder: http://, https:// (range requests) or
 * s3://bucket/prefix (credentials, region and a custom endpoint from the
 * standard AWS_* environment variables; retry and timeout knobs from
 * VF_HTTP_*, see src/io/io.h). With check_files, a remote root costs one
 * HEAD per data and video file at open. settings may be NULL (defaults). On success *out is a new dataset owned
 * by the caller (vf_dataset_close()); on failure *out is NULL and
 * vf_last_error() names the file and key. */
int vf_dataset_open(vf_dataset **out, const char *root, const vf_dataset_settings *settings);
/* Frees the dataset and everything its accessors returned. NULL is ok. */
void vf_dataset_close(vf_dataset *d);

/* A dataset over the episodes of src with the given indices (any order, no
 * duplicates), built from src's model without reading any metadata file:
 * its cost is in proportion to those episodes and to the episodes sharing
 * their data and video files (kept, unselected, so that row offsets,
 * expected rows and frame ordinals in a concatenated MP4 stay exact), not
 * to src. What it shares with src (root, file system, info, features,
 * tasks, stats) is borrowed: src must stay open while the subset is used,
 * and the two may be used from different threads. File checks are not run
 * again: files src checked at open are checked here at first use, as with
 * deferred checks. The fingerprint is the subset's own. On failure *out is
 * NULL and vf_last_error() names the episode. */
int vf_dataset_subset(const vf_dataset *src, const int64_t *episodes, size_t num_episodes, vf_dataset **out);

/* ---- description (from meta/info.json) ------------------------------ */

const char *vf_dataset_root(const vf_dataset *d);
/* "v3.0", "v2.1" or "v2.0", as written in info.json codebase_version. */
const char *vf_dataset_format_version(const vf_dataset *d);
/* Free text from info.json, or NULL when it is null or absent. */
const char *vf_dataset_robot_type(const vf_dataset *d);
double vf_dataset_fps(const vf_dataset *d);
/* The totals as written in info.json (checked against the metadata; a
 * mismatch is a problem, not a failure). */
int64_t vf_dataset_total_episodes(const vf_dataset *d);
int64_t vf_dataset_total_frames(const vf_dataset *d);
int64_t vf_dataset_total_tasks(const vf_dataset *d);
/* A 64-bit fingerprint of the dataset's identity: format, fps, features,
 * every episode's (index, length, global range, data and video location)
 * and the tasks. Independent of the episode selection. */
uint64_t vf_dataset_fingerprint(const vf_dataset *d);

/* ---- features ----------------------------------------------------------- */

typedef enum vf_feature_kind {
    VF_FEATURE_VECTOR = 0,   /* numeric, shape other than [1] */
    VF_FEATURE_SCALAR = 1,   /* numeric, shape [1] */
    VF_FEATURE_STRING = 2,   /* dtype "string" */
    VF_FEATURE_VIDEO = 3,    /* dtype "video": frames in mp4 files */
    VF_FEATURE_IMAGE = 4,    /* dtype "image": PNG/TIFF bytes in the data Parquet */
    VF_FEATURE_LANGUAGE = 5, /* dtype "language" (skipped by readers) */
} vf_feature_kind;
/* "vector", "scalar", "string", "video", "image" or "language" ("unknown" outside the enum). */
const char *vf_feature_kind_name(vf_feature_kind kind);

/* Element type of a numeric feature (dtype string in info.json). */
typedef enum vf_dtype {
    VF_DTYPE_OTHER = 0, /* video, image, string, language or unknown */
    VF_DTYPE_FLOAT16, VF_DTYPE_FLOAT32, VF_DTYPE_FLOAT64,
    VF_DTYPE_INT8, VF_DTYPE_INT16, VF_DTYPE_INT32, VF_DTYPE_INT64,
    VF_DTYPE_UINT8, VF_DTYPE_UINT16, VF_DTYPE_UINT32, VF_DTYPE_UINT64,
    VF_DTYPE_BOOL,
} vf_dtype;

typedef struct vf_feature {
    const char *name;       /* e.g. "observation.state" */
    const char *dtype;      /* as written in info.json, e.g. "float32", "video" */
    vf_dtype type;          /* numeric element type, VF_DTYPE_OTHER otherwise */
    vf_feature_kind kind;
    int ndim;               /* length of shape */
    const int64_t *shape;   /* ndim entries, each >= 1 */
    int64_t size;           /* product of shape: elements per row */
    int camera;             /* index into vf_dataset_camera() for videos, else -1 */
} vf_feature;

/* Features in info.json order. i must be < vf_dataset_num_features(). */
size_t vf_dataset_num_features(const vf_dataset *d);
const vf_feature *vf_dataset_feature(const vf_dataset *d, size_t i);
/* By name; NULL when absent. */
const vf_feature *vf_dataset_find_feature(const vf_dataset *d, const char *name);

/* A video feature (camera), from its info.json "info" object. Values not
 * given there are 0 / "" (fps falls back to the dataset fps). */
typedef struct vf_camera {
    const char *key;        /* the feature name, e.g. "observation.images.front" */
    int feature;            /* index into vf_dataset_feature() */
    const char *codec;      /* "av1", "h264", "hevc", ... */
    const char *pix_fmt;    /* "yuv420p", "gray12le", ... */
    int width, height, channels;
    double fps;
    int is_depth;           /* is_depth_map, video.is_depth_map or video_info.is_depth_map */
    size_t num_files;       /* distinct mp4 files used by the selected episodes */
} vf_camera;

size_t vf_dataset_num_cameras(const vf_dataset *d);
const vf_camera *vf_dataset_camera(const vf_dataset *d, size_t i);

/* ---- tasks and statistics ----------------------------------------------- */

/* Task strings by task_index. */
size_t vf_dataset_num_tasks(const vf_dataset *d);
const char *vf_dataset_task(const vf_dataset *d, size_t task_index);

/* One statistic of one feature: meta/stats.json for v3.0 and v2.0; for
 * v2.1 the aggregate of meta/episodes_stats.jsonl over all episodes
 * (min/max element-wise, mean count-weighted, std pooled, count summed), as
 * LeRobot computes it. Values are flattened row-major; NaN marks a
 * non-finite or null value in the file. */
typedef struct vf_stat {
    const char *feature;    /* e.g. "action" */
    const char *name;       /* "mean", "std", "min", "max", "count", "q01", ... */
    int ndim;
    const int64_t *shape;
    size_t size;            /* number of values */
    const double *values;
} vf_stat;

size_t vf_dataset_num_stats(const vf_dataset *d);
const vf_stat *vf_dataset_stat(const vf_dataset *d, size_t i);
/* NULL when the dataset has no such statistic. */
const vf_stat *vf_dataset_find_stat(const vf_dataset *d, const char *feature, const char *name);

/* ---- episodes and the locator ------------------------------------------- */

typedef struct vf_episode {
    int64_t episode_index;
    int64_t length;          /* frames (rows) */
    int64_t from_index;      /* global `index` range [from_index, to_index) */
    int64_t to_index;
    size_t num_tasks;        /* the episode's distinct task strings (metadata) */
    const char *const *tasks;
} vf_episode;

/* Selected episodes. pos must be < vf_dataset_num_episodes(). */
size_t vf_dataset_num_episodes(const vf_dataset *d);
const vf_episode *vf_dataset_episode(const vf_dataset *d, size_t pos);
/* Position of a selected episode: 0, or VF_ENOENT (message names it). */
int vf_dataset_find_episode(const vf_dataset *d, int64_t episode_index, size_t *pos);

/* Where an episode's rows are. */
typedef struct vf_data_span {
    const char *path;        /* absolute path of the data Parquet file */
    size_t file;             /* index into vf_dataset_data_file() */
    int64_t row_offset;      /* first row of the episode inside that file */
    int64_t length;          /* rows */
} vf_data_span;
int vf_dataset_episode_data(const vf_dataset *d, size_t pos, vf_data_span *out);

/* Where an episode's frames of one camera are. from/to are seconds inside
 * the mp4 ([from, to), as in the metadata; 0 and length/fps for v2.x). The
 * frame ordinal inside the file is best computed by the video layer from
 * the file's sample table (lerobot-format.md §3.4); first_frame_guess is
 * round(from_timestamp * fps). */
typedef struct vf_video_span {
    const char *path;        /* absolute path of the mp4 file */
    size_t file;             /* index into vf_dataset_video_file(d, camera, ...) */
    double from_timestamp;
    double to_timestamp;
    int64_t length;          /* frames the episode should have (= episode length) */
    int64_t first_frame_guess;
} vf_video_span;
int vf_dataset_episode_video(const vf_dataset *d, size_t pos, size_t camera, vf_video_span *out);

/* Distinct data files used by the selected episodes, in (chunk, file)
 * order for v3.0 and episode order for v2.x (absolute paths). */
size_t vf_dataset_num_data_files(const vf_dataset *d);
const char *vf_dataset_data_file(const vf_dataset *d, size_t i);
/* Distinct mp4 files of a camera used by the selected episodes. */
size_t vf_dataset_num_video_files(const vf_dataset *d, size_t camera);
const char *vf_dataset_video_file(const vf_dataset *d, size_t camera, size_t i);

/* ---- problems ---------------------------------------------------------- */

typedef enum vf_severity {
    VF_SEVERITY_WARNING = 1,
    VF_SEVERITY_ERROR = 2,
} vf_severity;

typedef struct vf_problem {
    vf_severity severity;
    const char *file;        /* path relative to the root, or "" */
    int64_t episode;         /* episode_index, or -1 */
    const char *column;      /* column / key involved, or "" */
    const char *message;
    /* A warning whose subject is served otherwise than the metadata says:
     * info.json disagrees with the files (their frame size is used, a dtype
     * cannot be read and the feature is left out, ...) or a file is served by
     * timestamp (video_mismatch "timestamp"). The Python open gives these as
     * LoaderWarnings and `vlafeed decode-check` exits 3 for them. */
    int changes_samples;
} vf_problem;

size_t vf_dataset_num_problems(const vf_dataset *d);
const vf_problem *vf_dataset_problem(const vf_dataset *d, size_t i);
/* Number of problems of severity error. */
size_t vf_dataset_num_errors(const vf_dataset *d);

/* Files referenced by the selected episodes that do not exist, relative to
 * the root, in the order found (data files first, then videos by camera). */
size_t vf_dataset_num_missing_files(const vf_dataset *d);
const char *vf_dataset_missing_file(const vf_dataset *d, size_t i);

/* ---- frames and video checks -------------------------------------------- */

/* Decodes frame `frame` (0-based within the episode) of episode
 * episode_index, camera `camera` (its feature name), into a newly allocated
 * RGB24 image (uint8 [height][width][3], free() it). The frame is located
 * by its ordinal in the camera file (exact whatever LeRobot's timestamp
 * drift); errors name the file, camera, episode and frame. */
int vf_dataset_read_frame(const vf_dataset *d, int64_t episode_index, int64_t frame, const char *camera,
                          uint8_t **rgb, int *width, int *height);

typedef struct vf_decode_check_settings {
    int decode;            /* 1 (default): decode every frame; 0: sample tables only */
    int decode_threads;    /* threads per decoder, default 1 */
    /* 1: also every problem of severity error the open found (metadata,
     * data footers, videos: open the dataset with check_data_files = 1 and
     * check_videos = 2 for the full check) and every data page of the
     * selected episodes read and verified (values, index, episode_index),
     * so that the report has no error only when loading is correct.
     * Default 0. */
    int thorough;
    /* Called after each file; may be NULL. */
    void (*progress)(void *ctx, int64_t done, int64_t total, const char *what);
    void *progress_ctx;
} vf_decode_check_settings;

void vf_decode_check_defaults(vf_decode_check_settings *s);

/* Checks every video file used by the selected episodes: frames in the file
 * against the metadata, keyframe intervals, each episode's start drift
 * (real pts minus from_timestamp), every frame decodable (decode = 1), and
 * which decoders this machine has (CPU, and NVDEC when a CUDA device is
 * present). *json is a newly allocated report (free()); *num_errors counts
 * the errors in it. Returns < 0 only when the check cannot run at all. */
int vf_dataset_decode_check(const vf_dataset *d, const vf_decode_check_settings *s, char **json,
                            size_t *num_errors);

/* ---- report ------------------------------------------------------------ */

/* The `vlafeed info --json` document (docs/info-json.md) as a newly
 * allocated NUL-terminated string; the caller frees it with free().
 * flags: 0, or VF_INFO_PRETTY for indented output. */
enum { VF_INFO_PRETTY = 1 };
int vf_dataset_info_json(const vf_dataset *d, int flags, char **out);

#ifdef __cplusplus
}
#endif

#endif
