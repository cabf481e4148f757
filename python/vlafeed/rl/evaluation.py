"""Evaluation of a policy in a simulator: `vlafeed.rl.evaluate` and `vlafeed eval`.

    from vlafeed.rl import evaluate
    report = evaluate(policy_or_path, "pusht", episodes=50, seed=0, num_workers=4)
    report["aggregated"]["pc_success"], report["aggregated"]["avg_sum_reward"]

Episode i (per task) resets its env with seed + i and seeds torch and the action space with the same
number, so the per-episode results are a pure function of (policy, env, seed), whatever the
number of workers. Episodes are spread round-robin over `num_workers` Ray tasks (one CPU each), or
run in this process with num_workers=0; results are put back in episode order.

Policies:
- any object with `act(obs, deterministic=True)` (vlafeed.rl's policy protocol): obs is a batch of
  one (a Tensor [1, ...], or a dict/tuple of them), the answer has `.action` (Tensor [1, ...]) or
  is the action batch itself. A `reset()` method, where present, is called before each episode
  (LeRobot's action-chunk queues need it).
- a vlafeed.rl checkpoint folder (vlafeed_rl.json): vlafeed.rl.policies.load_policy.
- a LeRobot `pretrained_model/` folder (config.json with "type"; or its parent): LeRobot's
  from_pretrained + make_pre_post_processors + select_action. Needs LeRobot 0.6 (Python 3.12:
  build-lerobot/venv312, or VF_PYTHON for `vlafeed eval`).

The report follows lerobot-eval's names: per_episode (episode_ix, seed, task, sum_reward,
max_reward, length, success, terminated, truncated, video), aggregated (pc_success,
avg_sum_reward, avg_max_reward, avg_length, n_episodes, eval_s, eval_ep_s), per_task (the same
aggregates per env when several are given), success_rule (per task), video_paths.
Videos: the first `video_episodes` episodes of each task as MP4 (H.264, vlafeed's own encoder
_native.video_encode) from env.render() (rgb_array) or, failing that, the "pixels" observation.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np

from vlafeed.rl.config import RLError
from vlafeed.rl import sims

LEROBOT_VENV_HINT = ("LeRobot 0.6 runs on Python 3.12: use build-lerobot/venv312/bin/python (make lerobot06 and "
                     "make py312-inplace), or VF_PYTHON=build-lerobot/venv312/bin/python vlafeed eval ...")


# ---------------------------------------------------------------- policies

def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RLError(f"policy checkpoint {path.parent}: cannot read {path.name}: {e}") from None


def load_policy(path: Union[str, os.PathLike], device: Optional[str] = None):
    """A policy from a folder: vlafeed.rl checkpoint (vlafeed_rl.json) or LeRobot pretrained_model/."""
    p = Path(path)
    if not p.exists():
        raise RLError(f"policy checkpoint {p}: no such file or folder")
    if not p.is_dir():
        raise RLError(f"policy checkpoint {p}: not a folder (expected a vlafeed.rl checkpoint with vlafeed_rl.json "
                      "or a LeRobot pretrained_model/ folder with config.json)")
    if (p / "vlafeed_rl.json").is_file() or any(p.glob("step_*/vlafeed_rl.json")):  # a step or its checkpoint_dir
        if (p / "vlafeed_rl.json").is_file():
            _read_json(p / "vlafeed_rl.json")
        try:
            from vlafeed.rl.policies import load_policy as rl_load
        except ImportError as e:
            raise RLError(f"policy checkpoint {p}: a vlafeed.rl checkpoint needs vlafeed.rl.policies ({e})") from None
        return rl_load(str(p))
    for cand in (p / "pretrained_model", p):  # vlafeed.train export's OUT/ holds OUT/pretrained_model/
        if (cand / "config.json").is_file():
            cfg = _read_json(cand / "config.json")
            if "type" not in cfg:
                raise RLError(f"policy checkpoint {cand}: config.json has no \"type\" (not a LeRobot policy "
                              "config; vlafeed.train checkpoints are exported with `python -m vlafeed.train export`)")
            return LeRobotPolicy(cand, device=device)
    raise RLError(f"policy checkpoint {p}: neither vlafeed_rl.json nor config.json (LeRobot pretrained_model/) in it")


class _Out:
    """The protocol's ActOut for policies that only give actions (logp/value are not computed)."""

    def __init__(self, action):
        self.action, self.logp, self.value = action, None, None


class LeRobotPolicy:
    """A LeRobot pretrained_model/ folder behind the act() protocol (inference only).

    Observation keys map as lerobot-eval's preprocess_observation: "pixels" (array) ->
    observation.image, "pixels" (dict) -> observation.images.<name>, "agent_pos" or "state" ->
    observation.state, "environment_state" -> observation.environment_state; a plain vector
    observation -> observation.state. Images go from uint8 HWC to float CHW in [0, 1]."""

    def __init__(self, path: Union[str, os.PathLike], device: Optional[str] = None):
        self.path = Path(path)
        try:
            import torch
            from lerobot.configs.policies import PreTrainedConfig
            from lerobot.policies.factory import get_policy_class, make_pre_post_processors
        except ImportError as e:
            raise RLError(f"LeRobot policy {self.path}: LeRobot is not importable in {sys.executable} ({e}). "
                          f"{LEROBOT_VENV_HINT}") from None
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        cfg = PreTrainedConfig.from_pretrained(str(self.path))
        cfg.device = self.device
        self.policy = get_policy_class(cfg.type).from_pretrained(str(self.path), config=cfg)
        self.policy.to(self.device).eval()
        self.pre, self.post = make_pre_post_processors(
            cfg, pretrained_path=str(self.path), preprocessor_overrides={"device_processor": {"device": self.device}})
        self.expected = set(getattr(cfg, "input_features", {}) or {})

    def reset(self):
        self.policy.reset()

    @staticmethod
    def observation(obs) -> dict:
        import torch

        def img(x):
            t = torch.as_tensor(np.asarray(x))
            if t.dtype == torch.uint8:
                t = t.float() / 255
            return t.permute(0, 3, 1, 2).contiguous() if t.shape[-1] in (1, 3, 4) else t

        if not isinstance(obs, dict):
            return {"observation.state": torch.as_tensor(np.asarray(obs)).float()}
        out = {}
        for k, v in obs.items():
            if k == "pixels":
                if isinstance(v, dict):
                    out.update({f"observation.images.{c}": img(x) for c, x in v.items()})
                else:
                    out["observation.image"] = img(v)
            elif k in ("agent_pos", "state"):
                out["observation.state"] = torch.as_tensor(np.asarray(v)).float()
            elif k == "environment_state":
                out["observation.environment_state"] = torch.as_tensor(np.asarray(v)).float()
        return out

    def act(self, obs, deterministic: bool = True):
        import torch
        batch = self.observation(obs)
        missing = sorted(self.expected - set(batch))
        if missing:
            raise RLError(f"LeRobot policy {self.path} expects {missing}; the env gives {sorted(batch)}")
        with torch.inference_mode():
            action = self.post(self.policy.select_action(self.pre(batch)))
        return _Out(action.to("cpu"))


# ---------------------------------------------------------------- one episode

def _batch(obs, space=None):
    """A batch of one observation for the protocol: rl-policy's spaces.stack where present, else torch.as_tensor
    with a leading 1 (dict/tuple aware)."""
    if space is not None:
        try:
            from vlafeed.rl.spaces import stack
            return stack([obs], space)
        except ImportError:
            pass
    import torch
    if isinstance(obs, dict):
        return {k: _batch(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_batch(v) for v in obs)
    return torch.as_tensor(np.ascontiguousarray(obs)).unsqueeze(0)


def _action(out, space):
    a = getattr(out, "action", out)
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    a = np.asarray(a)
    shape = tuple(getattr(space, "shape", None) or ())
    if a.ndim == len(shape) + 1 and a.shape[0] == 1:  # the batch of one
        a = a[0]
    if type(space).__name__ == "Discrete":
        return int(a.reshape(-1)[0])
    dtype = getattr(space, "dtype", None)
    return a.astype(dtype) if dtype is not None else a


def _frame(env, obs):
    if getattr(env, "render_mode", None) == "rgb_array":
        f = env.render()
        if isinstance(f, np.ndarray) and f.ndim == 3:
            return f
    if isinstance(obs, dict):
        p = obs.get("pixels")
        if isinstance(p, dict) and p:
            p = next(iter(p.values()))
        if isinstance(p, np.ndarray) and p.ndim == 3 and p.shape[-1] == 3:
            return p
    return None


def write_video(path: Union[str, os.PathLike], frames: Sequence[np.ndarray], fps: int) -> str:
    """RGB uint8 frames [H, W, 3] -> H.264 MP4 with vlafeed's encoder (odd sizes padded by one edge row/column)."""
    from vlafeed import _native
    arr = np.stack([np.asarray(f, dtype=np.uint8) for f in frames])
    h, w = arr.shape[1:3]
    if h % 2 or w % 2:
        arr = np.pad(arr, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    _native.video_encode(str(path), np.ascontiguousarray(arr), int(fps), codec="h264", gop=max(1, int(fps)), crf=23)
    return str(path)


def run_episode(policy, env, seed: int, max_steps: Optional[int] = None, deterministic: bool = True,
                rule: str = "none", video_path: Optional[str] = None) -> dict:
    """One seeded episode; returns its per-episode record."""
    import torch
    torch.manual_seed(seed)
    if hasattr(env.action_space, "seed"):
        env.action_space.seed(seed)
    if callable(getattr(policy, "reset", None)):
        policy.reset()
    obs, info = env.reset(seed=seed)
    frames = []
    if video_path:
        f = _frame(env, obs)
        if f is not None:
            frames.append(f)
    total, best, length, terminated, truncated, saw = 0.0, -float("inf"), 0, False, False, None
    limit = max_steps or getattr(getattr(env, "spec", None), "max_episode_steps", None) or 10_000
    while True:
        with torch.no_grad():
            out = policy.act(_batch(obs, env.observation_space), deterministic=deterministic)
        obs, reward, terminated, truncated, info = env.step(_action(out, env.action_space))
        length += 1
        total += float(reward)
        best = max(best, float(reward))
        if "is_success" in info:
            saw = bool(saw) or bool(np.any(info["is_success"]))
        if video_path:
            f = _frame(env, obs)
            if f is not None:
                frames.append(f)
        if not terminated and length >= limit:
            truncated = True
        if terminated or truncated:
            break
    video = None
    if video_path and frames:
        fps = (getattr(env, "metadata", {}) or {}).get("render_fps") or 30
        video = write_video(video_path, frames, int(fps))
    return {"seed": seed, "sum_reward": total, "max_reward": best, "length": length,
            "success": sims.episode_success(rule, saw, bool(terminated), bool(truncated)),
            "terminated": bool(terminated), "truncated": bool(truncated), "video": video}


def _run_jobs(policy, jobs, env_kwargs, max_steps, deterministic, video_dir, video_episodes, device=None):
    """Runs [(task index, task, episode index, seed)] in this process; one env per task, reused."""
    if isinstance(policy, (str, os.PathLike)):
        policy = load_policy(policy, device=device)
    envs, out = {}, []
    try:
        for t, task, i, seed in jobs:
            if t not in envs:
                envs[t] = sims.make_sim(task, env_kwargs)
            video = None
            if video_dir and i < video_episodes:
                video = str(Path(video_dir) / f"{_slug(task)}_episode_{i:03d}.mp4")
            rec = run_episode(policy, envs[t], seed, max_steps, deterministic, sims.success_rule(task), video)
            out.append({"task_index": t, "episode_ix": i, "task": _name(task), **rec})
    finally:
        for e in envs.values():
            try:
                e.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
    return out


def _name(task) -> str:
    return task if isinstance(task, str) else getattr(task, "__name__", repr(task))


def _slug(task) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in _name(task))


# ---------------------------------------------------------------- the evaluation

def _aggregate(eps: List[dict], wall: float) -> dict:
    succ = [e["success"] for e in eps if e["success"] is not None]
    n = len(eps)
    return {"n_episodes": n,
            "pc_success": (100.0 * sum(succ) / len(succ)) if succ and len(succ) == n else None,
            "avg_sum_reward": float(np.mean([e["sum_reward"] for e in eps])) if n else None,
            "avg_max_reward": float(np.mean([e["max_reward"] for e in eps])) if n else None,
            "avg_length": float(np.mean([e["length"] for e in eps])) if n else None,
            "eval_s": wall, "eval_ep_s": wall / n if n else None}


def evaluate(policy, env, episodes: int = 10, seed: int = 0, num_workers: int = 0, max_steps: Optional[int] = None,
             video_dir: Optional[Union[str, os.PathLike]] = None, video_episodes: int = 1,
             env_kwargs: Optional[dict] = None, deterministic: bool = True, device: Optional[str] = None) -> dict:
    """Runs `episodes` seeded episodes of policy (an object with act(), or a checkpoint folder) in env (an alias,
    a gymnasium id, a callable, or a list of them: one task each) and returns the report (see the module doc)."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    tasks = list(env) if isinstance(env, (list, tuple)) else [env]
    # fail early, in the caller, on an absent simulator (workers would each fail)
    for task in tasks:
        e = sims.make_sim(task, env_kwargs)
        e.close()
    label = str(policy) if isinstance(policy, (str, os.PathLike)) else type(policy).__name__
    if isinstance(policy, (str, os.PathLike)):  # in-process: load once here; Ray workers load their own copy
        policy = load_policy(policy, device=device) if num_workers == 0 else _check_path(str(policy))
    jobs = [(t, task, i, seed + i) for t, task in enumerate(tasks) for i in range(episodes)]
    start = time.time()
    if num_workers == 0:
        eps = _run_jobs(policy, jobs, env_kwargs, max_steps, deterministic, video_dir, video_episodes)
    else:
        eps = _run_ray(policy, jobs, num_workers, env_kwargs, max_steps, deterministic, video_dir, video_episodes,
                       device)
    wall = time.time() - start
    eps.sort(key=lambda e: (e["task_index"], e["episode_ix"]))
    for e in eps:
        del e["task_index"]
    names = [_name(t) for t in tasks]
    per_task = {n: _aggregate([e for e in eps if e["task"] == n], wall) for n in names}
    return {"env": names[0] if len(names) == 1 else names, "policy": label, "episodes": episodes, "seed": seed, "num_workers": num_workers,
            "max_steps": max_steps, "deterministic": deterministic,
            "success_rule": {n: sims.rule_text(sims.success_rule(t)) for n, t in zip(names, tasks)},
            "per_episode": eps, "per_task": per_task, "aggregated": _aggregate(eps, wall),
            "video_paths": [e["video"] for e in eps if e["video"]]}


def _check_path(path: str) -> str:
    """Checks a folder the Ray workers will load (without loading it here) and returns it."""
    p = Path(path)
    if not p.is_dir() or not (any((p / n).is_file() for n in ("vlafeed_rl.json", "config.json",
                                                              "pretrained_model/config.json"))
                              or any(p.glob("step_*/vlafeed_rl.json"))):
        load_policy(path)  # raises the precise error
    for n in ("vlafeed_rl.json", "config.json", "pretrained_model/config.json"):
        if (p / n).is_file():
            _read_json(p / n)
    return str(p.resolve())


def _run_ray(policy, jobs, num_workers, env_kwargs, max_steps, deterministic, video_dir, video_episodes, device):
    try:
        import ray
    except ImportError:
        raise RLError("num_workers > 0 needs ray (pip install 'vlafeed[rl]'); num_workers=0 runs in this "
                      "process") from None
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    task = ray.remote(num_cpus=1, max_retries=0)(_run_jobs)
    pol = ray.put(policy)
    shards = [jobs[w::num_workers] for w in range(num_workers)]
    refs = [task.remote(pol, s, env_kwargs, max_steps, deterministic, video_dir, video_episodes, device)
            for s in shards if s]
    try:
        parts = ray.get(refs)
    except ray.exceptions.RayTaskError as e:
        cause = e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e
        raise RLError(f"evaluation worker failed: {cause}") from None
    return [ep for part in parts for ep in part]


def format_table(report: dict) -> str:
    """The report as a small text table: one row per task and the overall row."""
    def pc(v):
        return "-" if v is None else f"{v:.1f}"
    rows = [("task", "episodes", "success %", "avg return", "avg max reward", "avg length")]
    for name, a in report["per_task"].items():
        rows.append((name, str(a["n_episodes"]), pc(a["pc_success"]), f"{a['avg_sum_reward']:.3f}",
                     f"{a['avg_max_reward']:.3f}", f"{a['avg_length']:.1f}"))
    if len(report["per_task"]) > 1:
        a = report["aggregated"]
        rows.append(("overall", str(a["n_episodes"]), pc(a["pc_success"]), f"{a['avg_sum_reward']:.3f}",
                     f"{a['avg_max_reward']:.3f}", f"{a['avg_length']:.1f}"))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)) for r in rows]
    lines.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(lines)


# ---------------------------------------------------------------- the command line

def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="vlafeed eval", description=(
        "Run a policy checkpoint in a simulator over seeded episodes and report success rate, return and episode "
        "length (lerobot-eval's names). CHECKPOINT: a vlafeed.rl checkpoint folder (vlafeed_rl.json) or a LeRobot "
        "pretrained_model/ folder (needs LeRobot 0.6, Python 3.12: VF_PYTHON=build-lerobot/venv312/bin/python)."))
    p.add_argument("checkpoint", nargs="?", help="policy folder")
    p.add_argument("--env", action="append", help="simulator alias or gymnasium id; repeat for several tasks "
                   f"(aliases: {', '.join(sims.ALIASES)})")
    p.add_argument("--env-kwargs", default=None, help="JSON object of keyword arguments for the env")
    p.add_argument("--episodes", type=int, default=10, help="episodes per task (default 10)")
    p.add_argument("--workers", type=int, default=0, help="Ray workers (0: in this process; default 0)")
    p.add_argument("--seed", type=int, default=0, help="episode i resets with seed + i (default 0)")
    p.add_argument("--max-steps", type=int, default=None, help="step limit per episode (default: the env's)")
    p.add_argument("--json", dest="json_out", default=None, help="write the report to this JSON file ('-': stdout)")
    p.add_argument("--video-dir", default=None, help="write MP4s of the first episodes here")
    p.add_argument("--video-episodes", type=int, default=1, help="episodes per task recorded (default 1)")
    p.add_argument("--stochastic", action="store_true", help="sample actions (default: deterministic)")
    p.add_argument("--device", default=None, help="LeRobot policies: torch device (default cuda if present)")
    p.add_argument("--num-cpus", type=int, default=None, help="ray.init(num_cpus=...)")
    p.add_argument("--list-envs", action="store_true", help="try each simulator alias here and print which work")
    a = p.parse_args(argv)
    if a.list_envs:
        for alias, why in sims.available().items():
            print(f"{alias:22s} {sims.resolve(alias)[0]:34s} {'ok' if why is None else why}")
        return 0
    if not a.checkpoint or not a.env:
        p.print_usage(sys.stderr)
        print("vlafeed eval: CHECKPOINT and --env are required", file=sys.stderr)
        return 2
    try:
        kw = json.loads(a.env_kwargs) if a.env_kwargs else None
    except ValueError as e:
        print(f"vlafeed eval: --env-kwargs is not JSON: {e}", file=sys.stderr)
        return 2
    if a.workers > 0:
        import ray
        ray.init(num_cpus=a.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        rep = evaluate(a.checkpoint, a.env, episodes=a.episodes, seed=a.seed, num_workers=a.workers,
                       max_steps=a.max_steps, video_dir=a.video_dir, video_episodes=a.video_episodes, env_kwargs=kw,
                       deterministic=not a.stochastic, device=a.device)
    except (RLError, ValueError) as e:
        print(f"vlafeed eval: {e}", file=sys.stderr)
        return 1
    text = json.dumps(rep, indent=2)
    if a.json_out == "-":
        print(text)
    else:
        if a.json_out:
            Path(a.json_out).write_text(text + "\n")
        print(format_table(rep))
        for v in rep["video_paths"]:
            print(f"video: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
