/*
 * test_elastic.c: elastic resume at the plan level, exhaustively over
 * small layouts. A run at world size N (W consumers per rank, batch B)
 * stops after a random number of rank-level batches; vf_plan_remaining
 * gives what is left; a run at world size M (W', B') takes over, stops at
 * random again, and a third layout finishes the epoch. In map, stream
 * (with and without a shuffle buffer) and pool modes, with and without
 * drop_last, the union of what the three runs delivered must be the epoch:
 * every sample at least once and no more extra copies than the documented
 * wrap padding (no drop_last), or no sample twice and no more missing than
 * the documented drop_last remainder.
 */
#include "testutil.h"

#include <stdlib.h>

#include "plan/plan.h"

enum { N_EPISODES = 23 };

typedef struct layout {
    int world, consumers;
    size_t batch;
} layout;

typedef struct mode_case {
    const char *name;
    int map, pool;
    size_t buffer;
} mode_case;

static int64_t run_rng(uint64_t *state, int64_t below)
{
    *state = vf_mix64(*state + 0x9E3779B97F4A7C15ull);
    return below > 0 ? (int64_t)(*state % (uint64_t)below) : 0;
}

/* One generation: every rank delivers `stop` rank-level batches (or all of
 * them when stop < 0); counts[] receives the deliveries. Returns the
 * batches delivered, or -1 on failure. *pad / *drop: the documented
 * remainder of this generation's split. */
static int64_t generation(const vf_plan_epoch_settings *base, const layout *lay, int64_t n, const vf_plan_task *tasks,
                          size_t nt, const int64_t *ranges, size_t nr, uint64_t *rng, int finish, int64_t *counts,
                          int64_t *pad, int64_t *drop)
{
    vf_plan_epoch_settings s = *base;
    s.world_size = lay->world;
    s.num_consumers = lay->consumers;
    s.batch_size = lay->batch;
    s.consumer = -1;
    s.ranges = ranges;
    s.num_ranges = nr;
    int64_t rn = vf_plan_ranges_samples(ranges, nr, n);
    int64_t total = vf_plan_rank_batches(rn, lay->world, lay->consumers, lay->batch, s.drop_last);
    int64_t stop = finish ? total : run_rng(rng, total + 1);
    int64_t per = s.drop_last ? rn / lay->world : (rn + lay->world - 1) / lay->world;
    *pad = s.drop_last ? 0 : per * lay->world - rn;
    *drop = s.drop_last ? rn - (int64_t)lay->world * (int64_t)lay->batch * (per / (int64_t)lay->batch) : 0;
    for (int r = 0; r < lay->world; r++) {
        s.rank = r;
        vf_plan_epoch e;
        if (vf_plan_epoch_build(&s, n, tasks, nt, &e) < 0) {
            CHECK(0);
            return -1;
        }
        CHECK_EQ_INT((int64_t)e.num_batches, total);
        for (int64_t i = 0; i < e.batch_start[stop]; i++)
            counts[e.positions[i]]++;
        vf_plan_epoch_free(&e);
    }
    return stop;
}

static void one_case(const mode_case *m, int drop_last, const layout *a, const layout *b, const layout *c,
                     uint64_t seed, const int64_t *lengths)
{
    vf_plan_task tasks[N_EPISODES];
    int64_t n = 0;
    for (size_t e = 0; e < N_EPISODES; e++) {
        tasks[e] = (vf_plan_task){e, 1, n, lengths[e]};
        n += lengths[e];
    }
    vf_plan_epoch_settings base = {.seed = seed, .epoch = 3, .shuffle = 1, .drop_last = drop_last,
                                   .shuffle_buffer = m->buffer, .pool_size = m->pool ? 3 : 0};
    const vf_plan_task *tk = m->map ? NULL : tasks;
    size_t nt = m->map ? 0 : N_EPISODES;
    int64_t *counts = calloc((size_t)n, sizeof *counts);
    uint64_t rng = seed * 7919 + (uint64_t)a->world * 31 + (uint64_t)b->world;
    int64_t pad_total = 0, drop_total = 0, pad, drop;
    const layout *lays[3] = {a, b, c};
    int64_t *ranges = NULL;
    size_t nr = 0;
    for (int g = 0; g < 3; g++) {
        vf_plan_epoch_settings s = base;
        int64_t k = generation(&base, lays[g], n, tk, nt, ranges, nr, &rng, g == 2, counts, &pad, &drop);
        pad_total += pad;
        drop_total += drop;
        if (g == 2 || k < 0)
            break;
        s.world_size = lays[g]->world;
        s.num_consumers = lays[g]->consumers;
        s.batch_size = lays[g]->batch;
        s.ranges = ranges;
        s.num_ranges = nr;
        int64_t *next = NULL;
        size_t nn = 0;
        CHECK_OK(vf_plan_remaining(&s, n, tk, nt, k, &next, &nn));
        free(ranges);
        ranges = next;
        nr = nn;
        if (nr == 0) { /* all delivered */
            int64_t left = 0;
            for (int64_t i = 0; i < n; i++)
                left += counts[i] == 0;
            if (!drop_last)
                CHECK_EQ_INT(left, 0);
            break;
        }
    }
    free(ranges);
    int64_t missing = 0, extra = 0, twice = 0;
    for (int64_t i = 0; i < n; i++) {
        missing += counts[i] == 0;
        extra += counts[i] > 1 ? counts[i] - 1 : 0;
        twice += counts[i] > 1;
    }
    int ok = drop_last ? (twice == 0 && missing <= drop_total) : (missing == 0 && extra <= pad_total);
    if (!ok)
        fprintf(stderr,
                "  %s drop_last %d: %dx%dxb%zu -> %dx%dxb%zu -> %dx%dxb%zu: missing %lld (drop %lld), extra %lld "
                "(pad %lld)\n",
                m->name, drop_last, a->world, a->consumers, a->batch, b->world, b->consumers, b->batch, c->world,
                c->consumers, c->batch, (long long)missing, (long long)drop_total, (long long)extra,
                (long long)pad_total);
    CHECK(ok);
    free(counts);
}

/* Without a stop (k = 0) nothing is delivered and everything remains; at
 * the end of the epoch nothing remains. */
static void test_edges(void)
{
    vf_plan_epoch_settings s = {.seed = 1, .shuffle = 1, .world_size = 3, .num_consumers = 2, .batch_size = 4};
    int64_t *r = NULL;
    size_t nr = 0;
    CHECK_OK(vf_plan_remaining(&s, 100, NULL, 0, 0, &r, &nr));
    CHECK_EQ_INT(nr, 1);
    if (nr == 1)
        CHECK(r[0] == 0 && r[1] == 100);
    free(r);
    int64_t total = vf_plan_rank_batches(100, 3, 2, 4, 0);
    CHECK_OK(vf_plan_remaining(&s, 100, NULL, 0, total, &r, &nr));
    CHECK_EQ_INT(nr, 0);
    free(r);
    CHECK_ERR(vf_plan_remaining(&s, 100, NULL, 0, total + 1, &r, &nr), VF_ERANGE, "past the epoch");
    int64_t bad[] = {5, 10, 8, 20};
    s.ranges = bad;
    s.num_ranges = 2;
    CHECK_ERR(vf_plan_remaining(&s, 100, NULL, 0, 0, &r, &nr), VF_EINVAL, "remaining range 1 [8, 20)");
    vf_plan_epoch e;
    CHECK_ERR(vf_plan_epoch_build(&s, 100, NULL, 0, &e), VF_EINVAL, "not ascending");
    int64_t out[] = {90, 120};
    s.ranges = out;
    s.num_ranges = 1;
    CHECK_ERR(vf_plan_epoch_build(&s, 100, NULL, 0, &e), VF_EINVAL, "inside the epoch");
}

/* drop_last keeps whole batches per rank: the drop is below
 * world * (batch + 1) whatever the consumers (the 1,024 x 8 x 32
 * case dropped 8.3% of an epoch when each consumer dropped its short
 * batch). */
static void test_drop_last_bound(void)
{
    int64_t n = 20000000;
    int world = 1024, consumers = 8;
    size_t batch = 32;
    int64_t batches = vf_plan_rank_batches(n, world, consumers, batch, 1);
    int64_t kept = batches * (int64_t)batch * world;
    CHECK(n - kept < (int64_t)world * ((int64_t)batch + 1));
    CHECK_EQ_INT(kept, (int64_t)world * (int64_t)batch * ((n / world) / (int64_t)batch));
    /* Samples per rank from the counts agree. */
    CHECK_EQ_INT(vf_plan_samples_after(n, world, consumers, batch, 1, batches), batches * (int64_t)batch);
}

int main(void)
{
    test_edges();
    test_drop_last_bound();
    int64_t lengths[N_EPISODES];
    for (int e = 0; e < N_EPISODES; e++)
        lengths[e] = 3 + (e * 7) % 11;
    const mode_case modes[] = {
        {"map", 1, 0, 0},
        {"stream", 0, 0, 0},
        {"stream+buffer", 0, 0, 7},
        {"pool", 0, 1, 0},
    };
    const layout firsts[] = {{1, 1, 4}, {2, 2, 3}, {3, 1, 5}, {4, 2, 4}};
    const layout seconds[] = {{1, 2, 5}, {2, 1, 4}, {3, 3, 3}, {4, 1, 6}};
    const layout third = {2, 2, 4};
    uint64_t seed = 11;
    for (size_t m = 0; m < VF_ARRAY_LEN(modes); m++)
        for (int drop = 0; drop <= 1; drop++)
            for (size_t i = 0; i < VF_ARRAY_LEN(firsts); i++)
                for (size_t j = 0; j < VF_ARRAY_LEN(seconds); j++)
                    for (int rep = 0; rep < 3; rep++)
                        one_case(&modes[m], drop, &firsts[i], &seconds[j], &third, seed++, lengths);
    return vf_test_finish("test_elastic");
}
