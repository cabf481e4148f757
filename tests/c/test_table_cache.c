/* test_table_cache.c: the table cache on disk (table_cache.c, meta_cache.h
 * "the table cache") on tables built here by hand and keyed against small
 * scratch files: a round trip (store, map, find, read back the same
 * values), an empty table, misses when the keyed file changes or the
 * caller asks for other column types or widths, damaged or truncated
 * cache files (a miss with a warning, never a crash), damaged values (the
 * episode's read fails its checksum, the others still read), the parser's
 * refusals on edited in-memory files, the store's refusals, and
 * VF_TABLE_CACHE=0. VF_CACHE_DIR points at a scratch folder throughout. */
#define _GNU_SOURCE /* setenv, utimensat, pwrite */
#include "dataset/dataset.h"
#include "dataset/meta_cache.h"
#include "testutil.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- a hand-built table ----------------------------------------------------- */

/* Three episodes of 2, 3 and 1 rows; column 0: float32 x 3, column 1: int64 x 1. */
#define NE 3
#define ROWS 6
#define W0 3

static const int64_t ep_len[NE] = {2, 3, 1};
static const int64_t row_offsets[NE] = {5, 7, 20}; /* gaps between episodes are allowed */
static const int64_t episode_index[NE] = {3, 4, 9};
static const int64_t from_index[NE] = {100, 102, 105};
static const int types[2] = {VF_DS_F32, VF_DS_I64};
static const int64_t widths[2] = {W0, 1};

typedef struct table_fixture {
    vf_ds_table t;
    vf_ds_column cols[2];
    float f[ROWS * W0];
    int64_t i[ROWS];
    int64_t starts[NE + 1];
} table_fixture;

static void make_table(table_fixture *tf)
{
    memset(tf, 0, sizeof *tf);
    for (int r = 0; r < ROWS; r++) {
        for (int k = 0; k < W0; k++)
            tf->f[r * W0 + k] = (float)r * 10.0f + (float)k + 0.25f;
        tf->i[r] = 1000 + r * 7;
    }
    tf->starts[0] = 0;
    for (int e = 0; e < NE; e++)
        tf->starts[e + 1] = tf->starts[e] + ep_len[e];
    tf->cols[0] = (vf_ds_column){.type = VF_DS_F32, .width = W0, .rows = ROWS, .values = tf->f};
    tf->cols[1] = (vf_ds_column){.type = VF_DS_I64, .width = 1, .rows = ROWS, .values = tf->i};
    tf->t.rows = ROWS;
    tf->t.num_columns = 2;
    tf->t.columns = tf->cols;
    tf->t.num_episodes = NE;
    tf->t.episode_start = tf->starts;
}

/* ---- files ------------------------------------------------------------------- */

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (fp) {
        CHECK(fwrite(data, 1, len, fp) == len);
        CHECK(fclose(fp) == 0);
    }
}

/* The whole file into an 8-byte aligned (malloc'd) buffer, as the parser wants it. */
static uint8_t *read_all(const char *path, size_t *len)
{
    *len = 0;
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL);
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n + 64 : 64); /* room to append in the tests */
    CHECK(buf && fread(buf, 1, (size_t)n, fp) == (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

static void flip_byte(const char *path, uint64_t at)
{
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    uint8_t b = 0;
    CHECK(pread(fd, &b, 1, (off_t)at) == 1);
    b ^= 0x5a;
    CHECK(pwrite(fd, &b, 1, (off_t)at) == 1);
    close(fd);
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    CHECK(stat(path, &st) == 0);
    return (uint64_t)st.st_size;
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Where a cache file's body (counts) starts, and where its checksummed start ends. */
static size_t body_at(const uint8_t *buf) { return 112 + pad8((size_t)get_u64(buf + 88)); }
static size_t head_end(const uint8_t *buf) { return 112 + (size_t)get_u32(buf + 108) * 8; }

/* A cache of the table kind for the fixture's projection. */
static vf_ds_meta_cache *open_cache(void)
{
    char *names[2] = {"state", "action"};
    vf_ds_meta_cache *mc = NULL;
    CHECK_EQ_INT(vf_ds_file_cache_open(&mc, VF_DS_CACHE_TABLE, names, 2), 0);
    CHECK(mc != NULL);
    return mc;
}

/* Keys the data file as it is now and stores the fixture for it: the
 * cache file's path (newly allocated). */
static char *store_fixture(vf_ds_meta_cache *mc, const char *data_path, const table_fixture *tf)
{
    vf_ds_meta_key key;
    CHECK_EQ_INT(vf_ds_file_cache_key(mc, data_path, &key), 0);
    CHECK_EQ_INT(key.valid, 1);
    CHECK_EQ_INT(vf_ds_table_cache_store(mc, &key, &tf->t, row_offsets, episode_index, from_index), 1);
    char *entry = vf_ds_file_cache_entry(mc, &key);
    CHECK(entry != NULL);
    vf_ds_meta_key_free(&key);
    return entry;
}

/* Maps the data file's cache file: map's result, f filled on a hit. */
static int map_fixture(vf_ds_meta_cache *mc, const char *data_path, vf_ds_table_cache_file *f)
{
    vf_ds_meta_key key;
    int r = vf_ds_table_cache_open(mc, data_path, types, widths, 2, &key, f);
    CHECK_EQ_INT(key.valid, 1);
    vf_ds_meta_key_free(&key);
    return r;
}

/* Reads episode e from f and compares it with the fixture: the read's result. */
static int read_episode(const vf_ds_table_cache_file *f, const table_fixture *tf, int e)
{
    const int64_t *x = vf_ds_table_cache_find(f, row_offsets[e]);
    CHECK(x != NULL);
    if (!x)
        return VF_ENOENT;
    CHECK_EQ_INT(x[0], row_offsets[e]);
    CHECK_EQ_INT(x[1], ep_len[e]);
    CHECK_EQ_INT(x[2], tf->starts[e]);
    CHECK_EQ_INT(x[3], episode_index[e]);
    CHECK_EQ_INT(x[4], from_index[e]);
    float fv[ROWS * W0];
    int64_t iv[ROWS];
    memset(fv, 0xee, sizeof fv);
    memset(iv, 0xee, sizeof iv);
    void *dest[2] = {fv, iv};
    int r = vf_ds_table_cache_read(f, types, widths, x, dest, 1);
    if (r == 0) {
        CHECK(!memcmp(fv, tf->f + tf->starts[e] * W0, (size_t)ep_len[e] * W0 * sizeof(float)));
        CHECK(!memcmp(iv, tf->i + tf->starts[e], (size_t)ep_len[e] * sizeof(int64_t)));
    }
    return r;
}

/* ---- tests ------------------------------------------------------------------- */

static void test_round_trip(const char *dir)
{
    table_fixture tf;
    make_table(&tf);
    char *data = vf_path_join(dir, "rt.parquet");
    write_bytes(data, "not really parquet, any bytes key", 33);
    vf_ds_meta_cache *mc = open_cache();

    /* Nothing stored yet: a miss, with a key to store under. */
    vf_ds_table_cache_file f;
    CHECK_EQ_INT(map_fixture(mc, data, &f), 0);
    CHECK_EQ_INT(f.fd, -1);

    char *entry = store_fixture(mc, data, &tf);
    CHECK_EQ_INT(map_fixture(mc, data, &f), 1);
    CHECK(f.fd >= 0);
    CHECK_EQ_INT(f.rows, ROWS);
    CHECK_EQ_INT(f.num_entries, NE);
    CHECK_EQ_INT(f.num_columns, 2);
    CHECK_EQ_INT(f.file_len, file_size(entry));
    /* The values follow the checksummed start: 6 x 3 floats, then 6 int64. */
    CHECK_EQ_INT(f.column_at[0], f.head_len);
    CHECK_EQ_INT(f.column_at[1], f.head_len + ROWS * W0 * 4);
    CHECK_EQ_INT(f.file_len, f.head_len + ROWS * W0 * 4 + ROWS * 8);
    for (int e = 0; e < NE; e++)
        CHECK_EQ_INT(read_episode(&f, &tf, e), 0);
    /* Offsets that are no episode's start: not found. */
    CHECK(vf_ds_table_cache_find(&f, 0) == NULL);
    CHECK(vf_ds_table_cache_find(&f, 6) == NULL);
    CHECK(vf_ds_table_cache_find(&f, 8) == NULL);
    CHECK(vf_ds_table_cache_find(&f, 21) == NULL);
    CHECK(vf_ds_table_cache_find(&f, -1) == NULL);
    vf_ds_table_cache_close(&f);
    CHECK_EQ_INT(f.fd, -1);
    CHECK(f.head == NULL);

    /* Other column types, widths or counts than stored: a miss. */
    int other_types[2] = {VF_DS_I64, VF_DS_I64};
    int64_t other_widths[2] = {W0 + 1, 1};
    vf_ds_meta_key key;
    CHECK_EQ_INT(vf_ds_table_cache_open(mc, data, other_types, widths, 2, &key, &f), 0);
    CHECK_EQ_INT(key.valid, 1);
    vf_ds_meta_key_free(&key);
    CHECK_EQ_INT(vf_ds_table_cache_open(mc, data, types, other_widths, 2, &key, &f), 0);
    vf_ds_meta_key_free(&key);
    CHECK_EQ_INT(vf_ds_table_cache_open(mc, data, types, widths, 1, &key, &f), 0);
    vf_ds_meta_key_free(&key);
    /* ... and the entry is still there for the right ones. */
    CHECK_EQ_INT(map_fixture(mc, data, &f), 1);
    vf_ds_table_cache_close(&f);

    /* A path that does not exist: a miss with no key. */
    char *gone = vf_path_join(dir, "gone.parquet");
    CHECK_EQ_INT(vf_ds_table_cache_open(mc, gone, types, widths, 2, &key, &f), 0);
    CHECK_EQ_INT(key.valid, 0);
    vf_ds_meta_key_free(&key);

    free(gone);
    free(entry);
    free(data);
    vf_ds_meta_cache_close(mc);
}

/* A data file with no episodes of the projection: an entry with no rows. */
static void test_empty_table(const char *dir)
{
    char *data = vf_path_join(dir, "empty.parquet");
    write_bytes(data, "x", 1);
    vf_ds_meta_cache *mc = open_cache();
    float fv[1];
    int64_t iv[1], start = 0;
    vf_ds_column cols[2] = {{.type = VF_DS_F32, .width = W0, .values = fv},
                            {.type = VF_DS_I64, .width = 1, .values = iv}};
    vf_ds_table t = {.rows = 0, .num_columns = 2, .columns = cols, .num_episodes = 0, .episode_start = &start};
    vf_ds_meta_key key;
    CHECK_EQ_INT(vf_ds_file_cache_key(mc, data, &key), 0);
    CHECK_EQ_INT(vf_ds_table_cache_store(mc, &key, &t, NULL, NULL, NULL), 1);
    vf_ds_meta_key_free(&key);
    vf_ds_table_cache_file f;
    CHECK_EQ_INT(map_fixture(mc, data, &f), 1);
    CHECK_EQ_INT(f.num_entries, 0);
    CHECK_EQ_INT(f.rows, 0);
    CHECK(vf_ds_table_cache_find(&f, 0) == NULL);
    vf_ds_table_cache_close(&f);
    free(data);
    vf_ds_meta_cache_close(mc);
}

/* The keyed file rewritten with other bytes, or only its mtime changed: a miss. */
static void test_stale(const char *dir)
{
    table_fixture tf;
    make_table(&tf);
    char *data = vf_path_join(dir, "stale.parquet");
    write_bytes(data, "version one of the data file", 28);
    vf_ds_meta_cache *mc = open_cache();
    char *entry = store_fixture(mc, data, &tf);
    vf_ds_table_cache_file f;
    CHECK_EQ_INT(map_fixture(mc, data, &f), 1);
    vf_ds_table_cache_close(&f);

    write_bytes(data, "version two of the data file", 28); /* same size */
    CHECK_EQ_INT(map_fixture(mc, data, &f), 0);
    CHECK_EQ_INT(f.fd, -1);

    /* Stored again for the new version: a hit; then only the mtime moves. */
    free(entry);
    entry = store_fixture(mc, data, &tf);
    CHECK_EQ_INT(map_fixture(mc, data, &f), 1);
    vf_ds_table_cache_close(&f);
    struct timespec times[2] = {{.tv_sec = 1000000000, .tv_nsec = 5}, {.tv_sec = 1000000000, .tv_nsec = 5}};
    CHECK(utimensat(AT_FDCWD, data, times, 0) == 0);
    CHECK_EQ_INT(map_fixture(mc, data, &f), 0);

    /* A store with a key taken before the file changed writes nothing. */
    vf_ds_meta_key key;
    CHECK_EQ_INT(vf_ds_file_cache_key(mc, data, &key), 0);
    write_bytes(data, "version three of the data file", 30);
    CHECK_EQ_INT(vf_ds_table_cache_store(mc, &key, &tf.t, row_offsets, episode_index, from_index), 0);
    vf_ds_meta_key_free(&key);
    CHECK_EQ_INT(map_fixture(mc, data, &f), 0);

    free(entry);
    free(data);
    vf_ds_meta_cache_close(mc);
}

/* One byte of the checksummed start flipped at `at` (from the body's start
 * when from_body, else from the checksummed start's end when negative):
 * a miss, with a warning naming the cache file. */
static void check_damaged_head(const char *dir, const char *name, int from_body, long at)
{
    table_fixture tf;
    make_table(&tf);
    char *data = vf_path_join(dir, name);
    write_bytes(data, name, strlen(name));
    vf_ds_meta_cache *mc = open_cache(); /* a fresh cache: its first damaged entry warns */
    char *entry = store_fixture(mc, data, &tf);
    size_t len;
    uint8_t *buf = read_all(entry, &len);
    if (!buf)
        return;
    uint64_t pos = from_body ? body_at(buf) + (uint64_t)at : head_end(buf) + (uint64_t)at;
    CHECK(pos >= 112 && pos < head_end(buf));
    free(buf);
    flip_byte(entry, pos);
    char log[4096];
    vf_ds_table_cache_file f;
    vf_test_capture_stderr_begin();
    int r = map_fixture(mc, data, &f);
    vf_test_capture_stderr_end(log, sizeof log);
    CHECK_EQ_INT(r, 0);
    CHECK_EQ_INT(f.fd, -1);
    CHECK(strstr(log, entry) != NULL);
    CHECK(strstr(log, "checksum mismatch") != NULL);
    CHECK(strstr(log, "decoding the file again") != NULL);
    /* A second damaged lookup on this cache logs at debug level only. */
    vf_test_capture_stderr_begin();
    r = map_fixture(mc, data, &f);
    vf_test_capture_stderr_end(log, sizeof log);
    CHECK_EQ_INT(r, 0);
    CHECK(strstr(log, "checksum mismatch") == NULL);
    free(entry);
    free(data);
    vf_ds_meta_cache_close(mc);
}

static void test_damaged_head(const char *dir)
{
    check_damaged_head(dir, "dmg-count.parquet", 1, 0);     /* the column count */
    check_damaged_head(dir, "dmg-rows.parquet", 1, 16);     /* the row count */
    check_damaged_head(dir, "dmg-type.parquet", 1, 24);     /* the first column's type */
    check_damaged_head(dir, "dmg-width.parquet", 1, 32);    /* its width */
    check_damaged_head(dir, "dmg-offset.parquet", 1, 56);   /* the first entry's row offset */
    check_damaged_head(dir, "dmg-last.parquet", 0, -1);     /* the last entry's CRC field */
    check_damaged_head(dir, "dmg-start.parquet", 0, -48 + 16); /* the last entry's start */
}

/* Damaged header fields outside the key: a miss; no crash, whatever is hit. */
static void test_damaged_header_fields(const char *dir)
{
    static const uint64_t offsets[] = {0, 8, 12, 88, 95, 96, 100, 104, 107, 108, 111};
    table_fixture tf;
    make_table(&tf);
    char *data = vf_path_join(dir, "hdr.parquet");
    write_bytes(data, "header fields", 13);
    vf_ds_meta_cache *mc = open_cache();
    vf_log_set_level(VF_LOG_ERROR); /* the warnings are checked above */
    for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
        char *entry = store_fixture(mc, data, &tf);
        vf_ds_table_cache_file f;
        CHECK_EQ_INT(map_fixture(mc, data, &f), 1);
        vf_ds_table_cache_close(&f);
        flip_byte(entry, offsets[k]);
        if (map_fixture(mc, data, &f) != 0) {
            fprintf(stderr, "header byte %llu flipped: still a hit\n", (unsigned long long)offsets[k]);
            CHECK(0);
            vf_ds_table_cache_close(&f);
        }
        free(entry);
    }
    vf_log_set_level(VF_LOG_WARN);
    free(data);
    vf_ds_meta_cache_close(mc);
}

/* Damaged values: the entries still check out (a hit), the damaged
 * episodes fail their checksum on read, the others read fine. */
static void test_damaged_values(const char *dir)
{
    table_fixture tf;
    make_table(&tf);
    char *data = vf_path_join(dir, "values.parquet");
    write_bytes(data, "values", 6);
    vf_ds_meta_cache *mc = open_cache();
    char *entry = store_fixture(mc, data, &tf);
    uint64_t size = file_size(entry);
    flip_byte(entry, size - 1); /* the int64 column's last row: episode 2 */
    vf_ds_table_cache_file f;
    CHECK_EQ_INT(map_fixture(mc, data, &f), 1);
    CHECK_EQ_INT(read_episode(&f, &tf, 0), 0);
    CHECK_EQ_INT(read_episode(&f, &tf, 1), 0);
    CHECK_ERR(read_episode(&f, &tf, 2), VF_ECORRUPT, "checksum mismatch");
    {
        /* Unchecked (a loader checks an episode the first time only): the
         * damaged bytes come back as they are, which is why the first read
         * of every episode is checked. */
        const int64_t *x = vf_ds_table_cache_find(&f, row_offsets[2]);
        float fv[ROWS * W0];
        int64_t iv[ROWS];
        void *dest[2] = {fv, iv};
        CHECK(x != NULL);
        CHECK_EQ_INT(vf_ds_table_cache_read(&f, types, widths, x, dest, 0), 0);
    }
    /* The float column's first value: episode 0 too. */
    flip_byte(entry, f.column_at[0]);
    CHECK_ERR(read_episode(&f, &tf, 0), VF_ECORRUPT, "checksum mismatch");
    CHECK_EQ_INT(read_episode(&f, &tf, 1), 0);
    vf_ds_table_cache_close(&f);
    /* A file cut short after it was mapped: the read fails, it does not hang or crash. */
    CHECK_EQ_INT(map_fixture(mc, data, &f), 1);
    CHECK(truncate(entry, (off_t)(f.column_at[1] + 8)) == 0);
    CHECK_ERR(read_episode(&f, &tf, 1), VF_EIO, "table cache file");
    vf_ds_table_cache_close(&f);
    free(entry);
    free(data);
    vf_ds_meta_cache_close(mc);
}

/* A cache file cut short at various points: a miss. */
static void test_truncated(const char *dir)
{
    table_fixture tf;
    make_table(&tf);
    char *data = vf_path_join(dir, "trunc.parquet");
    write_bytes(data, "truncated", 9);
    vf_ds_meta_cache *mc = open_cache();
    vf_log_set_level(VF_LOG_ERROR);
    char *entry = store_fixture(mc, data, &tf);
    size_t len;
    uint8_t *buf = read_all(entry, &len);
    free(entry);
    if (!buf)
        return;
    uint64_t cuts[] = {len - 8, len - 1, head_end(buf), head_end(buf) - 8, body_at(buf), 112, 111, 50, 0};
    free(buf);
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        entry = store_fixture(mc, data, &tf);
        CHECK(truncate(entry, (off_t)cuts[k]) == 0);
        vf_ds_table_cache_file f;
        if (map_fixture(mc, data, &f) != 0) {
            fprintf(stderr, "cut at %llu: still a hit\n", (unsigned long long)cuts[k]);
            CHECK(0);
            vf_ds_table_cache_close(&f);
        }
        free(entry);
    }
    vf_log_set_level(VF_LOG_WARN);
    free(data);
    vf_ds_meta_cache_close(mc);
}

/* Parses buf (len bytes) with the checksum skipped and any key: the result. */
static int parse(uint8_t *buf, size_t len)
{
    vf_ds_table_cache_file f;
    int r = vf_ds_table_cache_parse(buf, len, len, NULL, NULL, NULL, 0, 0, &f);
    CHECK_EQ_INT(f.fd, -1);
    vf_ds_table_cache_close(&f);
    return r;
}

/* The parser's refusals, on a stored file edited in memory. */
static void test_parse_errors(const char *dir)
{
    table_fixture tf;
    make_table(&tf);
    char *data = vf_path_join(dir, "parse.parquet");
    write_bytes(data, "parse", 5);
    vf_ds_meta_cache *mc = open_cache();
    char *entry = store_fixture(mc, data, &tf);
    size_t len;
    uint8_t *orig = read_all(entry, &len);
    free(entry);
    free(data);
    vf_ds_meta_cache_close(mc);
    if (!orig)
        return;
    uint8_t *buf = malloc(len + 64);
    size_t b = body_at(orig), ents = b + (3 + 2 * 2) * 8;
    int64_t *counts = (int64_t *)(void *)(buf + b);
    int64_t *ent = (int64_t *)(void *)(buf + ents);
    vf_ds_table_cache_file f;

    /* The file as stored parses, checksum verified or not, with or without the column types. */
    memcpy(buf, orig, len);
    CHECK_EQ_INT(vf_ds_table_cache_parse(buf, len, len, NULL, NULL, NULL, 0, 1, &f), 0);
    CHECK_EQ_INT(f.num_entries, NE);
    vf_ds_table_cache_close(&f);
    CHECK_EQ_INT(vf_ds_table_cache_parse(buf, len, len, NULL, types, widths, 2, 1, &f), 0);
    vf_ds_table_cache_close(&f);
    /* Only the checksummed start in memory, as map passes it. */
    CHECK_EQ_INT(vf_ds_table_cache_parse(buf, head_end(buf), len, NULL, types, widths, 2, 1, &f), 0);
    CHECK_EQ_INT(f.head_len, head_end(buf));
    vf_ds_table_cache_close(&f);
    /* Less than the checksummed start in memory. */
    CHECK_EQ_INT(vf_ds_table_cache_parse(buf, head_end(buf) - 8, len, NULL, types, widths, 2, 1, &f), VF_ECORRUPT);
    /* Other column types: stale, not damaged. */
    int other[2] = {VF_DS_F32, VF_DS_F32};
    CHECK_EQ_INT(vf_ds_table_cache_parse(buf, len, len, NULL, other, widths, 2, 1, &f), VF_ENOENT);
    CHECK_EQ_INT(vf_ds_table_cache_parse(buf, len, len, NULL, types, widths, 1, 1, &f), VF_ENOENT);

    /* Edits (the checksum is skipped, so each reaches its check). */
    memcpy(buf, orig, len);
    CHECK_EQ_INT(parse(buf, len), 0);
    ent[1 * VF_DS_TABLE_ENTRY_FIELDS + 0] = 0; /* entry 1 before entry 0 ends */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "out of order");

    memcpy(buf, orig, len);
    ent[1 * VF_DS_TABLE_ENTRY_FIELDS + 0] = 6; /* entry 1 overlaps entry 0 (rows 5, 6) */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "out of order");

    memcpy(buf, orig, len);
    ent[1 * VF_DS_TABLE_ENTRY_FIELDS + 2] = 3; /* start not right after entry 0 */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "out of order");

    memcpy(buf, orig, len);
    ent[2 * VF_DS_TABLE_ENTRY_FIELDS + 1] = -1; /* negative length */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "out of order");

    memcpy(buf, orig, len);
    ent[0 * VF_DS_TABLE_ENTRY_FIELDS + 5] = -1; /* CRC out of range */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "out of order");

    memcpy(buf, orig, len);
    ent[2 * VF_DS_TABLE_ENTRY_FIELDS + 0] = INT64_MAX; /* row offset + length overflows */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "out of order");

    memcpy(buf, orig, len);
    counts[2] = ROWS + 1; /* the entries cover fewer rows than the counts say */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "do not cover the rows");

    memcpy(buf, orig, len);
    counts[2] = ROWS - 1; /* the last entry runs past the rows */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "out of order");

    memcpy(buf, orig, len);
    counts[2] = -1;
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "bad counts");

    memcpy(buf, orig, len);
    counts[0] = 5000; /* too many columns */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "bad counts");

    memcpy(buf, orig, len);
    counts[1] = NE + 1; /* more entries than the checksummed start holds */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "checksummed length");

    memcpy(buf, orig, len);
    counts[3] = VF_DS_STRING; /* the first column's type */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "bad column type or width");

    memcpy(buf, orig, len);
    counts[4] = 0; /* the first column's width */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "bad column type or width");

    memcpy(buf, orig, len);
    counts[6] = ((int64_t)1 << 24) + 1; /* the second column's width, past the limit */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "bad column type or width");

    memcpy(buf, orig, len);
    counts[6] = 2; /* wider than its values: the file is too short */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "truncated columns");

    memcpy(buf, orig, len);
    counts[5] = VF_DS_F32; /* int64 -> float32: half the bytes, the rest trails */
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "trailing bytes");

    /* Eight more bytes at the end, with the body length to match. */
    memcpy(buf, orig, len);
    memset(buf + len, 0, 8);
    put_u64(buf + 96, get_u64(buf + 96) + 8);
    CHECK_ERR(parse(buf, len + 8), VF_ECORRUPT, "trailing bytes");

    /* Covered length past the end of the file, or not even the header and ident. */
    memcpy(buf, orig, len);
    put_u32(buf + 108, (uint32_t)((len - 112) / 8 + 1));
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "checksummed length out of range");
    put_u32(buf + 108, 1);
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "checksummed length out of range");
    /* Covered: the header, ident and counts but not the whole column list. */
    put_u32(buf + 108, (uint32_t)((b - 112) / 8 + 3));
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "truncated column list");
    /* 0 (the whole file): the column values are taken for entries. */
    put_u32(buf + 108, 0);
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "checksummed length");

    /* Another version or byte order: stale, not damaged. */
    memcpy(buf, orig, len);
    put_u32(buf + 8, 2);
    CHECK_EQ_INT(parse(buf, len), VF_ENOENT);
    memcpy(buf, orig, len);
    put_u32(buf + 12, 0x04030201u);
    CHECK_EQ_INT(parse(buf, len), VF_ENOENT);
    /* Not a table cache file at all. */
    memcpy(buf, orig, len);
    memcpy(buf, "VFMETAC\n", 8);
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "not a vlafeed table cache file");
    /* The checksum, verified, catches an edit the parser would accept. */
    memcpy(buf, orig, len);
    ent[0 * VF_DS_TABLE_ENTRY_FIELDS + 3] = 77; /* episode_index */
    CHECK_EQ_INT(parse(buf, len), 0);
    CHECK_ERR(vf_ds_table_cache_parse(buf, len, len, NULL, NULL, NULL, 0, 1, &f), VF_ECORRUPT, "checksum mismatch");

    free(buf);
    free(orig);
}

/* A file whose column sizes overflow 64 bits when multiplied out: 2^37
 * rows of 2^24 int64 values each are 2^64 bytes, which must not wrap to
 * 0 and pass for a file with no column data. */
static void test_parse_size_overflow(void)
{
    static const char ident[8] = "/x\0p";
    int64_t body[3 + 2 + VF_DS_TABLE_ENTRY_FIELDS] = {1, 1, (int64_t)1 << 37, VF_DS_I64, (int64_t)1 << 24,
                                                      0, (int64_t)1 << 37, 0, 0, 0, 0};
    size_t len = 112 + sizeof ident + sizeof body;
    uint8_t *buf = calloc(1, len);
    memcpy(buf, "VFTABLE\n", 8);
    put_u32(buf + 8, VF_DS_TABLE_CACHE_VERSION);
    put_u32(buf + 12, 0x01020304u);
    put_u64(buf + 88, 4);
    put_u64(buf + 96, sizeof body);
    put_u32(buf + 108, (uint32_t)((sizeof ident + sizeof body) / 8));
    memcpy(buf + 112, ident, sizeof ident);
    memcpy(buf + 112 + sizeof ident, body, sizeof body);
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "truncated columns");
    /* The same with 2^36 rows of float32 x 2^24: 2^62 bytes, no wrap, still too short. */
    body[2] = body[6] = (int64_t)1 << 36;
    body[3] = VF_DS_F32;
    memcpy(buf + 112 + sizeof ident, body, sizeof body);
    CHECK_ERR(parse(buf, len), VF_ECORRUPT, "truncated columns");
    free(buf);
}

/* The store's refusals: a string column, episodes not in file order. */
static void test_store_refusals(const char *dir)
{
    table_fixture tf;
    make_table(&tf);
    char *data = vf_path_join(dir, "refuse.parquet");
    write_bytes(data, "refuse", 6);
    vf_ds_meta_cache *mc = open_cache();
    vf_ds_meta_key key;
    CHECK_EQ_INT(vf_ds_file_cache_key(mc, data, &key), 0);

    tf.cols[1].type = VF_DS_STRING;
    CHECK_ERR(vf_ds_table_cache_store(mc, &key, &tf.t, row_offsets, episode_index, from_index), VF_EINVAL,
              "not numeric");
    tf.cols[1].type = VF_DS_I64;

    int64_t overlapping[NE] = {5, 6, 20}; /* episode 0 has 2 rows: 5, 6 */
    CHECK_ERR(vf_ds_table_cache_store(mc, &key, &tf.t, overlapping, episode_index, from_index), VF_EINVAL,
              "not in file order");
    int64_t backwards[NE] = {20, 7, 5};
    CHECK_ERR(vf_ds_table_cache_store(mc, &key, &tf.t, backwards, episode_index, from_index), VF_EINVAL,
              "not in file order");
    /* Nothing was written. */
    vf_ds_table_cache_file f;
    CHECK_EQ_INT(map_fixture(mc, data, &f), 0);
    /* Adjacent episodes are fine. */
    int64_t adjacent[NE] = {0, 2, 5};
    CHECK_EQ_INT(vf_ds_table_cache_store(mc, &key, &tf.t, adjacent, episode_index, from_index), 1);
    vf_ds_table_cache_file g;
    vf_ds_meta_key key2;
    CHECK_EQ_INT(vf_ds_table_cache_open(mc, data, types, widths, 2, &key2, &g), 1);
    CHECK(vf_ds_table_cache_find(&g, 2) != NULL);
    vf_ds_table_cache_close(&g);
    vf_ds_meta_key_free(&key2);
    /* An invalid key (the file could not be read): nothing stored, no error. */
    vf_ds_meta_key bad = {0};
    CHECK_EQ_INT(vf_ds_table_cache_store(mc, &bad, &tf.t, row_offsets, episode_index, from_index), 0);

    vf_ds_meta_key_free(&key);
    free(data);
    vf_ds_meta_cache_close(mc);
}

/* VF_TABLE_CACHE=0 turns the table cache off, not the metadata cache. */
static void test_env_off(void)
{
    char *names[1] = {"state"};
    vf_ds_meta_cache *mc = (vf_ds_meta_cache *)1;
    setenv("VF_TABLE_CACHE", "0", 1);
    CHECK_EQ_INT(vf_ds_file_cache_open(&mc, VF_DS_CACHE_TABLE, names, 1), 0);
    CHECK(mc == NULL);
    setenv("VF_TABLE_CACHE", "off", 1);
    mc = (vf_ds_meta_cache *)1;
    CHECK_EQ_INT(vf_ds_file_cache_open(&mc, VF_DS_CACHE_TABLE, names, 1), 0);
    CHECK(mc == NULL);
    unsetenv("VF_META_CACHE");
    CHECK_EQ_INT(vf_ds_file_cache_open(&mc, VF_DS_CACHE_META, names, 1), 0);
    CHECK(mc != NULL);
    vf_ds_meta_cache_close(mc);
    unsetenv("VF_TABLE_CACHE");
    mc = NULL;
    CHECK_EQ_INT(vf_ds_file_cache_open(&mc, VF_DS_CACHE_TABLE, names, 1), 0);
    CHECK(mc != NULL);
    if (mc) {
        const char *d = vf_ds_meta_cache_dir(mc);
        size_t n = strlen(d);
        CHECK(n >= 6 && !strcmp(d + n - 6, "/table"));
        CHECK(!strcmp(vf_ds_file_cache_what(mc), "table"));
    }
    vf_ds_meta_cache_close(mc);
}

int main(void)
{
    vf_log_set_level(VF_LOG_WARN);
    char *dir = vf_test_tmpdir("tc-data"), *cache = vf_test_tmpdir("tc-cache");
    setenv("VF_CACHE_DIR", cache, 1);
    unsetenv("VF_TABLE_CACHE");
    test_round_trip(dir);
    test_empty_table(dir);
    test_stale(dir);
    test_damaged_head(dir);
    test_damaged_header_fields(dir);
    test_damaged_values(dir);
    test_truncated(dir);
    test_parse_errors(dir);
    test_parse_size_overflow();
    test_store_refusals(dir);
    test_env_off();
    vf_test_rmtree(dir);
    vf_test_rmtree(cache);
    free(dir);
    free(cache);
    return vf_test_finish("test_table_cache");
}
