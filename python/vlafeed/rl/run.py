"""A run: the disaggregated pipeline on Ray (train), the colocated baseline, the report,
and the command line (python -m vlafeed.rl, vlafeed rl)."""
from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from vlafeed.rl import spaces as S
from vlafeed.rl.algos import GroupBuffer
from vlafeed.rl.config import RLConfig, RLError
from vlafeed.rl.envs import env_spaces, make_env
from vlafeed.rl.learner import Learner
from vlafeed.rl.server import policy_server_class
from vlafeed.rl.workers import _finish, _new_traj, rollout_worker_class
from vlafeed.rl import accounting, placement  # rl-runtime: ids, fates, placement, CPU seconds


def _report(cfg, learner, t0, env_steps, extra):
    secs = time.perf_counter() - t0
    k = max(1, min(len(learner.returns) // 4, 4 * cfg.global_batch))
    lags = learner.lags
    rep = {"config": {k2: v for k2, v in asdict(cfg).items() if k2 != "env"} | {"env": str(cfg.env)},
           "seconds": secs, "optimizer_steps": learner.version, "env_steps": env_steps,
           "env_steps_per_s": env_steps / secs if secs else 0.0,
           "trained_trajectories": len(learner.trained_ids), "trained_samples": learner.trained_steps,
           "trained_samples_per_s": (learner.trained_steps - learner.resumed_samples) / secs if secs else 0.0,
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
    prev_threads = placement.set_threads(cfg.torch_threads)
    try:
        return _train_colocated(cfg)
    finally:
        placement.set_threads(prev_threads)


def _train_colocated(cfg: RLConfig) -> dict:
    import os
    import torch
    obs_space, act_space = env_spaces(cfg)
    learner = Learner(cfg, obs_space, act_space)  # with cfg.resume: weights, optimizer, RNG, extra["seq"]
    cpu0 = placement.cpu_seconds({"driver": [os.getpid()]})
    envs = [make_env(cfg.env, cfg.env_kwargs) for _ in range(cfg.num_workers * cfg.envs_per_worker)]
    seq, env_steps, env_errors, dropped = learner.extra.get("seq", 0), 0, 0, []
    seq0, trained0 = seq, len(learner.trained_ids)  # a resumed learner brings what it did before
    first_error = None
    t0 = time.perf_counter()
    while learner.version < cfg.steps:
        batch = []
        while len(batch) < cfg.global_batch:
            n = min(len(envs), cfg.global_batch - len(batch))
            obs, trs, ids, active = {}, {}, {}, set()
            groups = {}
            for e in range(n):
                if cfg.algorithm == "grpo":  # a group's episodes share one seed (the same start state)
                    g = seq // cfg.group_size
                    seed, groups[e] = cfg.seed * 100003 + g * 31, f"w0.g{g}"
                else:
                    seed, groups[e] = cfg.seed * 100003 + seq * 31 + e, None
                obs[e], _ = envs[e].reset(seed=seed)
                ids[e] = f"c.e{seq}"
                seq += 1
                trs[e] = _new_traj()
                active.add(e)
            while active:
                es = sorted(active)
                with torch.no_grad():
                    out = learner.policy.act(S.stack([obs[e] for e in es], obs_space))
                acts, logps = out.action.cpu().numpy(), out.logp.float().cpu().numpy()
                for j, e in enumerate(es):
                    try:
                        o2, r, term, trunc, _ = envs[e].step(S.env_action(act_space, acts[j]))
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
                    tr["obs"].append(obs[e]), tr["actions"].append(acts[j]), tr["logp"].append(logps[j])
                    tr["rewards"].append(r), tr["versions"].append(learner.version)
                    obs[e] = o2
                    if term or trunc:
                        batch.append(_finish(tr, ids[e], envs[e], o2, term, groups[e] and f"c.{groups[e]}"))
                        active.discard(e)
        for i in range(0, cfg.global_batch, cfg.micro_batch):
            learner.micro_step(batch[i:i + cfg.micro_batch])
        learner.extra["seq"] = seq  # resume position (checkpoints)
        learner.step()
    issued = {f"c.e{i}": (0, 0, i) for i in range(seq0, seq)}
    acct = accounting.fates({"issued": issued, "env_dropped": dropped, "incarnations": [1], "next": [seq],
                             "start": [seq0]}, learner.trained_ids[trained0:], [], [])
    cpu = placement.cpu_delta(cpu0, placement.cpu_seconds({"driver": [os.getpid()]}))
    return _report(cfg, learner, t0, env_steps, {"mode": "sync colocated", "env_errors": env_errors,
                                                 "accounting": acct, "cpu_seconds": cpu, "placement": "colocated",
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
    cfg.check()
    if cfg.colocated:
        return train_colocated(cfg)
    import ray
    from ray.exceptions import RayActorError, RayTaskError
    from ray.util.queue import Empty, Queue
    if not ray.is_initialized():
        ray.init()
    import dataclasses
    import os
    cluster = ray.cluster_resources()
    placement.check_resources(cfg, cluster)  # RLError at start when the roles ask for more than there is
    opts = {r: placement.role_options(cfg, r, cluster.get("GPU", 0)) for r in ("worker", "server", "learner")}
    scfg = dataclasses.replace(cfg, server_device="cuda") if opts["server"]["num_gpus"] > 0 else cfg
    prev_threads = placement.set_threads(cfg.torch_threads)  # the driver (and a learner in it) too
    PolicyServer, RolloutWorker = policy_server_class(), rollout_worker_class()
    obs_space, act_space = env_spaces(cfg)
    learner = Learner(cfg, obs_space, act_space)  # with cfg.resume: from the latest checkpoint
    grouper = GroupBuffer(cfg.group_size, cfg.algorithm == "grpo")  # grpo: whole groups only
    worker_seq = learner.extra.setdefault("worker_seq", {})  # resume: episode counters go on
    queue = Queue(maxsize=cfg.queue_size, actor_options={"num_cpus": 0})
    gs = cfg.group_size if cfg.algorithm == "grpo" else 1  # a resumed run goes on in whole groups
    start = [-(-int(worker_seq.get(i, 0)) // gs) * gs for i in range(cfg.num_workers)]
    ledger = accounting.ledger_class().options(num_cpus=0).remote(cfg.num_workers, start)
    server = control = PolicyServer.options(max_concurrency=1000, **opts["server"]).remote(
        scfg, obs_space, act_space, learner.state())
    if learner.version:
        ray.get(server.set_weights.remote(learner.state(), learner.version))
    # max_concurrency=2: pid() answers while run() is going (run is the one long call a worker has)
    workers = [RolloutWorker.options(max_restarts=cfg.max_restarts, max_task_retries=0,
                                     max_concurrency=2, **opts["worker"])
               .remote(i, cfg, server, queue, ledger) for i in range(cfg.num_workers)]
    learner_actor = None
    if placement.learner_is_actor(cfg):
        if cfg.checkpoint_dir or cfg.resume:
            for a in workers + [server, ledger]:
                ray.kill(a)
            raise RLError("learner checkpoints (checkpoint_dir, resume) need the learner in the driver: with "
                          f"placement {cfg.placement!r} and learner_resources {cfg.learner_resources!r} it is an "
                          "actor; use placement 'disaggregated' without learner_resources")
        learner_actor = placement.learner_actor_class().options(**opts["learner"]).remote(
            cfg, (obs_space, act_space), server)
    trained_once = accounting.TrainedOnce()
    trained0 = len(learner.trained_ids)  # a resumed learner brings the ids it trained before

    def server_call(ref, what, timeout=None):
        """ray.get on a server call; a dead server is RLError naming it, not a raw ActorDiedError."""
        try:
            return ray.get(ref, timeout=timeout)
        except RayActorError as e:
            raise RLError(f"the policy server actor (PolicyServer, pid {server_pid}) died during {what}: "
                          f"{str(e).splitlines()[0]}") from None

    def dead_role():
        """Which shared actor is gone (server, ledger, queue, learner), or None."""
        for name, ref in (("the policy server actor (PolicyServer, pid %s)" % server_pid, server.stats.remote()),
                          ("the Ledger actor (trajectory ids)", ledger.snapshot.remote()),
                          ("the trajectory queue actor", queue.actor.qsize.remote())):
            try:
                ray.get(ref, timeout=10)
            except Exception:
                return name
        return None
    runs: Dict[Any, int] = {}
    results: List[dict] = []
    restarts = 0
    dropped_stale: List[str] = []
    unused: List[str] = []
    env_steps = 0
    try:  # the clock starts once every actor is up (process start and imports are not throughput)
        pids = ray.get([w.pid.remote() for w in workers], timeout=120)
        server_pid = ray.get(server.pid.remote(), timeout=120)
        learner_pid = ray.get(learner_actor.pid.remote(), timeout=120) if learner_actor else os.getpid()
    except Exception as e:
        for a in workers + [server, ledger] + ([learner_actor] if learner_actor else []):
            ray.kill(a)
        placement.set_threads(prev_threads)
        raise RLError(f"the actors did not start: {e}") from None
    if learner_actor:
        learner = placement.RemoteLearner(learner_actor, learner_pid)
    role_pids = lambda: {"workers": pids, "server": [server_pid], "learner": [learner_pid],  # noqa: E731
                         "driver": [os.getpid()] if learner_actor else []}
    cpu0 = placement.cpu_seconds(role_pids())
    if _hooks and "started" in _hooks:  # benches: every actor is up, the clock starts now
        _hooks["started"]({"worker_pids": pids, "server_pid": server_pid, "learner_pid": learner_pid})
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
                if isinstance(cause, RLError):
                    raise RLError(f"rollout worker {i}: {cause}") from None
                dead = dead_role()
                if dead:
                    raise RLError(f"{dead} died; rollout worker {i} stopped: {str(cause).splitlines()[0]}") from None
                raise RLError(f"rollout worker {i} failed: {cause}") from None
            except RayActorError as e:
                restarts += 1
                if restarts > cfg.max_restarts * cfg.num_workers or not _alive(workers[i]):
                    dead = dead_role()
                    if dead:
                        raise RLError(f"{dead} died (rollout worker {i} lost it: {str(e).splitlines()[0]})") from None
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
                pids[workers.index(w)] = ray.get(w.pid.remote(), timeout=30)
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
            except RayActorError as e:
                raise RLError(f"the trajectory queue actor died: {str(e).splitlines()[0]}") from None
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
                wid, n = int(t["id"].split(".")[0][1:]), int(t["id"].rsplit(".e", 1)[1])
                worker_seq[wid] = max(worker_seq.get(wid, 0), n + 1)
                group = grouper.add(t)
                if any(learner.lag(x) > cfg.max_lag for x in group):  # grpo: a group goes or stays whole
                    dropped_stale.extend(x["id"] for x in group)
                    continue
                for x in group:
                    pending.append(x)
                    got += 1
                    if cfg.streamer and len(pending) == cfg.micro_batch:
                        trained_once.check(y["id"] for y in pending)
                        learner.micro_step(pending)
                        pending = []
            if not cfg.streamer:
                trained_once.check(t["id"] for t in pending)
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
            learner.step()  # a learner actor publishes to the server itself
            if not learner_actor:  # one ray.put, the version stamp with it
                server_call(server.set_weights.remote(ray.put(learner.state()), learner.version), "set_weights")
            collect_finished()
            if on_step:
                on_step({"version": learner.version, "workers": workers, "server": server, "worker_pids": pids,
                         "server_pid": server_pid, "learner": learner_actor, "learner_pid": learner_pid})
    except BaseException:
        try:
            ray.get(control.set_stop.remote(), timeout=10)
        except Exception:
            pass
        raise
    finally:
        placement.set_threads(prev_threads)
        cpu = placement.cpu_delta(cpu0, placement.cpu_seconds(role_pids()))
        snapshot = None
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
                        restarts += 1  # noqa: SIM105
                    except Exception:
                        pass
                runs.clear()
            while True:
                try:
                    unused.append(queue.get_nowait()["id"])
                except Exception:
                    break
            unused.extend(grouper.waiting_ids())
            server_stats = ray.get(server.stats.remote(), timeout=10)
        except Exception:
            server_stats = None
        try:
            snapshot = ray.get(ledger.snapshot.remote(), timeout=10)
            if learner_actor:
                learner.finish()
        except Exception:
            pass
        for a in workers + [server, ledger] + ([learner_actor] if learner_actor else []):
            try:
                ray.kill(a)
            except Exception:
                pass
        try:
            queue.shutdown(force=True)
        except Exception:
            pass
    if snapshot is None:
        raise RLError("the Ledger actor (trajectory ids) was gone at the end of the run: no accounting")
    acct = accounting.fates(snapshot, learner.trained_ids[trained0:], dropped_stale, unused)
    pushed = [tid for r in results for tid in r["pushed"]]
    if cfg.checkpoint_dir and learner.version:  # the Ledger's counters as the run ended: a resumed run makes
        for wid, n in enumerate(snapshot["next"]):  # new ids only
            worker_seq[wid] = max(worker_seq.get(wid, 0), int(n))
        learner.save_checkpoint()
    dropped_env = [tid for r in results for tid in r["dropped_env"]]
    errs = [r for r in results if r["first_error"]]
    return _report(cfg, learner, t0, env_steps, {
        "mode": mode_name(cfg), "env_errors": sum(r["env_errors"] for r in results),
        "first_env_error": errs[0]["first_error"] if errs else None, "dropped_env_ids": dropped_env,
        "dropped_stale_ids": dropped_stale, "unused_ids": unused, "pushed_ids": pushed,
        "worker_restarts": restarts, "server": server_stats, "worker_pids": pids,
        "worker_runs": [{"worker": r["worker"], "incarnation": r["incarnation"], "pushed": len(r["pushed"]),
                         "env_steps": r["env_steps"]} for r in results],
        "abandoned_at_stop": sum(r.get("abandoned_at_stop", 0) for r in results),
        "accounting": acct, "cpu_seconds": cpu, "placement": cfg.placement,
        "placement_options": {**opts, "learner_actor": bool(learner_actor)}})


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
    p.add_argument("--server-device", choices=("cpu", "cuda"), default="cpu",
                   help="where the policy server runs its forward passes (cuda: Ray gives it 1 GPU)")
    # rl-runtime: placement and threads
    p.add_argument("--placement", choices=("colocated", "disaggregated", "hybrid"), default=None,
                   help="where the roles run (default disaggregated; --colocated is placement colocated)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch.set_num_threads in every process")
    p.add_argument("--num-cpus", type=int, default=None, help="ray.init(num_cpus=...) (default: Ray's)")
    # policies, algorithms, checkpoints (rl-policy)
    p.add_argument("--policy", default="auto", help="mlp, cnn, auto, package.module:fn or lerobot:TYPE-or-DIR")
    p.add_argument("--action-squash", choices=("tanh", "clip"), default="tanh", help="Box actions: squash or clip")
    p.add_argument("--algorithm", choices=("reinforce", "ppo", "grpo"), default="reinforce")
    p.add_argument("--ppo-epochs", type=int, default=1, help="ppo/grpo: passes over each global batch")
    p.add_argument("--group-size", type=int, default=4, help="grpo: trajectories per group (same reset seed)")
    p.add_argument("--gamma", type=float, default=0.97, help="discount")
    p.add_argument("--checkpoint-dir", default=None, help="learner checkpoints: DIR/step_NNNNNN")
    p.add_argument("--checkpoint-every", type=int, default=0, help="a checkpoint every N steps (0: at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    a = p.parse_args(argv)
    cfg = RLConfig(env=a.env, num_workers=a.workers, envs_per_worker=a.envs_per_worker, steps=a.steps,
                   global_batch=a.global_batch, micro_batch=a.micro_batch, max_batch_size=a.max_batch_size,
                   max_wait_ms=a.max_wait_ms, max_lag=a.max_lag, queue_size=a.queue_size,
                   train_async=not a.no_train_async, rollout_async=not a.no_rollout_async,
                   streamer=not a.no_streamer, colocated=a.colocated, lr=a.lr, seed=a.seed,
                   server_device=a.server_device, torch_threads=a.torch_threads,
                   placement=a.placement or ("colocated" if a.colocated else "disaggregated"),
                   policy=a.policy, action_squash=a.action_squash, algorithm=a.algorithm, ppo_epochs=a.ppo_epochs,
                   group_size=a.group_size, gamma=a.gamma, checkpoint_dir=a.checkpoint_dir,
                   checkpoint_every=a.checkpoint_every, resume=a.resume)
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
        print(accounting.summary_line(rep["accounting"]))
    return 0
