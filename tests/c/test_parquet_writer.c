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
#include "test_pq_helpers.h"
#include "testutil.h"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

/* ---- helpers ---- */

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

static long file_size(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    return size;
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

    /* Closing without any row group still gives a valid (empty) file. vf_pq_writer_bytes
     * counts the magic, then each row group as written; the footer comes on top. */
    CHECK_OK(vf_pq_writer_open(&w, path, NULL));
    int64_t at_open = vf_pq_writer_bytes(w);
    CHECK_EQ_INT(at_open, 4);
    CHECK_OK(vf_pq_writer_close(w));
    long empty_size = file_size(path);
    CHECK(empty_size > at_open);
    remove(path);
    CHECK_OK(vf_pq_writer_open(&w, path, NULL));
    CHECK_OK(vf_pq_writer_write_row_group(w, &a, 1));
    int64_t one_group = vf_pq_writer_bytes(w);
    CHECK(one_group > at_open);
    CHECK_OK(vf_pq_writer_write_row_group(w, &a, 1));
    CHECK(vf_pq_writer_bytes(w) > one_group);
    int64_t before_footer = vf_pq_writer_bytes(w);
    CHECK_OK(vf_pq_writer_close(w));
    CHECK(file_size(path) > before_footer);
    remove(path);
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

/* ---- random array trees ---- */

typedef struct rng {
    uint64_t state;
} rng;

static uint32_t rnd(rng *r)
{
    r->state = r->state * 6364136223846793005u + 1442695040888963407u;
    return (uint32_t)(r->state >> 33);
}

static int rnd_below(rng *r, int n) { return n > 0 ? (int)(rnd(r) % (uint32_t)n) : 0; }

static const vf_pq_type leaf_types[] = {
    VF_PQ_T_BOOL,   VF_PQ_T_INT8,   VF_PQ_T_INT16,   VF_PQ_T_INT32,  VF_PQ_T_INT64,  VF_PQ_T_UINT8,
    VF_PQ_T_UINT16, VF_PQ_T_UINT32, VF_PQ_T_UINT64,  VF_PQ_T_FLOAT16, VF_PQ_T_FLOAT, VF_PQ_T_DOUBLE,
    VF_PQ_T_STRING, VF_PQ_T_BINARY, VF_PQ_T_FIXED_BINARY,
};

/* A type skeleton: an array with type/name/children set and length 0. */
static void random_type(rng *r, vf_pq_array *t, int depth)
{
    memset(t, 0, sizeof *t);
    int pick = rnd_below(r, depth >= 3 ? 1 : 4);
    if (pick == 1 || pick == 2) {
        t->type = VF_PQ_T_LIST;
        t->num_children = 1;
        t->children = calloc(1, sizeof *t->children);
        random_type(r, &t->children[0], depth + 1);
        t->children[0].name = vf_strdup("element");
    } else if (pick == 3) {
        t->type = VF_PQ_T_STRUCT;
        t->num_children = 1 + rnd_below(r, 3);
        t->children = calloc((size_t)t->num_children, sizeof *t->children);
        for (int i = 0; i < t->num_children; i++) {
            random_type(r, &t->children[i], depth + 1);
            t->children[i].name = vf_asprintf("c%d", i);
        }
    } else {
        t->type = leaf_types[rnd_below(r, (int)VF_ARRAY_LEN(leaf_types))];
        t->width = t->type == VF_PQ_T_FIXED_BINARY ? 1 + rnd_below(r, 5) : 0;
    }
}

static size_t value_width(const vf_pq_array *t)
{
    switch (t->type) {
    case VF_PQ_T_BOOL: case VF_PQ_T_INT8: case VF_PQ_T_UINT8: return 1;
    case VF_PQ_T_INT16: case VF_PQ_T_UINT16: case VF_PQ_T_FLOAT16: return 2;
    case VF_PQ_T_INT32: case VF_PQ_T_UINT32: case VF_PQ_T_FLOAT: return 4;
    case VF_PQ_T_INT64: case VF_PQ_T_UINT64: case VF_PQ_T_DOUBLE: return 8;
    case VF_PQ_T_FIXED_BINARY: return (size_t)t->width;
    default: return 0;
    }
}

/* Fills `a` (same shape as skeleton t) with `length` random elements. Values
 * come from a small pool half of the time so dictionaries get reuse. */
static void random_fill(rng *r, const vf_pq_array *t, vf_pq_array *a, int64_t length, int null_pct)
{
    memset(a, 0, sizeof *a);
    a->type = t->type;
    a->name = t->name ? vf_strdup(t->name) : NULL;
    a->width = t->width;
    a->length = length;
    if (null_pct > 0) {
        a->valid = malloc((size_t)length + 1);
        for (int64_t i = 0; i < length; i++) {
            a->valid[i] = rnd_below(r, 100) >= null_pct;
            a->null_count += !a->valid[i];
        }
    }
    size_t w = value_width(t);
    if (w) {
        uint8_t *v = malloc((size_t)length * w + 1);
        for (int64_t i = 0; i < length; i++) {
            int pooled = rnd_below(r, 2);
            for (size_t b = 0; b < w; b++)
                v[(size_t)i * w + b] = pooled ? (uint8_t)(i % 3 + b) : (uint8_t)rnd(r);
            if (t->type == VF_PQ_T_BOOL)
                v[i] &= 1;
            if (t->type == VF_PQ_T_FLOAT16 && (v[(size_t)i * 2 + 1] & 0x7c) == 0x7c)
                v[(size_t)i * 2 + 1] &= 0x3f; /* no NaN/Inf: compared by value */
            if (t->type == VF_PQ_T_FLOAT && (v[(size_t)i * 4 + 3] & 0x7f) == 0x7f)
                v[(size_t)i * 4 + 3] &= 0x3f;
            if (t->type == VF_PQ_T_DOUBLE && (v[(size_t)i * 8 + 7] & 0x7f) == 0x7f)
                v[(size_t)i * 8 + 7] &= 0x3f;
        }
        a->values = v;
        return;
    }
    if (t->type == VF_PQ_T_STRING || t->type == VF_PQ_T_BINARY) {
        a->offsets = malloc(((size_t)length + 1) * sizeof *a->offsets);
        vf_buf data = {0};
        a->offsets[0] = 0;
        for (int64_t i = 0; i < length; i++) {
            if (!a->valid || a->valid[i]) {
                int len = rnd_below(r, 2) ? (int)(i % 4) : rnd_below(r, 40);
                for (int k = 0; k < len; k++)
                    vf_buf_append_u8(&data, (uint8_t)('a' + (t->type == VF_PQ_T_STRING ? rnd_below(r, 26) : 0)));
            }
            a->offsets[i + 1] = (int64_t)data.len;
        }
        a->data_len = (int64_t)data.len;
        a->data = data.data ? data.data : malloc(1);
        return;
    }
    if (t->type == VF_PQ_T_LIST) {
        a->offsets = malloc(((size_t)length + 1) * sizeof *a->offsets);
        a->offsets[0] = 0;
        for (int64_t i = 0; i < length; i++) {
            int n = (!a->valid || a->valid[i]) ? rnd_below(r, 5) : 0;
            a->offsets[i + 1] = a->offsets[i] + n;
        }
        a->num_children = 1;
        a->children = calloc(1, sizeof *a->children);
        random_fill(r, &t->children[0], &a->children[0], a->offsets[length], null_pct);
        return;
    }
    a->num_children = t->num_children;
    a->children = calloc((size_t)t->num_children, sizeof *a->children);
    for (int i = 0; i < t->num_children; i++)
        random_fill(r, &t->children[i], &a->children[i], length, null_pct);
}

static void free_array(vf_pq_array *a)
{
    for (int i = 0; i < a->num_children; i++)
        free_array(&a->children[i]);
    free(a->children);
    free(a->name);
    free(a->valid);
    free(a->values);
    free(a->offsets);
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* Element i of a equals element j of b (types, validity, values, nesting). */
static int same_element(const vf_pq_array *a, int64_t i, const vf_pq_array *b, int64_t j)
{
    if (a->type != b->type || a->width != b->width)
        return 0;
    int va = !a->valid || a->valid[i], vb = !b->valid || b->valid[j];
    if (va != vb)
        return 0;
    if (!va)
        return 1;
    size_t w = value_width(a);
    if (w)
        return memcmp((const uint8_t *)a->values + (size_t)i * w, (const uint8_t *)b->values + (size_t)j * w, w) == 0;
    if (a->type == VF_PQ_T_STRING || a->type == VF_PQ_T_BINARY) {
        int64_t la = a->offsets[i + 1] - a->offsets[i], lb = b->offsets[j + 1] - b->offsets[j];
        return la == lb && memcmp(a->data + a->offsets[i], b->data + b->offsets[j], (size_t)la) == 0;
    }
    if (a->type == VF_PQ_T_LIST) {
        int64_t la = a->offsets[i + 1] - a->offsets[i], lb = b->offsets[j + 1] - b->offsets[j];
        if (la != lb)
            return 0;
        for (int64_t k = 0; k < la; k++)
            if (!same_element(&a->children[0], a->offsets[i] + k, &b->children[0], b->offsets[j] + k))
                return 0;
        return 1;
    }
    if (a->num_children != b->num_children)
        return 0;
    for (int c = 0; c < a->num_children; c++)
        if (strcmp(a->children[c].name, b->children[c].name) != 0 || !same_element(&a->children[c], i, &b->children[c], j))
            return 0;
    return 1;
}

/* Writes random tables with random settings, reads them back with the
 * reader and compares every element (under ASan this also checks the
 * shredding and encoding for out-of-bounds access on every shape). */
static void test_random_roundtrip(const char *dir)
{
    rng r = {42};
    enum { MAX_FIELDS = 4, MAX_GROUPS = 3 };
    for (int round = 0; round < 80; round++) {
        char *path = vf_asprintf("%s/random-%d.parquet", dir, round);
        int num_fields = 1 + rnd_below(&r, MAX_FIELDS);
        vf_pq_array types[MAX_FIELDS];
        for (int f = 0; f < num_fields; f++) {
            random_type(&r, &types[f], 0);
            types[f].name = vf_asprintf("f%d", f);
        }
        if (round % 5 == 0) { /* an int64 scalar for the statistics checks */
            free_array(&types[0]);
            memset(&types[0], 0, sizeof types[0]);
            types[0].type = VF_PQ_T_INT64;
            types[0].name = vf_strdup("f0");
        }
        vf_pq_writer_settings s;
        vf_pq_writer_defaults(&s);
        static const vf_pq_codec codecs[] = {VF_PQ_UNCOMPRESSED, VF_PQ_SNAPPY, VF_PQ_GZIP, VF_PQ_ZSTD};
        s.codec = codecs[rnd_below(&r, 4)];
        s.dictionary = rnd_below(&r, 2);
        s.data_page_version = 1 + rnd_below(&r, 2);
        s.page_size = rnd_below(&r, 2) ? (size_t)(1 + rnd_below(&r, 100)) : (size_t)1 << 20;
        vf_pq_writer *w = NULL;
        CHECK_OK(vf_pq_writer_open(&w, path, &s));
        if (!w)
            break;
        CHECK_OK(vf_pq_writer_add_kv(w, "round", "x"));
        int groups = 1 + rnd_below(&r, MAX_GROUPS);
        vf_pq_array written[MAX_GROUPS][MAX_FIELDS];
        int64_t rows[MAX_GROUPS], total = 0;
        for (int g = 0; g < groups; g++) {
            rows[g] = rnd_below(&r, 60);
            total += rows[g];
            int null_pct = rnd_below(&r, 3) * 15;
            for (int f = 0; f < num_fields; f++)
                random_fill(&r, &types[f], &written[g][f], rows[g], null_pct);
            CHECK_OK(vf_pq_writer_write_row_group(w, written[g], num_fields));
        }
        CHECK_OK(vf_pq_writer_close(w));

        vf_pq_file *pf = NULL;
        CHECK_OK(vf_pq_open_path(&pf, path));
        if (pf) {
            CHECK_EQ_INT(vf_pq_num_rows(pf), total);
            CHECK_EQ_INT(vf_pq_num_row_groups(pf), groups);
            CHECK_EQ_INT(vf_pq_num_fields(pf), num_fields);
            CHECK(vf_pq_kv(pf, "round") && strcmp(vf_pq_kv(pf, "round"), "x") == 0);
            CHECK(strncmp(vf_pq_created_by(pf), "vlafeed version", 15) == 0);
            for (int f = 0; f < num_fields; f++) {
                CHECK_EQ_INT(vf_pq_field_index(pf, types[f].name), f);
                vf_pq_array all;
                CHECK_OK(vf_pq_read_field_all(pf, f, &all));
                CHECK_EQ_INT(all.length, total);
                int64_t row = 0;
                int same = all.length == total;
                for (int g = 0; g < groups && same; g++) {
                    vf_pq_array one;
                    CHECK_OK(vf_pq_read_field(pf, g, f, &one));
                    for (int64_t i = 0; i < rows[g] && same; i++, row++)
                        same = same_element(&written[g][f], i, &all, row) &&
                               same_element(&written[g][f], i, &one, i);
                    vf_pq_array_free(&one);
                }
                if (!same)
                    fprintf(stderr, "round %d field %d differs after reading back (row %lld)\n", round, f,
                            (long long)row);
                CHECK(same);
                vf_pq_array_free(&all);
            }
            /* Statistics of the int64 scalar, per row group. */
            for (int g = 0; g < groups && types[0].type == VF_PQ_T_INT64; g++) {
                const vf_pq_array *a = &written[g][0];
                int64_t lo = INT64_MAX, hi = INT64_MIN, n = 0;
                for (int64_t i = 0; i < a->length; i++) {
                    if (a->valid && !a->valid[i])
                        continue;
                    int64_t v = ((const int64_t *)a->values)[i];
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                    n++;
                }
                int64_t min = 0, max = 0;
                if (n > 0) {
                    CHECK_OK(vf_pq_stats_i64(pf, g, 0, &min, &max));
                    CHECK(min == lo && max == hi);
                }
            }
            vf_pq_close(pf);
        }
        for (int g = 0; g < groups; g++)
            for (int f = 0; f < num_fields; f++)
                free_array(&written[g][f]);
        for (int f = 0; f < num_fields; f++)
            free_array(&types[f]);
        free(path);
    }
}

/* A LeRobot-shaped data file: list<float32>[6] vectors, float32 timestamps,
 * int64 indices, one row group per episode, `huggingface` metadata. */
static void test_lerobot_shape(const char *dir)
{
    char *path = vf_path_join(dir, "file-000.parquet");
    static const int64_t lengths[3] = {5, 7, 3};
    vf_pq_writer *w = NULL;
    CHECK_OK(vf_pq_writer_open(&w, path, NULL));
    CHECK_OK(vf_pq_writer_add_kv(w, "huggingface", "{\"info\": {\"features\": {}}}"));
    int64_t start = 0;
    for (int e = 0; e < 3 && w; e++) {
        int64_t n = lengths[e];
        float action[7 * 6], ts[7];
        int64_t offs[8], frame[7], episode[7], index[7], task[7];
        for (int64_t i = 0; i < n; i++) {
            for (int k = 0; k < 6; k++)
                action[i * 6 + k] = (float)(start + i) * 0.01f + (float)k;
            ts[i] = (float)((double)i / 30.0);
            frame[i] = i;
            episode[i] = e;
            index[i] = start + i;
            task[i] = 0;
        }
        for (int64_t i = 0; i <= n; i++)
            offs[i] = i * 6;
        vf_pq_array element;
        memset(&element, 0, sizeof element);
        element.type = VF_PQ_T_FLOAT;
        element.name = "element";
        element.length = n * 6;
        element.values = action;
        vf_pq_array f[6];
        memset(f, 0, sizeof f);
        f[0].type = VF_PQ_T_LIST;
        f[0].name = "action";
        f[0].length = n;
        f[0].offsets = offs;
        f[0].num_children = 1;
        f[0].children = &element;
        f[1] = int64_array("frame_index", frame, n);
        f[1].type = VF_PQ_T_FLOAT;
        f[1].name = "timestamp";
        f[1].values = ts;
        f[2] = int64_array("frame_index", frame, n);
        f[3] = int64_array("episode_index", episode, n);
        f[4] = int64_array("index", index, n);
        f[5] = int64_array("task_index", task, n);
        CHECK_OK(vf_pq_writer_write_row_group(w, f, 6));
        start += n;
    }
    CHECK_OK(vf_pq_writer_close(w));
    vf_pq_file *pf = NULL;
    CHECK_OK(vf_pq_open_path(&pf, path));
    if (pf) {
        CHECK_EQ_INT(vf_pq_num_row_groups(pf), 3);
        CHECK(strstr(vf_pq_kv(pf, "huggingface"), "features") != NULL);
        const vf_pq_node *leaf = vf_pq_leaf(pf, 0);
        CHECK(leaf && leaf->max_def == 3 && leaf->max_rep == 1 && leaf->physical == VF_PQ_FLOAT);
        CHECK_EQ_INT(vf_pq_column_codec(pf, 0, 0), VF_PQ_SNAPPY);
        int64_t lo, hi;
        for (int e = 0; e < 3; e++) {
            CHECK_EQ_INT(vf_pq_row_group_rows(pf, e), lengths[e]);
            /* one leaf per field here, so leaf index == field index */
            CHECK_OK(vf_pq_stats_i64(pf, e, vf_pq_field_index(pf, "episode_index"), &lo, &hi));
            CHECK(lo == e && hi == e);
        }
        int *groups = NULL, count = 0;
        CHECK_OK(vf_pq_select_row_groups(pf, "index", 6, 8, &groups, &count));
        CHECK(count == 1 && groups && groups[0] == 1);
        free(groups);
        vf_pq_array ts;
        CHECK_OK(vf_pq_read_field_all(pf, vf_pq_field_index(pf, "timestamp"), &ts));
        CHECK(ts.type == VF_PQ_T_FLOAT && ts.length == 15 && ts.valid == NULL);
        if (ts.length == 15)
            CHECK(((float *)ts.values)[5 + 2] == (float)(2.0 / 30.0));
        vf_pq_array_free(&ts);
        vf_pq_array act;
        CHECK_OK(vf_pq_read_field(pf, 2, 0, &act));
        CHECK(act.type == VF_PQ_T_LIST && act.length == 3 && act.offsets[3] - act.offsets[0] == 18);
        if (act.num_children == 1 && act.children[0].length >= 18)
            CHECK(((float *)act.children[0].values)[act.offsets[0] + 6] == (float)13 * 0.01f + 0.0f);
        vf_pq_array_free(&act);
        vf_pq_close(pf);
    }
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
    test_random_roundtrip(dir);
    test_lerobot_shape(dir);
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_parquet_writer");
}
