"""Placement of a vlafeed.rl run's roles on Ray: which process each role runs in and with which
Ray resources, the learner as a Ray actor, and the torch thread setting applied in every process.

Roles and their RLinf names: rollout workers step the environments (RLinf's "env"), the policy
server runs batched inference (RLinf's "rollout"), the learner computes gradients (RLinf's "actor").

- ``colocated``: one process, no Ray (``train_colocated``): envs, inference and training take turns.
- ``disaggregated``: rollout workers and policy server are separate Ray actors; the learner runs in
  the calling process, or in its own Ray actor when ``learner_resources`` is given.
- ``hybrid``: rollout workers are separate actors; policy server and learner are two actors that
  share one GPU through fractional ``num_gpus`` (0.5 each unless set) when the cluster has a GPU.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

PLACEMENTS = ("colocated", "disaggregated", "hybrid")
_RESOURCE_KEYS = ("num_cpus", "num_gpus")


def check_placement(cfg) -> None:
    """Validates placement and the per-role resource dicts (ValueError naming the key)."""
    if cfg.colocated and cfg.placement == "disaggregated":
        cfg.placement = "colocated"  # the old switch
    if cfg.placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {cfg.placement!r}")
    if cfg.colocated and cfg.placement != "colocated":
        raise ValueError(f"colocated=True contradicts placement {cfg.placement!r}")
    cfg.colocated = cfg.placement == "colocated"
    for role in ("worker", "server", "learner"):
        res = getattr(cfg, f"{role}_resources")
        if not isinstance(res, dict):
            raise ValueError(f"{role}_resources must be a dict of num_cpus/num_gpus, got {type(res).__name__}")
        for k, v in res.items():
            if k not in _RESOURCE_KEYS:
                raise ValueError(f"{role}_resources: unknown key {k!r} (known: {', '.join(_RESOURCE_KEYS)})")
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{role}_resources[{k!r}] must be a number >= 0, got {v!r}")
        if res.get("num_gpus", 0) > 1 and res["num_gpus"] != int(res["num_gpus"]):
            raise ValueError(f"{role}_resources['num_gpus'] above 1 must be whole, got {res['num_gpus']}")
    if cfg.torch_threads < 1:
        raise ValueError(f"torch_threads must be >= 1, got {cfg.torch_threads}")


def learner_is_actor(cfg) -> bool:
    return cfg.placement == "hybrid" or (cfg.placement == "disaggregated" and bool(cfg.learner_resources))


def role_options(cfg, role: str, cluster_gpus: float = 0.0) -> Dict[str, Any]:
    """Ray .options() resources for a role ('worker', 'server', 'learner').

    Default num_cpus is 0 (the roles share the cluster's CPUs without reserving them, as before);
    server_device='cuda' gives the server one GPU; hybrid gives server and learner 0.5 GPU each
    when the cluster has a GPU and no num_gpus was set."""
    res = dict(getattr(cfg, f"{role}_resources"))
    opts = {"num_cpus": res.get("num_cpus", 0)}
    gpus = res.get("num_gpus")
    if gpus is None:
        gpus = 0
        if role == "server" and cfg.server_device == "cuda":
            gpus = 1
        if cfg.placement == "hybrid" and role in ("server", "learner") and cluster_gpus >= 1:
            gpus = 0.5
    opts["num_gpus"] = gpus
    return opts


def check_resources(cfg, cluster: Dict[str, float]) -> None:
    """RLError at start when the roles ask for more GPUs/CPUs than the cluster has (instead of Ray
    waiting forever for an actor it cannot place)."""
    from vlafeed.rl.config import RLError
    g = cluster.get("GPU", 0)
    asks = {"worker": role_options(cfg, "worker", g), "server": role_options(cfg, "server", g),
            "learner": role_options(cfg, "learner", g)}
    if cfg.server_device == "cuda" and g < 1:
        raise RLError(f"server_device 'cuda': the Ray cluster has no GPU (resources: {cluster})")
    need_gpu = cfg.num_workers * asks["worker"]["num_gpus"] + asks["server"]["num_gpus"] + (
        asks["learner"]["num_gpus"] if learner_is_actor(cfg) else 0)
    need_cpu = cfg.num_workers * asks["worker"]["num_cpus"] + asks["server"]["num_cpus"] + (
        asks["learner"]["num_cpus"] if learner_is_actor(cfg) else 0)
    if need_gpu > g + 1e-9:
        raise RLError(f"placement {cfg.placement!r} asks for {need_gpu:g} GPUs ({asks}); the Ray cluster has {g:g}")
    if need_cpu > cluster.get("CPU", 0) + 1e-9:
        raise RLError(f"placement {cfg.placement!r} asks for {need_cpu:g} CPUs ({asks}); the Ray cluster has "
                      f"{cluster.get('CPU', 0):g}")


def set_threads(n: int) -> int:
    """torch.set_num_threads(n) in this process; returns the previous setting."""
    import torch
    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    return prev


_LEARNER = []


def learner_actor_class():
    """The LearnerActor Ray class: the Learner in its own process; after each optimizer step it
    publishes the weights to the policy server itself (one ray.put, a version stamp)."""
    if _LEARNER:
        return _LEARNER[0]
    import ray

    @ray.remote
    class LearnerActor:
        def __init__(self, cfg, args: tuple, server):
            set_threads(cfg.torch_threads)
            from vlafeed.rl.learner import Learner
            self.learner = Learner(cfg, *args)
            self.server = server

        def pid(self) -> int:
            return os.getpid()

        def placement(self) -> dict:
            import torch
            return {"pid": os.getpid(), "gpu_ids": [str(x) for x in ray.get_gpu_ids()],
                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "torch_cuda": torch.cuda.is_available(), "torch_threads": torch.get_num_threads()}

        def state(self):
            return self.learner.state()

        def micro_step(self, trajs: List[dict]) -> int:
            self.learner.micro_step(trajs)
            return len(trajs)

        def step(self) -> int:
            self.learner.step()
            ok = ray.get(self.server.set_weights.remote(ray.put(self.learner.state()), self.learner.version))
            return self.learner.version if ok else -self.learner.version

        def summary(self) -> dict:
            lr = self.learner
            return {"trained_ids": lr.trained_ids, "lags": lr.lags, "returns": lr.returns,
                    "trained_steps": lr.trained_steps, "version": lr.version}

    _LEARNER.append(LearnerActor)
    return LearnerActor


class RemoteLearner:
    """The driver's handle on a LearnerActor with the attributes run.py reads from a local Learner.

    micro_step is not waited for (Ray runs an actor's calls in order), so the driver keeps pulling
    trajectories while the learner computes; step() waits. A dead learner actor -> RLError naming it."""

    def __init__(self, actor, pid: int):
        self.actor, self.pid = actor, pid
        self.version = 0
        self.inflight: list = []
        self.trained_ids: List[str] = []
        self.lags: List[int] = []
        self.returns: List[float] = []
        self.trained_steps = 0
        self.resumed_samples = 0  # a learner actor never resumes (checkpoints need the learner in the driver)

    def _get(self, ref, what: str):
        import ray
        from ray.exceptions import RayActorError, RayTaskError
        from vlafeed.rl.config import RLError
        try:
            return ray.get(ref)
        except RayActorError as e:
            raise RLError(f"the learner actor (LearnerActor, pid {self.pid}) died during {what}: "
                          f"{str(e).splitlines()[0]}") from None
        except RayTaskError as e:
            cause = e.cause if getattr(e, "cause", None) is not None else e
            raise RLError(f"the learner actor (LearnerActor, pid {self.pid}) failed in {what}: "
                          f"{type(cause).__name__}: {cause}") from None

    def lag(self, traj) -> int:
        return self.version - int(min(traj["versions"]))

    def micro_step(self, trajs: List[dict]) -> None:
        self.inflight.append(self.actor.micro_step.remote(trajs))

    def step(self) -> None:
        for ref in self.inflight:
            self._get(ref, "micro_step")
        self.inflight = []
        v = self._get(self.actor.step.remote(), "step")
        self.version = abs(v)

    def state(self):
        return self._get(self.actor.state.remote(), "state")

    def finish(self) -> None:
        s = self._get(self.actor.summary.remote(), "summary")
        self.trained_ids, self.lags, self.returns = s["trained_ids"], s["lags"], s["returns"]
        self.trained_steps, self.version = s["trained_steps"], s["version"]


def cpu_seconds(pids: Dict[str, List[int]]) -> Dict[str, float]:
    """User+system CPU seconds so far of each role's processes (psutil; a gone process counts 0)."""
    import psutil
    out = {}
    for role, ps in pids.items():
        tot = 0.0
        for pid in ps:
            try:
                t = psutil.Process(pid).cpu_times()
                tot += t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        out[role] = tot
    return out


def cpu_delta(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    return {k: max(0.0, after.get(k, 0.0) - before.get(k, 0.0)) for k in after}
