/*
 * spill.c: the on-disk buckets of the external shuffle. Records (a fixed
 * header + payload) are appended with one writev() each to O_APPEND files,
 * one file per bucket of consecutive shards; a bucket is read back by
 * scanning its headers and pread()ing payloads in the order the shard
 * needs. See convert.h for the invariants.
 */
#define _GNU_SOURCE
#include "convert/convert.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

struct vf_cv_spill {
    char *dir;
    size_t num_buckets;
    int *fds;
    _Atomic uint64_t bytes_written;
};

static int read_exact(int fd, void *dest, size_t len, uint64_t offset)
{
    uint8_t *p = dest;
    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)offset);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : 1; /* 1: short (end of file) */
        p += n;
        len -= (size_t)n;
        offset += (uint64_t)n;
    }
    return 0;
}

/* Walks the records of fd; *good is the end of the last whole record. */
static int walk(int fd, const char *name, vf_cv_record_ref **refs, size_t *count, uint64_t *good)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return vf_error(VF_EIO, "%s: stat: %s", name, strerror(errno));
    uint64_t size = (uint64_t)st.st_size, off = 0;
    size_t n = 0, cap = 0;
    vf_cv_record_ref *list = NULL;
    while (off + sizeof(vf_cv_record) <= size) {
        vf_cv_record h;
        int r = read_exact(fd, &h, sizeof h, off);
        if (r < 0) {
            free(list);
            return vf_error(VF_EIO, "%s: read: %s", name, strerror(-r));
        }
        if (h.magic != VF_CV_RECORD_MAGIC) {
            free(list);
            return vf_error(VF_ECORRUPT, "%s: spill record at byte %llu has a bad magic", name,
                            (unsigned long long)off);
        }
        if (off + sizeof h + h.len > size)
            break; /* torn tail */
        if (refs) {
            if (n == cap) {
                cap = cap ? cap * 2 : 256;
                vf_cv_record_ref *grown = vf_realloc(list, cap * sizeof *list);
                if (!grown) {
                    free(list);
                    return VF_ENOMEM;
                }
                list = grown;
            }
            list[n].head = h;
            list[n].offset = off + sizeof h;
        }
        n++;
        off += sizeof h + h.len;
    }
    if (refs) {
        *refs = list;
        *count = n;
    }
    *good = off;
    return 0;
}

int vf_cv_spill_open(vf_cv_spill **out, const char *dir, size_t num_buckets)
{
    *out = NULL;
    vf_cv_spill *s = vf_calloc(1, sizeof *s);
    if (!s)
        return VF_ENOMEM;
    s->dir = vf_strdup(dir);
    s->fds = vf_malloc_array(num_buckets, sizeof *s->fds);
    if (!s->dir || !s->fds) {
        vf_cv_spill_close(s);
        return VF_ENOMEM;
    }
    for (size_t i = 0; i < num_buckets; i++)
        s->fds[i] = -1;
    s->num_buckets = num_buckets;
    int r = vf_mkdirs(dir);
    for (size_t i = 0; i < num_buckets && r == 0; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/bucket_%05zu.bin", dir, i);
        s->fds[i] = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (s->fds[i] < 0) {
            r = vf_error(VF_EIO, "%s: cannot open: %s", path, strerror(errno));
            break;
        }
        uint64_t good = 0;
        struct stat st;
        if ((r = walk(s->fds[i], path, NULL, NULL, &good)) < 0)
            break;
        if (fstat(s->fds[i], &st) == 0 && (uint64_t)st.st_size != good && ftruncate(s->fds[i], (off_t)good) < 0)
            r = vf_error(VF_EIO, "%s: cannot cut the torn tail: %s", path, strerror(errno));
    }
    if (r < 0) {
        vf_cv_spill_close(s);
        return r;
    }
    *out = s;
    return 0;
}

int vf_cv_spill_put(vf_cv_spill *s, size_t bucket, const vf_cv_record *head, const void *payload)
{
    struct iovec iov[2] = {{(void *)head, sizeof *head}, {(void *)payload, head->len}};
    size_t total = sizeof *head + head->len, done = 0;
    int iovcnt = head->len ? 2 : 1;
    ssize_t n = writev(s->fds[bucket], iov, iovcnt);
    if (n < 0)
        return vf_error(VF_EIO, "%s/bucket_%05zu.bin: write: %s", s->dir, bucket, strerror(errno));
    done = (size_t)n;
    if (done != total) /* a regular file only writes short on a full disk */
        return vf_error(VF_EIO, "%s/bucket_%05zu.bin: short write (disk full?)", s->dir, bucket);
    atomic_fetch_add(&s->bytes_written, (uint64_t)total);
    return 0;
}

int vf_cv_spill_scan(vf_cv_spill *s, size_t bucket, vf_cv_record_ref **refs, size_t *count)
{
    char name[4096];
    snprintf(name, sizeof name, "%s/bucket_%05zu.bin", s->dir, bucket);
    uint64_t good;
    *refs = NULL;
    *count = 0;
    return walk(s->fds[bucket], name, refs, count, &good);
}

int vf_cv_spill_read(vf_cv_spill *s, size_t bucket, uint64_t offset, void *dest, size_t len)
{
    int r = read_exact(s->fds[bucket], dest, len, offset);
    if (r != 0)
        return vf_error(r < 0 ? VF_EIO : VF_ECORRUPT, "%s/bucket_%05zu.bin: record at byte %llu: %s", s->dir,
                        bucket, (unsigned long long)offset, r < 0 ? strerror(-r) : "truncated");
    return 0;
}

uint64_t vf_cv_spill_bytes_written(vf_cv_spill *s)
{
    return atomic_load(&s->bytes_written);
}

void vf_cv_spill_close(vf_cv_spill *s)
{
    if (!s)
        return;
    for (size_t i = 0; s->fds && i < s->num_buckets; i++)
        if (s->fds[i] >= 0)
            close(s->fds[i]);
    free(s->fds);
    free(s->dir);
    free(s);
}
