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

Exit status of main(): 0 done, 2 a config error (a key, a value out of its
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
from vlafeed.train.config import Config, ConfigError, load_config
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
            layout = packed_layout(lengths, self.cfg.packing.max_tokens, self.cfg.packing.window, self.device)
        else:
            layout = padded_layout(lengths, self.device)
        return images, state, samples, layout, target, valid


def lr_lambda(warmup, total):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return f


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
    dinfo = setup_distributed(cfg.parallel.backend, cfg.parallel.device)
    try:
        return _train(cfg, dinfo, vlafeed)
    finally:
        if dinfo.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def _train(cfg: Config, dinfo, vlafeed) -> dict:
    rank, world, device = dinfo.rank, dinfo.world_size, dinfo.device
    if cfg.train.deterministic:
        torch.use_deterministic_algorithms(True)
    share = max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    torch.set_num_threads(cfg.train.threads or max(1, share - cfg.data.loader_threads))

    meta = vlafeed.LeRobotDataset(cfg.data.dataset).meta
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
    from vlafeed.train import models  # t-models: the model seam (model.source)
    tm = models.build(cfg, meta, device, is_main=dinfo.is_main)
    model = tm.module
    signature = ckpt.model_signature(model)
    identity = ckpt.run_identity(cfg.to_dict())
    p = cfg.parallel
    wrapped = wrap_model(model, dinfo, fsdp=p.fsdp, precision=cfg.train.precision,
                         reshard_after_forward=p.reshard_after_forward, cpu_offload=p.cpu_offload,
                         keep_unsharded_during_accumulation=p.keep_unsharded_during_accumulation,
                         extra_block_types=tm.block_types)
    seed_rank_streams(cfg.train.seed, rank)
    params = list(wrapped.model.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.train.warmup_steps, cfg.train.steps))

    loader_kwargs = dict(mode=cfg.data.mode, batch_size=cfg.data.batch_size, seed=cfg.data.seed, rank=rank,
                         world_size=world, delta_timestamps=tm.delta_timestamps,
                         image_format=tm.image_format, drop_last=True, threads=cfg.data.loader_threads)
    if cfg.data.episodes:  # t-models
        loader_kwargs["episodes"] = list(cfg.data.episodes)
    if cfg.data.image_size:
        loader_kwargs["resize"] = (cfg.data.image_size, cfg.data.image_size)
    loader = vlafeed.Loader(cfg.data.dataset, **loader_kwargs)

    step, restored, resumed_from, data_note, load_seconds = 0, False, None, "", None
    path = resolve_resume(cfg)
    if cfg.checkpoint.resume and cfg.checkpoint.resume != "auto" and path is not None and not path.exists():
        raise ckpt.CheckpointError(f"checkpoint {path} (checkpoint.resume) does not exist")
    if path is not None:
        cmeta = ckpt.read_meta(path)
        ckpt.check_compatible(path, cmeta, signature, identity)
        tl = time.perf_counter()
        step, mine, rank0_loader, cmeta = ckpt.load(path, wrapped.model, optimizer, scheduler, rank=rank,
                                                    world=world)
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
                msg = (f"{path}: saved at world size {cmeta['world_size']}, resuming at {world}: the model and "
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

    if dinfo.is_main:
        kind = {"fsdp": f"FSDP2 ({wrapped.units} units)", "ddp": "DDP", "local": "1 process"}[wrapped.kind]
        print(f"training: {world} rank(s) on {device}, {kind}, precision {cfg.train.precision}, "
              f"micro-batch {cfg.data.batch_size} x {cfg.train.grad_accum} accumulated, "
              f"{'packed rows of ' + str(cfg.packing.max_tokens) + ' tokens' if cfg.packing.enabled else 'padded'}"
              f", {tm.describe}", flush=True)
    log = open(cfg.train.log_file, "a") if (cfg.train.log_file and dinfo.is_main) else None
    samples_log = open(f"{cfg.train.sample_log}.rank{rank}.jsonl", "a") if cfg.train.sample_log else None
    losses, wait, total, real_tokens, slot_tokens, saves, state_bytes = [], 0.0, 0.0, 0, 0, [], None
    accum = cfg.train.grad_accum
    t_start = time.perf_counter()
    every = cfg.checkpoint.every
    end = min(cfg.train.steps, cfg.train.stop_at) if cfg.train.stop_at > 0 else cfg.train.steps
    while step < end:
        t0 = time.perf_counter()
        step_loss = torch.zeros((), dtype=torch.float64)
        for micro in range(accum):
            tw = time.perf_counter()
            batch = batches.next()
            wait += time.perf_counter() - tw
            if samples_log:  # which samples this rank trained on, for exactly-once checks across restarts
                samples_log.write(json.dumps({"step": step + 1, "micro": micro, "epoch": batches.epoch,
                                              "index": batch["index"].tolist(), "time": time.time(),
                                              "world": world, "pid": os.getpid()}) + "\n")
                samples_log.flush()
            with wrapped.micro_batch(micro, accum):
                loss, mstats = tm.loss(wrapped, batch)  # t-models: the model's own loss
                del batch
                loss = loss / accum
                loss.backward()
            real_tokens += mstats["real_tokens"]
            slot_tokens += mstats["slot_tokens"]
            step_loss += loss.detach().double()
        wrapped.sync_ignored_grads(world)
        if dinfo.distributed:  # every rank sees the same mean loss, so all of them stop together
            dist.all_reduce(step_loss)
            step_loss /= world
        lv = float(step_loss)
        if not math.isfinite(lv):
            if log:
                log.close()
            raise NonFiniteLoss(f"step {step + 1}: the loss is {lv} (mean over {world} rank(s)); stopped before the "
                                f"optimizer step, so the weights and the last checkpoint stay finite (lower train.lr, "
                                f"or check the data and its stats)")
        optimizer.step()
        if state_bytes is None:  # gradients and optimizer state both exist now
            state_bytes = _state_bytes(wrapped.model, optimizer)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        total += time.perf_counter() - t0
        losses.append(lv)
        if log:
            log.write(json.dumps({"step": step, "loss": lv, "loss_hex": lv.hex()}) + "\n")
            log.flush()
        if dinfo.is_main and (step % cfg.train.log_every == 0 or step == cfg.train.steps):
            print(f"step {step}/{cfg.train.steps} loss {lv:.4f} lr {scheduler.get_last_lr()[0]:.2e} "
                  f"data-wait {100 * wait / max(total, 1e-9):.0f}%", flush=True)
        if (every and step % every == 0) or (cfg.checkpoint.at_end and step == end):
            ts = time.perf_counter()
            where = ckpt.save(cfg.checkpoint.dir, step, wrapped.model, optimizer, scheduler, rank=rank,
                              world=world, signature=signature, identity=identity,
                              loader_state=loader.state_dict(), rng=rng_state(), keep=cfg.checkpoint.keep,
                              extra={"config": cfg.to_dict()})
            saves.append(time.perf_counter() - ts)
            t0 = time.perf_counter()  # checkpoint time is not step time
    elapsed = time.perf_counter() - t_start
    if log:
        log.close()
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
               "peak_rss_mb": _peak_rss_mb()}
    if dinfo.is_main:
        Path(cfg.checkpoint.dir).mkdir(parents=True, exist_ok=True)
        (Path(cfg.checkpoint.dir) / "summary.json").write_text(json.dumps(summary, indent=1))
        if losses:
            print(f"done: {step} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
                  f"{summary['tokens_per_s']:.0f} tokens/s, {100 * summary['padding_fraction']:.0f}% padding, "
                  f"{100 * summary['data_wait_fraction']:.0f}% of step time waiting for data", flush=True)
    return summary


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
Keys (section.key = default):"""


def usage():
    lines = [USAGE]
    for section, values in Config().to_dict().items():
        for k, v in values.items():
            lines.append(f"  --{section}.{k} {v!r}")
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
