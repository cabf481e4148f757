"""Block-wise FP8 post-training quantization of Linear weights.

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
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
FORMAT = "vlafeed-fp8"
DEFAULT_SKIP = ("*vision*", "visual", "vit", "image*", "img*", "siglip*", "dino*")
EMBEDDING_MARKERS = ("*embed*", "wte", "wpe")

Block = Union[int, Tuple[int, int], str]


class QuantError(ValueError):
    """Bad input to the quantizer: the message names the layer or file."""


# ---------------------------------------------------------------------------
# the arithmetic

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


# ---------------------------------------------------------------------------
# the module

def fp8_gpu_available() -> Tuple[bool, str]:
    """(True, "") when torch._scaled_mm can run FP8 here, else (False, why not)."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return False, f"GPU compute capability {major}.{minor} < 8.9 has no FP8 tensor cores"
    if not hasattr(torch, "_scaled_mm"):
        return False, "this torch has no torch._scaled_mm"
    return True, ""


class FP8BlockLinear(nn.Module):
    """A drop-in nn.Linear whose weight is held as FP8 codes with block scales.

    On CPU (and on GPUs without FP8) the weight is dequantized block by block
    into the input's dtype and F.linear runs. On a CUDA device with FP8
    (compute capability >= 8.9) the product runs through torch._scaled_mm:
    each 128-column slab of the weight is one _scaled_mm call with a per-row
    (row-block) weight scale and a per-token activation scale, the slabs'
    outputs summed in float32 -- block scales on the weight side, as the
    installed torch's _scaled_mm takes row-wise scales. `.weight` gives the
    dequantized weight, so code reading it (nn.MultiheadAttention's
    out_proj) keeps working."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, block: Block = 128,
                 device=None, bias_dtype=torch.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        br, bc = block_shape((out_features, in_features), block)
        self.block = (br, bc)
        R, C = -(-out_features // br), -(-in_features // bc)
        self.register_buffer("weight_codes", torch.zeros(out_features, in_features, dtype=FP8_DTYPE, device=device))
        self.register_buffer("weight_scale", torch.zeros(R, C, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=bias_dtype, device=device),
                                 requires_grad=False) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, block: Block = 128, name: str = "linear") -> "FP8BlockLinear":
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, block,
                device=linear.weight.device, bias_dtype=linear.weight.dtype)
        codes, scale = quantize_weight(linear.weight, m.block, name)
        m.weight_codes.copy_(codes)
        m.weight_scale.copy_(scale)
        if linear.bias is not None:
            m.bias.data.copy_(linear.bias.detach())
        return m

    def load_quantized(self, codes: torch.Tensor, scale: torch.Tensor, name: str = "linear") -> None:
        if tuple(codes.shape) != tuple(self.weight_codes.shape) or tuple(scale.shape) != tuple(self.weight_scale.shape):
            raise QuantError(f"layer '{name}': checkpoint codes {list(codes.shape)} / scales {list(scale.shape)} do "
                             f"not match the model's {list(self.weight_codes.shape)} / {list(self.weight_scale.shape)}")
        self.weight_codes.copy_(codes.to(FP8_DTYPE))
        self.weight_scale.copy_(scale.float())

    @property
    def weight(self) -> torch.Tensor:
        dtype = self.bias.dtype if self.bias is not None else torch.float32
        return dequantize_weight(self.weight_codes, self.weight_scale, self.block, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and fp8_gpu_available()[0]:
            return self._forward_scaled_mm(x)
        w = dequantize_weight(self.weight_codes, self.weight_scale, self.block, x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def _forward_scaled_mm(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - needs an FP8 GPU
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        br, bc = self.block
        out = torch.zeros(x2.shape[0], self.out_features, dtype=torch.float32, device=x.device)
        row_scale_all = self.weight_scale.repeat_interleave(br, 0)[: self.out_features]  # [out, C]
        for c in range(self.weight_scale.shape[1]):
            lo, hi = c * bc, min(self.in_features, (c + 1) * bc)
            xs = x2[:, lo:hi].float()
            pad = (-(hi - lo)) % 16  # _scaled_mm wants K a multiple of 16
            a_amax = xs.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
            a_scale = a_amax / FP8_MAX
            a = (xs / a_scale).to(FP8_DTYPE)
            b = self.weight_codes[:, lo:hi]
            if pad:
                a = F.pad(a.float(), (0, pad)).to(FP8_DTYPE)
                b = F.pad(b.float(), (0, pad)).to(FP8_DTYPE)
            ws = row_scale_all[:, c:c + 1].t().contiguous().float()  # [1, out]
            out += torch._scaled_mm(a, b.t(), scale_a=a_scale.float(), scale_b=ws, out_dtype=torch.float32)
        if self.bias is not None:
            out += self.bias.float()
        return out.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, block={self.block}")


# ---------------------------------------------------------------------------
# selecting layers

def _component_match(path: str, pattern: str) -> bool:
    return (fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern + ".*")
            or any(fnmatch.fnmatchcase(part, pattern) for part in path.split(".")))


def matching_pattern(path: str, patterns: Iterable[str]) -> Optional[str]:
    for p in patterns:
        if _component_match(path, p):
            return p
    return None


def layer_path(key: str) -> str:
    for suffix in (".weight", "_proj_weight"):
        if key.endswith(suffix):
            return key[: -len(".weight")] if suffix == ".weight" else key[: -len("_weight")]
    return key


def is_linear_weight_key(key: str, t: torch.Tensor) -> bool:
    """The bare-checkpoint rule (module docstring)."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point() or t.dtype == FP8_DTYPE:
        return False
    if not (key.endswith(".weight") or key.endswith("in_proj_weight")):
        return False
    return matching_pattern(layer_path(key), EMBEDDING_MARKERS) is None


def linear_weight_keys_of(model: nn.Module) -> list:
    """State-dict keys of the weights of nn.Linear modules and of nn.MultiheadAttention's in_proj."""
    keys = []
    for name, mod in model.named_modules():
        prefix = name + "." if name else ""
        if isinstance(mod, nn.Linear):
            keys.append(prefix + "weight")
        elif isinstance(mod, nn.MultiheadAttention) and mod.in_proj_weight is not None:
            keys.append(prefix + "in_proj_weight")
    return keys


# ---------------------------------------------------------------------------
# checkpoints

def load_state_dict(path: Union[str, os.PathLike]) -> dict:
    """A flat {name: tensor} from a safetensors file or a torch .pt checkpoint
    (a state_dict, or a dict holding one under 'model' / 'state_dict', as examples/train_policy.py writes)."""
    path = Path(path)
    if not path.is_file():
        raise QuantError(f"{path}: no such checkpoint file")
    with open(path, "rb") as f:
        head = f.read(8)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        try:
            return dict(load_file(str(path)))
        except Exception as e:  # safetensors raises its own error types
            raise QuantError(f"{path}: not a readable safetensors file ({e})") from None
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        kind = "zip" if head[:2] == b"PK" else "unknown"
        raise QuantError(f"{path}: not a torch checkpoint that loads with weights_only=True "
                         f"({kind} file; {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    sd = obj
    if isinstance(obj, dict):
        for k in ("model", "state_dict", "model_state_dict"):
            if k in obj and isinstance(obj[k], dict):
                sd = obj[k]
                break
    if not isinstance(sd, dict) or not sd:
        raise QuantError(f"{path}: holds no state_dict (expected a dict of tensors, or one under 'model')")
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise QuantError(f"{path}: state_dict entry '{bad[0]}' is a {type(sd[bad[0]]).__name__}, not a tensor")
    return {k: v.detach().cpu().contiguous() for k, v in sd.items()}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class Result:
    tensors: dict
    summary: dict
    warnings: list = field(default_factory=list)


def quantize_state_dict(sd: dict, block: Block = 128, skip: Sequence[str] = (), default_skip: bool = True,
                        linear_keys: Optional[Iterable[str]] = None, source: str = "",
                        rest_dtype: Optional[torch.dtype] = None) -> Result:
    """Quantize the linear weights of a state_dict. Returns the tensors to save (codes + scales + the
    rest unchanged, or cast to `rest_dtype` when floating) and the summary. `linear_keys` (from a model)
    overrides the bare-checkpoint rule."""
    skip = list(skip)
    patterns = skip + (list(DEFAULT_SKIP) if default_skip else [])
    if linear_keys is not None:
        linear_keys = set(linear_keys)
        missing = sorted(k for k in linear_keys if k not in sd)
        if missing:
            raise QuantError(f"{source or 'checkpoint'}: the model's linear weight '{missing[0]}' is not in the "
                             f"checkpoint ({len(missing)} missing); the checkpoint's layers do not match the model")
    out, layers, skipped = {}, {}, {}
    hits = {p: 0 for p in skip}
    before = after = 0
    for key, t in sd.items():
        before += _nbytes(t)
        is_lin = (key in linear_keys) if linear_keys is not None else is_linear_weight_key(key, t)
        if not is_lin:
            out[key] = _rest(t, rest_dtype)
            after += _nbytes(out[key])
            continue
        path = layer_path(key)
        p = matching_pattern(path, patterns)
        if p is not None:
            if p in hits:
                hits[p] += 1
            skipped[key] = {"pattern": p, "default": p not in skip, "shape": list(t.shape)}
            out[key] = _rest(t, rest_dtype)
            after += _nbytes(out[key])
            continue
        codes, scale = quantize_weight(t, block, key)
        br_bc = block_shape(t.shape, block)
        err = block_errors(t, dequantize_weight(codes, scale, br_bc), br_bc)
        out[key] = codes
        out[key + "_scale"] = scale
        after += _nbytes(codes) + _nbytes(scale)
        layers[key] = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                       "scale_shape": list(scale.shape), "block": list(br_bc), "bytes_before": _nbytes(t),
                       "bytes_after": _nbytes(codes) + _nbytes(scale), **err}
    warns = []
    for p, n in hits.items():
        if n == 0:
            msg = f"skip pattern '{p}' matches no linear weight in {source or 'the checkpoint'}"
            warns.append(msg)
            warnings.warn(msg, stacklevel=2)
    bf16_before = sum(_nbytes(t) // max(1, t.element_size()) * 2 if t.is_floating_point() else _nbytes(t)
                      for t in sd.values())
    mean_all = [v["mean_rel_error"] for v in layers.values()]
    summary = {
        "format": FORMAT, "source": source, "block": list(block_shape((1, 1), block)) if isinstance(block, (int, tuple))
        else block, "fp8_dtype": "float8_e4m3fn", "scale_rule": "amax/448 per block, float32",
        "layers_quantized": len(layers), "layers_skipped": len(skipped),
        "tensors_total": len(sd), "bytes_before": before, "bytes_after": after,
        "size_ratio": after / before if before else 1.0,
        "bytes_before_as_bf16": bf16_before, "size_ratio_vs_bf16": after / bf16_before if bf16_before else 1.0,
        "max_rel_error": max((v["max_rel_error"] for v in layers.values()), default=0.0),
        "mean_rel_error": sum(mean_all) / len(mean_all) if mean_all else 0.0,
        "rest_dtype": "keep" if rest_dtype is None else str(rest_dtype).replace("torch.", ""),
        "skip_patterns": skip, "default_skip": list(DEFAULT_SKIP) if default_skip else [],
        "unmatched_skip_patterns": [p for p, n in hits.items() if n == 0],
        "quantized": layers, "skipped": skipped,
    }
    return Result(out, summary, warns)


def _rest(t: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def save_quantized(result: Result, out_path: Union[str, os.PathLike], summary_path=None) -> Tuple[Path, Path]:
    from safetensors.torch import save_file
    out_path = Path(out_path)
    summary_path = Path(summary_path) if summary_path else out_path.with_name(out_path.name + ".json")
    meta = {"format": FORMAT, "block": json.dumps(result.summary["block"]),
            "quantized": json.dumps({k: v["block"] for k, v in sorted(result.summary["quantized"].items())})}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in result.tensors.items()}, str(tmp), metadata=meta)
    os.replace(tmp, out_path)
    result.summary["output"] = str(out_path)
    result.summary["output_file_bytes"] = out_path.stat().st_size
    summary_path.write_text(json.dumps(result.summary, indent=2) + "\n")
    return out_path, summary_path


def load_quantized(path: Union[str, os.PathLike]) -> Tuple[dict, dict, dict]:
    """(tensors, header metadata, {quantized weight name: (block rows, block cols)}) of a file
    save_quantized wrote."""
    from safetensors import safe_open
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise QuantError(f"{path}: not a readable safetensors file ({e})") from None
    if meta.get("format") != FORMAT:
        raise QuantError(f"{path}: not a vlafeed FP8 checkpoint (metadata format={meta.get('format')!r})")
    try:
        quantized = {k: (int(v[0]), int(v[1])) for k, v in json.loads(meta.get("quantized", "{}")).items()}
    except (ValueError, TypeError, IndexError, AttributeError):
        raise QuantError(f"{path}: metadata 'quantized' is not a {{name: [rows, cols]}} map") from None
    for k, blk in quantized.items():
        if k not in tensors or k + "_scale" not in tensors:
            raise QuantError(f"{path}: quantized weight '{k}' or its scale '{k}_scale' is missing")
        if tensors[k].dtype != FP8_DTYPE or tensors[k].dim() != 2:
            raise QuantError(f"{path}: quantized weight '{k}' is {tensors[k].dtype} {list(tensors[k].shape)}, "
                             f"not 2-D float8_e4m3fn")
        R, C = tensors[k + "_scale"].shape
        if (R, C) != (-(-tensors[k].shape[0] // blk[0]), -(-tensors[k].shape[1] // blk[1])):
            raise QuantError(f"{path}: scale '{k}_scale' {[R, C]} does not fit weight {list(tensors[k].shape)} "
                             f"with block {list(blk)}")
    return tensors, meta, quantized


def dequantized_state_dict(path, dtype=torch.float32) -> dict:
    """The checkpoint with every quantized weight dequantized (scales dropped): loads into the float model."""
    tensors, _, quantized = load_quantized(path)
    sd = {k: v for k, v in tensors.items() if not (k.endswith("_scale") and k[: -len("_scale")] in quantized)}
    for k, blk in quantized.items():
        sd[k] = dequantize_weight(tensors[k], tensors[k + "_scale"], blk, dtype)
    return sd


def quantize_model(model: nn.Module, block: Block = 128, skip: Sequence[str] = (), default_skip: bool = True,
                   inplace: bool = True) -> Tuple[nn.Module, dict]:
    """Replace the nn.Linear modules of `model` (outside the skipped ones) with FP8BlockLinear and round
    nn.MultiheadAttention's in_proj_weight through FP8 (its packed QKV matmul is not a module).
    Returns (model, summary)."""
    import copy
    if not inplace:
        model = copy.deepcopy(model)
    sd = model.state_dict()
    res = quantize_state_dict(sd, block, skip, default_skip, linear_keys_of_model(model), type(model).__name__)
    _install(model, res.tensors, {k: tuple(v["block"]) for k, v in res.summary["quantized"].items()}, "model")
    return model, res.summary


def linear_keys_of_model(model: nn.Module) -> list:
    return linear_weight_keys_of(model)


def _install(model: nn.Module, tensors: dict, quantized: dict, source: str) -> None:
    modules = dict(model.named_modules())
    for key in sorted(quantized):
        mod_name, _, attr = key.rpartition(".")
        mod = modules.get(mod_name) if mod_name else model
        if mod is None:
            raise QuantError(f"{source}: quantized weight '{key}' has no module '{mod_name}' in the model")
        codes, scale = tensors[key], tensors[key + "_scale"]
        if isinstance(mod, nn.Linear) and attr == "weight":
            q = FP8BlockLinear(mod.in_features, mod.out_features, mod.bias is not None,
                               quantized[key], device=mod.weight.device,
                               bias_dtype=mod.weight.dtype)
            q.load_quantized(codes, scale, key)
            if mod.bias is not None:
                q.bias.data.copy_(mod.bias.detach())
            parent_name, _, child = mod_name.rpartition(".")
            parent = modules[parent_name] if parent_name else model
            setattr(parent, child, q)
            modules[mod_name] = q
        else:  # a non-module matmul weight (MHA in_proj) or an unexpected kind: the FP8 values, dequantized
            param = getattr(mod, attr, None)
            if not isinstance(param, torch.Tensor) or tuple(param.shape) != tuple(codes.shape):
                raise QuantError(f"{source}: quantized weight '{key}' {list(codes.shape)} does not match the "
                                 f"model's {None if param is None else list(param.shape)}")
            with torch.no_grad():
                param.copy_(dequantize_weight(codes, scale, quantized[key], param.dtype))


def load_into(model: nn.Module, path) -> nn.Module:
    """Load a file written by save_quantized into a float model: its quantized nn.Linear modules become
    FP8BlockLinear, the rest loads as usual. Raises QuantError naming the keys when the layers differ."""
    tensors, _, quantized = load_quantized(path)
    rest = {k: v for k, v in tensors.items() if k not in quantized and not (k.endswith("_scale") and
                                                                           k[: -len("_scale")] in quantized)}
    expected = model.state_dict()
    missing = sorted(k for k in expected if k not in rest and k not in quantized)
    unexpected = sorted(k for k in list(rest) + list(quantized) if k not in expected)
    if missing or unexpected:
        raise QuantError(f"{path}: layers do not match the model: missing {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                         f"{' ...' if len(unexpected) > 5 else ''}")
    for k, v in rest.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise QuantError(f"{path}: tensor '{k}' has shape {list(v.shape)}, the model's is "
                             f"{list(expected[k].shape)}")
    model.load_state_dict(rest, strict=False)
    _install(model, tensors, quantized, str(path))
    return model


# ---------------------------------------------------------------------------
# command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="vlafeed quantize",
        description="Block-wise FP8 (float8_e4m3fn) post-training quantization of a checkpoint's linear weights.",
        epilog="Output: OUT (safetensors: <layer>.weight codes + <layer>.weight_scale float32 beside each quantized "
               "weight, every other tensor unchanged) and OUT.json (summary: layers quantized/skipped, bytes "
               "before/after, per-layer max/mean relative error). Default skips (vision encoder): "
               + ", ".join(DEFAULT_SKIP) + ". Exit status: 0 ok, 1 bad input (the file/layer is named), 2 usage.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="torch .pt (a state_dict, or a dict with it under 'model' as examples/train_policy.py "
                        "writes) or .safetensors")
    p.add_argument("out", metavar="OUT", help="output .safetensors file")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--fp8-block", type=int, default=128, metavar="N",
                   help="block size: one float32 scale per NxN block of each weight (default 128)")
    g.add_argument("--per-tensor", action="store_true", help="baseline: one scale per weight matrix")
    g.add_argument("--per-channel", action="store_true", help="baseline: one scale per output channel (row)")
    p.add_argument("--skip", action="append", default=[], metavar="PATTERN",
                   help="keep layers matching this glob in high precision (repeatable); matched against the layer "
                        "path, its prefixes and each dotted component. A pattern matching nothing is warned about")
    p.add_argument("--no-default-skip", action="store_true",
                   help="quantize the vision encoder too (the default skip list is not applied)")
    p.add_argument("--rest-dtype", choices=["keep", "bfloat16", "float16", "float32"], default="keep",
                   help="dtype of the tensors left unquantized (default: as in the checkpoint)")
    p.add_argument("--summary", default=None, metavar="FILE", help="summary JSON path (default OUT.json)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing but warnings and errors")
    args = p.parse_args(argv)
    if args.fp8_block < 1:
        p.error("--fp8-block must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    block: Block = "tensor" if args.per_tensor else "channel" if args.per_channel else args.fp8_block
    try:
        sd = load_state_dict(args.checkpoint)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = quantize_state_dict(sd, block, args.skip, not args.no_default_skip, source=args.checkpoint,
                                      rest_dtype=None if args.rest_dtype == "keep" else getattr(torch, args.rest_dtype))
        for w in res.warnings:
            print(f"vlafeed quantize: warning: {w}", file=sys.stderr)
        if not res.summary["layers_quantized"]:
            raise QuantError(f"{args.checkpoint}: no linear weight left to quantize "
                             f"({res.summary['layers_skipped']} skipped)")
        out, summ = save_quantized(res, args.out, args.summary)
    except QuantError as e:
        print(f"vlafeed quantize: {e}", file=sys.stderr)
        return 1
    s = res.summary
    if not args.quiet:
        print(f"quantized {s['layers_quantized']} linear weight(s), skipped {s['layers_skipped']}; "
              f"{s['bytes_before']} -> {s['bytes_after']} bytes ({100 * s['size_ratio']:.1f}%, "
              f"{100 * s['size_ratio_vs_bf16']:.1f}% of bf16); relative error max {s['max_rel_error']:.4f} "
              f"mean {s['mean_rel_error']:.4f}")
        print(f"wrote {out} and {summ}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
