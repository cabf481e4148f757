"""python -m vlafeed.train refuses what would run code, train to garbage or fail late.

Checkpoints: trainer.pt and rank<r>.pt are read with torch.load(weights_only=True),
so a planted pickle (an object whose __reduce__ calls eval) is refused with the file
named, its payload never runs (it would create a marker file), and the process exits
non-zero; a genuine checkpoint still resumes, including one whose numpy RNG state is a
numpy array (as checkpoints written before this check hold it).

Config: values out of range fail at load with ConfigError naming the key, the value
and the allowed range (exit status 2): a non-finite or non-positive lr, negative
warmup_steps / stop_at / keep, log_every 0, absurd chunk / image_size. A loss that
turns NaN or infinite stops the run naming the step (exit status 4), before the
optimizer applies it. A checkpoint directory that cannot be written is refused before
the first step (exit status 2).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

pytest.importorskip("yaml")
from vlafeed.train.config import ConfigError, load_config  # noqa: E402
from vlafeed.train.runner import main  # noqa: E402

CONFIG = """
data:
  batch_size: 4
  chunk: 3
model:
  d_model: 32
  layers: 1
train:
  steps: {steps}
  warmup_steps: 1
  log_every: 1
  threads: 1
parallel:
  device: cpu
"""


@pytest.fixture(scope="module")
def setup(cli, tmp_path_factory):
    """2 episodes of 20..24 frames, one camera; a 3-step run with its checkpoint at the end."""
    base = tmp_path_factory.mktemp("train_safety")
    root = base / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "2", "--cameras", "1", "--codec", "h264",
                        "--size", "32x32", "--min-length", "20", "--max-length", "24", "--seed", "3", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    cfg = base / "run.yaml"
    cfg.write_text(CONFIG.format(steps=3).replace("data:\n", f"data:\n  dataset: {root}\n"))
    ck = base / "ck"
    r = run(cfg, ["--checkpoint.dir", str(ck)])
    assert r.returncode == 0, r.stderr[-3000:]
    return base, cfg, ck / "step_00000003"


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


def run(cfg, args):
    return subprocess.run([sys.executable, "-m", "vlafeed.train", "--config", str(cfg)] + args, env=env(),
                          capture_output=True, text=True, timeout=300)


def copy_checkpoint(step_dir, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(step_dir, ck / step_dir.name)
    (ck / "latest").write_text(step_dir.name + "\n")
    return ck, ck / step_dir.name


class Planted:
    """Unpickles by calling eval: the expression creates `marker` and evaluates to `value`."""

    def __init__(self, marker, value):
        self.marker, self.value = str(marker), value

    def __reduce__(self):
        return (eval, (f"open({self.marker!r}, 'w').close() or {self.value!r}",))


# ---------------------------------------------------------------------------
# checkpoints

def test_planted_trainer_pt_is_refused_and_never_runs(setup, tmp_path):
    base, cfg, step_dir = setup
    ck, step = copy_checkpoint(step_dir, tmp_path)
    marker = tmp_path / "payload-ran"
    trainer = torch.load(step / "trainer.pt", weights_only=True)
    trainer["step"] = Planted(marker, 3)  # a valid step once evaluated: the run would go on
    torch.save(trainer, step / "trainer.pt")
    r = run(cfg, ["--checkpoint.dir", str(ck), "--checkpoint.resume", "auto", "--train.steps", "4"])
    assert not marker.exists(), "the planted payload ran"
    assert r.returncode == 3, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert str(step / "trainer.pt") in r.stderr and "weights_only" in r.stderr
    assert "step 4/4" not in r.stdout


def test_planted_rank_pt_is_refused_and_never_runs(setup, tmp_path):
    base, cfg, step_dir = setup
    ck, step = copy_checkpoint(step_dir, tmp_path)
    marker = tmp_path / "payload-ran"
    state = torch.load(step / "rank0.pt", weights_only=False)
    state["extra"] = Planted(marker, 0)
    torch.save(state, step / "rank0.pt")
    r = run(cfg, ["--checkpoint.dir", str(ck), "--checkpoint.resume", str(step), "--train.steps", "4"])
    assert not marker.exists(), "the planted payload ran"
    assert r.returncode == 3, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert str(step / "rank0.pt") in r.stderr


def test_planted_dcp_metadata_is_refused_and_never_runs(setup, tmp_path):
    import pickle
    base, cfg, step_dir = setup
    ck, step = copy_checkpoint(step_dir, tmp_path)
    marker = tmp_path / "payload-ran"
    (step / ".metadata").write_bytes(pickle.dumps(Planted(marker, 0)))
    r = run(cfg, ["--checkpoint.dir", str(ck), "--checkpoint.resume", "auto", "--train.steps", "4"])
    assert not marker.exists(), "the planted payload ran"
    assert r.returncode == 3, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert str(step / ".metadata") in r.stderr and "builtins.eval" in r.stderr


def test_planted_dcp_item_is_refused_and_never_runs(setup, tmp_path):
    """A non-tensor DCP item (the optimizer's lr) replaced by a planted object, written by DCP itself."""
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    base, cfg, step_dir = setup
    ck, step = copy_checkpoint(step_dir, tmp_path)
    marker = tmp_path / "payload-ran"
    flat = tmp_path / "flat.pt"
    dcp_to_torch_save(str(step), str(flat))
    state = torch.load(flat, weights_only=False)
    state["optim"]["param_groups"][0]["lr"] = Planted(marker, 1e-3)
    for f in step.glob("*.distcp"):
        f.unlink()
    dcp_save(state, checkpoint_id=str(step))
    assert not marker.exists()
    r = run(cfg, ["--checkpoint.dir", str(ck), "--checkpoint.resume", "auto", "--train.steps", "4"])
    assert not marker.exists(), "the planted payload ran"
    assert r.returncode == 3, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert f"{step} (item optim.param_groups.0.lr)" in r.stderr and "eval" in r.stderr


def test_genuine_checkpoint_resumes_also_with_a_numpy_rng_array(setup, tmp_path):
    np = pytest.importorskip("numpy")
    base, cfg, step_dir = setup
    ck, step = copy_checkpoint(step_dir, tmp_path)
    r = run(cfg, ["--checkpoint.dir", str(ck), "--checkpoint.resume", "auto", "--train.steps", "4"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout and "step 4/4" in r.stdout
    # the form an older checkpoint holds: np.random.get_state() with its uint32 array
    ck2, step2 = copy_checkpoint(step_dir, tmp_path / "old")
    state = torch.load(step2 / "rank0.pt", weights_only=False)
    rs = np.random.RandomState(11)
    state["rng"]["numpy"] = rs.get_state()
    torch.save(state, step2 / "rank0.pt")
    r = run(cfg, ["--checkpoint.dir", str(ck2), "--checkpoint.resume", "auto", "--train.steps", "4"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 4/4" in r.stdout


# ---------------------------------------------------------------------------
# config ranges

@pytest.mark.parametrize("key,value,needle", [
    ("train.lr", ".inf", "finite"),
    ("train.lr", ".nan", "finite"),
    ("train.lr", "-0.1", "> 0"),
    ("train.lr", "0", "> 0"),
    ("train.weight_decay", "-1.0", ">= 0"),
    ("train.weight_decay", ".inf", "finite"),
    ("train.warmup_steps", "-1", ">= 0"),
    ("train.stop_at", "-5", ">= 0"),
    ("train.threads", "-1", ">= 0"),
    ("train.log_every", "0", ">= 1"),
    ("checkpoint.keep", "-1", ">= 0"),
    ("data.chunk", "1000000000", "<= 1024"),
    ("data.chunk", "0", "1 <= value <= 1024"),
    ("data.image_size", "10000000", "<= 4096"),
    ("data.image_size", "-2", "0 <= value <= 4096"),
    ("model.camera_dropout", ".nan", "[0, 1)"),
])
def test_out_of_range_values_are_refused_at_load(tmp_path, key, value, needle):
    section, name = key.split(".")
    path = tmp_path / "run.yaml"
    path.write_text(f"data:\n  dataset: /x\n{section}:\n  {name}: {value}\n" if section != "data" else
                    f"data:\n  dataset: /x\n  {name}: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    msg = str(info.value)
    assert f"'{key}'" in msg and needle in msg, msg


def test_out_of_range_on_the_command_line_exits_2(tmp_path, capsys):
    assert main(["--data.dataset", "/x", "--train.lr", "inf"]) == 2
    err = capsys.readouterr().err
    assert "'train.lr'" in err and "inf" in err
    assert main(["--data.dataset", "/x", "--train.log_every", "0"]) == 2
    assert "'train.log_every'" in capsys.readouterr().err


def test_values_inside_the_ranges_load(tmp_path):
    cfg = load_config(None, ["--data.dataset", "/x", "--train.lr", "3e-4", "--train.warmup_steps", "0",
                             "--train.stop_at", "0", "--checkpoint.keep", "0", "--data.chunk", "1024",
                             "--data.image_size", "4096", "--train.log_every", "1"])
    assert cfg.data.chunk == 1024 and cfg.data.image_size == 4096 and cfg.train.lr == 3e-4


# ---------------------------------------------------------------------------
# at run time

def test_non_finite_loss_stops_the_run_naming_the_step(setup, tmp_path):
    base, cfg, _ = setup
    log = tmp_path / "loss.jsonl"
    r = run(cfg, ["--checkpoint.dir", str(tmp_path / "ck"), "--train.lr", "1e30", "--train.steps", "6",
                  "--train.log_file", str(log)])
    assert r.returncode == 4, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert "loss" in r.stderr and "step " in r.stderr and ("nan" in r.stderr or "inf" in r.stderr)
    assert not (tmp_path / "ck" / "latest").exists()  # no checkpoint of a diverged model


def test_unwritable_checkpoint_dir_fails_before_the_first_step(setup, tmp_path):
    base, cfg, _ = setup
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    r = run(cfg, ["--checkpoint.dir", str(blocker / "ck")])
    assert r.returncode == 2, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert "'checkpoint.dir'" in r.stderr and str(blocker / "ck") in r.stderr
    assert "step 1/" not in r.stdout
