/*
 * test_close.c: teardown while work is in flight, the races a loader's close
 * can meet (issue 10); built and run under ThreadSanitizer too (make
 * test-tsan), and under ASan + UBSan with the other suites.
 *
 *  - close right after open and after k batches, while engine threads are
 *    still assembling the window ahead (stream, pool and map modes);
 *  - batches kept past close: their memory stays valid and they are
 *    released from other threads at once (the engine core is refcounted);
 *  - set_epoch abandoning in-flight batches again and again, then close;
 *  - on_error = SKIP with skip records in queued, undelivered batches, then
 *    close (the records of those batches are freed, delivered ones kept);
 *  - a thread blocked in vf_queue_pop while another closes the queue:
 *    it returns VF_EOF (the C side of the Python close hang of issue 10);
 *  - whole epochs on 3 engine threads sharing one reader per video file
 *    (the default; the decode under the file's lock, the conversion after
 *    it): every frame is the one asked for, and the opens counted equal
 *    vf_plan_count_opens (issue 26).
 */
#define _GNU_SOURCE /* usleep */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "base/base.h"
#include "test_loader_helpers.h"

static vf_loader *open_loader(vf_dataset *d, vf_mode mode, int threads, size_t batch)
{
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = mode;
    ls.threads = threads;
    ls.batch_size = batch;
    ls.prefetch_batches = 3;
    ls.episode_pool_size = 2;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    return l;
}

static void test_close_in_flight(vf_dataset *d)
{
    static const vf_mode modes[] = {VF_MODE_STREAM, VF_MODE_POOL, VF_MODE_MAP};
    for (size_t m = 0; m < 3; m++)
        for (int taken = 0; taken < 4; taken++) {
            vf_loader *l = open_loader(d, modes[m], 3, 4);
            if (!l)
                continue;
            for (int i = 0; i < taken; i++) {
                vf_batch *b = NULL;
                CHECK_OK(vf_loader_next(l, &b));
                vf_batch_release(b);
            }
            vf_loader_close(l); /* engine threads are still assembling the window */
        }
}

typedef struct release_arg {
    vf_batch **batches;
    size_t n;
    uint64_t sum;
} release_arg;

static void *release_thread(void *p)
{
    release_arg *a = p;
    for (size_t i = 0; i < a->n; i++) {
        const vf_column *c = vf_batch_find(a->batches[i], "index");
        const int64_t *v = c->data;
        for (int64_t k = 0; k < c->shape[0]; k++)
            a->sum += (uint64_t)v[k];
        vf_batch_release(a->batches[i]);
    }
    return NULL;
}

static void test_batches_outlive_close(vf_dataset *d)
{
    enum { N = 8 };
    vf_loader *l = open_loader(d, VF_MODE_STREAM, 2, 5);
    if (!l)
        return;
    vf_batch *b[N];
    uint64_t want = 0;
    size_t got = 0;
    for (; got < N; got++) {
        if (vf_loader_next(l, &b[got]) < 0)
            break;
        const vf_column *c = vf_batch_find(b[got], "index");
        for (int64_t k = 0; k < c->shape[0]; k++)
            want += (uint64_t)((const int64_t *)c->data)[k];
    }
    CHECK(got == N);
    vf_batch *extra = vf_batch_ref(b[0]); /* a second view of one batch */
    vf_loader_close(l);
    /* Two threads read and release the batches the loader no longer exists for. */
    release_arg a = {b, got / 2, 0}, c = {b + got / 2, got - got / 2, 0};
    pthread_t t1, t2;
    CHECK(pthread_create(&t1, NULL, release_thread, &a) == 0);
    CHECK(pthread_create(&t2, NULL, release_thread, &c) == 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK(a.sum + c.sum == want);
    CHECK(vf_batch_size(extra) == 5);
    vf_batch_release(extra);
}

static void test_set_epoch_abandons(vf_dataset *d)
{
    vf_loader *l = open_loader(d, VF_MODE_STREAM, 3, 3);
    if (!l)
        return;
    for (int e = 0; e < 12; e++) {
        vf_batch *b = NULL;
        CHECK_OK(vf_loader_next(l, &b));
        vf_batch_release(b);
        CHECK_OK(vf_loader_set_epoch(l, e + 1));
    }
    vf_loader_close(l);
}

static void test_skip_records_at_close(const char *root)
{
    vf_dataset *d = open_dataset(root, NULL, 0);
    char *victim = vf_strdup(vf_dataset_video_file(d, 0, 0));
    char *saved = vf_asprintf("%s.saved", victim);
    vf_dataset_close(d);
    CHECK_EQ_INT(rename(victim, saved), 0);
    d = open_dataset(root, NULL, 0);
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_STREAM;
    ls.threads = 3;
    ls.batch_size = 4;
    ls.shuffle = 0;
    ls.on_error = VF_ON_ERROR_SKIP;
    for (int taken = 0; taken < 3; taken++) {
        vf_loader *l = NULL;
        CHECK_OK(vf_loader_open(&l, d, &ls));
        if (!l)
            break;
        for (int i = 0; i < taken; i++) {
            vf_batch *b = NULL;
            if (vf_loader_next(l, &b) == 0)
                vf_batch_release(b);
        }
        vf_loader_stats st;
        vf_loader_get_stats(l, &st);
        CHECK(st.skipped == vf_loader_num_skips(l));
        for (size_t i = 0; i < vf_loader_num_skips(l); i++) {
            const vf_loader_skip *k = vf_loader_get_skip(l, i);
            CHECK(k->file && strstr(k->file, "cam0") != NULL);
            CHECK(k->column && strcmp(k->column, "observation.images.cam0") == 0);
            CHECK(k->message && strstr(k->message, "episode") != NULL);
        }
        CHECK(vf_loader_get_skip(l, vf_loader_num_skips(l)) == NULL);
        vf_loader_close(l); /* queued batches with skip records are freed */
    }
    /* A whole epoch: every sample of the files still there is served. */
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        vf_batch *b;
        uint64_t served = 0;
        int r;
        while ((r = vf_loader_next(l, &b)) == 0) {
            served += vf_batch_size(b);
            vf_batch_release(b);
        }
        CHECK_EQ_INT(r, VF_EOF);
        vf_loader_stats st;
        vf_loader_get_stats(l, &st);
        CHECK(st.skipped > 0);
        CHECK(served + st.skipped == (uint64_t)vf_loader_num_samples(l));
        vf_loader_close(l);
    }
    vf_dataset_close(d);
    CHECK_EQ_INT(rename(saved, victim), 0);
    free(saved);
    free(victim);
}

typedef struct pop_arg {
    vf_queue *q;
    int rc;
} pop_arg;

static void *pop_thread(void *p)
{
    pop_arg *a = p;
    void *item;
    a->rc = vf_queue_pop(a->q, &item);
    return NULL;
}

static void test_queue_close_wakes_a_blocked_pop(void)
{
    for (int i = 0; i < 20; i++) {
        vf_queue *q;
        CHECK_OK(vf_queue_create(&q, 2));
        pop_arg a = {q, 1};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, pop_thread, &a) == 0);
        if (i % 2)
            usleep(1000); /* sometimes the pop is already waiting, sometimes not yet */
        vf_queue_close(q);
        pthread_join(t, NULL);
        CHECK_EQ_INT(a.rc, VF_EOF);
        vf_queue_destroy(q);
    }
}

static void test_shared_readers_epoch(vf_dataset *d)
{
    static const vf_mode modes[] = {VF_MODE_STREAM, VF_MODE_POOL, VF_MODE_MAP};
    for (size_t m = 0; m < 3; m++) {
        vf_loader_settings ls;
        vf_loader_defaults(&ls);
        ls.mode = modes[m];
        ls.threads = 3;
        ls.batch_size = 4;
        ls.sample.image_format = VF_IMAGE_UINT8_HWC;
        vf_plan_opens plan;
        CHECK_OK(vf_plan_count_opens(d, &ls, 0, &plan));
        vf_loader *l = NULL;
        CHECK_OK(vf_loader_open(&l, d, &ls));
        if (!l)
            continue;
        vf_batch *b = NULL;
        int64_t samples = 0, bad = 0;
        int r;
        while ((r = vf_loader_next(l, &b)) == 0) {
            const vf_column *cams[2] = {vf_batch_find(b, "observation.images.cam0"),
                                        vf_batch_find(b, "observation.images.cam1")};
            for (size_t i = 0; i < vf_batch_size(b); i++) {
                int64_t ep, fr;
                locate(d, vf_batch_positions(b)[i], &ep, &fr);
                for (int c = 0; c < 2; c++)
                    bad += !cams[c] || !frame_is((const uint8_t *)cams[c]->data + i * 96 * 64 * 3, 96, 64, ep, fr, c);
            }
            samples += (int64_t)vf_batch_size(b);
            vf_batch_release(b);
        }
        CHECK_EQ_INT(r, VF_EOF);
        vf_loader_stats st;
        vf_loader_get_stats(l, &st);
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(samples, vf_loader_num_samples(l));
        CHECK_EQ_INT(st.video_opens, plan.consumer_opens);
        CHECK(plan.consumer_opens >= plan.lower_bound && plan.consumer_opens * 2 <= plan.lower_bound * 3);
        vf_loader_close(l);
    }
}

int main(void)
{
    char *root = make_dataset("close", 8, 30, 0.03, NULL);
    vf_dataset *d = open_dataset(root, NULL, 0);
    test_close_in_flight(d);
    test_batches_outlive_close(d);
    test_set_epoch_abandons(d);
    test_shared_readers_epoch(d);
    vf_dataset_close(d);
    test_skip_records_at_close(root);
    test_queue_close_wakes_a_blocked_pop();
    remove_dataset(root);
    return vf_test_finish("test_close");
}
