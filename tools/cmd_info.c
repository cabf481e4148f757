/*
 * cmd_info.c: `vlafeed info PATH [--json] [--episodes LIST]`: describes a
 * LeRobot dataset and lists every problem found. Built only on the public
 * API (include/vlafeed/). The JSON document is the library's
 * vf_dataset_info_json() (shape: docs/info-json.md).
 *
 * Exit codes: 0 no problems of severity error, 1 errors found (or the
 * dataset cannot be opened), 2 usage error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vlafeed/dataset.h"
#include "vlafeed/vlafeed.h"

#define HUMAN_PROBLEMS 25

static void usage(FILE *out)
{
    fprintf(out,
            "usage: vlafeed info PATH [--json] [--compact] [--episodes LIST] [--no-data-check]\n"
            "                         [--no-file-checks | --check-files] [--no-meta-cache]\n"
            "\n"
            "Describes the LeRobot dataset (v3.0, v2.1 or v2.0) in the folder PATH: format,\n"
            "fps, totals, features, cameras, tasks, normalization statistics, and every\n"
            "problem found (inconsistent metadata, missing data or video files, data files\n"
            "whose footer disagrees with the metadata, NaN statistics).\n"
            "\n"
            "  --json             print the report as JSON (shape: docs/info-json.md)\n"
            "  --compact          with --json: one line instead of indented\n"
            "  --episodes LIST    select episodes, e.g. 1,2,4 or 0-9,12; files are checked\n"
            "                     for the selected episodes only (metadata for all)\n"
            "  --no-data-check    do not open the data Parquet footers (existence only)\n"
            "  --no-file-checks   do not check that data and video files exist\n"
            "  --check-files      check every file at open even above 10,000 files (by\n"
            "                     default larger datasets are checked when files are opened)\n"
            "  --no-meta-cache    decode meta/episodes from Parquet, neither reading nor\n"
            "                     writing the metadata cache (also: VF_META_CACHE=0)\n"
            "  -h, --help         this text\n"
            "\n"
            "exit status: 0 no errors (warnings allowed), 1 errors found or unreadable\n"
            "dataset, 2 usage error\n");
}


static const char *kind_name(vf_feature_kind k)
{
    static const char *const names[] = {"vector", "scalar", "string", "video", "image", "language"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

static void print_values(const vf_stat *s, size_t max)
{
    printf("[");
    for (size_t i = 0; i < s->size && i < max; i++)
        printf("%s%.4g", i ? ", " : "", s->values[i]);
    if (s->size > max)
        printf(", ... (%zu values)", s->size);
    printf("]");
}

static void print_human(const vf_dataset *d)
{
    printf("dataset    %s\n", vf_dataset_root(d));
    printf("format     %s   robot %s   fps %g\n", vf_dataset_format_version(d),
           vf_dataset_robot_type(d) ? vf_dataset_robot_type(d) : "(none)", vf_dataset_fps(d));
    printf("episodes   %lld (selected %zu)   frames %lld   tasks %lld   data files %zu\n",
           (long long)vf_dataset_total_episodes(d), vf_dataset_num_episodes(d), (long long)vf_dataset_total_frames(d),
           (long long)vf_dataset_total_tasks(d), vf_dataset_num_data_files(d));
    printf("features\n");
    for (size_t i = 0; i < vf_dataset_num_features(d); i++) {
        const vf_feature *f = vf_dataset_feature(d, i);
        char shape[128] = "";
        size_t len = 0;
        for (int k = 0; k < f->ndim && len < sizeof shape - 24; k++)
            len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%lld", k ? ", " : "", (long long)f->shape[k]);
        printf("  %-36s %-8s [%s] %s\n", f->name, f->dtype, shape, kind_name(f->kind));
    }
    if (vf_dataset_num_cameras(d)) {
        printf("cameras\n");
        for (size_t i = 0; i < vf_dataset_num_cameras(d); i++) {
            const vf_camera *c = vf_dataset_camera(d, i);
            printf("  %-36s %s %dx%d %s %g fps%s, %zu file%s\n", c->key, c->codec[0] ? c->codec : "?", c->width,
                   c->height, c->pix_fmt[0] ? c->pix_fmt : "?", c->fps, c->is_depth ? " depth" : "", c->num_files,
                   c->num_files == 1 ? "" : "s");
        }
    }
    size_t ntasks = vf_dataset_num_tasks(d);
    printf("tasks\n");
    for (size_t i = 0; i < ntasks && i < 10; i++)
        printf("  %zu: %s\n", i, vf_dataset_task(d, i));
    if (ntasks > 10)
        printf("  ... %zu more\n", ntasks - 10);
    if (vf_dataset_num_stats(d)) {
        printf("stats (mean / std, first values)\n");
        for (size_t i = 0; i < vf_dataset_num_features(d); i++) {
            const vf_feature *f = vf_dataset_feature(d, i);
            const vf_stat *mean = vf_dataset_find_stat(d, f->name, "mean");
            const vf_stat *std = vf_dataset_find_stat(d, f->name, "std");
            if (!mean || !std)
                continue;
            printf("  %-36s ", f->name);
            print_values(mean, 4);
            printf(" / ");
            print_values(std, 4);
            printf("\n");
        }
    }
    size_t np = vf_dataset_num_problems(d), ne = vf_dataset_num_errors(d);
    printf("problems   %zu error%s, %zu warning%s\n", ne, ne == 1 ? "" : "s", np - (ne < np ? ne : np),
           np - (ne < np ? ne : np) == 1 ? "" : "s");
    for (size_t i = 0; i < np && i < HUMAN_PROBLEMS; i++) {
        const vf_problem *p = vf_dataset_problem(d, i);
        printf("  %-7s %s", p->severity == VF_SEVERITY_ERROR ? "error" : "warning", p->file[0] ? p->file : "-");
        if (p->episode >= 0)
            printf(" [episode %lld]", (long long)p->episode);
        if (p->column[0])
            printf(" [%s]", p->column);
        printf(": %s\n", p->message);
    }
    if (np > HUMAN_PROBLEMS)
        printf("  ... %zu more (--json lists all)\n", np - HUMAN_PROBLEMS);
    size_t nfiles = vf_dataset_num_data_files(d);
    for (size_t i = 0; i < vf_dataset_num_cameras(d); i++)
        nfiles += vf_dataset_num_video_files(d, i);
    if (vf_dataset_file_checks(d) == VF_FILES_DEFERRED)
        printf("files      %zu data and video files not checked at open (more than %d: each is checked when "
               "first opened; --check-files checks them now)\n",
               nfiles, VF_LAZY_FILE_CHECKS);
    else if (vf_dataset_file_checks(d) == VF_FILES_NOT_CHECKED)
        printf("files      %zu data and video files not checked (--no-file-checks)\n", nfiles);
    vf_meta_cache_stats mc;
    vf_dataset_meta_cache_stats(d, &mc);
    if (mc.enabled)
        printf("metadata   %zu episodes file%s from the metadata cache, %zu decoded (%zu cache entr%s written, "
               "%s)\n",
               mc.hits, mc.hits == 1 ? "" : "s", mc.misses, mc.written, mc.written == 1 ? "y" : "ies", mc.dir);
    if (vf_dataset_num_missing_files(d))
        printf("missing    %zu file%s\n", vf_dataset_num_missing_files(d),
               vf_dataset_num_missing_files(d) == 1 ? "" : "s");
}

int vf_cmd_info(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0, compact = 0, data_check = 1, file_checks = VF_CHECK_FILES_AUTO, meta_cache = 1;
    int64_t *episodes = NULL;
    size_t num_episodes = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (vf_cli_is(a, "--help", "-h")) {
            usage(stdout);
            free(episodes);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--compact")) {
            compact = 1;
        } else if (!strcmp(a, "--no-data-check")) {
            data_check = 0;
        } else if (!strcmp(a, "--no-file-checks")) {
            file_checks = VF_CHECK_FILES_OFF;
        } else if (!strcmp(a, "--check-files")) {
            file_checks = VF_CHECK_FILES_ALL;
        } else if (!strcmp(a, "--no-meta-cache")) {
            meta_cache = 0;
        } else if (!strcmp(a, "--episodes") || !strncmp(a, "--episodes=", 11)) {
            const char *list = a[10] == '=' ? a + 11 : (i + 1 < argc ? argv[++i] : NULL);
            free(episodes);
            episodes = NULL;
            if (vf_cli_episode_list("--episodes", list, &episodes, &num_episodes) < 0)
                return 2;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "vlafeed info: unknown option '%s'\n\n", a);
            usage(stderr);
            free(episodes);
            return 2;
        } else if (!path) {
            path = a;
        } else {
            fprintf(stderr, "vlafeed info: more than one PATH given ('%s', '%s')\n", path, a);
            free(episodes);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        free(episodes);
        return 2;
    }
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    s.episodes = episodes;
    s.num_episodes = num_episodes;
    s.check_data_files = data_check;
    s.check_files = file_checks;
    s.meta_cache = meta_cache;
    vf_dataset *d;
    int r = vf_dataset_open(&d, path, &s);
    free(episodes);
    if (r < 0)
        return vf_cli_fail("info");
    int status = vf_dataset_num_errors(d) ? 1 : 0;
    if (json) {
        char *text;
        if (vf_dataset_info_json(d, compact ? 0 : VF_INFO_PRETTY, &text) < 0) {
            vf_dataset_close(d);
            return vf_cli_fail("info");
        }
        printf("%s\n", text);
        free(text);
    } else {
        print_human(d);
    }
    vf_dataset_close(d);
    return status;
}
