"""vlafeed.train trains the user's own module (model.source: python, model.entry:
train_entry_module:build, a test module on PYTHONPATH) at 2 ranks under FSDP2 (torch.distributed.run,
gloo, CPU): stopped and resumed with per-step losses bit-identical to the uninterrupted run, and on a
dataset with other key names through data.rename. model.init_from starts a new run from another
run's weights (on another dataset); the error paths name the key: a bad source, a missing or broken
entry, a hub id, a shape mismatch on init_from, a key the model needs without data.rename.
"""
import json
import sys
from pathlib import Path

import pytest
import torch

import train_models_helpers as H

vlafeed = pytest.importorskip("vlafeed")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vlafeed.train import models  # noqa: E402
from vlafeed.train.config import ConfigError, load_config  # noqa: E402

STEPS = 6


@pytest.fixture(scope="module")
def datasets(cli, tmp_path_factory):
    base = tmp_path_factory.mktemp("train-entry")
    return H.sample_dataset(cli, base / "sample"), H.renamed_dataset(base / "renamed")


def args(dataset, ckdir, log, *extra):
    return ["--data.dataset", str(dataset), "--data.batch_size", "4", "--model.source", "python",
            "--model.entry", "train_entry_module:build", "--train.steps", str(STEPS), "--train.lr", "3e-3",
            "--train.threads", "1", "--train.log_file", str(log), "--checkpoint.dir", str(ckdir)] + list(extra)


def test_entry_module_trains_and_resumes(datasets, tmp_path):
    sample, _ = datasets
    r = H.train(sys.executable, tmp_path, args(sample, tmp_path / "full", tmp_path / "full.jsonl"))
    assert "TinyPolicy from train_entry_module:build" in r.stdout and "FSDP2" in r.stdout
    full = H.losses(tmp_path / "full.jsonl")
    assert sorted(full) == list(range(1, STEPS + 1))
    split = args(sample, tmp_path / "split", tmp_path / "split.jsonl")
    H.train(sys.executable, tmp_path, split + ["--train.stop_at", "3"])
    r = H.train(sys.executable, tmp_path, split + ["--checkpoint.resume", "auto"])
    assert "at step 3" in r.stdout
    assert H.losses(tmp_path / "split.jsonl") == full
    # export: the consolidated weights load into the user's module without vlafeed
    H.train(sys.executable, tmp_path, ["export", str(tmp_path / "full"), str(tmp_path / "out")], procs=1)
    from safetensors.torch import load_file
    sd = load_file(str(tmp_path / "out" / "model.safetensors"))
    import train_entry_module
    meta = vlafeed.LeRobotDataset(str(sample)).meta
    module = train_entry_module.build(meta.features, meta.stats, None)
    module.load_state_dict(sd, strict=True)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model"]["source"] == "python"


def test_entry_module_renamed_dataset_and_init_from(datasets, tmp_path):
    sample, renamed = datasets
    H.train(sys.executable, tmp_path, args(sample, tmp_path / "base", tmp_path / "base.jsonl",
                                           "--train.steps", "2"), procs=1)
    rename = json.dumps(H.RENAME)
    fresh = args(renamed, tmp_path / "fresh", tmp_path / "fresh.jsonl", "--data.rename", rename, "--train.steps", "2")
    H.train(sys.executable, tmp_path, fresh, procs=1)
    tuned = args(renamed, tmp_path / "tuned", tmp_path / "tuned.jsonl", "--data.rename", rename, "--train.steps",
                 "2", "--model.init_from", str(tmp_path / "base"))
    r = H.train(sys.executable, tmp_path, tuned, procs=1)
    assert "resumed" not in r.stdout  # a new run: step 1, fresh optimizer, another dataset
    a, b = H.losses(tmp_path / "fresh.jsonl"), H.losses(tmp_path / "tuned.jsonl")
    assert sorted(a) == sorted(b) == [1, 2] and a[1] != b[1]  # same seed and data: only the weights differ
    # a weights-only init from an exported model too
    H.train(sys.executable, tmp_path, ["export", str(tmp_path / "base"), str(tmp_path / "base-export")], procs=1)
    again = args(renamed, tmp_path / "tuned2", tmp_path / "tuned2.jsonl", "--data.rename", rename, "--train.steps",
                 "2", "--model.init_from", str(tmp_path / "base-export"))
    H.train(sys.executable, tmp_path, again, procs=1)
    assert H.losses(tmp_path / "tuned2.jsonl")[1] == b[1]


def cfg_of(dataset, tmp_path, *extra):
    return load_config(None, ["--data.dataset", str(dataset), "--checkpoint.dir", str(tmp_path / "ck")] + list(extra))


def test_error_paths(datasets, tmp_path):
    sample, renamed = datasets
    with pytest.raises(ConfigError, match="model.source.*'torchvision' is not one of"):
        cfg_of(sample, tmp_path, "--model.source", "torchvision")
    with pytest.raises(ConfigError, match="model.entry.*needs 'package.module:build_fn'"):
        cfg_of(sample, tmp_path, "--model.source", "python")
    with pytest.raises(ConfigError, match="data.episodes"):
        cfg_of(sample, tmp_path, "--data.episodes", "[1, 1]")
    with pytest.raises(ConfigError, match="data.rename"):
        cfg_of(sample, tmp_path, "--data.rename", "[state]")
    meta = vlafeed.LeRobotDataset(str(sample)).meta
    cpu = torch.device("cpu")
    cases = [
        (("--model.entry", "no_such_module:build"), "cannot import 'no_such_module'"),
        (("--model.entry", "train_entry_module:nope"), "has no callable 'nope'"),
        (("--model.entry", "train_entry_module:build_not_a_module"), "returned str, not an nn.Module"),
        (("--model.entry", "train_entry_module:build", "--model.init_from", "org/model"), "huggingface-cli download"),
        (("--model.entry", "train_entry_module:build", "--model.init_from", str(tmp_path)), "neither a vlafeed.train"),
    ]
    for extra, message in cases:
        with pytest.raises(models.ModelError, match=message):
            models.build(cfg_of(sample, tmp_path, "--model.source", "python", *extra), meta, cpu)
    try:
        import lerobot  # noqa: F401
    except ImportError:  # this Python has no LeRobot (3.11): the lerobot source says so, naming 3.12
        with pytest.raises(models.ModelError, match="LeRobot is not importable.*Python >= 3.12"):
            models.build(cfg_of(sample, tmp_path, "--model.source", "lerobot", "--model.name", "act"), meta, cpu)
    # a forward without "loss": a clear error at the first step, exit status 2
    r = H.train(sys.executable, tmp_path, ["--data.dataset", str(sample), "--model.source", "python",
                                           "--model.entry", "train_entry_module:build_no_loss", "--train.steps", "1",
                                           "--checkpoint.dir", str(tmp_path / "noloss")], procs=1, check=False)
    assert r.returncode == 2 and "without 'loss'" in r.stderr, r.stderr[-2000:]
    # a key the model needs, absent under that name: named, with data.rename suggested (no raw KeyError)
    rmeta = vlafeed.LeRobotDataset(str(renamed)).meta
    with pytest.raises(models.ModelError, match="needs the key 'observation.state'.*data.rename"):
        models.build(cfg_of(renamed, tmp_path), rmeta, cpu)
    with pytest.raises(models.ModelError, match="data.rename': the dataset has no key 'joints'"):
        models.build(cfg_of(renamed, tmp_path, "--data.rename", "{joints: observation.state}"), rmeta, cpu)


def test_init_from_shape_mismatch_names_the_tensor(datasets, tmp_path):
    sample, _ = datasets
    small = ["--data.dataset", str(sample), "--data.batch_size", "4", "--data.chunk", "3", "--model.d_model", "32",
             "--train.steps", "1", "--train.threads", "1", "--checkpoint.dir", str(tmp_path / "small")]
    H.train(sys.executable, tmp_path, small, procs=1)
    meta = vlafeed.LeRobotDataset(str(sample)).meta
    cfg = cfg_of(sample, tmp_path, "--data.chunk", "3", "--model.init_from", str(tmp_path / "small"))
    with pytest.raises(models.ModelError, match=r"tensor '[\w.]+' has shape \[[\d, ]*32[\d, ]*\] in .*small.*"
                                                r"\[[\d, ]*64[\d, ]*\] in the model"):
        models.build(cfg, meta, torch.device("cpu"))
    r = H.train(sys.executable, tmp_path, ["--data.dataset", str(sample), "--data.chunk", "3", "--train.steps", "1",
                                           "--model.init_from", str(tmp_path / "small"), "--checkpoint.dir",
                                           str(tmp_path / "big")], procs=1, check=False)
    assert r.returncode == 2 and "model.init_from" in r.stderr and "Traceback" not in r.stderr


def test_run_identity_new_keys(tmp_path):
    """data.rename and data.episodes belong to a run's identity; a checkpoint written before the model keys
    existed resumes while they are at their defaults, and is refused when they are not."""
    from vlafeed.train import checkpoint as ckpt
    from vlafeed.train.config import Config
    cfg = Config()
    cfg.data.dataset = str(tmp_path)
    mine = ckpt.run_identity(cfg.to_dict())
    new = ("model.source", "model.name", "model.path", "model.entry", "model.config", "model.overrides",
           "model.init_from", "data.rename", "data.episodes")
    old = {k: v for k, v in mine.items() if k not in new}
    meta = {"model_fingerprint": ckpt.fingerprint([]), "model_signature": [], "run": old}
    ckpt.check_compatible(tmp_path, meta, [], mine)  # same run
    cfg.data.episodes = [0, 1]
    with pytest.raises(ckpt.CheckpointError, match=r"'data.episodes' is None there and \[0, 1\] here"):
        ckpt.check_compatible(tmp_path, meta, [], ckpt.run_identity(cfg.to_dict()))
    meta["run"] = ckpt.run_identity(cfg.to_dict())
    cfg.data.rename = {"state": "observation.state"}
    with pytest.raises(ckpt.CheckpointError, match="'data.rename'"):
        ckpt.check_compatible(tmp_path, meta, [], ckpt.run_identity(cfg.to_dict()))
