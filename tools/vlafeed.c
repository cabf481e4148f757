/* vlafeed.c: the `vlafeed` command (placeholder until the subcommands land). */
#include <stdio.h>
#include <string.h>

#include "vlafeed/vlafeed.h"

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--version")) {
        printf("vlafeed %s\n", vf_version());
        return 0;
    }
    fprintf(stderr, "usage: vlafeed --version\n");
    return 2;
}
