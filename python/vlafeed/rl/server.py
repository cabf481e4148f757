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

from vlafeed.rl import spaces as S
from vlafeed.rl.config import RLConfig
from vlafeed.rl.policies import make_policy, module_of

_CLASS = []


def policy_server_class():
    """The PolicyServer actor class (made once per process)."""
    if _CLASS:
        return _CLASS[0]
    import ray

    @ray.remote
    class PolicyServer:
        """Dynamic batching of action requests over the latest published weights."""

        def __init__(self, cfg: RLConfig, observation_space, action_space, state: dict):
            self.cfg = cfg
            self.device = torch.device(cfg.server_device)
            if self.device.type == "cuda" and not torch.cuda.is_available():
                raise RuntimeError(f"policy server: server_device {cfg.server_device!r}, but torch sees no CUDA "
                                   f"device in this actor (torch {torch.__version__}, CUDA build "
                                   f"{torch.version.cuda})")
            torch.manual_seed(cfg.seed + 999)  # the sampling RNG of this process
            self.policy = make_policy(observation_space, action_space, cfg.policy, hidden=cfg.hidden,
                                      value_head=cfg.algorithm == "ppo", squash=cfg.action_squash)
            self.model = module_of(self.policy).to(self.device).eval()
            self.model.load_state_dict(state)
            self.obs_space = observation_space
            # observations are stacked into arrays allocated once (spaces.Stacker), one copy each
            self.stacker = S.Stacker(observation_space, cfg.max_batch_size)
            self.version = 0
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

        async def act(self, obs_rows: list):
            """Actions for a list of n observations (arrays, dicts or tuples as the space has them):
            (actions [n, ...], logp [n], version)."""
            if self.arrived is None:
                self.arrived = asyncio.Event()
            fut = asyncio.get_running_loop().create_future()
            self.pending.append((list(obs_rows), fut))
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
                rows = [r for o, _ in batch for r in o]
                obs = self.stacker(rows)
                with torch.no_grad():
                    out = self.policy.act(obs)
                actions, logp = out.action.cpu().numpy(), out.logp.float().cpu().numpy()
                self.batch_sizes.append(len(rows))
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
                    "ignored_stale_publishes": self.ignored_publishes, "stack_allocations": self.stacker.allocations}

    _CLASS.append(PolicyServer)
    return PolicyServer
