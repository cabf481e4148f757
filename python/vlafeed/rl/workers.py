"""RolloutWorker: the Ray actor that steps envs_per_worker environments with actions from the
PolicyServer, in lockstep or each env on its own (rollout_async), and pushes finished
trajectories into the bounded queue; and the trajectory records it fills. Defined on first use so
that importing vlafeed.rl does not import Ray."""
from __future__ import annotations

import time
from typing import List, Optional

import numpy as np

from vlafeed.rl import spaces as S
from vlafeed.rl.config import RLConfig, RLError
from vlafeed.rl.envs import make_env

_CLASS = []


def _new_traj():
    return {"obs": [], "actions": [], "logp": [], "rewards": [], "versions": []}


def _finish(tr, tid, env=None, last_obs=None, terminated=True, group=None):
    """A finished trajectory: observations stacked per leaf of the env's observation space
    (spaces.stack_numpy: dict/tuple aware), actions as the action space's dtype, and for PPO's
    bootstrap the observation after the last step and whether the episode terminated."""
    if env is None:  # the old flat float observations
        obs = np.asarray(tr["obs"], dtype=np.float32)
        acts = np.asarray(tr["actions"])
        last = None if last_obs is None else np.asarray([last_obs], dtype=np.float32)
    else:
        obs = S.stack_numpy(tr["obs"], env.observation_space)
        acts = S.action_numpy(env.action_space, tr["actions"])
        last = None if last_obs is None else S.stack_numpy([last_obs], env.observation_space)
    return {"id": tid, "obs": obs, "actions": acts,
            "logp": np.asarray(tr["logp"], dtype=np.float32), "rewards": np.asarray(tr["rewards"], dtype=np.float32),
            "versions": np.asarray(tr["versions"], dtype=np.int64), "finished_at": time.perf_counter(),
            "last_obs": last, "terminated": bool(terminated), "group": group}


def reset_seed(cfg: RLConfig, wid: int, counter: int) -> tuple:
    """(reset seed, GRPO group id or None) of worker wid's episode number `counter` (the Ledger's counter,
    which goes on across restarts and resumes, so no seed is used twice). GRPO: the group_size consecutive
    episodes of a group share one seed (the same start state)."""
    if cfg.algorithm == "grpo":
        g = counter // cfg.group_size
        return cfg.seed * 1000003 + g * cfg.num_workers + wid, f"w{wid}.g{g}"
    return cfg.seed * 1000003 + counter * cfg.num_workers + wid, None


def rollout_worker_class():
    """The RolloutWorker actor class (made once per process)."""
    if _CLASS:
        return _CLASS[0]
    import ray

    @ray.remote
    class RolloutWorker:
        def __init__(self, worker_id: int, cfg: RLConfig, server, queue, ledger):
            self.wid, self.cfg, self.server, self.queue = worker_id, cfg, server, queue
            # ids and the episode counter come from the driver's Ledger, so a restart (or a resumed run,
            # whose Ledger starts at the checkpoint's counters) goes on from the counter
            from vlafeed.rl.placement import set_threads
            set_threads(cfg.torch_threads)
            self.ledger = ledger
            self.incarnation = ray.get(ledger.register.remote(worker_id))
            self.tid = None
            self.groups = {}  # trajectory id -> GRPO group id
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
            try:
                self.tid = tid = ray.get(self.ledger.issue.remote(self.wid, self.incarnation))
            except ray.exceptions.RayActorError as exc:
                raise RLError(f"the Ledger actor (trajectory ids) died: {str(exc).splitlines()[0]}") from None
            counter = int(tid.rsplit(".e", 1)[1])  # w{wid}.e{counter}: one seed per id (per group under GRPO)
            seed, self.groups[tid] = reset_seed(self.cfg, self.wid, counter)
            obs, _ = self.envs[e].reset(seed=seed)
            return obs, tid

        def _error(self, e, tid, exc):
            if isinstance(exc, RLError):  # not the env: the Ledger is gone
                raise exc
            self.env_errors += 1
            self.dropped_env.append(tid)
            self.ledger.dropped_by_env.remote(tid)
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
                        self._error(e, self.tid, exc)
                while active:
                    if episodes is None and self._stop_due():
                        return
                    es = sorted(active)
                    acts, logps, ver = ray.get(self.server.act.remote([obs[e] for e in es]))
                    for j, e in enumerate(es):
                        try:
                            o2, r, term, trunc, _ = self.envs[e].step(S.env_action(self.envs[e].action_space,
                                                                                   acts[j]))
                        except Exception as exc:
                            self._error(e, ids[e], exc)
                            del active[e]
                            continue
                        self.steps += 1
                        tr = trs[e]
                        tr["obs"].append(obs[e]), tr["actions"].append(acts[j]), tr["logp"].append(logps[j])
                        tr["rewards"].append(r), tr["versions"].append(ver)
                        obs[e] = o2
                        if term or trunc:
                            out.append(_finish(tr, ids[e], self.envs[e], o2, term, self.groups.pop(ids[e])))
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
                        self._error(e, self.tid, exc)
                        self._check_errors()
                        continue
                    started += 1
                    state[e] = (o, tid, _new_traj())
                    inflight[self.server.act.remote([o])] = e
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
                    o2, r, term, trunc, _ = self.envs[e].step(S.env_action(self.envs[e].action_space, acts[0]))
                except Exception as exc:
                    self._error(e, tid, exc)
                    self._check_errors()
                    if not (episodes is None and self._stop()):
                        start(e)
                    continue
                self.steps += 1
                tr["obs"].append(o), tr["actions"].append(acts[0]), tr["logp"].append(logps[0])
                tr["rewards"].append(r), tr["versions"].append(ver)
                if term or trunc:
                    self._push([_finish(tr, tid, self.envs[e], o2, term, self.groups.pop(tid))])
                    if not (episodes is None and self._stop()):
                        start(e)
                else:
                    state[e] = (o2, tid, tr)
                    inflight[self.server.act.remote([o2])] = e

    _CLASS.append(RolloutWorker)
    return RolloutWorker
