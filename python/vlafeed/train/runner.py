"""The training loop behind ``python -m vlafeed.train``.

    torchrun --nproc_per_node=2 -m vlafeed.train --config run.yaml --train.steps 200

Order of work: the config is parsed and checked (ConfigError names the key,
with its range) and the checkpoint directory is checked writable before the
process group exists; then the process group, the model (same init on every
rank, seeded by train.seed), FSDP2 or DDP, the optimizer and LR schedule,
the vlafeed loader, and the checkpoint to resume from, which is checked
(CheckpointError names the file) before the first step. Each step runs
train.grad_accum micro-batches with gradient sync on the last one only; a
loss that is NaN or infinite stops the run (NonFiniteLoss names the step)
before the optimizer applies it.

After each optimizer step (gradients clipped to train.clip_grad_norm with the total norm over ranks, see
optim.py) the EMA moves (ema.py), the step's metrics go to the sinks (metrics.py), and a SIGTERM/SIGUSR1 seen
by any rank stops every rank there with a checkpoint (preempt.py).

Exit status of main(): 0 done (or preempted, with a checkpoint), 2 a config error (a key, a value out of its
range, an unwritable checkpoint.dir), 3 a checkpoint that cannot be resumed
(or is refused), 4 a non-finite loss.
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from vlafeed.train import checkpoint as ckpt
from vlafeed.train import data as vdata
from vlafeed.train.config import CHOICES, KEY_HELP, Config, ConfigError, load_config
from vlafeed.train.ema import EMA
from vlafeed.train.metrics import MetricsLogger, peak_memory_mb, set_main, warn_once
from vlafeed.train.optim import build_optimizer, build_scheduler, clip_grads, freeze, grad_norm
from vlafeed.train.optim import lr_lambda  # noqa: F401  (kept importable from here)
from vlafeed.train.preempt import Preemption
from vlafeed.train.packing import load_tokenizer, packed_layout, padded_layout, sample_tokens
from vlafeed.train.parallel import (rng_state, seed_rank_streams, set_rng_state, setup_distributed, wrap_model)
from vlafeed.train.policy import VLAPolicy, resolve_attention


class Batches:
    """Endless batches from a vlafeed.Loader: the next epoch starts when one ends."""

    def __init__(self, loader, restored: bool):
        self.loader = loader
        if not restored:
            loader.set_epoch(loader.epoch)
        self.it = iter(loader)

    @property
    def epoch(self):
        return self.loader.epoch

    def next(self):
        for _ in range(2):
            try:
                return next(self.it)
            except StopIteration:
                self.loader.set_epoch(self.loader.epoch + 1)
                self.it = iter(self.loader)
        raise RuntimeError("the loader yields no batch for this rank (is the dataset smaller than one batch?)")


def _stat(stats, key, name, dim):
    if stats and key in stats and name in stats[key]:
        return torch.as_tensor(stats[key][name], dtype=torch.float32).reshape(dim)
    return torch.zeros(dim) if name == "mean" else torch.ones(dim)


def build_model(cfg: Config, meta, device):
    cams = list(meta.camera_keys)
    feats = meta.features
    if cfg.data.image_size:
        hw = (cfg.data.image_size, cfg.data.image_size)
    else:
        shape = feats[cams[0]]["shape"]
        names = feats[cams[0]].get("names") or []
        hw = (shape[0], shape[1]) if (names and names[-1] in ("channel", "channels")) or shape[-1] == 3 \
            else (shape[1], shape[2])
    state_dim = int(feats["observation.state"]["shape"][0])
    action_dim = int(feats["action"]["shape"][0])
    m = cfg.model
    patches = (hw[0] // m.patch) * (hw[1] // m.patch)
    max_pos = m.max_text_tokens + len(cams) * patches + 1 + cfg.data.chunk
    attention = resolve_attention(m.attention, device)
    model = VLAPolicy(num_cameras=len(cams), image_hw=hw, state_dim=state_dim, action_dim=action_dim,
                      chunk=cfg.data.chunk, d_model=m.d_model, layers=m.layers, heads=m.heads, patch=m.patch,
                      vocab_size=m.vocab_size, max_positions=max_pos, attention=attention)
    return model, cams, hw, state_dim, action_dim


class Step:
    """Turns a loader batch into model inputs, a layout and targets."""

    def __init__(self, cfg: Config, model: VLAPolicy, cams, stats, state_dim, action_dim, device):
        self.cfg, self.cams, self.device = cfg, cams, device
        self.tokenizer = load_tokenizer(cfg.model.tokenizer)
        self.packed_rows = self.packed_samples = 0  # rows and samples of the packed micro-batches so far
        self.tokens_per_camera, self.chunk = model.tokens_per_camera, cfg.data.chunk
        self.s_mean, self.s_std = _stat(stats, "observation.state", "mean", state_dim).to(device), \
            _stat(stats, "observation.state", "std", state_dim).clamp_min(1e-3).to(device)
        self.a_mean, self.a_std = _stat(stats, "action", "mean", action_dim).to(device), \
            _stat(stats, "action", "std", action_dim).clamp_min(1e-3).to(device)

    def inputs(self, batch, packed: bool):
        dtype = torch.bfloat16 if self.cfg.train.precision == "pure_bf16" else torch.float32
        images = [batch[k].to(self.device).float().div_(255).to(dtype) for k in self.cams]
        state = ((batch["observation.state"].to(self.device).float() - self.s_mean) / self.s_std).to(dtype)
        target = (batch["action"].to(self.device).float() - self.a_mean) / self.a_std
        valid = (~batch["action_is_pad"].to(self.device)).float()
        m = self.cfg.model
        samples = sample_tokens(batch["task"], batch["index"].tolist(), tokenizer=self.tokenizer,
                                max_text_tokens=m.max_text_tokens, num_cameras=len(self.cams),
                                tokens_per_camera=self.tokens_per_camera, chunk=self.chunk,
                                camera_dropout=m.camera_dropout, seed=self.cfg.data.seed)
        lengths = [s.length for s in samples]
        if packed:
            row = self.cfg.packing.max_tokens or max(lengths)  # 0: rows as long as the longest sample
            layout = packed_layout(lengths, row, self.cfg.packing.window, self.device)
            self.packed_rows += layout.rows
            self.packed_samples += len(lengths)
        else:
            layout = padded_layout(lengths, self.device)
        return images, state, samples, layout, target, valid


def resolve_resume(cfg: Config):
    r = cfg.checkpoint.resume
    if not r:
        return None
    if r == "auto":
        return ckpt.latest(cfg.checkpoint.dir)
    return Path(r)


class NonFiniteLoss(RuntimeError):
    """The loss of a step is NaN or infinite; the message names the step."""


def check_checkpoint_dir(ckdir):
    """Creates ckdir if needed and writes a probe file into it: ConfigError naming checkpoint.dir when
    that fails, so an unwritable directory stops the run before its first step, not at its first save."""
    path = Path(ckdir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"config key 'checkpoint.dir': {path} is not a writable directory "
                          f"({e.strerror or e}); checkpoints and summary.json are written there") from None


def train(cfg: Config) -> dict:
    import vlafeed
    check_checkpoint_dir(cfg.checkpoint.dir)
    set_cublas_workspace(cfg)
    dinfo = setup_distributed(cfg.parallel.backend, cfg.parallel.device)
    try:
        return _train(cfg, dinfo, vlafeed)
    finally:
        if dinfo.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def set_cublas_workspace(cfg: Config):
    """CUBLAS_WORKSPACE_CONFIG=:4096:8 when deterministic and CUDA may be used (a value already set stays).

    cuBLAS is deterministic only with a fixed workspace, read when its first handle is made: so before any
    CUDA work (torch.use_deterministic_algorithms raises at the first matmul otherwise)."""
    if cfg.train.deterministic and cfg.parallel.device != "cpu":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _train(cfg: Config, dinfo, vlafeed) -> dict:
    rank, world, device = dinfo.rank, dinfo.world_size, dinfo.device
    set_main(dinfo.is_main)
    if cfg.train.deterministic:
        torch.use_deterministic_algorithms(True)
    share = max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    torch.set_num_threads(cfg.train.threads or max(1, share - cfg.data.loader_threads))

    plan = vdata.DataPlan(cfg, vlafeed, rank, world)  # data.* and eval.* keys: train/data.py
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
    from vlafeed.train import models  # the model seam (model.source): train/models.py
    tm = models.build(cfg, plan.model_meta, device, is_main=dinfo.is_main)
    model = tm.module
    frozen = freeze(model, cfg.train.freeze)
    # the loader delivers the plan's windows and what the model asks for (LeRobot: its delta indices)
    plan.use_model(tm.delta_timestamps, tm.image_format)
    signature = ckpt.model_signature(model)
    path = resolve_resume(cfg)
    if cfg.checkpoint.resume and cfg.checkpoint.resume != "auto" and path is not None and not path.exists():
        raise ckpt.CheckpointError(f"checkpoint {path} (checkpoint.resume) does not exist")
    cmeta = ckpt.read_meta(path) if path is not None else None
    global_batch = resolve_global_batch(cfg, world, cmeta, dinfo.is_main)
    run = cfg.to_dict()
    run["train"]["global_batch"] = global_batch
    identity = ckpt.run_identity(run)
    p = cfg.parallel
    wrapped = wrap_model(model, dinfo, fsdp=p.fsdp, precision=cfg.train.precision,
                         reshard_after_forward=p.reshard_after_forward, cpu_offload=p.cpu_offload,
                         keep_unsharded_during_accumulation=p.keep_unsharded_during_accumulation,
                         extra_block_types=tm.block_types,
                         activation_checkpointing=cfg.train.activation_checkpointing, compile=cfg.train.compile)
    seed_rank_streams(cfg.train.seed, rank)
    optimizer = build_optimizer(wrapped.model, cfg.train)
    scheduler = build_scheduler(optimizer, cfg.train)
    trainable = [q for q in wrapped.model.parameters() if q.requires_grad]
    ema = EMA(wrapped.model, cfg.train.ema_decay) if cfg.train.ema_decay > 0 else None
    metrics = MetricsLogger(cfg.train, dinfo.is_main, run)  # before the loader: a missing package stops here

    loader = plan.training_stream()  # a vlafeed.Loader, or a vlafeed.Mix for data.mix

    step, restored, resumed_from, data_note, load_seconds = 0, False, None, "", None
    if path is not None:
        ckpt.check_compatible(path, cmeta, signature, identity)
        tl = time.perf_counter()
        with_ema = ema is not None and cmeta.get("ema", False)
        step, mine, rank0_loader, cmeta = ckpt.load(path, wrapped.model, optimizer, scheduler, rank=rank,
                                                    world=world,
                                                    extra_state={"ema": ema.state_dict()} if with_ema else None)
        if ema is not None and not with_ema:  # EMA turned on at this resume: it starts from the loaded weights
            ema = EMA(wrapped.model, cfg.train.ema_decay)
        saved_batch = (cmeta.get("config") or {}).get("data", {}).get("batch_size", cfg.data.batch_size)
        if saved_batch != cfg.data.batch_size:
            mine = None  # another micro-batch size: the loader continues as after a world-size change
        load_seconds = time.perf_counter() - tl
        if mine is not None:
            set_rng_state(mine["rng"])
            loader.load_state_dict(mine["loader"])
            restored, data_note = True, "data continues exactly where it stopped"
        else:
            seed_rank_streams(cfg.train.seed + 7919 * step, rank)
            try:  # a loader with elastic resume accepts another world size's state
                loader.load_state_dict(rank0_loader)
                restored, data_note = True, "data continues from the loader's elastic resume"
            except ValueError as e:
                msg = (f"{path}: saved at world size {cmeta['world_size']}, resuming at {world} (data.batch_size "
                       f"{saved_batch} there, {cfg.data.batch_size} here): the model and "
                       f"optimizer reshard, but this vlafeed.Loader cannot continue its data stream at another "
                       f"world size ({e})")
                if cfg.checkpoint.elastic_data == "error":
                    raise ckpt.CheckpointError(msg + "; set checkpoint.elastic_data=restart_epoch to start the "
                                               "next epoch instead (not exactly-once)") from None
                loader.set_epoch(int(rank0_loader["epoch"]) + 1)
                data_note = (f"data NOT exactly-once: the loader restarts at epoch {int(rank0_loader['epoch']) + 1}"
                             f" (the rest of epoch {int(rank0_loader['epoch'])} is skipped)")
        resumed_from = str(path)
        if dinfo.is_main:
            print(f"resumed from {path} at step {step} (saved at world size {cmeta['world_size']}, now {world}; "
                  f"{data_note})", flush=True)
    batches = Batches(loader, restored)
    if dinfo.is_main and not (Path(cfg.checkpoint.dir) / models.ASSETS / "vlafeed_model.json").is_file():
        tm.save_assets(Path(cfg.checkpoint.dir) / models.ASSETS)  # t-models: what export needs besides weights

    def model_batch(batch):  # the example policy reads the newest step of a windowed key; others the window
        return vdata.newest_step(batch, plan.windows) if tm.source == "vlafeed" else batch

    def batch_loss(batch):  # the loss of the training step, for validation
        return tm.loss(wrapped, model_batch(batch))[0]
    val_losses = []

    if dinfo.is_main:
        kind = {"fsdp": f"FSDP2 ({wrapped.units} units)", "ddp": "DDP", "local": "1 process"}[wrapped.kind]
        print(f"training: {world} rank(s) on {device}, {kind}, precision {cfg.train.precision}, "
              f"micro-batch {cfg.data.batch_size} x {cfg.train.grad_accum} accumulated (global batch "
              f"{global_batch}), {_packing_text(cfg)}, {tm.describe}, "
              f"{cfg.train.optimizer} {cfg.train.schedule}"
              f"{', clip ' + format(cfg.train.clip_grad_norm, 'g') if cfg.train.clip_grad_norm else ''}"
              f"{', EMA ' + format(cfg.train.ema_decay, 'g') if ema else ''}"
              f"{', ' + str(len(frozen)) + ' frozen tensors' if frozen else ''}"
              f"{', activation checkpointing' if cfg.train.activation_checkpointing else ''}"
              f"{', compiled' if cfg.train.compile else ''}", flush=True)
    preempt = Preemption().install()
    preempted = None
    norm = None
    samples_log = open(f"{cfg.train.sample_log}.rank{rank}.jsonl", "a") if cfg.train.sample_log else None
    losses, wait, total, real_tokens, slot_tokens, saves, state_bytes = [], 0.0, 0.0, 0, 0, [], None
    accum = cfg.train.grad_accum
    t_start = time.perf_counter()
    every = cfg.checkpoint.every
    end = min(cfg.train.steps, cfg.train.stop_at) if cfg.train.stop_at > 0 else cfg.train.steps
    sim_evals = []

    def sim_eval(where):
        """eval.env: the checkpoint just written, exported (as `vlafeed.train export` does) and run in the
        simulator by vlafeed.rl.evaluate on rank 0; the other ranks wait at a barrier."""
        if dinfo.is_main:
            from vlafeed.rl.evaluation import evaluate
            out = models.export(where, Path(cfg.checkpoint.dir) / "sim_eval" / Path(where).name)
            rep = evaluate(str(out / "pretrained_model"), cfg.eval.env, episodes=cfg.eval.env_episodes,
                           seed=cfg.train.seed, max_steps=cfg.eval.env_max_steps or None)
            agg = rep["aggregated"]
            row = {"step": step, "sim_success": agg["pc_success"], "sim_return": agg["avg_sum_reward"],
                   "sim_length": agg.get("avg_length"), "sim_episodes": agg["n_episodes"]}
            sim_evals.append(row)
            metrics.log(row)
            success = "n/a" if agg["pc_success"] is None else f"{agg['pc_success']:.0f}%"
            print(f"step {step}/{cfg.train.steps} {cfg.eval.env}: success {success}, return "
                  f"{agg['avg_sum_reward']:.3f} over {agg['n_episodes']} episodes", flush=True)
        if dinfo.distributed:
            dist.barrier()

    def save_now():
        ts = time.perf_counter()
        where = ckpt.save(cfg.checkpoint.dir, step, wrapped.model, optimizer, scheduler, rank=rank, world=world,
                  signature=signature, identity=identity, loader_state=loader.state_dict(), rng=rng_state(),
                  keep=cfg.checkpoint.keep, extra={"config": cfg.to_dict(), "ema": ema is not None},
                  extra_state={"ema": ema.state_dict()} if ema is not None else None)
        saves.append(time.perf_counter() - ts)
        if cfg.eval.env:
            sim_eval(where)

    while step < end:
        t0 = time.perf_counter()
        step_wait, step_tokens = 0.0, 0
        step_loss = torch.zeros((), dtype=torch.float64)
        for micro in range(accum):
            tw = time.perf_counter()
            batch = batches.next()
            step_wait += time.perf_counter() - tw
            if samples_log:  # which samples this rank trained on, for exactly-once checks across restarts
                samples_log.write(json.dumps({"step": step + 1, "micro": micro, "epoch": batches.epoch,
                                              "index": batch["index"].tolist(),
                                              "episode_index": batch["episode_index"].tolist(),
                                              **({"dataset_index": batch["dataset_index"].tolist()}
                                                 if "dataset_index" in batch else {}), "time": time.time(),
                                              "world": world, "pid": os.getpid()}) + "\n")
                samples_log.flush()
            batch = vdata.apply_augment(plan.augment, batch, plan.camera_keys, seed=cfg.train.seed, rank=rank,
                                        step=step, micro=micro)
            batch = model_batch(batch)
            with wrapped.micro_batch(micro, accum):
                loss, mstats = tm.loss(wrapped, batch)  # t-models: the model's own loss
                del batch
                loss = loss / accum
                loss.backward()
            step_tokens += mstats["real_tokens"]
            slot_tokens += mstats["slot_tokens"]
            step_loss += loss.detach().double()
        wrapped.sync_ignored_grads(world)
        if dinfo.distributed:  # every rank sees the same mean loss, so all of them stop together
            dist.all_reduce(step_loss)
            step_loss /= world
        lv = float(step_loss)
        if not math.isfinite(lv):
            metrics.close()
            preempt.restore()
            raise NonFiniteLoss(f"step {step + 1}: the loss is {lv} (mean over {world} rank(s)); stopped before the "
                                f"optimizer step, so the weights and the last checkpoint stay finite (lower train.lr, "
                                f"or check the data and its stats)")
        norm = grad_norm(trainable)  # total over ranks, before clipping
        if cfg.train.clip_grad_norm > 0:
            clip_grads(trainable, cfg.train.clip_grad_norm, norm)
        lr_now = optimizer.param_groups[0]["lr"]
        optimizer.step()
        if ema is not None:
            ema.update(wrapped.model)
        if state_bytes is None:  # gradients and optimizer state both exist now
            state_bytes = _state_bytes(wrapped.model, optimizer)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        step_s = time.perf_counter() - t0
        total += step_s
        wait += step_wait
        real_tokens += step_tokens
        losses.append(lv)
        prep = getattr(tm, "step", None)  # the example policy's input builder counts packed rows
        if len(losses) == 1 and cfg.packing.enabled and prep is not None and prep.packed_rows == prep.packed_samples:
            warn_once("packing-saves-nothing",
                      f"packing saved no rows in the first step ({prep.packed_samples} samples in as many rows, "
                      f"{'rows of ' + str(cfg.packing.max_tokens) + ' tokens' if cfg.packing.max_tokens else 'rows as long as the longest sample'}"
                      f"): the padded layout does the same work here; raise packing.max_tokens, or turn "
                      f"packing.enabled off")
        metrics.log({"step": step, "loss": lv, "loss_hex": lv.hex(), "lr": lr_now, "grad_norm": float(norm),
                     "step_s": step_s, "data_wait_s": step_wait, "tokens_per_s": step_tokens * world / step_s,
                     "peak_mem_mb": peak_memory_mb(device)})
        if plan.heldout and cfg.eval.every and step % cfg.eval.every == 0:  # validation (train/data.py)
            v = vdata.validate(batch_loss, plan.validation_stream(), cfg.eval.batches, wrapped.model)
            val_losses.append({"step": step, **v})
            metrics.log({"step": step, "val_loss": v["val_loss"], "val_loss_hex": v["val_loss"].hex()})
            if dinfo.is_main:
                print(f"step {step}/{cfg.train.steps} val_loss {v['val_loss']:.4f} over {v['val_samples']} held-out "
                      f"samples ({len(plan.heldout)} episodes)", flush=True)
        if dinfo.is_main and (step % cfg.train.log_every == 0 or step == cfg.train.steps):
            print(f"step {step}/{cfg.train.steps} loss {lv:.4f} lr {lr_now:.2e} grad-norm {float(norm):.3g} "
                  f"data-wait {100 * wait / max(total, 1e-9):.0f}%", flush=True)
        saved = False
        if (every and step % every == 0) or (cfg.checkpoint.at_end and step == end):
            save_now()
            saved = True
        if step < end and preempt.should_stop(dinfo.distributed, device):
            if not saved:
                save_now()
            preempted = preempt.received or "a signal on another rank"
            if dinfo.is_main:
                print(f"preempted ({preempted}): stopped after step {step} with a checkpoint in "
                      f"{cfg.checkpoint.dir}; continue with --checkpoint.resume auto", flush=True)
            break
    elapsed = time.perf_counter() - t_start
    preempt.restore()
    metrics.close()
    if samples_log:
        samples_log.close()
    summary = {"steps": step, "world_size": world, "parallel": wrapped.kind, "precision": cfg.train.precision,
               "packed": cfg.packing.enabled, "losses_this_run": len(losses),
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
               "seconds": elapsed, "step_seconds": total, "data_wait_fraction": wait / total if total else 0.0,
               "real_tokens": real_tokens * world, "slot_tokens": slot_tokens * world,
               "padding_fraction": 1 - real_tokens / slot_tokens if slot_tokens else 0.0,
               "tokens_per_s": real_tokens * world / total if total else 0.0,
               "checkpoint_save_seconds": saves, "checkpoint_load_seconds": load_seconds,
               "resumed_from": resumed_from, "model_state_bytes_rank0": state_bytes,
               "peak_rss_mb": _peak_rss_mb(), "peak_mem_mb": peak_memory_mb(device), "global_batch": global_batch,
               "grad_accum": cfg.train.grad_accum, "last_grad_norm": float(norm) if norm is not None else None,
               "ema": ema is not None, "frozen": frozen, "preempted": preempted,
               "val_loss": val_losses[-1]["val_loss"] if val_losses else None, "val_losses": val_losses,
               "heldout_episodes": plan.heldout, "sim_evals": sim_evals}
    if dinfo.is_main:
        Path(cfg.checkpoint.dir).mkdir(parents=True, exist_ok=True)
        (Path(cfg.checkpoint.dir) / "summary.json").write_text(json.dumps(summary, indent=1))
        if losses:
            print(f"done: {step} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
                  f"{summary['tokens_per_s']:.0f} tokens/s, {100 * summary['padding_fraction']:.0f}% padding, "
                  f"{100 * summary['data_wait_fraction']:.0f}% of step time waiting for data", flush=True)
    return summary


def _packing_text(cfg):
    if not cfg.packing.enabled:
        return "padded"
    if cfg.packing.max_tokens == 0:
        return "packed rows as long as the longest sample"
    return f"packed rows of {cfg.packing.max_tokens} tokens"


def resolve_global_batch(cfg: Config, world: int, cmeta, is_main: bool) -> int:
    """The samples per optimizer step over all ranks, and cfg.train.grad_accum set to keep it.

    train.global_batch when set; else, resuming, the checkpoint's (so a world-size change keeps the run's
    global batch); else data.batch_size x train.grad_accum x world size. grad_accum is then
    global_batch / (data.batch_size x world size), which must be a whole number."""
    per_rank = cfg.data.batch_size * world
    target = cfg.train.global_batch
    source = "train.global_batch"
    if not target and cmeta is not None:
        target = (cmeta.get("run") or {}).get("train.global_batch") or 0
        source = "the checkpoint's global batch"
    if not target:
        return per_rank * cfg.train.grad_accum
    if target % per_rank:
        raise ConfigError(f"config key 'train.global_batch': {source} {target} is not a multiple of data.batch_size "
                          f"{cfg.data.batch_size} x world size {world}; change data.batch_size (or set "
                          f"train.global_batch) so that it divides")
    accum = target // per_rank
    if accum != cfg.train.grad_accum:
        if is_main:
            print(f"global batch {target} ({source}) at world size {world}: train.grad_accum "
                  f"{cfg.train.grad_accum} -> {accum}", flush=True)
        cfg.train.grad_accum = accum
    return target


def _local_bytes(t):
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def _state_bytes(model, optimizer):
    """Bytes this rank holds of parameters, gradients and optimizer state (its shards under FSDP2)."""
    total = 0
    for p in model.parameters():
        total += _local_bytes(p.detach())
        if p.grad is not None:
            total += _local_bytes(p.grad)
    for st in optimizer.state.values():
        total += sum(_local_bytes(v) for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


def _peak_rss_mb():
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except ImportError:
        return None


USAGE = """usage: python -m vlafeed.train [--config CONFIG.yaml] [--section.key value ...]

Launch with torchrun (RANK/LOCAL_RANK/WORLD_SIZE) or srun (SLURM_PROCID/SLURM_NTASKS,
MASTER_ADDR/MASTER_PORT); a plain `python -m vlafeed.train` runs one process.
List keys take a YAML list, or comma-separated values on the command line (--train.freeze 'vision.*,text.*').
Keys (section.key default [choices], then what the key does):"""


def usage():
    lines = [USAGE]
    for section, values in Config().to_dict().items():
        for k, v in values.items():
            key = f"{section}.{k}"
            choices = f" [{' | '.join(CHOICES[key])}]" if key in CHOICES else ""
            lines.append(f"  --{key} {v!r}{choices}")
            if key in KEY_HELP:
                lines.append(f"      {KEY_HELP[key]}")
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "export":  # t-models: python -m vlafeed.train export CKPT OUT
        from vlafeed.train.models import export_main
        return export_main(argv[1:])
    if "-h" in argv or "--help" in argv:
        print(usage())
        return 0
    config_path = None
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            print("error: --config needs a file", file=sys.stderr)
            return 2
        config_path = argv[i + 1]
        del argv[i:i + 2]
    try:
        cfg = load_config(config_path, argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        train(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ckpt.CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except NonFiniteLoss as e:
        print(f"error: {e}", file=sys.stderr)
        return 4
    return 0
