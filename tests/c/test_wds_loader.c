/*
 * test_wds_loader.c: the shard loader end to end in C (so ASan/UBSan see
 * loader.c): shards written with libarchive's writer (each sample a .npy
 * holding its id, a .cls and a .txt), a manifest with stems. Checks exact
 * coverage over 2 ranks x 2 consumers with a shuffle buffer, values (the
 * npy column carries the sample id, the cls column too), exact resume
 * from a state taken after every batch, and bad input: a missing shard
 * and a short manifest count, raised with the shard named or skipped and
 * counted.
 */
#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "wds/wds.h"

#define SHARDS 4
static const int COUNTS[SHARDS] = {5, 2, 7, 4};
#define TOTAL 18

static void add_member(struct archive *a, const char *name, const void *data, size_t len)
{
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, name);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, (la_int64_t)len);
    archive_write_header(a, e);
    archive_write_data(a, data, len);
    archive_entry_free(e);
}

/* A .npy v1.0 of one little-endian int64. */
static size_t npy_int64(uint8_t *out, int64_t v)
{
    const char *header = "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }";
    memset(out, ' ', 128);
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = 118;
    out[9] = 0;
    memcpy(out + 10, header, strlen(header));
    out[127] = '\n';
    memcpy(out + 128, &v, 8);
    return 136;
}

static void write_set(const char *dir, const int *counts_in_manifest)
{
    int id = 0;
    for (int s = 0; s < SHARDS; s++) {
        char path[512];
        snprintf(path, sizeof path, "%s/shard_%06d.tar", dir, s);
        struct archive *a = archive_write_new();
        archive_write_set_format_pax_restricted(a);
        archive_write_open_filename(a, path);
        for (int i = 0; i < COUNTS[s]; i++, id++) {
            char name[64], text[32];
            uint8_t npy[136];
            snprintf(name, sizeof name, "key%03d.id.npy", id);
            add_member(a, name, npy, npy_int64(npy, id));
            snprintf(name, sizeof name, "key%03d.cls", id);
            snprintf(text, sizeof text, "%d\n", id * 10);
            add_member(a, name, text, strlen(text));
            snprintf(name, sizeof name, "key%03d.txt", id);
            add_member(a, name, "hello", 5);
        }
        archive_write_close(a);
        archive_write_free(a);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/manifest.jsonl", dir);
    FILE *f = fopen(path, "w");
    for (int s = 0; s < SHARDS; s++)
        fprintf(f, "%s{\"shard\": \"shard_%06d\", \"num_sequences\": %d}", s ? "\n" : "", s, counts_in_manifest[s]);
    fclose(f);
}

/* Runs a loader to its epoch's end, appending the ids it yields; returns the batch count or -1. */
static int drain(vf_wds_loader *l, int *ids, int *n)
{
    int batches = 0;
    vf_wds_batch *b;
    int r;
    while ((r = vf_wds_loader_next(l, &b)) == 0) {
        const vf_wds_column *id = NULL, *cls = NULL, *txt = NULL;
        for (size_t c = 0; c < b->num_columns; c++) {
            if (!strcmp(b->columns[c].name, "id.npy"))
                id = &b->columns[c];
            if (!strcmp(b->columns[c].name, "cls"))
                cls = &b->columns[c];
            if (!strcmp(b->columns[c].name, "txt"))
                txt = &b->columns[c];
        }
        CHECK(id && cls && txt && id->type == VF_COL_INT64 && id->ndim == 2 && id->shape[1] == 1);
        CHECK(txt && txt->type == VF_WDS_BYTES);
        for (size_t i = 0; id && cls && i < b->size; i++) {
            int64_t v = ((int64_t *)id->data)[i], c = ((int64_t *)cls->data)[i];
            char key[16];
            snprintf(key, sizeof key, "key%03d", (int)v);
            CHECK(c == v * 10 && !strcmp(b->keys[i], key));
            CHECK(txt->item_sizes[i] == 5 && !memcmp(txt->items[i], "hello", 5));
            ids[(*n)++] = (int)v;
        }
        vf_wds_batch_free(b);
        batches++;
    }
    return r == VF_EOF ? batches : -1;
}

static void settings(vf_wds_loader_settings *s, int rank)
{
    vf_wds_loader_defaults(s);
    s->batch_size = 2;
    s->seed = 9;
    s->world_size = 2;
    s->rank = rank;
    s->num_consumers = 2;
    s->shuffle_buffer = 3;
    s->threads = 2;
}

static void test_coverage_and_resume(const char *manifest)
{
    int full[2][64], nfull[2] = {0, 0}, seen[TOTAL] = {0};
    for (int rank = 0; rank < 2; rank++) {
        vf_wds_loader_settings s;
        settings(&s, rank);
        vf_wds_loader *l = NULL;
        CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
        if (!l)
            return;
        CHECK(drain(l, full[rank], &nfull[rank]) > 0);
        CHECK_EQ_INT(nfull[rank], TOTAL / 2);
        for (int i = 0; i < nfull[rank]; i++)
            seen[full[rank][i]]++;
        vf_wds_loader_close(l);
    }
    for (int i = 0; i < TOTAL; i++)
        CHECK_EQ_INT(seen[i], 1);
    /* a state after k batches of rank 0 resumes rank 1 exactly */
    for (int k = 0; k <= 5; k++) {
        vf_wds_loader_settings s;
        settings(&s, 0);
        vf_wds_loader *l = NULL;
        CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
        if (!l)
            return;
        vf_wds_batch *b;
        for (int i = 0; i < k; i++) {
            CHECK_OK(vf_wds_loader_next(l, &b));
            vf_wds_batch_free(b);
        }
        vf_loader_state st;
        CHECK_OK(vf_wds_loader_get_state(l, &st));
        vf_wds_loader_close(l);
        for (int rank = 0; rank < 2; rank++) {
            vf_wds_loader_settings r;
            settings(&r, rank);
            r.resume = &st;
            CHECK_OK(vf_wds_loader_open(&l, manifest, &r));
            int got[64], n = 0;
            CHECK(l && drain(l, got, &n) >= 0);
            int skip = nfull[rank] - n;
            CHECK(skip == 2 * k || (k == 5 && n == 0));
            for (int i = 0; i < n && skip >= 0; i++)
                CHECK_EQ_INT(got[i], full[rank][skip + i]);
            vf_wds_stats stats;
            vf_wds_loader_stats(l, &stats);
            CHECK_EQ_INT(stats.samples_read, n);
            vf_wds_loader_close(l);
        }
    }
}

/* Elastic: a state of 2 ranks x 2 consumers x batch 2 after 2 batches resumes on 1 rank x 1 consumer x
 * batch 3; the old deliveries plus the new cover the epoch exactly once (18 samples: no padding). */
static void test_elastic(const char *manifest)
{
    int seen[TOTAL] = {0};
    vf_loader_state st;
    memset(&st, 0, sizeof st);
    for (int rank = 0; rank < 2; rank++) {
        vf_wds_loader_settings s;
        settings(&s, rank);
        vf_wds_loader *l = NULL;
        CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
        if (!l)
            return;
        for (int i = 0; i < 2; i++) {
            vf_wds_batch *b;
            CHECK_OK(vf_wds_loader_next(l, &b));
            for (size_t j = 0; b && j < b->size; j++)
                seen[atoi(b->keys[j] + 3)]++;
            vf_wds_batch_free(b);
        }
        if (rank == 0)
            CHECK_OK(vf_wds_loader_get_state(l, &st));
        vf_wds_loader_close(l);
    }
    CHECK_EQ_INT(st.samples_consumed, 8);
    vf_wds_loader_settings s;
    settings(&s, 0);
    s.world_size = 1;
    s.num_consumers = 1;
    s.batch_size = 3;
    s.resume = &st;
    vf_wds_loader *l = NULL;
    CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
    int ids[64], n = 0;
    CHECK(l && drain(l, ids, &n) > 0);
    CHECK_EQ_INT(n, TOTAL - 8);
    for (int i = 0; i < n; i++)
        seen[ids[i]]++;
    for (int i = 0; i < TOTAL; i++)
        CHECK_EQ_INT(seen[i], 1);
    vf_loader_state after;
    CHECK(l && vf_wds_loader_get_state(l, &after) == 0 && after.num_ranges > 0 && after.samples_consumed == n);
    vf_wds_loader_close(l);
}

static void test_bad(const char *dir, const char *manifest)
{
    int short_counts[SHARDS] = {5, 2, 6, 4};
    write_set(dir, short_counts);
    char path[512];
    snprintf(path, sizeof path, "%s/shard_%06d.tar", dir, 1);
    unlink(path);
    vf_wds_loader_settings s;
    vf_wds_loader_defaults(&s);
    s.shuffle = 0;
    s.batch_size = 4;
    s.prefetch = 0; /* errors on the synchronous path here; the other tests run the prefetch thread */
    vf_wds_loader *l = NULL;
    CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
    int ids[64], n = 0;
    CHECK(l && drain(l, ids, &n) == -1);
    CHECK(strstr(vf_last_error(), "shard_000001.tar") != NULL);
    vf_wds_loader_close(l);
    s.on_error = VF_WDS_SKIP;
    CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
    n = 0;
    CHECK(l && drain(l, ids, &n) > 0);
    CHECK_EQ_INT(n, 5 + 6 + 4);
    vf_wds_stats st;
    vf_wds_loader_stats(l, &st);
    CHECK_EQ_INT(st.skipped_samples, 2);
    CHECK_EQ_INT(st.skipped_shards, 2); /* the missing one, and the extra sample of shard 2 */
    /* one message per skipped shard range and per skipped sample */
    CHECK_EQ_INT(vf_wds_loader_num_skip_messages(l), 4);
    int extra = 0, missing = 0;
    for (size_t i = 0; i < vf_wds_loader_num_skip_messages(l); i++) {
        extra += strstr(vf_wds_loader_skip_message(l, i), "more samples than the manifest's num_sequences 6") != NULL;
        missing += strstr(vf_wds_loader_skip_message(l, i), "shard_000001.tar") != NULL;
    }
    CHECK(extra == 1 && missing == 3);
    vf_wds_loader_close(l);
}

/* set_epoch and close while the producer holds prefetched batches; the
 * same epoch with prefetch 0 and 3 gives the same batches. */
static void test_prefetch(const char *manifest)
{
    int a[64], na = 0, b[64], nb = 0;
    for (int pass = 0; pass < 2; pass++) {
        vf_wds_loader_settings s;
        settings(&s, 0);
        s.prefetch = pass ? 3 : 0;
        vf_wds_loader *l = NULL;
        CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
        if (!l)
            return;
        vf_wds_batch *batch;
        CHECK_OK(vf_wds_loader_next(l, &batch));
        vf_wds_batch_free(batch);
        CHECK_OK(vf_wds_loader_set_epoch(l, 3)); /* drops what was prefetched */
        CHECK(drain(l, pass ? b : a, pass ? &nb : &na) > 0);
        CHECK(vf_wds_loader_next(l, &batch) == VF_EOF); /* stays at the end */
        CHECK_OK(vf_wds_loader_set_epoch(l, 4));
        CHECK_OK(vf_wds_loader_next(l, &batch)); /* close with a producer running */
        vf_wds_batch_free(batch);
        vf_wds_loader_close(l);
    }
    CHECK_EQ_INT(na, nb);
    for (int i = 0; i < na && i < nb; i++)
        CHECK_EQ_INT(a[i], b[i]);
}

int main(void)
{
    char *dir = vf_test_tmpdir("wds_loader");
    char manifest[512];
    snprintf(manifest, sizeof manifest, "%s/manifest.jsonl", dir);
    write_set(dir, COUNTS);
    test_coverage_and_resume(manifest);
    test_elastic(manifest);
    test_prefetch(manifest);
    test_bad(dir, manifest);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_wds_loader");
}
