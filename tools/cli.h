/*
 * cli.h: shared pieces of the `vlafeed` command. Each subcommand lives in
 * its own tools/cmd_<name>.c and is built only on the public API
 * (include/vlafeed/) plus these helpers.
 */
#ifndef VF_CLI_H
#define VF_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Subcommand entry points: argv[0] is the subcommand name. Return the
 * process exit code (0 ok, 1 failure/problems found, 2 usage error). */
int vf_cmd_info(int argc, char **argv);
int vf_cmd_make_sample(int argc, char **argv);
int vf_cmd_frame(int argc, char **argv);
int vf_cmd_decode_check(int argc, char **argv);
int vf_cmd_plan(int argc, char **argv);
int vf_cmd_bench(int argc, char **argv);
int vf_cmd_bench_wds(int argc, char **argv); /* `vlafeed bench --source wds` (cmd_bench_wds.c) */
int vf_cmd_parquet(int argc, char **argv);
int vf_cmd_quantize(int argc, char **argv);
int vf_cmd_rl(int argc, char **argv);
int vf_cmd_eval(int argc, char **argv);
int vf_cmd_convert(int argc, char **argv);
/* The two targets of `vlafeed convert`, dispatched on --to by cmd_convert.c:
 * argv is the whole `convert` argv (with --to and its value still in it). */
int vf_cmd_convert_wds(int argc, char **argv);
int vf_cmd_convert_v3(int argc, char **argv);

/* Runs `$VF_PYTHON (or python3) -m MODULE argv[1..]` by exec, with the source
 * tree's python/ folder appended to PYTHONPATH; returns 1 only if exec fails. */
int vf_cli_exec_python(const char *cmd, const char *module, int argc, char **argv);

/* Prints "vlafeed <cmd>: <vf_last_error()>" to stderr and returns 1. */
int vf_cli_fail(const char *cmd);
/* 1 when arg equals one of the NULL-terminated alternatives. */
int vf_cli_is(const char *arg, const char *name, const char *alias);

/* A one-line progress bar on stderr, redrawn in place when stderr is a
 * terminal (plain lines every ~10% otherwise). Silent when quiet is set. */
typedef struct vf_cli_progress {
    const char *label;
    int quiet;
    int last_percent;
    double started;
} vf_cli_progress;
void vf_cli_progress_start(vf_cli_progress *p, const char *label, int quiet);
void vf_cli_progress_update(vf_cli_progress *p, long long done, long long total, const char *what);
void vf_cli_progress_finish(vf_cli_progress *p);
/* vf_cli_progress_update as an engine progress callback (ctx: the bar). */
void vf_cli_progress_cb(void *ctx, int64_t done, int64_t total, const char *what);

/* Parses an integer / double / "WxH" option value; prints a usage error
 * naming the option and returns -1 on failure. */
int vf_cli_int(const char *option, const char *value, long long min, long long max, long long *out);
int vf_cli_double(const char *option, const char *value, double min, double max, double *out);
int vf_cli_size(const char *option, const char *value, int *width, int *height);
/* Parses an episode list such as "1,2,4" or "0-9,12" into a newly allocated
 * array (free()); prints a usage error naming the option on failure. */
int vf_cli_episode_list(const char *option, const char *value, int64_t **episodes, size_t *count);

#endif
