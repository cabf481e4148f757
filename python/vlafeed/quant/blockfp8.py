"""Block-wise FP8 arithmetic: a weight's e4m3 codes and per-block scales, back, and the error."""
from __future__ import annotations

from typing import Sequence, Tuple, Union

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
# Header metadata of vlafeed's single-file output. LEGACY_FORMAT marks the files written before the
# standard naming (scales under `<layer>.weight_scale`); they are converted on load, never read as codes.
FORMAT = "vlafeed-fp8-v2"
LEGACY_FORMAT = "vlafeed-fp8"
# Suffix of a quantized weight's scale tensor: `<layer>.weight` -> `<layer>.weight_scale_inv` (the
# DeepSeek-V3 / Hugging Face FineGrainedFP8 name; the value multiplies the codes: W ~= codes * scale_inv).
SCALE_SUFFIX = "_scale_inv"
LEGACY_SCALE_SUFFIX = "_scale"
VISION_SKIP = ("*vision*", "visual", "vit", "image*", "img*", "siglip*", "dino*")
# Kept in high precision unless --no-default-skip: the vision encoder, the LM head (serving stacks keep
# it in bf16; it carries most of the logit error when quantized) and anything named like a norm.
DEFAULT_SKIP = VISION_SKIP + ("lm_head", "*norm*")
EMBEDDING_MARKERS = ("*embed*", "wte", "wpe")

Block = Union[int, Tuple[int, int], str]


class QuantError(ValueError):
    """Bad input to the quantizer: the message names the layer or file."""


def block_shape(shape: Sequence[int], block: Block) -> Tuple[int, int]:
    """(rows, cols) of one scale block for a weight of `shape`:
    an int B -> (B, B); "tensor" -> the whole matrix; "channel" -> one output row."""
    out_f, in_f = int(shape[0]), int(shape[1])
    if block == "tensor":
        return max(1, out_f), max(1, in_f)
    if block == "channel":
        return 1, max(1, in_f)
    if isinstance(block, int):
        br = bc = block
    else:
        br, bc = block
    if br < 1 or bc < 1:
        raise QuantError(f"block size must be >= 1, got {block!r}")
    return int(br), int(bc)


def _check_finite(w: torch.Tensor, name: str) -> None:
    bad = ~torch.isfinite(w)
    if bool(bad.any()):
        n = int(bad.sum())
        first = tuple(int(i) for i in bad.nonzero()[0])
        kinds = []
        if bool(torch.isnan(w).any()):
            kinds.append("NaN")
        if bool(torch.isinf(w).any()):
            kinds.append("Inf")
        raise QuantError(f"layer '{name}': weight holds {n} non-finite value(s) ({'/'.join(kinds)}), "
                         f"first at {list(first)}; refusing to quantize it")


def _blocked(w: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    """[out, in] -> zero-padded [R, br, C, bc] view of the blocks."""
    out_f, in_f = w.shape
    R, C = -(-out_f // br), -(-in_f // bc)
    pad = F.pad(w, (0, C * bc - in_f, 0, R * br - out_f))
    return pad.reshape(R, br, C, bc)


def _expand(scale: torch.Tensor, shape: Sequence[int], br: int, bc: int) -> torch.Tensor:
    out_f, in_f = int(shape[0]), int(shape[1])
    return scale.repeat_interleave(br, 0)[:out_f].repeat_interleave(bc, 1)[:, :in_f]


def quantize_weight(w: torch.Tensor, block: Block = 128, name: str = "weight"):
    """FP8 codes and float32 scales of a 2-D weight.

    Returns (codes: float8_e4m3fn [out, in], scale: float32 [ceil(out/br), ceil(in/bc)]),
    with W ~= codes * scale expanded over each block."""
    if w.dim() != 2:
        raise QuantError(f"layer '{name}': expected a 2-D weight, got shape {list(w.shape)}")
    if not w.is_floating_point():
        raise QuantError(f"layer '{name}': weight dtype {w.dtype} is not floating point")
    w32 = w.detach().to(torch.float32)
    _check_finite(w32, name)
    br, bc = block_shape(w32.shape, block)
    amax = _blocked(w32, br, bc).abs().amax(dim=(1, 3))  # [R, C]
    scale = amax / FP8_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    scaled = w32 / _expand(safe, w32.shape, br, bc)
    codes = scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes, scale.to(torch.float32)


def dequantize_weight(codes: torch.Tensor, scale: torch.Tensor, block: Block = 128,
                      dtype=torch.float32) -> torch.Tensor:
    """codes * scale, each scale spread over its block of `block` (as given to quantize_weight)."""
    br, bc = block_shape(codes.shape, block)
    R, C = scale.shape
    if (R, C) != (-(-codes.shape[0] // br), -(-codes.shape[1] // bc)):
        raise QuantError(f"scales {list(scale.shape)} do not fit codes {list(codes.shape)} with block {(br, bc)}")
    return (codes.to(torch.float32) * _expand(scale.to(torch.float32), codes.shape, br, bc)).to(dtype)


def block_errors(w: torch.Tensor, dq: torch.Tensor, block: Block = 128) -> dict:
    """Relative errors of a dequantized weight: per block ||dW_b||/||W_b|| (zero blocks count as 0),
    their max and mean, and the whole matrix's ||dW||/||W||."""
    w32, dq32 = w.detach().float(), dq.detach().float()
    br, bc = block_shape(w32.shape, block)
    num = _blocked(w32 - dq32, br, bc).pow(2).sum(dim=(1, 3)).sqrt()
    den = _blocked(w32, br, bc).pow(2).sum(dim=(1, 3)).sqrt()
    rel = torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den))
    total = float(w32.norm())
    return {"max_rel_error": float(rel.max()), "mean_rel_error": float(rel.mean()),
            "matrix_rel_error": float((w32 - dq32).norm()) / total if total > 0 else 0.0}
