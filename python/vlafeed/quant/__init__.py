"""vlafeed.quant: block-wise FP8 post-training quantization of Linear weights.

    python3 -m vlafeed.quant CHECKPOINT OUT [--fp8-block 128] [--skip PATTERN ...]
    vlafeed quantize CHECKPOINT OUT --fp8-block 128          # the same, from the C command

Every 2-D weight of a linear layer outside the skipped modules is stored as
float8_e4m3fn codes plus float32 scales: one scale per block of the weight
(128x128 by default, `--per-tensor` / `--per-channel` for the baselines). A
block's scale is amax(|W_block|) / 448 (448 = largest finite e4m3fn value),
so the largest element of each block maps to +-448 and dequantizes exactly.
Edge blocks (shapes not a multiple of the block) take their scale from their
real elements only; an all-zero block gets scale 0 and zero codes (no
division by zero, dequantizes to exact zeros). A weight holding NaN or Inf is
refused with the layer named.

The output is one safetensors file: `<layer>.weight` (float8_e4m3fn codes)
with `<layer>.weight_scale` (float32, [ceil(out/br), ceil(in/bc)]) beside it;
every other tensor is copied unchanged. The header metadata records the
format, the block shape and the quantized layers. A JSON summary goes to
OUT with `.json` appended (or --summary): layers quantized and skipped (and
why), bytes before and after, and per layer the max and mean relative error
over its blocks (||W_b - Q(W_b)||_F / ||W_b||_F) and the whole-matrix relative
error.

Which tensors are linear weights: with a model (`quantize_model`), the
weights of nn.Linear modules and nn.MultiheadAttention's packed in_proj_weight.
From a bare checkpoint (the CLI), every 2-D floating `*.weight` /
`*in_proj_weight` tensor, except those whose name marks an embedding table
(a path component containing "embed", or wte/wpe); add `--skip` for other
non-linear 2-D weights.

Skip patterns: a pattern P skips layer path X (the key without `.weight`)
when fnmatch(X, P) or fnmatch(X, P + ".*") (a module and everything under
it) or some dotted component of X fnmatches P. The defaults skip a vision
encoder (components `*vision*`, `visual`, `vit`, `image*`, `img*`,
`siglip*`, `dino*`), as the recipe keeps the ViT in high precision;
`--no-default-skip` quantizes it too. A pattern given with --skip that
matches no weight is warned about (and listed in the summary).

Modules: ``blockfp8`` (the arithmetic), ``linear`` (FP8BlockLinear, the GEMM
path), ``layers`` (which tensors are linear weights, skip patterns),
``checkpoint`` (state dicts, the safetensors file, loading back), ``cli``.
"""
from vlafeed.quant.blockfp8 import (DEFAULT_SKIP, EMBEDDING_MARKERS, FORMAT, FP8_DTYPE, FP8_MAX, Block, QuantError,
                                    block_errors, block_shape, dequantize_weight, quantize_weight)
from vlafeed.quant.checkpoint import (Result, dequantized_state_dict, linear_keys_of_model, load_into,
                                      load_quantized, load_state_dict, quantize_model, quantize_state_dict,
                                      save_quantized)
from vlafeed.quant.cli import main, parse_args
from vlafeed.quant.layers import is_linear_weight_key, layer_path, linear_weight_keys_of, matching_pattern
from vlafeed.quant.linear import FP8BlockLinear, fp8_gpu_available

__all__ = ["QuantError", "FORMAT", "DEFAULT_SKIP", "Block", "block_shape", "quantize_weight", "dequantize_weight",
           "block_errors", "FP8BlockLinear", "fp8_gpu_available", "matching_pattern", "layer_path",
           "is_linear_weight_key", "linear_weight_keys_of", "Result", "load_state_dict", "quantize_state_dict",
           "save_quantized", "load_quantized", "dequantized_state_dict", "quantize_model", "linear_keys_of_model",
           "load_into", "main", "parse_args", "FP8_DTYPE", "FP8_MAX", "EMBEDDING_MARKERS"]
