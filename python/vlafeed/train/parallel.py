"""Process group set-up, FSDP2 / DDP wrapping, precision modes, gradient
accumulation and per-rank RNG streams, all on PyTorch's own APIs.

- setup_distributed(): rank, local rank and world size from torchrun's
  RANK / LOCAL_RANK / WORLD_SIZE, else SLURM's SLURM_PROCID / SLURM_LOCALID /
  SLURM_NTASKS (MASTER_ADDR / MASTER_PORT must then be set, as srun scripts
  do), else one process. gloo on CPU, NCCL on CUDA.
- wrap_model(): FSDP2 (torch.distributed.fsdp.fully_shard) bottom-up over
  every FSDPBlock, or every module whose type the model's
  get_fsdp_block_types() names (Hugging Face-style models), then the root;
  0-dim parameters are passed as ignored_params (FSDP2 shards on dim 0) and
  their gradients are averaged by sync_ignored_grads(). DDP when FSDP is off.
- Precision: amp_bfloat16 keeps fp32 master weights on both paths (FSDP:
  MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); DDP: fp32
  parameters, fp32 gradients all-reduced) and runs every forward under bf16
  autocast (FSDP2 too, as VLA Foundry does);
  pure_bf16 stores parameters in bf16; fp32 changes nothing.
- micro_batch(): a context for one micro-batch of an accumulated step; only
  the last one synchronises gradients (FSDP: set_requires_gradient_sync /
  set_requires_all_reduce, optionally set_reshard_after_backward; DDP:
  no_sync).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn


class FSDPBlock(nn.Module):
    """Marker base class: every instance becomes its own FSDP2 unit."""


@dataclass
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    distributed: bool
    owns_group: bool = False  # this process group was created here (and is destroyed at the end)

    @property
    def is_main(self):
        return self.rank == 0


def env_rank_world():
    """(rank, local_rank, world_size, launcher) from torchrun's or SLURM's variables."""
    e = os.environ
    if "RANK" in e and "WORLD_SIZE" in e:
        return int(e["RANK"]), int(e.get("LOCAL_RANK", e["RANK"])), int(e["WORLD_SIZE"]), "torchrun"
    if "SLURM_PROCID" in e and "SLURM_NTASKS" in e:
        return int(e["SLURM_PROCID"]), int(e.get("SLURM_LOCALID", 0)), int(e["SLURM_NTASKS"]), "slurm"
    return 0, 0, 1, None


def _generation_store(rank: int, world: int, timeout_s: float = 600.0):
    """A store private to this generation of workers under an elastic torchrun, or None elsewhere.

    torchrun's agent keeps one store (MASTER_ADDR:MASTER_PORT) for every round of an elastic job
    (--nnodes 1:2, --max_restarts): workers of a later round would read the addresses the previous
    round's ranks left there (gloo: "Connection refused" in connectFullMesh). Rank 0 makes a fresh
    token and hands it to each rank against the nonce that rank has just written; the process
    group then lives under that token, which no earlier round used.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or world <= 1:
        return None
    import time
    import uuid
    from datetime import timedelta

    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                         timeout=timedelta(seconds=timeout_s))
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        token = uuid.uuid4().hex
        waiting, welcomed = set(range(1, world)), {}
        while waiting:
            for r in sorted(waiting):
                if base.check([f"vf/ack/{token}/{r}"]):
                    waiting.discard(r)
                elif base.check([f"vf/hello/{r}"]):
                    nonce = base.get(f"vf/hello/{r}").decode()  # may still be an earlier round's: then the
                    if welcomed.get(r) != nonce:                # rank has not written its own yet
                        base.set(f"vf/welcome/{r}/{nonce}", token)
                        welcomed[r] = nonce
            if time.monotonic() > deadline:
                raise RuntimeError(f"ranks {sorted(waiting)} did not join this round's process group")
            time.sleep(0.02)
    else:
        nonce = uuid.uuid4().hex
        base.set(f"vf/hello/{rank}", nonce)
        base.wait([f"vf/welcome/{rank}/{nonce}"], timedelta(seconds=timeout_s))
        token = base.get(f"vf/welcome/{rank}/{nonce}").decode()
        base.set(f"vf/ack/{token}/{rank}", "1")
    return dist.PrefixStore(f"vf/pg/{token}", base)


def setup_distributed(backend: str = "auto", device: str = "auto") -> DistInfo:
    rank, local_rank, world, launcher = env_rank_world()
    want_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("parallel.device is 'cuda' but torch sees no CUDA device")
    dev = torch.device("cuda", local_rank) if want_cuda else torch.device("cpu")
    if want_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        if launcher == "slurm":
            for var in ("MASTER_ADDR", "MASTER_PORT"):
                if var not in os.environ:
                    raise RuntimeError(f"launched by SLURM without {var}: export it in the sbatch script")
            os.environ.setdefault("RANK", str(rank))
            os.environ.setdefault("WORLD_SIZE", str(world))
            os.environ.setdefault("LOCAL_RANK", str(local_rank))
        be = backend if backend != "auto" else ("nccl" if want_cuda else "gloo")
        store = _generation_store(rank, world) if launcher == "torchrun" else None
        if store is not None:
            dist.init_process_group(be, store=store, rank=rank, world_size=world)
        else:
            dist.init_process_group(be, rank=rank, world_size=world)
        owns = True
    elif dist.is_initialized():  # e.g. Ray Train or a test harness set it up
        rank, world = dist.get_rank(), dist.get_world_size()
        owns = False
    else:
        owns = False
    return DistInfo(rank, local_rank, world, dev, dist.is_initialized() and world > 1, owns)


def rank_seed(seed: int, rank: int) -> int:
    """A 63-bit seed for rank `rank`'s RNG stream: a hash, so streams of nearby seeds and ranks do not overlap."""
    digest = hashlib.sha256(f"vlafeed.train:{seed}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seed_rank_streams(seed: int, rank: int):
    """Seeds torch (CPU and CUDA), random and numpy for this rank: distinct per rank, reproducible per run."""
    s = rank_seed(seed, rank)
    torch.manual_seed(s)
    random.seed(s)
    try:
        import numpy as np
        np.random.seed(s % (1 << 32))
    except ImportError:
        pass


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
        name, keys, pos, has_gauss, cached = np.random.get_state()
        # keys as a tensor, not a numpy array: the checkpoint then loads with weights_only=True as is
        state["numpy"] = (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))
    except ImportError:
        pass
    return state


def set_rng_state(state: dict):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np
        name, keys, *rest = state["numpy"]
        if isinstance(keys, torch.Tensor):  # saved by rng_state; older checkpoints hold the uint32 array
            keys = keys.numpy().astype(np.uint32)
        np.random.set_state((name, keys, *rest))


def block_types(model: nn.Module) -> tuple:
    types = [FSDPBlock]
    getter = getattr(model, "get_fsdp_block_types", None)
    if callable(getter):
        types += list(getter())
    return tuple(types)


def zero_dim_params(model: nn.Module) -> set:
    return {p for p in model.parameters() if p.dim() == 0}


class Wrapped:
    """The model as trained: `module` (the FSDP2 or DDP module), the kind, and the 0-dim parameters FSDP2 ignores."""

    def __init__(self, module, kind, precision, device, ignored=(), units=0):
        self.module, self.kind, self.precision, self.device = module, kind, precision, device
        self.ignored = list(ignored)
        self.units = units

    def __call__(self, *a, **k):
        with self.autocast():
            return self.module(*a, **k)

    def autocast(self):
        # every forward under autocast on all paths, FSDP2 included (as VLA Foundry does): FSDP2's
        # MixedPrecisionPolicy casts the parameters, autocast runs the ops (and their inputs) in bf16
        if self.precision == "amp_bfloat16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def model(self) -> nn.Module:
        """The underlying nn.Module (FSDP2 modules are the model itself)."""
        return self.module.module if self.kind == "ddp" else self.module

    @contextlib.contextmanager
    def micro_batch(self, index: int, count: int):
        """Context for micro-batch `index` of `count`: gradients synchronise on the last one only."""
        last = index == count - 1
        if self.kind == "fsdp":
            self.module.set_requires_gradient_sync(last)
            self.module.set_requires_all_reduce(last)
            if self.keep_unsharded:
                self.module.set_reshard_after_backward(last)
            yield
        elif self.kind == "ddp" and not last:
            with self.module.no_sync():
                yield
        else:
            yield

    keep_unsharded = False

    def sync_ignored_grads(self, world_size: int):
        """Averages the gradients of the parameters FSDP2 leaves alone (0-dim) over ranks: one all_reduce."""
        if self.kind != "fsdp" or world_size <= 1 or not self.ignored:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.ignored]
        flat = torch.stack([g.float().reshape(()) for g in grads])
        dist.all_reduce(flat)
        flat /= world_size
        for p, v in zip(self.ignored, flat):
            p.grad = v.to(p.dtype).reshape(p.shape).clone()


def wrap_model(model: nn.Module, dinfo: DistInfo, *, fsdp: bool = True, precision: str = "fp32",
               reshard_after_forward: bool = True, cpu_offload: bool = False,
               keep_unsharded_during_accumulation: bool = False, extra_block_types: tuple = (),
               activation_checkpointing: bool = False, compile: bool = False) -> Wrapped:
    """Moves `model` to the device in the precision's storage dtype and wraps it for data parallelism.

    extra_block_types: module types that become FSDP2 units besides FSDPBlock and get_fsdp_block_types()
    (the units the model seam in models.py names, e.g. a Hugging Face model's _no_split_modules).
    activation_checkpointing / compile apply per block (the same types; the whole model when it names
    none) before fully_shard or DDP."""
    if precision not in ("fp32", "amp_bfloat16", "pure_bf16"):
        raise ValueError(f"precision {precision!r}: expected fp32, amp_bfloat16 or pure_bf16")
    store = torch.bfloat16 if precision == "pure_bf16" else torch.float32
    model = model.to(device=dinfo.device, dtype=store)
    if activation_checkpointing or compile:
        from vlafeed.train.memory import apply_per_block
        apply_per_block(model, block_types(model) + tuple(extra_block_types), activation_checkpointing=activation_checkpointing,
                        compile=compile)
    if not dinfo.distributed:
        return Wrapped(model, "local", precision, dinfo.device)
    if not fsdp:
        ids = [dinfo.device.index] if dinfo.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        return Wrapped(ddp, "ddp", precision, dinfo.device)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    if precision == "amp_bfloat16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    offload = CPUOffloadPolicy(pin_memory=dinfo.device.type == "cuda") if cpu_offload else OffloadPolicy()
    ignored = zero_dim_params(model)
    types = block_types(model) + tuple(extra_block_types)  # extra: the units the model seam names (models.py)
    # bottom-up: children before parents (post-order), so nested blocks become their own units
    blocks = [m for m in _post_order(model) if m is not model and isinstance(m, types)]
    for m in blocks:
        fully_shard(m, reshard_after_forward=reshard_after_forward, mp_policy=mp, offload_policy=offload,
                    ignored_params={p for p in m.parameters() if p in ignored} or None)
    fully_shard(model, reshard_after_forward=reshard_after_forward, mp_policy=mp, offload_policy=offload,
                ignored_params=ignored or None)
    w = Wrapped(model, "fsdp", precision, dinfo.device, ignored=sorted(ignored, key=id), units=len(blocks) + 1)
    name_of = {p: n for n, p in model.named_parameters()}
    w.ignored = sorted(ignored, key=lambda p: name_of.get(p, ""))
    w.keep_unsharded = keep_unsharded_during_accumulation
    return w


def _post_order(module: nn.Module):
    for child in module.children():
        yield from _post_order(child)
    yield module
