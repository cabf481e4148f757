/*
 * plan.c: partitions, epoch order, rank/consumer split, shuffle buffer,
 * batching and the resume selection (see plan.h for the rules; the pool's
 * draws are in pool.c). Pure functions of their inputs.
 */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

/* ---- input ----------------------------------------------------------------------- */

void vf_plan_input_free(vf_plan_input *in)
{
    if (!in)
        return;
    free(in->lengths);
    free(in->video_files);
    free(in->data_files);
    memset(in, 0, sizeof *in);
}

int vf_plan_input_from_dataset(const vf_dataset *d, vf_plan_input *in)
{
    memset(in, 0, sizeof *in);
    size_t n = vf_dataset_num_episodes(d), nc = vf_dataset_num_cameras(d);
    in->num_episodes = n;
    in->num_cameras = nc;
    in->lengths = vf_malloc_array(n ? n : 1, sizeof *in->lengths);
    in->data_files = vf_malloc_array(n ? n : 1, sizeof *in->data_files);
    in->video_files = vf_malloc_array(n * nc > 0 ? n * nc : 1, sizeof *in->video_files);
    if (!in->lengths || !in->data_files || !in->video_files) {
        vf_plan_input_free(in);
        return VF_ENOMEM;
    }
    for (size_t e = 0; e < n; e++) {
        in->lengths[e] = vf_dataset_episode(d, e)->length;
        vf_data_span ds;
        int r = vf_dataset_episode_data(d, e, &ds);
        in->data_files[e] = r == 0 ? (int64_t)ds.file : -1;
        for (size_t c = 0; c < nc; c++) {
            vf_video_span vs;
            r = vf_dataset_episode_video(d, e, c, &vs);
            if (r < 0) {
                vf_plan_input_free(in);
                return r;
            }
            in->video_files[e * nc + c] = (int64_t)vs.file;
        }
    }
    return 0;
}

/* ---- partitions ------------------------------------------------------------------ */

const char *vf_plan_partition_name(vf_partition p)
{
    switch (p) {
    case VF_PARTITION_FILE_GROUP: return "file_group";
    case VF_PARTITION_EPISODE: return "episode";
    case VF_PARTITION_SEQUENTIAL: return "sequential";
    }
    return NULL;
}

int vf_plan_partition_from_name(const char *name)
{
    if (!name)
        return -1;
    if (!strcmp(name, "file_group") || !strcmp(name, "file-group"))
        return VF_PARTITION_FILE_GROUP;
    if (!strcmp(name, "episode"))
        return VF_PARTITION_EPISODE;
    if (!strcmp(name, "sequential"))
        return VF_PARTITION_SEQUENTIAL;
    return -1;
}

static int same_group(const vf_plan_input *in, size_t a, size_t b)
{
    if (in->num_cameras == 0)
        return in->data_files[a] == in->data_files[b];
    for (size_t c = 0; c < in->num_cameras; c++)
        if (in->video_files[a * in->num_cameras + c] != in->video_files[b * in->num_cameras + c])
            return 0;
    return 1;
}

int vf_plan_partition(const vf_plan_input *in, vf_partition partition, size_t consumers, vf_plan_task **tasks,
                      size_t *num_tasks)
{
    *tasks = NULL;
    *num_tasks = 0;
    if (!vf_plan_partition_name(partition))
        return vf_error(VF_EINVAL, "unknown partition %d", (int)partition);
    size_t n = in->num_episodes;
    vf_plan_task *t = vf_calloc(n ? n : 1, sizeof *t);
    if (!t)
        return VF_ENOMEM;
    int64_t total = 0;
    for (size_t e = 0; e < n; e++)
        total += in->lengths[e];
    if (consumers < 1)
        consumers = 1;
    size_t nt = 0;
    int64_t pos = 0;
    size_t prev_key = 0;
    for (size_t e = 0; e < n; e++) {
        int start_new;
        size_t key = 0;
        if (e == 0) {
            start_new = 1;
        } else if (partition == VF_PARTITION_EPISODE) {
            start_new = 1;
        } else if (partition == VF_PARTITION_FILE_GROUP) {
            start_new = !same_group(in, e - 1, e);
        } else {
            /* Sequential: the consumer slot this episode's first frame falls in. */
            key = (size_t)((unsigned __int128)pos * consumers / (unsigned __int128)(total ? total : 1));
            start_new = key != prev_key;
        }
        prev_key = key;
        if (start_new) {
            t[nt].first_episode = e;
            t[nt].first_position = pos;
            nt++;
        }
        t[nt - 1].num_episodes++;
        t[nt - 1].num_samples += in->lengths[e];
        pos += in->lengths[e];
    }
    *tasks = t;
    *num_tasks = nt;
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

size_t vf_plan_video_opens(const vf_plan_input *in, const vf_plan_task *tasks, size_t num_tasks)
{
    size_t opens = 0, cap = 0;
    int64_t *ids = NULL;
    for (size_t t = 0; t < num_tasks; t++) {
        size_t k = tasks[t].num_episodes;
        if (k > cap) {
            int64_t *n = realloc(ids, k * sizeof *ids);
            if (!n)
                break; /* counts stay a lower bound; only reached without memory */
            ids = n;
            cap = k;
        }
        for (size_t c = 0; c < in->num_cameras; c++) {
            for (size_t i = 0; i < k; i++)
                ids[i] = in->video_files[(tasks[t].first_episode + i) * in->num_cameras + c];
            qsort(ids, k, sizeof *ids, cmp_i64);
            for (size_t i = 0; i < k; i++)
                if (i == 0 || ids[i] != ids[i - 1])
                    opens++;
        }
    }
    free(ids);
    return opens;
}

/* ---- rank / consumer slices ------------------------------------------------------- */

void vf_plan_rank_slice(int64_t n, int rank, int world_size, int drop_last, int64_t *start, int64_t *count)
{
    if (world_size <= 1) {
        *start = 0;
        *count = n;
        return;
    }
    int64_t per = drop_last ? n / world_size : (n + world_size - 1) / world_size;
    if (n == 0)
        per = 0;
    *start = per * rank;
    *count = per;
}

void vf_plan_consumer_slice(int64_t count, int consumer, int num_consumers, int64_t *start, int64_t *len)
{
    if (num_consumers <= 1) {
        *start = 0;
        *len = count;
        return;
    }
    int64_t lo = (int64_t)((__int128)count * consumer / num_consumers);
    int64_t hi = (int64_t)((__int128)count * (consumer + 1) / num_consumers);
    *start = lo;
    *len = hi - lo;
}

int vf_plan_shuffle_buffer(const int64_t *values, int64_t n, size_t buffer, vf_rng *rng, int64_t *out)
{
    if (buffer <= 1 || n <= 1) {
        memmove(out, values, (size_t)n * sizeof *out);
        return 0;
    }
    size_t cap = (size_t)VF_MIN((int64_t)buffer, n);
    int64_t *buf = vf_malloc_array(cap, sizeof *buf);
    if (!buf)
        return VF_ENOMEM;
    size_t fill = 0;
    int64_t emitted = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fill < cap) {
            buf[fill++] = values[i];
            continue;
        }
        size_t j = (size_t)vf_rng_below(rng, cap);
        out[emitted++] = buf[j];
        buf[j] = values[i];
    }
    vf_rng_shuffle_i64(rng, buf, (int64_t)fill);
    memcpy(out + emitted, buf, fill * sizeof *buf);
    free(buf);
    return 0;
}

/* ---- batch counts (order-free) -------------------------------------------------------- */

/* Samples a consumer keeps and the batches they make. */
static void consumer_batches(int64_t rank_count, int c, int nc, size_t batch_size, int drop_last, int64_t *keep,
                             int64_t *batches)
{
    int64_t cs, cl;
    vf_plan_consumer_slice(rank_count, c, nc, &cs, &cl);
    if (drop_last)
        cl -= cl % (int64_t)batch_size;
    *keep = cl;
    *batches = (cl + (int64_t)batch_size - 1) / (int64_t)batch_size;
}

/* Walks the rank-level round-robin until `batches` batches or `samples`
 * samples (whichever is given, the other -1) are reached. Returns the
 * other count, or -1 when the target is past the epoch or (samples) falls
 * inside a batch. */
static int64_t walk_batches(int64_t n, int world_size, int nc, size_t batch_size, int drop_last, int64_t batches,
                            int64_t samples)
{
    if (world_size < 1 || nc < 1 || batch_size < 1 || n < 0)
        return -1;
    int64_t start, rank_count;
    vf_plan_rank_slice(n, 0, world_size, drop_last, &start, &rank_count);
    int64_t done_b = 0, done_s = 0;
    for (int64_t round = 0;; round++) {
        if (batches >= 0 ? done_b == batches : done_s == samples)
            return batches >= 0 ? done_s : done_b;
        if (samples >= 0 && done_s > samples)
            return -1;
        int any = 0;
        for (int c = 0; c < nc; c++) {
            int64_t keep, nb;
            consumer_batches(rank_count, c, nc, batch_size, drop_last, &keep, &nb);
            if (round >= nb)
                continue;
            any = 1;
            if (batches >= 0 ? done_b == batches : done_s >= samples)
                break;
            done_s += VF_MIN((int64_t)batch_size, keep - round * (int64_t)batch_size);
            done_b++;
        }
        if (!any)
            return (batches >= 0 ? done_b == batches : done_s == samples) ? (batches >= 0 ? done_s : done_b) : -1;
    }
}

int64_t vf_plan_samples_after(int64_t n, int world_size, int num_consumers, size_t batch_size, int drop_last,
                              int64_t batches)
{
    if (batches < 0)
        return -1;
    return walk_batches(n, world_size, num_consumers, batch_size, drop_last, batches, -1);
}

int64_t vf_plan_batches_at(int64_t n, int world_size, int num_consumers, size_t batch_size, int drop_last,
                           int64_t samples)
{
    if (samples < 0)
        return -1;
    return walk_batches(n, world_size, num_consumers, batch_size, drop_last, -1, samples);
}

/* ---- epoch ------------------------------------------------------------------------------ */

void vf_plan_epoch_free(vf_plan_epoch *e)
{
    if (!e)
        return;
    free(e->positions);
    free(e->batch_start);
    free(e->batch_consumer);
    free(e->segments);
    memset(e, 0, sizeof *e);
}

/* The global sequence of the epoch (before the rank split). */
static int global_sequence(const vf_plan_epoch_settings *s, int64_t num_positions, const vf_plan_task *tasks,
                           size_t num_tasks, int64_t **out)
{
    int64_t *seq = vf_malloc_array(num_positions > 0 ? (size_t)num_positions : 1, sizeof *seq);
    if (!seq)
        return VF_ENOMEM;
    if (!tasks) {
        for (int64_t i = 0; i < num_positions; i++)
            seq[i] = i;
        if (s->shuffle) {
            vf_rng r;
            vf_rng_init(&r, vf_rng_derive(s->seed, VF_PLAN_RNG_POSITIONS, (uint64_t)s->epoch, 0, 0));
            vf_rng_shuffle_i64(&r, seq, num_positions);
        }
    } else {
        int64_t *order = vf_malloc_array(num_tasks ? num_tasks : 1, sizeof *order);
        if (!order) {
            free(seq);
            return VF_ENOMEM;
        }
        for (size_t t = 0; t < num_tasks; t++)
            order[t] = (int64_t)t;
        if (s->shuffle) {
            vf_rng r;
            uint64_t purpose = s->pool_size > 0 ? VF_PLAN_RNG_EPISODES : VF_PLAN_RNG_TASKS;
            vf_rng_init(&r, vf_rng_derive(s->seed, purpose, (uint64_t)s->epoch, 0, 0));
            vf_rng_shuffle_i64(&r, order, (int64_t)num_tasks);
        }
        int64_t k = 0;
        for (size_t i = 0; i < num_tasks; i++) {
            const vf_plan_task *t = &tasks[order[i]];
            for (int64_t p = 0; p < t->num_samples && k < num_positions; p++)
                seq[k++] = t->first_position + p;
        }
        free(order);
        if (k != num_positions) {
            free(seq);
            return vf_error(VF_EINVAL, "plan: the tasks cover %lld of %lld positions", (long long)k,
                            (long long)num_positions);
        }
    }
    *out = seq;
    return 0;
}

/* One consumer's part of the epoch, in emitted order. */
typedef struct consumer_part {
    int64_t *positions;
    int64_t len, keep, batches;
    vf_plan_segment *segments; /* pool mode */
    size_t num_segments;
    int64_t *batch_map;        /* [batches]: this plan's batch index of each local batch, or -1 */
} consumer_part;

static int build_part(const vf_plan_epoch_settings *s, const int64_t *seq, int64_t n, int64_t rank_start,
                      int64_t rank_count, int c, const vf_plan_task *tasks, size_t num_tasks, consumer_part *p)
{
    int64_t cs, cl;
    vf_plan_consumer_slice(rank_count, c, s->num_consumers, &cs, &cl);
    int64_t *mine = vf_malloc_array(cl > 0 ? (size_t)cl : 1, sizeof *mine);
    int64_t *ordered = vf_malloc_array(cl > 0 ? (size_t)cl : 1, sizeof *ordered);
    if (!mine || !ordered) {
        free(mine);
        free(ordered);
        return VF_ENOMEM;
    }
    for (int64_t i = 0; i < cl; i++)
        mine[i] = seq[(rank_start + cs + i) % (n > 0 ? n : 1)];
    int r = 0;
    if (s->pool_size > 0) {
        vf_rng rng;
        vf_rng_init(&rng, vf_rng_derive(s->seed, VF_PLAN_RNG_POOL, (uint64_t)s->epoch, (uint64_t)s->rank,
                                        (uint64_t)c));
        r = vf_plan_pool_order(mine, cl, tasks, num_tasks, s->pool_size, s->shuffle ? &rng : NULL, c, ordered,
                               &p->segments, &p->num_segments);
        free(mine);
        mine = ordered;
    } else if (tasks && s->shuffle_buffer > 1) {
        vf_rng rng;
        vf_rng_init(&rng, vf_rng_derive(s->seed, VF_PLAN_RNG_BUFFER, (uint64_t)s->epoch, (uint64_t)s->rank,
                                        (uint64_t)c));
        r = vf_plan_shuffle_buffer(mine, cl, s->shuffle_buffer, &rng, ordered);
        free(mine);
        mine = ordered;
    } else {
        free(ordered);
    }
    p->positions = mine;
    p->len = cl;
    consumer_batches(rank_count, c, s->num_consumers, s->batch_size, s->drop_last, &p->keep, &p->batches);
    if (r == 0 && !(p->batch_map = vf_malloc_array(p->batches > 0 ? (size_t)p->batches : 1, sizeof *p->batch_map)))
        r = VF_ENOMEM;
    for (int64_t b = 0; r == 0 && b < p->batches; b++)
        p->batch_map[b] = -1;
    return r;
}

static int cmp_segment(const void *pa, const void *pb)
{
    const vf_plan_segment *a = pa, *b = pb;
    if (a->admit_batch != b->admit_batch)
        return a->admit_batch < b->admit_batch ? -1 : 1;
    if (a->consumer != b->consumer)
        return a->consumer < b->consumer ? -1 : 1;
    return a->admit_sample < b->admit_sample ? -1 : a->admit_sample > b->admit_sample;
}

/* Segments this plan serves, with their batches (see vf_plan_segment). */
static int map_segments(const vf_plan_epoch_settings *s, consumer_part *parts, int nparts, vf_plan_epoch *out)
{
    size_t total = 0;
    for (int i = 0; i < nparts; i++)
        total += parts[i].num_segments;
    vf_plan_segment *segs = vf_malloc_array(total ? total : 1, sizeof *segs);
    if (!segs)
        return VF_ENOMEM;
    size_t k = 0;
    int64_t bs = (int64_t)s->batch_size;
    for (int i = 0; i < nparts; i++) {
        const consumer_part *p = &parts[i];
        for (size_t j = 0; j < p->num_segments; j++) {
            vf_plan_segment g = p->segments[j];
            if (g.admit_sample < 0 || g.admit_sample >= p->keep)
                continue; /* admitted after the last kept draw */
            if (g.evict_sample < 0 || g.evict_sample >= p->keep)
                g.evict_sample = p->keep - 1;
            int64_t lo = g.admit_sample / bs, hi = g.evict_sample / bs;
            int64_t first = -1, last = -1;
            for (int64_t b = lo; b <= hi && first < 0; b++)
                first = p->batch_map[b];
            for (int64_t b = hi; b >= lo && last < 0; b--)
                last = p->batch_map[b];
            if (first < 0)
                continue;
            g.admit_batch = first;
            g.evict_batch = last;
            segs[k++] = g;
        }
    }
    qsort(segs, k, sizeof *segs, cmp_segment);
    out->segments = segs;
    out->num_segments = k;
    return 0;
}

int vf_plan_epoch_build(const vf_plan_epoch_settings *s, int64_t num_positions, const vf_plan_task *tasks,
                        size_t num_tasks, vf_plan_epoch *out)
{
    memset(out, 0, sizeof *out);
    if (s->world_size < 1 || s->rank < 0 || s->rank >= s->world_size)
        return vf_error(VF_EINVAL, "rank %d is not in [0, world_size %d)", s->rank, s->world_size);
    if (s->num_consumers < 1 || s->consumer < -1 || s->consumer >= s->num_consumers)
        return vf_error(VF_EINVAL, "consumer %d is not in [0, num_consumers %d)", s->consumer, s->num_consumers);
    if (s->batch_size < 1)
        return vf_error(VF_EINVAL, "batch_size must be at least 1");
    if (s->pool_size > 0 && !tasks)
        return vf_error(VF_EINVAL, "plan: pool mode needs one task per episode");
    if (s->resume_batch < 0)
        return vf_error(VF_EINVAL, "plan: resume batch %lld is negative", (long long)s->resume_batch);
    int64_t *seq = NULL;
    int r = global_sequence(s, num_positions, tasks, num_tasks, &seq);
    if (r < 0)
        return r;
    int64_t rank_start, rank_count;
    vf_plan_rank_slice(num_positions, s->rank, s->world_size, s->drop_last, &rank_start, &rank_count);

    /* The consumers to build: the one asked for, or all of the rank (a
     * rank-level plan, or a consumer resuming, which takes its share of
     * every consumer's remaining batches). */
    int redeal = s->consumer >= 0 && s->resume_batch > 0;
    int all = s->consumer < 0 || redeal;
    int first = all ? 0 : s->consumer;
    int np = all ? s->num_consumers : 1;
    consumer_part *parts = vf_calloc((size_t)np, sizeof *parts);
    if (!parts) {
        free(seq);
        return VF_ENOMEM;
    }
    int64_t total_batches = 0;
    for (int i = 0; i < np && r == 0; i++) {
        r = build_part(s, seq, num_positions, rank_start, rank_count, first + i, tasks, num_tasks, &parts[i]);
        total_batches += parts[i].batches;
    }
    free(seq);

    /* The rank-level round-robin: one batch per consumer per round (the
     * order a torch DataLoader takes batches from its workers), as
     * (part, local batch) pairs. */
    int64_t *rr_part = NULL, *rr_local = NULL;
    if (r == 0) {
        rr_part = vf_malloc_array(total_batches > 0 ? (size_t)total_batches : 1, sizeof *rr_part);
        rr_local = vf_malloc_array(total_batches > 0 ? (size_t)total_batches : 1, sizeof *rr_local);
        if (!rr_part || !rr_local)
            r = VF_ENOMEM;
    }
    if (r == 0) {
        int64_t b = 0;
        for (int64_t round = 0; b < total_batches; round++)
            for (int i = 0; i < np; i++)
                if (round < parts[i].batches) {
                    rr_part[b] = i;
                    rr_local[b] = round;
                    b++;
                }
    }
    if (r == 0 && s->resume_batch > total_batches && (s->consumer < 0 || redeal))
        r = vf_error(VF_ERANGE, "plan: resume at batch %lld, but the rank has %lld batches in epoch %lld",
                     (long long)s->resume_batch, (long long)total_batches, (long long)s->epoch);

    /* This plan's batches: every batch (rank-level, delivery from
     * resume_batch), the consumer's own, or its round-robin share of the
     * remaining ones. */
    int64_t sel_first = 0, sel_step = 1, sel_count = total_batches;
    if (r == 0 && redeal) {
        sel_first = s->resume_batch + s->consumer;
        sel_step = s->num_consumers;
        sel_count = sel_first < total_batches ? (total_batches - sel_first + sel_step - 1) / sel_step : 0;
    }
    int64_t nsamples = 0;
    for (int64_t i = 0; r == 0 && i < sel_count; i++) {
        int64_t b = sel_first + i * sel_step;
        const consumer_part *p = &parts[rr_part[b]];
        nsamples += VF_MIN((int64_t)s->batch_size, p->keep - rr_local[b] * (int64_t)s->batch_size);
    }
    if (r == 0) {
        out->positions = vf_malloc_array(nsamples > 0 ? (size_t)nsamples : 1, sizeof *out->positions);
        out->batch_start = vf_malloc_array((size_t)sel_count + 1, sizeof *out->batch_start);
        out->batch_consumer = vf_malloc_array((size_t)sel_count + 1, sizeof *out->batch_consumer);
        if (!out->positions || !out->batch_start || !out->batch_consumer)
            r = VF_ENOMEM;
    }
    if (r == 0) {
        int64_t k = 0;
        for (int64_t i = 0; i < sel_count; i++) {
            int64_t b = sel_first + i * sel_step;
            consumer_part *p = &parts[rr_part[b]];
            int64_t lo = rr_local[b] * (int64_t)s->batch_size;
            int64_t hi = VF_MIN(lo + (int64_t)s->batch_size, p->keep);
            out->batch_start[i] = k;
            out->batch_consumer[i] = first + rr_part[b];
            p->batch_map[rr_local[b]] = i;
            memcpy(out->positions + k, p->positions + lo, (size_t)(hi - lo) * sizeof *out->positions);
            k += hi - lo;
        }
        out->batch_start[sel_count] = k;
        out->num_batches = (size_t)sel_count;
        out->num_samples = k;
        out->first_batch = s->consumer < 0 ? (size_t)s->resume_batch : 0;
    }
    if (r == 0 && s->pool_size > 0)
        r = map_segments(s, parts, np, out);

    /* Remainder bookkeeping over this plan's own consumers. */
    if (r == 0) {
        out->epoch_samples = num_positions;
        out->rank_samples = rank_count;
        for (int i = 0; i < np; i++) {
            int c = first + i;
            if (s->consumer >= 0 && c != s->consumer)
                continue;
            int64_t cs, cl;
            vf_plan_consumer_slice(rank_count, c, s->num_consumers, &cs, &cl);
            int64_t lo = rank_start + cs, hi = lo + cl;
            if (hi > num_positions)
                out->padded_samples += hi - VF_MAX(lo, num_positions);
            out->dropped_samples += parts[i].len - parts[i].keep;
            out->empty_consumers += parts[i].keep == 0;
            if (s->drop_last && s->rank == s->world_size - 1 && c == s->num_consumers - 1)
                out->dropped_samples += num_positions - rank_count * s->world_size;
        }
    }
    for (int i = 0; i < np; i++) {
        free(parts[i].positions);
        free(parts[i].segments);
        free(parts[i].batch_map);
    }
    free(parts);
    free(rr_part);
    free(rr_local);
    if (r < 0)
        vf_plan_epoch_free(out);
    return r;
}
