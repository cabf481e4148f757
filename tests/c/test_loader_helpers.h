/*
 * test_loader_helpers.h: shared pieces of the sample / plan / loader tests
 * (header-only): a small make-sample dataset written at test time, loader
 * settings shortcuts, and checks of returned values against make-sample's
 * ground truth (frame identity stamps, state/action functions).
 */
#ifndef VF_TEST_LOADER_HELPERS_H
#define VF_TEST_LOADER_HELPERS_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "video/video.h"
#include "vlafeed/loader.h"
#include "vlafeed/make_sample.h"

/* A small H.264 dataset: `episodes` episodes of 10..30 frames, 2 cameras of
 * 96x64, per-camera rollover every ~0.03 MB (several files per camera). */
static VF_UNUSED char *make_dataset(const char *tag, int episodes, int fps, double max_video_mb,
                                    vf_make_sample_settings *used)
{
    char *dir = vf_test_tmpdir(tag);
    char *root = vf_path_join(dir, "ds");
    free(dir);
    vf_make_sample_settings s;
    vf_make_sample_defaults(&s);
    s.num_episodes = episodes;
    s.fps = fps;
    s.width = 96;
    s.height = 64;
    s.codec = "h264";
    s.min_length = 10;
    s.max_length = 30;
    s.max_video_mb = max_video_mb;
    vf_set_log_level(0);
    if (vf_make_sample(root, &s) < 0) {
        fprintf(stderr, "make-sample failed: %s\n", vf_last_error());
        exit(2);
    }
    if (used)
        *used = s;
    return root;
}

/* The dataset directory's parent (the tmpdir to remove). */
static VF_UNUSED void remove_dataset(char *root)
{
    char *slash = strrchr(root, '/');
    if (slash)
        *slash = 0;
    vf_test_rmtree(root);
    free(root);
}

static VF_UNUSED vf_dataset *open_dataset(const char *root, const int64_t *episodes, size_t n)
{
    vf_dataset_settings ds;
    vf_dataset_defaults(&ds);
    ds.episodes = episodes;
    ds.num_episodes = n;
    vf_dataset *d = NULL;
    if (vf_dataset_open(&d, root, &ds) < 0) {
        fprintf(stderr, "dataset open failed: %s\n", vf_last_error());
        exit(2);
    }
    return d;
}

static VF_UNUSED const vf_column *col(const vf_batch *b, const char *name)
{
    const vf_column *c = vf_batch_find(b, name);
    if (!c)
        fprintf(stderr, "  no column '%s' in the batch\n", name);
    return c;
}

/* Checks the HWC uint8 frame carries (episode, frame, camera). */
static VF_UNUSED int frame_is(const uint8_t *rgb, int w, int h, int64_t episode, int64_t frame, int camera)
{
    int64_t e, f;
    int c;
    int stamp_h = h >= 128 ? h / 2 : h;
    if (vf_video_read_identity(rgb, w, stamp_h, (size_t)w * 3, &e, &f, &c) < 0) {
        fprintf(stderr, "  identity unreadable (wanted %lld/%lld/%d): %s\n", (long long)episode, (long long)frame,
                camera, vf_last_error());
        return 0;
    }
    if (e != episode || f != frame || c != camera) {
        fprintf(stderr, "  frame identity %lld/%lld/%d, wanted %lld/%lld/%d\n", (long long)e, (long long)f, c,
                (long long)episode, (long long)frame, camera);
        return 0;
    }
    return 1;
}

/* Episode and frame of a position (the dataset's selected episodes). */
static VF_UNUSED void locate(const vf_dataset *d, int64_t position, int64_t *episode, int64_t *frame)
{
    int64_t start = 0;
    for (size_t i = 0; i < vf_dataset_num_episodes(d); i++) {
        const vf_episode *e = vf_dataset_episode(d, i);
        if (position < start + e->length) {
            *episode = e->episode_index;
            *frame = position - start;
            return;
        }
        start += e->length;
    }
    *episode = *frame = -1;
}

static VF_UNUSED int64_t episode_length(const vf_dataset *d, int64_t episode)
{
    size_t pos;
    if (vf_dataset_find_episode(d, episode, &pos) < 0)
        return -1;
    return vf_dataset_episode(d, pos)->length;
}

#endif
