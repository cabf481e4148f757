/*
 * plan.c: partitions, epoch order, rank/consumer split, shuffle buffer,
 * batching and the resume selection (see plan.h for the rules; the pool's
 * draws are in pool.c). Pure functions of their inputs.
 */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

/* ---- input ----------------------------------------------------------------------- */

/* Frees a struct's arrays and zeroes the struct (inputs and epochs alike). */
static void free_arrays_and_clear(void *object, size_t size, void *arrays[], size_t count)
{
    for (size_t i = 0; i < count; i++)
        free(arrays[i]);
    memset(object, 0, size);
}

void vf_plan_input_free(vf_plan_input *in)
{
    if (in)
        free_arrays_and_clear(in, sizeof *in, (void *[]){in->lengths, in->video_files, in->data_files}, 3);
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

/* The camera whose files change most often along the episodes (the first
 * such camera on ties), and how many runs of episodes its files make. */
static size_t primary_camera(const vf_plan_input *in, size_t *runs_out)
{
    size_t best = 0, best_runs = 0;
    for (size_t c = 0; c < in->num_cameras; c++) {
        size_t runs = in->num_episodes > 0;
        for (size_t e = 1; e < in->num_episodes; e++)
            runs += in->video_files[e * in->num_cameras + c] != in->video_files[(e - 1) * in->num_cameras + c];
        if (runs > best_runs) {
            best = c;
            best_runs = runs;
        }
    }
    *runs_out = best_runs;
    return best;
}

/* The file identity that cuts file groups: the primary camera's file, or
 * the data file without cameras. */
static int64_t group_key(const vf_plan_input *in, size_t primary, size_t e)
{
    return in->num_cameras ? in->video_files[e * in->num_cameras + primary] : in->data_files[e];
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
    /* File groups: runs of the primary camera's files, up to `span` of
     * them per task (see vf_plan_partition). */
    size_t primary = 0, runs = 0, span = 1, in_task = 0;
    if (partition == VF_PARTITION_FILE_GROUP) {
        primary = primary_camera(in, &runs);
        if (in->num_cameras == 0) {
            runs = n > 0;
            for (size_t e = 1; e < n; e++)
                runs += in->data_files[e] != in->data_files[e - 1];
        }
        span = runs / (4 * consumers);
        span = span < 1 ? 1 : span > VF_PLAN_MAX_FILES_PER_TASK ? VF_PLAN_MAX_FILES_PER_TASK : span;
    }
    for (size_t e = 0; e < n; e++) {
        int start_new;
        size_t key = 0;
        if (e == 0) {
            start_new = 1;
            in_task = 1;
        } else if (partition == VF_PARTITION_EPISODE) {
            start_new = 1;
        } else if (partition == VF_PARTITION_FILE_GROUP) {
            start_new = 0;
            if (group_key(in, primary, e) != group_key(in, primary, e - 1)) {
                start_new = in_task >= span;
                in_task = start_new ? 1 : in_task + 1;
            }
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

/* A consumer's part of its rank's slice: [*start, *start + *len) of the
 * slice, of which the first *keep samples make *batches batches. Without
 * drop_last the parts differ by at most one sample and every sample is
 * kept; with drop_last the rank keeps whole batches only and deals them to
 * its consumers as contiguous runs (see the remainder rule in plan.h). */
static void part_slice(int64_t rank_count, int c, int nc, size_t batch_size, int drop_last, int64_t *start,
                       int64_t *len, int64_t *keep, int64_t *batches)
{
    int64_t bs = (int64_t)batch_size;
    if (!drop_last) {
        vf_plan_consumer_slice(rank_count, c, nc, start, len);
        *keep = *len;
        *batches = (*len + bs - 1) / bs;
        return;
    }
    int64_t nb = rank_count / bs, lo, cnt;
    vf_plan_consumer_slice(nb, c, nc, &lo, &cnt);
    *start = lo * bs;
    *len = *keep = cnt * bs;
    *batches = cnt;
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
    part_slice(rank_count, c, nc, batch_size, drop_last, &cs, &cl, keep, batches);
}

/* Samples in consumer c's batch of round `round` of the rank's
 * round-robin (its round-th batch); 0 when it has no batch left by then. */
static int64_t round_batch_samples(int64_t rank_count, int c, int nc, size_t batch_size, int drop_last,
                                   int64_t round)
{
    int64_t keep, nb;
    consumer_batches(rank_count, c, nc, batch_size, drop_last, &keep, &nb);
    return round < nb ? VF_MIN((int64_t)batch_size, keep - round * (int64_t)batch_size) : 0;
}

/* Samples consumer c has delivered once its rank delivered `batches`
 * rank-level batches (the round-robin over consumers, exhausted ones
 * skipped). */
static int64_t consumer_delivered(int64_t rank_count, int c, int nc, size_t batch_size, int drop_last,
                                  int64_t batches)
{
    /* Rounds completed: the round-robin takes one batch from every consumer
     * that still has one. Walk rounds by the sorted batch counts. */
    int64_t done = 0, round = 0, mine = 0, my_keep = 0, my_batches = 0;
    consumer_batches(rank_count, c, nc, batch_size, drop_last, &my_keep, &my_batches);
    while (done < batches) {
        int active = 0;
        for (int k = 0; k < nc; k++) {
            if (!round_batch_samples(rank_count, k, nc, batch_size, drop_last, round))
                continue;
            active++;
            if (done == batches)
                break;
            done++;
            if (k == c)
                mine++;
        }
        if (!active)
            break;
        round++;
    }
    return VF_MIN(mine * (int64_t)batch_size, my_keep);
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
            int64_t in_batch = round_batch_samples(rank_count, c, nc, batch_size, drop_last, round);
            if (!in_batch)
                continue;
            any = 1;
            if (batches >= 0 ? done_b == batches : done_s >= samples)
                break;
            done_s += in_batch;
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

int64_t vf_plan_rank_batches(int64_t n, int world_size, int num_consumers, size_t batch_size, int drop_last)
{
    int64_t start, rank_count, total = 0;
    vf_plan_rank_slice(n, 0, world_size, drop_last, &start, &rank_count);
    for (int c = 0; c < num_consumers; c++) {
        int64_t keep, nb;
        consumer_batches(rank_count, c, num_consumers, batch_size, drop_last, &keep, &nb);
        total += nb;
    }
    return total;
}

int64_t vf_plan_batches_at(int64_t n, int world_size, int num_consumers, size_t batch_size, int drop_last,
                           int64_t samples)
{
    if (samples < 0)
        return -1;
    return walk_batches(n, world_size, num_consumers, batch_size, drop_last, -1, samples);
}

/* ---- the global sequence, evaluated per index ------------------------------------------- */

#define FEISTEL_ROUNDS 6

/* The epoch's global sequence (never materialised) restricted to the
 * remaining ranges: index j of the restricted sequence is index
 * range_index(j) of the global one, whose position is at(). */
typedef struct order {
    int64_t n;                 /* positions of the epoch */
    /* map mode */
    int permute;               /* keyed bijection of [0, n) (else identity) */
    int half;                  /* Feistel half width in bits */
    uint64_t keys[FEISTEL_ROUNDS];
    /* stream / pool: the tasks in epoch order */
    const vf_plan_task *tasks;
    size_t num_tasks;
    int64_t *task_order;       /* [num_tasks] */
    int64_t *task_prefix;      /* [num_tasks + 1]: global index of each ordered task's first sample */
    /* remaining ranges */
    const int64_t *ranges;
    size_t num_ranges;
    int64_t *range_prefix;     /* [num_ranges + 1]: restricted index of each range's start */
    int64_t rn;                /* samples of the restricted sequence */
} order;

static void order_free(order *o)
{
    free(o->task_order);
    free(o->task_prefix);
    free(o->range_prefix);
    memset(o, 0, sizeof *o);
}

int64_t vf_plan_ranges_samples(const int64_t *ranges, size_t num_ranges, int64_t num_positions)
{
    if (!ranges || num_ranges == 0)
        return num_positions;
    int64_t k = 0;
    for (size_t i = 0; i < num_ranges; i++)
        k += ranges[2 * i + 1] - ranges[2 * i];
    return k;
}

int vf_plan_ranges_check(const int64_t *ranges, size_t num_ranges, int64_t num_positions)
{
    int64_t prev = 0;
    for (size_t i = 0; i < num_ranges; i++) {
        int64_t a = ranges[2 * i], b = ranges[2 * i + 1];
        if (a < prev || b <= a || b > num_positions)
            return vf_error(VF_EINVAL,
                            "plan: remaining range %zu [%lld, %lld) is not ascending, disjoint and inside the "
                            "epoch's %lld samples",
                            i, (long long)a, (long long)b, (long long)num_positions);
        prev = b;
    }
    return 0;
}

static int order_init(order *o, const vf_plan_epoch_settings *s, int64_t n, const vf_plan_task *tasks,
                      size_t num_tasks)
{
    memset(o, 0, sizeof *o);
    o->n = n;
    int r = vf_plan_ranges_check(s->ranges, s->ranges ? s->num_ranges : 0, n);
    if (r < 0)
        return r;
    if (!tasks) {
        o->permute = s->shuffle && n > 1;
        if (o->permute) {
            int bits = 0;
            while (bits < 62 && ((int64_t)1 << bits) < n)
                bits++;
            o->half = (bits + 1) / 2;
            vf_rng rng;
            vf_rng_init(&rng, vf_rng_derive(s->seed, VF_PLAN_RNG_POSITIONS, (uint64_t)s->epoch, 0, 0));
            for (int i = 0; i < FEISTEL_ROUNDS; i++)
                o->keys[i] = vf_rng_next(&rng);
        }
    } else {
        o->tasks = tasks;
        o->num_tasks = num_tasks;
        o->task_order = vf_malloc_array(num_tasks ? num_tasks : 1, sizeof *o->task_order);
        o->task_prefix = vf_malloc_array(num_tasks + 1, sizeof *o->task_prefix);
        if (!o->task_order || !o->task_prefix) {
            order_free(o);
            return VF_ENOMEM;
        }
        for (size_t t = 0; t < num_tasks; t++)
            o->task_order[t] = (int64_t)t;
        if (s->shuffle) {
            vf_rng rng;
            uint64_t purpose = s->pool_size > 0 ? VF_PLAN_RNG_EPISODES : VF_PLAN_RNG_TASKS;
            vf_rng_init(&rng, vf_rng_derive(s->seed, purpose, (uint64_t)s->epoch, 0, 0));
            vf_rng_shuffle_i64(&rng, o->task_order, (int64_t)num_tasks);
        }
        int64_t k = 0;
        for (size_t i = 0; i < num_tasks; i++) {
            o->task_prefix[i] = k;
            k += tasks[o->task_order[i]].num_samples;
        }
        o->task_prefix[num_tasks] = k;
        if (k != n) {
            order_free(o);
            return vf_error(VF_EINVAL, "plan: the tasks cover %lld of %lld positions", (long long)k, (long long)n);
        }
    }
    if (s->ranges && s->num_ranges > 0) {
        o->ranges = s->ranges;
        o->num_ranges = s->num_ranges;
        if (!(o->range_prefix = vf_malloc_array(s->num_ranges + 1, sizeof *o->range_prefix))) {
            order_free(o);
            return VF_ENOMEM;
        }
        int64_t k = 0;
        for (size_t i = 0; i < s->num_ranges; i++) {
            o->range_prefix[i] = k;
            k += s->ranges[2 * i + 1] - s->ranges[2 * i];
        }
        o->range_prefix[s->num_ranges] = k;
        o->rn = k;
    } else {
        o->rn = n;
    }
    return 0;
}

static uint64_t feistel(const order *o, uint64_t x)
{
    uint64_t mask = (o->half >= 64) ? ~0ull : ((1ull << o->half) - 1);
    uint64_t l = x >> o->half, r = x & mask;
    for (int i = 0; i < FEISTEL_ROUNDS; i++) {
        uint64_t t = l ^ (vf_mix64(r ^ o->keys[i]) & mask);
        l = r;
        r = t;
    }
    return (l << o->half) | r;
}

/* Largest i in [0, n) with prefix[i] <= v (prefix ascending, prefix[0] <= v). */
static size_t find_le(const int64_t *prefix, size_t n, int64_t v)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (prefix[mid] <= v)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The position at index g of the global sequence. */
static int64_t order_at(const order *o, int64_t g)
{
    if (o->tasks) {
        size_t t = find_le(o->task_prefix, o->num_tasks, g);
        return o->tasks[o->task_order[t]].first_position + (g - o->task_prefix[t]);
    }
    if (!o->permute)
        return g;
    uint64_t x = (uint64_t)g;
    do
        x = feistel(o, x);
    while (x >= (uint64_t)o->n);
    return (int64_t)x;
}

/* The global index of index j (0 <= j < rn) of the restricted sequence. */
static int64_t order_global(const order *o, int64_t j)
{
    if (!o->ranges)
        return j;
    size_t i = find_le(o->range_prefix, o->num_ranges, j);
    return o->ranges[2 * i] + (j - o->range_prefix[i]);
}

/* ---- epoch ------------------------------------------------------------------------------ */

/* A lazy plan's own copy of an order (map mode: no tasks), with its own ranges. */
static int order_clone(const order *o, order **out)
{
    *out = NULL;
    order *c = vf_calloc(1, sizeof *c);
    if (!c)
        return VF_ENOMEM;
    *c = *o;
    c->tasks = NULL;
    c->task_order = c->task_prefix = c->range_prefix = NULL;
    c->ranges = NULL;
    if (o->ranges) {
        int64_t *ranges = vf_malloc_array(2 * o->num_ranges, sizeof *ranges);
        c->range_prefix = vf_malloc_array(o->num_ranges + 1, sizeof *c->range_prefix);
        if (!ranges || !c->range_prefix) {
            free(ranges);
            free(c->range_prefix);
            free(c);
            return VF_ENOMEM;
        }
        memcpy(ranges, o->ranges, 2 * o->num_ranges * sizeof *ranges);
        memcpy(c->range_prefix, o->range_prefix, (o->num_ranges + 1) * sizeof *c->range_prefix);
        c->ranges = ranges;
    }
    *out = c;
    return 0;
}

static void order_clone_free(void *p)
{
    order *c = p;
    if (!c)
        return;
    free((void *)c->ranges);
    free(c->range_prefix);
    free(c);
}

void vf_plan_epoch_free(vf_plan_epoch *e)
{
    if (!e)
        return;
    order_clone_free(e->order);
    free_arrays_and_clear(e, sizeof *e,
                          (void *[]){e->positions, e->batch_start, e->batch_consumer, e->segments, e->batch_index}, 5);
}

void vf_plan_epoch_batch_positions(const vf_plan_epoch *e, size_t b, int64_t *out)
{
    int64_t lo = e->batch_start[b], n = e->batch_start[b + 1] - lo;
    if (!e->order) {
        memcpy(out, e->positions + lo, (size_t)n * sizeof *out);
        return;
    }
    const order *o = e->order;
    int64_t rn = o->rn > 0 ? o->rn : 1;
    for (int64_t t = 0; t < n; t++)
        out[t] = order_at(o, order_global(o, (e->batch_index[b] + t) % rn));
}

/* One consumer's part of the epoch, in emitted order. */
typedef struct consumer_part {
    int64_t *positions;
    int64_t *rindex;           /* restricted-sequence index of each emitted sample (when asked for) */
    int64_t len, keep, batches;
    vf_plan_segment *segments; /* pool mode */
    size_t num_segments;
    int64_t *batch_map;        /* [batches]: this plan's batch index of each local batch, or -1 */
    int64_t first_index;       /* lazy (positions NULL): restricted index of the part's first sample */
} consumer_part;

static int cmp_pair(const void *pa, const void *pb)
{
    const int64_t *a = pa, *b = pb;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

/* Builds consumer c of rank `rank`'s part: its samples of the restricted
 * sequence in emitted order (and, with want_rindex, their restricted
 * indices). */
static int build_part(const vf_plan_epoch_settings *s, const order *o, int rank, int c, int want_rindex,
                      consumer_part *p)
{
    int64_t rank_start, rank_count, cs, cl, keep, nb;
    vf_plan_rank_slice(o->rn, rank, s->world_size, s->drop_last, &rank_start, &rank_count);
    part_slice(rank_count, c, s->num_consumers, s->batch_size, s->drop_last, &cs, &cl, &keep, &nb);
    if (s->lazy_positions && !o->tasks && !want_rindex) {
        /* Map mode, evaluated per batch: the part is the run of restricted
         * indices from first_index (mod rn). */
        p->first_index = rank_start + cs;
        p->len = cl;
        p->keep = keep;
        p->batches = nb;
        if (!(p->batch_map = vf_malloc_array(nb > 0 ? (size_t)nb : 1, sizeof *p->batch_map)))
            return VF_ENOMEM;
        for (int64_t b = 0; b < nb; b++)
            p->batch_map[b] = -1;
        return 0;
    }
    size_t cap = cl > 0 ? (size_t)cl : 1;
    /* Only the arrays this part needs: positions, and for a local reorder
     * (pool draws, shuffle buffer) or a caller that wants them, the
     * restricted indices and the reordered copy. The part is the rank's
     * whole share at world size 1, so every extra array counts. */
    int pool = s->pool_size > 0, buffer = o->tasks && s->shuffle_buffer > 1;
    int need_idx = want_rindex || buffer;
    int64_t *mine = vf_malloc_array(cap, sizeof *mine);
    int64_t *idx = need_idx ? vf_malloc_array(cap, sizeof *idx) : NULL;
    int64_t *ordered = pool || buffer ? vf_malloc_array(cap, sizeof *ordered) : NULL;
    if (!mine || (need_idx && !idx) || ((pool || buffer) && !ordered)) {
        free(mine);
        free(idx);
        free(ordered);
        return VF_ENOMEM;
    }
    int64_t rn = o->rn > 0 ? o->rn : 1;
    for (int64_t i = 0; i < cl; i++) {
        int64_t j = (rank_start + cs + i) % rn;
        if (idx)
            idx[i] = j;
        mine[i] = order_at(o, order_global(o, j));
    }
    int r = 0;
    int reordered = 0;
    if (pool) {
        vf_rng rng;
        vf_rng_init(&rng, vf_rng_derive(s->seed, VF_PLAN_RNG_POOL, (uint64_t)s->epoch, (uint64_t)rank, (uint64_t)c));
        r = vf_plan_pool_order(mine, cl, o->tasks, o->num_tasks, s->pool_size, s->shuffle ? &rng : NULL, c, ordered,
                               &p->segments, &p->num_segments);
        reordered = 1;
    } else if (buffer) {
        /* The buffer shuffles local indices, so positions and restricted
         * indices follow the same order. */
        vf_rng rng;
        vf_rng_init(&rng, vf_rng_derive(s->seed, VF_PLAN_RNG_BUFFER, (uint64_t)s->epoch, (uint64_t)rank,
                                        (uint64_t)c));
        int64_t *local = vf_malloc_array(cap, sizeof *local);
        if (!local)
            r = VF_ENOMEM;
        for (int64_t i = 0; r == 0 && i < cl; i++)
            local[i] = i;
        if (r == 0)
            r = vf_plan_shuffle_buffer(local, cl, s->shuffle_buffer, &rng, ordered);
        if (r == 0) {
            for (int64_t i = 0; i < cl; i++)
                local[i] = mine[ordered[i]];
            for (int64_t i = 0; i < cl; i++)
                ordered[i] = idx[ordered[i]];
            memcpy(idx, ordered, (size_t)cl * sizeof *idx);
            memcpy(ordered, local, (size_t)cl * sizeof *ordered);
        }
        free(local);
        if (r == 0) {
            free(mine);
            mine = ordered;
            ordered = NULL;
        }
    }
    if (r == 0 && reordered) {
        /* Pool: map the emitted positions back to restricted indices (the
         * part's positions are distinct: a part is at most one pass over
         * the restricted sequence). */
        if (want_rindex) {
            int64_t *pairs = vf_malloc_array(cap * 2, sizeof *pairs);
            if (!pairs)
                r = VF_ENOMEM;
            for (int64_t i = 0; r == 0 && i < cl; i++) {
                pairs[2 * i] = mine[i];
                pairs[2 * i + 1] = idx[i];
            }
            if (r == 0) {
                qsort(pairs, (size_t)cl, 2 * sizeof *pairs, cmp_pair);
                for (int64_t i = 0; i < cl; i++) {
                    int64_t key[2] = {ordered[i], 0};
                    const int64_t *hit = bsearch(key, pairs, (size_t)cl, 2 * sizeof *pairs, cmp_pair);
                    idx[i] = hit ? hit[1] : -1;
                }
            }
            free(pairs);
        }
        free(mine);
        mine = ordered;
        ordered = NULL;
    }
    free(ordered);
    if (!want_rindex) {
        free(idx);
        idx = NULL;
    }
    p->positions = mine;
    p->rindex = idx;
    p->len = cl;
    p->keep = keep;
    p->batches = nb;
    if (r == 0 && !(p->batch_map = vf_malloc_array(p->batches > 0 ? (size_t)p->batches : 1, sizeof *p->batch_map)))
        r = VF_ENOMEM;
    for (int64_t b = 0; r == 0 && b < p->batches; b++)
        p->batch_map[b] = -1;
    return r;
}

static void part_free(consumer_part *p)
{
    free(p->positions);
    free(p->rindex);
    free(p->segments);
    free(p->batch_map);
    memset(p, 0, sizeof *p);
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

static int check_epoch_settings(const vf_plan_epoch_settings *s, const vf_plan_task *tasks)
{
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
    return 0;
}

int vf_plan_epoch_build(const vf_plan_epoch_settings *s, int64_t num_positions, const vf_plan_task *tasks,
                        size_t num_tasks, vf_plan_epoch *out)
{
    memset(out, 0, sizeof *out);
    int r = check_epoch_settings(s, tasks);
    if (r < 0)
        return r;
    order o;
    if ((r = order_init(&o, s, num_positions, tasks, num_tasks)) < 0)
        return r;
    int64_t n = o.rn;
    int64_t rank_start, rank_count;
    vf_plan_rank_slice(n, s->rank, s->world_size, s->drop_last, &rank_start, &rank_count);

    /* The consumers to build: the one asked for, or all of the rank (a
     * rank-level plan, or a consumer resuming, which takes its share of
     * every consumer's remaining batches). */
    int redeal = s->consumer >= 0 && s->resume_batch > 0;
    int all = s->consumer < 0 || redeal;
    int first = all ? 0 : s->consumer;
    int np = all ? s->num_consumers : 1;
    consumer_part *parts = vf_calloc((size_t)np, sizeof *parts);
    if (!parts) {
        order_free(&o);
        return VF_ENOMEM;
    }
    int64_t total_batches = 0;
    for (int i = 0; i < np && r == 0; i++) {
        r = build_part(s, &o, s->rank, first + i, 0, &parts[i]);
        total_batches += parts[i].batches;
    }
    int lazy = s->lazy_positions && !tasks;
    if (r == 0 && lazy)
        r = order_clone(&o, (order **)&out->order);
    order_free(&o);

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
    /* One part delivered whole (a one-consumer plan): its positions are the
     * plan's, in order; take them instead of copying (the rank's whole
     * share at world size 1). */
    int steal = r == 0 && !lazy && np == 1 && !redeal && sel_first == 0 && sel_step == 1;
    if (r == 0) {
        if (lazy)
            out->batch_index = vf_malloc_array((size_t)sel_count + 1, sizeof *out->batch_index);
        else
            out->positions = steal ? parts[0].positions
                                   : vf_malloc_array(nsamples > 0 ? (size_t)nsamples : 1, sizeof *out->positions);
        if (steal)
            parts[0].positions = NULL;
        out->batch_start = vf_malloc_array((size_t)sel_count + 1, sizeof *out->batch_start);
        out->batch_consumer = vf_malloc_array((size_t)sel_count + 1, sizeof *out->batch_consumer);
        if (!(lazy ? (void *)out->batch_index : (void *)out->positions) || !out->batch_start || !out->batch_consumer)
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
            if (lazy)
                out->batch_index[i] = p->first_index + lo;
            else if (!steal)
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
        out->epoch_samples = n;
        out->rank_samples = rank_count;
        for (int i = 0; i < np; i++) {
            int c = first + i;
            if (s->consumer >= 0 && c != s->consumer)
                continue;
            int64_t cs, cl, keep, nb;
            part_slice(rank_count, c, s->num_consumers, s->batch_size, s->drop_last, &cs, &cl, &keep, &nb);
            int64_t lo = rank_start + cs, hi = lo + cl;
            if (hi > n)
                out->padded_samples += hi - VF_MAX(lo, n);
            out->empty_consumers += parts[i].keep == 0;
            if (s->drop_last && c == s->num_consumers - 1) {
                /* The rank's short tail (not whole batches), and on the
                 * last rank the epoch's tail past world_size slices. */
                out->dropped_samples += rank_count - rank_count / (int64_t)s->batch_size * (int64_t)s->batch_size;
                if (s->rank == s->world_size - 1)
                    out->dropped_samples += n - rank_count * s->world_size;
            }
        }
    }
    for (int i = 0; i < np; i++)
        part_free(&parts[i]);
    free(parts);
    free(rr_part);
    free(rr_local);
    if (r < 0)
        vf_plan_epoch_free(out);
    return r;
}

/* ---- elastic resume ------------------------------------------------------------------- */

static int cmp_range(const void *pa, const void *pb)
{
    const int64_t *a = pa, *b = pb;
    if (a[0] != b[0])
        return a[0] < b[0] ? -1 : 1;
    return a[1] < b[1] ? -1 : a[1] > b[1];
}

typedef struct range_list {
    int64_t *v;                /* pairs */
    size_t n, cap;
} range_list;

static int range_push(range_list *l, int64_t a, int64_t b)
{
    if (b <= a)
        return 0;
    if (l->n > 0 && l->v[2 * l->n - 1] == a) {
        l->v[2 * l->n - 1] = b;
        return 0;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        int64_t *v = vf_realloc(l->v, cap * 2 * sizeof *v);
        if (!v)
            return VF_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[2 * l->n] = a;
    l->v[2 * l->n + 1] = b;
    l->n++;
    return 0;
}

int vf_plan_remaining(const vf_plan_epoch_settings *s0, int64_t num_positions, const vf_plan_task *tasks,
                      size_t num_tasks, int64_t batches, int64_t **ranges, size_t *num_ranges)
{
    *ranges = NULL;
    *num_ranges = 0;
    vf_plan_epoch_settings s = *s0;
    s.rank = 0;
    s.consumer = -1;
    s.resume_batch = 0;
    int r = check_epoch_settings(&s, tasks);
    if (r < 0)
        return r;
    order o;
    if ((r = order_init(&o, &s, num_positions, tasks, num_tasks)) < 0)
        return r;
    int64_t rn = o.rn;
    int64_t rank_start, rank_count;
    vf_plan_rank_slice(rn, 0, s.world_size, s.drop_last, &rank_start, &rank_count);
    int64_t total = vf_plan_samples_after(rn, s.world_size, s.num_consumers, s.batch_size, s.drop_last, batches);
    if (total < 0) {
        order_free(&o);
        return vf_error(VF_ERANGE, "plan: %lld batches delivered is past the epoch (%lld samples per rank)",
                        (long long)batches, (long long)rank_count);
    }
    /* Delivered restricted indices, as ranges (unsorted across consumers). */
    range_list done = {0};
    for (int c = 0; c < s.num_consumers && r == 0; c++) {
        int64_t j = consumer_delivered(rank_count, c, s.num_consumers, s.batch_size, s.drop_last, batches);
        if (j <= 0)
            continue;
        int64_t cs, cl, keep, nb;
        part_slice(rank_count, c, s.num_consumers, s.batch_size, s.drop_last, &cs, &cl, &keep, &nb);
        int identity = !(s.pool_size > 0 && s.shuffle) && !(tasks && s.shuffle_buffer > 1);
        for (int rank = 0; rank < s.world_size && r == 0; rank++) {
            int64_t lo = rank_count * rank + cs;
            if (identity) {
                /* The first j of [lo, lo + cl) of the restricted sequence, wrapping. */
                int64_t a = lo % (rn > 0 ? rn : 1), left = j;
                while (left > 0 && r == 0) {
                    int64_t take = VF_MIN(left, rn - a);
                    r = range_push(&done, a, a + take);
                    left -= take;
                    a = 0;
                }
                continue;
            }
            consumer_part p = {0};
            r = build_part(&s, &o, rank, c, 1, &p);
            if (r == 0) {
                qsort(p.rindex, (size_t)j, sizeof *p.rindex, cmp_i64);
                for (int64_t i = 0; i < j && r == 0; i++)
                    r = range_push(&done, p.rindex[i], p.rindex[i] + 1);
            }
            part_free(&p);
        }
    }
    /* Complement in [0, rn), mapped to global indices. */
    range_list left = {0};
    if (r == 0) {
        if (done.n > 1)
            qsort(done.v, done.n, 2 * sizeof *done.v, cmp_range);
        int64_t at = 0;
        for (size_t i = 0; i <= done.n && r == 0; i++) {
            int64_t a = i < done.n ? done.v[2 * i] : rn;
            int64_t b = i < done.n ? done.v[2 * i + 1] : rn;
            /* Restricted [at, a) remains: split along the old ranges. */
            while (at < a && r == 0) {
                int64_t g = order_global(&o, at);
                int64_t run = a - at;
                if (o.ranges) {
                    size_t k = find_le(o.range_prefix, o.num_ranges, at);
                    run = VF_MIN(run, o.range_prefix[k + 1] - at);
                }
                r = range_push(&left, g, g + run);
                at += run;
            }
            if (b > at)
                at = b;
        }
    }
    free(done.v);
    order_free(&o);
    if (r < 0) {
        free(left.v);
        return r;
    }
    *ranges = left.v;
    *num_ranges = left.n;
    return 0;
}

/* ---- consumers' pieces (the public task lists) ---------------------------------------- */

static int piece_push(vf_plan_piece **v, size_t *n, size_t *cap, size_t task, int64_t pos, int64_t count)
{
    if (*n > 0) {
        vf_plan_piece *last = &(*v)[*n - 1];
        if (last->task == task && last->first_position + last->num_samples == pos) {
            last->num_samples += count;
            return 0;
        }
    }
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        vf_plan_piece *nv = vf_realloc(*v, nc * sizeof *nv);
        if (!nv)
            return VF_ENOMEM;
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = (vf_plan_piece){task, pos, count};
    return 0;
}

/* The pieces of consumer c of rank `rank` (its part in global order). */
static int part_pieces(const vf_plan_epoch_settings *s, const order *o, int rank, int c, vf_plan_piece **v,
                       size_t *n, size_t *cap)
{
    *n = 0;
    int64_t rank_start, rank_count, cs, cl, keep, nb;
    vf_plan_rank_slice(o->rn, rank, s->world_size, s->drop_last, &rank_start, &rank_count);
    part_slice(rank_count, c, s->num_consumers, s->batch_size, s->drop_last, &cs, &cl, &keep, &nb);
    int64_t j = rank_start + cs, left = keep;
    int r = 0;
    while (left > 0 && r == 0 && o->rn > 0) {
        int64_t jj = j % o->rn;
        int64_t g = order_global(o, jj);
        int64_t run = VF_MIN(left, o->rn - jj);
        if (o->ranges) {
            size_t k = find_le(o->range_prefix, o->num_ranges, jj);
            run = VF_MIN(run, o->range_prefix[k + 1] - jj);
        }
        size_t t = find_le(o->task_prefix, o->num_tasks, g);
        run = VF_MIN(run, o->task_prefix[t + 1] - g);
        size_t task = (size_t)o->task_order[t];
        r = piece_push(v, n, cap, task, o->tasks[task].first_position + (g - o->task_prefix[t]), run);
        j += run;
        left -= run;
    }
    return r;
}

int vf_plan_each_consumer(const vf_plan_epoch_settings *s, int64_t num_positions, const vf_plan_task *tasks,
                          size_t num_tasks,
                          int (*fn)(void *ctx, int rank, int consumer, const vf_plan_piece *pieces, size_t count),
                          void *ctx)
{
    vf_plan_epoch_settings a = *s;
    a.rank = 0;
    a.consumer = -1;
    a.resume_batch = 0;
    int r = check_epoch_settings(&a, tasks);
    if (r == 0 && !tasks)
        r = vf_error(VF_EINVAL, "plan: map mode has no tasks (its samples are random positions)");
    if (r < 0)
        return r;
    order o;
    if ((r = order_init(&o, &a, num_positions, tasks, num_tasks)) < 0)
        return r;
    vf_plan_piece *v = NULL;
    size_t n = 0, cap = 0;
    int first_rank = s->rank >= 0 ? s->rank : 0, last_rank = s->rank >= 0 ? s->rank : s->world_size - 1;
    int first_c = s->consumer >= 0 ? s->consumer : 0, last_c = s->consumer >= 0 ? s->consumer : s->num_consumers - 1;
    for (int rank = first_rank; rank <= last_rank && r == 0; rank++)
        for (int c = first_c; c <= last_c && r == 0; c++) {
            r = part_pieces(&a, &o, rank, c, &v, &n, &cap);
            if (r == 0)
                r = fn(ctx, rank, c, v, n);
        }
    free(v);
    order_free(&o);
    return r;
}
