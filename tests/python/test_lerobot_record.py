"""LeRobot's recording API on vlafeed.LeRobotDataset (python/vlafeed/data/recording.py).

Episodes with two video cameras, one image feature (PNG in Parquet), float32
state/action vectors and several tasks are recorded with
LeRobotDataset.create / add_frame / save_episode / finalize, then:
  * vlafeed reads them back: every tabular value exact (timestamps are
    float32(frame_index / fps)), tasks, frames close to what was recorded
    (the video codecs are lossy);
  * upstream LeRobot 0.6.1 (build-lerobot/venv312, skipped without it) opens
    the recordings (default libsvtav1; size rollover with batch encoding;
    a resumed dataset) and returns, for every index, items identical to
    vlafeed's (tabular, tasks, every pixel), and the image feature exactly as
    recorded;
  * upstream's own recorder, fed the same frames, writes the same metadata:
    info.json equal, the same data / episodes / tasks Parquet columns with
    the same Arrow types and row groups, equal values (stats, indices,
    timestamps; H.264 on both sides), stats.json with the same keys and
    values;
  * LeRobot's aggregate_datasets merges a vlafeed recording with one of its
    own, and LeRobot and vlafeed read the same items from the result;
  * every recording method has upstream's signature;
  * the errors LeRobot raises for a bad frame, an empty episode, an existing
    root, reading while recording, and the refusals of what vlafeed cannot do.
"""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from vlafeed import _native
from vlafeed.data.dataset import LeRobotDataset, LeRobotDatasetMetadata

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FPS = 30
H, W = 64, 96          # libsvtav1 needs >= 64 x 64
IH, IW = 32, 48
FEATURES = {
    "observation.images.cam0": {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
    "observation.images.cam1": {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
    "observation.images.wrist": {"dtype": "image", "shape": (IH, IW, 3), "names": ["height", "width", "channels"]},
    "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"joint{i}" for i in range(6)]},
    "action": {"dtype": "float32", "shape": (6,), "names": None},
}
LENGTHS = [8, 5, 11]
TASKS = ["pick the cube", "place the cube", "wave"]
# at most one new task per episode: LeRobot numbers an episode's new tasks in set() order
TASK_INDICES = [[0] * 8, [0, 0, 0, 1, 1], [1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0]]


def _frame(h, w, episode, index, camera):
    """A smooth picture (gradients and a moving square) that lossy codecs keep close."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.empty((h, w, 3), np.uint8)
    img[..., 0] = (x * 255 // (w - 1) + 40 * camera) % 256
    img[..., 1] = (y * 255 // (h - 1) + 17 * episode) % 256
    img[..., 2] = 128
    s = (index * 7 + 11 * camera) % (w - 16)
    img[8:24, s:s + 16] = (250, 250 - 60 * camera, 20 + 30 * episode)
    return img


def _episodes():
    """[(tasks per frame, {feature: stacked values})] for LENGTHS."""
    rng = np.random.default_rng(27)
    out = []
    for e, n in enumerate(LENGTHS):
        values = {
            "observation.images.cam0": np.stack([_frame(H, W, e, f, 0) for f in range(n)]),
            "observation.images.cam1": np.stack([_frame(H, W, e, f, 1) for f in range(n)]),
            "observation.images.wrist": rng.integers(0, 256, (n, IH, IW, 3), dtype=np.uint8),
            "observation.state": rng.standard_normal((n, 6)).astype(np.float32),
            "action": rng.standard_normal((n, 6)).astype(np.float32),
        }
        tasks = [TASKS[t] for t in TASK_INDICES[e]]
        out.append((tasks, values))
    return out


EPISODES = _episodes()


def record(root, episodes=EPISODES, **create_kwargs):
    ds = LeRobotDataset.create("local/vlafeed-record", FPS, FEATURES, root=root, robot_type="test_bot",
                               **create_kwargs)
    for tasks, values in episodes:
        for f, task in enumerate(tasks):
            frame = {k: v[f] for k, v in values.items()}
            frame["task"] = task
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return ds


def expected_rows(episodes=EPISODES):
    rows, index = [], 0
    for e, (tasks, values) in enumerate(episodes):
        for f, task in enumerate(tasks):
            rows.append({"episode_index": e, "frame_index": f, "index": index, "task": task,
                         "timestamp": np.float32(f / FPS), "values": {k: v[f] for k, v in values.items()}})
            index += 1
    return rows


# ---------------------------------------------------------------------------
# fixtures: the recordings

@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """vlafeed recordings: default codec (libsvtav1), H.264, size rollover + batch encoding, resumed."""
    base = tmp_path_factory.mktemp("record")
    out = {"av1": record(base / "av1").root, "h264": record(base / "h264", rgb_encoder={"vcodec": "h264"}).root}
    out["rollover"] = record(base / "rollover", rgb_encoder={"vcodec": "h264"}, batch_encoding_size=2,
                             video_files_size_in_mb=0.0001, data_files_size_in_mb=0.0001, metadata_buffer_size=2).root
    record(base / "resumed", episodes=EPISODES[:2], rgb_encoder={"vcodec": "h264"})
    ds = LeRobotDataset.resume("local/vlafeed-record", root=base / "resumed", rgb_encoder={"vcodec": "h264"})
    tasks, values = EPISODES[2]
    for f, task in enumerate(tasks):
        ds.add_frame({**{k: v[f] for k, v in values.items()}, "task": task})
    ds.save_episode()
    ds.finalize()
    out["resumed"] = ds.root
    return {k: Path(v) for k, v in out.items()}


def _lerobot_python():
    cand = os.environ.get("VF_LEROBOT_PYTHON") or str(ROOT / "build-lerobot" / "venv312" / "bin" / "python")
    if not os.path.isfile(cand):
        return None, f"no LeRobot 0.6 interpreter at {cand} (tests/python/install_lerobot06.sh)"
    r = subprocess.run([cand, str(HERE / "lerobot_upstream.py"), "--check"], check=False, capture_output=True,
                       text=True, timeout=300)
    if r.returncode != 0 or "lerobot 0.6" not in r.stdout:
        return None, f"LeRobot 0.6 in {cand} does not import: {(r.stderr or r.stdout).strip()[-400:]}"
    return cand, r.stdout.strip()


@pytest.fixture(scope="module")
def upstream(recorded, tmp_path_factory):
    """One run of upstream LeRobot: records EPISODES with its own recorder (H.264) and reads
    every vlafeed recording."""
    py, why = _lerobot_python()
    if py is None:
        pytest.skip(why)
    import torch
    tmp = tmp_path_factory.mktemp("upstream")
    arrays = {f"{e}/{k}": v for e, (_, values) in enumerate(EPISODES) for k, v in values.items()}
    np.savez(tmp / "frames.npz", tasks=json.dumps([t for t, _ in EPISODES]), **arrays)
    features = {k: dict(v, shape=list(v["shape"])) for k, v in FEATURES.items()}
    job = {"record": {"root": str(tmp / "up-h264"), "frames": str(tmp / "frames.npz"), "fps": FPS,
                      "features": features, "robot_type": "test_bot", "vcodec": "h264"},
           "aggregate": {"roots": [str(recorded["h264"]), str(tmp / "up-h264")], "out": str(tmp / "aggregated")},
           "read": [str(recorded[k]) for k in ("av1", "rollover", "resumed")] + [str(tmp / "aggregated")]}
    (tmp / "job.json").write_text(json.dumps(job))
    env = dict(os.environ, HF_HOME=str(tmp / "hf-home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    r = subprocess.run([py, str(HERE / "lerobot_record_upstream.py"), str(tmp / "job.json"), str(tmp / "out.pt")],
                       check=False, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = torch.load(tmp / "out.pt", weights_only=False)
    out["root"] = tmp / "up-h264"
    out["aggregated"] = tmp / "aggregated"
    return out


# ---------------------------------------------------------------------------
# (a) vlafeed reads its recordings back

@pytest.mark.parametrize("name", ["av1", "h264", "rollover", "resumed"])
def test_vlafeed_reads_the_recording_back(recorded, name):
    root = recorded[name]
    from vlafeed.data.loader import open_native_dataset
    problems = open_native_dataset(str(root), None, "raise", None).info()["problems"]
    assert problems == [], f"vlafeed info finds problems in the {name} recording: {problems}"
    ds = LeRobotDataset(root=root)
    rows = expected_rows()
    assert len(ds) == len(rows) == sum(LENGTHS)
    assert ds.meta.total_episodes == len(LENGTHS) and ds.meta.fps == FPS
    assert list(ds.meta.task_list) == TASKS
    worst = 0.0
    originals = {key: np.concatenate([v[key] for _, v in EPISODES]).astype(np.float32)
                 for key in ("observation.images.cam0", "observation.images.cam1")}
    for i, row in enumerate(rows):
        item = ds[i]
        for key in ("episode_index", "frame_index", "index"):
            assert int(item[key]) == row[key], (name, i, key)
        assert item["timestamp"].item() == row["timestamp"], (name, i)
        assert item["task"] == row["task"] and int(item["task_index"]) == TASKS.index(row["task"])
        for key in ("observation.state", "action"):
            np.testing.assert_array_equal(item[key].numpy(), row["values"][key], err_msg=f"{name} {i} {key}")
        for key in ("observation.images.cam0", "observation.images.cam1"):
            got = item[key].numpy().transpose(1, 2, 0) * 255.0
            distances = np.abs(originals[key] - got).mean(axis=(1, 2, 3))
            assert int(distances.argmin()) == i, \
                f"{name} {i} {key}: the decoded frame is closest to frame {distances.argmin()}"
            worst = max(worst, float(distances[i]))
    assert worst < 12.0, f"{name}: decoded frames differ from the recorded ones by {worst:.2f} on average"


def test_layout_info_and_cleanup(recorded):
    root = recorded["av1"]
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 3 and info["total_frames"] == sum(LENGTHS) and info["total_tasks"] == 3
    assert info["splits"] == {"train": "0:3"} and info["robot_type"] == "test_bot"
    cam = info["features"]["observation.images.cam0"]["info"]
    assert cam["video.codec"] == "av1" and cam["video.pix_fmt"] == "yuv420p" and cam["video.preset"] == 12
    assert (cam["video.height"], cam["video.width"], cam["video.g"], cam["video.crf"]) == (H, W, 2, 30)
    assert not (root / "images").exists(), "the scratch images/ folder is left behind"
    eps = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["tasks"] for e in eps] == [[TASKS[0]], [TASKS[0], TASKS[1]], [TASKS[1], TASKS[2], TASKS[0]]]
    # one MP4 per camera, episodes concatenated: each episode's span is its length / fps
    for e in eps:
        span = e["videos/observation.images.cam1/to_timestamp"] - e["videos/observation.images.cam1/from_timestamp"]
        assert span == pytest.approx(e["length"] / FPS, abs=1e-9)
    cam0 = "videos/observation.images.cam0"
    assert eps[1][f"{cam0}/from_timestamp"] == eps[0][f"{cam0}/to_timestamp"]
    assert _native.video_info(str(root / "videos/observation.images.cam0/chunk-000/file-000.mp4"))["frames"] == 24
    assert [pq.ParquetFile(root / "data/chunk-000/file-000.parquet").metadata.row_group(i).num_rows
            for i in range(3)] == LENGTHS


def test_rollover_splits_files_like_lerobot(recorded):
    root = recorded["rollover"]
    eps = pq.read_table(sorted((root / "meta" / "episodes").glob("*/*.parquet"))).to_pylist()
    assert [(e["data/chunk_index"], e["data/file_index"]) for e in eps] == [(0, 0), (0, 1), (0, 2)]
    assert [e["videos/observation.images.cam0/file_index"] for e in eps] == [0, 1, 2]
    assert all(e["videos/observation.images.cam0/from_timestamp"] == 0.0 for e in eps)
    assert len(list((root / "meta" / "episodes").glob("*/*.parquet"))) > 1


def test_image_feature_is_png_in_parquet_exactly(recorded):
    PIL = pytest.importorskip("PIL.Image")
    import io
    table = pq.read_table(recorded["av1"] / "data/chunk-000/file-000.parquet")
    assert table.schema.field("observation.images.wrist").type == pa.struct([("bytes", pa.binary()),
                                                                             ("path", pa.string())])
    assert table.schema.field("observation.state").type == pa.list_(pa.float32(), 6)
    cells = table.column("observation.images.wrist").to_pylist()
    for cell, row in zip(cells, expected_rows()):
        assert cell["path"] == f"frame-{row['frame_index']:06d}.png"
        np.testing.assert_array_equal(np.asarray(PIL.open(io.BytesIO(cell["bytes"]))),
                                      row["values"]["observation.images.wrist"])


# ---------------------------------------------------------------------------
# (b) upstream LeRobot reads vlafeed's recordings, and its recorder writes the same metadata

@pytest.mark.parametrize("name", ["av1", "rollover", "resumed"])
def test_upstream_reads_vlafeed_recordings_identically(recorded, upstream, name):
    import torch
    got = upstream["read"][str(recorded[name])]
    assert "__open_error__" not in got, got
    assert got["len"] == sum(LENGTHS) and got["total_episodes"] == 3 and got["tasks"] == TASKS
    ours = LeRobotDataset(root=recorded[name])
    rows = expected_rows()
    for i, up in enumerate(got["items"]):
        mine = ours[i]
        assert set(mine) == set(up) - {"observation.images.wrist"}, (name, i)
        for key, value in mine.items():
            if key == "task":
                assert up[key] == value
                continue
            assert up[key].dtype == value.dtype and up[key].shape == value.shape, (name, i, key)
            assert torch.equal(up[key], value), (name, i, key)
        want = torch.from_numpy(rows[i]["values"]["observation.images.wrist"]).permute(2, 0, 1).float() / 255
        assert torch.equal(up["observation.images.wrist"], want), (name, i)
    assert set(got["stats_keys"]) == set(FEATURES) | {"timestamp", "frame_index", "episode_index", "index",
                                                      "task_index"}


def test_lerobots_aggregate_merges_a_vlafeed_recording_with_its_own(upstream):
    """LeRobot's aggregate_datasets (a dataset tool reading meta.info, the episodes and stats
    tables and concatenating videos) over vlafeed's H.264 recording and upstream's: LeRobot
    reads every item of the result, and vlafeed reads the same items."""
    import torch
    got = upstream["read"][str(upstream["aggregated"])]
    assert "__open_error__" not in got, got
    assert got["len"] == 2 * sum(LENGTHS) and got["total_episodes"] == 2 * len(LENGTHS)
    ours = LeRobotDataset(root=upstream["aggregated"])
    assert len(ours) == got["len"]
    rows = expected_rows() * 2
    for i, up in enumerate(got["items"]):
        mine = ours[i]
        for key, value in mine.items():
            assert (up[key] == value) if key == "task" else torch.equal(up[key], value), (i, key)
        np.testing.assert_array_equal(mine["action"].numpy(), rows[i]["values"]["action"])


def _arrow_columns(path):
    f = pq.ParquetFile(path)
    return [(n, f.schema_arrow.field(n).type) for n in f.schema_arrow.names], \
        [f.metadata.row_group(i).num_rows for i in range(f.metadata.num_row_groups)]


def _close(a, b, where):
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _close(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)) and a and isinstance(a[0], str):
        assert a == b, where
    elif isinstance(a, (int, float, list)) and not isinstance(a, bool):
        np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=1e-6, atol=1e-9,
                                   err_msg=where)
    else:
        assert a == b, where


def test_metadata_matches_upstream_recorder(recorded, upstream):
    ours, theirs = recorded["h264"], upstream["root"]
    info_ours = json.loads((ours / "meta/info.json").read_text())
    info_theirs = json.loads((theirs / "meta/info.json").read_text())
    assert list(info_ours) == list(info_theirs)
    assert info_ours == info_theirs
    for rel in ("data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet", "meta/tasks.parquet"):
        assert _arrow_columns(ours / rel) == _arrow_columns(theirs / rel), rel
    for rel in ("data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet"):
        a, b = pq.read_table(ours / rel).to_pylist(), pq.read_table(theirs / rel).to_pylist()
        assert len(a) == len(b)
        for i, (ra, rb) in enumerate(zip(a, b)):
            for key in ra:
                if key == "observation.images.wrist":   # PNG bytes differ by encoder; pixels checked above
                    assert ra[key]["path"] == rb[key]["path"]
                    continue
                if key == "tasks":  # LeRobot lists an episode's tasks in set() order
                    assert sorted(ra[key]) == sorted(rb[key]), f"{rel} row {i}"
                    continue
                _close(ra[key], rb[key], f"{rel} row {i} {key}")
    import pandas as pd
    pd.testing.assert_frame_equal(pd.read_parquet(ours / "meta/tasks.parquet"),
                                  pd.read_parquet(theirs / "meta/tasks.parquet"))
    stats_ours = json.loads((ours / "meta/stats.json").read_text())
    stats_theirs = json.loads((theirs / "meta/stats.json").read_text())
    assert {k: list(v) for k, v in stats_ours.items()} == {k: list(v) for k, v in stats_theirs.items()}
    _close(stats_ours, stats_theirs, "stats.json")
    for f in ("observation.state", "observation.images.cam0"):
        assert {"q01", "q10", "q50", "q90", "q99"} <= set(stats_ours[f])


def test_recording_names_have_upstreams_signatures(upstream):
    """Every recording method of upstream's LeRobotDataset, LeRobotDatasetMetadata and
    DatasetWriter exists here with the same parameters, kinds and defaults."""
    import inspect

    from vlafeed.data.recording import DatasetWriter
    classes = {"LeRobotDataset": LeRobotDataset, "LeRobotDatasetMetadata": LeRobotDatasetMetadata,
               "DatasetWriter": DatasetWriter}
    checked = 0
    for cls_name, methods in upstream["signatures"].items():
        for name, params in methods.items():
            assert hasattr(classes[cls_name], name), f"{cls_name}.{name} is missing"
            ours = [(p.name, p.kind.name, "<none>" if p.default is p.empty else repr(p.default))
                    for p in inspect.signature(getattr(classes[cls_name], name)).parameters.values()]
            assert ours == params, f"{cls_name}.{name}"
            checked += 1
    assert checked >= 25


def test_vlafeed_reads_upstreams_recording(upstream):
    ds = LeRobotDataset(root=upstream["root"])
    rows = expected_rows()
    assert len(ds) == len(rows)
    for i in (0, 7, 8, len(rows) - 1):
        item = ds[i]
        np.testing.assert_array_equal(item["action"].numpy(), rows[i]["values"]["action"])
        assert item["task"] == rows[i]["task"]


# ---------------------------------------------------------------------------
# the rest of the surface and the error paths

def _new(tmp_path, **kw):
    return LeRobotDataset.create("local/errors", FPS, FEATURES, root=tmp_path / "ds", rgb_encoder={"vcodec": "h264"},
                                 **kw)


def _good_frame(f=0):
    return {**{k: v[f] for k, v in EPISODES[0][1].items()}, "task": "t"}


def test_add_frame_errors_are_lerobots(tmp_path):
    ds = _new(tmp_path)
    frame = _good_frame()
    del frame["action"]
    with pytest.raises(ValueError, match=r"Missing features: \{'action'\}"):
        ds.add_frame(frame)
    with pytest.raises(ValueError, match=r"Missing features: \{'task'\}"):
        ds.add_frame({k: v for k, v in _good_frame().items() if k != "task"})
    with pytest.raises(ValueError, match=r"Extra features: \{'timestamp'\}"):
        ds.add_frame({**_good_frame(), "timestamp": np.float32(0)})
    with pytest.raises(ValueError, match=r"'observation.state' of shape '\(5,\)' does not have the expected shape"):
        ds.add_frame({**_good_frame(), "observation.state": np.zeros(5, np.float32)})
    with pytest.raises(ValueError, match=r"'action' of dtype 'float64' is not of the expected dtype 'float32'"):
        ds.add_frame({**_good_frame(), "action": np.zeros(6)})
    with pytest.raises(ValueError, match=r"'observation.images.cam0' of shape '\(32, 32, 3\)'"):
        ds.add_frame({**_good_frame(), "observation.images.cam0": np.zeros((32, 32, 3), np.uint8)})
    with pytest.raises(ValueError, match=r"requires values in the range \[0.0, 1.0\]"):
        ds.add_frame({**_good_frame(), "observation.images.cam1": np.full((H, W, 3), 2.0, np.float32)})
    assert not ds.has_pending_frames()
    with pytest.raises(ValueError, match="You must add one or several frames"):
        ds.save_episode()


def test_create_on_existing_root_refuses(tmp_path):
    (tmp_path / "ds" / "meta").mkdir(parents=True)
    (tmp_path / "ds" / "meta" / "info.json").write_text("{}")
    with pytest.raises(FileExistsError):
        _new(tmp_path)
    assert (tmp_path / "ds" / "meta" / "info.json").read_text() == "{}"


def test_clear_buffer_reading_while_recording_and_refusals(tmp_path):
    ds = _new(tmp_path, image_writer_processes=1, image_writer_threads=2)
    ds.add_frame(_good_frame(0))
    assert ds.has_pending_frames() and len(ds) == 0
    ds.clear_episode_buffer()
    assert not ds.has_pending_frames()
    assert not any((tmp_path / "ds" / "images").rglob("*.rgb")), "clear_episode_buffer left spill files"
    for f in range(3):
        frame = _good_frame(f)
        frame["observation.images.cam1"] = frame["observation.images.cam1"].astype(np.float32) / 255
        ds.add_frame(frame)
    ds.save_episode()
    assert len(ds) == 3 and ds.num_episodes == 1 and ds.meta.total_tasks == 1
    assert ds.meta.get_task_index("t") == 0 and ds.meta.get_task_index("nope") is None
    assert ds.meta.info["total_frames"] == 3 and ds.meta.latest_episode["dataset_to_index"] == [3]
    with pytest.raises(RuntimeError, match="Call finalize"):
        ds[0]
    with pytest.raises(NotImplementedError, match="push_to_hub"):
        ds.push_to_hub()
    ds.finalize()
    ds.finalize()  # idempotent
    assert len(ds) == 3 and ds[1]["task"] == "t"
    want = _good_frame(1)["observation.images.cam0"]
    assert np.abs(ds[1]["observation.images.cam0"].numpy().transpose(1, 2, 0) * 255 - want).mean() < 6
    with pytest.raises(RuntimeError, match="read-only dataset"):
        LeRobotDataset(root=tmp_path / "ds").add_frame(_good_frame())
    try:  # the image feature went through the writer threads: exact PNGs, in frame order
        import io

        import PIL.Image
    except ImportError:
        return
    cells = pq.read_table(tmp_path / "ds/data/chunk-000/file-000.parquet").column("observation.images.wrist")
    for f, cell in enumerate(cells.to_pylist()):
        np.testing.assert_array_equal(np.asarray(PIL.Image.open(io.BytesIO(cell["bytes"]))),
                                      _good_frame(f)["observation.images.wrist"])


def test_unsupported_settings_are_named(tmp_path):
    with pytest.raises(NotImplementedError, match="vcodec='libaom-av1'"):
        LeRobotDataset.create("x", FPS, FEATURES, root=tmp_path / "a", rgb_encoder={"vcodec": "libaom-av1"})
    assert not (tmp_path / "a").exists()
    with pytest.raises(NotImplementedError, match="extra_options"):
        LeRobotDataset.create("x", FPS, FEATURES, root=tmp_path / "b", rgb_encoder={"extra_options": {"x": 1}})
    with pytest.raises(ValueError, match="use_videos"):
        LeRobotDataset.create("x", FPS, FEATURES, root=tmp_path / "c", use_videos=False)
    with pytest.raises(ValueError, match="should not contain '/'"):
        LeRobotDatasetMetadata.create("x", FPS, {"a/b": {"dtype": "float32", "shape": (1,), "names": None}},
                                      root=tmp_path / "d")
    with pytest.raises(NotImplementedError, match="multi-dimensional"):
        LeRobotDatasetMetadata.create("x", FPS, {"m": {"dtype": "float32", "shape": (2, 2), "names": None}},
                                      root=tmp_path / "e")
    with pytest.raises(NotImplementedError, match="language feature 'l'"):
        LeRobotDatasetMetadata.create("x", FPS, {"l": {"dtype": "language", "shape": (1,), "names": None}},
                                      root=tmp_path / "f")
    assert not any((tmp_path / n).exists() for n in "def")
    with pytest.raises(ValueError, match="resume\\(\\) requires an explicit 'root'"):
        LeRobotDataset.resume("x")


def test_metadata_writers_directly(tmp_path):
    feats = {"x": {"dtype": "float32", "shape": (2,), "names": None}}
    meta = LeRobotDatasetMetadata.create("local/meta", 10, feats, root=tmp_path / "m", robot_type="r", use_videos=False)
    assert meta.total_episodes == 0 and meta.fps == 10 and meta.video_path is None
    assert meta.get_chunk_settings() == {"chunks_size": 1000, "data_files_size_in_mb": 100,
                                         "video_files_size_in_mb": 200}
    meta.update_chunk_settings(chunks_size=7)
    assert json.loads((tmp_path / "m/meta/info.json").read_text())["chunks_size"] == 7
    with pytest.raises(ValueError, match="chunks_size must be positive"):
        meta.update_chunk_settings(chunks_size=0)
    meta.save_episode_tasks(["a", "b"])
    meta.save_episode_tasks(["b", "c"])
    assert list(meta.tasks.index) == ["a", "b", "c"] and meta.get_task_index("c") == 2
    with pytest.raises(ValueError, match="Tasks are not unique"):
        meta.save_episode_tasks(["a", "a"])
    import pandas as pd
    assert list(pd.read_parquet(tmp_path / "m/meta/tasks.parquet").index) == ["a", "b", "c"]


def test_save_episode_with_prebuilt_episode_data(tmp_path):
    """save_episode(episode_data=...) takes LeRobot's episode dict with frames as arrays."""
    ds = _new(tmp_path)
    tasks, values = EPISODES[1]
    n = len(tasks)
    episode = {"size": n, "task": list(tasks), "episode_index": 0, "frame_index": list(range(n)),
               "timestamp": [f / FPS for f in range(n)], "index": [], "task_index": [],
               **{k: list(v) for k, v in values.items()}}
    ds.save_episode(episode_data=episode)
    ds.finalize()
    assert len(ds) == n and [ds[i]["task"] for i in range(n)] == tasks
    np.testing.assert_array_equal(ds[n - 1]["action"].numpy(), values["action"][-1])
    paths = dict(episode, **{"observation.images.cam0": [f"/x/{i}.png" for i in range(n)]})
    paths["episode_index"] = 1
    rec = LeRobotDataset.resume("local/errors", root=tmp_path / "ds", rgb_encoder={"vcodec": "h264"})
    with pytest.raises(NotImplementedError, match="observation.images.cam0.*image file paths"):
        rec.save_episode(episode_data=paths)


def test_scalar_string_and_bool_features_without_cameras(tmp_path):
    feats = {"grip": {"dtype": "bool", "shape": (1,), "names": None},
             "count": {"dtype": "int32", "shape": (1,), "names": None},
             "note": {"dtype": "string", "shape": (1,), "names": None},
             "action": {"dtype": "float64", "shape": (3,), "names": None}}
    ds = LeRobotDataset.create("local/scalars", 10, feats, root=tmp_path / "s", use_videos=False)
    for f in range(4):
        ds.add_frame({"grip": np.array([f % 2 == 0]), "count": np.array([f * 7], np.int32), "note": f"n{f}",
                      "action": np.full(3, f / 4), "task": "t"})
    ds.save_episode()
    ds.finalize()
    table = pq.read_table(tmp_path / "s/data/chunk-000/file-000.parquet")
    assert table.schema.field("grip").type == pa.bool_() and table.schema.field("count").type == pa.int32()
    assert table.schema.field("note").type == pa.string()
    assert table.schema.field("action").type == pa.list_(pa.float64(), 3)
    assert table.column("grip").to_pylist() == [True, False, True, False]
    assert table.column("note").to_pylist() == ["n0", "n1", "n2", "n3"]
    assert table.column("count").to_pylist() == [0, 7, 14, 21]
    stats = json.loads((tmp_path / "s/meta/stats.json").read_text())
    assert "note" not in stats and stats["count"]["max"] == [21.0] and stats["action"]["mean"] == [0.375] * 3
    assert json.loads((tmp_path / "s/meta/info.json").read_text())["video_path"] is None


def test_parquet_writer_object(tmp_path):
    """_native.parquet_writer_open: row groups appended to one open file, footer at close(),
    the unfinished file removed when dropped unclosed; errors name what is wrong."""
    path = tmp_path / "w.parquet"
    w = _native.parquet_writer_open(str(path), [("a", "int64"), ("v", "list<float32>"),
                                                ("img", "struct<bytes:binary,path:string>")], kv={"k": "v"})
    w.write_row_group([[1, 2], [[1.0], [2.0, 3.0]], [{"bytes": b"x", "path": "p"}, {"bytes": b"y", "path": "q"}]])
    assert w.rows == 2 and w.bytes > 0 and not path.exists()  # a temporary name until close()
    w.write_row_group([[3], [[4.0]], [{"bytes": b"z", "path": "r"}]])
    with pytest.raises(ValueError, match="got 2 columns for a schema of 3"):
        w.write_row_group([[1], [[1.0]]])
    with pytest.raises(ValueError, match="column 'v' has 2 rows, column 'a' 1"):
        w.write_row_group([[1], [[1.0], [2.0]], [None]])
    w.close()
    w.close()  # idempotent
    assert not w.is_open
    with pytest.raises(ValueError, match="closed"):
        w.write_row_group([[1], [[1.0]], [None]])
    f = pq.ParquetFile(path)
    assert f.metadata.num_row_groups == 2 and f.schema_arrow.metadata == {b"k": b"v"}
    assert pq.read_table(path).to_pylist()[2] == {"a": 3, "v": [4.0], "img": {"bytes": b"z", "path": "r"}}
    dropped = _native.parquet_writer_open(str(tmp_path / "d.parquet"), [("a", "int64")])
    dropped.write_row_group([[1]])
    del dropped
    assert list(tmp_path.iterdir()) == [path]
    with pytest.raises(ValueError, match="cannot parse type 'nope'"):
        _native.parquet_writer_open(str(tmp_path / "e.parquet"), [("a", "nope")])
    assert list(tmp_path.iterdir()) == [path]


def test_dropped_recording_completes_its_files(tmp_path):
    """As LeRobot's DatasetWriter.__del__: a recorder garbage-collected without finalize()
    still closes its data file and flushes the episodes table."""
    import gc
    ds = _new(tmp_path)
    for f in range(3):
        ds.add_frame(_good_frame(f))
    ds.save_episode()
    del ds
    gc.collect()
    back = LeRobotDataset(root=tmp_path / "ds")
    assert len(back) == 3 and back[2]["task"] == "t"
