/*
 * plan.h: the plan layer of vlafeed, its whole interface to the engine and
 * the public vf_plan_* functions.
 *
 * Owns: partitions of the selected episodes into tasks (sequential,
 * per-episode, file-group), the per-epoch order of samples (seeded
 * permutations, tasks dealt to consumers), the split over ranks and
 * consumers, the stream shuffle buffer, and batching.
 *
 * Depends on: base (counter-based RNG), dataset (episodes and their files).
 *
 * Invariants:
 *  - Everything here is a pure function of its inputs: the order of an epoch
 *    depends on (seed, epoch, shuffle, partition, rank, world_size,
 *    num_consumers, consumer, batch_size, drop_last, shuffle_buffer,
 *    pool_size, resume_batch) and the dataset's episodes, never on threads
 *    or time.
 *  - Random streams come from vf_rng_derive(seed, purpose, epoch, rank,
 *    consumer). Permutations shared by all ranks (of positions in map mode,
 *    of tasks in stream mode, of episodes in pool mode) use rank = consumer
 *    = 0, so every rank derives the same global order and takes its own
 *    slice of it.
 *
 * Pool mode: the global sequence is the selected episodes in a seeded
 * permutation (shared by every rank), each episode's frames in order. After
 * the rank and consumer split, a consumer's part is a run of episode
 * segments (whole episodes, plus at most a partial one at each end of the
 * part). The consumer's pool holds pool_size segments at a time and emits a
 * uniformly drawn remaining frame of the pool (each remaining frame equally
 * likely); an exhausted segment is evicted and the next segment of the part
 * admitted, segments being admitted in position order, which is file order
 * (pool.c): the share is random, its admission walks its files once. Its random stream is vf_rng_derive(seed, VF_PLAN_RNG_POOL,
 * epoch, rank, consumer).
 *
 * Resume: batch sizes do not depend on the order, so "k batches of a rank
 * delivered" and "s samples of a rank delivered" convert into each other
 * from the counts alone (vf_plan_samples_after / vf_plan_batches_at). A
 * rank-level plan (consumer -1) resumes by starting at batch k. A consumer
 * loader (a DataLoader worker) resuming at k > 0 takes the rank's remaining
 * batches k, k+1, ... dealt round-robin from consumer 0: consumer c serves
 * remaining batches c, c + C, c + 2C, ..., so that a DataLoader restarted
 * over its workers (round-robin from worker 0, skipping exhausted workers)
 * yields exactly the batches the uninterrupted run would have yielded next.
 *
 * Remainder rule (documented in loader.h too): the epoch's global sequence
 * of N samples is cut into world_size equal contiguous slices. Unless
 * drop_last is set, each rank gets ceil(N / world_size) samples and the last
 * slices wrap around to the start of the sequence (the first samples are
 * repeated, as torch's DistributedSampler pads); inside a rank the slice is
 * split over its consumers into contiguous parts whose sizes differ by at
 * most one, without padding, so the union over a rank's consumers is
 * exactly its slice (no duplicates), and each consumer's last batch may be
 * short. With drop_last each rank gets floor(N / world_size) samples, of
 * which it keeps whole batches only: floor(floor(N / world_size) /
 * batch_size) batches, dealt to its consumers as contiguous runs of whole
 * batches (counts differ by at most one batch). So drop_last drops
 * N - world_size * batch_size * floor(floor(N / world_size) / batch_size)
 * samples per epoch: fewer than world_size * (batch_size + 1), whatever
 * the number of consumers.
 *
 * The global sequence is never materialised: map mode's permutation is a
 * keyed bijection of [0, N) evaluated per index (a Feistel network with
 * cycle walking), stream and pool modes keep the task order and its prefix
 * sums (one entry per task). A plan materialises only its own consumers'
 * samples, so its cost is proportional to the rank's share.
 */
#ifndef VF_PLAN_H
#define VF_PLAN_H

#include "base/base.h"
#include "vlafeed/dataset.h"
#include "vlafeed/loader.h"

/* ---- partitions ----------------------------------------------------------- */

/* What partitioning needs to know about the selected episodes. */
typedef struct vf_plan_input {
    size_t num_episodes;
    int64_t *lengths;          /* frames per selected episode (> 0) */
    size_t num_cameras;
    int64_t *video_files;      /* [episode * num_cameras + camera]: the camera file's identity */
    int64_t *data_files;       /* per episode: the data file's identity (groups when there is no camera) */
} vf_plan_input;

/* Fills in from the dataset's selected episodes (arrays newly allocated;
 * vf_plan_input_free). */
int vf_plan_input_from_dataset(const vf_dataset *d, vf_plan_input *in);
void vf_plan_input_free(vf_plan_input *in);

/* A task: a contiguous run of selected episodes and their positions. */
typedef struct vf_plan_task {
    size_t first_episode, num_episodes;
    int64_t first_position, num_samples;
} vf_plan_task;

/* Most primary-camera files one file-group task spans. */
#define VF_PLAN_MAX_FILES_PER_TASK 4

/* Partitions the episodes:
 *  - FILE_GROUP: runs of consecutive episodes stored in the same file of
 *    the primary camera (the camera whose files change most often; the
 *    data file when there is no camera); the other cameras' files may
 *    change inside a task (they roll over at other episodes, since their
 *    bitrates differ), so a task opens one file of the primary camera and
 *    one or two of each other camera, instead of cutting a new task at
 *    every camera's rollover (which fragments the dataset into about as
 *    many tasks as there are files of all cameras together, and opens each
 *    file about once per camera). When there are at least 8 primary files
 *    per consumer, a task spans several primary files (files / (4 x
 *    consumers), at most VF_PLAN_MAX_FILES_PER_TASK), which halves again
 *    the reopening of the other cameras' files at small consumer counts;
 *  - EPISODE: one task per episode;
 *  - SEQUENTIAL: min(consumers, episodes) contiguous runs of episodes with
 *    about equal frame counts (episode e goes to task floor(start(e) *
 *    consumers / total frames)).
 * *tasks is newly allocated (free()). */
int vf_plan_partition(const vf_plan_input *in, vf_partition partition, size_t consumers, vf_plan_task **tasks,
                      size_t *num_tasks);

/* MP4 opens to read every task once: the sum over tasks and cameras of the
 * distinct files the task's episodes use. */
size_t vf_plan_video_opens(const vf_plan_input *in, const vf_plan_task *tasks, size_t num_tasks);

/* "file_group", "episode", "sequential" (or NULL for an unknown value);
 * and back (-1 when unknown). */
const char *vf_plan_partition_name(vf_partition p);
int vf_plan_partition_from_name(const char *name);

/* ---- epoch order ---------------------------------------------------------- */

/* RNG purposes (the first stream id of vf_rng_derive). */
enum {
    VF_PLAN_RNG_POSITIONS = 0x706f73, /* map mode: permutation of positions */
    VF_PLAN_RNG_TASKS = 0x7461736b,   /* stream mode: permutation of tasks */
    VF_PLAN_RNG_BUFFER = 0x627566,    /* stream mode: shuffle buffer, per (rank, consumer) */
    VF_PLAN_RNG_EPISODES = 0x657073,  /* pool mode: permutation of episodes */
    VF_PLAN_RNG_POOL = 0x706f6f6c,    /* pool mode: draws from the pool, per (rank, consumer) */
};

typedef struct vf_plan_epoch_settings {
    uint64_t seed;
    int64_t epoch;
    int shuffle;
    int rank, world_size;      /* 0 <= rank < world_size */
    int num_consumers;         /* consumers per rank, >= 1 */
    int consumer;              /* -1: every consumer of the rank, batches interleaved round-robin */
    size_t batch_size;         /* >= 1 */
    int drop_last;             /* drop short last batches, and the rank remainder (see above) */
    size_t shuffle_buffer;     /* stream: samples in the seeded shuffle buffer, 0 = off */
    size_t pool_size;          /* > 0: pool mode (tasks must be one per episode), segments in the pool */
    int64_t resume_batch;      /* rank-level batches already delivered this epoch (see Resume above) */
    /* Elastic resume: the part of the epoch's global sequence still to
     * deliver, as num_ranges ascending, disjoint [start, end) index ranges
     * of the global sequence (ranges[2i], ranges[2i+1]); NULL / 0: all of
     * it. The rank and consumer split, batching and resume_batch then apply
     * to the sequence restricted to these ranges (in global order). */
    const int64_t *ranges;
    size_t num_ranges;
    /* Map mode: do not store the positions; vf_plan_epoch_batch_positions
     * evaluates a batch's when it is needed (a rank's share at world size 1
     * is every position of the dataset: 1.6 GB and a Feistel evaluation
     * each at 2 x 10^8 frames, paid before the first batch). */
    int lazy_positions;
} vf_plan_epoch_settings;

/* An episode segment of a pool-mode consumer: the frames of one episode in
 * its part, from admission to eviction. */
typedef struct vf_plan_segment {
    size_t episode;            /* selected-episode index (vf_dataset_episode) */
    int consumer;
    int64_t first_position, num_samples; /* positions [first, first + num_samples) */
    int64_t admit_sample;      /* consumer-local emission index of the first draw after admission */
    int64_t evict_sample;      /* ... of the draw that exhausted it (the last kept one when cut short) */
    int64_t admit_batch;       /* this plan's batches: first / last one drawing from the pool while */
    int64_t evict_batch;       /* the segment is in it; both -1 when this plan serves none */
} vf_plan_segment;

/* One epoch of one loader: positions in emitted order, cut into batches. */
typedef struct vf_plan_epoch {
    int64_t *positions;        /* num_samples; NULL with lazy_positions (vf_plan_epoch_batch_positions) */
    int64_t num_samples;
    size_t num_batches;
    int64_t *batch_start;      /* num_batches + 1 offsets into positions */
    int64_t *batch_consumer;   /* num_batches: the consumer each batch belongs to */
    size_t first_batch;        /* where delivery starts (resume_batch for a rank-level plan, else 0) */
    vf_plan_segment *segments; /* pool mode: served segments sorted by admit_batch, else NULL */
    size_t num_segments;
    /* Remainder bookkeeping of this plan's own consumers (all of the rank,
     * or the one consumer). */
    int64_t epoch_samples;     /* N: positions in the epoch's global sequence */
    int64_t rank_samples;      /* samples per rank */
    int64_t padded_samples;    /* samples of this rank that repeat the start of the sequence */
    int64_t dropped_samples;   /* samples dropped by drop_last (the tail on the last rank, short batches) */
    int empty_consumers;       /* consumers with no samples */
    /* lazy_positions (map mode): the restricted-sequence index of each
     * batch's first sample (a batch is a run of consecutive indices), and
     * the order that maps them to positions (owned, with its own copy of
     * the ranges) */
    int64_t *batch_index;
    void *order;
} vf_plan_epoch;

/* Map mode (tasks == NULL): the global sequence is a permutation of
 * 0..num_positions-1 (identity without shuffle). Stream mode: the tasks in
 * a seeded permutation (natural order without shuffle), each task's
 * positions in order. Pool mode (pool_size > 0, one task per episode): the
 * episodes in a seeded permutation. Then the rank split, the consumer
 * split, the shuffle buffer (stream) or the pool (pool), batching, and the
 * resume selection (see above; VF_ERANGE when resume_batch is past the
 * rank's batches). *out is overwritten; free with vf_plan_epoch_free. */
int vf_plan_epoch_build(const vf_plan_epoch_settings *s, int64_t num_positions, const vf_plan_task *tasks,
                        size_t num_tasks, vf_plan_epoch *out);
void vf_plan_epoch_free(vf_plan_epoch *e);
/* The positions of the plan's batch b (batch_start[b + 1] - batch_start[b]
 * of them) into out, stored or (lazy_positions) evaluated. Thread-safe. */
void vf_plan_epoch_batch_positions(const vf_plan_epoch *e, size_t b, int64_t *out);

/* Pool order of one consumer's part (positions in epoch order: runs of
 * episode segments; episodes = one task per selected episode, in position
 * order). out receives the n positions in emitted order; *segments (newly
 * allocated, free()) the part's segments in admission order with
 * consumer, admit_sample and evict_sample set (admit/evict_batch = -1). */
int vf_plan_pool_order(const int64_t *part, int64_t n, const vf_plan_task *episodes, size_t num_episodes,
                       size_t pool_size, vf_rng *rng, int consumer, int64_t *out, vf_plan_segment **segments,
                       size_t *num_segments);

/* Elastic resume: the ranges of the global sequence (see
 * vf_plan_epoch_settings.ranges) that remain undelivered once every rank of
 * a run with settings s (rank, consumer and resume_batch aside) has
 * delivered `batches` rank-level batches. Each old consumer's emitted
 * order is replayed from the settings alone (no decoding, no table reads;
 * O(samples of the epoch) time, memory bounded by one consumer's part plus
 * the delivered ranges), its first delivered samples taken out, and the
 * rest returned in global order. Samples that the old split never
 * delivered (drop_last tails, short batches) remain. *ranges is newly
 * allocated (free(); NULL when nothing remains). */
int vf_plan_remaining(const vf_plan_epoch_settings *s, int64_t num_positions, const vf_plan_task *tasks,
                      size_t num_tasks, int64_t batches, int64_t **ranges, size_t *num_ranges);
/* Samples in ranges (num_positions when there are none). */
int64_t vf_plan_ranges_samples(const int64_t *ranges, size_t num_ranges, int64_t num_positions);
/* Checks ranges against the epoch (ascending, disjoint, non-empty, inside
 * [0, num_positions)); VF_EINVAL naming the first bad range. */
int vf_plan_ranges_check(const int64_t *ranges, size_t num_ranges, int64_t num_positions);

/* A run of consecutive positions of one task in a consumer's part. */
typedef struct vf_plan_piece {
    size_t task;               /* index into the tasks */
    int64_t first_position, num_samples;
} vf_plan_piece;

/* Calls fn for every consumer of every rank (s->rank and s->consumer: -1
 * for all, else that one), in rank-major order, with the consumer's part
 * as pieces in global order (the samples it keeps; its shuffle buffer or
 * pool then reorders them inside the part). Stream and pool modes (tasks
 * given). The order is built once: O(tasks + consumers + pieces) over all
 * consumers, no per-sample work. fn's non-zero result stops the walk and
 * is returned. resume_batch is ignored (a part is the whole epoch's). */
int vf_plan_each_consumer(const vf_plan_epoch_settings *s, int64_t num_positions, const vf_plan_task *tasks,
                          size_t num_tasks,
                          int (*fn)(void *ctx, int rank, int consumer, const vf_plan_piece *pieces, size_t count),
                          void *ctx);

/* Samples of one rank in its first `batches` batches (the rank-level
 * round-robin over its consumers), from the counts alone; -1 when `batches`
 * is past the rank's epoch. */
int64_t vf_plan_samples_after(int64_t n, int world_size, int num_consumers, size_t batch_size, int drop_last,
                              int64_t batches);
/* Rank-level batches of one rank in an epoch of n samples. */
int64_t vf_plan_rank_batches(int64_t n, int world_size, int num_consumers, size_t batch_size, int drop_last);
/* The inverse: how many rank-level batches hold exactly `samples`; -1 when
 * `samples` falls inside a batch or past the epoch. */
int64_t vf_plan_batches_at(int64_t n, int world_size, int num_consumers, size_t batch_size, int drop_last,
                           int64_t samples);

/* The rank's slice of an N-sample sequence: indices [start, start + count)
 * of the sequence extended by wrapping around (index i means i mod N). */
void vf_plan_rank_slice(int64_t n, int rank, int world_size, int drop_last, int64_t *start, int64_t *count);
/* A consumer's contiguous part of a rank's `count` samples. */
void vf_plan_consumer_slice(int64_t count, int consumer, int num_consumers, int64_t *start, int64_t *len);

/* A bounded shuffle buffer over values[0..n) (LeRobot's streaming scheme):
 * the first `buffer` values fill it; each later value replaces a uniformly
 * drawn slot whose value is emitted; at the end the buffer is shuffled and
 * drained. out receives the n values in emitted order (0 or VF_ENOMEM). */
int vf_plan_shuffle_buffer(const int64_t *values, int64_t n, size_t buffer, vf_rng *rng, int64_t *out);

#endif
