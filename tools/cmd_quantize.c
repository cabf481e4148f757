/*
 * cmd_quantize.c: `vlafeed quantize CHECKPOINT OUT ...` (block-wise FP8
 * post-training quantization) and `vlafeed rl ...` (asynchronous RL on Ray).
 * The work is PyTorch's and Ray's, so these commands run
 * `python3 -m vlafeed.quant` / `python3 -m vlafeed.rl` with the same arguments (exec, so its exit
 * status and signals are the Python program's). The interpreter is $VF_PYTHON
 * or python3 on PATH. The source tree's python/ folder is added to
 * PYTHONPATH only when it holds a built extension (make py-inplace), so a
 * build tree works without `pip install .` and a fresh clone after
 * `make demo` runs the installed package.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#ifndef VF_SOURCE_PYTHON_DIR
#define VF_SOURCE_PYTHON_DIR ""
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vlafeed quantize CHECKPOINT OUT [--fp8-block N | --per-tensor | --per-channel]\n"
            "                        [--skip PATTERN ...] [--no-default-skip] [--rest-dtype T]\n"
            "                        [--summary FILE] [-q]\n"
            "\n"
            "Post-training quantization of every linear weight of CHECKPOINT (a torch .pt\n"
            "state_dict, or a dict with it under 'model' as examples/train_policy.py writes,\n"
            "or .safetensors) to float8_e4m3fn with one float32 scale per NxN block\n"
            "(amax/448; edge blocks and all-zero blocks handled). A weight holding NaN or\n"
            "Inf is refused with the layer named. The vision encoder is kept in high\n"
            "precision by default (layers matching *vision*, visual, vit, image*, img*,\n"
            "siglip*, dino*).\n"
            "\n"
            "Writes OUT (safetensors: <layer>.weight as FP8 codes with <layer>.weight_scale\n"
            "beside it, every other tensor unchanged) and OUT.json (layers quantized and\n"
            "skipped, bytes before and after, max/mean relative error per layer).\n"
            "\n"
            "options:\n"
            "  --fp8-block N      block size, one scale per NxN block (default 128)\n"
            "  --per-tensor       baseline: one scale per weight matrix\n"
            "  --per-channel      baseline: one scale per output channel\n"
            "  --skip PATTERN     keep matching layers in high precision (glob on the layer\n"
            "                     path, its prefixes and its dotted components; repeatable);\n"
            "                     a pattern that matches nothing is warned about\n"
            "  --no-default-skip  quantize the vision encoder too\n"
            "  --rest-dtype T     keep (default), bfloat16, float16 or float32: dtype of the\n"
            "                     tensors left unquantized\n"
            "  --summary FILE     summary JSON path (default OUT.json)\n"
            "  -q, --quiet        print only warnings and errors\n"
            "  -h, --help         this help\n"
            "\n"
            "Runs `python3 -m vlafeed.quant` ($VF_PYTHON overrides the interpreter), which\n"
            "needs torch and safetensors (pip install 'vlafeed[quant]').\n"
            "Exit status: 0 ok, 1 bad input (file or layer named), 2 usage error.\n");
}

/* The source tree's package is used only where it holds a built extension (make py-inplace);
 * otherwise its python/ folder would shadow the installed package and fail to import. */
static int source_tree_is_built(void)
{
    if (!VF_SOURCE_PYTHON_DIR[0])
        return 0;
    glob_t found;
    int rc = glob(VF_SOURCE_PYTHON_DIR "/vlafeed/_native/_core*.so", 0, NULL, &found);
    int built = rc == 0 && found.gl_pathc > 0;
    globfree(&found);
    return built;
}

int vf_cli_exec_python(const char *cmd, const char *module, int argc, char **argv)
{
    const char *py = getenv("VF_PYTHON");
    if (!py || !*py)
        py = "python3";
    if (source_tree_is_built()) {
        const char *old = getenv("PYTHONPATH");
        size_t n = (old ? strlen(old) + 1 : 0) + sizeof VF_SOURCE_PYTHON_DIR;
        char *val = malloc(n);
        if (!val) {
            fprintf(stderr, "vlafeed %s: out of memory\n", cmd);
            return 1;
        }
        snprintf(val, n, "%s%s%s", old && *old ? old : "", old && *old ? ":" : "", VF_SOURCE_PYTHON_DIR);
        setenv("PYTHONPATH", val, 1);
        free(val);
    }
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) {
        fprintf(stderr, "vlafeed %s: out of memory\n", cmd);
        return 1;
    }
    args[0] = (char *)py;
    args[1] = "-m";
    args[2] = (char *)module;
    for (int i = 1; i < argc; i++)
        args[i + 2] = argv[i];
    args[argc + 2] = NULL;
    fflush(stdout);
    execvp(py, args);
    fprintf(stderr, "vlafeed %s: cannot run %s: %s (set VF_PYTHON to a Python with vlafeed and its "
                    "dependencies)\n",
            cmd, py, strerror(errno));
    free(args);
    return 1;
}

int vf_cmd_quantize(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (vf_cli_is(argv[i], "--help", "-h")) {
            usage(stdout);
            return 0;
        }
    }
    if (argc < 3) {
        usage(stderr);
        return 2;
    }
    return vf_cli_exec_python("quantize", "vlafeed.quant", argc, argv);
}

/* `vlafeed rl [options]`: python3 -m vlafeed.rl, whose argparse prints the help. */
int vf_cmd_rl(int argc, char **argv)
{
    return vf_cli_exec_python("rl", "vlafeed.rl", argc, argv);
}
