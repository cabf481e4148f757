"""python -m vlafeed.train's data keys (python/vlafeed/train/data.py): observation windows
(data.obs_steps, data.delta_timestamps), image augmentation (data.augment), weighted mixing
(data.mix through vlafeed.Mix) and validation on held-out episodes (eval.*).

End to end: a one-process run with windows, a user augmentation and validation stopped at
step 3 and resumed is bit-identical (losses and val_loss) to the uninterrupted run, and
its sample log holds no held-out episode; a data.mix of two LeRobot datasets and a
WebDataset shard manifest trains at 2 ranks (torchrun, gloo, FSDP2) and a stop/resume run
gives bit-identical losses. Bad keys fail before any step, naming the key.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest.importorskip("yaml")
import vlafeed  # noqa: E402
from vlafeed.train import data as vdata  # noqa: E402
from vlafeed.train.config import ConfigError, load_config  # noqa: E402

CHUNK = 3
BASE = f"""
data:
  batch_size: 4
  chunk: {CHUNK}
model:
  d_model: 32
  layers: 1
  max_text_tokens: 16
train:
  steps: 6
  warmup_steps: 2
  log_every: 100
  threads: 1
checkpoint:
  every: 3
"""

AUGMENT_MODULE = '''
import torch
CALLS = []

def shift(batch, *, generator, camera_keys):
    """Adds per-sample noise drawn from the generator to every camera (uint8 kept)."""
    out = dict(batch)
    for k in camera_keys:
        img = out[k]
        noise = torch.randint(-20, 21, (img.shape[0],) + (1,) * (img.dim() - 1), generator=generator)
        out[k] = (img.to(torch.int16) + noise).clamp(0, 255).to(torch.uint8)
    return out
'''


def make_sample(cli, root, seed, episodes=5):
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", str(episodes), "--cameras", "1", "--codec",
                        "h264", "--size", "32x32", "--min-length", "16", "--max-length", "20", "--seed", str(seed),
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root


@pytest.fixture(scope="module")
def setup(cli, tmp_path_factory):
    base = tmp_path_factory.mktemp("train_data")
    a = make_sample(cli, base / "a", 3)
    b = make_sample(cli, base / "b", 4)
    (base / "augmod").mkdir()
    (base / "augmod" / "vf_test_augment.py").write_text(AUGMENT_MODULE)
    return base, a, b


def env(base):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), str(base / "augmod"), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


def run(base, cfg_text, args, procs=1, expect=0):
    cfg = base / f"run{abs(hash(cfg_text))}.yaml"
    cfg.write_text(cfg_text)
    if procs > 1:
        torchrun = shutil.which("torchrun")
        assert torchrun, "torchrun is not on PATH"
        cmd = [torchrun, "--standalone", f"--nproc_per_node={procs}", "-m", "vlafeed.train"]
    else:
        cmd = [sys.executable, "-m", "vlafeed.train"]
    r = subprocess.run(cmd + ["--config", str(cfg)] + args, env=env(base), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == expect, f"rc {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def log_records(path):
    train, val = {}, {}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        if "loss_hex" in rec:
            train[rec["step"]] = rec["loss_hex"]
        if "val_loss_hex" in rec:
            val[rec["step"]] = rec["val_loss_hex"]
    return train, val


# ---------------------------------------------------------------------------
# windows

FEATURES = {"observation.state": {"shape": [2]}, "observation.images.cam": {"shape": [3, 8, 8]},
            "action": {"shape": [2]}, "index": {"shape": [1]}}


def cfg_with(tmp_path, **data):
    c = load_config(None, ["--data.dataset", str(tmp_path)] + [a for k, v in data.items()
                                                                 for a in (f"--{k}", str(v))])
    return c


def test_obs_steps_windows_every_observation_key(tmp_path):
    c = cfg_with(tmp_path, **{"data.obs_steps": 3, "data.chunk": 2})
    dts = vdata.delta_timestamps(c, FEATURES, 10.0)
    assert dts == {"action": [0.0, 0.1], "observation.state": [-0.2, -0.1, 0.0],
                   "observation.images.cam": [-0.2, -0.1, 0.0]}
    assert vdata.windowed_keys(dts) == {"observation.state": 2, "observation.images.cam": 2}


def test_explicit_delta_timestamps_are_checked_against_the_dataset(tmp_path):
    c = cfg_with(tmp_path, **{"data.delta_timestamps": "{observation.state: [-0.1, 0.0, 0.1]}"})
    assert vdata.delta_timestamps(c, FEATURES, 10.0)["observation.state"] == [-0.1, 0.0, 0.1]
    assert vdata.windowed_keys(vdata.delta_timestamps(c, FEATURES, 10.0)) == {"observation.state": 2}
    with pytest.raises(ConfigError, match=r"'observation\.velocity' is not a feature.*observation\.state"):
        vdata.delta_timestamps(cfg_with(tmp_path, **{"data.delta_timestamps": "{observation.velocity: [0.0]}"}),
                               FEATURES, 10.0)
    with pytest.raises(ConfigError, match=r"'observation\.state' offset -0\.15 s is not a multiple of 1/fps.*fps 10"):
        vdata.delta_timestamps(cfg_with(tmp_path, **{"data.delta_timestamps": "{observation.state: [-0.15, 0]}"}),
                               FEATURES, 10.0)
    with pytest.raises(ConfigError, match="non-empty list"):
        vdata.delta_timestamps(cfg_with(tmp_path, **{"data.delta_timestamps": "{observation.state: []}"}),
                               FEATURES, 10.0)
    with pytest.raises(ConfigError, match="'action' is set by data.chunk"):
        vdata.delta_timestamps(cfg_with(tmp_path, **{"data.delta_timestamps": "{action: [0.0]}"}), FEATURES, 10.0)
    both = cfg_with(tmp_path, **{"data.obs_steps": 2, "data.delta_timestamps": "{observation.state: [0.0]}"})
    with pytest.raises(ConfigError, match="'data.obs_steps' and 'data.delta_timestamps' are exclusive"):
        vdata.delta_timestamps(both, FEATURES, 10.0)
    with pytest.raises(ConfigError, match="data.delta_timestamps.*expected a mapping"):
        cfg_with(tmp_path, **{"data.delta_timestamps": "[1, 2]"})


def test_loader_delivers_windows_with_pad_masks(setup):
    base, a, _ = setup
    c = load_config(None, ["--data.dataset", str(a), "--data.obs_steps", "3", "--data.batch_size", "8",
                           "--data.chunk", str(CHUNK)])
    plan = vdata.DataPlan(c, vlafeed, 0, 1)
    cam = plan.camera_keys[0]
    batch = next(iter(plan.training_stream()))
    assert batch["observation.state"].shape[:2] == (8, 3)
    assert batch[cam].shape[:2] == (8, 3) and batch[cam].shape[2] == 3 and batch[cam].dtype == torch.uint8
    assert batch["action"].shape[:2] == (8, CHUNK)
    pad = batch["observation.state_is_pad"]
    assert pad.shape == (8, 3) and pad.dtype == torch.bool
    # frame f pads the offsets that fall before the episode's first frame: -2 when f < 2, -1 when f < 1
    fi = batch["frame_index"].reshape(-1)
    assert torch.equal(pad[:, 0], fi < 2) and torch.equal(pad[:, 1], fi < 1) and not pad[:, 2].any()
    assert torch.equal(batch[cam + "_is_pad"], pad)
    newest = vdata.newest_step(batch, plan.windows)
    assert torch.equal(newest["observation.state"], batch["observation.state"][:, 2])
    assert newest[cam].shape == batch[cam][:, 2].shape


# ---------------------------------------------------------------------------
# augmentation

def test_augment_spec_errors(tmp_path):
    with pytest.raises(ConfigError, match="data.augment.*unknown augmentation 'blur'"):
        vdata.load_augment("blur")
    with pytest.raises(ConfigError, match="data.augment.*cannot load 'no_such_module_xyz:fn'"):
        vdata.load_augment("no_such_module_xyz:fn")
    with pytest.raises(ConfigError, match="data.augment.*cannot load 'json:no_such_fn'"):
        vdata.load_augment("json:no_such_fn")
    try:
        import torchvision  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="data.augment.*'random_crop' needs torchvision"):
            vdata.load_augment("random_crop")


def test_augment_generator_depends_on_seed_rank_step_only():
    def draw(*k):
        return torch.rand(4, generator=vdata.augment_generator(*k)).tolist()
    assert draw(0, 0, 5, 0) == draw(0, 0, 5, 0)
    assert len({tuple(draw(*k)) for k in [(0, 0, 5, 0), (1, 0, 5, 0), (0, 1, 5, 0), (0, 0, 6, 0), (0, 0, 5, 1)]}) == 5


BUILTIN_SCRIPT = r'''
import sys, types, torch
root = sys.argv[1]
for name, path in (("vlafeed", root + "/vlafeed"), ("vlafeed.train", root + "/vlafeed/train")):
    m = types.ModuleType(name); m.__path__ = [path]; sys.modules[name] = m
from vlafeed.train import data as vdata
img = torch.randint(0, 256, (4, 2, 3, 24, 24), dtype=torch.uint8)
batch = {"observation.images.cam": img, "observation.state": torch.zeros(4, 2)}
fn = vdata.load_augment("random_crop,color_jitter")
def go(step):
    return fn(dict(batch), generator=vdata.augment_generator(0, 0, step, 0),
              camera_keys=["observation.images.cam"])["observation.images.cam"]
a, b, c = go(1), go(1), go(2)
assert a.shape == img.shape and a.dtype == torch.uint8, (a.shape, a.dtype)
assert torch.equal(a, b), "same generator, different images"
assert not torch.equal(a, c), "another step augments the same"
assert not torch.equal(a, img), "nothing changed"
print("ok")
'''


def test_builtin_augmentations_through_torchvision(tmp_path):
    """random_crop and color_jitter run through torchvision.transforms.v2 (in the LeRobot 3.12
    environment, which has torchvision): same generator, same images; another step, others."""
    from lerobot_venv import lerobot06_python
    try:
        import torchvision  # noqa: F401
        python = sys.executable
    except ImportError:
        python, why = lerobot06_python(tmp_path)
        if python is None:
            pytest.skip(f"torchvision is not installed here and {why}")
    r = subprocess.run([python, "-c", BUILTIN_SCRIPT, str(ROOT / "python")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------
# held-out episodes and validate()

def test_heldout_split_is_seeded_and_checked(tmp_path):
    c = cfg_with(tmp_path, **{"eval.fraction": 0.25, "eval.every": 2})
    held = vdata.heldout_episodes(c, 20, "ds")
    assert len(held) == 5 and held == vdata.heldout_episodes(c, 20, "ds")
    c2 = cfg_with(tmp_path, **{"eval.fraction": 0.25, "data.seed": 1})
    assert vdata.heldout_episodes(c2, 20, "ds") != held
    assert vdata.training_episodes(c, 20, held) == [i for i in range(20) if i not in held]
    with pytest.raises(ConfigError, match="'eval.episodes': 7 is not an episode of ds"):
        vdata.heldout_episodes(cfg_with(tmp_path, **{"eval.episodes": "[1, 7]"}), 5, "ds")
    with pytest.raises(ConfigError, match="'eval.episodes' and 'eval.fraction' are exclusive"):
        vdata.heldout_episodes(cfg_with(tmp_path, **{"eval.episodes": "[1]", "eval.fraction": 0.5}), 5, "ds")
    with pytest.raises(ConfigError, match="all 3 training episodes of ds would be held out"):
        vdata.heldout_episodes(cfg_with(tmp_path, **{"eval.episodes": "[0, 1, 2]"}), 3, "ds")
    with pytest.raises(ConfigError, match="'eval.every': validation needs held-out episodes"):
        vdata.heldout_episodes(cfg_with(tmp_path, **{"eval.every": 5}), 3, "ds")
    with pytest.raises(ConfigError, match="eval.fraction.*out of range"):
        cfg_with(tmp_path, **{"eval.fraction": 1.0})


def test_validate_averages_per_sample_with_grads_off():
    model = torch.nn.Linear(2, 1)
    seen = []

    def loss_fn(batch):
        assert not torch.is_grad_enabled() and not model.training
        seen.append(batch["index"].tolist())
        return model(batch["x"]).sum() * 0 + batch["x"].sum() / len(batch["index"])

    stream = [{"index": torch.arange(4), "x": torch.ones(4, 2)},      # loss 2
              {"index": torch.arange(2), "x": torch.full((2, 2), 4.0)},  # loss 8
              {"index": torch.arange(3), "x": torch.zeros(3, 2)}]
    v = vdata.validate(loss_fn, stream, 2, model)
    assert v == {"val_loss": (2 * 4 + 8 * 2) / 6, "val_batches": 2, "val_samples": 6}
    assert model.training and len(seen) == 2
    assert vdata.validate(loss_fn, stream, 0, model)["val_batches"] == 3
    with pytest.raises(RuntimeError, match="held-out episodes gave no batch"):
        vdata.validate(loss_fn, [], 0, model)


# ---------------------------------------------------------------------------
# end to end: one process, windows + augmentation + validation, stop/resume

def test_windows_augment_and_validation_resume_bit_identical(setup):
    base, a, _ = setup
    cfg = BASE.replace("data:\n", f"data:\n  dataset: {a}\n  obs_steps: 2\n  augment: vf_test_augment:shift\n") \
        + "eval:\n  every: 2\n  episodes: [1, 3]\n  batches: 2\n"
    ref = base / "ref"
    r = run(base, cfg, ["--checkpoint.dir", str(ref), "--train.log_file", str(base / "ref.jsonl"),
                        "--train.sample_log", str(base / "ref_samples")])
    assert "val_loss" in r.stdout and "(2 episodes)" in r.stdout
    train_a, val_a = log_records(base / "ref.jsonl")
    assert sorted(train_a) == list(range(1, 7)) and sorted(val_a) == [2, 4, 6]
    summary = json.loads((ref / "summary.json").read_text())
    assert summary["heldout_episodes"] == [1, 3]
    assert float.fromhex(val_a[6]) == summary["val_loss"] and len(summary["val_losses"]) == 3
    # training never saw a held-out episode; it saw every other one
    seen = set()
    for line in Path(f"{base / 'ref_samples'}.rank0.jsonl").read_text().splitlines():
        seen.update(json.loads(line)["episode_index"])
    assert seen and not seen & {1, 3} and seen <= {0, 2, 4}
    # stopped at step 3, resumed: the same losses and validation losses, bit for bit
    ck = base / "stopped"
    run(base, cfg, ["--checkpoint.dir", str(ck), "--train.log_file", str(base / "b.jsonl"), "--train.stop_at", "3"])
    r = run(base, cfg, ["--checkpoint.dir", str(ck), "--train.log_file", str(base / "b.jsonl"),
                        "--checkpoint.resume", "auto"])
    assert "at step 3" in r.stdout
    train_b, val_b = log_records(base / "b.jsonl")
    assert train_b == train_a and val_b == val_a
    # the augmentation changes what is trained on: without it the losses differ
    plain = cfg.replace("  augment: vf_test_augment:shift\n", "")
    run(base, plain, ["--checkpoint.dir", str(base / "plain"), "--train.log_file", str(base / "plain.jsonl"),
                      "--train.steps", "3"])
    train_c, _ = log_records(base / "plain.jsonl")
    assert train_c[1] != train_a[1]  # same init and samples: only the augmented images differ


def test_run_identity_covers_the_data_keys(setup):
    base, a, _ = setup
    cfg = BASE.replace("data:\n", f"data:\n  dataset: {a}\n")
    ck = base / "ident"
    run(base, cfg, ["--checkpoint.dir", str(ck), "--train.stop_at", "3"])
    r = run(base, cfg, ["--checkpoint.dir", str(ck), "--checkpoint.resume", "auto", "--data.obs_steps", "2"],
            expect=3)
    assert "'data.obs_steps' is 1 there and 2 here" in r.stderr


# ---------------------------------------------------------------------------
# data.mix

def test_mix_config_errors(setup, tmp_path):
    base, a, b = setup
    with pytest.raises(ConfigError, match="data.dataset and data.mix are exclusive"):
        load_config(None, ["--data.dataset", str(a), "--data.mix", f"[{{dataset: {b}}}]"])
    bad = [("[3]", "entry 0: expected a mapping"),
           (f"[{{dataset: {a}, shards: {b}}}]", "exactly one of 'dataset'"),
           (f"[{{dataset: {a}, weight: 0}}]", "'weight' must be a number > 0"),
           (f"[{{dataset: {a}, colour: red}}]", "unknown field"),
           (f"[{{dataset: {tmp_path / 'nope'}}}]", "does not exist"),
           (f"[{{dataset: {a}, rename: [1]}}]", "'rename' must map")]
    for text, msg in bad:
        c = load_config(None, ["--data.mix", text])
        with pytest.raises(ConfigError, match=msg):
            vdata.parse_mix(c.data.mix)
    c = load_config(None, ["--data.mix", f"[{{dataset: {a}}}, {{dataset: {b}, rename: {{action: act}}}}]"])
    stream = vdata.DataPlan(c, vlafeed, 0, 1).training_stream()
    with pytest.raises(Exception, match="entry 1.*lacks action"):
        next(iter(stream))


def test_mix_shard_and_dataset_columns(setup, cli):
    base, a, b = setup
    shards = base / "shards_a"
    r = subprocess.run([cli, "convert", str(a), str(shards), "--to", "wds", "--past", "0", "--future",
                        str(CHUNK - 1), "--image-offsets", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    c = load_config(None, ["--data.mix", f"[{{shards: {shards}/shards/manifest.jsonl, weight: 1}}, {{dataset: {b}}}]",
                           "--data.chunk", str(CHUNK), "--data.batch_size", "4"])
    plan = vdata.DataPlan(c, vlafeed, 0, 1)
    batch = next(iter(plan.training_stream()))
    cam = plan.camera_keys[0]
    assert sorted(batch) == sorted(plan.columns() + ["dataset_index"])
    assert batch["action"].shape == (4, CHUNK, batch["observation.state"].shape[1])
    assert batch[cam].shape[1] == 3 and batch[cam].dtype == torch.uint8
    assert set(batch["dataset_index"].tolist()) == {0, 1}
    # shard samples equal the dataset's own frames (state, action chunk, pad mask)
    ds = vlafeed.LeRobotDataset(str(a), delta_timestamps={"action": [i / plan.fps for i in range(CHUNK)]})
    it = iter(plan.training_stream())
    checked, padded = 0, 0
    for _ in range(20):
        batch = next(it)
        for row in (batch["dataset_index"] == 0).nonzero().flatten().tolist():
            item = ds[int(batch["index"][row])]
            assert int(item["episode_index"]) == int(batch["episode_index"][row])
            assert torch.equal(item["observation.state"], batch["observation.state"][row])
            assert torch.equal(item["action"], batch["action"][row])
            assert torch.equal(item["action_is_pad"], batch["action_is_pad"][row])
            checked += 1
            padded += int(item["action_is_pad"].any())
    assert checked >= 30 and padded >= 1, (checked, padded)


def test_mix_trains_at_two_ranks_and_resumes_bit_identical(setup, cli):
    base, a, b = setup
    shards = base / "shards_a"
    if not (shards / "shards" / "manifest.jsonl").is_file():
        r = subprocess.run([cli, "convert", str(a), str(shards), "--to", "wds", "--past", "0", "--future",
                            str(CHUNK - 1), "--image-offsets", "0"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    cfg = BASE.replace("data:\n", f"data:\n  mix:\n    - {{dataset: {a}, weight: 0.5}}\n"
                                  f"    - {{dataset: {b}, weight: 0.25}}\n"
                                  f"    - {{shards: {shards}/shards/manifest.jsonl, weight: 0.25}}\n") \
        + "eval:\n  every: 4\n  episodes: [0]\n"
    cfg = cfg.replace("  steps: 6", "  steps: 8")
    ref = base / "mix_ref"
    r = run(base, cfg, ["--checkpoint.dir", str(ref), "--train.log_file", str(base / "mix_ref.jsonl"),
                        "--train.sample_log", str(base / "mix_samples")], procs=2)
    assert "FSDP2" in r.stdout
    a_losses, _ = log_records(base / "mix_ref.jsonl")
    assert sorted(a_losses) == list(range(1, 9))
    state = torch.load(ref / "step_00000008" / "rank1.pt", weights_only=True)["loader"]
    assert len(state["source_states"]) == 3 and state["position"] == 8 * 4  # the Mix's state, this rank's
    # validation at 2 ranks: episode 0 of the first source held out, never trained on, val_loss logged
    seen = set()
    for rank in range(2):
        for line in Path(f"{base / 'mix_samples'}.rank{rank}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            seen.update(zip(rec["dataset_index"], rec["episode_index"]))
    assert {d for d, _ in seen} == {0, 1, 2} and (0, 0) not in seen and (1, 0) in seen
    _, val = log_records(base / "mix_ref.jsonl")
    assert sorted(val) == [4, 8]
    assert json.loads((ref / "summary.json").read_text())["val_loss"] == float.fromhex(val[8])
    ck = base / "mix_stop"
    run(base, cfg, ["--checkpoint.dir", str(ck), "--train.log_file", str(base / "mix_b.jsonl"),
                    "--train.stop_at", "3"], procs=2)
    r = run(base, cfg, ["--checkpoint.dir", str(ck), "--train.log_file", str(base / "mix_b.jsonl"),
                        "--checkpoint.resume", "auto"], procs=2)
    assert "at step 3" in r.stdout and "exactly" in r.stdout
    b_losses, b_val = log_records(base / "mix_b.jsonl")
    assert b_losses == a_losses, {s: (a_losses[s], b_losses.get(s)) for s in a_losses}
    assert b_val == val
    # at another world size the Mix's sources cannot continue: the checkpoint is named, before any step
    r = run(base, cfg, ["--checkpoint.dir", str(ck), "--checkpoint.resume", "auto", "--train.steps", "10"],
            expect=3)
    assert "saved at world size 2, resuming at 1" in r.stderr and "does not reshard" in r.stderr, r.stderr[-2000:]
    r = run(base, cfg, ["--checkpoint.dir", str(ck), "--checkpoint.resume", "auto", "--train.steps", "10",
                        "--checkpoint.elastic_data", "restart_epoch"], expect=2)
    assert "restart_epoch cannot be used with data.mix" in r.stderr, r.stderr[-2000:]


# ---------------------------------------------------------------------------
# fuzzing the config parsers: any value is accepted or refused with a ConfigError, nothing else

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 50), st.floats(allow_nan=True),
                     st.text(max_size=12), st.sampled_from(["observation.state", "action", "/nonexistent", "."]))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.one_of(st.text(max_size=10),
                                                                                   st.sampled_from(
                                                                                       ["dataset", "shards",
                                                                                        "weight", "rename"])),
                                                                         inner, max_size=4)), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(entries=st.lists(_values, max_size=4))
def test_fuzz_parse_mix_only_raises_config_errors(entries):
    try:
        sources = vdata.parse_mix(entries)
    except ConfigError:
        return
    for s in sources:  # whatever passes is a well-formed source
        assert s.kind in ("dataset", "shards") and isinstance(s.path, str) and s.weight > 0
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.rename.items())


@settings(max_examples=200, deadline=None)
@given(window=st.dictionaries(st.one_of(st.text(max_size=10), st.sampled_from(list(FEATURES))), _values,
                              max_size=3),
       fps=st.sampled_from([10.0, 15.0, 30.0, 29.97]))
def test_fuzz_delta_timestamps_only_raises_config_errors(tmp_path_factory, window, fps):
    c = load_config(None, ["--data.dataset", "x"])
    c.data.delta_timestamps = window
    try:
        out = vdata.delta_timestamps(c, FEATURES, fps)
    except ConfigError:
        return
    for key, offsets in out.items():
        assert key in FEATURES and offsets
        assert all(abs(x * fps - round(x * fps)) < 1e-6 for x in offsets)
