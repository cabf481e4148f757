/* test_dataset_table.c: the Parquet side of the dataset layer on the real
 * v2.1 fixture: row-group location, columnar table reads (projection,
 * conversion, index verification) and the errors for a shape that does
 * not match the data, a missing column and non-table features. */
#include "dataset/dataset.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>

static const char *COLUMNS[] = {"observation.state", "action", "timestamp", "frame_index",
                                "episode_index", "index", "task_index"};

static void copy_file(const char *from, const char *to)
{
    uint8_t *data;
    size_t len;
    CHECK_OK(vf_read_file(from, &data, &len));
    char *dir = vf_strdup(to);
    *strrchr(dir, '/') = 0;
    CHECK_OK(vf_mkdirs(dir));
    free(dir);
    FILE *f = fopen(to, "wb");
    CHECK(f != NULL);
    if (f) {
        CHECK(fwrite(data, 1, len, f) == len);
        fclose(f);
    }
    free(data);
}

static void test_read_fixture(const char *root)
{
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    int64_t subset[] = {1, 2, 4};
    s.episodes = subset;
    s.num_episodes = 3;
    s.check_data_files = 1;
    vf_dataset *d;
    CHECK_OK(vf_dataset_open(&d, root, &s));
    if (!d)
        return;
    /* Footers agree with the metadata: no problem at all. */
    CHECK_EQ_INT(vf_dataset_num_problems(d), 0);

    /* Locator: one row group holding the whole episode. */
    vf_data_span span;
    CHECK_OK(vf_dataset_episode_data(d, 2, &span));
    vf_pq_file *f;
    CHECK_OK(vf_pq_open_path(&f, span.path));
    if (f) {
        vf_ds_rg_span *spans;
        int n;
        CHECK_OK(vf_ds_locate_row_groups(d, 2, f, &spans, &n));
        CHECK(n == 1 && spans[0].row_group == 0 && spans[0].first_row == 0 && spans[0].count == 357 &&
              spans[0].episode_row == 0);
        free(spans);
        /* The wrong episode for this file: statistics disagree. */
        CHECK_ERR(vf_ds_locate_row_groups(d, 0, f, &spans, &n), VF_ECORRUPT, "rows [0, 393) are outside");
        vf_pq_close(f);
    }

    /* Episodes 4 then 1, every tabular column, index verified. */
    size_t positions[] = {2, 0};
    vf_ds_table t;
    CHECK_OK(vf_ds_read_table(d, positions, 2, COLUMNS, 7, VF_DS_VERIFY_INDEX, &t));
    CHECK_EQ_INT(t.rows, 357 + 393);
    CHECK_EQ_INT(t.num_columns, 7);
    CHECK_EQ_INT(t.num_episodes, 2);
    if (t.num_columns == 7 && t.rows == 750) {
        CHECK(t.episode_start[0] == 0 && t.episode_start[1] == 357 && t.episode_start[2] == 750);
        const vf_ds_column *state = &t.columns[0], *ts = &t.columns[2], *fi = &t.columns[3], *ep = &t.columns[4],
                           *idx = &t.columns[5], *task = &t.columns[6];
        CHECK(state->type == VF_DS_F32 && state->width == 26 && state->rows == 750);
        CHECK(ts->type == VF_DS_F32 && ts->width == 1);
        CHECK(fi->type == VF_DS_I64 && ep->type == VF_DS_I64);
        int ok = 1;
        for (int64_t r = 0; r < 750 && ok; r++) {
            int first = r < 357;
            int64_t k = first ? r : r - 357;
            int64_t from = first ? 479 + 393 + 343 + 459 : 479;
            ok = ((int64_t *)ep->values)[r] == (first ? 4 : 1) && ((int64_t *)fi->values)[r] == k &&
                 ((int64_t *)idx->values)[r] == from + k && ((int64_t *)task->values)[r] == 0 &&
                 ((float *)ts->values)[r] == (float)((double)k / 30.0);
            for (int c = 0; c < 26 && ok; c++)
                ok = isfinite(((float *)state->values)[r * 26 + c]);
        }
        CHECK(ok);
        /* Joint values stay in a plausible range (radians / hand 0..1). */
        float first_state = ((float *)state->values)[0];
        CHECK(first_state > -3.2f && first_state < 3.2f);
    }
    vf_ds_table_free(&t);
    CHECK(t.columns == NULL && t.rows == 0);

    const char *video[] = {"observation.images.cam_high"};
    CHECK_ERR(vf_ds_read_table(d, positions, 1, video, 1, 0, &t), VF_EINVAL, "has no table values");
    const char *nope[] = {"nope"};
    CHECK_ERR(vf_ds_read_table(d, positions, 1, nope, 1, 0, &t), VF_ENOENT, "no feature named 'nope'");
    size_t bad_pos[] = {3};
    CHECK_ERR(vf_ds_read_table(d, bad_pos, 1, COLUMNS, 1, 0, &t), VF_ERANGE, "position 3");
    vf_dataset_close(d);
}

/* A copy of the fixture's metadata with one declared shape changed, and
 * one real data file: the read names file, episode and column. */
static void test_shape_mismatch(const char *root)
{
    char *dir = vf_test_tmpdir("shape");
    char *from, *to;
    uint8_t *info;
    size_t len;
    from = vf_path_join(root, "meta/info.json");
    CHECK_OK(vf_read_file(from, &info, &len));
    free(from);
    /* action's shape [26] -> [25] (the first "26" after "action"). */
    char *at = strstr((char *)info, "\"action\"");
    char *num = at ? strstr(at, "26") : NULL;
    CHECK(num != NULL);
    if (num)
        num[1] = '5';
    to = vf_path_join(dir, "meta/info.json");
    char *meta = vf_path_join(dir, "meta");
    CHECK_OK(vf_mkdirs(meta));
    free(meta);
    FILE *f = fopen(to, "wb");
    CHECK(f != NULL);
    if (f) {
        fwrite(info, 1, len, f);
        fclose(f);
    }
    free(to);
    free(info);
    static const char *metas[] = {"meta/episodes.jsonl", "meta/tasks.jsonl", "meta/episodes_stats.jsonl",
                                  "data/chunk-000/episode_000001.parquet"};
    for (size_t i = 0; i < 4; i++) {
        from = vf_path_join(root, metas[i]);
        to = vf_path_join(dir, metas[i]);
        copy_file(from, to);
        free(from);
        free(to);
    }
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    int64_t one[] = {1};
    s.episodes = one;
    s.num_episodes = 1;
    s.check_data_files = 1;
    vf_dataset *d;
    CHECK_OK(vf_dataset_open(&d, dir, &s));
    if (d) {
        size_t pos = 0;
        vf_ds_table t;
        const char *action[] = {"action"};
        CHECK_ERR(vf_ds_read_table(d, &pos, 1, action, 1, 0, &t), VF_ECORRUPT,
                  "episode_000001.parquet: episode 1: column 'action': row 0 has 26 elements, shape says 25");
        const char *state[] = {"observation.state", "index"};
        CHECK_OK(vf_ds_read_table(d, &pos, 1, state, 2, VF_DS_VERIFY_INDEX, &t));
        CHECK_EQ_INT(t.rows, 393);
        vf_ds_table_free(&t);
        vf_dataset_close(d);
    }
    /* The episodes metadata says episode 1 is longer than its file. */
    char *eps = vf_path_join(dir, "meta/episodes.jsonl");
    uint8_t *text;
    CHECK_OK(vf_read_file(eps, &text, &len));
    char *l = strstr((char *)text, "\"length\": 393");
    CHECK(l != NULL);
    if (l)
        memcpy(l, "\"length\": 394", 13);
    f = fopen(eps, "wb");
    if (f) {
        fwrite(text, 1, len, f);
        fclose(f);
    }
    free(text);
    free(eps);
    CHECK_OK(vf_dataset_open(&d, dir, &s));
    if (d) {
        int found = 0;
        for (size_t i = 0; i < vf_dataset_num_problems(d); i++) {
            const vf_problem *p = vf_dataset_problem(d, i);
            found |= p->episode == 1 && strstr(p->message, "file has 393 rows, the episodes stored in it have 394") != NULL;
        }
        CHECK(found);
        size_t pos = 0;
        vf_ds_table t;
        const char *ts[] = {"timestamp"};
        CHECK_ERR(vf_ds_read_table(d, &pos, 1, ts, 1, 0, &t), VF_ECORRUPT, "episode 1: rows [0, 394) are outside");
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    char *root = vf_test_fixture("lerobot-g1-v21");
    if (vf_dir_exists(root)) {
        test_read_fixture(root);
        test_shape_mismatch(root);
    } else {
        fprintf(stderr, "fixture %s missing; skipping\n", root);
    }
    free(root);
    return vf_test_finish("test_dataset_table");
}
