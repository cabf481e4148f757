/*
 * loader_produce.c: the loader's production side. A job assembles one
 * batch on an engine thread into a pooled buffer and returns it through the
 * done queue (never blocking: the queue holds window + 1). The caller's
 * thread submits jobs up to `window` batches ahead of delivery, plans each
 * epoch and, in pool mode, admits and evicts the plan's episode segments.
 *
 * on_error = SKIP: a batch that fails as a whole is assembled again one
 * sample at a time; the samples that fail are recorded in the job and left
 * out, the others keep their order.
 *
 * Pool mode: on_admit fires for a segment just before the first batch
 * drawing from it is submitted, on_evict once the caller received the last
 * one (seg_state tracks each segment: 0 pending, 1 admitted, 2 evicted or
 * skipped), and abandoning an epoch evicts whatever is still admitted, so
 * admits and evicts always pair.
 */
#include "engine/loader_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- production ------------------------------------------------------------------- */

void vf_engine_free_skip(vf_loader_skip *k)
{
    free((char *)k->file);
    free((char *)k->column);
    free((char *)k->message);
}

void vf_engine_free_job(vf_engine_job *j)
{
    if (!j)
        return;
    vf_batch_release(j->batch);
    free(j->message);
    for (size_t i = 0; i < j->num_skips; i++)
        vf_engine_free_skip(&j->skips[i]);
    free(j->skips);
    free(j);
}

/* on_error = SKIP, after the batch failed as a whole: assembles its samples
 * one at a time, keeping those that succeed (compacted to the front, in
 * order) and recording the others in the job. Fails only on out of memory. */
static int assemble_skipping(vf_loader *l, vf_engine_job *j, size_t n, vf_sample_dest *dest)
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
    vf_engine_job *j = arg;
    vf_loader *l = j->loader;
    if (atomic_load(&l->cancel)) {
        j->rc = VF_EOF;
    } else {
        size_t lo = (size_t)l->plan.batch_start[j->seq], hi = (size_t)l->plan.batch_start[j->seq + 1];
        size_t n = hi - lo;
        double t0 = vf_now_seconds();
        int r = vf_engine_batch_acquire(l->core, n, &j->batch);
        if (r == 0) {
            vf_plan_epoch_batch_positions(&l->plan, j->seq, j->batch->positions);
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
    if (vf_queue_push(l->done, j) < 0)
        vf_engine_free_job(j);
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
void vf_engine_prefetch_admit(void *ctx, const vf_pool_event *event)
{
    vf_loader *l = ctx;
    if (vf_prefetch_on_admit(l->file_cache, l->dataset, event->episode) < 0)
        vf_log(VF_LOG_WARN, "prefetch: %s", vf_last_error());
    if (l->user_hooks.on_admit)
        l->user_hooks.on_admit(l->user_hooks.ctx, event);
}

void vf_engine_prefetch_evict(void *ctx, const vf_pool_event *event)
{
    vf_loader *l = ctx;
    if (l->user_hooks.on_evict)
        l->user_hooks.on_evict(l->user_hooks.ctx, event);
    vf_prefetch_on_evict(l->file_cache, l->dataset, event->episode);
}

/* Runs one of the caller's pool hooks (none when it is NULL) on segment i. */
static void run_pool_hook(const vf_loader *l, size_t i, void (*hook)(void *ctx, const vf_pool_event *event))
{
    if (!hook)
        return;
    vf_pool_event ev;
    pool_event(l, &l->plan.segments[i], &ev);
    hook(l->settings.pool_hooks.ctx, &ev);
}

static void admit_segment(vf_loader *l, size_t i)
{
    l->seg_state[i] = 1;
    l->live_segments++;
    l->admitted++;
    run_pool_hook(l, i, l->settings.pool_hooks.on_admit);
}

static void evict_segment(vf_loader *l, size_t i)
{
    l->seg_state[i] = 2;
    l->live_segments--;
    l->evicted++;
    run_pool_hook(l, i, l->settings.pool_hooks.on_evict);
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
void vf_engine_evict_until(vf_loader *l, size_t batch)
{
    while (l->evict_next < l->plan.num_segments &&
           (size_t)l->plan.segments[l->evict_order[l->evict_next]].evict_batch <= batch) {
        size_t i = l->evict_order[l->evict_next++];
        if (l->seg_state[i] == 1)
            evict_segment(l, i);
    }
}

/* Evicts everything still admitted (the epoch is abandoned or over). */
void vf_engine_evict_all(vf_loader *l)
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

int vf_engine_submit_more(vf_loader *l)
{
    while (l->next_submit < l->plan.num_batches && l->next_submit < l->next_deliver + l->window) {
        if (l->seg_state)
            admit_until(l, l->next_submit);
        vf_engine_job *j = vf_calloc(1, sizeof *j);
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
void vf_engine_drain(vf_loader *l)
{
    atomic_store(&l->cancel, 1);
    vf_thread_pool_wait(l->threads);
    void *item;
    while (vf_queue_try_pop(l->done, &item) == 0)
        vf_engine_free_job(item);
    for (size_t i = 0; i < l->window; i++) {
        vf_engine_free_job(l->stash[i]);
        l->stash[i] = NULL;
    }
    l->in_flight = 0;
    atomic_store(&l->cancel, 0);
}

/* Keeps a warning once per loader for vf_loader_warning, and prints it
 * unless the caller reports warnings itself (log_warnings = 0). A global
 * warning (the same text on every rank) is printed by rank 0 only. */
static void warn_once(vf_loader *l, int global, char *message)
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
    unsigned char *scopes = realloc(l->warning_global, l->num_warnings + 1);
    if (!scopes) {
        free(message);
        return;
    }
    l->warning_global = scopes;
    l->warning_global[l->num_warnings] = (unsigned char)(global != 0);
    l->warnings[l->num_warnings++] = message;
    if (l->settings.log_warnings && (!global || l->settings.rank == 0))
        vf_log(VF_LOG_WARN, "%s", message);
}

void vf_engine_take_notes(vf_loader *l)
{
    vf_sample_spec *s = l->spec;
    pthread_mutex_lock(&s->notes_lock);
    for (; l->notes_taken < s->num_notes; l->notes_taken++)
        warn_once(l, s->notes[l->notes_taken].global, vf_strdup(s->notes[l->notes_taken].text));
    pthread_mutex_unlock(&s->notes_lock);
}

static void remainder_warnings(vf_loader *l)
{
    const vf_loader_settings *s = &l->settings;
    const vf_plan_epoch *p = &l->plan;
    int64_t n = p->epoch_samples, per = p->rank_samples, w = s->world_size, bs = (int64_t)s->batch_size;
    int64_t kept = per / bs * bs;
    if (s->drop_last && n - kept * w > 0) {
        warn_once(l, 1, vf_asprintf("loader: drop_last drops %lld of the %lld samples of an epoch: every rank keeps "
                                 "%lld whole batches of %lld (%lld of its %lld samples), over %d rank%s",
                                 (long long)(n - kept * w), (long long)n, (long long)(kept / bs), (long long)bs,
                                 (long long)kept, (long long)per, s->world_size, s->world_size == 1 ? "" : "s"));
    } else if (w > 1 && n % w != 0 && !s->drop_last) {
        warn_once(l, 1, vf_asprintf("loader: world_size %d does not divide the %lld samples of an epoch: every rank "
                                 "gets %lld, and %lld samples are repeated to even the ranks out (the last "
                                 "rank's slice wraps around to the start of the epoch's order)",
                                 s->world_size, (long long)n, (long long)per, (long long)(per * w - n)));
    }
    if (p->empty_consumers > 0)
        warn_once(l, 0, vf_asprintf("loader: %d consumer%s of rank %d get%s no samples (%lld samples per rank over %d "
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
    if (l->settings.mode == VF_MODE_MAP) {
        /* Map mode draws random positions: reading ahead along a data file
         * would read rows the next batches do not need (and its positions
         * are evaluated per batch, not stored). */
        sp->wanted = NULL;
        pthread_mutex_unlock(&sp->rows_lock);
        return;
    }
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
    sp->wanted = l->wanted;
    pthread_mutex_unlock(&sp->rows_lock);
}

/* Plans the current epoch from rank-level batch resume_batch and resets
 * delivery there. */
int vf_engine_plan_epoch(vf_loader *l, int64_t resume_batch)
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
        .ranges = l->resumed.ranges,
        .num_ranges = l->resumed.num_ranges,
        .lazy_positions = s->mode == VF_MODE_MAP,
    };
    int r = vf_plan_epoch_build(&ps, l->spec->num_positions, s->mode == VF_MODE_MAP ? NULL : l->tasks, l->num_tasks,
                                &l->plan);
    if (r == 0)
        r = reset_segments(l);
    if (r == 0)
        mark_wanted(l);
    if (r == 0 && s->mode == VF_MODE_MAP) {
        /* rows.c: whether this loader's epoch touches most of the table */
        pthread_mutex_lock(&l->spec->rows_lock);
        l->spec->map_samples = l->plan.num_samples;
        pthread_mutex_unlock(&l->spec->rows_lock);
    }
    if (r < 0)
        return r;
    l->resume_base = s->consumer >= 0 ? resume_batch : 0;
    l->next_submit = l->next_deliver = l->start_batch = l->plan.first_batch;
    vf_engine_take_notes(l);
    remainder_warnings(l);
    return 0;
}

int vf_engine_start(vf_loader *l)
{
    l->started = 1;
    l->started_at = vf_now_seconds();
    l->have_first = 0;
    return vf_engine_submit_more(l);
}

