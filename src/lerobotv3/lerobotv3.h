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

/* ---- re-encoding (implemented in src/video/encode.c, the video layer's
 * encoder side; declared here because this converter is its only user) ---- */

#include "video/video.h"

/* Figures of one re-encode, summed over files by the caller. Quality is
 * measured on the 8-bit YUV planes of every frame: the encoder's output is
 * decoded again and compared with the decoded source frame. */
typedef struct vf_video_transcode_report {
    int64_t frames;
    int64_t bytes_read, bytes_written;
    int measured;              /* 1: every frame compared (8-bit YUV sources) */
    double sum_sq_err;         /* over every sample of every plane */
    double sum_abs_err;
    int64_t samples;
    int max_abs_diff;          /* largest |source - output| of any sample, 0..255 */
    double min_frame_psnr;     /* dB, the worst frame (INFINITY when identical) */
} vf_video_transcode_report;

/* Name of the FFmpeg encoder used for codec (libsvtav1, libx264, libx265),
 * or NULL. */
const char *vf_video_encoder_name(vf_video_codec codec);

/* 0 when the encoder for codec is in the linked FFmpeg; VF_EUNSUPPORTED
 * naming the encoder and the codec otherwise. */
int vf_video_encoder_check(vf_video_codec codec);

/* Called after each frame is handed to the encoder (frames_done from 1); a
 * negative return stops the re-encode with that code. */
typedef int (*vf_video_transcode_frame_fn)(void *ctx, int64_t frames_done);

/* Decodes every frame of the first video stream of src and encodes it with
 * settings (codec, gop, crf, preset, threads, b_frames; size, pixel format
 * and frame rate come from the source: settings->fps is the nominal rate
 * used for rate control and frame durations) into a new MP4 at path,
 * written under a temporary name and renamed. Each frame keeps its
 * presentation timestamp: the output track has the source stream's time
 * base, so a frame at t seconds in the source is at t in the output and an
 * episode's from/to timestamps stay valid. yuv420p sources stay yuv420p (no
 * colour conversion); gray12le (depth) needs HEVC and is encoded
 * losslessly; any other format is converted to yuv420p. expected_frames > 0
 * is checked against the frames decoded (VF_ECORRUPT naming the source).
 * The caller keeps src. rep is filled (zeroed first). on_frame may be NULL. */
int vf_video_transcode(vf_source *src, const char *path, const vf_video_encode_settings *settings,
                       int64_t expected_frames, vf_video_transcode_frame_fn on_frame, void *ctx,
                       vf_video_transcode_report *rep);

/* PSNR in dB of a summed report (INFINITY when identical, NAN if nothing
 * was measured). */
double vf_video_transcode_psnr(const vf_video_transcode_report *rep);

/* ---- conversion with re-encoding (convert.c) ------------------------------ */

#include "vlafeed/convert_v3.h"

/* How the videos are re-encoded (`vlafeed convert --codec`). */
typedef struct vf_lr3_reencode {
    vf_video_codec codec;      /* AV1 (libsvtav1), H264 (libx264), HEVC (libx265) */
    int crf;                   /* < 0: the codec's default (vf_lr3_reencode_resolve) */
    const char *preset;        /* NULL: the codec's default; av1: a number -2..13, x264/x265: a preset name */
    int gop;                   /* keyframe interval in frames; <= 0: the source's (its longest keyframe
                                * distance in the camera's first file, at most 2 * fps) */
} vf_lr3_reencode;

/* What the re-encode did, over every camera. */
typedef struct vf_lr3_reencode_report {
    int64_t files;             /* MP4 files encoded (v2.x: one per episode and camera) */
    int64_t frames;
    int64_t bytes_before, bytes_after; /* source and output video bytes */
    int crf;                   /* the values in effect */
    char preset[32];
    int gop;                   /* largest used (per camera it can differ when taken from the source) */
    double encode_seconds;     /* summed over the camera jobs (they run in parallel) */
    vf_video_transcode_report quality; /* summed over every file */
} vf_lr3_reencode_report;

/* Fills the defaults of re in place (crf, preset) and checks the values:
 * crf 0..51 for h264/hevc, 0..63 for av1; preset names. VF_EINVAL with a
 * message naming the option otherwise. */
int vf_lr3_reencode_resolve(vf_lr3_reencode *re);

/* vf_convert_v3 with the videos re-encoded (re non-NULL): a v2.x source is
 * converted as vf_convert_v3 does, each episode's video re-encoded before it
 * is joined; a v3.0 source (a local folder) is copied file for file with
 * every video file re-encoded in place of the original, frames at the same
 * timestamps, so meta/episodes stays valid and is copied unchanged;
 * info.json's video.codec and video.pix_fmt (and video.g / video.crf /
 * video.preset where present) describe the new streams. The encoder is
 * checked before anything is read. rrep may be NULL. */
int vf_lr3_convert(const char *src, const char *out, const vf_convert_v3_settings *settings,
                   const vf_lr3_reencode *re, vf_convert_v3_report *report, vf_lr3_reencode_report *rrep);

#endif
