"""Per-step metrics of ``python -m vlafeed.train`` and where they go (rank 0 only).

Each step's record: step, loss (and loss_hex, its exact bits), lr,
grad_norm (total over ranks, before clipping), step_s (wall time of the
step), data_wait_s (time spent waiting for the loader), tokens_per_s (real,
non-padding tokens of the step over all ranks, when the model reports
tokens), peak_mem_mb (CUDA max_memory_allocated on GPU, else the process's
peak RSS).

Sinks: train.log_file (JSON lines, always there when set), train.tensorboard
(torch.utils.tensorboard's SummaryWriter; needs the tensorboard package),
train.wandb_project (wandb.init; needs the wandb package; WANDB_MODE=offline
keeps it on disk). A sink whose package is missing is a ConfigError naming
the key, before the first step.

warn_once(): a warning printed once per run, by rank 0 only.
"""
from __future__ import annotations

import json
import sys
import warnings

import torch

from vlafeed.train.config import ConfigError

_warned: set = set()
_is_main = True


def set_main(is_main: bool):
    """Rank 0 prints warnings; other ranks stay quiet (also Python warnings of the usual kinds)."""
    global _is_main
    _is_main = is_main
    if not is_main:
        for cat in (UserWarning, FutureWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", category=cat)
    else:
        warnings.filterwarnings("once", category=UserWarning)
        warnings.filterwarnings("once", category=FutureWarning)


def warn_once(key: str, message: str):
    """Prints "warning: message" to stderr the first time key is seen, on rank 0 only."""
    if key in _warned:
        return
    _warned.add(key)
    if _is_main:
        print(f"warning: {message}", file=sys.stderr, flush=True)


def peak_memory_mb(device) -> float:
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except ImportError:
        return 0.0


class MetricsLogger:
    """Writes step records to the configured sinks; a no-op on ranks other than 0."""

    def __init__(self, tc, is_main: bool, config: dict | None = None):
        """Checks the sinks' packages now (a ConfigError before the first step); files, writers and the wandb
        run are made at the first record, so a run refused before its first step leaves nothing behind."""
        self.jsonl = self.tb = self.wandb = None
        self.tc, self.config, self.started = tc, config or {}, False
        self.is_main = is_main
        if not is_main:
            return
        if tc.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # noqa: F401
            except ImportError as e:
                raise ConfigError(f"config key 'train.tensorboard': TensorBoard logging needs the tensorboard "
                                  f"package ({e}); pip install tensorboard, or leave the key empty") from None
        if tc.wandb_project:
            try:
                import wandb  # noqa: F401
            except ImportError:
                raise ConfigError("config key 'train.wandb_project': logging to Weights & Biases needs the wandb "
                                  "package; pip install wandb, or leave the key empty") from None

    def _start(self):
        self.started = True
        tc = self.tc
        if tc.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(log_dir=tc.tensorboard)
        if tc.wandb_project:
            import wandb
            self.wandb = wandb.init(project=tc.wandb_project, config=self.config)
        if tc.log_file:
            self.jsonl = open(tc.log_file, "a")  # noqa: SIM115  (open for the whole run)

    def log(self, record: dict):
        if not self.is_main:
            return
        if not self.started:
            self._start()
        if self.jsonl:
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        step = record["step"]
        scalars = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))
                   and not isinstance(v, bool)}
        if self.tb:
            for k, v in scalars.items():
                self.tb.add_scalar(f"train/{k}", v, step)
        if self.wandb:
            self.wandb.log({f"train/{k}": v for k, v in scalars.items()}, step=step)

    def close(self):
        if self.jsonl:
            self.jsonl.close()
            self.jsonl = None
        if self.tb:
            self.tb.close()
            self.tb = None
        if self.wandb:
            self.wandb.finish()
            self.wandb = None
