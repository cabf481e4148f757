/*
 * lerobotv3.h: the LeRobot v2.1 -> v3.0 converter layer (its whole
 * interface above the public include/vlafeed/convert_v3.h): the MP4 joiner
 * that packs per-episode videos into multi-episode files by stream copy.
 *
 * Depends on: base, io, dataset, parquet, video (its demuxer over a
 * vf_source), and FFmpeg's libavformat for the muxer.
 *
 * Invariants of a joined file:
 *  - episodes are appended whole, in call order; episode n's first packet
 *    is placed exactly at the end of episode n-1 (the end of its last
 *    frame: max pts + duration), in the output track's time base, so
 *    from_timestamp is a real pts and no drift accumulates;
 *  - packets are copied, never decoded or re-encoded;
 *  - an episode whose codec parameters (codec, size, extradata) differ from
 *    the file's is refused with VF_LR3_INCOMPATIBLE before anything is
 *    written, so the caller can start a new file.
 */
#ifndef VF_LEROBOTV3_H
#define VF_LEROBOTV3_H

#include <stdint.h>

#include "base/base.h"
#include "io/io.h"

/* Positive result of vf_lr3_join_append: the episode cannot go into this
 * file (different codec parameters); nothing was written. */
#define VF_LR3_INCOMPATIBLE 1

typedef struct vf_lr3_join vf_lr3_join;

/* Creates the output MP4 at path (moov first after close, like LeRobot's
 * concatenated files). */
int vf_lr3_join_open(vf_lr3_join **out, const char *path);

typedef struct vf_lr3_appended {
    int64_t frames;            /* packets (frames) of the episode */
    double from_timestamp;     /* seconds: the episode's first pts in the output */
    double to_timestamp;       /* seconds: end of its last frame */
    int64_t bytes_read;        /* size of the source file */
} vf_lr3_appended;

/* Appends every video packet of src (a whole per-episode MP4) at the end
 * of the file. expected_frames > 0 is checked against the packet count
 * (VF_ECORRUPT naming the source otherwise). Returns 0,
 * VF_LR3_INCOMPATIBLE, or a negative code naming the source. */
int vf_lr3_join_append(vf_lr3_join *j, vf_source *src, int64_t expected_frames, vf_lr3_appended *res);

/* Bytes written to the file so far (media data; the index comes at close). */
int64_t vf_lr3_join_bytes(const vf_lr3_join *j);
/* Number of episodes appended. */
int vf_lr3_join_episodes(const vf_lr3_join *j);
/* Packets written so far. */
int64_t vf_lr3_join_packets(const vf_lr3_join *j);

/* Writes the index (faststart) and closes; frees j in every case. */
int vf_lr3_join_close(vf_lr3_join *j);
/* Closes and deletes a partly written file; frees j. */
void vf_lr3_join_abort(vf_lr3_join *j);

#endif
