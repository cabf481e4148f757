#define _POSIX_C_SOURCE 200809L /* truncate */
/*
 * test_lazy_table.c: a loader reads only the table rows of the episodes it
 * emits. make-sample writes one row group per episode (the recorder's
 * layout), so the row groups a rank decodes can be counted: in stream,
 * pool and map mode at world size 4, each rank decodes exactly the row
 * groups of the episodes its plan touches (from vf_plan_consumer_tasks /
 * its own positions; map mode the whole table when it fits and the rank
 * draws most of it), none at open, and the ranks together about the
 * dataset once; a bounded row cache evicts and re-reads, with the same
 * values; a corrupt data file fails the batch that needs it, naming the
 * file and episode, not the open.
 */
#include "test_loader_helpers.h"

#include <stdio.h>
#include <unistd.h>

#include "vlafeed/make_sample.h"

static size_t touched_episodes(vf_dataset *d, const vf_loader *l, const int64_t *positions, int64_t n)
{
    (void)l;
    size_t ne = vf_dataset_num_episodes(d);
    int64_t *start = calloc(ne + 1, sizeof *start);
    for (size_t e = 0; e < ne; e++)
        start[e + 1] = start[e] + vf_dataset_episode(d, e)->length;
    uint8_t *seen = calloc(ne, 1);
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t e = 0;
        while (e + 1 < ne && start[e + 1] <= positions[i])
            e++;
        if (!seen[e]) {
            seen[e] = 1;
            k++;
        }
    }
    free(seen);
    free(start);
    return k;
}

static void run_mode(vf_dataset *d, vf_mode mode)
{
    const char *keys[] = {"index", "action"};
    size_t ne = vf_dataset_num_episodes(d);
    uint64_t total_rg = 0;
    for (int rank = 0; rank < 4; rank++) {
        vf_loader_settings ls;
        vf_loader_defaults(&ls);
        ls.mode = mode;
        ls.batch_size = 8;
        ls.seed = 3;
        ls.rank = rank;
        ls.world_size = 4;
        ls.threads = 2;
        ls.episode_pool_size = 3;
        ls.sample.keys = keys;
        ls.sample.num_keys = 2;
        vf_loader *l;
        CHECK_OK(vf_loader_open(&l, d, &ls));
        vf_loader_stats st;
        vf_loader_get_stats(l, &st);
        if (mode == VF_MODE_MAP)
            CHECK_EQ_INT(st.table_row_groups, 0); /* map loaders start on the first next() */
        int64_t *seen = malloc(100000 * sizeof *seen);
        int64_t n = 0;
        vf_batch *b;
        while (vf_loader_next(l, &b) == 0) {
            const vf_column *idx = vf_batch_find(b, "index");
            const int64_t *pos = vf_batch_positions(b);
            for (size_t i = 0; i < vf_batch_size(b); i++) {
                /* make-sample: index == position when every episode is selected */
                CHECK_EQ_INT(((const int64_t *)idx->data)[i], pos[i]);
                seen[n++] = pos[i];
            }
            vf_batch_release(b);
        }
        size_t mine = touched_episodes(d, l, seen, n);
        vf_loader_get_stats(l, &st);
        /* One row group per episode: exactly the episodes this rank emits.
         * Map mode, when the table fits in the row cache and the rank
         * draws at least 4 samples per episode (as here), reads the whole
         * table in file order: every episode once (rows.c, table_fits). */
        if (mode == VF_MODE_MAP) {
            CHECK(mine >= ne - 2);
            CHECK_EQ_INT(st.table_row_groups, ne);
            CHECK_EQ_INT(st.table_episodes, ne);
        } else {
            CHECK_EQ_INT(st.table_row_groups, mine);
            CHECK_EQ_INT(st.table_episodes, mine);
        }
        if (mode != VF_MODE_MAP)
            CHECK(mine < ne); /* a share of the dataset */
        total_rg += st.table_row_groups;
        free(seen);
        vf_loader_close(l);
    }
    /* The ranks together read about the dataset once (episodes cut between
     * two ranks' slices are read by both; map mode's random positions touch
     * most episodes on every rank, its share of rows is what scales). */
    if (mode != VF_MODE_MAP)
        CHECK(total_rg <= ne + 4 * 3);
}

static void test_bounded_cache(vf_dataset *d)
{
    const char *keys[] = {"index", "action", "observation.state"};
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_MAP;
    ls.batch_size = 16;
    ls.seed = 9;
    ls.threads = 1;
    ls.table_cache_bytes = 4096; /* about one episode */
    ls.sample.keys = keys;
    ls.sample.num_keys = 3;
    vf_loader *l;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    vf_batch *b;
    int64_t checked = 0;
    while (vf_loader_next(l, &b) == 0) {
        const vf_column *idx = vf_batch_find(b, "index");
        const vf_column *act = vf_batch_find(b, "action");
        const int64_t *pos = vf_batch_positions(b);
        for (size_t i = 0; i < vf_batch_size(b); i++) {
            CHECK_EQ_INT(((const int64_t *)idx->data)[i], pos[i]);
            /* frame k of episode e: action[d] = vf_make_sample_action(e, k, d) */
            int64_t e = 0, start = 0;
            while (start + vf_dataset_episode(d, (size_t)e)->length <= pos[i]) {
                start += vf_dataset_episode(d, (size_t)e)->length;
                e++;
            }
            float want = vf_make_sample_action((int)e, (int)(pos[i] - start), 1);
            CHECK(((const float *)act->data)[i * (size_t)act->shape[1] + 1] == want);
            checked++;
        }
        vf_batch_release(b);
    }
    vf_loader_stats st;
    vf_loader_get_stats(l, &st);
    CHECK(st.table_evictions > 0);
    CHECK(st.table_episodes > vf_dataset_num_episodes(d)); /* re-read after eviction */
    CHECK(st.table_cache_bytes <= 4096 * 4);              /* bounded (a batch's episodes are pinned) */
    CHECK(checked > 100);
    vf_loader_close(l);
}

static void test_corrupt_data_file(const char *root)
{
    /* Truncate one data file: the open succeeds (no table read), the batch
     * that needs it fails naming the file. */
    char *data = vf_path_join(root, "data/chunk-000/file-000.parquet");
    FILE *f = fopen(data, "r+b");
    CHECK(f != NULL);
    if (f) {
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fclose(f);
        CHECK(truncate(data, size / 2) == 0);
    }
    vf_dataset_settings ds;
    vf_dataset_defaults(&ds);
    ds.check_files = 0;
    vf_dataset *d;
    CHECK_OK(vf_dataset_open(&d, root, &ds));
    const char *keys[] = {"index"};
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_STREAM;
    ls.shuffle = 0;
    ls.batch_size = 8;
    ls.threads = 1;
    ls.sample.keys = keys;
    ls.sample.num_keys = 1;
    vf_loader *l;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    vf_batch *b = NULL;
    int r = vf_loader_next(l, &b);
    CHECK(r < 0);
    CHECK(strstr(vf_last_error(), "file-000.parquet") != NULL);
    if (b)
        vf_batch_release(b);
    vf_loader_close(l);
    vf_dataset_close(d);
    free(data);
}

int main(void)
{
    char *root = make_dataset("lazy", 24, 30, 0.03, NULL);
    vf_dataset *d = open_dataset(root, NULL, 0);
    run_mode(d, VF_MODE_STREAM);
    run_mode(d, VF_MODE_POOL);
    run_mode(d, VF_MODE_MAP);
    test_bounded_cache(d);
    vf_dataset_close(d);
    test_corrupt_data_file(root);
    remove_dataset(root);
    return vf_test_finish("test_lazy_table");
}
