"""Which tensors are linear weights, and the skip patterns that leave layers in high precision."""
from __future__ import annotations

import fnmatch
from typing import Iterable, Optional

import torch
import torch.nn as nn

from vlafeed.quant.blockfp8 import EMBEDDING_MARKERS, FP8_DTYPE


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
