"""vlafeed's Python API against the LeRobot reference (lerobot_reference.py).

For random positions (fixed seed) plus every episode boundary, with and
without delta windows, on make-sample datasets (AV1 and H.264, several
episodes per MP4, several MP4s per camera, timestamp drift present) and on
the real LeRobot v2.1 fixture (episodes 1, 2, 4):
  * vlafeed.LeRobotDataset returns the same keys in the same order, shapes,
    dtypes and values as the reference: tabular values exact, frames
    pixel-exact (both sides use swscale's bilinear yuv420p->rgb24 at source
    size; float32 = uint8 / 255), is_pad exact, task strings equal;
  * len() and .meta agree (fps, totals, camera keys, tasks, features, stats);
  * vlafeed.Loader batches (stream and map mode, 1 and 2 ranks) equal the
    reference item for the position each sample reports (its "index"
    column), cover the epoch exactly once, and are reproducible by seed;
  * vlafeed.torch.IterableDataset behind a torch DataLoader does the same.
The reference has no timestamp drift problem (ordinal mapping), so vlafeed
must return every drifting episode too.

Until the vlafeed Python API exists those tests SKIP with the reason. The
vlafeed command's own frame path (`vlafeed frame`, `vlafeed decode-check`) is
compared with the reference already: same pixels for the same (episode,
frame, camera), same drift per episode.
"""
import subprocess
import numpy as np
import pytest
import torch

import lerobot_reference as R

try:
    import vlafeed
    _API_MISSING = [n for n in ("LeRobotDataset", "Loader") if not hasattr(vlafeed, n)]
    _WHY = (f"vlafeed.{_API_MISSING[0]} does not exist yet (the loader's Python API is not merged)"
            if _API_MISSING else "")
except ImportError as e:  # the extension is not built
    vlafeed, _API_MISSING, _WHY = None, ["vlafeed"], f"the vlafeed package does not import: {e}"

needs_api = pytest.mark.skipif(bool(_API_MISSING), reason=_WHY or "vlafeed API present")

FPS = 30
DELTAS = {"observation.state": [-0.1, 0, 0.1], "action": [0, 1 / 30, 2 / 30], "observation.images.cam0": [-1 / 30, 0]}
G1_DELTAS = {"observation.state": [-0.1, 0, 0.1], "action": [0, 1 / 30, 2 / 30],
             "observation.images.cam_high": [-1 / 30, 0]}
G1_EPISODES = [1, 2, 4]


def positions_for(ref, n=40, seed=1234):
    """n random positions (fixed seed) plus each episode's first two and last
    two rows (where windows clamp and pad)."""
    rng = np.random.default_rng(seed)
    ps = set(rng.choice(len(ref), size=min(n, len(ref)), replace=False).tolist())
    for a, b in zip(ref.ep_from, ref.ep_to):
        ps |= {a, min(a + 1, b - 1), max(b - 2, a), b - 1}
    return sorted(ps)


def assert_same_items(ref, got_ds, positions, what):
    problems = []
    for p in positions:
        diffs = R.item_differences(ref[p], got_ds[p])
        if diffs:
            problems.append(f"{what} position {p}:\n  " + "\n  ".join(diffs))
    assert not problems, f"{len(problems)} of {len(positions)} items differ:\n" + "\n".join(problems[:8])


@pytest.fixture(scope="module", params=["av1", "h264"])
def sample(request, tmp_path_factory, cli):
    return request.param, R.sample_dataset(tmp_path_factory, cli, request.param)


# ---------------------------------------------------------------------------
# vlafeed.LeRobotDataset

@needs_api
@pytest.mark.parametrize("deltas", [None, DELTAS], ids=["plain", "deltas"])
def test_dataset_items_equal_the_reference(sample, deltas):
    name, root = sample
    ref = R.ReferenceDataset(root, delta_timestamps=deltas)
    ds = vlafeed.LeRobotDataset(str(root), delta_timestamps=deltas)
    assert len(ds) == len(ref)
    assert_same_items(ref, ds, positions_for(ref), f"{name} {'deltas' if deltas else 'plain'}")


@needs_api
def test_dataset_uint8_and_episode_subset(sample):
    name, root = sample
    episodes = [5, 0, 3]
    ref = R.ReferenceDataset(root, episodes=episodes, delta_timestamps=DELTAS, image_format="uint8")
    ds = vlafeed.LeRobotDataset(str(root), episodes=episodes, delta_timestamps=DELTAS, image_format="uint8")
    assert len(ds) == len(ref)
    assert_same_items(ref, ds, positions_for(ref, n=20), f"{name} uint8 episodes={episodes}")


@needs_api
def test_dataset_returns_every_drifting_episode(tmp_path_factory, cli):
    """LeRobot's lookup raises on these (#3177); vlafeed maps by ordinal."""
    root = R.sample_dataset(tmp_path_factory, cli, "av1")
    compat = R.ReferenceDataset(root, lerobot_compat=True, image_format="uint8")
    ref = R.ReferenceDataset(root, image_format="uint8")
    ds = vlafeed.LeRobotDataset(str(root), image_format="uint8")
    drifting = []
    for a, b in zip(ref.ep_from, ref.ep_to):
        try:
            compat[b - 1]
        except R.FrameTimestampError:
            drifting.append(b - 1)
    assert drifting
    assert_same_items(ref, ds, drifting, "drifting episodes' last frames")


@needs_api
def test_dataset_meta(sample):
    name, root = sample
    ref = R.ReferenceMeta(root)
    meta = vlafeed.LeRobotDataset(str(root)).meta
    assert meta.fps == ref.fps
    assert meta.total_frames == ref.total_frames and meta.total_episodes == ref.total_episodes
    assert list(meta.camera_keys) == ref.camera_keys
    assert list(meta.tasks.index) == ref.tasks  # LeRobot: a DataFrame indexed by task
    assert list(meta.features) == list(ref.features)
    for k, f in ref.features.items():
        assert meta.features[k]["dtype"] == f["dtype"], k
        assert list(meta.features[k]["shape"]) == list(f["shape"]), k
    assert set(meta.stats) == set(ref.stats)
    for feat, st in ref.stats.items():
        for stat, want in st.items():
            got = np.asarray(meta.stats[feat][stat], dtype=np.float64)
            assert got.shape == want.shape, (feat, stat)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9, err_msg=f"{feat}/{stat}")


@needs_api
def test_dataset_errors(tmp_path_factory, cli):
    root = str(R.sample_dataset(tmp_path_factory, cli, "av1"))
    with pytest.raises(ValueError):
        vlafeed.LeRobotDataset(root, delta_timestamps={"action": [0, 0.01]})  # not a multiple of 1/30
    ds = vlafeed.LeRobotDataset(root)
    with pytest.raises(IndexError):
        ds[len(ds)]
    # (vlafeed raises FileNotFoundError here; IndexError or ValueError would
    # say better what is wrong: reported, not pinned)
    with pytest.raises((IndexError, ValueError, KeyError, FileNotFoundError), match="99"):
        vlafeed.LeRobotDataset(root, episodes=[99])
    with pytest.raises(ValueError):
        vlafeed.LeRobotDataset(root, image_format="float16")


# ---------------------------------------------------------------------------
# the real LeRobot v2.1 fixture

@needs_api
@pytest.mark.parametrize("deltas", [None, G1_DELTAS], ids=["plain", "deltas"])
def test_fixture_items_equal_the_reference(g1_dir, deltas):
    ref = R.ReferenceDataset(g1_dir, episodes=G1_EPISODES, delta_timestamps=deltas)
    ds = vlafeed.LeRobotDataset(str(g1_dir), episodes=G1_EPISODES, delta_timestamps=deltas)
    assert len(ds) == len(ref) == 393 + 343 + 357
    assert_same_items(ref, ds, positions_for(ref, n=16), f"g1 {'deltas' if deltas else 'plain'}")


@needs_api
def test_fixture_meta(g1_dir):
    ref = R.ReferenceMeta(g1_dir)
    meta = vlafeed.LeRobotDataset(str(g1_dir), episodes=G1_EPISODES).meta
    assert meta.fps == 30 and list(meta.camera_keys) == ["observation.images.cam_high"]
    assert list(meta.tasks.index) == ref.tasks  # LeRobot: a DataFrame indexed by task
    assert meta.total_episodes == 100 and meta.total_frames == ref.total_frames


# ---------------------------------------------------------------------------
# vlafeed.Loader and vlafeed.torch.IterableDataset

def check_batch(ref, batch, seen, what):
    """Every sample of a batch equals the reference item at its index."""
    keys = [k for k in batch if k != "task"]
    idx = batch["index"]
    assert isinstance(idx, torch.Tensor) and idx.dtype == torch.int64 and idx.ndim == 1, what
    B = idx.shape[0]
    assert isinstance(batch["task"], list) and len(batch["task"]) == B, what
    problems = []
    for b in range(B):
        p = ref.position_of_index(int(idx[b]))
        seen.append(p)
        want = ref[p]
        got = {k: batch[k][b] for k in keys}
        got["task"] = batch["task"][b]
        diffs = R.item_differences(want, got)
        if diffs:
            problems.append(f"{what} sample {b} (index {int(idx[b])}):\n  " + "\n  ".join(diffs))
    assert not problems, "\n".join(problems[:5])


def run_epoch(ref, loader, what, max_batches=None):
    seen = []
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        check_batch(ref, batch, seen, f"{what} batch {i}")
    return seen


@needs_api
@pytest.mark.parametrize("mode", ["stream", "map"])
def test_loader_batches_equal_the_reference(sample, mode):
    name, root = sample
    ref = R.ReferenceDataset(root, delta_timestamps=DELTAS).preload_videos()
    loader = vlafeed.Loader(str(root), mode=mode, batch_size=8, seed=7, delta_timestamps=DELTAS, drop_last=False)
    seen = run_epoch(ref, loader, f"{name} {mode}")
    assert sorted(seen) == list(range(len(ref))), "an epoch must cover every position exactly once"
    stats = loader.stats()
    assert isinstance(stats, dict)


@needs_api
def test_loader_uint8_and_episode_subset(tmp_path_factory, cli):
    root = R.sample_dataset(tmp_path_factory, cli, "h264")
    ref = R.ReferenceDataset(root, episodes=[1, 4], image_format="uint8").preload_videos()
    ds = vlafeed.LeRobotDataset(str(root), episodes=[1, 4], image_format="uint8")
    loader = vlafeed.Loader(ds, mode="stream", batch_size=5, seed=3, drop_last=False)
    seen = run_epoch(ref, loader, "h264 uint8 episodes [1,4]")
    assert sorted(seen) == list(range(len(ref)))


@needs_api
def test_loader_ranks_partition_the_epoch(tmp_path_factory, cli):
    root = str(R.sample_dataset(tmp_path_factory, cli, "av1"))
    ref = R.ReferenceDataset(root).preload_videos()
    parts = []
    for rank in range(2):
        loader = vlafeed.Loader(root, mode="stream", batch_size=4, seed=11, rank=rank, world_size=2, drop_last=False)
        parts.append(run_epoch(ref, loader, f"rank {rank}/2"))
    assert not set(parts[0]) & set(parts[1]), "ranks must not share samples"
    union = sorted(parts[0] + parts[1])
    # equal shares: a rank may repeat or drop a few samples to even them out
    assert set(union) <= set(range(len(ref)))
    assert len(set(union)) >= len(ref) - 2 * 4


@needs_api
def test_loader_is_reproducible_and_epochs_differ(tmp_path_factory, cli):
    root = str(R.sample_dataset(tmp_path_factory, cli, "av1"))

    def order(epoch, seed=5):
        loader = vlafeed.Loader(root, mode="stream", batch_size=6, seed=seed)
        loader.set_epoch(epoch)
        return [int(i) for b in loader for i in b["index"]]

    a, b, c = order(0), order(0), order(1)
    assert a == b, "same seed and epoch must give the same order"
    assert a != c and sorted(a) == sorted(c), "another epoch: another order of the same samples"


@needs_api
def test_torch_iterable_dataset(tmp_path_factory, cli):
    vt = pytest.importorskip("vlafeed.torch", reason="vlafeed.torch is not importable")
    if not hasattr(vt, "IterableDataset"):
        pytest.skip("vlafeed.torch.IterableDataset does not exist yet")
    root = str(R.sample_dataset(tmp_path_factory, cli, "av1"))
    ref = R.ReferenceDataset(root, delta_timestamps=DELTAS)
    ids = vt.IterableDataset(root, batch_size=8, seed=1, delta_timestamps=DELTAS)
    dl = torch.utils.data.DataLoader(ids, batch_size=None, num_workers=0)
    seen = run_epoch(ref, dl, "torch DataLoader", max_batches=6)
    assert len(seen) == 6 * 8


# ---------------------------------------------------------------------------
# the vlafeed command's frame path (runs without the Python API)

def read_ppm(path):
    data = open(path, "rb").read()
    parts = data.split(maxsplit=4)
    assert parts[0] == b"P6" and parts[3] == b"255", parts[:4]
    w, h = int(parts[1]), int(parts[2])
    return np.frombuffer(parts[4][: w * h * 3], np.uint8).reshape(h, w, 3)


def cli_frame(cli, root, e, k, key, out):
    subprocess.run([cli, "frame", str(root), "--episode", str(e), "--frame", str(k), "--camera", key,
                    "--out", str(out)], check=True, capture_output=True)
    return read_ppm(out)


def cli_available(cli, sub):
    r = subprocess.run([cli, sub, "--help"], capture_output=True, text=True)
    return "not implemented" not in (r.stdout + r.stderr).lower()


@pytest.mark.parametrize("name", ["av1", "h264", "h264-gop12"])
def test_cli_frame_equals_the_reference(name, tmp_path, tmp_path_factory, cli):
    if not cli_available(cli, "frame"):
        pytest.skip("vlafeed frame is not implemented yet")
    root = R.sample_dataset(tmp_path_factory, cli, name)
    ref = R.ReferenceDataset(root, image_format="uint8")
    rng = np.random.default_rng(5)
    checked = 0
    for ep in ref.meta.episodes:
        e, n = ep["episode_index"], ep["length"]
        for k in sorted({0, 1, n - 1, int(rng.integers(n))}):
            for ci, key in enumerate(ref.meta.camera_keys):
                got = cli_frame(cli, root, e, k, key, tmp_path / "f.ppm")
                want = ref.frames_uint8_hwc(key, e, [k])[0]
                assert got.shape == want.shape and np.array_equal(got, want), (name, e, k, key)
                checked += 1
    assert checked >= 3 * len(ref.meta.episodes) * len(ref.meta.camera_keys)


def test_cli_frame_equals_the_reference_on_the_fixture(g1_dir, tmp_path, cli):
    if not cli_available(cli, "frame"):
        pytest.skip("vlafeed frame is not implemented yet")
    ref = R.ReferenceDataset(g1_dir, episodes=G1_EPISODES, image_format="uint8")
    key = "observation.images.cam_high"
    for e in G1_EPISODES:
        n = ref.meta.episodes[e]["length"]
        for k in (0, 1, 150, n - 1):
            got = cli_frame(cli, g1_dir, e, k, key, tmp_path / "f.ppm")
            assert np.array_equal(got, ref.frames_uint8_hwc(key, e, [k])[0]), (e, k)


@pytest.mark.parametrize("name", ["av1", "h264"])
def test_cli_decode_check_drift_equals_the_reference(name, tmp_path_factory, cli):
    if not cli_available(cli, "decode-check"):
        pytest.skip("vlafeed decode-check is not implemented yet")
    import json
    root = R.sample_dataset(tmp_path_factory, cli, name)
    ref = R.ReferenceDataset(root)
    r = subprocess.run([cli, "decode-check", str(root), "--json", "--no-decode"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    seen = 0
    for cam in report["cameras"]:
        for f in cam["files"]:
            path = root / f["file"]
            m = ref.camera_map(cam["key"], path)
            assert f["mapping"] == m.method == "ordinal"
            assert f["frames"] == len(ref.video(path))
            for ep in f["episodes"]:
                e = ep["episode"]
                assert ep["first_ordinal"] == m.start[e]
                assert abs(ep["drift_ms"] - m.drift_ms[e]) < 1e-6, (cam["key"], f["file"], e)
                seen += 1
    assert seen == len(ref.meta.episodes) * len(ref.meta.camera_keys)
