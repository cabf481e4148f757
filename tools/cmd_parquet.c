/* cmd_parquet.c: `vlafeed parquet` (not implemented yet). */
#include <stdio.h>

#include "cli.h"

int vf_cmd_parquet(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "vlafeed %s: not implemented yet\n", argv[0]);
    return 2;
}
