"""vlafeed.train: a training harness on PyTorch's own distributed APIs.

- ``python -m vlafeed.train --config run.yaml [--section.key value ...]``
  (runner.py): YAML config plus command-line overrides, launched by torchrun
  or SLURM; FSDP2 or DDP; precision modes; gradient accumulation; sharded
  atomic checkpoints with exact resume; sequence packing.
- Building blocks: FSDPBlock (the marker class FSDP2 wraps one by one),
  setup_distributed, wrap_model, seed_rank_streams (config.py, parallel.py),
  save/load of DCP checkpoints (checkpoint.py), the packer's Python side
  (packing.py) and the example VLA policy (policy.py).
- The essentials, for any nn.Module: optimizer, parameter groups, LR
  schedules, freezing and gradient clipping (optim.py), EMA (ema.py),
  per-step metrics to JSONL / TensorBoard / wandb (metrics.py), SIGTERM /
  SIGUSR1 preemption (preempt.py), activation checkpointing and compile per
  block (memory.py).
"""
from vlafeed.train.config import Config, ConfigError, load_config  # noqa: F401
from vlafeed.train.parallel import (FSDPBlock, DistInfo, Wrapped, rank_seed, seed_rank_streams,  # noqa: F401
                                    setup_distributed, wrap_model)

__all__ = ["Config", "ConfigError", "load_config", "FSDPBlock", "DistInfo", "Wrapped", "rank_seed",
           "seed_rank_streams", "setup_distributed", "wrap_model"]
