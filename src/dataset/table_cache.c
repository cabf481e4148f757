/*
 * table_cache.c: the decoded table columns of whole data files, kept on
 * disk (meta_cache.h, "the table cache"), so that map mode's random reads
 * of a table larger than its row cache cost a pread per column instead of
 * a Parquet page decode per column.
 *
 * Invariants:
 *  - A cache file is only ever produced from rows that passed the same
 *    checks a Parquet read does (VF_DS_VERIFY_INDEX: `index` runs from the
 *    episode's dataset_from_index, `episode_index` is the episode's on
 *    every row); each entry records the episode_index and from_index it
 *    was checked against, and a reader compares them with its own model
 *    before serving the rows.
 *  - Every count, offset and length of a cache file is checked before use
 *    (fuzz_table_cache); a damaged file is a miss, never a crash or a wrong
 *    row, and a file of another data file version (key) is never used.
 */
#define _GNU_SOURCE
#include "dataset/meta_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define MAX_COLUMNS 4096
#define MAX_WIDTH ((int64_t)1 << 24)

static inline size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

static size_t elem_size(int type) { return type == VF_DS_F32 ? sizeof(float) : sizeof(int64_t); }

/* CRC-32 of an episode's values: each column's slice, in column order. */
static uLong episode_crc(const void *const *values, const int *types, const int64_t *widths, size_t nc,
                         int64_t start, int64_t rows)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t i = 0; i < nc; i++) {
        size_t row = (size_t)widths[i] * elem_size(types[i]);
        const Bytef *p = (const Bytef *)values[i] + (size_t)start * row;
        for (size_t at = 0, len = (size_t)rows * row; at < len;) {
            size_t n = VF_MIN(len - at, (size_t)1 << 30);
            crc = crc32(crc, p + at, (uInt)n);
            at += n;
        }
    }
    return crc;
}

int vf_ds_table_cache_store(vf_ds_meta_cache *mc, const vf_ds_meta_key *key, const vf_ds_table *t,
                            const int64_t *row_offsets, const int64_t *episode_index, const int64_t *from_index)
{
    if (!key->valid)
        return 0;
    size_t nc = t->num_columns, ne = t->num_episodes;
    for (size_t i = 0; i < nc; i++)
        if (t->columns[i].type != VF_DS_F32 && t->columns[i].type != VF_DS_I64)
            return vf_error(VF_EINVAL, "table cache: column %zu is not numeric", i);
    for (size_t e = 0; e + 1 < ne; e++)
        if (row_offsets[e + 1] < row_offsets[e] + (t->episode_start[e + 1] - t->episode_start[e]))
            return vf_error(VF_EINVAL, "table cache: episodes not in file order");
    size_t head_n = 3 + 2 * nc;
    const void **vals = vf_malloc_array(nc ? nc : 1, sizeof *vals);
    int *types = vf_malloc_array(nc ? nc : 1, sizeof *types);
    int64_t *widths = vf_malloc_array(nc ? nc : 1, sizeof *widths);
    for (size_t i = 0; vals && types && widths && i < nc; i++) {
        vals[i] = t->columns[i].values;
        types[i] = t->columns[i].type;
        widths[i] = t->columns[i].width;
    }
    int64_t *head = vf_malloc_array(head_n, sizeof *head);
    int64_t *ent = vf_malloc_array(ne ? ne * VF_DS_TABLE_ENTRY_FIELDS : 1, sizeof *ent);
    const void **parts = vf_malloc_array(2 + nc, sizeof *parts);
    size_t *lens = vf_malloc_array(2 + nc, sizeof *lens);
    int r = head && ent && parts && lens && vals && types && widths ? 0 : VF_ENOMEM;
    if (r == 0) {
        head[0] = (int64_t)nc;
        head[1] = (int64_t)ne;
        head[2] = t->rows;
        for (size_t i = 0; i < nc; i++) {
            head[3 + 2 * i] = t->columns[i].type;
            head[4 + 2 * i] = t->columns[i].width;
        }
        for (size_t e = 0; e < ne; e++) {
            int64_t *x = ent + e * VF_DS_TABLE_ENTRY_FIELDS;
            x[0] = row_offsets[e];
            x[1] = t->episode_start[e + 1] - t->episode_start[e];
            x[2] = t->episode_start[e];
            x[3] = episode_index[e];
            x[4] = from_index[e];
            x[5] = (int64_t)episode_crc(vals, types, widths, nc, x[2], x[1]);
        }
        parts[0] = head;
        lens[0] = head_n * 8;
        parts[1] = ent;
        lens[1] = ne * VF_DS_TABLE_ENTRY_FIELDS * 8;
        for (size_t i = 0; i < nc; i++) {
            parts[2 + i] = t->columns[i].values;
            lens[2 + i] = (size_t)t->rows * (size_t)t->columns[i].width * elem_size(t->columns[i].type);
        }
        r = vf_ds_file_cache_store_parts(mc, key, parts, lens, 2 + nc, 2);
    }
    free(head);
    free(ent);
    free(parts);
    free(lens);
    free(vals);
    free(types);
    free(widths);
    return r;
}

static int corrupt(const char *what) { return vf_error(VF_ECORRUPT, "table cache entry: %s", what); }

int vf_ds_table_cache_parse(const uint8_t *buf, size_t avail, uint64_t file_len, const vf_ds_meta_key *key,
                            const int *types, const int64_t *widths, size_t num_columns, int verify_checksum,
                            vf_ds_table_cache_file *out)
{
    memset(out, 0, sizeof *out);
    out->fd = -1;
    size_t at = 0;
    int r = vf_ds_file_cache_check(VF_DS_CACHE_TABLE, buf, avail, file_len, key, verify_checksum, &at);
    if (r < 0)
        return r;
    /* The checksummed start: header, ident, counts, column list, entries
     * (within avail: vf_ds_file_cache_check made sure). */
    size_t head_len = (size_t)vf_ds_file_cache_checked_len(buf, file_len);
    const uint8_t *p = buf + at, *end = buf + head_len;
    if (end - p < 24)
        return corrupt("truncated body");
    const int64_t *head = (const int64_t *)(const void *)p;
    int64_t nc = head[0], ne = head[1], rows = head[2];
    if (nc < 0 || nc > MAX_COLUMNS || ne < 0 || rows < 0 || rows > (int64_t)1 << 40)
        return corrupt("bad counts");
    if (types && (size_t)nc != num_columns)
        return VF_ENOENT; /* another projection: cannot happen with a matching key */
    size_t list_bytes = (size_t)(3 + 2 * nc) * 8;
    if ((size_t)(end - p) < list_bytes)
        return corrupt("truncated column list");
    p += list_bytes;
    if ((uint64_t)ne > (uint64_t)(end - p) / (VF_DS_TABLE_ENTRY_FIELDS * 8) ||
        (size_t)(end - p) != (size_t)ne * VF_DS_TABLE_ENTRY_FIELDS * 8)
        return corrupt("entries do not match the checksummed length");
    size_t ent_at = (size_t)(p - buf);
    /* Entries: ascending, non-overlapping in the data file, contiguous in the cache. */
    const int64_t *ent = (const int64_t *)(const void *)p;
    int64_t next_start = 0, prev_end = 0;
    for (int64_t e = 0; e < ne; e++) {
        const int64_t *x = ent + e * VF_DS_TABLE_ENTRY_FIELDS;
        if (x[0] < prev_end || x[1] < 0 || x[2] != next_start || x[1] > rows - next_start ||
            x[0] > INT64_MAX - x[1] || x[5] < 0 || x[5] > (int64_t)UINT32_MAX)
            return corrupt("episode entries out of order or out of range");
        next_start += x[1];
        prev_end = x[0] + x[1];
    }
    if (next_start != rows)
        return corrupt("episode entries do not cover the rows");
    /* Column values: from the end of the checksummed start to the end of the file. */
    uint64_t col = head_len;
    out->column_at = vf_calloc(nc ? (size_t)nc : 1, sizeof *out->column_at);
    out->head = vf_malloc(head_len);
    if (!out->column_at || !out->head) {
        vf_ds_table_cache_close(out);
        return VF_ENOMEM;
    }
    for (int64_t i = 0; i < nc && r == 0; i++) {
        int64_t type = head[3 + 2 * i], width = head[4 + 2 * i];
        if ((type != VF_DS_F32 && type != VF_DS_I64) || width < 1 || width > MAX_WIDTH)
            r = corrupt("bad column type or width");
        else if (types && (type != types[i] || width != widths[i]))
            r = VF_ENOENT;
        else if (rows && (uint64_t)width > (file_len - col) / elem_size((int)type) / (uint64_t)rows)
            r = corrupt("truncated columns"); /* checked before multiplying: rows x width x 8 can pass 2^64 */
        else {
            uint64_t bytes = (uint64_t)rows * (uint64_t)width * elem_size((int)type); /* <= file_len - col */
            out->column_at[i] = col;
            if (bytes > file_len - col || pad8((size_t)bytes) > file_len - col)
                r = corrupt("truncated columns");
            else
                col += pad8((size_t)bytes);
        }
    }
    if (r == 0 && col != file_len)
        r = corrupt("trailing bytes");
    if (r < 0) {
        vf_ds_table_cache_close(out);
        out->fd = -1;
        return r;
    }
    memcpy(out->head, buf, head_len);
    out->head_len = head_len;
    out->rows = rows;
    out->num_entries = ne;
    out->num_columns = (size_t)nc;
    out->entries = (const int64_t *)(const void *)(out->head + ent_at);
    out->file_len = file_len;
    return 0;
}

/* pread of exactly len bytes at off: 0, or -1. */
static int read_at(int fd, void *dest, size_t len, uint64_t off)
{
    for (size_t got = 0; got < len;) {
        ssize_t k = pread(fd, (uint8_t *)dest + got, len - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

int vf_ds_table_cache_open(vf_ds_meta_cache *mc, const char *path, const int *types, const int64_t *widths,
                          size_t num_columns, vf_ds_meta_key *key, vf_ds_table_cache_file *out)
{
    memset(out, 0, sizeof *out);
    out->fd = -1;
    if (vf_ds_file_cache_key(mc, path, key) < 0)
        return 0;
    char *entry = vf_ds_file_cache_entry(mc, key);
    int fd = entry ? open(entry, O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1;
    struct stat st;
    uint8_t header[112];
    uint8_t *buf = NULL;
    size_t head_len = 0;
    int r = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size >= sizeof header &&
                    read_at(fd, header, sizeof header, 0) == 0
                ? 0
                : -1;
    if (r == 0) {
        uint64_t checked = vf_ds_file_cache_checked_len(header, (uint64_t)st.st_size);
        head_len = (size_t)checked;
        if (checked > (uint64_t)st.st_size || head_len > ((size_t)1 << 32) || !(buf = vf_malloc(head_len)) ||
            read_at(fd, buf, head_len, 0) < 0)
            r = -1;
    }
    if (r == 0) {
        r = vf_ds_table_cache_parse(buf, head_len, (uint64_t)st.st_size, key, types, widths, num_columns, 1, out);
        if (r == VF_ECORRUPT)
            vf_ds_file_cache_damaged(mc, entry, path);
    }
    free(buf);
    free(entry);
    if (r < 0) {
        if (fd >= 0)
            close(fd);
        return r == VF_ENOMEM ? r : 0;
    }
    out->fd = fd;
    return 1;
}

const int64_t *vf_ds_table_cache_find(const vf_ds_table_cache_file *f, int64_t row_offset)
{
    int64_t lo = 0, hi = f->num_entries;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int64_t v = f->entries[mid * VF_DS_TABLE_ENTRY_FIELDS];
        if (v == row_offset)
            return f->entries + mid * VF_DS_TABLE_ENTRY_FIELDS;
        if (v < row_offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int vf_ds_table_cache_read(const vf_ds_table_cache_file *f, const int *types, const int64_t *widths,
                           const int64_t *x, void *const *dest, int check)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t i = 0; i < f->num_columns; i++) {
        size_t row = (size_t)widths[i] * elem_size(types[i]), len = (size_t)x[1] * row;
        if (read_at(f->fd, dest[i], len, f->column_at[i] + (uint64_t)x[2] * row) < 0)
            return vf_error(VF_EIO, "table cache file: read failed (%s)", errno ? strerror(errno) : "short file");
        for (size_t at = 0; check && at < len;) {
            size_t n = VF_MIN(len - at, (size_t)1 << 30);
            crc = crc32(crc, (const Bytef *)dest[i] + at, (uInt)n);
            at += n;
        }
    }
    if (check && (int64_t)crc != x[5])
        return vf_error(VF_ECORRUPT, "table cache entry: checksum mismatch (episode at row %lld)", (long long)x[0]);
    return 0;
}

void vf_ds_table_cache_close(vf_ds_table_cache_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    free(f->head);
    free(f->column_at);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}
