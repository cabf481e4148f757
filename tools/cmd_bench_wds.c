/*
 * cmd_bench_wds.c: `vlafeed bench --source wds MANIFEST`: throughput of the
 * shard loader (include/vlafeed/wds.h) over the shards a manifest lists: a
 * consumer takes batches for whole epochs (or --num-batches) and frees
 * them; wall and CPU seconds (getrusage, all threads) from open to the last
 * batch, samples/s, member MB/s, and both per CPU second, so the figure
 * stays comparable on a busy machine. bench/wds_bench.py runs it next to
 * the webdataset library on the same shards.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "vlafeed/wds.h"

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: vlafeed bench --source wds MANIFEST [--batch-size 64] [--epochs 1] [--num-batches N]\n"
               "                     [--threads N] [--shuffle-buffer 1000] [--format uint8|float32]\n"
               "                     [--resize WxH] [--fields a.jpg,b.npz] [--seed S] [--json]\n"
               "\n"
               "Reads the shards of MANIFEST (local, http(s)://, s3://) through the shard loader and\n"
               "reports samples/s, MB/s of member bytes, and both per CPU second (all threads).\n");
}

int vf_cmd_bench_wds(int argc, char **argv)
{
    vf_wds_loader_settings s;
    vf_wds_loader_defaults(&s);
    s.batch_size = 64;
    const char *manifest = NULL;
    long long epochs = 1, num_batches = 0, v;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (vf_cli_is(a, "--help", "-h")) {
            usage(stdout);
            return 0;
        } else if (vf_cli_is(a, "--source", NULL) && val) {
            i++;
        } else if (vf_cli_is(a, "--batch-size", NULL)) {
            if (vf_cli_int(a, val, 1, 1 << 20, &v) < 0)
                return 2;
            s.batch_size = (size_t)v;
            i++;
        } else if (vf_cli_is(a, "--epochs", NULL)) {
            if (vf_cli_int(a, val, 1, 1000000, &epochs) < 0)
                return 2;
            i++;
        } else if (vf_cli_is(a, "--num-batches", NULL)) {
            if (vf_cli_int(a, val, 1, (long long)1 << 40, &num_batches) < 0)
                return 2;
            i++;
        } else if (vf_cli_is(a, "--threads", NULL)) {
            if (vf_cli_int(a, val, 1, 1024, &v) < 0)
                return 2;
            s.threads = (int)v;
            i++;
        } else if (vf_cli_is(a, "--shuffle-buffer", NULL)) {
            if (vf_cli_int(a, val, 0, (long long)1 << 30, &v) < 0)
                return 2;
            s.shuffle_buffer = (size_t)v;
            i++;
        } else if (vf_cli_is(a, "--seed", NULL)) {
            if (vf_cli_int(a, val, 0, (long long)1 << 62, &v) < 0)
                return 2;
            s.seed = (uint64_t)v;
            i++;
        } else if (vf_cli_is(a, "--format", NULL) && val) {
            s.image_float_chw = !strcmp(val, "float32");
            i++;
        } else if (vf_cli_is(a, "--resize", NULL)) {
            if (vf_cli_size(a, val, &s.resize_width, &s.resize_height) < 0)
                return 2;
            i++;
        } else if (vf_cli_is(a, "--fields", NULL) && val) {
            s.fields = val;
            i++;
        } else if (vf_cli_is(a, "--json", NULL)) {
            json = 1;
        } else if (a[0] != '-' && !manifest) {
            manifest = a;
        } else {
            fprintf(stderr, "vlafeed bench --source wds: unknown or incomplete option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!manifest) {
        usage(stderr);
        return 2;
    }
    double cpu0 = cpu_seconds(), t0 = wall_seconds();
    vf_wds_loader *l = NULL;
    if (vf_wds_loader_open(&l, manifest, &s) < 0)
        return vf_cli_fail("bench");
    long long batches = 0;
    int rc = 0;
    for (long long e = 0; e < epochs && rc == 0; e++) {
        if (e > 0 && vf_wds_loader_set_epoch(l, e) < 0)
            rc = -1;
        vf_wds_batch *b = NULL;
        while (rc == 0 && (!num_batches || batches < num_batches)) {
            int r = vf_wds_loader_next(l, &b);
            if (r == VF_EOF)
                break;
            if (r < 0) {
                rc = r;
                break;
            }
            vf_wds_batch_free(b);
            batches++;
        }
    }
    double wall = wall_seconds() - t0, cpu = cpu_seconds() - cpu0;
    vf_wds_stats st;
    vf_wds_loader_stats(l, &st);
    if (rc < 0) {
        vf_cli_fail("bench");
        vf_wds_loader_close(l);
        return 1;
    }
    vf_wds_loader_close(l);
    double mb = st.bytes_read / 1e6;
    if (json)
        printf("{\"source\": \"wds\", \"manifest\": \"%s\", \"samples\": %llu, \"batches\": %lld, \"images\": %llu, "
               "\"mb\": %.3f, \"wall_s\": %.4f, \"cpu_s\": %.4f, \"samples_per_s\": %.2f, \"mb_per_s\": %.3f, "
               "\"samples_per_cpu_s\": %.2f, \"mb_per_cpu_s\": %.3f, \"skipped\": %llu}\n",
               manifest, (unsigned long long)st.samples, batches, (unsigned long long)st.images_decoded, mb, wall,
               cpu, st.samples / wall, mb / wall, st.samples / cpu, mb / cpu,
               (unsigned long long)st.skipped_samples);
    else
        printf("wds %s: %llu samples in %lld batches (%llu images, %.1f MB of members)\n"
               "  wall %.2f s, cpu %.2f s: %.1f samples/s, %.2f MB/s; per CPU second: %.1f samples, %.2f MB\n",
               manifest, (unsigned long long)st.samples, batches, (unsigned long long)st.images_decoded, mb, wall,
               cpu, st.samples / wall, mb / wall, st.samples / cpu, mb / cpu);
    return 0;
}
