/*
 * convert.h: the convert layer of vlafeed, its whole interface to the
 * layers above (the public API include/vlafeed/convert.h is implemented in
 * wds.c on top of these pieces).
 *
 * Owns: the writers a conversion to WebDataset shards needs: .npy v1.0
 * arrays packed into an .npz (a DEFLATE zip through libarchive, what
 * numpy.load and np.savez_compressed agree on), tar shards (libarchive's
 * pax-restricted writer: plain ustar unless a name needs a pax header;
 * members 0644, uid/gid 0, mtime 0), and the on-disk spill that turns
 * records produced in decode order into shards in shuffled order (an
 * external bucket shuffle).
 *
 * Depends on: base, libarchive, zlib.
 *
 * Spill invariants:
 *  - A bucket file is a sequence of whole records (header + payload),
 *    appended with one writev() on an O_APPEND descriptor, so concurrent
 *    writers never interleave inside a record. A torn tail (a process killed
 *    inside a write) is cut off when the spill is reopened.
 *  - Every record names the unit of work and the run that wrote it; the
 *    reader of a bucket keeps only records of (unit, run) pairs that the
 *    caller's journal says finished, so the leftovers of a killed unit are
 *    ignored after it is redone.
 */
#ifndef VF_CONVERT_H
#define VF_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* ---- .npy / .npz ------------------------------------------------------ */

typedef struct vf_cv_array {
    const char *name;        /* member name without ".npy", e.g. "observation.state" */
    const char *descr;       /* numpy dtype string: "<f4", "<i8", "|b1", ... */
    int ndim;                /* 1..4 */
    int64_t shape[4];
    const void *data;        /* C order, little-endian */
    size_t bytes;
} vf_cv_array;

/* Appends the .npy v1.0 encoding of a (header padded to 64 bytes, like
 * numpy writes it) to out. */
int vf_cv_npy_encode(const vf_cv_array *a, vf_buf *out);
/* Writes an .npz (zip, DEFLATE, one "<name>.npy" member per array, in the
 * order given) into out (appended). */
int vf_cv_npz_write(const vf_cv_array *arrays, size_t count, vf_buf *out);

/* ---- tar shards ------------------------------------------------------- */

typedef struct vf_cv_tar vf_cv_tar;
/* Creates path (truncating) and starts a tar archive in it. */
int vf_cv_tar_open(vf_cv_tar **out, const char *path);
int vf_cv_tar_add(vf_cv_tar *t, const char *name, const void *data, size_t len);
/* Finishes the archive, fsyncs and closes the file; bytes and the CRC-32
 * of the whole file come back (either may be NULL). Frees t. */
int vf_cv_tar_finish(vf_cv_tar *t, uint64_t *bytes, uint32_t *crc);
/* Closes without finishing (the caller removes the file). NULL is ok. */
void vf_cv_tar_abort(vf_cv_tar *t);

/* CRC-32 and size of a whole file (to verify a finished shard). */
int vf_cv_file_crc(const char *path, uint64_t *bytes, uint32_t *crc);

/* ---- spill ------------------------------------------------------------ */

#define VF_CV_RECORD_MAGIC 0x31524656u /* "VFR1" */

typedef struct vf_cv_record {
    uint32_t magic;
    uint32_t unit;           /* unit of work that wrote it */
    uint32_t run;            /* run number of the conversion (1, 2, ... on resume) */
    uint32_t shard;
    uint32_t pos;            /* position of the sample inside its shard */
    uint16_t member;         /* index into the sample's member list */
    uint16_t reserved;
    uint32_t len;            /* payload bytes that follow */
    int64_t episode_index;   /* the sample's episode and anchor frame */
    int64_t frame;
} vf_cv_record;

/* A record found by vf_cv_spill_scan: its header and the payload offset. */
typedef struct vf_cv_record_ref {
    vf_cv_record head;
    uint64_t offset;
} vf_cv_record_ref;

typedef struct vf_cv_spill vf_cv_spill;
/* Opens (creating) num_buckets files bucket_NNNNN.bin in dir, cutting a torn
 * tail off each existing one. */
int vf_cv_spill_open(vf_cv_spill **out, const char *dir, size_t num_buckets);
/* Appends one record (head->len payload bytes) to a bucket. Thread-safe. */
int vf_cv_spill_put(vf_cv_spill *s, size_t bucket, const vf_cv_record *head, const void *payload);
/* Every whole record of a bucket, in file order (*refs newly allocated). */
int vf_cv_spill_scan(vf_cv_spill *s, size_t bucket, vf_cv_record_ref **refs, size_t *count);
/* Reads a payload found by scan into dest (len bytes). Thread-safe. */
int vf_cv_spill_read(vf_cv_spill *s, size_t bucket, uint64_t offset, void *dest, size_t len);
/* Bytes appended by this process so far. */
uint64_t vf_cv_spill_bytes_written(vf_cv_spill *s);
void vf_cv_spill_close(vf_cv_spill *s);

#endif
