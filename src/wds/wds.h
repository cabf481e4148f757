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

/* vf_wds_decode_image with a TurboJPEG handle kept by the caller (*tj_handle
 * NULL: created on first use; free with vf_wds_jpeg_handle_free). */
int vf_wds_decode_image_with(void **tj_handle, const uint8_t *data, size_t size, int width, int height,
                             int float_chw, void *out);
void vf_wds_jpeg_handle_free(void *tj_handle);
/* A PNG's bit depth (8, 16, ...), or -1 when data is not a PNG. */
int vf_wds_png_bit_depth(const uint8_t *data, size_t size);

#endif
