"""The closed loop: record -> train -> eval -> RL fine-tune -> eval, on a real physics simulator.

    python examples/closed_loop.py --out /tmp/loop                       # demo size, a few minutes
    build-lerobot/venv312/bin/python examples/closed_loop.py --out /tmp/loop   # all five steps

(a) record: a scripted expert (a PD controller on the pole's angle and the cart's position)
    balances MuJoCo's InvertedPendulum with image + state observations
    (vlafeed/InvertedPendulumPixels-v0); every frame (64x64 camera image, 4-float state, the
    expert's action) goes into a LeRobot v3.0 dataset through vlafeed's writer
    (LeRobotDataset.create / add_frame / save_episode / finalize, H.264 video). The executed
    action carries Gaussian noise (DART-style) so the data covers recoveries; the recorded
    label is the expert's clean action.
(b) train: `python -m vlafeed.train --model.source lerobot --model.name act` (a tiny ACT) on it,
    then `python -m vlafeed.train export` writes a LeRobot pretrained_model/ folder.
(c) eval: vlafeed.rl.evaluate (the function behind `vlafeed eval`) runs the exported policy over
    seeded episodes: success rate (the pole still up at the step limit), mean return.
(d) fine-tune: vlafeed.rl with the LeRobot adapter (policy "lerobot:<folder>") and GRPO (critic-free).
(e) eval again; the before/after table is printed and written to OUT/closed_loop.json.
    "before" for (d) is the exported policy behind the same adapter (vlafeed.rl's LeRobot adapter
    runs no normalization processor, LeRobot's select_action in (c) does), so (d)'s rows compare
    like with like.

Steps (b), (d) and (e) need LeRobot 0.6, i.e. Python 3.12 (build-lerobot/venv312 with
`make py312-inplace`), plus vlafeed.train's LeRobot model source and vlafeed.rl's LeRobot
adapter; where one is missing the step says so and is skipped, and the rest still runs.
The expert and a zero-action policy are always evaluated, as reference rows.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ENV = "vlafeed/InvertedPendulumPixels-v0"
FEATURES = {
    "observation.image": {"dtype": "video", "shape": (64, 64, 3), "names": ["height", "width", "channels"]},
    "observation.state": {"dtype": "float32", "shape": (4,), "names": ["x", "theta", "x_dot", "theta_dot"]},
    "action": {"dtype": "float32", "shape": (1,), "names": ["force"]},
}
TASK = "balance the pole"


def expert_action(state) -> np.ndarray:
    x, th, xd, thd = (float(v) for v in np.asarray(state).reshape(-1)[:4])
    return np.array([np.clip(x + 10 * th + xd + thd, -3, 3)], np.float32)


class Expert:
    """The scripted expert behind the policy protocol (act on a batch of one)."""

    def act(self, obs, deterministic=True):
        import torch
        s = obs["state"] if isinstance(obs, dict) else obs
        return torch.as_tensor(expert_action(s[0].numpy()))[None]


class Zero:
    def act(self, obs, deterministic=True):
        import torch
        return torch.zeros(1, 1)


def record(out: Path, episodes: int, max_steps: int, noise: float, seed: int) -> Path:
    """(a) expert demonstrations -> a LeRobot v3.0 dataset at out (vlafeed's writer)."""
    from vlafeed.data.dataset import LeRobotDataset
    from vlafeed.rl import sims
    env = sims.make_sim(ENV)
    rng = np.random.default_rng(seed)
    ds = LeRobotDataset.create("local/pendulum_expert", fps=int(env.metadata.get("render_fps") or 25),
                               features=FEATURES, root=out, robot_type="inverted_pendulum",
                               rgb_encoder={"vcodec": "h264"})
    frames = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        for _ in range(max_steps):
            label = expert_action(obs["state"])
            ds.add_frame({"observation.image": obs["pixels"], "observation.state": obs["state"].astype(np.float32),
                          "action": label, "task": TASK})
            executed = np.clip(label + rng.normal(0, noise, 1), -3, 3).astype(np.float32)
            obs, _, terminated, truncated, _ = env.step(executed)
            frames += 1
            if terminated or truncated:
                break
        ds.save_episode()
    ds.finalize()
    env.close()
    print(f"(a) recorded {episodes} episodes, {frames} frames -> {out}", flush=True)
    return out


def have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def train_act(dataset: Path, work: Path, steps: int, batch_size: int, max_steps: int = 100):
    """(b) vlafeed.train with model.source lerobot (ACT), then export; returns pretrained_model/ or (None, why)."""
    if not have("lerobot"):
        return None, f"needs LeRobot 0.6 in this Python ({sys.executable}); run with build-lerobot/venv312/bin/python"
    if not have("vlafeed.train.models"):
        return None, "needs vlafeed.train's LeRobot model source (model.source lerobot, t-models)"
    act = {"pretrained_backbone_weights": None, "dim_model": 64, "n_heads": 2, "dim_feedforward": 128,
           "n_encoder_layers": 1, "n_decoder_layers": 1, "use_vae": False, "chunk_size": 4, "n_action_steps": 1}
    cfg = {"data": {"dataset": str(dataset), "batch_size": batch_size, "seed": 0},
           "model": {"source": "lerobot", "name": "act", "overrides": act},
           "train": {"steps": steps, "lr": 1e-3, "warmup_steps": 1, "log_every": max(1, steps // 5), "threads": 2,
                     "log_file": str(work / "train.jsonl")},
           "checkpoint": {"dir": str(work / "ckpt")},
           # vlafeed.train's simulator hook: the final checkpoint, exported and run in the simulator (2 episodes)
           "eval": {"env": ENV, "env_episodes": 2, "env_max_steps": max_steps}}
    work.mkdir(parents=True, exist_ok=True)
    (work / "train.yaml").write_text(json.dumps(cfg))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "2"}
    for cmd in ([sys.executable, "-m", "vlafeed.train", "--config", str(work / "train.yaml")],
                [sys.executable, "-m", "vlafeed.train", "export", str(work / "ckpt"), str(work / "export")]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"closed_loop: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    print(f"(b) trained ACT for {steps} steps and exported -> {work / 'export' / 'pretrained_model'}", flush=True)
    return work / "export" / "pretrained_model", None


def adapter_policy(pretrained: Path):
    """The exported policy behind vlafeed.rl's LeRobot adapter, as GRPO starts from it (the "before" row
    of the fine-tuning: same inference path as the fine-tuned checkpoint)."""
    from vlafeed.rl import sims
    from vlafeed.rl.policies import make_policy
    env = sims.make_sim(ENV)
    try:
        return make_policy(env.observation_space, env.action_space, f"lerobot:{pretrained}", squash="clip")
    finally:
        env.close()


def finetune(pretrained: Path, work: Path, steps: int, seed: int):
    """(d) GRPO on the env with rl-policy's LeRobot adapter; returns the checkpoint_dir or (None, why)."""
    try:
        from vlafeed.rl import RLConfig, train
        from vlafeed.rl.policies import make_policy  # noqa: F401
    except ImportError as e:
        return None, f"needs vlafeed.rl's policies with the LeRobot adapter (rl-policy): {e}"
    # GRPO: the group baseline needs no critic (the LeRobot adapter has no value head, which PPO needs)
    cfg = RLConfig(env=ENV, policy=f"lerobot:{pretrained}", action_squash="clip", algorithm="grpo", group_size=2,
                   steps=steps, global_batch=4, micro_batch=2, num_workers=1, envs_per_worker=2, colocated=True,
                   lr=1e-4, seed=seed, checkpoint_dir=str(work / "rl"))
    rep = train(cfg)
    print(f"(d) fine-tuned {steps} GRPO steps: return {rep.get('first_return')} -> {rep.get('last_return')}",
          flush=True)
    return work / "rl", None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="work folder (dataset, checkpoints, videos, closed_loop.json)")
    p.add_argument("--demos", type=int, default=10, help="expert episodes recorded (default 10)")
    p.add_argument("--max-steps", type=int, default=100, help="steps per episode, recording and eval (default 100)")
    p.add_argument("--noise", type=float, default=0.5, help="std of the executed action's noise (default 0.5)")
    p.add_argument("--train-steps", type=int, default=300, help="vlafeed.train steps (default 300)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rl-steps", type=int, default=5, help="vlafeed.rl optimizer steps (default 5)")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--workers", type=int, default=0, help="evaluation Ray workers (0: in process)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from vlafeed.rl import evaluate
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    dataset = out / "dataset"
    if not (dataset / "meta" / "info.json").is_file():
        record(dataset, a.demos, a.max_steps, a.noise, a.seed)
    ev = dict(episodes=a.eval_episodes, seed=a.seed + 1000, max_steps=a.max_steps, num_workers=a.workers)
    rows, skipped = {}, {}
    rows["scripted expert"] = evaluate(Expert(), ENV, **ev)
    rows["zero action"] = evaluate(Zero(), ENV, **ev)
    pretrained, why = train_act(dataset, out / "train", a.train_steps, a.batch_size, a.max_steps)
    if pretrained is None:
        skipped["(b) train"] = why
    else:
        rows["ACT (vlafeed.train)"] = evaluate(str(pretrained), ENV, video_dir=out / "videos", **ev)
        print("(c) evaluated the trained policy", flush=True)
        if have("vlafeed.rl.policies"):
            rows["ACT via vlafeed.rl adapter"] = evaluate(adapter_policy(pretrained), ENV, **ev)
        rl_dir, why = finetune(pretrained, out / "finetune", a.rl_steps, a.seed)
        if rl_dir is None:
            skipped["(d) fine-tune"] = why
        else:
            rows["ACT + vlafeed.rl GRPO"] = evaluate(str(rl_dir), ENV, **ev)
            print("(e) evaluated the fine-tuned policy", flush=True)
    if "(b) train" in skipped:
        skipped["(c) eval, (d) fine-tune, (e) eval"] = "need (b)"
    print(f"\nclosed loop on {ENV}, {a.eval_episodes} episodes of {a.max_steps} steps, seeds {ev['seed']}..:")
    for name, rep in rows.items():
        agg = rep["aggregated"]
        print(f"  {name:28s} success {agg['pc_success']:5.1f}%  return {agg['avg_sum_reward']:7.2f}  "
              f"length {agg['avg_length']:6.1f}")
    for step, why in skipped.items():
        print(f"  skipped {step}: {why}")
    summary = {"env": ENV, "dataset": str(dataset), "rows": {k: v["aggregated"] for k, v in rows.items()},
               "skipped": skipped, "wall_s": time.time() - t0}
    (out / "closed_loop.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
