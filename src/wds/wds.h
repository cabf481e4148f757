/*
 * wds.h: the WebDataset layer of vlafeed, its whole interface to the layers
 * above (the public part is include/vlafeed/wds.h).
 *
 * Owns: manifest.jsonl parsing (manifest.c), the tar stream and webdataset's
 * grouping of members into samples (tar.c, libarchive), field decoders
 * (decode.c: TurboJPEG, libpng, swscale, .npy by hand, .npz through
 * libarchive's zip reader), and the shard loader (loader.c: the plan
 * layer's stream order with one task per shard, batch assembly).
 *
 * Depends on: base, io (byte sources: local, http(s), s3 with read-ahead),
 * json, plan.
 *
 * Invariants:
 *  - Every error names the shard (its path or URL), and where one is known
 *    the member and the sample key.
 *  - The order of samples never depends on threads or timing: only the
 *    manifest counts and the order settings decide it.
 */
#ifndef VF_WDS_H
#define VF_WDS_H

#include "base/base.h"
#include "vlafeed/wds.h"

/* webdataset's split of a member name (base_plus_ext): 1 with *key_len
 * (the key is name[0, key_len)) and *suffix (the rest after the '.'), 0
 * when the name has no key/suffix form and is ignored. */
int vf_wds_split_name(const char *name, size_t *key_len, const char **suffix);
/* 1 for webdataset's metadata names, which it skips (`__*__`). */
int vf_wds_is_meta_name(const char *name);

/* The budgets' defaults (vf_wds_loader_settings; the reader and the
 * decoders of include/vlafeed/wds.h use them when no loader sets others). */
#define VF_WDS_DEFAULT_MAX_IMAGE_PIXELS ((int64_t)8192 * 8192)
#define VF_WDS_DEFAULT_MAX_MEMBER_BYTES ((int64_t)256 << 20)
#define VF_WDS_DEFAULT_MAX_SAMPLE_BYTES ((int64_t)1 << 30)
#define VF_WDS_DEFAULT_MAX_BATCH_BYTES ((int64_t)8 << 30)
#define VF_WDS_DEFAULT_MAX_MANIFEST_SAMPLES ((int64_t)1 << 28)
#define VF_WDS_DEFAULT_MAX_BUFFER_BYTES ((int64_t)4 << 30)

/* What a reader reads of a wanted sample (vf_wds_reader_next with want = 1). */
typedef struct vf_wds_reader_limits {
    int64_t max_member_bytes;  /* a read member's declared size (a sparse member's real size) */
    int64_t max_sample_bytes;  /* the read members of one sample together */
    char *const *fields;       /* suffixes read; the others are skipped unread (data NULL); NULL: all */
    size_t num_fields;
    /* 0: a sample over a budget is an error that ends the reader, like any
     * other; 1: the rest of the sample is skipped unread and the call
     * returns VF_ERANGE (the message names shard, member, key and budget);
     * the next call returns the sample after it. */
    int skip_refused;
} vf_wds_reader_limits;
/* Replaces the reader's limits (default: the default budgets, every member
 * read, skip_refused 0). fields is borrowed: it must outlive the reader. */
void vf_wds_reader_set_limits(vf_wds_reader *r, const vf_wds_reader_limits *limits);

/* How an image of sw x sh is decoded for a target of width x height: the
 * size the codec produces (a JPEG at the smallest of libjpeg-turbo's
 * scaling factors 1/2, 1/4, 1/8 that keeps at least twice the target in
 * each dimension; else the image's own size). */
void vf_wds_decode_size(const uint8_t *data, size_t size, int sw, int sh, int width, int height, int *decode_w,
                        int *decode_h);
/* vf_wds_decode_image with a TurboJPEG handle kept by the caller (*tj_handle
 * NULL: created on first use; free with vf_wds_jpeg_handle_free) and a
 * pixel budget checked on the header before anything is allocated
 * (VF_ERANGE naming it). */
int vf_wds_decode_image_with(void **tj_handle, const uint8_t *data, size_t size, int width, int height,
                             int float_chw, int64_t max_pixels, void *out);
/* vf_wds_read_npz with a budget on the members' inflated sizes together,
 * checked on each member's zip header before it is inflated (VF_ERANGE
 * naming the member and max_member_bytes). */
int vf_wds_read_npz_limited(const uint8_t *data, size_t size, int64_t max_bytes, vf_wds_npz *out);
void vf_wds_jpeg_handle_free(void *tj_handle);
/* A PNG's bit depth (1, 2, 4, 8, 16), or -1 when data is not a PNG. PNGs
 * of 16 bits are handed to the caller as bytes; the others decode to 8-bit. */
int vf_wds_png_bit_depth(const uint8_t *data, size_t size);

/* ---- manifest checks (manifest.c) ---- */

/* The manifest's path or URL, as opened. */
const char *vf_wds_manifest_path(const vf_wds_manifest *m);
/* The manifest line a shard was listed on (1-based). */
int64_t vf_wds_manifest_shard_line(const vf_wds_manifest *m, size_t i);
/* Checks the counts before anything proportional to them is allocated:
 * their sum against max_samples, and each local shard's count against
 * what its file can hold (a sample needs at least one 512-byte tar
 * header: size / 512, or for a gzip'd shard what deflate's 1032:1 limit
 * lets that size inflate to). Remote shards, missing ones and shards
 * compressed with other filters are held to max_samples only (and checked
 * against their tar when read). VF_ECORRUPT naming the manifest, the line
 * and the shard. */
int vf_wds_manifest_check_counts(const vf_wds_manifest *m, int64_t max_samples);

#endif
