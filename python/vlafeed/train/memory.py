"""Activation checkpointing and torch.compile per block, applied before FSDP2
or DDP wraps the model (the order torchtitan and VLA Foundry use).

Blocks are the modules FSDP2 shards one by one: FSDPBlock instances and the
types the model's get_fsdp_block_types() names; a model with none is treated
as one block. Both change the module in place and keep every parameter name,
so checkpoints, freezing and weight-decay patterns see the same names:

- activation checkpointing replaces the block instance's forward by one that
  runs it under torch.utils.checkpoint.checkpoint (non-reentrant, the RNG
  state preserved), so its activations are recomputed in backward;
- compile calls nn.Module.compile() on each block (torch.compile of its
  forward; the module and its parameters stay as they are).
"""
from __future__ import annotations

import functools

import torch.nn as nn
from torch.utils.checkpoint import checkpoint


def _checkpointed(forward, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def blocks_of(model: nn.Module, types: tuple) -> list:
    found = [m for m in model.modules() if m is not model and isinstance(m, types)]
    # only the outermost blocks: a block inside a block is run (and recomputed) by its parent
    inner = {id(c) for b in found for c in b.modules() if c is not b}
    return [m for m in found if id(m) not in inner] or [model]


def apply_per_block(model: nn.Module, types: tuple, *, activation_checkpointing=False, compile=False) -> list:
    blocks = blocks_of(model, types)
    for b in blocks:
        if activation_checkpointing:
            b.forward = functools.partial(_checkpointed, b.forward)
        if compile:
            b.compile()
    return blocks
