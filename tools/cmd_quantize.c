/*
 * cmd_quantize.c: `vlafeed quantize CHECKPOINT OUT ...` (block-wise FP8
 * post-training quantization), `vlafeed rl ...` (asynchronous RL on Ray) and `vlafeed eval ...`
 * (a policy in a simulator, vlafeed.rl.eval_main).
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
            "usage: vlafeed quantize HF_DIR OUT_DIR [--fp8-block N] [--skip PATTERN ...]\n"
            "                        [--only PATTERN ...] [--no-default-skip] [--skip-ragged]\n"
            "                        [--max-shard-size SIZE] [--rest-dtype T] [--overwrite]\n"
            "                        [--eval] [--eval-tokens FILE] [--summary FILE] [-q]\n"
            "       vlafeed quantize CHECKPOINT OUT [--fp8-block N | --per-tensor | --per-channel]\n"
            "                        [--skip PATTERN ...] [--only PATTERN ...] [--rest-dtype T] ...\n"
            "\n"
            "Post-training quantization of every linear weight to float8_e4m3fn with one\n"
            "float32 scale per NxN block (amax/448; edge blocks and all-zero blocks handled).\n"
            "A weight holding NaN or Inf is refused with the layer named.\n"
            "\n"
            "Folder mode (HF_DIR: a Hugging Face model folder with config.json and\n"
            "model.safetensors, its shards + model.safetensors.index.json, or\n"
            "pytorch_model.bin read with weights_only=True): OUT_DIR is written in the\n"
            "DeepSeek-V3 / transformers FineGrainedFP8 layout that vLLM, SGLang and\n"
            "transformers load: <module>.weight as FP8 codes, <module>.weight_scale_inv\n"
            "(float32, W = codes * scale_inv per block, ceil(out/N) x ceil(in/N) grid),\n"
            "config.json with quantization_config (quant_method fp8, weight_block_size,\n"
            "activation_scheme dynamic, modules_to_not_convert), shards and their index,\n"
            "the folder's other files (tokenizer, processor) copied, vlafeed_quant.json.\n"
            "Tensors are streamed: memory stays far below one shard.\n"
            "\n"
            "Single-file mode (CHECKPOINT: a torch .pt state_dict, or a dict with it under\n"
            "'model' as examples/train_policy.py writes, or .safetensors): OUT is one\n"
            "safetensors file with the same naming, and OUT.json (the summary). A file in\n"
            "vlafeed's old layout (scales under <layer>.weight_scale) is converted.\n"
            "\n"
            "Kept in high precision by default: the vision encoder (*vision*, visual,\n"
            "vit, image*, img*, siglip*, dino*), lm_head, *norm*; embeddings and tensors\n"
            "that are not 2-D weights are never quantized.\n"
            "\n"
            "options:\n"
            "  --fp8-block N      block size, one scale per NxN block (default 128)\n"
            "  --per-tensor       single-file baseline: one scale per weight matrix\n"
            "  --per-channel      single-file baseline: one scale per output channel\n"
            "  --skip PATTERN     keep matching layers in high precision (glob on the layer\n"
            "                     path, its prefixes and its dotted components; repeatable);\n"
            "                     a pattern that matches nothing is warned about\n"
            "  --only PATTERN     quantize only the matching layers (repeatable)\n"
            "  --no-default-skip  quantize the vision encoder, lm_head and norms too\n"
            "  --skip-ragged      keep layers whose shape is not a multiple of N in high\n"
            "                     precision (transformers' CPU loader misreads ragged blocks)\n"
            "  --max-shard-size SIZE  largest output shard (default 5GB; 500MB, 2GiB, ...)\n"
            "  --rest-dtype T     keep (default), bfloat16, float16 or float32: dtype of the\n"
            "                     tensors left unquantized\n"
            "  --eval             held-out loss and logit error of block vs per-tensor vs\n"
            "                     per-channel FP8 vs the original (needs transformers);\n"
            "                     writes OUT_DIR/eval.json and a README.md table\n"
            "  --eval-tokens FILE token ids for --eval (.npy or .txt of integers; default a\n"
            "                     built-in paragraph); --eval-seq-len N, --eval-max-tokens N,\n"
            "                     --eval-dtype float32|bfloat16\n"
            "  --overwrite        replace a non-empty OUT_DIR\n"
            "  --summary FILE     summary JSON path (single-file default OUT.json)\n"
            "  -q, --quiet        print only warnings and errors\n"
            "  -h, --help         this help\n"
            "\n"
            "Runs `python3 -m vlafeed.quant` ($VF_PYTHON overrides the interpreter), which\n"
            "needs torch and safetensors (pip install 'vlafeed[quant]'; --eval also\n"
            "transformers and accelerate).\n"
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

/* `vlafeed eval CHECKPOINT --env NAME [options]`: python3 -m vlafeed.rl.eval_main, whose argparse
 * prints the help. VF_PYTHON picks the interpreter (LeRobot policies need LeRobot's Python 3.12). */
int vf_cmd_eval(int argc, char **argv)
{
    return vf_cli_exec_python("eval", "vlafeed.rl.eval_main", argc, argv);
}
