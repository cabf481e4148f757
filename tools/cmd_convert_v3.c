/*
 * cmd_convert_v3.c: `vlafeed convert SRC OUT --to lerobot-v3`: a LeRobot
 * v2.1 dataset (folder or URL) -> a LeRobot v3.0 dataset, through
 * vf_convert_v3() (include/vlafeed/convert_v3.h). Progress on stderr, a
 * summary (or --json) on stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "vlafeed/convert_v3.h"
#include "vlafeed/vlafeed.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vlafeed convert SRC OUT --to lerobot-v3 [options]\n"
            "\n"
            "Converts a LeRobot v2.1 dataset (a folder, or an http(s):// or s3:// URL) into a\n"
            "LeRobot v3.0 dataset at OUT: many episodes per data and video file, videos joined\n"
            "by stream copy (no re-encode) with exact from/to timestamps, meta/episodes,\n"
            "tasks.parquet, stats.json, info.json. OUT is written as OUT.partial and renamed\n"
            "when complete.\n"
            "\n"
            "  --data-mb N        data Parquet file size limit in MB (default 100, LeRobot's)\n"
            "  --video-mb N       per-camera MP4 file size limit in MB (default 200, LeRobot's)\n"
            "  --chunks-size N    files per chunk-XXX folder (default 1000)\n"
            "  --episodes LIST    convert only these source episodes (e.g. 0-9,12); they are\n"
            "                     renumbered 0..N-1 (episode_index and index columns too)\n"
            "  --force            replace an existing OUT\n"
            "  --no-verify        skip the check of every written video against its frame index\n"
            "  --threads N        data and each camera converted as parallel jobs on up to N\n"
            "                     threads (default: the number of cores; 1: one after another)\n"
            "  --json             print the summary as JSON\n"
            "  --quiet            no progress bar\n");
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

int vf_cmd_convert_v3(int argc, char **argv)
{
    vf_convert_v3_settings s;
    vf_convert_v3_defaults(&s);
    const char *positional[2] = {NULL, NULL};
    int npos = 0, json = 0, quiet = 0;
    int64_t *episodes = NULL;
    size_t num_episodes = 0;
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
    s.episodes = episodes;
    s.num_episodes = num_episodes;
    vf_cli_progress bar;
    vf_cli_progress_start(&bar, "convert", quiet);
    s.progress = vf_cli_progress_cb;
    s.progress_ctx = &bar;
    vf_convert_v3_report rep;
    int r = vf_convert_v3(positional[0], positional[1], &s, &rep);
    vf_cli_progress_finish(&bar);
    if (r < 0) {
        rc = vf_cli_fail("convert");
        goto done;
    }
    double mb_in = (double)rep.bytes_read / (1024.0 * 1024.0);
    double secs = rep.seconds > 0 ? rep.seconds : 1e-9;
    if (json) {
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
               "  %lld data file(s), %lld video file(s) (%lld packets copied, not re-encoded)\n"
               "  %.1f MB read, %.1f MB written in %.2f s: %.1f episodes/s, %.1f MB/s\n",
               positional[0], positional[1], (long long)rep.episodes, (long long)rep.frames, (long long)rep.cameras,
               (long long)rep.data_files, (long long)rep.video_files, (long long)rep.video_packets, mb_in,
               (double)rep.bytes_written / (1024.0 * 1024.0), rep.seconds, (double)rep.episodes / secs,
               mb_in / secs);
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
