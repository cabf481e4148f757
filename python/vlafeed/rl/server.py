"""PolicyServer: the Ray actor that answers rollout workers' action requests with dynamic
batching (a batch goes when max_batch_size requests are queued or max_wait_ms has passed since
its first) over the latest weights the learner published. Defined on first use so that importing
vlafeed.rl does not import Ray."""
from __future__ import annotations

import asyncio
import time
from typing import List

import numpy as np
import torch

from vlafeed.rl.config import RLConfig
from vlafeed.rl.policy import PolicyNet, act_batch

_CLASS = []


def policy_server_class():
    """The PolicyServer actor class (made once per process)."""
    if _CLASS:
        return _CLASS[0]
    import ray

    @ray.remote
    class PolicyServer:
        """Dynamic batching of action requests over the latest published weights."""

        def __init__(self, cfg: RLConfig, obs_dim: int, n_actions: int, state: dict):
            self.cfg = cfg
            self.device = torch.device(cfg.server_device)
            if self.device.type == "cuda" and not torch.cuda.is_available():
                raise RuntimeError(f"policy server: server_device {cfg.server_device!r}, but torch sees no CUDA "
                                   f"device in this actor (torch {torch.__version__}, CUDA build "
                                   f"{torch.version.cuda})")
            self.model = PolicyNet(obs_dim, n_actions, cfg.hidden).to(self.device)
            self.model.load_state_dict(state)
            self.version = 0
            self.rng = np.random.default_rng(cfg.seed + 999)
            self.pending: list = []
            self.arrived = None
            self.task = None
            self.batch_sizes: List[int] = []
            self.stop = False  # the run's stop flag, read by the workers
            self.publishes = self.ignored_publishes = 0
            torch.set_num_threads(cfg.torch_threads)

        def set_weights(self, state: dict, version: int) -> bool:
            """Loads a publish stamped `version`; an older or equal stamp (a stale publish) is ignored
            and counted. Each action returns the version that chose it."""
            if version <= self.version:
                self.ignored_publishes += 1
                return False
            self.model.load_state_dict(state)
            self.version = version
            self.publishes += 1
            return True

        def pid(self) -> int:
            import os
            return os.getpid()

        def placement(self) -> dict:
            import os
            return {"pid": os.getpid(), "gpu_ids": [str(x) for x in ray.get_gpu_ids()],
                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": str(self.device),
                    "torch_threads": torch.get_num_threads()}

        async def act(self, obs_rows: np.ndarray):
            """Actions for a [n, obs_dim] block of observations: (actions, logp, version)."""
            if self.arrived is None:
                self.arrived = asyncio.Event()
            fut = asyncio.get_running_loop().create_future()
            self.pending.append((np.asarray(obs_rows, dtype=np.float32), fut))
            self.arrived.set()
            if self.task is None or self.task.done():
                self.task = asyncio.ensure_future(self._batcher())
            return await fut

        async def _batcher(self):
            cfg = self.cfg
            while self.pending:
                first = time.perf_counter()
                while sum(len(o) for o, _ in self.pending) < cfg.max_batch_size:
                    left = cfg.max_wait_ms / 1000.0 - (time.perf_counter() - first)
                    if left <= 0:
                        break
                    self.arrived.clear()
                    try:
                        await asyncio.wait_for(self.arrived.wait(), left)
                    except asyncio.TimeoutError:
                        break
                batch, n = [], 0
                while self.pending and (n == 0 or n + len(self.pending[0][0]) <= cfg.max_batch_size):
                    batch.append(self.pending.pop(0))
                    n += len(batch[-1][0])
                obs = np.concatenate([o for o, _ in batch])
                actions, logp = act_batch(self.model, obs, self.rng)
                self.batch_sizes.append(len(obs))
                i = 0
                for o, fut in batch:
                    k = len(o)
                    if not fut.done():
                        fut.set_result((actions[i:i + k], logp[i:i + k], self.version))
                    i += k
                await asyncio.sleep(0)

        def set_stop(self):
            self.stop = True

        def should_stop(self):
            return self.stop

        def stats(self):
            b = self.batch_sizes
            return {"batches": len(b), "mean_batch": float(np.mean(b)) if b else 0.0, "max_batch": max(b, default=0),
                    "version": self.version, "device": str(self.device), "publishes": self.publishes,
                    "ignored_stale_publishes": self.ignored_publishes}

    _CLASS.append(PolicyServer)
    return PolicyServer
