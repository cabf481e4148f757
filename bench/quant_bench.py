#!/usr/bin/env python3
"""FP8 post-training quantization: accuracy of block-wise (128x128) vs per-tensor vs per-channel FP8
against the original, and the quantizer's peak memory.

    python3 bench/quant_bench.py --checkpoint CK.pt --heldout DIR      # the example policy
    python3 bench/quant_bench.py --qwen2 --work /tmp/qb                # tiny Qwen2 folders through `--eval`
    python3 bench/quant_bench.py --rss --work /tmp/qb                  # peak RSS of folder vs single-file mode
    (any combination; --out FILE writes every row as JSON)

Sections:
  policy  examples/train_policy.py's Policy with trained weights from CK.pt. Every variant's weights are
          dequantized and the model runs in fp32 (the error the stored weights carry). Task loss = the
          training L1 action loss over --batches held-out batches of a `vlafeed make-sample` dataset;
          output error ||y - y_orig|| / ||y_orig|| and max |y - y_orig| against the model as trained.
          The vision encoder (`image.*`) and the task embedding stay in high precision, as
          `vlafeed quantize --skip task` leaves them.
  qwen2   two tiny Qwen2 models saved as Hugging Face folders (bf16): one with random weights, one trained
          here for --qwen2-steps steps on the bytes of the repository's docs (byte-level, vocabulary 256).
          Each is quantized by the command itself, `python -m vlafeed.quant DIR OUT --eval-tokens
          HELDOUT.npy`, with the default skips (lm_head kept bf16) and with --no-default-skip (lm_head
          quantized); the rows are the eval.json the command writes. Held-out tokens: docs bytes the
          trained model never saw.
  rss     a random Qwen2 of 48 layers x 512 wide (~336 MB in bf16, saved as 100 MB shards) quantized in
          folder mode (--max-shard-size 100MB) and, merged into one .safetensors file, in single-file mode;
          each in a fresh process whose peak RSS (ru_maxrss) is reported, next to the RSS of a process that
          only imports torch, safetensors and vlafeed.quant.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
import _inplace  # noqa: E402  (bench/_inplace.py: the in-place build if there is one, else the installed package)
_inplace.use()
sys.path.insert(0, str(REPO / "examples"))

from vlafeed import quant as Q  # noqa: E402

VARIANTS = [("bf16", None), ("fp8 block 128x128", 128), ("fp8 per-channel", "channel"), ("fp8 per-tensor", "tensor")]


def nbytes(sd):
    return sum(t.numel() * t.element_size() for t in sd.values())


def variant_models(make_model, sd, linear_keys, skip):
    """{name: (model, bytes, summary)}: bf16 = every floating tensor rounded to bf16; the FP8 variants'
    quantized layers are FP8BlockLinear (dequantized for the fp32 forward), the rest stored in bf16."""
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


# ---------------------------------------------------------------------------------------------- policy

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

    y0, loss0 = run(ref.eval())
    rows = [{"model": "policy", "variant": "original (fp32, as trained)", "bytes": nbytes(sd), "loss": loss0,
             "rel_output_error": 0.0, "max_abs_output_diff": 0.0}]
    models = variant_models(make, sd, keys, skip=[])  # the task table is an nn.Embedding: not in `keys`
    for name, (m, size, summary) in models.items():
        y, loss = run(m)
        rows.append({"model": "policy", "variant": name, "bytes": size, "loss": loss,
                     "rel_output_error": float((y - y0).norm() / y0.norm()),
                     "max_abs_output_diff": float((y - y0).abs().max()), **weight_err(summary)})
    bf = next(r["bytes"] for r in rows if r["variant"] == "bf16")
    for r in rows:
        r["size_vs_bf16"] = r["bytes"] / bf
        r["loss_delta"] = r["loss"] - loss0
    s = models["fp8 block 128x128"][2]
    return rows, {"held_out_batches": len(batches), "batch_size": args.batch_size,
                  "quantized_layers": s["layers_quantized"], "skipped": sorted(s["skipped"])}


def weight_err(summary):
    if not summary:
        return {}
    return {"weight_block_rel_err_max": summary["max_rel_error"],
            "weight_block_rel_err_mean": summary["mean_rel_error"]}


def policy_table(rows):
    lines = ["| variant | MB | size vs bf16 | task loss (L1) | loss delta | output rel. error | max abs output diff |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['bytes'] / 2**20:.2f} | {r['size_vs_bf16']:.3f} | {r['loss']:.4f} | "
                     f"{r['loss_delta']:+.4f} | {r['rel_output_error']:.5f} | {r['max_abs_output_diff']:.4f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- qwen2

def docs_bytes():
    files = sorted((REPO / "docs").glob("*.md")) + sorted((REPO / "bench").glob("*.md"))
    return b"\n".join(f.read_bytes() for f in files)


def qwen2_config(layers=4):
    import transformers
    return transformers.Qwen2Config(vocab_size=256, hidden_size=256, intermediate_size=768, num_hidden_layers=layers,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                    tie_word_embeddings=False)


def train_qwen2(out_dir: Path, data: torch.Tensor, steps: int, seq: int = 128, batch: int = 8):
    import transformers
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(qwen2_config())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(0)
    losses = []
    model.train()
    for step in range(steps):
        idx = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[i:i + seq] for i in idx.tolist()])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.to(torch.bfloat16).save_pretrained(str(out_dir))
    tail = losses[-10:]
    return {"steps": steps, "seq": seq, "batch": batch, "first_loss": losses[0], "last_loss": sum(tail) / len(tail)}


def run_quantize(src, out, extra, env=None):
    cmd = [sys.executable, "-m", "vlafeed.quant", str(src), str(out), "--overwrite", "-q", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_inplace.child_env(env))
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads((Path(out) / "eval.json").read_text()) if (Path(out) / "eval.json").exists() else None


def bench_qwen2(args):
    import numpy as np
    import transformers
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = torch.tensor(list(docs_bytes()), dtype=torch.long)
    split = int(len(data) * 0.9)
    heldout = data[split:split + args.qwen2_eval_tokens]
    np.save(work / "heldout.npy", heldout.numpy())
    rows, info = [], {"train_bytes": split, "heldout_tokens": len(heldout)}
    torch.manual_seed(0)
    rand_dir = work / "qwen2-random"
    transformers.Qwen2ForCausalLM(qwen2_config()).to(torch.bfloat16).save_pretrained(str(rand_dir))
    trained_dir = work / "qwen2-trained"
    t0 = time.perf_counter()
    info["training"] = train_qwen2(trained_dir, data[:split], args.qwen2_steps)
    info["training"]["seconds"] = time.perf_counter() - t0
    for model, d in (("tiny Qwen2 (random init)", rand_dir), ("tiny Qwen2 (trained on docs bytes)", trained_dir)):
        for setting, extra in (("default skips (lm_head bf16)", []), ("--no-default-skip (lm_head FP8)",
                                                                       ["--no-default-skip"])):
            out = work / (d.name + ("-fp8" if not extra else "-fp8-all"))
            rep = run_quantize(d, out, ["--eval-tokens", str(work / "heldout.npy"), "--eval-seq-len", "256",
                                        *extra])
            summ = json.loads((out / "vlafeed_quant.json").read_text())
            for r in rep["variants"]:
                rows.append({"model": model, "setting": setting, "layers_quantized": rep["layers_quantized"],
                             "size_vs_bf16": summ["size_ratio_vs_bf16"] if r["variant"] != "original" else 1.0, **r})
    return rows, info


def qwen2_table(rows):
    lines = ["| model | layers in FP8 | variant | loss | loss delta | rel. logit error | max abs logit diff | "
             "top-1 agreement |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['setting']} | {r['variant']} | {r['loss']:.4f} | {r['loss_delta']:+.4f} | "
                     f"{r['rel_logit_error']:.5f} | {r['max_abs_logit_diff']:.4f} | {100 * r['top1_agreement']:.1f}% |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- rss

# VmHWM (this process image's peak RSS), not ru_maxrss: Linux carries ru_maxrss over from the parent
# across fork + exec, so a child of a large parent would report the parent's peak.
CHILD = """
import runpy, sys
sys.argv = ["vlafeed.quant"] + sys.argv[1:]
code = 0
if len(sys.argv) > 1:
    try:
        runpy.run_module("vlafeed.quant", run_name="__main__")
    except SystemExit as e:
        code = e.code or 0
else:
    import torch, safetensors, vlafeed.quant, vlafeed.quant.hf  # noqa
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0].split()
print("MAXRSS", int(hwm[1]) * 1024, code)
"""


def child_rss(argv):
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CHILD, *map(str, argv)], capture_output=True, text=True,
                       env=_inplace.child_env())
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("MAXRSS")]
    if not line or line[0].split()[2] != "0":
        raise SystemExit(f"child {argv} failed:\n{r.stdout}\n{r.stderr}")
    return int(line[0].split()[1]), time.perf_counter() - t0


def bench_rss(args):
    import transformers
    from safetensors.torch import load_file, save_file
    work = Path(args.work)
    src = work / "qwen2-48x512"
    if not (src / "config.json").exists():
        torch.manual_seed(0)
        cfg = transformers.Qwen2Config(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=48,
                                       num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512,
                                       tie_word_embeddings=False)
        transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(src), max_shard_size="100MB")
    shards = sorted(src.glob("model-*.safetensors"))
    ck_bytes = sum(f.stat().st_size for f in shards)
    single = work / "qwen2-48x512.safetensors"
    if not single.exists():
        sd = {}
        for f in shards:
            sd.update(load_file(str(f)))
        save_file(sd, str(single), metadata={"format": "pt"})
        del sd
    base, _ = child_rss([])
    folder, t_folder = child_rss([src, work / "qwen2-48x512-fp8", "--max-shard-size", "100MB", "--overwrite", "-q"])
    one, t_one = child_rss([single, work / "qwen2-48x512-fp8.safetensors", "-q"])
    rows = [{"mode": "imports only (torch, safetensors, vlafeed.quant)", "peak_rss": base},
            {"mode": "folder mode, 4 input shards of 100 MB -> 100 MB shards", "peak_rss": folder, "seconds": t_folder},
            {"mode": "single-file mode, one 336 MB .safetensors", "peak_rss": one, "seconds": t_one}]
    for r in rows:
        r["above_imports"] = r["peak_rss"] - base
        r["above_imports_vs_checkpoint"] = r["above_imports"] / ck_bytes
    return rows, {"checkpoint_bytes": ck_bytes, "input_shards": len(shards)}


def rss_table(rows, info):
    lines = [f"checkpoint: {info['checkpoint_bytes'] / 1e6:.0f} MB in {info['input_shards']} shards", "",
             "| run | peak RSS (MB) | above imports (MB) | above imports / checkpoint |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['peak_rss'] / 1e6:.0f} | {r['above_imports'] / 1e6:.0f} | "
                     f"{r['above_imports_vs_checkpoint']:.2f} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="a checkpoint written by examples/train_policy.py (policy section)")
    p.add_argument("--heldout", help="a held-out `vlafeed make-sample` dataset (policy section)")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--qwen2", action="store_true", help="run the tiny Qwen2 section")
    p.add_argument("--qwen2-steps", type=int, default=200)
    p.add_argument("--qwen2-eval-tokens", type=int, default=2048)
    p.add_argument("--rss", action="store_true", help="run the peak-memory section")
    p.add_argument("--work", default="/tmp/vlafeed-quant-bench", help="folder for the models the bench builds")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    result = {"info": {"torch": torch.__version__}}
    if args.checkpoint:
        if not args.heldout:
            p.error("--checkpoint needs --heldout")
        rows, info = bench_policy(args)
        result["policy"], result["info"]["policy"] = rows, info
        print(policy_table(rows))
    if args.qwen2:
        import transformers
        rows, info = bench_qwen2(args)
        info["transformers"] = transformers.__version__
        result["qwen2"], result["info"]["qwen2"] = rows, info
        print(qwen2_table(rows))
    if args.rss:
        rows, info = bench_rss(args)
        result["rss"], result["info"]["rss"] = rows, info
        print(rss_table(rows, info))
    result["info"]["seconds"] = time.perf_counter() - t0
    print(json.dumps(result["info"]))
    if args.out:
        old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        sections = ("policy", "qwen2", "rss")
        old = {k: v for k, v in old.items() if k in sections + ("info",)}
        info = {k: v for k, v in old.get("info", {}).items() if k in sections}
        info.update(result["info"])
        Path(args.out).write_text(json.dumps({**old, **result, "info": info}, indent=2) + "\n")


if __name__ == "__main__":
    main()
