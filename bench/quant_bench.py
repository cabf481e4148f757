#!/usr/bin/env python3
"""FP8 post-training quantization: block-wise (128x128) vs per-tensor vs per-channel, against bf16.

    python3 bench/quant_bench.py --checkpoint CK.pt --heldout DIR [--out bench/quant-results.json]

Two models:
  policy   examples/train_policy.py's Policy, trained weights from CK.pt (the vision encoder `image.*` kept
           in high precision, as `vlafeed quantize` does by default); task loss = the training L1 action
           loss on --batches held-out batches of a `vlafeed make-sample` dataset (--heldout), fixed seed.
  gpt2     a randomly initialised GPT-2-small-shaped decoder (12 layers, d=768, 12 heads, FFN 3072,
           vocab 50257, N(0, 0.02) init; built from torch.nn, no download), every Linear and the packed QKV
           quantized, embeddings not. No task loss (random weights); top-1 agreement with bf16 instead.

For each variant: bytes of the weights as written (bf16 for the unquantized tensors, as the recipe compares
against a bf16 model), size ratio to the bf16 model, output relative error ||y - y_bf16|| / ||y_bf16|| on a
fixed batch (weights dequantized, fp32 compute: the error the weights carry), task loss, and the max/mean
per-block relative weight error from vlafeed.quant's summary. Results print as a Markdown table and go to
--out as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
import _inplace  # noqa: E402  (bench/_inplace.py: the in-place build if there is one, else the installed package)
_inplace.use()
sys.path.insert(0, str(REPO / "examples"))

from vlafeed import quant as Q  # noqa: E402

VARIANTS = [("bf16", None), ("fp8 block 128x128", 128), ("fp8 per-channel", "channel"),
            ("fp8 per-tensor", "tensor")]


def nbytes(sd):
    return sum(t.numel() * t.element_size() for t in sd.values())


def variant_models(make_model, sd, linear_keys, skip):
    """{name: (model, bytes, summary)} with bf16 = every floating tensor rounded to bf16."""
    out = {}
    for name, block in VARIANTS:
        m = make_model()
        if block is None:
            bf = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}
            m.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in bf.items()})
            out[name] = (m.eval(), nbytes(bf), None)
            continue
        res = Q.quantize_state_dict(sd, block, skip=skip, linear_keys=linear_keys, rest_dtype=torch.bfloat16,
                                    source=name)
        tensors = res.tensors
        quantized = {k: tuple(v["block"]) for k, v in res.summary["quantized"].items()}
        m.load_state_dict({k: v.float() if v.is_floating_point() and v.dtype != Q.FP8_DTYPE else v
                           for k, v in tensors.items() if k in m.state_dict() and k not in quantized},
                          strict=False)
        Q.checkpoint._install(m, tensors, quantized, name)
        out[name] = (m.eval(), nbytes(tensors), res.summary)
    return out


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


# ---------------------------------------------------------------------------

def bench_policy(args):
    import vlafeed
    from train_policy import Policy, stat
    ck = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    sd = ck["model"]
    targs = ck.get("args", {})
    chunk = int(targs.get("chunk", 10))
    meta = vlafeed.LeRobotDataset(args.heldout).meta
    cams = list(meta.camera_keys)
    state_dim = int(meta.features["observation.state"]["shape"][0])
    action_dim = int(meta.features["action"]["shape"][0])

    def make():
        return Policy(len(cams), state_dim, action_dim, chunk)

    ref = make()
    ref.load_state_dict(sd)
    keys = Q.linear_weight_keys_of(ref)
    stats = meta.stats
    s_mean, s_std = stat(stats, "observation.state", "mean", state_dim, "cpu"), stat(
        stats, "observation.state", "std", state_dim, "cpu").clamp_min(1e-3)
    a_mean, a_std = stat(stats, "action", "mean", action_dim, "cpu"), stat(
        stats, "action", "std", action_dim, "cpu").clamp_min(1e-3)
    fps = float(meta.fps)
    loader = vlafeed.Loader(args.heldout, batch_size=args.batch_size, seed=123,
                            delta_timestamps={"action": [i / fps for i in range(chunk)]}, image_format="uint8",
                            drop_last=True)
    loader.set_epoch(0)
    batches = []
    for b in loader:
        batches.append(({k: b[k].float().div(255) for k in cams}, (b["observation.state"].float() - s_mean) / s_std,
                        list(b["task"]), (b["action"].float() - a_mean) / a_std, ~b["action_is_pad"]))
        if len(batches) == args.batches:
            break

    def run(model):
        losses, outs = [], []
        with torch.no_grad():
            for imgs, state, tasks, target, valid in batches:
                pred = model([imgs[k] for k in cams], state, tasks)
                outs.append(pred)
                err = F.l1_loss(pred, target, reduction="none").mean(dim=-1)
                losses.append(float((err * valid).sum() / valid.sum().clamp_min(1)))
        return torch.cat(outs), sum(losses) / len(losses)

    y32, loss32 = run(ref.eval())
    rows = [{"model": "policy", "variant": "fp32 (as trained)", "bytes": nbytes(sd), "output_rel_err_vs_bf16": None,
             "task_loss": loss32}]
    models = variant_models(make, sd, keys, skip=[])
    ybf = None
    for name, (m, size, summary) in models.items():
        y, loss = run(m)
        if ybf is None:
            ybf = y
            rows[0]["output_rel_err_vs_bf16"] = rel(y32, ybf)
        rows.append({"model": "policy", "variant": name, "bytes": size, "output_rel_err_vs_bf16": rel(y, ybf),
                     "task_loss": loss, **weight_err(summary)})
    bf = next(r["bytes"] for r in rows if r["variant"] == "bf16")
    for r in rows:
        r["size_vs_bf16"] = r["bytes"] / bf
    return rows, {"held_out_batches": len(batches), "batch_size": args.batch_size,
                  "quantized_layers": models["fp8 block 128x128"][2]["layers_quantized"],
                  "skipped": sorted(models["fp8 block 128x128"][2]["skipped"])}


def weight_err(summary):
    if not summary:
        return {}
    return {"weight_block_rel_err_max": summary["max_rel_error"], "weight_block_rel_err_mean": summary["mean_rel_error"]}


class GPT2Small(nn.Module):
    """GPT-2 small's shapes on torch.nn: pre-norm blocks, GELU MLP, causal attention, untied LM head."""

    def __init__(self, vocab=50257, ctx=1024, d=768, layers=12, heads=12, ffn=3072):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        block = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.h = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        mask = nn.Transformer.generate_square_subsequent_mask(T)
        return self.lm_head(self.ln_f(self.h(x, mask=mask, is_causal=True)))


def bench_gpt2(args):
    torch.manual_seed(0)
    ref = GPT2Small().eval()
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    keys = Q.linear_weight_keys_of(ref)
    idx = torch.randint(0, 50257, (args.gpt2_batch, args.gpt2_tokens), generator=torch.Generator().manual_seed(1))

    def run(m):
        with torch.no_grad():
            return m(idx)

    y32 = run(ref)
    rows = [{"model": "gpt2-small (random init)", "variant": "fp32", "bytes": nbytes(sd)}]
    models = variant_models(GPT2Small, sd, keys, skip=[])
    ybf = None
    for name, (m, size, summary) in models.items():
        y = run(m)
        if ybf is None:
            ybf = y
            rows[0]["output_rel_err_vs_bf16"] = rel(y32, ybf)
            rows[0]["top1_agree_bf16"] = float((y32.argmax(-1) == ybf.argmax(-1)).float().mean())
        rows.append({"model": "gpt2-small (random init)", "variant": name, "bytes": size,
                     "output_rel_err_vs_bf16": rel(y, ybf),
                     "top1_agree_bf16": float((y.argmax(-1) == ybf.argmax(-1)).float().mean()), **weight_err(summary)})
        del m
    bf = next(r["bytes"] for r in rows if r["variant"] == "bf16")
    for r in rows:
        r["size_vs_bf16"] = r["bytes"] / bf
    return rows, {"tokens": list(idx.shape), "quantized_layers": models["fp8 block 128x128"][2]["layers_quantized"]}


def table(rows):
    head = "| model | variant | MB | size vs bf16 | output rel. error vs bf16 | task loss / top-1 agree | " \
           "weight block rel. error max / mean |\n|---|---|---|---|---|---|---|"
    lines = [head]
    for r in rows:
        task = f"{r['task_loss']:.4f}" if "task_loss" in r else (
            f"top-1 {100 * r['top1_agree_bf16']:.1f}%" if "top1_agree_bf16" in r else "")
        werr = f"{r['weight_block_rel_err_max']:.4f} / {r['weight_block_rel_err_mean']:.4f}" \
            if "weight_block_rel_err_max" in r else ""
        e = r.get("output_rel_err_vs_bf16")
        lines.append(f"| {r['model']} | {r['variant']} | {r['bytes'] / 2**20:.2f} | {r['size_vs_bf16']:.3f} | "
                     f"{'' if e is None else f'{e:.5f}'} | {task} | {werr} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="a checkpoint written by examples/train_policy.py")
    p.add_argument("--heldout", required=True, help="a held-out `vlafeed make-sample` dataset")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--gpt2-batch", type=int, default=2)
    p.add_argument("--gpt2-tokens", type=int, default=128)
    p.add_argument("--skip-gpt2", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    rows, info = bench_policy(args)
    info = {"policy": info}
    if not args.skip_gpt2:
        r2, i2 = bench_gpt2(args)
        rows += r2
        info["gpt2"] = i2
    info["seconds"] = time.perf_counter() - t0
    info["torch"] = torch.__version__
    print(table(rows))
    print(json.dumps(info))
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "info": info}, indent=2) + "\n")


if __name__ == "__main__":
    main()
