"""Which tensors are linear weights, and the skip / only patterns that decide which of them are quantized."""
from __future__ import annotations

import fnmatch
from typing import Iterable, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from vlafeed.quant.blockfp8 import EMBEDDING_MARKERS, FP8_DTYPE, SCALE_SUFFIX


def _component_match(path: str, pattern: str) -> bool:
    return (fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern + ".*")
            or any(fnmatch.fnmatchcase(part, pattern) for part in path.split(".")))


def matching_pattern(path: str, patterns: Iterable[str]) -> Optional[str]:
    """The first pattern that matches layer path `path` (see the package docstring for the rule), or None."""
    for p in patterns:
        if _component_match(path, p):
            return p
    return None


def layer_path(key: str) -> str:
    """The module path of a weight key: `a.b.weight` -> `a.b`, `a.in_proj_weight` -> `a.in_proj`."""
    for suffix in (".weight", "_proj_weight"):
        if key.endswith(suffix):
            return key[: -len(".weight")] if suffix == ".weight" else key[: -len("_weight")]
    return key


def scale_key(key: str) -> str:
    """Name of the scale tensor stored beside quantized weight `key` (`x.weight` -> `x.weight_scale_inv`)."""
    return key + SCALE_SUFFIX


def is_linear_weight(key: str, shape: Sequence[int], dtype: torch.dtype) -> bool:
    """The bare-checkpoint rule from a name, a shape and a dtype (no tensor needed): a 2-D floating
    `*.weight` or `*in_proj_weight` that is not FP8 already and is not an embedding table."""
    if len(shape) != 2 or not dtype.is_floating_point or dtype == FP8_DTYPE:
        return False
    if not (key.endswith(".weight") or key.endswith("in_proj_weight")):
        return False
    return matching_pattern(layer_path(key), EMBEDDING_MARKERS) is None


def is_linear_weight_key(key: str, t: torch.Tensor) -> bool:
    """The bare-checkpoint rule (package docstring) applied to a tensor."""
    if not isinstance(t, torch.Tensor):
        return False
    return is_linear_weight(key, tuple(t.shape), t.dtype)


def decide(path: str, skip: Sequence[str], only: Sequence[str] = ()) -> Tuple[bool, Optional[str]]:
    """(quantize?, the pattern that decided it) for a linear layer at `path`.

    With `only` patterns, a layer matching none of them is left alone (the decision names "--only").
    Otherwise the first matching `skip` pattern keeps it in high precision."""
    if only and matching_pattern(path, only) is None:
        return False, "--only"
    p = matching_pattern(path, skip)
    return (p is None), p


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
