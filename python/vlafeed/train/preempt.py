"""Preemption: SIGTERM or SIGUSR1 (what SLURM and cluster schedulers send
before they kill a job) ends the run cleanly.

The handler only sets a flag; the training loop checks it after each
optimizer step. All ranks agree on the step to stop at: the flag is
all-reduced (MAX) each step, so a signal that reached one rank stops them
all after the same step. The run then saves a checkpoint at that step and
exits 0 with a message; ``checkpoint.resume=auto`` continues it exactly.
"""
from __future__ import annotations

import signal

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preemption:
    def __init__(self):
        self.received = None
        self.previous = {}

    def install(self):
        for s in SIGNALS:
            try:
                self.previous[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread (e.g. a Ray worker thread): no handler
                pass
        return self

    def _handler(self, signum, frame):
        self.received = signal.Signals(signum).name

    def restore(self):
        for s, h in self.previous.items():
            signal.signal(s, h)
        self.previous = {}

    def should_stop(self, distributed: bool, device) -> bool:
        """True on every rank when any rank received a signal (one small all_reduce when distributed)."""
        if not distributed:
            return self.received is not None
        flag = torch.tensor([1 if self.received else 0], dtype=torch.int32,
                            device=device if torch.device(device).type == "cuda" else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
