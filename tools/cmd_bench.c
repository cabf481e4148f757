/* cmd_bench.c: `vlafeed bench` (not implemented yet). */
#include <stdio.h>

#include "cli.h"

int vf_cmd_bench(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "vlafeed %s: not implemented yet\n", argv[0]);
    return 2;
}
