/*
 * test_sample.c: the sample layer through the loader's map access: delta
 * offsets and their validation, clamping with pad masks (LeRobot's own
 * example), LeRobot shapes and dtypes, tabular values and frames against the
 * make-sample ground truth, pixel formats, resize, renames, normalization,
 * and the setting errors (unknown keys, off-grid deltas, bad positions).
 */
#include "test_loader_helpers.h"

#include "sample/sample.h"

static void test_delta_offsets(void)
{
    int64_t off[8];
    const double ok[] = {-0.2, -0.1, 0.0, 0.1, 0.2};
    CHECK_OK(vf_sample_delta_offsets("action", ok, 5, 10.0, 1e-4, off));
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(off[i], i - 2);
    /* 1/30 steps are not exact in binary; they must still pass at 30 fps. */
    const double thirty[] = {-1.0 / 30, 0.0, 1.0 / 30, 2.0 / 30, 1.0};
    CHECK_OK(vf_sample_delta_offsets("observation.state", thirty, 5, 30.0, 1e-4, off));
    CHECK_EQ_INT(off[0], -1);
    CHECK_EQ_INT(off[3], 2);
    CHECK_EQ_INT(off[4], 30);
    /* Off the grid: the message names the key and the value. */
    const double bad[] = {0.0, 0.05};
    CHECK_ERR(vf_sample_delta_offsets("action", bad, 2, 10.0, 1e-4, off), VF_EINVAL, "delta_timestamps['action'][1]");
    CHECK(strstr(vf_last_error(), "0.05") != NULL);
    /* Within the tolerance it passes and rounds. */
    const double near[] = {0.10005};
    CHECK_OK(vf_sample_delta_offsets("action", near, 1, 10.0, 1e-4, off));
    CHECK_EQ_INT(off[0], 1);
    CHECK_ERR(vf_sample_delta_offsets("action", near, 1, 10.0, 1e-5, off), VF_EINVAL, "not a multiple of 1/fps");
    const double nan_value[] = {NAN};
    CHECK_ERR(vf_sample_delta_offsets("x", nan_value, 1, 10.0, 1e-4, off), VF_EINVAL, "delta_timestamps['x'][0]");
    CHECK_ERR(vf_sample_delta_offsets("x", ok, 0, 10.0, 1e-4, off), VF_EINVAL, "empty");
}

static void test_window_lerobot_example(void)
{
    /* tests/datasets/test_datasets.py: fps 10, a 5-frame episode, deltas
     * -0.2..+0.2 s: first frame pads [T,T,F,F,F], last [F,F,F,T,T]. Here the
     * episode covers positions [100, 105). */
    int64_t off[5];
    const double d[] = {-0.2, -0.1, 0.0, 0.1, 0.2};
    CHECK_OK(vf_sample_delta_offsets("action", d, 5, 10.0, 1e-4, off));
    int64_t rows[5];
    uint8_t pad[5];
    vf_sample_window(100, 100, 105, off, 5, rows, pad);
    const uint8_t first_pad[] = {1, 1, 0, 0, 0};
    const int64_t first_rows[] = {100, 100, 100, 101, 102};
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(pad[i], first_pad[i]);
        CHECK_EQ_INT(rows[i], first_rows[i]);
    }
    vf_sample_window(104, 100, 105, off, 5, rows, pad);
    const uint8_t last_pad[] = {0, 0, 0, 1, 1};
    const int64_t last_rows[] = {102, 103, 104, 104, 104};
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(pad[i], last_pad[i]);
        CHECK_EQ_INT(rows[i], last_rows[i]);
    }
    /* A window wider than the episode: everything clamps to its ends. */
    const int64_t wide[] = {-10, 10};
    vf_sample_window(102, 100, 105, wide, 2, rows, pad);
    CHECK_EQ_INT(rows[0], 100);
    CHECK_EQ_INT(rows[1], 104);
    CHECK(pad[0] && pad[1]);
}

static vf_loader *open_map(vf_dataset *d, vf_loader_settings *ls)
{
    ls->mode = VF_MODE_MAP;
    ls->threads = 2;
    vf_loader *l = NULL;
    int r = vf_loader_open(&l, d, ls);
    CHECK_OK(r);
    return r == 0 ? l : NULL;
}

/* Everything about one windowed sample against the ground truth. */
static void test_windows_values_frames(vf_dataset *d, const vf_make_sample_settings *ms)
{
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    const double action_d[] = {-0.2, -0.1, 0.0, 0.1, 0.2};
    const double cam_d[] = {-0.1, 0.0, 0.1};
    vf_delta_spec deltas[] = {{"action", action_d, 5}, {"observation.images.cam1", cam_d, 3}};
    ls.sample.delta_timestamps = deltas;
    ls.sample.num_delta_timestamps = 2;
    ls.sample.image_format = VF_IMAGE_UINT8_HWC;
    vf_loader *l = open_map(d, &ls);
    if (!l)
        return;
    /* First and last frames of episode 1, and a middle one. */
    const vf_episode *e1 = vf_dataset_episode(d, 1);
    int64_t start = vf_dataset_episode(d, 0)->length;
    int64_t positions[] = {start, start + e1->length - 1, start + 4};
    vf_batch *b = NULL;
    CHECK_OK(vf_loader_get_items(l, positions, 3, &b));
    if (!b) {
        vf_loader_close(l);
        return;
    }
    CHECK_EQ_INT(vf_batch_size(b), 3);
    /* Column order: videos, data columns, pads, task. */
    const char *expect[] = {"observation.images.cam0", "observation.images.cam1", "action", "observation.state",
                            "timestamp", "frame_index", "episode_index", "index", "task_index", "action_is_pad",
                            "observation.images.cam1_is_pad", "task"};
    CHECK_EQ_INT(vf_batch_num_columns(b), VF_ARRAY_LEN(expect));
    for (size_t i = 0; i < VF_ARRAY_LEN(expect) && i < vf_batch_num_columns(b); i++)
        CHECK(strcmp(vf_batch_column(b, i)->name, expect[i]) == 0);

    const vf_column *act = col(b, "action"), *pad = col(b, "action_is_pad"), *cam1 = col(b, "observation.images.cam1"),
                    *cam0 = col(b, "observation.images.cam0"), *cpad = col(b, "observation.images.cam1_is_pad"),
                    *state = col(b, "observation.state"), *task = col(b, "task"), *ts = col(b, "timestamp");
    if (!act || !pad || !cam1 || !cam0 || !cpad || !state || !task || !ts) {
        vf_batch_release(b);
        vf_loader_close(l);
        return;
    }
    /* Shapes and types. */
    CHECK_EQ_INT(act->ndim, 3);
    CHECK_EQ_INT(act->shape[1], 5);
    CHECK_EQ_INT(act->shape[2], ms->state_dim);
    CHECK_EQ_INT(act->type, VF_COL_FLOAT32);
    CHECK_EQ_INT(pad->type, VF_COL_BOOL);
    CHECK_EQ_INT(pad->ndim, 2);
    CHECK_EQ_INT(cam1->ndim, 5);
    CHECK_EQ_INT(cam1->shape[1], 3);
    CHECK_EQ_INT(cam1->shape[2], 64);
    CHECK_EQ_INT(cam1->shape[3], 96);
    CHECK_EQ_INT(cam1->shape[4], 3);
    CHECK_EQ_INT(cam0->ndim, 4); /* no window: [B, H, W, C] */
    CHECK_EQ_INT(state->ndim, 2);
    CHECK_EQ_INT(ts->ndim, 1);
    CHECK_EQ_INT(ts->type, VF_COL_FLOAT32);
    CHECK_EQ_INT(col(b, "index")->type, VF_COL_INT64);
    CHECK_EQ_INT(task->type, VF_COL_STRING);

    int64_t ep = e1->episode_index;
    int64_t frames_in_sample[] = {0, e1->length - 1, 4};
    const uint8_t *pads = pad->data;
    const float *av = act->data;
    for (int s = 0; s < 3; s++) {
        int64_t k = frames_in_sample[s];
        for (int t = 0; t < 5; t++) {
            int64_t want = k + t - 2;
            int is_pad = want < 0 || want >= e1->length;
            CHECK_EQ_INT(pads[s * 5 + t], is_pad);
            int64_t clamped = want < 0 ? 0 : want >= e1->length ? e1->length - 1 : want;
            for (int dim = 0; dim < ms->state_dim; dim++) {
                float v = av[((size_t)s * 5 + (size_t)t) * (size_t)ms->state_dim + (size_t)dim];
                CHECK(v == vf_make_sample_action((int)ep, (int)clamped, dim));
            }
        }
        const float *sv = (const float *)state->data + (size_t)s * (size_t)ms->state_dim;
        for (int dim = 0; dim < ms->state_dim; dim++)
            CHECK(sv[dim] == vf_make_sample_state((int)ep, (int)k, dim));
        CHECK(((const float *)ts->data)[s] == (float)((double)k / ms->fps));
        /* Frames: cam0 the current frame, cam1 the window (padded = boundary frame). */
        const uint8_t *f0 = (const uint8_t *)cam0->data + (size_t)s * 96 * 64 * 3;
        CHECK(frame_is(f0, 96, 64, ep, k, 0));
        const uint8_t *cp = cpad->data;
        for (int t = 0; t < 3; t++) {
            int64_t want = k + t - 1;
            int64_t clamped = want < 0 ? 0 : want >= e1->length ? e1->length - 1 : want;
            CHECK_EQ_INT(cp[s * 3 + t], want != clamped);
            const uint8_t *f1 = (const uint8_t *)cam1->data + ((size_t)s * 3 + (size_t)t) * 96 * 64 * 3;
            CHECK(frame_is(f1, 96, 64, ep, clamped, 1));
        }
        CHECK(strcmp(task->strings[s], vf_dataset_task(d, (size_t)(ep % ms->num_tasks))) == 0);
        CHECK_EQ_INT(vf_batch_positions(b)[s], positions[s]);
    }
    vf_batch_release(b);
    vf_loader_close(l);
}

/* LeRobot's shapes: single-delta video squeezed, single-delta vector [1,N],
 * scalars 0-d; lerobot_shapes = 0 keeps [T,...]. */
static void test_shapes(vf_dataset *d, const vf_make_sample_settings *ms)
{
    for (int lerobot = 1; lerobot >= 0; lerobot--) {
        vf_loader_settings ls;
        vf_loader_defaults(&ls);
        const double one[] = {0.0};
        vf_delta_spec deltas[] = {{"observation.images.cam0", one, 1}, {"observation.state", one, 1},
                                  {"frame_index", one, 1}};
        ls.sample.delta_timestamps = deltas;
        ls.sample.num_delta_timestamps = 3;
        ls.sample.lerobot_shapes = lerobot;
        vf_loader *l = open_map(d, &ls);
        if (!l)
            return;
        int64_t p = 3;
        vf_batch *b = NULL;
        CHECK_OK(vf_loader_get_items(l, &p, 1, &b));
        if (b) {
            const vf_column *c0 = col(b, "observation.images.cam0"), *c1 = col(b, "observation.images.cam1"),
                            *st = col(b, "observation.state"), *fi = col(b, "frame_index"),
                            *ix = col(b, "index");
            CHECK_EQ_INT(c0->ndim, lerobot ? 4 : 5); /* [B,C,H,W] vs [B,1,C,H,W] */
            CHECK_EQ_INT(c0->shape[lerobot ? 1 : 2], 3);
            CHECK_EQ_INT(c0->type, VF_COL_FLOAT32);
            CHECK_EQ_INT(c1->ndim, 4);
            CHECK_EQ_INT(st->ndim, 3); /* [B,1,N] either way */
            CHECK_EQ_INT(st->shape[1], 1);
            CHECK_EQ_INT(st->shape[2], ms->state_dim);
            CHECK_EQ_INT(fi->ndim, 2); /* [B,1] */
            CHECK_EQ_INT(ix->ndim, 1); /* [B]: a 0-d value per sample */
            CHECK_EQ_INT(((const int64_t *)ix->data)[0], 3);
            CHECK_EQ_INT(c0->nbytes, (size_t)3 * 64 * 96 * 4);
            const float *px = c0->data;
            float lo = 1, hi = 0;
            for (size_t i = 0; i < (size_t)3 * 64 * 96; i++) {
                lo = px[i] < lo ? px[i] : lo;
                hi = px[i] > hi ? px[i] : hi;
            }
            CHECK(lo >= 0.0f && hi <= 1.0f && hi > lo);
            vf_batch_release(b);
        }
        vf_loader_close(l);
    }
}

/* float32 CHW == uint8 CHW / 255 == transposed uint8 HWC; resize; renames. */
static void test_formats_resize_renames(vf_dataset *d)
{
    vf_batch *bf = NULL, *bc = NULL, *bh = NULL, *br = NULL;
    vf_loader *lf = NULL, *lc = NULL, *lh = NULL, *lr = NULL;
    int64_t p[] = {7, 30};
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    lf = open_map(d, &ls);
    ls.sample.image_format = VF_IMAGE_UINT8_CHW;
    lc = open_map(d, &ls);
    ls.sample.image_format = VF_IMAGE_UINT8_HWC;
    vf_rename_spec ren[] = {{"observation.images.cam0", "observation.images.base_0_rgb"}};
    ls.sample.renames = ren;
    ls.sample.num_renames = 1;
    lh = open_map(d, &ls);
    ls.sample.renames = NULL;
    ls.sample.num_renames = 0;
    ls.sample.resize_width = 48;
    ls.sample.resize_height = 32;
    lr = open_map(d, &ls);
    if (!lf || !lc || !lh || !lr)
        goto done;
    CHECK_OK(vf_loader_get_items(lf, p, 2, &bf));
    CHECK_OK(vf_loader_get_items(lc, p, 2, &bc));
    CHECK_OK(vf_loader_get_items(lh, p, 2, &bh));
    CHECK_OK(vf_loader_get_items(lr, p, 2, &br));
    if (!bf || !bc || !bh || !br)
        goto done;
    const vf_column *f = col(bf, "observation.images.cam0"), *c = col(bc, "observation.images.cam0"),
                    *h = col(bh, "observation.images.base_0_rgb"), *r = col(br, "observation.images.cam1");
    CHECK(vf_batch_find(bh, "observation.images.cam0") == NULL);
    if (!f || !c || !h || !r)
        goto done;
    CHECK_EQ_INT(c->type, VF_COL_UINT8);
    const float *fv = f->data;
    const uint8_t *cv = c->data, *hv = h->data;
    size_t plane = 64 * 96, mismatches = 0;
    for (size_t s = 0; s < 2; s++)
        for (size_t ch = 0; ch < 3; ch++)
            for (size_t i = 0; i < plane; i++) {
                size_t chw = s * 3 * plane + ch * plane + i;
                size_t hwc = s * 3 * plane + i * 3 + ch;
                if (fv[chw] != (float)cv[chw] / 255.0f || cv[chw] != hv[hwc])
                    mismatches++;
            }
    CHECK_EQ_INT(mismatches, 0);
    CHECK_EQ_INT(r->shape[1], 32);
    CHECK_EQ_INT(r->shape[2], 48);
    CHECK_EQ_INT(r->shape[3], 3);
    int64_t ep, fr;
    locate(d, 30, &ep, &fr);
    CHECK(frame_is((const uint8_t *)r->data + (size_t)48 * 32 * 3, 48, 32, ep, fr, 1));
done:
    vf_batch_release(bf);
    vf_batch_release(bc);
    vf_batch_release(bh);
    vf_batch_release(br);
    vf_loader_close(lf);
    vf_loader_close(lc);
    vf_loader_close(lh);
    vf_loader_close(lr);
}

static void test_normalization(vf_dataset *d, const vf_make_sample_settings *ms)
{
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    vf_norm_spec norm[] = {{"observation.state", VF_NORM_MEAN_STD}, {"action", VF_NORM_MIN_MAX},
                           {"observation.images.cam0", VF_NORM_MEAN_STD}};
    ls.sample.normalize = norm;
    ls.sample.num_normalize = 3;
    vf_loader *l = open_map(d, &ls);
    vf_loader_settings plain;
    vf_loader_defaults(&plain);
    vf_loader *lp = open_map(d, &plain);
    if (!l || !lp) {
        vf_loader_close(l);
        vf_loader_close(lp);
        return;
    }
    int64_t p = 11;
    vf_batch *b = NULL, *bp = NULL;
    CHECK_OK(vf_loader_get_items(l, &p, 1, &b));
    CHECK_OK(vf_loader_get_items(lp, &p, 1, &bp));
    if (b && bp) {
        const vf_stat *mean = vf_dataset_find_stat(d, "observation.state", "mean");
        const vf_stat *std = vf_dataset_find_stat(d, "observation.state", "std");
        const vf_stat *mn = vf_dataset_find_stat(d, "action", "min");
        const vf_stat *mx = vf_dataset_find_stat(d, "action", "max");
        int64_t ep, fr;
        locate(d, p, &ep, &fr);
        const float *sv = col(b, "observation.state")->data, *av = col(b, "action")->data;
        for (int i = 0; i < ms->state_dim; i++) {
            float x = vf_make_sample_state((int)ep, (int)fr, i);
            float want = (x - (float)mean->values[i]) / ((float)std->values[i] + 1e-8f);
            CHECK(fabsf(sv[i] - want) <= 1e-6f * fmaxf(1.0f, fabsf(want)));
            float a = vf_make_sample_action((int)ep, (int)fr, i);
            float wa = (a - (float)mn->values[i]) / (((float)mx->values[i] - (float)mn->values[i]) + 1e-8f) * 2 - 1;
            CHECK(fabsf(av[i] - wa) <= 1e-6f);
            CHECK(av[i] >= -1.0f - 1e-6f && av[i] <= 1.0f + 1e-6f);
        }
        const vf_stat *cm = vf_dataset_find_stat(d, "observation.images.cam0", "mean");
        const vf_stat *cs = vf_dataset_find_stat(d, "observation.images.cam0", "std");
        const float *img = col(b, "observation.images.cam0")->data, *raw = col(bp, "observation.images.cam0")->data;
        size_t plane = 64 * 96, bad = 0;
        for (size_t ch = 0; ch < 3; ch++)
            for (size_t i = 0; i < plane; i += 97) {
                float want = (raw[ch * plane + i] - (float)cm->values[ch]) / ((float)cs->values[ch] + 1e-8f);
                bad += fabsf(img[ch * plane + i] - want) > 1e-5f;
            }
        CHECK_EQ_INT(bad, 0);
    }
    vf_batch_release(b);
    vf_batch_release(bp);
    vf_loader_close(l);
    vf_loader_close(lp);
}

static void test_errors(vf_dataset *d)
{
    vf_loader *l = NULL;
    vf_loader_settings ls;
    const double ok[] = {0.0, 0.1};
    const double off[] = {0.0, 0.123};

    vf_loader_defaults(&ls);
    vf_delta_spec unknown[] = {{"observation.velocity", ok, 2}};
    ls.sample.delta_timestamps = unknown;
    ls.sample.num_delta_timestamps = 1;
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "unknown key 'observation.velocity'");
    CHECK(strstr(vf_last_error(), "delta_timestamps") != NULL);
    CHECK(l == NULL);

    vf_delta_spec offgrid[] = {{"action", off, 2}};
    ls.sample.delta_timestamps = offgrid;
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "delta_timestamps['action'][1]");
    CHECK(strstr(vf_last_error(), "0.123") != NULL);

    vf_loader_defaults(&ls);
    vf_rename_spec ren[] = {{"observation.images.top", "observation.images.base_0_rgb"}};
    ls.sample.renames = ren;
    ls.sample.num_renames = 1;
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "renames: unknown key 'observation.images.top'");

    vf_rename_spec clash[] = {{"observation.images.cam0", "observation.images.cam1"}};
    ls.sample.renames = clash;
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "two output columns would be named 'observation.images.cam1'");

    vf_loader_defaults(&ls);
    vf_norm_spec norm[] = {{"index", VF_NORM_MEAN_STD}};
    ls.sample.normalize = norm;
    ls.sample.num_normalize = 1;
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "normalize['index']");
    vf_norm_spec norm2[] = {{"observation.images.cam0", VF_NORM_MEAN_STD}};
    ls.sample.normalize = norm2;
    ls.sample.image_format = VF_IMAGE_UINT8_CHW;
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "only in the float32 format");

    vf_loader_defaults(&ls);
    const char *keys[] = {"action", "nope"};
    ls.sample.keys = keys;
    ls.sample.num_keys = 2;
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "keys: unknown key 'nope'");

    vf_loader_defaults(&ls);
    ls.sample.resize_width = 10;
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "resize");

    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_POOL;
    ls.episode_pool_size = 0;
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "episode_pool_size 0");

    vf_loader_defaults(&ls);
    ls.rank = 2;
    ls.world_size = 2;
    CHECK_ERR(vf_loader_open(&l, d, &ls), VF_EINVAL, "rank 2");

    /* Positions out of range. */
    vf_loader_defaults(&ls);
    l = open_map(d, &ls);
    if (l) {
        vf_batch *b = NULL;
        int64_t n = vf_loader_num_positions(l);
        int64_t bad[] = {0, n};
        CHECK_ERR(vf_loader_get_items(l, bad, 2, &b), VF_ERANGE, "out of range");
        int64_t neg = -1;
        CHECK_ERR(vf_loader_get_items(l, &neg, 1, &b), VF_ERANGE, "position -1");
        CHECK(b == NULL);
        vf_loader_close(l);
    }
}

/* A selection of episodes: positions cover only them, in order. */
static void test_selection(const char *root)
{
    const int64_t pick[] = {3, 1};
    vf_dataset *d = open_dataset(root, pick, 2);
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.sample.image_format = VF_IMAGE_UINT8_HWC;
    vf_loader *l = open_map(d, &ls);
    if (l) {
        int64_t l1 = episode_length(d, 1), l3 = episode_length(d, 3);
        CHECK_EQ_INT(vf_loader_num_positions(l), l1 + l3);
        int64_t p[] = {0, l1 - 1, l1, l1 + l3 - 1};
        int64_t want_ep[] = {1, 1, 3, 3}, want_fr[] = {0, l1 - 1, 0, l3 - 1};
        vf_batch *b = NULL;
        CHECK_OK(vf_loader_get_items(l, p, 4, &b));
        if (b) {
            const vf_column *ei = col(b, "episode_index"), *fi = col(b, "frame_index"),
                            *cam = col(b, "observation.images.cam1");
            for (int i = 0; i < 4; i++) {
                CHECK_EQ_INT(((const int64_t *)ei->data)[i], want_ep[i]);
                CHECK_EQ_INT(((const int64_t *)fi->data)[i], want_fr[i]);
                CHECK(frame_is((const uint8_t *)cam->data + (size_t)i * 96 * 64 * 3, 96, 64, want_ep[i], want_fr[i], 1));
            }
            vf_batch_release(b);
        }
        vf_loader_close(l);
    }
    vf_dataset_close(d);
}

/* The second camera declares another size in info.json than its stream has:
 * the open-time video check (issue 10) warns and uses the file's size, so
 * each camera gets its own output size (the stream's), never an overrun. */
static void test_per_camera_sizes(const char *root)
{
    char *info = vf_path_join(root, "meta/info.json");
    uint8_t *text;
    size_t len;
    if (vf_read_file(info, &text, &len) < 0) {
        CHECK(0);
        free(info);
        return;
    }
    /* The second occurrence of the size is cam1's. */
    char *edited = vf_strdup((const char *)text);
    char *h = strstr(edited, "\"video.height\": 64");
    h = h ? strstr(h + 1, "\"video.height\": 64") : NULL;
    char *w = h ? strstr(h, "\"video.width\": 96") : NULL;
    CHECK(h && w);
    if (h && w) {
        memcpy(h + strlen("\"video.height\": "), "32", 2);
        memcpy(w + strlen("\"video.width\": "), "48", 2);
        FILE *f = fopen(info, "wb");
        fwrite(edited, 1, strlen(edited), f);
        fclose(f);
        vf_dataset *d = open_dataset(root, NULL, 0);
        vf_loader_settings ls;
        vf_loader_defaults(&ls);
        ls.sample.image_format = VF_IMAGE_UINT8_HWC;
        vf_loader *l = open_map(d, &ls);
        int64_t p = 9, ep, fr;
        vf_batch *b = NULL;
        if (l)
            CHECK_OK(vf_loader_get_items(l, &p, 1, &b));
        if (b) {
            const vf_column *c0 = col(b, "observation.images.cam0"), *c1 = col(b, "observation.images.cam1");
            CHECK_EQ_INT(c0->shape[1], 64);
            CHECK_EQ_INT(c0->shape[2], 96);
            CHECK_EQ_INT(c1->shape[1], 64);
            CHECK_EQ_INT(c1->shape[2], 96);
            locate(d, p, &ep, &fr);
            CHECK(frame_is(c0->data, 96, 64, ep, fr, 0));
            CHECK(frame_is(c1->data, 96, 64, ep, fr, 1));
            int warned = 0;
            for (size_t i = 0; i < vf_dataset_num_problems(d); i++)
                warned |= strstr(vf_dataset_problem(d, i)->message, "frames are 96x64 in the file, info.json says "
                                                                    "48x32") != NULL;
            CHECK(warned);
            vf_batch_release(b);
        }
        vf_loader_close(l);
        vf_dataset_close(d);
        f = fopen(info, "wb");
        fwrite(text, 1, len, f);
        fclose(f);
    }
    free(edited);
    free(text);
    free(info);
}

int main(void)
{
    test_delta_offsets();
    test_window_lerobot_example();
    vf_make_sample_settings ms;
    char *root = make_dataset("sample", 4, 10, 0.03, &ms);
    vf_dataset *d = open_dataset(root, NULL, 0);
    test_windows_values_frames(d, &ms);
    test_shapes(d, &ms);
    test_formats_resize_renames(d);
    test_normalization(d, &ms);
    test_errors(d);
    vf_dataset_close(d);
    test_selection(root);
    test_per_camera_sizes(root);
    remove_dataset(root);
    return vf_test_finish("test_sample");
}
