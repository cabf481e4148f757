"""The Python loader API end to end on make-sample datasets (and the real
LeRobot v2.1 fixture): LeRobot's item layout, shapes and dtypes; values
equal make-sample's ground truth; frames equal `vlafeed frame`'s decode;
zero-copy tensors that keep the batch alive; exact epoch coverage through
vlafeed.Loader and torch DataLoader with 0 and 2 workers; determinism;
Python exceptions carrying the C messages; the plan document and CLI."""
import math
import os
import pickle
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import vlafeed  # noqa: E402
import vlafeed.torch  # noqa: E402
from vlafeed import _native  # noqa: E402

FPS = 10
STATE_DIM = 6


def run(cli, *args):
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def sample_root(cli, tmp_path_factory):
    """6 episodes of 10..30 frames, 2 H.264 cameras of 96x64, several MP4
    files per camera (rollover), fps 10."""
    root = tmp_path_factory.mktemp("loader") / "ds"
    r = run(cli, "make-sample", root, "--episodes", 6, "--codec", "h264", "--size", "96x64", "--fps", FPS,
            "--min-length", 10, "--max-length", 30, "--max-video-mb", 0.03, "--quiet")
    assert r.returncode == 0, r.stderr
    return root


def state(e, k, d):
    return np.float32(math.sin(0.05 * k + 0.3 * d + e))


def action(e, k, d):
    return np.float32(math.sin(0.05 * (k + 1) + 0.3 * d + e))


def episode_ranges(ds):
    out, start = [], 0
    for ep in ds.meta.selected_episodes:
        out.append((ep["episode_index"], start, start + ep["length"]))
        start += ep["length"]
    return out


def locate(ds, i):
    for e, lo, hi in episode_ranges(ds):
        if lo <= i < hi:
            return e, i - lo
    raise AssertionError(i)


def ppm_pixels(path):
    data = path.read_bytes()
    head, rest = data.split(b"\n", 1)
    size, rest = rest.split(b"\n", 1)
    _, pixels = rest.split(b"\n", 1)
    w, h = map(int, size.split())
    return np.frombuffer(pixels, np.uint8).reshape(h, w, 3)


# ---- LeRobotDataset -----------------------------------------------------------------


def test_item_layout_shapes_dtypes(sample_root):
    ds = vlafeed.LeRobotDataset(sample_root)
    assert len(ds) == ds.num_frames == ds.meta.total_frames
    item = ds[3]
    assert list(item) == ["observation.images.cam0", "observation.images.cam1", "action", "observation.state",
                          "timestamp", "frame_index", "episode_index", "index", "task_index", "task"]
    for cam in ds.meta.camera_keys:
        assert item[cam].shape == (3, 64, 96) and item[cam].dtype == torch.float32
        assert 0.0 <= float(item[cam].min()) and float(item[cam].max()) <= 1.0
    assert item["action"].shape == (STATE_DIM,) and item["action"].dtype == torch.float32
    assert item["timestamp"].shape == () and item["timestamp"].dtype == torch.float32
    for key in ("frame_index", "episode_index", "index", "task_index"):
        assert item[key].shape == () and item[key].dtype == torch.int64
    assert isinstance(item["task"], str)
    assert item["task"] == ds.meta.task_list[int(item["task_index"])]
    assert int(item["index"]) == 3


def test_values_equal_ground_truth(sample_root):
    ds = vlafeed.LeRobotDataset(sample_root)
    for i in (0, 17, len(ds) - 1):
        e, k = locate(ds, i)
        item = ds[i]
        assert int(item["episode_index"]) == e and int(item["frame_index"]) == k
        assert float(item["timestamp"]) == np.float32(k / FPS)
        np.testing.assert_array_equal(item["observation.state"].numpy(), [state(e, k, d) for d in range(STATE_DIM)])
        np.testing.assert_array_equal(item["action"].numpy(), [action(e, k, d) for d in range(STATE_DIM)])


def test_deltas_pads_and_lerobot_shapes(sample_root):
    deltas = {"action": [-0.2, -0.1, 0.0, 0.1, 0.2], "observation.images.cam1": [0.0],
              "observation.state": [0.0]}
    ds = vlafeed.LeRobotDataset(sample_root, delta_timestamps=deltas)
    assert ds.delta_indices["action"] == [-2, -1, 0, 1, 2]
    (e0, lo, hi) = episode_ranges(ds)[1]
    first, last = ds[lo], ds[hi - 1]
    # LeRobot's example: first frame [T,T,F,F,F], last frame [F,F,F,T,T].
    assert first["action_is_pad"].tolist() == [True, True, False, False, False]
    assert last["action_is_pad"].tolist() == [False, False, False, True, True]
    assert first["action"].shape == (5, STATE_DIM)
    # Padded steps repeat the boundary frame.
    np.testing.assert_array_equal(first["action"][0].numpy(), first["action"][2].numpy())
    np.testing.assert_array_equal(last["action"][4].numpy(), [action(e0, hi - lo - 1, d) for d in range(STATE_DIM)])
    # Single-delta video squeezed to [C,H,W]; single-delta vector stays [1,N].
    assert first["observation.images.cam1"].shape == (3, 64, 96)
    assert first["observation.state"].shape == (1, STATE_DIM)
    assert first["observation.images.cam1_is_pad"].shape == (1,)
    keys = list(first)
    assert keys.index("task_index") < keys.index("action_is_pad") < keys.index("task")
    # lerobot_shapes=False keeps [T, ...].
    raw = vlafeed.LeRobotDataset(sample_root, delta_timestamps=deltas, lerobot_shapes=False)
    assert raw[lo]["observation.images.cam1"].shape == (1, 3, 64, 96)


def test_frames_equal_cli_decode_and_formats(sample_root, cli, tmp_path):
    f32 = vlafeed.LeRobotDataset(sample_root)
    u8 = vlafeed.LeRobotDataset(sample_root, image_format="uint8")
    hwc = vlafeed.LeRobotDataset(sample_root, return_uint8=False, image_format="uint8_hwc")
    for i in (0, 25, len(f32) - 1):
        e, k = locate(f32, i)
        out = tmp_path / f"f{i}.ppm"
        r = run(cli, "frame", sample_root, "--episode", e, "--frame", k, "--camera", "observation.images.cam1",
                "--out", out)
        assert r.returncode == 0, r.stderr
        ref = ppm_pixels(out)
        np.testing.assert_array_equal(hwc[i]["observation.images.cam1"].numpy(), ref)
        np.testing.assert_array_equal(u8[i]["observation.images.cam1"].numpy(), ref.transpose(2, 0, 1))
        assert u8[i]["observation.images.cam1"].dtype == torch.uint8
        np.testing.assert_array_equal(f32[i]["observation.images.cam1"].numpy(),
                                      ref.transpose(2, 0, 1).astype(np.float32) / np.float32(255))


def test_meta(sample_root):
    ds = vlafeed.LeRobotDataset(sample_root, episodes=[4, 1])
    meta = ds.meta
    assert meta.fps == FPS
    assert meta.total_episodes == 6 and ds.num_episodes == 2
    assert meta.camera_keys == ["observation.images.cam0", "observation.images.cam1"]
    assert meta.features["action"]["shape"] == (STATE_DIM,)
    assert meta.features["observation.images.cam0"]["dtype"] == "video"
    assert len(meta.tasks) == 3
    mean = meta.stats["observation.state"]["mean"]
    assert isinstance(mean, np.ndarray) and mean.shape == (STATE_DIM,)
    assert meta.stats["observation.images.cam0"]["mean"].shape == (3, 1, 1)
    assert [e["episode_index"] for e in meta.selected_episodes] == [1, 4]
    assert len(ds) == sum(e["length"] for e in meta.selected_episodes)
    assert meta.episodes["episode_index"] == list(range(6))  # LeRobot: the full table
    assert int(ds[0]["episode_index"]) == 1 and int(ds[len(ds) - 1]["episode_index"]) == 4


def test_pickle_round_trip(sample_root):
    ds = vlafeed.LeRobotDataset(sample_root, delta_timestamps={"action": [0.0, 0.1]})
    copy = pickle.loads(pickle.dumps(ds))
    a, b = ds[7], copy[7]
    assert a.keys() == b.keys()
    for key in a:
        if key != "task":
            assert torch.equal(a[key], b[key])


# ---- errors carry the C message ---------------------------------------------------------


def test_errors(sample_root, tmp_path):
    ds = vlafeed.LeRobotDataset(sample_root)
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]
    assert int(ds[-1]["index"]) == len(ds) - 1
    with pytest.raises(ValueError, match=r"delta_timestamps: unknown key 'observation\.velocity'"):
        vlafeed.LeRobotDataset(sample_root, delta_timestamps={"observation.velocity": [0.0]})
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\]\[1\]: 0\.05 s is not a multiple"):
        vlafeed.LeRobotDataset(sample_root, delta_timestamps={"action": [0.0, 0.05]})
    with pytest.raises(ValueError, match="renames: unknown key 'observation.images.top'"):
        vlafeed.Loader(sample_root, renames={"observation.images.top": "x"})
    with pytest.raises(ValueError, match="episode_pool_size 0"):
        vlafeed.Loader(sample_root, mode="pool", episode_pool_size=0)
    with pytest.raises(FileNotFoundError):
        vlafeed.LeRobotDataset(tmp_path / "nowhere")
    loader = _native.Loader(_native.Dataset(str(sample_root)), mode="map")
    with pytest.raises(IndexError, match="position -1"):
        loader.get_items([-1])


def test_missing_video_names_the_file(sample_root, tmp_path):
    import shutil
    copy = tmp_path / "ds"
    shutil.copytree(sample_root, copy)
    victim = copy / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    victim.unlink()
    ds = vlafeed.LeRobotDataset(copy)
    with pytest.raises(FileNotFoundError) as err:
        ds[0]
    message = str(err.value)
    assert "file-000.mp4" in message and "observation.images.cam0" in message and "episode 0" in message
    loader = vlafeed.Loader(copy, mode="stream", shuffle=False)
    with pytest.raises(FileNotFoundError, match="file-000.mp4"):
        for _ in loader:
            pass


# ---- zero copy ----------------------------------------------------------------------------


def test_zero_copy_views_keep_the_batch_alive(sample_root):
    native = _native.Loader(_native.Dataset(str(sample_root)), mode="map", batch_size=4, image_format="uint8")
    batch = native.get_items([0, 1, 2])
    assert len(batch) == 3 and batch.positions == [0, 1, 2]
    col = batch["observation.images.cam0"]
    assert col.shape == (3, 3, 64, 96) and col.dtype == "uint8"
    array = np.asarray(col)
    tensor = torch.from_numpy(np.asarray(batch["observation.images.cam0"]))
    assert array.ctypes.data == col.address == tensor.data_ptr()
    assert isinstance(batch["task"], list) and len(batch["task"]) == 3
    assert np.asarray(batch["index"]).dtype == np.int64
    assert np.asarray(batch["index"]).tolist() == [0, 1, 2]
    # Writes through one view are seen through another: the same memory.
    tensor[0, 0, 0, 0] = 7
    assert array[0, 0, 0, 0] == 7
    # Views keep the batch alive after every Python reference to it is gone.
    expected = tensor.clone()
    del batch, col, array
    native.get_items([5, 6, 7])  # would reuse the buffer if it had been released
    assert torch.equal(tensor, expected)
    # Through the Python Loader too.
    loader = vlafeed.Loader(sample_root, mode="stream", batch_size=8, image_format="uint8")
    first = next(iter(loader))
    assert first["observation.images.cam1"].dtype == torch.uint8
    assert first["observation.images.cam1"].shape == (8, 3, 64, 96)


# ---- epochs: coverage and determinism ------------------------------------------------------


def epoch_indices(loader):
    seen = []
    for batch in loader:
        seen.extend(batch["index"].tolist())
    return seen


@pytest.mark.parametrize("mode", ["stream", "map"])
def test_loader_epoch_exactly_once(sample_root, mode):
    # (Episode tasks: with only a few file groups, two epochs may draw the same task order.)
    loader = vlafeed.Loader(sample_root, mode=mode, batch_size=7, seed=3, threads=2, partition="episode")
    n = loader.dataset.num_frames
    a = epoch_indices(loader)
    assert sorted(a) == list(range(n))
    assert len(loader) == math.ceil(n / 7)
    b = epoch_indices(loader)  # a second pass is the next epoch
    assert loader.epoch == 1 and sorted(b) == list(range(n)) and a != b
    loader.set_epoch(0)
    assert epoch_indices(loader) == a
    again = vlafeed.Loader(sample_root, mode=mode, batch_size=7, seed=3, threads=1, partition="episode")
    assert epoch_indices(again) == a
    other = vlafeed.Loader(sample_root, mode=mode, batch_size=7, seed=4, threads=2, partition="episode")
    assert epoch_indices(other) != a
    stats = loader.stats()
    assert stats["samples"] == 3 * n and stats["frames_delivered"] >= 2 * n
    assert stats["first_batch_seconds"] > 0 and stats["p99_sample_ms"] >= stats["p50_sample_ms"] > 0


def test_loader_batches_values(sample_root):
    loader = vlafeed.Loader(sample_root, mode="stream", batch_size=16, seed=0,
                            delta_timestamps={"action": [0.0, 0.1]})
    for batch in loader:
        assert batch["action"].shape[1:] == (2, STATE_DIM)
        assert batch["action_is_pad"].shape[1:] == (2,)
        for row in range(batch["index"].shape[0]):
            e, k = int(batch["episode_index"][row]), int(batch["frame_index"][row])
            np.testing.assert_array_equal(batch["observation.state"][row].numpy(),
                                          [state(e, k, d) for d in range(STATE_DIM)])
        assert len(batch["task"]) == batch["index"].shape[0]


def test_rank_world_size_from_environment(sample_root, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = vlafeed.Loader(sample_root, mode="map", batch_size=5)
    assert (loader.rank, loader.world_size) == (1, 2)
    n = loader.dataset.num_frames
    assert loader.num_samples == (n + 1) // 2
    other = vlafeed.Loader(sample_root, mode="map", batch_size=5, rank=0)
    together = epoch_indices(loader) + epoch_indices(other)
    assert set(together) == set(range(n)) and len(together) == 2 * ((n + 1) // 2)


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_dataloader_covers_the_epoch_once(sample_root, workers):
    ds = vlafeed.torch.IterableDataset(sample_root, batch_size=6, seed=1, num_workers=workers, partition="episode")
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    seen, batches = [], 0
    for batch in dl:
        assert batch["observation.images.cam0"].shape[1:] == (3, 64, 96)
        seen.extend(batch["index"].tolist())
        batches += 1
    n = _native.Dataset(str(sample_root)).num_frames
    assert sorted(seen) == list(range(n))
    assert batches == len(ds)
    # The same again for the same epoch; another epoch reorders.
    again = [i for batch in dl for i in batch["index"].tolist()]
    assert again == seen
    ds.set_epoch(1)
    assert [i for batch in dl for i in batch["index"].tolist()] != seen


def test_torch_dataloader_workers_match_in_process_consumers(sample_root):
    # Two worker processes == one process with two consumers (same batch order).
    ds = vlafeed.torch.IterableDataset(sample_root, batch_size=5, seed=2)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    workers = [batch["index"].tolist() for batch in dl]
    loader = vlafeed.Loader(sample_root, batch_size=5, seed=2, num_consumers=2)
    assert workers == [batch["index"].tolist() for batch in loader]


def test_map_dataset_in_dataloader_workers(sample_root):
    ds = vlafeed.LeRobotDataset(sample_root)
    ds[0]  # the parent opened its engine before forking
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
    seen = [i for batch in dl for i in batch["index"].tolist()]
    assert seen == list(range(len(ds)))


# ---- plan ----------------------------------------------------------------------------------


def test_plan_document_and_cli(sample_root, cli):
    doc = _native.plan(str(sample_root), world_size=2, num_consumers=2)
    native = _native.Dataset(str(sample_root))
    assert doc["episodes"] == 6 and doc["frames"] == native.num_frames and doc["consumers"] == 4
    s = doc["strategies"]
    files = sum(c["files"] for c in doc["cameras"])
    assert s["episode"]["tasks"] == 6 and s["episode"]["video_opens"] == 12
    assert s["file_group"]["tasks"] < 6 and s["file_group"]["video_opens"] >= files
    assert s["sequential"]["tasks"] <= 4
    assert doc["samples_per_rank"] == math.ceil(native.num_frames / 2)
    r = run(cli, "plan", sample_root, "--json", "--world-size", 2, "--workers", 2)
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads(r.stdout)["strategies"] == s
    r = run(cli, "plan", sample_root)
    assert r.returncode == 0 and "file_group" in r.stdout and "video opens" in r.stdout
    r = run(cli, "plan", "--help")
    assert r.returncode == 0 and "file_group" in r.stdout
    r = run(cli, "plan", sample_root, "--world-size", 0)
    assert r.returncode == 2
    r = run(cli, "plan", sample_root.parent / "nowhere")
    assert r.returncode == 1 and "nowhere" in r.stderr


# ---- the real LeRobot v2.1 fixture ----------------------------------------------------------


def test_real_v21_fixture(g1_dir, cli, tmp_path):
    if not (g1_dir / "meta" / "info.json").is_file():
        pytest.skip("G1 fixture missing")
    info = _native.Dataset(str(g1_dir)).info()
    present = [e["episode_index"] for e in info.get("episodes", []) if not e.get("missing_files")]
    episodes = present[:2] if present else [1]
    ds = vlafeed.LeRobotDataset(g1_dir, episodes=episodes, image_format="uint8_hwc",
                                delta_timestamps={"action": [-1 / 30, 0.0, 1 / 30]})
    cam = "observation.images.cam_high"
    item = ds[5]
    e, k = int(item["episode_index"]), int(item["frame_index"])
    out = tmp_path / "g1.ppm"
    r = run(cli, "frame", g1_dir, "--episode", e, "--frame", k, "--camera", cam, "--out", out)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(item[cam].numpy(), ppm_pixels(out))
    assert item["action"].shape == (3, ds.meta.features["action"]["shape"][0])
    assert item["action_is_pad"].tolist() == [False, False, False]


def test_keys_renames_resize_normalize(sample_root):
    ds = vlafeed.LeRobotDataset(sample_root, keys=["observation.images.cam1", "action", "index"],
                                renames={"observation.images.cam1": "observation.images.base_0_rgb"},
                                delta_timestamps={"observation.images.cam1": [-0.1, 0.0]}, resize=(48, 32),
                                normalize={"action": "mean_std"})
    item = ds[4]
    assert list(item) == ["observation.images.base_0_rgb", "action", "index",
                          "observation.images.base_0_rgb_is_pad", "task"]
    assert item["observation.images.base_0_rgb"].shape == (2, 3, 32, 48)
    e, k = locate(ds, 4)
    mean = ds.meta.stats["action"]["mean"].astype(np.float32)
    std = ds.meta.stats["action"]["std"].astype(np.float32)
    raw = np.array([action(e, k, d) for d in range(STATE_DIM)], np.float32)
    np.testing.assert_allclose(item["action"].numpy(), (raw - mean) / (std + np.float32(1e-8)), rtol=1e-6)
    # Tabular-only: no camera decoded at all.
    loader = vlafeed.Loader(sample_root, mode="stream", keys=["observation.state"], include_task=False, batch_size=50)
    batches = list(loader)
    assert list(batches[0]) == ["observation.state"]
    assert sum(b["observation.state"].shape[0] for b in batches) == loader.dataset.num_frames
    assert loader.stats()["frames_decoded"] == 0
