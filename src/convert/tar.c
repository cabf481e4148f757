/*
 * tar.c: shard tars through libarchive's pax-restricted writer (plain ustar
 * headers; a pax extended header only for a member whose name does not fit
 * ustar). Members are regular files, mode 0644, uid/gid 0, mtime 0, no user
 * or group names, so a shard is a pure function of its members. The bytes
 * go through our own write callback so the file's CRC-32 (recorded to
 * verify the shard on resume) costs no second read.
 */
#define _GNU_SOURCE
#include "convert/convert.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

struct vf_cv_tar {
    struct archive *archive;
    struct archive_entry *entry;
    int fd;
    char *path;
    uint64_t bytes;
    uint32_t crc;
    int failed_errno;
};

static la_ssize_t tar_write(struct archive *a, void *ctx, const void *data, size_t n)
{
    vf_cv_tar *t = ctx;
    const uint8_t *p = data;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(t->fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            t->failed_errno = errno;
            archive_set_error(a, errno, "write failed");
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    t->crc = (uint32_t)crc32(t->crc, data, (uInt)n);
    t->bytes += n;
    return (la_ssize_t)n;
}

int vf_cv_tar_open(vf_cv_tar **out, const char *path)
{
    *out = NULL;
    vf_cv_tar *t = vf_calloc(1, sizeof *t);
    if (!t)
        return VF_ENOMEM;
    t->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (t->fd < 0) {
        int err = errno;
        free(t);
        return vf_error(VF_EIO, "%s: cannot create: %s", path, strerror(err));
    }
    t->path = vf_strdup(path);
    t->crc = (uint32_t)crc32(0, NULL, 0);
    t->archive = archive_write_new();
    t->entry = archive_entry_new();
    if (!t->path || !t->archive || !t->entry) {
        vf_cv_tar_abort(t);
        return vf_error(VF_ENOMEM, "%s: out of memory", path);
    }
    if (archive_write_set_format_pax_restricted(t->archive) != ARCHIVE_OK ||
        archive_write_open2(t->archive, t, NULL, tar_write, NULL, NULL) != ARCHIVE_OK) {
        int r = vf_error(VF_EIO, "%s: %s", path, archive_error_string(t->archive));
        vf_cv_tar_abort(t);
        return r;
    }
    *out = t;
    return 0;
}

int vf_cv_tar_add(vf_cv_tar *t, const char *name, const void *data, size_t len)
{
    archive_entry_clear(t->entry);
    archive_entry_set_pathname(t->entry, name);
    archive_entry_set_filetype(t->entry, AE_IFREG);
    archive_entry_set_perm(t->entry, 0644);
    archive_entry_set_uid(t->entry, 0);
    archive_entry_set_gid(t->entry, 0);
    archive_entry_set_mtime(t->entry, 0, 0);
    archive_entry_set_size(t->entry, (la_int64_t)len);
    if (archive_write_header(t->archive, t->entry) != ARCHIVE_OK ||
        (len > 0 && archive_write_data(t->archive, data, len) != (la_ssize_t)len))
        return vf_error(VF_EIO, "%s: member %s: %s", t->path, name, archive_error_string(t->archive));
    return 0;
}

int vf_cv_tar_finish(vf_cv_tar *t, uint64_t *bytes, uint32_t *crc)
{
    int r = 0;
    if (archive_write_close(t->archive) != ARCHIVE_OK)
        r = vf_error(VF_EIO, "%s: %s", t->path, archive_error_string(t->archive));
    if (r == 0 && fsync(t->fd) < 0)
        r = vf_error(VF_EIO, "%s: fsync: %s", t->path, strerror(errno));
    if (close(t->fd) < 0 && r == 0)
        r = vf_error(VF_EIO, "%s: close: %s", t->path, strerror(errno));
    t->fd = -1;
    if (bytes)
        *bytes = t->bytes;
    if (crc)
        *crc = t->crc;
    vf_cv_tar_abort(t);
    return r;
}

void vf_cv_tar_abort(vf_cv_tar *t)
{
    if (!t)
        return;
    if (t->archive)
        archive_write_free(t->archive);
    archive_entry_free(t->entry);
    if (t->fd >= 0)
        close(t->fd);
    free(t->path);
    free(t);
}

int vf_cv_file_crc(const char *path, uint64_t *bytes, uint32_t *crc)
{
    int fd = -1;
    uint64_t size = 0;
    int r = vf_open_regular_file(path, &fd, &size);
    if (r < 0)
        return r;
    uint8_t *buf = vf_malloc(1 << 20);
    if (!buf) {
        close(fd);
        return VF_ENOMEM;
    }
    uint32_t c = (uint32_t)crc32(0, NULL, 0);
    uint64_t total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, 1 << 20);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = vf_error(VF_EIO, "%s: read: %s", path, strerror(errno));
            break;
        }
        if (n == 0)
            break;
        c = (uint32_t)crc32(c, buf, (uInt)n);
        total += (uint64_t)n;
    }
    free(buf);
    close(fd);
    *bytes = total;
    *crc = c;
    return r;
}
