/*
 * vlafeed.c: the `vlafeed` command: dispatch to the subcommands in
 * tools/cmd_*.c. Built only on include/vlafeed/ and tools/cli.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli.h"
#include "vlafeed/vlafeed.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"info", vf_cmd_info, "describe a LeRobot dataset and list every problem found (--json)"},
    {"make-sample", vf_cmd_make_sample, "write a synthetic LeRobot v3.0 dataset with frame-identity pixels"},
    {"frame", vf_cmd_frame, "decode one frame of one camera to a PNG or PPM file"},
    {"decode-check", vf_cmd_decode_check, "decode every frame of every video and report counts, GOPs, drift"},
    {"plan", vf_cmd_plan, "show tasks and video opens of each partition strategy (--json)"},
    {"bench", vf_cmd_bench, "measure data-loading throughput against the decode limit"},
    {"parquet", vf_cmd_parquet, "inspect a Parquet file: schema, row groups, values (--json)"},
    {"quantize", vf_cmd_quantize, "block-wise FP8 post-training quantization of a checkpoint (python3)"},
    {"convert", vf_cmd_convert, "convert a LeRobot dataset to WebDataset shards (--to wds), or v2.x to v3.0 and/or re-encode its videos (--to lerobot-v3 [--codec h264|hevc|av1])"},
    {"rl", vf_cmd_rl, "asynchronous RL on Ray actors: rollout workers, policy server, learner (python3)"},
    {"eval", vf_cmd_eval, "run a policy checkpoint in a simulator: success rate, return, MP4 (python3)"},
};

static void usage(FILE *out)
{
    fprintf(out, "vlafeed %s: stream LeRobot datasets into training from a C engine\n\n", vf_version());
    fprintf(out, "usage: vlafeed <command> [options]   (vlafeed <command> --help for details)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-13s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n  --version     print the version\n");
}

int vf_cli_fail(const char *cmd)
{
    fprintf(stderr, "vlafeed %s: %s\n", cmd, vf_last_error());
    return 1;
}

int vf_cli_is(const char *arg, const char *name, const char *alias)
{
    return (name && !strcmp(arg, name)) || (alias && !strcmp(arg, alias));
}

int main(int argc, char **argv)
{
    if (argc < 2 || vf_cli_is(argv[1], "--help", "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("vlafeed %s\n", vf_version());
        return 0;
    }
    /* The codec libraries are chatty (one line per decoder opened): they
     * print errors only unless VF_LOG asks for info or debug. vlafeed's own
     * warnings (a feature left out, frames not of info.json's size, ...)
     * are printed, once each; VF_LOG=error silences them. */
    const char *env = getenv("VF_LOG");
    int level = env && (!strcmp(env, "info") || !strcmp(env, "2"))    ? 2
                : env && (!strcmp(env, "debug") || !strcmp(env, "3")) ? 3
                : env && (!strcmp(env, "error") || !strcmp(env, "0")) ? 0
                                                                       : 1;
    vf_set_log_level(level >= 2 ? level : 0);
    vf_log_set_level(level);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "vlafeed: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
