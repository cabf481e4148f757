"""Optimizer, parameter groups, LR schedules, freezing and gradient clipping for
``python -m vlafeed.train``, for any nn.Module: parameters are taken by name.

- freeze(model, patterns): requires_grad=False on every parameter whose name
  matches one of the fnmatch patterns; a pattern that matches nothing is a
  ConfigError (a typo would otherwise train everything).
- param_groups(model, weight_decay, no_decay): two groups, "decay" and
  "no_decay". A parameter gets no weight decay when it has fewer than two
  dimensions (biases, norm weights, 0-dim scales), belongs to an
  nn.Embedding, or its name matches a no_decay pattern. Frozen parameters are left out.
- build_optimizer(): adamw | adam | sgd over those groups.
- lr_lambda(): linear warm-up, then constant | linear | cosine down to
  lr x min_lr_ratio (cosine to 10% is the default: the schedule of earlier
  versions, so their runs are unchanged).
- grad_norm(): the total L2 norm of the gradients over all ranks, correct
  under FSDP2 (DTensor gradient shards: the norm of the whole gradient, not
  of this rank's shard) and DDP (replicated gradients); clip_grads() scales
  them to max_norm with that norm.
"""
from __future__ import annotations

import fnmatch
import math

import torch
import torch.nn as nn

from vlafeed.train.config import ConfigError


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def freeze(model: nn.Module, patterns) -> list:
    """Sets requires_grad=False on the parameters matching any pattern; returns their names."""
    if not patterns:
        return []
    names = [n for n, _ in model.named_parameters()]
    for p in patterns:
        if not any(fnmatch.fnmatchcase(n, p) for n in names):
            sample = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            raise ConfigError(f"config key 'train.freeze': pattern {p!r} matches no parameter of "
                              f"{type(model).__name__} (names look like: {sample})")
    frozen = []
    for n, prm in model.named_parameters():
        if _matches(n, patterns):
            prm.requires_grad_(False)
            frozen.append(n)
    if len(frozen) == len(names):
        raise ConfigError(f"config key 'train.freeze': {list(patterns)!r} freezes every parameter: nothing to train")
    return frozen


def _embedding_params(model: nn.Module) -> set:
    return {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)}


def _no_decay(n, p, no_decay, embeddings) -> bool:
    return p.dim() < 2 or id(p) in embeddings or _matches(n, no_decay)


def param_groups(model: nn.Module, weight_decay: float, no_decay) -> list:
    """[{"params", "weight_decay"}]: no decay for < 2-dim parameters, nn.Embedding weights and no_decay names."""
    decay, plain = [], []
    emb = _embedding_params(model)
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (plain if _no_decay(n, p, no_decay, emb) else decay).append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if plain:
        groups.append({"params": plain, "weight_decay": 0.0})
    if not groups:
        raise ConfigError(f"{type(model).__name__} has no trainable parameter (all frozen?)")
    return groups


def group_names(model: nn.Module, no_decay) -> dict:
    """{"decay": [names], "no_decay": [names]} as param_groups() splits them (for logs and tests)."""
    out = {"decay": [], "no_decay": []}
    emb = _embedding_params(model)
    for n, p in model.named_parameters():
        if p.requires_grad:
            out["no_decay" if _no_decay(n, p, no_decay, emb) else "decay"].append(n)
    return out


def build_optimizer(model: nn.Module, tc) -> torch.optim.Optimizer:
    """tc: the train section (optimizer, lr, weight_decay, betas, momentum, no_decay)."""
    groups = param_groups(model, tc.weight_decay, tc.no_decay)
    if tc.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=tc.lr, betas=tuple(tc.betas))
    if tc.optimizer == "adam":
        return torch.optim.Adam(groups, lr=tc.lr, betas=tuple(tc.betas))
    if tc.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=tc.lr, momentum=tc.momentum)
    raise ConfigError(f"config key 'train.optimizer': {tc.optimizer!r} is not one of adamw, adam, sgd")


def lr_lambda(warmup: int, total: int, schedule: str = "cosine", min_ratio: float = 0.1):
    """The LR multiplier at each step: (step + 1) / warmup during warm-up, then the schedule."""
    if schedule not in ("constant", "linear", "cosine"):
        raise ConfigError(f"config key 'train.schedule': {schedule!r} is not one of constant, linear, cosine")

    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - (1.0 - min_ratio) * progress
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def build_scheduler(optimizer, tc):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tc.warmup_steps, tc.steps, tc.schedule,
                                                                  tc.min_lr_ratio))


def _is_dtensor(t) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(t, DTensor)


def grad_norm(parameters) -> torch.Tensor:
    """Total L2 norm (fp32, a plain 0-dim tensor equal on every rank) of the parameters' gradients.

    DTensor gradients (FSDP2 shards) are reduced over their mesh by full_tensor(); plain ones (DDP,
    one process, or the 0-dim parameters FSDP2 ignores, already averaged) are the same on every rank."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    sharded = [g for g in grads if _is_dtensor(g)]
    plain = [g for g in grads if not _is_dtensor(g)]
    sq = torch.zeros((), dtype=torch.float32)
    if sharded:
        n = torch.nn.utils.get_total_norm(sharded, 2.0)
        n = n.full_tensor() if _is_dtensor(n) else n
        sq = sq + n.float().cpu() ** 2
    if plain:
        n = torch.nn.utils.get_total_norm(plain, 2.0)
        sq = sq + n.float().cpu() ** 2
    return sq.sqrt()


def clip_grads(parameters, max_norm: float, total_norm: torch.Tensor):
    """Scales every gradient by min(1, max_norm / (total_norm + 1e-6)), as torch's clip_grad_norm_."""
    coef = float(max_norm) / (float(total_norm) + 1e-6)
    if coef >= 1.0:
        return
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(coef)
