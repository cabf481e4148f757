"""vlafeed.train's essentials (issue 19, parts 3 and 4): optimizer choice and
parameter groups, LR schedules, gradient clipping with the total norm over
FSDP2 shards, EMA (saved, resharded and resumed bit-identically), per-step
metrics to JSONL / TensorBoard / wandb, activation checkpointing, compile,
freezing, SIGTERM preemption under torchrun, the global batch kept across a
world-size change, packing rows as long as the longest sample, the config's
KEY_HELP and --help, warnings once per run. CPU only.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

pytest.importorskip("yaml")
from vlafeed.train import config as C  # noqa: E402
from vlafeed.train.config import ConfigError, load_config  # noqa: E402
from vlafeed.train.ema import EMA  # noqa: E402
from vlafeed.train.memory import apply_per_block  # noqa: E402
from vlafeed.train.metrics import MetricsLogger  # noqa: E402
from vlafeed.train.optim import (build_optimizer, clip_grads, freeze, grad_norm, group_names,  # noqa: E402
                                 lr_lambda)
from vlafeed.train.parallel import FSDPBlock  # noqa: E402


# ---------------------------------------------------------------------------
# a small model that is not the example policy

class Block(FSDPBlock):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(torch.tanh(self.lin(x)))


class Net(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.tok = nn.Embedding(11, d)
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.head = nn.Linear(d, 1)
        self.scale = nn.Parameter(torch.tensor(1.5))  # 0-dim: FSDP2 ignores it

    def forward(self, x):
        h = self.tok(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h).squeeze(-1) * self.scale


def _data():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 11, (6, 5), generator=g), torch.randn(6, 5, generator=g)


def _loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


def _cfg(tmp_path, *args):
    return load_config(None, ["--data.dataset", str(tmp_path)] + list(args))


# ---------------------------------------------------------------------------
# config: KEY_HELP, --help, ranges

def test_every_declared_key_has_a_description_and_every_description_a_key():
    declared = set(C.declared_keys())
    assert declared - set(C.KEY_HELP) == set(), "keys without a KEY_HELP description"
    assert set(C.KEY_HELP) - declared == set(), "KEY_HELP entries that are not config keys"
    assert set(C.CHOICES) <= declared
    assert all(isinstance(v, str) and len(v) > 10 for v in C.KEY_HELP.values())


def test_help_prints_default_description_and_choices():
    from vlafeed.train.runner import usage
    text = usage()
    lines = text.splitlines()
    i = lines.index("  --train.schedule 'cosine' [constant | linear | cosine]")
    assert lines[i + 1].strip() == C.KEY_HELP["train.schedule"]
    assert "  --train.optimizer 'adamw' [adamw | adam | sgd]" in lines
    assert "  --packing.max_tokens 0" in lines
    for key in C.declared_keys():
        assert f"--{key} " in text


@pytest.mark.parametrize("args,needle", [
    (["--train.clip_grad_norm", "-1"], "'train.clip_grad_norm': -1.0 is out of range"),
    (["--train.clip_grad_norm", "nan"], "'train.clip_grad_norm': nan is out of range"),
    (["--train.ema_decay", "1.0"], "'train.ema_decay': 1.0 is out of range (allowed: [0, 1))"),
    (["--train.ema_decay", "-0.5"], "'train.ema_decay': -0.5 is out of range"),
    (["--train.schedule", "step"], "'train.schedule' (command line): 'step' is not one of constant, linear, cosine"),
    (["--train.optimizer", "lion"], "'train.optimizer' (command line): 'lion' is not one of adamw, adam, sgd"),
    (["--train.betas", "0.9"], "'train.betas': [0.9]: expected two numbers"),
    (["--train.betas", "0.9,1.5"], "'train.betas': [0.9, 1.5]: expected two numbers"),
    (["--train.betas", "a,b"], "'train.betas' (command line): expected a list of numbers"),
    (["--train.min_lr_ratio", "2"], "'train.min_lr_ratio': 2.0 is out of range"),
    (["--train.global_batch", "-8"], "'train.global_batch': -8 is out of range"),
    (["--packing.max_tokens", "-1"], "'packing.max_tokens': -1 is out of range"),
])
def test_out_of_range_and_unknown_values_are_refused_naming_the_key(tmp_path, args, needle):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, *args)
    assert needle in str(e.value)


def test_list_keys_from_yaml_and_command_line(tmp_path):
    y = tmp_path / "r.yaml"
    y.write_text(f"data: {{dataset: {tmp_path}}}\ntrain: {{freeze: ['tok.*'], betas: [0.8, 0.95]}}\n")
    cfg = load_config(str(y), ["--train.no_decay", "*bias,head.*"])
    assert cfg.train.freeze == ["tok.*"] and cfg.train.betas == [0.8, 0.95]
    assert cfg.train.no_decay == ["*bias", "head.*"]
    y.write_text(f"data: {{dataset: {tmp_path}}}\ntrain: {{freeze: 'tok.*'}}\n")
    with pytest.raises(ConfigError, match="'train.freeze' .*expected a list"):
        load_config(str(y))


# ---------------------------------------------------------------------------
# optimizer, groups, schedules, freezing

def test_param_groups_no_decay_on_norms_biases_small_params_and_embeddings(tmp_path):
    m = Net()
    g = group_names(m, C.NO_DECAY_DEFAULT)
    assert g["decay"] == ["blocks.0.lin.weight", "blocks.1.lin.weight", "head.weight"]
    assert set(g["no_decay"]) == {"tok.weight", "scale", "head.bias", "blocks.0.lin.bias", "blocks.0.norm.weight",
                                  "blocks.0.norm.bias", "blocks.1.lin.bias", "blocks.1.norm.weight",
                                  "blocks.1.norm.bias"}
    cfg = _cfg(tmp_path, "--train.weight_decay", "0.5", "--train.no_decay", "head.*")
    opt = build_optimizer(m, cfg.train)
    assert isinstance(opt, torch.optim.AdamW)
    decay, plain = opt.param_groups
    assert decay["weight_decay"] == 0.5 and plain["weight_decay"] == 0.0
    assert {id(p) for p in plain["params"]} == {id(m.head.weight), id(m.head.bias), id(m.tok.weight), id(m.scale)} | \
        {id(p) for b in m.blocks for p in (b.lin.bias, b.norm.weight, b.norm.bias)}
    # weight decay really spares the no-decay group: with a zero gradient only decayed weights move
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    moved = {n for n, p in m.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"blocks.0.lin.weight", "blocks.1.lin.weight"}


def test_optimizer_choices(tmp_path):
    m = Net()
    o = build_optimizer(m, _cfg(tmp_path, "--train.optimizer", "sgd", "--train.momentum", "0.5").train)
    assert isinstance(o, torch.optim.SGD) and o.param_groups[0]["momentum"] == 0.5
    o = build_optimizer(m, _cfg(tmp_path, "--train.optimizer", "adam", "--train.betas", "0.8,0.9").train)
    assert type(o) is torch.optim.Adam and o.param_groups[0]["betas"] == (0.8, 0.9)


def test_schedules():
    import math
    old = lambda s: (s + 1) / 10 if s < 10 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - 10) / 90)))  # noqa: E731
    cos = lr_lambda(10, 100)  # the default: what earlier versions did
    assert all(cos(s) == old(s) for s in range(120))
    lin = lr_lambda(0, 100, "linear", 0.0)
    assert lin(0) == 1.0 and lin(50) == 0.5 and lin(100) == 0.0 and lin(150) == 0.0
    const = lr_lambda(4, 100, "constant")
    assert [const(s) for s in (0, 3, 4, 99)] == [0.25, 1.0, 1.0, 1.0]
    assert lr_lambda(0, 10, "cosine", 0.2)(10) == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="train.schedule"):
        lr_lambda(0, 10, "exp")


def test_freeze_by_pattern_and_its_errors(tmp_path):
    m = Net()
    names = freeze(m, ["tok.*", "blocks.0.*"])
    assert names == ["tok.weight", "blocks.0.lin.weight", "blocks.0.lin.bias", "blocks.0.norm.weight",
                     "blocks.0.norm.bias"]
    opt = build_optimizer(m, _cfg(tmp_path).train)
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(p) for p in m.parameters() if p.requires_grad} and id(m.tok.weight) not in in_opt
    with pytest.raises(ConfigError, match=r"'train.freeze': pattern 'encoder\.\*' matches no parameter of Net"):
        freeze(Net(), ["encoder.*"])
    with pytest.raises(ConfigError, match="freezes every parameter"):
        freeze(Net(), ["*"])


def test_grad_norm_and_clipping_match_torch_in_one_process():
    m = Net()
    x, y = _data()
    _loss(m, x, y).backward()
    ours = grad_norm(list(m.parameters()))
    ref = torch.nn.utils.clip_grad_norm_(m.parameters(), float("inf"))
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)
    clip_grads(list(m.parameters()), 0.25 * float(ours), ours)
    assert grad_norm(list(m.parameters())).item() == pytest.approx(0.25 * float(ours), rel=1e-4)
    before = [p.grad.clone() for p in m.parameters()]
    clip_grads(list(m.parameters()), 1e9, grad_norm(list(m.parameters())))  # under the limit: unchanged
    assert all(torch.equal(a, p.grad) for a, p in zip(before, m.parameters()))


def test_ema_update_apply_and_state():
    m = Net()
    ema = EMA(m, 0.75)
    start = {n: p.detach().clone() for n, p in m.named_parameters()}
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    ema.update(m)
    for n, p in m.named_parameters():
        assert torch.allclose(ema.shadow[n], 0.75 * start[n] + 0.25 * p.detach())
    state = ema.ema_state(m)
    assert set(state) == set(m.state_dict()) and torch.equal(state["head.weight"], ema.shadow["head.weight"])
    trained = m.head.weight.detach().clone()
    with ema.applied(m):
        assert torch.equal(m.head.weight, ema.shadow["head.weight"])
    assert torch.equal(m.head.weight, trained)
    with pytest.raises(ConfigError, match="train.ema_decay"):
        EMA(m, 1.0)


def test_activation_checkpointing_keeps_names_and_gradients():
    x, y = _data()
    torch.manual_seed(0)
    a = Net()
    torch.manual_seed(0)
    b = Net()
    blocks = apply_per_block(b, (FSDPBlock,), activation_checkpointing=True)
    assert blocks == [b.blocks[0], b.blocks[1]]
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in b.named_parameters()]
    _loss(a, x, y).backward()
    lb = _loss(b, x, y)
    assert lb.grad_fn is not None
    lb.backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa.grad, pb.grad), n
    # really recomputed: the block's forward runs again in backward
    calls = []
    b.blocks[0].lin.register_forward_hook(lambda *a: calls.append(1))
    _loss(b, x, y).backward()
    assert len(calls) == 2


def test_compile_per_block_matches_eager():
    x, y = _data()
    torch.manual_seed(0)
    a = Net()
    torch.manual_seed(0)
    b = Net()
    apply_per_block(b, (FSDPBlock,), compile=True)
    try:
        lb = _loss(b, x, y)
        lb.backward()
    except Exception as e:  # inductor needs a working C++ compiler on CPU
        pytest.skip(f"torch.compile cannot compile here: {type(e).__name__}: {str(e)[:200]}")
    la = _loss(a, x, y)
    la.backward()
    assert lb.item() == pytest.approx(la.item(), rel=1e-5)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, rtol=1e-4, atol=1e-6), n


def test_flex_attention_is_refused_on_cpu_with_a_clear_message():
    from vlafeed.train.policy import resolve_attention
    with pytest.raises(ConfigError, match="flex needs a CUDA device.*no backward on CPU"):
        resolve_attention("flex", "cpu")
    assert resolve_attention("sdpa", "cpu") == "sdpa"


def test_cublas_workspace_is_set_when_deterministic_and_cuda_may_run(tmp_path, monkeypatch):
    from vlafeed.train.runner import set_cublas_workspace
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    set_cublas_workspace(_cfg(tmp_path, "--parallel.device", "cpu"))
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    set_cublas_workspace(_cfg(tmp_path, "--train.deterministic", "false"))
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    set_cublas_workspace(_cfg(tmp_path))
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    set_cublas_workspace(_cfg(tmp_path))
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_global_batch_is_kept_by_recomputing_grad_accum(tmp_path, capsys):
    from vlafeed.train.runner import resolve_global_batch
    cfg = _cfg(tmp_path, "--data.batch_size", "4", "--train.grad_accum", "2")
    assert resolve_global_batch(cfg, 2, None, True) == 16 and cfg.train.grad_accum == 2
    saved = {"run": {"train.global_batch": 16}}
    cfg = _cfg(tmp_path, "--data.batch_size", "4", "--train.grad_accum", "2")
    assert resolve_global_batch(cfg, 1, saved, True) == 16 and cfg.train.grad_accum == 4
    assert "global batch 16 (the checkpoint's global batch) at world size 1: train.grad_accum 2 -> 4" in \
        capsys.readouterr().out
    cfg = _cfg(tmp_path, "--data.batch_size", "8", "--train.global_batch", "32")
    assert resolve_global_batch(cfg, 2, saved, False) == 32 and cfg.train.grad_accum == 2
    cfg = _cfg(tmp_path, "--data.batch_size", "3")
    with pytest.raises(ConfigError, match="checkpoint's global batch 16 is not a multiple of data.batch_size 3 x "
                                          "world size 2"):
        resolve_global_batch(cfg, 2, saved, True)


def test_warnings_once_and_on_rank_0_only(capsys):
    from vlafeed.train import metrics
    metrics.set_main(False)
    metrics.warn_once("t-a", "from rank 1")
    metrics.set_main(True)
    metrics.warn_once("t-b", "from rank 0")
    metrics.warn_once("t-b", "from rank 0")
    err = capsys.readouterr().err
    assert "from rank 1" not in err and err.count("warning: from rank 0") == 1


def test_metrics_sinks(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, "--train.log_file", str(tmp_path / "m.jsonl"), "--train.tensorboard", str(tmp_path / "tb"))
    rec = {"step": 1, "loss": 0.5, "loss_hex": (0.5).hex(), "lr": 1e-3, "grad_norm": 2.0}
    try:
        import tensorboard  # noqa: F401
        have_tb = True
    except ImportError:
        have_tb = False
    if have_tb:
        log = MetricsLogger(cfg.train, True)
        log.log(rec)
        log.close()
        assert json.loads((tmp_path / "m.jsonl").read_text()) == rec
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        acc = EventAccumulator(str(tmp_path / "tb"))
        acc.Reload()
        assert set(acc.Tags()["scalars"]) == {"train/loss", "train/lr", "train/grad_norm"}
        assert [(e.step, e.value) for e in acc.Scalars("train/grad_norm")] == [(1, 2.0)]
        MetricsLogger(cfg.train, False).log(rec)  # other ranks write nothing
        assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 1
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ConfigError, match="'train.tensorboard': TensorBoard logging needs the tensorboard package"):
        MetricsLogger(cfg.train, True)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match="'train.wandb_project': logging to Weights & Biases needs the wandb"):
        MetricsLogger(_cfg(tmp_path, "--train.wandb_project", "p").train, True)


def test_wandb_offline_run_is_written(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLogger(_cfg(tmp_path, "--train.wandb_project", "vf-test").train, True, {"x": 1})
    log.log({"step": 1, "loss": 0.25, "grad_norm": 1.0})
    log.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and list(runs[0].glob("*.wandb"))


# ---------------------------------------------------------------------------
# FSDP2 at 2 ranks: the total norm over shards, clipping, EMA on DTensors

class AutocastProbe(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen = None

    def forward(self, x):
        self.seen = torch.is_autocast_enabled(x.device.type)
        return self.lin(x)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, queue):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        from vlafeed.train.parallel import setup_distributed, wrap_model
        dinfo = setup_distributed("gloo", "cpu")
        torch.manual_seed(0)
        w = wrap_model(Net(), dinfo, fsdp=True)
        x, y = _data()  # the same batch on both ranks: averaged gradients equal one process's
        with w.micro_batch(0, 1):
            _loss(w, x, y).backward()
        w.sync_ignored_grads(2)
        params = list(w.model.parameters())
        norm = float(grad_norm(params))
        clip_grads(params, norm / 4, torch.tensor(norm))
        clipped = float(grad_norm(params))
        ema = EMA(w.model, 0.5)
        with torch.no_grad():
            for p in params:
                p.add_(2.0)
        ema.update(w.model)
        state = ema.ema_state(w.model)
        probe = wrap_model(AutocastProbe(), dinfo, fsdp=True, precision="amp_bfloat16")
        probe(torch.randn(2, 4))
        queue.put((rank, {"autocast": probe.model.seen, "norm": norm, "clipped": clipped, "ema": {k: v.tolist() for k, v in state.items()},
                          "sharded": type(params[1]).__name__}, None))
    except BaseException:
        queue.put((rank, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_fsdp2_grad_norm_is_the_whole_models_ema_shards_and_amp_autocasts():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    out = {}
    for _ in range(2):
        rank, res, err = queue.get(timeout=240)
        assert err is None, f"rank {rank}:\n{err}"
        out[rank] = res
    for p in procs:
        p.join(60)
    torch.manual_seed(0)
    ref = Net()
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    x, y = _data()
    _loss(ref, x, y).backward()
    full = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), float("inf")))
    for r in (0, 1):
        assert out[r]["sharded"] == "DTensor"
        assert out[r]["autocast"] is True  # amp_bfloat16 under FSDP2: every forward under autocast
        assert out[r]["norm"] == pytest.approx(full, rel=1e-5)  # not a shard's norm
        assert out[r]["clipped"] == pytest.approx(full / 4, rel=1e-4)
        for k, v in out[r]["ema"].items():
            v = torch.tensor(v)
            assert v.shape == start[k].shape and torch.allclose(v, start[k] + 1.0), k


# ---------------------------------------------------------------------------
# end to end: python -m vlafeed.train under torchrun (2 ranks, FSDP2, gloo)

STEPS = 8
CONFIG = f"""
data:
  batch_size: 4
  chunk: 5
model:
  d_model: 32
  layers: 2
  max_text_tokens: 32
  camera_dropout: 0.3
packing:
  enabled: true
train:
  steps: {STEPS}
  grad_accum: 2
  warmup_steps: 3
  log_every: 100
  clip_grad_norm: 0.5
  ema_decay: 0.9
  schedule: linear
  optimizer: adamw
checkpoint:
  every: 4
"""


@pytest.fixture(scope="module")
def setup(cli, tmp_path_factory):
    base = tmp_path_factory.mktemp("train_essentials")
    root = base / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "4", "--cameras", "2", "--codec", "h264",
                        "--size", "64x64", "--min-length", "26", "--max-length", "30", "--seed", "9", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    cfg = base / "run.yaml"
    cfg.write_text(CONFIG.replace("data:\n", f"data:\n  dataset: {root}\n"))
    return base, cfg


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


def command(cfg, args, procs=2):
    if procs > 1:
        torchrun = shutil.which("torchrun")
        assert torchrun, "torchrun is not on PATH"
        return [torchrun, "--standalone", f"--nproc_per_node={procs}", "-m", "vlafeed.train", "--config",
                str(cfg)] + args
    return [sys.executable, "-m", "vlafeed.train", "--config", str(cfg)] + args


def run(cfg, args, procs=2, expect=0):
    r = subprocess.run(command(cfg, args, procs), env=env(), capture_output=True, text=True, timeout=400)
    assert r.returncode == expect, f"rc {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def records(path):
    out = {}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = rec
    return out


def full_state(ckpt_dir):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = Path(str(ckpt_dir) + ".pt")
    dcp_to_torch_save(str(ckpt_dir), str(out))
    return torch.load(out, weights_only=False)


def flat(x, prefix="", out=None):
    out = {} if out is None else out
    if isinstance(x, dict):
        for k, v in x.items():
            flat(v, f"{prefix}.{k}", out)
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            flat(v, f"{prefix}.{i}", out)
    else:
        out[prefix] = x
    return out


@pytest.fixture(scope="module")
def uninterrupted(setup):
    base, cfg = setup
    ck = base / "ckA"
    r = run(cfg, ["--checkpoint.dir", str(ck), "--train.log_file", str(base / "A.jsonl"),
                  "--train.tensorboard", str(base / "tb")])
    return ck, records(base / "A.jsonl"), r


def test_metrics_every_step_rank_0_only_and_warnings_once(setup, uninterrupted):
    base, _ = setup
    ck, recs, r = uninterrupted
    assert sorted(recs) == list(range(1, STEPS + 1))  # one line per step: rank 0 only
    for s, rec in recs.items():
        assert {"loss", "loss_hex", "lr", "grad_norm", "step_s", "data_wait_s", "tokens_per_s",
                "peak_mem_mb"} <= set(rec), rec
        assert float.fromhex(rec["loss_hex"]) == rec["loss"]
        assert rec["grad_norm"] > 0 and rec["step_s"] > 0 and rec["tokens_per_s"] > 0 and rec["peak_mem_mb"] > 0
    # linear schedule: warm-up 1/3, 2/3, 1, then down towards 10% of 1e-3
    assert [recs[s]["lr"] for s in (1, 2, 3)] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3])
    assert recs[STEPS]["lr"] < recs[5]["lr"] < recs[4]["lr"]
    assert "clip 0.5, EMA 0.9" in r.stdout and "packed rows as long as the longest sample" in r.stdout
    assert r.stderr.count("warning: packing saved no rows") <= 1  # once, by rank 0 only
    assert r.stderr.count("LoaderWarning") <= 1  # Python warnings too: rank 1 is silent
    assert list((base / "tb").glob("events.out.tfevents.*"))
    summary = json.loads((ck / "summary.json").read_text())
    assert summary["ema"] is True and summary["global_batch"] == 16 and summary["last_grad_norm"] > 0
    st = flat(full_state(ck / f"step_{STEPS:08d}"))
    ema_keys = [k for k in st if k.startswith(".ema.")]
    assert ema_keys and all(k.replace(".ema.", ".model.", 1) in st for k in ema_keys)
    k = ema_keys[0]
    assert not torch.equal(st[k], st[k.replace(".ema.", ".model.", 1)])  # an average, not a copy


def test_sigterm_saves_and_resume_is_bit_identical_with_ema(setup, uninterrupted):
    base, cfg = setup
    ckA, recsA, _ = uninterrupted
    ck = base / "ckB"
    log, samples = base / "B.jsonl", base / "B.samples"
    p = subprocess.Popen(command(cfg, ["--checkpoint.dir", str(ck), "--train.log_file", str(log),
                                       "--train.sample_log", str(samples)]),
                         env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank1 = Path(f"{samples}.rank1.jsonl")
    deadline = time.monotonic() + 300
    pid = None
    while time.monotonic() < deadline and p.poll() is None:
        if rank1.is_file():
            lines = [json.loads(x) for x in rank1.read_text().splitlines() if x.strip()]
            if lines and lines[-1]["step"] >= 2:
                pid = lines[-1]["pid"]
                break
        time.sleep(0.02)
    assert pid is not None, "the run ended before step 2"
    os.kill(pid, signal.SIGTERM)  # one rank only: the other stops at the same step through the all_reduce
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    assert "preempted (" in out and "continue with --checkpoint.resume auto" in out, out
    stopped = max(records(log))
    assert 2 <= stopped < STEPS
    assert (ck / f"step_{stopped:08d}" / "vlafeed.json").is_file()
    assert json.loads((ck / "summary.json").read_text())["preempted"]
    # resumed with activation checkpointing on: recomputation changes no bit of the gradients
    r = run(cfg, ["--checkpoint.dir", str(ck), "--train.log_file", str(log), "--checkpoint.resume", "auto",
                  "--train.activation_checkpointing", "true"])
    assert "activation checkpointing" in r.stdout
    recsB = records(log)
    assert {s: r["loss_hex"] for s, r in recsB.items()} == {s: r["loss_hex"] for s, r in recsA.items()}
    a, b = flat(full_state(ckA / f"step_{STEPS:08d}")), flat(full_state(ck / f"step_{STEPS:08d}"))
    assert a.keys() == b.keys() and any(k.startswith(".ema.") for k in a)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), f"{k} differs"


def test_world_size_change_keeps_the_global_batch(setup, uninterrupted, tmp_path):
    base, cfg = setup
    ckA, _, _ = uninterrupted
    ck = tmp_path / "ck"
    shutil.copytree(ckA / "step_00000004", ck / "step_00000004")
    r = run(cfg, ["--checkpoint.dir", str(ck), "--checkpoint.resume", str(ck / "step_00000004"), "--train.steps",
                  "5", "--train.stop_at", "5", "--checkpoint.elastic_data", "restart_epoch",
                  "--train.activation_checkpointing", "true"], procs=1)
    assert "global batch 16 (the checkpoint's global batch) at world size 1: train.grad_accum 2 -> 4" in r.stdout
    s = json.loads((ck / "summary.json").read_text())
    assert s["grad_accum"] == 4 and s["global_batch"] == 16 and s["steps"] == 5
    # a global batch the new world size cannot keep is refused, naming the key
    r = run(cfg, ["--checkpoint.dir", str(ck), "--checkpoint.resume", str(ck / "step_00000004"),
                  "--data.batch_size", "3"], procs=1, expect=2)
    assert "'train.global_batch'" in r.stderr and "not a multiple of data.batch_size 3" in r.stderr
