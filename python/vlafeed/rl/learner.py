"""The learner: the policy (vlafeed.rl.policies), the loss of cfg.algorithm (vlafeed.rl.algos),
gradients accumulated per micro-batch, one optimizer step per global batch (plus ppo_epochs - 1
more passes over the stored batch), and checkpoints (vlafeed.rl.checkpoint)."""
from __future__ import annotations

from typing import List

import numpy as np
import torch

from vlafeed.rl import algos
from vlafeed.rl import spaces as S
from vlafeed.rl.config import RLConfig
from vlafeed.rl.policies import make_policy, module_of


def _spaces(a, b):
    """(observation_space, action_space) from spaces, or from the old (obs_dim, n_actions) ints."""
    if isinstance(a, int) and isinstance(b, int):
        return S.gspaces.Box(-np.inf, np.inf, (a,), np.float32), S.gspaces.Discrete(b)
    return a, b


class Learner:
    """Accumulates gradients per micro-batch, steps after the global batch."""

    def __init__(self, cfg: RLConfig, observation_space, action_space):
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.observation_space, self.action_space = _spaces(observation_space, action_space)
        self.value_head = cfg.algorithm == "ppo"
        self.policy = make_policy(self.observation_space, self.action_space, cfg.policy, hidden=cfg.hidden,
                                  value_head=self.value_head, squash=cfg.action_squash)
        self.model = module_of(self.policy)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.version = 0
        self.baseline = 0.0
        self.in_batch = 0
        self.trained_ids: List[str] = []
        self.lags: List[int] = []
        self.returns: List[float] = []
        self.trained_steps = 0
        self.step_returns: List[float] = []
        self.stored: List[List[dict]] = []  # the global batch's micro-batches (ppo_epochs > 1)
        self.extra: dict = {}  # the run's own resume state (its counters, queue position, accounting)
        self.last_checkpoint = None
        self.opt.zero_grad(set_to_none=True)
        if cfg.resume:
            from vlafeed.rl import checkpoint
            self.last_checkpoint = checkpoint.restore(self, cfg.checkpoint_dir)
        self.resumed_samples = self.trained_steps  # trained before this run (throughput counts this run's)

    def state(self):
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def lag(self, traj) -> int:
        return self.version - int(min(traj["versions"]))

    # ------------------------------------------------------------------
    def _advantages(self, trajs: List[dict]):
        """Per-step advantages (and value targets for ppo), computed once per trajectory."""
        cfg = self.cfg
        if cfg.algorithm == "grpo":
            ga = algos.group_advantages(trajs)
            for t in trajs:
                t.setdefault("adv", np.full(len(t["rewards"]), ga[t["id"]]))
        elif cfg.algorithm == "ppo":
            todo = [t for t in trajs if "adv" not in t]
            if todo:
                with torch.no_grad():
                    parts = [t["obs"] for t in todo] + [t["last_obs"] for t in todo]
                    v = self._values(S.concat(parts))
                n = sum(len(t["rewards"]) for t in todo)
                vals, last = v[:n], v[n:]
                i = 0
                for j, t in enumerate(todo):
                    T = len(t["rewards"])
                    lv = 0.0 if t.get("terminated", True) else float(last[j])
                    t["adv"], t["ret"] = algos.gae(np.asarray(t["rewards"], np.float64),
                                                   vals[i:i + T].astype(np.float64), lv, cfg.gamma, cfg.gae_lambda)
                    i += T
        else:
            for t in trajs:
                t.setdefault("ret", algos.discounted(t["rewards"], cfg.gamma))

    def _values(self, obs) -> np.ndarray:
        pol = self.policy
        out = pol.params(pol._prep(S.to_torch(obs))) if hasattr(pol, "params") else None
        if out is None or out[1] is None:
            raise RuntimeError("algorithm 'ppo' needs a policy with a value head")
        return out[1].float().cpu().numpy()

    def _loss(self, trajs: List[dict]) -> torch.Tensor:
        cfg = self.cfg
        obs = S.to_torch(S.concat([t["obs"] for t in trajs]))
        act = torch.from_numpy(np.concatenate([t["actions"] for t in trajs]))
        old = torch.as_tensor(np.concatenate([t["logp"] for t in trajs]), dtype=torch.float32)
        logp, ent, value = self.policy.evaluate(obs, act)
        dev = logp.device
        old = old.to(dev)
        ratio = torch.exp(logp - old)
        n_micro = cfg.global_batch // cfg.micro_batch
        if cfg.algorithm == "reinforce":
            ret = torch.as_tensor(np.concatenate([t["ret"] for t in trajs]), dtype=torch.float32, device=dev)
            adv = ret - self.baseline
            obj = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
            loss = -(obj.sum() / cfg.global_batch)
            return loss - cfg.ent_coef * ent.sum() / cfg.global_batch
        adv = torch.as_tensor(np.concatenate([t["adv"] for t in trajs]), dtype=torch.float32, device=dev)
        if cfg.algorithm == "ppo" and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        obj = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
        loss = -obj.mean() - cfg.ent_coef * ent.mean()
        if cfg.algorithm == "ppo":
            ret = torch.as_tensor(np.concatenate([t["ret"] for t in trajs]), dtype=torch.float32, device=dev)
            loss = loss + cfg.vf_coef * ((value - ret) ** 2).mean()
        return loss / n_micro

    def micro_step(self, trajs: List[dict]) -> None:
        """Forward/backward over one micro-batch; gradients accumulate until step()."""
        self._advantages(trajs)
        self._loss(trajs).backward()
        for t in trajs:
            self.trained_ids.append(t["id"])
            self.lags.append(self.lag(t))
            self.returns.append(float(np.sum(t["rewards"])))
            self.step_returns.append(float(algos.discounted(t["rewards"], self.cfg.gamma)[0]))
            self.trained_steps += len(t["rewards"])
        self.in_batch += len(trajs)
        if self.cfg.ppo_epochs > 1:
            self.stored.append(trajs)

    def step(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for _ in range(self.cfg.ppo_epochs - 1):
            for mb in self.stored:
                self._loss(mb).backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self.stored = []
        self.version += 1
        if self.step_returns:
            self.baseline = 0.5 * self.baseline + 0.5 * float(np.mean(self.step_returns))
        self.step_returns = []
        self.in_batch = 0
        cfg = self.cfg
        if cfg.checkpoint_dir and ((cfg.checkpoint_every and self.version % cfg.checkpoint_every == 0)
                                   or self.version == cfg.steps):
            self.save_checkpoint()

    # ------------------------------------------------------------------
    def save_checkpoint(self):
        from vlafeed.rl import checkpoint
        self.last_checkpoint = checkpoint.save(self, self.cfg.checkpoint_dir)
        return self.last_checkpoint

    def resume_state(self) -> dict:
        """Everything but the weights that an exact resume needs; `extra` is the run's."""
        return {"optimizer": self.opt.state_dict(), "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "version": self.version, "baseline": self.baseline, "trained_ids": list(self.trained_ids),
                "lags": list(self.lags), "returns": list(self.returns), "trained_steps": self.trained_steps,
                "extra": dict(self.extra)}

    def load_resume_state(self, st: dict) -> None:
        self.opt.load_state_dict(st["optimizer"])
        torch.set_rng_state(st["torch_rng"])
        if st.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(st["cuda_rng"])
        self.version, self.baseline = st["version"], st["baseline"]
        self.trained_ids, self.lags, self.returns = st["trained_ids"], st["lags"], st["returns"]
        self.trained_steps = st["trained_steps"]
        self.extra = dict(st["extra"])
