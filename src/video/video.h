/*
 * video.h: the video layer of vlafeed, its whole interface to the layers
 * above (dataset, sample, engine, tools).
 *
 * Owns: demuxing MP4 (and Matroska) through a vf_source, the per-file frame
 * index (every frame's pts in presentation order, keyframes), decoders
 * (libdav1d for AV1, FFmpeg's h264 and hevc), random and batched frame
 * access by frame ordinal, pixel conversion straight into caller memory,
 * a bounded cache of open decoders, the episode -> frame-ordinal mapping for
 * concatenated LeRobot files, and the encoder side used by the sample writer
 * (episode encoding, concatenation that reproduces LeRobot's layout, frame
 * identity stamps for exactness tests).
 *
 * Depends on: base, io, and FFmpeg 5.1 (libavformat, libavcodec, libswscale,
 * libavutil). No FFmpeg type appears in this header.
 *
 * Invariants:
 *  - Frames are addressed by ordinal: 0..frame_count-1 in presentation
 *    order, as the index lists them. A decoded frame is matched to its
 *    ordinal by its pts; a frame that cannot be matched is an error, never a
 *    silently different frame.
 *  - Every function that can fail returns 0 or a negative VF_E* code and sets
 *    a message that names the file (and the camera / episode / frame when the
 *    caller supplied them).
 *  - A reader (demuxer + decoder) is used by one thread at a time. The cache
 *    hands a reader to one thread (checkout) until it is given back.
 *  - Decode loops are bounded by the index: corrupt input ends in an error,
 *    never a hang.
 */
#ifndef VF_VIDEO_H
#define VF_VIDEO_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "io/io.h"
#include "vlafeed/dataset.h" /* vf_video_mismatch: the public name of the mismatch policy */
#include "vlafeed/loader.h"  /* vf_decode_device: the public name of the decode device */

/* ======================================================================
 * Codecs, pixel formats
 * ==================================================================== */

typedef enum vf_video_codec {
    VF_VIDEO_CODEC_UNKNOWN = 0,
    VF_VIDEO_CODEC_AV1 = 1,  /* decoded with libdav1d, encoded with libsvtav1 */
    VF_VIDEO_CODEC_H264 = 2, /* FFmpeg h264 / libx264 */
    VF_VIDEO_CODEC_HEVC = 3, /* FFmpeg hevc / libx265 */
    VF_VIDEO_CODEC_OTHER = 4, /* any other codec the linked FFmpeg decodes (mpeg4, vp9, mjpeg, ...);
                               * vf_video_index.codec_name says which */
} vf_video_codec;

typedef enum vf_video_pixfmt {
    VF_VIDEO_PIX_UNKNOWN = 0,
    VF_VIDEO_PIX_YUV420P = 1,  /* 8-bit 4:2:0 (also accepted: yuvj420p) */
    VF_VIDEO_PIX_GRAY12 = 2,   /* gray12le: LeRobot depth maps, codes 0..4095 */
    VF_VIDEO_PIX_OTHER = 3,    /* any other format swscale converts to RGB (yuv422p, yuv444p,
                                * 10-bit, nv12, gray, ...): the generic swscale path */
} vf_video_pixfmt;

/* "av1", "h264", "hevc", "other" or "unknown". */
const char *vf_video_codec_name(vf_video_codec codec);

/* Sets FFmpeg's own (process-wide) log level from a VF_LOG_* level, or
 * silences it with -1. For applications and tests; the library never calls
 * it. FFmpeg's default prints info lines such as "libdav1d 1.0.0". */
void vf_video_set_ffmpeg_log_level(int vf_log_level);

/* ======================================================================
 * Frame index
 * ==================================================================== */

/* How the index was built. */
enum {
    VF_VIDEO_INDEX_FROM_ENTRIES = 1, /* the container's sample table (MP4 stts/stss), no packet read */
    VF_VIDEO_INDEX_FROM_PACKETS = 2, /* a walk over every packet (reordering streams, non-MP4) */
};

/* The per-file frame index. Built once per file; read-only afterwards, so it
 * may be shared between threads. All arrays have frame_count entries and
 * are owned by the index. */
typedef struct vf_video_index {
    char *name;                 /* the source's name (path or URL) */
    vf_video_codec codec;
    char codec_name[32];        /* FFmpeg's name, e.g. "av1" */
    vf_video_pixfmt pixfmt;
    char pixfmt_name[32];       /* FFmpeg's name, e.g. "yuv420p" */
    int width, height;
    int time_base_num, time_base_den; /* unit of pts[] */
    double avg_fps;             /* container average frame rate, 0 if unknown */
    int64_t frame_count;
    int64_t keyframe_count;
    int64_t *pts;               /* presentation timestamps, strictly ascending (what a seek uses) */
    uint8_t *keyframe;          /* 1 where decoding can start */
    int64_t stream_duration;    /* AVStream.duration in time_base ticks, -1 if unknown */
    int64_t container_duration_us; /* AVFormatContext.duration (mvhd), -1 if unknown */
    int built_from;             /* VF_VIDEO_INDEX_FROM_* */
} vf_video_index;

/* Builds the index of the first video stream of src (takes no ownership of
 * src). *out is owned by the caller: free with vf_video_index_free. */
int vf_video_index_build(vf_video_index **out, vf_source *src);
int vf_video_index_build_file(vf_video_index **out, const char *path);
void vf_video_index_free(vf_video_index *index);

/* Ordinal of the frame whose pts is exactly pts, or -1. */
int64_t vf_video_index_find_pts(const vf_video_index *index, int64_t pts);
/* Ordinal of the frame whose pts is nearest to seconds (ties: the earlier),
 * or -1 when the index is empty. */
int64_t vf_video_index_nearest(const vf_video_index *index, double seconds);
/* The last keyframe at or before ordinal, or -1 if none. */
int64_t vf_video_index_keyframe_before(const vf_video_index *index, int64_t ordinal);
/* pts of ordinal in seconds. ordinal must be in range. */
double vf_video_index_seconds(const vf_video_index *index, int64_t ordinal);
/* VF_ECORRUPT naming the file (and camera) if the file holds fewer than
 * expected frames; 0 otherwise. camera may be NULL. */
int vf_video_index_expect_frames(const vf_video_index *index, int64_t expected, const char *camera);

/* ======================================================================
 * Episodes inside one camera file
 * ==================================================================== */

/* One episode stored in a camera file, as the dataset metadata describes it
 * (videos/<key>/from_timestamp, to_timestamp; length), plus the mapping
 * vf_video_map_episodes computes. */
typedef struct vf_video_episode {
    /* in */
    int64_t episode_index;     /* the caller's id, used in problems and messages */
    double from_timestamp;     /* seconds inside the file */
    double to_timestamp;       /* exclusive end, seconds */
    int64_t length;            /* frames (data rows) of the episode, > 0 */
    /* out */
    int64_t first_ordinal;     /* ordinal of frame 0, -1 when no frame was found */
    int64_t frames_found;      /* frames of the episode located in the file */
    double drift_ms;           /* pts of first_ordinal minus from_timestamp, ms (NAN if unmapped) */
    int64_t *frame_ordinals;   /* NULL when frame k is first_ordinal + k for every k;
                                * else [length] ordinals with -1 where a frame is
                                * missing. Owned by the map (vf_video_map_free). */
    int64_t unmatched_frame;   /* -1, or the first frame k that cannot be matched exactly:
                                * then NO frame of the episode is handed out
                                * (vf_video_episode_frame fails for every k) */
    char unmatched_reason[240];/* why, when unmatched_frame >= 0 */
} vf_video_episode;

typedef enum vf_video_problem_kind {
    VF_VIDEO_PROBLEM_DRIFT = 1,          /* informational: ordinal mapping is exact, but the
                                          * metadata start differs from the real pts by more
                                          * than the tolerance */
    VF_VIDEO_PROBLEM_COUNT_MISMATCH = 2, /* sum of lengths != frames in the file, the difference located
                                          * (pts gaps, short recorded spans): matched by timestamp */
    VF_VIDEO_PROBLEM_MISSING_FRAMES = 3, /* frames [frame, frame+count) of the episode have no
                                          * frame within the tolerance (dropped, edited, past the end) */
    VF_VIDEO_PROBLEM_SPAN_MISMATCH = 4,  /* (to - from) * fps matches neither length (to = end of the
                                          * last frame) nor length - 1 (to = the last frame's time) */
    VF_VIDEO_PROBLEM_UNMATCHED = 5,      /* an error: the episode's frames cannot be matched exactly
                                          * (wrong start, broken pts grid, missing frames); the
                                          * episode is refused as a whole (unmatched_frame) */
    VF_VIDEO_PROBLEM_FILE_REFUSED = 6,   /* an error (episode_index -1): the frame count disagrees
                                          * with the episodes and nothing in the file locates the
                                          * difference; every episode of the file is refused (each
                                          * also has its UNMATCHED record) */
    VF_VIDEO_PROBLEM_FILE_BY_TIMESTAMP = 7, /* a warning (episode_index -1): the same file, served by
                                          * timestamp because the caller opted in
                                          * (VF_VIDEO_MISMATCH_TIMESTAMP); one per file */
} vf_video_problem_kind;

typedef struct vf_video_problem {
    vf_video_problem_kind kind;
    int64_t episode_index;     /* -1 for whole-file problems */
    int64_t frame;             /* first frame (k within the episode) concerned, -1 if none */
    int64_t count;             /* frames concerned (MISSING_FRAMES), else 0 */
    double expected_s, found_s;/* the times compared, seconds (NAN when not applicable) */
    char message[512];
} vf_video_problem;

enum {
    VF_VIDEO_MAP_BY_ORDINAL = 1,
    VF_VIDEO_MAP_BY_TIMESTAMP = 2,
    VF_VIDEO_MAP_REFUSED = 3,  /* no frame of the file is placed: every episode refused */
};

typedef struct vf_video_map_settings {
    double fps;                /* the dataset's fps, > 0 */
    double tolerance_s;        /* timestamp match tolerance; <= 0 means 0.45 / fps */
    const char *camera;        /* used in messages; may be NULL */
} vf_video_map_settings;

/* The policy in effect for `requested`: itself, or for
 * VF_VIDEO_MISMATCH_DEFAULT the environment variable VF_VIDEO_MISMATCH
 * ("timestamp" or "refuse"; unset or empty: refuse; any other value is
 * refused with a warning logged once). Never returns _DEFAULT. */
vf_video_mismatch vf_video_mismatch_resolve(vf_video_mismatch requested);

typedef struct vf_video_map {
    int method;                /* VF_VIDEO_MAP_BY_* */
    double max_abs_drift_ms;
    size_t problem_count;
    vf_video_problem *problems;/* owned by the map */
} vf_video_map;

/* Maps every episode of one camera file to frame ordinals (see
 * lerobot-format.md §3.4). Episodes may be passed in any order; they are
 * processed by from_timestamp. When the lengths sum to the file's frame
 * count, episode e starts at the summed lengths of the earlier episodes
 * (exact whatever the timestamp drift), and each episode is verified from
 * the index: its first pts against from_timestamp (the drift may grow by
 * less than the tolerance from one episode to the next, as LeRobot's
 * millisecond-rounded concatenation makes it grow, but a jump of a frame or
 * more means the metadata and the file disagree), and every frame's pts on
 * the 1/fps grid from the episode's first frame.
 *
 * Otherwise the difference must be located before any frame is placed by
 * time: each episode's time window [from, next episode's from) must hold
 * exactly its frames, on its 1/fps grid, and an episode with fewer must
 * show where the others are missing, either as pts gaps (frames missing
 * before the episode's last frame, whose pts is present) or, for an episode
 * whose recorded span is itself short (LeRobot's streaming encoder), by
 * that span. A file where this fails (a CFR re-encode that dropped frames
 * mid-file, a truncated file, another recording in its place, more frames
 * than the episodes) places no frame with certainty: with the policy
 * VF_VIDEO_MISMATCH_REFUSE every episode of the file is UNMATCHED from frame
 * 0 and one FILE_REFUSED record names the file and both counts (method
 * VF_VIDEO_MAP_REFUSED); with VF_VIDEO_MISMATCH_TIMESTAMP the file is
 * matched by timestamp anyway, with one FILE_BY_TIMESTAMP warning (a file
 * with more frames than its episodes is refused either way). A located
 * difference is matched by timestamp: the first frame with pts >=
 * from - 0.5/fps, then the nearest pts to from + k/fps within the tolerance.
 * An episode that fails any of these is UNMATCHED: a problem record naming
 * the episode and its first unmatched frame, and no frame of it is handed
 * out. The span
 * (to - from) * fps is accepted as length (to = end) or length - 1 (to = the
 * last frame's time, written by some converters). Returns an error only for
 * invalid arguments (non-finite times, length <= 0); data problems are
 * records.
 * The policy is the environment's (VF_VIDEO_MISMATCH_DEFAULT);
 * vf_video_map_episodes_policy takes it explicitly.
 * Free with vf_video_map_free(map, episodes, count). */
int vf_video_map_episodes(const vf_video_index *index, vf_video_episode *episodes, size_t count,
                          const vf_video_map_settings *settings, vf_video_map *map);
/* The same with the mismatch policy given: VF_VIDEO_MISMATCH_DEFAULT,
 * _REFUSE or _TIMESTAMP (VF_EINVAL otherwise). */
int vf_video_map_episodes_policy(const vf_video_index *index, vf_video_episode *episodes, size_t count,
                                 const vf_video_map_settings *settings, vf_video_mismatch policy,
                                 vf_video_map *map);
void vf_video_map_free(vf_video_map *map, vf_video_episode *episodes, size_t count);

/* The ordinal of frame k of a mapped episode. VF_ERANGE if k is outside
 * [0, length); VF_ECORRUPT if that frame is missing from the file. The
 * message names the episode; the caller adds file and camera. */
int vf_video_episode_frame(const vf_video_episode *episode, int64_t k, int64_t *ordinal);

/* ======================================================================
 * Output formats (pixel conversion straight into caller memory)
 * ==================================================================== */

typedef enum vf_video_layout {
    VF_VIDEO_RGB_HWC_U8 = 0,   /* uint8 [H][W][3] */
    VF_VIDEO_RGB_CHW_U8 = 1,   /* uint8 [3][H][W], planes R, G, B */
    VF_VIDEO_RGB_CHW_F32 = 2,  /* float32 [3][H][W], value / 255 (equal to uint8 / 255.0f) */
    VF_VIDEO_GRAY_U16 = 3,     /* uint16 [H][W]: raw codes of a gray stream (12-bit depth: 0..4095) */
} vf_video_layout;

typedef enum vf_video_scaler {
    VF_VIDEO_SCALE_BILINEAR = 0,      /* SWS_BILINEAR (PyAV's default) */
    VF_VIDEO_SCALE_FAST_BILINEAR = 1, /* SWS_FAST_BILINEAR */
    VF_VIDEO_SCALE_BICUBIC = 2,       /* SWS_BICUBIC (the ffmpeg CLI's default) */
    VF_VIDEO_SCALE_AREA = 3,          /* SWS_AREA */
    VF_VIDEO_SCALE_POINT = 4,         /* SWS_POINT */
} vf_video_scaler;

typedef struct vf_video_format {
    vf_video_layout layout;
    int width, height;         /* output size; 0 x 0 = the stream's size */
    vf_video_scaler scaler;    /* used when resizing (and by swscale's chroma path) */
    int streaming;             /* 1: dest is written once and not read again soon (batch memory much
                                * larger than the cache): CHW layouts are stored with non-temporal
                                * stores where the planes are aligned, which skips reading each
                                * destination line into the cache first; values are the same */
} vf_video_format;

/* A zeroed vf_video_format is valid: RGB HWC uint8 at the source size,
 * bilinear, ordinary stores. */
void vf_video_format_defaults(vf_video_format *format);

/* Bytes one frame occupies in format for a src_width x src_height stream. */
size_t vf_video_format_bytes(const vf_video_format *format, int src_width, int src_height);

/* ======================================================================
 * Readers: demuxer + decoder for one file, random and batched access
 * ==================================================================== */

typedef struct vf_video_reader vf_video_reader;
typedef struct vf_video_hwdevice vf_video_hwdevice; /* hwdecode.c */

typedef struct vf_video_settings {
    int decode_threads;        /* threads per decoder; default 1 (parallelism comes from
                                * many readers on the engine's threads) */
    int forward_skip_frames;   /* also keep decoding forward (instead of seeking) when the
                                * target's keyframe lies at most this many frames past the
                                * position; default 0: continue only inside the target's
                                * GOP run. A local seek costs less than decoding one inter
                                * frame (bench: every 2nd frame of a GOP-2 file, 10% faster
                                * with 0 than with 1); raise it for sources where a seek
                                * means a new remote request. */
    int64_t probe_bytes;       /* avformat probesize; default 1 MiB */
    int64_t max_pixels;        /* refuse streams with more pixels per frame; default 8192*8192 */
    const char *camera;        /* optional label for messages ("observation.images.top"); copied */
    vf_decode_device device;   /* CPU, AUTO or CUDA (NVDEC), see vf_decode_device; default
                                * DEFAULT: the environment's (vf_video_decode_device_resolve) */
    vf_video_hwdevice *hwdevice; /* the CUDA device to decode on (not owned; the reader takes its
                                * own reference, so it may be closed first), or NULL: a reader
                                * that wants NVDEC opens a device of its own */
    int early_drain;           /* random access (map mode): when the last target of a read call
                                * is decoded but held back by the decoder's reorder delay (H.264
                                * and HEVC streams that allow B-frames delay every picture, even
                                * at GOP 2), drain the decoder instead of decoding the packets
                                * after it, which the next, random, call would not use. Not done
                                * while the calls run forward through the file (the first target
                                * of a call continues the previous call's run): there the
                                * position is worth keeping. Frames are the same either way;
                                * default 0 (never drain early) */
    int skip_nonref;           /* do not decode non-reference pictures shown before the target
                                * (skip_frame = NONREF for their packets: H.264/HEVC non-reference
                                * pictures, MPEG-4 Part 2 B-VOPs; libdav1d has no such knob): no
                                * other picture uses them, so the target is the same. Helps long
                                * GOPs with B-frames; at GOP 2 there are none. default 0 */
} vf_video_settings;

void vf_video_defaults(vf_video_settings *settings);

/* Opens src (a new reference is taken; the caller keeps its own) and builds
 * the index. settings may be NULL (defaults). Errors name the source: missing
 * or unreadable file, not an MP4, no video stream, unsupported codec or pixel
 * format, truncated or corrupt container. Close with vf_video_close. */
int vf_video_open(vf_video_reader **out, vf_source *src, const vf_video_settings *settings);
int vf_video_open_file(vf_video_reader **out, const char *path, const vf_video_settings *settings);
void vf_video_close(vf_video_reader *reader);

/* The reader's index (owned by the reader, valid until close). */
const vf_video_index *vf_video_reader_index(const vf_video_reader *reader);
const char *vf_video_reader_name(const vf_video_reader *reader);
/* An estimate of the memory the reader holds (index, decoder pictures,
 * scratch), used by the cache's byte bound. */
size_t vf_video_reader_memory(const vf_video_reader *reader);

/* Decodes frame `ordinal` and writes it in `format` to dest (which holds
 * vf_video_format_bytes bytes). Seeks to the keyframe at or before the
 * target unless the decoder is already positioned in the same run, then
 * decodes forward. VF_ERANGE for an ordinal outside the index. */
int vf_video_read_frame(vf_video_reader *reader, int64_t ordinal, const vf_video_format *format, void *dest);

/* One request of a batch. */
typedef struct vf_video_request {
    int64_t frame_ordinal;     /* in */
    void *dest;                /* in: vf_video_format_bytes bytes */
    int64_t episode;           /* in, optional (-1): named in error messages */
    int64_t frame_in_episode;  /* in, optional (-1): named in error messages */
    int status;                /* out: 0 or the negative code of this request */
} vf_video_request;

/* Serves many requests on one file: sorted by ordinal, each forward decode
 * run is decoded once and every request in it (duplicates too) is served
 * from it. The requests array is not reordered. Returns 0 when every
 * request succeeded, else the first failure's code (with its message); each
 * request's status says which ones failed. */
int vf_video_read_frames(vf_video_reader *reader, vf_video_request *requests, size_t count,
                         const vf_video_format *format);

/* vf_video_read_frames in two steps, for a reader shared between threads:
 * the decode needs the reader, the conversion only the decoded pictures.
 * Decodes and keeps a reference to each target's picture in *held (set
 * even on failure: the frames that came out); the caller may then give the
 * reader back (or close it) and call vf_video_held_convert (a converter
 * made for the call) or vf_video_cache_convert (one of the cache's, reused),
 * which write the destinations, then vf_video_held_free. The requests array must live until the conversion
 * (a failed conversion sets its requests' status). GPU surfaces, and
 * pictures past 32 MB held by one call, are delivered during the decode
 * step. */
typedef struct vf_video_held vf_video_held;
int vf_video_read_frames_held(vf_video_reader *reader, vf_video_request *requests, size_t count,
                              const vf_video_format *format, vf_video_held **held);
int vf_video_held_convert(vf_video_held *held);
void vf_video_held_free(vf_video_held *held);

typedef struct vf_video_stats {
    uint64_t frames_decoded;   /* frames that came out of the decoder */
    uint64_t frames_delivered; /* frames written to destinations (duplicates counted) */
    uint64_t packets_read;
    uint64_t seeks;
    uint64_t continued;        /* targets reached by decoding forward without a seek */
    uint64_t reused;           /* targets served from the frame already decoded */
    uint64_t early_drains;     /* calls whose last target came out by an early drain */
} vf_video_stats;

void vf_video_get_stats(const vf_video_reader *reader, vf_video_stats *stats);

/* ======================================================================
 * Decode device: NVDEC through FFmpeg's CUDA hwaccel (hwdecode.c)
 * ==================================================================== */

/* The device in effect for `requested`: itself, or for
 * VF_DECODE_DEVICE_DEFAULT the environment variable VF_DECODE_DEVICE
 * ("auto", "cpu", "cuda"; unset or empty: cpu; any other value: cpu with a
 * warning logged once). Never returns _DEFAULT. */
vf_decode_device vf_video_decode_device_resolve(vf_decode_device requested);

/* A CUDA device created through FFmpeg (av_hwdevice_ctx_create), shared by
 * the readers that decode on it. Opening never fails for want of a device:
 * the handle then records why (vf_video_hwdevice_unavailable). *out is
 * owned by the caller (vf_video_hwdevice_close); 0 or VF_ENOMEM.
 *
 * Test hook: the environment variable VF_TEST_NVDEC=absent makes the open
 * report no device; VF_TEST_NVDEC=open-fails makes it report a device and
 * every NVDEC decoder open on it fail, so that the fallback and the error
 * paths run on machines without a GPU. */
int vf_video_hwdevice_open(vf_video_hwdevice **out);
void vf_video_hwdevice_close(vf_video_hwdevice *device);
/* NULL when the device is usable, else why not ("no CUDA device (...)"). */
const char *vf_video_hwdevice_unavailable(const vf_video_hwdevice *device);

/* Where the reader decodes: VF_DECODE_DEVICE_CUDA (NVDEC) or
 * VF_DECODE_DEVICE_CPU. *reason (may be NULL) receives why it is on the CPU
 * although AUTO asked for NVDEC, or "" (owned by the reader). */
vf_decode_device vf_video_reader_device(const vf_video_reader *reader, const char **reason);

/* ======================================================================
 * Decoder cache
 * ==================================================================== */

typedef struct vf_video_cache vf_video_cache;

/* Opens the source behind a cache key (a path or URL). Default: local file. */
typedef int (*vf_video_open_source_fn)(void *ctx, const char *key, vf_source **out);

/* The decode device for the file behind key (e.g. by the key's camera). */
typedef vf_decode_device (*vf_video_device_for_fn)(void *ctx, const char *key);
/* Told about every reader the cache opened (e.g. to count where it decodes).
 * Called outside the cache's lock, from the thread that checked it out. */
typedef void (*vf_video_opened_fn)(void *ctx, const char *key, const vf_video_reader *reader);

typedef struct vf_video_cache_settings {
    size_t max_entries;        /* open readers kept, busy ones included; default 32 */
    size_t max_bytes;          /* estimated bytes kept (vf_video_reader_memory); default 1 GiB */
    vf_video_settings video;   /* settings for the readers it opens */
    vf_video_open_source_fn open_source; /* NULL: vf_source_open_file */
    void *open_source_ctx;
    vf_video_device_for_fn device_for;   /* NULL: video.device for every key */
    vf_video_opened_fn opened;           /* NULL: none */
    void *hooks_ctx;           /* passed to device_for and opened */
} vf_video_cache_settings;

typedef struct vf_video_cache_stats {
    uint64_t hits, misses, evictions;
    size_t entries, busy, bytes;
} vf_video_cache_stats;

void vf_video_cache_defaults(vf_video_cache_settings *settings);
int vf_video_cache_open(vf_video_cache **out, const vf_video_cache_settings *settings);
/* Closes every reader. All checked-out readers must have been returned. */
void vf_video_cache_close(vf_video_cache *cache);

/* Hands the caller a reader for key for its exclusive use: an idle cached
 * one (hit) or a newly opened one (miss). Opening happens outside the lock.
 * Give it back with vf_video_cache_return (keep it) or vf_video_cache_discard
 * (close it, e.g. after a decode error). Idle readers are evicted least
 * recently used first when a bound is exceeded; busy readers never. */
int vf_video_cache_checkout(vf_video_cache *cache, const char *key, vf_video_reader **reader);
void vf_video_cache_return(vf_video_cache *cache, vf_video_reader *reader);
void vf_video_cache_discard(vf_video_cache *cache, vf_video_reader *reader);
/* vf_video_held_convert with a converter the cache keeps for reuse (one per
 * thread converting at the same time; their swscale contexts and scratch
 * live until the cache is closed). Thread-safe. */
int vf_video_cache_convert(vf_video_cache *cache, vf_video_held *held);
void vf_video_cache_get_stats(vf_video_cache *cache, vf_video_cache_stats *stats);

/* ======================================================================
 * Encoder side (the sample writer)
 * ==================================================================== */

typedef struct vf_video_encode_settings {
    vf_video_codec codec;      /* AV1 (libsvtav1, default), H264 (libx264), HEVC (libx265) */
    vf_video_pixfmt pixfmt;    /* YUV420P (default) from RGB frames; GRAY12 (HEVC only,
                                * lossless like LeRobot's depth) from uint16 frames */
    int width, height;         /* libsvtav1 needs both >= 64 */
    int fps;                   /* frames per second, > 0 */
    int gop;                   /* keyframe interval; default 2 (LeRobot) */
    int crf;                   /* default 30 (LeRobot) */
    int preset;                /* libsvtav1 preset; default 12 (LeRobot); -1 = encoder default */
    const char *x26x_preset;   /* libx264/libx265 preset name; NULL = encoder default */
    int fast_decode;           /* libsvtav1 fast-decode (0..2), tune=fastdecode for x26x; default 0 */
    int threads;               /* encoder threads (svt lp=, x264 threads, x265 pools); default 1 */
    int b_frames;              /* -1 = encoder default (x264: 3, like LeRobot); 0 = none */
} vf_video_encode_settings;

void vf_video_encode_defaults(vf_video_encode_settings *settings);

/* Fills frame `frame` (0-based). pixels: RGB24 rows of width*3 bytes (GRAY12:
 * uint16 codes, width*2 bytes), stride bytes apart. Return 0, or a negative
 * code (with a message) to abort the encode. */
typedef int (*vf_video_fill_fn)(void *ctx, int64_t frame, uint8_t *pixels, size_t stride);

/* Encodes num_frames frames into a new MP4 at path (written to a temporary
 * name and renamed, so a failure leaves no partial file). Timestamps like
 * LeRobot/PyAV: pts = frame index at 1/fps; the MP4 track timescale becomes
 * fps * 2^k >= 10000 (30 fps -> 15360); moov after mdat. libsvtav1 runs with
 * lp=threads, no pinning, and cannot raise its threads to real-time priority
 * (CAP_SYS_NICE is dropped from the calling thread while it starts them). */
int vf_video_write_episode(const char *path, const vf_video_encode_settings *settings, int64_t num_frames,
                           vf_video_fill_fn fill, void *ctx);

/* stream.duration * time_base of the first video stream, in seconds (the
 * container duration when the stream has none): LeRobot's
 * get_video_duration_in_s. */
int vf_video_stream_duration(const char *path, double *seconds);

/* Concatenates MP4 files by packet remux (no re-encode), placing each file
 * at the summed container durations of the earlier ones (FFmpeg's concat
 * demuxer; the MP4 mvhd duration is whole milliseconds rounded up), with
 * moov first (faststart). This reproduces LeRobot's timestamp drift. out may
 * be one of the inputs (written to a temporary name, then renamed). All
 * inputs must share codec and size. */
int vf_video_concat(const char *const *inputs, size_t count, const char *out);
/* The same, but each file starts where the previous streams end (the summed
 * stream durations, in the streams' time base): no drift, as LeRobot 0.6's
 * recorder concatenates with a current FFmpeg. The recording API uses it. */
int vf_video_concat_exact(const char *const *inputs, size_t count, const char *out);

/* ======================================================================
 * Frame identity stamps (tests of frame exactness)
 * ==================================================================== */

/* Limits of the stamped fields. */
#define VF_VIDEO_IDENTITY_MAX_EPISODE ((1 << 24) - 1)
#define VF_VIDEO_IDENTITY_MAX_FRAME ((1 << 24) - 1)
#define VF_VIDEO_IDENTITY_MAX_CAMERA 255
/* Smallest image a stamp fits in. */
#define VF_VIDEO_IDENTITY_MIN_WIDTH 18
#define VF_VIDEO_IDENTITY_MIN_HEIGHT 16

/* Paints (episode, frame, camera) plus a CRC-16 over an RGB24 image of
 * w x h (rows stride bytes apart) as a 9 x 8 grid of black and white blocks
 * covering the image. Survives AV1 crf 30 and H.264 down to about 96 x 64,
 * and resizing. To stamp part of a picture, pass a pointer into it. */
int vf_video_stamp_identity(uint8_t *rgb, int w, int h, size_t stride, int64_t episode, int64_t frame,
                            int camera);
/* Reads a stamp back. VF_ECORRUPT when a block is ambiguous or the checksum
 * fails (not a stamped frame, or damaged beyond recovery). */
int vf_video_read_identity(const uint8_t *rgb, int w, int h, size_t stride, int64_t *episode, int64_t *frame,
                           int *camera);

/* ======================================================================
 * Capabilities (capabilities.c)
 * ==================================================================== */

/* Which decoders this machine has, as a JSON object:
 * {"cpu": {"av1": "libdav1d"|null, "h264": ..., "hevc": ...},
 *  "nvdec": {"available": bool, "reason": "...", "decoders": {...}}}
 * Newly allocated string (free()), or NULL on ENOMEM. NVDEC is available
 * when FFmpeg can create a CUDA device; AV1 NVDEC needs a GPU generation
 * that has it (A100/H100/H200 do not), so av1_cuvid is listed only as
 * "built", not promised. */
char *vf_video_capabilities_json(void);

#endif
