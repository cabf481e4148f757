"""vlafeed.train trains LeRobot's own ACT policy (model.source: lerobot) in the LeRobot 0.6
venv (Python 3.12, build-lerobot/venv312): a tiny random-init ACT (resnet18 without pretrained
weights, 32-wide transformer) at 2 ranks under FSDP2 (torch.distributed.run, gloo, CPU)

- from a `vlafeed make-sample` dataset: stopped at step 2 (train.stop_at) and resumed, the
  per-step losses bit-identical to the uninterrupted run; exported with
  `python -m vlafeed.train export`, and LeRobot's own ACTPolicy.from_pretrained loads the
  export with outputs equal to the checkpoint's weights on a batch;
- from a real v3.0 dataset whose keys are `state`, `actions`, `image`, through data.rename
  (and without it: a clear error naming the missing key and data.rename).

Skips, with the reason, when the venv (or LeRobot in it) is absent (VF_LEROBOT06=0 too).
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

import lerobot_venv
import train_models_helpers as H

ACT = {"pretrained_backbone_weights": None, "dim_model": 32, "n_heads": 2, "dim_feedforward": 64,
       "n_encoder_layers": 1, "n_decoder_layers": 1, "n_vae_encoder_layers": 1, "latent_dim": 8,
       "chunk_size": 4, "n_action_steps": 4}
STEPS = 4


@pytest.fixture(scope="module")
def py312(tmp_path_factory):
    if os.environ.get("VF_LEROBOT06") == "0":
        pytest.skip("VF_LEROBOT06=0: the LeRobot 0.6 tests are off")
    tmp = tmp_path_factory.mktemp("lerobot-env")
    python, why = lerobot_venv.lerobot06_python(tmp)
    if python is None:
        print(f"SKIP reason: {why}")
        pytest.skip(why)
    r = subprocess.run([python, "-c", "import vlafeed._native._core"], env=H.env(tmp), capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        why = f"vlafeed's 3.12 extension is not built (make py312-inplace): {r.stderr.strip()[-300:]}"
        print(f"SKIP reason: {why}")
        pytest.skip(why)
    return python


@pytest.fixture(scope="module")
def datasets(cli, tmp_path_factory):
    base = tmp_path_factory.mktemp("train-lerobot-data")
    return H.sample_dataset(cli, base / "sample"), H.renamed_dataset(base / "renamed")


def config(tmp, dataset, ckdir, **extra):
    cfg = {"data": {"dataset": str(dataset), "batch_size": 4, "seed": 1},
           "model": {"source": "lerobot", "name": "act", "overrides": ACT},
           "train": {"steps": STEPS, "lr": 1e-4, "warmup_steps": 1, "log_every": 1, "threads": 1,
                     "log_file": str(Path(tmp) / f"{Path(ckdir).name}.jsonl")},
           "checkpoint": {"dir": str(ckdir)}}
    for k, v in extra.items():
        section, name = k.split("__")
        cfg[section][name] = v
    path = Path(tmp) / f"{Path(ckdir).name}.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def test_act_fsdp2_stop_resume_export(py312, datasets, tmp_path):
    sample, _ = datasets
    full = config(tmp_path, sample, tmp_path / "full")
    r = H.train(py312, tmp_path, ["--config", str(full)])
    assert "FSDP2 (4 units)" in r.stdout, r.stdout  # ACT's VAE encoder, encoder and decoder layers + the root
    assert "LeRobot act" in r.stdout
    uninterrupted = H.losses(tmp_path / "full.jsonl")
    assert sorted(uninterrupted) == list(range(1, STEPS + 1))

    split = config(tmp_path, sample, tmp_path / "split")
    H.train(py312, tmp_path, ["--config", str(split), "--train.stop_at", "2"])
    assert sorted(H.losses(tmp_path / "split.jsonl")) == [1, 2]
    r = H.train(py312, tmp_path, ["--config", str(split), "--checkpoint.resume", "auto"])
    assert "resumed from" in r.stdout and "at step 2" in r.stdout
    assert H.losses(tmp_path / "split.jsonl") == uninterrupted  # bit-identical (hex of each float)

    out = tmp_path / "export"
    r = subprocess.run([py312, "-m", "vlafeed.train", "export", str(tmp_path / "full"), str(out)],
                       env=H.env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    pretrained = out / "pretrained_model"
    for name in ("model.safetensors", "config.json", "policy_preprocessor.json", "policy_postprocessor.json"):
        assert (pretrained / name).is_file(), name
    assert (out / "model.safetensors").is_file() and json.loads((out / "config.json").read_text())["step"] == STEPS
    # LeRobot loads the export on its own (no vlafeed import), and its outputs on a batch equal those of a
    # policy holding the checkpoint's weights (read from the DCP shards by vlafeed)
    check = f"""
import sys, torch
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors
policy = ACTPolicy.from_pretrained({str(pretrained)!r}).eval()
pre, post = make_pre_post_processors(policy.config, pretrained_path={str(pretrained)!r})
assert 'vlafeed' not in sys.modules
torch.manual_seed(0)
batch = {{"observation.state": torch.randn(3, 6), "observation.images.cam0": torch.rand(3, 3, 64, 96)}}
with torch.no_grad():
    a = post(policy.predict_action_chunk(pre(dict(batch))))
from vlafeed.train.models import full_state_dict_from_checkpoint
ref = ACTPolicy(policy.config)
ref.load_state_dict(full_state_dict_from_checkpoint({str(tmp_path / 'full' / f'step_{STEPS:08d}')!r}))
ref.eval()
with torch.no_grad():
    b = post(ref.predict_action_chunk(pre(dict(batch))))
fresh = ACTPolicy(policy.config).eval()
with torch.no_grad():
    c = post(fresh.predict_action_chunk(pre(dict(batch))))
assert a.shape == (3, 4, 6), a.shape
assert torch.equal(a, b), (a - b).abs().max()
assert not torch.equal(a, c)
print("OK")
"""
    r = subprocess.run([py312, "-c", check], env=H.env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_act_renamed_keys(py312, datasets, tmp_path):
    _, renamed = datasets
    cfg = config(tmp_path, renamed, tmp_path / "bare", train__steps=2)
    r = H.train(py312, tmp_path, ["--config", str(cfg)], procs=1, check=False)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "'action'" in r.stderr and "data.rename" in r.stderr and "actions" in r.stderr, r.stderr[-2000:]
    assert "KeyError" not in r.stderr

    cfg = config(tmp_path, renamed, tmp_path / "renamed", train__steps=3, data__rename=H.RENAME,
                 data__episodes=[0, 1, 3])
    r = H.train(py312, tmp_path, ["--config", str(cfg)])
    assert "FSDP2 (4 units)" in r.stdout
    losses = H.losses(tmp_path / "renamed.jsonl")
    assert sorted(losses) == [1, 2, 3]
    summary = json.loads((tmp_path / "renamed" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["world_size"] == 2
    # the policy was built for the renamed keys: its config names the camera as the model expects
    pcfg = json.loads((tmp_path / "renamed" / "model" / "config.json").read_text())
    assert "observation.images.front" in pcfg["input_features"] and "image" not in pcfg["input_features"]


def test_lerobot_errors(py312, datasets, tmp_path):
    sample, _ = datasets
    cfg = config(tmp_path, sample, tmp_path / "e1")
    cases = [
        (["--model.name", "no_such_policy"], "is not a LeRobot policy type"),
        (["--model.path", "lerobot/act_aloha_sim"], "huggingface-cli download lerobot/act_aloha_sim"),
        (["--model.overrides.no_such_field", "1"], "has no field 'no_such_field'"),
    ]
    has_diffusers = subprocess.run([py312, "-c", "import diffusers"], capture_output=True).returncode == 0
    if not has_diffusers:  # LeRobot's diffusion policy imports diffusers: the error names the pip install
        cases.append((["--model.name", "diffusion", "--model.overrides", "{}"], "pip install 'lerobot[diffusion]'"))
    if subprocess.run([py312, "-c", "import transformers"], capture_output=True).returncode != 0:  # SmolVLA needs it
        cases.append((["--model.name", "smolvla", "--model.overrides", "{}"], "pip install 'lerobot[smolvla]'"))
    for args, message in cases:
        r = H.train(py312, tmp_path, ["--config", str(cfg)] + args, procs=1, check=False)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr[-2000:])


DIFFUSION = {"pretrained_backbone_weights": None, "down_dims": [16, 32], "n_groups": 4, "kernel_size": 3,
             "diffusion_step_embed_dim": 16, "spatial_softmax_num_keypoints": 8, "n_obs_steps": 2, "horizon": 8,
             "n_action_steps": 4, "num_train_timesteps": 10, "num_inference_steps": 2, "crop_shape": None,
             "use_group_norm": True}


def test_diffusion_trains_with_its_observation_window(py312, datasets, tmp_path):
    """LeRobot's diffusion policy (n_obs_steps 2, horizon 8): the loader delivers the windows the policy's
    delta indices ask for, the loss is the policy's own, and the export loads with DiffusionPolicy.from_pretrained."""
    if subprocess.run([py312, "-c", "import diffusers"], capture_output=True).returncode != 0:
        pytest.skip("LeRobot's diffusion policy needs diffusers (tests/python/install_lerobot06.sh installs it)")
    sample, _ = datasets
    cfg = config(tmp_path, sample, tmp_path / "diffusion", model__name="diffusion", model__overrides=DIFFUSION,
                 train__steps=3)
    r = H.train(py312, tmp_path, ["--config", str(cfg)], procs=1)
    assert "LeRobot diffusion" in r.stdout, r.stdout
    losses = H.losses(tmp_path / "diffusion.jsonl")
    assert sorted(losses) == [1, 2, 3]
    assert all(float.fromhex(v) == float.fromhex(v) and abs(float.fromhex(v)) < 1e3 for v in losses.values())
    out = tmp_path / "diffusion-export"
    r = subprocess.run([py312, "-m", "vlafeed.train", "export", str(tmp_path / "diffusion"), str(out)],
                       env=H.env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    check = f"""
from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
p = DiffusionPolicy.from_pretrained({str(out / 'pretrained_model')!r})
assert p.config.n_obs_steps == 2 and p.config.horizon == 8, p.config
print("ok")
"""
    r = subprocess.run([py312, "-c", check], env=H.env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
