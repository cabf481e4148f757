/*
 * test_parquet_reader.c: the Parquet reader on a real LeRobot file and on
 * hostile input.
 *
 *  - A fixture data file: schema (7 leaves, levels), row counts, list
 *    offsets, index contiguity, timestamp == (float)(frame_index / 30.0),
 *    statistics and row-group selection, read_field vs read_field_all.
 *  - The RLE/bit-packed hybrid for every width 0..32 against an encoder
 *    written here (bit-packed, RLE and mixed runs, truncated data).
 *  - Hostile files, built in memory from the real file's bytes (truncated
 *    at many offsets, bad magics, footer length past the file, random byte
 *    flips in the footer and in the pages) and from a small file written
 *    here with a minimal Thrift encoder, then broken on purpose (huge list
 *    sizes, num_children, num_values, page sizes past the end, bit widths
 *    over 32, dictionary indices out of range, a Thrift nesting bomb and a
 *    schema nesting bomb). Each must fail with the right code and a
 *    message naming the file, and never crash (ASan/UBSan builds run this).
 *  - Concurrent reads of one open file from several threads.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/parquet.h"
#include "parquet/read_internal.h"
#include "parquet/thrift.h"
#include "testutil.h"

static const char *FIXTURE = "lerobot-g1-v21/data/chunk-000/episode_000000.parquet";

/* ---- helpers ------------------------------------------------------------- */

static int open_mem(const void *data, size_t len, const char *name, vf_pq_file **f)
{
    vf_source *src;
    int r = vf_source_open_memory(&src, name, data, len, 1);
    if (r < 0)
        return r;
    r = vf_pq_open(f, src);
    vf_source_close(src);
    return r;
}

/* Reads every field of every row group and of the whole file; returns 0
 * or the first error. */
static int read_everything(vf_pq_file *f)
{
    int first = 0;
    for (int g = 0; g < vf_pq_num_row_groups(f); g++)
        for (int i = 0; i < vf_pq_num_fields(f); i++) {
            vf_pq_array a;
            int r = vf_pq_read_field(f, g, i, &a);
            if (r < 0 && !first)
                first = r;
            vf_pq_array_free(&a);
        }
    for (int i = 0; i < vf_pq_num_fields(f); i++) {
        vf_pq_array a;
        int r = vf_pq_read_field_all(f, i, &a);
        if (r < 0 && !first)
            first = r;
        vf_pq_array_free(&a);
    }
    return first;
}

/* Opens and reads a hostile buffer: it may fail anywhere but must not
 * crash, and a failure must name the file. Returns the result. */
static int try_hostile(const uint8_t *data, size_t len, const char *name)
{
    vf_pq_file *f = NULL;
    int r = open_mem(data, len, name, &f);
    if (r == 0) {
        vf_pq_set_limits(f, (int64_t)1 << 24, (int64_t)1 << 28);
        r = read_everything(f);
        vf_pq_close(f);
    }
    if (r < 0) {
        CHECK(strstr(vf_last_error(), name) != NULL);
        CHECK(r == VF_ECORRUPT || r == VF_EUNSUPPORTED || r == VF_ERANGE || r == VF_ENOENT);
    }
    return r;
}

/* ---- the real file ---------------------------------------------------------- */

static void test_fixture(void)
{
    char *path = vf_test_fixture(FIXTURE);
    vf_pq_file *f;
    CHECK_OK(vf_pq_open_path(&f, path));
    if (!f) {
        free(path);
        return;
    }
    CHECK_EQ_INT(vf_pq_num_leaves(f), 7);
    CHECK_EQ_INT(vf_pq_num_fields(f), 7);
    CHECK_EQ_INT(vf_pq_num_rows(f), 479);
    CHECK_EQ_INT(vf_pq_num_row_groups(f), 1);
    CHECK_EQ_INT(vf_pq_row_group_rows(f, 0), 479);
    CHECK(strncmp(vf_pq_created_by(f), "parquet-cpp-arrow", 17) == 0);
    CHECK(vf_pq_kv(f, "huggingface") != NULL);
    CHECK(vf_pq_kv(f, "ARROW:schema") != NULL);
    CHECK(vf_pq_kv(f, "nope") == NULL);
    CHECK_EQ_INT(vf_pq_num_kv(f), 2);

    int state = vf_pq_field_index(f, "observation.state");
    CHECK_EQ_INT(state, 0);
    CHECK_EQ_INT(vf_pq_field_index(f, "observation"), -1);
    const vf_pq_node *leaf = vf_pq_leaf(f, 0);
    CHECK(!strcmp(leaf->name, "element"));
    CHECK_EQ_INT(leaf->max_def, 3);
    CHECK_EQ_INT(leaf->max_rep, 1);
    CHECK_EQ_INT(leaf->type, VF_PQ_T_FLOAT);
    CHECK_EQ_INT(vf_pq_field(f, 0)->type, VF_PQ_T_LIST);
    CHECK_EQ_INT(vf_pq_leaf(f, 5)->max_def, 1);
    CHECK_EQ_INT(vf_pq_leaf(f, 5)->max_rep, 0);
    CHECK_EQ_INT(vf_pq_column_codec(f, 0, 0), VF_PQ_SNAPPY);

    vf_pq_array st, idx, ts, fi, ep;
    CHECK_OK(vf_pq_read_field(f, 0, state, &st));
    CHECK_EQ_INT(st.type, VF_PQ_T_LIST);
    CHECK_EQ_INT(st.length, 479);
    CHECK(st.valid == NULL);
    CHECK_EQ_INT(st.num_children, 1);
    CHECK_EQ_INT(st.children[0].length, 479 * 26);
    CHECK_EQ_INT(st.children[0].type, VF_PQ_T_FLOAT);
    int offsets_ok = 1;
    for (int64_t i = 0; i <= st.length; i++)
        offsets_ok &= st.offsets[i] == i * 26;
    CHECK(offsets_ok);

    CHECK_OK(vf_pq_read_field(f, 0, vf_pq_field_index(f, "index"), &idx));
    CHECK_OK(vf_pq_read_field(f, 0, vf_pq_field_index(f, "timestamp"), &ts));
    CHECK_OK(vf_pq_read_field(f, 0, vf_pq_field_index(f, "frame_index"), &fi));
    CHECK_OK(vf_pq_read_field(f, 0, vf_pq_field_index(f, "episode_index"), &ep));
    CHECK_EQ_INT(idx.type, VF_PQ_T_INT64);
    CHECK_EQ_INT(idx.length, 479);
    const int64_t *iv = idx.values, *fv = fi.values, *ev = ep.values;
    const float *tv = ts.values;
    int contiguous = 1, times = 1, episode = 1;
    for (int64_t i = 0; i < idx.length; i++) {
        contiguous &= iv[i] == iv[0] + i;
        times &= tv[i] == (float)(fv[i] / 30.0);
        episode &= ev[i] == 0;
    }
    CHECK(contiguous);
    CHECK(times);
    CHECK(episode);
    CHECK_EQ_INT(iv[0], 0);

    int64_t mn, mx;
    CHECK_OK(vf_pq_stats_i64(f, 0, 5, &mn, &mx));
    CHECK_EQ_INT(mn, 0);
    CHECK_EQ_INT(mx, 478);
    CHECK_ERR(vf_pq_stats_i64(f, 0, 0, &mn, &mx), VF_EINVAL, "not an integer");
    CHECK_ERR(vf_pq_stats_i64(f, 1, 5, &mn, &mx), VF_ERANGE, "row group 1");
    int *groups, count;
    CHECK_OK(vf_pq_select_row_groups(f, "index", 100, 200, &groups, &count));
    CHECK_EQ_INT(count, 1);
    free(groups);
    CHECK_OK(vf_pq_select_row_groups(f, "index", 479, 1000, &groups, &count));
    CHECK_EQ_INT(count, 0);
    free(groups);
    CHECK_ERR(vf_pq_select_row_groups(f, "missing", 0, 1, &groups, &count), VF_ENOENT, "missing");

    /* The whole-file read equals the row-group read. */
    vf_pq_array all;
    CHECK_OK(vf_pq_read_field_all(f, state, &all));
    CHECK_EQ_INT(all.length, st.length);
    CHECK(all.children && !memcmp(all.children[0].values, st.children[0].values, 479 * 26 * sizeof(float)));

    vf_pq_array bad;
    CHECK_ERR(vf_pq_read_field(f, 1, 0, &bad), VF_ERANGE, "row group 1");
    CHECK_ERR(vf_pq_read_field(f, 0, 7, &bad), VF_ERANGE, "field index 7");

    vf_pq_array_free(&all);
    vf_pq_array_free(&st);
    vf_pq_array_free(&idx);
    vf_pq_array_free(&ts);
    vf_pq_array_free(&fi);
    vf_pq_array_free(&ep);
    vf_pq_array_free(&st); /* safe on a zeroed array */
    vf_pq_close(f);
    free(path);

    /* A few more files: timestamps and contiguity hold in every one. */
    const char *more[] = {"episode_000031.parquet", "episode_000077.parquet", "episode_000099.parquet"};
    for (size_t k = 0; k < VF_ARRAY_LEN(more); k++) {
        char *rel = vf_asprintf("lerobot-g1-v21/data/chunk-000/%s", more[k]);
        char *p = vf_test_fixture(rel);
        CHECK_OK(vf_pq_open_path(&f, p));
        if (f) {
            CHECK_OK(vf_pq_read_field_all(f, vf_pq_field_index(f, "timestamp"), &ts));
            CHECK_OK(vf_pq_read_field_all(f, vf_pq_field_index(f, "frame_index"), &fi));
            CHECK_OK(vf_pq_read_field_all(f, vf_pq_field_index(f, "action"), &st));
            CHECK_EQ_INT(st.children[0].length, st.length * 26);
            int ok = ts.length == vf_pq_num_rows(f);
            for (int64_t i = 0; ok && i < ts.length; i++)
                ok = ((const float *)ts.values)[i] == (float)(((const int64_t *)fi.values)[i] / 30.0);
            CHECK(ok);
            vf_pq_array_free(&ts);
            vf_pq_array_free(&fi);
            vf_pq_array_free(&st);
            vf_pq_close(f);
        }
        free(p);
        free(rel);
    }
    CHECK_ERR(vf_pq_open_path(&f, "/nonexistent/file.parquet"), VF_ENOENT, "/nonexistent/file.parquet");
}

/* ---- RLE / bit-packed hybrid ------------------------------------------------- */

static void put_varint(vf_buf *b, uint64_t v)
{
    while (v >= 0x80) {
        vf_buf_append_u8(b, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    vf_buf_append_u8(b, (uint8_t)v);
}

/* Encodes vals (n a multiple of 8 for the packed parts) as alternating
 * bit-packed and RLE runs, so both kinds and their switches are tested. */
static void rle_encode(vf_buf *b, const uint32_t *vals, int64_t n, int width)
{
    int64_t i = 0;
    int packed = 1;
    while (i < n) {
        if (packed || n - i < 8) {
            int64_t groups = VF_MIN((n - i + 7) / 8, 3);
            put_varint(b, (uint64_t)groups << 1 | 1);
            uint64_t acc = 0;
            int bits = 0;
            for (int64_t k = 0; k < groups * 8; k++) {
                uint64_t v = i + k < n ? vals[i + k] : 0;
                acc |= v << bits;
                bits += width;
                while (bits >= 8) {
                    vf_buf_append_u8(b, (uint8_t)acc);
                    acc >>= 8;
                    bits -= 8;
                }
            }
            i += groups * 8;
        } else {
            int64_t run = 1;
            while (i + run < n && vals[i + run] == vals[i] && run < 50)
                run++;
            put_varint(b, (uint64_t)run << 1);
            for (int k = 0; k < (width + 7) / 8; k++)
                vf_buf_append_u8(b, (uint8_t)(vals[i] >> (8 * k)));
            i += run;
        }
        packed = !packed;
    }
}

static void test_rle(void)
{
    uint64_t seed = 12345;
    for (int width = 0; width <= 32; width++) {
        const int64_t n = 1000;
        uint32_t vals[1000], out[1000];
        uint32_t mask = width == 32 ? 0xffffffffu : (1u << width) - 1;
        for (int64_t i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            /* runs of repeats mixed with noise */
            vals[i] = (i % 97 < 40 && i > 0) ? vals[i - 1] : (uint32_t)(seed >> 29) & mask;
        }
        vf_buf b = {0};
        rle_encode(&b, vals, n, width);
        vf_pq_rle d;
        vf_pq_rle_init(&d, b.data, b.len, width);
        /* Odd batch sizes cross group and run boundaries. */
        int64_t done = 0, step = 1;
        int ok = 1;
        while (done < n) {
            int64_t k = VF_MIN(step, n - done);
            ok &= vf_pq_rle_read_u32(&d, out + done, k) == 0;
            done += k;
            step = step * 3 % 17 + 1;
        }
        ok &= !memcmp(vals, out, sizeof vals);
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "  rle width %d failed\n", width);
        if (width <= 8) {
            uint8_t out8[1000];
            vf_pq_rle_init(&d, b.data, b.len, width);
            int ok8 = vf_pq_rle_read_u8(&d, out8, n) == 0;
            for (int64_t i = 0; i < n; i++)
                ok8 &= out8[i] == vals[i];
            CHECK(ok8);
        }
        /* Skipping then reading gives the values after the skip, for
         * skips ending inside runs, inside bit-packed groups and at their
         * boundaries (page-level reads step over the indices before a
         * row range). */
        for (int64_t skip = 0; skip <= n; skip += skip < 24 ? 1 : 37) {
            uint32_t rest[1000];
            vf_pq_rle_init(&d, b.data, b.len, width);
            int64_t first = skip / 3;
            int oks = vf_pq_rle_read_u32(&d, rest, first) == 0 && vf_pq_rle_skip(&d, skip - first) == 0 &&
                      vf_pq_rle_read_u32(&d, rest, n - skip) == 0 && !memcmp(rest, vals + skip,
                                                                            (size_t)(n - skip) * sizeof *rest);
            CHECK(oks);
            if (!oks)
                fprintf(stderr, "  rle skip %lld width %d failed\n", (long long)skip, width);
        }
        /* Skipping past the data fails (except width 0), truncated data
         * never reads out of bounds. */
        vf_pq_rle_init(&d, b.data, b.len, width);
        CHECK(width == 0 ? vf_pq_rle_skip(&d, n + 100) == 0 : vf_pq_rle_skip(&d, n + 100) < 0);
        for (size_t cut = 0; cut < b.len; cut += 5) {
            vf_pq_rle_init(&d, b.data, cut, width);
            (void)vf_pq_rle_skip(&d, n / 2);
        }
        /* Reading past the data fails (except width 0, all zeros). */
        vf_pq_rle_init(&d, b.data, b.len, width);
        uint32_t big[1100];
        int r = vf_pq_rle_read_u32(&d, big, 1100);
        CHECK(width == 0 ? r == 0 : r < 0);
        /* Truncated data never reads out of bounds (ASan checks). */
        for (size_t cut = 0; cut < b.len; cut += 7) {
            vf_pq_rle_init(&d, b.data, cut, width);
            (void)vf_pq_rle_read_u32(&d, big, n);
        }
        vf_buf_free(&b);
    }
    /* An RLE value wider than the bit width is rejected. */
    uint8_t bad[] = {0x10, 0xff}; /* run of 8, value 255, width 3 */
    vf_pq_rle d;
    uint32_t out[8];
    vf_pq_rle_init(&d, bad, sizeof bad, 3);
    CHECK(vf_pq_rle_read_u32(&d, out, 8) < 0);
    /* Row starts straight from width-1 runs. */
    uint32_t rep[64];
    for (int i = 0; i < 64; i++)
        rep[i] = i % 13 != 0;
    vf_buf b = {0};
    rle_encode(&b, rep, 64, 1);
    int64_t pos[64];
    vf_pq_rle_init(&d, b.data, b.len, 1);
    int64_t cnt = vf_pq_rle_zero_positions(&d, 64, 100, pos);
    CHECK_EQ_INT(cnt, 5);
    for (int i = 0; i < 5 && cnt == 5; i++)
        CHECK_EQ_INT(pos[i], 100 + 13 * i);
    vf_buf_free(&b);
}

/* ---- a tiny Parquet writer for precise corruption ------------------------------ */

typedef struct tw {
    vf_buf b;
    int16_t last[16];
    int depth;
} tw;

static void tw_field(tw *t, int id, int type)
{
    int delta = id - t->last[t->depth];
    if (delta > 0 && delta <= 15) {
        vf_buf_append_u8(&t->b, (uint8_t)(delta << 4 | type));
    } else {
        vf_buf_append_u8(&t->b, (uint8_t)type);
        put_varint(&t->b, (uint64_t)((id << 1) ^ (id >> 15)));
    }
    t->last[t->depth] = (int16_t)id;
}
static void tw_i32(tw *t, int id, int64_t v)
{
    tw_field(t, id, VF_TC_I32);
    put_varint(&t->b, (uint64_t)((v << 1) ^ (v >> 63)));
}
static void tw_i64(tw *t, int id, int64_t v)
{
    tw_field(t, id, VF_TC_I64);
    put_varint(&t->b, (uint64_t)((v << 1) ^ (v >> 63)));
}
static void tw_str(tw *t, int id, const char *s)
{
    tw_field(t, id, VF_TC_BINARY);
    put_varint(&t->b, strlen(s));
    vf_buf_append(&t->b, s, strlen(s));
}
static void tw_begin(tw *t, int id) /* id < 0: a list element */
{
    if (id >= 0)
        tw_field(t, id, VF_TC_STRUCT);
    t->last[++t->depth] = 0;
}
static void tw_end(tw *t)
{
    vf_buf_append_u8(&t->b, 0);
    t->depth--;
}
static void tw_list(tw *t, int id, int etype, uint64_t n)
{
    tw_field(t, id, VF_TC_LIST);
    if (n < 15) {
        vf_buf_append_u8(&t->b, (uint8_t)(n << 4 | (uint64_t)etype));
    } else {
        vf_buf_append_u8(&t->b, (uint8_t)(0xf0 | etype));
        put_varint(&t->b, n);
    }
}

/* What to break in the small file. */
typedef struct spec {
    int bit_width;          /* dictionary index width byte (2) */
    uint32_t bad_index;     /* 0: none; else index 7 becomes this */
    int64_t page_size_add;  /* added to the data page's compressed size */
    int64_t num_values_add; /* added to the chunk's num_values */
    int64_t chunk_len_add;  /* added to total_compressed_size */
    uint64_t num_children;  /* root's num_children (1) */
    int skip_dictionary;    /* leave the dictionary page out */
    int data_first;         /* data page before the dictionary page */
    int bitpacked_def;      /* def levels 1,0,1,1,0,1,1,1 as deprecated BIT_PACKED */
} spec;

/* One column `optional int32 x`, 8 rows: dictionary {10, 20, 30}, a v1
 * data page with def levels (all 1) and RLE_DICTIONARY indices
 * 0,1,2,0,1,2,0,1. Uncompressed. */
static void build_file(const spec *s, vf_buf *out)
{
    vf_buf dict = {0}, data = {0};
    for (int32_t v = 10; v <= 30; v += 10)
        vf_buf_append(&dict, &v, 4);
    /* def levels: RLE run of 8 ones, width 1, with the 4-byte prefix; or
     * 10110111 packed MSB-first without a prefix */
    uint8_t lv[] = {2, 0, 0, 0, 8 << 1, 1};
    if (s->bitpacked_def)
        vf_buf_append_u8(&data, 0xb7);
    else
        vf_buf_append(&data, lv, sizeof lv);
    vf_buf_append_u8(&data, (uint8_t)s->bit_width);
    uint32_t idx[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    if (s->bad_index)
        idx[7] = s->bad_index;
    rle_encode(&data, idx, s->bitpacked_def ? 6 : 8, s->bit_width > 32 ? 2 : s->bit_width);

    vf_buf file = {0};
    vf_buf_append(&file, "PAR1", 4);
    int64_t dict_off = -1, data_off = 0;
    for (int pass = 0; pass < 2; pass++) {
        int is_dict = s->data_first ? pass == 1 : pass == 0;
        if (is_dict && s->skip_dictionary)
            continue;
        tw h = {0};
        tw_begin(&h, -1);
        tw_i32(&h, 1, is_dict ? VF_PQ_PAGE_DICTIONARY : VF_PQ_PAGE_DATA);
        tw_i32(&h, 2, (int64_t)(is_dict ? dict.len : data.len));
        tw_i32(&h, 3, (int64_t)(is_dict ? dict.len : data.len) + (is_dict ? 0 : s->page_size_add));
        tw_begin(&h, is_dict ? 7 : 5);
        if (is_dict) {
            tw_i32(&h, 1, 3);
            tw_i32(&h, 2, VF_PQ_ENC_PLAIN);
        } else {
            tw_i32(&h, 1, 8);
            tw_i32(&h, 2, VF_PQ_ENC_RLE_DICTIONARY);
            tw_i32(&h, 3, s->bitpacked_def ? VF_PQ_ENC_BIT_PACKED : VF_PQ_ENC_RLE);
            tw_i32(&h, 4, VF_PQ_ENC_RLE);
        }
        tw_end(&h);
        tw_end(&h);
        if (is_dict)
            dict_off = (int64_t)file.len;
        else
            data_off = (int64_t)file.len;
        vf_buf_append(&file, h.b.data, h.b.len);
        vf_buf_append(&file, is_dict ? dict.data : data.data, is_dict ? dict.len : data.len);
        vf_buf_free(&h.b);
    }
    int64_t start = dict_off >= 0 && dict_off < data_off ? dict_off : data_off;
    int64_t chunk_len = (int64_t)file.len - start;

    tw t = {0};
    tw_begin(&t, -1);
    tw_i32(&t, 1, 2);
    tw_list(&t, 2, VF_TC_STRUCT, 2);
    tw_begin(&t, -1);
    tw_str(&t, 4, "schema");
    tw_i32(&t, 5, (int64_t)s->num_children);
    tw_end(&t);
    tw_begin(&t, -1);
    tw_i32(&t, 1, VF_PQ_INT32);
    tw_i32(&t, 3, VF_PQ_OPTIONAL);
    tw_str(&t, 4, "x");
    tw_end(&t);
    tw_i64(&t, 3, 8);
    tw_list(&t, 4, VF_TC_STRUCT, 1);
    tw_begin(&t, -1);
    tw_list(&t, 1, VF_TC_STRUCT, 1);
    tw_begin(&t, -1);
    tw_i64(&t, 2, start);
    tw_begin(&t, 3);
    tw_i32(&t, 1, VF_PQ_INT32);
    tw_list(&t, 3, VF_TC_BINARY, 1);
    put_varint(&t.b, 1);
    vf_buf_append_u8(&t.b, 'x');
    tw_i32(&t, 4, VF_PQ_UNCOMPRESSED);
    tw_i64(&t, 5, 8 + s->num_values_add);
    tw_i64(&t, 6, chunk_len);
    tw_i64(&t, 7, chunk_len + s->chunk_len_add);
    tw_i64(&t, 9, data_off);
    if (dict_off >= 0)
        tw_i64(&t, 11, dict_off);
    tw_end(&t);
    tw_end(&t);
    tw_i64(&t, 3, 8);
    tw_end(&t);
    tw_str(&t, 6, "vlafeed test writer");
    tw_end(&t);
    vf_buf_append(&file, t.b.data, t.b.len);
    uint32_t flen = (uint32_t)t.b.len;
    vf_buf_append(&file, &flen, 4);
    vf_buf_append(&file, "PAR1", 4);
    vf_buf_free(&t.b);
    vf_buf_free(&dict);
    vf_buf_free(&data);
    *out = file;
}

static int read_x(const spec *s, const char *name, int32_t *values, uint8_t *valid)
{
    vf_buf file;
    build_file(s, &file);
    vf_pq_file *f;
    int r = open_mem(file.data, file.len, name, &f);
    vf_buf_free(&file);
    if (r < 0)
        return r;
    vf_pq_array a;
    r = vf_pq_read_field(f, 0, 0, &a);
    if (r == 0 && values && a.length == 8)
        memcpy(values, a.values, 8 * sizeof *values);
    if (r == 0 && valid && a.length == 8)
        for (int i = 0; i < 8; i++)
            valid[i] = a.valid ? a.valid[i] : 1;
    vf_pq_array_free(&a);
    vf_pq_close(f);
    return r;
}

static void test_crafted(void)
{
    const spec good = {.bit_width = 2, .num_children = 1};
    int32_t v[8] = {0};
    uint8_t valid[8] = {0};
    CHECK_OK(read_x(&good, "good.parquet", v, valid));
    const int32_t want[8] = {10, 20, 30, 10, 20, 30, 10, 20};
    CHECK(!memcmp(v, want, sizeof want));

    /* Deprecated BIT_PACKED definition levels (MSB first). */
    spec bp = good;
    bp.bitpacked_def = 1;
    CHECK_OK(read_x(&bp, "bitpacked.parquet", v, valid));
    const int32_t want_bp[8] = {10, 0, 20, 30, 0, 10, 20, 30};
    const uint8_t want_valid[8] = {1, 0, 1, 1, 0, 1, 1, 1};
    CHECK(!memcmp(v, want_bp, sizeof want_bp));
    CHECK(!memcmp(valid, want_valid, sizeof want_valid));

    spec s = good;
    s.bit_width = 33;
    CHECK_ERR(read_x(&s, "width.parquet", NULL, NULL), VF_ECORRUPT, "bit width 33");
    CHECK(strstr(vf_last_error(), "width.parquet") && strstr(vf_last_error(), "'x'"));
    s = good;
    s.bad_index = 3;
    CHECK_ERR(read_x(&s, "index.parquet", NULL, NULL), VF_ECORRUPT, "out of range");
    CHECK(strstr(vf_last_error(), "index.parquet"));
    s = good;
    s.page_size_add = 1 << 30;
    CHECK_ERR(read_x(&s, "pagesize.parquet", NULL, NULL), VF_ECORRUPT, "passes the end");
    CHECK(strstr(vf_last_error(), "pagesize.parquet"));
    s = good;
    s.num_values_add = (int64_t)1 << 40;
    CHECK_ERR(read_x(&s, "numvalues.parquet", NULL, NULL), VF_ECORRUPT, "numvalues.parquet");
    s = good;
    s.chunk_len_add = 1 << 20;
    CHECK_ERR(read_x(&s, "chunklen.parquet", NULL, NULL), VF_ECORRUPT, "outside the file");
    s = good;
    s.num_children = 1000000;
    CHECK_ERR(read_x(&s, "children.parquet", NULL, NULL), VF_ECORRUPT, "children.parquet");
    s = good;
    s.num_children = 0;
    CHECK_ERR(read_x(&s, "children0.parquet", NULL, NULL), VF_ECORRUPT, "tree uses");
    s = good;
    s.skip_dictionary = 1;
    CHECK_ERR(read_x(&s, "nodict.parquet", NULL, NULL), VF_ECORRUPT, "without a dictionary page");
    s = good;
    s.data_first = 1;
    CHECK_ERR(read_x(&s, "dictlast.parquet", NULL, NULL), VF_ECORRUPT, "dictionary-encoded data page without");
}

/* A footer made of raw Thrift bytes. */
static int open_footer(const uint8_t *footer, size_t len, const char *name)
{
    vf_buf file = {0};
    vf_buf_append(&file, "PAR1", 4);
    vf_buf_append(&file, footer, len);
    uint32_t flen = (uint32_t)len;
    vf_buf_append(&file, &flen, 4);
    vf_buf_append(&file, "PAR1", 4);
    vf_pq_file *f;
    int r = open_mem(file.data, file.len, name, &f);
    if (r == 0)
        vf_pq_close(f);
    vf_buf_free(&file);
    return r;
}

/* The skipper's in-struct fast path for short lists of integers and
 * binaries (a column chunk's encodings and path_in_schema), against the
 * general path: the same end position, the same errors. */
static void test_thrift_skip_lists(void)
{
    uint8_t ok[] = {
        0x19, 0x35, 0x02, 0x04, 0x06,             /* 1: list<i32> [1, 2, 3] */
        0x19, 0x28, 0x02, 'a', 'b', 0x01, 'c',    /* 2: list<binary> ["ab", "c"] */
        0x19, 0xf6, 0x10,                         /* 3: list<i64> of 16 (long form: general path) */
        2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
        0x19, 0x21, 0x01, 0x02,                   /* 4: list<bool> [true, false] (general path) */
        0x1a, 0x15, 0x80, 0x01,                   /* 5: set<i32> {64} (a two-byte varint) */
        0x1c, 0x19, 0x18, 0x01, 'z', 0x00,        /* 6: struct {1: list<binary> ["z"]} */
        0x00,
        'E', 'N', 'D', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-',
        '-', '-', '-', '-', '-',
    };
    size_t body = sizeof ok - 25;
    vf_pq_tr t;
    vf_pq_tr_init(&t, ok, sizeof ok, "skip-lists");
    vf_pq_tr_skip(&t, VF_TC_STRUCT);
    CHECK_EQ_INT(t.err, 0);
    CHECK_EQ_INT(t.p - ok, (int64_t)body);
    /* the same without room for the fast path (fewer than 24 bytes left
     * is the general path all the way): the same end */
    vf_pq_tr_init(&t, ok, body, "skip-lists-short");
    vf_pq_tr_skip(&t, VF_TC_STRUCT);
    CHECK_EQ_INT(t.err, 0);
    CHECK_EQ_INT(t.p - ok, (int64_t)body);
    /* a binary element longer than what is left: refused, not skipped past */
    uint8_t bad[40] = {0x19, 0x18, 0x7f, 'x'};
    vf_pq_tr_init(&t, bad, sizeof bad, "skip-bad");
    vf_pq_tr_skip(&t, VF_TC_STRUCT);
    CHECK(t.err == VF_ECORRUPT && strstr(vf_last_error(), "binary length past the end"));
    /* nested structs and short lists of structs (a column chunk's
     * meta_data, statistics, encoding_stats) on the fast path: the same end
     * as the general path, which a buffer with no slack forces */
    uint8_t nested[] = {
        0x1c,                                     /* 1: struct { */
        0x15, 0x04,                               /*   1: i32 2 */
        0x1c, 0x18, 0x02, 'm', 'n', 0x00,         /*   2: struct {1: binary "mn"} */
        0x19, 0x2c,                               /*   3: list<struct> of 2 */
        0x15, 0x02, 0x15, 0x04, 0x00,             /*     {1: 1, 2: 2} */
        0x15, 0x06, 0x00,                         /*     {1: 3} */
        0x19, 0x0c,                               /*   4: list<struct> of 0 */
        0x16, 0x0a,                               /*   5: i64 5 */
        0x00,                                     /* } */
        0x15, 0x08,                               /* 2: i32 4 */
        0x00,
        'E', 'N', 'D', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-',
        '-', '-', '-', '-', '-',
    };
    size_t nested_body = sizeof nested - 25;
    vf_pq_tr_init(&t, nested, sizeof nested, "skip-nested");
    vf_pq_tr_skip(&t, VF_TC_STRUCT);
    CHECK_EQ_INT(t.err, 0);
    CHECK_EQ_INT(t.p - nested, (int64_t)nested_body);
    vf_pq_tr_init(&t, nested, nested_body, "skip-nested-short");
    vf_pq_tr_skip(&t, VF_TC_STRUCT);
    CHECK_EQ_INT(t.err, 0);
    CHECK_EQ_INT(t.p - nested, (int64_t)nested_body);
    /* structs nested past the limit on the fast path: refused */
    uint8_t deep[VF_PQ_THRIFT_MAX_DEPTH * 2 + 64];
    memset(deep, 0x1c, sizeof deep); /* field 1: struct, again and again */
    vf_pq_tr_init(&t, deep, sizeof deep, "skip-deep");
    vf_pq_tr_skip(&t, VF_TC_STRUCT);
    CHECK(t.err == VF_ECORRUPT && strstr(vf_last_error(), "nested too deeply"));
    /* a varint element that never ends */
    uint8_t endless[40] = {0x19, 0x15};
    memset(endless + 2, 0xff, 12);
    vf_pq_tr_init(&t, endless, sizeof endless, "skip-varint");
    vf_pq_tr_skip(&t, VF_TC_STRUCT);
    CHECK(t.err == VF_ECORRUPT && strstr(vf_last_error(), "varint"));
}

static void test_hostile_thrift(void)
{
    /* Thrift nesting bomb: field 1 of type struct, 10000 levels deep. */
    vf_buf b = {0};
    for (int i = 0; i < 10000; i++)
        vf_buf_append_u8(&b, 0x1c);
    CHECK_ERR(open_footer(b.data, b.len, "bomb.parquet"), VF_ECORRUPT, "nested too deeply");
    CHECK(strstr(vf_last_error(), "bomb.parquet"));
    /* The same through lists of lists (skipped as an unknown field 9). */
    b.len = 0;
    vf_buf_append_u8(&b, 0x09);
    vf_buf_append_u8(&b, 0x12); /* field id zigzag 9 */
    for (int i = 0; i < 10000; i++)
        vf_buf_append_u8(&b, 0x19); /* list of 1 list */
    CHECK_ERR(open_footer(b.data, b.len, "listbomb.parquet"), VF_ECORRUPT, "listbomb.parquet");
    /* A list claiming 2^31 schema elements. */
    tw t = {0};
    tw_begin(&t, -1);
    tw_list(&t, 2, VF_TC_STRUCT, (uint64_t)1 << 31);
    CHECK_ERR(open_footer(t.b.data, t.b.len, "hugelist.parquet"), VF_ECORRUPT, "list size larger");
    CHECK(strstr(vf_last_error(), "hugelist.parquet"));
    vf_buf_free(&t.b);
    /* A binary length past the end. */
    uint8_t binbomb[] = {0x68, 0xff, 0xff, 0xff, 0xff, 0x0f};
    CHECK_ERR(open_footer(binbomb, sizeof binbomb, "bin.parquet"), VF_ECORRUPT, "binary length");
    /* A varint that never ends. */
    uint8_t varbomb[] = {0x15, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    CHECK_ERR(open_footer(varbomb, sizeof varbomb, "varint.parquet"), VF_ECORRUPT, "varint.parquet");
    /* Unknown fields of every type are skipped: a valid empty schema
     * preceded by fields 20..27 (i8, i16, i32, i64, double, binary, set,
     * map) and a struct 28. */
    uint8_t skip[] = {
        0x03, 0x28, 0x7f,                   /* 20: i8 */
        0x14, 0x05,                         /* 21: i16 */
        0x15, 0x07,                         /* 22: i32 */
        0x16, 0x09,                         /* 23: i64 */
        0x17, 1, 2, 3, 4, 5, 6, 7, 8,       /* 24: double */
        0x18, 0x02, 'h', 'i',               /* 25: binary */
        0x1a, 0x21, 0x01, 0x02,             /* 26: set<bool> of 2: true, false */
        0x1b, 0x01, 0x55, 0x02, 0x04,       /* 27: map<i32,i32> of 1 */
        0x1c, 0x11, 0x00,                   /* 28: struct {1: true} */
        0x09, 0x04, 0x1c, 0x48, 0x04, 'r', 'o', 'o', 't', 0x00, /* 2: schema [root] */
        0x16, 0x00,                         /* 3: num_rows 0 */
        0x00,
    };
    vf_pq_file *f;
    vf_buf file = {0};
    vf_buf_append(&file, "PAR1", 4);
    vf_buf_append(&file, skip, sizeof skip);
    uint32_t flen = sizeof skip;
    vf_buf_append(&file, &flen, 4);
    vf_buf_append(&file, "PAR1", 4);
    CHECK_OK(open_mem(file.data, file.len, "skip.parquet", &f));
    if (f) {
        CHECK_EQ_INT(vf_pq_num_fields(f), 0);
        CHECK_EQ_INT(vf_pq_num_rows(f), 0);
        vf_pq_close(f);
    }
    vf_buf_free(&file);
    /* A schema nesting bomb: 200 groups each with one child. */
    tw s = {0};
    tw_begin(&s, -1);
    tw_list(&s, 2, VF_TC_STRUCT, 201);
    for (int i = 0; i < 200; i++) {
        tw_begin(&s, -1);
        tw_i32(&s, 3, VF_PQ_OPTIONAL);
        tw_str(&s, 4, "g");
        tw_i32(&s, 5, 1);
        tw_end(&s);
    }
    tw_begin(&s, -1);
    tw_i32(&s, 1, VF_PQ_INT32);
    tw_i32(&s, 3, VF_PQ_OPTIONAL);
    tw_str(&s, 4, "leaf");
    tw_end(&s);
    tw_i64(&s, 3, 0);
    tw_end(&s);
    CHECK_ERR(open_footer(s.b.data, s.b.len, "deep.parquet"), VF_EUNSUPPORTED, "nested deeper");
    CHECK(strstr(vf_last_error(), "deep.parquet"));
    vf_buf_free(&s.b);
    vf_buf_free(&b);
}

/* ---- hostile versions of the real file --------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_hostile_real(void)
{
    char *path = vf_test_fixture(FIXTURE);
    uint8_t *data;
    size_t size;
    CHECK_OK(vf_read_file(path, &data, &size));
    free(path);
    if (!data)
        return;
    CHECK_OK(try_hostile(data, size, "intact.parquet"));

    /* Truncated at many offsets: no tail magic any more. */
    for (size_t cut = 0; cut < size; cut += size / 97 + 1)
        CHECK_ERR(try_hostile(data, cut, "truncated.parquet"), VF_ECORRUPT, "truncated.parquet");
    uint32_t footer_len;
    memcpy(&footer_len, data + size - 8, 4);
    size_t footer_start = size - 8 - footer_len;
    /* Column data cut out but the footer kept: chunks point past the end. */
    int failures = 0;
    for (size_t keep = 4; keep < footer_start; keep += footer_start / 41 + 1) {
        size_t len = keep + (size - footer_start);
        uint8_t *buf = vf_malloc(len);
        memcpy(buf, data, keep);
        memcpy(buf + keep, data + footer_start, size - footer_start);
        failures += try_hostile(buf, len, "gutted.parquet") < 0;
        free(buf);
    }
    CHECK(failures > 30);

    uint8_t *buf = vf_malloc(size);
    memcpy(buf, data, size);
    memcpy(buf, "PAR2", 4);
    CHECK_ERR(try_hostile(buf, size, "head.parquet"), VF_ECORRUPT, "no PAR1 magic at the start");
    memcpy(buf, data, size);
    memcpy(buf + size - 4, "PAR0", 4);
    CHECK_ERR(try_hostile(buf, size, "tail.parquet"), VF_ECORRUPT, "no PAR1 magic at the end");
    memcpy(buf, data, size);
    uint32_t huge = (uint32_t)size;
    memcpy(buf + size - 8, &huge, 4);
    CHECK_ERR(try_hostile(buf, size, "footerlen.parquet"), VF_ECORRUPT, "does not fit");
    huge = 0xffffffffu;
    memcpy(buf + size - 8, &huge, 4);
    CHECK_ERR(try_hostile(buf, size, "footerlen.parquet"), VF_ECORRUPT, "does not fit");
    huge = footer_len - 100; /* footer starts mid-struct */
    memcpy(buf + size - 8, &huge, 4);
    CHECK(try_hostile(buf, size, "shortfooter.parquet") < 0);

    /* Random byte flips in the footer, then in the pages. */
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int footer_fail = 0, page_fail = 0;
    for (int round = 0; round < 400; round++) {
        memcpy(buf, data, size);
        int in_footer = round < 200;
        int flips = 1 + (int)(rng_next(&seed) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = in_footer ? footer_start + rng_next(&seed) % footer_len : 4 + rng_next(&seed) % (footer_start - 4);
            buf[at] ^= (uint8_t)(1u << (rng_next(&seed) % 8));
            if (rng_next(&seed) % 4 == 0)
                buf[at] = (uint8_t)rng_next(&seed);
        }
        int r = try_hostile(buf, size, in_footer ? "flip-footer.parquet" : "flip-pages.parquet");
        if (in_footer)
            footer_fail += r < 0;
        else
            page_fail += r < 0;
    }
    /* Many flips must be detected; some only change a value, a statistic
     * or a literal inside compressed float data, which is not an error. */
    printf("byte flips detected: footer %d/200, pages %d/200\n", footer_fail, page_fail);
    CHECK(footer_fail > 50);
    CHECK(page_fail > 10);
    free(buf);
    free(data);
}

/* ---- concurrent reads of one file ---------------------------------------------------- */

typedef struct reader_job {
    vf_pq_file *f;
    int field;
    int rounds;
    int failures;
    double checksum;
} reader_job;

static double array_sum(const vf_pq_array *a)
{
    double s = (double)a->length;
    if (a->type == VF_PQ_T_FLOAT)
        for (int64_t i = 0; i < a->length; i++)
            s += ((const float *)a->values)[i];
    if (a->type == VF_PQ_T_INT64)
        for (int64_t i = 0; i < a->length; i++)
            s += (double)((const int64_t *)a->values)[i];
    for (int c = 0; c < a->num_children; c++)
        s += array_sum(&a->children[c]);
    return s;
}

static void *reader_thread(void *arg)
{
    reader_job *j = arg;
    for (int k = 0; k < j->rounds; k++) {
        vf_pq_array a;
        if (vf_pq_read_field_all(j->f, j->field, &a) < 0) {
            j->failures++;
            continue;
        }
        double s = array_sum(&a);
        if (k == 0)
            j->checksum = s;
        else if (s != j->checksum)
            j->failures++;
        vf_pq_array_free(&a);
    }
    return NULL;
}

static void test_concurrent_reads(void)
{
    char *path = vf_test_fixture(FIXTURE);
    vf_pq_file *f;
    CHECK_OK(vf_pq_open_path(&f, path));
    free(path);
    if (!f)
        return;
    reader_job jobs[6];
    pthread_t threads[6];
    for (int i = 0; i < 6; i++) {
        jobs[i] = (reader_job){.f = f, .field = i % 3 == 2 ? 5 : i % 2, .rounds = 20};
        CHECK(pthread_create(&threads[i], NULL, reader_thread, &jobs[i]) == 0);
    }
    for (int i = 0; i < 6; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; i < 6; i++)
        CHECK_EQ_INT(jobs[i].failures, 0);
    /* Threads reading the same field agree with each other. */
    CHECK(jobs[0].checksum == jobs[4].checksum);
    CHECK(jobs[2].checksum == jobs[5].checksum);
    vf_pq_close(f);
}

int main(void)
{
    test_fixture();
    test_rle();
    test_crafted();
    test_hostile_thrift();
    test_thrift_skip_lists();
    test_hostile_real();
    test_concurrent_reads();
    return vf_test_finish("test_parquet_reader");
}
