/*
 * plan.c: partitions, epoch order, rank/consumer split, shuffle buffer and
 * batching (see plan.h for the rules). Pure functions of their inputs.
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

/* ---- epoch ------------------------------------------------------------------------------ */

void vf_plan_epoch_free(vf_plan_epoch *e)
{
    if (!e)
        return;
    free(e->positions);
    free(e->batch_start);
    free(e->batch_consumer);
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
            vf_rng_init(&r, vf_rng_derive(s->seed, VF_PLAN_RNG_TASKS, (uint64_t)s->epoch, 0, 0));
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
    int64_t *seq = NULL;
    int r = global_sequence(s, num_positions, tasks, num_tasks, &seq);
    if (r < 0)
        return r;
    int64_t rank_start, rank_count;
    vf_plan_rank_slice(num_positions, s->rank, s->world_size, s->drop_last, &rank_start, &rank_count);

    int first = s->consumer >= 0 ? s->consumer : 0;
    int last = s->consumer >= 0 ? s->consumer : s->num_consumers - 1;
    int nc = last - first + 1;
    /* Per consumer: its samples (after the buffer) and its batches. */
    int64_t **cons_pos = vf_calloc((size_t)nc, sizeof *cons_pos);
    int64_t *cons_len = vf_calloc((size_t)nc, sizeof *cons_len);
    size_t *cons_batches = vf_calloc((size_t)nc, sizeof *cons_batches);
    if (!cons_pos || !cons_len || !cons_batches)
        r = VF_ENOMEM;
    int64_t total = 0;
    size_t total_batches = 0;
    for (int c = 0; c < nc && r == 0; c++) {
        int64_t cs, cl;
        vf_plan_consumer_slice(rank_count, first + c, s->num_consumers, &cs, &cl);
        int64_t *mine = vf_malloc_array(cl > 0 ? (size_t)cl : 1, sizeof *mine);
        int64_t *buffered = vf_malloc_array(cl > 0 ? (size_t)cl : 1, sizeof *buffered);
        if (!mine || !buffered) {
            free(mine);
            free(buffered);
            r = VF_ENOMEM;
            break;
        }
        for (int64_t i = 0; i < cl; i++)
            mine[i] = seq[(rank_start + cs + i) % (num_positions > 0 ? num_positions : 1)];
        if (tasks && s->shuffle_buffer > 1) {
            vf_rng rng;
            vf_rng_init(&rng, vf_rng_derive(s->seed, VF_PLAN_RNG_BUFFER, (uint64_t)s->epoch, (uint64_t)s->rank,
                                            (uint64_t)(first + c)));
            r = vf_plan_shuffle_buffer(mine, cl, s->shuffle_buffer, &rng, buffered);
            free(mine);
            mine = buffered;
        } else {
            free(buffered);
        }
        int64_t keep = cl;
        if (s->drop_last)
            keep -= cl % (int64_t)s->batch_size;
        cons_pos[c] = mine;
        cons_len[c] = keep;
        cons_batches[c] = (size_t)((keep + (int64_t)s->batch_size - 1) / (int64_t)s->batch_size);
        total += keep;
        total_batches += cons_batches[c];
    }
    free(seq);
    if (r == 0) {
        out->positions = vf_malloc_array(total > 0 ? (size_t)total : 1, sizeof *out->positions);
        out->batch_start = vf_malloc_array(total_batches + 1, sizeof *out->batch_start);
        out->batch_consumer = vf_malloc_array(total_batches + 1, sizeof *out->batch_consumer);
        if (!out->positions || !out->batch_start || !out->batch_consumer)
            r = VF_ENOMEM;
    }
    if (r == 0) {
        /* Round-robin over consumers, one batch each per round (the order a
         * torch DataLoader takes batches from its workers). */
        int64_t k = 0;
        size_t b = 0;
        for (size_t round = 0; b < total_batches; round++) {
            for (int c = 0; c < nc; c++) {
                if (round >= cons_batches[c])
                    continue;
                int64_t lo = (int64_t)round * (int64_t)s->batch_size;
                int64_t hi = VF_MIN(lo + (int64_t)s->batch_size, cons_len[c]);
                out->batch_start[b] = k;
                out->batch_consumer[b] = first + c;
                b++;
                for (int64_t i = lo; i < hi; i++)
                    out->positions[k++] = cons_pos[c][i];
            }
        }
        out->batch_start[b] = k;
        out->num_batches = b;
        out->num_samples = k;
    }
    for (int c = 0; cons_pos && c < nc; c++)
        free(cons_pos[c]);
    free(cons_pos);
    free(cons_len);
    free(cons_batches);
    if (r < 0)
        vf_plan_epoch_free(out);
    return r;
}
