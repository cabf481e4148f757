"""A user's own model for vlafeed.train's model.source: python (test_train_entry.py):
`model.entry: train_entry_module:build`. build(features, stats, cfg) gets the dataset's features and
stats after data.rename and returns an nn.Module whose forward(batch) returns {"loss": ...}."""
import torch
import torch.nn as nn


class TinyPolicy(nn.Module):
    image_format = "float32"  # what the loader delivers (the default too): float images in [0, 1]

    def __init__(self, camera, state_dim, action_dim, chunk, state_mean, state_std):
        super().__init__()
        self.camera, self.chunk, self.action_dim = camera, chunk, action_dim
        self.delta_timestamps = {"action": [i / 30 for i in range(chunk)]}
        self.register_buffer("state_mean", state_mean)
        self.register_buffer("state_std", state_std)
        self.conv = nn.Conv2d(3, 8, 8, stride=8)
        self.head = nn.Sequential(nn.Linear(8 + state_dim, 32), nn.ReLU(), nn.Linear(32, chunk * action_dim))

    def forward(self, batch):
        img = self.conv(batch[self.camera]).mean(dim=(2, 3))
        state = (batch["observation.state"] - self.state_mean) / self.state_std
        pred = self.head(torch.cat([img, state], dim=1)).view(-1, self.chunk, self.action_dim)
        err = (pred - batch["action"]).pow(2).mean(-1)
        valid = (~batch["action_is_pad"]).float()
        return {"loss": (err * valid).sum() / valid.sum().clamp_min(1), "pred": pred}


def build(features, stats, cfg):
    camera = next(k for k, v in features.items() if v["dtype"] in ("video", "image"))
    state_dim = features["observation.state"]["shape"][0]
    st = stats["observation.state"]
    return TinyPolicy(camera, state_dim, features["action"]["shape"][0], 3,
                      torch.as_tensor(st["mean"], dtype=torch.float32),
                      torch.as_tensor(st["std"], dtype=torch.float32).clamp_min(1e-3))


def build_not_a_module(features, stats, cfg):
    return "a string"


class NoLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, batch):
        return {"pred": self.w.sum()}


def build_no_loss(features, stats, cfg):
    return NoLoss()
