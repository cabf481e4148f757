/*
 * fuzz_table_cache.c: libFuzzer target for the table cache file parser
 * (vf_ds_table_cache_parse, table_cache.c).
 *
 * Input: the bytes of a .vftable cache file. The file is parsed twice: as
 * a map would (checksum verified, any key, any column types) and with the
 * checksum skipped, so that mutations reach the counts, column list and
 * entries past the CRC. Here the whole file is in memory, so for a parsed
 * file every entry's values are then read straight from the input at the
 * column offsets the parser computed (column_at + start x row bytes, length
 * rows), the way vf_ds_table_cache_read reads them from the file: an offset
 * or length the parser let through past the end shows under ASan, and an
 * entry or column that does not fit the file's rows aborts.
 */
#include <stdlib.h>
#include <string.h>

#include "dataset/meta_cache.h"

static volatile uint64_t sink;

/* Reads every value of every entry of f, whose file is buf (len bytes). */
static void walk(const vf_ds_table_cache_file *f, const uint8_t *buf, size_t len)
{
    if (f->file_len != len || f->head_len > len)
        abort();
    /* The column list is in the checksummed start, after the header, the
     * ident (padded to 8) and the three counts. */
    uint64_t ident_len;
    memcpy(&ident_len, f->head + 88, 8);
    size_t list_at = 112 + (((size_t)ident_len + 7) & ~(size_t)7) + 24;
    if (list_at + f->num_columns * 16 > f->head_len)
        abort();
    uint64_t acc = 0;
    for (size_t i = 0; i < f->num_columns; i++) {
        int64_t type, width;
        memcpy(&type, f->head + list_at + 16 * i, 8);
        memcpy(&width, f->head + list_at + 16 * i + 8, 8);
        if ((type != VF_DS_F32 && type != VF_DS_I64) || width < 1)
            abort(); /* the parser must have refused it */
        uint64_t row = (uint64_t)width * (type == VF_DS_F32 ? 4 : 8), column;
        /* The whole column, rows x row bytes, must lie in the file. */
        if (__builtin_mul_overflow((uint64_t)f->rows, row, &column) || f->column_at[i] < f->head_len ||
            f->column_at[i] > len || column > len - f->column_at[i])
            abort();
        const uint8_t *values = buf + f->column_at[i];
        for (int64_t e = 0; e < f->num_entries; e++) {
            const int64_t *x = f->entries + e * VF_DS_TABLE_ENTRY_FIELDS;
            if (x[1] < 0 || x[2] < 0 || x[2] > f->rows - x[1])
                abort();
            const uint8_t *p = values + (uint64_t)x[2] * row;
            size_t n = (size_t)((uint64_t)x[1] * row);
            if (type == VF_DS_F32) {
                for (size_t k = 0; k + 4 <= n; k += 4) {
                    uint32_t v;
                    memcpy(&v, p + k, 4);
                    acc += v;
                }
            } else {
                for (size_t k = 0; k + 8 <= n; k += 8) {
                    uint64_t v;
                    memcpy(&v, p + k, 8);
                    acc += v;
                }
            }
        }
    }
    /* find must locate an entry at each entry's row offset (they ascend;
     * entries of no rows may share an offset, so not necessarily this one). */
    for (int64_t e = 0; e < f->num_entries; e++) {
        const int64_t *x = f->entries + e * VF_DS_TABLE_ENTRY_FIELDS, *y = vf_ds_table_cache_find(f, x[0]);
        if (!y || y[0] != x[0])
            abort();
    }
    sink = acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* malloc'd: 8-byte aligned, as a map's buffer, and exactly size bytes for ASan. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    for (int verify = 1; verify >= 0; verify--) {
        vf_ds_table_cache_file f;
        if (vf_ds_table_cache_parse(buf, size, size, NULL, NULL, NULL, 0, verify, &f) == 0) {
            if (f.fd != -1)
                abort();
            walk(&f, buf, size);
        }
        vf_ds_table_cache_close(&f);
    }
    free(buf);
    return 0;
}
