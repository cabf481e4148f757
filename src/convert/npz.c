/*
 * npz.c: .npy v1.0 arrays and .npz archives (the lowdim member of a robotics
 * sample). The .npy header is numpy's own text: a Python dict literal
 * padded with spaces and a newline so the data starts at a multiple of 64
 * bytes. The zip container comes from libarchive's zip writer with DEFLATE,
 * which numpy.load (Python's zipfile) reads.
 */
#include "convert/convert.h"

#include <archive.h>
#include <archive_entry.h>
#include <string.h>

int vf_cv_npy_encode(const vf_cv_array *a, vf_buf *out)
{
    if (a->ndim < 1 || a->ndim > 4)
        return vf_error(VF_EINVAL, "npy %s: %d dimensions (1..4 supported)", a->name, a->ndim);
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", a->descr);
    for (int i = 0; i < a->ndim; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld,%s", (long long)a->shape[i],
                      i + 1 < a->ndim ? " " : "");
    if (a->ndim > 1)
        n--; /* numpy writes (16, 2) but (16,) */
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    size_t header_len = (size_t)n + 1; /* + '\n' */
    size_t total = 10 + header_len;
    size_t padded = (total + 63) / 64 * 64;
    header_len += padded - total;
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(header_len & 0xff), (uint8_t)(header_len >> 8)};
    int r = vf_buf_reserve(out, padded + a->bytes);
    if (r < 0)
        return r;
    vf_buf_append(out, pre, sizeof pre);
    vf_buf_append(out, dict, (size_t)n);
    for (size_t i = (size_t)n + 1; i < header_len; i++)
        vf_buf_append_u8(out, ' ');
    vf_buf_append_u8(out, '\n');
    return vf_buf_append(out, a->data, a->bytes);
}

static la_ssize_t mem_write(struct archive *a, void *ctx, const void *data, size_t n)
{
    (void)a;
    return vf_buf_append(ctx, data, n) < 0 ? -1 : (la_ssize_t)n;
}

int vf_cv_npz_write(const vf_cv_array *arrays, size_t count, vf_buf *out)
{
    struct archive *a = archive_write_new();
    struct archive_entry *e = archive_entry_new();
    vf_buf npy = {0};
    int r = a && e ? 0 : vf_error(VF_ENOMEM, "npz: out of memory");
    if (r == 0 && (archive_write_set_format_zip(a) != ARCHIVE_OK ||
                   archive_write_set_options(a, "zip:compression=deflate") != ARCHIVE_OK ||
                   archive_write_set_bytes_in_last_block(a, 1) != ARCHIVE_OK ||
                   archive_write_open2(a, out, NULL, mem_write, NULL, NULL) != ARCHIVE_OK))
        r = vf_error(VF_EIO, "npz: %s", archive_error_string(a));
    for (size_t i = 0; i < count && r == 0; i++) {
        npy.len = 0;
        if ((r = vf_cv_npy_encode(&arrays[i], &npy)) < 0)
            break;
        char name[512];
        snprintf(name, sizeof name, "%s.npy", arrays[i].name);
        archive_entry_clear(e);
        archive_entry_set_pathname(e, name);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_size(e, (la_int64_t)npy.len);
        archive_entry_set_mtime(e, 315532800, 0); /* 1980-01-01, the zip epoch */
        if (archive_write_header(a, e) != ARCHIVE_OK ||
            archive_write_data(a, npy.data, npy.len) != (la_ssize_t)npy.len)
            r = vf_error(VF_EIO, "npz member %s: %s", name, archive_error_string(a));
    }
    if (a && archive_write_close(a) != ARCHIVE_OK && r == 0)
        r = vf_error(VF_EIO, "npz: %s", archive_error_string(a));
    archive_entry_free(e);
    archive_write_free(a);
    vf_buf_free(&npy);
    return r;
}
