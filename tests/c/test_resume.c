/*
 * test_resume.c: loader states (vf_loader_get_state / set_state /
 * settings.resume / vf_loader_state_at) on a make-sample H.264 dataset
 * with windows on a camera and the action.
 *
 * Proves: for map, stream (shuffle buffer) and pool modes, a loader
 * resumed at many random batch boundaries (opened with the state, or
 * switched to it with set_state, with 1 or 2 engine threads) yields the
 * remaining batches of the epoch byte for byte equal to an uninterrupted
 * run, and assembles nothing before the resume point (samples_assembled ==
 * the remaining samples; at most 2 decoded frames per frame delivered);
 * states at the end of an epoch and in a later epoch; one state (computed
 * with vf_loader_state_at, equal to a rank-level loader's) resumes every
 * rank and every worker of 2 ranks x 2 workers, the workers taken
 * round-robin from worker 0 as a restarted DataLoader takes them; pool
 * hooks re-admit the segments live at the resume point and pair up; states
 * that do not fit are refused with the differences named (other dataset,
 * episode selection, seed, batch_size, world_size, consumers, mode, pool
 * size, shuffle, drop_last, a sample count inside a batch, another
 * version, an edited record), the loader unchanged; settings that do not
 * affect the order (threads, prefetch, image format) may change; an
 * elastic restore is recorded as generations (resolved, reported by a
 * loader, chained), and a generation whose replay disagrees with it, a
 * malformed one, too many, or one in a version 2 state are refused.
 */
#include "test_pool_helpers.h"

#include "engine/loader_internal.h" /* vf_engine_state_hash: a tampered generation with a valid hash */

static vf_make_sample_settings g_ms;

static void mode_settings(vf_loader_settings *ls, vf_mode mode, int threads)
{
    tp_settings(ls, mode, 17, 5, threads);
    ls->shuffle_buffer = mode == VF_MODE_STREAM ? 8 : 0;
    ls->partition = VF_PARTITION_EPISODE;
    ls->episode_pool_size = 3;
}

static void reference(vf_dataset *d, const vf_loader_settings *ls, int64_t epoch, tp_run *out)
{
    vf_loader_settings s = *ls;
    s.epoch = epoch;
    vf_loader *l = NULL;
    memset(out, 0, sizeof *out);
    CHECK_OK(vf_loader_open(&l, d, &s));
    if (!l)
        return;
    tp_take(l, d, SIZE_MAX, 1, g_ms.state_dim, out);
    CHECK_EQ_INT(out->rc, VF_EOF);
    CHECK_EQ_INT(out->bad, 0);
    vf_loader_close(l);
}

/* Resumes at batch k of `ref` in both ways and compares the rest. */
static void resume_at(vf_dataset *d, const vf_loader_settings *base, const tp_run *ref, size_t k, int threads)
{
    vf_loader_settings ls = *base;
    ls.threads = 3 - threads; /* the interrupted run used the other thread count */
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (!l)
        return;
    tp_run head = {0};
    tp_take(l, d, k, 0, g_ms.state_dim, &head);
    CHECK(tp_same_batches(ref, 0, &head, k));
    vf_loader_state st;
    CHECK_OK(vf_loader_get_state(l, &st));
    int64_t consumed = k ? ref->batch_end[k - 1] : 0;
    CHECK_EQ_INT(st.samples_consumed, consumed);
    CHECK_EQ_INT(st.epoch, base->epoch);
    CHECK_EQ_INT(vf_loader_batches_delivered(l), k);
    int64_t kb;
    CHECK_OK(vf_loader_state_batches(&st, &kb));
    CHECK_EQ_INT(kb, (int64_t)k);

    /* Opened with the state. */
    ls.threads = threads;
    ls.resume = &st;
    ls.epoch = 99; /* the state's epoch wins */
    vf_loader *r = NULL;
    CHECK_OK(vf_loader_open(&r, d, &ls));
    if (r) {
        tp_run rest = {0};
        tp_take(r, d, SIZE_MAX, 1, g_ms.state_dim, &rest);
        CHECK_EQ_INT(rest.rc, VF_EOF);
        CHECK_EQ_INT(rest.bad, 0);
        int same = rest.batches == ref->batches - k && tp_same_batches(ref, k, &rest, ref->batches - k);
        if (!same)
            fprintf(stderr, "  resume at batch %zu of %zu (mode %d, %d threads) differs\n", k, ref->batches,
                    (int)base->mode, threads);
        CHECK(same);
        vf_loader_stats s;
        vf_loader_get_stats(r, &s);
        /* Fast-forward decoded nothing: only the remaining samples were built. */
        CHECK_EQ_INT(s.samples_assembled, (uint64_t)(ref->count - consumed));
        CHECK(s.frames_decoded <= 2 * s.frames_delivered);
        CHECK_EQ_INT(vf_loader_batches_delivered(r), ref->batches);
        vf_loader_state end;
        CHECK_OK(vf_loader_get_state(r, &end));
        CHECK_EQ_INT(end.samples_consumed, ref->count);
        tp_run_free(&rest);
        vf_loader_close(r);
    }
    /* set_state on the running loader (it has moved on to another epoch). */
    CHECK_OK(vf_loader_set_epoch(l, 5));
    vf_batch *b;
    CHECK_OK(vf_loader_next(l, &b));
    vf_batch_release(b);
    CHECK_OK(vf_loader_set_state(l, &st));
    CHECK_EQ_INT(vf_loader_batches_delivered(l), k);
    CHECK_OK(vf_loader_set_epoch(l, st.epoch)); /* keeps the restored position */
    tp_run rest = {0};
    tp_take(l, d, SIZE_MAX, 0, g_ms.state_dim, &rest);
    CHECK(rest.batches == ref->batches - k && tp_same_batches(ref, k, &rest, ref->batches - k));
    tp_run_free(&rest);
    tp_run_free(&head);
    vf_loader_close(l);
}

static void test_equivalence(vf_dataset *d)
{
    const vf_mode modes[] = {VF_MODE_MAP, VF_MODE_STREAM, VF_MODE_POOL};
    vf_rng rng;
    vf_rng_init(&rng, 12345);
    for (size_t m = 0; m < VF_ARRAY_LEN(modes); m++) {
        vf_loader_settings ls;
        mode_settings(&ls, modes[m], 2);
        ls.epoch = 1;
        tp_run ref;
        reference(d, &ls, 1, &ref);
        if (ref.batches < 4) {
            tp_run_free(&ref);
            continue;
        }
        size_t ks[8] = {0, 1, ref.batches - 1, ref.batches};
        for (size_t i = 4; i < VF_ARRAY_LEN(ks); i++)
            ks[i] = 2 + (size_t)vf_rng_below(&rng, ref.batches - 3);
        for (size_t i = 0; i < VF_ARRAY_LEN(ks); i++)
            resume_at(d, &ls, &ref, ks[i], 1 + (int)(i % 2));
        tp_run_free(&ref);
    }
}

/* A state at the end of an epoch resumes to its end; the next epoch is the
 * same as ever. */
static void test_epoch_edges(vf_dataset *d)
{
    vf_loader_settings ls;
    mode_settings(&ls, VF_MODE_POOL, 2);
    tp_run e0, e1;
    reference(d, &ls, 0, &e0);
    reference(d, &ls, 1, &e1);
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (!l)
        return;
    tp_run all = {0};
    tp_take(l, d, SIZE_MAX, 0, g_ms.state_dim, &all);
    vf_loader_state st;
    CHECK_OK(vf_loader_get_state(l, &st));
    CHECK_EQ_INT(st.samples_consumed, e0.count);
    vf_loader_close(l);
    ls.resume = &st;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        vf_batch *b = NULL;
        CHECK_EQ_INT(vf_loader_next(l, &b), VF_EOF);
        vf_loader_stats s;
        vf_loader_get_stats(l, &s);
        CHECK_EQ_INT(s.samples_assembled, 0);
        CHECK_OK(vf_loader_set_epoch(l, 1));
        tp_run next = {0};
        tp_take(l, d, SIZE_MAX, 0, g_ms.state_dim, &next);
        CHECK(next.batches == e1.batches && tp_same_batches(&e1, 0, &next, e1.batches));
        tp_run_free(&next);
        vf_loader_close(l);
    }
    tp_run_free(&all);
    tp_run_free(&e0);
    tp_run_free(&e1);
}

/* One state for every rank and worker (2 ranks x 2 workers). */
static void test_ranks_and_workers(vf_dataset *d)
{
    vf_rng rng;
    vf_rng_init(&rng, 777);
    const vf_mode modes[] = {VF_MODE_POOL, VF_MODE_STREAM};
    for (size_t m = 0; m < VF_ARRAY_LEN(modes); m++) {
        vf_loader_settings ls;
        mode_settings(&ls, modes[m], 2);
        ls.world_size = 2;
        ls.num_consumers = 2;
        ls.batch_size = 4;
        tp_run ref[2];
        for (int rank = 0; rank < 2; rank++) {
            ls.rank = rank;
            reference(d, &ls, 0, &ref[rank]);
        }
        CHECK_EQ_INT(ref[0].batches, ref[1].batches);
        size_t ks[] = {0, 1, 2 + (size_t)vf_rng_below(&rng, ref[0].batches - 3),
                       2 + (size_t)vf_rng_below(&rng, ref[0].batches - 3), ref[0].batches};
        for (size_t i = 0; i < VF_ARRAY_LEN(ks); i++) {
            size_t k = ks[i];
            /* The state as rank 0's rank-level loader sees it, and computed. */
            ls.rank = 0;
            vf_loader *l = NULL;
            CHECK_OK(vf_loader_open(&l, d, &ls));
            if (!l)
                return;
            tp_run head = {0};
            tp_take(l, d, k, 0, g_ms.state_dim, &head);
            vf_loader_state st, at;
            CHECK_OK(vf_loader_get_state(l, &st));
            CHECK_EQ_INT(st.samples_consumed, 2 * (k ? ref[0].batch_end[k - 1] : 0));
            CHECK_OK(vf_loader_state_at(d, &ls, 0, (int64_t)k, &at));
            CHECK(memcmp(&st, &at, sizeof st) == 0);
            tp_run_free(&head);
            vf_loader_close(l);
            for (int rank = 0; rank < 2; rank++) {
                /* The rank-level loader of every rank. */
                vf_loader_settings rs = ls;
                rs.rank = rank;
                rs.resume = &st;
                CHECK_OK(vf_loader_open(&l, d, &rs));
                if (l) {
                    tp_run rest = {0};
                    tp_take(l, d, SIZE_MAX, 0, g_ms.state_dim, &rest);
                    CHECK(rest.batches == ref[rank].batches - k &&
                          tp_same_batches(&ref[rank], k, &rest, ref[rank].batches - k));
                    tp_run_free(&rest);
                    vf_loader_close(l);
                }
                /* Each worker its own loader, taken round-robin from worker 0. */
                tp_run w[2] = {{0}, {0}};
                for (int c = 0; c < 2; c++) {
                    rs.consumer = c;
                    rs.threads = 1 + c;
                    CHECK_OK(vf_loader_open(&l, d, &rs));
                    if (!l)
                        continue;
                    tp_take(l, d, SIZE_MAX, 1, g_ms.state_dim, &w[c]);
                    CHECK_EQ_INT(w[c].bad, 0);
                    vf_loader_state ws;
                    CHECK_ERR(vf_loader_get_state(l, &ws), VF_EINVAL, "cannot see its rank's progress");
                    vf_loader_close(l);
                }
                size_t next[2] = {0, 0}, b = k;
                int ok = 1, done[2] = {0, 0};
                for (int c = 0; !(done[0] && done[1]); c = 1 - c) {
                    if (done[c])
                        continue;
                    if (next[c] >= w[c].batches) {
                        done[c] = 1;
                        continue;
                    }
                    ok &= tp_batch_equal(&w[c], next[c]++, &ref[rank], b++);
                }
                ok &= b == ref[rank].batches;
                if (!ok)
                    fprintf(stderr, "  workers of rank %d resumed at %zu (mode %d) differ\n", rank, k,
                            (int)modes[m]);
                CHECK(ok);
                tp_run_free(&w[0]);
                tp_run_free(&w[1]);
            }
        }
        tp_run_free(&ref[0]);
        tp_run_free(&ref[1]);
    }
}

typedef struct hooks {
    int64_t admits, evicts, bad;
    int *live;
    int *ever;                 /* per episode: admitted at least once */
    size_t n;
} hooks;

static void on_admit(void *ctx, const vf_pool_event *e)
{
    hooks *h = ctx;
    h->admits++;
    if (e->episode < h->n) {
        h->live[e->episode]++;
        h->ever[e->episode] = 1;
    } else
        h->bad++;
}

static void on_evict(void *ctx, const vf_pool_event *e)
{
    hooks *h = ctx;
    h->evicts++;
    if (e->episode < h->n && h->live[e->episode] > 0)
        h->live[e->episode]--;
    else
        h->bad++;
}

/* Resumed pool loaders admit the segments live at the resume point. */
static void test_hooks_resume(vf_dataset *d)
{
    vf_loader_settings ls;
    mode_settings(&ls, VF_MODE_POOL, 2);
    size_t ne = vf_dataset_num_episodes(d);
    hooks h = {0, 0, 0, calloc(ne, sizeof(int)), calloc(ne, sizeof(int)), ne};
    int *delivered = calloc(ne, sizeof(int));
    ls.pool_hooks = (vf_pool_hooks){on_admit, on_evict, &h};
    vf_loader_state st;
    CHECK_OK(vf_loader_state_at(d, &ls, 0, 25, &st));
    ls.resume = &st;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        CHECK(h.admits >= 1);
        vf_batch *b;
        int64_t not_live = 0;
        while (vf_loader_next(l, &b) == 0) {
            /* Evictions of this batch's last segments happened in the call:
             * check the first sample, whose segment is admitted whatever. */
            for (size_t j = 0; j < vf_batch_size(b); j++) {
                int64_t start = 0, p = vf_batch_positions(b)[j];
                for (size_t i = 0; i < ne; i++) {
                    int64_t len = vf_dataset_episode(d, i)->length;
                    if (p < start + len) {
                        not_live += j == 0 && h.live[i] == 0 && h.evicts == 0;
                        delivered[i] = 1;
                        break;
                    }
                    start += len;
                }
            }
            vf_batch_release(b);
        }
        CHECK_EQ_INT(not_live, 0);
        vf_loader_close(l);
    }
    CHECK_EQ_INT(h.admits, h.evicts);
    CHECK_EQ_INT(h.bad, 0);
    /* Exactly the episodes the resumed run draws from were admitted (not
     * the ones finished before the resume point). */
    int64_t wrong = 0;
    for (size_t i = 0; i < ne; i++)
        wrong += h.ever[i] != delivered[i];
    CHECK_EQ_INT(wrong, 0);
    free(h.live);
    free(h.ever);
    free(delivered);
}

static void expect_refused(vf_dataset *d, const vf_loader_settings *ls, const vf_loader_state *st, const char *what,
                           const char *also)
{
    vf_loader_settings s = *ls;
    s.resume = st;
    vf_loader *l = NULL;
    int r = vf_loader_open(&l, d, &s);
    CHECK_EQ_INT(r, VF_EINVAL);
    CHECK(l == NULL);
    if (r == VF_EINVAL && (!strstr(vf_last_error(), what) || (also && !strstr(vf_last_error(), also))))
        fprintf(stderr, "  wanted '%s'%s%s in: %s\n", what, also ? " and " : "", also ? also : "", vf_last_error());
    CHECK(strstr(vf_last_error(), what) != NULL);
    if (also)
        CHECK(strstr(vf_last_error(), also) != NULL);
}

static void test_refusals(vf_dataset *d, const char *root, const char *other_root)
{
    vf_loader_settings ls;
    mode_settings(&ls, VF_MODE_POOL, 1);
    vf_loader_state st;
    CHECK_OK(vf_loader_state_at(d, &ls, 2, 3, &st));

    vf_dataset *other = open_dataset(other_root, NULL, 0);
    expect_refused(other, &ls, &st, "another dataset", other_root);
    vf_dataset_close(other);
    const int64_t pick[] = {0, 1, 2, 3};
    vf_dataset *some = open_dataset(root, pick, 4);
    expect_refused(some, &ls, &st, "another episode selection", NULL);
    vf_dataset_close(some);

    vf_loader_settings s = ls;
    s.seed = 18;
    expect_refused(d, &s, &st, "seed (state 17, loader 18)", NULL);
    s = ls;
    s.batch_size = 6; /* a layout change (elastic resume) is not an order difference */
    s.seed = 1;
    s.shuffle = 0;
    expect_refused(d, &s, &st, "seed (state 17, loader 1)", "shuffle (state 1, loader 0)");
    CHECK(strstr(vf_last_error(), "batch_size") == NULL);
    s = ls;
    s.mode = VF_MODE_STREAM;
    expect_refused(d, &s, &st, "mode (state 'pool', loader 'stream')", NULL);
    s = ls;
    s.episode_pool_size = 4;
    expect_refused(d, &s, &st, "episode_pool_size (state 3, loader 4)", NULL);
    s = ls;
    s.shuffle = 0;
    expect_refused(d, &s, &st, "shuffle (state 1, loader 0)", NULL);
    s = ls;
    s.drop_last = 1;
    expect_refused(d, &s, &st, "drop_last (state 0, loader 1)", NULL);

    vf_loader_state bad = st;
    bad.samples_consumed += 1;
    expect_refused(d, &ls, &bad, "is not the end of a batch", NULL);
    bad = st;
    bad.samples_consumed = 1 << 30;
    expect_refused(d, &ls, &bad, "is not the end of a batch", NULL);
    bad = st;
    bad.version = VF_LOADER_STATE_VERSION + 1;
    expect_refused(d, &ls, &bad, "version 4 is not supported", NULL);
    bad = st;
    bad.epoch = -1; /* epoch is not in the hash */
    expect_refused(d, &ls, &bad, "epoch -1 is negative", NULL);
    bad = st;
    bad.seed = 18; /* edited without its hash */
    expect_refused(d, &ls, &bad, "settings_hash does not match", NULL);

    /* Settings that do not change the order are free. */
    s = ls;
    s.threads = 2;
    s.prefetch_batches = 1;
    s.sample.image_format = VF_IMAGE_FLOAT32_CHW;
    s.resume = &st;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &s));
    vf_loader_close(l);

    /* A refused set_state leaves the loader as it was. */
    tp_run ref;
    reference(d, &ls, 0, &ref);
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        tp_run head = {0}, rest = {0};
        tp_take(l, d, 2, 0, g_ms.state_dim, &head);
        bad = st;
        bad.version = 7;
        CHECK_ERR(vf_loader_set_state(l, &bad), VF_EINVAL, "version 7");
        tp_take(l, d, SIZE_MAX, 0, g_ms.state_dim, &rest);
        CHECK(rest.batches + 2 == ref.batches && tp_same_batches(&ref, 2, &rest, rest.batches));
        tp_run_free(&head);
        tp_run_free(&rest);
        vf_loader_close(l);
    }
    tp_run_free(&ref);
    /* vf_loader_state_at past the epoch. */
    CHECK_ERR(vf_loader_state_at(d, &ls, 0, 1 << 20, &st), VF_ERANGE, "past the epoch");
}

/* Elastic resume records the old layout as a generation, never the remainder:
 * resolve, open, report and chain; a generation whose replay leaves another
 * count than it says (hash recomputed, as an editor would), a malformed one,
 * too many, or one in a version 2 state are refused by name. */
static void test_generations(vf_dataset *d)
{
    vf_loader_settings old, mid, last;
    mode_settings(&old, VF_MODE_POOL, 1);
    old.world_size = 2;
    old.batch_size = 4;
    mid = old;
    mid.world_size = 3;
    mid.batch_size = 3;
    last = old;
    last.world_size = 1;
    last.batch_size = 2;
    vf_loader_state st, res, st2, res2;
    CHECK_OK(vf_loader_state_at(d, &old, 0, 2, &st));
    CHECK_OK(vf_loader_state_resolve(d, &mid, &st, &res));
    CHECK_EQ_INT(res.num_ranges, 0);
    CHECK_EQ_INT(res.num_generations, 1);
    if (res.num_generations != 1)
        return;
    const vf_loader_generation *g = &res.generations[0];
    CHECK(g->world_size == 2 && g->consumers == 1 && g->batch_size == 4 && g->batches == 2);
    int64_t n = st.positions;
    CHECK(g->remaining >= n - 2 * 4 * 2 && g->remaining < n);
    /* A loader opened from it reports the same generation, and a second restore appends one. */
    mid.resume = &res;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &mid));
    vf_batch *b;
    if (l && vf_loader_next(l, &b) == 0)
        vf_batch_release(b);
    if (l) {
        CHECK_OK(vf_loader_get_state(l, &st2));
        CHECK(st2.num_generations == 1 && !memcmp(st2.generations, g, sizeof *g) && st2.num_ranges == 0);
        CHECK_OK(vf_loader_state_resolve(d, &last, &st2, &res2));
        CHECK_EQ_INT(res2.num_generations, 2);
        if (res2.num_generations == 2) {
            CHECK(!memcmp(&res2.generations[0], g, sizeof *g));
            CHECK(res2.generations[1].world_size == 3 && res2.generations[1].batches == 1);
            CHECK(res2.generations[1].remaining <= g->remaining - 3);
        }
        free((void *)res2.ranges);
        free((void *)res2.generations);
        vf_loader_close(l);
    }
    mid.resume = NULL;
    /* Tampered: the remaining count, with the hash made to match. */
    vf_loader_generation bad = *g;
    vf_loader_state t = res;
    bad.remaining = g->remaining - 1;
    t.generations = &bad;
    t.settings_hash = vf_engine_state_hash(&t);
    expect_refused(d, &mid, &t, "generations[0] leaves", "the state says");
    bad = *g;
    bad.world_size = 0;
    t.settings_hash = vf_engine_state_hash(&t);
    expect_refused(d, &mid, &t, "generations[0] (world_size 0", NULL);
    t = res;
    t.version = 2;
    t.settings_hash = vf_engine_state_hash(&t);
    expect_refused(d, &mid, &t, "a version 2 state has no generations", NULL);
    vf_loader_generation *many = calloc(VF_LOADER_MAX_GENERATIONS + 1, sizeof *many);
    CHECK(many != NULL);
    if (many) {
        for (size_t i = 0; i <= VF_LOADER_MAX_GENERATIONS; i++)
            many[i] = *g;
        t = res;
        t.generations = many;
        t.num_generations = VF_LOADER_MAX_GENERATIONS + 1;
        t.settings_hash = vf_engine_state_hash(&t);
        expect_refused(d, &mid, &t, "4097 generations", "at most 4096");
        free(many);
    }
    free((void *)res.ranges);
    free((void *)res.generations);
}

int main(void)
{
    char *root = make_dataset("resume", 10, TP_FPS, 0.03, &g_ms);
    char *other = make_dataset("resume_other", 9, TP_FPS, 0.03, NULL);
    vf_dataset *d = open_dataset(root, NULL, 0);
    test_equivalence(d);
    test_epoch_edges(d);
    test_ranks_and_workers(d);
    test_hooks_resume(d);
    test_refusals(d, root, other);
    test_generations(d);
    vf_dataset_close(d);
    remove_dataset(other);
    remove_dataset(root);
    return vf_test_finish("test_resume");
}
