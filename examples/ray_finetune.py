#!/usr/bin/env python3
"""Fine-tune a small policy with Ray Train, fed by vlafeed (Ray Data or vlafeed.Loader).

    python3 examples/ray_finetune.py --dataset DIR --epochs 3                 # Ray Data pipeline
    python3 examples/ray_finetune.py --dataset DIR --data loader --checkpoint-every 4   # exact resume
    (the torchrun version of the same job: examples/train_policy.py)

--data ray (the default): ``ray.data.read_datasource(vlafeed.ray.LeRobotDatasource(...))``
with the camera rename and the CHW float32 conversion done by the C engine
inside each read task (no per-row Python ``.map``), handed to
``ray.train.torch.TorchTrainer`` (ScalingConfig(num_workers=N)); each worker
reads ``ray.train.get_dataset_shard("train").iter_torch_batches(...)``.
A checkpoint at the end of every epoch; after a failure Ray restarts the
workers from it and Ray Data re-reads the interrupted epoch from its start
(what was trained between the checkpoint and the failure is seen again).

--data loader: each Ray Train worker runs its own ``vlafeed.Loader`` with rank
and world size from ``ray.train.get_context()``; the loader's
``state_dict()`` goes into the checkpoint (every --checkpoint-every steps),
so a restarted worker continues sample for sample where the checkpoint
stopped.

Both: ``prepare_model`` (DDP: gloo on CPU, NCCL when CUDA is available),
AdamW, gradient accumulation (--accum micro-batches per optimizer step, DDP's
no_sync() on the others), a linear warm-up then cosine LR schedule,
``ray.train.report`` with the checkpoint attached by rank 0 only,
``FailureConfig(max_failures=...)``.

--log-dir DIR: each worker appends one JSON line per step to
DIR/rank<r>.jsonl (pid, epoch, step, loss, the batch's ``index`` values,
the checkpoint it resumed from). --kill-at STEP: rank 1 SIGKILLs its own
process at that global step, once (a marker file in the log dir), to show
the recovery.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "python") not in sys.path and (REPO / "python" / "vlafeed").is_dir():
    if any((REPO / "python" / "vlafeed" / "_native").glob("_core*.so")):  # the in-place build, else the installed package
        sys.path.insert(0, str(REPO / "python"))

CAMERA = "front"  # the renamed first camera


class Policy(nn.Module):
    """front image (float32 CHW) + observation.state -> action."""

    def __init__(self, state_dim: int, action_dim: int, width: int = 64):
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(3, 16, 5, stride=4, padding=2), nn.SiLU(),
                                   nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.SiLU(),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(32 + state_dim, width), nn.SiLU(), nn.Linear(width, action_dim))

    def forward(self, image, state):
        return self.head(torch.cat([self.image(image), state], dim=1))


def lr_lambda(warmup: int, total: int):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def source_kwargs(cfg):
    """What the engine does inside each read task / loader: rename, CHW float32, keys."""
    return dict(renames={cfg["camera"]: CAMERA}, image_format="float32",
                keys=[cfg["camera"], "observation.state", "action", "index"])


def train_loop(cfg):
    """Runs in every Ray Train worker."""
    import ray.train
    import ray.train.torch

    import vlafeed.ray as vray

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(cfg["seed"])
    model = ray.train.torch.prepare_model(Policy(cfg["state_dim"], cfg["action_dim"]))
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg["warmup"], cfg["total_updates"]))

    start_epoch, global_step, loader_state, resumed_from = 0, 0, None, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            saved = torch.load(os.path.join(d, "state.pt"), map_location="cpu", weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        global_step, loader_state = saved["global_step"], saved.get("loader")
        start_epoch = saved["epoch"] + 1 if loader_state is None else saved["epoch"]
        resumed_from = global_step

    log = open(os.path.join(cfg["log_dir"], f"rank{rank}.jsonl"), "a") if cfg.get("log_dir") else None

    def save_and_report(epoch, metrics, loader=None):
        # Every rank reports (it is a barrier); only rank 0 attaches the checkpoint.
        if rank != 0:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory() as d:
            state = {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                     "epoch": epoch, "global_step": global_step}
            if loader is not None:
                state["loader"] = loader.state_dict()
            torch.save(state, os.path.join(d, "state.pt"))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))

    def maybe_die():
        marker = os.path.join(cfg["log_dir"] or ".", "killed")
        if cfg.get("kill_at") is not None and rank == 1 and global_step == cfg["kill_at"] \
                and not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()))
            # Ray Train's controller collects reports (and registers their checkpoints) when it
            # polls the workers, every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default); a
            # worker that dies right after a report can take it with it. Wait for the poll.
            time.sleep(3 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2.0")))
            os.kill(os.getpid(), signal.SIGKILL)

    micro = 0

    def step(batch, epoch):
        nonlocal micro, global_step
        image = batch[CAMERA].to(device, non_blocking=True)
        state = batch["observation.state"].to(device)
        target = batch["action"].to(device)
        last = (micro + 1) % cfg["accum"] == 0
        sync = model.no_sync() if (world > 1 and not last and hasattr(model, "no_sync")) else _null()
        with sync:
            loss = F.mse_loss(model(image, state), target)
            (loss / cfg["accum"]).backward()
        micro += 1
        if last:
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        global_step += 1
        if log is not None:
            log.write(json.dumps({"t": time.time(), "pid": os.getpid(), "epoch": epoch, "step": global_step, "loss": float(loss.detach()),
                                  "lr": sched.get_last_lr()[0], "resumed_from": resumed_from,
                                  "index": batch["index"].tolist()}) + "\n")
            log.flush()
        maybe_die()
        return float(loss.detach())

    if cfg["data"] == "ray":
        shard = ray.train.get_dataset_shard("train")
        for epoch in range(start_epoch, cfg["epochs"]):
            losses = [step(b, epoch) for b in shard.iter_torch_batches(
                batch_size=cfg["batch_size"], collate_fn=vray.TorchCollate(), drop_last=True)]
            save_and_report(epoch, {"epoch": epoch, "loss": sum(losses) / max(1, len(losses)),
                                    "steps": global_step})
    else:
        loader = vray.loader_for_train_worker(cfg["dataset"], state=loader_state, mode=cfg["mode"],
                                              batch_size=cfg["batch_size"], seed=cfg["seed"], drop_last=True,
                                              threads=1, **source_kwargs(cfg))
        epoch = loader.epoch if loader_state is not None else start_epoch
        while epoch < cfg["epochs"]:
            loader.set_epoch(epoch)  # after a restore: keeps the restored position
            losses = []
            for batch in loader:
                losses.append(step(batch, epoch))
                if global_step % cfg["checkpoint_every"] == 0:
                    save_and_report(epoch, {"epoch": epoch, "loss": sum(losses) / len(losses),
                                            "steps": global_step}, loader)
            epoch += 1
        loader.close()
    if log is not None:
        log.close()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def build_trainer(cfg, storage_path):
    """The TorchTrainer for cfg (a dict; see parse_args), with its Ray dataset when data == "ray"."""
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    import vlafeed.ray as vray

    use_gpu = torch.cuda.is_available()
    datasets = {}
    if cfg["data"] == "ray":
        source = vray.LeRobotDatasource(cfg["dataset"], rows_per_block=cfg["rows_per_block"], **source_kwargs(cfg))
        datasets["train"] = ray.data.read_datasource(source)
    resources = {"CPU": cfg["cpus_per_worker"]}
    if use_gpu:
        resources["GPU"] = 1
    return TorchTrainer(
        train_loop, train_loop_config=cfg, datasets=datasets,
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=cfg["workers"], use_gpu=use_gpu,
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(name=cfg["name"], storage_path=storage_path,
                                       failure_config=ray.train.FailureConfig(max_failures=cfg["max_failures"])))


def config(dataset, **overrides):
    """The run's settings, with the state/action sizes read from the dataset's metadata."""
    import vlafeed

    meta = vlafeed.LeRobotDatasetMetadata(str(dataset))
    cfg = dict(dataset=str(dataset), data="ray", mode="stream", camera=meta.camera_keys[0], epochs=3,
               batch_size=8, accum=2, lr=3e-3, warmup=4, workers=2, cpus_per_worker=0.5, seed=0,
               rows_per_block=64, checkpoint_every=4, max_failures=1, kill_at=None, log_dir=None,
               name="vlafeed-ray-finetune", state_dim=int(meta.features["observation.state"]["shape"][-1]),
               action_dim=int(meta.features["action"]["shape"][-1]))
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    per_rank = meta.total_frames // cfg["workers"] // cfg["batch_size"]
    cfg["total_updates"] = max(1, per_rank * cfg["epochs"] // cfg["accum"])
    return cfg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--data", choices=["ray", "loader"], default="ray")
    p.add_argument("--mode", choices=["stream", "pool", "map"], default="stream", help="--data loader's mode")
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--accum", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--cpus-per-worker", type=float)
    p.add_argument("--num-cpus", type=int, default=None, help="ray.init(num_cpus=...) when starting Ray here")
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--max-failures", type=int)
    p.add_argument("--kill-at", type=int)
    p.add_argument("--log-dir")
    p.add_argument("--storage", default=None, help="Ray Train storage_path (default: a temp dir)")
    a = p.parse_args(argv)
    import ray

    cfg = config(a.dataset, data=a.data, mode=a.mode, epochs=a.epochs, batch_size=a.batch_size, accum=a.accum,
                 lr=a.lr, warmup=a.warmup, workers=a.workers, cpus_per_worker=a.cpus_per_worker,
                 checkpoint_every=a.checkpoint_every, max_failures=a.max_failures, kill_at=a.kill_at,
                 log_dir=a.log_dir)
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)
    if not torch.cuda.is_available():
        print("no CUDA device: DDP over gloo on CPU (NCCL is used when a GPU is present)", flush=True)
    ray.init(num_cpus=a.num_cpus, include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    storage = a.storage or tempfile.mkdtemp(prefix="vlafeed-ray-")
    t0 = time.perf_counter()
    result = build_trainer(cfg, storage).fit()
    print(json.dumps({"metrics": result.metrics, "checkpoint": str(result.checkpoint),
                      "error": None if result.error is None else str(result.error),
                      "wall_s": round(time.perf_counter() - t0, 2)}, default=str))
    ray.shutdown()
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
