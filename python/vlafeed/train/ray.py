"""Running vlafeed.train under Ray Train (Ray's TorchTrainer sets up the process group; the harness uses it).

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from vlafeed.train.ray import train_loop_per_worker

    TorchTrainer(train_loop_per_worker,
                 train_loop_config={"config": "run.yaml", "overrides": ["--train.steps", "100"]},
                 scaling_config=ScalingConfig(num_workers=2, use_gpu=False)).fit()

Each worker loads the same config, trains with the process group Ray created (gloo on CPU, NCCL with GPUs),
and reports its summary (steps, losses, tokens/s, data-wait fraction) through ray.train.report.
"""
from __future__ import annotations


def train_loop_per_worker(loop_config: dict):
    import ray.train

    from vlafeed.train.config import load_config
    from vlafeed.train.runner import train
    cfg = load_config(loop_config.get("config"), list(loop_config.get("overrides", [])))
    summary = train(cfg)
    ray.train.report({k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None})
    return summary
