/*
 * loader.c: the shard loader. Batches of decoded columns from the shards of
 * a manifest, in an order computed from the manifest counts alone. This
 * file holds its life (open, close, epochs, resume) and the prefetch
 * thread; the consumers read their parts in loader_read.c and batches are
 * assembled in loader_batch.c.
 *
 * Order: the plan layer's stream mode with one task per non-empty shard
 * (vf_plan_epoch_build): shards in a seeded permutation per epoch, each
 * shard's samples in tar order, the rank and consumer split of the
 * remainder rule, each consumer's part reordered by the bounded shuffle
 * buffer (vf_plan_shuffle_buffer, seeded by seed, epoch, rank, consumer),
 * cut into batches, consumers' batches round-robin. The plan gives the
 * global sample indices ("positions": shard i holds the positions
 * [prefix_i, prefix_i + num_sequences_i)) of every batch, so nothing in the
 * order depends on decoding, threads or timing.
 *
 * Plan of an epoch: every piece of the rank's parts is indexed by its first
 * position (a rank's slice holds each position once, so pieces are
 * disjoint), and each consumer part gets the sorted list of positions it
 * still has to deliver from the first batch on (with repeats when wrap
 * padding delivers a position twice).
 *
 * Resume: a state names the epoch and the samples consumed; a state from
 * the same layout continues at its batch, one from another world size,
 * consumer count or batch size is converted into the ranges of the epoch
 * not yet delivered (elastic resume).
 *
 * Prefetch: with prefetch > 0 a producer thread assembles batches ahead
 * into a bounded queue; the first error or the epoch's end is returned
 * again on every later call.
 *
 * Open checks the manifest's counts before anything proportional to them
 * is allocated (vf_wds_manifest_check_counts: a local shard's size, the
 * max_manifest_samples budget) and opens each shard listed as empty, so a
 * count of 0 cannot silently drop a shard's samples.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wds/loader_internal.h"

typedef struct produced {
    vf_wds_batch *batch;
    int rc;
    char *message;
} produced;

static void stop_producer(vf_wds_loader *l);

void vf_wds_loader_defaults(vf_wds_loader_settings *s)
{
    memset(s, 0, sizeof *s);
    s->batch_size = 32;
    s->shuffle = 1;
    s->world_size = 1;
    s->num_consumers = 1;
    s->consumer = -1;
    s->shuffle_buffer = 1000;
    s->prefetch = 2;
    s->max_image_pixels = VF_WDS_DEFAULT_MAX_IMAGE_PIXELS;
    s->max_member_bytes = VF_WDS_DEFAULT_MAX_MEMBER_BYTES;
    s->max_sample_bytes = VF_WDS_DEFAULT_MAX_SAMPLE_BYTES;
    s->max_batch_bytes = VF_WDS_DEFAULT_MAX_BATCH_BYTES;
    s->max_manifest_samples = VF_WDS_DEFAULT_MAX_MANIFEST_SAMPLES;
    s->max_buffer_bytes = VF_WDS_DEFAULT_MAX_BUFFER_BYTES;
    vf_wds_manifest_settings ms;
    vf_wds_manifest_defaults(&ms); /* VF_WDS_ALLOW_OUTSIDE=1 in the environment opts in */
    s->allow_outside_base = ms.allow_outside_base;
}

void vf_wds_note_skip(vf_wds_loader *l, const char *message)
{
    if (l->num_skip_messages >= 64)
        return;
    char **grown = vf_realloc(l->skip_messages, (l->num_skip_messages + 1) * sizeof *grown);
    if (!grown)
        return;
    l->skip_messages = grown;
    char *copy = vf_strdup(message);
    if (copy)
        l->skip_messages[l->num_skip_messages++] = copy;
}

/* ---- plan ------------------------------------------------------------------------ */

typedef struct pieces_ctx {
    vf_wds_loader *l;
} pieces_ctx;

static int collect_pieces(void *ctx, int rank, int consumer_id, const vf_plan_piece *pieces, size_t count)
{
    (void)rank;
    vf_wds_loader *l = ((pieces_ctx *)ctx)->l;
    vf_wds_consumer *c = &l->consumers[consumer_id];
    c->pieces = vf_malloc_array(count ? count : 1, sizeof *pieces);
    c->piece_needed = vf_calloc(count ? count : 1, sizeof *c->piece_needed);
    if (!c->pieces || !c->piece_needed)
        return VF_ENOMEM;
    if (count) /* a consumer with no pieces gets pieces == NULL: memcpy must not see it */
        memcpy(c->pieces, pieces, count * sizeof *pieces);
    c->num_pieces = count;
    vf_wds_piece_ref *grown = vf_realloc(l->piece_index, (l->num_piece_index + count + 1) * sizeof *grown);
    if (!grown)
        return VF_ENOMEM;
    l->piece_index = grown;
    for (size_t i = 0; i < count; i++)
        l->piece_index[l->num_piece_index++] =
            (vf_wds_piece_ref){pieces[i].first_position, pieces[i].first_position + pieces[i].num_samples, consumer_id};
    return 0;
}

static void epoch_settings(const vf_wds_loader *l, int64_t epoch, int64_t resume_batch, vf_plan_epoch_settings *ps)
{
    memset(ps, 0, sizeof *ps);
    ps->seed = l->s.seed;
    ps->epoch = epoch;
    ps->shuffle = l->s.shuffle;
    ps->rank = l->s.rank;
    ps->world_size = l->s.world_size;
    ps->num_consumers = l->s.num_consumers;
    ps->consumer = l->s.consumer;
    ps->batch_size = l->s.batch_size;
    ps->drop_last = l->s.drop_last;
    ps->shuffle_buffer = l->s.shuffle ? l->s.shuffle_buffer : 0;
    ps->resume_batch = resume_batch;
    ps->ranges = l->ranges;
    ps->num_ranges = l->num_ranges;
}

static int cmp_piece_ref(const void *a, const void *b)
{
    int64_t x = ((const vf_wds_piece_ref *)a)->first, y = ((const vf_wds_piece_ref *)b)->first;
    return (x > y) - (x < y);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The part (consumer id) whose pieces hold position p, or -1. */
int vf_wds_owner_part(const vf_wds_loader *l, int64_t p)
{
    size_t lo = 0, hi = l->num_piece_index;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (l->piece_index[mid].first <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || p >= l->piece_index[lo - 1].end)
        return -1;
    return l->piece_index[lo - 1].part;
}

static void drop_plan(vf_wds_loader *l)
{
    free(l->piece_index);
    l->piece_index = NULL;
    l->num_piece_index = 0;
    vf_plan_epoch_free(&l->plan);
    memset(&l->plan, 0, sizeof l->plan);
    if (l->consumers)
        for (int i = 0; i < l->s.num_consumers; i++)
            vf_wds_consumer_reset(&l->consumers[i]);
    l->buffer_bytes = 0;
}

static int start_epoch(vf_wds_loader *l, int64_t epoch, int64_t resume_batch)
{
    drop_plan(l);
    free(l->failure);
    l->failure = NULL;
    vf_plan_epoch_settings ps;
    epoch_settings(l, epoch, resume_batch, &ps);
    int rc = vf_plan_epoch_build(&ps, l->num_positions, l->tasks, l->num_tasks, &l->plan);
    if (rc < 0)
        return rc;
    l->epoch = epoch;
    l->epoch_done = 0;
    l->next_batch = l->plan.first_batch;
    l->delivered = 0;
    l->terminal = 0;
    free(l->terminal_message);
    l->terminal_message = NULL;
    l->resume_base = l->s.consumer >= 0 ? resume_batch : 0;
    pieces_ctx ctx = {l};
    vf_plan_epoch_settings each = ps;
    each.consumer = -1; /* a resumed consumer loader serves batches of its rank's other parts too */
    if ((rc = vf_plan_each_consumer(&each, l->num_positions, l->tasks, l->num_tasks, collect_pieces, &ctx)) < 0)
        return rc;
    qsort(l->piece_index, l->num_piece_index, sizeof *l->piece_index, cmp_piece_ref);
    /* what each part still delivers */
    size_t *counts = vf_calloc((size_t)l->s.num_consumers, sizeof *counts);
    if (!counts)
        return VF_ENOMEM;
    for (int64_t k = l->plan.batch_start[l->plan.first_batch]; k < l->plan.batch_start[l->plan.num_batches]; k++) {
        int part = vf_wds_owner_part(l, l->plan.positions[k]);
        if (part < 0) {
            free(counts);
            return vf_error(VF_ECORRUPT, "wds loader: position %lld is in no part of this rank (internal)",
                            (long long)l->plan.positions[k]);
        }
        counts[part]++;
    }
    for (int ci = 0; ci < l->s.num_consumers; ci++) {
        vf_wds_consumer *c = &l->consumers[ci];
        c->needed = vf_malloc_array(counts[ci] ? counts[ci] : 1, sizeof *c->needed);
        if (!c->needed) {
            free(counts);
            return VF_ENOMEM;
        }
    }
    free(counts);
    for (int64_t k = l->plan.batch_start[l->plan.first_batch]; k < l->plan.batch_start[l->plan.num_batches]; k++) {
        vf_wds_consumer *c = &l->consumers[vf_wds_owner_part(l, l->plan.positions[k])];
        c->needed[c->num_needed++] = l->plan.positions[k];
    }
    for (int ci = 0; ci < l->s.num_consumers; ci++) {
        vf_wds_consumer *c = &l->consumers[ci];
        qsort(c->needed, c->num_needed, sizeof *c->needed, cmp_i64);
        for (size_t i = 0; i < c->num_pieces; i++) {
            const vf_plan_piece *pc = &c->pieces[i];
            for (int64_t p = pc->first_position; p < pc->first_position + pc->num_samples; p++)
                c->piece_needed[i] += (int64_t)vf_wds_needed_count(c, p);
        }
    }
    return 0;
}

/* ---- open / close ------------------------------------------------------------------ */

static int check_settings(const vf_wds_loader_settings *s)
{
    if (s->batch_size < 1)
        return vf_error(VF_EINVAL, "wds loader: batch_size must be >= 1");
    if (s->world_size < 1 || s->rank < 0 || s->rank >= s->world_size)
        return vf_error(VF_EINVAL, "wds loader: rank %d outside world_size %d", s->rank, s->world_size);
    if (s->num_consumers < 1 || s->consumer < -1 || s->consumer >= s->num_consumers)
        return vf_error(VF_EINVAL, "wds loader: consumer %d outside num_consumers %d", s->consumer, s->num_consumers);
    if (s->resize_width < 0 || s->resize_height < 0 || (!s->resize_width) != (!s->resize_height))
        return vf_error(VF_EINVAL, "wds loader: resize needs both width and height > 0");
    if (s->on_error != VF_WDS_RAISE && s->on_error != VF_WDS_SKIP)
        return vf_error(VF_EINVAL, "wds loader: on_error must be raise or skip");
    const struct {
        int64_t value;
        const char *name;
    } budgets[] = {{s->max_image_pixels, "max_image_pixels"},
                   {s->max_member_bytes, "max_member_bytes"},
                   {s->max_sample_bytes, "max_sample_bytes"},
                   {s->max_batch_bytes, "max_batch_bytes"},
                   {s->max_manifest_samples, "max_manifest_samples"},
                   {s->max_buffer_bytes, "max_buffer_bytes"}};
    for (size_t i = 0; i < VF_ARRAY_LEN(budgets); i++)
        if (budgets[i].value < 1)
            return vf_error(VF_EINVAL, "wds loader: %s must be >= 1 (it is %lld)", budgets[i].name,
                            (long long)budgets[i].value);
    return 0;
}

/* A shard the manifest says is empty is never read by the plan; one whose
 * tar holds samples would lose them silently. Each is opened and its first
 * sample looked for (its bytes skipped): found, it is an error naming the
 * shard (VF_WDS_RAISE), or under VF_WDS_SKIP a skipped shard, counted with
 * its message. A shard that cannot be opened or read has nothing to lose
 * here (a count above 0 would report it when read). */
static int check_empty_shards(vf_wds_loader *l)
{
    for (size_t i = 0; i < vf_wds_manifest_num_shards(l->manifest); i++) {
        if (vf_wds_manifest_shard_samples(l->manifest, i) != 0)
            continue;
        const char *url = vf_wds_manifest_shard_url(l->manifest, i);
        vf_wds_reader *r = NULL;
        const vf_wds_sample *smp = NULL;
        int rc = vf_wds_reader_open(&r, url);
        if (rc == 0)
            rc = vf_wds_reader_next(r, 0, &smp);
        char *msg = rc == 0 ? vf_asprintf("%s:%lld: shard %s has num_sequences 0 but its tar holds samples (first "
                                          "key %s): they would never be read; fix the count",
                                          vf_wds_manifest_path(l->manifest),
                                          (long long)vf_wds_manifest_shard_line(l->manifest, i), url, smp->key)
                            : NULL;
        vf_wds_reader_close(r);
        if (rc == VF_ENOMEM)
            return rc;
        if (rc < 0)
            continue;
        if (!msg)
            return VF_ENOMEM;
        if (l->s.on_error != VF_WDS_SKIP) {
            rc = vf_error(VF_ECORRUPT, "%s", msg);
            free(msg);
            return rc;
        }
        l->stats.skipped_shards++;
        vf_wds_note_skip(l, msg);
        free(msg);
    }
    return 0;
}

int vf_wds_loader_open(vf_wds_loader **out, const char *manifest, const vf_wds_loader_settings *settings)
{
    *out = NULL;
    int rc = check_settings(settings);
    if (rc < 0)
        return rc;
    vf_wds_loader *l = vf_calloc(1, sizeof *l);
    if (!l)
        return VF_ENOMEM;
    pthread_mutex_init(&l->work_lock, NULL);
    l->pid = getpid();
    l->s = *settings;
    l->s.resume = NULL;
    l->s.fields = NULL;
    vf_wds_manifest_settings ms;
    vf_wds_manifest_defaults(&ms);
    ms.allow_outside_base = settings->allow_outside_base;
    if ((rc = vf_wds_manifest_open_with(&l->manifest, manifest, &ms)) < 0)
        goto fail;
    /* before anything proportional to the counts is allocated */
    if ((rc = vf_wds_manifest_check_counts(l->manifest, settings->max_manifest_samples)) < 0 ||
        (rc = check_empty_shards(l)) < 0)
        goto fail;
    size_t ns = vf_wds_manifest_num_shards(l->manifest);
    l->tasks = vf_calloc(ns, sizeof *l->tasks);
    l->task_shard = vf_calloc(ns, sizeof *l->task_shard);
    l->consumers = vf_calloc((size_t)l->s.num_consumers, sizeof *l->consumers);
    if (!l->tasks || !l->task_shard || !l->consumers) {
        rc = VF_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < ns; i++) {
        int64_t n = vf_wds_manifest_shard_samples(l->manifest, i);
        if (n == 0)
            continue;
        l->tasks[l->num_tasks] = (vf_plan_task){.first_episode = l->num_tasks, .num_episodes = 1,
                                                .first_position = l->num_positions, .num_samples = n};
        l->task_shard[l->num_tasks++] = i;
        l->num_positions += n;
    }
    rc = settings->fields ? vf_wds_fields_from_setting(l, settings->fields) : vf_wds_fields_from_first_sample(l);
    if (rc < 0)
        goto fail;
    l->threads = settings->threads > 0 ? settings->threads : VF_MIN(4, vf_cpu_count());
    if (l->threads > 1 && (rc = vf_thread_pool_create(&l->pool, l->threads)) < 0)
        goto fail;
    if (settings->resume) {
        /* plan first so set_state can check against this loader */
        if ((rc = start_epoch(l, settings->resume->epoch, 0)) < 0 || (rc = vf_wds_loader_set_state(l, settings->resume)) < 0)
            goto fail;
    } else if ((rc = start_epoch(l, settings->epoch, 0)) < 0) {
        goto fail;
    }
    *out = l;
    return 0;
fail:
    vf_wds_loader_close(l);
    return rc;
}

void vf_wds_loader_cancel(vf_wds_loader *l)
{
    if (l)
        vf_io_cancel_request(&l->io_cancel);
}

void vf_wds_loader_close(vf_wds_loader *l)
{
    if (!l || l->pid != getpid())
        return; /* NULL, or a forked copy: its threads live in the parent only */
    vf_wds_loader_cancel(l); /* a producer riding out an outage stops at once */
    stop_producer(l);
    drop_plan(l);
    if (l->pool)
        vf_thread_pool_destroy(l->pool);
    free(l->consumers);
    for (size_t i = 0; i < l->num_fields; i++)
        free(l->field_suffix[i]);
    free(l->field_suffix);
    free(l->field_kind);
    for (size_t i = 0; i < l->num_skip_messages; i++)
        free(l->skip_messages[i]);
    free(l->skip_messages);
    free(l->failure);
    free(l->terminal_message);
    free(l->ranges);
    pthread_mutex_destroy(&l->work_lock);
    free(l->tasks);
    free(l->task_shard);
    vf_wds_manifest_close(l->manifest);
    free(l);
}

int64_t vf_wds_loader_num_samples(const vf_wds_loader *l)
{
    int64_t n = 0;
    for (size_t b = 0; b < l->plan.num_batches; b++)
        n += l->plan.batch_start[b + 1] - l->plan.batch_start[b];
    return n;
}

size_t vf_wds_loader_num_batches(const vf_wds_loader *l) { return l->plan.num_batches; }
const vf_wds_manifest *vf_wds_loader_manifest(const vf_wds_loader *l) { return l->manifest; }

int vf_wds_loader_set_epoch(vf_wds_loader *l, int64_t epoch)
{
    if (epoch < 0)
        return vf_error(VF_EINVAL, "wds loader: epoch must be >= 0");
    stop_producer(l);
    free(l->ranges);
    l->ranges = NULL;
    l->num_ranges = 0;
    return start_epoch(l, epoch, 0);
}

/* ---- resume ----------------------------------------------------------------------- */

static void state_from_loader(const vf_wds_loader *l, vf_loader_state *out)
{
    memset(out, 0, sizeof *out);
    out->version = VF_LOADER_STATE_VERSION;
    out->mode = VF_MODE_STREAM;
    out->fingerprint = vf_wds_manifest_fingerprint(l->manifest);
    out->selection = out->fingerprint;
    out->positions = l->num_positions;
    out->seed = l->s.seed;
    out->epoch = l->epoch;
    out->batch_size = (int64_t)l->s.batch_size;
    out->world_size = l->s.world_size;
    out->consumers = l->s.num_consumers;
    out->shuffle = l->s.shuffle;
    out->drop_last = l->s.drop_last;
    out->partition = VF_PARTITION_EPISODE;
    out->shuffle_buffer = l->s.shuffle ? (int64_t)l->s.shuffle_buffer : 0;
}

static int64_t rank_batches(const vf_wds_loader *l)
{
    int64_t delivered = (int64_t)l->delivered;
    if (l->s.consumer < 0)
        return (int64_t)l->plan.first_batch + delivered;
    if (l->s.num_consumers == 1)
        return l->resume_base + delivered;
    return -1;
}

size_t vf_wds_loader_batches_delivered(const vf_wds_loader *l)
{
    int64_t k = rank_batches(l);
    return k >= 0 ? (size_t)k : l->delivered;
}

int vf_wds_loader_get_state(const vf_wds_loader *l, vf_loader_state *out)
{
    int64_t k = rank_batches(l);
    if (k < 0)
        return vf_error(VF_EINVAL, "wds loader: consumer %d of %d cannot see its rank's progress; take the state "
                                   "where every consumer's batches arrive",
                        l->s.consumer, l->s.num_consumers);
    state_from_loader(l, out);
    out->ranges = l->ranges;
    out->num_ranges = l->num_ranges;
    int64_t rn = vf_plan_ranges_samples(l->ranges, l->num_ranges, l->num_positions);
    if (l->epoch_done)
        k = vf_plan_rank_batches(rn, l->s.world_size, l->s.num_consumers, l->s.batch_size, l->s.drop_last);
    int64_t per_rank = vf_plan_samples_after(rn, l->s.world_size, l->s.num_consumers, l->s.batch_size,
                                             l->s.drop_last, k);
    if (per_rank < 0)
        return vf_error(VF_EINVAL, "wds loader: %lld batches delivered is past the epoch", (long long)k);
    out->samples_consumed = per_rank * l->s.world_size;
    return 0;
}

int vf_wds_loader_state_at(const vf_wds_loader *l, int64_t batches, vf_loader_state *out)
{
    state_from_loader(l, out);
    out->ranges = l->ranges;
    out->num_ranges = l->num_ranges;
    int64_t rn = vf_plan_ranges_samples(l->ranges, l->num_ranges, l->num_positions);
    int64_t per_rank = vf_plan_samples_after(rn, l->s.world_size, l->s.num_consumers, l->s.batch_size,
                                             l->s.drop_last, batches);
    if (batches < 0)
        return vf_error(VF_EINVAL, "wds loader: batches %lld is negative", (long long)batches);
    if (per_rank < 0)
        return vf_error(VF_EINVAL, "wds loader: %lld batches is past the epoch", (long long)batches);
    out->samples_consumed = per_rank * l->s.world_size;
    return 0;
}

#define STATE_FIELD_CHECK(field, what)                                                                        \
    if (state->field != mine.field)                                                                          \
        return vf_error(VF_EINVAL, "wds loader: the state's %s (%lld) differs from this loader's (%lld)", what, \
                        (long long)state->field, (long long)mine.field);

int vf_wds_loader_set_state(vf_wds_loader *l, const vf_loader_state *state)
{
    vf_loader_state mine;
    state_from_loader(l, &mine);
    if (state->fingerprint != mine.fingerprint || state->positions != mine.positions)
        return vf_error(VF_EINVAL, "wds loader: the state comes from another manifest (shard names or counts differ): "
                                   "its fingerprint %llu and positions %lld, this manifest's %llu and %lld",
                        (unsigned long long)state->fingerprint, (long long)state->positions,
                        (unsigned long long)mine.fingerprint, (long long)mine.positions);
    STATE_FIELD_CHECK(mode, "mode");
    STATE_FIELD_CHECK(seed, "seed");
    STATE_FIELD_CHECK(shuffle, "shuffle");
    STATE_FIELD_CHECK(drop_last, "drop_last");
    STATE_FIELD_CHECK(shuffle_buffer, "shuffle_buffer");
    const struct {
        const char *name;
        int64_t value, min;
    } counts[] = {{"epoch", state->epoch, 0},           {"samples_consumed", state->samples_consumed, 0},
                  {"world_size", state->world_size, 1}, {"consumers", state->consumers, 1},
                  {"batch_size", state->batch_size, 1}};
    for (size_t i = 0; i < VF_ARRAY_LEN(counts); i++)
        if (counts[i].value < counts[i].min)
            return vf_error(VF_EINVAL, "wds loader: the state's %s is %lld (at least %lld)", counts[i].name,
                            (long long)counts[i].value, (long long)counts[i].min);
    if (state->samples_consumed % state->world_size)
        return vf_error(VF_EINVAL, "wds loader: the state's samples_consumed %lld is not a multiple of its world_size "
                                   "%lld",
                        (long long)state->samples_consumed, (long long)state->world_size);
    if (state->num_ranges && (!state->ranges || vf_plan_ranges_check(state->ranges, state->num_ranges,
                                                                     l->num_positions) < 0))
        return vf_error(VF_EINVAL, "wds loader: the state's ranges are invalid");
    int64_t rn = vf_plan_ranges_samples(state->ranges, state->num_ranges, l->num_positions);
    int64_t k = vf_plan_batches_at(rn, state->world_size, state->consumers, (size_t)state->batch_size,
                                   state->drop_last, state->samples_consumed / state->world_size);
    if (k < 0)
        return vf_error(VF_EINVAL, "wds loader: the state's samples_consumed %lld is not where a whole number of "
                                   "batches ends (batch_size %lld, world_size %lld x consumers %lld, %lld samples)",
                        (long long)state->samples_consumed, (long long)state->batch_size,
                        (long long)state->world_size, (long long)state->consumers, (long long)rn);
    int64_t *ranges = NULL;
    size_t nr = 0;
    int same = state->world_size == mine.world_size && state->consumers == mine.consumers &&
               state->batch_size == mine.batch_size;
    if (same && state->num_ranges) {
        ranges = vf_malloc_array(2 * state->num_ranges, sizeof *ranges);
        if (!ranges)
            return VF_ENOMEM;
        memcpy(ranges, state->ranges, 2 * state->num_ranges * sizeof *ranges);
        nr = state->num_ranges;
    } else if (!same) {
        /* elastic: replay what the state's layout had delivered, keep the rest */
        vf_plan_epoch_settings old;
        epoch_settings(l, state->epoch, 0, &old);
        old.world_size = state->world_size;
        old.num_consumers = state->consumers;
        old.batch_size = (size_t)state->batch_size;
        old.rank = 0;
        old.consumer = -1;
        old.ranges = state->ranges;
        old.num_ranges = state->num_ranges;
        int rc = vf_plan_remaining(&old, l->num_positions, l->tasks, l->num_tasks, k, &ranges, &nr);
        if (rc < 0)
            return rc;
        k = 0;
    }
    int nothing_left = !same && nr == 0;
    stop_producer(l);
    free(l->ranges);
    l->ranges = ranges;
    l->num_ranges = nr;
    int rc = start_epoch(l, state->epoch, k);
    if (rc == 0 && nothing_left) {
        l->next_batch = l->plan.num_batches;
        l->delivered = l->plan.num_batches - l->plan.first_batch;
        l->epoch_done = 1;
    }
    return rc;
}

/* ---- prefetch ------------------------------------------------------------------------ */

static void *producer_main(void *arg)
{
    vf_wds_loader *l = arg;
    for (;;) {
        produced *item = vf_calloc(1, sizeof *item);
        if (!item)
            break; /* the caller's pop then sees the queue closed */
        pthread_mutex_lock(&l->work_lock);
        item->rc = vf_wds_produce(l, &item->batch);
        pthread_mutex_unlock(&l->work_lock);
        if (item->rc < 0 && item->rc != VF_EOF)
            item->message = vf_strdup(vf_last_error());
        int last = item->rc < 0;
        if (vf_queue_push(l->queue, item) < 0) {
            vf_wds_batch_free(item->batch);
            free(item->message);
            free(item);
            break;
        }
        if (last)
            break;
    }
    vf_queue_close(l->queue);
    return NULL;
}

static int start_producer(vf_wds_loader *l)
{
    int rc = vf_queue_create(&l->queue, l->s.prefetch);
    if (rc < 0)
        return rc;
    if (pthread_create(&l->producer, NULL, producer_main, l) != 0) {
        vf_queue_destroy(l->queue);
        l->queue = NULL;
        return vf_error(VF_ENOMEM, "wds loader: cannot start the prefetch thread");
    }
    l->producer_running = 1;
    return 0;
}

/* Stops the producer (if any) and drops what it had prefetched. */
static void stop_producer(vf_wds_loader *l)
{
    if (!l->producer_running)
        return;
    vf_queue_close(l->queue);
    pthread_join(l->producer, NULL);
    void *item;
    while (vf_queue_pop(l->queue, &item) == 0) {
        produced *p = item;
        vf_wds_batch_free(p->batch);
        free(p->message);
        free(p);
    }
    vf_queue_destroy(l->queue);
    l->queue = NULL;
    l->producer_running = 0;
}

static int set_terminal(vf_wds_loader *l, int rc, const char *message)
{
    l->terminal = 1;
    l->terminal_rc = rc;
    free(l->terminal_message);
    l->terminal_message = message ? vf_strdup(message) : NULL;
    return rc == VF_EOF ? VF_EOF : vf_error(rc, "%s", message ? message : "wds loader: failed");
}

int vf_wds_loader_next(vf_wds_loader *l, vf_wds_batch **out)
{
    *out = NULL;
    if (l->pid != getpid())
        return vf_error(VF_EINVAL, "wds loader: opened in process %ld, it cannot be used after fork(); open a new "
                                   "loader in this process",
                        (long)l->pid);
    if (l->terminal)
        return l->terminal_rc == VF_EOF ? VF_EOF
                                        : vf_error(l->terminal_rc, "%s",
                                                   l->terminal_message ? l->terminal_message : "wds loader: failed");
    if (l->s.prefetch == 0) {
        int rc = vf_wds_produce(l, out);
        if (rc == 0)
            l->delivered++;
        return rc;
    }
    if (!l->producer_running) {
        int rc = start_producer(l);
        if (rc < 0)
            return rc;
    }
    void *item = NULL;
    if (vf_queue_pop(l->queue, &item) < 0)
        return set_terminal(l, VF_ENOMEM, "wds loader: the prefetch thread stopped (out of memory)");
    produced *p = item;
    int rc = p->rc;
    if (rc == 0) {
        *out = p->batch;
        l->delivered++;
    } else {
        rc = set_terminal(l, rc, p->message);
    }
    free(p->message);
    free(p);
    return rc;
}

void vf_wds_loader_stats(const vf_wds_loader *l, vf_wds_stats *out)
{
    vf_wds_loader *m = (vf_wds_loader *)l;
    pthread_mutex_lock(&m->work_lock);
    *out = l->stats;
    pthread_mutex_unlock(&m->work_lock);
}

size_t vf_wds_loader_num_skip_messages(const vf_wds_loader *l)
{
    vf_wds_loader *m = (vf_wds_loader *)l;
    pthread_mutex_lock(&m->work_lock);
    size_t n = l->num_skip_messages;
    pthread_mutex_unlock(&m->work_lock);
    return n;
}

const char *vf_wds_loader_skip_message(const vf_wds_loader *l, size_t i)
{
    vf_wds_loader *m = (vf_wds_loader *)l;
    pthread_mutex_lock(&m->work_lock);
    const char *msg = i < l->num_skip_messages ? l->skip_messages[i] : NULL;
    pthread_mutex_unlock(&m->work_lock);
    return msg;
}
