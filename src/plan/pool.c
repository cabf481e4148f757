/*
 * pool.c: the episode pool's order for one consumer (vf_plan_pool_order,
 * rules in plan.h).
 *
 * The consumer's part is cut into segments (maximal runs of consecutive
 * positions inside one episode). The pool holds up to pool_size segments;
 * each draw picks one of the pool's remaining frames uniformly: a draw u in
 * [0, remaining) is located in the pool's slots through a Fenwick tree of
 * the slots' remaining counts (O(log pool_size)), and inside the slot's
 * segment by index, the drawn frame being swapped with the segment's last
 * remaining one (an incremental Fisher-Yates). An exhausted segment leaves
 * its slot to the next segment of the part. Everything here is a pure
 * function of (part, pool_size, the random stream).
 *
 * Admission order (shuffled pools): the part's segments in position order,
 * which is file order (a LeRobot dataset stores episodes in its data and
 * video files in episode order). The part itself is a random share of the
 * epoch's episode permutation, so which episodes a consumer serves stays
 * random; admitting them in file order makes the pool hold neighbours in
 * the same few MP4s, so each file of the share is opened about once
 * instead of about once per episode and camera (the part order spread an
 * episode's neighbours over the whole epoch). Without shuffling the part is
 * emitted in part order, as before.
 *
 * Invariants: every position of the part is emitted exactly once; segments
 * are admitted in position order (part order without shuffling); at most
 * pool_size segments are in the pool.
 */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

/* The selected episode holding position p (episodes sorted by position). */
static size_t episode_of(const vf_plan_task *episodes, size_t n, int64_t p)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (episodes[mid].first_position <= p)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static void fenwick_add(int64_t *tree, size_t n, size_t slot, int64_t v)
{
    for (size_t i = slot + 1; i <= n; i += i & (~i + 1))
        tree[i] += v;
}

/* The slot holding draw *u (0-based over the slots' counts); *u becomes the
 * offset inside that slot. */
static size_t fenwick_find(const int64_t *tree, size_t n, int64_t *u)
{
    size_t pos = 0, step = 1;
    while (step * 2 <= n)
        step *= 2;
    for (; step; step /= 2) {
        if (pos + step <= n && tree[pos + step] <= *u) {
            pos += step;
            *u -= tree[pos];
        }
    }
    return pos;
}

static int cmp_segment_position(const void *a, const void *b)
{
    const vf_plan_segment *x = a, *y = b;
    return x->first_position < y->first_position ? -1 : x->first_position > y->first_position;
}

/* Splits the part into segments (newly allocated, in part order). */
static int find_segments(const int64_t *part, int64_t n, const vf_plan_task *episodes, size_t num_episodes,
                         int consumer, vf_plan_segment **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    size_t cap = 16, k = 0;
    vf_plan_segment *segs = vf_malloc_array(cap, sizeof *segs);
    if (!segs)
        return VF_ENOMEM;
    int64_t i = 0;
    while (i < n) {
        int64_t p = part[i];
        size_t e = episode_of(episodes, num_episodes, p);
        int64_t end = episodes[e].first_position + episodes[e].num_samples;
        if (p < episodes[e].first_position || p >= end) {
            free(segs);
            return vf_error(VF_EINVAL, "plan: position %lld is in no episode", (long long)p);
        }
        int64_t j = i + 1;
        while (j < n && part[j] == part[j - 1] + 1 && part[j] < end)
            j++;
        if (k == cap) {
            vf_plan_segment *grown = realloc(segs, cap * 2 * sizeof *segs);
            if (!grown) {
                free(segs);
                return VF_ENOMEM;
            }
            segs = grown;
            cap *= 2;
        }
        segs[k] = (vf_plan_segment){.episode = episodes[e].first_episode,
                                    .consumer = consumer,
                                    .first_position = p,
                                    .num_samples = j - i,
                                    .admit_sample = -1,
                                    .evict_sample = -1,
                                    .admit_batch = -1,
                                    .evict_batch = -1};
        k++;
        i = j;
    }
    *out = segs;
    *count = k;
    return 0;
}

int vf_plan_pool_order(const int64_t *part, int64_t n, const vf_plan_task *episodes, size_t num_episodes,
                       size_t pool_size, vf_rng *rng, int consumer, int64_t *out, vf_plan_segment **segments,
                       size_t *num_segments)
{
    *segments = NULL;
    *num_segments = 0;
    if (n > 0 && num_episodes == 0)
        return vf_error(VF_EINVAL, "plan: pool mode needs the episodes");
    vf_plan_segment *segs;
    size_t ns;
    int r = find_segments(part, n, episodes, num_episodes, consumer, &segs, &ns);
    if (r < 0)
        return r;
    if (!rng || pool_size == 0) {
        /* No shuffling: the part in order, one segment after the other. */
        memmove(out, part, (size_t)n * sizeof *out);
        int64_t at = 0;
        for (size_t s = 0; s < ns; s++) {
            segs[s].admit_sample = at;
            at += segs[s].num_samples;
            segs[s].evict_sample = at - 1;
        }
        *segments = segs;
        *num_segments = ns;
        return 0;
    }
    /* File order (see the top of the file); segments never overlap. */
    qsort(segs, ns, sizeof *segs, cmp_segment_position);
    size_t k = VF_MIN(pool_size, ns);
    int64_t *scratch = vf_malloc_array(n > 0 ? (size_t)n : 1, sizeof *scratch);
    int64_t *offset = vf_malloc_array(ns ? ns : 1, sizeof *offset);
    int64_t *tree = vf_calloc(k + 1, sizeof *tree);
    size_t *slot_seg = vf_malloc_array(k ? k : 1, sizeof *slot_seg);
    int64_t *slot_left = vf_malloc_array(k ? k : 1, sizeof *slot_left);
    if (!scratch || !offset || !tree || !slot_seg || !slot_left) {
        free(scratch);
        free(offset);
        free(tree);
        free(slot_seg);
        free(slot_left);
        free(segs);
        return VF_ENOMEM;
    }
    /* Each segment's frames (consecutive positions), in admission order. */
    int64_t at = 0;
    for (size_t s = 0; s < ns; s++) {
        offset[s] = at;
        for (int64_t i = 0; i < segs[s].num_samples; i++)
            scratch[at + i] = segs[s].first_position + i;
        at += segs[s].num_samples;
    }
    size_t next = 0;
    int64_t remaining = 0;
    for (size_t slot = 0; slot < k; slot++, next++) {
        slot_seg[slot] = next;
        slot_left[slot] = segs[next].num_samples;
        segs[next].admit_sample = 0;
        fenwick_add(tree, k, slot, slot_left[slot]);
        remaining += slot_left[slot];
    }
    for (int64_t emitted = 0; remaining > 0; emitted++) {
        int64_t u = (int64_t)vf_rng_below(rng, (uint64_t)remaining);
        size_t slot = fenwick_find(tree, k, &u);
        size_t s = slot_seg[slot];
        int64_t *frames = scratch + offset[s];
        int64_t last = --slot_left[slot];
        out[emitted] = frames[u];
        frames[u] = frames[last];
        fenwick_add(tree, k, slot, -1);
        remaining--;
        if (slot_left[slot] == 0) {
            segs[s].evict_sample = emitted;
            if (next < ns) {
                slot_seg[slot] = next;
                slot_left[slot] = segs[next].num_samples;
                segs[next].admit_sample = emitted + 1;
                fenwick_add(tree, k, slot, slot_left[slot]);
                remaining += slot_left[slot];
                next++;
            }
        }
    }
    free(scratch);
    free(offset);
    free(tree);
    free(slot_seg);
    free(slot_left);
    *segments = segs;
    *num_segments = ns;
    return 0;
}
