/*
 * test_wds.c: the WebDataset layer's parsers on tars built in memory with
 * libarchive's writer (ustar, pax and GNU long names): webdataset's name
 * split and metadata rule, grouping (case-folded suffixes, non-regular and
 * __meta__ members skipped, a key seen again later starting a new sample,
 * duplicate suffix refused), skipping without reading, truncation and
 * damaged headers named with shard and member; .npy headers (versions,
 * dtypes left to numpy, malformed ones); manifests with and without .tar.
 */
#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "wds/wds.h"

typedef struct member {
    const char *name;
    const char *data;
    int type; /* AE_IFREG or AE_IFDIR */
} member;

static size_t build_tar(uint8_t *out, size_t cap, int format, const member *members, size_t n)
{
    struct archive *a = archive_write_new();
    archive_write_set_format(a, format);
    size_t used = 0;
    archive_write_open_memory(a, out, cap, &used);
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, members[i].name);
        archive_entry_set_filetype(e, (unsigned)members[i].type);
        archive_entry_set_perm(e, 0644);
        size_t len = members[i].type == AE_IFREG ? strlen(members[i].data) : 0;
        archive_entry_set_size(e, (la_int64_t)len);
        archive_write_header(a, e);
        if (len)
            archive_write_data(a, members[i].data, len);
        archive_entry_free(e);
    }
    archive_write_close(a);
    archive_write_free(a);
    return used;
}

static void test_split(void)
{
    size_t k;
    const char *suffix;
    CHECK(vf_wds_split_name("abc.jpg", &k, &suffix) && k == 3 && !strcmp(suffix, "jpg"));
    CHECK(vf_wds_split_name("a.b/c.d.e", &k, &suffix) && k == 5 && !strcmp(suffix, "d.e"));
    CHECK(vf_wds_split_name("x/.txt", &k, &suffix) && k == 2 && !strcmp(suffix, "txt"));
    CHECK(!vf_wds_split_name("x./.txt", &k, &suffix));
    CHECK(!vf_wds_split_name("nodot", &k, &suffix));
    CHECK(!vf_wds_split_name("dir.x/nodot", &k, &suffix));
    CHECK(!vf_wds_split_name(".hidden", &k, &suffix));
    CHECK(vf_wds_is_meta_name("__meta__") && vf_wds_is_meta_name("__a__/b.txt"));
    CHECK(!vf_wds_is_meta_name("__key__.txt") && !vf_wds_is_meta_name("_a_.txt"));
}

static void test_grouping(int format)
{
    static uint8_t buf[1 << 16];
    char long_name[300];
    memset(long_name, 'd', 150);
    strcpy(long_name + 150, "/k3.TXT");
    member ms[] = {{"__meta__", "m", AE_IFREG}, {"k1.Json", "{}", AE_IFREG}, {"k1.top.JPG", "j", AE_IFREG},
                   {"dir", "", AE_IFDIR},      {"k2.json", "[]", AE_IFREG}, {long_name, "long", AE_IFREG},
                   {"k1.json", "again", AE_IFREG}};
    size_t len = build_tar(buf, sizeof buf, format, ms, VF_ARRAY_LEN(ms));
    CHECK(len > 0);
    vf_wds_reader *r = NULL;
    CHECK_OK(vf_wds_reader_open_memory(&r, "mem.tar", buf, len));
    const vf_wds_sample *s = NULL;
    CHECK_OK(vf_wds_reader_next(r, 1, &s));
    CHECK(s && !strcmp(s->key, "k1") && s->num_members == 2 && s->index == 0);
    CHECK(s && !strcmp(s->members[0].suffix, "json") && !strcmp(s->members[1].suffix, "top.jpg"));
    CHECK(s && s->members[0].size == 2 && !memcmp(s->members[0].data, "{}", 2));
    CHECK_OK(vf_wds_reader_next(r, 0, &s)); /* skipped: no data */
    CHECK(s && !strcmp(s->key, "k2") && s->members[0].data == NULL && s->members[0].size == 2);
    CHECK_OK(vf_wds_reader_next(r, 1, &s));
    CHECK(s && strlen(s->key) == 153 && !strcmp(s->members[0].suffix, "txt") && s->members[0].size == 4);
    CHECK_OK(vf_wds_reader_next(r, 1, &s)); /* k1 again: a new sample, as in webdataset */
    CHECK(s && !strcmp(s->key, "k1") && s->index == 3 && !memcmp(s->members[0].data, "again", 5));
    CHECK(vf_wds_reader_next(r, 1, &s) == VF_EOF);
    CHECK(vf_wds_reader_next(r, 1, &s) == VF_EOF);
    vf_wds_reader_close(r);
}

static void test_errors(void)
{
    static uint8_t buf[1 << 16];
    member dup[] = {{"k.a", "1", AE_IFREG}, {"k.A", "2", AE_IFREG}};
    size_t len = build_tar(buf, sizeof buf, ARCHIVE_FORMAT_TAR_USTAR, dup, 2);
    vf_wds_reader *r = NULL;
    const vf_wds_sample *s = NULL;
    CHECK_OK(vf_wds_reader_open_memory(&r, "dup.tar", buf, len));
    CHECK_ERR(vf_wds_reader_next(r, 1, &s), VF_ECORRUPT, "shard dup.tar: member k.A (key k): duplicate suffix");
    vf_wds_reader_close(r);

    member two[] = {{"k1.txt", "aaaaaaaaaaaaaaaaaaaa", AE_IFREG}, {"k2.txt", "bbbbbbbbbbbbbbbbbbbb", AE_IFREG}};
    len = build_tar(buf, sizeof buf, ARCHIVE_FORMAT_TAR_USTAR, two, 2);
    /* cut inside the second member's data */
    CHECK_OK(vf_wds_reader_open_memory(&r, "cut.tar", buf, 512 * 3 + 5));
    CHECK_OK(vf_wds_reader_next(r, 1, &s));
    CHECK_ERR(vf_wds_reader_next(r, 1, &s), VF_ECORRUPT, "shard cut.tar: member k2.txt (key k2)");
    CHECK(vf_wds_reader_next(r, 1, &s) == VF_EOF);
    vf_wds_reader_close(r);
    /* a damaged checksum in the second header */
    buf[512 * 2 + 1] ^= 0x01;
    CHECK_OK(vf_wds_reader_open_memory(&r, "sum.tar", buf, len));
    CHECK_ERR(vf_wds_reader_next(r, 1, &s), VF_ECORRUPT, "shard sum.tar: after key k1");
    vf_wds_reader_close(r);
    CHECK_ERR(vf_wds_reader_open(&r, "/nonexistent/shard.tar"), VF_ENOENT, "/nonexistent/shard.tar");
}

static void test_npy(void)
{
    uint8_t doc[128];
    const char *header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    size_t hl = 118 - 10;
    memset(doc, ' ', sizeof doc);
    memcpy(doc, "\x93NUMPY\x01\x00", 8);
    doc[8] = (uint8_t)hl;
    doc[9] = 0;
    memcpy(doc + 10, header, strlen(header));
    doc[117] = '\n';
    vf_wds_array a;
    CHECK_ERR(vf_wds_parse_npy(doc, 118, &a), VF_ECORRUPT, "truncated");
    uint8_t full[118 + 24];
    memcpy(full, doc, 118);
    for (int i = 0; i < 6; i++) {
        float v = (float)i;
        memcpy(full + 118 + 4 * i, &v, 4);
    }
    CHECK_OK(vf_wds_parse_npy(full, sizeof full, &a));
    CHECK(a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.itemsize == 4 && a.nbytes == 24);
    CHECK(!strcmp(a.descr, "<f4") && a.data == full + 118);
    memcpy(full + 10 + 11, "<U5", 3);
    CHECK_ERR(vf_wds_parse_npy(full, sizeof full, &a), VF_EUNSUPPORTED, "decoded by numpy");
    memcpy(full + 10 + 11, ">f4", 3);
    CHECK(vf_wds_parse_npy(full, sizeof full, &a) == VF_EUNSUPPORTED);
    memcpy(full + 10 + 11, "<f4", 3);
    full[0] = 'X';
    CHECK_ERR(vf_wds_parse_npy(full, sizeof full, &a), VF_ECORRUPT, "bad magic");
    CHECK_ERR(vf_wds_image_size((const uint8_t *)"nope", 4, &(int){0}, &(int){0}), VF_ECORRUPT, "not a JPEG or PNG");
    /* headers that end right after a key's colon (or its spaces), in
     * buffers of exactly their size, so ASan sees any read past the end
     * (fuzz_wds found one in CI) */
    static const char *const cut[] = {"{'descr':", "{'descr':   ", "{'descr': '<f4', 'fortran_order':",
                                      "{'descr': '<f4', 'fortran_order': False, 'shape':",
                                      "{'descr': '<f4', 'fortran_order': False, 'shape': ", "{'descr': '",
                                      "{'descr': '<f4', 'fortran_order': False, 'shape': (", "{'descr': '<f4', 'fortran_order': Fal"};
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        size_t n = strlen(cut[i]);
        uint8_t *d = malloc(10 + n);
        CHECK(d != NULL);
        if (!d)
            continue;
        memcpy(d, "\x93NUMPY\x01\x00", 8);
        d[8] = (uint8_t)n;
        d[9] = 0;
        memcpy(d + 10, cut[i], n);
        CHECK(vf_wds_parse_npy(d, 10 + n, &a) == VF_ECORRUPT);
        free(d);
    }
}

static void test_manifest(void)
{
    const char *text = "{\"shard\": \"shard_000000\", \"num_sequences\": 5}\n"
                       "{\"shard\": \"sub/shard_000001.tar\", \"num_sequences\": 0, \"extra\": 1}\n\n"
                       "{\"shard\": \"s3://b/k/x\", \"num_sequences\": 2}";
    vf_wds_manifest *m = NULL;
    /* an s3:// shard in a local manifest needs the opt-in (test_wds_manifest.c covers the refusals) */
    CHECK_ERR(vf_wds_manifest_parse(&m, "/data/shards/manifest.jsonl", text, strlen(text)), VF_EINVAL, "s3://b/k/x");
    vf_wds_manifest_settings outside;
    vf_wds_manifest_defaults(&outside);
    outside.allow_outside_base = 1;
    CHECK_OK(vf_wds_manifest_parse_with(&m, "/data/shards/manifest.jsonl", text, strlen(text), &outside));
    CHECK(m && vf_wds_manifest_num_shards(m) == 3 && vf_wds_manifest_total_samples(m) == 7);
    CHECK(m && !strcmp(vf_wds_manifest_shard_url(m, 0), "/data/shards/shard_000000.tar"));
    CHECK(m && !strcmp(vf_wds_manifest_shard_url(m, 1), "/data/shards/sub/shard_000001.tar"));
    CHECK(m && !strcmp(vf_wds_manifest_shard_url(m, 2), "s3://b/k/x.tar"));
    CHECK(m && !strcmp(vf_wds_manifest_shard_name(m, 0), "shard_000000"));
    vf_wds_manifest *m2 = NULL;
    const char *other = "{\"shard\": \"shard_000000\", \"num_sequences\": 6}";
    CHECK_OK(vf_wds_manifest_parse(&m2, "m.jsonl", other, strlen(other)));
    CHECK(m && m2 && vf_wds_manifest_fingerprint(m) != vf_wds_manifest_fingerprint(m2));
    vf_wds_manifest_close(m);
    vf_wds_manifest_close(m2);
    const char *bad = "{\"shard\": \"a\", \"num_sequences\": -1}";
    CHECK_ERR(vf_wds_manifest_parse(&m, "bad.jsonl", bad, strlen(bad)), VF_ECORRUPT, "bad.jsonl:1: num_sequences");
    CHECK_ERR(vf_wds_manifest_parse(&m, "x.jsonl", "{\"shard\": 3}", 12), VF_ECORRUPT, "x.jsonl");
}

int main(void)
{
    test_split();
    test_grouping(ARCHIVE_FORMAT_TAR_USTAR);
    test_grouping(ARCHIVE_FORMAT_TAR_PAX_RESTRICTED);
    test_grouping(ARCHIVE_FORMAT_TAR_GNUTAR);
    test_errors();
    test_npy();
    test_manifest();
    return vf_test_finish("test_wds");
}
