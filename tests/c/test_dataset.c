/* test_dataset.c: the dataset model on the real v2.1 fixture (totals,
 * features, locator, missing videos, subsets) and on generated v2.x
 * layouts: hostile info.json / JSONL (each refused with a message naming
 * file and key or line), validation problems, path templates. */
#include "dataset/dataset.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>

/* ---- helpers ------------------------------------------------------------ */

/* The synthetic datasets here hold placeholder MP4s: open them without the
 * open-time video check (issue 10), which test_video_*.c and the Python
 * corruption corpus exercise on real files. */
static const vf_dataset_settings *meta_only(void)
{
    static vf_dataset_settings s;
    vf_dataset_defaults(&s);
    s.check_videos = 0;
    return &s;
}

static void write_file(const char *dir, const char *rel, const char *text)
{
    char *path = vf_path_join(dir, rel);
    char *slash = strrchr(path, '/');
    *slash = 0;
    CHECK_OK(vf_mkdirs(path));
    *slash = '/';
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fwrite(text, 1, strlen(text), f);
        fclose(f);
    }
    free(path);
}

/* Returns a copy of text with the first occurrence of from replaced. */
static char *replace(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    if (!at) {
        fprintf(stderr, "replace: '%s' not found\n", from);
        exit(2);
    }
    return vf_asprintf("%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
}

static const char *INFO =
    "{\n"
    "  \"codebase_version\": \"v2.1\",\n"
    "  \"robot_type\": \"test_bot\",\n"
    "  \"total_episodes\": 2,\n"
    "  \"total_frames\": 5,\n"
    "  \"total_tasks\": 1,\n"
    "  \"chunks_size\": 1000,\n"
    "  \"fps\": 10,\n"
    "  \"data_path\": \"data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet\",\n"
    "  \"video_path\": \"videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4\",\n"
    "  \"features\": {\n"
    "    \"action\": {\"dtype\": \"float32\", \"shape\": [2], \"names\": [[\"a\", \"b\"]]},\n"
    "    \"cam\": {\"dtype\": \"video\", \"shape\": [64, 64, 3], \"names\": null,\n"
    "            \"info\": {\"video.codec\": \"h264\", \"video.width\": 64, \"video.height\": 48,\n"
    "                     \"video.pix_fmt\": \"yuv420p\", \"video.fps\": 10, \"is_depth_map\": false}},\n"
    "    \"timestamp\": {\"dtype\": \"float32\", \"shape\": [1], \"names\": null},\n"
    "    \"frame_index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null},\n"
    "    \"episode_index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null},\n"
    "    \"index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null},\n"
    "    \"task_index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null}\n"
    "  },\n"
    "  \"splits\": {\"train\": \"0:2\"}, \"some_future_key\": [1, 2, 3]\n"
    "}\n";

static const char *EPISODES = "{\"episode_index\": 0, \"tasks\": [\"pick\"], \"length\": 3}\n"
                              "{\"episode_index\": 1, \"tasks\": [\"pick\"], \"length\": 2}\n";
static const char *TASKS = "{\"task_index\": 0, \"task\": \"pick\"}\n";
static const char *STATS =
    "{\"episode_index\": 0, \"stats\": {\"action\": {\"min\": [0, 1], \"max\": [2, 3], \"mean\": [1, 2], "
    "\"std\": [1, 1], \"count\": [3]}}}\n"
    "{\"episode_index\": 1, \"stats\": {\"action\": {\"min\": [-1, 1], \"max\": [1, 5], \"mean\": [0, 4], "
    "\"std\": [0.5, 1], \"count\": [2]}}}\n";

/* A complete small v2.1 dataset (placeholder data and video files). */
static char *make_v21(const char *tag, const char *info, const char *episodes, const char *tasks, const char *stats)
{
    char *dir = vf_test_tmpdir(tag);
    if (info)
        write_file(dir, "meta/info.json", info);
    if (episodes)
        write_file(dir, "meta/episodes.jsonl", episodes);
    if (tasks)
        write_file(dir, "meta/tasks.jsonl", tasks);
    if (stats)
        write_file(dir, "meta/episodes_stats.jsonl", stats);
    for (int e = 0; e < 2; e++) {
        char rel[128];
        snprintf(rel, sizeof rel, "data/chunk-000/episode_%06d.parquet", e);
        write_file(dir, rel, "placeholder");
        snprintf(rel, sizeof rel, "videos/chunk-000/cam/episode_%06d.mp4", e);
        write_file(dir, rel, "placeholder");
    }
    return dir;
}

/* Opens a dataset whose info.json is `info` (other files standard) and
 * expects failure `code` with `needle` in the message. */
static void expect_info_error(const char *info, int code, const char *needle, int line)
{
    char *dir = make_v21("hostile", info, EPISODES, TASKS, STATS);
    vf_dataset *d = (vf_dataset *)1;
    int r = vf_dataset_open(&d, dir, meta_only());
    vf_test_checks++;
    if (r != code || !strstr(vf_last_error(), needle) || d != NULL) {
        vf_test_failures++;
        fprintf(stderr, "%s:%d: expected %d containing \"%s\", got %d \"%s\"\n", __FILE__, line, code, needle, r,
                vf_last_error());
    }
    vf_dataset_close(d == (vf_dataset *)1 ? NULL : d);
    vf_test_rmtree(dir);
    free(dir);
}
#define EXPECT_INFO_ERROR(info, code, needle) expect_info_error(info, code, needle, __LINE__)

static int has_problem(const vf_dataset *d, vf_severity sev, const char *column, const char *needle)
{
    for (size_t i = 0; i < vf_dataset_num_problems(d); i++) {
        const vf_problem *p = vf_dataset_problem(d, i);
        if (p->severity == sev && (!column || !strcmp(p->column, column)) && strstr(p->message, needle))
            return 1;
    }
    return 0;
}

static void dump_problems(const vf_dataset *d)
{
    for (size_t i = 0; i < vf_dataset_num_problems(d); i++) {
        const vf_problem *p = vf_dataset_problem(d, i);
        fprintf(stderr, "  problem: %d %s ep=%lld [%s] %s\n", p->severity, p->file, (long long)p->episode, p->column,
                p->message);
    }
}

/* ---- the real fixture -------------------------------------------------- */

static void test_fixture(void)
{
    char *root = vf_test_fixture("lerobot-g1-v21");
    if (!vf_dir_exists(root)) {
        fprintf(stderr, "fixture %s missing; skipping\n", root);
        free(root);
        return;
    }
    vf_dataset *d;
    CHECK_OK(vf_dataset_open(&d, root, meta_only()));
    if (!d) {
        free(root);
        return;
    }
    CHECK(!strcmp(vf_dataset_format_version(d), "v2.1"));
    CHECK(!strcmp(vf_dataset_robot_type(d), "Unitree_G1_Inspire"));
    CHECK(vf_dataset_fps(d) == 30);
    CHECK_EQ_INT(vf_dataset_total_episodes(d), 100);
    CHECK_EQ_INT(vf_dataset_total_frames(d), 35965);
    CHECK_EQ_INT(vf_dataset_total_tasks(d), 1);
    CHECK_EQ_INT(vf_dataset_num_episodes(d), 100);
    CHECK_EQ_INT(vf_dataset_num_tasks(d), 1);
    CHECK(!strcmp(vf_dataset_task(d, 0), "Pick up the yellow bottle on the table."));

    /* Features in info.json order. */
    CHECK_EQ_INT(vf_dataset_num_features(d), 8);
    const char *order[] = {"observation.state", "action", "observation.images.cam_high", "timestamp",
                           "frame_index", "episode_index", "index", "task_index"};
    for (size_t i = 0; i < 8; i++)
        CHECK(!strcmp(vf_dataset_feature(d, i)->name, order[i]));
    const vf_feature *state = vf_dataset_find_feature(d, "observation.state");
    CHECK(state && state->kind == VF_FEATURE_VECTOR && state->type == VF_DTYPE_FLOAT32 && state->ndim == 1 &&
          state->shape[0] == 26 && state->size == 26);
    const vf_feature *action = vf_dataset_find_feature(d, "action");
    CHECK(action && action->shape[0] == 26);
    const vf_feature *ts = vf_dataset_find_feature(d, "timestamp");
    CHECK(ts && ts->kind == VF_FEATURE_SCALAR);
    CHECK(vf_dataset_find_feature(d, "nope") == NULL);

    CHECK_EQ_INT(vf_dataset_num_cameras(d), 1);
    const vf_camera *cam = vf_dataset_camera(d, 0);
    CHECK(!strcmp(cam->key, "observation.images.cam_high") && !strcmp(cam->codec, "av1") && cam->width == 640 &&
          cam->height == 480 && !strcmp(cam->pix_fmt, "yuv420p") && cam->fps == 30 && !cam->is_depth);
    CHECK_EQ_INT(cam->num_files, 100);
    CHECK(vf_dataset_feature(d, (size_t)cam->feature) == vf_dataset_find_feature(d, cam->key));

    /* Episode 1: the locator. */
    size_t pos = 99;
    CHECK_OK(vf_dataset_find_episode(d, 1, &pos));
    CHECK_EQ_INT(pos, 1);
    const vf_episode *e = vf_dataset_episode(d, pos);
    CHECK_EQ_INT(e->episode_index, 1);
    CHECK_EQ_INT(e->length, 393);
    CHECK_EQ_INT(e->from_index, 479);
    CHECK_EQ_INT(e->to_index, 479 + 393);
    CHECK(e->num_tasks == 1 && !strcmp(e->tasks[0], "Pick up the yellow bottle on the table."));
    vf_data_span ds;
    CHECK_OK(vf_dataset_episode_data(d, pos, &ds));
    char *want = vf_path_join(root, "data/chunk-000/episode_000001.parquet");
    CHECK(!strcmp(ds.path, want));
    free(want);
    CHECK_EQ_INT(ds.row_offset, 0);
    CHECK_EQ_INT(ds.length, 393);
    CHECK(!strcmp(vf_dataset_data_file(d, ds.file), ds.path));
    vf_video_span vs;
    CHECK_OK(vf_dataset_episode_video(d, pos, 0, &vs));
    want = vf_path_join(root, "videos/chunk-000/observation.images.cam_high/episode_000001.mp4");
    CHECK(!strcmp(vs.path, want));
    free(want);
    CHECK(vs.from_timestamp == 0 && fabs(vs.to_timestamp - 393.0 / 30) < 1e-12 && vs.length == 393 &&
          vs.first_frame_guess == 0);
    CHECK_ERR(vf_dataset_episode_video(d, pos, 1, &vs), VF_ERANGE, "camera 1");
    CHECK_ERR(vf_dataset_episode_data(d, 100, &ds), VF_ERANGE, "position 100");
    CHECK_ERR(vf_dataset_find_episode(d, 100, &pos), VF_ENOENT, "episode 100");

    /* Exactly the 97 missing videos (episodes 1, 2 and 4 have theirs). */
    CHECK_EQ_INT(vf_dataset_num_missing_files(d), 97);
    CHECK_EQ_INT(vf_dataset_num_errors(d), 97);
    int saw0 = 0, saw1 = 0;
    for (size_t i = 0; i < vf_dataset_num_missing_files(d); i++) {
        const char *m = vf_dataset_missing_file(d, i);
        saw0 |= !strcmp(m, "videos/chunk-000/observation.images.cam_high/episode_000000.mp4");
        saw1 |= !strcmp(m, "videos/chunk-000/observation.images.cam_high/episode_000001.mp4");
        CHECK(strncmp(m, "videos/", 7) == 0);
    }
    CHECK(saw0 && !saw1);
    const vf_problem *p = vf_dataset_problem(d, 0);
    CHECK(p && p->severity == VF_SEVERITY_ERROR && p->episode == 0 &&
          !strcmp(p->column, "observation.images.cam_high") && strstr(p->message, "missing"));

    /* Aggregated v2.1 statistics (checked against numpy). */
    const vf_stat *mean = vf_dataset_find_stat(d, "observation.state", "mean");
    const vf_stat *std = vf_dataset_find_stat(d, "observation.state", "std");
    CHECK(mean && mean->size == 26 && fabs(mean->values[0] - (-0.77404041)) < 1e-7);
    CHECK(std && fabs(std->values[0] - 0.06188991) < 1e-7);
    const vf_stat *img = vf_dataset_find_stat(d, "observation.images.cam_high", "mean");
    CHECK(img && img->ndim == 3 && img->shape[0] == 3 && fabs(img->values[0] - 0.45890964) < 1e-7);
    const vf_stat *count = vf_dataset_find_stat(d, "index", "count");
    CHECK(count && count->values[0] == 35965);
    uint64_t fp = vf_dataset_fingerprint(d);
    vf_dataset_close(d);

    /* A subset of present episodes: no missing file, same fingerprint. */
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    int64_t subset[] = {4, 1, 2};
    s.episodes = subset;
    s.num_episodes = 3;
    CHECK_OK(vf_dataset_open(&d, root, &s));
    if (d) {
        CHECK_EQ_INT(vf_dataset_num_episodes(d), 3);
        CHECK_EQ_INT(vf_dataset_episode(d, 0)->episode_index, 1);
        CHECK_EQ_INT(vf_dataset_episode(d, 2)->episode_index, 4);
        CHECK_EQ_INT(vf_dataset_episode(d, 2)->from_index, 479 + 393 + 343 + 459);
        CHECK_EQ_INT(vf_dataset_num_missing_files(d), 0);
        CHECK_EQ_INT(vf_dataset_num_problems(d), 0);
        CHECK_EQ_INT(vf_dataset_num_data_files(d), 3);
        CHECK_EQ_INT(vf_dataset_camera(d, 0)->num_files, 3);
        CHECK(vf_dataset_fingerprint(d) == fp);
        CHECK_ERR(vf_dataset_find_episode(d, 0, &pos), VF_ENOENT, "episode 0 is not among the 3 selected");
        vf_dataset_close(d);
    }
    int64_t unknown[] = {1, 500};
    s.episodes = unknown;
    s.num_episodes = 2;
    d = (vf_dataset *)1;
    CHECK_ERR(vf_dataset_open(&d, root, &s), VF_ENOENT, "episode 500 is not in the dataset");
    CHECK(d == NULL);
    int64_t twice[] = {3, 3};
    s.episodes = twice;
    CHECK_ERR(vf_dataset_open(&d, root, &s), VF_EINVAL, "episode 3 is selected twice");
    /* check_files off: nothing reported missing. */
    vf_dataset_defaults(&s);
    s.check_files = 0;
    CHECK_OK(vf_dataset_open(&d, root, &s));
    if (d) {
        CHECK_EQ_INT(vf_dataset_num_missing_files(d), 0);
        vf_dataset_close(d);
    }
    free(root);
}

/* ---- generated layouts ----------------------------------------------- */

static void test_good_v21(void)
{
    char *dir = make_v21("good", INFO, EPISODES, TASKS, STATS);
    vf_dataset *d;
    CHECK_OK(vf_dataset_open(&d, dir, meta_only()));
    if (d) {
        if (vf_dataset_num_problems(d))
            dump_problems(d);
        CHECK_EQ_INT(vf_dataset_num_problems(d), 0);
        CHECK_EQ_INT(vf_dataset_num_episodes(d), 2);
        CHECK_EQ_INT(vf_dataset_episode(d, 1)->from_index, 3);
        const vf_camera *c = vf_dataset_camera(d, 0);
        CHECK(c && c->width == 64 && c->height == 48 && !strcmp(c->codec, "h264") && !c->is_depth);
        /* Aggregation: count-weighted mean, pooled std. */
        const vf_stat *mean = vf_dataset_find_stat(d, "action", "mean");
        const vf_stat *std = vf_dataset_find_stat(d, "action", "std");
        const vf_stat *mn = vf_dataset_find_stat(d, "action", "min");
        CHECK(mean && fabs(mean->values[0] - 0.6) < 1e-12 && fabs(mean->values[1] - 2.8) < 1e-12);
        /* var0 = (3*(1+0.16) + 2*(0.25+0.36)) / 5 = 0.94 */
        CHECK(std && fabs(std->values[0] - sqrt(0.94)) < 1e-12);
        CHECK(mn && mn->values[0] == -1 && mn->values[1] == 1);
        char *json;
        CHECK_OK(vf_dataset_info_json(d, 0, &json));
        CHECK(json && strstr(json, "\"format_version\":\"v2.1\"") && strstr(json, "\"problems\":[]"));
        free(json);
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);
}

static void test_depth_flags(void)
{
    /* The depth flag in each of its three places. */
    const char *variants[][2] = {
        {"\"is_depth_map\": false}}", "\"is_depth_map\": true}}"},
        {"\"is_depth_map\": false}}", "\"video.is_depth_map\": true}}"},
        {"\"is_depth_map\": false}}", "\"is_depth_map\": false}, \"video_info\": {\"video.is_depth_map\": true}}"},
    };
    for (size_t i = 0; i < 3; i++) {
        char *info = replace(INFO, variants[i][0], variants[i][1]);
        char *dir = make_v21("depth", info, EPISODES, TASKS, STATS);
        vf_dataset *d;
        CHECK_OK(vf_dataset_open(&d, dir, meta_only()));
        CHECK(d && vf_dataset_camera(d, 0)->is_depth == 1);
        vf_dataset_close(d);
        vf_test_rmtree(dir);
        free(dir);
        free(info);
    }
}

static void test_hostile_info(void)
{
    /* Truncated in the middle of the features object. */
    char *cut = vf_strndup(INFO, strlen(INFO) / 2);
    EXPECT_INFO_ERROR(cut, VF_ECORRUPT, "meta/info.json:");
    free(cut);
    EXPECT_INFO_ERROR("", VF_ECORRUPT, "meta/info.json:");
    EXPECT_INFO_ERROR("[1, 2]", VF_ECORRUPT, "meta/info.json: expected a JSON object");

    struct {
        const char *from, *to;
        int code;
        const char *needle;
    } cases[] = {
        /* wrong types */
        {"\"fps\": 10", "\"fps\": \"10\"", VF_ECORRUPT, "meta/info.json: fps: expected a number"},
        {"\"shape\": [2]", "\"shape\": \"2\"", VF_ECORRUPT, "meta/info.json: features.action.shape: expected a list of integers"},
        {"\"shape\": [2]", "\"shape\": [2.5]", VF_ECORRUPT, "features.action.shape: expected a list of integers"},
        {"\"shape\": [2]", "\"shape\": []", VF_ECORRUPT, "features.action.shape: expected a non-empty list"},
        {"\"video.width\": 64", "\"video.width\": \"64\"", VF_ECORRUPT, "features.cam.info.video.width: expected an integer"},
        {"\"dtype\": \"float32\", \"shape\": [2]", "\"dtype\": 7, \"shape\": [2]", VF_ECORRUPT, "features.action.dtype: expected a string"},
        {"\"total_frames\": 5", "\"total_frames\": [5]", VF_ECORRUPT, "total_frames: expected an integer"},
        {"\"robot_type\": \"test_bot\"", "\"robot_type\": 3", VF_ECORRUPT, "robot_type: expected a string"},
        {"\"is_depth_map\": false", "\"is_depth_map\": \"no\"", VF_ECORRUPT, "features.cam.info.is_depth_map: expected true or false"},
        {"\"features\": {", "\"features\": [], \"x\": {", VF_ECORRUPT, "features: expected an object"},
        {"\"action\": {\"dtype\"", "\"action\": 5, \"z\": {\"dtype\"", VF_ECORRUPT, "features.action: expected an object"},
        /* bad values */
        {"\"fps\": 10", "\"fps\": -10", VF_ECORRUPT, "meta/info.json: fps: must be a number in (0, 100000] (got -10)"},
        {"\"fps\": 10", "\"fps\": 0", VF_ECORRUPT, "fps: must be"},
        {"\"total_episodes\": 2", "\"total_episodes\": -2", VF_ECORRUPT, "total_episodes: out of range (-2)"},
        {"\"chunks_size\": 1000", "\"chunks_size\": 0", VF_ECORRUPT, "chunks_size: must be positive"},
        {"\"video.width\": 64", "\"video.width\": 1000000", VF_ECORRUPT, "video size 1000000x48"},
        /* huge shapes */
        {"\"shape\": [2]", "\"shape\": [100000000000]", VF_ECORRUPT, "features.action.shape: expected integers in [1, 16777216]"},
        {"\"shape\": [2]", "\"shape\": [16777216, 16777216]", VF_ECORRUPT, "features.action.shape: more than 2147483648 elements per row"},
        {"\"shape\": [2]", "\"shape\": [2, -1]", VF_ECORRUPT, "item 1 is -1"},
        {"\"shape\": [2]", "\"shape\": [1,1,1,1,1,1,1,1,1]", VF_ECORRUPT, "at most 8 integers"},
        {"\"shape\": [2]", "\"shape\": [99999999999999999999999]", VF_ECORRUPT, "meta/info.json:"},
        /* missing keys */
        {"\"total_frames\": 5,", "", VF_ECORRUPT, "meta/info.json: missing key 'total_frames'"},
        {"\"fps\": 10,", "", VF_ECORRUPT, "missing key 'fps'"},
        {"\"chunks_size\": 1000,", "", VF_ECORRUPT, "missing key 'chunks_size'"},
        {"\"codebase_version\": \"v2.1\",", "", VF_ECORRUPT, "missing key 'codebase_version'"},
        {"\"dtype\": \"float32\", \"shape\": [2]", "\"shape\": [2]", VF_ECORRUPT, "features.action: missing key 'dtype'"},
        {"\"video_path\": \"videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4\",",
         "\"video_path\": null,", VF_ECORRUPT, "video_path: missing or null, but feature 'cam' is a video"},
        /* versions */
        {"\"v2.1\"", "\"v1.6\"", VF_EUNSUPPORTED, "codebase_version: unsupported version 'v1.6'"},
        {"\"v2.1\"", "\"v4.0\"", VF_EUNSUPPORTED, "unsupported version 'v4.0' (vlafeed reads v2.0, v2.1 and v3.0)"},
        {"\"v2.1\"", "\"v2.2\"", VF_EUNSUPPORTED, "unsupported version 'v2.2'"},
        {"\"v2.1\"", "\"banana\"", VF_EUNSUPPORTED, "unsupported version 'banana'"},
        {"\"v2.1\"", "2.1", VF_ECORRUPT, "codebase_version: expected a string"},
        /* templates */
        {"episode_{episode_index:06d}.parquet", "episode_{foo}.parquet", VF_ECORRUPT, "data_path: path template"},
        {"episode_{episode_index:06d}.parquet", "episode_{episode_index:06x}.parquet", VF_ECORRUPT, "unsupported format spec"},
        {"episode_{episode_index:06d}.parquet", "episode_{episode_index.parquet", VF_ECORRUPT, "unclosed '{'"},
    };
    for (size_t i = 0; i < VF_ARRAY_LEN(cases); i++) {
        char *info = replace(INFO, cases[i].from, cases[i].to);
        expect_info_error(info, cases[i].code, cases[i].needle, (int)(1000 + i));
        free(info);
    }
    /* Not a dataset at all. */
    char *dir = vf_test_tmpdir("empty");
    vf_dataset *d;
    CHECK_ERR(vf_dataset_open(&d, dir, meta_only()), VF_ENOENT, "meta/info.json not found");
    vf_test_rmtree(dir);
    free(dir);
    CHECK_ERR(vf_dataset_open(&d, "/nonexistent/dataset", NULL), VF_ENOENT, "/nonexistent/dataset: no such directory");
}

static void test_hostile_jsonl(void)
{
    vf_dataset *d = NULL;
    struct {
        const char *episodes, *tasks;
        int code;
        const char *needle;
    } cases[] = {
        {"{\"episode_index\": 0, \"length\": 3}\n{\"episode_index\": 1, \"length\": 2\n", TASKS, VF_ECORRUPT,
         "meta/episodes.jsonl:2:"},
        {"{\"episode_index\": 0, \"length\": 3}\n\n{\"episode_index\": 1, \"length\": 2}\nnot json\n", TASKS,
         VF_ECORRUPT, "meta/episodes.jsonl:4:"},
        {"{\"episode_index\": 0, \"length\": 3}\n{\"episode_index\": 1, \"length\": \"x\"}\n", TASKS, VF_ECORRUPT,
         "meta/episodes.jsonl: line 2.length: expected an integer"},
        {"{\"episode_index\": 0, \"length\": 3}\n{\"length\": 2}\n", TASKS, VF_ECORRUPT,
         "meta/episodes.jsonl: line 2: missing key 'episode_index'"},
        {"{\"episode_index\": -4, \"length\": 3}\n", TASKS, VF_ECORRUPT, "line 1.episode_index: out of range (-4)"},
        {"[1, 2]\n", TASKS, VF_ECORRUPT, "meta/episodes.jsonl:1: expected a JSON object"},
        {"{\"episode_index\": 0, \"length\": 3, \"tasks\": [1]}\n", TASKS, VF_ECORRUPT,
         "line 1.tasks: expected a list of strings"},
        {"", TASKS, VF_ECORRUPT, "meta/episodes.jsonl: no episodes"},
        {EPISODES, "{\"task_index\": 0}\n", VF_ECORRUPT, "meta/tasks.jsonl: line 1: missing key 'task'"},
        {EPISODES, "{\"task_index\": 0, \"task\": \"pick\"}\n{\"task_index\": 1, \"task\": \"pl", VF_ECORRUPT,
         "meta/tasks.jsonl:2:"},
        {EPISODES, NULL, VF_ENOENT, "meta/tasks.jsonl: missing"},
        {NULL, TASKS, VF_ENOENT, "meta/episodes.jsonl: missing"},
    };
    for (size_t i = 0; i < VF_ARRAY_LEN(cases); i++) {
        char *dir = make_v21("jsonl", INFO, cases[i].episodes, cases[i].tasks, STATS);
        int r = vf_dataset_open(&d, dir, meta_only());
        vf_test_checks++;
        if (r != cases[i].code || !strstr(vf_last_error(), cases[i].needle)) {
            vf_test_failures++;
            fprintf(stderr, "jsonl case %zu: expected %d containing \"%s\", got %d \"%s\"\n", i, cases[i].code,
                    cases[i].needle, r, vf_last_error());
        }
        vf_dataset_close(d);
        vf_test_rmtree(dir);
        free(dir);
    }
}

static void test_validation(void)
{
    vf_dataset *d;
    /* Totals that disagree with the metadata. */
    char *info = replace(INFO, "\"total_frames\": 5", "\"total_frames\": 6");
    char *info2 = replace(info, "\"total_tasks\": 1", "\"total_tasks\": 2");
    char *info3 = replace(info2, "\"total_episodes\": 2", "\"total_episodes\": 3");
    char *dir = make_v21("totals", info3, EPISODES, TASKS, STATS);
    CHECK_OK(vf_dataset_open(&d, dir, meta_only()));
    if (d) {
        CHECK(has_problem(d, VF_SEVERITY_ERROR, "total_frames", "the episode lengths sum to 5, info.json total_frames says 6"));
        CHECK(has_problem(d, VF_SEVERITY_ERROR, "total_tasks", "the task table has 1 tasks, info.json total_tasks says 2"));
        CHECK(has_problem(d, VF_SEVERITY_ERROR, "total_episodes", "lists 2 episodes, info.json total_episodes says 3"));
        CHECK_EQ_INT(vf_dataset_num_errors(d), 3);
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);
    free(info);
    free(info2);
    free(info3);

    /* Rows out of position order, a zero-length episode, an unknown task,
     * a task_index that is not its position. */
    const char *episodes = "{\"episode_index\": 1, \"tasks\": [\"pick\"], \"length\": 3}\n"
                           "{\"episode_index\": 0, \"tasks\": [\"place\"], \"length\": 2}\n";
    dir = make_v21("order", INFO, episodes, "{\"task_index\": 5, \"task\": \"pick\"}\n", STATS);
    CHECK_OK(vf_dataset_open(&d, dir, meta_only()));
    if (d) {
        CHECK(has_problem(d, VF_SEVERITY_ERROR, "episode_index", "row 0 holds episode 1"));
        CHECK(has_problem(d, VF_SEVERITY_WARNING, "tasks", "task \"place\" is not in meta/tasks.jsonl"));
        CHECK(has_problem(d, VF_SEVERITY_ERROR, "task_index", "task_index 5 at position 0"));
        /* Positions stay in ascending episode order; global ranges follow
         * the file order (LeRobot's cumulative lengths). */
        CHECK_EQ_INT(vf_dataset_episode(d, 0)->episode_index, 0);
        CHECK_EQ_INT(vf_dataset_episode(d, 0)->from_index, 3);
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);

    /* Duplicate episode and zero length. */
    episodes = "{\"episode_index\": 0, \"length\": 5}\n{\"episode_index\": 0, \"length\": 0}\n";
    dir = make_v21("dup", INFO, episodes, TASKS, STATS);
    CHECK_OK(vf_dataset_open(&d, dir, meta_only()));
    if (d) {
        CHECK(has_problem(d, VF_SEVERITY_ERROR, "episode_index", "episode listed more than once"));
        CHECK(has_problem(d, VF_SEVERITY_ERROR, "length", "episode length is 0"));
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);

    /* NaN statistics, a malformed stats line, missing stats. */
    const char *stats = "{\"episode_index\": 0, \"stats\": {\"action\": {\"min\": [0, NaN], \"max\": [2, 3], "
                        "\"mean\": [1, 2], \"std\": [1, 1], \"count\": [3]}}}\n"
                        "{\"episode_index\": 1, \"stats\": {\"action\": {\"min\": [0, 1], \"max\": [2, 3], "
                        "\"mean\": [1, Infinity], \"std\": [1, 1], \"count\": [2]}}}\n";
    dir = make_v21("nan", INFO, EPISODES, TASKS, stats);
    CHECK_OK(vf_dataset_open(&d, dir, meta_only()));
    if (d) {
        CHECK(has_problem(d, VF_SEVERITY_WARNING, "action.min", "non-finite value"));
        CHECK(has_problem(d, VF_SEVERITY_WARNING, "action.mean", "non-finite value (NaN, Infinity or null) at element 1"));
        const vf_stat *mean = vf_dataset_find_stat(d, "action", "mean");
        CHECK(mean && !isfinite(mean->values[1]));
        CHECK_EQ_INT(vf_dataset_num_errors(d), 0);
        char *json;
        CHECK_OK(vf_dataset_info_json(d, 0, &json));
        CHECK(json && strstr(json, "null"));
        free(json);
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);
    dir = make_v21("nostats", INFO, EPISODES, TASKS, "{\"episode_index\": 0, \"stats\": \n");
    CHECK_OK(vf_dataset_open(&d, dir, meta_only()));
    if (d) {
        CHECK(has_problem(d, VF_SEVERITY_ERROR, "", "meta/episodes_stats.jsonl:1:"));
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);
    dir = make_v21("nostats2", INFO, EPISODES, TASKS, NULL);
    CHECK_OK(vf_dataset_open(&d, dir, meta_only()));
    if (d) {
        CHECK(has_problem(d, VF_SEVERITY_WARNING, "", "missing: no normalization statistics"));
        CHECK_EQ_INT(vf_dataset_num_stats(d), 0);
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);

    /* A missing data file and a missing video: listed, dataset opens; a
     * subset of the other episode reports nothing. */
    dir = make_v21("missing", INFO, EPISODES, TASKS, STATS);
    char *gone = vf_path_join(dir, "data/chunk-000/episode_000001.parquet");
    char *gone2 = vf_path_join(dir, "videos/chunk-000/cam/episode_000001.mp4");
    CHECK(remove(gone) == 0 && remove(gone2) == 0);
    CHECK_OK(vf_dataset_open(&d, dir, meta_only()));
    if (d) {
        CHECK_EQ_INT(vf_dataset_num_missing_files(d), 2);
        CHECK(!strcmp(vf_dataset_missing_file(d, 0), "data/chunk-000/episode_000001.parquet"));
        CHECK(!strcmp(vf_dataset_missing_file(d, 1), "videos/chunk-000/cam/episode_000001.mp4"));
        CHECK(has_problem(d, VF_SEVERITY_ERROR, "", "data file missing"));
        CHECK(has_problem(d, VF_SEVERITY_ERROR, "cam", "video file missing"));
        vf_dataset_close(d);
    }
    vf_dataset_settings s = *meta_only();
    int64_t only0[] = {0};
    s.episodes = only0;
    s.num_episodes = 1;
    CHECK_OK(vf_dataset_open(&d, dir, &s));
    if (d) {
        CHECK_EQ_INT(vf_dataset_num_missing_files(d), 0);
        CHECK_EQ_INT(vf_dataset_num_problems(d), 0);
        vf_dataset_close(d);
    }
    free(gone);
    free(gone2);
    vf_test_rmtree(dir);
    free(dir);
}

static void test_v20(void)
{
    char *info = replace(INFO, "\"v2.1\"", "\"v2.0\"");
    char *dir = make_v21("v20", info, EPISODES, TASKS, NULL);
    write_file(dir, "meta/stats.json", "{\"action\": {\"mean\": [1, 2], \"std\": [0.5, NaN]}}");
    vf_dataset *d;
    CHECK_OK(vf_dataset_open(&d, dir, meta_only()));
    if (d) {
        CHECK(!strcmp(vf_dataset_format_version(d), "v2.0"));
        const vf_stat *m = vf_dataset_find_stat(d, "action", "mean");
        CHECK(m && m->size == 2 && m->values[1] == 2);
        CHECK(has_problem(d, VF_SEVERITY_WARNING, "action.std", "non-finite"));
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);
    free(info);
}

static void test_templates(void)
{
    vf_ds_template_vars v = {.chunk_index = 1, .file_index = 1000, .episode_chunk = 0, .episode_index = 42,
                             .video_key = "observation.images.front"};
    char *out;
    CHECK_OK(vf_ds_format_template("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4", &v, &out));
    CHECK(out && !strcmp(out, "videos/observation.images.front/chunk-001/file-1000.mp4"));
    free(out);
    CHECK_OK(vf_ds_format_template("data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet", &v, &out));
    CHECK(out && !strcmp(out, "data/chunk-000/episode_000042.parquet"));
    free(out);
    CHECK_OK(vf_ds_format_template("{{literal}}/{episode_index}/{episode_index:5d}", &v, &out));
    CHECK(out && !strcmp(out, "{literal}/42/   42"));
    free(out);
    v.video_key = NULL;
    CHECK_ERR(vf_ds_format_template("{video_key}", &v, &out), VF_ECORRUPT, "unknown placeholder {video_key}");
    CHECK_ERR(vf_ds_format_template("a}b", &v, &out), VF_ECORRUPT, "single '}'");
    CHECK_ERR(vf_ds_format_template("{chunk_index:03s}", &v, &out), VF_ECORRUPT, "unsupported format spec");
}

int main(void)
{
    test_fixture();
    test_good_v21();
    test_depth_flags();
    test_hostile_info();
    test_hostile_jsonl();
    test_validation();
    test_v20();
    test_templates();
    return vf_test_finish("test_dataset");
}
