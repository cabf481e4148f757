"""Simulators for vlafeed.rl's evaluation and closed loop: which gymnasium ids need which PyPI
package, how to make them headless, and how each decides that an episode succeeded.

    from vlafeed.rl.sims import make_sim, success_rule
    env = make_sim("pusht")                 # gym_pusht/PushT-v0, pixels + agent_pos observations
    rule = success_rule("pusht")            # "is_success": the env's info["is_success"]

Aliases: pusht, aloha-insertion, aloha-transfer-cube, pendulum-pixels, pendulum. Any other
string goes to gymnasium.make (after importing the namespace's package, "gym_x/Name-v0" ->
gym_x), "toy-reach" is vlafeed.rl's built-in task, and a callable is called with the kwargs.

MuJoCo renders headless through EGL unless MUJOCO_GL is set already (osmesa also works for
gymnasium's MuJoCo tasks; gym-aloha's dm_control fails on osmesa here). An absent package
raises SimulatorMissing (an RLError) naming the pip package and its pinned version.

Success rules (success_rule): an env that reports info["is_success"] (gym-pusht, gym-aloha)
succeeds when any step of the episode reports it; "survive" tasks (InvertedPendulum,
InvertedDoublePendulum, CartPole, vlafeed/InvertedPendulumPixels) succeed when the episode ends
by truncation (the step limit) and not by termination (the pole fell); toy-reach succeeds when
it terminates (target reached). Other envs have no rule: success is None and pc_success null.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Optional

from vlafeed.rl.config import RLError

PIXEL_PENDULUM = "vlafeed/InvertedPendulumPixels-v0"

# pip pins, one place (scripts/install-deps.sh installs the same ones)
PIP = {"gym_pusht": "gym-pusht==0.1.8", "gym_aloha": "gym-aloha==0.1.5", "mujoco": "mujoco==3.8.1"}

ALIASES = {
    "pusht": ("gym_pusht/PushT-v0", {"obs_type": "pixels_agent_pos", "render_mode": "rgb_array"}),
    "aloha-insertion": ("gym_aloha/AlohaInsertion-v0", {"obs_type": "pixels_agent_pos", "render_mode": "rgb_array"}),
    "aloha-transfer-cube": ("gym_aloha/AlohaTransferCube-v0",
                            {"obs_type": "pixels_agent_pos", "render_mode": "rgb_array"}),
    "pendulum-pixels": (PIXEL_PENDULUM, {}),
    "pendulum": ("InvertedPendulum-v5", {"render_mode": "rgb_array", "width": 64, "height": 64}),
}

SURVIVE = ("InvertedPendulum", "InvertedDoublePendulum", "CartPole", PIXEL_PENDULUM)
MUJOCO_IDS = ("InvertedPendulum", "InvertedDoublePendulum", "HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid",
              "Swimmer", "Reacher", "Pusher")


class SimulatorMissing(RLError):
    """The simulator's Python package is not installed; the message names the pip package."""


def resolve(name: str, env_kwargs: Optional[dict] = None):
    """(gymnasium id, kwargs) for an alias or an id; the caller's kwargs win over the alias's."""
    if name in ALIASES:
        sim_id, kw = ALIASES[name]
        return sim_id, {**kw, **(env_kwargs or {})}
    return name, dict(env_kwargs or {})


def _headless():
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])


def _need(module: str, sim_id: str):
    try:
        importlib.import_module(module)
    except ImportError as e:
        pip = PIP.get(module, module.replace("_", "-"))
        raise SimulatorMissing(f"environment '{sim_id}' needs the simulator package '{pip.split('==')[0]}', which "
                               f"is not installed ({e}): pip install '{pip}' (scripts/install-deps.sh installs it "
                               "with the other simulators)") from None


def _pixel_pendulum(width: int = 64, height: int = 64, **kw):
    """InvertedPendulum-v5 with Dict observations {"pixels": [H, W, 3] uint8 render, "state": the 4 floats}.
    vlafeed.rl.envs registers the same id where it is present; this is the stand-in when it is not."""
    import gymnasium as gym
    from gymnasium.wrappers import AddRenderObservation
    base = gym.make("InvertedPendulum-v5", render_mode="rgb_array", width=width, height=height, **kw)
    return AddRenderObservation(base, render_only=False, render_key="pixels", obs_key="state")


def make_sim(name: Any, env_kwargs: Optional[dict] = None):
    """The environment for name (an alias, a gymnasium id, 'toy-reach' or a callable)."""
    if callable(name):
        return name(**(env_kwargs or {}))
    sim_id, kw = resolve(str(name), env_kwargs)
    if sim_id == "toy-reach":
        from vlafeed.rl.envs import ToyReachEnv
        return ToyReachEnv(**kw)
    try:
        import gymnasium as gym
    except ImportError:
        raise SimulatorMissing(f"environment '{sim_id}' needs gymnasium: pip install gymnasium") from None
    if sim_id == PIXEL_PENDULUM or sim_id.split("-v")[0] in MUJOCO_IDS:
        _headless()
        _need("mujoco", sim_id)
    if sim_id == PIXEL_PENDULUM:
        try:
            import vlafeed.rl.envs  # noqa: F401  (rl-policy's registration, where present)
        except ImportError:
            pass
        if sim_id not in gym.registry:
            return _pixel_pendulum(**kw)
    if "/" in sim_id:
        module = sim_id.split("/")[0]
        if module.startswith("gym_aloha"):
            _headless()
        if module in PIP or module.startswith("gym_"):
            _need(module, sim_id)
    try:
        return gym.make(sim_id, **kw)
    except gym.error.Error as e:
        raise RLError(f"environment '{sim_id}': {e} (known simulators: {', '.join(ALIASES)}; "
                      "any gymnasium id whose package is installed)") from None


def success_rule(name: Any) -> str:
    """'is_success' (info flag; used wherever the env reports it), 'survive', 'reach' or 'none'."""
    if callable(name) and not isinstance(name, str):
        return "none"
    sim_id, _ = resolve(str(name))
    if sim_id.startswith(("gym_pusht/", "gym_aloha/")):
        return "is_success"
    if sim_id == "toy-reach":
        return "reach"
    if sim_id.startswith(SURVIVE):
        return "survive"
    return "none"


def episode_success(rule: str, saw_is_success: Optional[bool], terminated: bool, truncated: bool) -> Optional[bool]:
    """Applies a rule to one finished episode. saw_is_success: None when the env never reported the flag."""
    if saw_is_success is not None:
        return bool(saw_is_success)
    if rule == "survive":
        return bool(truncated and not terminated)
    if rule == "reach":
        return bool(terminated)
    return None


def available() -> dict:
    """{alias: None if it makes and steps here, else the reason}: for `vlafeed eval --list-envs`."""
    out = {}
    for alias in ALIASES:
        try:
            env = make_sim(alias)
            env.reset(seed=0)
            env.step(env.action_space.sample())
            env.close()
            out[alias] = None
        except Exception as e:  # noqa: BLE001 - reported, not raised
            out[alias] = f"{type(e).__name__}: {e}"
    return out


def rule_text(rule: str) -> str:
    return {"is_success": "info['is_success'] at any step",
            "survive": "episode reached the step limit without terminating",
            "reach": "episode terminated (goal reached)",
            "none": "no success rule for this env (success is null)"}[rule]


__all__ = ["make_sim", "success_rule", "episode_success", "resolve", "available", "SimulatorMissing", "ALIASES",
           "PIP", "PIXEL_PENDULUM", "rule_text"]

