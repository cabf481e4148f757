/*
 * cmd_convert_v3.c: `vlafeed convert SRC OUT --to lerobot-v3`: a LeRobot
 * v2.1 dataset (folder or URL) -> a LeRobot v3.0 dataset, through
 * vf_convert_v3() (include/vlafeed/convert_v3.h); with --codec, the
 * videos re-encoded (v2.x or v3.0 source) through vf_lr3_convert()
 * (src/lerobotv3/lerobotv3.h, the converter's internal interface, where the
 * re-encode settings live for now). Progress on stderr, a summary (or
 * --json) on stdout.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "lerobotv3/lerobotv3.h"
#include "vlafeed/convert_v3.h"
#include "vlafeed/vlafeed.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vlafeed convert SRC OUT --to lerobot-v3 [--codec h264|hevc|av1] [options]\n"
            "\n"
            "Converts a LeRobot v2.1 dataset (a folder, or an http(s):// or s3:// URL) into a\n"
            "LeRobot v3.0 dataset at OUT: many episodes per data and video file, videos joined\n"
            "by stream copy (no re-encode) with exact from/to timestamps, meta/episodes,\n"
            "tasks.parquet, stats.json, info.json. With --codec the videos are re-encoded, and\n"
            "the source may also be a v3.0 dataset (see below). OUT is written as OUT.partial\n"
            "and renamed when complete.\n"
            "\n"
            "  --data-mb N        data Parquet file size limit in MB (default 100, LeRobot's)\n"
            "  --video-mb N       per-camera MP4 file size limit in MB (default 200, LeRobot's)\n"
            "  --chunks-size N    files per chunk-XXX folder (default 1000)\n"
            "  --episodes LIST    convert only these source episodes (e.g. 0-9,12); they are\n"
            "                     renumbered 0..N-1 (episode_index and index columns too)\n"
            "  --force            replace an existing OUT\n"
            "  --no-verify        skip the check of every written video against its frame index\n"
            "  --threads N        data and each camera converted as parallel jobs on up to N\n"
            "                     threads (default: the number of cores; 1: one after another);\n"
            "                     with --codec the encoders share them\n"
            "  --json             print the summary as JSON\n"
            "  --quiet            no progress bar\n"
            "\n"
            "Re-encoding the videos (for GPU decoding: NVIDIA's NVDEC on A100, H100 and H200\n"
            "has no AV1, LeRobot's default codec, so those GPUs decode only H.264/HEVC):\n"
            "  --codec C          h264 (libx264), hevc (libx265) or av1 (libsvtav1): every video\n"
            "                     decoded and encoded again, each frame kept at its timestamp.\n"
            "                     A v2.x source is converted and re-encoded in one run; a v3.0\n"
            "                     source (a local folder) is re-encoded only: data, metadata and\n"
            "                     episode spans copied unchanged, info.json's video.codec and\n"
            "                     video.pix_fmt updated, its file layout kept (--data-mb,\n"
            "                     --video-mb and --chunks-size do not apply; --episodes is\n"
            "                     refused). Every frame is decoded again and compared with\n"
            "                     the source (PSNR and max/mean abs difference in the\n"
            "                     summary). The encoder is checked before anything runs.\n"
            "                     Depth cameras (gray12le, lossless HEVC) are copied as they are.\n"
            "  --crf N            quality, lower is better and larger: default 18 for h264, 20 for\n"
            "                     hevc, 24 for av1; range 0-51 (h264, hevc) or 0-63 (av1)\n"
            "  --preset P         h264/hevc: ultrafast .. veryslow (default medium); av1: -2 .. 13\n"
            "                     (default 8; LeRobot records with 12)\n"
            "  --gop N            keyframe interval in frames (default: the source's longest, at\n"
            "                     most 2 * fps; LeRobot's 2 keeps random access cheap). h264/hevc\n"
            "                     are written without B-frames.\n"
            "OUT (and OUT.partial from a stopped run) is started over, never resumed; an\n"
            "existing OUT is refused unless --force.\n");
}

/* A path as a JSON string (escaped by jansson; bytes kept as they are). */
static void print_json_string(const char *s)
{
    json_t *j = json_string_nocheck(s);
    char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    fputs(t ? t : "null", stdout);
    free(t);
    json_decref(j);
}

/* "name": value, for a PSNR in dB ("inf" when the frames were identical). */
static void print_db(const char *name, double db)
{
    if (isfinite(db))
        printf("\"%s\": %.4f, ", name, db);
    else
        printf("\"%s\": \"inf\", ", name);
}

int vf_cmd_convert_v3(int argc, char **argv)
{
    vf_convert_v3_settings s;
    vf_convert_v3_defaults(&s);
    const char *positional[2] = {NULL, NULL};
    int npos = 0, json = 0, quiet = 0;
    int64_t *episodes = NULL;
    size_t num_episodes = 0;
    vf_lr3_reencode re = {VF_VIDEO_CODEC_UNKNOWN, -1, NULL, 0};
    int reencode = 0;
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        double x;
        if (vf_cli_is(a, "--help", "-h")) {
            usage(stdout);
            rc = 0;
            goto done;
        } else if (!strcmp(a, "--to")) {
            i++;
        } else if (!strncmp(a, "--to=", 5)) {
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "--force")) {
            s.force = 1;
        } else if (!strcmp(a, "--no-verify")) {
            s.verify = 0;
        } else if (!strcmp(a, "--data-mb") || !strcmp(a, "--video-mb")) {
            if (!v || vf_cli_double(a, v, 1e-6, 1e9, &x) < 0)
                goto usage_error;
            if (!strcmp(a, "--data-mb"))
                s.data_files_size_in_mb = x;
            else
                s.video_files_size_in_mb = x;
            i++;
        } else if (!strcmp(a, "--threads")) {
            if (!v || vf_cli_int(a, v, 1, 1024, &n) < 0)
                goto usage_error;
            s.threads = (int)n;
            i++;
        } else if (!strcmp(a, "--chunks-size")) {
            if (!v || vf_cli_int(a, v, 1, 1000000, &n) < 0)
                goto usage_error;
            s.chunks_size = (int)n;
            i++;
        } else if (!strcmp(a, "--codec")) {
            if (!v) {
                fprintf(stderr, "vlafeed convert: --codec needs a value (h264, hevc or av1)\n");
                goto usage_error;
            }
            if (!strcmp(v, "h264")) {
                re.codec = VF_VIDEO_CODEC_H264;
            } else if (!strcmp(v, "hevc") || !strcmp(v, "h265")) {
                re.codec = VF_VIDEO_CODEC_HEVC;
            } else if (!strcmp(v, "av1")) {
                re.codec = VF_VIDEO_CODEC_AV1;
            } else {
                fprintf(stderr, "vlafeed convert: --codec %s: unknown codec; expected h264, hevc or av1\n", v);
                goto usage_error;
            }
            reencode = 1;
            i++;
        } else if (!strcmp(a, "--crf") || !strcmp(a, "--gop")) {
            if (!v || vf_cli_int(a, v, !strcmp(a, "--gop") ? 1 : 0, !strcmp(a, "--gop") ? 100000 : 63, &n) < 0)
                goto usage_error;
            if (!strcmp(a, "--crf"))
                re.crf = (int)n;
            else
                re.gop = (int)n;
            i++;
        } else if (!strcmp(a, "--preset")) {
            if (!v) {
                fprintf(stderr, "vlafeed convert: --preset needs a value\n");
                goto usage_error;
            }
            re.preset = v;
            i++;
        } else if (!strcmp(a, "--episodes")) {
            free(episodes);
            episodes = NULL;
            if (!v || vf_cli_episode_list(a, v, &episodes, &num_episodes) < 0)
                goto usage_error;
            i++;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "vlafeed convert: unknown option %s\n", a);
            goto usage_error;
        } else if (npos < 2) {
            positional[npos++] = a;
        } else {
            fprintf(stderr, "vlafeed convert: unexpected argument %s\n", a);
            goto usage_error;
        }
    }
    if (npos != 2) {
        fprintf(stderr, "vlafeed convert: SRC and OUT are required\n");
        goto usage_error;
    }
    if (!reencode && (re.crf >= 0 || re.preset || re.gop > 0)) {
        fprintf(stderr, "vlafeed convert: --crf, --preset and --gop go with --codec\n");
        goto usage_error;
    }
    s.episodes = episodes;
    s.num_episodes = num_episodes;
    vf_cli_progress bar;
    vf_cli_progress_start(&bar, "convert", quiet);
    s.progress = vf_cli_progress_cb;
    s.progress_ctx = &bar;
    vf_convert_v3_report rep;
    vf_lr3_reencode_report rr;
    int r = vf_lr3_convert(positional[0], positional[1], &s, reencode ? &re : NULL, &rep, &rr);
    vf_cli_progress_finish(&bar);
    if (r < 0) {
        rc = vf_cli_fail("convert");
        goto done;
    }
    double mb_in = (double)rep.bytes_read / (1024.0 * 1024.0);
    double secs = rep.seconds > 0 ? rep.seconds : 1e-9;
    double psnr = vf_video_transcode_psnr(&rr.quality);
    double mean_abs = rr.quality.samples > 0 ? rr.quality.sum_abs_err / (double)rr.quality.samples : NAN;
    if (json && reencode) {
        static const char *const names[] = {"?", "av1", "h264", "hevc", "?"};
        printf("{\"source\": ");
        print_json_string(positional[0]);
        printf(", \"output\": ");
        print_json_string(positional[1]);
        printf(", \"format_version\": \"v3.0\", \"codec\": \"%s\", \"encoder\": \"%s\", \"crf\": %d, "
               "\"preset\": \"%s\", \"gop\": %d, \"episodes\": %lld, \"frames\": %lld, \"cameras\": %lld, "
               "\"data_files\": %lld, \"video_files\": %lld, \"encoded_files\": %lld, \"encoded_frames\": %lld, "
               "\"video_bytes_before\": %lld, \"video_bytes_after\": %lld, \"bytes_read\": %lld, "
               "\"bytes_written\": %lld, \"seconds\": %.6f, \"encode_seconds\": %.6f, \"frames_per_s\": %.3f, "
               "\"quality_measured\": %s, ",
               names[re.codec], vf_video_encoder_name(re.codec), rr.crf, rr.preset, rr.gop, (long long)rep.episodes,
               (long long)rep.frames, (long long)rep.cameras, (long long)rep.data_files, (long long)rep.video_files,
               (long long)rr.files, (long long)rr.frames, (long long)rr.bytes_before, (long long)rr.bytes_after,
               (long long)rep.bytes_read, (long long)rep.bytes_written, rep.seconds, rr.encode_seconds,
               (double)rr.frames / secs, rr.quality.measured ? "true" : "false");
        if (rr.quality.measured) {
            /* identical frames have an infinite PSNR, which JSON cannot hold: "inf" as a string */
            print_db("psnr_db", psnr);
            print_db("min_frame_psnr_db", rr.quality.min_frame_psnr);
            printf("\"max_abs_diff\": %d, \"mean_abs_diff\": %.6f, ", rr.quality.max_abs_diff, mean_abs);
        } else {
            printf("\"psnr_db\": null, \"min_frame_psnr_db\": null, \"max_abs_diff\": null, \"mean_abs_diff\": null, ");
        }
        printf("\"max_abs_drift_ms\": %.6f, \"verified\": %s}\n", rep.max_abs_drift_ms, s.verify ? "true" : "false");
    } else if (json) {
        printf("{\"source\": ");
        print_json_string(positional[0]);
        printf(", \"output\": ");
        print_json_string(positional[1]);
        printf(", \"format_version\": \"v3.0\", \"episodes\": %lld, "
               "\"frames\": %lld, \"cameras\": %lld, \"data_files\": %lld, \"video_files\": %lld, "
               "\"video_packets\": %lld, \"bytes_read\": %lld, \"bytes_written\": %lld, \"seconds\": %.6f, "
               "\"episodes_per_s\": %.3f, \"mb_per_s\": %.3f, \"max_abs_drift_ms\": %.6f, \"verified\": %s}\n",
               (long long)rep.episodes, (long long)rep.frames, (long long)rep.cameras,
               (long long)rep.data_files, (long long)rep.video_files, (long long)rep.video_packets,
               (long long)rep.bytes_read, (long long)rep.bytes_written, rep.seconds,
               (double)rep.episodes / secs, mb_in / secs, rep.max_abs_drift_ms, s.verify ? "true" : "false");
    } else {
        printf("converted %s -> %s (LeRobot v3.0)\n"
               "  %lld episodes, %lld frames, %lld camera(s)\n"
               "  %lld data file(s), %lld video file(s)%s\n"
               "  %.1f MB read, %.1f MB written in %.2f s: %.1f episodes/s, %.1f MB/s\n",
               positional[0], positional[1], (long long)rep.episodes, (long long)rep.frames, (long long)rep.cameras,
               (long long)rep.data_files, (long long)rep.video_files,
               reencode ? "" : " (packets copied, not re-encoded)", mb_in,
               (double)rep.bytes_written / (1024.0 * 1024.0), rep.seconds, (double)rep.episodes / secs,
               mb_in / secs);
        if (reencode) {
            printf("  videos re-encoded with %s (crf %d, preset %s, gop %d): %lld file(s), %lld frames in %.2f s "
                   "of encoding (%.1f frames/s)\n"
                   "  video bytes %.2f MB -> %.2f MB (x%.2f)\n",
                   vf_video_encoder_name(re.codec), rr.crf, rr.preset, rr.gop, (long long)rr.files,
                   (long long)rr.frames, rr.encode_seconds, rr.encode_seconds > 0 ? rr.frames / rr.encode_seconds : 0.0,
                   rr.bytes_before / (1024.0 * 1024.0), rr.bytes_after / (1024.0 * 1024.0),
                   rr.bytes_before > 0 ? (double)rr.bytes_after / (double)rr.bytes_before : 0.0);
            if (rr.quality.measured)
                printf("  quality against the source frames (YUV): PSNR %.2f dB (worst frame %.2f dB), "
                       "mean abs diff %.3f, max abs diff %d\n",
                       psnr, rr.quality.min_frame_psnr, mean_abs, rr.quality.max_abs_diff);
        }
        if (s.verify)
            printf("  every video checked against its frame index: episodes exactly at their timestamps\n");
    }
    rc = 0;
    goto done;
usage_error:
    usage(stderr);
    rc = 2;
done:
    free(episodes);
    return rc;
}
