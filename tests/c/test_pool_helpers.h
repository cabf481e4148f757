/*
 * test_pool_helpers.h: shared pieces of the pool and resume tests
 * (header-only): loader settings with delta windows on a camera and on the
 * action, a ground-truth check of every value of a batch (frame identity
 * stamps of every window step, clamped rows and pad masks, state/action
 * functions, index), and runs that record each batch's positions and a
 * digest of its bytes so two runs can be compared batch for batch.
 */
#ifndef VF_TEST_POOL_HELPERS_H
#define VF_TEST_POOL_HELPERS_H

#include <stdio.h>

#include "test_loader_helpers.h"

#define TP_W 96
#define TP_H 64
#define TP_FPS 10

/* action at offsets -2, 0, +1, +3 frames; cam0 at -1, 0 (cam1 current only). */
static const double tp_action_deltas[] = {-0.2, 0.0, 0.1, 0.3};
static const int64_t tp_action_offsets[] = {-2, 0, 1, 3};
static const double tp_cam_deltas[] = {-0.1, 0.0};
static const int64_t tp_cam_offsets[] = {-1, 0};
static const vf_delta_spec tp_deltas[] = {
    {"action", tp_action_deltas, 4},
    {"observation.images.cam0", tp_cam_deltas, 2},
};

static VF_UNUSED void tp_settings(vf_loader_settings *ls, vf_mode mode, uint64_t seed, size_t batch, int threads)
{
    vf_loader_defaults(ls);
    ls->mode = mode;
    ls->seed = seed;
    ls->batch_size = batch;
    ls->threads = threads;
    ls->sample.image_format = VF_IMAGE_UINT8_HWC;
    ls->sample.delta_timestamps = tp_deltas;
    ls->sample.num_delta_timestamps = 2;
}

/* Selected-episode start position of a position (first frame's position). */
static VF_UNUSED void tp_episode_bounds(const vf_dataset *d, int64_t position, int64_t *first, int64_t *end)
{
    int64_t start = 0;
    for (size_t i = 0; i < vf_dataset_num_episodes(d); i++) {
        int64_t len = vf_dataset_episode(d, i)->length;
        if (position < start + len) {
            *first = start;
            *end = start + len;
            return;
        }
        start += len;
    }
    *first = *end = -1;
}

/* Checks every value of a batch against make-sample's ground truth;
 * returns the number of wrong values (printing the first few). */
static VF_UNUSED int64_t tp_check_batch(const vf_dataset *d, const vf_batch *b, int state_dim, int windows)
{
    int64_t bad = 0;
    const vf_column *ac = vf_batch_find(b, "action"), *st = vf_batch_find(b, "observation.state"),
                    *ix = vf_batch_find(b, "index"), *ei = vf_batch_find(b, "episode_index"),
                    *fi = vf_batch_find(b, "frame_index"), *apad = vf_batch_find(b, "action_is_pad"),
                    *c0 = vf_batch_find(b, "observation.images.cam0"),
                    *c0pad = vf_batch_find(b, "observation.images.cam0_is_pad"),
                    *c1 = vf_batch_find(b, "observation.images.cam1");
    if (!ac || !st || !ix || !ei || !fi || (windows && (!apad || !c0pad)))
        return 1000000;
    size_t frame_bytes = (size_t)TP_W * TP_H * 3;
    int nact = windows ? 4 : 1, ncam = windows ? 2 : 1;
    for (size_t i = 0; i < vf_batch_size(b); i++) {
        int64_t p = vf_batch_positions(b)[i], ep, fr, first, end;
        locate(d, p, &ep, &fr);
        tp_episode_bounds(d, p, &first, &end);
        int64_t len = end - first;
        if (((const int64_t *)ei->data)[i] != ep || ((const int64_t *)fi->data)[i] != fr)
            bad++;
        size_t pos;
        if (vf_dataset_find_episode(d, ep, &pos) == 0 &&
            ((const int64_t *)ix->data)[i] != vf_dataset_episode(d, pos)->from_index + fr)
            bad++;
        for (int k = 0; k < state_dim; k++)
            if (((const float *)st->data)[i * (size_t)state_dim + (size_t)k] != vf_make_sample_state((int)ep, (int)fr, k))
                bad++;
        for (int t = 0; t < nact; t++) {
            int64_t q = fr + (windows ? tp_action_offsets[t] : 0);
            int pad = q < 0 || q >= len;
            q = q < 0 ? 0 : q >= len ? len - 1 : q;
            for (int k = 0; k < state_dim; k++)
                if (((const float *)ac->data)[(i * (size_t)nact + (size_t)t) * (size_t)state_dim + (size_t)k] !=
                    vf_make_sample_action((int)ep, (int)q, k))
                    bad++;
            if (windows && ((const uint8_t *)apad->data)[i * 4 + (size_t)t] != pad)
                bad++;
        }
        if (c0) {
            for (int t = 0; t < ncam; t++) {
                int64_t q = fr + (windows ? tp_cam_offsets[t] : 0);
                int pad = q < 0 || q >= len;
                q = q < 0 ? 0 : q >= len ? len - 1 : q;
                if (!frame_is((const uint8_t *)c0->data + (i * (size_t)ncam + (size_t)t) * frame_bytes, TP_W, TP_H, ep,
                              q, 0))
                    bad++;
                if (windows && ((const uint8_t *)c0pad->data)[i * 2 + (size_t)t] != pad)
                    bad++;
            }
        }
        if (c1 && !frame_is((const uint8_t *)c1->data + i * frame_bytes, TP_W, TP_H, ep, fr, 1))
            bad++;
    }
    return bad;
}

static VF_UNUSED uint64_t tp_digest(const vf_batch *b)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t c = 0; c < vf_batch_num_columns(b); c++) {
        const vf_column *col_ = vf_batch_column(b, c);
        if (col_->type == VF_COL_STRING) {
            for (int64_t i = 0; i < col_->shape[0]; i++)
                for (const char *s = col_->strings[i]; *s; s++)
                    h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
        } else {
            const uint8_t *p = col_->data;
            for (size_t i = 0; i < col_->nbytes; i++)
                h = (h ^ p[i]) * 0x100000001b3ull;
        }
    }
    return h;
}

/* What a run delivered, batch by batch. */
typedef struct tp_run {
    int64_t *positions;
    int64_t count;
    uint64_t *digests;         /* per batch */
    int64_t *batch_end;        /* per batch: positions[] index after its last sample */
    size_t batches;
    int64_t bad;               /* wrong values (when checked) */
    int rc;                    /* VF_EOF when the run ended cleanly */
} tp_run;

static VF_UNUSED void tp_run_free(tp_run *r)
{
    free(r->positions);
    free(r->digests);
    free(r->batch_end);
    memset(r, 0, sizeof *r);
}

static VF_UNUSED void tp_run_add(tp_run *r, const vf_batch *b)
{
    size_t n = vf_batch_size(b);
    r->positions = realloc(r->positions, (size_t)(r->count + (int64_t)n + 1) * sizeof *r->positions);
    r->digests = realloc(r->digests, (r->batches + 1) * sizeof *r->digests);
    r->batch_end = realloc(r->batch_end, (r->batches + 1) * sizeof *r->batch_end);
    memcpy(r->positions + r->count, vf_batch_positions(b), n * sizeof *r->positions);
    r->count += (int64_t)n;
    r->digests[r->batches] = tp_digest(b);
    r->batch_end[r->batches] = r->count;
    r->batches++;
}

/* Takes up to max_batches batches (SIZE_MAX: to the end of the epoch). */
static VF_UNUSED void tp_take(vf_loader *l, const vf_dataset *d, size_t max_batches, int check, int state_dim,
                              tp_run *r)
{
    vf_batch *b;
    int rc = 0;
    for (size_t i = 0; i < max_batches && (rc = vf_loader_next(l, &b)) == 0; i++) {
        if (check)
            r->bad += tp_check_batch(d, b, state_dim, 1);
        tp_run_add(r, b);
        vf_batch_release(b);
    }
    r->rc = rc;
}

/* Batch ia of a equals batch ib of b (positions and bytes). */
static VF_UNUSED int tp_batch_equal(const tp_run *a, size_t ia, const tp_run *b, size_t ib)
{
    if (ia >= a->batches || ib >= b->batches)
        return 0;
    int64_t a0 = ia ? a->batch_end[ia - 1] : 0, b0 = ib ? b->batch_end[ib - 1] : 0;
    int64_t len = a->batch_end[ia] - a0;
    return len == b->batch_end[ib] - b0 && a->digests[ia] == b->digests[ib] &&
           memcmp(a->positions + a0, b->positions + b0, (size_t)len * sizeof(int64_t)) == 0;
}

/* Batches [from, from + n) of a equal batches [0, n) of b (positions and bytes). */
static VF_UNUSED int tp_same_batches(const tp_run *a, size_t from, const tp_run *b, size_t n)
{
    if (from + n > a->batches || n > b->batches)
        return 0;
    for (size_t i = 0; i < n; i++) {
        int64_t a0 = from + i ? a->batch_end[from + i - 1] : 0, b0 = i ? b->batch_end[i - 1] : 0;
        int64_t len = a->batch_end[from + i] - a0;
        if (len != b->batch_end[i] - b0 || a->digests[from + i] != b->digests[i] ||
            memcmp(a->positions + a0, b->positions + b0, (size_t)len * sizeof(int64_t)) != 0)
            return 0;
    }
    return 1;
}

#endif
