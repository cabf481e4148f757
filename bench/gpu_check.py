#!/usr/bin/env python3
"""bench/gpu_check.py: the steps of scripts/gpu-check.sh (docs/gpus.md "The GPU check").

    python3 bench/gpu_check.py [--dry-run] [--out DIR] [--work DIR] [--steps a,b] [--batch-sizes 8,16,32,64]

Each step is one function ``step_<name>(ctx) -> dict`` returning {"status": "ok" | "failed" |
"skipped", "reason": text or None, "figures": {...}, "notes": [...]}:

- ``loader_cuda``: vlafeed.Loader to cuda:0 on make-sample datasets (H.264 and AV1), batch sizes
  8-64, under a real training step of the example policy (examples/train_policy.py's Policy;
  LeRobot's ACT too when lerobot imports): samples/s and the data-wait fraction (the loader's
  stats() and the step loop's own clock). Uses ``Loader(device=...)`` when the keyword exists,
  else ``.to(device, non_blocking=True)`` per tensor, and says which.
- ``nvdec``: ``Loader(decode_device="cuda")`` against ``"cpu"``: frames/s and frame equality
  (skipped with the reason when the keyword does not exist).
- ``train``: one-GPU vlafeed.train runs (torchrun, 1 process): FSDP2 and DDP with amp_bfloat16
  on packed batches, SDPA and (when flash_attn imports) flash-attn varlen.
- ``fp8``: vlafeed.quant.gpu_self_check() at a few shapes: FP8 blockwise GEMM against bf16
  (error and time).
- ``rl``: a short vlafeed.rl run; the policy server on the GPU when RLConfig has a device field; then
  a hybrid-placement run (server and learner actor sharing the GPU, 0.5 each) when RLConfig has placement.

On a machine with CUDA every step runs in its own child process with its own time limit (a hang or
a crash fails that step only; the next one runs). Without CUDA, or with --dry-run, the datasets are
made at tiny sizes, every step reports "skipped: no CUDA device (torch.cuda.is_available() is
False)" and the summary is written all the same. The summary: DIR/summary.json and
DIR/summary.md, DIR defaulting to bench/gpu/<date>-<device name slug>/.
"""
import argparse
import datetime
import inspect
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import _inplace  # noqa: E402

_inplace.use()

NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"
STEPS = ("loader_cuda", "nvdec", "train", "fp8", "rl")
# Seconds each step may run on a GPU machine; the whole check stays under 8 minutes with the build.
LIMITS = {"loader_cuda": 100, "nvdec": 50, "train": 120, "fp8": 40, "rl": 60}
SIZES = {  # make-sample datasets: (episodes, WxH, min length, max length)
    "full": (8, "320x240", 60, 100),
    "tiny": (2, "64x64", 8, 12),
}


def result(status, reason=None, figures=None, notes=None):
    return {"status": status, "reason": reason, "figures": figures or {}, "notes": notes or []}


def skipped(reason):
    return result("skipped", reason)


def cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def cli_path():
    for c in (os.environ.get("VF_CLI"), str(REPO / "build" / "vlafeed"), shutil.which("vlafeed")):
        if c and os.path.exists(c):
            return c
    raise FileNotFoundError("no vlafeed command: run `make build` (or set VF_CLI)")


# ---- the machine -------------------------------------------------------------------------------

def describe_device():
    """Device name, driver, torch / CUDA / cuDNN versions and the host's CPUs."""
    out = {"python": platform.python_version(), "host_cpus": os.cpu_count(),
           "allowed_cpus": len(os.sched_getaffinity(0))}
    try:
        import torch
    except ImportError:
        out.update(name="cpu", torch=None, cuda=None, driver=None)
        return out
    out.update(torch=torch.__version__, cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    if not torch.cuda.is_available():
        out.update(name="cpu", driver=None, cuda_available=False)
        return out
    props = torch.cuda.get_device_properties(0)
    out.update(name=torch.cuda.get_device_name(0), cuda_available=True, gpus=torch.cuda.device_count(),
               capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2**30, 1))
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        out["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        out["driver"] = None
    return out


def git_commit():
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ---- datasets ----------------------------------------------------------------------------------

def prepare_datasets(work, size):
    """make-sample datasets (H.264 and AV1, 2 cameras) under work/<size>-<codec>, made once: a
    dataset whose stamp file matches its settings is reused (the check is idempotent)."""
    episodes, wxh, lo, hi = SIZES[size]
    roots = {}
    for codec in ("h264", "av1"):
        root = Path(work) / f"{size}-{codec}"
        args = ["--episodes", episodes, "--codec", codec, "--size", wxh, "--fps", 10, "--min-length", lo,
                "--max-length", hi, "--quiet"]
        stamp = root.parent / f"{root.name}.stamp"
        want = json.dumps([str(a) for a in args])
        if not (root.exists() and stamp.exists() and stamp.read_text() == want):
            shutil.rmtree(root, ignore_errors=True)
            root.parent.mkdir(parents=True, exist_ok=True)
            r = subprocess.run([cli_path(), "make-sample", str(root), *map(str, args)], capture_output=True,
                               text=True, timeout=300)
            if r.returncode != 0:
                raise RuntimeError(f"make-sample {codec} failed: {r.stderr.strip()[-500:]}")
            stamp.write_text(want)
        roots[codec] = str(root)
    return roots


# ---- step helpers ------------------------------------------------------------------------------

def loader_keywords():
    import vlafeed
    return set(inspect.signature(vlafeed.Loader.__init__).parameters)


def example_policy_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_policy_example", REPO / "examples" / "train_policy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_device(ctx):
    """The device the steps run on: cuda:0, or the CPU in a --cpu-rehearsal."""
    import torch
    return torch.device("cpu" if ctx.get("rehearsal") else "cuda:0")


def timed_training(loader, step_fn, device, steps, warmup=3):
    """Runs step_fn(batch) over the loader (restarting epochs) for warmup + steps steps; returns the
    step loop's own figures: seconds, samples/s and the fraction of step time spent in next()."""
    it, epoch = iter(loader), 0
    wait = total = 0.0
    samples = done = 0
    while done < warmup + steps:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            epoch += 1
            loader.set_epoch(epoch)
            it = iter(loader)
            continue
        t1 = time.perf_counter()
        n = step_fn(batch)
        del batch
        sync(device)
        t2 = time.perf_counter()
        done += 1
        if done > warmup:
            wait += t1 - t0
            total += t2 - t0
            samples += n
    return {"steps": steps, "seconds": round(total, 3), "samples_per_s": round(samples / total, 1) if total else None,
            "loop_wait_fraction": round(wait / total, 4) if total else None}


def to_device(batch, device, fallback):
    if not fallback:
        return batch
    return {k: (v.to(device, non_blocking=True) if hasattr(v, "to") else v) for k, v in batch.items()}


# ---- the steps ---------------------------------------------------------------------------------

def step_loader_cuda(ctx):
    """(a) The loader to cuda under the example policy's training step (and ACT with LeRobot)."""
    if not (ctx["cuda"] or ctx.get("rehearsal")):
        return skipped(NO_CUDA)
    import torch
    import torch.nn.functional as F
    import vlafeed
    device = run_device(ctx)
    has_device_kw = "device" in loader_keywords()
    notes = [f"Loader(device='{device}')" if has_device_kw else
             "vlafeed.Loader has no device= keyword: batches moved with .to(device, non_blocking=True)"]
    ex = example_policy_module()
    figures = {"device_api": "Loader(device=)" if has_device_kw else "fallback .to(non_blocking=True)"}
    steps = ctx.get("train_steps", 20)
    for codec, root in ctx["datasets"].items():
        fps, cams, state_dim, action_dim, _ = ex.dataset_meta(root, "vlafeed")
        chunk = 10
        deltas = {"action": [i / fps for i in range(chunk)]}
        torch.manual_seed(0)
        model = ex.Policy(len(cams), state_dim, action_dim, chunk).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def policy_step(batch):
            batch = to_device(batch, device, not has_device_kw)
            images = [batch[k].to(device, non_blocking=True).float().div_(255) for k in cams]
            state = batch["observation.state"].to(device).float()
            target = batch["action"].to(device).float()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                pred = model(images, state, batch["task"])
            loss = F.l1_loss(pred.float(), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return state.shape[0]

        for bs in ctx["batch_sizes"]:
            kw = dict(mode="stream", batch_size=bs, seed=0, delta_timestamps=deltas, image_format="uint8",
                      drop_last=True, affinity="auto", decode_threads=0)
            if has_device_kw:
                kw["device"] = str(device)
            with vlafeed.Loader(root, **kw) as loader:
                fig = timed_training(loader, policy_step, device, steps)
                st = loader.stats()
            fig.update(loader_data_wait_fraction=st["data_wait_fraction"],
                       loader_data_wait_s=round(st["data_wait_s"], 3),
                       affinity=st["affinity"], decode_threads=st["decode_threads"])
            figures[f"example_policy/{codec}/bs{bs}"] = fig
    act = act_figures(ctx, device, has_device_kw, steps)
    figures.update(act.pop("figures", {}))
    notes += act.pop("notes", [])
    return result("ok", None, figures, notes)


def act_figures(ctx, device, has_device_kw, steps):
    """LeRobot's ACT on the H.264 dataset when lerobot imports (its API moves between releases:
    a failure here is a note, not the step's failure)."""
    import importlib.util
    if importlib.util.find_spec("lerobot") is None:
        return {"notes": ["ACT: skipped: lerobot is not importable"]}
    try:
        import torch
        import vlafeed
        from lerobot.configs.types import FeatureType, PolicyFeature
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy
        root = ctx["datasets"]["h264"]
        meta = vlafeed.LeRobotDataset(root).meta
        feats = meta.features
        inputs = {"observation.state": PolicyFeature(type=FeatureType.STATE,
                                                     shape=tuple(feats["observation.state"]["shape"]))}
        for cam in meta.camera_keys:
            shape = feats[cam]["shape"]  # [H, W, C] in info.json
            inputs[cam] = PolicyFeature(type=FeatureType.VISUAL, shape=(3, shape[0], shape[1]))
        outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=tuple(feats["action"]["shape"]))}
        cfg = ACTConfig(input_features=inputs, output_features=outputs, chunk_size=10, n_action_steps=10,
                        device=device.type)
        policy = ACTPolicy(cfg).to(device)
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
        deltas = {"action": [i / meta.fps for i in range(10)]}
        figures = {}
        for bs in ctx["batch_sizes"]:
            kw = dict(mode="stream", batch_size=bs, delta_timestamps=deltas, drop_last=True, affinity="auto")
            if has_device_kw:
                kw["device"] = str(device)

            def act_step(batch):
                batch = {k: (v.to(device, non_blocking=True) if hasattr(v, "to") else v) for k, v in batch.items()}
                loss, _ = policy.forward(batch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                return batch["observation.state"].shape[0]

            with vlafeed.Loader(root, **kw) as loader:
                fig = timed_training(loader, act_step, device, steps)
                fig["loader_data_wait_fraction"] = loader.stats()["data_wait_fraction"]
            figures[f"act/h264/bs{bs}"] = fig
        return {"figures": figures}
    except Exception as e:  # noqa: BLE001 - reported, the step goes on
        return {"notes": [f"ACT: failed: {type(e).__name__}: {e}"]}


def step_nvdec(ctx):
    """(b) NVDEC against CPU decoding: frames/s and frame equality."""
    if not (ctx["cuda"] or ctx.get("rehearsal")):
        return skipped(NO_CUDA)
    if "decode_device" not in loader_keywords():
        return skipped("vlafeed.Loader has no decode_device keyword (NVDEC decoding not in this build)")
    import numpy as np
    import vlafeed
    figures = {}
    for codec, root in ctx["datasets"].items():
        frames = {}
        for where in ("cpu", "cuda"):
            kw = dict(mode="stream", batch_size=16, shuffle=False, image_format="uint8",
                      decode_device="cpu" if ctx.get("rehearsal") else where)
            t0 = time.perf_counter()
            with vlafeed.Loader(root, **kw) as loader:
                got, count = [], 0
                for batch in loader:
                    for k in [k for k in batch if k.startswith("observation.images.")]:
                        arr = batch[k].cpu().numpy() if hasattr(batch[k], "cpu") else np.asarray(batch[k])
                        got.append(arr.copy())
                        count += arr.shape[0]
            secs = time.perf_counter() - t0
            frames[where] = got
            figures[f"{codec}/{where}_frames_per_s"] = round(count / secs, 1) if secs else None
        a, b = frames["cpu"], frames["cuda"]
        same = len(a) == len(b) and all(x.shape == y.shape for x, y in zip(a, b))
        if same:
            diffs = [np.abs(x.astype(np.int16) - y.astype(np.int16)) for x, y in zip(a, b)]
            figures[f"{codec}/max_abs_diff"] = int(max(d.max() for d in diffs)) if diffs else 0
            figures[f"{codec}/mean_abs_diff"] = float(np.mean([d.mean() for d in diffs])) if diffs else 0.0
            figures[f"{codec}/identical"] = all(int(d.max()) == 0 for d in diffs)
        else:
            figures[f"{codec}/identical"] = False
            figures[f"{codec}/shape_mismatch"] = True
    bad = [c for c in ctx["datasets"] if figures.get(f"{c}/shape_mismatch")]
    return result("failed" if bad else "ok", f"NVDEC frames differ in shape for {bad}" if bad else None, figures)


def train_in_one_process_group(argv):
    """vlafeed.train.runner.main(argv) with a process group of one: vlafeed.train wraps the model
    (FSDP2 or DDP) only when it runs distributed, which a single torchrun process is not, so the
    group is made here (NCCL on CUDA, gloo on the CPU) and the run is told it is distributed."""
    import dataclasses
    import torch.distributed as dist
    from vlafeed.train import runner

    def one_rank_group(backend="auto", device="auto"):
        dinfo = runner.__dict__["_gpu_check_setup"](backend, device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if dinfo.device.type == "cuda" else "gloo", rank=0, world_size=1)
        return dataclasses.replace(dinfo, distributed=True, owns_group=True)

    runner._gpu_check_setup = runner.setup_distributed
    runner.setup_distributed = one_rank_group
    return runner.main(argv)


def step_train(ctx):
    """(c) vlafeed.train on one GPU: FSDP2 and DDP, amp_bfloat16, packed batches, SDPA and flash-attn."""
    if not (ctx["cuda"] or ctx.get("rehearsal")):
        return skipped(NO_CUDA)
    import importlib.util
    attentions = ["sdpa"]
    notes = []
    if importlib.util.find_spec("flash_attn") is not None and not ctx.get("rehearsal"):
        attentions.append("flash")
    else:
        notes.append("flash-attn is not importable: SDPA only")
    figures, failures = {}, []
    root = ctx["datasets"]["h264"]
    for fsdp in ("true", "false"):
        for attention in attentions:
            name = f"{'fsdp2' if fsdp == 'true' else 'ddp'}/{attention}"
            ck = Path(ctx["work"]) / "train" / name.replace("/", "-")
            shutil.rmtree(ck, ignore_errors=True)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                   __file__, "--train-one-rank", "--data.dataset", root, "--data.batch_size", "16",
                   "--data.image_size", "64", "--train.steps", "20", "--train.precision", "amp_bfloat16",
                   "--parallel.device", "cpu" if ctx.get("rehearsal") else "cuda", "--parallel.fsdp", fsdp,
                   "--model.attention", attention,
                   "--packing.enabled", "true", "--checkpoint.dir", str(ck), "--checkpoint.every", "0"]
            t0 = time.perf_counter()
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=45, env=_inplace.child_env())
                ok = r.returncode == 0 and (ck / "summary.json").exists()
                why = None if ok else f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}"
            except subprocess.TimeoutExpired:
                ok, why = False, "timed out after 45 s"
            fig = {"wall_s": round(time.perf_counter() - t0, 1)}
            if ok:
                s = json.loads((ck / "summary.json").read_text())
                fig.update({k: s.get(k) for k in ("parallel", "world_size", "tokens_per_s", "data_wait_fraction",
                                                  "padding_fraction",
                                                  "first_loss", "last_loss", "step_seconds")})
            else:
                failures.append(f"{name}: {why}")
            figures[name] = fig
    if failures:
        return result("failed", "; ".join(failures), figures, notes)
    return result("ok", None, figures, notes)


def step_fp8(ctx):
    """(d) The FP8 blockwise GEMM against bf16 (vlafeed.quant.gpu_self_check)."""
    if not (ctx["cuda"] or ctx.get("rehearsal")):
        return skipped(NO_CUDA)
    from vlafeed.quant import gpu_self_check
    figures = {}
    if ctx.get("rehearsal"):
        return result("ok", None, {"self_check": gpu_self_check(m=16, k=256, n=256, iters=1)})
    for m, k, n in ((256, 4096, 4096), (2048, 4096, 4096), (4096, 8192, 8192)):
        figures[f"m{m}_k{k}_n{n}"] = gpu_self_check(m=m, k=k, n=n, iters=20)
    return result("ok", None, figures)


def step_rl(ctx):
    """(e) A short vlafeed.rl run (policy server on the GPU when RLConfig can say so)."""
    if not (ctx["cuda"] or ctx.get("rehearsal")):
        return skipped(NO_CUDA)
    import dataclasses
    import importlib.util
    for mod in ("ray", "gymnasium"):
        if importlib.util.find_spec(mod) is None:
            return skipped(f"{mod} is not importable (pip install '.[rl]')")
    from vlafeed.rl import RLConfig, train
    fields = {f.name for f in dataclasses.fields(RLConfig)}
    kw = dict(env="toy-reach", num_workers=2, steps=5, global_batch=8, micro_batch=4)
    notes = []
    for name in ("device", "policy_device", "server_device"):
        if name in fields:
            kw[name] = "cpu" if ctx.get("rehearsal") else "cuda"
            notes.append(f"RLConfig.{name} = 'cuda'")
            break
    else:
        notes.append("RLConfig has no device field: the policy server ran on the CPU of the GPU machine")
    t0 = time.perf_counter()
    report = train(RLConfig(**kw))
    figures = {k: v for k, v in report.items() if isinstance(v, (int, float, str, bool)) or v is None}
    figures["wall_s"] = round(time.perf_counter() - t0, 1)
    if "placement" in fields and not ctx.get("rehearsal"):
        # hybrid placement: the policy server and the learner actor share the GPU (0.5 each)
        seen = {}

        def look(info):
            if info["version"] == 1 and info.get("learner") is not None:
                import ray
                seen["server"] = ray.get(info["server"].placement.remote())
                seen["learner"] = ray.get(info["learner"].placement.remote())

        t1 = time.perf_counter()
        rep = train(RLConfig(**{k: v for k, v in kw.items() if k not in ("device", "policy_device", "server_device")},
                             placement="hybrid"), on_step=look)
        figures["hybrid_wall_s"] = round(time.perf_counter() - t1, 1)
        figures["hybrid_placement"] = rep.get("placement_options")
        figures["hybrid_gpu_ids"] = {k: v.get("gpu_ids") for k, v in seen.items()}
        figures["hybrid_accounting"] = {k: v for k, v in rep.get("accounting", {}).items() if isinstance(v, int)}
        notes.append("hybrid: server and learner actor with num_gpus 0.5 each on one GPU")
    return result("ok", None, figures, notes)


# ---- running the steps -------------------------------------------------------------------------

def run_step_here(name, ctx):
    t0 = time.perf_counter()
    try:
        res = globals()[f"step_{name}"](ctx)
    except Exception as e:  # noqa: BLE001 - the step failed; the check goes on
        res = result("failed", f"{type(e).__name__}: {e}", notes=[traceback.format_exc()[-2000:]])
    res["seconds"] = round(time.perf_counter() - t0, 2)
    return res


def run_step_child(name, ctx, out, limit):
    """The step in its own process (own time limit; a crash or hang fails this step only)."""
    logs = Path(out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ctx_file, res_file = logs / f"{name}.context.json", logs / f"{name}.result.json"
    ctx_file.write_text(json.dumps(ctx))
    res_file.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(logs / f"{name}.log", "w") as log:
        proc = subprocess.Popen([sys.executable, __file__, "--run-step", name, "--context", str(ctx_file),
                                 "--result", str(res_file)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=_inplace.child_env())
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return result("failed", f"timed out after {limit} s (log: logs/{name}.log)") | {
                "seconds": round(time.perf_counter() - t0, 2)}
    if res_file.exists():
        return json.loads(res_file.read_text())
    return result("failed", f"the step's process exited with status {rc} without a result (log: logs/{name}.log)") | {
        "seconds": round(time.perf_counter() - t0, 2)}


def write_summary(out, summary):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    dev = summary["device"]
    lines = [f"# GPU check: {dev.get('name')}", "",
             f"- date: {summary['date']}  commit: {summary.get('commit')}  dry run: {summary['dry_run']}",
             f"- device: {dev.get('name')}, driver {dev.get('driver')}, torch {dev.get('torch')}, "
             f"CUDA {dev.get('cuda')}, cuDNN {dev.get('cudnn')}",
             f"- CPUs: {dev.get('allowed_cpus')} allowed of {dev.get('host_cpus')}; batch sizes "
             f"{summary['batch_sizes']}; datasets: {summary['datasets_size']}", "",
             "| step | status | seconds | reason |", "|---|---|---|---|"]
    for name, res in summary["steps"].items():
        reason = (res.get("reason") or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {name} | {res['status']} | {res.get('seconds', '')} | {reason} |")
    for name, res in summary["steps"].items():
        if not res.get("figures") and not res.get("notes"):
            continue
        lines += ["", f"## {name}", ""]
        for key, value in res.get("figures", {}).items():
            lines.append(f"- `{key}`: {json.dumps(value, default=str)}")
        for note in res.get("notes", []):
            lines.append(f"- note: {note.strip()}" if "\n" not in note.strip() else f"- note:\n\n```\n{note}\n```")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true",
                   help="CPU dry run even with a GPU: tiny datasets, every step skipped, the summary written")
    p.add_argument("--out", help="summary folder (default bench/gpu/<date>-<device name slug>)")
    p.add_argument("--work", help="datasets and scratch (default ~/.cache/vlafeed-gpu-check)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    p.add_argument("--batch-sizes", default="8,16,32,64", help="loader batch sizes of the loader_cuda step")
    p.add_argument("--train-steps", type=int, default=20, help="measured training steps per configuration")
    p.add_argument("--deadline", type=float, default=0,
                   help="Unix time by which every step must be over (steps cut to fit; 0: none)")
    p.add_argument("--cpu-rehearsal", action="store_true",
                   help="run the steps' code on the CPU at tiny sizes (to check the script, not the GPU; "
                        "its figures mean nothing)")
    p.add_argument("--run-step", help=argparse.SUPPRESS)
    p.add_argument("--context", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        p.error(f"unknown step(s) {unknown}: choose among {list(STEPS)}")
    args.steps = steps
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        p.error(f"--batch-sizes: {args.batch_sizes!r} is not a list of integers")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        p.error("--batch-sizes: each must be >= 1")
    return args


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--train-one-rank"]:  # step_train's child: vlafeed.train with FSDP2 / DDP on one rank
        return train_in_one_process_group(argv[1:])
    args = parse_args(argv)
    if args.run_step:  # a child: one step, its result as JSON
        ctx = json.loads(Path(args.context).read_text())
        Path(args.result).write_text(json.dumps(run_step_here(args.run_step, ctx), default=str))
        return 0
    cuda = cuda_available() and not args.dry_run
    device = describe_device()
    today = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else HERE / "gpu" / f"{today}-{slug(device['name']) if cuda else 'cpu-dry-run'}"
    work = Path(args.work or Path.home() / ".cache" / "vlafeed-gpu-check")
    size = "full" if cuda else "tiny"
    print(f"gpu-check: {'GPU ' + device['name'] if cuda else 'CPU dry run'}; datasets in {work}; summary in {out}",
          flush=True)
    summary = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "dry_run": not cuda, "cpu_rehearsal": args.cpu_rehearsal and not cuda, "device": device,
               "commit": git_commit(), "batch_sizes": args.batch_sizes,
               "datasets_size": f"{size}: {SIZES[size]}", "steps": {}}
    try:
        datasets = prepare_datasets(work, size)
    except Exception as e:  # noqa: BLE001 - every step then fails with the reason
        datasets = None
        why = f"dataset preparation failed: {type(e).__name__}: {e}"
    rehearsal = args.cpu_rehearsal and not cuda
    ctx = {"cuda": cuda, "rehearsal": rehearsal, "datasets": datasets, "work": str(work),
           "batch_sizes": args.batch_sizes, "train_steps": args.train_steps}
    for name in args.steps:
        if datasets is None and cuda:
            res = result("failed", why)
        elif not cuda and not rehearsal:
            res = run_step_here(name, ctx)  # each skips at once, with the reason
        else:
            left = args.deadline - time.time() - 5 if args.deadline else LIMITS[name]
            if left < 10:
                res = skipped("the check's time budget is spent")
            else:
                res = run_step_child(name, ctx, out, int(min(LIMITS[name], left)))
        summary["steps"][name] = res
        print(f"  {name}: {res['status']}" + (f" ({res['reason']})" if res.get("reason") else ""), flush=True)
        write_summary(out, summary)  # after every step: a later hang still leaves a summary
    if datasets is None:
        summary["datasets_error"] = why
    summary["datasets"] = datasets
    write_summary(out, summary)
    print(f"gpu-check: wrote {out / 'summary.json'} and {out / 'summary.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
