"""python -m vlafeed.train end to end under torchrun at world size 2 (FSDP2,
gloo, CPU, fp32, packing on, 2 micro-batches per step), and its bad input.

Exact resume: a run stopped at step 5 (train.stop_at) and a run killed with
SIGKILL after its first checkpoints, each resumed from the checkpoint they
left, produce bit-identical per-step losses and bit-identical final model and
optimizer state to an uninterrupted run, across an epoch boundary. The
sharded checkpoint loads into one process (DCP reshards). Bad input fails
before any step with the key or the file named: unknown config keys, wrong
types, a checkpoint of another model or another run, a world size the
loader state cannot continue at.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

pytest.importorskip("yaml")
import vlafeed  # noqa: E402
from vlafeed.train.config import ConfigError, load_config  # noqa: E402

STEPS = 10
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
  max_tokens: 160
train:
  steps: {STEPS}
  grad_accum: 2
  precision: fp32
  warmup_steps: 3
  log_every: 4
checkpoint:
  every: 2
"""


@pytest.fixture(scope="module")
def setup(cli, tmp_path_factory):
    """4 episodes of 26..30 frames, 2 cameras: ~110 samples, an epoch of ~6 steps at 2 ranks x 4 x 2 per step."""
    base = tmp_path_factory.mktemp("train_harness")
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
    torchrun = shutil.which("torchrun")
    if procs > 1:
        assert torchrun, "torchrun is not on PATH"
        return [torchrun, "--standalone", f"--nproc_per_node={procs}", "-m", "vlafeed.train", "--config", str(cfg)] \
            + args
    return [sys.executable, "-m", "vlafeed.train", "--config", str(cfg)] + args


def train(cfg, args, procs=2, expect=0):
    r = subprocess.run(command(cfg, args, procs), env=env(), capture_output=True, text=True, timeout=400)
    assert r.returncode == expect, f"rc {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def losses(path):
    out = {}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = rec["loss_hex"]
    return out


def full_state(ckpt_dir):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = Path(str(ckpt_dir) + ".pt")
    dcp_to_torch_save(str(ckpt_dir), str(out))
    return torch.load(out, weights_only=False)


def assert_same_state(a, b):
    flat_a, flat_b = {}, {}

    def flatten(prefix, x, out):
        if isinstance(x, dict):
            for k, v in x.items():
                flatten(f"{prefix}.{k}", v, out)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                flatten(f"{prefix}.{i}", v, out)
        else:
            out[prefix] = x
    flatten("", a, flat_a)
    flatten("", b, flat_b)
    assert flat_a.keys() == flat_b.keys()
    tensors = 0
    for k in flat_a:
        if isinstance(flat_a[k], torch.Tensor):
            tensors += 1
            assert torch.equal(flat_a[k], flat_b[k]), f"{k} differs"
        else:
            assert flat_a[k] == flat_b[k], k
    assert tensors > 20


@pytest.fixture(scope="module")
def uninterrupted(setup):
    base, cfg = setup
    ck = base / "ckA"
    r = train(cfg, ["--checkpoint.dir", str(ck), "--train.log_file", str(base / "A.jsonl")])
    assert "FSDP2 (" in r.stdout and "packed rows" in r.stdout
    return ck, losses(base / "A.jsonl")


def test_uninterrupted_run_trains_and_checkpoints(uninterrupted):
    ck, a = uninterrupted
    assert sorted(a) == list(range(1, STEPS + 1))
    summary = json.loads((ck / "summary.json").read_text())
    assert summary["parallel"] == "fsdp" and summary["world_size"] == 2 and summary["packed"]
    assert 0 <= summary["data_wait_fraction"] <= 1 and summary["padding_fraction"] < 0.5
    assert (ck / "latest").read_text().strip() == f"step_{STEPS:08d}"
    meta = json.loads((ck / f"step_{STEPS:08d}" / "vlafeed.json").read_text())
    assert meta["world_size"] == 2 and meta["step"] == STEPS
    assert not list(ck.glob(".tmp-*"))  # no half-written checkpoint left
    # the run crossed an epoch boundary, so the resumes below do too
    assert torch.load(ck / f"step_{STEPS:08d}" / "rank0.pt", weights_only=False)["loader"]["epoch"] >= 1


def test_stop_and_resume_is_bit_identical(setup, uninterrupted):
    base, cfg = setup
    ckA, a = uninterrupted
    ck = base / "ckB"
    log = str(base / "B.jsonl")
    train(cfg, ["--checkpoint.dir", str(ck), "--train.log_file", log, "--train.stop_at", "5"])
    assert (ck / "latest").read_text().strip() == "step_00000005"
    r = train(cfg, ["--checkpoint.dir", str(ck), "--train.log_file", log, "--checkpoint.resume", "auto"])
    assert "resumed from" in r.stdout and "at step 5" in r.stdout and "exactly" in r.stdout
    b = losses(log)
    assert b == a, {s: (a[s], b.get(s)) for s in a if a[s] != b.get(s)}
    assert_same_state(full_state(ckA / f"step_{STEPS:08d}"), full_state(ck / f"step_{STEPS:08d}"))


def test_sigkill_and_resume_is_bit_identical(setup, uninterrupted):
    base, cfg = setup
    ckA, a = uninterrupted
    ck = base / "ckC"
    log = base / "C.jsonl"
    p = subprocess.Popen(command(cfg, ["--checkpoint.dir", str(ck), "--train.log_file", str(log)]), env=env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None:
            if (ck / "latest").is_file() and (ck / "latest").read_text().strip() >= "step_00000004":
                break
            time.sleep(0.02)
        assert p.poll() is None, "the run ended before it could be killed"
    finally:
        kill_tree(p.pid)  # torchrun's workers run in their own sessions: kill each by pid
        p.wait()
    time.sleep(0.5)
    killed_at = (ck / "latest").read_text().strip()
    assert killed_at < f"step_{STEPS:08d}"
    r = train(cfg, ["--checkpoint.dir", str(ck), "--train.log_file", str(log), "--checkpoint.resume", "auto",
                    "--checkpoint.keep", "2"])
    assert f"at step {int(killed_at[5:])}" in r.stdout
    # keep=2: only the two newest complete checkpoints remain, and no half-written one
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith(("step_", ".tmp-"))) == \
        [f"step_{STEPS - 2:08d}", f"step_{STEPS:08d}"]
    c = losses(log)  # steps logged after the checkpoint and before the kill are overwritten by the resumed run
    assert c == a, {s: (a[s], c.get(s)) for s in a if a[s] != c.get(s)}
    assert_same_state(full_state(ckA / f"step_{STEPS:08d}"), full_state(ck / f"step_{STEPS:08d}"))


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        try:
            kids = Path(f"/proc/{cur}/task/{cur}/children").read_text().split()
        except OSError:
            kids = []
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def kill_tree(pid):
    """SIGKILL pid and every process under it, all at once (a crash, not a shutdown)."""
    for victim in [pid] + descendants(pid):
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _in_process(argv):
    """runner.main in this process (no torchrun: world size 1); restores the global torch settings it changes."""
    from vlafeed.train.runner import main
    threads = torch.get_num_threads()
    try:
        return main(argv)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)


def test_sharded_checkpoint_reshards_into_one_process(setup, uninterrupted):
    from vlafeed.train import checkpoint as ckpt
    from vlafeed.train.runner import build_model
    from vlafeed.train.parallel import DistInfo, wrap_model
    base, cfg_path = setup
    ckA, _ = uninterrupted
    cfg = load_config(str(cfg_path))
    meta = vlafeed.LeRobotDataset(cfg.data.dataset).meta
    model = build_model(cfg, meta, torch.device("cpu"))[0]
    w = wrap_model(model, DistInfo(0, 0, 1, torch.device("cpu"), False))
    opt = torch.optim.AdamW(model.parameters())
    path = ckA / "step_00000010"
    step, mine, rank0_loader, cmeta = ckpt.load(path, w.model, opt, None, rank=0, world=1)
    assert step == 10 and mine is None and cmeta["world_size"] == 2  # another world size: no per-rank state
    reference = full_state(path)["model"]
    assert set(reference) == set(model.state_dict())
    for k, v in model.state_dict().items():
        assert torch.equal(v, reference[k]), k
    assert len(opt.state) == len(list(model.parameters()))


def test_resume_at_another_world_size_names_the_checkpoint(setup, uninterrupted, capsys, tmp_path):
    base, cfg = setup
    ckA, _ = uninterrupted
    ck = tmp_path / "ck"
    shutil.copytree(ckA / "step_00000010", ck / "step_00000010")
    rc = _in_process(["--config", str(cfg), "--checkpoint.dir", str(ck), "--checkpoint.resume",
                      str(ck / "step_00000010"), "--train.steps", "11", "--train.log_file", str(tmp_path / "l")])
    err = capsys.readouterr().err
    if rc == 0:  # the loader learned elastic resume (issue 9): then the data continues
        assert (tmp_path / "l").is_file()
        return
    assert rc == 3 and "step_00000010" in err and "world size 2, resuming at 1" in err, err
    assert "elastic_data=restart_epoch" in err
    assert not (tmp_path / "l").exists()  # no step ran
    rc = _in_process(["--config", str(cfg), "--checkpoint.dir", str(ck), "--checkpoint.resume",
                      str(ck / "step_00000010"), "--train.steps", "11", "--checkpoint.elastic_data", "restart_epoch"])
    out = capsys.readouterr().out
    assert rc == 0 and "NOT exactly-once" in out and "at step 10" in out
    assert (ck / "step_00000011" / "vlafeed.json").is_file()


@pytest.mark.parametrize("override,needle", [
    (["--model.d_model", "48"], "another model: parameter"),
    (["--data.seed", "5"], "another run: 'data.seed' is 0 there and 5 here"),
    (["--packing.max_tokens", "200"], "another run: 'packing.max_tokens'"),
])
def test_checkpoint_of_another_model_or_run_is_refused_before_any_step(setup, uninterrupted, capsys, tmp_path,
                                                                       override, needle):
    base, cfg = setup
    ckA, _ = uninterrupted
    path = ckA / "step_00000004"
    log = tmp_path / "l"
    rc = _in_process(["--config", str(cfg), "--checkpoint.dir", str(tmp_path / "ck"), "--checkpoint.resume",
                      str(path), "--train.log_file", str(log)] + override)
    err = capsys.readouterr().err
    assert rc == 3 and str(path / "vlafeed.json") in err and needle in err, err
    assert not log.exists()


def test_incomplete_or_missing_checkpoint_is_named(setup, capsys, tmp_path):
    base, cfg = setup
    half = tmp_path / "step_00000003"
    half.mkdir()
    (half / "rank0.pt").write_bytes(b"partial")
    rc = _in_process(["--config", str(cfg), "--checkpoint.resume", str(half)])
    err = capsys.readouterr().err
    assert rc == 3 and f"{half / 'vlafeed.json'} is missing" in err
    rc = _in_process(["--config", str(cfg), "--checkpoint.resume", str(tmp_path / "nope")])
    assert rc == 3 and "nope" in capsys.readouterr().err
    # resume=auto with no checkpoint yet starts fresh (tested by the runs above); bad JSON is named
    (half / "vlafeed.json").write_text("{")
    rc = _in_process(["--config", str(cfg), "--checkpoint.resume", str(half)])
    assert rc == 3 and "not valid JSON" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# config errors

def test_config_errors_name_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  dataset: /x\ntrain:\n  stepz: 3\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'train.stepz' \(" + str(bad)):
        load_config(str(bad))
    bad.write_text("data:\n  dataset: /x\ntrain:\n  steps: many\n")
    with pytest.raises(ConfigError, match="'train.steps'.*expected int, got str"):
        load_config(str(bad))
    bad.write_text("data:\n  dataset: /x\n  batch_size: true\n")
    with pytest.raises(ConfigError, match="'data.batch_size'.*boolean"):
        load_config(str(bad))
    bad.write_text("datta:\n  dataset: /x\n")
    with pytest.raises(ConfigError, match="no section 'datta'"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="'train.lr'.*expected float"):
        load_config(None, ["--data.dataset", "/x", "--train.lr", "fast"])
    with pytest.raises(ConfigError, match="'parallel.fsdp'.*expected bool"):
        load_config(None, ["--data.dataset", "/x", "--parallel.fsdp", "maybe"])
    with pytest.raises(ConfigError, match="'train.precision'.*not one of"):
        load_config(None, ["--data.dataset", "/x", "--train.precision", "fp16"])
    with pytest.raises(ConfigError, match="'data.dataset'"):
        load_config(None, [])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "none.yaml"))
    cfg = load_config(None, ["--data.dataset", "/x", "--train.lr=0.5", "--parallel.fsdp", "off",
                             "--train.grad_accum", "3"])
    assert cfg.train.lr == 0.5 and cfg.parallel.fsdp is False and cfg.train.grad_accum == 3


def test_cli_rejects_a_bad_key_before_starting(setup):
    base, cfg = setup
    r = subprocess.run([sys.executable, "-m", "vlafeed.train", "--config", str(cfg), "--train.stepz", "3"],
                       env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown config key 'train.stepz' (command line)" in r.stderr
    assert "training:" not in r.stdout
    r = subprocess.run([sys.executable, "-m", "vlafeed.train", "--help"], env=env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "--packing.max_tokens" in r.stdout


@pytest.mark.parametrize("precision", ["amp_bfloat16", "pure_bf16"])
def test_bf16_precisions_train_end_to_end_in_one_process(setup, tmp_path, precision):
    base, cfg = setup
    rc = _in_process(["--config", str(cfg), "--checkpoint.dir", str(tmp_path / "ck"), "--train.steps", "2",
                      "--train.precision", precision, "--train.grad_accum", "1"])
    assert rc == 0
    summary = json.loads((tmp_path / "ck" / "summary.json").read_text())
    assert summary["precision"] == precision and summary["steps"] == 2 and summary["parallel"] == "local"
    assert all(v == v for v in (summary["first_loss"], summary["last_loss"]))  # not NaN


def test_launcher_variables_torchrun_then_slurm(monkeypatch):
    from vlafeed.train.parallel import env_rank_world, setup_distributed
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "MASTER_ADDR",
                "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert env_rank_world() == (0, 0, 1, None)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert env_rank_world() == (5, 1, 8, "slurm")
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):  # srun alone does not say where rank 0 listens
        setup_distributed("gloo", "cpu")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert env_rank_world() == (3, 0, 4, "torchrun")  # torchrun's variables win inside an srun allocation
