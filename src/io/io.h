/*
 * io.h: byte sources. Every reader above this layer (Parquet, JSON, video
 * demux, tar) reads through a vf_source, so a local file, a memory buffer
 * and (later) an HTTP/S3 object are interchangeable.
 *
 * Invariants:
 *  - vf_source_read_at() is positional and thread-safe (pread semantics): no
 *    shared cursor, so several readers may share one source.
 *  - A source is reference counted; vf_source_close() drops one reference.
 *  - A short read past the end is an error (VF_ECORRUPT, "truncated"), never
 *    a silent partial result. Use vf_source_read_upto() when a short read is
 *    expected.
 */
#ifndef VF_IO_H
#define VF_IO_H

#include "base/base.h"

typedef struct vf_source vf_source;

typedef struct vf_source_ops {
    /* Reads up to len bytes at offset into buf; returns bytes read (0 at
     * end) or a negative code with the message set. */
    int64_t (*read_at)(void *impl, uint64_t offset, void *buf, size_t len);
    void (*destroy)(void *impl);
} vf_source_ops;

/* Wraps an implementation. name is copied (used in error messages); size is
 * the total byte size. On success the source owns impl (ops->destroy). */
int vf_source_create(vf_source **out, const char *name, uint64_t size, const vf_source_ops *ops, void *impl);

/* A local file opened read-only. Errors name the path (VF_ENOENT if absent). */
int vf_source_open_file(vf_source **out, const char *path);

/* A memory buffer. If copy is 0 the caller keeps data alive until the source
 * is closed; otherwise the source keeps its own copy. */
int vf_source_open_memory(vf_source **out, const char *name, const void *data, size_t len, int copy);

/* Exactly len bytes at offset, or an error naming the source
 * (VF_ECORRUPT "truncated" when the range passes the end). */
int vf_source_read_at(vf_source *s, uint64_t offset, void *buf, size_t len);
/* Up to len bytes; returns the count read or a negative code. */
int64_t vf_source_read_upto(vf_source *s, uint64_t offset, void *buf, size_t len);

uint64_t vf_source_size(const vf_source *s);
const char *vf_source_name(const vf_source *s);

/* Reference counting: ref adds one; close drops one and frees at zero. */
vf_source *vf_source_ref(vf_source *s);
void vf_source_close(vf_source *s);

#endif
