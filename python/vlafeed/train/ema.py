"""Exponential moving average of a model's weights (train.ema_decay).

After each optimizer step every trainable parameter's shadow copy moves
towards it: ``shadow = decay * shadow + (1 - decay) * param`` (lerp, in fp32
whatever the parameter's dtype). The shadows have the parameters' own type:
DTensor shards under FSDP2 (so they shard, save and reshard like the
model), plain tensors under DDP or in one process.

The checkpoint holds them under the DCP key "ema" beside the model and the
optimizer, so a resumed run continues with bit-identical averages.

For export and validation (other parts of vlafeed.train call these):
- ``ema.ema_state(model)``: the model's state_dict with the averaged weights
  in place of the trained ones, as full tensors (a collective under FSDP2:
  every rank calls it);
- ``with ema.applied(model): ...``: the model runs with the averaged weights
  inside the block and gets its own back at the end.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from vlafeed.train.config import ConfigError


class EMA:
    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"config key 'train.ema_decay': {decay!r} is out of range (allowed: (0, 1))")
        self.decay = decay
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        params = dict(model.named_parameters())
        with torch.no_grad():
            self.shadow = {n: params[n].detach().to(torch.float32).clone() for n in self.names}
        self.updates = 0

    @torch.no_grad()
    def update(self, model: nn.Module):
        params = dict(model.named_parameters())
        w = 1.0 - self.decay
        for n in self.names:
            self.shadow[n].lerp_(params[n].detach().to(torch.float32), w)
        self.updates += 1

    def state_dict(self) -> dict:
        """{name: shadow tensor}: the tensors themselves, so DCP loads into them in place."""
        return self.shadow

    def ema_state(self, model: nn.Module) -> dict:
        """model.state_dict() with the averaged weights, every value a full (unsharded) tensor."""
        out = {}
        for k, v in model.state_dict().items():
            v = self.shadow[k].to(v.dtype) if k in self.shadow else v
            out[k] = v.full_tensor() if hasattr(v, "full_tensor") else v.detach().clone()
        return out

    @contextlib.contextmanager
    def applied(self, model: nn.Module):
        """The model holds the averaged weights inside the block, its own again after it."""
        params = dict(model.named_parameters())
        saved = {}
        with torch.no_grad():
            for n in self.names:
                saved[n] = params[n].detach().clone()
                params[n].copy_(self.shadow[n].to(params[n].dtype))
        try:
            yield model
        finally:
            with torch.no_grad():
                for n in self.names:
                    params[n].copy_(saved[n])
