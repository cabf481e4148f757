/*
 * cmd_convert_wds.c: `vlafeed convert SRC OUT --to wds`: a LeRobot v3.0 or
 * v2.1 dataset (local or URL) into WebDataset shards in VLA Foundry's
 * robotics layout, through vf_wds_convert() (include/vlafeed/convert.h).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vlafeed/convert.h"
#include "vlafeed/vlafeed.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vlafeed convert SRC OUT --to wds [options]\n"
            "\n"
            "Converts the LeRobot v3.0 / v2.1 dataset SRC (a folder, or an http(s):// or s3:// URL) into\n"
            "WebDataset shards in VLA Foundry's robotics layout under OUT/shards/: shard_NNNNNN.tar,\n"
            "manifest.jsonl, stats.json, processing_metadata.json, preprocessing_config.yaml. One sample per\n"
            "(episode, frame): <key>.<cam>_t<off>.jpg per camera and image offset, <key>.lowdim.npz (every\n"
            "numeric feature over the window, edge-padded, with past_mask / future_mask), <key>.metadata.json,\n"
            "<key>.language_instructions.json. Samples are shuffled across shards by --seed; every video frame\n"
            "is decoded once and JPEG-encoded once.\n"
            "\n"
            "  --samples-per-shard N   samples per shard (default 100; the last shard is short)\n"
            "  --past P                lowdim steps before the anchor (default 1)\n"
            "  --future F              lowdim steps after the anchor (default 14)\n"
            "  --image-offsets LIST    frame offsets of the images, e.g. -1,0 (default -1,0)\n"
            "  --cameras LIST          camera keys or short names, e.g. top,wrist (default: every\n"
            "                          non-depth video camera)\n"
            "  --episodes LIST         episode indices, e.g. 0-9,12 (default: all)\n"
            "  --resize WxH            scale to cover WxH, then centre crop (default: source size)\n"
            "  --jpeg-quality Q        1..100 (default 95)\n"
            "  --seed S                shuffle seed (default 0)\n"
            "  --threads N             worker threads (default: the number of cores)\n"
            "  --json                  print the summary as one JSON line on stdout\n"
            "  --quiet                 no progress bar\n"
            "\n"
            "Memory is bounded by the threads, not the dataset: per thread one batch of 16 decoded\n"
            "frames and their JPEGs, or a slice of the numeric columns (65,536 rows, or one episode if\n"
            "longer), or one shard member; plus 256 open spill files. The spill\n"
            "(OUT/shards/.vlafeed-convert/) takes about the size of the output on disk until the shards\n"
            "are assembled, then it is removed.\n"
            "Re-running an interrupted conversion with the same options resumes it (finished work and\n"
            "verified shards are kept); different options are refused, naming the option.\n"
            "Exit status: 0 done, 1 failure, 2 usage error.\n");
}

static int parse_offsets(const char *value, vf_wds_convert_settings *s)
{
    s->num_image_offsets = 0;
    const char *p = value;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < -100000 || v > 100000 || s->num_image_offsets >= VF_WDS_MAX_OFFSETS) {
            fprintf(stderr, "vlafeed convert: --image-offsets '%s': expected integers like -1,0\n", value);
            return -1;
        }
        s->image_offsets[s->num_image_offsets++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (s->num_image_offsets == 0) {
        fprintf(stderr, "vlafeed convert: --image-offsets: at least one offset\n");
        return -1;
    }
    return 0;
}

/* Splits "a,b,c" into a newly allocated array of newly allocated strings. */
static int split_list(const char *value, char ***items, size_t *count)
{
    *items = NULL;
    *count = 0;
    char *copy = strdup(value), *save = NULL;
    if (!copy)
        return -1;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char **grown = realloc(*items, (*count + 1) * sizeof **items);
        if (!grown)
            break;
        *items = grown;
        (*items)[(*count)++] = strdup(t);
    }
    free(copy);
    return *count ? 0 : -1;
}

int vf_cmd_convert_wds(int argc, char **argv)
{
    vf_wds_convert_settings s;
    vf_wds_convert_defaults(&s);
    const char *positional[2] = {NULL, NULL};
    int npos = 0, json = 0, quiet = 0;
    char **cameras = NULL;
    size_t num_cameras = 0;
    int64_t *episodes = NULL;
    size_t num_episodes = 0;
    int rc = 0;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        if (vf_cli_is(a, "--help", "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--to")) {
            i++;
        } else if (!strncmp(a, "--to=", 5)) {
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (a[0] == '-' && a[1] == '-' && !v) {
            fprintf(stderr, "vlafeed convert: %s needs a value\n", a);
            rc = 2;
        } else if (!strcmp(a, "--samples-per-shard")) {
            rc = vf_cli_int(a, v, 1, 1000000, &n) < 0 ? 2 : 0;
            s.samples_per_shard = n;
            i++;
        } else if (!strcmp(a, "--past")) {
            rc = vf_cli_int(a, v, 0, 5000, &n) < 0 ? 2 : 0;
            s.past = (int)n;
            i++;
        } else if (!strcmp(a, "--future")) {
            rc = vf_cli_int(a, v, 0, 5000, &n) < 0 ? 2 : 0;
            s.future = (int)n;
            i++;
        } else if (!strcmp(a, "--image-offsets")) {
            rc = parse_offsets(v, &s) < 0 ? 2 : 0;
            i++;
        } else if (!strcmp(a, "--cameras")) {
            if (split_list(v, &cameras, &num_cameras) < 0) {
                fprintf(stderr, "vlafeed convert: --cameras '%s': expected names like top,wrist\n", v);
                rc = 2;
            }
            i++;
        } else if (!strcmp(a, "--episodes")) {
            rc = vf_cli_episode_list(a, v, &episodes, &num_episodes) < 0 ? 2 : 0;
            i++;
        } else if (!strcmp(a, "--resize")) {
            rc = vf_cli_size(a, v, &s.resize_width, &s.resize_height) < 0 ? 2 : 0;
            i++;
        } else if (!strcmp(a, "--jpeg-quality")) {
            rc = vf_cli_int(a, v, 1, 100, &n) < 0 ? 2 : 0;
            s.jpeg_quality = (int)n;
            i++;
        } else if (!strcmp(a, "--seed")) {
            rc = vf_cli_int(a, v, 0, INT64_MAX, &n) < 0 ? 2 : 0;
            s.seed = (uint64_t)n;
            i++;
        } else if (!strcmp(a, "--threads")) {
            rc = vf_cli_int(a, v, 1, 1024, &n) < 0 ? 2 : 0;
            s.threads = (int)n;
            i++;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "vlafeed convert: unknown option %s (see vlafeed convert --to wds --help)\n", a);
            rc = 2;
        } else if (npos < 2) {
            positional[npos++] = a;
        } else {
            fprintf(stderr, "vlafeed convert: unexpected argument %s\n", a);
            rc = 2;
        }
    }
    if (rc == 0 && npos != 2) {
        usage(stderr);
        fprintf(stderr, "vlafeed convert: SRC and OUT are required\n");
        rc = 2;
    }
    if (rc == 0) {
        s.cameras = (const char *const *)cameras;
        s.num_cameras = num_cameras;
        s.episodes = episodes;
        s.num_episodes = num_episodes;
        vf_cli_progress bar;
        vf_cli_progress_start(&bar, "convert", quiet || json);
        s.progress = vf_cli_progress_cb;
        s.progress_ctx = &bar;
        char *summary = NULL;
        int r = vf_wds_convert(positional[0], positional[1], &s, &summary);
        vf_cli_progress_finish(&bar);
        if (r < 0) {
            rc = vf_cli_fail("convert");
        } else if (json) {
            printf("%s\n", summary);
        } else {
            printf("vlafeed convert: %s\n", summary);
        }
        free(summary);
    }
    for (size_t i = 0; i < num_cameras; i++)
        free(cameras[i]);
    free(cameras);
    free(episodes);
    return rc;
}
