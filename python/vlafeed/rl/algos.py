"""The learning rules of vlafeed.rl (``algorithm: reinforce | ppo | grpo``): advantages and losses
over micro-batches of trajectories, and the grouping of GRPO trajectories.

- reinforce: discounted return-to-go minus a running-mean baseline, a clipped importance ratio
  against the behaviour log-probs (so slightly stale samples are corrected). Each step weighs
  1/global_batch.
- ppo: a value head; GAE(gamma, gae_lambda) advantages computed once per trajectory with the
  value function of the moment the trajectory is first trained (bootstrapped from the value of
  the last observation when the episode was truncated, 0 when it terminated); advantages
  normalized per micro-batch; clipped ratio; value loss (vf_coef); entropy bonus (ent_coef);
  ``ppo_epochs`` passes over the stored global batch (the first while it streams in).
- grpo: no critic. Trajectories come in groups of ``group_size`` started from the same reset
  seed; each trajectory's advantage is (return - group mean) / (group std + 1e-6), given to
  every step of it; the clipped-ratio surrogate and the entropy bonus as in ppo.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List

import numpy as np

ALGORITHMS = ("reinforce", "ppo", "grpo")


def discounted(r: np.ndarray, gamma: float) -> np.ndarray:
    g = np.zeros(len(r), dtype=np.float64)
    acc = 0.0
    for i in range(len(r) - 1, -1, -1):
        acc = float(r[i]) + gamma * acc
        g[i] = acc
    return g


def gae(rewards: np.ndarray, values: np.ndarray, last_value: float, gamma: float, lam: float):
    """(advantages, value targets) of one trajectory; last_value is V(s_T) (0 when terminated)."""
    T = len(rewards)
    adv = np.zeros(T, dtype=np.float64)
    nxt, acc = float(last_value), 0.0
    for t in range(T - 1, -1, -1):
        delta = float(rewards[t]) + gamma * nxt - float(values[t])
        acc = delta + gamma * lam * acc
        adv[t] = acc
        nxt = float(values[t])
    return adv, adv + values


def group_advantages(trajs: List[dict]) -> Dict[str, float]:
    """GRPO: per trajectory id, (return - mean) / (std + 1e-6) over the trajectories of its group
    (trajectories without a group form their own: advantage 0)."""
    groups: Dict[str, List[dict]] = OrderedDict()
    for t in trajs:
        groups.setdefault(t.get("group") or t["id"], []).append(t)
    out = {}
    for members in groups.values():
        rets = np.array([float(np.sum(t["rewards"])) for t in members])
        mu, sd = rets.mean(), rets.std()
        for t, r in zip(members, rets):
            out[t["id"]] = float((r - mu) / (sd + 1e-6))
    return out


class GroupBuffer:
    """Holds GRPO trajectories until their group is complete; other algorithms pass through."""

    def __init__(self, group_size: int, enabled: bool):
        self.size, self.enabled = group_size, enabled
        self.partial: Dict[str, List[dict]] = OrderedDict()

    def add(self, traj: dict) -> List[dict]:
        if not self.enabled:
            return [traj]
        g = self.partial.setdefault(traj["group"], [])
        g.append(traj)
        if len(g) < self.size:
            return []
        return self.partial.pop(traj["group"])

    def waiting_ids(self) -> List[str]:
        return [t["id"] for g in self.partial.values() for t in g]
