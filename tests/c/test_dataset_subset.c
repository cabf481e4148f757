/* test_dataset_subset.c: vf_dataset_subset against vf_dataset_open with the
 * same episode selection, on make-sample data whose MP4s and data files
 * each hold several episodes (so frame ordinals and row offsets depend on
 * the episodes a subset does not select), and on the real v2.1 fixture:
 * the same episodes, data spans, video spans, file lists, per-file episode
 * lists and frame ordinals; a subset of a subset; the subset outliving
 * nothing it borrows (closed before its source, under ASan); errors for an
 * unknown and a repeated episode. */
#include "dataset/dataset.h"
#include "testutil.h"
#include "vlafeed/make_sample.h"

#include <stdlib.h>
#include <string.h>

static vf_dataset *open_selection(const char *root, const int64_t *eps, size_t n)
{
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    s.episodes = eps;
    s.num_episodes = n;
    s.check_files = VF_CHECK_FILES_OFF;
    s.check_videos = 0;
    vf_dataset *d = NULL;
    CHECK_OK(vf_dataset_open(&d, root, &s));
    return d;
}

/* a and b describe the same selection exactly (what the loaders read). */
static void check_same(const vf_dataset *a, const vf_dataset *b, int map_videos)
{
    CHECK_EQ_INT(vf_dataset_num_episodes(a), vf_dataset_num_episodes(b));
    CHECK_EQ_INT(vf_dataset_num_cameras(a), vf_dataset_num_cameras(b));
    CHECK_EQ_INT(vf_dataset_num_data_files(a), vf_dataset_num_data_files(b));
    for (size_t i = 0; i < vf_dataset_num_data_files(a) && i < vf_dataset_num_data_files(b); i++)
        CHECK(strcmp(vf_dataset_data_file(a, i), vf_dataset_data_file(b, i)) == 0);
    size_t n = vf_dataset_num_episodes(a) < vf_dataset_num_episodes(b) ? vf_dataset_num_episodes(a)
                                                                         : vf_dataset_num_episodes(b);
    for (size_t pos = 0; pos < n; pos++) {
        const vf_episode *x = vf_dataset_episode(a, pos), *y = vf_dataset_episode(b, pos);
        CHECK(x->episode_index == y->episode_index && x->length == y->length && x->from_index == y->from_index &&
              x->to_index == y->to_index);
        vf_data_span dx, dy;
        CHECK_OK(vf_dataset_episode_data(a, pos, &dx));
        CHECK_OK(vf_dataset_episode_data(b, pos, &dy));
        CHECK(strcmp(dx.path, dy.path) == 0 && dx.file == dy.file && dx.row_offset == dy.row_offset &&
              dx.length == dy.length);
        for (size_t c = 0; c < vf_dataset_num_cameras(a); c++) {
            vf_video_span vx, vy;
            CHECK_OK(vf_dataset_episode_video(a, pos, c, &vx));
            CHECK_OK(vf_dataset_episode_video(b, pos, c, &vy));
            CHECK(strcmp(vx.path, vy.path) == 0 && vx.file == vy.file && vx.from_timestamp == vy.from_timestamp &&
                  vx.to_timestamp == vy.to_timestamp && vx.length == vy.length);
            if (!map_videos)
                continue;
            /* Every episode stored in the MP4, and the episode's frame ordinals. */
            vf_ds_video_map mx, my;
            CHECK_OK(vf_ds_video_map_build(a, c, vx.file, &mx));
            CHECK_OK(vf_ds_video_map_build(b, c, vy.file, &my));
            CHECK_EQ_INT(mx.num_episodes, my.num_episodes);
            for (size_t k = 0; k < mx.num_episodes && k < my.num_episodes; k++)
                CHECK(mx.episodes[k].episode_index == my.episodes[k].episode_index &&
                      mx.episodes[k].from_timestamp == my.episodes[k].from_timestamp);
            for (int64_t k = 0; k < x->length; k++) {
                int64_t ox = -1, oy = -2;
                CHECK_OK(vf_ds_video_map_ordinal(&mx, a, x->episode_index, k, &ox));
                CHECK_OK(vf_ds_video_map_ordinal(&my, b, y->episode_index, k, &oy));
                CHECK(ox == oy);
            }
            vf_ds_video_map_free(&mx);
            vf_ds_video_map_free(&my);
        }
    }
}

static void test_against_selection(const char *root, const int64_t *eps, size_t n, int map_videos)
{
    vf_dataset *full = open_selection(root, NULL, 0);
    vf_dataset *sel = open_selection(root, eps, n);
    vf_dataset *sub = NULL;
    if (full)
        CHECK_OK(vf_dataset_subset(full, eps, n, &sub));
    if (sel && sub)
        check_same(sel, sub, map_videos);
    /* A subset of a subset (its source does not select every episode it holds). */
    if (sub && n > 1) {
        vf_dataset *sub2 = NULL, *sel2 = open_selection(root, eps + 1, 1);
        CHECK_OK(vf_dataset_subset(sub, eps + 1, 1, &sub2));
        if (sub2 && sel2)
            check_same(sel2, sub2, map_videos);
        vf_dataset_close(sub2);
        vf_dataset_close(sel2);
    }
    vf_dataset_close(sub); /* before its source: it borrows from it */
    vf_dataset_close(sel);
    vf_dataset_close(full);
}

static void test_errors(const char *root)
{
    vf_dataset *full = open_selection(root, NULL, 0);
    if (!full)
        return;
    vf_dataset *sub = (vf_dataset *)1;
    int64_t missing[] = {2, 999};
    CHECK_ERR(vf_dataset_subset(full, missing, 2, &sub), VF_ENOENT, "episode 999 is not in the dataset");
    CHECK(sub == NULL);
    int64_t twice[] = {3, 1, 3};
    CHECK_ERR(vf_dataset_subset(full, twice, 3, &sub), VF_EINVAL, "episode 3 is selected twice");
    CHECK_ERR(vf_dataset_subset(NULL, twice, 1, &sub), VF_EINVAL, "required");
    CHECK_ERR(vf_dataset_subset(full, NULL, 2, &sub), VF_EINVAL, "required");
    vf_dataset_close(full);
}

int main(void)
{
    char *tmp = vf_test_tmpdir("subset");
    char *root = vf_path_join(tmp, "ds");
    vf_make_sample_settings ms;
    vf_make_sample_defaults(&ms);
    ms.num_episodes = 12;
    ms.codec = "h264";
    ms.width = 64;
    ms.height = 48;
    ms.fps = 10;
    ms.min_length = 6;
    ms.max_length = 14;
    ms.max_video_mb = 0.02; /* several MP4s per camera, several episodes in each */
    CHECK_OK(vf_make_sample(root, &ms));
    int64_t middle[] = {7, 3, 8};
    test_against_selection(root, middle, 3, 1);
    int64_t last[] = {11};
    test_against_selection(root, last, 1, 1);
    int64_t spread[] = {0, 5, 6, 10};
    test_against_selection(root, spread, 4, 1);
    test_errors(root);
    vf_test_rmtree(tmp);
    free(root);
    free(tmp);

    char *fixture = vf_test_fixture("lerobot-g1-v21");
    if (vf_dir_exists(fixture)) {
        int64_t eps[] = {4, 1, 2};
        test_against_selection(fixture, eps, 3, 0);
    } else {
        fprintf(stderr, "fixture %s missing; skipping the v2.1 part\n", fixture);
    }
    free(fixture);
    return vf_test_finish("test_dataset_subset");
}
