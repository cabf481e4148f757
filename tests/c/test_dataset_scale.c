/* test_dataset_scale.c: the dataset layer at scale, on v3.0 datasets
 * written here with the C Parquet writer: projected footer decoding of a
 * wide episodes file, episodes files read in parallel (order kept), the
 * row-group locator on a data file with one row group per episode, bad
 * input (episodes out of order, overlapping episodes files, a data file
 * whose row groups do not match the episode index: errors naming file and
 * episode, found at open) and deferred file existence checks above VF_LAZY_FILE_CHECKS. */
#include "dataset/dataset.h"
#include "test_pq_helpers.h"
#include "testutil.h"

#include <stdlib.h>

/* ---- writing datasets ------------------------------------------------------ */

/* One episode row of the metadata. */
typedef struct ep_row {
    int64_t episode, length, from, data_file, video_file;
    double vfrom;             /* start in its mp4: the episodes before it there, back to back */
} ep_row;

/* A dataset: n episodes, lengths 1 + e % 3, one camera "cam". */
typedef struct spec {
    int64_t n;
    int64_t per_meta_file;    /* episodes per meta/episodes file */
    int64_t meta_rg;          /* rows per row group in the episodes files */
    int64_t per_data_file;    /* episodes per data file (0: no data files) */
    int64_t per_video_file;   /* episodes per mp4 */
} spec;

static int64_t ep_length(int64_t e) { return 1 + e % 3; }

static void fill_rows(const spec *s, ep_row *rows)
{
    int64_t from = 0;
    for (int64_t e = 0; e < s->n; e++) {
        rows[e].episode = e;
        rows[e].length = ep_length(e);
        rows[e].from = from;
        rows[e].data_file = s->per_data_file ? e / s->per_data_file : 0;
        rows[e].video_file = e / s->per_video_file;
        rows[e].vfrom = e % s->per_video_file ? rows[e - 1].vfrom + (double)rows[e - 1].length / 10.0 : 0.0;
        from += rows[e].length;
    }
}

static void write_info(const char *dir, int64_t episodes, int64_t frames)
{
    char *info = vf_asprintf(
        "{\"codebase_version\": \"v3.0\", \"robot_type\": \"bot\", \"total_episodes\": %lld,\n"
        " \"total_frames\": %lld, \"total_tasks\": 1, \"chunks_size\": 1000, \"fps\": 10,\n"
        " \"data_path\": \"data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet\",\n"
        " \"video_path\": \"videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4\",\n"
        " \"features\": {\n"
        "  \"action\": {\"dtype\": \"float64\", \"shape\": [1], \"names\": null},\n"
        "  \"cam\": {\"dtype\": \"video\", \"shape\": [48, 64, 3], \"names\": null,\n"
        "          \"info\": {\"video.codec\": \"av1\", \"video.width\": 64, \"video.height\": 48,\n"
        "                   \"video.pix_fmt\": \"yuv420p\", \"video.fps\": 10}},\n"
        "  \"timestamp\": {\"dtype\": \"float32\", \"shape\": [1], \"names\": null},\n"
        "  \"frame_index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null},\n"
        "  \"episode_index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null},\n"
        "  \"index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null},\n"
        "  \"task_index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null}}}\n",
        (long long)episodes, (long long)frames);
    vf_test_write_text(dir, "meta/info.json", info);
    free(info);
}

static void write_tasks(const char *dir)
{
    char *path = vf_test_path_in(dir, "meta/tasks.parquet");
    vf_pq_writer *w;
    CHECK_OK(vf_pq_writer_open(&w, path, NULL));
    int64_t ti[1] = {0}, offs[2] = {0, 4};
    vf_pq_array f[2] = {int64_array("task_index", ti, 1), int64_array("task", NULL, 1)};
    f[1].type = VF_PQ_T_STRING;
    f[1].offsets = offs;
    f[1].data = (uint8_t *)"pick";
    f[1].data_len = 4;
    CHECK_OK(vf_pq_writer_write_row_group(w, f, 2));
    CHECK_OK(vf_pq_writer_close(w));
    free(path);
}

/* Writes rows[0..count) as one episodes file, `rg` rows per row group,
 * with a wide nested stats column that no reader needs. */
static void write_episodes_file(const char *dir, const char *rel, const ep_row *rows, int64_t count, int64_t rg)
{
    char *path = vf_test_path_in(dir, rel);
    vf_pq_writer *w;
    CHECK_OK(vf_pq_writer_open(&w, path, NULL));
    for (int64_t start = 0; start < count; start += rg) {
        int64_t m = VF_MIN(rg, count - start);
        int64_t *c[9];
        for (int k = 0; k < 9; k++)
            c[k] = calloc((size_t)m, sizeof(int64_t));
        double *vfrom = calloc((size_t)m, sizeof(double)), *vto = calloc((size_t)m, sizeof(double));
        double *stat = calloc((size_t)m * 4, sizeof(double));
        int64_t *soffs = calloc((size_t)m + 1, sizeof(int64_t));
        for (int64_t i = 0; i < m; i++) {
            const ep_row *e = &rows[start + i];
            c[0][i] = e->episode;
            c[1][i] = e->length;
            c[2][i] = 0;
            c[3][i] = e->data_file;
            c[4][i] = e->from;
            c[5][i] = e->from + e->length;
            c[6][i] = 0;
            c[7][i] = e->video_file;
            vfrom[i] = e->vfrom;
            vto[i] = e->vfrom + (double)e->length / 10.0;
            for (int k = 0; k < 4; k++)
                stat[i * 4 + k] = (double)(e->episode + k);
            soffs[i + 1] = (i + 1) * 4;
        }
        vf_pq_array child = double_array("element", stat, m * 4);
        vf_pq_array f[12] = {
            int64_array("episode_index", c[0], m),
            int64_array("length", c[1], m),
            int64_array("data/chunk_index", c[2], m),
            int64_array("data/file_index", c[3], m),
            int64_array("dataset_from_index", c[4], m),
            int64_array("dataset_to_index", c[5], m),
            int64_array("stats/action/mean", NULL, m),
            int64_array("videos/cam/chunk_index", c[6], m),
            int64_array("videos/cam/file_index", c[7], m),
            double_array("videos/cam/from_timestamp", vfrom, m),
            double_array("videos/cam/to_timestamp", vto, m),
            int64_array("meta/episodes/file_index", c[2], m),
        };
        f[6].type = VF_PQ_T_LIST;
        f[6].offsets = soffs;
        f[6].num_children = 1;
        f[6].children = &child;
        CHECK_OK(vf_pq_writer_write_row_group(w, f, 12));
        for (int k = 0; k < 9; k++)
            free(c[k]);
        free(vfrom);
        free(vto);
        free(stat);
        free(soffs);
    }
    CHECK_OK(vf_pq_writer_close(w));
    free(path);
}

/* Data rows of episodes [first, first+count) (consecutive in rows[]),
 * one row group per episode; `swap` exchanges the row groups of episodes
 * swap and swap+1 (same length) so the file disagrees with the metadata. */
static void write_data_file(const char *dir, const char *rel, const ep_row *rows, int64_t first, int64_t count,
                            int64_t swap)
{
    char *path = vf_test_path_in(dir, rel);
    vf_pq_writer *w;
    CHECK_OK(vf_pq_writer_open(&w, path, NULL));
    for (int64_t k = 0; k < count; k++) {
        int64_t which = first + k;
        if (swap >= 0 && which == swap)
            which = swap + 1;
        else if (swap >= 0 && which == swap + 1)
            which = swap;
        const ep_row *e = &rows[which];
        int64_t m = e->length;
        int64_t fi[3], ep[3], idx[3], ti[3];
        double act[3], ts[3];
        for (int64_t i = 0; i < m; i++) {
            fi[i] = i;
            ep[i] = e->episode;
            idx[i] = e->from + i;
            ti[i] = 0;
            act[i] = (double)(e->from + i) * 0.5;
            ts[i] = (double)i / 10.0;
        }
        vf_pq_array f[6] = {double_array("action", act, m), double_array("timestamp", ts, m),
                            int64_array("frame_index", fi, m), int64_array("episode_index", ep, m),
                            int64_array("index", idx, m),      int64_array("task_index", ti, m)};
        CHECK_OK(vf_pq_writer_write_row_group(w, f, 6));
    }
    CHECK_OK(vf_pq_writer_close(w));
    free(path);
}

/* The whole dataset of spec s (rows may be edited by the caller first). */
static void write_dataset(const char *dir, const spec *s, const ep_row *rows, int64_t swap)
{
    int64_t frames = 0;
    for (int64_t e = 0; e < s->n; e++)
        frames += rows[e].length;
    write_info(dir, s->n, frames);
    write_tasks(dir);
    for (int64_t start = 0, f = 0; start < s->n; start += s->per_meta_file, f++) {
        char rel[64];
        snprintf(rel, sizeof rel, "meta/episodes/chunk-000/file-%03lld.parquet", (long long)f);
        write_episodes_file(dir, rel, rows + start, VF_MIN(s->per_meta_file, s->n - start), s->meta_rg);
    }
    for (int64_t start = 0, f = 0; s->per_data_file && start < s->n; start += s->per_data_file, f++) {
        char rel[64];
        snprintf(rel, sizeof rel, "data/chunk-000/file-%03lld.parquet", (long long)f);
        write_data_file(dir, rel, rows, start, VF_MIN(s->per_data_file, s->n - start), swap);
    }
}

static vf_dataset *open_ds(const char *dir, int check_files, int check_data)
{
    vf_dataset_settings st;
    vf_dataset_defaults(&st);
    st.check_files = check_files;
    st.check_data_files = check_data;
    vf_dataset *d = NULL;
    CHECK_OK(vf_dataset_open(&d, dir, &st));
    return d;
}

/* The first problem with this file (NULL: any), episode and column. */
static const vf_problem *find_problem(const vf_dataset *d, const char *file, int64_t episode, const char *column)
{
    for (size_t i = 0; i < vf_dataset_num_problems(d); i++) {
        const vf_problem *p = vf_dataset_problem(d, i);
        if ((!file || !strcmp(p->file, file)) && p->episode == episode && !strcmp(p->column, column))
            return p;
    }
    return NULL;
}

/* ---- tests ------------------------------------------------------------------- */

/* A projected open keeps the chunk metadata of the named fields only;
 * what it reads equals a full open's reads; other fields fail clearly. */
static void test_projected_open(void)
{
    char *dir = vf_test_tmpdir("scale-proj");
    spec s = {.n = 95, .per_meta_file = 95, .meta_rg = 10, .per_data_file = 0, .per_video_file = 40};
    ep_row *rows = calloc((size_t)s.n, sizeof *rows);
    fill_rows(&s, rows);
    write_dataset(dir, &s, rows, -1);
    char *path = vf_path_join(dir, "meta/episodes/chunk-000/file-000.parquet");
    vf_source *src;
    CHECK_OK(vf_source_open_file(&src, path));
    vf_pq_file *full = NULL, *proj = NULL;
    const char *fields[] = {"dataset_to_index", "episode_index", "no such column"};
    CHECK_OK(vf_pq_open(&full, src));
    CHECK_OK(vf_pq_open_projected(&proj, src, fields, 3));
    vf_source_close(src);
    if (full && proj) {
        CHECK_EQ_INT(vf_pq_num_rows(proj), 95);
        CHECK_EQ_INT(vf_pq_num_row_groups(proj), 10);
        CHECK_EQ_INT(vf_pq_num_fields(proj), vf_pq_num_fields(full));
        CHECK_EQ_INT(vf_pq_row_group_rows(proj, 9), 5);
        for (int k = 0; k < 2; k++) {
            int fi = vf_pq_field_index(proj, fields[k]);
            vf_pq_array a, b;
            CHECK_OK(vf_pq_read_field_all(proj, fi, &a));
            CHECK_OK(vf_pq_read_field_all(full, fi, &b));
            CHECK(a.length == 95 && b.length == 95 && a.type == VF_PQ_T_INT64 &&
                  !memcmp(a.values, b.values, 95 * sizeof(int64_t)));
            vf_pq_array_free(&a);
            vf_pq_array_free(&b);
        }
        /* Statistics of a kept column work; a skipped one (the nested
         * stats list, or a scalar) is refused by name. */
        int64_t mn, mx;
        const vf_pq_node *ep = vf_pq_field(proj, vf_pq_field_index(proj, "episode_index"));
        CHECK_OK(vf_pq_stats_i64(proj, 3, ep->leaf_index, &mn, &mx));
        CHECK(mn == 30 && mx == 39);
        vf_pq_array a;
        CHECK_ERR(vf_pq_read_field_all(proj, vf_pq_field_index(proj, "stats/action/mean"), &a), VF_EINVAL,
                  "column 'stats/action/mean.list.element' was not loaded");
        CHECK_ERR(vf_pq_read_field(proj, 0, vf_pq_field_index(proj, "length"), &a), VF_EINVAL,
                  "column 'length' was not loaded");
        const vf_pq_node *len = vf_pq_field(proj, vf_pq_field_index(proj, "length"));
        vf_pq_chunk_info info;
        CHECK_ERR(vf_pq_column_chunk(proj, 0, len->leaf_index, &info), VF_EINVAL, "was not loaded");
        CHECK_OK(vf_pq_column_chunk(full, 0, len->leaf_index, &info));
        int *groups, ng;
        CHECK_ERR(vf_pq_select_row_groups(proj, "length", 0, 5, &groups, &ng), VF_EINVAL, "was not loaded");
        CHECK_OK(vf_pq_select_row_groups(proj, "episode_index", 35, 52, &groups, &ng));
        CHECK(ng == 3 && groups[0] == 3 && groups[1] == 4 && groups[2] == 5);
        free(groups);
        /* Row-group lookup by row: boundaries and outside rows. */
        int64_t first = -7;
        CHECK_EQ_INT(vf_pq_row_group_of_row(proj, 0, &first), 0);
        CHECK_EQ_INT(first, 0);
        CHECK_EQ_INT(vf_pq_row_group_of_row(proj, 9, &first), 0);
        CHECK_EQ_INT(vf_pq_row_group_of_row(proj, 10, &first), 1);
        CHECK_EQ_INT(first, 10);
        CHECK_EQ_INT(vf_pq_row_group_of_row(proj, 94, &first), 9);
        CHECK_EQ_INT(first, 90);
        CHECK_EQ_INT(vf_pq_row_group_of_row(proj, 95, NULL), -1);
        CHECK_EQ_INT(vf_pq_row_group_of_row(proj, -1, NULL), -1);
    }
    vf_pq_close(full);
    vf_pq_close(proj);
    free(path);
    free(rows);
    vf_test_rmtree(dir);
    free(dir);
}

/* Seven episodes files of 10-row row groups (read in parallel): the
 * episodes come out in file order with every field right. */
static void test_parallel_episodes_files(void)
{
    char *dir = vf_test_tmpdir("scale-par");
    spec s = {.n = 653, .per_meta_file = 100, .meta_rg = 10, .per_data_file = 0, .per_video_file = 50};
    ep_row *rows = calloc((size_t)s.n, sizeof *rows);
    fill_rows(&s, rows);
    write_dataset(dir, &s, rows, -1);
    vf_dataset *d = open_ds(dir, VF_CHECK_FILES_OFF, 0);
    if (d) {
        CHECK_EQ_INT(vf_dataset_num_episodes(d), 653);
        CHECK_EQ_INT(vf_dataset_num_errors(d), 0);
        CHECK_EQ_INT(vf_dataset_file_checks(d), VF_FILES_NOT_CHECKED);
        CHECK_EQ_INT(d->num_meta_files, 7);
        int ok = 1;
        for (size_t i = 0; i < 653 && ok; i++) {
            const vf_episode *e = vf_dataset_episode(d, i);
            vf_video_span v;
            ok = e->episode_index == (int64_t)i && e->length == ep_length((int64_t)i) &&
                 e->from_index == rows[i].from && d->episodes[i].meta_file == (int)(i / 100) &&
                 vf_dataset_episode_video(d, i, 0, &v) == 0 && v.length == e->length &&
                 v.file == (size_t)(i / 50);
        }
        CHECK(ok);
        CHECK_EQ_INT(vf_dataset_num_video_files(d, 0), 14);
        vf_dataset_close(d);
    }
    /* A damaged file in the middle while the files after it are being
     * read: the open fails naming it, and the files in flight finish
     * before their columns are freed (ASan/TSan run this too). */
    char *bad = vf_path_join(dir, "meta/episodes/chunk-000/file-003.parquet");
    FILE *f = fopen(bad, "r+b");
    CHECK(f != NULL);
    if (f) {
        CHECK(fseek(f, -12, SEEK_END) == 0);
        fputs("garbage!", f); /* footer length and magic */
        fclose(f);
    }
    vf_dataset_settings st;
    vf_dataset_defaults(&st);
    st.check_files = VF_CHECK_FILES_OFF;
    vf_dataset *bad_ds = NULL;
    CHECK_ERR(vf_dataset_open(&bad_ds, dir, &st), VF_ECORRUPT, "file-003.parquet");
    CHECK(bad_ds == NULL);
    free(bad);
    free(rows);
    vf_test_rmtree(dir);
    free(dir);
}

/* One data file, one row group per episode (the recorder's layout), one
 * episode split over two row groups: every episode is located by binary
 * search, the table reads verify the index. */
static void test_locator_many_row_groups(void)
{
    char *dir = vf_test_tmpdir("scale-loc");
    spec s = {.n = 400, .per_meta_file = 400, .meta_rg = 400, .per_data_file = 400, .per_video_file = 400};
    ep_row *rows = calloc((size_t)s.n, sizeof *rows);
    fill_rows(&s, rows);
    write_dataset(dir, &s, rows, -1);
    vf_dataset *d = open_ds(dir, VF_CHECK_FILES_OFF, 0);
    vf_pq_file *f = NULL;
    if (d) {
        vf_data_span span;
        CHECK_OK(vf_dataset_episode_data(d, 0, &span));
        CHECK_OK(vf_pq_open_path(&f, span.path));
    }
    if (d && f) {
        CHECK_EQ_INT(vf_pq_num_row_groups(f), 400);
        int ok = 1;
        for (size_t i = 0; i < 400 && ok; i++) {
            vf_ds_rg_span *spans = NULL;
            int n = 0;
            ok = vf_ds_locate_row_groups(d, i, f, &spans, &n) == 0 && n == 1 && spans[0].row_group == (int)i &&
                 spans[0].first_row == 0 && spans[0].count == ep_length((int64_t)i) && spans[0].episode_row == 0;
            if (!ok)
                fprintf(stderr, "episode %zu: %s\n", i, vf_last_error());
            free(spans);
        }
        CHECK(ok);
        size_t *all = malloc(400 * sizeof *all);
        for (size_t i = 0; i < 400; i++)
            all[i] = 399 - i;
        const char *cols[] = {"action", "index"};
        vf_ds_table t;
        CHECK_OK(vf_ds_read_table(d, all, 400, cols, 2, VF_DS_VERIFY_INDEX, &t));
        if (t.num_columns == 2) {
            int good = t.rows == rows[399].from + rows[399].length;
            const int64_t *idx = t.columns[1].values;
            for (size_t k = 0; k < 400 && good; k++) {
                const ep_row *e = &rows[399 - k];
                good = idx[t.episode_start[k]] == e->from &&
                       t.episode_start[k + 1] - t.episode_start[k] == e->length &&
                       ((const float *)t.columns[0].values)[t.episode_start[k]] == (float)((double)e->from * 0.5);
            }
            CHECK(good);
        }
        vf_ds_table_free(&t);
        free(all);
    }
    vf_pq_close(f);
    vf_dataset_close(d);
    vf_test_rmtree(dir);
    free(dir);

    /* Row groups that cut episodes: rows of 7 per group, so episodes
     * straddle boundaries and some span two groups. */
    dir = vf_test_tmpdir("scale-loc2");
    write_dataset(dir, &s, rows, -1);
    char *data = vf_path_join(dir, "data/chunk-000/file-000.parquet");
    {
        vf_pq_writer *w;
        CHECK_OK(vf_pq_writer_open(&w, data, NULL));
        int64_t total = rows[399].from + rows[399].length;
        for (int64_t start = 0; start < total; start += 7) {
            int64_t m = VF_MIN(7, total - start);
            int64_t fi[7], ep[7], idx[7], ti[7];
            double act[7], ts[7];
            for (int64_t i = 0; i < m; i++) {
                int64_t g = start + i, e = 0;
                while (e + 1 < 400 && rows[e + 1].from <= g)
                    e++;
                fi[i] = g - rows[e].from;
                ep[i] = e;
                idx[i] = g;
                ti[i] = 0;
                act[i] = (double)g * 0.5;
                ts[i] = (double)fi[i] / 10.0;
            }
            vf_pq_array fl[6] = {double_array("action", act, m), double_array("timestamp", ts, m),
                                 int64_array("frame_index", fi, m), int64_array("episode_index", ep, m),
                                 int64_array("index", idx, m),      int64_array("task_index", ti, m)};
            CHECK_OK(vf_pq_writer_write_row_group(w, fl, 6));
        }
        CHECK_OK(vf_pq_writer_close(w));
    }
    d = open_ds(dir, VF_CHECK_FILES_OFF, 0);
    f = NULL;
    if (d)
        CHECK_OK(vf_pq_open_path(&f, data));
    if (d && f) {
        int ok = 1, split = 0;
        for (size_t i = 0; i < 400 && ok; i++) {
            vf_ds_rg_span *sp = NULL;
            int n = 0;
            ok = vf_ds_locate_row_groups(d, i, f, &sp, &n) == 0 && n >= 1 && n <= 2 &&
                 sp[0].row_group == (int)(rows[i].from / 7) && sp[0].first_row == rows[i].from % 7 &&
                 sp[n - 1].row_group == (int)((rows[i].from + rows[i].length - 1) / 7);
            int64_t covered = 0;
            for (int k = 0; ok && k < n; k++) {
                ok = sp[k].episode_row == covered;
                covered += sp[k].count;
            }
            ok = ok && covered == rows[i].length;
            split += n == 2;
            free(sp);
        }
        CHECK(ok);
        CHECK(split > 10);
    }
    vf_pq_close(f);
    vf_dataset_close(d);
    free(data);
    free(rows);
    vf_test_rmtree(dir);
    free(dir);
}

/* Bad input: episodes out of order inside a file; episodes files whose
 * episodes or global index ranges overlap; a data file whose row groups
 * hold other episodes than the metadata says. */
static void test_bad_input(void)
{
    spec s = {.n = 40, .per_meta_file = 20, .meta_rg = 5, .per_data_file = 40, .per_video_file = 40};
    ep_row *rows = calloc((size_t)s.n, sizeof *rows);
    vf_dataset *d = NULL;

    /* Rows 6 and 7 of the second file swapped (episodes 26, 27): an
     * error naming that file and the episode (the dataset opens, as with
     * every metadata inconsistency). */
    char *dir = vf_test_tmpdir("scale-order");
    fill_rows(&s, rows);
    ep_row t = rows[26];
    rows[26] = rows[27];
    rows[27] = t;
    write_dataset(dir, &s, rows, -1);
    vf_dataset_settings st;
    vf_dataset_defaults(&st);
    d = open_ds(dir, VF_CHECK_FILES_OFF, 0);
    if (d) {
        const vf_problem *p = find_problem(d, "meta/episodes/chunk-000/file-001.parquet", 26, "episode_index");
        CHECK(p && p->severity == VF_SEVERITY_ERROR &&
              strstr(p->message, "episode 26 comes after episode 27 in the same file: rows out of order"));
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);

    /* The second file restarts at episode 15 (overlap with the first). */
    dir = vf_test_tmpdir("scale-overlap");
    fill_rows(&s, rows);
    for (int64_t e = 20; e < 40; e++)
        rows[e].episode -= 5;
    write_dataset(dir, &s, rows, -1);
    d = open_ds(dir, VF_CHECK_FILES_OFF, 0);
    if (d) {
        const vf_problem *p = find_problem(d, "meta/episodes/chunk-000/file-001.parquet", 15, "episode_index");
        CHECK(p && p->severity == VF_SEVERITY_ERROR &&
              strstr(p->message, "episode 15 overlaps the episodes of meta/episodes/chunk-000/file-000.parquet "
                                 "(which ends with episode 19)"));
        /* Only the first row of the overlap is out of order. */
        CHECK(find_problem(d, "meta/episodes/chunk-000/file-001.parquet", 16, "episode_index") == NULL);
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);

    /* Episode numbers fine, but the second file's global index range
     * starts inside the first file's: validation's contiguity error. */
    dir = vf_test_tmpdir("scale-range");
    fill_rows(&s, rows);
    for (int64_t e = 20; e < 40; e++)
        rows[e].from -= 2;
    write_dataset(dir, &s, rows, -1);
    d = open_ds(dir, VF_CHECK_FILES_OFF, 0);
    if (d) {
        const vf_problem *p = find_problem(d, NULL, 20, "dataset_from_index");
        CHECK(p && p->severity == VF_SEVERITY_ERROR &&
              strstr(p->message, "not contiguous: episode starts at 37, expected 39"));
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);

    /* The data file holds episode 31's rows where 30's should be and the
     * other way round; all lengths equal, so the row counts still agree
     * and only the `index` statistics tell. */
    dir = vf_test_tmpdir("scale-rg");
    fill_rows(&s, rows);
    for (int64_t e = 0; e < 40; e++)
        rows[e].length = 2; /* equal lengths: swapped row groups keep the row counts */
    for (int64_t e = 0, from = 0; e < 40; e++, from += 2)
        rows[e].from = from;
    write_dataset(dir, &s, rows, 30);
    d = open_ds(dir, VF_CHECK_FILES_OFF, 0);
    if (d) {
        /* Found at open with the data checks (footer statistics). */
        vf_dataset_close(d);
        vf_dataset_defaults(&st);
        st.check_data_files = 1;
        st.check_files = VF_CHECK_FILES_ALL;
        CHECK_OK(vf_dataset_open(&d, dir, &st));
    }
    if (d) {
        int found30 = 0, found31 = 0;
        for (size_t i = 0; i < vf_dataset_num_problems(d); i++) {
            const vf_problem *p = vf_dataset_problem(d, i);
            if (p->severity != VF_SEVERITY_ERROR || strcmp(p->file, "data/chunk-000/file-000.parquet"))
                continue;
            found30 |= p->episode == 30 && strstr(p->message, "episode 30: row group 30 should hold its rows") &&
                       strstr(p->message, "statistics say 62..63");
            found31 |= p->episode == 31 && strstr(p->message, "episode 31: row group 31") != NULL;
        }
        CHECK(found30 && found31);
        /* And when the rows are read. */
        size_t pos[] = {29, 30};
        const char *cols[] = {"action"};
        vf_ds_table tab;
        CHECK_ERR(vf_ds_read_table(d, pos, 2, cols, 1, VF_DS_VERIFY_INDEX, &tab), VF_ECORRUPT,
                  "file-000.parquet: episode 30: row group 30 should hold its rows");
        vf_dataset_close(d);
    }
    vf_test_rmtree(dir);
    free(dir);
    free(rows);
}

/* File existence: checked at open for a small dataset; above
 * VF_LAZY_FILE_CHECKS files deferred (no stat at all), unless asked. */
static void test_lazy_file_checks(void)
{
    char *dir = vf_test_tmpdir("scale-lazy");
    spec s = {.n = VF_LAZY_FILE_CHECKS + 1, .per_meta_file = 4000, .meta_rg = 4000, .per_data_file = 0,
              .per_video_file = 1};
    ep_row *rows = calloc((size_t)s.n, sizeof *rows);
    fill_rows(&s, rows);
    write_dataset(dir, &s, rows, -1);
    /* 1 data file (absent) + 10,001 mp4 files (absent). */
    vf_dataset *d = open_ds(dir, VF_CHECK_FILES_AUTO, 1);
    if (d) {
        CHECK_EQ_INT(vf_dataset_file_checks(d), VF_FILES_DEFERRED);
        CHECK_EQ_INT(vf_dataset_num_missing_files(d), 0);
        CHECK_EQ_INT(vf_dataset_num_errors(d), 0);
        char *json = NULL;
        CHECK_OK(vf_dataset_info_json(d, 0, &json));
        CHECK(json && strstr(json, "\"file_checks\":\"deferred\""));
        free(json);
        /* A missing file is reported when it is opened. */
        uint8_t *rgb;
        int w, h;
        CHECK_ERR(vf_dataset_read_frame(d, 5, 0, "cam", &rgb, &w, &h), VF_ENOENT,
                  "videos/cam/chunk-000/file-005.mp4");
        vf_dataset_close(d);
    }
    d = open_ds(dir, VF_CHECK_FILES_ALL, 0);
    if (d) {
        CHECK_EQ_INT(vf_dataset_file_checks(d), VF_FILES_CHECKED);
        CHECK_EQ_INT(vf_dataset_num_missing_files(d), VF_LAZY_FILE_CHECKS + 2);
        vf_dataset_close(d);
    }
    /* The same files selected down to 10,000 - 1 episodes: checked. */
    vf_dataset_settings st;
    vf_dataset_defaults(&st);
    int64_t *sel = malloc((VF_LAZY_FILE_CHECKS - 1) * sizeof *sel);
    for (int64_t i = 0; i < VF_LAZY_FILE_CHECKS - 1; i++)
        sel[i] = i;
    st.episodes = sel;
    st.num_episodes = VF_LAZY_FILE_CHECKS - 1;
    d = NULL;
    CHECK_OK(vf_dataset_open(&d, dir, &st));
    if (d) {
        CHECK_EQ_INT(vf_dataset_file_checks(d), VF_FILES_CHECKED);
        CHECK_EQ_INT(vf_dataset_num_missing_files(d), VF_LAZY_FILE_CHECKS);
        vf_dataset_close(d);
    }
    free(sel);
    free(rows);
    vf_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    test_projected_open();
    test_parallel_episodes_files();
    test_locator_many_row_groups();
    test_bad_input();
    test_lazy_file_checks();
    return vf_test_finish("test_dataset_scale");
}
