"""LeRobot's own training entry point and dataset tools, unchanged, on vlafeed's classes
(issue 27).

lerobot_train_runner.py runs lerobot.scripts.lerobot_train.main() in LeRobot
0.6's venv (build-lerobot/venv312), twice with the same arguments: once as
LeRobot ships it, once through ``python -m vlafeed.lerobot train`` (the
patch that swaps in vlafeed's LeRobotDataset / LeRobotDatasetMetadata).
ACT, random init (no pretrained backbone), CPU, tiny dims, 3 steps, batch 4,
num_workers=0, a fixed seed, wandb off. Asserted, for all episodes, for
an episode subset and for lerobot-train's held-out eval split: the dataset
trained on is LeRobot's in one run and vlafeed's in the other, and every
item the DataLoader fetched (index and bytes of every value), every batch
tensor, every loss and every gradient norm (and, with the eval split,
every eval item and eval loss) is bit-identical. The subset runs go
through LeRobot's EpisodeAwareSampler and absolute_to_relative_idx; the
eval split through meta.episodes["tasks"] and hf_dataset.data.

lerobot_tools_runner.py runs LeRobot's dataset_tools.split_dataset on a
vlafeed LeRobotDataset (it reads meta.info, features, chunk settings,
episodes, tasks, file paths) and LeRobot's MultiLeRobotDataset built over
vlafeed children (meta.info.fps, features, stats aggregation), against the
same on LeRobot's own classes: identical split datasets (info.json,
episodes, data, video files) and identical items and stats.

The dataset is make-sample H.264 with one MP4 per episode, so LeRobot's own
timestamp check passes everywhere (concatenated files drift; #3177, see
test_upstream_lerobot.py). Skips, with the reason printed, without the venv,
without accelerate in it (install_lerobot06.sh adds it), or without
vlafeed built for its Python (make py312-inplace).
"""
import json
import math
import pathlib
import subprocess

import pytest

import damage
import lerobot_venv

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]

ACT_TINY = ["--policy.type=act", "--policy.device=cpu", "--policy.push_to_hub=false",
            "--policy.pretrained_backbone_weights=null", "--policy.dim_model=32", "--policy.n_heads=2",
            "--policy.dim_feedforward=64", "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1",
            "--policy.n_vae_encoder_layers=1", "--policy.latent_dim=8", "--policy.chunk_size=4",
            "--policy.n_action_steps=4"]
STEPS, BATCH = 3, 4


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lerobot-train-env")
    py, why = lerobot_venv.lerobot06_python(tmp)
    if py is None:
        print(f"\nSKIP lerobot-train on vlafeed: {why}")
        pytest.skip(why)
    env = _env(tmp)
    r = subprocess.run([py, "-c", "import accelerate, vlafeed.lerobot, vlafeed; print(vlafeed.__version__)"],
                       capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        why = (f"vlafeed or accelerate does not import in {py} (make py312-inplace; "
               f"tests/python/install_lerobot06.sh): {r.stderr.strip()[-400:]}")
        print(f"\nSKIP lerobot-train on vlafeed: {why}")
        pytest.skip(why)
    return py


def _env(tmp):
    # One thread and a fixed hash seed in both runs (LeRobot's split orders tasks through a set).
    return lerobot_venv.env(tmp, PYTHONPATH=str(ROOT / "python"), OMP_NUM_THREADS="1", PYTHONHASHSEED="0")


@pytest.fixture(scope="module")
def sample(cli, tmp_path_factory):
    return damage.make_sample(cli, tmp_path_factory.mktemp("train-upstream") / "ds", episodes=4, size="96x64",
                              min_length=20, max_length=30, extra=("--max-video-mb", "0.0001"))


def train(py, tmp, mode, sample, episodes, extra=()):
    out = tmp / f"{mode}.json"
    args = [f"--dataset.repo_id=local/{sample.name}", f"--dataset.root={sample}", *ACT_TINY,
            f"--steps={STEPS}", f"--batch_size={BATCH}", "--num_workers=0", "--seed=7", "--wandb.enable=false",
            "--save_checkpoint=false", "--log_freq=1", f"--output_dir={tmp / ('out-' + mode)}"]
    if episodes is not None:
        args.append("--dataset.episodes=[" + ",".join(str(e) for e in episodes) + "]")
    args += list(extra)
    r = subprocess.run([py, str(HERE / "lerobot_train_runner.py"), mode, str(out), *args], capture_output=True,
                       text=True, env=_env(tmp), timeout=600)
    assert r.returncode == 0, f"{mode}: {r.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.parametrize("episodes", [None, [3, 1]], ids=["all-episodes", "episode-subset"])
def test_lerobot_train_is_bit_identical_on_vlafeed(lerobot, sample, tmp_path, episodes):
    theirs = train(lerobot, tmp_path, "upstream", sample, episodes)
    mine = train(lerobot, tmp_path, "vlafeed", sample, episodes)
    assert theirs["dataset_class"] == "lerobot.datasets.lerobot_dataset.LeRobotDataset"
    assert mine["dataset_class"] == "vlafeed.data.dataset.LeRobotDataset"
    assert mine["meta_class"] == "vlafeed.data.dataset.LeRobotDatasetMetadata"
    assert (mine["num_frames"], mine["num_episodes"], mine["episodes"]) == \
        (theirs["num_frames"], theirs["num_episodes"], theirs["episodes"])
    assert len(theirs["steps"]) == STEPS and len(theirs["items"]) >= STEPS * BATCH
    assert mine["items"] == theirs["items"], "the DataLoader fetched other items (or other bytes)"
    for step, (a, b) in enumerate(zip(theirs["steps"], mine["steps"])):
        assert b["batch"] == a["batch"], f"step {step}: batch tensors differ"
        assert b["loss"] == a["loss"] and b["grad_norm"] == a["grad_norm"], f"step {step}: {a} vs {b}"
        assert math.isfinite(a["loss"]) and a["grad_norm"] > 0
    if episodes is not None:
        import vlafeed
        meta = vlafeed.LeRobotDatasetMetadata(root=sample)
        allowed = {i for e in episodes for i in range(meta.episodes["dataset_from_index"][e],
                                                      meta.episodes["dataset_to_index"][e])}
        positions = {p for p, _ in mine["items"]}
        # Positions in the subset (0..len-1), reached through absolute_to_relative_idx: all valid.
        assert positions <= set(range(mine["num_frames"])) and len(allowed) == mine["num_frames"]
    print(f"\n{episodes or 'all episodes'}: {len(mine['items'])} items, losses "
          f"{[s['loss'] for s in mine['steps']]} identical to LeRobot's")


def test_lerobot_train_eval_split_is_bit_identical_on_vlafeed(lerobot, sample, tmp_path):
    """lerobot-train's held-out split (make_train_eval_datasets): the train set is an episode
    subset LeRobot picks per task from meta.episodes["tasks"], the eval set is read through
    hf_dataset.data.column("task_index") for max_eval_samples and evaluated at step 3."""
    extra = ("--dataset.eval_split=0.5", "--max_eval_samples=4", f"--eval_steps={STEPS}")
    theirs = train(lerobot, tmp_path, "upstream", sample, None, extra)
    mine = train(lerobot, tmp_path, "vlafeed", sample, None, extra)
    assert mine["dataset_class"] == "vlafeed.data.dataset.LeRobotDataset"
    assert theirs["episodes"] == mine["episodes"] and theirs["eval_episodes"] == mine["eval_episodes"]
    assert mine["episodes"] and mine["eval_episodes"] and theirs["eval_items"]
    assert mine["items"] == theirs["items"] and mine["eval_items"] == theirs["eval_items"]
    assert mine["steps"] == theirs["steps"]
    assert theirs["eval_losses"] and mine["eval_losses"] == theirs["eval_losses"]


def test_lerobot_dataset_tools_read_vlafeed_metadata(lerobot, sample, tmp_path):
    results = {}
    for mode in ("upstream", "vlafeed"):
        out = tmp_path / f"tools-{mode}.json"
        r = subprocess.run([lerobot, str(HERE / "lerobot_tools_runner.py"), mode, str(sample),
                            str(tmp_path / f"split-{mode}"), str(out)], capture_output=True, text=True,
                           env=_env(tmp_path), timeout=600)
        assert r.returncode == 0, f"{mode}: {r.stderr[-4000:]}"
        results[mode] = json.loads(out.read_text())
    theirs, mine = results["upstream"], results["vlafeed"]
    assert mine["dataset_class"] == "vlafeed.data.dataset.LeRobotDataset"
    assert mine["child_class"] == "vlafeed.data.dataset.LeRobotDataset"
    assert theirs["child_class"] == "lerobot.datasets.lerobot_dataset.LeRobotDataset"
    assert set(mine["split"]) == {"a", "b"}
    for name in ("a", "b"):
        for part in ("info", "episodes", "data", "videos"):
            assert mine["split"][name][part] == theirs["split"][name][part], (name, part)
        for video in theirs["split"][name]["videos"]:
            assert (tmp_path / "split-vlafeed" / name / video).read_bytes() == \
                (tmp_path / "split-upstream" / name / video).read_bytes(), video
    assert mine["split_lens"] == theirs["split_lens"]
    assert mine["multi"] == theirs["multi"]


def test_patch_unpatch_and_the_entry_point(lerobot, tmp_path):
    code = (
        "import vlafeed.lerobot as L, vlafeed\n"
        "from lerobot.datasets import factory, lerobot_dataset, dataset_metadata\n"
        "import lerobot.datasets as pkg\n"
        "orig = (factory.LeRobotDataset, factory.LeRobotDatasetMetadata, pkg.MultiLeRobotDataset)\n"
        "replaced = L.patch()\n"
        "assert factory.LeRobotDataset is vlafeed.LeRobotDataset, replaced\n"
        "assert lerobot_dataset.LeRobotDataset is vlafeed.LeRobotDataset\n"
        "assert dataset_metadata.LeRobotDatasetMetadata is vlafeed.LeRobotDatasetMetadata\n"
        "assert pkg.MultiLeRobotDataset is vlafeed.MultiLeRobotDataset and L.is_patched()\n"
        "assert 'lerobot.datasets.factory.LeRobotDataset' in replaced\n"
        "assert L.patch() == replaced\n"
        "import lerobot.scripts.lerobot_edit_dataset as late  # first imported while patched\n"
        "assert late.LeRobotDataset is vlafeed.LeRobotDataset\n"
        "L.unpatch()\n"
        "assert (factory.LeRobotDataset, factory.LeRobotDatasetMetadata, pkg.MultiLeRobotDataset) == orig\n"
        "assert late.LeRobotDataset is orig[0]\n"
        "assert not L.is_patched()\n"
        "print('ok')\n")
    env = _env(tmp_path)
    r = subprocess.run([lerobot, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
    r = subprocess.run([lerobot, "-m", "vlafeed.lerobot", "--help"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0 and "python -m vlafeed.lerobot COMMAND" in r.stderr
    r = subprocess.run([lerobot, "-m", "vlafeed.lerobot", "fly"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 2 and "train" in r.stderr


def test_patch_without_lerobot_names_it():
    """In an environment without LeRobot (this one), patch() says what is missing."""
    import importlib.util
    if importlib.util.find_spec("lerobot") is not None:
        pytest.skip("LeRobot is importable in this interpreter")
    import vlafeed.lerobot
    with pytest.raises(ImportError, match="lerobot.datasets.dataset_metadata.*install lerobot"):
        vlafeed.lerobot.patch()
    assert not vlafeed.lerobot.is_patched()
