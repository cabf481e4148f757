"""RLConfig (every switch of a run) and RLError."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


class RLError(RuntimeError):
    """The run cannot go on: a worker or the server is gone, an env keeps raising, nothing arrives."""


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
    server_device: str = "cpu"         # policy server's device: "cpu" or "cuda" (Ray gives the server 1 GPU)
    # --- policies, algorithms, learner checkpoints (rl-policy; see docs/rl.md) ---
    policy: str = "auto"               # mlp | cnn | auto (cnn if an obs leaf is an image) | pkg.mod:fn | lerobot:TYPE-or-DIR
    action_squash: str = "tanh"        # Box actions: tanh (squashed Gaussian) | clip (clipped Gaussian)
    algorithm: str = "reinforce"       # reinforce | ppo | grpo
    gae_lambda: float = 0.95           # ppo: GAE lambda
    vf_coef: float = 0.5               # ppo: value-loss weight
    ent_coef: float = 0.0              # ppo/grpo/reinforce: entropy-bonus weight
    ppo_epochs: int = 1                # ppo/grpo: passes over each global batch (optimizer steps per version)
    group_size: int = 4                # grpo: trajectories per group (same reset seed)
    checkpoint_dir: Optional[str] = None  # learner checkpoints go to DIR/step_NNNNNN (None: none)
    checkpoint_every: int = 0          # a checkpoint every N optimizer steps (versions); 0: only at the end
    resume: bool = False               # continue from the latest checkpoint in checkpoint_dir
    # --- placement and threads (rl-runtime: vlafeed/rl/placement.py) ---
    placement: str = "disaggregated"   # 'colocated' | 'disaggregated' | 'hybrid' (see docs/rl.md "Placement")
    worker_resources: dict = field(default_factory=dict)   # Ray options per rollout worker: num_cpus, num_gpus
    server_resources: dict = field(default_factory=dict)   # ... for the policy server
    learner_resources: dict = field(default_factory=dict)  # ... for the learner (non-empty: the learner is an actor)
    torch_threads: int = 1             # torch.set_num_threads in every process of the run (the fair setting)

    def check(self):
        if self.global_batch % self.micro_batch:
            raise ValueError(f"global_batch {self.global_batch} is not a multiple of micro_batch {self.micro_batch}")
        for k in ("num_workers", "envs_per_worker", "steps", "global_batch", "micro_batch", "max_batch_size",
                  "queue_size"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if self.max_wait_ms < 0 or self.max_lag < 0:
            raise ValueError("max_wait_ms and max_lag must be >= 0")
        from vlafeed.rl.placement import check_placement
        check_placement(self)
        if self.server_device not in ("cpu", "cuda"):
            raise ValueError(f"server_device must be 'cpu' or 'cuda' (Ray assigns the GPU), got {self.server_device!r}")
        self._check_policy_keys()

    def _check_policy_keys(self):
        """The keys of policies, algorithms and checkpoints (rl-policy)."""
        if self.algorithm not in ("reinforce", "ppo", "grpo"):
            raise ValueError(f"algorithm must be 'reinforce', 'ppo' or 'grpo', got {self.algorithm!r}")
        if self.action_squash not in ("tanh", "clip"):
            raise ValueError(f"action_squash must be 'tanh' or 'clip', got {self.action_squash!r}")
        if self.ppo_epochs < 1 or self.checkpoint_every < 0:
            raise ValueError("ppo_epochs must be >= 1 and checkpoint_every >= 0")
        if self.algorithm == "grpo":
            if self.group_size < 2:
                raise ValueError(f"group_size must be >= 2 for grpo, got {self.group_size}")
            if self.micro_batch % self.group_size:
                raise ValueError(f"grpo: micro_batch {self.micro_batch} is not a multiple of group_size "
                                 f"{self.group_size} (a group is trained in one micro-batch)")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("resume=True needs checkpoint_dir")
