/*
 * source.c: the vf_source abstraction with local-file (pread) and memory
 * implementations. Remote sources plug in through vf_source_create().
 */
#define _GNU_SOURCE
#include "io/io.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct vf_source {
    atomic_int refs;
    char *name;
    uint64_t size;
    vf_source_ops ops;
    void *impl;
};

int vf_source_create(vf_source **out, const char *name, uint64_t size, const vf_source_ops *ops, void *impl)
{
    *out = NULL;
    vf_source *s = vf_calloc(1, sizeof *s);
    if (!s)
        return VF_ENOMEM;
    s->name = vf_strdup(name ? name : "(unnamed)");
    if (!s->name) {
        free(s);
        return VF_ENOMEM;
    }
    atomic_init(&s->refs, 1);
    s->size = size;
    s->ops = *ops;
    s->impl = impl;
    *out = s;
    return 0;
}

/* ---- local file ---- */

typedef struct file_impl {
    int fd;
    char *path;
} file_impl;

static int64_t file_read_at(void *impl, uint64_t offset, void *buf, size_t len)
{
    file_impl *f = impl;
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(f->fd, (char *)buf + done, len - done, (off_t)(offset + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return vf_error(VF_EIO, "%s: read failed at offset %llu: %s", f->path,
                            (unsigned long long)(offset + done), strerror(errno));
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (int64_t)done;
}

typedef struct file_view {
    void *addr;
    size_t len;
} file_view;

static const uint8_t *file_view_range(void *impl, uint64_t offset, size_t len, int populate, void **token)
{
    file_impl *f = impl;
    *token = NULL;
    if (len < VF_SOURCE_VIEW_MIN || getenv("VF_NO_MMAP"))
        return NULL;
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start = offset - offset % (uint64_t)(page > 0 ? page : 4096);
    size_t maplen = (size_t)(offset - start) + len;
    file_view *v = malloc(sizeof *v);
    if (!v)
        return NULL;
    void *addr = mmap(NULL, maplen, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), f->fd, (off_t)start);
    if (addr == MAP_FAILED) {
        free(v);
        return NULL;
    }
    v->addr = addr;
    v->len = maplen;
    *token = v;
    return (const uint8_t *)addr + (offset - start);
}

static void file_unview(void *impl, void *token)
{
    (void)impl;
    file_view *v = token;
    if (v) {
        munmap(v->addr, v->len);
        free(v);
    }
}

static void file_destroy(void *impl)
{
    file_impl *f = impl;
    close(f->fd);
    free(f->path);
    free(f);
}

int vf_source_open_file(vf_source **out, const char *path)
{
    *out = NULL;
    int fd;
    uint64_t size;
    int r = vf_open_regular_file(path, &fd, &size);
    if (r < 0)
        return r;
    file_impl *f = vf_calloc(1, sizeof *f);
    if (!f || !(f->path = vf_strdup(path))) {
        free(f);
        close(fd);
        return VF_ENOMEM;
    }
    f->fd = fd;
    static const vf_source_ops ops = {file_read_at, file_destroy, file_view_range, file_unview};
    r = vf_source_create(out, path, size, &ops, f);
    if (r < 0)
        file_destroy(f);
    return r;
}

/* ---- memory ---- */

typedef struct mem_impl {
    const uint8_t *data;
    size_t len;
    uint8_t *owned;
} mem_impl;

static int64_t mem_read_at(void *impl, uint64_t offset, void *buf, size_t len)
{
    mem_impl *m = impl;
    if (offset >= m->len)
        return 0;
    size_t n = VF_MIN(len, (size_t)(m->len - offset));
    memcpy(buf, m->data + offset, n);
    return (int64_t)n;
}

static const uint8_t *mem_view(void *impl, uint64_t offset, size_t len, int populate, void **token)
{
    (void)populate;
    mem_impl *m = impl;
    *token = NULL;
    return offset <= m->len && len <= m->len - offset ? m->data + offset : NULL;
}

static void mem_destroy(void *impl)
{
    mem_impl *m = impl;
    free(m->owned);
    free(m);
}

int vf_source_open_memory(vf_source **out, const char *name, const void *data, size_t len, int copy)
{
    *out = NULL;
    mem_impl *m = vf_calloc(1, sizeof *m);
    if (!m)
        return VF_ENOMEM;
    if (copy) {
        m->owned = vf_malloc(len);
        if (!m->owned) {
            free(m);
            return VF_ENOMEM;
        }
        if (len)
            memcpy(m->owned, data, len);
        m->data = m->owned;
    } else {
        m->data = data;
    }
    m->len = len;
    static const vf_source_ops ops = {mem_read_at, mem_destroy, mem_view, NULL};
    int r = vf_source_create(out, name ? name : "(memory)", len, &ops, m);
    if (r < 0)
        mem_destroy(m);
    return r;
}

/* ---- common ---- */

int64_t vf_source_read_upto(vf_source *s, uint64_t offset, void *buf, size_t len)
{
    if (offset >= s->size || len == 0)
        return 0;
    if (len > s->size - offset)
        len = (size_t)(s->size - offset);
    return s->ops.read_at(s->impl, offset, buf, len);
}

int vf_source_read_at(vf_source *s, uint64_t offset, void *buf, size_t len)
{
    if (offset > s->size || len > s->size - offset)
        return vf_error(VF_ECORRUPT, "%s: truncated: need bytes [%llu, %llu) but the file has %llu", s->name,
                        (unsigned long long)offset, (unsigned long long)offset + len,
                        (unsigned long long)s->size);
    int64_t n = s->ops.read_at(s->impl, offset, buf, len);
    if (n < 0)
        return (int)n;
    if ((size_t)n != len)
        return vf_error(VF_ECORRUPT, "%s: truncated: short read at offset %llu (%lld of %zu bytes)", s->name,
                        (unsigned long long)offset, (long long)n, len);
    return 0;
}

const uint8_t *vf_source_view(vf_source *s, uint64_t offset, size_t len, int populate, void **token)
{
    *token = NULL;
    if (!s->ops.view || offset > s->size || len > s->size - offset || len == 0)
        return NULL;
    return s->ops.view(s->impl, offset, len, populate, token);
}

void vf_source_unview(vf_source *s, void *token)
{
    if (token && s->ops.unview)
        s->ops.unview(s->impl, token);
}

uint64_t vf_source_size(const vf_source *s) { return s->size; }

const char *vf_source_name(const vf_source *s) { return s->name; }

vf_source *vf_source_ref(vf_source *s)
{
    atomic_fetch_add(&s->refs, 1);
    return s;
}

void vf_source_close(vf_source *s)
{
    if (!s)
        return;
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    if (s->ops.destroy)
        s->ops.destroy(s->impl);
    free(s->name);
    free(s);
}
