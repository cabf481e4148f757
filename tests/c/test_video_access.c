/*
 * test_video_access.c: frame exactness of random and batched access.
 *
 * For AV1 and H.264, GOP 2 and GOP 30: episodes with identity stamps are
 * encoded, concatenated LeRobot-style (timestamp drift included), indexed and
 * mapped; then every (episode, k) is fetched by random access in a shuffled
 * order and by batched requests with duplicates, and each returned frame must
 * carry exactly its identity. Also: sequential decoder reuse (one seek, no
 * frame decoded twice), GOP-aware decode counts, output layouts agreeing with
 * each other, identities surviving resize, per-request errors in a batch,
 * held frames (decode now, convert after the reader is closed) equal to
 * frames converted at once.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <pthread.h>

#include "test_video_helpers.h"
#include "video/video_internal.h"

#define W 96
#define H 64

static void check_all_frames(const camera_file *cf, int gop, const char *label, int camera)
{
    vf_video_reader *r = NULL;
    vf_video_settings vs;
    vf_video_defaults(&vs);
    vs.camera = "observation.images.test";
    CHECK_OK(vf_video_open_file(&r, cf->path, &vs));
    if (!r)
        return;
    const vf_video_index *ix = vf_video_reader_index(r);
    CHECK_EQ_INT(ix->frame_count, cf->total_frames);
    CHECK_EQ_INT(ix->width, W);
    CHECK_EQ_INT(ix->height, H);
    CHECK_EQ_INT(ix->time_base_den, 15360);
    int64_t expect_keys = 0;
    for (size_t e = 0; e < cf->count; e++)
        expect_keys += (cf->eps[e].length + gop - 1) / gop;
    CHECK_EQ_INT(ix->keyframe_count, expect_keys);

    vf_video_episode eps[16];
    memcpy(eps, cf->eps, sizeof eps);
    vf_video_map map;
    vf_video_map_settings ms = {.fps = 30, .camera = "observation.images.test"};
    CHECK_OK(vf_video_map_episodes(ix, eps, cf->count, &ms, &map));
    CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_ORDINAL);
    CHECK(map.max_abs_drift_ms > 0.0); /* lengths not multiples of 3 at 30 fps drift */
    CHECK(map.max_abs_drift_ms < 5.0);

    /* Every (episode, k) by random access, shuffled. */
    int64_t n = cf->total_frames;
    int64_t *order = malloc((size_t)n * sizeof *order);
    int64_t *ep_of = malloc((size_t)n * sizeof *ep_of), *k_of = malloc((size_t)n * sizeof *k_of);
    int64_t m = 0;
    for (size_t e = 0; e < cf->count; e++)
        for (int64_t k = 0; k < eps[e].length; k++) {
            ep_of[m] = (int64_t)e;
            k_of[m] = k;
            order[m] = m;
            m++;
        }
    shuffle_i64(order, (size_t)n, 42);
    uint8_t *buf = malloc(W * H * 3);
    int wrong = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t e = ep_of[order[i]], k = k_of[order[i]], ordinal;
        CHECK_OK(vf_video_episode_frame(&eps[e], k, &ordinal));
        int rc = vf_video_read_frame(r, ordinal, NULL, buf);
        CHECK_OK(rc);
        if (rc == 0 && !has_identity(buf, W, H, eps[e].episode_index, k, camera))
            wrong++;
    }
    if (wrong)
        fprintf(stderr, "%s: %d frames wrong by random access\n", label, wrong);
    CHECK_EQ_INT(wrong, 0);
    vf_video_stats st;
    vf_video_get_stats(r, &st);
    CHECK_EQ_INT(st.frames_delivered, n);
    /* Random access decodes at most a GOP per frame. */
    CHECK(st.frames_decoded <= (uint64_t)(n * gop));

    /* Batched: every frame twice plus some triples, shuffled. */
    size_t count = (size_t)n * 2 + 5;
    vf_video_request *req = calloc(count, sizeof *req);
    uint8_t *dests = malloc(count * W * H * 3);
    int64_t *which = malloc(count * sizeof *which);
    for (size_t i = 0; i < count; i++)
        which[i] = (int64_t)(i % (size_t)n);
    shuffle_i64(which, count, 7);
    for (size_t i = 0; i < count; i++) {
        int64_t e = ep_of[which[i]], k = k_of[which[i]], ordinal;
        vf_video_episode_frame(&eps[e], k, &ordinal);
        req[i].frame_ordinal = ordinal;
        req[i].dest = dests + i * W * H * 3;
        req[i].episode = eps[e].episode_index;
        req[i].frame_in_episode = k;
        req[i].status = 1;
    }
    vf_video_stats before, after;
    vf_video_get_stats(r, &before);
    CHECK_OK(vf_video_read_frames(r, req, count, NULL));
    vf_video_get_stats(r, &after);
    wrong = 0;
    for (size_t i = 0; i < count; i++) {
        CHECK_EQ_INT(req[i].status, 0);
        if (!has_identity(req[i].dest, W, H, req[i].episode, req[i].frame_in_episode, camera))
            wrong++;
    }
    if (wrong)
        fprintf(stderr, "%s: %d frames wrong by batched requests\n", label, wrong);
    CHECK_EQ_INT(wrong, 0);
    /* Sorted, the whole file is one forward run: each frame decoded once. */
    CHECK_EQ_INT(after.frames_delivered - before.frames_delivered, count);
    CHECK(after.frames_decoded - before.frames_decoded <= (uint64_t)n);
    CHECK(after.seeks - before.seeks <= 1);
    if (after.seeks - before.seeks > 1)
        fprintf(stderr, "%s: batch took %llu seeks, decoded %llu\n", label,
                (unsigned long long)(after.seeks - before.seeks),
                (unsigned long long)(after.frames_decoded - before.frames_decoded));

    free(req);
    free(dests);
    free(which);
    free(buf);
    free(order);
    free(ep_of);
    free(k_of);
    vf_video_map_free(&map, eps, cf->count);
    vf_video_close(r);
}

static void test_codec_gop(const char *dir, vf_video_codec codec, int gop, const char *label)
{
    static const int64_t lengths[] = {7, 11, 5, 9}; /* 32 frames; 7, 11, 5 are not multiples of 3: drift */
    camera_file cf;
    int camera = 2;
    int rc = build_camera_file(&cf, dir, label, codec, W, H, gop, lengths, 4, 10, camera);
    CHECK_OK(rc);
    if (rc == 0)
        check_all_frames(&cf, gop, label, camera);
    if (cf.path)
        remove(cf.path);
    free_camera_file(&cf);
}

static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* One decode thread by default: opening and decoding start no threads
 * (libdav1d would otherwise start 1.5 per core); more when asked. */
static void test_decoder_threads(const char *dir)
{
    char *path = vf_asprintf("%s/threads.mp4", dir);
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_AV1, W, H, 2, 0, 4, 0));
    uint8_t buf[W * H * 3];
    int before = thread_count();
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_open_file(&r, path, NULL));
    if (r) {
        CHECK_OK(vf_video_read_frame(r, 3, NULL, buf));
        CHECK_EQ_INT(thread_count(), before);
        vf_video_close(r);
    }
    vf_video_settings vs;
    vf_video_defaults(&vs);
    vs.decode_threads = 3;
    CHECK_OK(vf_video_open_file(&r, path, &vs));
    if (r) {
        CHECK_OK(vf_video_read_frame(r, 3, NULL, buf));
        CHECK(has_identity(buf, W, H, 0, 3, 0));
        CHECK(thread_count() > before);
        vf_video_close(r);
    }
    CHECK_EQ_INT(thread_count(), before);
    remove(path);
    free(path);
}

/* Sequential reading reuses the decoder: one seek, each frame decoded once. */
static void test_sequential_reuse(const char *dir)
{
    char *path = vf_asprintf("%s/seq.mp4", dir);
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_AV1, W, H, 2, 3, 24, 0));
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_open_file(&r, path, NULL));
    if (!r) {
        free(path);
        return;
    }
    uint8_t *buf = malloc(W * H * 3);
    for (int64_t k = 0; k < 24; k++) {
        CHECK_OK(vf_video_read_frame(r, k, NULL, buf));
        CHECK(has_identity(buf, W, H, 3, k, 0));
    }
    vf_video_stats st;
    vf_video_get_stats(r, &st);
    CHECK_EQ_INT(st.seeks, 1);
    CHECK_EQ_INT(st.frames_decoded, 24);
    CHECK_EQ_INT(st.continued, 23);

    /* Same frame again: served from the decoded frame. */
    CHECK_OK(vf_video_read_frame(r, 23, NULL, buf));
    CHECK(has_identity(buf, W, H, 3, 23, 0));
    vf_video_get_stats(r, &st);
    CHECK_EQ_INT(st.reused, 1);
    CHECK_EQ_INT(st.frames_decoded, 24);

    /* Backwards needs a seek; forward in the same GOP does not. GOP 2:
     * keyframes at even ordinals. */
    CHECK_OK(vf_video_read_frame(r, 10, NULL, buf));
    CHECK(has_identity(buf, W, H, 3, 10, 0));
    vf_video_get_stats(r, &st);
    CHECK_EQ_INT(st.seeks, 2);
    CHECK_OK(vf_video_read_frame(r, 11, NULL, buf));
    CHECK(has_identity(buf, W, H, 3, 11, 0));
    vf_video_stats st2;
    vf_video_get_stats(r, &st2);
    CHECK_EQ_INT(st2.seeks, 2);
    CHECK_EQ_INT(st2.frames_decoded, st.frames_decoded + 1);
    /* Far ahead: seek to the target's keyframe, decode 2 frames. */
    CHECK_OK(vf_video_read_frame(r, 21, NULL, buf));
    CHECK(has_identity(buf, W, H, 3, 21, 0));
    vf_video_stats st3;
    vf_video_get_stats(r, &st3);
    CHECK_EQ_INT(st3.seeks, 3);
    CHECK_EQ_INT(st3.frames_decoded, st2.frames_decoded + 2);

    free(buf);
    vf_video_close(r);
    remove(path);
    free(path);
}

/* HWC, CHW, float CHW and resized outputs agree; identities survive resize. */
/* Streaming (non-temporal) stores write the same values as ordinary ones, in
 * both CHW layouts, whether the planes are aligned for them (the vector
 * stores run, with or without a scalar tail) or not (ordinary stores). */
static void check_streaming_same(vf_video_reader *r, int64_t frame, int w, int h, const char *label)
{
    size_t px = (size_t)w * h;
    vf_video_layout layouts[2] = {VF_VIDEO_RGB_CHW_U8, VF_VIDEO_RGB_CHW_F32};
    for (int li = 0; li < 2; li++) {
        vf_video_format f;
        vf_video_format_defaults(&f);
        f.width = w;
        f.height = h;
        f.layout = layouts[li];
        size_t bytes = vf_video_format_bytes(&f, w, h);
        uint8_t *plain = malloc(bytes);
        /* 64 bytes of slack: the streamed copy at offset 0 (aligned) and at 4 (not aligned for either). */
        uint8_t *block = aligned_alloc(64, (bytes + 64 + 63) & ~(size_t)63);
        CHECK(plain && block);
        if (!plain || !block) {
            free(plain);
            free(block);
            return;
        }
        CHECK_OK(vf_video_read_frame(r, frame, &f, plain));
        f.streaming = 1;
        for (size_t offset = 0; offset <= 4; offset += 4) {
            memset(block, 0xA5, bytes + 64);
            CHECK_OK(vf_video_read_frame(r, frame, &f, block + offset));
            if (memcmp(plain, block + offset, bytes) != 0) {
                fprintf(stderr, "%s: %dx%d layout %d offset %zu: streamed frame differs\n", label, w, h,
                        (int)layouts[li], offset);
                CHECK(0);
            }
            /* nothing written past the frame */
            int past = 0;
            for (size_t i = offset + bytes; i < bytes + 64; i++)
                past |= block[i] != 0xA5;
            CHECK(!past);
        }
        (void)px;
        free(plain);
        free(block);
    }
}

static void test_layouts(const char *dir)
{
    char *path = vf_asprintf("%s/layouts.mp4", dir);
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_AV1, 160, 128, 2, 5, 6, 9));
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_open_file(&r, path, NULL));
    if (!r) {
        free(path);
        return;
    }
    const int w = 160, h = 128;
    size_t px = (size_t)w * h;
    uint8_t *hwc = malloc(px * 3), *chw = malloc(px * 3);
    float *f32 = malloc(px * 3 * sizeof(float));
    vf_video_format f;
    vf_video_format_defaults(&f);
    CHECK_EQ_INT(vf_video_format_bytes(&f, w, h), px * 3);
    CHECK_OK(vf_video_read_frame(r, 3, &f, hwc));
    CHECK(has_identity(hwc, w, h, 5, 3, 9));
    f.layout = VF_VIDEO_RGB_CHW_U8;
    CHECK_OK(vf_video_read_frame(r, 3, &f, chw));
    f.layout = VF_VIDEO_RGB_CHW_F32;
    CHECK_EQ_INT(vf_video_format_bytes(&f, w, h), px * 3 * sizeof(float));
    CHECK_OK(vf_video_read_frame(r, 3, &f, f32));
    int mismatch_chw = 0, mismatch_f32 = 0;
    for (size_t p = 0; p < px; p++)
        for (int c = 0; c < 3; c++) {
            uint8_t v = hwc[p * 3 + (size_t)c];
            mismatch_chw += chw[(size_t)c * px + p] != v;
            mismatch_f32 += f32[(size_t)c * px + p] != (float)v / 255.0f;
        }
    CHECK_EQ_INT(mismatch_chw, 0);
    CHECK_EQ_INT(mismatch_f32, 0);
    /* The frame has real content (not all one value). */
    int distinct = 0;
    for (size_t p = 1; p < px * 3; p++)
        distinct |= hwc[p] != hwc[0];
    CHECK(distinct);

    /* Resized: HWC and CHW agree, and the identity still reads. */
    const int rw = 224, rh = 160;
    size_t rpx = (size_t)rw * rh;
    uint8_t *rhwc = malloc(rpx * 3), *rchw = malloc(rpx * 3);
    float *rf32 = malloc(rpx * 3 * sizeof(float));
    vf_video_format_defaults(&f);
    f.width = rw;
    f.height = rh;
    CHECK_OK(vf_video_read_frame(r, 4, &f, rhwc));
    CHECK(has_identity(rhwc, rw, rh, 5, 4, 9));
    f.layout = VF_VIDEO_RGB_CHW_U8;
    CHECK_OK(vf_video_read_frame(r, 4, &f, rchw));
    f.layout = VF_VIDEO_RGB_CHW_F32;
    CHECK_OK(vf_video_read_frame(r, 4, &f, rf32));
    mismatch_chw = mismatch_f32 = 0;
    for (size_t p = 0; p < rpx; p++)
        for (int c = 0; c < 3; c++) {
            uint8_t v = rhwc[p * 3 + (size_t)c];
            mismatch_chw += rchw[(size_t)c * rpx + p] != v;
            mismatch_f32 += rf32[(size_t)c * rpx + p] != (float)v / 255.0f;
        }
    CHECK_EQ_INT(mismatch_chw, 0);
    CHECK_EQ_INT(mismatch_f32, 0);
    /* A width that is not a multiple of 16 (swscale's padded-row path). */
    const int ow = 100, oh = 70;
    uint8_t *odd = malloc((size_t)ow * oh * 3);
    vf_video_format_defaults(&f);
    f.width = ow;
    f.height = oh;
    CHECK_OK(vf_video_read_frame(r, 5, &f, odd));
    CHECK(has_identity(odd, ow, oh, 5, 5, 9));
    /* 7000 pixels: the vector CHW paths leave a scalar tail. */
    size_t opx = (size_t)ow * oh;
    uint8_t *ochw = malloc(opx * 3);
    float *of32 = malloc(opx * 3 * sizeof(float));
    f.layout = VF_VIDEO_RGB_CHW_U8;
    CHECK_OK(vf_video_read_frame(r, 5, &f, ochw));
    f.layout = VF_VIDEO_RGB_CHW_F32;
    CHECK_OK(vf_video_read_frame(r, 5, &f, of32));
    mismatch_chw = mismatch_f32 = 0;
    for (size_t p = 0; p < opx; p++)
        for (int c = 0; c < 3; c++) {
            uint8_t v = odd[p * 3 + (size_t)c];
            mismatch_chw += ochw[(size_t)c * opx + p] != v;
            mismatch_f32 += of32[(size_t)c * opx + p] != (float)v / 255.0f;
        }
    CHECK_EQ_INT(mismatch_chw, 0);
    CHECK_EQ_INT(mismatch_f32, 0);
    free(ochw);
    free(of32);
    /* Streaming stores: planes aligned for both layouts (224x160, 160x128),
     * aligned for float32 only, with a scalar tail (84x86: 7,224 pixels;
     * 100x70: 7,000); check_streaming_same also writes at an address aligned
     * for neither. */
    check_streaming_same(r, 4, rw, rh, "layouts");
    check_streaming_same(r, 4, 84, 86, "layouts");
    check_streaming_same(r, 5, ow, oh, "layouts");
    check_streaming_same(r, 5, w, h, "layouts");
    vf_video_format_defaults(&f);
    f.width = ow;
    f.height = oh;
    f.layout = VF_VIDEO_RGB_HWC_U8;
    /* Downscale to a small training size. */
    f.width = 48;
    f.height = 32;
    uint8_t small[48 * 32 * 3];
    CHECK_OK(vf_video_read_frame(r, 2, &f, small));
    CHECK(has_identity(small, 48, 32, 5, 2, 9));

    /* Bad formats and a depth layout on a colour stream are refused. */
    f.width = 10;
    f.height = 0;
    CHECK_ERR(vf_video_read_frame(r, 2, &f, small), VF_EINVAL, "invalid output format");
    vf_video_format_defaults(&f);
    f.layout = VF_VIDEO_GRAY_U16;
    CHECK_ERR(vf_video_read_frame(r, 2, &f, hwc), VF_EINVAL, "16-bit gray output requested");

    free(odd);
    free(rhwc);
    free(rchw);
    free(rf32);
    free(hwc);
    free(chw);
    free(f32);
    vf_video_close(r);
    remove(path);
    free(path);
}

/* A batch with a bad request: the others are still served. */
static void test_batch_errors(const char *dir)
{
    char *path = vf_asprintf("%s/batch.mp4", dir);
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_H264, W, H, 2, 1, 8, 4));
    vf_video_reader *r = NULL;
    vf_video_settings vs;
    vf_video_defaults(&vs);
    vs.camera = "cam_left";
    CHECK_OK(vf_video_open_file(&r, path, &vs));
    if (!r) {
        free(path);
        return;
    }
    uint8_t *dest = malloc(4 * W * H * 3);
    vf_video_request req[4] = {
        {.frame_ordinal = 6, .dest = dest, .episode = 1, .frame_in_episode = 6},
        {.frame_ordinal = 99, .dest = dest + W * H * 3, .episode = 1, .frame_in_episode = 99},
        {.frame_ordinal = 1, .dest = dest + 2 * W * H * 3, .episode = 1, .frame_in_episode = 1},
        {.frame_ordinal = -3, .dest = dest + 3 * W * H * 3, .episode = -1, .frame_in_episode = -1},
    };
    /* The first failure in ordinal order is reported. */
    CHECK_ERR(vf_video_read_frames(r, req, 4, NULL), VF_ERANGE, "frame -3 out of range");
    CHECK_EQ_INT(req[0].status, 0);
    CHECK_EQ_INT(req[1].status, VF_ERANGE);
    CHECK_EQ_INT(req[2].status, 0);
    CHECK_EQ_INT(req[3].status, VF_ERANGE);
    CHECK(has_identity(req[0].dest, W, H, 1, 6, 4));
    CHECK(has_identity(req[2].dest, W, H, 1, 1, 4));
    CHECK_ERR(vf_video_read_frame(r, 8, NULL, dest), VF_ERANGE, "cam_left");
    CHECK_OK(vf_video_read_frames(r, req, 0, NULL));
    free(dest);
    vf_video_close(r);
    remove(path);
    free(path);
}

/* Early drain and skip_nonref (map mode): the same frames as without them, random single
 * reads and random 8-frame windows; on H.264 (x264 keeps a reorder delay of
 * one picture even at GOP 2) fewer packets decoded, none on AV1 (no delay:
 * nothing to drain); sequential reads keep their position (no drain while
 * calls follow on). */
static void check_early_drain(const char *dir, vf_video_codec codec, int gop, const char *label, int expect_drains,
                              int expect_skips)
{
    char *path = vf_asprintf("%s/drain-%s.mp4", dir, label);
    const int64_t n = 40;
    CHECK_OK(write_stamped(path, codec, W, H, gop, 5, n, 1));
    vf_video_reader *plain = NULL, *drain = NULL;
    vf_video_settings vs;
    vf_video_defaults(&vs);
    CHECK_OK(vf_video_open_file(&plain, path, &vs));
    vs.early_drain = 1;
    vs.skip_nonref = 1;
    CHECK_OK(vf_video_open_file(&drain, path, &vs));
    if (!plain || !drain) {
        vf_video_close(plain);
        vf_video_close(drain);
        free(path);
        return;
    }
    int64_t order[120];
    for (int i = 0; i < 120; i++)
        order[i] = i % n;
    shuffle_i64(order, 120, 3);
    uint8_t *a = malloc(W * H * 3), *b = malloc(W * H * 3);
    int wrong = 0;
    for (int i = 0; i < 120; i++) {
        CHECK_OK(vf_video_read_frame(plain, order[i], NULL, a));
        CHECK_OK(vf_video_read_frame(drain, order[i], NULL, b));
        if (!has_identity(b, W, H, 5, order[i], 1) || memcmp(a, b, W * H * 3) != 0)
            wrong++;
    }
    vf_video_stats sp, sd;
    vf_video_get_stats(plain, &sp);
    vf_video_get_stats(drain, &sd);
    CHECK_EQ_INT(sp.early_drains, 0);
    if (expect_drains) {
        CHECK(sd.early_drains > 0);
        CHECK(sd.packets_read < sp.packets_read);
        fprintf(stderr, "%s: 120 random reads: %llu packets with early drain, %llu without\n", label,
                (unsigned long long)sd.packets_read, (unsigned long long)sp.packets_read);
    } else {
        CHECK_EQ_INT(sd.early_drains, 0);
        CHECK_EQ_INT(sd.packets_read, sp.packets_read);
    }
    /* Non-reference pictures before a target are not decoded, so fewer
     * pictures come out (x264's B-frames at GOP 12; none at GOP 2). */
    if (expect_skips)
        CHECK(sd.frames_decoded < sp.frames_decoded);
    else /* GOP 2: none to skip; a drained reader seeks where the plain one may continue (+1 at most) */
        CHECK(sd.frames_decoded <= sp.frames_decoded + sd.early_drains);
    fprintf(stderr, "%s: 120 random reads: %llu pictures out of the decoder with skip_nonref, %llu without\n", label,
            (unsigned long long)sd.frames_decoded, (unsigned long long)sp.frames_decoded);
    /* Windows: 8 consecutive frames ending at a random one, in one batch call each. */
    uint8_t *win = malloc((size_t)8 * W * H * 3);
    for (int i = 0; i < 30; i++) {
        vf_video_request req[8];
        int64_t end = 7 + order[i] % (n - 7);
        for (int s = 0; s < 8; s++)
            req[s] = (vf_video_request){.frame_ordinal = end - 7 + s, .dest = win + (size_t)s * W * H * 3,
                                        .episode = 5, .frame_in_episode = end - 7 + s};
        CHECK_OK(vf_video_read_frames(drain, req, 8, NULL));
        for (int s = 0; s < 8; s++)
            if (req[s].status != 0 || !has_identity(req[s].dest, W, H, 5, end - 7 + s, 1))
                wrong++;
    }
    if (wrong)
        fprintf(stderr, "%s: %d frames wrong with early drain\n", label, wrong);
    CHECK_EQ_INT(wrong, 0);

    /* Sequential calls keep the position: at most one drain (the first call)
     * and one seek after it. */
    vf_video_close(drain);
    drain = NULL;
    CHECK_OK(vf_video_open_file(&drain, path, &vs));
    for (int64_t k = 0; drain && k < n; k++) {
        CHECK_OK(vf_video_read_frame(drain, k, NULL, b));
        CHECK(has_identity(b, W, H, 5, k, 1));
    }
    if (drain) {
        vf_video_get_stats(drain, &sd);
        CHECK(sd.early_drains <= 1);
        CHECK(sd.seeks <= 2);
        CHECK(sd.frames_decoded <= (uint64_t)n + 1);
    }
    free(a);
    free(b);
    free(win);
    vf_video_close(plain);
    vf_video_close(drain);
    remove(path);
    free(path);
}

/* Fewer packets by early drain, counted exactly on a GOP-2 H.264 file with
 * a one-picture reorder delay: reading keyframe k needs its packet alone
 * (not k+1's); reading frame k+1 needs k and k+1 (not k+2's). */
static void test_early_drain_counts(const char *dir)
{
    char *path = vf_asprintf("%s/drain-count.mp4", dir);
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_H264, W, H, 2, 0, 20, 0));
    vf_video_settings vs;
    vf_video_defaults(&vs);
    vs.early_drain = 1;
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_open_file(&r, path, &vs));
    uint8_t buf[W * H * 3];
    const int64_t targets[] = {10, 3, 16, 7};
    const uint64_t packets[] = {1, 2, 1, 2};
    for (int i = 0; r && i < 4; i++) {
        vf_video_stats before, after;
        vf_video_get_stats(r, &before);
        CHECK_OK(vf_video_read_frame(r, targets[i], NULL, buf));
        CHECK(has_identity(buf, W, H, 0, targets[i], 0));
        vf_video_get_stats(r, &after);
        CHECK_EQ_INT(after.packets_read - before.packets_read, packets[i]);
        CHECK_EQ_INT(after.early_drains - before.early_drains, 1);
    }
    vf_video_close(r);
    remove(path);
    free(path);
}

/* The float32 kernel without division (convert.c) is exact for all 256
 * byte values on this CPU (the converter checks it exhaustively at init and
 * otherwise divides): on a machine with AVX2 and FMA the fast path is the
 * one the layout test above exercised. */
static void test_float_kernel_exact(void)
{
#if defined(__x86_64__) || defined(__i386__)
    vf_vid_converter c;
    vf_vid_converter_init(&c);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("ssse3"))
        CHECK_EQ_INT(c.fma_exact, 1);
    else
        CHECK_EQ_INT(c.fma_exact, 0);
    for (int v = 0; v < 256; v++)
        CHECK(c.lut[v] == (float)v / 255.0f);
    vf_vid_converter_free(&c);
#endif
}

/* Frames of 640x480 and more take the kernel's non-temporal store path
 * (convert.c): float32 CHW there equals HWC uint8 / 255 too, at a size
 * just past the threshold and at an odd one. */
static void test_float_large_frames(const char *dir)
{
    char *path = vf_asprintf("%s/large.mp4", dir);
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_H264, 160, 128, 2, 2, 3, 4));
    vf_video_reader *r = NULL;
    CHECK_OK(vf_video_open_file(&r, path, NULL));
    const int sizes[][2] = {{640, 480}, {656, 408}};
    for (int k = 0; r && k < 2; k++) {
        int w = sizes[k][0], h = sizes[k][1];
        size_t px = (size_t)w * h;
        uint8_t *hwc = malloc(px * 3);
        float *f32 = aligned_alloc(64, px * 3 * sizeof(float));
        vf_video_format f;
        vf_video_format_defaults(&f);
        f.width = w;
        f.height = h;
        CHECK_OK(vf_video_read_frame(r, 1, &f, hwc));
        CHECK(has_identity(hwc, w, h, 2, 1, 4));
        f.layout = VF_VIDEO_RGB_CHW_F32;
        CHECK_OK(vf_video_read_frame(r, 1, &f, f32));
        int mismatch = 0;
        for (size_t p = 0; p < px; p++)
            for (int c = 0; c < 3; c++)
                mismatch += f32[(size_t)c * px + p] != (float)hwc[p * 3 + (size_t)c] / 255.0f;
        CHECK_EQ_INT(mismatch, 0);
        free(hwc);
        free(f32);
    }
    vf_video_close(r);
    remove(path);
    free(path);
}

typedef struct convert_arg {
    vf_video_held *held;
    vf_video_cache *cache; /* NULL: a converter for the call */
    int rc;
} convert_arg;

static void *convert_thread(void *p)
{
    convert_arg *a = p;
    a->rc = a->cache ? vf_video_cache_convert(a->cache, a->held) : vf_video_held_convert(a->held);
    return NULL;
}

/* vf_video_read_frames_held: the decode keeps references, the reader is
 * closed before the conversion (run on another thread, with a converter of
 * its own or a decoder cache's), and the destinations equal what
 * vf_video_read_frames writes,
 * duplicates and per-request errors included. At w x h past 32 MB of held
 * pictures (1080p: 10) the rest are converted during the decode. */
static void check_held(const char *dir, int w, int h, int frames, int use_cache, const char *label)
{
    char *path = vf_asprintf("%s/held-%s.mp4", dir, label);
    CHECK_OK(write_stamped(path, VF_VIDEO_CODEC_H264, w, h, 30, 2, frames, 1));
    size_t bytes = (size_t)w * h * 3, count = (size_t)frames + 3;
    uint8_t *want = malloc(count * bytes), *got = malloc(count * bytes);
    vf_video_request *a = calloc(count, sizeof *a), *b = calloc(count, sizeof *b);
    for (size_t i = 0; i < count; i++) {
        int64_t ordinal = i + 1 == count ? frames + 5 : (int64_t)((i * 7) % (size_t)frames); /* last: out of range */
        a[i] = (vf_video_request){.frame_ordinal = ordinal, .dest = want + i * bytes, .episode = 2,
                                  .frame_in_episode = ordinal};
        b[i] = a[i];
        b[i].dest = got + i * bytes;
    }
    memset(got, 0, count * bytes);
    vf_video_reader *r1 = NULL, *r2 = NULL;
    CHECK_OK(vf_video_open_file(&r1, path, NULL));
    CHECK_OK(vf_video_open_file(&r2, path, NULL));
    if (r1 && r2) {
        CHECK_ERR(vf_video_read_frames(r1, a, count, NULL), VF_ERANGE, "out of range");
        vf_video_held *held = NULL;
        CHECK_ERR(vf_video_read_frames_held(r2, b, count, NULL, &held), VF_ERANGE, "out of range");
        CHECK(held != NULL);
        vf_video_stats st;
        vf_video_get_stats(r2, &st);
        CHECK_EQ_INT(st.frames_delivered, count - 1);
        vf_video_close(r2); /* the held pictures outlive the reader */
        r2 = NULL;
        vf_video_cache *cache = NULL;
        if (use_cache)
            CHECK_OK(vf_video_cache_open(&cache, NULL));
        convert_arg arg = {held, cache, -1};
        pthread_t t;
        CHECK_EQ_INT(pthread_create(&t, NULL, convert_thread, &arg), 0);
        pthread_join(t, NULL);
        CHECK_EQ_INT(arg.rc, 0);
        vf_video_held_free(held);
        vf_video_cache_close(cache);
        int wrong = 0;
        for (size_t i = 0; i < count; i++) {
            CHECK_EQ_INT(b[i].status, a[i].status);
            if (a[i].status == 0)
                wrong += memcmp(a[i].dest, b[i].dest, bytes) != 0 ||
                         !has_identity(b[i].dest, w, h, 2, b[i].frame_ordinal, 1);
        }
        CHECK_EQ_INT(b[count - 1].status, VF_ERANGE);
        if (wrong)
            fprintf(stderr, "%s: %d held frames differ\n", label, wrong);
        CHECK_EQ_INT(wrong, 0);
    }
    vf_video_close(r1);
    vf_video_close(r2);
    CHECK_OK(vf_video_held_convert(NULL));
    vf_video_held_free(NULL);
    free(a);
    free(b);
    free(want);
    free(got);
    remove(path);
    free(path);
}

static void test_held_frames(const char *dir)
{
    check_held(dir, W, H, 40, 0, "small");
    check_held(dir, W, H, 40, 1, "small-cache");
    check_held(dir, 1920, 1080, 14, 1, "1080p");
}

int main(void)
{
    vf_video_set_ffmpeg_log_level(vf_log_level() >= VF_LOG_DEBUG ? VF_LOG_INFO : -1);
    setenv("SVT_LOG", "1", 0);
    char *dir = vf_test_tmpdir("video-access");
    test_codec_gop(dir, VF_VIDEO_CODEC_AV1, 2, "av1-gop2");
    test_codec_gop(dir, VF_VIDEO_CODEC_AV1, 30, "av1-gop30");
    test_codec_gop(dir, VF_VIDEO_CODEC_H264, 2, "h264-gop2");
    test_codec_gop(dir, VF_VIDEO_CODEC_H264, 30, "h264-gop30");
    test_codec_gop(dir, VF_VIDEO_CODEC_HEVC, 30, "hevc-gop30");
    test_sequential_reuse(dir);
    test_decoder_threads(dir);
    test_layouts(dir);
    test_batch_errors(dir);
    test_held_frames(dir);
    check_early_drain(dir, VF_VIDEO_CODEC_H264, 2, "h264-gop2", 1, 0);
    check_early_drain(dir, VF_VIDEO_CODEC_H264, 12, "h264-gop12", 1, 1);
    check_early_drain(dir, VF_VIDEO_CODEC_HEVC, 12, "hevc-gop12", 1, 1);
    check_early_drain(dir, VF_VIDEO_CODEC_AV1, 2, "av1-gop2", 0, 0);
    test_early_drain_counts(dir);
    test_float_kernel_exact();
    test_float_large_frames(dir);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_video_access");
}
