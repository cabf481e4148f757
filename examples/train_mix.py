#!/usr/bin/env python3
"""Train a small policy from a weighted mix of WebDataset shards and a LeRobot
dataset, sample by sample (vlafeed.Mix over vlafeed.ShardLoader and
vlafeed.Loader), and show that the mix resumes exactly.

The shards are the ones `vlafeed convert DATASET OUT --to wds --past 0
--future 0 --image-offsets 0` writes; both sources then describe the same
frames, and each source's batch is mapped onto one column set:

    observation.state  float32 [D]        (the shard's window [1, D] squeezed)
    action             float32 [D]
    image              float32 [3, H, W]  (first camera, in [0, 1])

Usage:
    python3 examples/train_mix.py --shards OUT/shards/manifest.jsonl --dataset DATASET \\
        [--weights 0.7,0.3] [--steps 30] [--batch-size 16] [--seed 0] [--json]

Prints the loss every few steps, the realised proportions next to the
requested weights, and checks that a Mix restored from a state_dict taken
mid-run yields the same samples as the uninterrupted one.
"""
import argparse
import json
import sys

import torch

import vlafeed


def shard_columns(camera):
    def f(b):
        img = b[f"{camera}_t0"]  # uint8 [B, H, W, 3]
        return {
            "observation.state": b["observation.state"][:, 0].float(),
            "action": b["action"][:, 0].float(),
            "image": img.permute(0, 3, 1, 2).float().div_(255.0),
        }
    return f


def lerobot_columns(camera):
    def f(b):
        return {
            "observation.state": b["observation.state"].float(),
            "action": b["action"].float(),
            "image": b[f"observation.images.{camera}"],
        }
    return f


class Policy(torch.nn.Module):
    def __init__(self, state_dim, action_dim):
        super().__init__()
        self.conv = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 5, stride=4), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Sequential(torch.nn.Linear(16 + state_dim, 64), torch.nn.ReLU(),
                                        torch.nn.Linear(64, action_dim))

    def forward(self, image, state):
        return self.head(torch.cat([self.conv(image), state], dim=1))


def make_mix(args, camera):
    shards = vlafeed.ShardLoader(args.shards, batch_size=args.batch_size, seed=args.seed, rank=0, world_size=1)
    lerobot = vlafeed.Loader(args.dataset, batch_size=args.batch_size, seed=args.seed, rank=0, world_size=1)
    return vlafeed.Mix([shards, lerobot], weights=args.weights, batch_size=args.batch_size, seed=args.seed,
                       window=args.window,
                       transforms=[shard_columns(camera), lerobot_columns(camera)])


def batches(mix):
    while True:
        for b in mix:
            yield b


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", required=True, help="manifest.jsonl of the converted shards")
    p.add_argument("--dataset", required=True, help="the LeRobot dataset (the same one, or another with the same features)")
    p.add_argument("--weights", default="0.7,0.3", help="shards,lerobot (default 0.7,0.3)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=None,
                   help="mixing window in samples: each holds exactly its largest-remainder shares (default 10 batches)")
    p.add_argument("--camera", default=None, help="camera short name (default: the dataset's first camera)")
    p.add_argument("--json", action="store_true", help="print one JSON summary line at the end")
    args = p.parse_args(argv)
    args.weights = [float(w) for w in args.weights.split(",")]
    if args.window is None:
        args.window = 10 * args.batch_size
    torch.manual_seed(args.seed)

    meta = vlafeed.LeRobotDatasetMetadata(args.dataset) if hasattr(vlafeed, "LeRobotDatasetMetadata") else None
    camera = args.camera
    if camera is None:
        keys = list(meta.video_keys) if meta is not None else []
        if not keys:
            sys.exit("train_mix: no camera in the dataset; pass --camera")
        camera = keys[0].removeprefix("observation.images.")

    mix = make_mix(args, camera)
    it = batches(mix)
    first = next(it)
    state_dim, action_dim = first["observation.state"].shape[1], first["action"].shape[1]
    policy = Policy(state_dim, action_dim)
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    losses = []
    batch = first
    for step in range(args.steps):
        pred = policy(batch["image"], batch["observation.state"])
        loss = torch.nn.functional.mse_loss(pred, batch["action"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % max(1, args.steps // 6) == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}  dataset_index share "
                  f"{batch['dataset_index'].float().mean().item():.2f} from the LeRobot dataset")
        batch = next(it)

    st = mix.stats()
    realised = {f"source {e['index']}": round(e["proportion"], 4) for e in st["sources"]}
    # Exact resume: a Mix restored from the state taken now yields what this one yields next.
    saved = mix.state_dict()
    ahead = [next(it) for _ in range(3)]
    again = make_mix(args, camera)
    again.load_state_dict(saved)
    it2 = batches(again)
    same = True
    for a in ahead:
        b = next(it2)
        same &= all(torch.equal(a[k], b[k]) for k in ("observation.state", "action", "image", "dataset_index"))
    summary = {"steps": args.steps, "loss_first": losses[0], "loss_last": losses[-1], "weights": args.weights,
               "realised": realised, "samples": st["samples"], "resume_exact": bool(same)}
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {args.steps} steps")
    print(f"realised proportions over {st['samples']} samples: shards {realised['source 0']:.4f}, "
          f"LeRobot {realised['source 1']:.4f} (asked {args.weights[0]}, {args.weights[1]}); each full window of "
          f"{args.window}: " + ", ".join(f"{e['last_window_samples']}" for e in st["sources"]))
    print(f"resume from a mid-run state_dict gives the same next 3 batches: {'yes' if same else 'NO'}")
    if args.json:
        print(json.dumps(summary))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
