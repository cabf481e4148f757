"""The learner: REINFORCE with a running-mean baseline and a PPO-style clipped ratio,
gradients accumulated per micro-batch, one optimizer step per global batch."""
from __future__ import annotations

from typing import List

import numpy as np
import torch

from vlafeed.rl.config import RLConfig
from vlafeed.rl.policy import PolicyNet


class Learner:
    """Accumulates gradients per micro-batch, steps after the global batch."""

    def __init__(self, cfg: RLConfig, obs_dim: int, n_actions: int):
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.model = PolicyNet(obs_dim, n_actions, cfg.hidden)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.version = 0
        self.baseline = 0.0
        self.in_batch = 0
        self.trained_ids: List[str] = []
        self.lags: List[int] = []
        self.returns: List[float] = []
        self.trained_steps = 0
        self.step_returns: List[float] = []
        self.opt.zero_grad(set_to_none=True)

    def state(self):
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def lag(self, traj) -> int:
        return self.version - int(min(traj["versions"]))

    def micro_step(self, trajs: List[dict]) -> None:
        """Forward/backward over one micro-batch; gradients accumulate until step()."""
        cfg = self.cfg
        obs = torch.as_tensor(np.concatenate([t["obs"] for t in trajs]), dtype=torch.float32)
        act = torch.as_tensor(np.concatenate([t["actions"] for t in trajs]), dtype=torch.long)
        old = torch.as_tensor(np.concatenate([t["logp"] for t in trajs]), dtype=torch.float32)
        rets, weights = [], []
        for t in trajs:
            r = np.asarray(t["rewards"], dtype=np.float64)
            g = np.zeros_like(r)
            acc = 0.0
            for i in range(len(r) - 1, -1, -1):
                acc = r[i] + cfg.gamma * acc
                g[i] = acc
            rets.append(g)
            weights.append(np.full(len(r), 1.0 / cfg.global_batch))
        ret = torch.as_tensor(np.concatenate(rets), dtype=torch.float32)
        w = torch.as_tensor(np.concatenate(weights), dtype=torch.float32)
        adv = ret - self.baseline
        logp = torch.log_softmax(self.model(obs), -1).gather(1, act[:, None])[:, 0]
        ratio = torch.exp(logp - old)
        obj = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
        (-(obj * w).sum()).backward()
        for t in trajs:
            self.trained_ids.append(t["id"])
            self.lags.append(self.lag(t))
            self.returns.append(float(np.sum(t["rewards"])))
            self.step_returns.append(float(np.asarray(rets[trajs.index(t)])[0]))
        self.trained_steps += int(obs.shape[0])
        self.in_batch += len(trajs)

    def step(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.version += 1
        if self.step_returns:
            self.baseline = 0.5 * self.baseline + 0.5 * float(np.mean(self.step_returns))
        self.step_returns = []
        self.in_batch = 0
