/*
 * test_loader_prefetch_bytes.c: the byte bound on prefetched batches
 * (vf_loader_settings.prefetch_bytes): the loader builds at most
 * prefetch + threads batches ahead, where prefetch is prefetch_batches
 * reduced (to at least 1) so the prefetched batches fit in prefetch_bytes;
 * 0 means no byte bound. Checked through vf_loader_stats.window and the
 * batch buffers alive over a whole epoch, with the epoch's samples intact.
 */
#include "test_loader_helpers.h"

#include <stdio.h>

/* Bytes of one sample in the default (float32 CHW) layout: 2 cameras of
 * 96x64x3 floats plus the tabular columns (a few hundred bytes). */
#define FRAME_BYTES (96 * 64 * 3 * 4)

static size_t window_of(vf_dataset *d, size_t prefetch, size_t bytes, int threads, size_t batch)
{
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_MAP;
    ls.batch_size = batch;
    ls.threads = threads;
    ls.prefetch_batches = prefetch;
    ls.prefetch_bytes = bytes;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (!l)
        return 0;
    vf_loader_stats st;
    vf_loader_get_stats(l, &st);
    vf_loader_close(l);
    return st.window;
}

static void test_window(vf_dataset *d)
{
    size_t batch = 16, sample_min = 2 * FRAME_BYTES, batch_min = batch * sample_min;
    vf_loader_settings def;
    vf_loader_defaults(&def);
    CHECK_EQ_INT(def.prefetch_batches, 4);
    CHECK_EQ_INT(def.prefetch_bytes, (size_t)1 << 30);
    /* Small batches: the count rules. */
    CHECK_EQ_INT(window_of(d, 4, (size_t)1 << 30, 1, batch), 4 + 1);
    CHECK_EQ_INT(window_of(d, 4, (size_t)1 << 30, 2, batch), 4 + 2);
    /* No byte bound. */
    CHECK_EQ_INT(window_of(d, 4, 0, 1, batch), 4 + 1);
    /* Room for two batches (but not three): prefetch 2. */
    CHECK_EQ_INT(window_of(d, 4, 2 * batch_min + batch_min / 2, 1, batch), 2 + 1);
    /* Less than one batch: still 1 prefetched. */
    CHECK_EQ_INT(window_of(d, 4, 1, 2, batch), 1 + 2);
    /* The count stays the upper bound. */
    CHECK_EQ_INT(window_of(d, 1, (size_t)1 << 30, 1, batch), 1 + 1);
}

/* A whole epoch under the tightest bound: every sample once, and the
 * buffers alive never exceed the window + the one the caller holds. */
static void test_epoch_under_bound(vf_dataset *d, int64_t frames)
{
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_MAP;
    ls.batch_size = 8;
    ls.threads = 2;
    ls.prefetch_bytes = 1;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (!l)
        return;
    uint8_t *seen = calloc((size_t)frames, 1);
    int64_t samples = 0;
    size_t max_buffers = 0;
    vf_batch *b;
    int r;
    while ((r = vf_loader_next(l, &b)) == 0) {
        for (size_t i = 0; i < vf_batch_size(b); i++) {
            int64_t p = vf_batch_positions(b)[i];
            if (p >= 0 && p < frames)
                seen[p]++;
        }
        samples += (int64_t)vf_batch_size(b);
        vf_loader_stats st;
        vf_loader_get_stats(l, &st);
        CHECK_EQ_INT(st.window, 1 + 2);
        if (st.batch_buffers > max_buffers)
            max_buffers = st.batch_buffers;
        vf_batch_release(b);
    }
    CHECK_EQ_INT(r, VF_EOF);
    CHECK_EQ_INT(samples, frames);
    int64_t once = 0;
    for (int64_t p = 0; p < frames; p++)
        once += seen[p] == 1;
    CHECK_EQ_INT(once, frames);
    CHECK(max_buffers >= 1 && max_buffers <= 3 + 1);
    free(seen);
    vf_loader_close(l);
}

int main(void)
{
    char *root = make_dataset("prefetch-bytes", 4, 30, 200, NULL);
    vf_dataset *d = open_dataset(root, NULL, 0);
    int64_t frames = 0;
    for (size_t i = 0; i < vf_dataset_num_episodes(d); i++)
        frames += vf_dataset_episode(d, i)->length;
    test_window(d);
    test_epoch_under_bound(d, frames);
    vf_dataset_close(d);
    remove_dataset(root);
    return vf_test_finish("test_loader_prefetch_bytes");
}
