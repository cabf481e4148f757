/* cmd_frame.c: `vlafeed frame` (not implemented yet). */
#include <stdio.h>

#include "cli.h"

int vf_cmd_frame(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "vlafeed %s: not implemented yet\n", argv[0]);
    return 2;
}
