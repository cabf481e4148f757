"""Sharded, atomic checkpoints through torch.distributed.checkpoint (DCP).

A checkpoint is a directory <dir>/step_<N>/ holding:
  - the DCP files (.metadata, __<rank>_0.distcp): the model and optimizer
    state from torch.distributed.checkpoint.state_dict.get_state_dict, each
    rank writing its own shards (FSDP2 DTensors) or, for DDP, rank 0's copy;
  - trainer.pt: the LR scheduler's state and the step (rank 0);
  - rank<r>.pt: rank r's RNG states (torch, CUDA, random, numpy) and its
    vlafeed loader state (Loader.state_dict());
  - vlafeed.json: step, world size, the model's fingerprint (parameter names
    and global shapes) and the run's identity (the config keys that fix the
    data order and the model), written last.
Every rank writes into <dir>/.tmp-step_<N>/; after a barrier rank 0 renames
it to step_<N> and then replaces <dir>/latest (a one-line file naming it)
by rename too, so a reader (or a run killed with SIGKILL at any moment)
sees either the previous complete checkpoint or the new one. The directory
must be shared by all ranks (one machine, or a shared filesystem).

Loading reshards: DCP reads each rank's part for the current world size, so
the model and optimizer resume at another world size. The loader state
resumes only where the loader accepts it (see runner.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

META = "vlafeed.json"
FORMAT = 1

# config keys that must be equal for a resume to continue the same run
RUN_KEYS = ("data.dataset", "data.mode", "data.batch_size", "data.seed", "data.chunk", "data.image_size",
            "model.*", "packing.*", "train.grad_accum", "train.seed", "train.precision")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed here; the message names its file."""


def model_signature(model: torch.nn.Module) -> list:
    """[[name, global shape], ...] of the model's state (before or after wrapping: DTensor shapes are global)."""
    return [[k, list(v.shape)] for k, v in model.state_dict().items()]


def fingerprint(signature) -> str:
    return hashlib.sha256(json.dumps(signature).encode()).hexdigest()[:16]


def run_identity(cfg: dict) -> dict:
    out = {}
    for key in RUN_KEYS:
        section, name = key.split(".")
        if name == "*":
            for k, v in cfg[section].items():
                out[f"{section}.{k}"] = v
        else:
            out[key] = cfg[section][name]
    ds = out.get("data.dataset")
    if ds and "://" not in ds:
        out["data.dataset"] = str(Path(ds).resolve())
    return out


def _barrier(world):
    if world > 1:
        dist.barrier()


def latest(ckdir) -> Path | None:
    p = Path(ckdir) / "latest"
    if not p.is_file():
        return None
    return Path(ckdir) / p.read_text().strip()


def save(ckdir, step, model, optimizer, scheduler, *, rank, world, signature, identity, loader_state, rng,
         extra=None, keep=0) -> Path:
    """Writes step_<step> atomically (all ranks call it); returns its path."""
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.state_dict import get_state_dict
    ckdir = Path(ckdir)
    name = f"step_{step:08d}"
    tmp, final = ckdir / f".tmp-{name}", ckdir / name
    if rank == 0:
        ckdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while saving
        tmp.mkdir()
    _barrier(world)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save({"rng": rng, "loader": loader_state}, tmp / f"rank{rank}.pt")
    if rank == 0:
        torch.save({"scheduler": scheduler.state_dict() if scheduler is not None else None, "step": step},
                   tmp / "trainer.pt")
    _barrier(world)
    if rank == 0:
        meta = {"format": FORMAT, "step": step, "world_size": world, "model_fingerprint": fingerprint(signature),
                "model_signature": signature, "run": identity, **(extra or {})}
        (tmp / META).write_text(json.dumps(meta, indent=1))
        for f in tmp.iterdir():  # data on disk before the rename makes it visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        link = ckdir / ".latest.tmp"
        link.write_text(name + "\n")
        os.replace(link, ckdir / "latest")
        if keep > 0:
            done = sorted(p for p in ckdir.glob("step_*") if (p / META).is_file())
            for old in done[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    _barrier(world)
    return final


def read_meta(path) -> dict:
    path = Path(path)
    meta_file = path / META
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist (or is not a directory)")
    if not meta_file.is_file():
        raise CheckpointError(f"{meta_file} is missing: {path} is not a complete vlafeed.train checkpoint")
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{meta_file}: not valid JSON ({e})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_file}: format {meta.get('format')!r}, this version reads {FORMAT}")
    return meta


def check_compatible(path, meta, signature, identity):
    """Raises CheckpointError naming the file and the first difference: another model, or another run."""
    meta_file = Path(path) / META
    if meta["model_fingerprint"] != fingerprint(signature):
        theirs = {k: s for k, s in meta["model_signature"]}
        ours = {k: s for k, s in signature}
        for k in sorted(set(theirs) | set(ours)):
            if theirs.get(k) != ours.get(k):
                raise CheckpointError(f"{meta_file}: the checkpoint is of another model: parameter '{k}' has "
                                      f"shape {theirs.get(k, 'absent')} there, {ours.get(k, 'absent')} here")
        raise CheckpointError(f"{meta_file}: the checkpoint is of another model (parameter order differs)")
    for k in sorted(set(meta["run"]) | set(identity)):
        if meta["run"].get(k) != identity.get(k):
            raise CheckpointError(f"{meta_file}: the checkpoint is from another run: '{k}' is "
                                  f"{meta['run'].get(k)!r} there and {identity.get(k)!r} here")


def load(path, model, optimizer, scheduler, *, rank, world):
    """Loads model + optimizer (resharded by DCP to this world size) and the scheduler; returns
    (step, this rank's {"rng", "loader"} or None when the world size changed, rank 0's loader state)."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    path = Path(path)
    meta = read_meta(path)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        dcp_load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    except Exception as e:  # DCP raises CheckpointException with each rank's traceback
        raise CheckpointError(f"{path}: DCP could not load the model/optimizer state: {e}") from e
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    trainer = torch.load(path / "trainer.pt", weights_only=False)
    if scheduler is not None and trainer["scheduler"] is not None:
        scheduler.load_state_dict(trainer["scheduler"])
    mine = None
    if meta["world_size"] == world:
        mine = torch.load(path / f"rank{rank}.pt", weights_only=False)
    first = torch.load(path / "rank0.pt", weights_only=False)
    return int(trainer["step"]), mine, first["loader"], meta
