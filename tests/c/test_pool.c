/*
 * test_pool.c: the episode pool.
 *
 * Plan level (no video): the pool order is a permutation of the consumer's
 * part; segments split at episode boundaries (also between consecutive
 * positions of two episodes); at most pool_size segments are live at any
 * draw, admitted in part order, each admitted when one is exhausted; pool
 * size 1 emits segment after segment; the same stream gives the same order,
 * another stream another; without shuffle the part in order. The
 * order-free batch counts (vf_plan_samples_after / batches_at) agree with
 * built plans, and consumer plans resumed mid-epoch, taken round-robin from
 * worker 0 the way a DataLoader does, give the rank-level plan's remaining
 * batches.
 *
 * Loader level (make-sample H.264 dataset, windows on a camera and the
 * action): every frame of the epoch exactly once across 2 ranks x 2
 * consumers (plus the documented padding), every value and frame identity
 * right; rank-level loaders interleave their consumers' batches; same seed
 * same bytes for 1 and 2 threads, another seed or epoch another order;
 * admit/evict hooks pair up and every delivered sample's episode is
 * admitted when it arrives; pool mode decodes at most 2 frames per frame
 * delivered (GOP 2) and keeps no decoded frames (batch buffers and decoder
 * cache stay within their bounds); uneven splits and empty consumers warn
 * and count.
 */
#include "test_pool_helpers.h"

#include "plan/plan.h"

static vf_make_sample_settings g_ms;

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* ---- plan level ------------------------------------------------------------------------- */

static void episodes_of(const int64_t *lengths, size_t n, vf_plan_task **tasks, size_t *num)
{
    int64_t *video = calloc(n, sizeof *video), *data = calloc(n, sizeof *data);
    vf_plan_input in = {n, (int64_t *)lengths, 0, video, data};
    CHECK_OK(vf_plan_partition(&in, VF_PARTITION_EPISODE, 1, tasks, num));
    free(video);
    free(data);
}

static size_t segment_of(const vf_plan_segment *segs, size_t n, int64_t p)
{
    for (size_t i = 0; i < n; i++)
        if (p >= segs[i].first_position && p < segs[i].first_position + segs[i].num_samples)
            return i;
    return (size_t)-1;
}

static void test_pool_order_rules(void)
{
    /* Episodes 0..5; positions: 0-4, 5-11, 12-14, 15-23, 24-27, 28-33. */
    const int64_t lengths[] = {5, 7, 3, 9, 4, 6};
    vf_plan_task *eps;
    size_t ne;
    episodes_of(lengths, 6, &eps, &ne);
    /* A part: the tail of episode 3, episodes 0 and 1 (adjacent positions
     * 4 -> 5 across the boundary), 5, and the head of 2. */
    int64_t part[64];
    int64_t n = 0;
    for (int64_t p = 19; p < 24; p++)
        part[n++] = p;
    for (int64_t p = 0; p < 12; p++)
        part[n++] = p;
    for (int64_t p = 28; p < 34; p++)
        part[n++] = p;
    for (int64_t p = 12; p < 14; p++)
        part[n++] = p;
    const size_t expect_segments = 5; /* 3-tail, 0, 1, 5, 2-head */
    const size_t pool_sizes[] = {1, 2, 3, 10};
    for (size_t t = 0; t < VF_ARRAY_LEN(pool_sizes); t++) {
        size_t k = pool_sizes[t];
        int64_t out[64], again[64], sorted_in[64], sorted_out[64];
        vf_plan_segment *segs = NULL, *segs2 = NULL;
        size_t ns = 0, ns2 = 0;
        vf_rng rng;
        vf_rng_init(&rng, vf_rng_derive(7, VF_PLAN_RNG_POOL, 0, 0, 0));
        CHECK_OK(vf_plan_pool_order(part, n, eps, ne, k, &rng, 3, out, &segs, &ns));
        CHECK_EQ_INT(ns, expect_segments);
        if (ns != expect_segments) {
            free(segs);
            continue;
        }
        /* A permutation of the part. */
        memcpy(sorted_in, part, (size_t)n * sizeof *part);
        memcpy(sorted_out, out, (size_t)n * sizeof *out);
        qsort(sorted_in, (size_t)n, sizeof(int64_t), cmp_i64);
        qsort(sorted_out, (size_t)n, sizeof(int64_t), cmp_i64);
        CHECK(memcmp(sorted_in, sorted_out, (size_t)n * sizeof(int64_t)) == 0);
        /* Segments in position (file) order, whatever the part's order,
         * each inside one episode: 0, 1, 2-head, 3-tail, 5. */
        CHECK_EQ_INT(segs[0].first_position, 0);
        CHECK_EQ_INT(segs[0].num_samples, 5);
        CHECK_EQ_INT(segs[0].episode, 0);
        CHECK_EQ_INT(segs[1].first_position, 5);
        CHECK_EQ_INT(segs[1].num_samples, 7);
        CHECK_EQ_INT(segs[1].episode, 1);
        CHECK_EQ_INT(segs[2].first_position, 12);
        CHECK_EQ_INT(segs[2].num_samples, 2);
        CHECK_EQ_INT(segs[2].episode, 2);
        CHECK_EQ_INT(segs[3].first_position, 19);
        CHECK_EQ_INT(segs[3].num_samples, 5);
        CHECK_EQ_INT(segs[3].episode, 3);
        CHECK_EQ_INT(segs[4].first_position, 28);
        CHECK_EQ_INT(segs[4].episode, 5);
        for (size_t i = 0; i < ns; i++)
            CHECK_EQ_INT(segs[i].consumer, 3);
        /* Admission and eviction: evict = the last draw of the segment;
         * the first k admitted at 0, later ones right after an eviction; at
         * most k live; admitted in position order. */
        int64_t last_draw[5] = {-1, -1, -1, -1, -1};
        int ok = 1;
        for (int64_t i = 0; i < n; i++) {
            size_t s = segment_of(segs, ns, out[i]);
            ok &= s < ns && segs[s].admit_sample <= i && i <= segs[s].evict_sample;
            if (s < ns)
                last_draw[s] = i;
            size_t live = 0;
            for (size_t j = 0; j < ns; j++)
                live += segs[j].admit_sample <= i && i <= segs[j].evict_sample;
            ok &= live <= k;
        }
        CHECK(ok);
        for (size_t i = 0; i < ns; i++) {
            CHECK_EQ_INT(segs[i].evict_sample, last_draw[i]);
            if (i < k) {
                CHECK_EQ_INT(segs[i].admit_sample, 0);
            } else {
                int after_evict = 0;
                for (size_t j = 0; j < i; j++)
                    after_evict |= segs[j].evict_sample + 1 == segs[i].admit_sample;
                CHECK(after_evict);
                CHECK(segs[i].admit_sample >= segs[i - 1].admit_sample);
            }
        }
        if (k == 1) { /* segment after segment */
            int64_t at = 0;
            for (size_t i = 0; i < ns; i++) {
                for (int64_t j = 0; j < segs[i].num_samples; j++)
                    ok &= segment_of(segs, ns, out[at + j]) == i;
                at += segs[i].num_samples;
            }
            CHECK(ok);
        }
        /* Same stream, same order; another stream, another order. */
        vf_rng_init(&rng, vf_rng_derive(7, VF_PLAN_RNG_POOL, 0, 0, 0));
        CHECK_OK(vf_plan_pool_order(part, n, eps, ne, k, &rng, 3, again, &segs2, &ns2));
        CHECK(memcmp(out, again, (size_t)n * sizeof *out) == 0);
        free(segs2);
        vf_rng_init(&rng, vf_rng_derive(8, VF_PLAN_RNG_POOL, 0, 0, 0));
        CHECK_OK(vf_plan_pool_order(part, n, eps, ne, k, &rng, 3, again, &segs2, &ns2));
        CHECK(memcmp(out, again, (size_t)n * sizeof *out) != 0);
        free(segs2);
        free(segs);
    }
    /* No shuffle: the part as it is. */
    int64_t out[64];
    vf_plan_segment *segs = NULL;
    size_t ns = 0;
    CHECK_OK(vf_plan_pool_order(part, n, eps, ne, 4, NULL, 0, out, &segs, &ns));
    CHECK(memcmp(out, part, (size_t)n * sizeof *out) == 0);
    CHECK_EQ_INT(ns, expect_segments);
    if (ns == expect_segments)
        CHECK_EQ_INT(segs[1].admit_sample, 5);
    free(segs);
    /* Empty part. */
    CHECK_OK(vf_plan_pool_order(part, 0, eps, ne, 4, NULL, 0, out, &segs, &ns));
    CHECK_EQ_INT(ns, 0);
    free(segs);
    free(eps);
}

/* Mixing: with a pool as large as the part, the first draws come from many
 * segments; with a pool of 2, from at most 2 (the first draw's pool). */
static void test_pool_mixing(void)
{
    int64_t lengths[40];
    for (int i = 0; i < 40; i++)
        lengths[i] = 10;
    vf_plan_task *eps;
    size_t ne;
    episodes_of(lengths, 40, &eps, &ne);
    int64_t part[400], out[400];
    for (int i = 0; i < 400; i++)
        part[i] = i;
    size_t sizes[] = {40, 2};
    for (int t = 0; t < 2; t++) {
        vf_rng rng;
        vf_rng_init(&rng, vf_rng_derive(1, VF_PLAN_RNG_POOL, 0, 0, 0));
        vf_plan_segment *segs = NULL;
        size_t ns = 0;
        CHECK_OK(vf_plan_pool_order(part, 400, eps, ne, sizes[t], &rng, 0, out, &segs, &ns));
        CHECK_EQ_INT(ns, 40);
        int seen[40] = {0}, distinct = 0;
        for (int i = 0; i < 10; i++)
            if (!seen[out[i] / 10]++)
                distinct++;
        if (t == 0)
            CHECK(distinct >= 6); /* 10 draws over 40 equal episodes: ~9 distinct expected */
        else
            CHECK(distinct <= 2 && out[0] / 10 <= 1);
        free(segs);
    }
    free(eps);
}

/* The order-free counts match what plans build. */
static void test_counts_match_plans(void)
{
    const int64_t ns[] = {0, 1, 7, 103};
    const int worlds[] = {1, 2, 3};
    const int consumers[] = {1, 3};
    const size_t batches[] = {1, 4, 50};
    for (size_t a = 0; a < VF_ARRAY_LEN(ns); a++)
        for (size_t w = 0; w < VF_ARRAY_LEN(worlds); w++)
            for (size_t c = 0; c < VF_ARRAY_LEN(consumers); c++)
                for (size_t bs = 0; bs < VF_ARRAY_LEN(batches); bs++)
                    for (int drop = 0; drop < 2; drop++) {
                        vf_plan_epoch_settings s = {.seed = 1, .shuffle = 1, .rank = worlds[w] - 1,
                                                    .world_size = worlds[w], .num_consumers = consumers[c],
                                                    .consumer = -1, .batch_size = batches[bs], .drop_last = drop};
                        vf_plan_epoch e;
                        CHECK_OK(vf_plan_epoch_build(&s, ns[a], NULL, 0, &e));
                        int ok = 1;
                        for (size_t k = 0; k <= e.num_batches; k++) {
                            ok &= vf_plan_samples_after(ns[a], worlds[w], consumers[c], batches[bs], drop,
                                                        (int64_t)k) == e.batch_start[k];
                            ok &= vf_plan_batches_at(ns[a], worlds[w], consumers[c], batches[bs], drop,
                                                     e.batch_start[k]) == (int64_t)k;
                            if (k < e.num_batches && e.batch_start[k + 1] - e.batch_start[k] > 1)
                                ok &= vf_plan_batches_at(ns[a], worlds[w], consumers[c], batches[bs], drop,
                                                         e.batch_start[k] + 1) == -1;
                        }
                        ok &= vf_plan_samples_after(ns[a], worlds[w], consumers[c], batches[bs], drop,
                                                    (int64_t)e.num_batches + 1) == -1;
                        ok &= vf_plan_batches_at(ns[a], worlds[w], consumers[c], batches[bs], drop,
                                                 e.num_samples + 1) == -1;
                        if (!ok)
                            fprintf(stderr, "  counts differ: n %lld world %d consumers %d batch %zu drop %d\n",
                                    (long long)ns[a], worlds[w], consumers[c], batches[bs], drop);
                        CHECK(ok);
                        vf_plan_epoch_free(&e);
                    }
}

/* Workers resumed at k, taken round-robin from worker 0 (skipping
 * exhausted ones, as torch's DataLoader does), give the rank's batches
 * from k on. */
static void test_worker_redeal(void)
{
    int64_t lengths[9];
    int64_t total = 0;
    for (int i = 0; i < 9; i++) {
        lengths[i] = 5 + (i * 7) % 11;
        total += lengths[i];
    }
    vf_plan_task *eps;
    size_t ne;
    episodes_of(lengths, 9, &eps, &ne);
    for (int pool = 0; pool < 2; pool++)
        for (int drop = 0; drop < 2; drop++) {
            vf_plan_epoch_settings s = {.seed = 4, .epoch = 2, .shuffle = 1, .rank = 1, .world_size = 2,
                                        .num_consumers = 3, .consumer = -1, .batch_size = 4, .drop_last = drop,
                                        .pool_size = pool ? 2 : 0};
            vf_plan_epoch whole;
            CHECK_OK(vf_plan_epoch_build(&s, total, pool ? eps : NULL, ne, &whole));
            for (size_t k = 0; k <= whole.num_batches; k++) {
                vf_plan_epoch w[3];
                size_t next[3] = {0, 0, 0};
                for (int c = 0; c < 3; c++) {
                    vf_plan_epoch_settings sc = s;
                    sc.consumer = c;
                    sc.resume_batch = (int64_t)k;
                    CHECK_OK(vf_plan_epoch_build(&sc, total, pool ? eps : NULL, ne, &w[c]));
                }
                /* The DataLoader: worker 0, 1, 2, 0, ...; exhausted ones skipped. */
                size_t b = k;
                int ok = 1, active = 3;
                int done[3] = {0, 0, 0};
                for (int c = 0; active > 0; c = (c + 1) % 3) {
                    if (done[c])
                        continue;
                    if (next[c] >= w[c].num_batches) {
                        done[c] = 1;
                        active--;
                        continue;
                    }
                    size_t i = next[c]++;
                    int64_t len = w[c].batch_start[i + 1] - w[c].batch_start[i];
                    ok &= b < whole.num_batches && len == whole.batch_start[b + 1] - whole.batch_start[b] &&
                          memcmp(w[c].positions + w[c].batch_start[i], whole.positions + whole.batch_start[b],
                                 (size_t)len * sizeof(int64_t)) == 0;
                    b++;
                }
                ok &= b == whole.num_batches;
                if (!ok)
                    fprintf(stderr, "  worker re-deal differs: pool %d drop_last %d resume %zu\n", pool, drop, k);
                CHECK(ok);
                for (int c = 0; c < 3; c++)
                    vf_plan_epoch_free(&w[c]);
            }
            /* A rank-level plan resumed at k starts delivering there. */
            vf_plan_epoch_settings sr = s;
            sr.resume_batch = 3;
            vf_plan_epoch part;
            CHECK_OK(vf_plan_epoch_build(&sr, total, pool ? eps : NULL, ne, &part));
            CHECK_EQ_INT(part.first_batch, 3);
            CHECK(part.num_samples == whole.num_samples &&
                  memcmp(part.positions, whole.positions, (size_t)whole.num_samples * sizeof(int64_t)) == 0);
            vf_plan_epoch_free(&part);
            sr.resume_batch = (int64_t)whole.num_batches + 1;
            CHECK_ERR(vf_plan_epoch_build(&sr, total, pool ? eps : NULL, ne, &part), VF_ERANGE, "resume at batch");
            vf_plan_epoch_free(&whole);
        }
    free(eps);
}

/* ---- loader level ------------------------------------------------------------------------ */

typedef struct hook_log {
    int64_t delivered;         /* samples delivered so far (set by the test) */
    size_t num_episodes;
    int *live;                 /* per selected episode: admitted segments not yet evicted */
    int *evicted_now;          /* per selected episode: evictions during the current call */
    int64_t admits, evicts;
    int64_t bad;               /* events that break the pairing or carry wrong fields */
    const vf_dataset *d;
} hook_log;

static void on_admit(void *ctx, const vf_pool_event *e)
{
    hook_log *h = ctx;
    h->admits++;
    if (e->episode >= h->num_episodes || e->num_frames < 1 || e->first_frame < 0 ||
        e->first_frame + e->num_frames > vf_dataset_episode(h->d, e->episode)->length ||
        e->episode_index != vf_dataset_episode(h->d, e->episode)->episode_index) {
        h->bad++;
        return;
    }
    h->live[e->episode]++;
}

static void on_evict(void *ctx, const vf_pool_event *e)
{
    hook_log *h = ctx;
    h->evicts++;
    if (e->episode >= h->num_episodes || h->live[e->episode] <= 0) {
        h->bad++;
        return;
    }
    h->live[e->episode]--;
    h->evicted_now[e->episode]++;
}

static size_t episode_pos(const vf_dataset *d, int64_t position)
{
    int64_t start = 0;
    for (size_t i = 0; i < vf_dataset_num_episodes(d); i++) {
        start += vf_dataset_episode(d, i)->length;
        if (position < start)
            return i;
    }
    return (size_t)-1;
}

/* 2 ranks x 2 consumers, each consumer its own loader: exactly once plus padding. */
static void test_coverage(vf_dataset *d)
{
    int64_t n = 0, total = 0, bad = 0, rank_total[2] = {0, 0};
    int64_t *seen = NULL;
    for (int rank = 0; rank < 2; rank++) {
        tp_run rank_runs[2];
        for (int c = 0; c < 2; c++) {
            vf_loader_settings ls;
            tp_settings(&ls, VF_MODE_POOL, 21, 5, 2);
            ls.rank = rank;
            ls.world_size = 2;
            ls.num_consumers = 2;
            ls.consumer = c;
            ls.episode_pool_size = 3;
            vf_loader *l = NULL;
            CHECK_OK(vf_loader_open(&l, d, &ls));
            if (!l)
                return;
            if (!seen) {
                n = vf_loader_num_positions(l);
                seen = calloc((size_t)n, sizeof *seen);
            }
            memset(&rank_runs[c], 0, sizeof rank_runs[c]);
            tp_take(l, d, SIZE_MAX, 1, g_ms.state_dim, &rank_runs[c]);
            CHECK_EQ_INT(rank_runs[c].rc, VF_EOF);
            CHECK_EQ_INT(rank_runs[c].count, vf_loader_num_samples(l));
            bad += rank_runs[c].bad;
            for (int64_t i = 0; i < rank_runs[c].count; i++)
                seen[rank_runs[c].positions[i]]++;
            total += rank_runs[c].count;
            rank_total[rank] += rank_runs[c].count;
            vf_loader_close(l);
        }
        /* The rank-level loader yields the consumers' batches round-robin. */
        vf_loader_settings ls;
        tp_settings(&ls, VF_MODE_POOL, 21, 5, 2);
        ls.rank = rank;
        ls.world_size = 2;
        ls.num_consumers = 2;
        ls.episode_pool_size = 3;
        vf_loader *l = NULL;
        CHECK_OK(vf_loader_open(&l, d, &ls));
        if (l) {
            tp_run all = {0};
            tp_take(l, d, SIZE_MAX, 0, g_ms.state_dim, &all);
            size_t next[2] = {0, 0};
            int ok = 1;
            size_t b = 0;
            for (int c = 0; b < all.batches; c = 1 - c) {
                if (next[c] >= rank_runs[c].batches)
                    continue;
                ok &= tp_batch_equal(&rank_runs[c], next[c]++, &all, b++);
            }
            ok &= next[0] == rank_runs[0].batches && next[1] == rank_runs[1].batches;
            CHECK(ok);
            tp_run_free(&all);
            vf_loader_close(l);
        }
        tp_run_free(&rank_runs[0]);
        tp_run_free(&rank_runs[1]);
    }
    CHECK_EQ_INT(bad, 0);
    int64_t per_rank = (n + 1) / 2, missing = 0, extra = 0;
    CHECK_EQ_INT(total, 2 * per_rank);
    CHECK_EQ_INT(rank_total[0], per_rank); /* every rank the same count (DDP steps in lockstep) */
    CHECK_EQ_INT(rank_total[1], per_rank);
    CHECK(n % 2 == 1); /* the dataset is odd-sized, so the padding rule is exercised */
    for (int64_t i = 0; i < n; i++) {
        missing += seen[i] == 0;
        extra += seen[i] > 1 ? seen[i] - 1 : 0;
    }
    CHECK_EQ_INT(missing, 0);
    CHECK_EQ_INT(extra, 2 * per_rank - n);
    free(seen);
}

static void run_pool(vf_dataset *d, uint64_t seed, int64_t epoch, int threads, tp_run *out)
{
    vf_loader_settings ls;
    tp_settings(&ls, VF_MODE_POOL, seed, 6, threads);
    ls.epoch = epoch;
    ls.episode_pool_size = 4;
    vf_loader *l = NULL;
    memset(out, 0, sizeof *out);
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (!l)
        return;
    tp_take(l, d, SIZE_MAX, 0, g_ms.state_dim, out);
    vf_loader_close(l);
}

static int exactly_once(const tp_run *r, int64_t n)
{
    if (r->count != n)
        return 0;
    int64_t *c = malloc((size_t)(n ? n : 1) * sizeof *c);
    memcpy(c, r->positions, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_i64);
    int ok = 1;
    for (int64_t i = 0; i < n; i++)
        ok &= c[i] == i;
    free(c);
    return ok;
}

static void test_determinism(vf_dataset *d, int64_t n)
{
    tp_run a, b, c, e1;
    run_pool(d, 5, 0, 1, &a);
    run_pool(d, 5, 0, 2, &b);
    run_pool(d, 6, 0, 2, &c);
    run_pool(d, 5, 1, 2, &e1);
    CHECK(exactly_once(&a, n));
    CHECK(exactly_once(&c, n));
    CHECK(exactly_once(&e1, n));
    CHECK(a.batches == b.batches && tp_same_batches(&a, 0, &b, a.batches)); /* threads do not matter */
    CHECK(memcmp(a.positions, c.positions, (size_t)n * sizeof(int64_t)) != 0);  /* the seed does */
    CHECK(memcmp(a.positions, e1.positions, (size_t)n * sizeof(int64_t)) != 0); /* epochs reshuffle */
    /* Random frames, not runs: few successors are the next frame. */
    int64_t runs = 0;
    for (int64_t i = 1; i < a.count; i++)
        runs += a.positions[i] == a.positions[i - 1] + 1;
    CHECK(runs < a.count / 4);
    tp_run_free(&a);
    tp_run_free(&b);
    tp_run_free(&c);
    tp_run_free(&e1);
}

/* Hooks pair up, every delivered sample's episode is admitted when it
 * arrives, the pool is the working set of the decoder cache, decoding
 * costs at most 2 frames per frame (GOP 2), and no decoded frames are kept. */
static void test_hooks_and_memory(vf_dataset *d, int64_t n)
{
    size_t ne = vf_dataset_num_episodes(d);
    hook_log h = {0};
    h.num_episodes = ne;
    h.live = calloc(ne, sizeof *h.live);
    h.evicted_now = calloc(ne, sizeof *h.evicted_now);
    h.d = d;
    vf_loader_settings ls;
    tp_settings(&ls, VF_MODE_POOL, 3, 4, 2);
    ls.episode_pool_size = 3;
    ls.prefetch_batches = 2;
    ls.pool_hooks = (vf_pool_hooks){on_admit, on_evict, &h};
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (!l) {
        free(h.live);
        free(h.evicted_now);
        return;
    }
    vf_loader_stats st;
    vf_loader_get_stats(l, &st);
    CHECK_EQ_INT(st.cache_capacity, 3 * 2); /* pool 3 x 2 cameras; threads share readers (default) */
    vf_batch *b;
    int64_t not_live = 0, delivered = 0, bad = 0;
    size_t max_cache = 0, max_buffers = 0;
    /* A sample's episode is admitted before its batch arrives and evicted
     * no earlier than in the call delivering it. */
    while (memset(h.evicted_now, 0, ne * sizeof *h.evicted_now), vf_loader_next(l, &b) == 0) {
        for (size_t i = 0; i < vf_batch_size(b); i++) {
            size_t e = episode_pos(d, vf_batch_positions(b)[i]);
            not_live += e >= ne || h.live[e] + h.evicted_now[e] <= 0;
        }
        bad += tp_check_batch(d, b, g_ms.state_dim, 1);
        delivered += (int64_t)vf_batch_size(b);
        vf_batch_release(b);
        vf_loader_get_stats(l, &st);
        max_cache = VF_MAX(max_cache, st.cache_entries);
        max_buffers = VF_MAX(max_buffers, st.batch_buffers);
    }
    CHECK_EQ_INT(delivered, n);
    CHECK_EQ_INT(not_live, 0);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(h.bad, 0);
    CHECK(h.admits >= (int64_t)ne); /* every episode at least once (more when split over segments) */
    CHECK_EQ_INT(h.admits, h.evicts);
    vf_loader_get_stats(l, &st);
    CHECK_EQ_INT(st.pool_segments, 0);
    CHECK_EQ_INT(st.pool_admitted, (uint64_t)h.admits);
    CHECK_EQ_INT(st.pool_evicted, (uint64_t)h.evicts);
    /* Decoding: each delivered frame costs at most 2 decoded (GOP 2), windows included. */
    CHECK(st.frames_delivered == (uint64_t)n * 3); /* cam0 window of 2 + cam1 */
    CHECK(st.frames_decoded <= 2 * st.frames_delivered);
    fprintf(stderr, "  pool: %llu frames decoded for %llu delivered (%.2f per frame), %llu decoder opens\n",
            (unsigned long long)st.frames_decoded, (unsigned long long)st.frames_delivered,
            (double)st.frames_decoded / (double)st.frames_delivered, (unsigned long long)st.video_opens);
    /* Memory: batch buffers bounded by the window, readers by the cache bound. */
    CHECK(max_buffers <= st.window + 1);
    CHECK(max_cache <= st.cache_capacity);
    /* Abandoning an epoch mid-way evicts what is admitted. */
    CHECK_OK(vf_loader_set_epoch(l, 1));
    CHECK_OK(vf_loader_next(l, &b));
    vf_batch_release(b);
    CHECK(h.admits > h.evicts);
    CHECK_OK(vf_loader_set_epoch(l, 2));
    vf_loader_close(l);
    CHECK_EQ_INT(h.admits, h.evicts);
    CHECK_EQ_INT(h.bad, 0);
    free(h.live);
    free(h.evicted_now);

    /* The cache bound: pool x cameras x consumers x threads, capped at 128; explicit wins. */
    tp_settings(&ls, VF_MODE_POOL, 3, 4, 1);
    ls.episode_pool_size = 100;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        vf_loader_get_stats(l, &st);
        CHECK_EQ_INT(st.cache_capacity, 128);
        vf_loader_close(l);
    }
    ls.decoder_cache_entries = 5;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        vf_loader_get_stats(l, &st);
        CHECK_EQ_INT(st.cache_capacity, 5);
        vf_loader_close(l);
    }
    tp_settings(&ls, VF_MODE_STREAM, 3, 4, 1);
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        vf_loader_get_stats(l, &st);
        CHECK_EQ_INT(st.cache_capacity, 32);
        vf_loader_close(l);
    }
}

/* Without shuffle: the episodes in order, each one's frames in order. */
static void test_no_shuffle(vf_dataset *d, int64_t n)
{
    vf_loader_settings ls;
    tp_settings(&ls, VF_MODE_POOL, 3, 7, 1);
    ls.shuffle = 0;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (!l)
        return;
    tp_run r = {0};
    tp_take(l, d, SIZE_MAX, 0, g_ms.state_dim, &r);
    int ok = r.count == n;
    for (int64_t i = 0; ok && i < n; i++)
        ok = r.positions[i] == i;
    CHECK(ok);
    tp_run_free(&r);
    vf_loader_close(l);
}

/* Uneven splits and consumers without samples warn and count. */
static void test_warnings(vf_dataset *d, int64_t n)
{
    vf_loader_settings ls;
    tp_settings(&ls, VF_MODE_POOL, 1, 4, 1);
    ls.world_size = 7; /* the test dataset's frame count is not a multiple of 7 (checked below) */
    ls.rank = 6;
    vf_loader *l = NULL;
    vf_set_log_level(-1);
    CHECK_OK(vf_loader_open(&l, d, &ls));
    CHECK(n % 7 != 0);
    if (l) {
        vf_loader_stats st;
        vf_loader_get_stats(l, &st);
        int64_t per = (n + 6) / 7;
        CHECK_EQ_INT(st.padded_samples, per * 7 - n);
        CHECK_EQ_INT(st.warnings, 1);
        CHECK_EQ_INT(vf_loader_num_warnings(l), 1);
        const char *w = vf_loader_warning(l, 0);
        CHECK(w && strstr(w, "world_size 7 does not divide") && strstr(w, "repeated"));
        CHECK(vf_loader_warning_is_global(l, 0) == 1); /* the same text on every rank */
        CHECK(vf_loader_warning_is_global(l, 1) == 0); /* out of range */
        /* Once per loader, not once per epoch. */
        CHECK_OK(vf_loader_set_epoch(l, 1));
        CHECK_EQ_INT(vf_loader_num_warnings(l), 1);
        CHECK(vf_loader_warning(l, 1) == NULL);
        vf_loader_close(l);
    }
    ls.drop_last = 1;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        vf_loader_stats st;
        vf_loader_get_stats(l, &st);
        CHECK(st.dropped_samples >= n % 7);
        CHECK(vf_loader_num_warnings(l) >= 1 && strstr(vf_loader_warning(l, 0), "drop_last drops"));
        vf_loader_close(l);
    }
    /* More consumers than samples per rank: empty ones. */
    tp_settings(&ls, VF_MODE_POOL, 1, 4, 1);
    ls.num_consumers = (int)n + 3;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        vf_loader_stats st;
        vf_loader_get_stats(l, &st);
        CHECK_EQ_INT(st.empty_consumers, 3);
        CHECK(st.warnings == 1 && strstr(vf_loader_warning(l, 0), "3 consumers of rank 0 get no samples"));
        CHECK(vf_loader_warning_is_global(l, 0) == 0); /* about this rank */
        CHECK(strstr(vf_loader_warning(l, 0), "no episodes to pool") != NULL);
        tp_run r = {0};
        tp_take(l, d, SIZE_MAX, 0, g_ms.state_dim, &r);
        CHECK(exactly_once(&r, n));
        tp_run_free(&r);
        vf_loader_close(l);
    }
    /* Printed on stderr: a global warning by rank 0 only, nothing when the
     * caller reports warnings itself (log_warnings = 0), once per process. */
    {
        vf_set_log_level(VF_LOG_WARN);
        char text[4096];
        tp_settings(&ls, VF_MODE_POOL, 1, 4, 1);
        ls.world_size = 7;
        ls.drop_last = 1;
        vf_test_capture_stderr_begin();
        for (int rank = 6; rank >= 0; rank--) {
            ls.rank = rank;
            ls.log_warnings = rank != 0; /* rank 0 first opens as the Python binding does */
            CHECK_OK(vf_loader_open(&l, d, &ls));
            vf_loader_close(l);
        }
        vf_test_capture_stderr_end(text, sizeof text);
        CHECK(text[0] == 0); /* ranks 6..1 global: silent; rank 0 with log_warnings 0: silent */
        ls.log_warnings = 1;
        vf_test_capture_stderr_begin();
        for (int i = 0; i < 2; i++) {
            CHECK_OK(vf_loader_open(&l, d, &ls));
            vf_loader_close(l);
        }
        vf_test_capture_stderr_end(text, sizeof text);
        const char *first = strstr(text, "drop_last drops");
        CHECK(first && !strstr(first + 1, "drop_last drops")); /* printed once for two loaders */
        vf_set_log_level(-1);
    }
    /* Even splits: no warning. */
    tp_settings(&ls, VF_MODE_POOL, 1, 4, 1);
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        CHECK_EQ_INT(vf_loader_num_warnings(l), 0);
        vf_loader_close(l);
    }
    vf_set_log_level(0);
}

int main(void)
{
    test_pool_order_rules();
    test_pool_mixing();
    test_counts_match_plans();
    test_worker_redeal();

    char *root = make_dataset("pool", 12, TP_FPS, 0.03, &g_ms);
    vf_dataset *d = open_dataset(root, NULL, 0);
    int64_t n = 0;
    for (size_t i = 0; i < vf_dataset_num_episodes(d); i++)
        n += vf_dataset_episode(d, i)->length;
    test_coverage(d);
    test_determinism(d, n);
    test_hooks_and_memory(d, n);
    test_no_shuffle(d, n);
    test_warnings(d, n);
    vf_dataset_close(d);
    remove_dataset(root);
    return vf_test_finish("test_pool");
}
