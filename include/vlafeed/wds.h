/*
 * wds.h: the public API for WebDataset tar shards indexed by a
 * manifest.jsonl (VLA Foundry's layout): the manifest, a sample reader over
 * one shard, and a shard loader that yields batches of decoded columns.
 *
 *   vf_wds_loader_settings ws;  vf_wds_loader_defaults(&ws);
 *   ws.batch_size = 64; ws.seed = 0; ws.shuffle_buffer = 1000;
 *   vf_wds_loader *l;  if (vf_wds_loader_open(&l, "shards/manifest.jsonl", &ws) < 0) ... vf_last_error()
 *   vf_wds_batch *b;
 *   while ((r = vf_wds_loader_next(l, &b)) == 0) { ... vf_wds_batch_free(b); }
 *   // r == VF_EOF: the epoch is over; vf_wds_loader_set_epoch(l, 1) starts the next
 *   vf_wds_loader_close(l);
 *
 * Grouping (as webdataset 1.0.2 groups a tar stream): a member name is
 * split at the first '.' after its last '/': the key is what comes before,
 * the suffix (lower-cased) what comes after; names without such a '.' are
 * ignored, as are non-regular members and webdataset's metadata names
 * (`__*__`). The members of one key must be contiguous (a key seen again
 * later starts a new sample, as in webdataset); a suffix twice in one
 * sample is an error. A sample never spans two shards.
 *
 * Order: the loader uses the plan layer's stream mode with one task per
 * shard: the shards in a seeded permutation per epoch, each shard's
 * samples in tar order, cut into rank slices by the loader's remainder rule
 * (include/vlafeed/loader.h), each consumer's part reordered by the bounded
 * shuffle buffer. The emitted order is computed from the manifest counts
 * alone, so it is a pure function of (manifest, seed, epoch, rank,
 * world_size, consumers, batch_size, drop_last, shuffle_buffer), and a
 * restored loader skips delivered samples without decoding them (their
 * bytes are skipped in the tar stream, never read into memory).
 *
 * Ownership: strings in settings are copied at open. A batch belongs to
 * the caller until vf_wds_batch_free. Everything returned by the manifest
 * lives as long as the manifest.
 */
#ifndef VLAFEED_WDS_H
#define VLAFEED_WDS_H

#include <stddef.h>
#include <stdint.h>

#include "vlafeed/loader.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- manifest ------------------------------------------------------------ */

typedef struct vf_wds_manifest vf_wds_manifest;

/* Where the shards may live. By default every shard must resolve under the
 * manifest's base: the folder of a local manifest, or for an http(s):// /
 * s3:// manifest its URL up to the last '/' of the path (the query left
 * out). A shard written as a relative path must have no ".." component
 * (for a URL base also none spelled with %2e, %2f or a backslash); a shard
 * written as an absolute path or URL must start with the base and obey
 * the same rule after it. Anything else (a "../x", "/abs/x", a URL in a
 * local manifest, another host or a local path in a remote one,
 * "file:///etc/passwd?.tar") is refused at open with VF_EINVAL naming the
 * manifest, the line, the shard and why. The check reads the text only:
 * a symbolic link inside the folder is followed wherever it points.
 *
 * allow_outside_base = 1 lets every shard through as written (a relative
 * one joined to the base, absolute paths and URLs used as they are).
 * vf_wds_manifest_defaults and vf_wds_loader_defaults set it to 1 when the
 * environment has VF_WDS_ALLOW_OUTSIDE=1 (the opt-in for callers that
 * cannot reach the settings, e.g. the Python binding), else 0. */
typedef struct vf_wds_manifest_settings {
    int allow_outside_base;    /* 0: refuse shards outside the base (default unless VF_WDS_ALLOW_OUTSIDE=1) */
} vf_wds_manifest_settings;
void vf_wds_manifest_defaults(vf_wds_manifest_settings *s);

/* Reads manifest.jsonl (a local path or an http(s):// / s3:// URL): one
 * JSON object per line with "shard" (a path relative to the manifest's
 * directory, with or without ".tar": VLA Foundry's code writes stems, its
 * docs show names with .tar; both resolve to <dir>/<stem>.tar) and
 * "num_sequences" (samples in the shard, >= 0). Other fields are ignored;
 * blank lines are skipped. Errors name the manifest and line. settings
 * NULL: vf_wds_manifest_defaults. On success *out is the caller's
 * (vf_wds_manifest_close); on failure it is NULL. */
int vf_wds_manifest_open_with(vf_wds_manifest **out, const char *path_or_url, const vf_wds_manifest_settings *s);
/* The same from text in memory; `name` is the manifest's path or URL (its
 * directory resolves the shards). */
int vf_wds_manifest_parse_with(vf_wds_manifest **out, const char *name, const char *text, size_t len,
                               const vf_wds_manifest_settings *s);
/* The two above with the default settings. */
int vf_wds_manifest_open(vf_wds_manifest **out, const char *path_or_url);
int vf_wds_manifest_parse(vf_wds_manifest **out, const char *name, const char *text, size_t len);
size_t vf_wds_manifest_num_shards(const vf_wds_manifest *m);
const char *vf_wds_manifest_shard_url(const vf_wds_manifest *m, size_t i);  /* path or URL of the .tar */
const char *vf_wds_manifest_shard_name(const vf_wds_manifest *m, size_t i); /* "shard" as written */
int64_t vf_wds_manifest_shard_samples(const vf_wds_manifest *m, size_t i);
int64_t vf_wds_manifest_total_samples(const vf_wds_manifest *m);
/* A hash of the shard names and counts (what a resume state must match). */
uint64_t vf_wds_manifest_fingerprint(const vf_wds_manifest *m);
void vf_wds_manifest_close(vf_wds_manifest *m);

/* ---- one shard as a stream of samples ------------------------------------ */

typedef struct vf_wds_member {
    const char *suffix;        /* lower-cased, e.g. "top_t0.jpg", "lowdim.npz" */
    const char *name;          /* the member's full name in the tar */
    const uint8_t *data;       /* NULL when the sample was skipped (want = 0), or the member was not
                                * read (not a wanted field: see vf_wds_loader_settings.fields) */
    size_t size;
} vf_wds_member;

typedef struct vf_wds_sample {
    const char *key;
    int64_t index;             /* 0-based sample number in the shard */
    size_t num_members;
    const vf_wds_member *members;
} vf_wds_sample;

typedef struct vf_wds_reader vf_wds_reader;

/* Opens a shard (local path, http(s):// or s3:// through the byte-source
 * layer; remote reads go through its read-ahead block cache). VF_ENOENT
 * names a missing shard. */
int vf_wds_reader_open(vf_wds_reader **out, const char *path_or_url);
/* A shard in memory (tests, fuzzing); data must outlive the reader. */
int vf_wds_reader_open_memory(vf_wds_reader **out, const char *name, const void *data, size_t len);
/* The next sample: 0 with *out (valid until the next call), VF_EOF at the
 * end of the shard, or an error naming the shard, the member and the key
 * (truncated or damaged tar, duplicate suffix). want = 0 skips the
 * sample's bytes without reading them into memory (members' data NULL).
 * A member whose tar header declares more than 256 MiB (a sparse member:
 * its expanded size), or a sample whose members together pass 1 GiB, is
 * refused before it is read: VF_ERANGE naming the budget
 * (max_member_bytes, max_sample_bytes). After an error the reader ends. */
int vf_wds_reader_next(vf_wds_reader *r, int want, const vf_wds_sample **out);
void vf_wds_reader_close(vf_wds_reader *r);

/* ---- field decoders (exposed for tests and fuzzing) ---------------------- */

/* A .npy array (format 1.0, 2.0 or 3.0; little-endian or byte-order-free
 * dtypes b1 u1 i1 i2 i4 i8 u2 u4 u8 f2 f4 f8; C order). data points into
 * the input. Anything else is VF_EUNSUPPORTED (the Python layer then
 * decodes the member with numpy), a malformed header VF_ECORRUPT. */
typedef struct vf_wds_array {
    char descr[8];             /* numpy dtype string, e.g. "<f4", "|b1" */
    int itemsize;
    int ndim;
    int64_t shape[8];
    const uint8_t *data;
    size_t nbytes;
} vf_wds_array;
int vf_wds_parse_npy(const uint8_t *data, size_t size, vf_wds_array *out);

/* The members of a .npz (zip, stored or deflated), each parsed as .npy.
 * Members that together inflate to more than 256 MiB (max_member_bytes)
 * are refused from their zip headers before inflating: VF_ERANGE.
 * names[i] is the member name without ".npy"; storage[i] / sizes[i] the
 * member's bytes (a .npy document); parsed[i] 1 when arrays[i] describes it
 * (data pointing into storage[i]), 0 for a dtype left to numpy
 * (VF_EUNSUPPORTED from vf_wds_parse_npy). A damaged zip, a CRC mismatch
 * or a malformed .npy is VF_ECORRUPT. Everything newly allocated:
 * vf_wds_npz_free. */
typedef struct vf_wds_npz {
    size_t count;
    char **names;
    vf_wds_array *arrays;
    uint8_t **storage;
    size_t *sizes;
    int *parsed;
} vf_wds_npz;
int vf_wds_read_npz(const uint8_t *data, size_t size, vf_wds_npz *out);
void vf_wds_npz_free(vf_wds_npz *z);

/* Width and height of a JPEG (TurboJPEG header) or PNG (IHDR). */
int vf_wds_image_size(const uint8_t *data, size_t size, int *width, int *height);
/* Decodes a JPEG (libjpeg-turbo through TurboJPEG; accurate integer IDCT and
 * fancy upsampling, the settings PIL uses) or a PNG (libpng; 8-bit output,
 * 1/2/4-bit samples scaled to 8 bits, alpha dropped, gray expanded) to RGB,
 * resized with swscale (area) when (width, height) differ from the
 * image's; a JPEG at least twice the target is decoded at 1/2, 1/4 or 1/8
 * scale first. float_chw = 0: uint8 [H][W][3] into out; 1: float32
 * [3][H][W] in [0, 1]. An image whose header declares more than 64 Mpx
 * (max_image_pixels) is refused before anything is allocated: VF_ERANGE. */
int vf_wds_decode_image(const uint8_t *data, size_t size, int width, int height, int float_chw, void *out);

/* ---- the shard loader ------------------------------------------------------ */

typedef enum vf_wds_on_error {
    VF_WDS_RAISE = 0,          /* the first bad sample or shard fails vf_wds_loader_next */
    VF_WDS_SKIP = 1,           /* bad samples are left out of their batch and counted */
} vf_wds_on_error;

typedef struct vf_wds_loader_settings {
    size_t batch_size;         /* default 32 */
    uint64_t seed;             /* default 0 */
    int shuffle;               /* default 1: shards permuted per epoch + the shuffle buffer */
    int drop_last;             /* default 0 */
    int64_t epoch;             /* first epoch, default 0 */
    int rank, world_size;      /* default 0 / 1 */
    int num_consumers;         /* consumers per rank, default 1 */
    int consumer;              /* -1 (default): all of the rank's, batches round-robin */
    size_t shuffle_buffer;     /* samples in each consumer's shuffle buffer; default 1000, 0 = off */
    /* Fields (suffixes) to deliver, comma-separated, e.g. "lowdim.npz,top_t0.jpg";
     * NULL (default): those of the first sample of the manifest's first
     * non-empty shard. A sample lacking one is bad input. */
    const char *fields;
    int image_float_chw;       /* 0 (default): uint8 [B,H,W,3]; 1: float32 [B,3,H,W] in [0,1] */
    int resize_width, resize_height; /* 0 (default): images keep their size (must agree in a batch) */
    vf_wds_on_error on_error;
    int threads;               /* decode threads per batch, default 0 = min(4, CPUs) */
    size_t prefetch;           /* batches a producer thread assembles ahead of the caller, default 2;
                                * 0: each batch is assembled inside vf_wds_loader_next */
    const vf_loader_state *resume; /* NULL, or a state to start from (overrides epoch) */
    int allow_outside_base;    /* shards outside the manifest's base: see vf_wds_manifest_settings;
                                * default 0, or 1 when the environment has VF_WDS_ALLOW_OUTSIDE=1 */
    /* Budgets (all > 0; a crafted shard or manifest cannot make the loader
     * allocate more than they allow). Each is checked against what a header
     * declares BEFORE anything of that size is allocated: a tar member's
     * size (a GNU/pax sparse member's real size), a JPEG's or PNG's
     * dimensions, a .npz member's size from its zip headers, the columns
     * of a batch, the manifest's counts. Exceeding one is bad input: the
     * message names the shard, the member, the key and the budget's name;
     * under VF_WDS_SKIP the sample is left out and counted. Members whose
     * suffix is not a delivered field are never read (skipped in the tar
     * stream), whatever their size. */
    int64_t max_image_pixels;  /* width * height an image may declare; default 64 Mpx (8192 x 8192) */
    int64_t max_member_bytes;  /* a read member's size, and what one member decodes to (an image's
                                * pixels at their decoded size, a .npz's arrays); default 256 MiB */
    int64_t max_sample_bytes;  /* a sample's read members plus what they decode to; default 1 GiB */
    int64_t max_batch_bytes;   /* a batch's columns; a sample that would pass it is refused (the
                                * batch keeps the samples before it); default 8 GiB */
    int64_t max_manifest_samples; /* num_sequences of all shards together (the plan of an epoch
                                * holds about 16 bytes per sample); default 2^28 */
    int64_t max_buffer_bytes;  /* the read members of the samples each consumer holds between
                                * reading and delivering them (the shuffle buffer, all consumers
                                * together); default 4 GiB. Not bad input: the sample that would
                                * pass it fails the pass under both on_error policies, at a point
                                * fixed by the plan (nothing is dropped or reordered) */
} vf_wds_loader_settings;

typedef struct vf_wds_loader vf_wds_loader;

void vf_wds_loader_defaults(vf_wds_loader_settings *s);
/* Opens the manifest and plans the first epoch. VF_EINVAL for bad
 * settings or a shard outside the manifest's base (see
 * vf_wds_manifest_settings); errors of the manifest name it. Before the
 * plan is allocated the counts are checked (VF_ECORRUPT naming the line
 * and the shard): a local shard of B bytes holds at most B / 512 samples
 * (a gzip'd one 1032 times that), all shards together at most
 * max_manifest_samples (remote shard sizes are not fetched at open); a
 * shard listed with num_sequences 0 whose tar holds samples is an error
 * (under VF_WDS_SKIP a skipped shard, counted with its message). */
int vf_wds_loader_open(vf_wds_loader **out, const char *manifest, const vf_wds_loader_settings *s);
void vf_wds_loader_close(vf_wds_loader *l);
/* Stops the loader's shard reads (any thread, also during
 * vf_wds_loader_next): a remote read retrying through an outage fails at
 * once with "cancelled" instead of at the end of its retry budget, and
 * every later vf_wds_loader_next fails so; never a partial batch. Close
 * calls it first. */
void vf_wds_loader_cancel(vf_wds_loader *l);
int64_t vf_wds_loader_num_samples(const vf_wds_loader *l); /* this loader's samples per epoch */
size_t vf_wds_loader_num_batches(const vf_wds_loader *l);
const vf_wds_manifest *vf_wds_loader_manifest(const vf_wds_loader *l);
int vf_wds_loader_set_epoch(vf_wds_loader *l, int64_t epoch);

/* A column of a batch. Numeric columns (npz arrays, .npy, images, .cls
 * as int64) have type, shape and data; VF_WDS_BYTES columns hold the raw
 * member bytes per sample (.json, .txt, .pth and any other suffix, and
 * .npy / npz arrays of dtypes decoded in Python), for the caller to parse.
 * A bytes column whose name ends in ".npy" inside an npz is named
 * "<npz member name>" and flagged npy = 1. */
#define VF_WDS_BYTES 100
typedef struct vf_wds_column {
    char *name;                /* npz array name, image suffix without extension, or the suffix */
    int type;                  /* vf_column_type, or VF_WDS_BYTES */
    char descr[8];             /* numeric: numpy dtype string ("<f4", "|u1", ...) */
    int ndim;                  /* including the batch dimension */
    int64_t shape[9];
    uint8_t *data;             /* numeric: contiguous C order */
    size_t nbytes;
    uint8_t **items;           /* VF_WDS_BYTES: one buffer per sample */
    size_t *item_sizes;
    int npy;                   /* VF_WDS_BYTES holding a .npy document */
    char *suffix;              /* the member suffix it comes from */
} vf_wds_column;

typedef struct vf_wds_batch {
    size_t size;               /* samples */
    size_t num_columns;
    vf_wds_column *columns;
    char **keys;               /* __key__ per sample */
    char **shards;             /* the shard's manifest name per sample */
    int64_t *positions;        /* global sample indices (manifest order) */
} vf_wds_batch;

/* The next batch of the current epoch (0), VF_EOF at its end, or an error
 * naming the shard, member and key (under VF_WDS_RAISE; the loader then
 * returns the same error until set_epoch / set_state). The batch is the
 * caller's (vf_wds_batch_free). With prefetch > 0 a producer thread
 * (started by the first call) assembles up to `prefetch` batches ahead;
 * set_epoch, set_state and close stop it and drop what it prefetched.
 * One caller thread at a time. */
int vf_wds_loader_next(vf_wds_loader *l, vf_wds_batch **out);
void vf_wds_batch_free(vf_wds_batch *b);

/* Resume: the same vf_loader_state as vf_loader (mode VF_MODE_STREAM,
 * fingerprint = the manifest's, positions = its total samples,
 * partition "episode", pool size 0). samples_consumed counts what the
 * callers of all ranks received; a state from another manifest or order
 * settings is refused (VF_EINVAL naming what differs); a state from
 * another world size, consumer count or batch size resumes elastically
 * (the remaining ranges, as vf_loader does). out->ranges is borrowed from
 * the loader (valid until its next set_state/set_epoch). */
int vf_wds_loader_get_state(const vf_wds_loader *l, vf_loader_state *out);
int vf_wds_loader_set_state(vf_wds_loader *l, const vf_loader_state *state);
size_t vf_wds_loader_batches_delivered(const vf_wds_loader *l);
/* The state after `batches` rank-level batches of the current epoch in this
 * loader's layout (world_size, num_consumers, batch_size, and its ranges
 * after an elastic restore), without iterating: for DataLoader workers,
 * whose batches only the main process sees. */
int vf_wds_loader_state_at(const vf_wds_loader *l, int64_t batches, vf_loader_state *out);

typedef struct vf_wds_stats {
    uint64_t samples, batches;
    uint64_t skipped_samples;  /* bad samples left out under VF_WDS_SKIP */
    uint64_t skipped_shards;   /* shards (or their rest) given up under VF_WDS_SKIP */
    uint64_t samples_read;     /* samples whose bytes were read */
    uint64_t samples_passed;   /* samples skipped in the stream (not this consumer's, or delivered before a resume) */
    uint64_t shards_opened;
    uint64_t bytes_read;       /* member bytes read */
    uint64_t images_decoded;
    double decode_seconds;     /* wall time of the decode phase */
} vf_wds_stats;
void vf_wds_loader_stats(const vf_wds_loader *l, vf_wds_stats *out);
/* The message of the i-th skipped item (i < skipped_samples + skipped_shards, at most 64 kept). */
size_t vf_wds_loader_num_skip_messages(const vf_wds_loader *l);
const char *vf_wds_loader_skip_message(const vf_wds_loader *l, size_t i);

#ifdef __cplusplus
}
#endif

#endif
