/*
 * loader.h: the public loader API: samples with LeRobot's semantics,
 * assembled by the C engine into batches of contiguous typed columns.
 *
 *   vf_loader_settings ls;  vf_loader_defaults(&ls);
 *   ls.mode = VF_MODE_STREAM; ls.batch_size = 64; ls.seed = 0;
 *   vf_loader *l;  if (vf_loader_open(&l, dataset, &ls) < 0) ... vf_last_error()
 *   vf_batch *b;
 *   while ((r = vf_loader_next(l, &b)) == 0) { ... vf_batch_release(b); }
 *   // r == VF_EOF: the epoch is over; vf_loader_set_epoch(l, 1) starts the next
 *   vf_loader_close(l);
 *
 * Map-style access (LeRobotDataset.__getitem__) uses vf_loader_get_items()
 * on a loader opened with VF_MODE_MAP: any list of global frame positions,
 * assembled into one batch.
 *
 * Ownership: the loader borrows the dataset (keep it open until the loader
 * is closed). A batch belongs to the caller from vf_loader_next/get_items
 * until vf_batch_release; its column memory comes from the loader's buffer
 * pool and goes back there on the last release (vf_batch_ref adds one, so
 * zero-copy views in Python can keep a batch alive). A batch stays valid
 * after vf_loader_close until its last release, as long as the dataset is
 * open (task strings point into it). Strings in settings are copied at open.
 *
 * Work: stream loaders start assembling batches at open (fast first
 * batch), map loaders at the first vf_loader_next; at most prefetch + threads
 * batches are built ahead of the caller (backpressure), where prefetch is
 * prefetch_batches, reduced (to at least 1) so that the prefetched batches
 * hold at most prefetch_bytes. Each
 * batch's frames are requested together and grouped per video file, one
 * sorted vf_video_read_frames call per file; engine threads check readers
 * out of the loader's decoder cache, so a file is open at most once per
 * thread that is decoding it.
 *
 * Order: what comes at position k of an epoch is a pure function of
 * (dataset fingerprint, seed, epoch, settings, rank, world_size, consumer),
 * never of thread timing or thread count.
 *
 * Distribution: the epoch's global sequence (map: a seeded permutation of
 * the positions; stream: the partition's tasks in a seeded order, each
 * task's frames in order; pool: the episodes in a seeded order, each
 * episode's frames in order) is cut into world_size equal contiguous
 * slices.
 * Remainder rule: without drop_last every rank gets ceil(N / world_size)
 * samples, the last slices wrapping around to the start of the sequence
 * (a few samples repeat, like torch's DistributedSampler); with drop_last
 * every rank gets floor(N / world_size) and the tail is dropped. A rank's
 * slice is split over its num_consumers consumers in contiguous parts
 * (sizes differ by at most one, no padding, so a rank's consumers together
 * cover its slice exactly once); stream mode's shuffle buffer (pool mode:
 * the pool's draws) then orders each consumer's part (seeded by seed,
 * epoch, rank, consumer); each consumer's part is cut into batches; a
 * loader with consumer = -1 yields its consumers' batches round-robin (the
 * order in which a DataLoader takes them from its workers), a loader with
 * consumer = c only consumer c's.
 *
 * Pool mode (VF_MODE_POOL): the epoch's global sequence is the selected
 * episodes in a seeded permutation (the same on every rank), each
 * episode's frames in order; it is split over ranks and consumers by the
 * same remainder rule, so a consumer's part is a run of episodes (the
 * first and last possibly partial: "segments"). Each consumer keeps
 * episode_pool_size segments in its pool and emits a uniformly random
 * remaining frame of the pool (every remaining frame equally likely, drawn
 * from vf_rng_derive(seed, pool, epoch, rank, consumer)); an exhausted
 * segment is evicted and the next one of the part admitted. Windows are
 * exact slices of the episode's rows in RAM (clamped and padded at the
 * episode's ends, no look-back or look-ahead limit). Frames are decoded
 * only when a sample is assembled into a batch; the pool itself is a few
 * integers per segment. Without shuffle the part is emitted in order.
 *
 * Table rows: no mode reads the data files at open. A batch reads the
 * rows of the episodes it draws from when they are not cached yet (plus
 * read-ahead: the following episodes of the same data file that this
 * loader emits in the epoch), so a rank reads only the row groups of its
 * own share; the row cache is bounded by table_cache_bytes (least recently
 * used first). Counters are in vf_loader_stats (table_*).
 *
 * Resume: vf_loader_get_state returns a few integers (vf_loader_state)
 * that restore, on any rank and in any worker, the stream exactly where
 * the callers were: samples_consumed counts the samples delivered to the
 * callers of all ranks in the current epoch (a rank's count times
 * world_size; every rank delivers the same batches sizes in lockstep).
 * Restoring (vf_loader_set_state, or settings.resume at open) rebuilds the
 * epoch's plan and skips what was delivered without assembling or decoding
 * anything. A state is refused (VF_EINVAL, the message naming what
 * differs) when it comes from another dataset or episode selection, or
 * from other order settings (mode, seed, batch_size, world_size,
 * consumers, shuffle, drop_last, partition, shuffle_buffer,
 * episode_pool_size); engine threads, prefetch and sample settings may
 * change.
 *
 * Elastic resume: a state saved at world size N with W consumers per rank
 * and batch size B restores at world size M, W' consumers and batch size
 * B' (any of the three may differ). The order of an epoch is a pure
 * function of (seed, epoch) over one global sequence, and every consumer
 * emits a deterministic function of its contiguous slice of it, so the
 * restoring loader replays, from the state's integers alone, what each of
 * the N x W old consumers had delivered (no decoding, no table reads),
 * takes it out, and splits what remains (in global order) over the new
 * consumers by the same remainder rule. Nothing is delivered twice and
 * nothing skipped: the old and new runs together deliver every sample of
 * the epoch exactly once (plus the wrap padding of each run, without
 * drop_last). The state then records the old layout and its batch count
 * as a generation (below), so a second restore, elastic or not, replays
 * the chain and continues from there: the state holds a few integers per
 * restore, whatever was delivered. Replaying costs O(samples of the
 * epoch) time per generation at every open of a loader from the state
 * (integer work over the plan, no reads) and memory for the remaining
 * ranges while it runs; the next epoch starts from the whole sequence.
 * The other order settings must still match.
 *
 * Workers: a loader with consumer = c restored at a state k batches into
 * its rank's epoch serves the rank's remaining batches k + c, k + c + C,
 * k + c + 2C, ... (C = num_consumers): a DataLoader restarted over its
 * workers, taking one batch from each worker in turn starting at worker 0,
 * then yields exactly what the uninterrupted run would have yielded next.
 *
 * Placement: with cpus set, the engine threads start pinned to that CPU
 * set (a CPU this process may not run on is refused at open, VF_EINVAL
 * naming it) and the decoder threads they start inherit it. threads = 0
 * then means one engine thread per CPU of the set. decode_threads = 0
 * sizes the decoders from the cores of the rank: cores / engine threads,
 * at least 1 and at most 8, where cores is num_cpus when pinned, else the
 * CPUs this process may run on (sched_getaffinity). vf_loader_stats
 * reports both as resolved.
 *
 * Data wait: vf_loader_next measures the time it blocks waiting for the
 * next batch (wait_seconds), the part of it after the first batch was
 * handed out (wait_after_first_seconds) and the wall time from the first
 * batch handed out to the last (handout_seconds); their ratio is the
 * fraction of the caller's loop spent waiting for data once the pipeline
 * is running (the first batch's latency is first_batch_seconds).
 * vf_loader_get_items is synchronous and not counted.
 *
 * Threads: one caller thread drives a loader at a time; batches may be
 * released from any thread; vf_loader_cancel may be called from any thread.
 */
#ifndef VLAFEED_LOADER_H
#define VLAFEED_LOADER_H

#include "vlafeed/dataset.h"
#include "vlafeed/vlafeed.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vf_mode {
    VF_MODE_MAP = 0,    /* random access by position (vf_loader_get_items); next() walks a
                         * seeded permutation of positions (or 0..N-1 with shuffle = 0) */
    VF_MODE_STREAM = 1, /* partitions (file groups by default) decoded forward, shuffled per epoch */
    VF_MODE_POOL = 2,   /* episode pool: random frames across episode_pool_size episodes per consumer */
} vf_mode;

typedef enum vf_partition {
    VF_PARTITION_FILE_GROUP = 0, /* contiguous episodes sharing one tuple of video files */
    VF_PARTITION_EPISODE = 1,    /* one task per episode */
    VF_PARTITION_SEQUENTIAL = 2, /* one task per consumer, contiguous ranges of episodes */
} vf_partition;

typedef enum vf_image_format {
    VF_IMAGE_FLOAT32_CHW = 0, /* LeRobot default: float32 [C,H,W] in [0,1] */
    VF_IMAGE_UINT8_CHW = 1,   /* LeRobot return_uint8=True (lerobot-train) */
    VF_IMAGE_UINT8_HWC = 2,
} vf_image_format;

typedef enum vf_normalization {
    VF_NORM_NONE = 0,
    VF_NORM_MEAN_STD = 1, /* (x - mean) / (std + eps), from the dataset stats */
    VF_NORM_MIN_MAX = 2,  /* 2 * (x - min) / (max - min + eps) - 1 */
} vf_normalization;

/* delta_timestamps entry: seconds relative to the current frame. */
typedef struct vf_delta_spec {
    const char *key;
    const double *seconds;
    size_t count;
} vf_delta_spec;

typedef struct vf_rename_spec {
    const char *from; /* dataset key, e.g. "observation.images.cam_high" */
    const char *to;   /* name in the batch, e.g. "observation.images.base_0_rgb" */
} vf_rename_spec;

typedef struct vf_norm_spec {
    const char *key;
    vf_normalization mode;
} vf_norm_spec;

/* What one sample holds and how it is transformed. */
typedef struct vf_sample_settings {
    const vf_delta_spec *delta_timestamps; /* NULL/0: no windows */
    size_t num_delta_timestamps;
    double tolerance_s;                    /* delta grid check, default 1e-4 (LeRobot's) */
    const char *const *keys;               /* features to emit; NULL = all (video, vectors, scalars) */
    size_t num_keys;
    const vf_rename_spec *renames;
    size_t num_renames;
    vf_image_format image_format;          /* default VF_IMAGE_FLOAT32_CHW */
    int resize_width, resize_height;       /* 0 = the stream's size */
    const vf_norm_spec *normalize;
    size_t num_normalize;
    int lerobot_shapes;                    /* 1 (default): squeeze single-delta video keys to
                                            * [C,H,W] as LeRobot does; 0: always [T,...] for windowed keys */
    int include_task;                      /* 1 (default): a "task" string column */
} vf_sample_settings;

/* Pool mode: which episode segment a consumer admitted to or evicted from
 * its pool (see "Pool mode" above). */
typedef struct vf_pool_event {
    size_t episode;            /* selected-episode index: vf_dataset_episode(d, episode),
                                * vf_dataset_episode_video(d, episode, camera, ...) */
    int64_t episode_index;     /* the dataset's episode_index */
    int64_t first_frame;       /* the frames of the episode this segment holds: */
    int64_t num_frames;        /* [first_frame, first_frame + num_frames) */
    int rank, consumer;
    int64_t epoch;
} vf_pool_event;

/* Admission and eviction hooks (e.g. a prefetching cache: fetch an
 * episode's video bytes on admit, release them on evict). Both run on the
 * thread that calls the loader (inside vf_loader_open, vf_loader_next,
 * vf_loader_set_epoch, vf_loader_set_state, vf_loader_close), never
 * concurrently, and must not call the loader. on_admit(e) runs before the
 * engine assembles the first batch that draws from e's segment (up to
 * `window` batches ahead of the caller, see vf_loader_stats); on_evict(e)
 * after the caller has received the last batch that draws from it, or when
 * the epoch is abandoned (set_epoch, set_state, close). Every on_admit is
 * matched by exactly one on_evict. NULL hooks are skipped. */
typedef struct vf_pool_hooks {
    void (*on_admit)(void *ctx, const vf_pool_event *event);
    void (*on_evict)(void *ctx, const vf_pool_event *event);
    void *ctx;
} vf_pool_hooks;

/* A loader's position, to resume it (see "Resume" above). Plain integers:
 * store them however you like (the Python binding uses a dict). */
#define VF_LOADER_STATE_VERSION 3 /* 2 added the ranges, 3 the generations; versions 1 and 2 are read too */
#define VF_LOADER_MAX_GENERATIONS 4096 /* elastic restores one state may record within one epoch */

/* An earlier run of the state's epoch in another layout (elastic resume):
 * its world size, consumers per rank and batch size, the rank-level
 * batches it delivered, and the samples of the epoch left after it. The
 * run's order settings are the state's. */
typedef struct vf_loader_generation {
    int64_t world_size, consumers, batch_size;
    int64_t batches;           /* rank-level batches delivered in that layout (within what was left before it) */
    int64_t remaining;         /* samples of the epoch it left undelivered (> 0) */
} vf_loader_generation;

typedef struct vf_loader_state {
    uint32_t version;          /* VF_LOADER_STATE_VERSION */
    uint32_t mode;             /* vf_mode */
    uint64_t fingerprint;      /* vf_dataset_fingerprint of the dataset */
    uint64_t selection;        /* hash of the selected episodes (index, length) */
    int64_t positions;         /* frames of the selected episodes */
    uint64_t seed;
    int64_t epoch;             /* the epoch in progress */
    int64_t samples_consumed;  /* samples delivered to the callers of all ranks in this epoch */
    int64_t batch_size;
    int32_t world_size;
    int32_t consumers;         /* consumers per rank (engine consumers, or DataLoader workers) */
    int32_t shuffle, drop_last;
    int32_t partition;         /* stream mode, else 0 */
    int64_t shuffle_buffer;    /* stream mode, else 0 */
    int64_t episode_pool_size; /* pool mode, else 0 */
    /* Elastic resume: after a restore at another world size, consumer
     * count or batch size, the epoch continues over what the earlier runs
     * had not delivered. That set is not stored: it is replayed from the
     * generations (the earlier runs' layouts and batch counts, oldest
     * first), starting from `ranges`, so a state's size grows with the
     * number of restores, not with the samples delivered (a pool-mode
     * remainder is millions of ranges at 10^7 samples). samples_consumed
     * counts within the last generation's remainder.
     * ranges: num_ranges ascending, disjoint [start, end) index ranges of
     * the epoch's global order (ranges[2i], ranges[2i+1]) the first
     * generation started from; 0 / NULL: the whole epoch. Version 3 states
     * written by vlafeed have none (version 2 states carried the remainder
     * here, and are read as such). From vf_loader_get_state both arrays
     * belong to the loader (valid until its next set_state, set_epoch or
     * close); given to the loader they are copied. */
    size_t num_ranges;
    const int64_t *ranges;
    size_t num_generations;    /* at most VF_LOADER_MAX_GENERATIONS */
    const vf_loader_generation *generations;
    uint64_t settings_hash;    /* over every field above except epoch and samples_consumed
                                * (and over the values of the ranges and generations) */
} vf_loader_state;

/* What iteration (vf_loader_next) does with a sample whose frame or table
 * row cannot be read (a damaged, missing or refused video or data file):
 * RAISE fails the batch with the error (naming file, camera/column and
 * episode); SKIP leaves the sample out of its batch, which is then shorter
 * (a batch left empty is not delivered), and records it (vf_loader_skip).
 * The order and the batch sequence are unchanged, so a resume state taken
 * under SKIP resumes exactly (samples_consumed counts skipped samples as
 * consumed). Out of memory always fails. vf_loader_get_items always fails
 * on such a sample: its positions are asked for explicitly. */
typedef enum vf_on_error { VF_ON_ERROR_RAISE = 0, VF_ON_ERROR_SKIP = 1 } vf_on_error;

/* Where video frames are decoded (decode_device; Python decode_device=,
 * environment VF_DECODE_DEVICE). CPU: libdav1d / FFmpeg's software
 * decoders, as always. CUDA: NVDEC through FFmpeg's CUDA hwaccel, required:
 * a camera whose files cannot be decoded there fails, the message naming
 * camera, file, codec and why (no CUDA device, an FFmpeg without CUDA
 * hwaccel, a codec this GPU's NVDEC lacks, such as AV1 on A100/H100/H200).
 * AUTO: NVDEC where that works, else the CPU, with the reason recorded
 * (vf_loader_decode_device) and a one-line notice per reason and process.
 * DEFAULT: the environment variable VF_DECODE_DEVICE ("auto", "cpu",
 * "cuda"; unset or empty: cpu; any other value: cpu with a warning). The
 * frame mapping (which frame a sample gets) is the same on every device;
 * pixel values may differ slightly (docs/gpus.md). */
typedef enum vf_decode_device {
    VF_DECODE_DEVICE_DEFAULT = 0,
    VF_DECODE_DEVICE_AUTO = 1,
    VF_DECODE_DEVICE_CPU = 2,
    VF_DECODE_DEVICE_CUDA = 3,
} vf_decode_device;

/* One camera's own decode device (vf_loader_settings.decode_device_cameras). */
typedef struct vf_decode_device_camera {
    const char *camera;        /* the camera's feature key, e.g. "observation.images.top" */
    vf_decode_device device;
} vf_decode_device_camera;

typedef struct vf_loader_settings {
    vf_mode mode;
    size_t batch_size;         /* default 32 */
    int drop_last;             /* default 0: the last batch may be short */
    uint64_t seed;             /* default 0 */
    int shuffle;               /* default 1 */
    int64_t epoch;             /* first epoch, default 0 */
    int rank, world_size;      /* default 0 / 1; -1 = read RANK / WORLD_SIZE from the environment */
    int num_consumers;         /* consumers (engine workers) per rank, default 1 */
    int consumer;              /* when a DataLoader worker process is one consumer: its id, else -1 */
    int threads;               /* engine threads; 0 = number of cores (of cpus when pinned) */
    int decode_threads;        /* threads per decoder, default 1; 0 = from the cores (see Placement);
                                * NVDEC decoders: always 1 */
    vf_decode_device decode_device; /* every camera's decode device (see vf_decode_device);
                                     * default VF_DECODE_DEVICE_DEFAULT: the environment's */
    const vf_decode_device_camera *decode_device_cameras; /* per-camera overrides (copied; an
                                     * unknown camera is refused), or NULL */
    size_t num_decode_device_cameras;
    size_t prefetch_batches;   /* bounded output queue depth, default 4 */
    size_t prefetch_bytes;     /* ...and at most this many bytes of queued batches: fewer
                                * (at least 1) are queued when batches are big; default
                                * 1 GiB, 0 = no byte bound */
    size_t shuffle_buffer;     /* stream mode: samples in the local shuffle buffer, 0 = off */
    vf_partition partition;    /* stream mode, default VF_PARTITION_FILE_GROUP */
    size_t episode_pool_size;  /* pool mode: episode segments per consumer, default 16 */
    size_t decoder_cache_entries; /* open decoders kept; 0 (default) = 32, or in pool mode
                                   * the pool's working set: episode_pool_size x cameras x
                                   * consumers of this loader (x threads when
                                   * share_video_readers = 0), at most 128; in map mode video
                                   * files, at least 32, at most 128 */
    int share_video_readers;   /* 1 or -1 (default): one reader per video file serves every
                                * engine thread in turn (a thread waits for the decoder of a
                                * file another is decoding; the conversion of the decoded
                                * pictures runs outside that wait), so a run opens what
                                * vf_plan_count_opens counts at any thread count; 0: each
                                * thread opens its own reader of a file it needs while
                                * another decodes it (more opens, no waiting) */
    vf_pool_hooks pool_hooks;  /* pool mode: admission / eviction callbacks (none by default) */
    /* Pool mode over a remote (http/https/s3) root: prefetch-on-admit. When
     * both are set, admitting an episode starts background downloads of its
     * video files into a local cache in this folder (a private subfolder,
     * removed at close), refcounted because episodes share files, released
     * on eviction and bounded by prefetch_cache_bytes; decoding then reads
     * local bytes (range requests until a download is done). */
    const char *prefetch_cache_dir;   /* NULL (default): no prefetch */
    uint64_t prefetch_cache_bytes;    /* byte bound of that cache */
    size_t table_cache_bytes;  /* bound of the table rows kept in memory (episodes are read lazily,
                                * when a batch needs them); 0 (default) = 256 MiB */
    int table_disk_cache;      /* map mode: the table cache on disk (docs/scale.md "The table cache
                                * on disk"): -1 (default) when the table does not fit in
                                * table_cache_bytes and the loader draws at least one sample per
                                * episode this epoch; 1 whenever map mode reads a local table;
                                * 0 never. VF_TABLE_CACHE=0 turns it off; VF_CACHE_DIR moves it */
    const int *cpus;           /* engine threads pinned to these CPUs (see Placement; copied at open);
                                * NULL / 0 (default): not pinned */
    size_t num_cpus;
    const vf_loader_state *resume; /* NULL, or a state to start from (copied; checked like
                                    * vf_loader_set_state; overrides epoch) */
    vf_on_error on_error;      /* VF_ON_ERROR_RAISE (default) or VF_ON_ERROR_SKIP (see below) */
    int log_warnings;          /* default 1: each vf_loader_warning is also printed on stderr (a
                                * warning about the whole epoch by rank 0 only); 0 when the caller
                                * reports them itself (the Python binding, through `warnings`) */
    vf_sample_settings sample;
} vf_loader_settings;

void vf_loader_defaults(vf_loader_settings *s);

typedef struct vf_loader vf_loader;
typedef struct vf_batch vf_batch;

/* Opens a loader over the dataset's selected episodes. Checks the settings
 * (unknown keys in delta_timestamps/renames/normalize, off-grid deltas,
 * missing stats for normalization) with messages naming the key. */
int vf_loader_open(vf_loader **out, vf_dataset *dataset, const vf_loader_settings *settings);
/* Cancels what is in flight (vf_loader_cancel), joins the engine threads
 * and frees the loader. */
void vf_loader_close(vf_loader *l);
/* Stops the loader's remote reads: requests of its engine threads (and of
 * its prefetch file cache) make no further attempt, end their wait between
 * retries and abort a transfer in progress, failing with "cancelled"; a
 * batch that needed one fails whole (VF_EIO), never a partial sample.
 * From then on vf_loader_next and vf_loader_get_items fail with "loader:
 * cancelled"; what is left to do is closing it. Any thread,
 * also while another is inside vf_loader_next (e.g. to stop a training
 * loop waiting on an outage); closing from another thread still needs the
 * caller's call to return first. */
void vf_loader_cancel(vf_loader *l);

/* Number of samples this consumer (rank, consumer) yields per epoch, and the
 * number of positions in map mode (the selected episodes' frames). */
int64_t vf_loader_num_samples(const vf_loader *l);
int64_t vf_loader_num_positions(const vf_loader *l);
/* Number of batches vf_loader_next yields per epoch (each consumer's last
 * batch may be short unless drop_last). */
size_t vf_loader_num_batches(const vf_loader *l);

/* The next batch of the current epoch; VF_EOF when the epoch is done. */
int vf_loader_next(vf_loader *l, vf_batch **out);
/* Starts epoch `epoch` (drops whatever of the current epoch is queued). */
int vf_loader_set_epoch(vf_loader *l, int64_t epoch);

/* ---- resume ------------------------------------------------------------ */

/* The state after the batches delivered so far in the current epoch (a
 * restored loader counts the skipped ones too). A loader with consumer = c
 * among several consumers cannot see its rank's progress (the other
 * consumers' batches go to other processes): VF_EINVAL; compute the state
 * where every consumer's batches arrive, with vf_loader_state_at. */
int vf_loader_get_state(const vf_loader *l, vf_loader_state *out);
/* Continues exactly where the state's callers stopped: epoch
 * state->epoch, the samples after state->samples_consumed. Drops what is
 * queued (like set_epoch). Refused (VF_EINVAL, message naming the
 * difference) when the state does not fit this loader; the loader is then
 * unchanged. */
int vf_loader_set_state(vf_loader *l, const vf_loader_state *state);
/* The state a rank-level loader (consumer -1) with these settings would
 * report after delivering `batches` batches of epoch `epoch`, without
 * opening one (order-free arithmetic). settings->num_consumers is the
 * consumers per rank (DataLoader workers when they are the consumers).
 * When settings->resume is a resolved state of the same epoch with ranges
 * or generations (vf_loader_state_resolve), `batches` counts within what
 * they leave and the result carries them (borrowed from settings->resume). */
int vf_loader_state_at(const vf_dataset *d, const vf_loader_settings *settings, int64_t epoch, int64_t batches,
                       vf_loader_state *out);
/* The state `state` becomes for a loader with these settings over d: the
 * same state when its layout (world_size, consumers, batch_size) matches;
 * else (elastic resume) a state of settings' layout at the start of what
 * remains of the state's epoch (samples_consumed 0, the state's
 * generations plus one for its own layout; at the end of the epoch, with
 * no generations, when nothing remains). Refused like
 * vf_loader_set_state. out->ranges and out->generations are newly
 * allocated (free(); NULL when there are none). Every loader opened from
 * the result replays its generations (integer work, see "Elastic
 * resume"). */
int vf_loader_state_resolve(const vf_dataset *d, const vf_loader_settings *settings, const vf_loader_state *state,
                            vf_loader_state *out);
/* Rank-level batches a state stands for (batches the callers of one rank
 * received this epoch), or VF_EINVAL when samples_consumed does not fall
 * on a batch boundary of its settings. */
int vf_loader_state_batches(const vf_loader_state *state, int64_t *batches);
/* Batches of the current epoch delivered by this loader so far (a
 * restored rank-level loader counts the skipped ones too). */
size_t vf_loader_batches_delivered(const vf_loader *l);

/* Warnings the loader logged (uneven splits over ranks, consumers without
 * samples), each once per loader; i < vf_loader_num_warnings(l). The
 * strings live as long as the loader. vf_loader_warning_is_global is 1 for
 * a warning whose text is the same on every rank (how the epoch splits over
 * the ranks: report it once, from rank 0) and 0 for one about this rank. */
size_t vf_loader_num_warnings(const vf_loader *l);
const char *vf_loader_warning(const vf_loader *l, size_t i);
int vf_loader_warning_is_global(const vf_loader *l, size_t i);

/* Map mode: one batch holding the samples at the given positions
 * (0 <= position < vf_loader_num_positions), in order. VF_ERANGE names an
 * out-of-range position. */
int vf_loader_get_items(vf_loader *l, const int64_t *positions, size_t count, vf_batch **out);

/* ---- batches ------------------------------------------------------------ */

typedef enum vf_column_type {
    VF_COL_FLOAT32 = 0,
    VF_COL_FLOAT64 = 1,
    VF_COL_INT64 = 2,
    VF_COL_INT32 = 3,
    VF_COL_UINT8 = 4,
    VF_COL_BOOL = 5,    /* 1 byte per value */
    VF_COL_STRING = 6,  /* strings[], one per sample */
} vf_column_type;

typedef struct vf_column {
    const char *name;          /* e.g. "observation.state", "action_is_pad", "task" */
    vf_column_type type;
    int ndim;                  /* including the batch dimension */
    int64_t shape[8];          /* shape[0] = samples in the batch */
    void *data;                /* contiguous C-order; NULL for strings */
    size_t nbytes;
    const char *const *strings;/* VF_COL_STRING only */
} vf_column;

size_t vf_batch_size(const vf_batch *b);
size_t vf_batch_num_columns(const vf_batch *b);
const vf_column *vf_batch_column(const vf_batch *b, size_t i);
const vf_column *vf_batch_find(const vf_batch *b, const char *name); /* NULL if absent */
/* Global frame positions of the samples (index column order). */
const int64_t *vf_batch_positions(const vf_batch *b);
vf_batch *vf_batch_ref(vf_batch *b);
void vf_batch_release(vf_batch *b);

/* ---- metrics ------------------------------------------------------------ */

typedef struct vf_loader_stats {
    uint64_t samples, batches;
    uint64_t frames_delivered, frames_decoded;
    uint64_t video_opens;
    uint64_t cache_hits, cache_misses, cache_evictions;
    size_t cache_entries;
    double wait_seconds;       /* time vf_loader_next spent blocked on the queue */
    double first_batch_seconds;
    double p50_sample_ms, p95_sample_ms, p99_sample_ms; /* batch assembly time / samples in it */
    uint64_t skipped;          /* samples skipped under an explicit policy (counted, reported) */
    size_t batch_buffers;      /* batch buffers alive (pooled or held by the caller) */
    size_t window;             /* batches assembled ahead of the caller at most (prefetch + threads,
                                * prefetch bounded by prefetch_bytes) */
    uint64_t samples_assembled;/* samples the engine built (delivered, queued, or dropped by set_epoch) */
    /* Remainder of the current epoch's split (see the remainder rule). */
    int64_t padded_samples;    /* samples of this loader that repeat the start of the epoch (wrap padding) */
    int64_t dropped_samples;   /* samples of the epoch this loader leaves out (drop_last) */
    int empty_consumers;       /* consumers of this loader with nothing to yield */
    size_t warnings;           /* warnings logged (vf_loader_warning) */
    /* Pool mode. */
    size_t pool_segments;      /* segments admitted and not yet evicted (all consumers of the loader) */
    uint64_t pool_admitted, pool_evicted; /* admissions / evictions so far */
    size_t cache_capacity;     /* the decoder cache's entry bound */
    /* Table rows, read lazily per episode (only episodes this loader emits). */
    uint64_t table_reads;      /* reads of the data files (each: a set of episodes, each file opened once) */
    uint64_t table_row_groups; /* (data file, row group) pairs decoded (the needed rows' pages of each) */
    uint64_t table_rows;       /* rows read (episodes read again after eviction count again) */
    uint64_t table_episodes;   /* episodes read */
    uint64_t table_evictions;  /* episodes dropped from the row cache */
    size_t table_cache_bytes;  /* bytes of rows held now */
    uint64_t table_pages_decoded; /* data pages of those row groups decoded */
    uint64_t table_pages_skipped; /* ... and skipped unread (before the rows needed; pages after them are not
                                     even counted) */
    /* Placement and data wait (see "Placement" and "Data wait" above). */
    size_t pinned_cpus;        /* CPUs the engine threads are pinned to; 0: not pinned */
    int engine_threads;        /* engine threads running */
    int decode_threads;        /* threads per decoder, decode_threads = 0 resolved */
    double handout_seconds;    /* wall time from the first batch vf_loader_next handed out to the last */
    double wait_after_first_seconds; /* of wait_seconds, the part spent after the first batch */
    /* The loader's open data files (Parquet footers decoded once, kept in a
     * bounded cache; see docs/scale.md "Open data files"). */
    uint64_t table_files_opened;   /* data file footers decoded (cache misses; once per file when they fit) */
    uint64_t table_file_evictions; /* open data files closed to stay within the bound */
    uint64_t table_file_trims;     /* ... whose kept dictionaries were dropped instead (tried first) */
    size_t table_files_open;       /* data files open now */
    size_t table_files_bytes;      /* their decoded footers, page indexes and dictionaries (estimate) */
    /* The table cache on disk (map mode; see table_disk_cache). */
    uint64_t table_disk_episodes;  /* episodes served from the cache files (not decoded) */
    uint64_t table_disk_builds;    /* data files decoded whole and stored by this loader */
    uint64_t table_disk_files;     /* cache files opened (their entries read and checked) */
    size_t table_disk_bytes;       /* their size on disk */
} vf_loader_stats;

void vf_loader_get_stats(const vf_loader *l, vf_loader_stats *stats);

/* Where one camera's frames are decoded (counted over the readers the
 * loader opened so far). */
typedef struct vf_decode_device_report {
    const char *camera;        /* the camera's key (owned by the dataset) */
    vf_decode_device requested;/* after the environment: AUTO, CPU or CUDA */
    uint64_t files_cpu;        /* decoders opened on the CPU */
    uint64_t files_cuda;       /* decoders opened on NVDEC */
    char reason[320];          /* why (some of) the camera's files decode on the CPU although
                                * AUTO asked for NVDEC (the latest reason); "" when none */
} vf_decode_device_report;

/* The report of camera i (0..vf_dataset_num_cameras - 1); VF_ERANGE
 * otherwise. */
int vf_loader_decode_device(const vf_loader *l, size_t camera, vf_decode_device_report *report);
/* "default", "auto", "cpu", "cuda" (NULL for another value); and back
 * (VF_EINVAL for an unknown name). */
const char *vf_decode_device_name(vf_decode_device device);
int vf_decode_device_parse(const char *name, vf_decode_device *out);

/* A sample left out under VF_ON_ERROR_SKIP, recorded when the batch it was
 * cut from is delivered (so the list depends only on what the caller
 * received). file: the video or data file that failed; column: the output
 * column (a camera's) or NULL for table rows; message: the error. Strings
 * are owned by the loader and valid until it is closed. At most 65,536
 * records are kept; vf_loader_stats.skipped counts them all. */
typedef struct vf_loader_skip {
    int64_t position;          /* global frame position (index column) */
    int64_t episode_index;
    const char *file, *column, *message;
} vf_loader_skip;

size_t vf_loader_num_skips(const vf_loader *l);
const vf_loader_skip *vf_loader_get_skip(const vf_loader *l, size_t i); /* NULL when out of range */

/* ---- partition plan (vlafeed plan) --------------------------------------- */

typedef struct vf_plan_summary {
    vf_partition partition;
    size_t tasks;              /* partitions */
    size_t video_opens;        /* MP4 opens to read every task once (sum over cameras) */
    size_t episodes;
    int64_t frames;
} vf_plan_summary;

/* A partition task, or a consumer's piece of one (a run of its rows). */
typedef struct vf_task_info {
    size_t id;                 /* the partition task (0.., in dataset order) */
    size_t first_episode;      /* the selected episodes it touches (vf_dataset_episode) */
    size_t num_episodes;
    int64_t first_row;         /* positions [first_row, first_row + num_rows): frames of the */
    int64_t num_rows;          /* selection in episode order (vf_loader_get_items positions) */
    int64_t estimated_bytes;   /* decoded size of these rows: uint8 HWC frames of every camera
                                * plus the numeric columns as float32 / int64 */
    int rank, consumer;        /* a consumer's piece: whose; a partition task: -1 */
} vf_task_info;

/* The partition's tasks over the selected episodes (any strategy; the
 * sequential one depends on world_size x num_consumers). Metadata only: no
 * data or video file is opened. *out is newly allocated (free()). */
int vf_plan_tasks(const vf_dataset *d, vf_partition partition, int world_size, int num_consumers, vf_task_info **out,
                  size_t *count);

/* What consumer `consumer` of rank `rank` reads in epoch `epoch` with these
 * loader settings (stream and pool modes; settings' rank and consumer are
 * ignored; -1 for every rank / every consumer, rank-major, in one walk):
 * its pieces of tasks, in the epoch's global order (the shuffle
 * buffer or the pool then reorders samples inside the part), restricted
 * to settings->resume's remaining ranges when it is a resolved state of
 * that epoch. The rows kept only (drop_last tails excluded). Metadata only.
 * *out is newly allocated (free()). */
int vf_plan_consumer_tasks(const vf_dataset *d, const vf_loader_settings *settings, int64_t epoch, int rank,
                           int consumer, vf_task_info **out, size_t *count);

/* MP4 opens of one epoch at the settings' world_size x num_consumers. */
typedef struct vf_plan_opens {
    size_t consumers;          /* world_size x num_consumers */
    size_t distinct_files;     /* video files the selection uses, all cameras */
    size_t task_opens;         /* reading every task once on its own (a task-per-worker executor, e.g.
                                * Ray Data): the sum over tasks and cameras of the files each touches */
    size_t consumer_opens;     /* what the loaders do: the sum over consumers of the files each opens
                                * reading its part in order (pool mode: its episodes in admission
                                * order) through a decoder cache of cache_entries (simulated LRU; one
                                * consumer per loader; any number of engine threads, which share one
                                * reader per file). A run's vf_loader_stats.video_opens */
    size_t cache_entries;      /* the decoder cache capacity simulated */
    size_t lower_bound;        /* no plan can do better: the sum over consumers of the distinct files
                                * their share of the epoch uses */
    int64_t samples;           /* rows the consumers read this epoch */
} vf_plan_opens;

/* Counts the opens of an epoch from the plan alone (stream and pool modes). */
int vf_plan_count_opens(const vf_dataset *d, const vf_loader_settings *settings, int64_t epoch, vf_plan_opens *out);

/* The plan of one strategy over the dataset's selected episodes. */
int vf_plan_summarize(const vf_dataset *d, vf_partition partition, int world_size, int num_consumers,
                      vf_plan_summary *out);

/* The `vlafeed plan --json` document: dataset, episodes, frames, cameras
 * (files each), world_size, workers, consumers, samples_per_rank,
 * padded_samples, samples_per_rank_drop_last, and "strategies":
 * {"sequential"|"episode"|"file_group": {tasks, video_opens, episodes,
 * frames, max_task_frames}}. *out is newly allocated (free()); flags 0 or
 * VF_INFO_PRETTY. */
int vf_plan_json(const vf_dataset *d, int world_size, int num_consumers, int flags, char **out);

/* The `vlafeed plan --json` document for loaders with these settings
 * (stream or pool mode; world_size and num_consumers = workers per rank):
 * vf_plan_json's fields, plus mode, partition, batch_size,
 * samples_per_rank_drop_last and dropped_drop_last (the whole-batch
 * remainder rule), "opens" (vf_plan_count_opens of epoch `epoch`), and
 * with list_tasks 1 the partition's "tasks" (id, episodes [first, count],
 * episode_index [first, last], rows [first, count], estimated_bytes,
 * video_files per camera), with rank >= 0 that consumer's "consumer_tasks"
 * (its pieces, the same fields plus rank and worker), with list_tasks 2
 * and rank -1 every consumer's pieces, rank-major.
 * Metadata only. *out is newly allocated (free()). */
enum { VF_PLAN_NO_FILES = 0x100 }; /* flag: task lists without their video_files */
int vf_plan_report_json(const vf_dataset *d, const vf_loader_settings *settings, int64_t epoch, int list_tasks,
                        int rank, int worker, int flags, char **out);

#ifdef __cplusplus
}
#endif

#endif
