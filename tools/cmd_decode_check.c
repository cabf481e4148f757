/* cmd_decode_check.c: `vlafeed decode-check` (not implemented yet). */
#include <stdio.h>

#include "cli.h"

int vf_cmd_decode_check(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "vlafeed %s: not implemented yet\n", argv[0]);
    return 2;
}
