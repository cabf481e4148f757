/*
 * test_table_disk_loader.c: map mode through the table cache on disk
 * (rows.c, table_cache.c) with several engine threads: a row cache far
 * below the table, so that every batch misses; the first loader builds the
 * cache files while its threads race for the same data files, the second
 * reads every episode back from them. Every value is checked against
 * make-sample's ground truth (state, action, index, episode and frame
 * index), every position delivered once. Also run under TSan (Makefile
 * TSAN_TESTS): the threads meet on the per-file states and the row cache.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_loader_helpers.h"
#include "vlafeed/dataset.h"

static vf_make_sample_settings g_ms;

static const char *keys[] = {"observation.state", "action", "index", "episode_index", "frame_index"};

typedef struct run_result {
    int64_t count, bad;
    uint8_t *seen;
    vf_loader_stats st;
} run_result;

static void check_batch(const vf_dataset *d, const vf_batch *b, run_result *res, int64_t npos)
{
    const vf_column *st = vf_batch_find(b, "observation.state"), *ac = vf_batch_find(b, "action"),
                    *ei = vf_batch_find(b, "episode_index"), *fi = vf_batch_find(b, "frame_index"),
                    *ix = vf_batch_find(b, "index");
    if (!st || !ac || !ei || !fi || !ix) {
        res->bad++;
        return;
    }
    int dim = g_ms.state_dim;
    for (size_t i = 0; i < vf_batch_size(b); i++) {
        int64_t p = vf_batch_positions(b)[i], ep, fr;
        if (p < 0 || p >= npos || res->seen[p]++) {
            res->bad++;
            continue;
        }
        res->count++;
        locate(d, p, &ep, &fr);
        if (((const int64_t *)ei->data)[i] != ep || ((const int64_t *)fi->data)[i] != fr ||
            ((const int64_t *)ix->data)[i] != p)
            res->bad++;
        for (int k = 0; k < dim; k++)
            if (((const float *)st->data)[i * (size_t)dim + (size_t)k] != vf_make_sample_state((int)ep, (int)fr, k) ||
                ((const float *)ac->data)[i * (size_t)dim + (size_t)k] != vf_make_sample_action((int)ep, (int)fr, k))
                res->bad++;
    }
}

static void run(vf_dataset *d, int disk, int threads, run_result *res)
{
    memset(res, 0, sizeof *res);
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_MAP;
    ls.seed = 9;
    ls.threads = threads;
    ls.batch_size = 8;
    ls.table_cache_bytes = 1024; /* a few rows: every batch misses */
    ls.table_disk_cache = disk;
    ls.sample.keys = keys;
    ls.sample.num_keys = sizeof keys / sizeof *keys;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &ls));
    if (!l)
        return;
    int64_t npos = vf_loader_num_positions(l);
    res->seen = vf_calloc((size_t)npos, 1);
    vf_batch *b = NULL;
    int r;
    while ((r = vf_loader_next(l, &b)) == 0) {
        check_batch(d, b, res, npos);
        vf_batch_release(b);
        b = NULL;
    }
    CHECK_EQ_INT(r, VF_EOF);
    CHECK_EQ_INT(res->count, npos);
    vf_loader_get_stats(l, &res->st);
    vf_loader_close(l);
    free(res->seen);
}

int main(void)
{
    char *root = make_dataset("tdisk", 24, 30, 0.03, &g_ms);
    char *cache = vf_test_tmpdir("tdisk-cache");
    setenv("VF_CACHE_DIR", cache, 1);
    vf_dataset *d = open_dataset(root, NULL, 0);
    size_t nfiles = vf_dataset_num_data_files(d);
    run_result a, b, c;
    /* Off: the Parquet path, the reference for the counters. */
    run(d, 0, 4, &a);
    CHECK_EQ_INT(a.bad, 0);
    CHECK_EQ_INT((int64_t)a.st.table_disk_episodes, 0);
    /* On, cache empty: threads race to build; each data file is built once
     * (a thread that needs a file another is preparing waits for it). */
    run(d, 1, 4, &b);
    CHECK_EQ_INT(b.bad, 0);
    CHECK_EQ_INT((int64_t)b.st.table_disk_builds, (int64_t)nfiles);
    CHECK_EQ_INT((int64_t)b.st.table_disk_files, (int64_t)nfiles);
    CHECK(b.st.table_disk_episodes > 0);
    CHECK_EQ_INT((int64_t)b.st.table_reads, (int64_t)nfiles); /* the builds, nothing else */
    /* Again: nothing decoded, every episode read back. */
    run(d, 1, 4, &c);
    CHECK_EQ_INT(c.bad, 0);
    CHECK_EQ_INT((int64_t)c.st.table_disk_builds, 0);
    CHECK_EQ_INT((int64_t)c.st.table_reads, 0);
    CHECK_EQ_INT((int64_t)c.st.table_disk_episodes, (int64_t)c.st.table_episodes);
    /* One thread, same answer. */
    run(d, 1, 1, &c);
    CHECK_EQ_INT(c.bad, 0);
    CHECK_EQ_INT((int64_t)c.st.table_reads, 0);
    vf_dataset_close(d);
    vf_test_rmtree(cache);
    free(cache);
    remove_dataset(root);
    return vf_test_finish("test_table_disk_loader");
}
