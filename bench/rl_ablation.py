#!/usr/bin/env python3
"""The fair RL-VLA3-style ablation of vlafeed.rl: five rungs, same threads, same CPUs, per CPU-second.

    python3 bench/rl_ablation.py [--envs pendulum toy-sleep toy-cpu] [--steps 10] [--repeats 3] [--out bench/rl-ablation.json]

Rungs (as in RL-VLA3's table), plus RLinf-style hybrid placement as a sixth row:
  colocated sync        one process: all envs in lockstep with a local policy, then train
  disaggregated 1:1     Ray rollout workers + policy server + learner, synchronous rounds
  + train async         workers keep generating while the learner trains
  + rollout async       each env on its own, trajectories pushed as they finish
  + streamer            forward/backward per micro-batch as soon as it is complete
  hybrid (all async)    the learner in its own actor beside the server (they would share a GPU)

Fairness: torch.set_num_threads(1) in every process (RLConfig.torch_threads=1: driver, workers,
server, learner actor); the same Ray cluster (ray.init(num_cpus=2)) and the same process CPU
affinity for every rung; the same number of envs (workers x envs per worker) in every rung.
CPU seconds: user+system time of the driver plus the whole Ray session's process tree (raylet and
its children: every actor, the queue actor, idle workers; GCS), from the moment every actor is up
to the last optimizer step, read with psutil; for colocated sync (no Ray) the driver process
alone. A 1-step warm-up run comes first so that Ray's pooled workers start outside the figures. Env steps/s is wall-clock (the machine is shared).
"""
import argparse
import json
import os
import statistics
import time
from pathlib import Path

import _inplace  # noqa: E402  (bench/_inplace.py: the in-place build if there is one, else the installed package)
_inplace.use()
os.environ.update(_inplace.child_env())  # Ray workers import the same package

import psutil  # noqa: E402

from vlafeed import rl  # noqa: E402

LADDER = [("colocated sync", dict(placement="colocated")),
          ("disaggregated 1:1", dict(train_async=False, rollout_async=False, streamer=False)),
          ("+ train async", dict(train_async=True, rollout_async=False, streamer=False)),
          ("+ rollout async", dict(train_async=True, rollout_async=True, streamer=False)),
          ("+ streamer", dict(train_async=True, rollout_async=True, streamer=True)),
          ("hybrid (all async)", dict(placement="hybrid", train_async=True, rollout_async=True, streamer=True))]


def pendulum(max_episode_steps=200, bins=5):
    """gymnasium's MuJoCo InvertedPendulum-v5 (state obs), its 1-D force discretised into `bins`
    actions (vlafeed.rl's policy here is categorical). Pickled by value into the workers."""
    import gymnasium as gym
    from gymnasium.wrappers import DiscretizeAction
    return DiscretizeAction(gym.make("InvertedPendulum-v5", max_episode_steps=max_episode_steps), bins=bins)


def toy_cpu(spin_ms=1.0):
    """vlafeed.rl's ToyReachEnv that burns `spin_ms` of CPU per step (a busy loop standing in for a
    CPU-bound simulator). Pickled by value into the workers."""
    import time as _t
    from vlafeed.rl.envs import ToyReachEnv

    class SpinReach(ToyReachEnv):
        def step(self, action):
            end = _t.thread_time() + spin_ms / 1000.0
            while _t.thread_time() < end:
                pass
            return super().step(action)

    return SpinReach(size=5, max_steps=16)


ENVS = {"pendulum": dict(env=pendulum, env_kwargs={}),
        "toy-sleep": dict(env="toy-reach", env_kwargs={"size": 5, "max_steps": 16, "step_delay_ms": 4.0}),
        "toy-cpu": dict(env=toy_cpu, env_kwargs={"spin_ms": 1.0})}


def session_pids():
    """The driver, and this Ray session's system processes and their children (actors, workers)."""
    import ray
    node = ray._private.worker._global_node
    pids = {os.getpid()}
    for infos in node.all_processes.values():
        for info in infos:
            try:
                p = psutil.Process(info.process.pid)
                pids.add(p.pid)
                pids.update(c.pid for c in p.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
    return pids


def cpu_now(pids=None):
    """{pid: cpu seconds} over the session's processes (pids: a fixed set, else the current tree)."""
    out = {}
    for pid in (pids if pids is not None else session_pids()):
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def run_rung(name, sw, envspec, a):
    cfg = rl.RLConfig(num_workers=a.workers, envs_per_worker=a.envs_per_worker, steps=a.steps,
                      global_batch=a.global_batch, micro_batch=a.micro_batch, hidden=a.hidden, max_lag=2,
                      queue_size=2 * a.global_batch, torch_threads=1, seed=a.seed, **envspec, **sw)
    marks = {}

    def started(_info):
        marks["cpu0"], marks["t0"] = cpu_now(), time.perf_counter()

    def on_step(info):
        if info["version"] == cfg.steps:
            marks["cpu1"], marks["t1"] = cpu_now(), time.perf_counter()

    if sw.get("placement") == "colocated":  # no Ray: its CPU is this process's
        marks["cpu0"] = cpu_now([os.getpid()])
        rep = rl.train(cfg)
        marks["cpu1"] = cpu_now([os.getpid()])
    else:
        rep = rl.train(cfg, on_step=on_step, _hooks={"started": started})
    c0, c1 = marks["cpu0"], marks["cpu1"]
    cpu = sum(v - c0.get(pid, 0.0) for pid, v in c1.items())
    acct = rep["accounting"]
    return {"mode": name, "env_steps": rep["env_steps"], "trained_samples": rep["trained_samples"],
            "seconds": rep["seconds"], "cpu_seconds": cpu, "role_cpu_seconds": rep["cpu_seconds"],
            "env_steps_per_s": rep["env_steps_per_s"], "trained_samples_per_s": rep["trained_samples_per_s"],
            "env_steps_per_cpu_s": rep["env_steps"] / cpu, "samples_per_cpu_s": rep["trained_samples"] / cpu,
            "lag_mean": rep["lag_mean"], "dropped_stale": acct["dropped_stale"],
            "mean_server_batch": (rep["server"] or {}).get("mean_batch"),
            "first_return": rep["first_return"], "last_return": rep["last_return"],
            "accounting": {k: acct[k] for k in ("produced", "trained", "dropped_stale", "dropped_env",
                                                 "lost_to_faults", "in_flight_at_end", "left_in_queue_at_end")}}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=["pendulum", "toy-sleep", "toy-cpu"], choices=sorted(ENVS))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs-per-worker", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per run")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--repeats", type=int, default=1, help="passes over the ladder (interleaved)")
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--from-log", nargs="+", default=None, help="only print the table of the JSON rows in these logs")
    a = p.parse_args()
    if a.from_log:
        rows = [json.loads(x) for f in a.from_log for x in Path(f).read_text().splitlines() if x.startswith('{"env"')]
        table(rows, [e for e in a.envs if any(r["env"] == e for r in rows)])
        if a.out:
            Path(a.out).write_text(json.dumps({"rows": rows, "args": vars(a), "cpu_count": os.cpu_count()},
                                              indent=2) + "\n")
        return
    import ray
    import torch
    torch.set_num_threads(1)
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:a.num_cpus])  # Ray's processes inherit it
    ray.init(num_cpus=a.num_cpus, include_dashboard=False, log_to_driver=False)
    # warm-up (not recorded): Ray's pooled workers start and import once, outside every measurement
    run_rung("warm-up", LADDER[-2][1], ENVS[a.envs[0]], argparse.Namespace(**{**vars(a), "steps": 1}))
    rows = []
    for rep_i in range(a.repeats):
        for env in a.envs:
            for name, sw in LADDER:
                row = {"env": env, "repeat": rep_i, **run_rung(name, sw, ENVS[env], a)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    ray.shutdown()
    table(rows, a.envs)
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "args": vars(a), "when": time.strftime("%Y-%m-%d %H:%M"),
                                           "cpu_count": os.cpu_count()}, indent=2) + "\n")


def table(rows, envs):
    """The markdown table: per env and rung, the median over the repeats."""
    print("\n| env | mode | env steps/s | env steps / CPU-s | trained samples / CPU-s | vs colocated (per CPU-s) "
          "| CPU-s | mean lag | stale | runs |\n|---|---|---|---|---|---|---|---|---|---|")
    for env in envs:
        base = None
        for name, _ in LADDER:
            rs = [r for r in rows if r["env"] == env and r["mode"] == name]
            med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
            base = base or med("samples_per_cpu_s")
            if not rs:
                continue
            print(f"| {env} | {name} | {med('env_steps_per_s'):.0f} | {med('env_steps_per_cpu_s'):.0f} | "
                  f"{med('samples_per_cpu_s'):.0f} | {med('samples_per_cpu_s') / base:.2f} | "
                  f"{med('cpu_seconds'):.1f} | {med('lag_mean'):.2f} | {med('dropped_stale'):g} | {len(rs)} |")


if __name__ == "__main__":
    main()
