/*
 * cmd_make_sample.c: `vlafeed make-sample OUT [options]`: writes a synthetic
 * LeRobot v3.0 dataset (include/vlafeed/make_sample.h) with a progress bar.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "vlafeed/make_sample.h"
#include "vlafeed/vlafeed.h"

static void usage(FILE *out)
{
    vf_make_sample_settings d;
    vf_make_sample_defaults(&d);
    fprintf(out,
            "usage: vlafeed make-sample OUT [options]\n\n"
            "Writes a complete LeRobot v3.0 dataset into the new folder OUT: meta/info.json,\n"
            "meta/episodes, meta/tasks.parquet, meta/stats.json, data Parquet (one row group per\n"
            "episode) and per-camera MP4 files holding many episodes concatenated as LeRobot does\n"
            "(its timestamp drift included). Every frame carries its identity (episode, frame,\n"
            "camera) in pixel blocks and every table value is a pure function of (episode, frame),\n"
            "so loaders can be checked for exactness.\n\n"
            "options:\n"
            "  --episodes N       number of episodes (default %d)\n"
            "  --cameras K        cameras observation.images.cam0..K-1 (default %d)\n"
            "  --fps F            frames per second (default %d)\n"
            "  --size WxH         frame size (default %dx%d; AV1 needs H >= 64)\n"
            "  --codec C          av1 (libsvtav1), h264 (libx264) or hevc (libx265) (default %s)\n"
            "  --gop G            keyframe interval (default %d, LeRobot's)\n"
            "  --crf C            quality (default %d, LeRobot's)\n"
            "  --max-video-mb M   start a new MP4 per camera past this size (default %g)\n"
            "  --max-data-mb M    start a new data Parquet file past this size (default %g)\n"
            "  --min-length N     shortest episode in frames (default %d)\n"
            "  --max-length N     longest episode in frames (default %d)\n"
            "  --tasks N          number of task strings (default %d)\n"
            "  --state-dim N      width of observation.state and action (default %d)\n"
            "  --seed S           episode lengths depend on it (default %llu)\n"
            "  --encoder-threads N threads per encoder (default %d)\n"
            "  --quiet            no progress bar\n",
            d.num_episodes, d.num_cameras, d.fps, d.width, d.height, d.codec, d.gop, d.crf, d.max_video_mb,
            d.max_data_mb, d.min_length, d.max_length, d.num_tasks, d.state_dim, (unsigned long long)d.seed,
            d.encoder_threads);
}

static void on_progress(void *ctx, int done, int total, const char *what)
{
    vf_cli_progress_update(ctx, done, total, what);
}

int vf_cmd_make_sample(int argc, char **argv)
{
    vf_make_sample_settings s;
    vf_make_sample_defaults(&s);
    const char *out = NULL;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        double x;
        if (vf_cli_is(a, "--help", "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        } else if (a[0] != '-') {
            if (out) {
                fprintf(stderr, "vlafeed make-sample: more than one output folder given\n");
                return 2;
            }
            out = a;
            continue;
        }
        if (!v) {
            fprintf(stderr, "vlafeed make-sample: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--episodes")) {
            if (vf_cli_int(a, v, 1, 1000000, &n)) return 2;
            s.num_episodes = (int)n;
        } else if (!strcmp(a, "--cameras")) {
            if (vf_cli_int(a, v, 0, 16, &n)) return 2;
            s.num_cameras = (int)n;
        } else if (!strcmp(a, "--fps")) {
            if (vf_cli_int(a, v, 1, 1000, &n)) return 2;
            s.fps = (int)n;
        } else if (!strcmp(a, "--size")) {
            if (vf_cli_size(a, v, &s.width, &s.height)) return 2;
        } else if (!strcmp(a, "--codec")) {
            s.codec = v;
        } else if (!strcmp(a, "--gop")) {
            if (vf_cli_int(a, v, 1, 10000, &n)) return 2;
            s.gop = (int)n;
        } else if (!strcmp(a, "--crf")) {
            if (vf_cli_int(a, v, 0, 63, &n)) return 2;
            s.crf = (int)n;
        } else if (!strcmp(a, "--max-video-mb")) {
            if (vf_cli_double(a, v, 1e-6, 1e9, &x)) return 2;
            s.max_video_mb = x;
        } else if (!strcmp(a, "--max-data-mb")) {
            if (vf_cli_double(a, v, 1e-6, 1e9, &x)) return 2;
            s.max_data_mb = x;
        } else if (!strcmp(a, "--min-length")) {
            if (vf_cli_int(a, v, 1, 1000000, &n)) return 2;
            s.min_length = (int)n;
        } else if (!strcmp(a, "--max-length")) {
            if (vf_cli_int(a, v, 1, 1000000, &n)) return 2;
            s.max_length = (int)n;
        } else if (!strcmp(a, "--tasks")) {
            if (vf_cli_int(a, v, 1, 6, &n)) return 2;
            s.num_tasks = (int)n;
        } else if (!strcmp(a, "--state-dim")) {
            if (vf_cli_int(a, v, 1, 4096, &n)) return 2;
            s.state_dim = (int)n;
        } else if (!strcmp(a, "--seed")) {
            if (vf_cli_int(a, v, 0, (long long)1 << 62, &n)) return 2;
            s.seed = (unsigned long long)n;
        } else if (!strcmp(a, "--encoder-threads")) {
            if (vf_cli_int(a, v, 1, 64, &n)) return 2;
            s.encoder_threads = (int)n;
        } else {
            fprintf(stderr, "vlafeed make-sample: unknown option %s (see --help)\n", a);
            return 2;
        }
    }
    if (!out) {
        usage(stderr);
        return 2;
    }
    vf_cli_progress bar;
    vf_cli_progress_start(&bar, "make-sample", quiet);
    s.progress = on_progress;
    s.progress_ctx = &bar;
    int r = vf_make_sample(out, &s);
    vf_cli_progress_finish(&bar);
    if (r < 0)
        return vf_cli_fail("make-sample");
    if (!quiet)
        fprintf(stderr, "make-sample: wrote %d episodes x %d cameras (%s %dx%d @ %d fps) to %s\n", s.num_episodes,
                s.num_cameras, s.codec, s.width, s.height, s.fps, out);
    return 0;
}
