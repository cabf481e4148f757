"""bench/scale_meta.py (synthetic LeRobot v3.0 metadata at scale) and the
subprocess harness of bench/scale_bench.py.

The small dataset (2,000 episodes, data files, the recorder's layout: 10-row
row groups in meta/episodes and one data row group per episode; small
chunks_size so that chunk directories roll over too) is checked three ways:
`vlafeed info` finds no problem other than the absent MP4s, pyarrow finds the
totals and indexes consistent, and the engine's loader reads back the rows
the generator wrote. The 100K run is skipped unless VF_SCALE_HEAVY=1.
"""
import json
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import scale_bench  # noqa: E402
import scale_meta  # noqa: E402

SMALL = dict(episodes=2000, seed=3, with_data=True, data_row_groups="episode", meta_row_group=10,
             episodes_per_meta_file=300, data_files_size_in_mb=10, chunks_size=4, num_tasks=50)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale") / "small"
    stamp = scale_meta.generate(root, **SMALL)
    return root, stamp


def info_json(cli, root, *flags):
    r = subprocess.run([cli, "info", "--json", *flags, str(root)], capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def numbered(path):
    """(chunk, file) numbers of .../chunk-N/file-M.parquet."""
    return int(path.parent.name.split("-")[1]), int(path.stem.split("-")[1])


def episodes_table(root):
    files = sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"), key=numbered)
    return files, [pq.read_table(f) for f in files]


def test_info_accepts_it_with_only_the_videos_missing(small, cli):
    root, stamp = small
    rc, doc = info_json(cli, root)
    assert rc == 1  # the MP4s are absent by design
    assert doc["format_version"] == "v3.0"
    assert doc["total_episodes"] == 2000
    assert doc["total_frames"] == stamp["total_frames"]
    assert doc["total_tasks"] == 50
    assert doc["data_files"] == stamp["data_files_written"] == stamp["data_files_in_meta"] > 1
    problems = doc["problems"]
    assert {p["message"] for p in problems} == {"video file missing"}, problems[:5]
    # One problem per referenced MP4, and every MP4 the metadata names is counted.
    assert len(problems) == stamp["distinct_video_files"] == sum(stamp["video_files_per_camera"])
    assert len({p["file"] for p in problems}) == len(problems)
    # chunks_size 4: file numbers roll over into new chunk directories.
    assert any("/chunk-001/" in p["file"] for p in problems)


def test_totals_and_indexes_are_consistent(small):
    root, stamp = small
    info = json.loads((root / "meta/info.json").read_text())
    files, tables = episodes_table(root)
    assert len(files) == stamp["meta_files"] == 7  # 2000 episodes, 300 per file
    for f, t in zip(files, tables):
        chunk, file = numbered(f)
        assert set(t.column("meta/episodes/chunk_index").to_pylist()) == {chunk}
        assert set(t.column("meta/episodes/file_index").to_pylist()) == {file}
        md = pq.ParquetFile(f).metadata
        assert [md.row_group(i).num_rows for i in range(md.num_row_groups)][:-1] == [10] * (md.num_row_groups - 1)
    ep = {name: np.concatenate([t.column(name).to_numpy() for t in tables])
          for name in ("episode_index", "length", "dataset_from_index", "dataset_to_index",
                       "data/chunk_index", "data/file_index")}
    assert (ep["episode_index"] == np.arange(2000)).all()
    assert ep["length"].min() >= 150 and ep["length"].max() <= 250
    assert (ep["dataset_to_index"] - ep["dataset_from_index"] == ep["length"]).all()
    assert ep["dataset_from_index"][0] == 0
    assert (ep["dataset_from_index"][1:] == ep["dataset_to_index"][:-1]).all()
    assert ep["length"].sum() == info["total_frames"] == stamp["total_frames"]
    assert info["total_episodes"] == 2000
    stats_cols = [c for c in tables[0].column_names if c.startswith("stats/")]
    assert "stats/observation.state/mean" in stats_cols and "stats/observation.images.a/std" in stats_cols
    assert len(tables[0].column("stats/observation.state/mean")[0]) == SMALL.get("state_dim", 8)

    # Data files: the recorder's layout (one row group per episode), rows in
    # index order, and each episode's data/{chunk,file}_index names its file.
    data_files = sorted((root / "data").glob("chunk-*/file-*.parquet"), key=numbered)
    assert len(data_files) == stamp["data_files_written"]
    seen = 0
    for f in data_files:
        chunk, file = numbered(f)
        mine = np.flatnonzero((ep["data/chunk_index"] == chunk) & (ep["data/file_index"] == file))
        pf = pq.ParquetFile(f)
        assert pf.metadata.num_row_groups == len(mine)
        assert [pf.metadata.row_group(i).num_rows for i in range(len(mine))] == ep["length"][mine].tolist()
        t = pf.read(columns=["index", "episode_index", "frame_index", "timestamp"])
        index = t.column("index").to_numpy()
        assert (index == np.arange(seen, seen + len(index))).all()
        assert (t.column("episode_index").to_numpy() == np.repeat(mine, ep["length"][mine])).all()
        frame = t.column("frame_index").to_numpy()
        assert (frame == index - np.repeat(ep["dataset_from_index"][mine], ep["length"][mine])).all()
        assert (t.column("timestamp").to_numpy() == (frame / info["fps"]).astype(np.float32)).all()
        seen += len(index)
    assert seen == info["total_frames"]


def test_cameras_roll_over_at_different_episodes(small):
    root, stamp = small
    info = json.loads((root / "meta/info.json").read_text())
    _, tables = episodes_table(root)
    cams = [k for k, v in info["features"].items() if v["dtype"] == "video"]
    assert cams == list(scale_meta.CAMERAS)
    fps = info["fps"]
    length = np.concatenate([t.column("length").to_numpy() for t in tables])
    starts = {}
    for cam in cams:
        col = {s: np.concatenate([t.column(f"videos/{cam}/{s}").to_numpy() for t in tables])
               for s in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")}
        seq = col["chunk_index"] * info["chunks_size"] + col["file_index"]
        assert (np.diff(seq) >= 0).all() and (np.diff(seq) <= 1).all()
        new = np.flatnonzero(np.diff(seq)) + 1
        starts[cam] = set(new.tolist())
        assert len(new) + 1 == stamp["video_files_per_camera"][cams.index(cam)]
        # A rollover restarts the file's clock; inside a file episodes are back to back.
        assert col["from_timestamp"][0] == 0 and (col["from_timestamp"][new] == 0).all()
        same = np.flatnonzero(np.diff(seq) == 0)
        assert np.allclose(col["from_timestamp"][same + 1], col["to_timestamp"][same])
        assert np.allclose(col["to_timestamp"] - col["from_timestamp"], length / fps)
    a, b, c = (starts[k] for k in cams)
    assert a and b and c
    assert a != b and b != c and a != c
    assert stamp["first_rollover_per_camera"] == [min(starts[k]) for k in cams]
    assert len(set(stamp["first_rollover_per_camera"])) == 3


def test_engine_reads_back_the_generated_rows(small):
    vlafeed = pytest.importorskip("vlafeed")
    root, stamp = small
    meta = vlafeed.LeRobotDatasetMetadata(root)
    assert meta.total_episodes == 2000 and meta.total_frames == stamp["total_frames"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = vlafeed.Loader(root, mode="map", batch_size=64, seed=1, rank=0, world_size=1, output="numpy",
                                keys=["observation.state", "action", "index", "episode_index", "frame_index"])
        batch = next(iter(loader))
        loader.close()
    index = batch["index"].astype(np.int64)
    assert len(set(index.tolist())) == 64
    base = (index % 4096).astype(np.float32) * np.float32(1 / 4096)
    assert np.array_equal(batch["observation.state"], base[:, None] + np.arange(8, dtype=np.float32))
    assert np.array_equal(batch["action"], base[:, None] - np.arange(7, dtype=np.float32))


def test_stamp_caches_and_refuses_foreign_folders(tmp_path):
    root = tmp_path / "tiny"
    params = dict(episodes=30, min_length=5, max_length=9, num_tasks=3)
    first = scale_meta.generate(root, **params)
    mtime = (root / "meta/info.json").stat().st_mtime_ns
    assert scale_meta.generate(root, **params) == first
    assert (root / "meta/info.json").stat().st_mtime_ns == mtime
    # Other parameters: regenerated in place.
    second = scale_meta.generate(root, **dict(params, episodes=40))
    assert second["params"]["episodes"] == 40
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == 40
    # An interrupted generation (no stamp, the partial marker) is replaced.
    (root / scale_meta.STAMP).unlink()
    (root / scale_meta.PARTIAL).write_text("")
    assert scale_meta.generate(root, **params)["params"]["episodes"] == 30
    assert not (root / scale_meta.PARTIAL).exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not ours")
    with pytest.raises(FileExistsError, match="foreign"):
        scale_meta.generate(foreign, **params)
    assert (foreign / "keep.txt").exists()
    with pytest.raises(TypeError, match="episode_count"):
        scale_meta.generate(tmp_path / "x", episode_count=3)
    with pytest.raises(ValueError, match="data_row_groups"):
        scale_meta.generate(tmp_path / "y", data_row_groups="page")
    with pytest.raises(ValueError, match="unknown shape"):
        scale_meta.shape_params("10m")


def test_droid_shape_and_variant_names():
    p = scale_meta.shape_params("droid")
    assert (p["episodes"], p["fps"], p["video_files_size_in_mb"], p["cameras"]) == (95_600, 15, 200, 3)
    assert scale_meta.variant_name("100k", scale_meta.shape_params("100k", meta_row_group=10)) == "100k-rg10"
    assert scale_meta.variant_name("10k", scale_meta.shape_params("10k", with_data=True, data_row_groups="episode")) \
        == "10k-data-ep"
    assert scale_meta.variant_name("10k", scale_meta.shape_params("10k", seed=5)) == "10k-seed=5"


def test_lerobot_stats_columns(tmp_path, cli):
    """stats_quantiles writes LeRobot's per-episode stats as its writer names them (compute_stats.py:
    min, max, mean, std, count and q01, q10, q50, q90, q99 per feature), and vlafeed opens the result
    with the same episodes as without them."""
    assert scale_meta.variant_name("1m", scale_meta.shape_params("1m", meta_row_group=10, stats_quantiles=True)) \
        == "1m-rg10-lr"
    params = dict(episodes=40, seed=2, meta_row_group=10, episodes_per_meta_file=20, num_tasks=5)
    plain, real = tmp_path / "plain", tmp_path / "real"
    scale_meta.generate(plain, **params)
    scale_meta.generate(real, stats_quantiles=True, **params)
    f = pq.ParquetFile(sorted((real / "meta/episodes").glob("chunk-*/file-*.parquet"))[0])
    names = set(f.schema_arrow.names)
    stats = ("min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99")
    for feature in ("observation.state", "action", "observation.images.a", "timestamp", "index"):
        assert {f"stats/{feature}/{k}" for k in stats} <= names, feature
    assert f.metadata.num_row_groups == 2 and len([n for n in names if n.startswith("stats/")]) == 10 * 10
    t = f.read_row_group(0).to_pydict()
    for i in range(10):   # quantiles ordered inside [min, max], per component
        row = [t[f"stats/action/{k}"][i] for k in ("min", "q01", "q10", "q50", "q90", "q99", "max")]
        assert all(a <= b for col in zip(*row) for a, b in zip(col, col[1:]))
    _, a = info_json(cli, plain, "--no-file-checks")
    _, b = info_json(cli, real, "--no-file-checks")
    assert a["total_episodes"] == b["total_episodes"] == 40 and a["total_frames"] == b["total_frames"]
    assert not b["problems"]


def test_bench_harness_reports_timeouts_and_errors(tmp_path, cli):
    r = scale_bench.run_child([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert r["timed_out"]
    r = scale_bench.run_child([sys.executable, "-c", "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096])"],
                              timeout=60)
    assert r["rc"] == 0 and not r["timed_out"]
    assert r["maxrss_mb"] >= 200  # the child's own peak, not this process's

    class Args:
        world_size, workers, batch_size, timeout, py_kwarg = 4, 2, 8, 60, {}

    env = scale_bench.python_env()
    missing = tmp_path / "nothing-here"
    for what in ("info", "plan", "meta_py", "loader:stream:all"):
        res = scale_bench.measure(what, missing, Args, cli, [], env, False)
        assert res["status"].startswith("error: "), res
    table = scale_bench.markdown([dict(res, dataset="x")])
    assert "| x |" in table and "error: " in table


@pytest.mark.skipif(not os.environ.get("VF_SCALE_HEAVY"), reason="heavy (100K episodes): set VF_SCALE_HEAVY=1")
def test_100k_metadata_opens_with_only_files_missing(tmp_path, cli):
    root = tmp_path / "100k"
    stamp = scale_meta.generate(root, **scale_meta.shape_params("100k"))
    rc, doc = info_json(cli, root, "--no-data-check")
    assert rc == 1
    assert doc["total_episodes"] == 100_000 and doc["total_frames"] == stamp["total_frames"]
    kinds = {p["message"] for p in doc["problems"]}
    assert kinds == {"video file missing", "data file missing"}
    assert sum(p["message"] == "video file missing" for p in doc["problems"]) == stamp["distinct_video_files"]
    r = subprocess.run([cli, "plan", "--json", "--world-size", "1024", "--workers", "8", str(root)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["frames"] == stamp["total_frames"]
    assert [c["files"] for c in plan["cameras"]] == stamp["video_files_per_camera"]


def test_bench_meta_cache_modes(tmp_path, cli):
    """scale_bench --meta-cache: off sets VF_META_CACHE=0 (the cache untouched), cold a new empty
    VF_CACHE_DIR per run (every episodes file a miss, written), warm one folder per dataset filled
    beforehand (every file a hit); the folders go with close()."""
    root = tmp_path / "ds"
    scale_meta.generate(root, episodes=40, seed=2, meta_row_group=10, episodes_per_meta_file=20, num_tasks=5)

    class Args:
        world_size, workers, batch_size, timeout, py_kwarg = 4, 2, 8, 60, {}

    dirs = scale_bench.MetaCacheDirs(cli)
    try:
        notes = {}
        for mode in ("off", "cold", "cold", "warm", "warm"):
            res = scale_bench.measure("info", root, Args, cli, ["--no-file-checks"], scale_bench.python_env(), False,
                                      dirs.env(mode, root))
            assert res["status"] == "ok", res
            notes.setdefault(mode, []).append(res["notes"])
        assert all("meta cache" not in n for n in notes["off"])
        assert all("0 hits, 2 misses, 2 written" in n for n in notes["cold"])
        assert all("2 hits, 0 misses, 0 written" in n for n in notes["warm"])
        top = dirs.top
        assert len(list(top.glob("cold-*"))) == 2 and len(list(top.glob("warm-*"))) == 1
    finally:
        dirs.close()
    assert not top.exists()
