#!/usr/bin/env python3
"""vlafeed.train measurements, as ratios within one run (absolute numbers only mean something on the machine
they were taken on):

1. tokens/s of the example policy (forward + backward + AdamW step) on packed vs padded batches at padding
   rates 10..90% (synthetic batches whose lengths give that padding rate when padded to the longest sample;
   packed rows of that longest length, by the C packer).
2. FSDP2 vs DDP at 2 ranks (torchrun, gloo, CPU; NCCL on GPU): model-state bytes per rank (parameters,
   gradients and AdamW state this rank holds) and peak RSS, on a larger example policy, trained by
   `python -m vlafeed.train` on a `vlafeed make-sample` dataset.
3. Checkpoint save and load time and bytes (DCP, both runs), and the data-wait fraction of step time.

    python3 bench/train_bench.py [--cli build/vlafeed] [--out bench/train-results.md]

GPU parts (NCCL, flash_attn_varlen_func) run only where CUDA is available and are otherwise skipped with the
reason printed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import _inplace  # noqa: E402  (bench/_inplace.py: the in-place build if there is one, else the installed package)
_inplace.use()

import torch  # noqa: E402

from vlafeed.train.packing import SampleTokens, packed_layout, padded_layout  # noqa: E402
from vlafeed.train.policy import VLAPolicy, per_sample_loss, resolve_attention  # noqa: E402


def lengths_for(padding: float, batch: int, longest: int, fixed: int):
    """Lengths whose padded batch (to `longest`) has about this padding fraction: one sample of `longest`,
    the others spread around the length that gives the target mean."""
    mean = (1 - padding) * longest
    others = (mean * batch - longest) / (batch - 1)
    out = [longest]
    for i in range(1, batch):
        jitter = ((i * 37) % 11 - 5) / 5 * 0.15 * others  # +-15%, deterministic
        out.append(int(min(longest, max(fixed + 1, round(others + jitter)))))
    return out


def packing_bench(device, steps, batch=16, longest=128, d_model=64, layers=2, row_factor=1, clock=time.perf_counter):
    """Per padding rate: median step time of the padded and the packed batch, timed alternately (one padded
    step, one packed step, ...) so that load from other processes hits both alike."""
    import statistics
    attention = resolve_attention("auto", device)
    fixed = 4 + 1 + 4  # 1 camera of 4 patch tokens, 1 state token, 4 action queries (+ BOS in the text)
    rows = []
    for padding in (0.1, 0.3, 0.5, 0.7, 0.9):
        lengths = lengths_for(padding, batch, longest, fixed)
        samples = [SampleTokens([256] + [65] * (n - fixed - 1), [True], n) for n in lengths]
        runs = {}
        for mode in ("padded", "packed"):
            torch.manual_seed(0)
            model = VLAPolicy(num_cameras=1, image_hw=(32, 32), state_dim=6, action_dim=6, chunk=4, d_model=d_model,
                              layers=layers, heads=4, patch=16, max_positions=longest,
                              attention=attention).to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            layout = (padded_layout(lengths, device) if mode == "padded"
                      else packed_layout(lengths, row_factor * longest, 0, device))
            runs[mode] = (model, opt, layout, [])
        images = [torch.rand(batch, 3, 32, 32, device=device)]
        state = torch.randn(batch, 6, device=device)
        target, valid = torch.randn(batch, 4, 6, device=device), torch.ones(batch, 4, device=device)

        def step(model, opt, layout):
            loss = per_sample_loss(model(images, state, samples, layout), target, valid).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for model, opt, layout, _ in runs.values():
            step(model, opt, layout)  # warm-up
        for _ in range(steps):
            for model, opt, layout, times in runs.values():
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = clock()
                step(model, opt, layout)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(clock() - t0)
        res = {}
        for mode, (model, opt, layout, times) in runs.items():
            res[mode] = (layout.real_tokens / statistics.median(times), 1 - layout.real_tokens / layout.slots,
                         layout.rows)
        rows.append((padding, res))
    return attention, rows


def make_dataset(cli, root):
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "8", "--cameras", "2", "--codec", "h264",
                        "--size", "96x96", "--min-length", "40", "--max-length", "60", "--seed", "3", "--quiet"],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"make-sample failed: {r.stderr}")


def torchrun(args, env):
    cmd = [shutil.which("torchrun"), "--standalone", "--nproc_per_node=2", "-m", "vlafeed.train"] + args
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r


def dist_bench(cli, work, steps):
    ds = work / "ds"
    make_dataset(cli, ds)
    env = _inplace.child_env(OMP_NUM_THREADS="1")
    common = ["--data.dataset", str(ds), "--data.batch_size", "8", "--model.d_model", "256", "--model.layers", "4",
              "--model.heads", "8", "--model.patch", "16", "--packing.enabled", "true", "--packing.max_tokens", "256",
              "--train.steps", str(steps), "--train.log_every", "1000", "--train.precision", "fp32"]
    out = {}
    for kind in ("fsdp", "ddp"):
        ck = work / f"ck-{kind}"
        base = common + ["--parallel.fsdp", "true" if kind == "fsdp" else "false", "--checkpoint.dir", str(ck)]
        torchrun(base, env)
        first = json.loads((ck / "summary.json").read_text())
        # resume from the checkpoint just written, for the load time (one more step)
        torchrun(base + ["--checkpoint.resume", "auto", "--train.steps", str(steps + 1)], env)
        second = json.loads((ck / "summary.json").read_text())
        step_dir = ck / f"step_{steps:08d}"
        size = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())
        out[kind] = {"state_bytes": first["model_state_bytes_rank0"], "peak_rss_mb": first["peak_rss_mb"],
                     "save_s": first["checkpoint_save_seconds"][-1], "load_s": second["checkpoint_load_seconds"],
                     "ckpt_bytes": size, "data_wait": first["data_wait_fraction"],
                     "tokens_per_s": first["tokens_per_s"], "padding": first["padding_fraction"]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=str(ROOT / "build" / "vlafeed"))
    ap.add_argument("--steps", type=int, default=9, help="timed steps per packing measurement")
    ap.add_argument("--train-steps", type=int, default=20, help="steps of each FSDP2 / DDP run")
    ap.add_argument("--out", default=None, help="also write the markdown tables here")
    ap.add_argument("--skip-dist", action="store_true")
    ap.add_argument("--row-factor", type=int, default=1,
                    help="packed rows of up to this many times the longest sample (1: vlafeed.train's default, "
                         "packing.max_tokens 0)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time steps by wall clock or by this process's CPU time (steadier on a shared machine; "
                         "CPU only, with --threads 1)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the packing part (1: steady on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lines = [f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
             f"torch {torch.__version__}, {os.cpu_count()} cores", ""]
    if device.type != "cuda":
        print("GPU parts skipped: no CUDA device (NCCL and flash_attn_varlen_func are measured only on a GPU)")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    attention, rows = packing_bench(device, args.steps, row_factor=args.row_factor, clock=clock)
    lines += [f"### Packed vs padded (example policy, d_model 64, 2 blocks, batch 16, longest sample 128 tokens, packed "
              f"rows of up to {128 * args.row_factor} tokens, attention {attention}, median of {args.steps} "
              f"alternating steps each, {args.clock} clock)", "",
              "| padding rate (padded) | padded tokens/s | packed tokens/s | rows (padded: 16) | packed padding | "
              "speed-up |", "|---|---|---|---|---|---|"]
    for padding, res in rows:
        (pt, pp, pr), (kt, kp, kr) = res["padded"], res["packed"]
        lines.append(f"| {100 * pp:.0f}% | {pt:,.0f} | {kt:,.0f} | {kr} | {100 * kp:.0f}% | {kt / pt:.2f}x |")
        print(lines[-1], flush=True)
    if not args.skip_dist:
        with tempfile.TemporaryDirectory() as tmp:
            d = dist_bench(args.cli, Path(tmp), args.train_steps)
        f, p = d["fsdp"], d["ddp"]
        lines += ["", "### FSDP2 vs DDP, 2 ranks (gloo, CPU; example policy d_model 256, 4 blocks, fp32, AdamW, "
                  f"packed, {args.train_steps} steps)", "",
                  "| | FSDP2 | DDP | FSDP2 / DDP |", "|---|---|---|---|",
                  f"| model state per rank (params + grads + AdamW) | {f['state_bytes'] / 2**20:.2f} MiB | "
                  f"{p['state_bytes'] / 2**20:.2f} MiB | {f['state_bytes'] / p['state_bytes']:.2f} |",
                  f"| peak RSS, rank 0 | {f['peak_rss_mb']:.0f} MB | {p['peak_rss_mb']:.0f} MB | "
                  f"{f['peak_rss_mb'] / p['peak_rss_mb']:.2f} |",
                  f"| checkpoint bytes (DCP dir) | {f['ckpt_bytes'] / 2**20:.2f} MiB | {p['ckpt_bytes'] / 2**20:.2f} MiB"
                  f" | {f['ckpt_bytes'] / p['ckpt_bytes']:.2f} |",
                  f"| checkpoint save | {f['save_s']:.2f} s | {p['save_s']:.2f} s | {f['save_s'] / p['save_s']:.2f} |",
                  f"| checkpoint load (resume) | {f['load_s']:.2f} s | {p['load_s']:.2f} s | "
                  f"{f['load_s'] / p['load_s']:.2f} |",
                  f"| tokens/s (2 ranks) | {f['tokens_per_s']:,.0f} | {p['tokens_per_s']:,.0f} | "
                  f"{f['tokens_per_s'] / p['tokens_per_s']:.2f} |",
                  f"| data-wait fraction of step time | {100 * f['data_wait']:.1f}% | {100 * p['data_wait']:.1f}% | |"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
