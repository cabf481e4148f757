"""vlafeed.quant: block-wise FP8 post-training quantization of linear weights, written in the
DeepSeek-V3 / Hugging Face block-FP8 format that vLLM, SGLang, TensorRT-LLM and transformers load.

    vlafeed quantize HF_DIR OUT_DIR [--fp8-block 128] [--skip P] [--only P] [--max-shard-size 5GB] [--eval]
    vlafeed quantize CHECKPOINT.pt OUT.safetensors [--per-tensor | --per-channel]   # single-file mode
    python3 -m vlafeed.quant ...                                                     # the same

Every 2-D weight of a linear layer outside the skipped modules is stored as float8_e4m3fn codes
plus float32 scales, one per 128x128 block by default. A block's scale is amax(|W_block|) / 448
(448 = largest finite e4m3fn value), so the largest element of each block maps to +-448 and
dequantizes exactly; the scale is stored as `<weight>_scale_inv` (for `x.weight`:
`x.weight_scale_inv`) and is the multiplier that dequantizes: W ~= codes * scale_inv, spread
over the block, on a ceil(out/128) x ceil(in/128) grid. Edge blocks of a ragged shape take their
scale from their real elements only; an all-zero block gets scale 0 and zero codes (no division by
zero, dequantizes to exact zeros). A weight holding NaN or Inf is refused with the layer named.

Folder mode (a Hugging Face model folder in, ``hf``): shards, the index, `config.json` with
`quantization_config` (`quant_method` "fp8", `weight_block_size`, `activation_scheme` "dynamic",
`modules_to_not_convert`), the other files copied, a summary `vlafeed_quant.json`; tensors are
streamed, so memory stays far below one shard. `--eval` (``evaluate``) adds eval.json and a
README.md table: loss and logit error of block FP8, per-tensor FP8, per-channel FP8 and the
original. Single-file mode (``checkpoint``): a .pt / .safetensors state dict in, one safetensors
file plus OUT.json out, same tensor naming. Files in vlafeed's old private layout (header format
"vlafeed-fp8", scales under `<weight>_scale`) are converted, on load or by giving one as input.

Which tensors are linear weights: with a model (`quantize_model`), the weights of nn.Linear
modules and nn.MultiheadAttention's packed in_proj_weight. From a checkpoint, every 2-D floating
`*.weight` / `*in_proj_weight` tensor, except those whose name marks an embedding table (a path
component containing "embed", or wte/wpe); add `--skip` for other non-linear 2-D weights.

Skip patterns: a pattern P skips layer path X (the key without `.weight`) when fnmatch(X, P) or
fnmatch(X, P + ".*") (a module and everything under it) or some dotted component of X fnmatches
P. The defaults keep in high precision a vision encoder (components `*vision*`, `visual`, `vit`,
`image*`, `img*`, `siglip*`, `dino*`), the LM head (`lm_head`) and anything named `*norm*`;
`--no-default-skip` quantizes them too. `--only P` quantizes only the layers matching P. A pattern
that matches no weight is warned about (and listed in the summary).

Modules: ``blockfp8`` (the arithmetic), ``linear`` (FP8BlockLinear and its GEMM paths),
``layers`` (which tensors are linear weights, skip patterns), ``checkpoint`` (state dicts, the
single file, loading back), ``hf`` (model folders), ``evaluate`` (--eval), ``cli``.
"""
from vlafeed.quant.blockfp8 import (DEFAULT_SKIP, EMBEDDING_MARKERS, FORMAT, FP8_DTYPE, FP8_MAX, LEGACY_FORMAT,
                                    SCALE_SUFFIX, VISION_SKIP, Block, QuantError, block_errors, block_shape,
                                    dequantize_weight, quantize_weight)
from vlafeed.quant.checkpoint import (LegacyLayoutWarning, Result, convert_legacy, dequantized_state_dict,
                                      linear_keys_of_model, load_into, load_quantized, load_state_dict,
                                      quantize_model, quantize_state_dict, save_quantized)
from vlafeed.quant.cli import main, parse_args
from vlafeed.quant.hf import parse_size, quantize_folder, read_quantized_folder
from vlafeed.quant.layers import (decide, is_linear_weight, is_linear_weight_key, layer_path, linear_weight_keys_of,
                                  matching_pattern, scale_key)
from vlafeed.quant.linear import FP8BlockLinear, fp8_gpu_available, gemm_path, gpu_self_check, select_gemm_path

__all__ = ["QuantError", "FORMAT", "LEGACY_FORMAT", "SCALE_SUFFIX", "DEFAULT_SKIP", "VISION_SKIP", "Block",
           "block_shape", "quantize_weight", "dequantize_weight", "block_errors", "FP8BlockLinear",
           "fp8_gpu_available", "gemm_path", "select_gemm_path", "gpu_self_check", "matching_pattern", "layer_path",
           "scale_key", "decide", "is_linear_weight", "is_linear_weight_key", "linear_weight_keys_of", "Result",
           "load_state_dict", "quantize_state_dict", "save_quantized", "load_quantized", "convert_legacy",
           "LegacyLayoutWarning", "dequantized_state_dict", "quantize_model", "linear_keys_of_model", "load_into",
           "quantize_folder", "read_quantized_folder", "parse_size", "main", "parse_args", "FP8_DTYPE", "FP8_MAX",
           "EMBEDDING_MARKERS"]
