/*
 * cli_util.c: helpers shared by the subcommands: progress bar and option
 * value parsing with messages that name the option.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void vf_cli_progress_start(vf_cli_progress *p, const char *label, int quiet)
{
    p->label = label;
    p->quiet = quiet;
    p->last_percent = -1;
    p->started = now();
}

void vf_cli_progress_update(vf_cli_progress *p, long long done, long long total, const char *what)
{
    if (p->quiet || total <= 0)
        return;
    int percent = (int)(100 * done / total);
    int tty = isatty(2);
    if (!tty && percent / 10 == p->last_percent / 10 && done != total)
        return;
    if (tty && percent == p->last_percent && done != total)
        return;
    p->last_percent = percent;
    const int width = 30;
    int filled = (int)(width * done / total);
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    double elapsed = now() - p->started;
    double eta = done > 0 ? elapsed * (double)(total - done) / (double)done : 0;
    fprintf(stderr, "%s%s [%s] %3d%% %lld/%lld %.0fs elapsed, ~%.0fs left %-24.24s%s", tty ? "\r" : "", p->label,
            bar, percent, done, total, elapsed, eta, what ? what : "", tty ? "" : "\n");
    fflush(stderr);
}

void vf_cli_progress_cb(void *ctx, int64_t done, int64_t total, const char *what)
{
    vf_cli_progress_update(ctx, done, total, what);
}

void vf_cli_progress_finish(vf_cli_progress *p)
{
    if (!p->quiet && isatty(2))
        fprintf(stderr, "\n");
}

int vf_cli_int(const char *option, const char *value, long long min, long long max, long long *out)
{
    char *end = NULL;
    errno = 0;
    long long v = value ? strtoll(value, &end, 10) : 0;
    if (!value || !*value || *end || errno || v < min || v > max) {
        fprintf(stderr, "vlafeed: %s needs an integer in %lld..%lld (got '%s')\n", option, min, max,
                value ? value : "");
        return -1;
    }
    *out = v;
    return 0;
}

int vf_cli_double(const char *option, const char *value, double min, double max, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = value ? strtod(value, &end) : 0;
    if (!value || !*value || *end || errno || !(v >= min && v <= max)) {
        fprintf(stderr, "vlafeed: %s needs a number in %g..%g (got '%s')\n", option, min, max, value ? value : "");
        return -1;
    }
    *out = v;
    return 0;
}

int vf_cli_size(const char *option, const char *value, int *width, int *height)
{
    int w = 0, h = 0;
    char extra;
    if (!value || sscanf(value, "%dx%d%c", &w, &h, &extra) != 2 || w <= 0 || h <= 0) {
        fprintf(stderr, "vlafeed: %s needs WIDTHxHEIGHT, e.g. 640x480 (got '%s')\n", option, value ? value : "");
        return -1;
    }
    *width = w;
    *height = h;
    return 0;
}

int vf_cli_episode_list(const char *option, const char *value, int64_t **episodes, size_t *count)
{
    size_t n = 0, cap = 16;
    int64_t *v = value ? malloc(cap * sizeof *v) : NULL;
    const char *p = value;
    while (v && *p) {
        char *end;
        errno = 0;
        long long a = strtoll(p, &end, 10);
        if (end == p || errno || a < 0)
            goto bad;
        long long b = a;
        p = end;
        if (*p == '-') {
            const char *q = p + 1;
            b = strtoll(q, &end, 10);
            if (end == q || errno || b < a || b - a > 10000000)
                goto bad;
            p = end;
        }
        for (long long e = a; e <= b; e++) {
            if (n == cap) {
                int64_t *grown = realloc(v, (cap *= 2) * sizeof *grown);
                if (!grown)
                    goto bad;
                v = grown;
            }
            v[n++] = e;
        }
        if (*p == ',')
            p++;
        else if (*p)
            goto bad;
    }
    if (!v || n == 0)
        goto bad;
    *episodes = v;
    *count = n;
    return 0;
bad:
    free(v);
    fprintf(stderr, "vlafeed: %s needs a list of episode indices such as 1,2,4 or 0-9,12 (got '%s')\n", option,
            value ? value : "");
    return -1;
}
