/* cmd_convert_wds.c: placeholder until the converter lands (being built on its own branch). */
#include <stdio.h>

#include "cli.h"

int vf_cmd_convert_wds(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "vlafeed convert: this target is not built yet\n");
    return 1;
}
