#!/usr/bin/env python3
"""Train a small VLA-style policy on a LeRobot dataset fed by vlafeed.

    torchrun --nproc_per_node=2 examples/train_policy.py --dataset DIR --steps 200
    python3 examples/train_policy.py --dataset DIR --steps 50      # one process

The policy: a small CNN encodes each camera image (shared weights plus a
learned camera embedding), an MLP encodes observation.state, the task string
is hashed (CRC-32, stable across processes) into an embedding table, and a
2-layer transformer over [task, state, cameras..., chunk queries] predicts an
action chunk: `action` over the next --chunk steps (a delta window
[0, 1/fps, ..., (chunk-1)/fps], padded steps masked out of the L1 loss).

Data: vlafeed.Loader in stream mode (--mode pool: the episode pool), one
loader per process with rank and world size from torch.distributed, uint8
frames (converted on the device). --log-indices PREFIX writes each step's
`index` column to PREFIX.rank<r>.jsonl (what a resumed run must match).
Distributed: DDP over gloo on CPU, NCCL when CUDA is used (--device).

Reports (rank 0): a tqdm bar with loss, samples/s and the fraction of step
time spent waiting for data; at the end a summary (also written to
<checkpoint-dir>/summary.json): first and last loss, samples/s, data-wait
fraction and the loader's own stats(). Checkpoints every --checkpoint-every
steps hold the model, optimizer, step, epoch and each rank's loader state
(loader.state_dict(), when the loader has it); --resume continues from one.

`--loader reference` feeds the same batches from the pure-Python LeRobot
reference in tests/python/lerobot_reference.py instead (slow; a baseline).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------
# the policy

class ImageEncoder(nn.Module):
    """uint8/float image [B,3,H,W] -> [B,d]: 4 strided convs, global pooling."""

    def __init__(self, d: int):
        super().__init__()
        chans = [3, 16, 32, 64, 96]
        layers = []
        for cin, cout in zip(chans[:-1], chans[1:]):
            layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.GroupNorm(8, cout), nn.SiLU()]
        self.net = nn.Sequential(*layers)
        self.proj = nn.Linear(chans[-1], d)

    def forward(self, x):
        x = self.net(x)
        return self.proj(x.mean(dim=(2, 3)))


class Policy(nn.Module):
    def __init__(self, num_cameras: int, state_dim: int, action_dim: int, chunk: int, d: int = 128,
                 task_buckets: int = 1024, layers: int = 2, heads: int = 4):
        super().__init__()
        self.chunk, self.action_dim = chunk, action_dim
        self.image = ImageEncoder(d)
        self.camera_embed = nn.Parameter(torch.zeros(num_cameras, d))
        self.state = nn.Sequential(nn.Linear(state_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.task_buckets = task_buckets
        self.task = nn.Embedding(task_buckets, d)
        self.queries = nn.Parameter(torch.randn(chunk, d) * 0.02)
        self.kind = nn.Parameter(torch.zeros(3, d))  # task, state, image token types
        block = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.transformer = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, action_dim))

    def task_ids(self, tasks: list[str], device) -> torch.Tensor:
        ids = [zlib.crc32(t.encode("utf-8")) % self.task_buckets for t in tasks]
        return torch.tensor(ids, dtype=torch.long, device=device)

    def forward(self, images: list[torch.Tensor], state: torch.Tensor, tasks: list[str]) -> torch.Tensor:
        B = state.shape[0]
        tokens = [self.task(self.task_ids(tasks, state.device)) + self.kind[0], self.state(state) + self.kind[1]]
        for c, img in enumerate(images):
            tokens.append(self.image(img) + self.camera_embed[c] + self.kind[2])
        x = torch.cat([torch.stack(tokens, dim=1), self.queries.expand(B, -1, -1)], dim=1)
        x = self.transformer(x)
        return self.head(x[:, -self.chunk:])  # [B, chunk, action_dim]


# ---------------------------------------------------------------------------
# data

def dataset_meta(root: str, loader_kind: str):
    """(fps, camera_keys, state_dim, action_dim, stats) from the dataset's metadata."""
    if loader_kind == "vlafeed":
        import vlafeed
        meta = vlafeed.LeRobotDataset(root).meta
        fps, cams, feats, stats = meta.fps, list(meta.camera_keys), meta.features, meta.stats
    else:
        sys.path.insert(0, str(REPO / "tests" / "python"))
        import lerobot_reference as R
        meta = R.ReferenceMeta(root)
        fps, cams, feats, stats = meta.fps, meta.camera_keys, meta.features, meta.stats
    state_dim = int(feats["observation.state"]["shape"][0])
    action_dim = int(feats["action"]["shape"][0])
    return float(fps), cams, state_dim, action_dim, stats


def make_loader(args, rank: int, world: int, deltas: dict):
    if args.loader == "vlafeed":
        import vlafeed  # quiets FFmpeg's info lines on import (vlafeed.set_log_level)
        return vlafeed.Loader(args.dataset, mode=args.mode, batch_size=args.batch_size, seed=args.seed, rank=rank,
                              world_size=world, delta_timestamps=deltas, image_format="uint8", drop_last=True)
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import lerobot_reference as R
    ds = R.ReferenceDataset(args.dataset, delta_timestamps=deltas, image_format="uint8")
    return R.ReferenceLoader(ds, batch_size=args.batch_size, seed=args.seed, rank=rank, world_size=world)


class Batches:
    """Endless batches: restarts the loader with the next epoch at its end."""

    def __init__(self, loader, epoch: int = 0, restored: bool = False):
        self.loader, self.epoch = loader, epoch
        if not restored:  # a restored loader state already holds its epoch and position
            self.loader.set_epoch(epoch)
        self.it = iter(loader)

    def next(self):
        for _ in range(2):
            try:
                return next(self.it)
            except StopIteration:
                self.epoch += 1
                self.loader.set_epoch(self.epoch)
                self.it = iter(self.loader)
        raise RuntimeError("the loader yields no batch for this rank (dataset smaller than one batch?)")


def stat(stats, key, name, dim, device):
    if stats and key in stats and name in stats[key]:
        return torch.as_tensor(stats[key][name], dtype=torch.float32, device=device).reshape(dim)
    return torch.zeros(dim, device=device) if name == "mean" else torch.ones(dim, device=device)


# ---------------------------------------------------------------------------
# checkpoints

def save_checkpoint(path: Path, model, opt, step, epoch, loader_states, args):
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "epoch": epoch,
                "loader_states": loader_states, "args": vars(args)}, tmp)
    os.replace(tmp, path)
    latest = path.parent / "latest.pt"
    tmp_link = path.parent / ".latest.tmp"
    if tmp_link.exists() or tmp_link.is_symlink():
        tmp_link.unlink()
    os.symlink(path.name, tmp_link)
    os.replace(tmp_link, latest)


def gather(obj, world):
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


# ---------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dataset", required=True, help="LeRobot dataset root (v3.0 or v2.1)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in total (a resumed run continues to it)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per step per process")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--checkpoint-dir", default="checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (0: only at the end)")
    p.add_argument("--resume", default=None, help="checkpoint to resume from, or 'auto' for <checkpoint-dir>/latest.pt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    p.add_argument("--chunk", type=int, default=10, help="action chunk length (steps of 1/fps)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (0: cores / processes)")
    p.add_argument("--loader", choices=["vlafeed", "reference"], default="vlafeed",
                   help="vlafeed.Loader, or the pure-Python reference (slow baseline)")
    p.add_argument("--log-every", type=int, default=10, help="steps between progress-bar updates")
    p.add_argument("--mode", choices=["stream", "pool"], default="stream", help="vlafeed sampling mode")
    p.add_argument("--log-indices", default=None, help="write each step's sample indices to PREFIX.rank<r>.jsonl")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    want_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if distributed:
        dist.init_process_group("nccl" if want_cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    else:
        rank, world, local_rank = 0, 1, 0
    if want_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    is_main = rank == 0

    fps, cams, state_dim, action_dim, stats = dataset_meta(args.dataset, args.loader)
    deltas = {"action": [i / fps for i in range(args.chunk)]}
    model = Policy(len(cams), state_dim, action_dim, args.chunk).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    s_mean, s_std = stat(stats, "observation.state", "mean", state_dim, device), stat(
        stats, "observation.state", "std", state_dim, device)
    a_mean, a_std = stat(stats, "action", "mean", action_dim, device), stat(stats, "action", "std", action_dim, device)
    s_std, a_std = s_std.clamp_min(1e-3), a_std.clamp_min(1e-3)

    loader = make_loader(args, rank, world, deltas)
    step, epoch, restored = 0, 0, False
    ckdir = Path(args.checkpoint_dir)
    if args.resume:
        path = ckdir / "latest.pt" if args.resume == "auto" else Path(args.resume)
        ck = torch.load(path, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        step, epoch = int(ck["step"]), int(ck["epoch"])
        states = ck.get("loader_states") or []
        if states and hasattr(loader, "load_state_dict"):
            loader.load_state_dict(states[rank] if len(states) == world else states[0])
            restored = True
            resumed = "loader state restored"
        else:
            resumed = "no loader state: the epoch restarts"
        if is_main:
            print(f"resumed from {path} at step {step} (epoch {epoch}; {resumed})", flush=True)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if want_cuda else None) \
        if distributed else model
    batches = Batches(loader, epoch, restored)

    if is_main:
        print(f"training: {world} process(es) on {device}, batch {args.batch_size}/process, "
              f"{len(cams)} camera(s), action chunk {args.chunk}, loader={args.loader}, torch threads {threads}",
              flush=True)
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety
        tqdm = None
    bar = tqdm(total=args.steps, initial=step, disable=not is_main or tqdm is None, unit="step",
               dynamic_ncols=True, mininterval=0.5) if tqdm else None

    index_log = open(f"{args.log_indices}.rank{rank}.jsonl", "a") if args.log_indices else None
    losses: list[float] = []
    wait_total = step_total = 0.0
    win_wait = win_total = 0.0
    win_samples = 0
    samples = 0
    ckdir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    while step < args.steps:
        t0 = time.perf_counter()
        batch = batches.next()
        t1 = time.perf_counter()
        images = [batch[k].to(device, non_blocking=True).float().div_(255) for k in cams]
        state = (batch["observation.state"].to(device).float() - s_mean) / s_std
        target = (batch["action"].to(device).float() - a_mean) / a_std
        valid = ~batch["action_is_pad"].to(device)
        pred = ddp(images, state, batch["task"])
        if index_log:
            index_log.write(json.dumps({"step": step + 1, "epoch": batches.epoch,
                                        "index": batch["index"].tolist()}) + "\n")
            index_log.flush()
        del batch  # vlafeed tensors view engine buffers: hand this one back before the next wait
        err = F.l1_loss(pred, target, reduction="none").mean(dim=-1)
        loss = (err * valid).sum() / valid.sum().clamp_min(1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        lv = float(loss.detach())  # syncs the device: step time is real
        t2 = time.perf_counter()
        losses.append(lv)
        n = int(state.shape[0]) * world
        samples += n
        wait_total += t1 - t0
        step_total += t2 - t0
        win_wait += t1 - t0
        win_total += t2 - t0
        win_samples += n
        if bar is not None and (step % args.log_every == 0 or step == args.steps):
            recent = losses[-args.log_every:]
            bar.set_postfix(loss=f"{sum(recent) / len(recent):.4f}", samples_s=f"{win_samples / win_total:.1f}",
                            data_wait=f"{100 * win_wait / win_total:.0f}%", refresh=False)
            bar.update(step - bar.n)
            win_wait = win_total = 0.0
            win_samples = 0
        if args.checkpoint_every and (step % args.checkpoint_every == 0 or step == args.steps):
            states = gather(loader.state_dict() if hasattr(loader, "state_dict") else None, world)
            if is_main:
                save_checkpoint(ckdir / f"step_{step:06d}.pt", model, opt, step, batches.epoch,
                                [s for s in states] if any(s is not None for s in states) else None, args)
    elapsed = time.perf_counter() - t_start
    if index_log:
        index_log.close()
    if bar is not None:
        bar.close()

    k = max(1, min(10, len(losses) // 4))
    # average the loss over ranks for the summary
    first = sum(losses[:k]) / k if losses else math.nan
    last = sum(losses[-k:]) / k if losses else math.nan
    if distributed:
        t = torch.tensor([first, last, wait_total, step_total], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        first, last, wait_sum, total_sum = (t / world).tolist()
    else:
        wait_sum, total_sum = wait_total, step_total
    loader_stats = loader.stats() if hasattr(loader, "stats") else {}
    summary = {"steps": step, "processes": world, "device": str(device), "batch_size": args.batch_size,
               "samples": samples, "seconds": elapsed, "samples_per_s": samples / elapsed if elapsed else 0.0,
               "data_wait_fraction": wait_sum / total_sum if total_sum else 0.0, "first_loss": first,
               "last_loss": last, "loader": args.loader, "loader_stats": _jsonable(loader_stats)}
    if is_main:
        print(f"loss {first:.4f} -> {last:.4f} ({'fell' if last < first else 'did NOT fall'}); "
              f"{summary['samples_per_s']:.1f} samples/s over {world} process(es); "
              f"{100 * summary['data_wait_fraction']:.1f}% of step time waiting for data", flush=True)
        (ckdir / "summary.json").write_text(json.dumps(summary, indent=2))
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return summary


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return str(x)


if __name__ == "__main__":
    main()
