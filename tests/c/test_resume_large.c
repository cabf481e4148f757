/*
 * test_resume_large.c: resuming mid-epoch on a million-frame dataset
 * (make-sample without cameras: 1000 episodes x 1000 frames, written in
 * about a second). The fast-forward replays the plan only: after
 * vf_loader_set_state (and after opening with the state) the loader
 * continues with exactly the batch an uninterrupted run yields there, and
 * nothing before the resume point is assembled (samples_assembled stays
 * within the prefetch window past the resume point). The fast-forward time
 * is printed, never asserted.
 */
#include "test_pool_helpers.h"

static double now(void) { return vf_now_seconds(); }

static void settings(vf_loader_settings *ls, vf_mode mode)
{
    vf_loader_defaults(ls);
    ls->mode = mode;
    ls->seed = 3;
    ls->batch_size = 256;
    ls->threads = 2;
    ls->episode_pool_size = 16;
    ls->partition = VF_PARTITION_EPISODE;
}

static void run(vf_dataset *d, vf_mode mode, const char *name)
{
    vf_loader_settings ls;
    settings(&ls, mode);
    double t0 = now();
    vf_loader *ref = NULL;
    CHECK_OK(vf_loader_open(&ref, d, &ls));
    double open_s = now() - t0;
    if (!ref)
        return;
    size_t nb = vf_loader_num_batches(ref);
    size_t k = nb / 2 + 7;
    /* The reference: batches k and k + 1 of an uninterrupted run. */
    tp_run want = {0}, skip = {0};
    tp_take(ref, d, k, 0, 0, &skip);
    tp_take(ref, d, 2, 0, 0, &want);
    CHECK_EQ_INT(want.batches, 2);
    vf_loader_state st;
    CHECK_OK(vf_loader_state_at(d, &ls, 0, (int64_t)k, &st));
    CHECK_EQ_INT(st.samples_consumed, skip.count);
    vf_loader_close(ref);

    /* set_state on a running loader (at the start of epoch 0). */
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (l) {
        double t1 = now();
        CHECK_OK(vf_loader_set_state(l, &st));
        double ff_s = now() - t1;
        tp_run got = {0};
        tp_take(l, d, 2, 0, 0, &got);
        CHECK(tp_same_batches(&want, 0, &got, 2));
        fprintf(stderr, "  %s: %lld frames, %zu batches of 256: open %.1f ms; set_state to batch %zu "
                        "(fast-forward, plan rebuilt) %.1f ms\n",
                name, (long long)vf_loader_num_positions(l), nb, open_s * 1e3, k, ff_s * 1e3);
        tp_run_free(&got);
        vf_loader_close(l);
    }
    /* Opened with the state: nothing before the resume point is built. */
    ls.resume = &st;
    double t2 = now();
    CHECK_OK(vf_loader_open(&l, d, &ls));
    double open_resume_s = now() - t2;
    if (l) {
        tp_run got = {0};
        tp_take(l, d, 2, 0, 0, &got);
        CHECK(tp_same_batches(&want, 0, &got, 2));
        vf_loader_stats s;
        vf_loader_get_stats(l, &s);
        CHECK(s.samples_assembled <= (uint64_t)(s.window + 2) * 256);
        CHECK_EQ_INT(s.frames_decoded, 0);
        fprintf(stderr, "  %s: open with a mid-epoch state %.1f ms (%llu samples assembled)\n", name,
                open_resume_s * 1e3, (unsigned long long)s.samples_assembled);
        tp_run_free(&got);
        vf_loader_close(l);
    }
    tp_run_free(&want);
    tp_run_free(&skip);
}

int main(void)
{
    char *dir = vf_test_tmpdir("resume_large");
    char *root = vf_path_join(dir, "ds");
    free(dir);
    vf_make_sample_settings s;
    vf_make_sample_defaults(&s);
    s.num_cameras = 0;
    s.num_episodes = 1000;
    s.min_length = 1000;
    s.max_length = 1000;
    vf_set_log_level(0);
    double t0 = now();
    if (vf_make_sample(root, &s) < 0) {
        fprintf(stderr, "make-sample failed: %s\n", vf_last_error());
        return 2;
    }
    fprintf(stderr, "  make-sample: 1,000,000 frames in %.2f s\n", now() - t0);
    vf_dataset *d = open_dataset(root, NULL, 0);
    run(d, VF_MODE_POOL, "pool");
    run(d, VF_MODE_MAP, "map");
    vf_dataset_close(d);
    remove_dataset(root);
    return vf_test_finish("test_resume_large");
}
