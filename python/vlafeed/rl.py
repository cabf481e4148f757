"""Asynchronous RL training on Ray actors: rollout workers, a batching policy server, a streaming learner.

    from vlafeed.rl import RLConfig, train
    report = train(RLConfig(env="toy-reach", num_workers=2, steps=30,
                            train_async=True, rollout_async=True, streamer=True))

The pieces (RL-VLA3's three levels of asynchrony, each behind a switch so the
ablation can be run):

- RolloutWorker (Ray actor, `max_restarts`): steps `envs_per_worker`
  Gymnasium-API environments. Actions come from the PolicyServer. Each step
  records the policy version that chose it. With `rollout_async` each env
  runs on its own: the worker waits for whichever env's action comes back
  first (ray.wait), and a finished trajectory goes into the bounded queue at
  once. Without it, the worker's envs step in lockstep (one action request
  for all of them per step), and the round's trajectories are delivered
  together when the round ends.
- PolicyServer (async Ray actor): dynamic batching. Requests wait until
  `max_batch_size` are queued or `max_wait_ms` has passed since the first
  one. Under load the batches are large; when idle a lone request waits at
  most max_wait_ms. It holds the latest weights that the learner publishes.
- Learner (in the calling process): takes trajectories from the queue.
  With `streamer` it runs forward/backward on each micro-batch
  (`micro_batch` trajectories) as soon as it is complete; without it, only
  once the whole global batch is in. Gradients accumulate; after
  `global_batch` trajectories the optimizer steps, the version goes up, and
  the weights go to the server.
- `train_async`: the workers keep generating while the learner trains
  (bounded by the queue and by `max_lag`). Without it, rollouts run in
  rounds: the workers make one global batch with the current weights and
  stop, then the learner trains.
- `colocated` (sync baseline): no Ray. One process steps all envs in lockstep
  with a local copy of the policy, then trains.

Policy-version lag = learner version at training time minus the oldest
version that acted in the trajectory. It is recorded per trajectory.
Trajectories with lag > `max_lag` are dropped and counted. The loss is
REINFORCE with a running-mean baseline and a PPO-style clipped importance
ratio against the behaviour log-probabilities, so slightly stale samples are
corrected.

Faults: an environment that raises in reset/step loses the trajectory in
progress (counted in `env_errors`, the first message kept); past
`max_env_errors` in total, the run stops with an error naming the env and
the exception. A worker that dies is restarted by Ray (`max_restarts`);
its episode in flight is lost and counted in `worker_restarts`. Its run is
resubmitted. A worker dead for good, a dead server, or no trajectory for
`stall_timeout_s` ends the run with RLError. Every exit path (Ctrl-C
included) stops the workers, kills the actors and reports what was dropped.
"""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import torch
import torch.nn as nn

try:
    import gymnasium as gym
except ImportError:  # pragma: no cover - install-deps installs it
    gym = None


class RLError(RuntimeError):
    """The run cannot go on: a worker or the server is gone, an env keeps raising, nothing arrives."""


# ---------------------------------------------------------------------------
# a toy task

class ToyReachEnv(gym.Env if gym else object):
    """A 2-D reaching task (a point end-effector moving to a target on a grid).

    Observation: (target - position) / size, 2 floats. Actions: 0 stay, 1 +x, 2 -x, 3 +y, 4 -y.
    Reward: 0.1 per grid step closer to the target (-0.1 per step away), -0.02 per step, +1 on reaching
    it (the episode ends); at most `max_steps` steps.
    `step_delay_ms` sleeps in each step to stand in for a simulator's cost.
    `fail_every`: raise RuntimeError in the step after every N-th reset (fault tests)."""

    metadata = {"render_modes": []}

    def __init__(self, size: int = 6, max_steps: int = 24, step_delay_ms: float = 0.0, fail_every: int = 0,
                 fail_at_step: int = 3):
        self.size, self.max_steps, self.delay = size, max_steps, step_delay_ms / 1000.0
        self.fail_every, self.fail_at_step = fail_every, fail_at_step
        if gym:
            self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
            self.action_space = gym.spaces.Discrete(5)
        self.resets = 0

    def _obs(self):
        return ((self.target - self.pos) / self.size).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # gymnasium seeds self.np_random
        self.rng = self.np_random
        self.resets += 1
        self.t = 0
        self.pos = self.rng.integers(0, self.size, 2)
        self.target = self.rng.integers(0, self.size, 2)
        while (self.target == self.pos).all():
            self.target = self.rng.integers(0, self.size, 2)
        return self._obs(), {}

    def step(self, action):
        if self.delay:
            time.sleep(self.delay)
        self.t += 1
        if self.fail_every and self.resets % self.fail_every == 0 and self.t == self.fail_at_step:
            raise RuntimeError(f"ToyReachEnv: simulated failure in episode {self.resets} step {self.t}")
        if not 0 <= int(action) < 5:
            raise ValueError(f"ToyReachEnv: action {action!r} outside Discrete(5)")
        move = [(0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)][int(action)]
        before = np.abs(self.target - self.pos).sum()
        self.pos = np.clip(self.pos + np.array(move), 0, self.size - 1)
        after = np.abs(self.target - self.pos).sum()
        reached = bool(after == 0)
        reward = float(0.1 * (before - after) - 0.02 + (1.0 if reached else 0.0))
        return self._obs(), reward, reached, self.t >= self.max_steps, {}


def make_env(spec: Union[str, Callable[[], Any]], env_kwargs: Optional[dict] = None):
    """'toy-reach' -> ToyReachEnv(**env_kwargs); any other string -> gymnasium.make(spec); a callable is called."""
    env_kwargs = env_kwargs or {}
    if callable(spec):
        return spec(**env_kwargs)
    if spec == "toy-reach":
        return ToyReachEnv(**env_kwargs)
    if gym is None:
        raise RLError(f"environment '{spec}' needs gymnasium (pip install gymnasium)")
    return gym.make(spec, **env_kwargs)


# ---------------------------------------------------------------------------
# policy and loss

class PolicyNet(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, n_actions))

    def forward(self, obs):
        return self.net(obs)


def env_dims(cfg: "RLConfig"):
    env = make_env(cfg.env, cfg.env_kwargs)
    try:
        obs_dim = int(np.prod(env.observation_space.shape))
        n = int(env.action_space.n)
    finally:
        if hasattr(env, "close"):
            env.close()
    return obs_dim, n


def act_batch(model: nn.Module, obs: np.ndarray, rng: np.random.Generator):
    with torch.no_grad():
        logits = model(torch.as_tensor(np.asarray(obs, dtype=np.float32)))
        logp_all = torch.log_softmax(logits, -1).numpy()
    p = np.exp(logp_all)
    p /= p.sum(-1, keepdims=True)
    actions = np.array([rng.choice(p.shape[1], p=row) for row in p])
    return actions, logp_all[np.arange(len(actions)), actions]


@dataclass
class RLConfig:
    env: Any = "toy-reach"             # 'toy-reach', a gymnasium id, or a picklable callable returning an env
    env_kwargs: dict = field(default_factory=dict)
    num_workers: int = 2
    envs_per_worker: int = 2
    steps: int = 20                    # optimizer steps
    global_batch: int = 16             # trajectories per optimizer step
    micro_batch: int = 4               # trajectories per forward/backward
    max_batch_size: int = 8            # policy server: largest batch
    max_wait_ms: float = 2.0           # policy server: longest wait after a batch's first request
    queue_size: int = 32               # bounded trajectory queue
    max_lag: int = 2                   # drop trajectories older than this many versions
    train_async: bool = True
    rollout_async: bool = True
    streamer: bool = True
    colocated: bool = False            # sync colocated baseline: one process, no Ray actors
    lr: float = 3e-3
    gamma: float = 0.97
    clip: float = 0.2
    hidden: int = 64
    seed: int = 0
    max_restarts: int = 1
    max_env_errors: int = 20
    stall_timeout_s: float = 60.0

    def check(self):
        if self.global_batch % self.micro_batch:
            raise ValueError(f"global_batch {self.global_batch} is not a multiple of micro_batch {self.micro_batch}")
        for k in ("num_workers", "envs_per_worker", "steps", "global_batch", "micro_batch", "max_batch_size",
                  "queue_size"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if self.max_wait_ms < 0 or self.max_lag < 0:
            raise ValueError("max_wait_ms and max_lag must be >= 0")


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


def _new_traj():
    return {"obs": [], "actions": [], "logp": [], "rewards": [], "versions": []}


def _finish(tr, tid):
    return {"id": tid, "obs": np.asarray(tr["obs"], dtype=np.float32), "actions": np.asarray(tr["actions"]),
            "logp": np.asarray(tr["logp"], dtype=np.float32), "rewards": np.asarray(tr["rewards"], dtype=np.float32),
            "versions": np.asarray(tr["versions"], dtype=np.int64), "finished_at": time.perf_counter()}


# ---------------------------------------------------------------------------
# Ray actors (defined lazily so importing vlafeed.rl does not import ray)

_ACTORS = {}


def _actors():
    if _ACTORS:
        return _ACTORS
    import ray

    @ray.remote
    class PolicyServer:
        """Dynamic batching of action requests over the latest published weights."""

        def __init__(self, cfg: RLConfig, obs_dim: int, n_actions: int, state: dict):
            self.cfg = cfg
            self.model = PolicyNet(obs_dim, n_actions, cfg.hidden)
            self.model.load_state_dict(state)
            self.version = 0
            self.rng = np.random.default_rng(cfg.seed + 999)
            self.pending: list = []
            self.arrived = None
            self.task = None
            self.batch_sizes: List[int] = []
            self.stop = False  # the run's stop flag, read by the workers
            torch.set_num_threads(1)

        def set_weights(self, state: dict, version: int) -> int:
            self.model.load_state_dict(state)
            self.version = version
            return version

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
                    "version": self.version}

    @ray.remote
    class RolloutWorker:
        def __init__(self, worker_id: int, cfg: RLConfig, server, queue):
            self.wid, self.cfg, self.server, self.queue = worker_id, cfg, server, queue
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.incarnation = 1 if ray.get_runtime_context().was_current_actor_reconstructed else 0
            self.seq = 0
            self.envs = [make_env(cfg.env, cfg.env_kwargs) for _ in range(cfg.envs_per_worker)]
            self.env_errors = 0
            self.first_error = None
            self.steps = 0
            self.pushed: List[str] = []
            self.dropped_env: List[str] = []
            self.abandoned = 0

        def pid(self):
            import os
            return os.getpid()

        def _reset(self, e):
            seed = self.cfg.seed * 100003 + self.wid * 1009 + self.incarnation * 7919 + self.seq * 31 + e
            obs, _ = self.envs[e].reset(seed=seed)
            tid = f"w{self.wid}.i{self.incarnation}.e{self.seq}"
            self.seq += 1
            return obs, tid

        def _error(self, e, tid, exc):
            self.env_errors += 1
            self.dropped_env.append(tid)
            if self.first_error is None:
                self.first_error = f"worker {self.wid} env {e} ({type(self.envs[e]).__name__}): " \
                                   f"{type(exc).__name__}: {exc}"
            try:
                self.envs[e].close()
            except Exception:
                pass
            self.envs[e] = make_env(self.cfg.env, self.cfg.env_kwargs)

        def _stop(self) -> bool:
            self.checked = time.perf_counter()
            return bool(ray.get(self.server.should_stop.remote()))

        def _stop_due(self) -> bool:
            """The stop flag, asked at most every 0.25 s (mid-episode checks; a stop abandons the episode)."""
            if time.perf_counter() - getattr(self, "checked", 0.0) < 0.25:
                return False
            if self._stop():
                self.abandoned += 1
                return True
            return False

        def _push(self, trajs):
            for t in trajs:
                while True:
                    try:
                        self.queue.put(t, timeout=0.5)
                        self.pushed.append(t["id"])
                        break
                    except Exception:  # ray.util.queue.Full
                        if self._stop():
                            return

        def run(self, episodes: Optional[int] = None) -> dict:
            """Run `episodes` trajectories (None: until the control actor says stop); returns counts."""
            t0 = time.perf_counter()
            self.pushed, self.dropped_env = [], []
            steps0, err0 = self.steps, self.env_errors
            if self.cfg.rollout_async:
                self._run_async(episodes)
            else:
                self._run_lockstep(episodes)
            return {"worker": self.wid, "incarnation": self.incarnation, "pushed": self.pushed,
                    "abandoned_at_stop": self.abandoned,
                    "dropped_env": self.dropped_env, "env_steps": self.steps - steps0,
                    "env_errors": self.env_errors - err0, "first_error": self.first_error,
                    "seconds": time.perf_counter() - t0}

        def _check_errors(self):
            if self.env_errors > self.cfg.max_env_errors:
                raise RLError(f"environment kept raising ({self.env_errors} errors > max_env_errors="
                              f"{self.cfg.max_env_errors}); first: {self.first_error}")

        def _run_lockstep(self, episodes):
            """All envs of this worker step together; the round's trajectories are delivered at its end."""
            done_eps = 0
            while episodes is None or done_eps < episodes:
                if episodes is None and self._stop():
                    return
                n = len(self.envs) if episodes is None else min(len(self.envs), episodes - done_eps)
                active, trs, obs, ids, out = {}, {}, {}, {}, []
                for e in range(n):
                    try:
                        obs[e], ids[e] = self._reset(e)
                        trs[e] = _new_traj()
                        active[e] = True
                    except Exception as exc:
                        self._error(e, f"w{self.wid}.reset", exc)
                while active:
                    if episodes is None and self._stop_due():
                        return
                    es = sorted(active)
                    acts, logps, ver = ray.get(self.server.act.remote(np.stack([obs[e] for e in es])))
                    for j, e in enumerate(es):
                        try:
                            o2, r, term, trunc, _ = self.envs[e].step(int(acts[j]))
                        except Exception as exc:
                            self._error(e, ids[e], exc)
                            del active[e]
                            continue
                        self.steps += 1
                        tr = trs[e]
                        tr["obs"].append(obs[e]), tr["actions"].append(int(acts[j])), tr["logp"].append(logps[j])
                        tr["rewards"].append(r), tr["versions"].append(ver)
                        obs[e] = o2
                        if term or trunc:
                            out.append(_finish(tr, ids[e]))
                            del active[e]
                done_eps += n
                self._check_errors()
                self._push(out)

        def _run_async(self, episodes):
            """Each env on its own: step whichever env's action arrives first; push each trajectory at once."""
            started = 0
            inflight, state = {}, {}

            def start(e):
                nonlocal started
                while True:
                    if episodes is not None and started >= episodes:
                        return False
                    try:
                        o, tid = self._reset(e)
                    except Exception as exc:
                        self._error(e, f"w{self.wid}.reset", exc)
                        self._check_errors()
                        continue
                    started += 1
                    state[e] = (o, tid, _new_traj())
                    inflight[self.server.act.remote(o[None])] = e
                    return True

            for e in range(len(self.envs)):
                start(e)
            while inflight:
                if episodes is None and self._stop_due():
                    return
                ready, _ = ray.wait(list(inflight), num_returns=1)
                ref = ready[0]
                e = inflight.pop(ref)
                acts, logps, ver = ray.get(ref)
                o, tid, tr = state[e]
                try:
                    o2, r, term, trunc, _ = self.envs[e].step(int(acts[0]))
                except Exception as exc:
                    self._error(e, tid, exc)
                    self._check_errors()
                    if not (episodes is None and self._stop()):
                        start(e)
                    continue
                self.steps += 1
                tr["obs"].append(o), tr["actions"].append(int(acts[0])), tr["logp"].append(logps[0])
                tr["rewards"].append(r), tr["versions"].append(ver)
                if term or trunc:
                    self._push([_finish(tr, tid)])
                    if not (episodes is None and self._stop()):
                        start(e)
                else:
                    state[e] = (o2, tid, tr)
                    inflight[self.server.act.remote(o2[None])] = e

    _ACTORS.update(PolicyServer=PolicyServer, RolloutWorker=RolloutWorker)
    return _ACTORS


# ---------------------------------------------------------------------------
# the run

def _report(cfg, learner, t0, env_steps, extra):
    secs = time.perf_counter() - t0
    k = max(1, min(len(learner.returns) // 4, 4 * cfg.global_batch))
    lags = learner.lags
    rep = {"config": {k2: v for k2, v in asdict(cfg).items() if k2 != "env"} | {"env": str(cfg.env)},
           "seconds": secs, "optimizer_steps": learner.version, "env_steps": env_steps,
           "env_steps_per_s": env_steps / secs if secs else 0.0,
           "trained_trajectories": len(learner.trained_ids), "trained_samples": learner.trained_steps,
           "trained_samples_per_s": learner.trained_steps / secs if secs else 0.0,
           "first_return": float(np.mean(learner.returns[:k])) if learner.returns else math.nan,
           "last_return": float(np.mean(learner.returns[-k:])) if learner.returns else math.nan,
           "lag_max": max(lags, default=0), "lag_mean": float(np.mean(lags)) if lags else 0.0,
           "lag_histogram": {str(v): lags.count(v) for v in sorted(set(lags))},
           "trained_ids": learner.trained_ids}
    rep.update(extra)
    return rep


def train_colocated(cfg: RLConfig) -> dict:
    """Synchronous colocated baseline: one process, all envs in lockstep with the learner's own policy."""
    cfg.check()
    obs_dim, n_act = env_dims(cfg)
    learner = Learner(cfg, obs_dim, n_act)
    envs = [make_env(cfg.env, cfg.env_kwargs) for _ in range(cfg.num_workers * cfg.envs_per_worker)]
    rng = np.random.default_rng(cfg.seed + 999)
    seq, env_steps, env_errors, dropped = 0, 0, 0, []
    first_error = None
    t0 = time.perf_counter()
    while learner.version < cfg.steps:
        batch = []
        while len(batch) < cfg.global_batch:
            n = min(len(envs), cfg.global_batch - len(batch))
            obs, trs, ids, active = {}, {}, {}, set()
            for e in range(n):
                obs[e], _ = envs[e].reset(seed=cfg.seed * 100003 + seq * 31 + e)
                ids[e] = f"c.e{seq}"
                seq += 1
                trs[e] = _new_traj()
                active.add(e)
            while active:
                es = sorted(active)
                acts, logps = act_batch(learner.model, np.stack([obs[e] for e in es]), rng)
                for j, e in enumerate(es):
                    try:
                        o2, r, term, trunc, _ = envs[e].step(int(acts[j]))
                    except Exception as exc:
                        env_errors += 1
                        dropped.append(ids[e])
                        first_error = first_error or f"env {e}: {type(exc).__name__}: {exc}"
                        if env_errors > cfg.max_env_errors:
                            raise RLError(f"environment kept raising ({env_errors} errors); first: {first_error}")
                        envs[e] = make_env(cfg.env, cfg.env_kwargs)
                        active.discard(e)
                        continue
                    env_steps += 1
                    tr = trs[e]
                    tr["obs"].append(obs[e]), tr["actions"].append(int(acts[j])), tr["logp"].append(logps[j])
                    tr["rewards"].append(r), tr["versions"].append(learner.version)
                    obs[e] = o2
                    if term or trunc:
                        batch.append(_finish(tr, ids[e]))
                        active.discard(e)
        for i in range(0, cfg.global_batch, cfg.micro_batch):
            learner.micro_step(batch[i:i + cfg.micro_batch])
        learner.step()
    return _report(cfg, learner, t0, env_steps, {"mode": "sync colocated", "env_errors": env_errors,
                                                 "dropped_env_ids": dropped, "first_env_error": first_error,
                                                 "dropped_stale_ids": [], "unused_ids": [], "pushed_ids": None,
                                                 "worker_restarts": 0, "server": None})


def mode_name(cfg: RLConfig) -> str:
    if cfg.colocated:
        return "sync colocated"
    parts = ["disaggregated"]
    parts += ["train async"] if cfg.train_async else []
    parts += ["rollout async"] if cfg.rollout_async else []
    parts += ["streamer"] if cfg.streamer else []
    return ("sync " if not cfg.train_async else "") + " + ".join(parts)


def train(cfg: RLConfig, on_step: Optional[Callable[[dict], None]] = None, _hooks: Optional[dict] = None) -> dict:
    """Run the pipeline that cfg's switches select; returns the report (counts, throughput, lags, returns).

    Needs ray.init() to have been called (else it calls ray.init() with defaults) unless cfg.colocated.
    `on_step(info)` is called after each optimizer step (tests use it to kill a worker)."""
    if cfg.colocated:
        return train_colocated(cfg)
    cfg.check()
    import ray
    from ray.exceptions import RayActorError, RayTaskError
    from ray.util.queue import Empty, Queue
    if not ray.is_initialized():
        ray.init()
    A = _actors()
    obs_dim, n_act = env_dims(cfg)
    learner = Learner(cfg, obs_dim, n_act)
    queue = Queue(maxsize=cfg.queue_size, actor_options={"num_cpus": 0})
    server = control = A["PolicyServer"].options(num_cpus=0, max_concurrency=1000).remote(cfg, obs_dim, n_act,
                                                                                 learner.state())
    # max_concurrency=2: pid() answers while run() is going (run is the one long call a worker has)
    workers = [A["RolloutWorker"].options(num_cpus=0, max_restarts=cfg.max_restarts, max_task_retries=0,
                                          max_concurrency=2)
               .remote(i, cfg, server, queue) for i in range(cfg.num_workers)]
    runs: Dict[Any, int] = {}
    results: List[dict] = []
    restarts = 0
    dropped_stale: List[str] = []
    unused: List[str] = []
    env_steps = 0
    try:  # the clock starts once every actor is up (process start and imports are not throughput)
        pids = ray.get([w.pid.remote() for w in workers] + [server.stats.remote()], timeout=120)[:-1]
    except Exception as e:
        for a in workers + [server]:
            ray.kill(a)
        raise RLError(f"rollout workers did not start: {e}") from None
    t0 = time.perf_counter()
    per_worker = [cfg.global_batch // cfg.num_workers + (1 if i < cfg.global_batch % cfg.num_workers else 0)
                  for i in range(cfg.num_workers)]

    def launch(i, episodes):
        runs[workers[i].run.remote(episodes)] = i

    def collect_finished(block=False):
        """Gather finished worker runs; resubmit after a restart; raise on a dead worker or an env error."""
        nonlocal restarts, env_steps
        if not runs:
            return
        ready, _ = ray.wait(list(runs), num_returns=len(runs) if block else 1, timeout=None if block else 0)
        for ref in ready:
            i = runs.pop(ref)
            try:
                res = ray.get(ref)
            except RayTaskError as e:
                cause = e.cause if getattr(e, "cause", None) is not None else e
                raise RLError(f"rollout worker {i} failed: {cause}") from None
            except RayActorError as e:
                restarts += 1
                if restarts > cfg.max_restarts * cfg.num_workers or not _alive(workers[i]):
                    raise RLError(f"rollout worker {i} died and was not restarted (max_restarts="
                                  f"{cfg.max_restarts}): {str(e).splitlines()[0]}") from None
                if cfg.train_async:
                    launch(i, None)
                else:
                    launch(i, 1)  # replace the episode lost in flight (its number is unknown: at least one)
                continue
            results.append(res)
            env_steps += res["env_steps"]

    def _alive(w):
        """True once a restarted worker answers; False when Ray says it is dead for good."""
        from ray.exceptions import ActorUnavailableError
        deadline = time.perf_counter() + 60
        while time.perf_counter() < deadline:
            try:
                ray.get(w.pid.remote(), timeout=30)
                return True
            except ActorUnavailableError:  # restarting: ask again
                time.sleep(0.2)
            except Exception:
                return False
        return False

    def next_traj():
        waited = time.perf_counter()
        while True:
            try:
                return queue.get(timeout=0.2)
            except Empty:
                collect_finished()
                if not cfg.train_async and not runs and queue.empty():
                    return None  # the round is over and short (env errors or a lost episode)
                if time.perf_counter() - waited > cfg.stall_timeout_s:
                    raise RLError(f"no trajectory arrived for {cfg.stall_timeout_s:.0f} s (workers running: "
                                  f"{len(runs)})")

    try:
        if cfg.train_async:
            for i in range(cfg.num_workers):
                launch(i, None)
        while learner.version < cfg.steps:
            if not cfg.train_async:
                for i in range(cfg.num_workers):
                    if per_worker[i]:
                        launch(i, per_worker[i])
            pending: List[dict] = []
            got = 0
            while got < cfg.global_batch:
                t = next_traj()
                if t is None:
                    for i in range(cfg.num_workers):  # top the round up
                        launch(i, 1)
                    continue
                if learner.lag(t) > cfg.max_lag:
                    dropped_stale.append(t["id"])
                    continue
                pending.append(t)
                got += 1
                if cfg.streamer and len(pending) == cfg.micro_batch:
                    learner.micro_step(pending)
                    pending = []
            if not cfg.streamer:
                for i in range(0, len(pending), cfg.micro_batch):
                    learner.micro_step(pending[i:i + cfg.micro_batch])
                pending = []
            if not cfg.train_async:
                collect_finished(block=True)
                while True:  # anything a topping-up round added beyond the batch is not trained
                    try:
                        unused.append(queue.get_nowait()["id"])
                    except Empty:
                        break
            learner.step()
            ray.get(server.set_weights.remote(learner.state(), learner.version))
            collect_finished()
            if on_step:
                on_step({"version": learner.version, "workers": workers, "server": server, "worker_pids": pids})
    except BaseException:
        ray.get(control.set_stop.remote())
        raise
    finally:
        try:
            ray.get(control.set_stop.remote(), timeout=10)
            if runs:
                ready, not_ready = ray.wait(list(runs), num_returns=len(runs), timeout=30)
                for ref in ready:
                    try:
                        res = ray.get(ref)
                        results.append(res)
                        env_steps += res["env_steps"]
                    except RayActorError:  # died (and maybe restarted) after the last check
                        restarts += 1
                    except Exception:
                        pass
                runs.clear()
            while True:
                try:
                    unused.append(queue.get_nowait()["id"])
                except Exception:
                    break
            server_stats = ray.get(server.stats.remote(), timeout=10)
        except Exception:
            server_stats = None
        for a in workers + [server]:
            try:
                ray.kill(a)
            except Exception:
                pass
        try:
            queue.shutdown(force=True)
        except Exception:
            pass
    pushed = [tid for r in results for tid in r["pushed"]]
    dropped_env = [tid for r in results for tid in r["dropped_env"]]
    errs = [r for r in results if r["first_error"]]
    return _report(cfg, learner, t0, env_steps, {
        "mode": mode_name(cfg), "env_errors": sum(r["env_errors"] for r in results),
        "first_env_error": errs[0]["first_error"] if errs else None, "dropped_env_ids": dropped_env,
        "dropped_stale_ids": dropped_stale, "unused_ids": unused, "pushed_ids": pushed,
        "worker_restarts": restarts, "server": server_stats, "worker_pids": pids,
        "worker_runs": [{"worker": r["worker"], "incarnation": r["incarnation"], "pushed": len(r["pushed"]),
                         "env_steps": r["env_steps"]} for r in results],
        "abandoned_at_stop": sum(r.get("abandoned_at_stop", 0) for r in results)})


# ---------------------------------------------------------------------------
# command line

def main(argv=None) -> int:
    import argparse
    import json
    import sys
    p = argparse.ArgumentParser(prog="vlafeed rl",
                                description="Asynchronous RL on Ray actors: train a policy on a Gymnasium env and "
                                            "report throughput, version lag and what was dropped.")
    p.add_argument("--env", default="toy-reach", help="'toy-reach' (built in) or a gymnasium id, e.g. CartPole-v1")
    p.add_argument("--workers", type=int, default=2, help="rollout workers (Ray actors)")
    p.add_argument("--envs-per-worker", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--global-batch", type=int, default=16, help="trajectories per optimizer step")
    p.add_argument("--micro-batch", type=int, default=4, help="trajectories per forward/backward")
    p.add_argument("--max-batch-size", type=int, default=8, help="policy server: largest inference batch")
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="policy server: longest wait to fill a batch")
    p.add_argument("--max-lag", type=int, default=2, help="drop trajectories more than this many versions old")
    p.add_argument("--queue-size", type=int, default=32, help="bounded trajectory queue")
    p.add_argument("--no-train-async", action="store_true", help="rollouts pause while the learner trains")
    p.add_argument("--no-rollout-async", action="store_true", help="a worker's envs step in lockstep")
    p.add_argument("--no-streamer", action="store_true", help="train only once the whole global batch is in")
    p.add_argument("--colocated", action="store_true", help="sync colocated baseline (one process, no Ray)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-cpus", type=int, default=None, help="ray.init(num_cpus=...) (default: Ray's)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    a = p.parse_args(argv)
    cfg = RLConfig(env=a.env, num_workers=a.workers, envs_per_worker=a.envs_per_worker, steps=a.steps,
                   global_batch=a.global_batch, micro_batch=a.micro_batch, max_batch_size=a.max_batch_size,
                   max_wait_ms=a.max_wait_ms, max_lag=a.max_lag, queue_size=a.queue_size,
                   train_async=not a.no_train_async, rollout_async=not a.no_rollout_async,
                   streamer=not a.no_streamer, colocated=a.colocated, lr=a.lr, seed=a.seed)
    try:
        cfg.check()
    except ValueError as e:
        p.error(str(e))
    if not cfg.colocated:
        import ray
        ray.init(num_cpus=a.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        rep = train(cfg)
    except RLError as e:
        print(f"vlafeed.rl: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("vlafeed.rl: interrupted; workers stopped", file=sys.stderr)
        return 130
    if a.json:
        print(json.dumps({k: v for k, v in rep.items()}, indent=2, default=str))
    else:
        print(f"{rep['mode']}: {rep['optimizer_steps']} steps in {rep['seconds']:.1f} s; "
              f"{rep['env_steps_per_s']:.0f} env steps/s, {rep['trained_samples_per_s']:.0f} trained samples/s; "
              f"return {rep['first_return']:.3f} -> {rep['last_return']:.3f}; lag mean {rep['lag_mean']:.2f} "
              f"max {rep['lag_max']}; dropped: {len(rep['dropped_stale_ids'])} stale, {rep['env_errors']} env "
              f"errors, {len(rep['unused_ids'])} unused at shutdown; worker restarts {rep['worker_restarts']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
