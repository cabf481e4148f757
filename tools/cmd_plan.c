/*
 * cmd_plan.c: `vlafeed plan PATH`: how the loader's partition strategies
 * split a dataset into tasks, and how many MP4 opens each needs to read
 * every task once (the comparison of Ray's file-group partitioning blog:
 * per-episode reading opens every camera file once per episode; file
 * groups open each once per group). Built on the public API only.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vlafeed/loader.h"

static int partition_from_name(const char *n)
{
    return !strcmp(n, "file_group") ? VF_PARTITION_FILE_GROUP
           : !strcmp(n, "episode")  ? VF_PARTITION_EPISODE
           : !strcmp(n, "sequential") ? VF_PARTITION_SEQUENTIAL
                                      : -1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vlafeed plan PATH [--json] [-w|--world-size N] [--workers N] [--episodes A,B,...]\n"
            "                    [--mode stream|pool|map] [--partition file_group|episode|sequential]\n"
            "                    [--batch-size B] [--seed S] [--epoch E] [--tasks] [--rank R --worker W]\n"
            "\n"
            "Shows how the loader splits the dataset at PATH into tasks and over consumers\n"
            "(consumers = world size x workers per rank), from the metadata alone (no data\n"
            "or video file is opened). For each partition strategy:\n"
            "  sequential   one task per consumer: contiguous runs of episodes of about equal\n"
            "               frames\n"
            "  episode      one task per episode\n"
            "  file_group   consecutive episodes stored in the same file of the primary\n"
            "               camera (the one whose files change most often); the other\n"
            "               cameras' files may roll over inside a task (the default of\n"
            "               `stream` mode)\n"
            "the tasks and the MP4 opens needed to read every task once (the sum over tasks\n"
            "and cameras of the distinct files a task uses). Then the MP4 opens one epoch\n"
            "really makes at this world size and worker count (the loaders'\n"
            "stats()[\"video_opens\"] over the epoch at any number of engine threads, which\n"
            "share one reader per file by default; not with share_video_readers=False),\n"
            "against the lower bound: the distinct files of each consumer's share.\n"
            "Stream mode reads its file groups in order;\n"
            "pool mode admits the episodes of its (random) share in file order; map mode\n"
            "walks every consumer's random order batch by batch (time in the frames).\n"
            "\n"
            "Samples per rank: without drop_last every rank gets ceil(frames / world size),\n"
            "the last ranks repeating the first samples of the epoch (padded); with\n"
            "drop_last every rank keeps whole batches of floor(frames / world size), so\n"
            "fewer than world size x (batch size + 1) samples are dropped per epoch.\n"
            "\n"
            "options:\n"
            "  --json           print the plan as one JSON document\n"
            "  -w, --world-size N   number of ranks (default 1)\n"
            "  --workers N      consumers (engine workers or DataLoader workers) per rank\n"
            "                   (default 1)\n"
            "  --episodes LIST  only these episode indices (comma separated)\n"
            "  --mode M         stream (default), pool or map, for the opens; stream or pool\n"
            "                   for the task lists\n"
            "  --partition P    stream mode's partition (default file_group)\n"
            "  --batch-size B   for the drop_last remainder (default 32)\n"
            "  --seed S, --epoch E   the epoch whose order is planned (default 0, 0)\n"
            "  --tasks          with --json: list the partition's tasks (id, episodes, rows,\n"
            "                   estimated bytes, video files per camera)\n"
            "  --rank R --worker W   with --json: list what that consumer reads this epoch\n"
            "  -h, --help       this help\n");
}

int vf_cmd_plan(int argc, char **argv)
{
    int json = 0, list_tasks = 0;
    long long world_size = 1, workers = 1, batch_size = 32, seed = 0, epoch = 0, rank = -1, worker = -1;
    const char *mode = "stream", *partition = "file_group";
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
        } else if (vf_cli_is(a, "--world-size", "-w")) {
            if (vf_cli_int("--world-size", v, 1, 1 << 20, &world_size) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--workers", NULL)) {
            if (vf_cli_int("--workers", v, 1, 1 << 16, &workers) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--batch-size", NULL)) {
            if (vf_cli_int("--batch-size", v, 1, 1 << 24, &batch_size) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--seed", NULL)) {
            if (vf_cli_int("--seed", v, 0, INT64_MAX, &seed) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--epoch", NULL)) {
            if (vf_cli_int("--epoch", v, 0, INT64_MAX, &epoch) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--rank", NULL)) {
            if (vf_cli_int("--rank", v, 0, (1 << 20) - 1, &rank) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--worker", NULL)) {
            if (vf_cli_int("--worker", v, 0, (1 << 16) - 1, &worker) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--tasks", NULL)) {
            list_tasks = 1;
        } else if (vf_cli_is(a, "--mode", NULL)) {
            if (!v || (strcmp(v, "stream") && strcmp(v, "pool") && strcmp(v, "map"))) {
                fprintf(stderr, "vlafeed plan: --mode takes stream, pool or map\n");
                goto usage_error;
            }
            mode = v;
            i++;
        } else if (vf_cli_is(a, "--partition", NULL)) {
            if (!v || partition_from_name(v) < 0) {
                fprintf(stderr, "vlafeed plan: --partition takes file_group, episode or sequential\n");
                goto usage_error;
            }
            partition = v;
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
    if ((rank >= 0) != (worker >= 0)) {
        fprintf(stderr, "vlafeed plan: --rank and --worker go together\n");
        goto usage_error;
    }
    if (rank >= world_size || worker >= workers) {
        fprintf(stderr, "vlafeed plan: --rank %lld --worker %lld is not in world size %lld x %lld workers\n", rank,
                worker, world_size, workers);
        goto usage_error;
    }
    if ((list_tasks || rank >= 0) && !json) {
        fprintf(stderr, "vlafeed plan: --tasks and --rank/--worker print JSON: add --json\n");
        goto usage_error;
    }
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = !strcmp(mode, "pool") ? VF_MODE_POOL : !strcmp(mode, "map") ? VF_MODE_MAP : VF_MODE_STREAM;
    ls.partition = (vf_partition)partition_from_name(partition);
    ls.world_size = (int)world_size;
    ls.num_consumers = (int)workers;
    ls.batch_size = (size_t)batch_size;
    ls.seed = (uint64_t)seed;

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
        r = vf_plan_report_json(d, &ls, epoch, list_tasks, (int)rank, (int)worker, VF_INFO_PRETTY, &doc);
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
        printf(" (%lld padded)", per_rank * world_size - frames);
    printf("\n\n%-12s %10s %12s %14s\n", "strategy", "tasks", "video opens", "frames/task");
    for (int i = 0; i < 3; i++)
        printf("%-12s %10zu %12zu %14.1f\n", names[i], sums[i].tasks, sums[i].video_opens,
               sums[i].tasks ? (double)sums[i].frames / (double)sums[i].tasks : 0.0);
    if (sums[2].video_opens > 0 && ncam > 0)
        printf("\nfile-group partitioning needs %.1fx fewer MP4 opens than reading episode by episode.\n",
               (double)sums[1].video_opens / (double)sums[2].video_opens);
    long long kept = frames / world_size / batch_size * batch_size;
    printf("drop_last with batch size %lld: %lld samples per rank, %lld dropped per epoch\n", batch_size, kept,
           frames - kept * world_size);
    vf_plan_opens o;
    if (ncam > 0 && vf_plan_count_opens(d, &ls, epoch, &o) == 0)
        printf("MP4 opens in epoch %lld (%s, %lld consumers, decoder cache of %zu each): %zu; reading each task on "
               "its own: %zu; distinct files: %zu; lower bound: %zu (%.2fx of it)\n",
               epoch, mode, consumers, o.cache_entries, o.consumer_opens, o.task_opens, o.distinct_files,
               o.lower_bound, o.lower_bound ? (double)o.consumer_opens / (double)o.lower_bound : 0.0);
    vf_dataset_close(d);
    return 0;

usage_error:
    free(episodes);
    usage(stderr);
    return 2;
}
