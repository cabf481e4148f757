/*
 * loader.c: the public loader (include/vlafeed/loader.h), its caller side:
 * settings, open and close, epochs and resume, in-order delivery and
 * statistics. Batches are produced in loader_produce.c; states and task
 * lists computed from settings alone are in loader_plan.c.
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
 * Resume: a state names the epoch and the rank-level batches delivered
 * (vf_plan_batches_at); the epoch is planned again with that resume batch
 * and production starts there. Nothing before it is assembled or decoded.
 *
 * Threading contract: one loader is driven by one caller thread at a time
 * (next / get_items / set_epoch / stats); batches may be released from any
 * thread, and vf_loader_cancel called from any thread. A loader inherited
 * through fork() (e.g. by DataLoader worker processes) cannot be used in
 * the child, whose copy has no engine threads: calls there fail with a
 * message, and closing it there leaks it instead of joining threads that
 * do not exist.
 *
 * Cancellation: the remote requests of the engine threads (and of the
 * caller's thread inside get_items) watch the loader's io_cancel token
 * (io.h), and those of the prefetch file cache watch the cache's.
 * vf_loader_cancel requests both; close does so first, so that it never
 * waits for a read riding out an outage (the retry budget is minutes).
 */
#define _POSIX_C_SOURCE 200809L /* getpid */
#include "engine/loader_internal.h"

#include <stdio.h>
#include <unistd.h>

#include <stdlib.h>
#include <string.h>

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
    s->share_video_readers = -1;
    s->table_disk_cache = -1;
    s->sample.tolerance_s = 1e-4;
    s->sample.image_format = VF_IMAGE_FLOAT32_CHW;
    s->sample.lerobot_shapes = 1;
    s->sample.include_task = 1;
    s->log_warnings = 1;
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

int vf_engine_check_settings(vf_loader_settings *s)
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

/* ---- sizes ------------------------------------------------------------------------------ */

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

/* Placement: copies the settings' CPU set (the caller's array is not kept)
 * after checking that this process may run on each CPU of it. */
static int pin_to(vf_loader *l, vf_loader_settings *s)
{
    int r = vf_cpu_list_check(s->cpus, s->num_cpus);
    if (r < 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", vf_last_error());
        return vf_error(r, "loader: cpus: %s", why);
    }
    if (!(l->cpus = vf_malloc_array(s->num_cpus, sizeof *l->cpus)))
        return VF_ENOMEM;
    memcpy(l->cpus, s->cpus, s->num_cpus * sizeof *l->cpus);
    l->num_cpus = s->num_cpus;
    s->cpus = NULL; /* settings pointers must not be kept */
    s->num_cpus = 0;
    return 0;
}

/* decode_threads = 0: the rank's cores (the pinned set, else the CPUs this
 * process may run on) shared by its engine threads, at least 1, at most 8
 * (frame threads beyond ~8 add latency and memory, not throughput, at the
 * resolutions datasets hold). */
int vf_engine_decode_threads(size_t pinned_cpus, int engine_threads)
{
    int cores = pinned_cpus > 0 ? (int)VF_MIN(pinned_cpus, (size_t)1 << 16) : vf_cpu_allowed_count();
    int per_thread = cores / (engine_threads > 0 ? engine_threads : 1);
    return per_thread < 1 ? 1 : per_thread > 8 ? 8 : per_thread;
}

/* The decoder cache bound: the user's, or 32; in pool mode the pool's
 * working set, at most 128: segments x cameras x consumers of this loader.
 * In map mode a batch of random positions touches every video file of the
 * selection, so the working set is the files (at least 32, at most 128).
 * By default one reader per file serves every engine thread in turn
 * (run_group in src/sample/assemble.c), so the thread count does not
 * multiply the working set; with share_video_readers = 0 each thread checks
 * out its own reader of a file, and the pool bound is multiplied by the
 * threads (with one entry per file, 2 threads reopened files ~5x as often,
 * measured). `vlafeed plan` simulates this bound. */
size_t vf_engine_cache_entries(const vf_loader_settings *s, size_t cameras, size_t files, int threads)
{
    if (s->decoder_cache_entries > 0)
        return s->decoder_cache_entries;
    if (s->mode == VF_MODE_MAP)
        return VF_MIN(VF_MAX(files, (size_t)32), (size_t)128);
    if (s->mode != VF_MODE_POOL)
        return 32;
    size_t cams = cameras ? cameras : 1;
    size_t local = s->consumer < 0 ? (size_t)s->num_consumers : 1;
    size_t n = VF_MIN(s->episode_pool_size, (size_t)128) * VF_MIN(cams, (size_t)128);
    n = VF_MIN(n, (size_t)128) * VF_MIN(local, (size_t)128);
    if (s->share_video_readers == 0) /* each thread its own readers */
        n = VF_MIN(n, (size_t)128) * (size_t)(threads > 0 ? VF_MIN(threads, 128) : 1);
    return VF_MIN(n, (size_t)128);
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

void vf_loader_cancel(vf_loader *l)
{
    if (!l || l->pid != getpid())
        return;
    vf_io_cancel_request(&l->io_cancel);
    vf_file_cache_cancel(l->file_cache);
}

/* The remote requests of every engine thread watch the loader's token:
 * one job per thread, each holding its thread until all have started, so
 * that no thread runs two. (If a job cannot be queued, out of memory, the
 * ones queued still meet; a thread without one watches nothing.) */
typedef struct watch_gate {
    vf_io_cancel *token;
    pthread_mutex_t lock;
    pthread_cond_t arrived_cond;
    int arrived, expected;
} watch_gate;

static void watch_job(void *arg)
{
    watch_gate *g = arg;
    vf_io_cancel_watch(g->token);
    pthread_mutex_lock(&g->lock);
    g->arrived++;
    pthread_cond_broadcast(&g->arrived_cond);
    while (g->arrived < g->expected)
        pthread_cond_wait(&g->arrived_cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

static void watch_on_engine_threads(vf_loader *l)
{
    watch_gate g = {.token = &l->io_cancel, .expected = vf_thread_pool_threads(l->threads)};
    pthread_mutex_init(&g.lock, NULL);
    pthread_cond_init(&g.arrived_cond, NULL);
    for (int i = 0; i < g.expected; i++) {
        if (vf_thread_pool_submit(l->threads, watch_job, &g) == 0)
            continue;
        pthread_mutex_lock(&g.lock);
        g.expected = i;
        pthread_cond_broadcast(&g.arrived_cond);
        pthread_mutex_unlock(&g.lock);
        break;
    }
    vf_thread_pool_wait(l->threads);
    pthread_mutex_destroy(&g.lock);
    pthread_cond_destroy(&g.arrived_cond);
}

void vf_loader_close(vf_loader *l)
{
    if (!l || l->pid != getpid())
        return; /* NULL, or a forked copy: its threads live in the parent only */
    vf_loader_cancel(l);
    if (l->threads) {
        if (l->done && l->stash)
            vf_engine_drain(l);
        vf_thread_pool_destroy(l->threads);
    }
    vf_engine_evict_all(l);
    free(l->seg_state);
    free(l->cpus);
    free(l->evict_order);
    for (size_t i = 0; i < l->num_warnings; i++)
        free(l->warnings[i]);
    free(l->warnings);
    free(l->warning_global);
    for (size_t i = 0; i < l->num_skips; i++)
        vf_engine_free_skip(&l->skips[i]);
    free(l->skips);
    if (l->done)
        vf_queue_destroy(l->done);
    free(l->stash);
    vf_plan_epoch_free(&l->plan);
    free(l->tasks);
    vf_engine_resume_free(&l->resumed);
    if (l->spec) { /* batches may outlive the loader: they keep the spec, not the hint */
        pthread_mutex_lock(&l->spec->rows_lock);
        l->spec->wanted = NULL;
        pthread_mutex_unlock(&l->spec->rows_lock);
    }
    free(l->wanted);
    if (l->cache)
        vf_video_cache_close(l->cache);
    vf_engine_devices_close(l->devices); /* after the readers that decode on its device */
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
    int r = vf_engine_check_settings(s);
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
    if (r == 0)
        r = vf_engine_devices_open(&l->devices, dataset, s);
    s->decode_device_cameras = NULL; /* resolved per camera in l->devices */
    s->num_decode_device_cameras = 0;
    if (r == 0) {
        if (!(l->wanted = vf_calloc(l->spec->num_episodes ? l->spec->num_episodes : 1, 1)))
            r = VF_ENOMEM;
        else if (s->table_cache_bytes > 0)
            l->spec->rows_max_bytes = s->table_cache_bytes;
        l->spec->tdisk_mode = s->table_disk_cache < 0 ? -1 : s->table_disk_cache > 0;
        l->spec->share_readers = s->share_video_readers != 0; /* -1 (default) and 1: assemble.c run_group */
    }
    if (r == 0 && s->num_cpus > 0)
        r = pin_to(l, s);
    if (s->threads > 0)
        l->nthreads = s->threads;
    else /* one per pinned CPU, else one per online core */
        l->nthreads = l->num_cpus > 0 ? (int)VF_MIN(l->num_cpus, (size_t)1024) : vf_cpu_count();
    if (l->nthreads < 1)
        l->nthreads = 1;
    l->decode_threads = s->decode_threads > 0 ? s->decode_threads
                                              : vf_engine_decode_threads(l->num_cpus, l->nthreads);
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
        l->cache_capacity = vf_engine_cache_entries(s, vf_dataset_num_cameras(dataset), files, l->nthreads);
        cs.max_entries = l->cache_capacity;
        cs.video.decode_threads = l->decode_threads;
        /* Map mode reads random positions: cut the reorder delay of each
         * call's last target instead of decoding past it, and skip the
         * non-reference pictures before a target (reader.c). */
        cs.video.early_drain = s->mode == VF_MODE_MAP;
        cs.video.skip_nonref = s->mode == VF_MODE_MAP;
        vf_engine_devices_configure(l->devices, &cs);
        l->opener.dataset = dataset;
        if (s->prefetch_cache_dir && s->prefetch_cache_bytes > 0 && s->mode == VF_MODE_POOL) {
            r = vf_file_cache_open(&l->file_cache, s->prefetch_cache_dir, s->prefetch_cache_bytes);
            l->opener.file_cache = l->file_cache;
            l->user_hooks = s->pool_hooks;
            s->pool_hooks = (vf_pool_hooks){vf_engine_prefetch_admit, vf_engine_prefetch_evict, l};
        }
        s->prefetch_cache_dir = NULL; /* not kept: the cache has its own copy */
        cs.open_source = vf_ds_opener_open;
        cs.open_source_ctx = &l->opener;
        if (r == 0)
            r = vf_video_cache_open(&l->cache, &cs);
    }
    if (r == 0 && (r = vf_thread_pool_create_pinned(&l->threads, l->nthreads, l->cpus, l->num_cpus)) == 0)
        watch_on_engine_threads(l);
    if (r == 0)
        r = vf_queue_create(&l->done, l->window + 1);
    if (r == 0 && !(l->stash = vf_calloc(l->window, sizeof *l->stash)))
        r = VF_ENOMEM;
    if (r == 0)
        r = vf_engine_make_tasks(dataset, s->mode, s->partition, (size_t)s->world_size * (size_t)s->num_consumers,
                                 &l->tasks, &l->num_tasks);
    if (r == 0)
        l->selection = vf_engine_selection_hash(dataset);
    l->epoch = s->epoch;
    if (r == 0 && have_resume &&
        (r = vf_engine_resolve_state(s, dataset, l->spec->num_positions, l->selection, l->tasks, l->num_tasks, &resume,
                                     &l->resumed)) == 0)
        l->epoch = resume.epoch;
    if (r == 0)
        r = vf_engine_plan_epoch(l, l->resumed.batches);
    if (r == 0 && s->mode != VF_MODE_MAP)
        r = vf_engine_start(l);
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
    vf_engine_drain(l);
    vf_engine_evict_all(l);
    l->epoch = epoch;
    int r = vf_engine_plan_epoch(l, resume_batch);
    if (r < 0)
        return r;
    l->started = 0;
    if (l->settings.mode != VF_MODE_MAP)
        return vf_engine_start(l);
    return 0;
}

int vf_loader_set_state(vf_loader *l, const vf_loader_state *state)
{
    int r = check_process(l);
    if (r < 0)
        return r;
    vf_engine_resume res;
    if ((r = vf_engine_resolve_state(&l->settings, l->dataset, l->spec->num_positions, l->selection, l->tasks,
                                     l->num_tasks, state, &res)) < 0)
        return r;
    vf_engine_resume_free(&l->resumed);
    l->resumed = res;
    return restart(l, state->epoch, res.batches);
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
    vf_engine_state_from_settings(s, l->dataset, l->spec->num_positions, l->selection, out);
    vf_engine_resume_to_state(&l->resumed, out);
    out->settings_hash = vf_engine_state_hash(out);
    int64_t rn = vf_plan_ranges_samples(l->resumed.ranges, l->resumed.num_ranges, l->spec->num_positions);
    int64_t per_rank = vf_plan_samples_after(rn, s->world_size, s->num_consumers, s->batch_size, s->drop_last, k);
    if (per_rank < 0)
        return vf_error(VF_EINVAL, "loader: %lld batches delivered is past the epoch", (long long)k);
    out->epoch = l->epoch;
    out->samples_consumed = per_rank * s->world_size;
    return 0;
}

size_t vf_loader_num_warnings(const vf_loader *l) { return l->num_warnings; }
const char *vf_loader_warning(const vf_loader *l, size_t i) { return i < l->num_warnings ? l->warnings[i] : NULL; }
int vf_loader_warning_is_global(const vf_loader *l, size_t i) { return i < l->num_warnings && l->warning_global[i]; }

int vf_loader_set_epoch(vf_loader *l, int64_t epoch)
{
    int r = check_process(l);
    if (r < 0)
        return r;
    if (epoch == l->epoch && l->next_deliver == l->start_batch)
        return 0; /* that epoch (or its resumed part) has delivered nothing yet: keep what is being built */
    vf_engine_resume_free(&l->resumed); /* a new epoch covers its whole global order */
    return restart(l, epoch, 0);
}

/* Moves a delivered job's skip records to the loader (they pass to it, or
 * are dropped beyond VF_ENGINE_MAX_SKIP_RECORDS). */
static void take_skips(vf_loader *l, vf_engine_job *j)
{
    l->skipped += j->num_skips;
    size_t room = l->num_skips < VF_ENGINE_MAX_SKIP_RECORDS ? VF_ENGINE_MAX_SKIP_RECORDS - l->num_skips : 0;
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
        vf_engine_free_skip(&j->skips[i]);
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

/* Refuses work after vf_loader_cancel. */
static int check_not_cancelled(vf_loader *l)
{
    if (vf_io_cancel_requested(&l->io_cancel))
        return vf_error(VF_EIO, "loader: cancelled (vf_loader_cancel, or close from another thread)");
    return 0;
}

static int next_batch(vf_loader *l, vf_batch **out)
{
    *out = NULL;
    int r = check_process(l);
    if (r == 0)
        r = check_not_cancelled(l);
    if (r < 0)
        return r;
    if (l->next_deliver >= l->plan.num_batches)
        return VF_EOF;
    if (!l->started && (r = vf_engine_start(l)) < 0)
        return r;
    size_t want = l->next_deliver;
    vf_engine_job *j = l->stash[want % l->window];
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
        vf_engine_job *got = item;
        l->in_flight--;
        if (got->seq == want) {
            j = got;
        } else {
            vf_engine_free_job(l->stash[got->seq % l->window]);
            l->stash[got->seq % l->window] = got;
        }
    }
    if (l->stash[want % l->window] == j)
        l->stash[want % l->window] = NULL;
    double now = vf_now_seconds();
    if (waited_from) {
        l->wait_seconds += now - waited_from;
        if (l->first_handout_at > 0)
            l->wait_after_first += now - waited_from;
    }
    l->next_deliver++;
    int rc = j->rc;
    vf_batch *b = j->batch;
    double ready_at = j->done_at;
    j->batch = NULL;
    if (rc < 0)
        vf_error(rc, "%s", j->message ? j->message : "batch assembly failed");
    else
        take_skips(l, j);
    vf_engine_free_job(j);
    vf_engine_take_notes(l);
    if (rc == 0) {
        if (!l->have_first) {
            l->have_first = 1;
            l->first_batch_seconds = ready_at - l->started_at; /* ready, whenever the caller asked */
        }
        l->samples += b->size;
        l->batches += b->size > 0; /* a batch whose samples were all skipped is not delivered */
        if (l->first_handout_at == 0)
            l->first_handout_at = now;
        l->last_handout_at = now;
        if (l->seg_state)
            vf_engine_evict_until(l, want);
    }
    r = vf_engine_submit_more(l);
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
    if (r == 0)
        r = check_not_cancelled(l);
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
    vf_io_cancel *outer = vf_io_cancel_watch(&l->io_cancel); /* this thread assembles too */
    r = vf_sample_assemble(l->spec, l->cache, &l->counters, b->positions, count, &dest, &par);
    vf_io_cancel_watch(outer);
    vf_engine_take_notes(l);
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
    st->table_disk_episodes = sp->table_disk_episodes;
    st->table_disk_builds = sp->table_disk_builds;
    st->table_disk_files = sp->table_disk_files;
    st->table_disk_bytes = sp->table_disk_bytes;
    pthread_mutex_unlock(&sp->rows_lock);
    if (sp->data_files) {
        vf_ds_pq_cache_stats fs;
        vf_ds_pq_cache_get_stats(sp->data_files, &fs);
        st->table_files_opened = fs.misses;
        st->table_file_evictions = fs.evictions;
        st->table_file_trims = fs.trims;
        st->table_files_open = fs.entries;
        st->table_files_bytes = fs.bytes;
    }
    st->pinned_cpus = l->num_cpus;
    st->engine_threads = l->nthreads;
    st->decode_threads = l->decode_threads;
    st->handout_seconds = l->first_handout_at > 0 ? l->last_handout_at - l->first_handout_at : 0.0;
    st->wait_after_first_seconds = l->wait_after_first;
}

