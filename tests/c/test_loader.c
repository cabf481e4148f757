/*
 * test_loader.c: the engine end to end on make-sample datasets: stream mode
 * covers every frame of the selected episodes exactly once per epoch, with
 * every frame's identity and every tabular value right; the order is a pure
 * function of the seed and settings (same seed same order, different seed
 * different, the same for 1, 2 and 4 threads); map mode's next() walks a
 * permutation; ranks and consumers split an epoch as documented; the
 * output queue bounds the work done ahead (backpressure); batches outlive
 * the loader; decode errors (missing or corrupt video) name file, camera and
 * episode.
 */
#define _GNU_SOURCE /* setenv, usleep */
#include "test_loader_helpers.h"

#include <stdio.h>
#include <unistd.h>

static vf_make_sample_settings g_ms;

typedef struct epoch_result {
    int64_t *positions;
    int64_t count;
    uint64_t digest;           /* over every value of every column */
    int64_t bad_frames, bad_values;
    int rc;                    /* the first error (VF_EOF when the epoch ended cleanly) */
} epoch_result;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Checks one batch against the ground truth (uint8 HWC frames). */
static void check_batch(const vf_dataset *d, const vf_batch *b, epoch_result *res)
{
    const vf_column *st = vf_batch_find(b, "observation.state"), *ac = vf_batch_find(b, "action"),
                    *ei = vf_batch_find(b, "episode_index"), *fi = vf_batch_find(b, "frame_index"),
                    *ix = vf_batch_find(b, "index");
    const vf_column *cams[2] = {vf_batch_find(b, "observation.images.cam0"),
                                vf_batch_find(b, "observation.images.cam1")};
    int dim = g_ms.state_dim;
    for (size_t i = 0; i < vf_batch_size(b); i++) {
        int64_t p = vf_batch_positions(b)[i], ep, fr;
        locate(d, p, &ep, &fr);
        if (((const int64_t *)ei->data)[i] != ep || ((const int64_t *)fi->data)[i] != fr)
            res->bad_values++;
        if (vf_dataset_num_episodes(d) == (size_t)g_ms.num_episodes && ((const int64_t *)ix->data)[i] != p)
            res->bad_values++;
        for (int k = 0; k < dim; k++) {
            if (((const float *)st->data)[i * (size_t)dim + (size_t)k] != vf_make_sample_state((int)ep, (int)fr, k))
                res->bad_values++;
            if (((const float *)ac->data)[i * (size_t)dim + (size_t)k] != vf_make_sample_action((int)ep, (int)fr, k))
                res->bad_values++;
        }
        for (int c = 0; c < 2; c++)
            if (!cams[c] || !frame_is((const uint8_t *)cams[c]->data + i * 96 * 64 * 3, 96, 64, ep, fr, c))
                res->bad_frames++;
    }
}

static void digest_batch(const vf_batch *b, epoch_result *res)
{
    for (size_t c = 0; c < vf_batch_num_columns(b); c++) {
        const vf_column *col_ = vf_batch_column(b, c);
        if (col_->type == VF_COL_STRING) {
            for (int64_t i = 0; i < col_->shape[0]; i++)
                res->digest = fnv(res->digest, col_->strings[i], strlen(col_->strings[i]));
        } else {
            res->digest = fnv(res->digest, col_->data, col_->nbytes);
        }
    }
}

/* Runs one epoch of a loader, collecting positions (and checking values). */
static void run_epoch(vf_loader *l, const vf_dataset *d, int check, epoch_result *res)
{
    memset(res, 0, sizeof *res);
    res->digest = 1469598103934665603ull;
    int64_t cap = vf_loader_num_samples(l) + 1;
    res->positions = malloc((size_t)cap * sizeof *res->positions);
    vf_batch *b;
    int r;
    while ((r = vf_loader_next(l, &b)) == 0) {
        for (size_t i = 0; i < vf_batch_size(b) && res->count < cap; i++)
            res->positions[res->count++] = vf_batch_positions(b)[i];
        if (check)
            check_batch(d, b, res);
        digest_batch(b, res);
        vf_batch_release(b);
    }
    res->rc = r;
}

static vf_loader *open_loader(vf_dataset *d, vf_mode mode, uint64_t seed, int threads, size_t batch,
                              void (*tweak)(vf_loader_settings *))
{
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = mode;
    ls.seed = seed;
    ls.threads = threads;
    ls.batch_size = batch;
    ls.sample.image_format = VF_IMAGE_UINT8_HWC;
    if (tweak)
        tweak(&ls);
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    return l;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Every position of the selection exactly once. */
static int exactly_once(const epoch_result *r, int64_t n)
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

static void test_stream_exact(vf_dataset *d)
{
    vf_loader *l = open_loader(d, VF_MODE_STREAM, 3, 2, 7, NULL);
    if (!l)
        return;
    int64_t n = vf_loader_num_positions(l);
    CHECK_EQ_INT(vf_loader_num_samples(l), n);
    epoch_result r;
    run_epoch(l, d, 1, &r);
    CHECK_EQ_INT(r.rc, VF_EOF);
    CHECK(exactly_once(&r, n));
    CHECK_EQ_INT(r.bad_frames, 0);
    CHECK_EQ_INT(r.bad_values, 0);
    /* Stream order: file groups whole, frames in order inside. */
    int64_t breaks = 0;
    for (int64_t i = 1; i < r.count; i++)
        breaks += r.positions[i] != r.positions[i - 1] + 1;
    vf_plan_summary s;
    CHECK_OK(vf_plan_summarize(d, VF_PARTITION_FILE_GROUP, 1, 1, &s));
    CHECK(breaks < (int64_t)s.tasks);
    vf_loader_stats st;
    vf_loader_get_stats(l, &st);
    CHECK_EQ_INT(st.samples, n);
    CHECK_EQ_INT(st.frames_delivered, 2 * n);
    CHECK(st.frames_decoded >= st.frames_delivered / 2);
    CHECK(st.first_batch_seconds > 0);
    CHECK(st.p50_sample_ms > 0 && st.p99_sample_ms >= st.p50_sample_ms);
    CHECK(st.video_opens >= 1);
    /* Next epoch: again exactly once, in another order. */
    CHECK_EQ_INT(vf_loader_next(l, &(vf_batch *){NULL}), VF_EOF);
    CHECK_OK(vf_loader_set_epoch(l, 1));
    epoch_result r2;
    run_epoch(l, d, 0, &r2);
    CHECK(exactly_once(&r2, n));
    CHECK(memcmp(r.positions, r2.positions, (size_t)n * sizeof(int64_t)) != 0);
    free(r.positions);
    free(r2.positions);
    vf_loader_close(l);

    /* A selection of episodes: only their frames. */
}

static void shuffle_buffer_tweak(vf_loader_settings *ls) { ls->shuffle_buffer = 16; }
static void episode_partition_tweak(vf_loader_settings *ls) { ls->partition = VF_PARTITION_EPISODE; }

/* Same seed: same order and bytes; 1, 2, 4 threads: the same; other seed: different. */
static void test_determinism(vf_dataset *d)
{
    vf_mode modes[] = {VF_MODE_STREAM, VF_MODE_MAP, VF_MODE_STREAM};
    void (*tweaks[])(vf_loader_settings *) = {episode_partition_tweak, NULL, shuffle_buffer_tweak};
    for (int m = 0; m < 3; m++) {
        epoch_result base, other;
        vf_loader *l = open_loader(d, modes[m], 11, 1, 5, tweaks[m]);
        if (!l)
            return;
        run_epoch(l, d, 0, &base);
        vf_loader_close(l);
        CHECK(exactly_once(&base, base.count));
        int threads[] = {2, 4, 4};
        for (int t = 0; t < 3; t++) {
            l = open_loader(d, modes[m], 11, threads[t], 5, tweaks[m]);
            if (!l)
                break;
            run_epoch(l, d, 0, &other);
            CHECK_EQ_INT(other.count, base.count);
            CHECK(memcmp(other.positions, base.positions, (size_t)base.count * sizeof(int64_t)) == 0);
            CHECK(other.digest == base.digest);
            free(other.positions);
            vf_loader_close(l);
        }
        l = open_loader(d, modes[m], 12, 2, 5, tweaks[m]);
        if (l) {
            run_epoch(l, d, 0, &other);
            CHECK(memcmp(other.positions, base.positions, (size_t)base.count * sizeof(int64_t)) != 0);
            free(other.positions);
            vf_loader_close(l);
        }
        free(base.positions);
    }
}

static void test_map_mode(vf_dataset *d)
{
    vf_loader *l = open_loader(d, VF_MODE_MAP, 5, 2, 8, NULL);
    if (!l)
        return;
    epoch_result r;
    run_epoch(l, d, 1, &r);
    CHECK(exactly_once(&r, vf_loader_num_positions(l)));
    CHECK_EQ_INT(r.bad_frames, 0);
    CHECK_EQ_INT(r.bad_values, 0);
    /* Shuffled: not the identity. */
    int64_t in_place = 0;
    for (int64_t i = 0; i < r.count; i++)
        in_place += r.positions[i] == i;
    CHECK(in_place < r.count / 2);
    free(r.positions);
    /* get_items interleaved with iteration, duplicates allowed. */
    int64_t p[] = {4, 4, 0};
    vf_batch *b = NULL;
    CHECK_OK(vf_loader_get_items(l, p, 3, &b));
    if (b) {
        epoch_result chk = {0};
        check_batch(d, b, &chk);
        CHECK_EQ_INT(chk.bad_frames + chk.bad_values, 0);
        /* Batches outlive their loader. */
        vf_loader_close(l);
        const vf_column *c = vf_batch_find(b, "observation.images.cam0");
        CHECK(frame_is((const uint8_t *)c->data + 2 * 96 * 64 * 3, 96, 64, vf_dataset_episode(d, 0)->episode_index, 0,
                       0));
        vf_batch_release(b);
    } else {
        vf_loader_close(l);
    }
    /* No shuffle: 0..N-1. */
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.shuffle = 0;
    ls.batch_size = 64;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        run_epoch(l, d, 0, &r);
        int ok = r.count == vf_loader_num_positions(l);
        for (int64_t i = 0; i < r.count; i++)
            ok &= r.positions[i] == i;
        CHECK(ok);
        free(r.positions);
        vf_loader_close(l);
    }
}

/* Two ranks x two consumers, each consumer its own loader: the union is the
 * epoch, with the documented padding. */
static void test_distributed(vf_dataset *d)
{
    int64_t n = 0;
    int64_t *seen = NULL;
    int64_t total = 0;
    for (int rank = 0; rank < 2; rank++) {
        for (int consumer = 0; consumer < 2; consumer++) {
            vf_loader_settings ls;
            vf_loader_defaults(&ls);
            ls.mode = VF_MODE_STREAM;
            ls.seed = 9;
            ls.rank = rank;
            ls.world_size = 2;
            ls.num_consumers = 2;
            ls.consumer = consumer;
            ls.threads = 1;
            ls.batch_size = 6;
            ls.sample.image_format = VF_IMAGE_UINT8_HWC;
            vf_loader *l = NULL;
            CHECK_OK(vf_loader_open(&l, d, &ls));
            if (!l)
                return;
            if (!seen) {
                n = vf_loader_num_positions(l);
                seen = calloc((size_t)n, sizeof *seen);
            }
            epoch_result r;
            run_epoch(l, d, 1, &r);
            CHECK_EQ_INT(r.rc, VF_EOF);
            CHECK_EQ_INT(r.bad_frames + r.bad_values, 0);
            for (int64_t i = 0; i < r.count; i++)
                seen[r.positions[i]]++;
            total += r.count;
            free(r.positions);
            vf_loader_close(l);
        }
    }
    int64_t per_rank = (n + 1) / 2;
    CHECK_EQ_INT(total, 2 * per_rank);
    int64_t missing = 0, extra = 0;
    for (int64_t i = 0; i < n; i++) {
        missing += seen[i] == 0;
        extra += seen[i] > 1 ? seen[i] - 1 : 0;
    }
    CHECK_EQ_INT(missing, 0);
    CHECK_EQ_INT(extra, 2 * per_rank - n);
    free(seen);

    /* RANK / WORLD_SIZE from the environment. */
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "3", 1);
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.rank = -1;
    ls.world_size = -1;
    ls.mode = VF_MODE_MAP;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l)
        CHECK_EQ_INT(vf_loader_num_samples(l), (vf_loader_num_positions(l) + 2) / 3);
    vf_loader_close(l);
    setenv("WORLD_SIZE", "x", 1);
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "WORLD_SIZE");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
}

/* Nobody calls next: production stops at the window. */
static void test_backpressure(vf_dataset *d)
{
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_STREAM;
    ls.threads = 2;
    ls.prefetch_batches = 2;
    ls.batch_size = 3;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (!l)
        return;
    vf_loader_stats st;
    uint64_t last = (uint64_t)-1;
    for (int i = 0; i < 400; i++) { /* until nothing moves for a while */
        usleep(10000);
        vf_loader_get_stats(l, &st);
        if (st.samples_assembled == last && i > 20)
            break;
        last = st.samples_assembled;
    }
    CHECK_EQ_INT(st.window, 4);
    CHECK_EQ_INT(st.samples_assembled, 4 * 3); /* exactly the window, then it waits */
    CHECK(st.batch_buffers <= 4);
    CHECK_EQ_INT(st.samples, 0);
    /* Taking one batch lets exactly one more be built. */
    vf_batch *b = NULL;
    CHECK_OK(vf_loader_next(l, &b));
    for (int i = 0; i < 400; i++) {
        usleep(10000);
        vf_loader_get_stats(l, &st);
        if (st.samples_assembled >= 5 * 3)
            break;
    }
    usleep(50000);
    vf_loader_get_stats(l, &st);
    CHECK_EQ_INT(st.samples_assembled, 5 * 3);
    vf_batch_release(b);
    /* The buffers are reused: a whole epoch needs only a few. */
    while (vf_loader_next(l, &b) == 0)
        vf_batch_release(b);
    vf_loader_get_stats(l, &st);
    CHECK(st.batch_buffers <= st.window + 1);
    CHECK(st.wait_seconds >= 0);
    vf_loader_close(l);
}

static int copy_file(const char *from, const char *to)
{
    uint8_t *data;
    size_t len;
    if (vf_read_file(from, &data, &len) < 0)
        return -1;
    FILE *f = fopen(to, "wb");
    int ok = f && fwrite(data, 1, len, f) == len;
    if (f)
        fclose(f);
    free(data);
    return ok ? 0 : -1;
}

/* A missing and a truncated camera file: the error names file, camera, episode. */
static void test_decode_errors(const char *root)
{
    vf_dataset *d = open_dataset(root, NULL, 0);
    char *victim = vf_strdup(vf_dataset_video_file(d, 1, 0));
    char *saved = vf_asprintf("%s.saved", victim);
    CHECK_EQ_INT(rename(victim, saved), 0);
    vf_dataset_close(d);

    /* The dataset still opens (the missing file is a problem record). */
    d = open_dataset(root, NULL, 0);
    CHECK(vf_dataset_num_missing_files(d) == 1);
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_STREAM;
    ls.shuffle = 0;
    ls.threads = 2;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        vf_batch *b = NULL;
        int r = vf_loader_next(l, &b);
        CHECK_EQ_INT(r, VF_ENOENT);
        CHECK(b == NULL);
        const char *msg = vf_last_error();
        CHECK(strstr(msg, "file-000.mp4") != NULL);
        CHECK(strstr(msg, "observation.images.cam1") != NULL);
        CHECK(strstr(msg, "episode 0") != NULL);
        vf_loader_close(l);
    }
    /* Map access too. */
    ls.mode = VF_MODE_MAP;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        int64_t p = 0;
        vf_batch *b = NULL;
        CHECK_ERR(vf_loader_get_items(l, &p, 1, &b), VF_ENOENT, "observation.images.cam1");
        CHECK(strstr(vf_last_error(), "file-000.mp4") != NULL);
        vf_loader_close(l);
    }
    vf_dataset_close(d);

    /* Truncated: keep the first 40% of the file. */
    uint8_t *data;
    size_t len;
    if (vf_read_file(saved, &data, &len) == 0) {
        FILE *f = fopen(victim, "wb");
        if (f) {
            fwrite(data, 1, len * 2 / 5, f);
            fclose(f);
        }
        free(data);
    }
    d = open_dataset(root, NULL, 0);
    ls.mode = VF_MODE_STREAM;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        vf_batch *b;
        int r;
        int errors = 0;
        while ((r = vf_loader_next(l, &b)) != VF_EOF) {
            if (r < 0) {
                errors++;
                CHECK(strstr(vf_last_error(), "file-000.mp4") != NULL);
                CHECK(strstr(vf_last_error(), "observation.images.cam1") != NULL);
                CHECK(strstr(vf_last_error(), "episode") != NULL);
                break;
            }
            vf_batch_release(b);
        }
        CHECK(errors == 1);
        vf_loader_close(l);
    }
    vf_dataset_close(d);
    CHECK_EQ_INT(copy_file(saved, victim), 0);
    remove(saved);
    free(saved);
    free(victim);
}

static void test_selection(const char *root)
{
    const int64_t pick[] = {5, 2, 3};
    vf_dataset *d = open_dataset(root, pick, 3);
    vf_loader *l = open_loader(d, VF_MODE_STREAM, 1, 2, 4, episode_partition_tweak);
    if (l) {
        epoch_result r;
        run_epoch(l, d, 1, &r);
        CHECK(exactly_once(&r, episode_length(d, 2) + episode_length(d, 3) + episode_length(d, 5)));
        CHECK_EQ_INT(r.bad_frames + r.bad_values, 0);
        free(r.positions);
        vf_loader_close(l);
    }
    vf_dataset_close(d);
}

int main(void)
{
    char *root = make_dataset("loader", 10, 30, 0.03, &g_ms);
    vf_dataset *d = open_dataset(root, NULL, 0);
    test_stream_exact(d);
    test_determinism(d);
    test_map_mode(d);
    test_distributed(d);
    test_backpressure(d);
    vf_dataset_close(d);
    test_selection(root);
    test_decode_errors(root);
    remove_dataset(root);
    return vf_test_finish("test_loader");
}
