/*
 * cmd_convert.c: `vlafeed convert SRC OUT --to wds|lerobot-v3`: picks the
 * target named by --to and hands the whole argv to it. Each target lives in
 * its own file (cmd_convert_wds.c, cmd_convert_v3.c) with its own --help.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vlafeed convert SRC OUT --to wds|lerobot-v3 [options]\n"
            "\n"
            "  --to wds          LeRobot v3.0 or v2.1 dataset (local or URL) -> WebDataset shards\n"
            "                    in VLA Foundry's robotics layout (vlafeed convert --to wds --help)\n"
            "  --to lerobot-v3   LeRobot v2.1 dataset -> LeRobot v3.0 dataset\n"
            "                    (vlafeed convert --to lerobot-v3 --help)\n");
}

int vf_cmd_convert(int argc, char **argv)
{
    const char *to = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--to") && i + 1 < argc)
            to = argv[i + 1];
        else if (!strncmp(argv[i], "--to=", 5))
            to = argv[i] + 5;
    }
    if (!to) {
        int help = 0;
        for (int i = 1; i < argc; i++)
            help |= vf_cli_is(argv[i], "--help", "-h");
        usage(help ? stdout : stderr);
        if (!help)
            fprintf(stderr, "vlafeed convert: --to is required\n");
        return help ? 0 : 2;
    }
    if (!strcmp(to, "wds"))
        return vf_cmd_convert_wds(argc, argv);
    if (!strcmp(to, "lerobot-v3"))
        return vf_cmd_convert_v3(argc, argv);
    fprintf(stderr, "vlafeed convert: unknown --to '%s' (wds or lerobot-v3)\n", to);
    return 2;
}
