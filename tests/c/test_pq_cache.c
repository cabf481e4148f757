/*
 * test_pq_cache.c: the table reads map mode relies on (issue 26, part 3).
 *
 *  - Page index (src/parquet/page.c): a file with one big row group of
 *    many small pages, written by vlafeed's writer in v1 and v2 pages,
 *    with and without dictionaries, a plain int64 column and a list
 *    column (repeated: its v1 pages tell no rows in their headers). Random
 *    row ranges read through vf_pq_read_field_rows equal the whole
 *    chunk's rows, decode at most the pages the range spans once the
 *    index is built (built once: vf_pq_memory_bytes grows on the first
 *    read only), also from four threads at once on one open file; the
 *    kept dictionary is dropped and decoded again.
 *  - Data file cache (src/dataset/pq_cache.c): hits, misses, eviction by
 *    count and by bytes, entries in use never closed (a read beyond the
 *    bound is served uncached), errors; table reads through the cache
 *    equal uncached ones on a dataset of several multi-row-group files.
 */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "parquet/parquet.h"
#include "vlafeed/make_sample.h"

#define ROWS 60000
#define WIDTH 3

/* id: int64 = row; v: list<float> of WIDTH values row * WIDTH + k. */
static void write_pages_file(const char *path, int version, int dictionary)
{
    int64_t *ids = malloc(ROWS * sizeof *ids);
    float *vals = malloc((size_t)ROWS * WIDTH * sizeof *vals);
    int64_t *offs = malloc((ROWS + 1) * sizeof *offs);
    for (int64_t i = 0; i < ROWS; i++) {
        ids[i] = i;
        offs[i] = i * WIDTH;
        for (int k = 0; k < WIDTH; k++)
            vals[i * WIDTH + k] = (float)(i * WIDTH + k);
    }
    offs[ROWS] = (int64_t)ROWS * WIDTH;
    vf_pq_array child, fields[2];
    memset(&child, 0, sizeof child);
    memset(fields, 0, sizeof fields);
    fields[0].type = VF_PQ_T_INT64;
    fields[0].name = "id";
    fields[0].length = ROWS;
    fields[0].values = ids;
    child.type = VF_PQ_T_FLOAT;
    child.name = "element";
    child.length = (int64_t)ROWS * WIDTH;
    child.values = vals;
    fields[1].type = VF_PQ_T_LIST;
    fields[1].name = "v";
    fields[1].length = ROWS;
    fields[1].offsets = offs;
    fields[1].num_children = 1;
    fields[1].children = &child;
    vf_pq_writer_settings s;
    vf_pq_writer_defaults(&s);
    s.codec = VF_PQ_UNCOMPRESSED; /* chunks well above the page index's minimum size */
    s.data_page_version = version;
    s.dictionary = dictionary;
    s.page_size = 16 * 1024;
    vf_pq_writer *w;
    CHECK_OK(vf_pq_writer_open(&w, path, &s));
    CHECK_OK(vf_pq_writer_write_row_group(w, fields, 2));
    CHECK_OK(vf_pq_writer_close(w));
    free(ids);
    free(vals);
    free(offs);
}

/* Reads rows [lo, lo + n) of both fields and checks every value; returns
 * the data pages decoded. */
static int64_t check_range(vf_pq_file *f, int64_t lo, int64_t n, int *bad)
{
    int64_t decoded = 0;
    vf_pq_array a;
    vf_pq_page_counts pages = {0, 0};
    if (vf_pq_read_field_rows(f, 0, 0, lo, n, &a, &pages) < 0) {
        fprintf(stderr, "read id [%lld, +%lld): %s\n", (long long)lo, (long long)n, vf_last_error());
        ++*bad;
        return 0;
    }
    decoded += pages.decoded;
    if (a.length != n)
        ++*bad;
    for (int64_t i = 0; i < n && i < a.length; i++)
        *bad += ((const int64_t *)a.values)[i] != lo + i;
    vf_pq_array_free(&a);
    if (vf_pq_read_field_rows(f, 0, 1, lo, n, &a, &pages) < 0) {
        fprintf(stderr, "read v [%lld, +%lld): %s\n", (long long)lo, (long long)n, vf_last_error());
        ++*bad;
        return decoded;
    }
    decoded += pages.decoded;
    if (a.length != n || a.type != VF_PQ_T_LIST || a.children[0].length != n * WIDTH)
        ++*bad;
    for (int64_t i = 0; !*bad && i < n; i++) {
        *bad += a.offsets[i + 1] - a.offsets[i] != WIDTH;
        for (int k = 0; k < WIDTH; k++)
            *bad += ((const float *)a.children[0].values)[a.offsets[i] + k] != (float)((lo + i) * WIDTH + k);
    }
    vf_pq_array_free(&a);
    return decoded;
}

typedef struct reader_arg {
    vf_pq_file *f;
    uint64_t seed;
    int bad;
} reader_arg;

static void *reader_main(void *p)
{
    reader_arg *a = p;
    uint64_t x = a->seed;
    for (int i = 0; i < 40; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int64_t lo = (int64_t)((x >> 33) % (ROWS - 300));
        check_range(a->f, lo, 1 + (int64_t)((x >> 13) % 250), &a->bad);
    }
    return NULL;
}

static void test_page_index(const char *dir)
{
    for (int version = 1; version <= 2; version++)
        for (int dictionary = 0; dictionary <= 1; dictionary++) {
            char name[64];
            snprintf(name, sizeof name, "pages-v%d-d%d.parquet", version, dictionary);
            char *path = vf_path_join(dir, name);
            write_pages_file(path, version, dictionary);
            vf_pq_file *f;
            CHECK_OK(vf_pq_open_path(&f, path));
            vf_pq_chunk_info ci;
            CHECK_OK(vf_pq_column_chunk(f, 0, 1, &ci));
            CHECK(ci.compressed_size >= VF_PQ_PAGE_INDEX_MIN_BYTES); /* the index applies */
            int bad = 0;
            size_t before = vf_pq_memory_bytes(f);
            /* From row 0 no index is needed; past it the first read builds it. */
            check_range(f, 0, 10, &bad);
            CHECK_EQ_INT(vf_pq_memory_bytes(f), before);
            int64_t first = check_range(f, 40000, 5, &bad);
            size_t built = vf_pq_memory_bytes(f);
            CHECK(built > before);
            CHECK(first <= 6);
            /* Later reads: only the pages of the range (a row may straddle
             * two pages: at most 2 per column for a few rows). */
            int64_t worst = 0;
            const int64_t starts[] = {1, 999, 16383, 30000, 45678, ROWS - 7};
            for (size_t i = 0; i < VF_ARRAY_LEN(starts); i++)
                worst = VF_MAX(worst, check_range(f, starts[i], 5, &bad));
            CHECK(worst <= 4);
            /* A range over many pages, and the very end. */
            check_range(f, 12345, 20000, &bad);
            check_range(f, ROWS - 1, 1, &bad);
            CHECK_EQ_INT(vf_pq_memory_bytes(f), built); /* built once */
            CHECK_EQ_INT(bad, 0);
            /* The index keeps the decoded dictionary of a dictionary-encoded
             * chunk (counted in the bytes); dropping it frees exactly that,
             * and reads decode it again, still right. */
            size_t dropped = vf_pq_drop_kept_dictionaries(f);
            CHECK(dictionary ? dropped > 0 : dropped == 0);
            CHECK_EQ_INT(vf_pq_memory_bytes(f), built - dropped);
            CHECK_EQ_INT(vf_pq_drop_kept_dictionaries(f), 0);
            check_range(f, 33333, 40, &bad);
            check_range(f, 7, 3, &bad);
            CHECK_EQ_INT(bad, 0);
            CHECK_EQ_INT(vf_pq_memory_bytes(f), built);
            vf_pq_close(f);

            /* Four threads on one freshly opened file: the index is built
             * concurrently, once, and every read is right. */
            CHECK_OK(vf_pq_open_path(&f, path));
            pthread_t t[4];
            reader_arg args[4];
            for (int i = 0; i < 4; i++) {
                args[i] = (reader_arg){f, 77u + (uint64_t)i, 0};
                pthread_create(&t[i], NULL, reader_main, &args[i]);
            }
            for (int i = 0; i < 4; i++) {
                pthread_join(t[i], NULL);
                CHECK_EQ_INT(args[i].bad, 0);
            }
            vf_pq_close(f);
            free(path);
        }
}

static void same_table(const vf_ds_table *a, const vf_ds_table *b, int *bad)
{
    if (a->rows != b->rows || a->num_columns != b->num_columns) {
        ++*bad;
        return;
    }
    for (size_t c = 0; c < a->num_columns; c++) {
        const vf_ds_column *x = &a->columns[c], *y = &b->columns[c];
        size_t elem = x->type == VF_DS_F32 ? sizeof(float) : sizeof(int64_t);
        if (x->type == VF_DS_STRING)
            continue;
        *bad += memcmp(x->values, y->values, (size_t)x->rows * (size_t)x->width * elem) != 0;
    }
}

static void test_data_file_cache(const char *dir)
{
    char *root = vf_path_join(dir, "ds");
    vf_make_sample_settings ms;
    vf_make_sample_defaults(&ms);
    ms.num_episodes = 12;
    ms.num_cameras = 1;
    ms.width = 64;
    ms.height = 64;
    ms.codec = "h264";
    ms.min_length = 20;
    ms.max_length = 40;
    ms.max_data_mb = 0.01; /* several data files, each of several row groups (one per episode) */
    CHECK_OK(vf_make_sample(root, &ms));
    vf_dataset *d;
    CHECK_OK(vf_dataset_open(&d, root, NULL));
    size_t nfiles = vf_dataset_num_data_files(d);
    CHECK(nfiles >= 3);

    vf_ds_pq_cache *c;
    CHECK_OK(vf_ds_pq_cache_open(&c, d, 0, 2, NULL, 0));
    vf_ds_pq_cache_stats st;
    vf_pq_file *a, *b, *e, *g;
    CHECK_OK(vf_ds_pq_cache_get(c, 0, &a));
    CHECK_OK(vf_ds_pq_cache_get(c, 0, &b));
    CHECK(a == b); /* one open file, shared */
    CHECK(vf_pq_num_row_groups(a) > 1);
    vf_ds_pq_cache_release(c, a);
    vf_ds_pq_cache_release(c, b);
    vf_ds_pq_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.misses, 1);
    CHECK_EQ_INT(st.hits, 1);
    CHECK_EQ_INT(st.entries, 1);
    CHECK(st.bytes >= vf_pq_memory_bytes(a) && st.bytes > 0);
    /* Two entries at most: the least recently used goes. */
    CHECK_OK(vf_ds_pq_cache_get(c, 1, &a));
    vf_ds_pq_cache_release(c, a);
    CHECK_OK(vf_ds_pq_cache_get(c, 0, &a)); /* 0 is now more recent than 1 */
    vf_ds_pq_cache_release(c, a);
    CHECK_OK(vf_ds_pq_cache_get(c, 2, &a)); /* evicts 1 */
    vf_ds_pq_cache_release(c, a);
    vf_ds_pq_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.evictions, 1);
    CHECK_EQ_INT(st.entries, 2);
    CHECK_OK(vf_ds_pq_cache_get(c, 0, &a)); /* still there: a hit */
    vf_ds_pq_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.misses, 3);
    CHECK_EQ_INT(st.hits, 3);
    /* Entries in use are never closed: a third file while two are held is
     * served uncached and closed on release. */
    CHECK_OK(vf_ds_pq_cache_get(c, 2, &b));
    CHECK_OK(vf_ds_pq_cache_get(c, 1, &e));
    vf_ds_pq_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.uncached, 1);
    CHECK_EQ_INT(st.entries, 2);
    CHECK_EQ_INT(vf_pq_num_rows(e) > 0, 1); /* usable */
    vf_ds_pq_cache_release(c, e);
    vf_ds_pq_cache_release(c, b);
    vf_ds_pq_cache_release(c, a);
    CHECK_ERR(vf_ds_pq_cache_get(c, nfiles, &g), VF_ERANGE, "out of range");
    vf_ds_pq_cache_close(c);

    /* A byte bound smaller than one file: every entry goes once released. */
    CHECK_OK(vf_ds_pq_cache_open(&c, d, 1, 0, NULL, 0));
    CHECK_OK(vf_ds_pq_cache_get(c, 0, &a));
    vf_ds_pq_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.entries, 1); /* held: kept above the bound */
    vf_ds_pq_cache_release(c, a);
    vf_ds_pq_cache_get_stats(c, &st);
    CHECK_EQ_INT(st.entries, 0);
    CHECK_EQ_INT(st.bytes, 0);
    vf_ds_pq_cache_close(c);

    /* Table reads through a small cache equal uncached ones, in any order
     * of episodes over the files, with the row counts and row-group ends. */
    CHECK_OK(vf_ds_pq_cache_open(&c, d, 0, 2, NULL, 0));
    const char *cols[] = {"observation.state", "action", "index", "task_index"};
    size_t ne = vf_dataset_num_episodes(d);
    int bad = 0;
    for (int round = 0; round < 6; round++) {
        size_t pos[5];
        for (size_t i = 0; i < 5; i++)
            pos[i] = (size_t)(round * 7 + (int)i * 5) % ne;
        vf_ds_table t1, t2;
        CHECK_OK(vf_ds_read_table_cached(d, c, pos, 5, cols, 4, VF_DS_VERIFY_INDEX, &t1));
        CHECK_OK(vf_ds_read_table(d, pos, 5, cols, 4, VF_DS_VERIFY_INDEX, &t2));
        same_table(&t1, &t2, &bad);
        vf_ds_table_free(&t1);
        vf_ds_table_free(&t2);
    }
    CHECK_EQ_INT(bad, 0);
    for (size_t file = 0; file < nfiles; file++) {
        int64_t *e1, *e2;
        int n1, n2;
        CHECK_OK(vf_ds_data_file_row_groups_cached(d, c, file, &e1, &n1));
        CHECK_OK(vf_ds_data_file_row_groups(d, file, &e2, &n2));
        CHECK(n1 == n2 && n1 > 0 && memcmp(e1, e2, (size_t)n1 * sizeof *e1) == 0);
        free(e1);
        free(e2);
    }
    vf_ds_pq_cache_get_stats(c, &st);
    CHECK(st.entries <= 2 && st.misses >= nfiles);
    /* The same read again hits the file it just used. */
    size_t one = 0;
    vf_ds_table t1;
    vf_ds_pq_cache_stats st1, st2;
    CHECK_OK(vf_ds_read_table_cached(d, c, &one, 1, cols, 4, VF_DS_VERIFY_INDEX, &t1));
    vf_ds_table_free(&t1);
    vf_ds_pq_cache_get_stats(c, &st1);
    CHECK_OK(vf_ds_read_table_cached(d, c, &one, 1, cols, 4, VF_DS_VERIFY_INDEX, &t1));
    vf_ds_table_free(&t1);
    vf_ds_pq_cache_get_stats(c, &st2);
    CHECK_EQ_INT(st2.hits, st1.hits + 1);
    CHECK_EQ_INT(st2.misses, st1.misses);
    vf_ds_pq_cache_close(c);

    /* A projected cache keeps the footer entries of its columns only (and
     * index, episode_index): less memory, the same rows; a column outside
     * it is refused by name. */
    vf_ds_pq_cache *full, *proj;
    const char *some[] = {"action", "task_index"};
    CHECK_OK(vf_ds_pq_cache_open(&full, d, 0, 0, NULL, 0));
    CHECK_OK(vf_ds_pq_cache_open(&proj, d, 0, 0, some, 2));
    CHECK_OK(vf_ds_pq_cache_get(full, 0, &a));
    CHECK_OK(vf_ds_pq_cache_get(proj, 0, &b));
    CHECK(vf_pq_memory_bytes(b) < vf_pq_memory_bytes(a));
    vf_ds_pq_cache_release(full, a);
    vf_ds_pq_cache_release(proj, b);
    size_t pos3[3] = {0, ne / 2, ne - 1};
    vf_ds_table t2;
    CHECK_OK(vf_ds_read_table_cached(d, proj, pos3, 3, cols + 1, 3, VF_DS_VERIFY_INDEX, &t1));
    CHECK_OK(vf_ds_read_table(d, pos3, 3, cols + 1, 3, VF_DS_VERIFY_INDEX, &t2));
    bad = 0;
    same_table(&t1, &t2, &bad);
    CHECK_EQ_INT(bad, 0);
    vf_ds_table_free(&t1);
    vf_ds_table_free(&t2);
    const char *outside[] = {"observation.state"};
    CHECK_ERR(vf_ds_read_table_cached(d, proj, pos3, 1, outside, 1, 0, &t1), VF_EINVAL, "observation.state");
    vf_ds_pq_cache_close(full);
    vf_ds_pq_cache_close(proj);
    vf_dataset_close(d);
    free(root);
}

int main(void)
{
    char *dir = vf_test_tmpdir("pq_cache");
    test_page_index(dir);
    test_data_file_cache(dir);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_pq_cache");
}
