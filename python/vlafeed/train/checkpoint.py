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

Loading never runs code from the checkpoint: a checkpoint directory may come
from elsewhere (a shared filesystem, a download), and a pickle can call any
function while it is read. trainer.pt and rank<r>.pt are read with
torch.load(weights_only=True) (tensors and plain data; the numpy RNG array of
older checkpoints through a short allowlist of numpy's array reconstruction);
DCP's .metadata is unpickled with an allowlist of DCP's own metadata classes,
and its non-tensor items (the optimizer's param_groups) are checked
weights-only before DCP reads them. Anything else raises CheckpointError
naming the file, before the object it would build exists.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

META = "vlafeed.json"
FORMAT = 1

# config keys that must be equal for a resume to continue the same run
# (data.batch_size and train.grad_accum may change when train.global_batch, the samples per optimizer step
# over all ranks, stays the same: the runner puts the run's effective global batch there)
RUN_KEYS = ("data.dataset", "data.mode", "data.seed", "data.chunk", "data.image_size",
            "model.*", "packing.*", "train.global_batch", "train.seed", "train.precision",
            "data.rename", "data.episodes",
            # data windows, augmentation, mixing and the held-out split (train/data.py)
            "data.obs_steps", "data.delta_timestamps", "data.augment", "data.mix", "data.mix_window",
            "eval.episodes", "eval.fraction")


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


def _default_identity() -> dict:
    """The run identity of the default config (keys newer than a checkpoint compare against these)."""
    from vlafeed.train.config import Config
    out = run_identity(Config().to_dict())
    out.pop("data.dataset", None)
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
         extra=None, keep=0, extra_state=None) -> Path:
    """Writes step_<step> atomically (all ranks call it); returns its path. extra_state: more DCP items
    ({"ema": {name: tensor}}), saved sharded beside the model and the optimizer."""
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
    dcp_save({"model": model_sd, "optim": optim_sd, **(extra_state or {})}, checkpoint_id=str(tmp))
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
    defaults = _default_identity()
    for k in sorted(set(meta["run"]) | set(identity)):
        if k not in meta["run"] and k in defaults and identity.get(k) == defaults[k]:
            continue  # a key added after the checkpoint was written, at its default here: the same run
        if meta["run"].get(k) != identity.get(k):
            raise CheckpointError(f"{meta_file}: the checkpoint is from another run: '{k}' is "
                                  f"{meta['run'].get(k)!r} there and {identity.get(k)!r} here")


# ---------------------------------------------------------------------------
# reading files without running code

def _numpy_array_globals() -> list:
    """What np.random.get_state()'s uint32 array needs to unpickle (checkpoints written before the
    RNG state was saved as a tensor hold it): array reconstruction, not arbitrary callables."""
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype]
    allowed += [type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64)]  # numpy 2's dtype classes
    return allowed


def _refusal(file, error) -> CheckpointError:
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    what = f" (it calls {found.group(1)})" if found else ""
    return CheckpointError(f"{file}: refused: it holds objects other than tensors and plain data{what}; checkpoints "
                           f"are read with torch.load(weights_only=True) so that a planted pickle cannot run code")


def load_plain(file):
    """torch.load(file, weights_only=True): tensors and plain data only. CheckpointError naming the
    file when it holds anything else, is missing or is not a torch file."""
    file = Path(file)
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: the checkpoint is incomplete")
    allowed = _numpy_array_globals()
    try:
        if allowed and hasattr(torch.serialization, "safe_globals"):
            with torch.serialization.safe_globals(allowed):
                return torch.load(file, map_location="cpu", weights_only=True)
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise _refusal(file, e) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{file}: not a readable torch file ({e})") from None


def _dcp_metadata_classes() -> dict:
    """{(module, name): object} that DCP's .metadata pickle may name."""
    import pathlib

    from torch.distributed.checkpoint import filesystem, metadata
    allowed = {}
    for name in dir(metadata):
        obj = getattr(metadata, name)
        if isinstance(obj, type) and obj.__module__ == metadata.__name__:
            allowed[(metadata.__name__, name)] = obj
    if hasattr(filesystem, "_StorageInfo"):
        allowed[(filesystem.__name__, "_StorageInfo")] = filesystem._StorageInfo
    allowed[("torch", "Size")] = torch.Size
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    if hasattr(torch.serialization, "_get_layout"):
        allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    for name in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
        allowed[("pathlib", name)] = getattr(pathlib, name)
    import collections
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    allowed[("builtins", "set")] = set
    allowed[("builtins", "frozenset")] = frozenset
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    allowed: dict = {}

    def find_class(self, module, name):
        obj = self.allowed.get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(f"GLOBAL {module}.{name} is not a DCP metadata class")
        return obj


def _safe_dcp_reader(path):
    """A FileSystemReader whose .metadata is unpickled with the allowlist above."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            rank = kwargs.get("rank")
            if hasattr(self, "_get_metadata_path"):
                file = Path(self._get_metadata_path(rank))
            else:
                file = Path(self.path) / ".metadata"
            unpickler_type = type("Unpickler", (_MetadataUnpickler,), {"allowed": _dcp_metadata_classes()})
            try:
                with open(file, "rb") as f:
                    meta = unpickler_type(f).load()
            except pickle.UnpicklingError as e:
                raise _refusal(file, e) from None
            except (OSError, EOFError, ValueError, TypeError, AttributeError) as e:
                raise CheckpointError(f"{file}: not a readable DCP metadata file ({e})") from None
            if getattr(meta, "storage_meta", None) is None:
                meta.storage_meta = StorageMeta()
            meta.storage_meta.load_id = self.load_id
            return meta

    return Reader(str(path))


def _safe_dcp_planner(path):
    """A DefaultLoadPlanner that reads DCP's non-tensor items only after they load weights-only."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            data = value.read()
            try:
                torch.load(io.BytesIO(data), weights_only=True)
            except pickle.UnpicklingError as e:
                raise _refusal(f"{path} (item {read_item.dest_index.fqn})", e) from None
            super().load_bytes(read_item, io.BytesIO(data))  # checked above: plain data only

    return Planner()


def load(path, model, optimizer, scheduler, *, rank, world, extra_state=None):
    """Loads model + optimizer (resharded by DCP to this world size) and the scheduler; returns
    (step, this rank's {"rng", "loader"} or None when the world size changed, rank 0's loader state).
    Nothing in the checkpoint can run code (see the module's docstring)."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    path = Path(path)
    meta = read_meta(path)
    # the small files first: a refused one stops the resume before DCP reads anything
    trainer = load_plain(path / "trainer.pt")
    mine = None
    if meta["world_size"] == world:
        mine = _rank_state(load_plain(path / f"rank{rank}.pt"), path / f"rank{rank}.pt")
    first = _rank_state(load_plain(path / "rank0.pt"), path / "rank0.pt")
    if not isinstance(trainer, dict) or not isinstance(trainer.get("step"), int) or "scheduler" not in trainer:
        raise CheckpointError(f"{path / 'trainer.pt'}: not a vlafeed.train trainer state (no integer 'step')")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        dcp_load({"model": model_sd, "optim": optim_sd, **(extra_state or {})}, storage_reader=_safe_dcp_reader(path),
                 planner=_safe_dcp_planner(path))
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException (a BaseException) holds each rank's
        refused = _refusal_inside(e)
        if refused is not None:
            raise refused from None
        raise CheckpointError(f"{path}: DCP could not load the model/optimizer state: {e}") from e
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    if scheduler is not None and trainer["scheduler"] is not None:
        scheduler.load_state_dict(trainer["scheduler"])
    return trainer["step"], mine, first["loader"], meta


def _rank_state(state, file):
    if not isinstance(state, dict) or "rng" not in state or "loader" not in state:
        raise CheckpointError(f"{file}: not a vlafeed.train rank state (no 'rng' and 'loader')")
    return state


def _refusal_inside(error):
    """The CheckpointError a DCP reader or planner raised, when DCP wrapped it (it collects the
    exceptions of every rank into one CheckpointException)."""
    seen = set()
    stack = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, CheckpointError):
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            for v in failures.values():
                stack.append(v[0] if isinstance(v, tuple) else v)
        stack += [e.__cause__, e.__context__]
    return None
