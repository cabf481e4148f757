/*
 * cmd_plan.c: `vlafeed plan PATH`: how the loader's partition strategies
 * split a dataset into tasks, and how many MP4 opens each needs to read
 * every task once (the comparison of Ray's file-group partitioning blog:
 * per-episode reading opens every camera file once per episode; file
 * groups open each once per group). Built on the public API only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vlafeed/loader.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vlafeed plan PATH [--json] [--world-size N] [--workers N] [--episodes A,B,...]\n"
            "\n"
            "Shows how the streaming loader partitions the dataset at PATH into tasks, for\n"
            "each strategy:\n"
            "  sequential   one task per consumer: contiguous runs of episodes of about equal\n"
            "               frames (consumers = world size x workers per rank)\n"
            "  episode      one task per episode\n"
            "  file_group   consecutive episodes that share the same video file in every\n"
            "               camera form one task, so each MP4 is opened once per task (the\n"
            "               default of `stream` mode)\n"
            "and the MP4 opens needed to read every task once: the sum over tasks and\n"
            "cameras of the distinct files a task uses. Also the samples each rank gets per\n"
            "epoch: without drop_last every rank gets ceil(frames / world size), the last\n"
            "ranks repeating the first samples of the epoch (padded_samples); with drop_last\n"
            "floor(frames / world size).\n"
            "\n"
            "options:\n"
            "  --json           print the plan as one JSON document\n"
            "  --world-size N   number of ranks (default 1)\n"
            "  --workers N      consumers (engine workers or DataLoader workers) per rank\n"
            "                   (default 1)\n"
            "  --episodes LIST  only these episode indices (comma separated)\n"
            "  -h, --help       this help\n");
}


int vf_cmd_plan(int argc, char **argv)
{
    int json = 0;
    long long world_size = 1, workers = 1;
    int64_t *episodes = NULL;
    size_t num_episodes = 0;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (vf_cli_is(a, "--help", "-h")) {
            usage(stdout);
            free(episodes);
            return 0;
        } else if (vf_cli_is(a, "--json", NULL)) {
            json = 1;
        } else if (vf_cli_is(a, "--world-size", NULL)) {
            if (vf_cli_int("--world-size", v, 1, 1 << 20, &world_size) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--workers", NULL)) {
            if (vf_cli_int("--workers", v, 1, 1 << 16, &workers) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--episodes", NULL)) {
            free(episodes);
            episodes = NULL;
            if (vf_cli_episode_list("--episodes", v, &episodes, &num_episodes) < 0)
                goto usage_error;
            i++;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "vlafeed plan: unknown option '%s'\n", a);
            goto usage_error;
        } else if (path) {
            fprintf(stderr, "vlafeed plan: expected exactly one dataset PATH\n");
            goto usage_error;
        } else {
            path = a;
        }
    }
    if (!path) {
        fprintf(stderr, "vlafeed plan: expected a dataset PATH\n");
        goto usage_error;
    }

    vf_dataset_settings ds;
    vf_dataset_defaults(&ds);
    ds.episodes = episodes;
    ds.num_episodes = num_episodes;
    ds.check_files = 0; /* planning needs only the metadata */
    vf_dataset *d;
    int r = vf_dataset_open(&d, path, &ds);
    free(episodes);
    if (r < 0)
        return vf_cli_fail("plan");

    char *doc = NULL;
    if (json) {
        r = vf_plan_json(d, (int)world_size, (int)workers, VF_INFO_PRETTY, &doc);
        if (r == 0)
            printf("%s\n", doc);
        free(doc);
        vf_dataset_close(d);
        return r < 0 ? vf_cli_fail("plan") : 0;
    }

    const vf_partition order[] = {VF_PARTITION_SEQUENTIAL, VF_PARTITION_EPISODE, VF_PARTITION_FILE_GROUP};
    const char *names[] = {"sequential", "episode", "file_group"};
    vf_plan_summary sums[3];
    for (int i = 0; i < 3; i++) {
        if (vf_plan_summarize(d, order[i], (int)world_size, (int)workers, &sums[i]) < 0) {
            vf_dataset_close(d);
            return vf_cli_fail("plan");
        }
    }
    size_t ncam = vf_dataset_num_cameras(d);
    printf("dataset    %s\n", vf_dataset_root(d));
    printf("episodes   %zu   frames %lld   cameras %zu\n", sums[0].episodes, (long long)sums[0].frames, ncam);
    for (size_t i = 0; i < ncam; i++)
        printf("  %-40s %zu file%s\n", vf_dataset_camera(d, i)->key, vf_dataset_num_video_files(d, i),
               vf_dataset_num_video_files(d, i) == 1 ? "" : "s");
    long long frames = sums[0].frames, consumers = world_size * workers;
    long long per_rank = (frames + world_size - 1) / world_size;
    printf("consumers  %lld (world size %lld x %lld workers)   samples per rank %lld", consumers, world_size, workers,
           per_rank);
    if (per_rank * world_size != frames)
        printf(" (%lld padded; %lld with drop_last)", per_rank * world_size - frames, frames / world_size);
    printf("\n\n%-12s %10s %12s %14s\n", "strategy", "tasks", "video opens", "frames/task");
    for (int i = 0; i < 3; i++)
        printf("%-12s %10zu %12zu %14.1f\n", names[i], sums[i].tasks, sums[i].video_opens,
               sums[i].tasks ? (double)sums[i].frames / (double)sums[i].tasks : 0.0);
    if (sums[2].video_opens > 0 && ncam > 0)
        printf("\nfile-group partitioning needs %.1fx fewer MP4 opens than reading episode by episode.\n",
               (double)sums[1].video_opens / (double)sums[2].video_opens);
    vf_dataset_close(d);
    return 0;

usage_error:
    free(episodes);
    usage(stderr);
    return 2;
}
