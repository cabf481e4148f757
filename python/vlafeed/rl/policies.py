"""Policies of vlafeed.rl: the protocol the rollout side and the learner use, the built-in
networks, and adapters for a plain nn.Module and a LeRobot policy.

The protocol. A policy is an nn.Module (or wraps one in ``.module``) with

- ``act(obs, deterministic=False) -> ActOut``: ``obs`` is a batch (a tensor [B, ...] for a Box,
  a dict of batches for a Dict, a tuple for a Tuple; see vlafeed.rl.spaces.stack). ``ActOut``
  holds ``action`` ([B, ...] in the env's action space: int64 for Discrete/MultiDiscrete, float
  for Box, already inside the Box's bounds), ``logp`` ([B]) and ``value`` ([B] or None).
- ``evaluate(obs, action) -> (logp [B], entropy [B], value [B] or None)``: what the learner
  differentiates.

``make_policy(observation_space, action_space, spec)`` builds one: "mlp", "cnn", "auto" (cnn when
an observation leaf is an image, else mlp), "package.module:fn" (a user factory called as
``fn(observation_space, action_space)``: it returns a protocol policy as is, or an nn.Module
that maps the obs batch to distribution parameters, which ModulePolicy wraps), or
"lerobot:<type-or-path>" (LeRobotPolicy). ``load_policy(DIR)`` loads a vlafeed.rl checkpoint.

Action distributions:

- Discrete: categorical over n logits. MultiDiscrete: one categorical per dimension (logits
  concatenated, sum(nvec) of them), log-probs and entropies summed.
- Box: diagonal Gaussian; the mean comes from the network, the log-std is a learned parameter
  (state independent). ``action_squash``:
  - "tanh": a = low + (tanh(u) + 1) / 2 * (high - low), u ~ N(mean, std). The log-prob includes
    the change of variables (-sum log(1 - tanh(u)^2) - sum log((high - low) / 2)); it is computed
    from the action itself (u = atanh of the rescaled action, clamped 1e-6 inside the bounds), so
    act() and evaluate() give the same number. Needs finite bounds.
  - "clip": a = clip(u, low, high) and the distribution is the clipped (censored) Gaussian: a
    coordinate at a bound has the probability mass beyond that bound (log CDF / log survival),
    one inside has the Gaussian density. Exact, so the importance ratio is right at the bounds
    too. Infinite bounds mean no clipping.
  The entropy reported (and used for the bonus) is the Gaussian's, before squashing/clipping.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from vlafeed.rl import spaces as S
from vlafeed.rl.config import RLError
from vlafeed._entry import import_entry

gspaces = S.gspaces


@dataclass
class ActOut:
    action: torch.Tensor
    logp: torch.Tensor
    value: Optional[torch.Tensor]


# ---------------------------------------------------------------------------
# action distributions

class ActionHead:
    """Maps distribution parameters [B, n_params] (and a log-std) to samples, log-probs, entropies."""

    def __init__(self, space, squash: str = "tanh"):
        S.check_action_space(space)
        if squash not in ("tanh", "clip"):
            raise RLError(f"action_squash must be 'tanh' or 'clip', got {squash!r}")
        self.space, self.squash = space, squash
        if isinstance(space, gspaces.Discrete):
            self.kind, self.n_params = "cat", int(space.n)
        elif isinstance(space, gspaces.MultiDiscrete):
            if space.nvec.ndim != 1:
                raise RLError(f"vlafeed.rl: action space {S.describe(space)}: only 1-D MultiDiscrete is supported")
            self.kind, self.nvec = "multi", [int(n) for n in space.nvec]
            self.n_params = sum(self.nvec)
            self.start = torch.as_tensor(np.asarray(space.start, dtype=np.int64))
        else:
            self.kind = "box"
            self.shape = tuple(space.shape)
            self.dim = int(np.prod(self.shape))
            self.n_params = self.dim
            low = np.asarray(space.low, dtype=np.float64).reshape(-1)
            high = np.asarray(space.high, dtype=np.float64).reshape(-1)
            self.finite = bool(np.isfinite(low).all() and np.isfinite(high).all())
            if squash == "tanh" and not self.finite:
                raise RLError(f"vlafeed.rl: action_squash 'tanh' needs finite bounds; action space "
                              f"{S.describe(space)} has infinite ones (use action_squash='clip')")
            self.low = torch.as_tensor(np.where(np.isfinite(low), low, -np.inf), dtype=torch.float32)
            self.high = torch.as_tensor(np.where(np.isfinite(high), high, np.inf), dtype=torch.float32)

    # discrete -------------------------------------------------------------
    def _cat_parts(self, params):
        if self.kind == "cat":
            return [params]
        return list(torch.split(params, self.nvec, dim=-1))

    def sample(self, params, log_std, deterministic: bool):
        if self.kind in ("cat", "multi"):
            parts = self._cat_parts(params)
            idx = [p.argmax(-1) if deterministic else torch.distributions.Categorical(logits=p).sample()
                   for p in parts]
            if self.kind == "cat":
                a = idx[0] + int(self.space.start)
            else:
                a = torch.stack(idx, -1) + self.start.to(params.device)
            return a, self.log_prob(params, log_std, a)
        mean = params
        if deterministic:
            u = mean
        else:
            u = mean + torch.randn_like(mean) * log_std.exp()
        low, high = self.low.to(mean.device), self.high.to(mean.device)
        if self.squash == "tanh":
            a = low + (torch.tanh(u) + 1) * 0.5 * (high - low)
        else:
            a = torch.maximum(torch.minimum(u, high), low)
        a = a.reshape((a.shape[0],) + self.shape)
        return a, self.log_prob(params, log_std, a)

    def log_prob(self, params, log_std, action):
        if self.kind == "cat":
            logp = torch.log_softmax(params, -1)
            return logp.gather(1, (action.long() - int(self.space.start))[:, None])[:, 0]
        if self.kind == "multi":
            a = action.long() - self.start.to(params.device)
            return sum(torch.log_softmax(p, -1).gather(1, a[:, i:i + 1])[:, 0]
                       for i, p in enumerate(self._cat_parts(params)))
        mean = params
        a = action.reshape(action.shape[0], -1).to(mean.dtype)
        std = log_std.exp().expand_as(mean)
        low, high = self.low.to(mean.device), self.high.to(mean.device)
        if self.squash == "tanh":
            half = (high - low) * 0.5
            y = ((a - low) / half - 1).clamp(-1 + 1e-6, 1 - 1e-6)
            u = torch.atanh(y)
            lp = torch.distributions.Normal(mean, std).log_prob(u)
            lp = lp - torch.log1p(-y * y) - torch.log(half)
            return lp.sum(-1)
        normal = torch.distributions.Normal(mean, std)
        lp = normal.log_prob(a)
        z = (a - mean) / std
        at_low = torch.isfinite(low) & (a <= low)
        at_high = torch.isfinite(high) & (a >= high)
        if at_low.any() or at_high.any():
            log_cdf = torch.special.log_ndtr(z)
            log_sf = torch.special.log_ndtr(-z)
            lp = torch.where(at_low, log_cdf, torch.where(at_high, log_sf, lp))
        return lp.sum(-1)

    def entropy(self, params, log_std):
        if self.kind in ("cat", "multi"):
            return sum(torch.distributions.Categorical(logits=p).entropy() for p in self._cat_parts(params))
        ent = 0.5 + 0.5 * math.log(2 * math.pi) + log_std
        return ent.expand_as(params).sum(-1)


# ---------------------------------------------------------------------------
# encoders and the built-in network

class SmallCNN(nn.Module):
    """Three strided convolutions and a linear layer; uint8 images scaled to [0, 1]."""

    def __init__(self, space, out: int):
        super().__init__()
        self.layout = S.image_layout(space)
        c, h, w = (space.shape[2], space.shape[0], space.shape[1]) if self.layout == "hwc" else space.shape
        self.conv = nn.Sequential(nn.Conv2d(c, 16, 5, stride=2, padding=2), nn.ReLU(),
                                  nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            n = self.conv(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n, out), nn.ReLU())

    def forward(self, x):
        x = x.float() / 255.0
        if self.layout == "hwc":
            x = x.permute(0, 3, 1, 2)
        return self.fc(self.conv(x))


def _get(batch, path):
    for p in path:
        batch = batch[p]
    return batch


class Encoder(nn.Module):
    """Features of every observation leaf, concatenated: CNN features for images (with cnn=True),
    one-hot for Discrete, the flattened floats otherwise."""

    def __init__(self, space, cnn: bool, hidden: int):
        super().__init__()
        S.check_obs_space(space)
        self.paths, self.kinds = [], []
        self.cnns = nn.ModuleDict()
        size = 0
        for path, leaf in S.leaves(space):
            self.paths.append(path)
            if S.is_image(leaf) and cnn:
                self.kinds.append(("cnn", str(len(self.cnns))))
                self.cnns[str(len(self.cnns))] = SmallCNN(leaf, hidden)
                size += hidden
            elif isinstance(leaf, gspaces.Discrete):
                self.kinds.append(("onehot", int(leaf.n), int(leaf.start)))
                size += int(leaf.n)
            else:
                self.kinds.append(("flat", 255.0 if S.is_image(leaf) else 1.0))
                size += int(np.prod(leaf.shape))
        self.size = size

    def forward(self, obs):
        feats = []
        for path, kind in zip(self.paths, self.kinds):
            x = _get(obs, path)
            if kind[0] == "cnn":
                feats.append(self.cnns[kind[1]](x))
            elif kind[0] == "onehot":
                feats.append(F.one_hot(x.long() - kind[2], kind[1]).float())
            else:
                feats.append(x.reshape(x.shape[0], -1).float() / kind[1])
        return torch.cat(feats, -1)


class _DistPolicy(nn.Module):
    """act/evaluate on top of ``params(obs) -> (params [B, n], value [B] or None)``."""

    head: ActionHead

    def _device(self):
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def _prep(self, obs):
        if isinstance(obs, np.ndarray):
            obs = torch.from_numpy(obs)
        return S.to_torch(obs, self._device())

    @torch.no_grad()
    def act(self, obs, deterministic: bool = False) -> ActOut:
        """Actions for a batch (no gradients: rollouts)."""
        params, value = self.params(self._prep(obs))
        a, logp = self.head.sample(params, self.log_std_param(), deterministic)
        return ActOut(a, logp, value)

    def evaluate(self, obs, action):
        params, value = self.params(self._prep(obs))
        action = action.to(params.device)
        ls = self.log_std_param()
        return self.head.log_prob(params, ls, action), self.head.entropy(params, ls), value

    def log_std_param(self):
        return getattr(self, "log_std", None)


class ActorCritic(_DistPolicy):
    """The built-in policy: Encoder -> 2-layer tanh MLP -> action parameters; the optional value head is
    a second 2-layer MLP on the same encoder features."""

    def __init__(self, observation_space, action_space, hidden: int = 64, cnn: bool = False,
                 value_head: bool = True, squash: str = "tanh", init_log_std: float = -0.5):
        super().__init__()
        self.head = ActionHead(action_space, squash)
        self.encoder = Encoder(observation_space, cnn, hidden)
        self.trunk = nn.Sequential(nn.Linear(self.encoder.size, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                   nn.Tanh())
        self.pi = nn.Linear(hidden, self.head.n_params)
        if self.head.kind == "box":
            with torch.no_grad():  # a near-zero first mean (the middle of the Box with tanh)
                self.pi.weight.mul_(0.01)
                self.pi.bias.zero_()
        # the critic has its own MLP on the encoder's features (a shared trunk lets the value loss,
        # in return units, swamp the policy gradient)
        self.vf = nn.Sequential(nn.Linear(self.encoder.size, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                nn.Linear(hidden, 1)) if value_head else None
        if self.head.kind == "box":
            self.log_std = nn.Parameter(torch.full((self.head.dim,), float(init_log_std)))

    def params(self, obs):
        f = self.encoder(obs)
        return self.pi(self.trunk(f)), (self.vf(f)[:, 0] if self.vf is not None else None)


class ModulePolicy(_DistPolicy):
    """Adapter for a plain nn.Module: ``module(obs_batch)`` returns the distribution parameters
    (logits [B, n] for Discrete; concatenated logits [B, sum(nvec)] for MultiDiscrete; for a Box
    of d dims the mean [B, d], or [B, 2d] = mean and log-std), or a tuple (params, value [B] or
    [B, 1]). For a Box whose module gives only the mean, the log-std is a learned parameter here."""

    def __init__(self, module: nn.Module, observation_space, action_space, squash: str = "tanh",
                 init_log_std: float = -0.5):
        super().__init__()
        S.check_obs_space(observation_space)
        self.module, self.head = module, ActionHead(action_space, squash)
        if self.head.kind == "box":
            self.log_std = nn.Parameter(torch.full((self.head.dim,), float(init_log_std)))
        self._state_log_std = None

    def params(self, obs):
        out = self.module(obs)
        value = None
        if isinstance(out, (tuple, list)):
            out, value = out[0], out[1]
            if value is not None:
                value = value.reshape(value.shape[0])
        out = out.reshape(out.shape[0], -1)
        n = self.head.n_params
        if self.head.kind == "box" and out.shape[1] == 2 * n:
            out, ls = out[:, :n], out[:, n:]
            self._state_log_std = ls
        elif out.shape[1] != n:
            raise RLError(f"vlafeed.rl: module {type(self.module).__name__} returned {out.shape[1]} parameters per "
                          f"row; action space {S.describe(self.head.space)} needs {n}"
                          + (f" (or {2 * n}: mean and log-std)" if self.head.kind == "box" else ""))
        else:
            self._state_log_std = None
        return out, value

    def log_std_param(self):
        return self._state_log_std if self._state_log_std is not None else getattr(self, "log_std", None)


# ---------------------------------------------------------------------------
# LeRobot adapter

# LeRobot policy types whose action is the end of an iterative sampler: refused by the adapter
SAMPLED_ACTIONS = {"pi0": "a flow-matching integration", "pi05": "a flow-matching integration",
                   "smolvla": "a flow-matching integration"}
# diffusion: its denoising loop from zero noise is the Gaussian's mean (deterministic, so act() and evaluate()
# agree), with few sampler steps for a fresh policy (every RL step backpropagates through all of them)
DIFFUSION_RL_STEPS = 4


class LeRobotPolicy(_DistPolicy):
    """A LeRobot policy (ACT, diffusion, ...) as a Gaussian policy: the first action of its
    predicted chunk is the mean (computed with gradients: the undecorated predict_action_chunk),
    the log-std is learned here. Observations map as LeRobot's gym wrappers do: "pixels" (uint8
    HWC) -> observation.image (float CHW in [0, 1]); "agent_pos"/"state" -> observation.state;
    "environment_state" -> observation.environment_state. No normalization processor runs: feed
    a policy trained on raw units, or one made fresh from a type ("lerobot:act")."""

    def __init__(self, target: str, observation_space, action_space, squash: str = "clip", init_log_std=-0.5):
        super().__init__()
        p = Path(target)
        kind = json.loads((p / "config.json").read_text()).get("type") if (p / "config.json").is_file() else target
        if kind in SAMPLED_ACTIONS:
            raise RLError(f"vlafeed.rl: LeRobot policy {kind!r} cannot be an RL policy here: its action comes out of "
                          f"{SAMPLED_ACTIONS[kind]}, which the Gaussian adapter would have to backpropagate through "
                          f"at every step; use a policy with a direct action head (act), or a plain nn.Module")
        try:
            import lerobot  # noqa: F401
            from lerobot.configs.types import FeatureType, PolicyFeature
            from lerobot.policies.factory import get_policy_class, make_policy_config
        except ImportError as e:
            raise RLError(f"vlafeed.rl: policy 'lerobot:{target}' needs LeRobot (pip install lerobot): {e}") from None
        if not isinstance(action_space, gspaces.Box):
            raise RLError(f"vlafeed.rl: a LeRobot policy acts in a Box; action space is {S.describe(action_space)}")
        self.head = ActionHead(action_space, squash)
        self.obs_map = self._obs_map(observation_space)
        if (p / "config.json").is_file():
            cfg_type = kind
            self.module = get_policy_class(cfg_type).from_pretrained(str(p))
        else:
            feats = {}
            for key, (lkey, leaf) in self.obs_map.items():
                if S.is_image(leaf):
                    h, w, c = leaf.shape if S.image_layout(leaf) == "hwc" else (leaf.shape[1], leaf.shape[2],
                                                                                 leaf.shape[0])
                    feats[lkey] = PolicyFeature(FeatureType.VISUAL, (c, h, w))
                else:
                    feats[lkey] = PolicyFeature(FeatureType.ENV if lkey.endswith("environment_state")
                                                else FeatureType.STATE, tuple(leaf.shape))
            out = {"action": PolicyFeature(FeatureType.ACTION, (self.head.dim,))}
            try:
                import dataclasses
                fields = {f.name for f in dataclasses.fields(type(make_policy_config(target)))}
                # offline and any image size: no backbone download, no fixed random crop
                kw = {k: None for k in ("pretrained_backbone_weights", "crop_shape") if k in fields}
                if "use_group_norm" in fields:  # a backbone trained from scratch: GroupNorm, as LeRobot advises
                    kw["use_group_norm"] = True  # (BatchNorm fails on its 1-sample shape probe at small images)
                if "num_inference_steps" in fields:  # DDIM (eta 0) is deterministic; DDPM adds noise per step
                    kw.update(num_inference_steps=DIFFUSION_RL_STEPS, noise_scheduler_type="DDIM")
                pcfg = make_policy_config(target, input_features=feats, output_features=out, device="cpu", **kw)
            except ValueError as e:
                raise RLError(f"vlafeed.rl: 'lerobot:{target}' is neither a pretrained_model folder (config.json) "
                              f"nor a LeRobot policy type: {e}") from None
            try:
                self.module = get_policy_class(target)(pcfg)
            except ImportError as e:  # the policy's own extras (e.g. diffusers for diffusion)
                raise RLError(f"vlafeed.rl: LeRobot policy {target!r} cannot be built here: {e}") from None
        sched = getattr(getattr(self.module, "diffusion", None), "noise_scheduler", None)
        if sched is not None and type(sched).__name__ != "DDIMScheduler":  # a loaded DDPM policy: sampled by
            from diffusers import DDIMScheduler  # DDIM from the same schedule, deterministic from zero noise
            self.module.diffusion.noise_scheduler = DDIMScheduler.from_config(sched.config)
        fn = type(self.module).predict_action_chunk
        self._chunk = getattr(fn, "__wrapped__", fn)  # with gradients
        self.log_std = nn.Parameter(torch.full((self.head.dim,), float(init_log_std)))

    @staticmethod
    def _obs_map(space):
        names = {"pixels": "observation.image", "agent_pos": "observation.state", "state": "observation.state",
                 "environment_state": "observation.environment_state"}
        if not isinstance(space, gspaces.Dict):
            raise RLError(f"vlafeed.rl: a LeRobot policy takes Dict observations ('pixels', 'agent_pos'/'state'); "
                          f"got {S.describe(space)}")
        out = {}
        for k, leaf in space.spaces.items():
            if k not in names:
                raise RLError(f"vlafeed.rl: observation key {k!r} has no LeRobot name (known: {sorted(names)})")
            out[k] = (names[k], leaf)
        return out

    def params(self, obs):
        batch = {}
        for k, (lkey, leaf) in self.obs_map.items():
            x = obs[k]
            if S.is_image(leaf):
                x = x.float() / 255.0
                if S.image_layout(leaf) == "hwc":
                    x = x.permute(0, 3, 1, 2)
                batch[lkey] = x.contiguous()
            else:
                batch[lkey] = x.float()
        steps = int(getattr(self.module.config, "n_obs_steps", 1) or 1)
        kw = {}
        if steps > 1 or hasattr(self.module.config, "num_inference_steps"):  # diffusion
            # its observation window filled with the current observation (as LeRobot's queues are at an
            # episode's first step), and its sampler run from zero noise: a deterministic mean
            batch = {k: v.unsqueeze(1).expand(-1, steps, *v.shape[1:]) for k, v in batch.items()}
            cfg = self.module.config
            kw["noise"] = torch.zeros(batch[next(iter(batch))].shape[0], cfg.horizon, self.head.dim,
                                      device=next(self.module.parameters()).device)
        self.module.eval()
        chunk = self._chunk(self.module, batch, **kw)
        return chunk[:, 0].reshape(chunk.shape[0], -1).float(), None


# ---------------------------------------------------------------------------
# factory and checkpoint loading

def make_policy(observation_space, action_space, spec: str = "mlp", *, hidden: int = 64, value_head: bool = True,
                squash: str = "tanh"):
    """A policy for these spaces (see the module doc for spec)."""
    S.check_obs_space(observation_space)
    S.check_action_space(action_space)
    spec = spec or "mlp"
    if spec in ("mlp", "cnn", "auto"):
        has_image = any(S.is_image(leaf) for _, leaf in S.leaves(observation_space))
        if spec == "cnn" and not has_image:
            raise RLError(f"vlafeed.rl: policy 'cnn' needs an image observation (uint8 Box with 3 dims); "
                          f"{S.describe(observation_space)} has none")
        cnn = spec == "cnn" or (spec == "auto" and has_image)
        return ActorCritic(observation_space, action_space, hidden, cnn=cnn, value_head=value_head, squash=squash)
    if spec.startswith("lerobot:"):
        return LeRobotPolicy(spec[len("lerobot:"):], observation_space, action_space, squash=squash)
    if ":" in spec:
        try:
            factory = import_entry(spec)
        except (ImportError, AttributeError) as e:
            raise RLError(f"vlafeed.rl: policy factory {spec!r} not found: {e}") from None
        obj = factory(observation_space, action_space)
        if hasattr(obj, "act") and hasattr(obj, "evaluate"):
            return obj
        if isinstance(obj, nn.Module):
            return ModulePolicy(obj, observation_space, action_space, squash=squash)
        raise RLError(f"vlafeed.rl: policy factory {spec!r} returned {type(obj).__name__}: neither a policy "
                      f"(act/evaluate) nor an nn.Module")
    raise RLError(f"vlafeed.rl: unknown policy spec {spec!r} (mlp, cnn, auto, package.module:fn, lerobot:...)")


def module_of(policy) -> nn.Module:
    """The nn.Module holding a policy's parameters."""
    return policy if isinstance(policy, nn.Module) else policy.module


def load_policy(path, device: str = "cpu"):
    """A policy from a vlafeed.rl checkpoint folder (vlafeed_rl.json + model.safetensors), or from a
    checkpoint_dir (its latest step). In eval mode, on `device`."""
    from vlafeed.rl.checkpoint import latest, read_meta
    from safetensors.torch import load_file
    d = Path(path)
    if not (d / "vlafeed_rl.json").is_file():
        found = latest(d)
        if found is None:
            raise RLError(f"vlafeed.rl: {d} holds no vlafeed.rl checkpoint (vlafeed_rl.json)")
        d = found
    meta = read_meta(d)
    pol = make_policy(S.from_json(meta["observation_space"]), S.from_json(meta["action_space"]), meta["policy"],
                      hidden=meta.get("hidden", 64), value_head=meta.get("value_head", True),
                      squash=meta.get("action_squash", "tanh"))
    m = module_of(pol)
    state = load_file(str(d / "model.safetensors"))
    missing, unexpected = m.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RLError(f"vlafeed.rl: {d / 'model.safetensors'} does not fit policy {meta['policy']!r}: missing "
                      f"{missing[:5]}, unexpected {unexpected[:5]}")
    m.to(device).eval()
    pol.meta = meta
    return pol
