"""vlafeed.train's data-parallel building blocks at world size 2 (gloo, CPU,
torch.multiprocessing): FSDP2 wrapping (FSDPBlocks and a wrapper's
get_fsdp_block_types, 0-dim parameters left out), the precision modes on
FSDP2 and DDP (fp32 master weights and fp32 gradients under amp_bfloat16),
per-rank RNG streams, and gradient accumulation that synchronises only on
the last micro-batch, checked by counting the collectives that run.
"""
import os
import socket
import sys
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from vlafeed.train import FSDPBlock, rank_seed, seed_rank_streams, setup_distributed, wrap_model  # noqa: E402

WORLD = 2


class Block(FSDPBlock):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class ThirdPartyLayer(nn.Module):  # not an FSDPBlock: named by get_fsdp_block_types()
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return self.lin(x)


class Net(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.extra = ThirdPartyLayer(d)
        self.head = nn.Linear(d, 1)
        self.scale = nn.Parameter(torch.tensor(1.5))  # 0-dim

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(self.extra(x)) * self.scale

    def get_fsdp_block_types(self):
        return (ThirdPartyLayer,)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, fn, port, queue):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        dinfo = setup_distributed("gloo", "cpu")
        queue.put((rank, fn(dinfo), None))
    except BaseException:
        queue.put((rank, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn):
    """Runs fn(dinfo) on 2 ranks; returns [result of rank 0, result of rank 1]."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, fn, PORT[0], queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    out = {}
    for _ in range(WORLD):
        rank, result, err = queue.get(timeout=240)
        assert err is None, f"rank {rank} failed:\n{err}"
        out[rank] = result
    for p in procs:
        p.join(60)
    PORT[0] = _free_port()
    return [out[r] for r in range(WORLD)]


PORT = [_free_port()]


def _everything(dinfo):
    return {"wrapping": _wrapping(dinfo), "precision": _precision(dinfo), "rng": _rng(dinfo),
            "fsdp_counts": _count_fsdp(dinfo), "ddp_counts": _count_ddp(dinfo)}


@pytest.fixture(scope="module")
def ranks():
    """One spawn of 2 ranks runs every check below (starting processes is the slow part)."""
    return spawn(_everything)


def make(dinfo, **kw):
    torch.manual_seed(0)
    return wrap_model(Net(), dinfo, **kw)


# ---------------------------------------------------------------------------

def _wrapping(dinfo):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    w = make(dinfo, fsdp=True)
    m = w.model
    return {"units": w.units, "fsdp": {name: isinstance(mod, FSDPModule) for name, mod in
                                       [("root", m), ("block0", m.blocks[0]), ("block1", m.blocks[1]),
                                        ("extra", m.extra), ("head", m.head)]},
            "dtensor": {n: isinstance(p, DTensor) for n, p in m.named_parameters()},
            "ignored": [id(p) == id(m.scale) for p in w.ignored],
            "local_rows": m.blocks[0].lin.weight.to_local().shape[0]}


def test_fsdp2_wraps_blocks_bottom_up_and_leaves_0dim_params_out(ranks):
    r0, r1 = [r['wrapping'] for r in ranks]
    assert r0["units"] == 4  # 2 FSDPBlocks + the wrapper-named layer + the root
    assert r0["fsdp"] == {"root": True, "block0": True, "block1": True, "extra": True, "head": False}
    assert r0["dtensor"]["scale"] is False and r0["ignored"] == [True]
    assert all(v for k, v in r0["dtensor"].items() if k != "scale")
    assert r0["local_rows"] == 4 and r1["local_rows"] == 4  # 8 rows sharded over 2 ranks


def _precision(dinfo):
    out = {}
    for kind in ("fsdp", "ddp"):
        for precision in ("amp_bfloat16", "pure_bf16", "fp32"):
            w = make(dinfo, fsdp=kind == "fsdp", precision=precision)
            seen = {}
            lin = w.model.blocks[0].lin
            h = lin.register_forward_hook(lambda mod, inp, outp: seen.update(inp=inp[0].dtype, out=outp.dtype))
            x = torch.randn(4, 8, dtype=torch.bfloat16 if precision == "pure_bf16" else torch.float32)
            w(x).float().sum().backward()
            h.remove()
            mp_policy = None
            if kind == "fsdp":
                mp_policy = w.model._get_fsdp_state()._mp_policy
                mp_policy = (str(mp_policy.param_dtype), str(mp_policy.reduce_dtype))
            out[f"{kind}/{precision}"] = {
                "param": str(lin.weight.dtype), "grad": str(lin.weight.grad.dtype), "compute": str(seen["out"]),
                "mp": mp_policy}
    return out


def test_precision_modes_keep_fp32_master_weights_under_amp_on_fsdp_and_ddp(ranks):
    r0, _ = [r['precision'] for r in ranks]
    for kind in ("fsdp", "ddp"):
        amp = r0[f"{kind}/amp_bfloat16"]
        assert amp["param"] == "torch.float32" and amp["grad"] == "torch.float32", (kind, amp)
        assert amp["compute"] == "torch.bfloat16", (kind, amp)
        pure = r0[f"{kind}/pure_bf16"]
        assert pure["param"] == "torch.bfloat16" and pure["compute"] == "torch.bfloat16", (kind, pure)
        fp32 = r0[f"{kind}/fp32"]
        assert fp32["param"] == fp32["grad"] == fp32["compute"] == "torch.float32", (kind, fp32)
    # FSDP2: bf16 compute copies, gradients reduced in fp32
    assert r0["fsdp/amp_bfloat16"]["mp"] == ("torch.bfloat16", "torch.float32")


def _rng(dinfo):
    seed_rank_streams(123, dinfo.rank)
    a = torch.rand(4)
    w = make(dinfo, fsdp=True)  # wrapping must not collapse the streams (it seeds nothing)
    seed_rank_streams(123, dinfo.rank)
    b = torch.rand(4)
    import random
    return a.tolist(), b.tolist(), random.random(), rank_seed(123, dinfo.rank)


def test_rank_rng_streams_are_distinct_and_reproducible(ranks):
    (a0, b0, p0, s0), (a1, b1, p1, s1) = [r['rng'] for r in ranks]
    assert a0 != a1 and p0 != p1 and s0 != s1
    assert a0 == b0 and a1 == b1  # same seed and rank: same stream
    assert rank_seed(123, 0) == s0 and rank_seed(124, 0) != s0


# ---------------------------------------------------------------------------
# gradient accumulation: count the collectives

def _count_fsdp(dinfo):
    counts = {}
    originals = {}

    def counting(name):
        fn = getattr(dist, name)
        originals[name] = fn

        def wrapper(*a, **k):
            counts[name] = counts.get(name, 0) + 1
            return fn(*a, **k)
        setattr(dist, name, wrapper)
    for name in ("reduce_scatter_single", "all_gather_single", "all_reduce", "reduce_scatter_tensor",
                 "all_gather_into_tensor"):
        if hasattr(dist, name):
            counting(name)
    try:
        results = {}
        for mode in ("sync_last_only", "sync_every_micro_batch", "keep_unsharded"):
            w = make(dinfo, fsdp=True, keep_unsharded_during_accumulation=mode == "keep_unsharded")
            torch.manual_seed(1 + dinfo.rank)
            xs = [torch.randn(4, 8) for _ in range(4)]
            per_micro = []
            for i, x in enumerate(xs):
                counts.clear()
                if mode == "sync_every_micro_batch":
                    w(x).sum().backward()
                else:
                    with w.micro_batch(i, len(xs)):
                        w(x).sum().backward()
                if i == len(xs) - 1:
                    w.sync_ignored_grads(dinfo.world_size)
                per_micro.append(dict(counts))
            grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
                     for n, p in w.model.named_parameters()}
            results[mode] = (per_micro, {n: g.tolist() for n, g in grads.items()})
        return results
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def _rs(c):
    return c.get("reduce_scatter_single", 0) + c.get("reduce_scatter_tensor", 0)


def _ag(c):
    return c.get("all_gather_single", 0) + c.get("all_gather_into_tensor", 0)


def test_fsdp2_accumulation_reduces_gradients_on_the_last_micro_batch_only(ranks):
    r0, r1 = [r['fsdp_counts'] for r in ranks]
    last, naive = r0["sync_last_only"][0], r0["sync_every_micro_batch"][0]
    # without the context every micro-batch reduce-scatters each of the 4 units
    assert [_rs(c) for c in naive] == [4, 4, 4, 4], naive
    # with it, only the last one does; the earlier ones run no reduction at all
    assert [_rs(c) for c in last] == [0, 0, 0, 4], last
    assert [c.get("all_reduce", 0) for c in last] == [0, 0, 0, 1], last  # the 0-dim parameter's gradient
    # keeping parameters unsharded between micro-batches also saves the re-all-gathers
    keep = r0["keep_unsharded"][0]
    assert [_rs(c) for c in keep] == [0, 0, 0, 4], keep
    assert sum(_ag(c) for c in keep) < sum(_ag(c) for c in last), (keep, last)
    # and the reduced gradients are the same as when every micro-batch synchronises
    g_last, g_naive = r0["sync_last_only"][1], r0["sync_every_micro_batch"][1]
    for n in g_last:
        if n == "scale":
            continue  # the naive run never averages the ignored 0-dim gradient
        assert torch.allclose(torch.tensor(g_last[n]), torch.tensor(g_naive[n]), atol=1e-5), n
    assert r0["sync_last_only"][1] == r1["sync_last_only"][1]  # every rank holds the same averaged gradients


def _count_ddp(dinfo):
    calls = []

    def hook(state, bucket):
        calls.append(state["micro"])
        fut = dist.all_reduce(bucket.buffer().div_(dinfo.world_size), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])
    out = {}
    for mode in ("sync_last_only", "sync_every_micro_batch"):
        w = make(dinfo, fsdp=False)
        state = {"micro": -1}
        w.module.register_comm_hook(state, hook)
        calls.clear()
        torch.manual_seed(1 + dinfo.rank)
        xs = [torch.randn(4, 8) for _ in range(4)]
        for i, x in enumerate(xs):
            state["micro"] = i
            if mode == "sync_every_micro_batch":
                w(x).sum().backward()
            else:
                with w.micro_batch(i, len(xs)):
                    w(x).sum().backward()
        out[mode] = (list(calls), {n: p.grad.tolist() for n, p in w.model.named_parameters()})
    return out


def test_ddp_accumulation_all_reduces_on_the_last_micro_batch_only(ranks):
    r0, r1 = [r['ddp_counts'] for r in ranks]
    last, naive = r0["sync_last_only"][0], r0["sync_every_micro_batch"][0]
    assert last and set(last) == {3}, last
    assert set(naive) == {0, 1, 2, 3} and len(naive) == 4 * len(last), naive
    for n, g in r0["sync_last_only"][1].items():
        assert torch.allclose(torch.tensor(g), torch.tensor(r0["sync_every_micro_batch"][1][n]), atol=1e-5), n
    assert r0["sync_last_only"][1] == r1["sync_last_only"][1]
