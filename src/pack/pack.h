/*
 * pack.h: sequence packing for variable-length attention.
 *
 * Owns: the placement of samples (token sequences of known lengths) into
 * rows of at most max_tokens tokens, and the index arrays a varlen attention
 * kernel needs (cu_seqlens, position_ids, per-sample row and offset).
 * Depends on base/ only.
 *
 * Invariants:
 *  - vf_pack_build is a pure function of (lengths, settings): the same input
 *    gives the same plan on every machine, so a batch's packed layout stays
 *    a function of the loader's seed and position, and a resumed run packs
 *    exactly like an uninterrupted one.
 *  - Algorithm: first-fit-decreasing over a bounded look-ahead window. The
 *    samples are cut into consecutive windows of `window` samples; inside a
 *    window they are taken longest first (ties: lower index first) and each
 *    goes into the first row opened in this window that still has room, or
 *    opens a new row. Rows never span windows, so a sample waits for at
 *    most window-1 others.
 *  - Every sample is placed exactly once; a row's samples are contiguous in
 *    `order` and their offsets ascend from 0 with no gaps; row_tokens[r] <=
 *    max_tokens.
 */
#ifndef VF_PACK_H
#define VF_PACK_H

#include <stddef.h>
#include <stdint.h>

typedef struct vf_pack_settings {
    int32_t max_tokens; /* tokens per row (>= 1) */
    size_t window;      /* samples per look-ahead window (0: all samples in one window) */
} vf_pack_settings;

/* max_tokens 2048, window 0. */
void vf_pack_defaults(vf_pack_settings *settings);

typedef struct vf_pack_plan {
    size_t sample_count;
    size_t row_count;
    size_t token_count;     /* sum of the lengths */
    int32_t *sample_row;    /* [sample_count] row of sample i */
    int32_t *sample_offset; /* [sample_count] first token of sample i inside its row */
    int32_t *order;         /* [sample_count] sample indices, row by row, offsets ascending */
    int32_t *cu_seqlens;    /* [sample_count + 1] token starts of order[k] in the unpadded concatenation */
    int32_t *row_first;     /* [row_count + 1] index into order of each row's first sample */
    int32_t *row_tokens;    /* [row_count] tokens used in each row */
    int32_t *position_ids;  /* [token_count] position of each token inside its sample (concatenation order) */
} vf_pack_plan;

/* Packs `count` samples of lengths[i] tokens. On success *plan owns its
 * arrays (release with vf_pack_free). VF_EINVAL names the sample when a
 * length is < 1 or > max_tokens, or the setting that is out of range;
 * VF_ERANGE when the total exceeds INT32_MAX tokens. On failure *plan is
 * zeroed. count may be 0 (an empty plan). */
int vf_pack_build(vf_pack_plan *plan, const int32_t *lengths, size_t count, const vf_pack_settings *settings);

/* Frees the arrays of a plan filled by vf_pack_build and zeroes it; NULL or a zeroed plan is fine. */
void vf_pack_free(vf_pack_plan *plan);

#endif
