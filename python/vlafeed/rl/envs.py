"""Environments: the built-in toy reaching task and gymnasium's registry (make_env, env_dims)."""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Union

import numpy as np

from vlafeed.rl.config import RLConfig, RLError

try:
    import gymnasium as gym
except ImportError:  # pragma: no cover - install-deps installs it
    gym = None


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


def env_dims(cfg: "RLConfig"):
    env = make_env(cfg.env, cfg.env_kwargs)
    try:
        obs_dim = int(np.prod(env.observation_space.shape))
        n = int(env.action_space.n)
    finally:
        if hasattr(env, "close"):
            env.close()
    return obs_dim, n


def env_spaces(cfg: "RLConfig"):
    """(observation_space, action_space) of cfg's env (made once and closed)."""
    env = make_env(cfg.env, cfg.env_kwargs)
    try:
        return env.observation_space, env.action_space
    finally:
        if hasattr(env, "close"):
            env.close()


# ---------------------------------------------------------------------------
# vlafeed/InvertedPendulumPixels-v0: image + state dict observations, continuous actions, MuJoCo

def _headless_gl():
    """MuJoCo's rendering backend when none is chosen: one default for the whole package (sims._headless:
    EGL, which gym-aloha's dm_control needs too; MUJOCO_GL=osmesa also works for gymnasium's tasks). Must
    run before mujoco is imported."""
    from vlafeed.rl.sims import _headless
    _headless()


def make_inverted_pendulum_pixels(width: int = 64, height: int = 64, max_episode_steps: int = 1000, **kwargs):
    """gymnasium's MuJoCo InvertedPendulum-v5 with Dict observations {"pixels": uint8 [height, width, 3]
    (the default camera's RGB render), "state": the 4 floats of InvertedPendulum}; actions Box(-3, 3, (1,)).
    Needs `mujoco` (pip) and a headless GL (libosmesa6 or EGL)."""
    _headless_gl()
    try:
        import mujoco  # noqa: F401
    except ImportError as e:
        raise RLError(f"vlafeed/InvertedPendulumPixels-v0 needs MuJoCo (pip install mujoco): {e}") from None
    from gymnasium.wrappers import AddRenderObservation
    env = gym.make("InvertedPendulum-v5", render_mode="rgb_array", width=width, height=height,
                   max_episode_steps=max_episode_steps, **kwargs)
    return AddRenderObservation(env, render_only=False, render_key="pixels", obs_key="state")


if gym is not None and "vlafeed/InvertedPendulumPixels-v0" not in gym.registry:
    gym.register("vlafeed/InvertedPendulumPixels-v0", entry_point="vlafeed.rl.envs:make_inverted_pendulum_pixels",
                 disable_env_checker=True)
