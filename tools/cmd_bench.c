/*
 * cmd_bench.c: `vlafeed bench PATH`: data-loading throughput of the loader,
 * measured the way a training step sees it (a consumer thread pulls batches
 * and releases them), next to the decode limit of the same video files.
 *
 * What is measured (see usage() and bench/README.md):
 *  - single: one frame of every camera per sample (no windows);
 *    sarm: 8 frames of every camera per sample, 1 s apart, looking BACK:
 *    delta_timestamps {camera: [-7, -6, ..., 0] s} (steps before the
 *    episode start are clamped to its first frame and marked padded, as
 *    LeRobot does).
 *  - the loader in stream, map or pool mode, the consumer taking batches
 *    for --num-batches (moving on to the next epoch if one runs out);
 *    wall clock and CPU seconds (getrusage) from vf_loader_open to the last
 *    batch, so frames per CPU second stays comparable on a busy machine.
 *  - --with-limit: the raw decode + RGB conversion of the SAME video files
 *    with the SAME number of threads, straight on the video layer (no
 *    loader): sequential decode of whole files for stream mode, uniformly
 *    random single frames with every reader kept open (decoder reuse) for
 *    map and pool mode; frames are written in the loader's output layout.
 *    It runs after the loader (so peak RSS is the loader's) for the same
 *    number of frames (capped by --limit-seconds).
 *  - the machine's load before the run (/proc/loadavg and a short spin test
 *    on as many threads as the loader uses), with a warning when busy.
 *
 * GPU copy: this C command is built without CUDA, so it does not copy
 * batches to a device (it says so in its output); bench/torchrun_bench.py
 * copies with torch.cuda when a GPU is present.
 *
 * Built on the public API (include/vlafeed/) plus the video layer's header
 * for the decode limit, which must bypass the loader.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "video/video.h"
#include "vlafeed/loader.h"

#define SARM_STEPS 8

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vlafeed bench PATH --mode single|sarm [--loader stream|pool|map] [--batch-size 64]\n"
            "                          [--num-batches 200] [--threads N] [--out-dir DIR] [--with-limit] [--json]\n"
            "\n"
            "Measures data loading only: a consumer pulls --num-batches batches from the loader\n"
            "over the dataset at PATH and releases them. Reports frames/s per node, samples/s,\n"
            "first-batch latency, p50/p95/p99 sample latency, wall and CPU seconds, frames per\n"
            "CPU second, decoded frames per emitted frame, decoder cache counters and peak RSS.\n"
            "\n"
            "modes:\n"
            "  single   one frame of every camera per sample\n"
            "  sarm     8 frames of every camera per sample, 1 s apart, ending at the sample:\n"
            "           delta_timestamps {camera: [-7, -6, ..., 0] s}\n"
            "\n"
            "options:\n"
            "  --loader L          stream (default), map or pool\n"
            "  --batch-size N      samples per batch (default 64)\n"
            "  --num-batches N     batches to take (default 200; the next epoch starts if one ends)\n"
            "  --threads N         engine threads (default: the number of cores)\n"
            "  --prefetch N        batches queued ahead of the consumer (default 4)\n"
            "  --format F          float32 (default, LeRobot's [C,H,W] in [0,1]) or uint8\n"
            "  --cache-entries N   decoder cache entries (default: the loader's)\n"
            "  --pool-size N       pool mode: episodes in the pool (default: the loader's)\n"
            "  --seed S            shuffle seed (default 0)\n"
            "  --episodes LIST     only these episode indices\n"
            "  --with-limit        also measure the raw decode + RGB limit of the same files with\n"
            "                      the same threads (sequential for stream, random single frames\n"
            "                      with decoders reused otherwise) and print loader / limit ratios\n"
            "  --limit-seconds S   cap on the limit measurement (default 60)\n"
            "  --repeat N          run the loader and the limit N times each, alternating which goes first\n"
            "                      (loader, limit / limit, loader / ...), and report the median of the N\n"
            "                      loader / limit ratios and their spread (min-max); needs --with-limit\n"
            "                      (default 1)\n"
            "  --out-dir DIR       write <name>.json and <name>.csv there (name from the settings,\n"
            "                      e.g. single-stream-b64-t2)\n"
            "  --name NAME         the file name instead\n"
            "  --json              print the JSON document on stdout instead of the summary\n"
            "  --quiet             no progress or warnings on stderr\n"
            "  -h, --help          this help\n"
            "\n"
            "GPU copy: this command is built without CUDA and does not copy batches to a device;\n"
            "bench/torchrun_bench.py does (torch.cuda) when a GPU is present.\n");
}

typedef struct bench_opts {
    const char *path;
    int sarm;                   /* 0 single, 1 sarm */
    vf_mode mode;
    const char *loader_name;
    long long batch_size, num_batches, threads, prefetch, seed, cache_entries, pool_size;
    int uint8;
    int with_limit;
    long long repeat;           /* loader / limit pairs (--repeat) */
    double limit_seconds;
    const char *out_dir, *name;
    int json, quiet;
    int64_t *episodes;
    size_t num_episodes;
} bench_opts;

/* ---- small helpers ------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct cpu_times {
    double user, sys;
} cpu_times;

static cpu_times cpu_now(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    cpu_times t = {(double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6,
                   (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6};
    return t;
}

static double peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* kilobytes on Linux */
}

static double current_rss_mb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

/* A JSON number, or null when not finite (jansson refuses NaN). */
static json_t *jnum(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : NAN;
}

static int cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

/* Quantile of a sorted array (nearest rank). */
static double quantile(const double *v, size_t n, double q)
{
    if (n == 0)
        return NAN;
    size_t i = (size_t)ceil(q * (double)n);
    return v[i ? i - 1 : 0];
}

/* ---- the machine ------------------------------------------------------------------ */

static void read_loadavg(double load[3])
{
    load[0] = load[1] = load[2] = NAN;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = load[1] = load[2] = NAN;
        fclose(f);
    }
}

static void read_cpu_model(char *out, size_t cap)
{
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            const char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ')
                    c++;
                snprintf(out, cap, "%s", c);
                out[strcspn(out, "\n")] = 0;
            }
            break;
        }
    }
    fclose(f);
}

static double mem_total_mb(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return NAN;
    char line[256];
    double kb = NAN;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %lf kB", &kb) == 1)
            break;
    fclose(f);
    return kb / 1024.0;
}

typedef struct spin_arg {
    double seconds;
    double cpu;
} spin_arg;

static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *spin_main(void *p)
{
    spin_arg *a = p;
    double t0 = now_s(), c0 = thread_cpu();
    volatile uint64_t x = 1;
    while (now_s() - t0 < a->seconds)
        for (int i = 0; i < 10000; i++)
            x = x * 6364136223846793005ull + 1442695040888963407ull;
    a->cpu = thread_cpu() - c0;
    return NULL;
}

/* Share of `threads` cores this process actually gets while spinning for
 * `seconds`: 1.0 on an idle machine, less when others compete. */
static double spin_share(int threads, double seconds)
{
    pthread_t tid[64];
    spin_arg args[64];
    int n = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    double t0 = now_s();
    int started = 0;
    for (int i = 0; i < n; i++) {
        args[i].seconds = seconds;
        args[i].cpu = 0;
        if (pthread_create(&tid[i], NULL, spin_main, &args[i]) != 0)
            break;
        started++;
    }
    double cpu = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
        cpu += args[i].cpu;
    }
    double wall = now_s() - t0;
    return started ? cpu / (wall * started) : NAN;
}

/* ---- the loader run ---------------------------------------------------------------- */

typedef struct loader_result {
    size_t batches, samples, epochs;
    double frames, frames_per_sample;
    double wall, cpu_user, cpu_sys, first_batch, open_s;
    double rss_before_mb, rss_after_open_mb, peak_rss_mb;
    double wait_p50, wait_p95, wait_p99;
    size_t warmup_batches;      /* batches before the steady-state window (0: run too short) */
    double steady_frames, steady_wall, steady_cpu;
    size_t batch_bytes;
    int image_layout;           /* vf_video_layout the frames are written in */
    vf_loader_stats stats;
    size_t batches_per_epoch;
    int64_t samples_per_epoch;
} loader_result;

/* Frames (camera x step) in one sample of batch b: every column named
 * after a camera contributes its elements per sample / (3 * H * W). */
static double frames_in_sample(const vf_dataset *d, const vf_batch *b, size_t *bytes)
{
    double frames = 0;
    *bytes = 0;
    size_t n = vf_batch_size(b);
    for (size_t i = 0; i < vf_batch_num_columns(b); i++) {
        const vf_column *c = vf_batch_column(b, i);
        *bytes += c->nbytes;
        for (size_t k = 0; k < vf_dataset_num_cameras(d); k++) {
            const vf_camera *cam = vf_dataset_camera(d, k);
            if (strcmp(c->name, cam->key) != 0 || n == 0)
                continue;
            double per_sample = 1;
            for (int dim = 1; dim < c->ndim; dim++)
                per_sample *= (double)c->shape[dim];
            double pixels = 3.0 * (double)(cam->height > 0 ? cam->height : 1) * (cam->width > 0 ? cam->width : 1);
            frames += per_sample / pixels;
        }
    }
    return frames;
}

static int run_loader(const bench_opts *o, vf_dataset *d, loader_result *res)
{
    memset(res, 0, sizeof *res);
    size_t ncam = vf_dataset_num_cameras(d);
    double steps[SARM_STEPS];
    for (int i = 0; i < SARM_STEPS; i++)
        steps[i] = (double)(i - (SARM_STEPS - 1)); /* -7 .. 0 s */
    vf_delta_spec *deltas = NULL;
    if (o->sarm && ncam) {
        deltas = calloc(ncam, sizeof *deltas);
        if (!deltas)
            return vf_error(VF_ENOMEM, "out of memory");
        for (size_t k = 0; k < ncam; k++)
            deltas[k] = (vf_delta_spec){vf_dataset_camera(d, k)->key, steps, SARM_STEPS};
    }
    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = o->mode;
    ls.batch_size = (size_t)o->batch_size;
    ls.seed = (uint64_t)o->seed;
    ls.threads = (int)o->threads;
    ls.prefetch_batches = (size_t)o->prefetch;
    if (o->cache_entries > 0)
        ls.decoder_cache_entries = (size_t)o->cache_entries;
    if (o->pool_size > 0)
        ls.episode_pool_size = (size_t)o->pool_size;
    ls.sample.image_format = o->uint8 ? VF_IMAGE_UINT8_CHW : VF_IMAGE_FLOAT32_CHW;
    ls.sample.delta_timestamps = deltas;
    ls.sample.num_delta_timestamps = deltas ? ncam : 0;
    res->image_layout = o->uint8 ? VF_VIDEO_RGB_CHW_U8 : VF_VIDEO_RGB_CHW_F32;

    size_t cap = (size_t)o->num_batches;
    double *waits = malloc(cap * sizeof *waits);
    if (!waits) {
        free(deltas);
        return vf_error(VF_ENOMEM, "out of memory");
    }
    res->rss_before_mb = current_rss_mb();
    cpu_times c0 = cpu_now();
    double t0 = now_s();
    vf_loader *l;
    int r = vf_loader_open(&l, d, &ls);
    free(deltas);
    if (r < 0) {
        free(waits);
        return r;
    }
    res->open_s = now_s() - t0;
    res->rss_after_open_mb = current_rss_mb();
    res->batches_per_epoch = vf_loader_num_batches(l);
    res->samples_per_epoch = vf_loader_num_samples(l);
    res->epochs = 1;
    int64_t epoch = 0;
    /* Steady state: after every batch buffer of the pool exists (the
     * loader's window of batches built ahead + the one the consumer holds),
     * so first touches of fresh memory and decoder opens of the first
     * batches are outside it. */
    vf_loader_stats st0;
    vf_loader_get_stats(l, &st0);
    size_t warmup = st0.window + 2;
    double steady_t0 = 0, steady_samples0 = 0;
    cpu_times steady_c0 = {0, 0};
    vf_cli_progress prog;
    vf_cli_progress_start(&prog, "bench", o->quiet);
    while (res->batches < cap) {
        if (res->batches == warmup && cap >= 2 * warmup) {
            steady_t0 = now_s();
            steady_c0 = cpu_now();
            steady_samples0 = (double)res->samples;
            res->warmup_batches = warmup;
        }
        double w0 = now_s();
        vf_batch *b;
        r = vf_loader_next(l, &b);
        if (r == VF_EOF) {
            if (!o->quiet && res->epochs == 1)
                fprintf(stderr, "vlafeed bench: warning: the epoch ended after %zu batches; going on with the next "
                                "epoch (a bigger dataset avoids the wrap)\n",
                        res->batches);
            if ((r = vf_loader_set_epoch(l, ++epoch)) < 0)
                break;
            res->epochs++;
            continue;
        }
        if (r < 0)
            break;
        double w1 = now_s();
        if (res->batches == 0) {
            res->first_batch = w1 - t0;
            res->frames_per_sample = frames_in_sample(d, b, &res->batch_bytes);
        }
        waits[res->batches++] = w1 - w0;
        res->samples += vf_batch_size(b);
        vf_batch_release(b);
        vf_cli_progress_update(&prog, (long long)res->batches, (long long)cap, "batches");
    }
    vf_cli_progress_finish(&prog);
    double t_end = now_s();
    res->wall = t_end - t0;
    cpu_times c1 = cpu_now();
    res->cpu_user = c1.user - c0.user;
    res->cpu_sys = c1.sys - c0.sys;
    vf_loader_get_stats(l, &res->stats);
    res->peak_rss_mb = peak_rss_mb();
    res->frames = res->frames_per_sample * (double)res->samples;
    if (res->warmup_batches) {
        res->steady_wall = t_end - steady_t0;
        res->steady_cpu = (c1.user - steady_c0.user) + (c1.sys - steady_c0.sys);
        res->steady_frames = res->frames_per_sample * ((double)res->samples - steady_samples0);
    }
    qsort(waits, res->batches, sizeof *waits, cmp_double);
    res->wait_p50 = quantile(waits, res->batches, 0.50) * 1e3;
    res->wait_p95 = quantile(waits, res->batches, 0.95) * 1e3;
    res->wait_p99 = quantile(waits, res->batches, 0.99) * 1e3;
    free(waits);
    if (r < 0 && r != VF_EOF) {
        vf_error(r, "%s", vf_last_error()); /* keep the loader's message across close */
        char *msg = strdup(vf_last_error());
        vf_loader_close(l);
        r = vf_error(r, "%s", msg ? msg : "loader failed");
        free(msg);
        return r;
    }
    vf_loader_close(l);
    return 0;
}

/* ---- the decode limit ---------------------------------------------------------------- */

typedef struct limit_file {
    const char *path;
    int64_t frames;
    int width, height;
} limit_file;

typedef struct limit_ctx {
    limit_file *files;
    size_t num_files;
    int64_t *cumulative;        /* [num_files + 1]: frames before file i */
    int sequential;
    vf_video_format format;
    size_t frame_bytes;
    int64_t budget;
    double deadline;
    uint64_t seed;
    atomic_llong claimed;
    atomic_llong next_file;
    atomic_int failed;
    pthread_mutex_t lock;
    char error[512];
} limit_ctx;

typedef struct limit_thread {
    limit_ctx *x;
    int id;
    int64_t frames;
    uint64_t decoded;
    uint64_t opens;
} limit_thread;

static int limit_claim(limit_ctx *x)
{
    if (atomic_load(&x->failed))
        return 0;
    if (atomic_fetch_add(&x->claimed, 1) >= x->budget)
        return 0;
    return now_s() < x->deadline;
}

static void limit_fail(limit_ctx *x, const char *what)
{
    pthread_mutex_lock(&x->lock);
    if (!atomic_load(&x->failed))
        snprintf(x->error, sizeof x->error, "%s: %s", what, vf_last_error());
    atomic_store(&x->failed, 1);
    pthread_mutex_unlock(&x->lock);
}

static void *limit_main(void *p)
{
    limit_thread *t = p;
    limit_ctx *x = t->x;
    void *buf = malloc(x->frame_bytes);
    if (!buf) {
        vf_error(VF_ENOMEM, "out of memory");
        limit_fail(x, "limit");
        return NULL;
    }
    vf_video_settings vs;
    vf_video_defaults(&vs);
    if (x->sequential) {
        /* Whole files front to back, one file at a time per thread. */
        int more = 1;
        while (more) {
            size_t f = (size_t)(atomic_fetch_add(&x->next_file, 1) % (long long)x->num_files);
            vf_video_reader *r;
            if (vf_video_open_file(&r, x->files[f].path, &vs) < 0) {
                limit_fail(x, x->files[f].path);
                break;
            }
            t->opens++;
            int64_t n = vf_video_reader_index(r)->frame_count;
            for (int64_t k = 0; k < n; k++) {
                if (!(more = limit_claim(x)))
                    break;
                if (vf_video_read_frame(r, k, &x->format, buf) < 0) {
                    limit_fail(x, x->files[f].path);
                    more = 0;
                    break;
                }
                t->frames++;
            }
            vf_video_stats st;
            vf_video_get_stats(r, &st);
            t->decoded += st.frames_decoded;
            vf_video_close(r);
        }
    } else {
        /* Uniformly random frames over all files, every reader kept open. */
        vf_video_reader **readers = calloc(x->num_files, sizeof *readers);
        vf_rng rng;
        vf_rng_init(&rng, vf_rng_derive(x->seed, 0x6c696d6974ull, (uint64_t)t->id, 0, 0));
        int64_t total = x->cumulative[x->num_files];
        while (readers && total > 0 && limit_claim(x)) {
            int64_t u = (int64_t)vf_rng_below(&rng, (uint64_t)total);
            size_t lo = 0, hi = x->num_files; /* the file holding u */
            while (hi - lo > 1) {
                size_t mid = (lo + hi) / 2;
                if (x->cumulative[mid] <= u)
                    lo = mid;
                else
                    hi = mid;
            }
            if (!readers[lo]) {
                if (vf_video_open_file(&readers[lo], x->files[lo].path, &vs) < 0) {
                    limit_fail(x, x->files[lo].path);
                    break;
                }
                t->opens++;
            }
            if (vf_video_read_frame(readers[lo], u - x->cumulative[lo], &x->format, buf) < 0) {
                limit_fail(x, x->files[lo].path);
                break;
            }
            t->frames++;
        }
        for (size_t f = 0; readers && f < x->num_files; f++) {
            if (!readers[f])
                continue;
            vf_video_stats st;
            vf_video_get_stats(readers[f], &st);
            t->decoded += st.frames_decoded;
            vf_video_close(readers[f]);
        }
        free(readers);
    }
    free(buf);
    return NULL;
}

typedef struct limit_result {
    int sequential;
    int threads;
    int64_t frames;
    uint64_t decoded, opens;
    double wall, cpu, cpu_sys;
    size_t files;
} limit_result;

static int run_limit(const bench_opts *o, vf_dataset *d, int threads, int layout, int64_t budget,
                     limit_result *res)
{
    memset(res, 0, sizeof *res);
    limit_ctx x;
    memset(&x, 0, sizeof x);
    pthread_mutex_init(&x.lock, NULL);
    x.sequential = o->mode == VF_MODE_STREAM;
    vf_video_format_defaults(&x.format);
    x.format.layout = (vf_video_layout)layout;
    size_t ncam = vf_dataset_num_cameras(d), nf = 0;
    for (size_t k = 0; k < ncam; k++)
        nf += vf_dataset_num_video_files(d, k);
    int r = 0;
    x.files = calloc(nf ? nf : 1, sizeof *x.files);
    x.cumulative = calloc(nf + 1, sizeof *x.cumulative);
    if (!x.files || !x.cumulative)
        r = vf_error(VF_ENOMEM, "out of memory");
    /* The frame counts come from each file's index (the same files the
     * loader read; the index build is not timed). */
    for (size_t k = 0; k < ncam && r == 0; k++) {
        for (size_t i = 0; i < vf_dataset_num_video_files(d, k) && r == 0; i++) {
            limit_file *lf = &x.files[x.num_files];
            lf->path = vf_dataset_video_file(d, k, i);
            vf_video_index *ix;
            r = vf_video_index_build_file(&ix, lf->path);
            if (r < 0)
                break;
            lf->frames = ix->frame_count;
            lf->width = ix->width;
            lf->height = ix->height;
            vf_video_index_free(ix);
            size_t bytes = vf_video_format_bytes(&x.format, lf->width, lf->height);
            if (bytes > x.frame_bytes)
                x.frame_bytes = bytes;
            x.cumulative[x.num_files + 1] = x.cumulative[x.num_files] + lf->frames;
            x.num_files++;
        }
    }
    if (r == 0 && x.num_files == 0)
        r = vf_error(VF_EINVAL, "%s: no video files to measure the decode limit on", vf_dataset_root(d));
    if (r < 0) {
        free(x.files);
        free(x.cumulative);
        pthread_mutex_destroy(&x.lock);
        return r;
    }
    x.budget = budget;
    x.seed = (uint64_t)o->seed;
    limit_thread *ts = calloc((size_t)threads, sizeof *ts);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    int started = 0;
    if (ts && tid) {
        cpu_times c0 = cpu_now();
        double t0 = now_s();
        x.deadline = t0 + o->limit_seconds;
        for (int i = 0; i < threads; i++) {
            ts[i].x = &x;
            ts[i].id = i;
            if (pthread_create(&tid[i], NULL, limit_main, &ts[i]) != 0)
                break;
            started++;
        }
        for (int i = 0; i < started; i++)
            pthread_join(tid[i], NULL);
        res->wall = now_s() - t0;
        cpu_times c1 = cpu_now();
        res->cpu = (c1.user - c0.user) + (c1.sys - c0.sys);
        res->cpu_sys = c1.sys - c0.sys;
    }
    res->sequential = x.sequential;
    res->threads = started;
    res->files = x.num_files;
    for (int i = 0; i < started; i++) {
        res->frames += ts[i].frames;
        res->decoded += ts[i].decoded;
        res->opens += ts[i].opens;
    }
    if (!ts || !tid)
        r = vf_error(VF_ENOMEM, "out of memory");
    else if (started < threads)
        r = vf_error(VF_EIO, "limit: could not start %d threads", threads);
    else if (atomic_load(&x.failed))
        r = vf_error(VF_EIO, "decode limit: %s", x.error);
    free(ts);
    free(tid);
    free(x.files);
    free(x.cumulative);
    pthread_mutex_destroy(&x.lock);
    return r;
}

/* ---- repeated loader / limit pairs ------------------------------------------------- */

/* One loader run and one limit run of --repeat, in either order. */
typedef struct bench_pair {
    int loader_first;
    double loader_cpu, loader_sys, loader_wall, loader_fpc, loader_fps, loader_fpc_steady;
    double limit_cpu, limit_sys, limit_wall, limit_fpc, limit_fps;
    double ratio_cpu;           /* loader / limit, frames per CPU-second */
    double ratio_wall;          /* loader / limit, frames per wall-clock second */
    double ratio_cpu_steady;    /* the loader's steady state / limit, per CPU-second */
} bench_pair;

static void pair_fill(bench_pair *p, int loader_first, const loader_result *lr, const limit_result *lim)
{
    p->loader_first = loader_first;
    p->loader_cpu = lr->cpu_user + lr->cpu_sys;
    p->loader_sys = lr->cpu_sys;
    p->loader_wall = lr->wall;
    p->loader_fpc = ratio(lr->frames, p->loader_cpu);
    p->loader_fps = ratio(lr->frames, lr->wall);
    p->loader_fpc_steady = lr->warmup_batches ? ratio(lr->steady_frames, lr->steady_cpu) : NAN;
    p->limit_cpu = lim ? lim->cpu : NAN;
    p->limit_sys = lim ? lim->cpu_sys : NAN;
    p->limit_wall = lim ? lim->wall : NAN;
    p->limit_fpc = lim ? ratio((double)lim->frames, lim->cpu) : NAN;
    p->limit_fps = lim ? ratio((double)lim->frames, lim->wall) : NAN;
    p->ratio_cpu = ratio(p->loader_fpc, p->limit_fpc);
    p->ratio_wall = ratio(p->loader_fps, p->limit_fps);
    p->ratio_cpu_steady = ratio(p->loader_fpc_steady, p->limit_fpc);
}

typedef struct pair_summary {
    double median, min, max;
    size_t count;               /* pairs with a finite value */
} pair_summary;

/* Median (the mean of the middle two for an even count), min and max of
 * the finite values of one double field of the pairs. */
static pair_summary summarize(const bench_pair *pairs, size_t n, size_t field)
{
    pair_summary s = {NAN, NAN, NAN, 0};
    double *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return s;
    for (size_t i = 0; i < n; i++) {
        double x = *(const double *)((const char *)&pairs[i] + field);
        if (isfinite(x))
            v[s.count++] = x;
    }
    if (s.count) {
        qsort(v, s.count, sizeof *v, cmp_double);
        s.min = v[0];
        s.max = v[s.count - 1];
        s.median = s.count % 2 ? v[s.count / 2] : 0.5 * (v[s.count / 2 - 1] + v[s.count / 2]);
    }
    free(v);
    return s;
}

static json_t *summary_json(const pair_summary *s)
{
    return json_pack("{s:o,s:o,s:o}", "median", jnum(s->median), "min", jnum(s->min), "max", jnum(s->max));
}

/* ---- report ------------------------------------------------------------------------- */

static const char *mode_name(vf_mode m)
{
    return m == VF_MODE_STREAM ? "stream" : m == VF_MODE_MAP ? "map" : "pool";
}

static char *command_line(int argc, char **argv)
{
    vf_buf b = {0};
    vf_buf_printf(&b, "vlafeed");
    for (int i = 0; i < argc; i++)
        vf_buf_printf(&b, " %s", argv[i]);
    return vf_buf_take_string(&b);
}

typedef struct csv_field {
    const char *name;
    char value[288];
} csv_field;

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return vf_error(VF_EIO, "%s: cannot write: %s", path, strerror(errno));
    int ok = fputs(text, f) >= 0;
    ok &= fclose(f) == 0;
    return ok ? 0 : vf_error(VF_EIO, "%s: write failed", path);
}

int vf_cmd_bench(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--source") && !strcmp(argv[i + 1], "wds"))
            return vf_cmd_bench_wds(argc, argv);
    bench_opts o = {0};
    o.mode = VF_MODE_STREAM;
    o.loader_name = "stream";
    o.batch_size = 64;
    o.num_batches = 200;
    o.prefetch = 4;
    o.limit_seconds = 60;
    o.repeat = 1;
    int have_mode = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (vf_cli_is(a, "--help", "-h")) {
            usage(stdout);
            free(o.episodes);
            return 0;
        } else if (vf_cli_is(a, "--mode", NULL)) {
            if (!v || (strcmp(v, "single") && strcmp(v, "sarm"))) {
                fprintf(stderr, "vlafeed bench: --mode must be single or sarm\n");
                goto usage_error;
            }
            o.sarm = !strcmp(v, "sarm");
            have_mode = 1;
            i++;
        } else if (vf_cli_is(a, "--loader", NULL)) {
            if (v && !strcmp(v, "stream"))
                o.mode = VF_MODE_STREAM;
            else if (v && !strcmp(v, "map"))
                o.mode = VF_MODE_MAP;
            else if (v && !strcmp(v, "pool"))
                o.mode = VF_MODE_POOL;
            else {
                fprintf(stderr, "vlafeed bench: --loader must be stream, map or pool\n");
                goto usage_error;
            }
            o.loader_name = v;
            i++;
        } else if (vf_cli_is(a, "--batch-size", NULL)) {
            if (vf_cli_int(a, v, 1, 1 << 20, &o.batch_size) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--num-batches", NULL)) {
            if (vf_cli_int(a, v, 1, 1 << 24, &o.num_batches) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--threads", NULL)) {
            if (vf_cli_int(a, v, 1, 1024, &o.threads) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--prefetch", NULL)) {
            if (vf_cli_int(a, v, 1, 4096, &o.prefetch) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--cache-entries", NULL)) {
            if (vf_cli_int(a, v, 1, 1 << 20, &o.cache_entries) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--pool-size", NULL)) {
            if (vf_cli_int(a, v, 1, 1 << 24, &o.pool_size) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--seed", NULL)) {
            if (vf_cli_int(a, v, 0, (long long)1 << 62, &o.seed) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--format", NULL)) {
            if (!v || (strcmp(v, "float32") && strcmp(v, "uint8"))) {
                fprintf(stderr, "vlafeed bench: --format must be float32 or uint8\n");
                goto usage_error;
            }
            o.uint8 = !strcmp(v, "uint8");
            i++;
        } else if (vf_cli_is(a, "--episodes", NULL)) {
            free(o.episodes);
            o.episodes = NULL;
            if (vf_cli_episode_list(a, v, &o.episodes, &o.num_episodes) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--limit-seconds", NULL)) {
            if (vf_cli_double(a, v, 0.1, 86400, &o.limit_seconds) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--repeat", NULL)) {
            if (vf_cli_int(a, v, 1, 1000, &o.repeat) < 0)
                goto usage_error;
            i++;
        } else if (vf_cli_is(a, "--out-dir", NULL)) {
            if (!v) {
                fprintf(stderr, "vlafeed bench: --out-dir needs a folder\n");
                goto usage_error;
            }
            o.out_dir = v;
            i++;
        } else if (vf_cli_is(a, "--name", NULL)) {
            if (!v || !*v || strchr(v, '/')) {
                fprintf(stderr, "vlafeed bench: --name needs a file name without '/'\n");
                goto usage_error;
            }
            o.name = v;
            i++;
        } else if (vf_cli_is(a, "--with-limit", NULL)) {
            o.with_limit = 1;
        } else if (vf_cli_is(a, "--json", NULL)) {
            o.json = 1;
        } else if (vf_cli_is(a, "--quiet", "-q")) {
            o.quiet = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "vlafeed bench: unknown option '%s'\n", a);
            goto usage_error;
        } else if (o.path) {
            fprintf(stderr, "vlafeed bench: expected exactly one dataset PATH\n");
            goto usage_error;
        } else {
            o.path = a;
        }
    }
    if (!o.path) {
        fprintf(stderr, "vlafeed bench: expected a dataset PATH\n");
        goto usage_error;
    }
    if (!have_mode) {
        fprintf(stderr, "vlafeed bench: --mode single|sarm is required\n");
        goto usage_error;
    }
    if (o.repeat > 1 && !o.with_limit) {
        fprintf(stderr, "vlafeed bench: --repeat needs --with-limit (it repeats loader / limit pairs)\n");
        goto usage_error;
    }

    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1)
        cores = 1;
    int threads = o.threads > 0 ? (int)o.threads : cores;

    /* Is the machine busy? */
    double load[3];
    read_loadavg(load);
    double share = spin_share(threads < cores ? threads : cores, 0.3);
    int busy_load = isfinite(load[0]) && load[0] > (double)cores - 0.5;
    int busy_spin = isfinite(share) && share < 0.85;
    if ((busy_load || busy_spin) && !o.quiet)
        fprintf(stderr,
                "vlafeed bench: warning: the machine was busy before the run (load %.2f on %d cores, a %d-thread "
                "spin test got %.0f%% of its CPU): wall-clock figures are noisy; compare frames per CPU second\n",
                load[0], cores, threads < cores ? threads : cores, 100.0 * share);

    vf_dataset_settings ds;
    vf_dataset_defaults(&ds);
    ds.episodes = o.episodes;
    ds.num_episodes = o.num_episodes;
    vf_dataset *d;
    int r = vf_dataset_open(&d, o.path, &ds);
    free(o.episodes);
    o.episodes = NULL;
    if (r < 0)
        return vf_cli_fail("bench");

    /* Pair 0 is the loader then the limit (its figures are `results`,
     * `limit` and `ratios`); with --repeat, pair i runs the limit first when
     * i is odd, so a drift in the machine's load during the run weighs on
     * both sides alike. */
    loader_result lr;
    limit_result lim;
    memset(&lim, 0, sizeof lim);
    int have_limit = 0;
    size_t num_pairs = (size_t)o.repeat;
    bench_pair *pairs = calloc(num_pairs, sizeof *pairs);
    if (!pairs) {
        vf_dataset_close(d);
        fprintf(stderr, "vlafeed bench: out of memory\n");
        return 1;
    }
    int64_t budget = 0;
    for (size_t p = 0; p < num_pairs; p++) {
        int loader_first = p % 2 == 0;
        loader_result lr_p;
        limit_result lim_p;
        memset(&lim_p, 0, sizeof lim_p);
        if (num_pairs > 1 && !o.quiet)
            fprintf(stderr, "vlafeed bench: pair %zu of %zu (%s first)\n", p + 1, num_pairs,
                    loader_first ? "loader" : "limit");
        for (int side = 0; side < 2 && r == 0; side++) {
            if ((side == 0) == loader_first) {
                r = run_loader(&o, d, p == 0 ? &lr : &lr_p);
                if (r == 0 && p == 0) {
                    budget = (int64_t)llround(lr.frames);
                    if (budget < 200 * (int64_t)threads)
                        budget = 200 * (int64_t)threads;
                }
            } else if (o.with_limit) {
                if (!o.quiet && p == 0)
                    fprintf(stderr, "vlafeed bench: measuring the decode limit (%s, %d threads, %lld frames)...\n",
                            o.mode == VF_MODE_STREAM ? "sequential" : "random single frames", threads,
                            (long long)budget);
                r = run_limit(&o, d, threads, lr.image_layout, budget, p == 0 ? &lim : &lim_p);
                if (r == 0 && p == 0)
                    have_limit = 1;
            }
        }
        if (r < 0)
            break;
        pair_fill(&pairs[p], loader_first, p == 0 ? &lr : &lr_p, o.with_limit ? (p == 0 ? &lim : &lim_p) : NULL);
    }
    if (r < 0) {
        free(pairs);
        vf_dataset_close(d);
        return vf_cli_fail("bench");
    }
    double cpu = lr.cpu_user + lr.cpu_sys;
    double fps = lr.wall > 0 ? lr.frames / lr.wall : NAN;
    double fpc = cpu > 0 ? lr.frames / cpu : NAN;
    pair_summary ratio_cpu = summarize(pairs, num_pairs, offsetof(bench_pair, ratio_cpu));
    pair_summary ratio_wall = summarize(pairs, num_pairs, offsetof(bench_pair, ratio_wall));
    pair_summary ratio_steady = summarize(pairs, num_pairs, offsetof(bench_pair, ratio_cpu_steady));

    double lim_fps = have_limit && lim.wall > 0 ? (double)lim.frames / lim.wall : NAN;
    double lim_fpc = have_limit && lim.cpu > 0 ? (double)lim.frames / lim.cpu : NAN;

    /* ---- the JSON document ---- */
    char name[256];
    if (o.name)
        snprintf(name, sizeof name, "%s", o.name);
    else
        snprintf(name, sizeof name, "%s-%s-b%lld-t%d%s", o.sarm ? "sarm" : "single", mode_name(o.mode),
                 o.batch_size, threads, o.uint8 ? "-u8" : "");
    char cpu_model[256];
    read_cpu_model(cpu_model, sizeof cpu_model);
    char *cmd = command_line(argc, argv);
    const vf_loader_stats *st = &lr.stats;
    uint64_t lookups = st->cache_hits + st->cache_misses;
    double hit_rate = lookups ? (double)st->cache_hits / (double)lookups : NAN;
    double dec_per_emit = st->frames_delivered ? (double)st->frames_decoded / (double)st->frames_delivered : NAN;

    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("vlafeed-bench/1"));
    json_object_set_new(doc, "config", json_string(name));
    json_object_set_new(doc, "vlafeed_version", json_string(vf_version()));
    json_object_set_new(doc, "command", json_string(cmd ? cmd : ""));
    json_object_set_new(doc, "timestamp_unix", json_integer((json_int_t)time(NULL)));
    json_t *m = json_object();
    json_object_set_new(m, "cores", json_integer(cores));
    json_object_set_new(m, "cpu_model", json_string(cpu_model));
    json_object_set_new(m, "mem_total_mb", jnum(mem_total_mb()));
    json_object_set_new(m, "loadavg_before", json_pack("[o,o,o]", jnum(load[0]), jnum(load[1]), jnum(load[2])));
    json_object_set_new(m, "spin_test_threads", json_integer(threads < cores ? threads : cores));
    json_object_set_new(m, "spin_test_cpu_share", jnum(share));
    json_object_set_new(m, "busy", json_boolean(busy_load || busy_spin));
    json_object_set_new(doc, "machine", m);

    json_t *dj = json_object();
    json_object_set_new(dj, "path", json_string(vf_dataset_root(d)));
    json_object_set_new(dj, "episodes", json_integer((json_int_t)vf_dataset_num_episodes(d)));
    int64_t frames_total = 0;
    for (size_t i = 0; i < vf_dataset_num_episodes(d); i++)
        frames_total += vf_dataset_episode(d, i)->length;
    json_object_set_new(dj, "frames", json_integer(frames_total));
    json_object_set_new(dj, "fps", jnum(vf_dataset_fps(d)));
    json_t *cams = json_array();
    for (size_t k = 0; k < vf_dataset_num_cameras(d); k++) {
        const vf_camera *c = vf_dataset_camera(d, k);
        json_array_append_new(cams, json_pack("{s:s,s:s,s:i,s:i,s:I}", "key", c->key, "codec", c->codec, "width",
                                              c->width, "height", c->height, "files",
                                              (json_int_t)vf_dataset_num_video_files(d, k)));
    }
    json_object_set_new(dj, "cameras", cams);
    json_object_set_new(doc, "dataset", dj);

    json_t *sj = json_object();
    json_object_set_new(sj, "mode", json_string(o.sarm ? "sarm" : "single"));
    json_object_set_new(sj, "loader", json_string(mode_name(o.mode)));
    json_object_set_new(sj, "batch_size", json_integer(o.batch_size));
    json_object_set_new(sj, "num_batches", json_integer(o.num_batches));
    json_object_set_new(sj, "threads", json_integer(threads));
    json_object_set_new(sj, "prefetch", json_integer(o.prefetch));
    json_object_set_new(sj, "image_format", json_string(o.uint8 ? "uint8_chw" : "float32_chw"));
    json_object_set_new(sj, "seed", json_integer(o.seed));
    if (o.sarm) {
        json_t *steps = json_array();
        for (int i = 0; i < SARM_STEPS; i++)
            json_array_append_new(steps, json_real((double)(i - (SARM_STEPS - 1))));
        json_object_set_new(sj, "delta_timestamps_s", steps);
    } else {
        json_object_set_new(sj, "delta_timestamps_s", json_null());
    }
    json_object_set_new(sj, "decoder_cache_entries",
                        o.cache_entries > 0 ? json_integer(o.cache_entries) : json_string("default"));
    json_object_set_new(sj, "episode_pool_size",
                        o.mode != VF_MODE_POOL ? json_null()
                        : o.pool_size > 0      ? json_integer(o.pool_size)
                                               : json_string("default"));
    json_object_set_new(doc, "settings", sj);

    json_t *rj = json_object();
    json_object_set_new(rj, "batches", json_integer((json_int_t)lr.batches));
    json_object_set_new(rj, "samples", json_integer((json_int_t)lr.samples));
    json_object_set_new(rj, "frames", json_integer((json_int_t)llround(lr.frames)));
    json_object_set_new(rj, "frames_per_sample", jnum(lr.frames_per_sample));
    json_object_set_new(rj, "epochs", json_integer((json_int_t)lr.epochs));
    json_object_set_new(rj, "batches_per_epoch", json_integer((json_int_t)lr.batches_per_epoch));
    json_object_set_new(rj, "wallclock_s", jnum(lr.wall));
    json_object_set_new(rj, "cpu_s", jnum(cpu));
    json_object_set_new(rj, "cpu_user_s", jnum(lr.cpu_user));
    json_object_set_new(rj, "cpu_sys_s", jnum(lr.cpu_sys));
    json_object_set_new(rj, "cpu_utilization", jnum(ratio(cpu, lr.wall)));
    json_object_set_new(rj, "frames_per_s_node", jnum(fps));
    json_object_set_new(rj, "frames_per_cpu_s", jnum(fpc));
    json_object_set_new(rj, "samples_per_s", jnum(ratio((double)lr.samples, lr.wall)));
    json_object_set_new(rj, "steady_state",
                        lr.warmup_batches
                            ? json_pack("{s:I,s:o,s:o,s:o}", "after_batches", (json_int_t)lr.warmup_batches,
                                        "frames_per_s_node", jnum(ratio(lr.steady_frames, lr.steady_wall)),
                                        "frames_per_cpu_s", jnum(ratio(lr.steady_frames, lr.steady_cpu)),
                                        "wallclock_s", jnum(lr.steady_wall))
                            : json_null());
    json_object_set_new(rj, "loader_open_s", jnum(lr.open_s));
    json_object_set_new(rj, "first_batch_latency_s", jnum(lr.first_batch));
    json_object_set_new(rj, "engine_first_batch_s", jnum(st->first_batch_seconds));
    json_object_set_new(rj, "sample_latency_ms",
                        json_pack("{s:o,s:o,s:o}", "p50", jnum(st->p50_sample_ms), "p95", jnum(st->p95_sample_ms),
                                  "p99", jnum(st->p99_sample_ms)));
    json_object_set_new(rj, "batch_wait_ms",
                        json_pack("{s:o,s:o,s:o}", "p50", jnum(lr.wait_p50), "p95", jnum(lr.wait_p95), "p99",
                                  jnum(lr.wait_p99)));
    json_object_set_new(rj, "consumer_wait_s", jnum(st->wait_seconds));
    json_object_set_new(rj, "frames_decoded", json_integer((json_int_t)st->frames_decoded));
    json_object_set_new(rj, "frames_assembled", json_integer((json_int_t)st->frames_delivered));
    json_object_set_new(rj, "decoded_per_emitted", jnum(dec_per_emit));
    json_object_set_new(rj, "video_opens", json_integer((json_int_t)st->video_opens));
    json_object_set_new(rj, "decoder_cache",
                        json_pack("{s:I,s:I,s:I,s:o,s:I,s:I}", "hits", (json_int_t)st->cache_hits, "misses",
                                  (json_int_t)st->cache_misses, "evictions", (json_int_t)st->cache_evictions,
                                  "hit_rate", jnum(hit_rate), "size", (json_int_t)st->cache_entries, "capacity",
                                  (json_int_t)st->cache_capacity));
    if (o.mode == VF_MODE_POOL)
        json_object_set_new(rj, "pool",
                            json_pack("{s:I,s:I,s:I}", "segments", (json_int_t)st->pool_segments, "admitted",
                                      (json_int_t)st->pool_admitted, "evicted", (json_int_t)st->pool_evicted));
    json_object_set_new(rj, "peak_rss_mb", jnum(lr.peak_rss_mb));
    json_object_set_new(rj, "rss_before_open_mb", jnum(lr.rss_before_mb));
    json_object_set_new(rj, "rss_after_open_mb", jnum(lr.rss_after_open_mb));
    json_object_set_new(rj, "batch_bytes", json_integer((json_int_t)lr.batch_bytes));
    json_object_set_new(rj, "batch_buffers", json_integer((json_int_t)st->batch_buffers));
    json_object_set_new(rj, "window", json_integer((json_int_t)st->window));
    json_object_set_new(doc, "results", rj);

    json_object_set_new(doc, "gpu_copy",
                        json_pack("{s:b,s:s}", "done", 0, "reason",
                                  "vlafeed bench is built without CUDA; bench/torchrun_bench.py --gpu copies "
                                  "batches with torch.cuda"));
    if (have_limit) {
        json_t *lj = json_object();
        json_object_set_new(lj, "kind", json_string(lim.sequential ? "sequential" : "random"));
        json_object_set_new(lj, "description",
                            json_string(lim.sequential ? "whole files decoded front to back, one reader per file pass"
                                                       : "uniformly random single frames, every reader kept open "
                                                         "(decoder reuse)"));
        json_object_set_new(lj, "threads", json_integer(lim.threads));
        json_object_set_new(lj, "files", json_integer((json_int_t)lim.files));
        json_object_set_new(lj, "image_format", json_string(o.uint8 ? "uint8_chw" : "float32_chw"));
        json_object_set_new(lj, "frames", json_integer(lim.frames));
        json_object_set_new(lj, "frames_decoded", json_integer((json_int_t)lim.decoded));
        json_object_set_new(lj, "decoded_per_emitted", jnum(ratio((double)lim.decoded, (double)lim.frames)));
        json_object_set_new(lj, "video_opens", json_integer((json_int_t)lim.opens));
        json_object_set_new(lj, "wallclock_s", jnum(lim.wall));
        json_object_set_new(lj, "cpu_s", jnum(lim.cpu));
        json_object_set_new(lj, "frames_per_s", jnum(lim_fps));
        json_object_set_new(lj, "frames_per_cpu_s", jnum(lim_fpc));
        json_object_set_new(doc, "limit", lj);
        json_object_set_new(doc, "ratios",
                            json_pack("{s:o,s:o}", "loader_vs_limit_wall", jnum(ratio(fps, lim_fps)),
                                      "loader_vs_limit_cpu", jnum(ratio(fpc, lim_fpc))));
    } else {
        json_object_set_new(doc, "limit", json_null());
        json_object_set_new(doc, "ratios", json_null());
    }
    if (have_limit) {
        json_t *pj = json_array();
        for (size_t p = 0; p < num_pairs; p++) {
            const bench_pair *q = &pairs[p];
            json_array_append_new(
                pj, json_pack("{s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "first",
                              q->loader_first ? "loader" : "limit", "loader_cpu_s", jnum(q->loader_cpu),
                              "loader_cpu_sys_s", jnum(q->loader_sys), "limit_cpu_sys_s", jnum(q->limit_sys),
                              "loader_wallclock_s", jnum(q->loader_wall), "loader_frames_per_cpu_s",
                              jnum(q->loader_fpc), "loader_frames_per_s", jnum(q->loader_fps),
                              "loader_steady_frames_per_cpu_s", jnum(q->loader_fpc_steady), "limit_cpu_s",
                              jnum(q->limit_cpu), "limit_wallclock_s", jnum(q->limit_wall),
                              "limit_frames_per_cpu_s", jnum(q->limit_fpc), "limit_frames_per_s",
                              jnum(q->limit_fps), "loader_vs_limit_cpu", jnum(q->ratio_cpu),
                              "loader_vs_limit_wall", jnum(q->ratio_wall)));
        }
        json_t *rp = json_object();
        json_object_set_new(rp, "pairs", json_integer((json_int_t)num_pairs));
        json_object_set_new(rp, "order", json_string("pair i runs the loader first when i is even, the limit "
                                                     "first when i is odd"));
        json_object_set_new(rp, "cpu_clock", json_string("getrusage(RUSAGE_SELF): user + sys of every thread of "
                                                         "the process, per run"));
        json_object_set_new(rp, "loader_vs_limit_cpu", summary_json(&ratio_cpu));
        json_object_set_new(rp, "loader_vs_limit_wall", summary_json(&ratio_wall));
        json_object_set_new(rp, "loader_steady_vs_limit_cpu", summary_json(&ratio_steady));
        json_object_set_new(rp, "runs", pj);
        json_object_set_new(doc, "repeat", rp);
    } else {
        json_object_set_new(doc, "repeat", json_null());
    }
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    json_decref(doc);
    free(cmd);
    if (!text) {
        free(pairs);
        vf_dataset_close(d);
        fprintf(stderr, "vlafeed bench: out of memory\n");
        return 1;
    }

    /* ---- CSV: one header line, one row ---- */
    csv_field fields[] = {
        {"config", ""}, {"mode", ""}, {"loader", ""}, {"batch_size", ""}, {"threads", ""}, {"image_format", ""},
        {"batches", ""}, {"samples", ""}, {"frames", ""}, {"wallclock_s", ""}, {"cpu_s", ""},
        {"frames_per_s_node", ""}, {"frames_per_cpu_s", ""}, {"samples_per_s", ""}, {"first_batch_latency_s", ""},
        {"p50_sample_ms", ""}, {"p95_sample_ms", ""}, {"p99_sample_ms", ""}, {"decoded_per_emitted", ""},
        {"cache_hits", ""}, {"cache_misses", ""}, {"cache_evictions", ""}, {"cache_hit_rate", ""},
        {"cache_size", ""}, {"cache_capacity", ""}, {"peak_rss_mb", ""}, {"loadavg_1m", ""}, {"busy", ""}, {"limit_kind", ""},
        {"limit_frames_per_s", ""}, {"limit_frames_per_cpu_s", ""}, {"ratio_limit_wall", ""},
        {"ratio_limit_cpu", ""}, {"repeat", ""}, {"ratio_limit_cpu_median", ""}, {"ratio_limit_cpu_min", ""},
        {"ratio_limit_cpu_max", ""}, {"ratio_limit_wall_median", ""},
    };
    size_t nfields = sizeof fields / sizeof fields[0], fi = 0;
#define CSV_S(v) snprintf(fields[fi++].value, sizeof fields[0].value, "%s", (v))
#define CSV_D(v) snprintf(fields[fi++].value, sizeof fields[0].value, "%.6g", (double)(v))
    CSV_S(name);
    CSV_S(o.sarm ? "sarm" : "single");
    CSV_S(mode_name(o.mode));
    CSV_D(o.batch_size);
    CSV_D(threads);
    CSV_S(o.uint8 ? "uint8_chw" : "float32_chw");
    CSV_D(lr.batches);
    CSV_D(lr.samples);
    CSV_D(llround(lr.frames));
    CSV_D(lr.wall);
    CSV_D(cpu);
    CSV_D(fps);
    CSV_D(fpc);
    CSV_D(ratio((double)lr.samples, lr.wall));
    CSV_D(lr.first_batch);
    CSV_D(st->p50_sample_ms);
    CSV_D(st->p95_sample_ms);
    CSV_D(st->p99_sample_ms);
    CSV_D(dec_per_emit);
    CSV_D(st->cache_hits);
    CSV_D(st->cache_misses);
    CSV_D(st->cache_evictions);
    CSV_D(hit_rate);
    CSV_D(st->cache_entries);
    CSV_D(st->cache_capacity);
    CSV_D(lr.peak_rss_mb);
    CSV_D(load[0]);
    CSV_S(busy_load || busy_spin ? "true" : "false");
    CSV_S(have_limit ? (lim.sequential ? "sequential" : "random") : "");
    CSV_D(lim_fps);
    CSV_D(lim_fpc);
    CSV_D(ratio(fps, lim_fps));
    CSV_D(ratio(fpc, lim_fpc));
    CSV_D(num_pairs);
    CSV_D(ratio_cpu.median);
    CSV_D(ratio_cpu.min);
    CSV_D(ratio_cpu.max);
    CSV_D(ratio_wall.median);
#undef CSV_S
#undef CSV_D
    vf_buf csv = {0};
    for (size_t i = 0; i < nfields; i++)
        vf_buf_printf(&csv, "%s%s", i ? "," : "", fields[i].name);
    vf_buf_printf(&csv, "\n");
    for (size_t i = 0; i < nfields; i++)
        vf_buf_printf(&csv, "%s%s", i ? "," : "", !strcmp(fields[i].value, "nan") ? "" : fields[i].value);
    vf_buf_printf(&csv, "\n");
    char *csv_text = vf_buf_take_string(&csv);

    int rc = 0;
    char *json_path = NULL, *csv_path = NULL;
    if (o.out_dir) {
        char file[300];
        if (vf_mkdirs(o.out_dir) < 0) {
            rc = vf_cli_fail("bench");
        } else {
            snprintf(file, sizeof file, "%s.json", name);
            json_path = vf_path_join(o.out_dir, file);
            snprintf(file, sizeof file, "%s.csv", name);
            csv_path = vf_path_join(o.out_dir, file);
            vf_buf jb = {0};
            vf_buf_printf(&jb, "%s\n", text);
            char *jt = vf_buf_take_string(&jb);
            if (!json_path || !csv_path || !jt || !csv_text || write_file(json_path, jt) < 0 ||
                write_file(csv_path, csv_text) < 0)
                rc = vf_cli_fail("bench");
            free(jt);
        }
    }

    if (o.json) {
        printf("%s\n", text);
    } else {
        printf("vlafeed bench: %s (%s mode, %s loader, batch %lld, %zu batches, %d threads, %s)\n", name,
               o.sarm ? "sarm" : "single", mode_name(o.mode), o.batch_size, lr.batches, threads,
               o.uint8 ? "uint8" : "float32");
        printf("  dataset               %s: %zu episodes, %lld frames, %zu cameras\n", vf_dataset_root(d),
               vf_dataset_num_episodes(d), (long long)frames_total, vf_dataset_num_cameras(d));
        printf("  machine               %d cores, load %.2f before the run, spin test %.0f%% of %d threads%s\n", cores,
               load[0], 100.0 * share, threads < cores ? threads : cores, busy_load || busy_spin ? " (BUSY)" : "");
        printf("  frames/s (node)       %.1f wall, %.1f per CPU-second (%.2f CPU-s/s)\n", fps, fpc, ratio(cpu, lr.wall));
        if (lr.warmup_batches)
            printf("  steady state          %.1f frames/s wall, %.1f per CPU-second (after %zu batches)\n",
                   ratio(lr.steady_frames, lr.steady_wall), ratio(lr.steady_frames, lr.steady_cpu),
                   lr.warmup_batches);
        printf("  samples/s             %.1f (%.0f frames per sample)\n", ratio((double)lr.samples, lr.wall),
               lr.frames_per_sample);
        printf("  wall / CPU            %.2f s / %.2f s (user %.2f, sys %.2f)\n", lr.wall, cpu, lr.cpu_user,
               lr.cpu_sys);
        printf("  first batch           %.3f s\n", lr.first_batch);
        printf("  sample latency        p50 %.2f ms, p95 %.2f ms, p99 %.2f ms\n", st->p50_sample_ms,
               st->p95_sample_ms, st->p99_sample_ms);
        printf("  batch wait            p50 %.2f ms, p95 %.2f ms, p99 %.2f ms\n", lr.wait_p50, lr.wait_p95,
               lr.wait_p99);
        printf("  decoded per emitted   %.3f (%llu decoded, %llu assembled)\n", dec_per_emit,
               (unsigned long long)st->frames_decoded, (unsigned long long)st->frames_delivered);
        printf("  decoder cache         hits %llu, misses %llu, evictions %llu, hit rate %.3f, size %zu of %zu\n",
               (unsigned long long)st->cache_hits, (unsigned long long)st->cache_misses,
               (unsigned long long)st->cache_evictions, hit_rate, st->cache_entries, st->cache_capacity);
        if (o.mode == VF_MODE_POOL)
            printf("  episode pool          %zu segments held, %llu admitted, %llu evicted\n", st->pool_segments,
                   (unsigned long long)st->pool_admitted, (unsigned long long)st->pool_evicted);
        printf("  peak RSS              %.1f MB (%.1f MB after open; %zu batch buffers of %.1f MB, %zu built ahead at "
               "most)\n",
               lr.peak_rss_mb, lr.rss_after_open_mb, st->batch_buffers, (double)lr.batch_bytes / (1024.0 * 1024.0),
               st->window);
        printf("  gpu copy              skipped: built without CUDA (bench/torchrun_bench.py --gpu uses torch.cuda)\n");
        if (have_limit) {
            printf("  decode limit          %s, %d threads: %.1f frames/s wall, %.1f per CPU-second (%.3f decoded "
                   "per frame)\n",
                   lim.sequential ? "sequential" : "random single frames", lim.threads, lim_fps, lim_fpc,
                   ratio((double)lim.decoded, (double)lim.frames));
            printf("  loader / limit        %.3f wall, %.3f per CPU-second\n", ratio(fps, lim_fps), ratio(fpc, lim_fpc));
            if (num_pairs > 1) {
                printf("  loader / limit, %zu pairs (alternating order):\n", num_pairs);
                printf("    per CPU-second      median %.3f, min %.3f, max %.3f\n", ratio_cpu.median, ratio_cpu.min,
                       ratio_cpu.max);
                printf("    wall                median %.3f, min %.3f, max %.3f\n", ratio_wall.median,
                       ratio_wall.min, ratio_wall.max);
                printf("    steady state / CPU  median %.3f, min %.3f, max %.3f\n", ratio_steady.median,
                       ratio_steady.min, ratio_steady.max);
                printf("    per pair, CPU       ");
                for (size_t p = 0; p < num_pairs; p++)
                    printf("%s%.3f", p ? ", " : "", pairs[p].ratio_cpu);
                printf("\n");
            }
        }
        if (json_path)
            printf("  written               %s, %s\n", json_path, csv_path);
    }
    free(json_path);
    free(csv_path);
    free(pairs);
    free(text);
    free(csv_text);
    vf_dataset_close(d);
    return rc;

usage_error:
    free(o.episodes);
    usage(stderr);
    return 2;
}
