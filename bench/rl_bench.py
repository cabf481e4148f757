#!/usr/bin/env python3
"""RL-VLA3-style ablation of vlafeed.rl on this machine: env steps/s and trained samples/s.

    python3 bench/rl_bench.py [--workers 2 4] [--steps 12] [--out bench/rl-results.json]

Runs, in one process and one Ray session, for each worker count:
  sync colocated            one process: all envs in lockstep with a local policy, then train
  sync disaggregated        Ray rollout workers + batching policy server + learner, in rounds
  + train async             workers keep generating while the learner trains
  + rollout async           each env on its own, trajectories pushed as they finish
  + streamer                forward/backward per micro-batch as soon as it is complete
The env is vlafeed.rl's ToyReachEnv with --step-ms of sleep per step standing in for a simulator
(the machine has 2 cores: sleeping envs let rollout overlap be measured without the simulators
competing with the learner for the cores). Actor start-up is excluded from the timings.
"""
import argparse
import json
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
import _inplace  # noqa: E402  (bench/_inplace.py: the in-place build if there is one, else the installed package)
_inplace.use()
os.environ.update(_inplace.child_env())  # Ray workers import the same package

from vlafeed import rl  # noqa: E402

LADDER = [("sync colocated", dict(colocated=True)),
          ("sync disaggregated", dict(train_async=False, rollout_async=False, streamer=False)),
          ("+ train async", dict(train_async=True, rollout_async=False, streamer=False)),
          ("+ rollout async", dict(train_async=True, rollout_async=True, streamer=False)),
          ("+ streamer", dict(train_async=True, rollout_async=True, streamer=True))]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--envs-per-worker", type=int, default=2)
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--step-ms", type=float, default=4.0, help="simulated env cost per step (sleep)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    for nw in a.workers:
        base = None
        for name, sw in LADDER:
            cfg = rl.RLConfig(env_kwargs={"size": 5, "max_steps": 16, "step_delay_ms": a.step_ms}, num_workers=nw,
                              envs_per_worker=a.envs_per_worker, steps=a.steps, global_batch=a.global_batch,
                              micro_batch=a.micro_batch, hidden=a.hidden, max_lag=2, queue_size=2 * a.global_batch,
                              **sw)
            rep = rl.train(cfg)
            row = {"workers": nw, "mode": name, "env_steps_per_s": rep["env_steps_per_s"],
                   "trained_samples_per_s": rep["trained_samples_per_s"], "seconds": rep["seconds"],
                   "lag_mean": rep["lag_mean"], "lag_max": rep["lag_max"],
                   "dropped_stale": len(rep["dropped_stale_ids"]), "unused": len(rep["unused_ids"]),
                   "mean_server_batch": (rep["server"] or {}).get("mean_batch"),
                   "first_return": rep["first_return"], "last_return": rep["last_return"]}
            base = base or row
            row["env_ratio"] = row["env_steps_per_s"] / base["env_steps_per_s"]
            row["trained_ratio"] = row["trained_samples_per_s"] / base["trained_samples_per_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    ray.shutdown()
    print("\n| workers | mode | env steps/s | trained samples/s | vs sync colocated (env / trained) | "
          "mean lag | stale dropped | mean server batch |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        sb = "" if r["mean_server_batch"] is None else f"{r['mean_server_batch']:.1f}"
        print(f"| {r['workers']} | {r['mode']} | {r['env_steps_per_s']:.0f} | {r['trained_samples_per_s']:.0f} | "
              f"{r['env_ratio']:.2f} / {r['trained_ratio']:.2f} | {r['lag_mean']:.2f} | {r['dropped_stale']} | {sb} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "args": vars(a), "when": time.strftime("%Y-%m-%d %H:%M")},
                                          indent=2) + "\n")


if __name__ == "__main__":
    main()
