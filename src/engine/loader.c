/*
 * loader.c: the public loader (include/vlafeed/loader.h).
 *
 * Runtime: an epoch is planned up front (src/plan: positions in emitted
 * order, cut into batches with sequence numbers 0..B-1). Engine threads
 * (vf_thread_pool) assemble batches into pooled buffers; at most `window` =
 * prefetch_batches + threads batches are submitted beyond the last one the
 * caller took, which bounds memory and decoding ahead (backpressure). A
 * finished batch goes to a bounded vf_queue; vf_loader_next takes batches
 * strictly by sequence number, parking early arrivals in a window-sized
 * stash, so the output order never depends on which thread finished first.
 *
 * Stream and pool loaders start producing at open (fast first batch); map
 * loaders start on the first vf_loader_next (their main use is get_items).
 *
 * Pool mode adds the plan's episode segments: on_admit fires for a segment
 * just before the first batch drawing from it is submitted, on_evict once
 * the caller received the last one (seg_state tracks each segment:
 * 0 pending, 1 admitted, 2 evicted or skipped), and abandoning an epoch
 * evicts whatever is still admitted, so admits and evicts always pair.
 *
 * Resume: a state names the epoch and the rank-level batches delivered
 * (vf_plan_batches_at); the epoch is planned again with that resume batch
 * and production starts there. Nothing before it is assembled or decoded.
 *
 * Threading contract: one loader is driven by one caller thread at a time
 * (next / get_items / set_epoch / stats); batches may be released from any
 * thread. A loader inherited through fork() (e.g. by DataLoader worker
 * processes) cannot be used in the child, whose copy has no engine threads:
 * calls there fail with a message, and closing it there leaks it instead of
 * joining threads that do not exist.
 */
#define _POSIX_C_SOURCE 200809L /* getpid */
#include "engine/engine.h"

#include <unistd.h>

#include <stdlib.h>
#include <string.h>

typedef struct job {
    struct vf_loader *loader;
    size_t seq;
    vf_batch *batch;
    int rc;
    char *message;
    double done_at;            /* when the batch was ready (first-batch latency) */
    vf_loader_skip *skips;     /* on_error = SKIP: the samples left out of this batch (strings owned) */
    size_t num_skips;
} job;

#define MAX_SKIP_RECORDS 65536

struct vf_loader {
    vf_dataset *dataset;
    pid_t pid;                 /* the process that opened it */
    vf_loader_settings settings;
    vf_engine_core *core;
    vf_sample_spec *spec;      /* owned by core */
    vf_video_cache *cache;
    vf_ds_opener opener;       /* the cache's open hook: local files, or URLs through the dataset's fs */
    vf_file_cache *file_cache; /* prefetch-on-admit downloads (pool mode over URLs), or NULL */
    vf_pool_hooks user_hooks;  /* the caller's hooks, run after/before the prefetch ones */
    vf_thread_pool *threads;
    int nthreads;
    vf_sample_counters counters;
    vf_plan_task *tasks;       /* stream mode: partitions; pool mode: one per episode */
    size_t num_tasks;
    uint64_t selection;        /* hash of the selected episodes (resume states) */
    size_t cache_capacity;
    char **warnings;           /* logged once each */
    size_t num_warnings;
    vf_loader_skip *skips;     /* on_error = SKIP: samples left out of delivered batches (<= MAX_SKIP_RECORDS) */
    size_t num_skips;
    uint64_t skipped;          /* all of them, records kept or not */

    /* the current epoch */
    int64_t epoch;
    int64_t *ranges;           /* elastic resume: what of the epoch's global order remains (NULL: all) */
    uint8_t *wanted;           /* [selected episodes]: those this epoch's plan emits (table read-ahead) */
    size_t num_ranges;
    vf_plan_epoch plan;
    int64_t resume_base;       /* rank-level batches skipped by a consumer plan's resume (else 0) */
    size_t start_batch;        /* where delivery of this epoch (re)started */
    int started;
    size_t window;
    size_t next_submit, next_deliver;
    job **stash;               /* [window], by seq % window */
    vf_queue *done;
    atomic_int cancel;
    size_t in_flight;          /* submitted, not yet taken from the queue */

    /* pool segments of the current epoch (plan.segments) */
    uint8_t *seg_state;        /* 0 pending, 1 admitted, 2 evicted / skipped */
    size_t *evict_order;       /* segment indices by evict_batch */
    size_t admit_next, evict_next;
    size_t live_segments;
    uint64_t admitted, evicted;

    /* metrics */
    pthread_mutex_t stats_lock;
    vf_histogram latency;
    double started_at;
    double first_batch_seconds;
    int have_first;
    double wait_seconds;
    uint64_t samples, batches;
};

/* ---- settings ------------------------------------------------------------------ */

void vf_loader_defaults(vf_loader_settings *s)
{
    memset(s, 0, sizeof *s);
    s->mode = VF_MODE_MAP;
    s->batch_size = 32;
    s->shuffle = 1;
    s->rank = 0;
    s->world_size = 1;
    s->num_consumers = 1;
    s->consumer = -1;
    s->decode_threads = 1;
    s->prefetch_batches = 4;
    s->prefetch_bytes = (size_t)1 << 30;
    s->partition = VF_PARTITION_FILE_GROUP;
    s->episode_pool_size = 16;
    s->decoder_cache_entries = 0;
    s->sample.tolerance_s = 1e-4;
    s->sample.image_format = VF_IMAGE_FLOAT32_CHW;
    s->sample.lerobot_shapes = 1;
    s->sample.include_task = 1;
}

static int env_int(const char *name, int fallback, int *out)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        *out = fallback;
        return 0;
    }
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1 << 24)
        return vf_error(VF_EINVAL, "environment variable %s=%s is not a valid integer", name, v);
    *out = (int)x;
    return 0;
}

static int check_settings(vf_loader_settings *s)
{
    if (s->on_error != VF_ON_ERROR_RAISE && s->on_error != VF_ON_ERROR_SKIP)
        return vf_error(VF_EINVAL, "loader: unknown on_error policy %d", (int)s->on_error);
    if ((unsigned)s->mode > VF_MODE_POOL)
        return vf_error(VF_EINVAL, "loader: unknown mode %d", (int)s->mode);
    if (s->mode == VF_MODE_POOL && (s->episode_pool_size < 1 || s->episode_pool_size > (1u << 20)))
        return vf_error(VF_EINVAL, "loader: episode_pool_size %zu must be between 1 and %u", s->episode_pool_size,
                        1u << 20);
    if (!vf_plan_partition_name(s->partition))
        return vf_error(VF_EINVAL, "loader: unknown partition %d", (int)s->partition);
    if (s->batch_size < 1 || s->batch_size > (1u << 24))
        return vf_error(VF_EINVAL, "loader: batch_size %zu must be between 1 and %u", s->batch_size, 1u << 24);
    int r;
    if (s->rank == -1 && (r = env_int("RANK", 0, &s->rank)) < 0)
        return r;
    if (s->world_size == -1 && (r = env_int("WORLD_SIZE", 1, &s->world_size)) < 0)
        return r;
    if (s->world_size < 1 || s->rank < 0 || s->rank >= s->world_size)
        return vf_error(VF_EINVAL, "loader: rank %d must be in [0, world_size %d)", s->rank, s->world_size);
    if (s->num_consumers < 1 || s->num_consumers > 1 << 16)
        return vf_error(VF_EINVAL, "loader: num_consumers %d must be between 1 and 65536", s->num_consumers);
    if (s->consumer < -1 || s->consumer >= s->num_consumers)
        return vf_error(VF_EINVAL, "loader: consumer %d must be -1 or in [0, num_consumers %d)", s->consumer,
                        s->num_consumers);
    if (s->threads < 0 || s->threads > 1024)
        return vf_error(VF_EINVAL, "loader: threads %d must be between 0 (all cores) and 1024", s->threads);
    if (s->decode_threads < 0 || s->decode_threads > 256)
        return vf_error(VF_EINVAL, "loader: decode_threads %d must be between 0 and 256", s->decode_threads);
    if (s->prefetch_batches > 4096)
        return vf_error(VF_EINVAL, "loader: prefetch %zu is too large (at most 4096)", s->prefetch_batches);
    if (s->prefetch_batches == 0)
        s->prefetch_batches = 1;
    if (s->decoder_cache_entries > (1u << 20))
        return vf_error(VF_EINVAL, "loader: decoder_cache_entries %zu is too large (at most %u)",
                        s->decoder_cache_entries, 1u << 20);
    return 0;
}

/* ---- production ------------------------------------------------------------------- */

static void free_skip(vf_loader_skip *k)
{
    free((char *)k->file);
    free((char *)k->column);
    free((char *)k->message);
}

/* on_error = SKIP, after the batch failed as a whole: assembles its samples
 * one at a time, keeping those that succeed (compacted to the front, in
 * order) and recording the others in the job. Fails only on out of memory. */
static int assemble_skipping(vf_loader *l, job *j, size_t n, vf_sample_dest *dest)
{
    int64_t *pos = j->batch->positions;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t p = pos[i];
        vf_sample_failure fail;
        dest->first = kept;
        int r = vf_sample_assemble_ex(l->spec, l->cache, &l->counters, &p, 1, dest, NULL, &fail);
        if (r == 0) {
            pos[kept++] = p;
            continue;
        }
        if (r == VF_ENOMEM) {
            free(fail.file);
            free(fail.column);
            return r;
        }
        vf_loader_skip *grown = realloc(j->skips, (j->num_skips + 1) * sizeof *grown);
        char *message = vf_strdup(vf_last_error());
        if (!grown || !message) {
            if (grown)
                j->skips = grown;
            free(message);
            free(fail.file);
            free(fail.column);
            return vf_error(VF_ENOMEM, "out of memory recording a skipped sample");
        }
        j->skips = grown;
        size_t ep = vf_sample_episode_of(l->spec, p);
        j->skips[j->num_skips++] = (vf_loader_skip){p, vf_dataset_episode(l->dataset, ep)->episode_index, fail.file,
                                                    fail.column, message};
    }
    dest->first = 0;
    vf_engine_batch_shrink(j->batch, kept);
    return 0;
}

static void produce(void *arg)
{
    job *j = arg;
    vf_loader *l = j->loader;
    if (atomic_load(&l->cancel)) {
        j->rc = VF_EOF;
    } else {
        size_t lo = (size_t)l->plan.batch_start[j->seq], hi = (size_t)l->plan.batch_start[j->seq + 1];
        size_t n = hi - lo;
        double t0 = vf_now_seconds();
        int r = vf_engine_batch_acquire(l->core, n, &j->batch);
        if (r == 0) {
            memcpy(j->batch->positions, l->plan.positions + lo, n * sizeof(int64_t));
            vf_sample_dest dest;
            vf_engine_batch_dest(j->batch, &dest);
            r = vf_sample_assemble(l->spec, l->cache, &l->counters, j->batch->positions, n, &dest, NULL);
            if (r < 0 && r != VF_ENOMEM && l->settings.on_error == VF_ON_ERROR_SKIP)
                r = assemble_skipping(l, j, n, &dest);
        }
        if (r < 0) {
            j->message = vf_strdup(vf_last_error());
            vf_batch_release(j->batch);
            j->batch = NULL;
        } else {
            double per_sample = (vf_now_seconds() - t0) / (double)(n ? n : 1);
            pthread_mutex_lock(&l->stats_lock);
            for (size_t i = 0; i < n; i++)
                vf_histogram_add(&l->latency, per_sample);
            pthread_mutex_unlock(&l->stats_lock);
        }
        j->rc = r;
    }
    j->done_at = vf_now_seconds();
    /* Never blocks: the queue holds window + 1 and at most window jobs are out. */
    if (vf_queue_push(l->done, j) < 0) {
        vf_batch_release(j->batch);
        free(j->message);
        for (size_t i = 0; i < j->num_skips; i++)
            free_skip(&j->skips[i]);
        free(j->skips);
        free(j);
    }
}

static void free_job(job *j)
{
    if (!j)
        return;
    vf_batch_release(j->batch);
    free(j->message);
    for (size_t i = 0; i < j->num_skips; i++)
        free_skip(&j->skips[i]);
    free(j->skips);
    free(j);
}

/* ---- pool segments ------------------------------------------------------------------- */

static void pool_event(const vf_loader *l, const vf_plan_segment *g, vf_pool_event *ev)
{
    ev->episode = g->episode;
    ev->episode_index = vf_dataset_episode(l->dataset, g->episode)->episode_index;
    ev->first_frame = g->first_position - l->spec->episode_start[g->episode];
    ev->num_frames = g->num_samples;
    ev->rank = l->settings.rank;
    ev->consumer = g->consumer;
    ev->epoch = l->epoch;
}

/* Prefetch-on-admit: wraps the caller's pool hooks. Admission takes one
 * file-cache reference per remote video file of the episode and starts the
 * downloads without waiting; eviction drops them. A failed prefetch only
 * logs: decoding then reads the file with range requests. */
static void prefetch_admit(void *ctx, const vf_pool_event *event)
{
    vf_loader *l = ctx;
    if (vf_prefetch_on_admit(l->file_cache, l->dataset, event->episode) < 0)
        vf_log(VF_LOG_WARN, "prefetch: %s", vf_last_error());
    if (l->user_hooks.on_admit)
        l->user_hooks.on_admit(l->user_hooks.ctx, event);
}

static void prefetch_evict(void *ctx, const vf_pool_event *event)
{
    vf_loader *l = ctx;
    if (l->user_hooks.on_evict)
        l->user_hooks.on_evict(l->user_hooks.ctx, event);
    vf_prefetch_on_evict(l->file_cache, l->dataset, event->episode);
}

static void admit_segment(vf_loader *l, size_t i)
{
    l->seg_state[i] = 1;
    l->live_segments++;
    l->admitted++;
    const vf_pool_hooks *h = &l->settings.pool_hooks;
    if (h->on_admit) {
        vf_pool_event ev;
        pool_event(l, &l->plan.segments[i], &ev);
        h->on_admit(h->ctx, &ev);
    }
}

static void evict_segment(vf_loader *l, size_t i)
{
    l->seg_state[i] = 2;
    l->live_segments--;
    l->evicted++;
    const vf_pool_hooks *h = &l->settings.pool_hooks;
    if (h->on_evict) {
        vf_pool_event ev;
        pool_event(l, &l->plan.segments[i], &ev);
        h->on_evict(h->ctx, &ev);
    }
}

/* Admits the segments drawn from by batches up to `batch` (segments whose
 * last batch came before the start of this run are skipped). */
static void admit_until(vf_loader *l, size_t batch)
{
    while (l->admit_next < l->plan.num_segments &&
           (size_t)l->plan.segments[l->admit_next].admit_batch <= batch) {
        size_t i = l->admit_next++;
        if (l->seg_state[i] == 0 && (size_t)l->plan.segments[i].evict_batch >= l->start_batch)
            admit_segment(l, i);
        else if (l->seg_state[i] == 0)
            l->seg_state[i] = 2;
    }
}

/* Evicts the admitted segments whose last batch is at most `batch`. */
static void evict_until(vf_loader *l, size_t batch)
{
    while (l->evict_next < l->plan.num_segments &&
           (size_t)l->plan.segments[l->evict_order[l->evict_next]].evict_batch <= batch) {
        size_t i = l->evict_order[l->evict_next++];
        if (l->seg_state[i] == 1)
            evict_segment(l, i);
    }
}

/* Evicts everything still admitted (the epoch is abandoned or over). */
static void evict_all(vf_loader *l)
{
    for (size_t k = 0; l->seg_state && k < l->plan.num_segments; k++) {
        size_t i = l->evict_order[k];
        if (l->seg_state[i] == 1)
            evict_segment(l, i);
    }
    l->evict_next = l->plan.num_segments;
}

typedef struct evict_key {
    int64_t batch;
    size_t segment;
} evict_key;

static int cmp_evict(const void *pa, const void *pb)
{
    const evict_key *a = pa, *b = pb;
    if (a->batch != b->batch)
        return a->batch < b->batch ? -1 : 1;
    return a->segment < b->segment ? -1 : a->segment > b->segment;
}

/* Fresh bookkeeping for the plan's segments. */
static int reset_segments(vf_loader *l)
{
    free(l->seg_state);
    free(l->evict_order);
    l->seg_state = NULL;
    l->evict_order = NULL;
    l->admit_next = l->evict_next = 0;
    l->live_segments = 0;
    size_t n = l->plan.num_segments;
    if (l->settings.mode != VF_MODE_POOL)
        return 0;
    l->seg_state = vf_calloc(n ? n : 1, 1);
    l->evict_order = vf_malloc_array(n ? n : 1, sizeof *l->evict_order);
    evict_key *keys = vf_malloc_array(n ? n : 1, sizeof *keys);
    if (!l->seg_state || !l->evict_order || !keys) {
        free(keys);
        free(l->seg_state);
        free(l->evict_order);
        l->seg_state = NULL;
        l->evict_order = NULL;
        return VF_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        keys[i] = (evict_key){l->plan.segments[i].evict_batch, i};
    qsort(keys, n, sizeof *keys, cmp_evict);
    for (size_t i = 0; i < n; i++)
        l->evict_order[i] = keys[i].segment;
    free(keys);
    return 0;
}

static int submit_more(vf_loader *l)
{
    while (l->next_submit < l->plan.num_batches && l->next_submit < l->next_deliver + l->window) {
        if (l->seg_state)
            admit_until(l, l->next_submit);
        job *j = vf_calloc(1, sizeof *j);
        if (!j)
            return VF_ENOMEM;
        j->loader = l;
        j->seq = l->next_submit;
        int r = vf_thread_pool_submit(l->threads, produce, j);
        if (r < 0) {
            free(j);
            return r;
        }
        l->next_submit++;
        l->in_flight++;
    }
    return 0;
}

/* Waits for every submitted job and drops what they produced. */
static void drain(vf_loader *l)
{
    atomic_store(&l->cancel, 1);
    vf_thread_pool_wait(l->threads);
    void *item;
    while (vf_queue_try_pop(l->done, &item) == 0)
        free_job(item);
    for (size_t i = 0; i < l->window; i++) {
        free_job(l->stash[i]);
        l->stash[i] = NULL;
    }
    l->in_flight = 0;
    atomic_store(&l->cancel, 0);
}

/* Logs a warning once per loader and keeps it for vf_loader_warning. */
static void warn_once(vf_loader *l, char *message)
{
    if (!message)
        return;
    for (size_t i = 0; i < l->num_warnings; i++)
        if (strcmp(l->warnings[i], message) == 0) {
            free(message);
            return;
        }
    char **grown = realloc(l->warnings, (l->num_warnings + 1) * sizeof *grown);
    if (!grown) {
        free(message);
        return;
    }
    l->warnings = grown;
    l->warnings[l->num_warnings++] = message;
    vf_log(VF_LOG_WARN, "%s", message);
}

static void remainder_warnings(vf_loader *l)
{
    const vf_loader_settings *s = &l->settings;
    const vf_plan_epoch *p = &l->plan;
    int64_t n = p->epoch_samples, per = p->rank_samples, w = s->world_size, bs = (int64_t)s->batch_size;
    int64_t kept = per / bs * bs;
    if (s->drop_last && n - kept * w > 0) {
        warn_once(l, vf_asprintf("loader: drop_last drops %lld of the %lld samples of an epoch: every rank keeps "
                                 "%lld whole batches of %lld (%lld of its %lld samples), over %d rank%s",
                                 (long long)(n - kept * w), (long long)n, (long long)(kept / bs), (long long)bs,
                                 (long long)kept, (long long)per, s->world_size, s->world_size == 1 ? "" : "s"));
    } else if (w > 1 && n % w != 0 && !s->drop_last) {
        warn_once(l, vf_asprintf("loader: world_size %d does not divide the %lld samples of an epoch: every rank "
                                 "gets %lld, and %lld samples are repeated to even the ranks out (the last "
                                 "rank's slice wraps around to the start of the epoch's order)",
                                 s->world_size, (long long)n, (long long)per, (long long)(per * w - n)));
    }
    if (p->empty_consumers > 0)
        warn_once(l, vf_asprintf("loader: %d consumer%s of rank %d get%s no samples (%lld samples per rank over %d "
                                 "consumers%s)%s",
                                 p->empty_consumers, p->empty_consumers == 1 ? "" : "s", s->rank,
                                 p->empty_consumers == 1 ? "s" : "", (long long)per, s->num_consumers,
                                 s->drop_last ? ", drop_last" : "",
                                 s->mode == VF_MODE_POOL ? ": no episodes to pool" : ""));
}

/* The episodes this loader's plan emits (from batch first_batch on): the
 * table's read-ahead stays inside them, and rows of other episodes are
 * never read. Rows cached for the previous epoch are dropped when unused. */
static void mark_wanted(vf_loader *l)
{
    vf_sample_spec *sp = l->spec;
    pthread_mutex_lock(&sp->rows_lock);
    memset(l->wanted, 0, sp->num_episodes);
    const vf_plan_epoch *p = &l->plan;
    int64_t from = p->num_batches ? p->batch_start[p->first_batch] : 0;
    size_t last = (size_t)-1;
    for (int64_t i = from; i < p->num_samples; i++) {
        int64_t pos = p->positions[i];
        if (last != (size_t)-1 && pos >= sp->episode_start[last] && pos < sp->episode_start[last + 1])
            continue;
        last = vf_sample_episode_of(sp, pos);
        l->wanted[last] = 1;
    }
    /* Map mode draws random positions: reading ahead along a data file
     * would read rows the next batches do not need. */
    sp->wanted = l->settings.mode == VF_MODE_MAP ? NULL : l->wanted;
    pthread_mutex_unlock(&sp->rows_lock);
}

/* Plans the current epoch from rank-level batch resume_batch and resets
 * delivery there. */
static int plan_epoch(vf_loader *l, int64_t resume_batch)
{
    vf_plan_epoch_free(&l->plan);
    const vf_loader_settings *s = &l->settings;
    vf_plan_epoch_settings ps = {
        .seed = s->seed,
        .epoch = l->epoch,
        .shuffle = s->shuffle,
        .rank = s->rank,
        .world_size = s->world_size,
        .num_consumers = s->num_consumers,
        .consumer = s->consumer,
        .batch_size = s->batch_size,
        .drop_last = s->drop_last,
        .shuffle_buffer = s->mode == VF_MODE_STREAM ? s->shuffle_buffer : 0,
        .pool_size = s->mode == VF_MODE_POOL ? s->episode_pool_size : 0,
        .resume_batch = resume_batch,
        .ranges = l->ranges,
        .num_ranges = l->num_ranges,
    };
    int r = vf_plan_epoch_build(&ps, l->spec->num_positions, s->mode == VF_MODE_MAP ? NULL : l->tasks, l->num_tasks,
                                &l->plan);
    if (r == 0)
        r = reset_segments(l);
    if (r == 0)
        mark_wanted(l);
    if (r < 0)
        return r;
    l->resume_base = s->consumer >= 0 ? resume_batch : 0;
    l->next_submit = l->next_deliver = l->start_batch = l->plan.first_batch;
    remainder_warnings(l);
    return 0;
}

static int start(vf_loader *l)
{
    l->started = 1;
    l->started_at = vf_now_seconds();
    l->have_first = 0;
    return submit_more(l);
}

/* Batches queued ahead of the caller: prefetch_batches, fewer (at least 1)
 * when they would hold more than prefetch_bytes. Each batch buffer is
 * written once per batch and its first use touches fresh memory: with
 * 3 x 640x480 float32 cameras, 4 prefetched batches of 64 samples are
 * 2.7 GB, and faulting in the 5-7 buffers in flight cost ~25% of the CPU
 * of a 40-batch run, with no gain in throughput over 1 (bench/README.md). */
static size_t prefetch_count(const vf_loader_settings *s, const vf_sample_spec *spec)
{
    if (!s->prefetch_bytes || !spec)
        return s->prefetch_batches;
    double per_sample = 0;
    for (size_t i = 0; i < spec->num_columns; i++)
        per_sample += spec->columns[i].type == VF_COL_STRING ? (double)sizeof(char *)
                                                              : (double)spec->columns[i].sample_bytes;
    double fit = (double)s->prefetch_bytes / (per_sample * (double)s->batch_size + 1.0);
    if (fit < 1)
        return 1;
    return fit < (double)s->prefetch_batches ? (size_t)fit : s->prefetch_batches;
}

/* ---- sizes and states --------------------------------------------------------------------- */

/* The decoder cache bound: the user's, or 32; in pool mode the pool's
 * working set, at most 128: segments x cameras x consumers of this loader
 * x engine threads (every thread assembles batches drawing from the whole
 * pool and checks out its own reader of each file: with one reader per
 * file, 2 threads reopened files ~5x as often, measured). In map mode a
 * batch of random positions touches every video file of the selection and
 * each engine thread checks out its own reader per file, so the working
 * set is files x threads (at least 32, at most 128): with 30 files and 2
 * threads a 32-entry cache hit 29-90% of lookups (reopening a file each
 * miss), 60 entries 97% (bench/README.md). */
static size_t cache_entries(const vf_loader_settings *s, size_t cameras, size_t files, int threads)
{
    if (s->decoder_cache_entries > 0)
        return s->decoder_cache_entries;
    if (s->mode == VF_MODE_MAP) {
        size_t n = VF_MIN(files, (size_t)128) * (size_t)(threads > 0 ? VF_MIN(threads, 128) : 1);
        return VF_MIN(VF_MAX(n, (size_t)32), (size_t)128);
    }
    if (s->mode != VF_MODE_POOL)
        return 32;
    size_t cams = cameras ? cameras : 1;
    size_t local = s->consumer < 0 ? (size_t)s->num_consumers : 1;
    size_t n = VF_MIN(s->episode_pool_size, (size_t)128) * VF_MIN(cams, (size_t)128);
    n = VF_MIN(n, (size_t)128) * VF_MIN(local, (size_t)128);
    n = VF_MIN(n, (size_t)128) * (size_t)(threads > 0 ? VF_MIN(threads, 128) : 1);
    return VF_MIN(n, (size_t)128);
}

static uint64_t hash_u64(uint64_t h, uint64_t v) { return vf_mix64(h ^ (v + 0x9E3779B97F4A7C15ull)); }

static uint64_t selection_hash(const vf_dataset *d)
{
    uint64_t h = 0x73656c656374ull;
    for (size_t i = 0; i < vf_dataset_num_episodes(d); i++) {
        const vf_episode *e = vf_dataset_episode(d, i);
        h = hash_u64(h, (uint64_t)e->episode_index);
        h = hash_u64(h, (uint64_t)e->length);
    }
    return h;
}

static uint64_t state_hash(const vf_loader_state *st)
{
    uint64_t h = 0x7666737461746531ull;
    const uint64_t fields[] = {st->version,
                               st->mode,
                               st->fingerprint,
                               st->selection,
                               (uint64_t)st->positions,
                               st->seed,
                               (uint64_t)st->batch_size,
                               (uint64_t)(int64_t)st->world_size,
                               (uint64_t)(int64_t)st->consumers,
                               (uint64_t)(int64_t)st->shuffle,
                               (uint64_t)(int64_t)st->drop_last,
                               (uint64_t)(int64_t)st->partition,
                               (uint64_t)st->shuffle_buffer,
                               (uint64_t)st->episode_pool_size};
    for (size_t i = 0; i < VF_ARRAY_LEN(fields); i++)
        h = hash_u64(h, fields[i]);
    if (st->num_ranges > 0 && st->ranges) {
        h = hash_u64(h, (uint64_t)st->num_ranges);
        for (size_t i = 0; i < 2 * st->num_ranges; i++)
            h = hash_u64(h, (uint64_t)st->ranges[i]);
    }
    return h;
}

/* The order-defining fields of a state for these (checked) settings; epoch
 * and samples_consumed are 0. Settings that do not affect the order of the
 * mode are recorded as 0. */
static void state_from_settings(const vf_loader_settings *s, const vf_dataset *d, int64_t positions,
                                uint64_t selection, vf_loader_state *st)
{
    memset(st, 0, sizeof *st);
    st->version = VF_LOADER_STATE_VERSION;
    st->mode = (uint32_t)s->mode;
    st->fingerprint = vf_dataset_fingerprint(d);
    st->selection = selection;
    st->positions = positions;
    st->seed = s->seed;
    st->batch_size = (int64_t)s->batch_size;
    st->world_size = s->world_size;
    st->consumers = s->num_consumers;
    st->shuffle = s->shuffle != 0;
    st->drop_last = s->drop_last != 0;
    st->partition = s->mode == VF_MODE_STREAM ? (int32_t)s->partition : 0;
    st->shuffle_buffer = s->mode == VF_MODE_STREAM && s->shuffle_buffer > 1 ? (int64_t)s->shuffle_buffer : 0;
    st->episode_pool_size = s->mode == VF_MODE_POOL ? (int64_t)s->episode_pool_size : 0;
    st->settings_hash = state_hash(st);
}

static const char *mode_name(uint32_t m)
{
    return m == VF_MODE_MAP ? "map" : m == VF_MODE_STREAM ? "stream" : m == VF_MODE_POOL ? "pool" : "unknown";
}

static int64_t total_positions(const vf_dataset *d)
{
    int64_t n = 0;
    for (size_t i = 0; i < vf_dataset_num_episodes(d); i++)
        n += vf_dataset_episode(d, i)->length;
    return n;
}

int vf_loader_state_batches(const vf_loader_state *st, int64_t *batches)
{
    *batches = 0;
    if (st->world_size < 1 || st->consumers < 1 || st->batch_size < 1 || st->positions < 0)
        return vf_error(VF_EINVAL, "loader state: world_size %d, consumers %d, batch_size %lld, positions %lld: "
                                   "not a valid state",
                        (int)st->world_size, (int)st->consumers, (long long)st->batch_size,
                        (long long)st->positions);
    if (st->samples_consumed < 0)
        return vf_error(VF_EINVAL, "loader state: samples_consumed %lld is negative", (long long)st->samples_consumed);
    if (st->samples_consumed % st->world_size != 0)
        return vf_error(VF_EINVAL, "loader state: samples_consumed %lld is not a multiple of world_size %d (every "
                                   "rank delivers the same batches)",
                        (long long)st->samples_consumed, (int)st->world_size);
    if (st->num_ranges > 0 && (!st->ranges || vf_plan_ranges_check(st->ranges, st->num_ranges, st->positions) < 0))
        return vf_error(VF_EINVAL, "loader state: %s", st->ranges ? vf_last_error() : "ranges missing");
    int64_t n = vf_plan_ranges_samples(st->ranges, st->num_ranges, st->positions);
    int64_t per_rank = st->samples_consumed / st->world_size;
    int64_t k = vf_plan_batches_at(n, st->world_size, st->consumers, (size_t)st->batch_size, st->drop_last, per_rank);
    if (k < 0) {
        int64_t start, count;
        vf_plan_rank_slice(n, 0, st->world_size, st->drop_last, &start, &count);
        return vf_error(VF_EINVAL, "loader state: samples_consumed %lld (%lld per rank) is not the end of a batch "
                                   "of epoch %lld (batch_size %lld, %d consumers per rank, %lld samples per rank)",
                        (long long)st->samples_consumed, (long long)per_rank, (long long)st->epoch,
                        (long long)st->batch_size, (int)st->consumers, (long long)count);
    }
    *batches = k;
    return 0;
}

/* The tasks of a mode and partition (NULL for map mode), as a loader with
 * `consumers` consumers over all ranks cuts them. */
static int make_tasks(const vf_dataset *d, vf_mode mode, vf_partition partition, size_t consumers,
                      vf_plan_task **tasks, size_t *num_tasks)
{
    *tasks = NULL;
    *num_tasks = 0;
    if (mode == VF_MODE_MAP)
        return 0;
    vf_plan_input in;
    int r = vf_plan_input_from_dataset(d, &in);
    if (r == 0) {
        r = vf_plan_partition(&in, mode == VF_MODE_POOL ? VF_PARTITION_EPISODE : partition, consumers, tasks,
                              num_tasks);
        vf_plan_input_free(&in);
    }
    return r;
}

/* Resolves a state for a loader with settings s (checked) over d: every
 * order difference is named; a state from another world size, consumer
 * count or batch size is converted (elastic resume) into the remaining
 * ranges of its epoch. On success *ranges (newly allocated, NULL for the
 * whole epoch) and *batches (rank-level batches already delivered within
 * them, in s's layout) say where to continue. tasks: s's own partition
 * (NULL in map mode). */
static int resolve_state(const vf_loader_settings *s, const vf_dataset *d, int64_t positions, uint64_t selection,
                         const vf_plan_task *tasks, size_t num_tasks, const vf_loader_state *st, int64_t **ranges,
                         size_t *num_ranges, int64_t *batches)
{
    *ranges = NULL;
    *num_ranges = 0;
    *batches = 0;
    if (st->version != VF_LOADER_STATE_VERSION && st->version != 1)
        return vf_error(VF_EINVAL, "loader state: version %u is not supported (this vlafeed reads versions 1 and %d)",
                        (unsigned)st->version, VF_LOADER_STATE_VERSION);
    if (st->version == 1 && st->num_ranges > 0)
        return vf_error(VF_EINVAL, "loader state: a version 1 state has no ranges");
    if (st->settings_hash != state_hash(st))
        return vf_error(VF_EINVAL, "loader state: settings_hash does not match the state's fields (the state was "
                                   "edited or corrupted)");
    if (st->epoch < 0)
        return vf_error(VF_EINVAL, "loader state: epoch %lld is negative", (long long)st->epoch);
    vf_loader_state mine;
    state_from_settings(s, d, positions, selection, &mine);
    vf_buf msg = {0};
    int n = 0;
#define DIFF(cond, ...)                                                                                              \
    do {                                                                                                             \
        if (cond) {                                                                                                  \
            if (n++)                                                                                                 \
                vf_buf_append(&msg, "; ", 2);                                                                        \
            vf_buf_printf(&msg, __VA_ARGS__);                                                                        \
        }                                                                                                            \
    } while (0)
    DIFF(st->fingerprint != mine.fingerprint,
         "another dataset (the state's fingerprint is %016llx, this dataset %s has %016llx)",
         (unsigned long long)st->fingerprint, vf_dataset_root(d), (unsigned long long)mine.fingerprint);
    DIFF(st->fingerprint == mine.fingerprint && (st->selection != mine.selection || st->positions != mine.positions),
         "another episode selection (the state's has %lld frames, this loader's %lld%s)", (long long)st->positions,
         (long long)mine.positions, st->positions == mine.positions ? ", other episodes" : "");
    DIFF(st->mode != mine.mode, "mode (state '%s', loader '%s')", mode_name(st->mode), mode_name(mine.mode));
    DIFF(st->seed != mine.seed, "seed (state %llu, loader %llu)", (unsigned long long)st->seed,
         (unsigned long long)mine.seed);
    DIFF(st->shuffle != mine.shuffle, "shuffle (state %d, loader %d)", (int)st->shuffle, (int)mine.shuffle);
    DIFF(st->drop_last != mine.drop_last, "drop_last (state %d, loader %d)", (int)st->drop_last,
         (int)mine.drop_last);
    DIFF(st->mode == mine.mode && st->partition != mine.partition, "partition (state %d, loader %d)",
         (int)st->partition, (int)mine.partition);
    DIFF(st->mode == mine.mode && st->shuffle_buffer != mine.shuffle_buffer, "shuffle_buffer (state %lld, loader %lld)",
         (long long)st->shuffle_buffer, (long long)mine.shuffle_buffer);
    DIFF(st->mode == mine.mode && st->episode_pool_size != mine.episode_pool_size,
         "episode_pool_size (state %lld, loader %lld)", (long long)st->episode_pool_size,
         (long long)mine.episode_pool_size);
#undef DIFF
    int r = 0;
    if (n > 0)
        r = vf_error(VF_EINVAL, "loader state does not fit this loader: %s", msg.data ? (char *)msg.data : "");
    vf_buf_free(&msg);
    int64_t k = 0;
    if (r == 0)
        r = vf_loader_state_batches(st, &k);
    if (r < 0)
        return r;
    size_t nr = st->num_ranges;
    if (st->world_size == mine.world_size && st->consumers == mine.consumers && st->batch_size == mine.batch_size) {
        if (nr > 0) {
            if (!(*ranges = vf_malloc_array(2 * nr, sizeof **ranges)))
                return VF_ENOMEM;
            memcpy(*ranges, st->ranges, 2 * nr * sizeof **ranges);
            *num_ranges = nr;
        }
        *batches = k;
        return 0;
    }
    /* Elastic: replay the state's layout, keep what it had not delivered. */
    vf_plan_task *old_tasks = NULL;
    size_t num_old = 0;
    const vf_plan_task *use = tasks;
    size_t use_n = num_tasks;
    if (s->mode == VF_MODE_STREAM && s->partition == VF_PARTITION_SEQUENTIAL) {
        /* Sequential tasks depend on the consumer count. */
        r = make_tasks(d, s->mode, s->partition, (size_t)st->world_size * (size_t)st->consumers, &old_tasks,
                       &num_old);
        use = old_tasks;
        use_n = num_old;
    }
    vf_plan_epoch_settings old = {
        .seed = st->seed,
        .epoch = st->epoch,
        .shuffle = st->shuffle,
        .world_size = st->world_size,
        .num_consumers = st->consumers,
        .consumer = -1,
        .batch_size = (size_t)st->batch_size,
        .drop_last = st->drop_last,
        .shuffle_buffer = (size_t)st->shuffle_buffer,
        .pool_size = (size_t)st->episode_pool_size,
        .ranges = nr ? st->ranges : NULL,
        .num_ranges = nr,
    };
    if (r == 0)
        r = vf_plan_remaining(&old, positions, use, use_n, k, ranges, num_ranges);
    free(old_tasks);
    if (r < 0)
        return vf_error(r, "loader state: elastic resume from world_size %d x %d consumers: %s", (int)st->world_size,
                        (int)st->consumers, vf_last_error());
    int64_t before = vf_plan_ranges_samples(st->ranges, nr, positions);
    int64_t after = *num_ranges ? vf_plan_ranges_samples(*ranges, *num_ranges, positions) : 0;
    if (*num_ranges == 0) /* everything was delivered: continue at the end of the epoch */
        *batches = vf_plan_rank_batches(positions, s->world_size, s->num_consumers, s->batch_size, s->drop_last);
    vf_log(VF_LOG_INFO,
           "loader: elastic resume of epoch %lld: %lld of %lld samples delivered at world_size %d x %d consumers "
           "(batch %lld); %lld remain in %zu ranges for world_size %d x %d consumers",
           (long long)st->epoch, (long long)(before - after), (long long)before, (int)st->world_size,
           (int)st->consumers, (long long)st->batch_size, (long long)after, *num_ranges, s->world_size,
           s->num_consumers);
    return 0;
}

int vf_loader_state_resolve(const vf_dataset *d, const vf_loader_settings *settings, const vf_loader_state *state,
                            vf_loader_state *out)
{
    memset(out, 0, sizeof *out);
    vf_loader_settings s = *settings;
    s.resume = NULL;
    int r = check_settings(&s);
    if (r < 0)
        return r;
    vf_plan_task *tasks = NULL;
    size_t nt = 0;
    if ((r = make_tasks(d, s.mode, s.partition, (size_t)s.world_size * (size_t)s.num_consumers, &tasks, &nt)) < 0)
        return r;
    int64_t n = total_positions(d);
    uint64_t sel = selection_hash(d);
    int64_t *ranges = NULL, batches = 0;
    size_t nr = 0;
    r = resolve_state(&s, d, n, sel, tasks, nt, state, &ranges, &nr, &batches);
    free(tasks);
    if (r < 0)
        return r;
    state_from_settings(&s, d, n, sel, out);
    out->epoch = state->epoch;
    out->num_ranges = nr;
    out->ranges = ranges;
    out->settings_hash = state_hash(out);
    int64_t rn = vf_plan_ranges_samples(ranges, nr, n);
    int64_t per_rank = vf_plan_samples_after(rn, s.world_size, s.num_consumers, s.batch_size, s.drop_last, batches);
    out->samples_consumed = (per_rank > 0 ? per_rank : 0) * s.world_size;
    return 0;
}

/* ---- open / close -------------------------------------------------------------------- */

static int check_process(const vf_loader *l)
{
    if (l->pid != getpid())
        return vf_error(VF_EINVAL, "loader: this loader was opened in process %ld and cannot be used after fork(); "
                                   "open a new loader in this process",
                        (long)l->pid);
    return 0;
}

void vf_loader_close(vf_loader *l)
{
    if (!l || l->pid != getpid())
        return; /* NULL, or a forked copy: its threads live in the parent only */
    if (l->threads) {
        if (l->done && l->stash)
            drain(l);
        vf_thread_pool_destroy(l->threads);
    }
    evict_all(l);
    free(l->seg_state);
    free(l->evict_order);
    for (size_t i = 0; i < l->num_warnings; i++)
        free(l->warnings[i]);
    free(l->warnings);
    for (size_t i = 0; i < l->num_skips; i++)
        free_skip(&l->skips[i]);
    free(l->skips);
    if (l->done)
        vf_queue_destroy(l->done);
    free(l->stash);
    vf_plan_epoch_free(&l->plan);
    free(l->tasks);
    free(l->ranges);
    if (l->spec) { /* batches may outlive the loader: they keep the spec, not the hint */
        pthread_mutex_lock(&l->spec->rows_lock);
        l->spec->wanted = NULL;
        pthread_mutex_unlock(&l->spec->rows_lock);
    }
    free(l->wanted);
    if (l->cache)
        vf_video_cache_close(l->cache);
    if (l->file_cache) /* after the readers that may read its files, and after every evict */
        vf_file_cache_close(l->file_cache);
    if (l->core)
        vf_engine_core_unref(l->core);
    else
        vf_sample_spec_free(l->spec);
    pthread_mutex_destroy(&l->stats_lock);
    free(l);
}

int vf_loader_open(vf_loader **out, vf_dataset *dataset, const vf_loader_settings *settings)
{
    *out = NULL;
    if (!dataset)
        return vf_error(VF_EINVAL, "loader: no dataset");
    vf_loader *l = vf_calloc(1, sizeof *l);
    if (!l)
        return VF_ENOMEM;
    pthread_mutex_init(&l->stats_lock, NULL);
    vf_histogram_init(&l->latency);
    l->dataset = dataset;
    l->pid = getpid();
    if (settings)
        l->settings = *settings;
    else
        vf_loader_defaults(&l->settings);
    vf_loader_settings *s = &l->settings;
    vf_loader_state resume;
    int have_resume = s->resume != NULL;
    if (have_resume)
        resume = *s->resume;
    s->resume = NULL;
    int r = check_settings(s);
    if (r == 0 && vf_dataset_num_episodes(dataset) == 0)
        r = vf_error(VF_EINVAL, "%s: no episodes selected", vf_dataset_root(dataset));
    if (r == 0)
        r = vf_sample_spec_build(&l->spec, dataset, &s->sample);
    /* The spec copied what it needs; settings pointers must not be kept. */
    s->sample.delta_timestamps = NULL;
    s->sample.keys = NULL;
    s->sample.renames = NULL;
    s->sample.normalize = NULL;
    s->sample.num_delta_timestamps = s->sample.num_keys = s->sample.num_renames = s->sample.num_normalize = 0;
    if (r == 0) {
        if (!(l->wanted = vf_calloc(l->spec->num_episodes ? l->spec->num_episodes : 1, 1)))
            r = VF_ENOMEM;
        else if (s->table_cache_bytes > 0)
            l->spec->rows_max_bytes = s->table_cache_bytes;
    }
    l->nthreads = s->threads > 0 ? s->threads : vf_cpu_count();
    if (l->nthreads < 1)
        l->nthreads = 1;
    l->window = prefetch_count(s, r == 0 ? l->spec : NULL) + (size_t)l->nthreads;
    if (r == 0) {
        r = vf_engine_core_create(&l->core, l->spec, s->batch_size, l->window + 2);
    }
    if (r == 0) {
        vf_video_cache_settings cs;
        vf_video_cache_defaults(&cs);
        size_t files = 0;
        for (size_t k = 0; k < vf_dataset_num_cameras(dataset); k++)
            files += vf_dataset_num_video_files(dataset, k);
        l->cache_capacity = cache_entries(s, vf_dataset_num_cameras(dataset), files, l->nthreads);
        cs.max_entries = l->cache_capacity;
        cs.video.decode_threads = s->decode_threads;
        l->opener.dataset = dataset;
        if (s->prefetch_cache_dir && s->prefetch_cache_bytes > 0 && s->mode == VF_MODE_POOL) {
            r = vf_file_cache_open(&l->file_cache, s->prefetch_cache_dir, s->prefetch_cache_bytes);
            l->opener.file_cache = l->file_cache;
            l->user_hooks = s->pool_hooks;
            s->pool_hooks = (vf_pool_hooks){prefetch_admit, prefetch_evict, l};
        }
        s->prefetch_cache_dir = NULL; /* not kept: the cache has its own copy */
        cs.open_source = vf_ds_opener_open;
        cs.open_source_ctx = &l->opener;
        if (r == 0)
            r = vf_video_cache_open(&l->cache, &cs);
    }
    if (r == 0)
        r = vf_thread_pool_create(&l->threads, l->nthreads);
    if (r == 0)
        r = vf_queue_create(&l->done, l->window + 1);
    if (r == 0 && !(l->stash = vf_calloc(l->window, sizeof *l->stash)))
        r = VF_ENOMEM;
    if (r == 0)
        r = make_tasks(dataset, s->mode, s->partition, (size_t)s->world_size * (size_t)s->num_consumers, &l->tasks,
                       &l->num_tasks);
    if (r == 0)
        l->selection = selection_hash(dataset);
    l->epoch = s->epoch;
    int64_t resume_batch = 0;
    if (r == 0 && have_resume &&
        (r = resolve_state(s, dataset, l->spec->num_positions, l->selection, l->tasks, l->num_tasks, &resume,
                           &l->ranges, &l->num_ranges, &resume_batch)) == 0)
        l->epoch = resume.epoch;
    if (r == 0)
        r = plan_epoch(l, resume_batch);
    if (r == 0 && s->mode != VF_MODE_MAP)
        r = start(l);
    if (r < 0) {
        vf_loader_close(l);
        return r;
    }
    *out = l;
    return 0;
}

/* ---- epochs and batches ----------------------------------------------------------------- */

int64_t vf_loader_num_samples(const vf_loader *l) { return l->plan.num_samples; }
int64_t vf_loader_num_positions(const vf_loader *l) { return l->spec->num_positions; }
size_t vf_loader_num_batches(const vf_loader *l) { return l->plan.num_batches; }

/* Abandons what the current epoch has in flight and starts `epoch` at
 * rank-level batch resume_batch. */
static int restart(vf_loader *l, int64_t epoch, int64_t resume_batch)
{
    drain(l);
    evict_all(l);
    l->epoch = epoch;
    int r = plan_epoch(l, resume_batch);
    if (r < 0)
        return r;
    l->started = 0;
    if (l->settings.mode != VF_MODE_MAP)
        return start(l);
    return 0;
}

int vf_loader_set_state(vf_loader *l, const vf_loader_state *state)
{
    int r = check_process(l);
    if (r < 0)
        return r;
    int64_t k, *ranges = NULL;
    size_t nr = 0;
    if ((r = resolve_state(&l->settings, l->dataset, l->spec->num_positions, l->selection, l->tasks, l->num_tasks,
                           state, &ranges, &nr, &k)) < 0)
        return r;
    free(l->ranges);
    l->ranges = ranges;
    l->num_ranges = nr;
    return restart(l, state->epoch, k);
}

/* Rank-level batches delivered, or -1 when this loader cannot know. */
static int64_t rank_batches(const vf_loader *l)
{
    if (l->settings.consumer < 0)
        return (int64_t)l->next_deliver;
    if (l->settings.num_consumers == 1)
        return l->resume_base + (int64_t)l->next_deliver;
    return -1;
}

size_t vf_loader_batches_delivered(const vf_loader *l)
{
    int64_t k = rank_batches(l);
    return k >= 0 ? (size_t)k : l->next_deliver;
}

int vf_loader_get_state(const vf_loader *l, vf_loader_state *out)
{
    memset(out, 0, sizeof *out);
    int64_t k = rank_batches(l);
    if (k < 0)
        return vf_error(VF_EINVAL, "loader: consumer %d of %d cannot see its rank's progress (the other consumers' "
                                   "batches go elsewhere); take the state where every consumer's batches arrive "
                                   "(vf_loader_state_at, or vlafeed.torch.DataLoader.state_dict())",
                        l->settings.consumer, l->settings.num_consumers);
    const vf_loader_settings *s = &l->settings;
    state_from_settings(s, l->dataset, l->spec->num_positions, l->selection, out);
    out->num_ranges = l->num_ranges;
    out->ranges = l->ranges;
    out->settings_hash = state_hash(out);
    int64_t rn = vf_plan_ranges_samples(l->ranges, l->num_ranges, l->spec->num_positions);
    int64_t per_rank = vf_plan_samples_after(rn, s->world_size, s->num_consumers, s->batch_size, s->drop_last, k);
    if (per_rank < 0)
        return vf_error(VF_EINVAL, "loader: %lld batches delivered is past the epoch", (long long)k);
    out->epoch = l->epoch;
    out->samples_consumed = per_rank * s->world_size;
    return 0;
}

int vf_loader_state_at(const vf_dataset *d, const vf_loader_settings *settings, int64_t epoch, int64_t batches,
                       vf_loader_state *out)
{
    memset(out, 0, sizeof *out);
    vf_loader_settings s = *settings;
    int r = check_settings(&s);
    if (r < 0)
        return r;
    int64_t n = total_positions(d);
    state_from_settings(&s, d, n, selection_hash(d), out);
    int64_t rn = n;
    if (s.resume && s.resume->epoch == epoch && s.resume->num_ranges > 0) {
        /* A generation that continues an elastic resume (a resolved state,
         * vf_loader_state_resolve): counts are within its ranges. */
        if ((r = vf_plan_ranges_check(s.resume->ranges, s.resume->num_ranges, n)) < 0)
            return r;
        out->num_ranges = s.resume->num_ranges;
        out->ranges = s.resume->ranges;
        out->settings_hash = state_hash(out);
        rn = vf_plan_ranges_samples(out->ranges, out->num_ranges, n);
    }
    int64_t per_rank = vf_plan_samples_after(rn, s.world_size, s.num_consumers, s.batch_size, s.drop_last, batches);
    if (per_rank < 0) {
        int64_t start, count;
        vf_plan_rank_slice(n, 0, s.world_size, s.drop_last, &start, &count);
        return vf_error(VF_ERANGE, "loader state: %lld batches is past the epoch (%lld samples per rank in batches "
                                   "of %zu over %d consumers)",
                        (long long)batches, (long long)count, s.batch_size, s.num_consumers);
    }
    out->epoch = epoch;
    out->samples_consumed = per_rank * s.world_size;
    return 0;
}

size_t vf_loader_num_warnings(const vf_loader *l) { return l->num_warnings; }
const char *vf_loader_warning(const vf_loader *l, size_t i) { return i < l->num_warnings ? l->warnings[i] : NULL; }

int vf_loader_set_epoch(vf_loader *l, int64_t epoch)
{
    int r = check_process(l);
    if (r < 0)
        return r;
    if (epoch == l->epoch && l->next_deliver == l->start_batch)
        return 0; /* that epoch (or its resumed part) has delivered nothing yet: keep what is being built */
    free(l->ranges); /* a new epoch covers its whole global order */
    l->ranges = NULL;
    l->num_ranges = 0;
    return restart(l, epoch, 0);
}

/* Moves a delivered job's skip records to the loader (they pass to it, or
 * are dropped beyond MAX_SKIP_RECORDS). */
static void take_skips(vf_loader *l, job *j)
{
    l->skipped += j->num_skips;
    size_t room = l->num_skips < MAX_SKIP_RECORDS ? MAX_SKIP_RECORDS - l->num_skips : 0;
    size_t take = VF_MIN(room, j->num_skips);
    vf_loader_skip *grown = take ? realloc(l->skips, (l->num_skips + take) * sizeof *grown) : NULL;
    if (grown) {
        l->skips = grown;
        memcpy(l->skips + l->num_skips, j->skips, take * sizeof *grown);
        l->num_skips += take;
    } else {
        take = 0;
    }
    for (size_t i = take; i < j->num_skips; i++)
        free_skip(&j->skips[i]);
    free(j->skips);
    j->skips = NULL;
    j->num_skips = 0;
}

size_t vf_loader_num_skips(const vf_loader *l) { return l->num_skips; }

const vf_loader_skip *vf_loader_get_skip(const vf_loader *l, size_t i)
{
    return i < l->num_skips ? &l->skips[i] : NULL;
}

static int next_batch(vf_loader *l, vf_batch **out);

int vf_loader_next(vf_loader *l, vf_batch **out)
{
    for (;;) {
        int r = next_batch(l, out);
        if (r < 0 || (*out)->size > 0)
            return r;
        vf_batch_release(*out); /* every sample of it was skipped: on to the next one */
        *out = NULL;
    }
}

static int next_batch(vf_loader *l, vf_batch **out)
{
    *out = NULL;
    int r = check_process(l);
    if (r < 0)
        return r;
    if (l->next_deliver >= l->plan.num_batches)
        return VF_EOF;
    if (!l->started && (r = start(l)) < 0)
        return r;
    size_t want = l->next_deliver;
    job *j = l->stash[want % l->window];
    double waited_from = 0;
    while (!j || j->seq != want) {
        void *item;
        if (vf_queue_try_pop(l->done, &item) != 0) {
            if (!waited_from)
                waited_from = vf_now_seconds();
            r = vf_queue_pop(l->done, &item);
            if (r < 0)
                return vf_error(VF_EIO, "loader: the output queue closed unexpectedly");
        }
        job *got = item;
        l->in_flight--;
        if (got->seq == want) {
            j = got;
        } else {
            free_job(l->stash[got->seq % l->window]);
            l->stash[got->seq % l->window] = got;
        }
    }
    if (l->stash[want % l->window] == j)
        l->stash[want % l->window] = NULL;
    if (waited_from)
        l->wait_seconds += vf_now_seconds() - waited_from;
    l->next_deliver++;
    int rc = j->rc;
    vf_batch *b = j->batch;
    double ready_at = j->done_at;
    j->batch = NULL;
    if (rc < 0)
        vf_error(rc, "%s", j->message ? j->message : "batch assembly failed");
    else
        take_skips(l, j);
    free_job(j);
    if (rc == 0) {
        if (!l->have_first) {
            l->have_first = 1;
            l->first_batch_seconds = ready_at - l->started_at; /* ready, whenever the caller asked */
        }
        l->samples += b->size;
        l->batches += b->size > 0; /* a batch whose samples were all skipped is not delivered */
        if (l->seg_state)
            evict_until(l, want);
    }
    r = submit_more(l);
    if (rc < 0)
        return rc;
    if (r < 0) {
        vf_batch_release(b);
        return r;
    }
    *out = b;
    return 0;
}

int vf_loader_get_items(vf_loader *l, const int64_t *positions, size_t count, vf_batch **out)
{
    *out = NULL;
    int r = check_process(l);
    if (r < 0)
        return r;
    if (count == 0)
        return vf_error(VF_EINVAL, "get_items: no positions");
    if (count > (1u << 24))
        return vf_error(VF_EINVAL, "get_items: %zu positions is too many for one batch", count);
    for (size_t i = 0; i < count; i++)
        if (positions[i] < 0 || positions[i] >= l->spec->num_positions)
            return vf_error(VF_ERANGE, "get_items: position %lld is out of range [0, %lld)", (long long)positions[i],
                            (long long)l->spec->num_positions);
    vf_batch *b;
    r = vf_engine_batch_acquire(l->core, count, &b);
    if (r < 0)
        return r;
    memcpy(b->positions, positions, count * sizeof *positions);
    vf_sample_dest dest;
    vf_engine_batch_dest(b, &dest);
    vf_sample_parallel par = {vf_engine_parallel_run, l->threads};
    double t0 = vf_now_seconds();
    r = vf_sample_assemble(l->spec, l->cache, &l->counters, b->positions, count, &dest, &par);
    if (r < 0) {
        vf_batch_release(b);
        return r;
    }
    double per_sample = (vf_now_seconds() - t0) / (double)count;
    pthread_mutex_lock(&l->stats_lock);
    for (size_t i = 0; i < count; i++)
        vf_histogram_add(&l->latency, per_sample);
    pthread_mutex_unlock(&l->stats_lock);
    l->samples += count;
    l->batches++;
    *out = b;
    return 0;
}

void vf_loader_get_stats(const vf_loader *l, vf_loader_stats *st)
{
    memset(st, 0, sizeof *st);
    vf_loader *m = (vf_loader *)l; /* the locks are not part of the loader's logical state */
    st->samples = l->samples;
    st->batches = l->batches;
    st->frames_decoded = atomic_load(&m->counters.frames_decoded);
    st->frames_delivered = atomic_load(&m->counters.frames_delivered);
    vf_video_cache_stats cs;
    vf_video_cache_get_stats(l->cache, &cs);
    st->video_opens = cs.misses;
    st->cache_hits = cs.hits;
    st->cache_misses = cs.misses;
    st->cache_evictions = cs.evictions;
    st->cache_entries = cs.entries;
    st->wait_seconds = l->wait_seconds;
    st->first_batch_seconds = l->have_first ? l->first_batch_seconds : 0.0;
    pthread_mutex_lock(&m->stats_lock);
    st->p50_sample_ms = vf_histogram_quantile(&l->latency, 0.50) * 1e3;
    st->p95_sample_ms = vf_histogram_quantile(&l->latency, 0.95) * 1e3;
    st->p99_sample_ms = vf_histogram_quantile(&l->latency, 0.99) * 1e3;
    pthread_mutex_unlock(&m->stats_lock);
    pthread_mutex_lock(&l->core->lock);
    st->batch_buffers = l->core->allocated;
    pthread_mutex_unlock(&l->core->lock);
    st->window = l->window;
    st->samples_assembled = atomic_load(&m->counters.samples);
    st->padded_samples = l->plan.padded_samples;
    st->dropped_samples = l->plan.dropped_samples;
    st->empty_consumers = l->plan.empty_consumers;
    st->warnings = l->num_warnings;
    st->skipped = l->skipped;
    st->pool_segments = l->live_segments;
    st->pool_admitted = l->admitted;
    st->pool_evicted = l->evicted;
    st->cache_capacity = l->cache_capacity;
    vf_sample_spec *sp = l->spec;
    pthread_mutex_lock(&sp->rows_lock);
    st->table_reads = sp->table_reads;
    st->table_row_groups = sp->table_row_groups;
    st->table_pages_decoded = sp->table_pages_decoded;
    st->table_pages_skipped = sp->table_pages_skipped;
    st->table_rows = sp->table_rows;
    st->table_episodes = sp->table_episodes;
    st->table_evictions = sp->table_evictions;
    st->table_cache_bytes = sp->rows_bytes;
    pthread_mutex_unlock(&sp->rows_lock);
}

/* ---- public task lists and open counts ------------------------------------------------------ */

/* Decoded bytes of one frame row: uint8 HWC frames of every camera plus the
 * numeric columns (float32, int64 for integers). */
static int64_t frame_bytes(const vf_dataset *d)
{
    int64_t b = 0;
    for (size_t i = 0; i < vf_dataset_num_features(d); i++) {
        const vf_feature *f = vf_dataset_feature(d, i);
        if (f->camera >= 0) {
            const vf_camera *c = vf_dataset_camera(d, (size_t)f->camera);
            b += (int64_t)c->width * c->height * 3;
        } else if (f->type != VF_DTYPE_OTHER) {
            int is_int = f->type != VF_DTYPE_FLOAT32 && f->type != VF_DTYPE_FLOAT64 && f->type != VF_DTYPE_FLOAT16;
            b += f->size * (is_int ? 8 : 4);
        }
    }
    return b;
}

typedef struct task_walk {
    const vf_dataset *d;
    vf_loader_settings s;      /* checked */
    vf_plan_task *tasks;       /* the partition (owned) */
    size_t num_tasks;
    int64_t *ranges;           /* a resolved resume state's remaining ranges (owned) */
    size_t num_ranges;
    vf_plan_epoch_settings ps;
    int64_t *ep_start;         /* [episodes + 1] first position of each selected episode */
    size_t num_episodes;
    int64_t frame_bytes;
    /* consumer_tasks */
    vf_task_info *out;
    size_t count;
    /* count_opens */
    size_t out_cap;
    size_t *file_base;         /* [cameras]: key offset of each camera's files */
    size_t lru_cap;            /* the decoder cache's capacity (entries) */
    size_t lru_key[128];
    uint64_t lru_time[128];
    vf_plan_opens *opens;
} task_walk;

static size_t episode_at(const task_walk *w, int64_t position)
{
    size_t lo = 0, hi = w->num_episodes;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->ep_start[mid] <= position)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static void fill_info(const task_walk *w, size_t id, int64_t first, int64_t rows, vf_task_info *t)
{
    t->id = id;
    t->first_row = first;
    t->num_rows = rows;
    t->first_episode = episode_at(w, first);
    t->num_episodes = rows > 0 ? episode_at(w, first + rows - 1) - t->first_episode + 1 : 0;
    t->estimated_bytes = rows * w->frame_bytes;
    t->rank = t->consumer = -1;
}

static int collect_pieces(void *ctx, int rank, int consumer, const vf_plan_piece *p, size_t n)
{
    task_walk *w = ctx;
    if (w->count + n > w->out_cap) {
        size_t cap = VF_MAX(w->out_cap * 2, w->count + n + 16);
        vf_task_info *nv = vf_realloc(w->out, cap * sizeof *nv);
        if (!nv)
            return VF_ENOMEM;
        w->out = nv;
        w->out_cap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        vf_task_info *t = &w->out[w->count++];
        fill_info(w, p[i].task, p[i].first_position, p[i].num_samples, t);
        t->rank = rank;
        t->consumer = consumer;
    }
    return 0;
}


static int count_consumer_opens(void *ctx, int rank, int consumer, const vf_plan_piece *p, size_t n)
{
    (void)rank;
    (void)consumer;
    task_walk *w = ctx;
    size_t nc = vf_dataset_num_cameras(w->d);
    int64_t samples = 0;
    /* The decoder cache of one consumer, simulated: LRU over the files of
     * its part in reading order, with the loader's capacity. */
    size_t cap = w->lru_cap, used = 0, opens = 0;
    uint64_t clock = 0;
    for (size_t i = 0; i < n; i++) {
        samples += p[i].num_samples;
        size_t e0 = episode_at(w, p[i].first_position);
        size_t e1 = episode_at(w, p[i].first_position + p[i].num_samples - 1);
        for (size_t e = e0; e <= e1; e++)
            for (size_t c = 0; c < nc; c++) {
                vf_video_span vs;
                if (vf_dataset_episode_video(w->d, e, c, &vs) < 0)
                    return VF_EINVAL;
                size_t key = w->file_base[c] + vs.file, hit = SIZE_MAX, oldest = 0;
                clock++;
                for (size_t k = 0; k < used; k++) {
                    if (w->lru_key[k] == key)
                        hit = k;
                    if (w->lru_time[k] < w->lru_time[oldest])
                        oldest = k;
                }
                if (hit != SIZE_MAX) {
                    w->lru_time[hit] = clock;
                    continue;
                }
                opens++;
                size_t slot = used < cap ? used++ : oldest;
                w->lru_key[slot] = key;
                w->lru_time[slot] = clock;
            }
    }
    w->opens->consumer_opens += opens;
    w->opens->lower_bound += samples > 0 ? nc : 0;
    w->opens->samples += samples;
    return 0;
}

static void walk_free(task_walk *w)
{
    free(w->tasks);
    free(w->ranges);
    free(w->ep_start);
    free(w->file_base);
}

/* The walk over a dataset's consumers for these settings: checked
 * settings, tasks, plan settings (with the remaining ranges of a resolved
 * resume state of that epoch). */
static int walk_setup(const vf_dataset *d, const vf_loader_settings *settings, int64_t epoch, task_walk *w)
{
    memset(w, 0, sizeof *w);
    w->s = *settings;
    vf_loader_settings *s = &w->s;
    const vf_loader_state *resume = s->resume;
    s->resume = NULL;
    int r = check_settings(s);
    if (r == 0 && s->mode == VF_MODE_MAP)
        r = vf_error(VF_EINVAL, "plan: map mode has no tasks (its samples are random positions); use mode "
                                "'stream' or 'pool'");
    if (r == 0)
        r = make_tasks(d, s->mode, s->partition, (size_t)s->world_size * (size_t)s->num_consumers, &w->tasks,
                       &w->num_tasks);
    int64_t n = total_positions(d), k = 0;
    if (r == 0 && resume && resume->epoch == epoch)
        r = resolve_state(s, d, n, selection_hash(d), w->tasks, w->num_tasks, resume, &w->ranges, &w->num_ranges,
                          &k);
    w->ps = (vf_plan_epoch_settings){
        .seed = s->seed,
        .epoch = epoch,
        .shuffle = s->shuffle,
        .rank = -1,
        .world_size = s->world_size,
        .num_consumers = s->num_consumers,
        .consumer = -1,
        .batch_size = s->batch_size,
        .drop_last = s->drop_last,
        .shuffle_buffer = s->mode == VF_MODE_STREAM ? s->shuffle_buffer : 0,
        .pool_size = s->mode == VF_MODE_POOL ? s->episode_pool_size : 0,
        .ranges = w->ranges,
        .num_ranges = w->num_ranges,
    };
    w->d = d;
    w->num_episodes = vf_dataset_num_episodes(d);
    w->frame_bytes = frame_bytes(d);
    if (r == 0 && !(w->ep_start = vf_malloc_array(w->num_episodes + 1, sizeof *w->ep_start)))
        r = VF_ENOMEM;
    int64_t pos = 0;
    for (size_t e = 0; r == 0 && e < w->num_episodes; e++) {
        w->ep_start[e] = pos;
        pos += vf_dataset_episode(d, e)->length;
    }
    if (r == 0)
        w->ep_start[w->num_episodes] = pos;
    if (r < 0)
        walk_free(w);
    return r;
}

int vf_plan_consumer_tasks(const vf_dataset *d, const vf_loader_settings *settings, int64_t epoch, int rank,
                           int consumer, vf_task_info **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    task_walk w;
    int r = walk_setup(d, settings, epoch, &w);
    if (r < 0)
        return r;
    if (rank < -1 || rank >= w.s.world_size || consumer < -1 || consumer >= w.s.num_consumers)
        r = vf_error(VF_EINVAL, "plan: rank %d, consumer %d is not in world_size %d x %d consumers", rank, consumer,
                     w.s.world_size, w.s.num_consumers);
    w.ps.rank = rank;
    w.ps.consumer = consumer;
    if (r == 0)
        r = vf_plan_each_consumer(&w.ps, w.ep_start[w.num_episodes], w.tasks, w.num_tasks, collect_pieces, &w);
    walk_free(&w);
    if (r < 0) {
        free(w.out);
        return r;
    }
    *out = w.out;
    *count = w.count;
    return 0;
}

int vf_plan_count_opens(const vf_dataset *d, const vf_loader_settings *settings, int64_t epoch, vf_plan_opens *out)
{
    memset(out, 0, sizeof *out);
    task_walk w;
    int r = walk_setup(d, settings, epoch, &w);
    if (r < 0)
        return r;
    size_t nc = vf_dataset_num_cameras(d);
    if (!(w.file_base = vf_calloc(nc ? nc : 1, sizeof *w.file_base)))
        r = VF_ENOMEM;
    for (size_t c = 0; r == 0 && c < nc; c++) {
        w.file_base[c] = out->distinct_files;
        out->distinct_files += vf_dataset_num_video_files(d, c);
    }
    out->consumers = (size_t)w.s.world_size * (size_t)w.s.num_consumers;
    /* One consumer per loader (a DataLoader worker), one engine thread. */
    vf_loader_settings one = w.s;
    one.consumer = 0;
    w.lru_cap = cache_entries(&one, nc, out->distinct_files, 1);
    w.lru_cap = w.lru_cap < 1 ? 1 : w.lru_cap > 128 ? 128 : w.lru_cap;
    out->cache_entries = w.lru_cap;
    if (r == 0) {
        vf_plan_input in;
        r = vf_plan_input_from_dataset(d, &in);
        if (r == 0) {
            out->task_opens = vf_plan_video_opens(&in, w.tasks, w.num_tasks);
            vf_plan_input_free(&in);
        }
    }
    w.opens = out;
    if (r == 0)
        r = vf_plan_each_consumer(&w.ps, w.ep_start[w.num_episodes], w.tasks, w.num_tasks, count_consumer_opens,
                                  &w);
    if (r == 0 && out->lower_bound < out->distinct_files)
        out->lower_bound = out->distinct_files;
    walk_free(&w);
    return r;
}

int vf_plan_tasks(const vf_dataset *d, vf_partition partition, int world_size, int num_consumers, vf_task_info **out,
                  size_t *count)
{
    *out = NULL;
    *count = 0;
    if (world_size < 1 || num_consumers < 1)
        return vf_error(VF_EINVAL, "plan: world size %d and workers %d must be at least 1", world_size,
                        num_consumers);
    vf_plan_task *tasks = NULL;
    size_t nt = 0;
    int r = make_tasks(d, VF_MODE_STREAM, partition, (size_t)world_size * (size_t)num_consumers, &tasks, &nt);
    if (r < 0)
        return r;
    task_walk w = {.d = d, .num_episodes = vf_dataset_num_episodes(d), .frame_bytes = frame_bytes(d)};
    vf_task_info *v = vf_malloc_array(nt ? nt : 1, sizeof *v);
    if (!v) {
        free(tasks);
        return VF_ENOMEM;
    }
    for (size_t i = 0; i < nt; i++) {
        v[i] = (vf_task_info){i, tasks[i].first_episode, tasks[i].num_episodes, tasks[i].first_position,
                              tasks[i].num_samples, tasks[i].num_samples * w.frame_bytes, -1, -1};
    }
    free(tasks);
    *out = v;
    *count = nt;
    return 0;
}
