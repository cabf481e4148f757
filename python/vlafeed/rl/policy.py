"""The policy network and batched action sampling."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn


class PolicyNet(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, n_actions))

    def forward(self, obs):
        return self.net(obs)


def act_batch(model: nn.Module, obs: np.ndarray, rng: np.random.Generator):
    """Samples one action per row of obs; the forward runs on the model's device, the sampling on
    the CPU (the same numbers whatever the device, up to the device's float arithmetic)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.as_tensor(np.asarray(obs, dtype=np.float32)).to(device, non_blocking=True))
        logp_all = torch.log_softmax(logits, -1).cpu().numpy()
    p = np.exp(logp_all)
    p /= p.sum(-1, keepdims=True)
    actions = np.array([rng.choice(p.shape[1], p=row) for row in p])
    return actions, logp_all[np.arange(len(actions)), actions]
