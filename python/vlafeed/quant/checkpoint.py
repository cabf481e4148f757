"""Checkpoints: reading a state dict, quantizing it or a model, the safetensors file and its summary, loading back."""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from vlafeed.quant.blockfp8 import (DEFAULT_SKIP, FORMAT, FP8_DTYPE, LEGACY_FORMAT, LEGACY_SCALE_SUFFIX, Block,
                                    QuantError, block_errors, block_shape, dequantize_weight, quantize_weight)
from vlafeed.quant.linear import FP8BlockLinear
from vlafeed.quant.layers import decide, is_linear_weight_key, layer_path, linear_weight_keys_of, matching_pattern, \
    scale_key


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
        raise not_a_checkpoint(path, e, "zip" if head[:2] == b"PK" else "unknown") from None
    sd = state_dict_in(obj, path)
    return {k: v.detach().cpu().contiguous() for k, v in sd.items()}


def not_a_checkpoint(path, error: Exception, kind: Optional[str] = None) -> QuantError:
    """The QuantError for a file torch.load(weights_only=True) refused, naming it and why."""
    first = str(error).splitlines()[0] if str(error) else ""
    what = f"{kind} file; " if kind else ""
    return QuantError(f"{path}: not a torch checkpoint that loads with weights_only=True "
                      f"({what}{type(error).__name__}: {first})")


def state_dict_in(obj, path) -> dict:
    """The tensors of a loaded torch checkpoint: the object itself, or the dict under 'model',
    'state_dict' or 'model_state_dict'. QuantError naming `path` when there is none, or when an entry
    is not a tensor."""
    sd = obj
    if isinstance(obj, dict):
        for k in ("model", "state_dict", "model_state_dict"):
            if k in obj and isinstance(obj[k], dict):
                sd = obj[k]
                break
    if not isinstance(sd, dict) or not sd:
        raise QuantError(f"{path}: holds no state_dict (expected a dict of tensors, or one under 'model')")
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise QuantError(f"{path}: state_dict entry '{k}' is a {type(v).__name__}, not a tensor")
    return sd


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class Result:
    tensors: dict
    summary: dict
    warnings: list = field(default_factory=list)


def quantize_state_dict(sd: dict, block: Block = 128, skip: Sequence[str] = (), default_skip: bool = True,
                        linear_keys: Optional[Iterable[str]] = None, source: str = "",
                        rest_dtype: Optional[torch.dtype] = None, only: Sequence[str] = ()) -> Result:
    """Quantize the linear weights of a state_dict. Returns the tensors to save (codes under the weight's
    name, scales under `<weight>_scale_inv`, the rest unchanged or cast to `rest_dtype` when floating)
    and the summary. `linear_keys` (from a model) overrides the bare-checkpoint rule; with `only`
    patterns, only the layers matching one of them are quantized."""
    skip, only = list(skip), list(only)
    fp8 = [k for k, v in sd.items() if isinstance(v, torch.Tensor) and v.dtype in (FP8_DTYPE, torch.float8_e5m2)]
    if fp8:
        raise QuantError(f"{source or 'checkpoint'}: already holds FP8 tensors ('{fp8[0]}'); quantize the original "
                         f"high-precision checkpoint instead")
    patterns = skip + (list(DEFAULT_SKIP) if default_skip else [])
    if linear_keys is not None:
        linear_keys = set(linear_keys)
        missing = sorted(k for k in linear_keys if k not in sd)
        if missing:
            raise QuantError(f"{source or 'checkpoint'}: the model's linear weight '{missing[0]}' is not in the "
                             f"checkpoint ({len(missing)} missing); the checkpoint's layers do not match the model")
    out, layers, skipped = {}, {}, {}
    hits = {p: 0 for p in skip}
    only_hits = {p: 0 for p in only}
    before = after = 0
    for key, t in sd.items():
        before += _nbytes(t)
        is_lin = (key in linear_keys) if linear_keys is not None else is_linear_weight_key(key, t)
        if not is_lin:
            out[key] = _rest(t, rest_dtype)
            after += _nbytes(out[key])
            continue
        path = layer_path(key)
        for o in only:
            if matching_pattern(path, [o]):
                only_hits[o] += 1
        q, p = decide(path, patterns, only)
        if not q:
            if p in hits:
                hits[p] += 1
            skipped[key] = {"pattern": p, "default": p not in skip and p != "--only", "shape": list(t.shape)}
            out[key] = _rest(t, rest_dtype)
            after += _nbytes(out[key])
            continue
        codes, scale = quantize_weight(t, block, key)
        br_bc = block_shape(t.shape, block)
        err = block_errors(t, dequantize_weight(codes, scale, br_bc), br_bc)
        out[key] = codes
        out[scale_key(key)] = scale
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
    for p, n in only_hits.items():
        if n == 0:
            msg = f"--only pattern '{p}' matches no linear weight in {source or 'the checkpoint'}"
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
        "skip_patterns": skip, "only_patterns": only, "default_skip": list(DEFAULT_SKIP) if default_skip else [],
        "unmatched_skip_patterns": [p for p, n in hits.items() if n == 0],
        "unmatched_only_patterns": [p for p, n in only_hits.items() if n == 0],
        "quantized": layers, "skipped": skipped,
    }
    return Result(out, summary, warns)


def _rest(t: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def save_quantized(result: Result, out_path: Union[str, os.PathLike], summary_path=None) -> Tuple[Path, Path]:
    """Write one safetensors file (codes, `<weight>_scale_inv` scales, the rest) and the summary JSON
    (default: OUT.json). The header metadata says format "pt" (what Hugging Face loaders expect),
    `vlafeed_format` (FORMAT), the block shape and the quantized layers with their blocks."""
    from safetensors.torch import save_file
    out_path = Path(out_path)
    summary_path = Path(summary_path) if summary_path else out_path.with_name(out_path.name + ".json")
    meta = {"format": "pt", "vlafeed_format": FORMAT, "block": json.dumps(result.summary["block"]),
            "quantized": json.dumps({k: v["block"] for k, v in sorted(result.summary["quantized"].items())})}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in result.tensors.items()}, str(tmp), metadata=meta)
    os.replace(tmp, out_path)
    result.summary["output"] = str(out_path)
    result.summary["output_file_bytes"] = out_path.stat().st_size
    summary_path.write_text(json.dumps(result.summary, indent=2) + "\n")
    return out_path, summary_path


class LegacyLayoutWarning(UserWarning):
    """A file in vlafeed's old private layout was converted on load."""


def _quantized_map(path, meta: dict) -> dict:
    try:
        return {k: (int(v[0]), int(v[1])) for k, v in json.loads(meta.get("quantized", "{}")).items()}
    except (ValueError, TypeError, IndexError, AttributeError, KeyError):
        raise QuantError(f"{path}: metadata 'quantized' is not a {{name: [rows, cols]}} map") from None


def load_quantized(path: Union[str, os.PathLike]) -> Tuple[dict, dict, dict]:
    """(tensors, metadata, {quantized weight name: (block rows, block cols)}) of a quantized checkpoint.

    Reads a file save_quantized wrote, a Hugging Face block-FP8 folder (its `quantization_config`
    becomes the metadata), or a file in vlafeed's old private layout (header format "vlafeed-fp8",
    scales under `<weight>_scale`), whose scales are renamed to `<weight>_scale_inv` on the fly (the
    values are the same: both layouts store the dequantization multiplier) with a
    LegacyLayoutWarning. Any other file is refused; FP8 codes are never handed out without their scales."""
    from safetensors import safe_open
    path = Path(path)
    if path.is_dir():
        from vlafeed.quant.hf import read_quantized_folder
        tensors, qcfg, quantized = read_quantized_folder(path)
        return tensors, {"quantization_config": json.dumps(qcfg)}, quantized
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise QuantError(f"{path}: not a readable safetensors file ({e})") from None
    legacy = meta.get("format") == LEGACY_FORMAT
    if not legacy and meta.get("vlafeed_format") != FORMAT:
        fp8 = [k for k, v in tensors.items() if v.dtype == FP8_DTYPE]
        hint = (f"; it holds FP8 tensors ('{fp8[0]}') but no vlafeed header, so their scales cannot be "
                f"identified safely" if fp8 else "")
        raise QuantError(f"{path}: not a vlafeed FP8 checkpoint (metadata format={meta.get('format')!r}, "
                         f"vlafeed_format={meta.get('vlafeed_format')!r}){hint}")
    quantized = _quantized_map(path, meta)
    if legacy:
        for k in quantized:
            old = k + LEGACY_SCALE_SUFFIX
            if old not in tensors:
                raise QuantError(f"{path}: old-layout file lacks the scale '{old}' of quantized weight '{k}'")
            tensors[scale_key(k)] = tensors.pop(old)
        warnings.warn(f"{path}: vlafeed's old private FP8 layout (scales under '<weight>_scale'); converted on "
                      f"load. Rewrite it in the standard layout with `vlafeed quantize {path} NEW.safetensors`",
                      LegacyLayoutWarning, stacklevel=2)
        meta = dict(meta, converted_from=LEGACY_FORMAT)
    for k, blk in quantized.items():
        sk = scale_key(k)
        if k not in tensors or sk not in tensors:
            raise QuantError(f"{path}: quantized weight '{k}' or its scale '{sk}' is missing")
        if tensors[k].dtype != FP8_DTYPE or tensors[k].dim() != 2:
            raise QuantError(f"{path}: quantized weight '{k}' is {tensors[k].dtype} {list(tensors[k].shape)}, "
                             f"not 2-D float8_e4m3fn")
        R, C = tensors[sk].shape
        if (R, C) != (-(-tensors[k].shape[0] // blk[0]), -(-tensors[k].shape[1] // blk[1])):
            raise QuantError(f"{path}: scale '{sk}' {[R, C]} does not fit weight {list(tensors[k].shape)} "
                             f"with block {list(blk)}")
    stray = [k for k, v in tensors.items() if v.dtype == FP8_DTYPE and k not in quantized]
    if stray:
        raise QuantError(f"{path}: FP8 tensor '{stray[0]}' is not listed as quantized in the header")
    return tensors, meta, quantized


def convert_legacy(path, out_path, summary_path=None) -> Tuple[Path, Path]:
    """Rewrite a file in vlafeed's old private layout in the current one (scales renamed to
    `<weight>_scale_inv`; codes and scale values unchanged)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyLayoutWarning)
        tensors, meta, quantized = load_quantized(path)
    if meta.get("converted_from") != LEGACY_FORMAT:
        raise QuantError(f"{path}: not in the old layout; nothing to convert")
    layers = {k: {"block": list(b), "shape": list(tensors[k].shape)} for k, b in quantized.items()}
    summary = {"format": FORMAT, "source": str(path), "converted_from": LEGACY_FORMAT,
               "block": json.loads(meta.get("block", "null")), "layers_quantized": len(layers), "quantized": layers}
    return save_quantized(Result(tensors, summary), out_path, summary_path)


def dequantized_state_dict(path, dtype=torch.float32) -> dict:
    """The checkpoint with every quantized weight dequantized (scales dropped): loads into the float model."""
    tensors, _, quantized = load_quantized(path)
    scales = {scale_key(k) for k in quantized}
    sd = {k: v for k, v in tensors.items() if k not in scales}
    for k, blk in quantized.items():
        sd[k] = dequantize_weight(tensors[k], tensors[scale_key(k)], blk, dtype)
    return sd


def quantize_model(model: nn.Module, block: Block = 128, skip: Sequence[str] = (), default_skip: bool = True,
                   inplace: bool = True, only: Sequence[str] = ()) -> Tuple[nn.Module, dict]:
    """Replace the nn.Linear modules of `model` (outside the skipped ones) with FP8BlockLinear and round
    nn.MultiheadAttention's in_proj_weight through FP8 (its packed QKV matmul is not a module).
    Returns (model, summary)."""
    import copy
    if not inplace:
        model = copy.deepcopy(model)
    sd = model.state_dict()
    res = quantize_state_dict(sd, block, skip, default_skip, linear_keys_of_model(model), type(model).__name__,
                              only=only)
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
        codes, scale = tensors[key], tensors[scale_key(key)]
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
    """Load a quantized checkpoint (anything load_quantized reads) into a float model: its quantized
    nn.Linear modules become FP8BlockLinear, the rest loads as usual. Raises QuantError naming the keys
    when the layers differ."""
    tensors, _, quantized = load_quantized(path)
    scales = {scale_key(k) for k in quantized}
    rest = {k: v for k, v in tensors.items() if k not in quantized and k not in scales}
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
