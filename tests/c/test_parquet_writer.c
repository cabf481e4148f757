/*
 * test_parquet_writer.c: the Parquet writer's C-level behaviour: the Thrift
 * compact encoder's exact bytes, the RLE/bit-packed hybrid (round trip
 * through a small decoder written here), settings and input validation,
 * schema changes between row groups, I/O failure, abort and the
 * temp-name-then-rename guarantee. Value-level compatibility with pyarrow
 * is covered by tests/python/test_parquet_writer.py.
 */
#define _GNU_SOURCE
#include "parquet/writer_internal.h"
#include "testutil.h"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

/* ---- helpers ---- */

static vf_pq_array int64_array(const char *name, const int64_t *values, int64_t n)
{
    vf_pq_array a;
    memset(&a, 0, sizeof a);
    a.type = VF_PQ_T_INT64;
    a.name = (char *)name;
    a.length = n;
    a.values = (void *)values;
    return a;
}

static vf_pq_array double_array(const char *name, const double *values, int64_t n)
{
    vf_pq_array a = int64_array(name, NULL, n);
    a.type = VF_PQ_T_DOUBLE;
    a.values = (void *)values;
    return a;
}

/* Number of directory entries whose name starts with prefix. */
static int count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}

static int has_parquet_magic(const char *path)
{
    uint8_t *data;
    size_t len;
    if (vf_read_file(path, &data, &len) < 0)
        return 0;
    int ok = len >= 12 && memcmp(data, "PAR1", 4) == 0 && memcmp(data + len - 4, "PAR1", 4) == 0;
    free(data);
    return ok;
}

/* ---- Thrift compact encoder ---- */

static void test_thrift_bytes(void)
{
    vf_buf b = {0};
    vf_pq_tw t;
    vf_pq_tw_init(&t, &b);
    vf_pq_tw_struct_begin(&t);
    vf_pq_tw_field_i32(&t, 1, 2);          /* delta 1, type i32: 0x15, zigzag(2) = 4 */
    vf_pq_tw_field_i64(&t, 3, -1);         /* delta 2, type i64: 0x26, zigzag(-1) = 1 */
    vf_pq_tw_field_string(&t, 4, "ab");    /* 0x18, len 2, 'a' 'b' */
    vf_pq_tw_field_bool(&t, 5, 1);         /* 0x11 */
    vf_pq_tw_field_bool(&t, 6, 0);         /* 0x12 */
    vf_pq_tw_field_i32(&t, 40, 300);       /* long form: 0x05, zigzag(40)=80, zigzag(300)=600 = 0xd8 0x04 */
    vf_pq_tw_field_list_begin(&t, 41, VF_PQ_TW_I32, 2); /* 0x19, 0x25 */
    vf_pq_tw_elem_i32(&t, 1);
    vf_pq_tw_elem_i32(&t, -2);
    vf_pq_tw_field_struct_begin(&t, 42);   /* 0x1c */
    vf_pq_tw_field_i8(&t, 1, 8);           /* 0x13 0x08 */
    vf_pq_tw_struct_end(&t);               /* 0x00 */
    vf_pq_tw_field_i16(&t, 43, 7);         /* 0x14 0x0e: the id state was restored */
    vf_pq_tw_struct_end(&t);
    CHECK_OK(t.status);
    static const uint8_t expect[] = {0x15, 0x04, 0x26, 0x01, 0x18, 0x02, 'a', 'b', 0x11, 0x12, 0x05, 0x50,
                                     0xd8, 0x04, 0x19, 0x25, 0x02, 0x03, 0x1c, 0x13, 0x08, 0x00, 0x14, 0x0e, 0x00};
    CHECK_EQ_INT(b.len, sizeof expect);
    CHECK(b.len == sizeof expect && memcmp(b.data, expect, sizeof expect) == 0);

    /* A list of 20 elements takes the long header: 0xf5 then varint 20. */
    b.len = 0;
    vf_pq_tw_init(&t, &b);
    vf_pq_tw_struct_begin(&t);
    vf_pq_tw_field_list_begin(&t, 1, VF_PQ_TW_I32, 20);
    for (int i = 0; i < 20; i++)
        vf_pq_tw_elem_i32(&t, 0);
    vf_pq_tw_struct_end(&t);
    CHECK_OK(t.status);
    CHECK(b.len == 1 + 2 + 20 + 1 && b.data[0] == 0x19 && b.data[1] == 0xf5 && b.data[2] == 20);
    vf_buf_free(&b);

    /* uvarint / zigzag edge values */
    vf_buf v = {0};
    CHECK_OK(vf_pq_tw_put_uvarint(&v, 300));
    CHECK(v.len == 2 && v.data[0] == 0xac && v.data[1] == 0x02);
    v.len = 0;
    CHECK_OK(vf_pq_tw_put_zigzag(&v, INT64_MIN));
    CHECK_EQ_INT(v.len, 10);
    CHECK(v.data[0] == 0xff && v.data[9] == 0x01);
    vf_buf_free(&v);
}

/* ---- RLE / bit-packed hybrid ---- */

/* Decodes `count` values; returns 0 when the input was consumed exactly. */
static int rle_decode(const uint8_t *p, size_t len, int width, uint32_t *out, int64_t count)
{
    size_t pos = 0;
    int64_t n = 0;
    int value_bytes = (width + 7) / 8;
    while (n < count) {
        uint64_t header = 0;
        int shift = 0;
        for (;;) {
            if (pos >= len || shift > 56)
                return -1;
            uint8_t byte = p[pos++];
            header |= (uint64_t)(byte & 0x7f) << shift;
            shift += 7;
            if (!(byte & 0x80))
                break;
        }
        if (header & 1) {
            int64_t values = (int64_t)(header >> 1) * 8;
            uint64_t acc = 0;
            int bits = 0;
            for (int64_t i = 0; i < values; i++) {
                while (bits < width) {
                    if (pos >= len)
                        return -1;
                    acc |= (uint64_t)p[pos++] << bits;
                    bits += 8;
                }
                uint32_t x = (uint32_t)(acc & ((UINT64_C(1) << width) - 1));
                acc >>= width;
                bits -= width;
                if (n < count)
                    out[n++] = x;
            }
        } else {
            int64_t run = (int64_t)(header >> 1);
            uint32_t x = 0;
            for (int b = 0; b < value_bytes; b++) {
                if (pos >= len)
                    return -1;
                x |= (uint32_t)p[pos++] << (8 * b);
            }
            for (int64_t i = 0; i < run && n < count; i++)
                out[n++] = x;
        }
    }
    return pos == len ? 0 : -1;
}

static void test_rle(void)
{
    vf_buf b = {0};
    /* Eight equal values: one RLE run, header 8<<1, one value byte. */
    uint32_t eight[8] = {3, 3, 3, 3, 3, 3, 3, 3};
    CHECK_OK(vf_pq_w_rle_encode_u32(&b, eight, 8, 2));
    CHECK(b.len == 2 && b.data[0] == 0x10 && b.data[1] == 0x03);
    /* Levels 0..7 at width 3: one bit-packed group, header 0x03, 3 bytes. */
    b.len = 0;
    int16_t ramp[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    CHECK_OK(vf_pq_w_rle_encode_u16(&b, ramp, 8, 3));
    static const uint8_t ramp_bytes[] = {0x03, 0x88, 0xc6, 0xfa};
    CHECK(b.len == 4 && memcmp(b.data, ramp_bytes, 4) == 0);

    /* Random mixes of runs and noise round-trip at every width. */
    uint64_t state = 12345;
    enum { N = 5000 };
    uint32_t *values = malloc(N * sizeof *values);
    uint32_t *decoded = malloc(N * sizeof *decoded);
    for (int width = 1; width <= 32; width++) {
        uint64_t mask = width == 32 ? 0xffffffffu : (UINT64_C(1) << width) - 1;
        int64_t count = 0;
        while (count < N) {
            state = state * 6364136223846793005u + 1442695040888963407u;
            uint32_t x = (uint32_t)((state >> 20) & mask);
            int run = (state >> 60) < 4 ? (int)(state >> 40) % 40 + 1 : 1;
            for (int i = 0; i < run && count < N; i++)
                values[count++] = x;
        }
        for (int64_t n = 0; n <= N; n += n < 20 ? 1 : 997) {
            b.len = 0;
            CHECK_OK(vf_pq_w_rle_encode_u32(&b, values, n, width));
            int ok = rle_decode(b.data, b.len, width, decoded, n) == 0 &&
                     memcmp(values, decoded, (size_t)n * sizeof *values) == 0;
            if (!ok)
                fprintf(stderr, "rle mismatch: width %d count %lld\n", width, (long long)n);
            CHECK(ok);
        }
    }
    free(values);
    free(decoded);
    vf_buf_free(&b);
}

/* ---- settings, validation, errors ---- */

static void test_settings(const char *dir)
{
    char *path = vf_path_join(dir, "settings.parquet");
    vf_pq_writer *w = NULL;
    vf_pq_writer_settings s;
    vf_pq_writer_defaults(&s);
    CHECK_EQ_INT(s.codec, VF_PQ_SNAPPY);
    CHECK_EQ_INT(s.dictionary, 1);
    CHECK_EQ_INT(s.data_page_version, 1);
    CHECK_EQ_INT(s.page_size, 1 << 20);

    s.codec = VF_PQ_LZ4;
    CHECK_ERR(vf_pq_writer_open(&w, path, &s), VF_EUNSUPPORTED, "codec LZ4 is not supported");
    CHECK(w == NULL);
    s.codec = (vf_pq_codec)99;
    CHECK_ERR(vf_pq_writer_open(&w, path, &s), VF_EINVAL, "invalid codec 99");
    vf_pq_writer_defaults(&s);
    s.data_page_version = 3;
    CHECK_ERR(vf_pq_writer_open(&w, path, &s), VF_EINVAL, "data_page_version must be 1 or 2");
    vf_pq_writer_defaults(&s);
    s.page_size = 0;
    CHECK_ERR(vf_pq_writer_open(&w, path, &s), VF_EINVAL, "page_size must be positive");
    vf_pq_writer_defaults(&s);
    s.dictionary = 7;
    CHECK_ERR(vf_pq_writer_open(&w, path, &s), VF_EINVAL, "dictionary must be 0 or 1");
    CHECK_ERR(vf_pq_writer_open(&w, "", NULL), VF_EINVAL, "empty path");
    CHECK_ERR(vf_pq_writer_open(&w, "/nonexistent-vlafeed-dir/x.parquet", NULL), VF_ENOENT,
              "/nonexistent-vlafeed-dir/x.parquet: cannot create");
    CHECK_ERR(vf_pq_writer_open(&w, dir, NULL), VF_EINVAL, "is a directory");
    CHECK(!vf_file_exists(path));
    CHECK_EQ_INT(count_entries(dir, "settings.parquet"), 0);
    free(path);
}

static void test_validation(const char *dir)
{
    char *path = vf_path_join(dir, "valid.parquet");
    vf_pq_writer *w = NULL;
    CHECK_OK(vf_pq_writer_open(&w, path, NULL));
    int64_t ints[4] = {1, 2, 3, 4};
    double dbl[4] = {0.5, 1.5, 2.5, 3.5};

    /* Length mismatch names both fields. */
    vf_pq_array f[2] = {int64_array("a", ints, 4), int64_array("b", ints, 3)};
    CHECK_ERR(vf_pq_writer_write_row_group(w, f, 2), VF_EINVAL, "field 'b' has 3 rows but field 'a' has 4");
    CHECK_ERR(vf_pq_writer_write_row_group(w, f, 0), VF_EINVAL, "no fields");
    f[1] = int64_array("a", ints, 4);
    CHECK_ERR(vf_pq_writer_write_row_group(w, f, 2), VF_EINVAL, "field 'a' given twice");
    f[1] = int64_array(NULL, ints, 4);
    CHECK_ERR(vf_pq_writer_write_row_group(w, f, 2), VF_EINVAL, "field 1 has no name");

    /* Unsupported type, missing values. */
    vf_pq_array bad = int64_array("n", ints, 4);
    bad.type = VF_PQ_T_NULL;
    CHECK_ERR(vf_pq_writer_write_row_group(w, &bad, 1), VF_EUNSUPPORTED, "field 'n': type null cannot be written");
    bad = int64_array("v", NULL, 4);
    CHECK_ERR(vf_pq_writer_write_row_group(w, &bad, 1), VF_EINVAL, "field 'v': int64 array without values");

    /* Strings whose offsets decrease or run past the data. */
    int64_t offs[4] = {0, 2, 1, 3};
    vf_pq_array str;
    memset(&str, 0, sizeof str);
    str.type = VF_PQ_T_STRING;
    str.name = "s";
    str.length = 3;
    str.offsets = offs;
    str.data = (uint8_t *)"abc";
    str.data_len = 3;
    CHECK_ERR(vf_pq_writer_write_row_group(w, &str, 1), VF_EINVAL, "field 's': offsets decrease at element 1");
    int64_t offs2[4] = {0, 1, 2, 9};
    str.offsets = offs2;
    CHECK_ERR(vf_pq_writer_write_row_group(w, &str, 1), VF_EINVAL, "last offset 9 is past the data length (3)");

    /* A list whose child is too short, a list without a child. */
    int64_t loffs[3] = {0, 2, 5};
    vf_pq_array child = double_array("element", dbl, 4);
    vf_pq_array list;
    memset(&list, 0, sizeof list);
    list.type = VF_PQ_T_LIST;
    list.name = "l";
    list.length = 2;
    list.offsets = loffs;
    list.num_children = 1;
    list.children = &child;
    CHECK_ERR(vf_pq_writer_write_row_group(w, &list, 1), VF_EINVAL, "field 'l': last offset 5 is past the child length");
    list.num_children = 0;
    CHECK_ERR(vf_pq_writer_write_row_group(w, &list, 1), VF_EINVAL, "exactly one child");

    /* A struct child of the wrong length; an empty struct. */
    vf_pq_array kids[2] = {int64_array("x", ints, 4), double_array("y", dbl, 3)};
    vf_pq_array st;
    memset(&st, 0, sizeof st);
    st.type = VF_PQ_T_STRUCT;
    st.name = "st";
    st.length = 4;
    st.num_children = 2;
    st.children = kids;
    CHECK_ERR(vf_pq_writer_write_row_group(w, &st, 1), VF_EINVAL, "field 'st.y': struct child has 3 elements");
    st.num_children = 0;
    CHECK_ERR(vf_pq_writer_write_row_group(w, &st, 1), VF_EUNSUPPORTED, "field 'st': a struct needs at least one child");

    /* None of that wrote anything: the writer still works. */
    f[0] = int64_array("a", ints, 4);
    f[1] = double_array("b", dbl, 4);
    CHECK_OK(vf_pq_writer_write_row_group(w, f, 2));

    /* Schema changes after the first row group. */
    vf_pq_array g[2] = {int64_array("a", ints, 2), int64_array("b", ints, 2)};
    CHECK_ERR(vf_pq_writer_write_row_group(w, g, 2), VF_EINVAL, "field 'b' changed type from float64 to int64");
    g[1] = double_array("c", dbl, 2);
    CHECK_ERR(vf_pq_writer_write_row_group(w, g, 2), VF_EINVAL, "field 1 is 'c', but the schema has 'b'");
    CHECK_ERR(vf_pq_writer_write_row_group(w, g, 1), VF_EINVAL, "1 fields, but the schema (from row group 0) has 2");
    g[1] = double_array("b", dbl, 2);
    CHECK_OK(vf_pq_writer_write_row_group(w, g, 2));
    CHECK_OK(vf_pq_writer_add_kv(w, "k", "v1"));
    CHECK_OK(vf_pq_writer_add_kv(w, "k", "v2")); /* replaces */
    CHECK_OK(vf_pq_writer_close(w));
    CHECK(has_parquet_magic(path));
    CHECK_EQ_INT(count_entries(dir, "valid.parquet.tmp"), 0);
    free(path);
}

static void test_abort_and_temp(const char *dir)
{
    char *path = vf_path_join(dir, "aborted.parquet");
    vf_pq_writer *w = NULL;
    CHECK_OK(vf_pq_writer_open(&w, path, NULL));
    /* While writing, only the temporary name exists. */
    CHECK(!vf_file_exists(path));
    CHECK_EQ_INT(count_entries(dir, "aborted.parquet.tmp-"), 1);
    int64_t ints[3] = {7, 8, 9};
    vf_pq_array a = int64_array("a", ints, 3);
    CHECK_OK(vf_pq_writer_write_row_group(w, &a, 1));
    vf_pq_writer_abort(w);
    CHECK(!vf_file_exists(path));
    CHECK_EQ_INT(count_entries(dir, "aborted.parquet"), 0);
    vf_pq_writer_abort(NULL);

    /* Closing without any row group still gives a valid (empty) file. */
    CHECK_OK(vf_pq_writer_open(&w, path, NULL));
    CHECK_OK(vf_pq_writer_close(w));
    CHECK(has_parquet_magic(path));
    CHECK_EQ_INT(count_entries(dir, "aborted.parquet"), 1);
    free(path);
}

/* A write that fails (file size limit) marks the writer failed; close
 * reports it and nothing is left behind. */
static void test_io_failure(const char *dir)
{
    char *path = vf_path_join(dir, "full.parquet");
    struct rlimit old;
    if (getrlimit(RLIMIT_FSIZE, &old) < 0) {
        free(path);
        return;
    }
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    vf_pq_writer *w = NULL;
    vf_pq_writer_settings s;
    vf_pq_writer_defaults(&s);
    s.codec = VF_PQ_UNCOMPRESSED;
    s.dictionary = 0;
    CHECK_OK(vf_pq_writer_open(&w, path, &s));
    enum { N = 1 << 19 }; /* 4 MiB of doubles */
    double *values = malloc(N * sizeof *values);
    for (int i = 0; i < N; i++)
        values[i] = i * 0.25;
    vf_pq_array a = double_array("x", values, N);
    struct rlimit small = old;
    small.rlim_cur = 256 * 1024;
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    CHECK_ERR(vf_pq_writer_write_row_group(w, &a, 1), VF_EIO, "full.parquet: write failed");
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, old_handler);
    CHECK_ERR(vf_pq_writer_write_row_group(w, &a, 1), VF_EIO, "failed earlier");
    CHECK_ERR(vf_pq_writer_close(w), VF_EIO, "not written");
    CHECK(!vf_file_exists(path));
    CHECK_EQ_INT(count_entries(dir, "full.parquet"), 0);
    free(values);
    free(path);
}

int main(void)
{
    char *dir = vf_test_tmpdir("pqwriter");
    test_thrift_bytes();
    test_rle();
    test_settings(dir);
    test_validation(dir);
    test_abort_and_temp(dir);
    test_io_failure(dir);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_parquet_writer");
}
