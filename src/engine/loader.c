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
 * Stream loaders start producing at open (fast first batch); map loaders
 * start on the first vf_loader_next (their main use is get_items).
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
} job;

struct vf_loader {
    vf_dataset *dataset;
    pid_t pid;                 /* the process that opened it */
    vf_loader_settings settings;
    vf_engine_core *core;
    vf_sample_spec *spec;      /* owned by core */
    vf_video_cache *cache;
    vf_ds_opener opener;       /* the cache's open hook: local files, or URLs through the dataset's fs */
    vf_thread_pool *threads;
    int nthreads;
    vf_sample_counters counters;
    vf_plan_task *tasks;       /* stream mode */
    size_t num_tasks;

    /* the current epoch */
    int64_t epoch;
    vf_plan_epoch plan;
    int started;
    size_t window;
    size_t next_submit, next_deliver;
    job **stash;               /* [window], by seq % window */
    vf_queue *done;
    atomic_int cancel;
    size_t in_flight;          /* submitted, not yet taken from the queue */

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
    s->partition = VF_PARTITION_FILE_GROUP;
    s->episode_pool_size = 16;
    s->decoder_cache_entries = 32;
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
    if ((unsigned)s->mode > VF_MODE_POOL)
        return vf_error(VF_EINVAL, "loader: unknown mode %d", (int)s->mode);
    if (s->mode == VF_MODE_POOL)
        return vf_error(VF_EUNSUPPORTED, "loader: mode 'pool' (the episode pool) is not implemented yet; use 'map' "
                                         "or 'stream'");
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
    if (s->decoder_cache_entries == 0)
        s->decoder_cache_entries = 32;
    return 0;
}

/* ---- production ------------------------------------------------------------------- */

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
        free(j);
    }
}

static void free_job(job *j)
{
    if (!j)
        return;
    vf_batch_release(j->batch);
    free(j->message);
    free(j);
}

static int submit_more(vf_loader *l)
{
    while (l->next_submit < l->plan.num_batches && l->next_submit < l->next_deliver + l->window) {
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

static int plan_epoch(vf_loader *l)
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
    };
    return vf_plan_epoch_build(&ps, l->spec->num_positions, s->mode == VF_MODE_STREAM ? l->tasks : NULL,
                               l->num_tasks, &l->plan);
}

static int start(vf_loader *l)
{
    l->started = 1;
    l->started_at = vf_now_seconds();
    l->have_first = 0;
    return submit_more(l);
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
    if (l->done)
        vf_queue_destroy(l->done);
    free(l->stash);
    vf_plan_epoch_free(&l->plan);
    free(l->tasks);
    if (l->cache)
        vf_video_cache_close(l->cache);
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
    l->nthreads = s->threads > 0 ? s->threads : vf_cpu_count();
    if (l->nthreads < 1)
        l->nthreads = 1;
    l->window = s->prefetch_batches + (size_t)l->nthreads;
    if (r == 0) {
        r = vf_engine_core_create(&l->core, l->spec, s->batch_size, l->window + 2);
    }
    if (r == 0) {
        vf_video_cache_settings cs;
        vf_video_cache_defaults(&cs);
        cs.max_entries = s->decoder_cache_entries;
        cs.video.decode_threads = s->decode_threads;
        l->opener.dataset = dataset;
        cs.open_source = vf_ds_opener_open;
        cs.open_source_ctx = &l->opener;
        r = vf_video_cache_open(&l->cache, &cs);
    }
    if (r == 0)
        r = vf_thread_pool_create(&l->threads, l->nthreads);
    if (r == 0)
        r = vf_queue_create(&l->done, l->window + 1);
    if (r == 0 && !(l->stash = vf_calloc(l->window, sizeof *l->stash)))
        r = VF_ENOMEM;
    if (r == 0 && s->mode == VF_MODE_STREAM) {
        vf_plan_input in;
        r = vf_plan_input_from_dataset(dataset, &in);
        if (r == 0) {
            r = vf_plan_partition(&in, s->partition, (size_t)s->world_size * (size_t)s->num_consumers, &l->tasks,
                                  &l->num_tasks);
            vf_plan_input_free(&in);
        }
    }
    l->epoch = s->epoch;
    if (r == 0)
        r = plan_epoch(l);
    if (r == 0 && s->mode == VF_MODE_STREAM)
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

int vf_loader_set_epoch(vf_loader *l, int64_t epoch)
{
    int r = check_process(l);
    if (r < 0)
        return r;
    if (epoch == l->epoch && l->next_deliver == 0)
        return 0; /* that epoch has not delivered anything yet: keep what is being built */
    drain(l);
    l->epoch = epoch;
    l->next_submit = l->next_deliver = 0;
    r = plan_epoch(l);
    if (r < 0)
        return r;
    l->started = 0;
    if (l->settings.mode == VF_MODE_STREAM)
        return start(l);
    return 0;
}

int vf_loader_next(vf_loader *l, vf_batch **out)
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
    free_job(j);
    if (rc == 0) {
        if (!l->have_first) {
            l->have_first = 1;
            l->first_batch_seconds = ready_at - l->started_at; /* ready, whenever the caller asked */
        }
        l->samples += b->size;
        l->batches++;
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
}
