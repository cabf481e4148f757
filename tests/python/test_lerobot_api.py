"""LeRobot 0.6's API surface on vlafeed (issue 10): the constructor
signature, LeRobotDatasetMetadata, meta.features/tasks/episodes/stats with
LeRobot's keys, types and dtypes, path helpers, hf_dataset column access,
slicing, and the per-episode on_error="skip" policy.

Upstream LeRobot itself cannot be imported here (see test_upstream_lerobot.py
for the isolated-venv parity run); what its training code reads from these
objects is asserted directly: lerobot-train builds EpisodeAwareSampler from
meta.episodes["dataset_from_index"/"dataset_to_index"], and
dataset_to_policy_features reads every feature's dtype, shape and names
(names[2] == "channels" turning a video's (H, W, C) into (C, H, W))."""
import pathlib
import shutil
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

import vlafeed

import damage
from damage import CAM


@pytest.fixture(scope="module")
def sample(cli, tmp_path_factory):
    return damage.make_sample(cli, tmp_path_factory.mktemp("api") / "base", episodes=4, size="64x48",
                              min_length=12, max_length=24)


def test_constructor_accepts_lerobot_signature(sample):
    ds = vlafeed.LeRobotDataset("user/my-dataset", root=sample, episodes=[1, 3], image_transforms=None,
                                delta_timestamps={"action": [0.0, 1 / 30]}, tolerance_s=1e-4, revision="v3.0",
                                download_videos=False, video_backend="pyav")
    assert ds.repo_id == "user/my-dataset" and ds.meta.repo_id == "user/my-dataset"
    assert ds.revision == "v3.0" and ds.meta.revision == "v3.0"
    assert ds.episodes == [1, 3]
    assert ds[0]["action"].shape == (2, 6) and ds[0]["action_is_pad"].tolist() == [False, False]
    # vlafeed's older form: the root as first positional argument.
    assert len(vlafeed.LeRobotDataset(sample)) == vlafeed.LeRobotDataset(root=sample).num_frames


def test_repo_id_resolution(sample, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    with pytest.raises(FileNotFoundError, match="does not download from the Hugging Face Hub; pass root="):
        vlafeed.LeRobotDataset("user/absent")
    shutil.copytree(sample, tmp_path / "home" / "user" / "cached")
    ds = vlafeed.LeRobotDataset("user/cached")
    assert ds.repo_id == "user/cached" and ds.root == tmp_path / "home" / "user" / "cached"  # a Path, as in LeRobot
    meta = vlafeed.LeRobotDatasetMetadata("user/cached")
    assert meta.total_episodes == 4
    with pytest.raises(TypeError, match="root"):
        vlafeed.LeRobotDataset()


def test_features_are_lerobots(sample):
    meta = vlafeed.LeRobotDatasetMetadata(root=sample)
    info = damage.read_info(sample)
    assert list(meta.features) == list(info["features"])
    for name, ft in info["features"].items():
        got = meta.features[name]
        assert got["dtype"] == ft["dtype"] and got["shape"] == tuple(ft["shape"]) and got["names"] == ft["names"]
    assert meta.features[CAM]["info"]["video.codec"] == "h264"
    # What dataset_to_policy_features does with a visual feature.
    ft = meta.features[CAM]
    assert ft["names"][2] in ("channel", "channels")
    assert (ft["shape"][2], ft["shape"][0], ft["shape"][1]) == (3, 48, 64)


def test_tasks_episodes_stats(sample):
    ds = vlafeed.LeRobotDataset(sample, episodes=[2])
    meta = ds.meta
    assert isinstance(meta.tasks, pd.DataFrame) and meta.tasks.index.name == "task"
    assert meta.tasks["task_index"].dtype == np.int64
    for i, task in enumerate(meta.task_list):
        assert meta.tasks.loc[task, "task_index"] == i and meta.get_task_index(task) == i
    assert meta.get_task_index("no such task") is None
    # The full table (LeRobot applies the selection in the dataset, not in meta.episodes).
    eps = meta.episodes
    assert len(eps) == 4 and eps["episode_index"] == [0, 1, 2, 3]
    assert not any(c.startswith("stats/") for c in eps.column_names)
    starts, ends = eps["dataset_from_index"], eps["dataset_to_index"]
    assert starts[0] == 0 and all(b == a for a, b in zip(ends, starts[1:]))
    assert eps[2]["length"] == ends[2] - starts[2] == len(ds)
    assert int(ds[0]["index"]) == starts[2]
    assert list(eps.to_pandas().columns) == eps.column_names
    st = meta.stats
    assert st["index"]["count"].dtype == np.int64 and st["index"]["min"].dtype == np.int64
    assert st["index"]["max"].dtype == np.int64 and st["index"]["mean"].dtype == np.float64
    assert st["action"]["min"].dtype == np.float64 and st["action"]["count"].dtype == np.int64
    assert st[CAM]["mean"].shape == (3, 1, 1)


def test_paths_and_info(sample):
    meta = vlafeed.LeRobotDatasetMetadata(root=sample)
    info = damage.read_info(sample)
    assert meta.robot_type == info["robot_type"] and meta.chunks_size == info["chunks_size"]
    assert meta.data_path == info["data_path"] and meta.video_path == info["video_path"]
    for e in range(4):
        assert (sample / meta.get_data_file_path(e)).is_file()
        assert (sample / meta.get_video_file_path(e, CAM)).is_file()
    with pytest.raises(IndexError, match="episode 9"):
        meta.get_data_file_path(9)


def test_hf_dataset_columns_and_slicing(sample):
    ds = vlafeed.LeRobotDataset(sample, episodes=[1, 3])
    actions = ds.hf_dataset["action"]
    assert actions.shape == (len(ds), 6) and len(ds.hf_dataset) == len(ds)
    for i in (0, len(ds) // 2, len(ds) - 1):
        np.testing.assert_array_equal(actions[i], ds[i]["action"].numpy())
    index = ds.hf_dataset["index"]
    assert index.shape == (len(ds),) and int(index[0]) == int(ds[0]["index"])
    with pytest.raises(KeyError, match="no column"):
        ds.hf_dataset["nope"]
    items = ds[1:4]
    assert len(items) == 3
    for k, item in enumerate(items):
        torch.testing.assert_close(item["action"], ds[1 + k]["action"])
    assert len(ds[-2:]) == 2


def test_on_error_skip_is_per_episode_and_counted(sample, tmp_path):
    root = damage.copy(sample, tmp_path / "ds")
    key = f"videos/{CAM}"
    damage.edit_episodes(root, lambda rows: [dict(r, **{f"{key}/from_timestamp": r[f"{key}/from_timestamp"] + 40,
                                                        f"{key}/to_timestamp": r[f"{key}/to_timestamp"] + 40})
                                             if r["episode_index"] == 3 else r for r in rows])
    strict = vlafeed.LeRobotDataset(root)  # the default: episode 3's items raise, the others are served
    errors = 0
    for i in range(len(strict)):
        try:
            strict[i]
        except vlafeed.VlafeedError as e:
            assert "episode 3" in str(e) and damage.VIDEO_FILE in str(e)
            errors += 1
    assert errors == [e for e in strict.meta.selected_episodes if e["episode_index"] == 3][0]["length"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lenient = vlafeed.LeRobotDataset(root, on_error="skip")
    assert lenient.skipped_episodes == [3]
    assert any("episode 3 skipped" in str(w.message) for w in caught)
    assert len(lenient) == len(strict) - errors
    assert 3 not in {int(lenient[i]["episode_index"]) for i in range(len(lenient))}
    base = vlafeed.LeRobotDataset(sample, episodes=[0, 1, 2])
    for i in range(len(lenient)):
        torch.testing.assert_close(lenient[i][CAM], base[i][CAM], rtol=0, atol=0)
    with pytest.raises(ValueError, match="on_error"):
        vlafeed.LeRobotDataset(root, on_error="ignore")


def test_hf_dataset_rows_are_table_rows(sample):
    """hf_dataset[i] is row i of the table (what LeRobot's hf_dataset gives:
    non-video columns, vectors as float32 tensors, scalars 0-d), not the
    item with frames; slices give columns of values; the values are the
    Parquet file's (pyarrow) and agree with ds[i]."""
    import pyarrow.parquet as pq
    ds = vlafeed.LeRobotDataset(root=str(sample), episodes=[1, 2])
    table = pq.read_table(str(next((pathlib.Path(sample) / "data").rglob("*.parquet")))).to_pydict()
    by_index = {ix: k for k, ix in enumerate(table["index"])}
    for i in (0, 1, len(ds) // 2, len(ds) - 1, -1):
        row = ds.hf_dataset[i]
        item = ds[i]
        assert set(row) == set(ds.hf_dataset.column_names)
        assert not any(k.startswith("observation.images") for k in row) and "task" not in row
        k = by_index[int(row["index"])]
        for name, v in row.items():
            assert torch.equal(v, item[name]), (i, name)
            want = np.asarray(table[name][k], dtype=v.numpy().dtype)
            assert np.array_equal(v.numpy(), want), (i, name)
        assert row["action"].dtype == torch.float32 and row["index"].dim() == 0
    cols = ds.hf_dataset[2:5]
    assert [int(x) for x in cols["index"]] == [int(ds[i]["index"]) for i in range(2, 5)]
    with pytest.raises(IndexError):
        ds.hf_dataset[len(ds)]


def test_meta_episodes_of_a_remote_root_is_the_full_table(sample):
    """An http:// v3.0 root gives the same full episodes table as the local
    folder (the meta/episodes files read through the engine's HTTP layer)."""
    from remote_server import RemoteServer
    local = vlafeed.LeRobotDatasetMetadata(str(sample)).episodes
    with RemoteServer(pathlib.Path(sample).parent) as srv:
        remote = vlafeed.LeRobotDatasetMetadata(srv.url(pathlib.Path(sample).name)).episodes
    assert remote.column_names == local.column_names and len(remote) == len(local)
    assert "videos/" + CAM + "/from_timestamp" in remote.column_names
    for c in local.column_names:
        assert remote[c] == local[c], c
