/*
 * loader_plan.c: what a loader's settings imply for a dataset, computed
 * without a running loader: the order-defining fields of a resume state
 * (with their hash), the checks and the elastic conversion of a state from
 * another layout (vf_loader_state_resolve, vf_loader_state_at,
 * vf_loader_state_batches), and the public task lists and MP4 open counts
 * (vf_plan_tasks, vf_plan_consumer_tasks, vf_plan_count_opens).
 *
 * Invariant: everything here is a pure function of (dataset, settings,
 * epoch, state), as the order itself is: the same inputs give the same
 * tasks, counts and states on every rank and in every process.
 */
#include "engine/loader_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- states ------------------------------------------------------------------------------ */

static uint64_t hash_u64(uint64_t h, uint64_t v) { return vf_mix64(h ^ (v + 0x9E3779B97F4A7C15ull)); }

uint64_t vf_engine_selection_hash(const vf_dataset *d)
{
    uint64_t h = 0x73656c656374ull;
    for (size_t i = 0; i < vf_dataset_num_episodes(d); i++) {
        const vf_episode *e = vf_dataset_episode(d, i);
        h = hash_u64(h, (uint64_t)e->episode_index);
        h = hash_u64(h, (uint64_t)e->length);
    }
    return h;
}

uint64_t vf_engine_state_hash(const vf_loader_state *st)
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
    if (st->num_generations > 0 && st->generations) {
        h = hash_u64(h, 0x67656e73ull ^ (uint64_t)st->num_generations);
        for (size_t i = 0; i < st->num_generations; i++) {
            const vf_loader_generation *g = &st->generations[i];
            const int64_t v[] = {g->world_size, g->consumers, g->batch_size, g->batches, g->remaining};
            for (size_t j = 0; j < VF_ARRAY_LEN(v); j++)
                h = hash_u64(h, (uint64_t)v[j]);
        }
    }
    return h;
}

/* The order-defining fields of a state for these (checked) settings; epoch
 * and samples_consumed are 0. Settings that do not affect the order of the
 * mode are recorded as 0. */
void vf_engine_state_from_settings(const vf_loader_settings *s, const vf_dataset *d, int64_t positions,
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
    st->settings_hash = vf_engine_state_hash(st);
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

/* The generations' own checks (their replay checks the rest). */
static int check_generations(const vf_loader_state *st)
{
    size_t n = st->num_generations;
    if (n == 0)
        return 0;
    if (st->version < 3)
        return vf_error(VF_EINVAL, "loader state: a version %u state has no generations", (unsigned)st->version);
    if (!st->generations)
        return vf_error(VF_EINVAL, "loader state: generations missing");
    if (n > VF_LOADER_MAX_GENERATIONS)
        return vf_error(VF_EINVAL, "loader state: %zu generations (elastic restores in one epoch); at most %d", n,
                        VF_LOADER_MAX_GENERATIONS);
    for (size_t i = 0; i < n; i++) {
        const vf_loader_generation *g = &st->generations[i];
        if (g->world_size < 1 || g->world_size > INT32_MAX || g->consumers < 1 || g->consumers > INT32_MAX ||
            g->batch_size < 1 || g->batches < 0 || g->remaining < 1 || g->remaining > st->positions)
            return vf_error(VF_EINVAL, "loader state: generations[%zu] (world_size %lld, consumers %lld, batch_size "
                                       "%lld, batches %lld, remaining %lld) is not a valid earlier run of an epoch of "
                                       "%lld samples",
                            i, (long long)g->world_size, (long long)g->consumers, (long long)g->batch_size,
                            (long long)g->batches, (long long)g->remaining, (long long)st->positions);
    }
    return 0;
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
    int r = check_generations(st);
    if (r < 0)
        return r;
    int64_t n = st->num_generations ? st->generations[st->num_generations - 1].remaining
                                    : vf_plan_ranges_samples(st->ranges, st->num_ranges, st->positions);
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
int vf_engine_make_tasks(const vf_dataset *d, vf_mode mode, vf_partition partition, size_t consumers,
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

void vf_engine_resume_free(vf_engine_resume *r)
{
    free(r->ranges);
    free(r->base);
    free(r->generations);
    memset(r, 0, sizeof *r);
}

void vf_engine_resume_to_state(const vf_engine_resume *r, vf_loader_state *st)
{
    st->num_ranges = r->num_base;
    st->ranges = r->base;
    st->num_generations = r->num_generations;
    st->generations = r->generations;
}

static int copy_i64(const int64_t *v, size_t n, int64_t **out)
{
    *out = NULL;
    if (n == 0)
        return 0;
    if (!(*out = vf_malloc_array(n, sizeof **out)))
        return VF_ENOMEM;
    memcpy(*out, v, n * sizeof **out);
    return 0;
}

/* What remains after one earlier run of the state's epoch: the run in the
 * state's order settings and the layout (world_size, consumers,
 * batch_size) that delivered `batches` rank-level batches of the set
 * `ranges` (NULL: the whole epoch). *out is newly allocated (NULL, 0 when
 * nothing remains). tasks: the loader's own partition (sequential
 * partitions are cut again for the run's consumers). */
static int replay_run(const vf_loader_settings *s, const vf_dataset *d, int64_t positions, const vf_plan_task *tasks,
                      size_t num_tasks, const vf_loader_state *st, int64_t world_size, int64_t consumers,
                      int64_t batch_size, int64_t batches, const int64_t *ranges, size_t num_ranges, int64_t **out,
                      size_t *num_out)
{
    vf_plan_task *old_tasks = NULL;
    size_t num_old = 0;
    const vf_plan_task *use = tasks;
    size_t use_n = num_tasks;
    int r = 0;
    if (s->mode == VF_MODE_STREAM && s->partition == VF_PARTITION_SEQUENTIAL) {
        /* Sequential tasks depend on the consumer count. */
        r = vf_engine_make_tasks(d, s->mode, s->partition, (size_t)world_size * (size_t)consumers, &old_tasks,
                                 &num_old);
        use = old_tasks;
        use_n = num_old;
    }
    vf_plan_epoch_settings old = {
        .seed = st->seed,
        .epoch = st->epoch,
        .shuffle = st->shuffle,
        .world_size = (int)world_size,
        .num_consumers = (int)consumers,
        .consumer = -1,
        .batch_size = (size_t)batch_size,
        .drop_last = st->drop_last,
        .shuffle_buffer = (size_t)st->shuffle_buffer,
        .pool_size = (size_t)st->episode_pool_size,
        .ranges = num_ranges ? ranges : NULL,
        .num_ranges = num_ranges,
    };
    if (r == 0)
        r = vf_plan_remaining(&old, positions, use, use_n, batches, out, num_out);
    free(old_tasks);
    return r;
}

/* Resolves a state for a loader with settings s (checked) over d: every
 * order difference is named. The state's generations are replayed from its
 * ranges (each run's delivered samples taken out) to the set its own run
 * served; a state from another world size, consumer count or batch size
 * (elastic resume) then also has its own run replayed, and becomes a new
 * generation. On success out->ranges (NULL for the whole epoch) and
 * out->batches (rank-level batches already delivered within them, in s's
 * layout) say where to continue, and out->base / out->generations are what
 * the continuing loader's states carry. tasks: s's own partition (NULL in
 * map mode). */
int vf_engine_resolve_state(const vf_loader_settings *s, const vf_dataset *d, int64_t positions, uint64_t selection,
                            const vf_plan_task *tasks, size_t num_tasks, const vf_loader_state *st,
                            vf_engine_resume *out)
{
    memset(out, 0, sizeof *out);
    if (st->version < 1 || st->version > VF_LOADER_STATE_VERSION)
        return vf_error(VF_EINVAL, "loader state: version %u is not supported (this vlafeed reads versions 1 to %d)",
                        (unsigned)st->version, VF_LOADER_STATE_VERSION);
    if (st->version == 1 && st->num_ranges > 0)
        return vf_error(VF_EINVAL, "loader state: a version 1 state has no ranges");
    if (st->version < 3 && st->num_generations > 0)
        return vf_error(VF_EINVAL, "loader state: a version %u state has no generations", (unsigned)st->version);
    if (st->settings_hash != vf_engine_state_hash(st))
        return vf_error(VF_EINVAL, "loader state: settings_hash does not match the state's fields (the state was "
                                   "edited or corrupted)");
    if (st->epoch < 0)
        return vf_error(VF_EINVAL, "loader state: epoch %lld is negative", (long long)st->epoch);
    vf_loader_state mine;
    vf_engine_state_from_settings(s, d, positions, selection, &mine);
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
    size_t ng = st->num_generations;
    int elastic = !(st->world_size == mine.world_size && st->consumers == mine.consumers &&
                    st->batch_size == mine.batch_size);
    if (elastic && ng >= VF_LOADER_MAX_GENERATIONS)
        return vf_error(VF_EINVAL, "loader state: already %zu elastic restores in epoch %lld (at most %d)", ng,
                        (long long)st->epoch, VF_LOADER_MAX_GENERATIONS);
    out->num_base = st->num_ranges;
    r = copy_i64(st->ranges, st->num_ranges, &out->base);
    if (r == 0 && (ng || elastic) &&
        !(out->generations = vf_malloc_array(ng + 1, sizeof *out->generations)))
        r = VF_ENOMEM;
    if (r == 0 && ng)
        memcpy(out->generations, st->generations, ng * sizeof *out->generations);
    out->num_generations = ng;
    /* The set the state's own run served: its ranges, less each generation's deliveries. */
    int64_t *cur = NULL;
    size_t ncur = st->num_ranges;
    if (r == 0)
        r = copy_i64(st->ranges, st->num_ranges, &cur);
    for (size_t i = 0; i < ng && r == 0; i++) {
        const vf_loader_generation *g = &st->generations[i];
        int64_t *next = NULL;
        size_t nn = 0;
        r = replay_run(s, d, positions, tasks, num_tasks, st, g->world_size, g->consumers, g->batch_size, g->batches,
                       cur, ncur, &next, &nn);
        free(cur);
        cur = next;
        ncur = nn;
        int64_t left = nn ? vf_plan_ranges_samples(cur, ncur, positions) : 0;
        if (r < 0)
            r = vf_error(r, "loader state: generations[%zu] (world_size %lld x %lld consumers, batch_size %lld): %s", i,
                         (long long)g->world_size, (long long)g->consumers, (long long)g->batch_size,
                         vf_last_error());
        else if (left != g->remaining)
            r = vf_error(VF_EINVAL, "loader state: generations[%zu] leaves %lld samples of epoch %lld, the state "
                                    "says %lld (the state was edited, or is not this dataset's)",
                         i, (long long)left, (long long)st->epoch, (long long)g->remaining);
    }
    if (r == 0 && !elastic) {
        out->ranges = cur;
        out->num_ranges = ncur;
        out->batches = k;
        return 0;
    }
    /* Elastic: replay the state's own run, keep what it had not delivered. */
    int64_t before = ncur ? vf_plan_ranges_samples(cur, ncur, positions) : positions;
    if (r == 0) {
        r = replay_run(s, d, positions, tasks, num_tasks, st, st->world_size, st->consumers, st->batch_size, k, cur,
                       ncur, &out->ranges, &out->num_ranges);
        if (r < 0)
            r = vf_error(r, "loader state: elastic resume from world_size %d x %d consumers: %s", (int)st->world_size,
                         (int)st->consumers, vf_last_error());
    }
    free(cur);
    if (r < 0) {
        vf_engine_resume_free(out);
        return r;
    }
    int64_t after = out->num_ranges ? vf_plan_ranges_samples(out->ranges, out->num_ranges, positions) : 0;
    if (out->num_ranges == 0) {
        /* Everything was delivered: continue at the end of the whole epoch. */
        vf_engine_resume_free(out);
        out->batches = vf_plan_rank_batches(positions, s->world_size, s->num_consumers, s->batch_size, s->drop_last);
    } else {
        out->generations[out->num_generations++] = (vf_loader_generation){
            .world_size = st->world_size,
            .consumers = st->consumers,
            .batch_size = st->batch_size,
            .batches = k,
            .remaining = after,
        };
    }
    vf_log(VF_LOG_INFO,
           "loader: elastic resume of epoch %lld: %lld of %lld samples delivered at world_size %d x %d consumers "
           "(batch %lld); %lld remain in %zu ranges for world_size %d x %d consumers (generation %zu)",
           (long long)st->epoch, (long long)(before - after), (long long)before, (int)st->world_size,
           (int)st->consumers, (long long)st->batch_size, (long long)after, out->num_ranges, s->world_size,
           s->num_consumers, out->num_generations);
    return 0;
}

int vf_loader_state_resolve(const vf_dataset *d, const vf_loader_settings *settings, const vf_loader_state *state,
                            vf_loader_state *out)
{
    memset(out, 0, sizeof *out);
    vf_loader_settings s = *settings;
    s.resume = NULL;
    int r = vf_engine_check_settings(&s);
    if (r < 0)
        return r;
    vf_plan_task *tasks = NULL;
    size_t nt = 0;
    if ((r = vf_engine_make_tasks(d, s.mode, s.partition, (size_t)s.world_size * (size_t)s.num_consumers, &tasks,
                                  &nt)) < 0)
        return r;
    int64_t n = total_positions(d);
    uint64_t sel = vf_engine_selection_hash(d);
    vf_engine_resume res;
    r = vf_engine_resolve_state(&s, d, n, sel, tasks, nt, state, &res);
    free(tasks);
    if (r < 0)
        return r;
    vf_engine_state_from_settings(&s, d, n, sel, out);
    out->epoch = state->epoch;
    vf_engine_resume_to_state(&res, out); /* the caller owns base and generations now */
    out->settings_hash = vf_engine_state_hash(out);
    int64_t rn = vf_plan_ranges_samples(res.ranges, res.num_ranges, n);
    int64_t batches = res.batches;
    free(res.ranges);
    int64_t per_rank = vf_plan_samples_after(rn, s.world_size, s.num_consumers, s.batch_size, s.drop_last, batches);
    out->samples_consumed = (per_rank > 0 ? per_rank : 0) * s.world_size;
    return 0;
}

int vf_loader_state_at(const vf_dataset *d, const vf_loader_settings *settings, int64_t epoch, int64_t batches,
                       vf_loader_state *out)
{
    memset(out, 0, sizeof *out);
    if (batches < 0)
        return vf_error(VF_ERANGE, "loader state: batches %lld is negative", (long long)batches);
    vf_loader_settings s = *settings;
    int r = vf_engine_check_settings(&s);
    if (r < 0)
        return r;
    int64_t n = total_positions(d);
    vf_engine_state_from_settings(&s, d, n, vf_engine_selection_hash(d), out);
    int64_t rn = n;
    const vf_loader_state *res = s.resume;
    if (res && res->epoch == epoch && (res->num_ranges > 0 || res->num_generations > 0)) {
        /* A generation that continues an elastic resume (a resolved state,
         * vf_loader_state_resolve): counts are within what it left. */
        if ((r = vf_plan_ranges_check(res->ranges, res->num_ranges, n)) < 0)
            return r;
        if (res->num_generations > 0 && (r = check_generations(res)) < 0)
            return r;
        out->num_ranges = res->num_ranges;
        out->ranges = res->ranges;
        out->num_generations = res->num_generations;
        out->generations = res->generations;
        out->settings_hash = vf_engine_state_hash(out);
        rn = res->num_generations ? res->generations[res->num_generations - 1].remaining
                                  : vf_plan_ranges_samples(out->ranges, out->num_ranges, n);
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
    vf_engine_resume resumed;  /* a resume state's remainder (owned) */
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

static int cmp_size_t(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* One file access of a consumer's simulated decoder cache (LRU with the
 * loader's capacity): 1 when it opens the file. */
static int lru_touch(task_walk *w, size_t key, size_t *used, uint64_t *clock)
{
    size_t hit = SIZE_MAX, oldest = 0;
    ++*clock;
    for (size_t k = 0; k < *used; k++) {
        if (w->lru_key[k] == key)
            hit = k;
        if (w->lru_time[k] < w->lru_time[oldest])
            oldest = k;
    }
    if (hit != SIZE_MAX) {
        w->lru_time[hit] = *clock;
        return 0;
    }
    size_t slot = *used < w->lru_cap ? (*used)++ : oldest;
    w->lru_key[slot] = key;
    w->lru_time[slot] = *clock;
    return 1;
}

/* The MP4 opens of one consumer: its episodes in the order the loader
 * reads them (stream: its part's order; pool: admission order, which is
 * position order, see src/plan/pool.c) through the simulated decoder cache,
 * each (episode, camera) one access. A run uses one reader per file shared
 * by its engine threads (src/sample/assemble.c), so this is the count at
 * any thread count while the cache holds the working set. The lower bound
 * is the distinct files of the consumer's share. */
static int count_consumer_opens(void *ctx, int rank, int consumer, const vf_plan_piece *p, size_t n)
{
    (void)rank;
    (void)consumer;
    task_walk *w = ctx;
    size_t nc = vf_dataset_num_cameras(w->d);
    int64_t samples = 0;
    size_t num_eps = 0;
    for (size_t i = 0; i < n; i++) {
        samples += p[i].num_samples;
        num_eps += episode_at(w, p[i].first_position + p[i].num_samples - 1) - episode_at(w, p[i].first_position) + 1;
    }
    size_t *eps = vf_malloc_array(num_eps ? num_eps : 1, sizeof *eps);
    size_t *keys = vf_malloc_array(num_eps * nc > 0 ? num_eps * nc : 1, sizeof *keys);
    if (!eps || !keys) {
        free(eps);
        free(keys);
        return VF_ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t e1 = episode_at(w, p[i].first_position + p[i].num_samples - 1);
        for (size_t e = episode_at(w, p[i].first_position); e <= e1; e++)
            eps[k++] = e;
    }
    if (w->s.mode == VF_MODE_POOL && w->s.shuffle)
        qsort(eps, k, sizeof *eps, cmp_size_t);
    size_t used = 0, opens = 0, nk = 0;
    uint64_t clock = 0;
    int r = 0;
    for (size_t i = 0; i < k && r == 0; i++)
        for (size_t c = 0; c < nc; c++) {
            vf_video_span vs;
            if ((r = vf_dataset_episode_video(w->d, eps[i], c, &vs)) < 0)
                break;
            size_t key = w->file_base[c] + vs.file;
            keys[nk++] = key;
            opens += (size_t)lru_touch(w, key, &used, &clock);
        }
    size_t distinct = 0;
    if (r == 0) {
        qsort(keys, nk, sizeof *keys, cmp_size_t);
        for (size_t i = 0; i < nk; i++)
            distinct += i == 0 || keys[i] != keys[i - 1];
    }
    free(eps);
    free(keys);
    if (r < 0)
        return r;
    w->opens->consumer_opens += opens;
    w->opens->lower_bound += distinct;
    w->opens->samples += samples;
    return 0;
}

/* Map mode: every consumer's epoch order (vf_plan_epoch_build, O(its
 * samples)), batch by batch as the engine assembles one: the batch's
 * distinct files in file order (src/sample/assemble.c runs its file groups
 * sorted by file), each one access of the simulated cache. */
static int count_map_opens(task_walk *w)
{
    size_t nc = vf_dataset_num_cameras(w->d);
    int r = 0;
    for (int rank = 0; rank < w->s.world_size && r == 0; rank++)
        for (int c = 0; c < w->s.num_consumers && r == 0; c++) {
            vf_plan_epoch_settings ps = w->ps;
            ps.rank = rank;
            ps.consumer = c;
            vf_plan_epoch ep;
            if ((r = vf_plan_epoch_build(&ps, w->ep_start[w->num_episodes], NULL, 0, &ep)) < 0)
                break;
            size_t max_batch = 0;
            for (size_t b = 0; b < ep.num_batches; b++)
                max_batch = VF_MAX(max_batch, (size_t)(ep.batch_start[b + 1] - ep.batch_start[b]));
            size_t *keys = vf_malloc_array(max_batch * nc > 0 ? max_batch * nc : 1, sizeof *keys);
            size_t *all = vf_malloc_array(ep.num_samples * (int64_t)nc > 0 ? (size_t)ep.num_samples * nc : 1,
                                          sizeof *all);
            if (!keys || !all)
                r = VF_ENOMEM;
            size_t used = 0, opens = 0, na = 0;
            uint64_t clock = 0;
            for (size_t b = 0; b < ep.num_batches && r == 0; b++) {
                size_t nk = 0;
                for (int64_t i = ep.batch_start[b]; i < ep.batch_start[b + 1] && r == 0; i++) {
                    size_t e = episode_at(w, ep.positions[i]);
                    for (size_t cam = 0; cam < nc; cam++) {
                        vf_video_span vs;
                        if ((r = vf_dataset_episode_video(w->d, e, cam, &vs)) < 0)
                            break;
                        keys[nk++] = w->file_base[cam] + vs.file;
                    }
                }
                qsort(keys, nk, sizeof *keys, cmp_size_t);
                for (size_t i = 0; i < nk; i++)
                    if (i == 0 || keys[i] != keys[i - 1]) {
                        opens += (size_t)lru_touch(w, keys[i], &used, &clock);
                        all[na++] = keys[i];
                    }
            }
            size_t distinct = 0;
            if (r == 0) {
                qsort(all, na, sizeof *all, cmp_size_t);
                for (size_t i = 0; i < na; i++)
                    distinct += i == 0 || all[i] != all[i - 1];
                w->opens->consumer_opens += opens;
                w->opens->lower_bound += distinct;
                w->opens->samples += ep.num_samples;
            }
            free(keys);
            free(all);
            vf_plan_epoch_free(&ep);
        }
    return r;
}

static void walk_free(task_walk *w)
{
    free(w->tasks);
    vf_engine_resume_free(&w->resumed);
    free(w->ep_start);
    free(w->file_base);
}

/* The walk over a dataset's consumers for these settings: checked
 * settings, tasks, plan settings (with the remaining ranges of a resolved
 * resume state of that epoch). */
static int walk_setup(const vf_dataset *d, const vf_loader_settings *settings, int64_t epoch, int allow_map,
                      task_walk *w)
{
    memset(w, 0, sizeof *w);
    w->s = *settings;
    vf_loader_settings *s = &w->s;
    const vf_loader_state *resume = s->resume;
    s->resume = NULL;
    int r = vf_engine_check_settings(s);
    if (r == 0 && s->mode == VF_MODE_MAP && !allow_map)
        r = vf_error(VF_EINVAL, "plan: map mode has no tasks (its samples are random positions); use mode "
                                "'stream' or 'pool'");
    if (r == 0)
        r = vf_engine_make_tasks(d, s->mode, s->partition, (size_t)s->world_size * (size_t)s->num_consumers, &w->tasks,
                                 &w->num_tasks);
    int64_t n = total_positions(d);
    if (r == 0 && resume && resume->epoch == epoch)
        r = vf_engine_resolve_state(s, d, n, vf_engine_selection_hash(d), w->tasks, w->num_tasks, resume, &w->resumed);
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
        .ranges = w->resumed.ranges,
        .num_ranges = w->resumed.num_ranges,
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
    int r = walk_setup(d, settings, epoch, 0, &w);
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
    int r = walk_setup(d, settings, epoch, 1, &w);
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
    /* One consumer per loader (a DataLoader worker); any thread count. */
    vf_loader_settings one = w.s;
    one.consumer = 0;
    w.lru_cap = vf_engine_cache_entries(&one, nc, out->distinct_files, 1);
    w.lru_cap = w.lru_cap < 1 ? 1 : w.lru_cap > 128 ? 128 : w.lru_cap;
    out->cache_entries = w.lru_cap;
    if (r == 0 && w.s.mode != VF_MODE_MAP) {
        vf_plan_input in;
        r = vf_plan_input_from_dataset(d, &in);
        if (r == 0) {
            out->task_opens = vf_plan_video_opens(&in, w.tasks, w.num_tasks);
            vf_plan_input_free(&in);
        }
    }
    w.opens = out;
    if (r == 0 && w.s.mode == VF_MODE_MAP)
        r = count_map_opens(&w);
    else if (r == 0)
        r = vf_plan_each_consumer(&w.ps, w.ep_start[w.num_episodes], w.tasks, w.num_tasks, count_consumer_opens,
                                  &w);
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
    int r = vf_engine_make_tasks(d, VF_MODE_STREAM, partition, (size_t)world_size * (size_t)num_consumers, &tasks, &nt);
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
