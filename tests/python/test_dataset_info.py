"""Dataset metadata layer, end to end: LeRobot v3.0 datasets written with
pyarrow the way LeRobot writes them (shared/docs/lerobot-format.md §1-§6),
read through vlafeed._native.dataset_info() and the `vlafeed info` command,
then corrupted one way each to check the exact problem or error reported.

The real v2.1 fixture (lerobot-g1-v21) is checked through the CLI.
"""
import json
import math
import pathlib
import shutil
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

native = pytest.importorskip("vlafeed._native")

FPS = 30
DIM = 4
CAMERAS = ["observation.images.front", "observation.images.top"]
TASKS = ["Pick the orange cube and place it in the box", "Put it back"]
LENGTHS = [12, 9, 15, 7, 10]
# Data files: (chunk, file) per episode (several per file, one rolled into chunk 1).
DATA_FILES = [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0)]
# Video files per camera, with independent (chunk, file) counters.
VIDEO_FILES = {
    "observation.images.front": [(0, 0), (0, 0), (0, 0), (0, 1), (0, 1)],
    "observation.images.top": [(0, 0), (0, 1), (0, 1), (0, 1), (0, 2)],
}
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
STATS_NAMES = ["min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"]


# ---- writers -------------------------------------------------------------

def pandas_metadata(data_columns, index_column):
    """The `pandas` key-value metadata DataFrame.to_parquet writes."""
    cols = [{"name": c, "field_name": c, "pandas_type": "int64", "numpy_type": "int64", "metadata": None}
            for c in data_columns]
    name = None if index_column == "__index_level_0__" else index_column
    cols.append({"name": name, "field_name": index_column, "pandas_type": "unicode", "numpy_type": "object",
                 "metadata": None})
    return json.dumps({"index_columns": [index_column],
                       "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode",
                                           "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
                       "columns": cols, "creator": {"library": "pyarrow", "version": pa.__version__},
                       "pandas_version": "2.2.3"})


def write_tasks(root, column="task"):
    """tasks.parquet as pandas writes it: task_index, then the index column
    holding the strings (`task` for the current writer, `__index_level_0__`
    for the older one)."""
    table = pa.table({"task_index": pa.array(range(len(TASKS)), pa.int64()), column: pa.array(TASKS)})
    table = table.replace_schema_metadata({b"pandas": pandas_metadata(["task_index"], column).encode()})
    pq.write_table(table, root / "meta/tasks.parquet", compression="snappy")


def episode_stats_columns(ep, n):
    """stats/<feature>/<stat> columns of one episode row (vector, image and
    scalar shapes), which the reader must skip without decoding."""
    cols = {}
    for feat in ["action", "observation.state"]:
        for s in STATS_NAMES:
            cols[f"stats/{feat}/{s}"] = [float(n)] if s == "count" else [0.5 + ep] * DIM
    for cam in CAMERAS:
        for s in STATS_NAMES:
            cols[f"stats/{cam}/{s}"] = [[[100.0]]] if s == "count" else [[[0.25]], [[0.5]], [[0.75]]]
    for feat in ["timestamp", "frame_index", "episode_index", "index", "task_index"]:
        for s in STATS_NAMES:
            cols[f"stats/{feat}/{s}"] = [float(ep)]
    return cols


def write_v3(root, *, episodes_split=((0, 0, [0, 1, 2]), (0, 1, [3, 4])), tasks_column="task",
             extra_index_column=False, mutate_episode=None, data_extra_rows=0, row_group_per_episode=True,
             string_feature=False):
    """Writes a 5-episode, 2-camera v3.0 dataset under root.

    episodes_split: (chunk, file, [episode indices]) per episodes-metadata file.
    mutate_episode: function(row dict) -> None applied to each metadata row.
    data_extra_rows: rows appended to the last episode of data file-000.
    row_group_per_episode: False writes each data file as one row group, as
    the v2.1 -> v3.0 converter does (episodes then start mid-group).
    string_feature: adds a `string` feature "observation.note" to the data.
    """
    root = pathlib.Path(root)
    for d in ["meta", "data"]:
        (root / d).mkdir(parents=True, exist_ok=True)
    froms = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]]).astype(int).tolist()

    # data: one row group per episode (ParquetWriter.write_table per episode)
    vec = pa.list_(pa.float32(), DIM)
    schema = pa.schema([("action", vec), ("observation.state", vec), ("timestamp", pa.float32()),
                        ("frame_index", pa.int64()), ("episode_index", pa.int64()), ("index", pa.int64()),
                        ("task_index", pa.int64())])
    if string_feature:
        schema = schema.append(pa.field("observation.note", pa.string()))
    tables = {}
    for ep, n in enumerate(LENGTHS):
        key = DATA_FILES[ep]
        extra = data_extra_rows if (key == (0, 0) and ep == 1) else 0
        k = np.arange(n + extra)
        vals = (np.arange((n + extra) * DIM, dtype=np.float32) + 1000 * ep).reshape(-1, DIM)
        tables.setdefault(key, []).append(pa.table({
            "action": pa.FixedSizeListArray.from_arrays(pa.array(vals.ravel()), DIM),
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(-vals.ravel()), DIM),
            "timestamp": pa.array((k / FPS).astype(np.float32)),
            "frame_index": pa.array(k, pa.int64()),
            "episode_index": pa.array(np.full(n + extra, ep), pa.int64()),
            "index": pa.array(froms[ep] + k, pa.int64()),
            "task_index": pa.array(np.full(n + extra, ep % 2), pa.int64()),
            **({"observation.note": pa.array([f"ep{ep}-frame{i}-\u00e9" * (i % 3) for i in k])}
               if string_feature else {}),
        }, schema=schema))
    for key, parts in tables.items():
        path = root / DATA_PATH.format(chunk_index=key[0], file_index=key[1])
        path.parent.mkdir(parents=True, exist_ok=True)
        if row_group_per_episode:  # the recorder: write_table per episode
            with pq.ParquetWriter(path, schema, compression="snappy") as w:
                for t in parts:
                    w.write_table(t)
        else:
            pq.write_table(pa.concat_tables(parts), path, compression="snappy", row_group_size=1 << 20)

    # videos: placeholders; from/to timestamps restart at each new file
    video_cols = {}
    for cam in CAMERAS:
        cur, t = None, 0.0
        rows = []
        for ep, n in enumerate(LENGTHS):
            key = VIDEO_FILES[cam][ep]
            if key != cur:
                cur, t = key, 0.0
                path = root / VIDEO_PATH.format(video_key=cam, chunk_index=key[0], file_index=key[1])
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"\x00\x00\x00\x18ftypisom placeholder")
            rows.append((key[0], key[1], t, t + n / FPS))
            t += n / FPS
        video_cols[cam] = rows

    # episodes metadata, in LeRobot's column order
    rows = []
    for ep, n in enumerate(LENGTHS):
        row = {"episode_index": ep, "tasks": [TASKS[ep % 2]], "length": n,
               "data/chunk_index": DATA_FILES[ep][0], "data/file_index": DATA_FILES[ep][1],
               "dataset_from_index": froms[ep], "dataset_to_index": froms[ep] + n}
        for cam in CAMERAS:
            c, f, a, b = video_cols[cam][ep]
            row.update({f"videos/{cam}/chunk_index": c, f"videos/{cam}/file_index": f,
                        f"videos/{cam}/from_timestamp": a, f"videos/{cam}/to_timestamp": b})
        row.update(episode_stats_columns(ep, n))
        if mutate_episode:
            mutate_episode(row)
        rows.append(row)
    for chunk, file, eps in episodes_split:
        part = [dict(rows[e]) for e in eps]
        for r in part:
            r["meta/episodes/chunk_index"] = chunk
            r["meta/episodes/file_index"] = file
        cols = {k: [r[k] for r in part] for k in part[0]}
        arrays = {}
        for k, v in cols.items():
            if k.endswith("from_timestamp") or k.endswith("to_timestamp"):
                arrays[k] = pa.array(v, pa.float64())
            elif k == "tasks":
                arrays[k] = pa.array(v, pa.list_(pa.string()))
            elif k.startswith("stats/"):
                arrays[k] = pa.array(v)
            else:
                arrays[k] = pa.array(v, pa.int64())
        table = pa.table(arrays)
        if extra_index_column:
            # pandas round trip: an index column appended, metadata added
            table = table.append_column("__index_level_0__", pa.array(range(len(part)), pa.int64()))
        path = root / f"meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="snappy")

    write_tasks(root, tasks_column)

    features = {
        "action": {"dtype": "float32", "shape": [DIM], "names": [f"j{i}" for i in range(DIM)]},
        "observation.state": {"dtype": "float32", "shape": [DIM], "names": {"motors": [f"j{i}" for i in range(DIM)]}},
    }
    for cam in CAMERAS:
        features[cam] = {"dtype": "video", "shape": [64, 96, 3], "names": ["height", "width", "channels"],
                         "info": {"video.height": 64, "video.width": 96, "video.codec": "av1",
                                  "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": FPS,
                                  "video.channels": 3, "has_audio": False}}
    if string_feature:
        features["observation.note"] = {"dtype": "string", "shape": [1], "names": None}
    for name in ["timestamp", "frame_index", "episode_index", "index", "task_index"]:
        features[name] = {"dtype": "float32" if name == "timestamp" else "int64", "shape": [1], "names": None}
    info = {"codebase_version": "v3.0", "robot_type": "so101_follower", "total_episodes": len(LENGTHS),
            "total_frames": sum(LENGTHS), "total_tasks": len(TASKS), "chunks_size": 1000,
            "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": FPS,
            "splits": {"train": f"0:{len(LENGTHS)}"}, "data_path": DATA_PATH, "video_path": VIDEO_PATH,
            "features": features}
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    stats = {"action": {"min": [0.0] * DIM, "max": [1.0] * DIM, "mean": [0.5] * DIM, "std": [0.1] * DIM,
                        "count": [sum(LENGTHS)], "q01": [0.01] * DIM},
             "observation.images.front": {"mean": [[[0.25]], [[0.5]], [[0.75]]], "std": [[[0.1]], [[0.1]], [[0.1]]],
                                          "min": [[[0.0]], [[0.0]], [[0.0]]], "max": [[[1.0]], [[1.0]], [[1.0]]],
                                          "count": [500]},
             "index": {"mean": [float("nan")], "std": [1.0], "min": [0], "max": [sum(LENGTHS) - 1],
                       "count": [sum(LENGTHS)]}}
    (root / "meta/stats.json").write_text(json.dumps(stats, indent=4))  # NaN written as Python does
    return root


def info(root, **kw):
    # The synthetic datasets here hold placeholder MP4s: the video checks
    # (issue 10) are exercised by test_corruption_corpus.py instead.
    kw.setdefault("check_videos", False)
    return native.dataset_info(str(root), **kw)


def problems(doc, severity=None):
    """The problems of that severity; changes_samples is left out of errors (it is False for every error)."""
    got = [p for p in doc["problems"] if severity is None or p["severity"] == severity]
    assert all(p["changes_samples"] is False for p in got if p["severity"] == "error"), got
    return [{k: v for k, v in p.items() if k != "changes_samples" or p["severity"] == "warning"} for p in got]


def errors(doc):
    return problems(doc, "error")


# ---- good datasets -------------------------------------------------------------

def test_v3_good(tmp_path):
    root = write_v3(tmp_path / "ds")
    doc = info(root)
    assert doc["path"] == str(root)
    assert doc["format_version"] == "v3.0"
    assert doc["robot_type"] == "so101_follower"
    assert doc["fps"] == FPS
    assert (doc["total_episodes"], doc["total_frames"], doc["total_tasks"]) == (5, sum(LENGTHS), 2)
    assert [f["name"] for f in doc["features"]] == ["action", "observation.state", *CAMERAS, "timestamp",
                                                    "frame_index", "episode_index", "index", "task_index"]
    assert doc["features"][0] == {"name": "action", "dtype": "float32", "shape": [DIM], "kind": "vector"}
    assert doc["features"][2]["kind"] == "video"
    assert doc["features"][4]["kind"] == "scalar"
    assert doc["cameras"] == [
        {"key": "observation.images.front", "codec": "av1", "width": 96, "height": 64, "pix_fmt": "yuv420p",
         "fps": FPS, "is_depth": False, "files": 2},
        {"key": "observation.images.top", "codec": "av1", "width": 96, "height": 64, "pix_fmt": "yuv420p",
         "fps": FPS, "is_depth": False, "files": 3},
    ]
    assert doc["data_files"] == 3
    assert doc["tasks"] == TASKS
    assert doc["episodes_selected"] == 5
    assert doc["stats"]["action"]["mean"] == [0.5] * DIM
    assert doc["stats"]["action"]["shape"] == [DIM]
    assert "q01" not in doc["stats"]["action"]  # summary: mean/std/min/max only
    assert doc["stats"]["observation.images.front"]["shape"] == [3, 1, 1]
    assert doc["stats"]["observation.images.front"]["mean"] == [0.25, 0.5, 0.75]
    # NaN in stats.json: null in the report, flagged as a warning
    assert doc["stats"]["index"]["mean"] == [None]
    assert problems(doc) == [{"severity": "warning", "file": "meta/stats.json", "episode": None,
                              "column": "index.mean", "changes_samples": False,
                              "message": "non-finite value (NaN, Infinity or null) at element 0"}]
    assert doc["missing_files"] == []
    assert len(doc["fingerprint"]) == 16


def test_v3_subset_and_unknown_episode(tmp_path):
    root = write_v3(tmp_path / "ds")
    doc = info(root, episodes=[4, 0])
    assert doc["episodes_selected"] == 2
    assert doc["data_files"] == 2
    assert [c["files"] for c in doc["cameras"]] == [2, 2]
    with pytest.raises(FileNotFoundError, match="episode 9 is not in the dataset"):
        info(root, episodes=[1, 9])


def test_v3_old_tasks_column(tmp_path):
    root = write_v3(tmp_path / "ds", tasks_column="__index_level_0__")
    doc = info(root)
    assert doc["tasks"] == TASKS
    assert errors(doc) == []


def test_v3_tasks_from_pandas_index_metadata(tmp_path):
    root = write_v3(tmp_path / "ds", tasks_column="task_text")
    assert info(root)["tasks"] == TASKS


def test_v3_extra_pandas_index_column_in_episodes(tmp_path):
    root = write_v3(tmp_path / "ds", extra_index_column=True)
    doc = info(root)
    assert errors(doc) == []
    assert doc["total_frames"] == sum(LENGTHS)


def test_v3_chunk_1000_sorts_after_chunk_999(tmp_path):
    # Lexicographic order would put chunk-1000 (episodes 3, 4) first.
    root = write_v3(tmp_path / "ds", episodes_split=((999, 0, [0, 1, 2]), (1000, 0, [3, 4])))
    doc = info(root)
    assert errors(doc) == []
    # file-10 after file-9 inside one chunk, too
    root2 = write_v3(tmp_path / "ds2", episodes_split=((0, 9, [0, 1]), (0, 10, [2, 3, 4])))
    assert errors(info(root2)) == []


# ---- corruptions -----------------------------------------------------------------

def test_v3_sum_of_lengths_wrong(tmp_path):
    root = write_v3(tmp_path / "ds")
    meta = json.loads((root / "meta/info.json").read_text())
    meta["total_frames"] += 1
    (root / "meta/info.json").write_text(json.dumps(meta))
    doc = info(root, check_data=False)
    assert errors(doc) == [{"severity": "error", "file": "meta/episodes", "episode": None, "column": "total_frames",
                            "message": f"the episode lengths sum to {sum(LENGTHS)}, info.json total_frames says "
                                       f"{sum(LENGTHS) + 1}"}]


def test_v3_non_contiguous_index(tmp_path):
    def shift(row):
        if row["episode_index"] == 2:
            row["dataset_from_index"] += 1
            row["dataset_to_index"] += 1
    root = write_v3(tmp_path / "ds", mutate_episode=shift)
    doc = info(root, check_data=False)
    f2 = sum(LENGTHS[:2])
    assert errors(doc) == [
        {"severity": "error", "file": "meta/episodes", "episode": 2, "column": "dataset_from_index",
         "message": f"global index not contiguous: episode starts at {f2 + 1}, expected {f2}"},
        {"severity": "error", "file": "meta/episodes", "episode": 3, "column": "dataset_from_index",
         "message": f"global index not contiguous: episode starts at {f2 + LENGTHS[2]}, "
                    f"expected {f2 + LENGTHS[2] + 1}"},
    ]


def test_v3_length_disagrees_with_range(tmp_path):
    def bad(row):
        if row["episode_index"] == 1:
            row["dataset_to_index"] += 2
    root = write_v3(tmp_path / "ds", mutate_episode=bad)
    doc = info(root, check_data=False)
    assert any(p["episode"] == 1 and p["column"] == "dataset_to_index" and "but length is 9" in p["message"]
               for p in errors(doc))


def test_v3_missing_data_file(tmp_path):
    root = write_v3(tmp_path / "ds")
    (root / "data/chunk-000/file-001.parquet").unlink()
    doc = info(root)
    assert doc["missing_files"] == ["data/chunk-000/file-001.parquet"]
    assert errors(doc) == [{"severity": "error", "file": "data/chunk-000/file-001.parquet", "episode": 2,
                            "column": "", "message": "data file missing"}]
    # a subset of episodes stored elsewhere does not check that file
    assert info(root, episodes=[0, 1, 4])["missing_files"] == []


def test_v3_missing_video(tmp_path):
    root = write_v3(tmp_path / "ds")
    (root / "videos/observation.images.top/chunk-000/file-001.mp4").unlink()
    doc = info(root)
    assert doc["missing_files"] == ["videos/observation.images.top/chunk-000/file-001.mp4"]
    assert errors(doc) == [{"severity": "error", "file": "videos/observation.images.top/chunk-000/file-001.mp4",
                            "episode": 1, "column": "observation.images.top", "message": "video file missing"}]


def test_v3_unsupported_version(tmp_path, cli):
    root = write_v3(tmp_path / "ds")
    meta = json.loads((root / "meta/info.json").read_text())
    meta["codebase_version"] = "v1.6"
    (root / "meta/info.json").write_text(json.dumps(meta))
    with pytest.raises(native.VlafeedError, match=r"meta/info.json: codebase_version: unsupported version 'v1.6'"):
        info(root)
    res = subprocess.run([cli, "info", str(root), "--json"], capture_output=True, text=True)
    assert res.returncode == 1
    assert "unsupported version 'v1.6'" in res.stderr
    assert res.stdout == ""


def test_v3_missing_episodes_column_is_fatal(tmp_path):
    def drop(row):
        del row["videos/observation.images.top/from_timestamp"]
    root = write_v3(tmp_path / "ds", mutate_episode=drop)
    with pytest.raises(FileNotFoundError,
                       match=r"meta/episodes/chunk-000/file-000.parquet: missing column "
                             r"'videos/observation.images.top/from_timestamp'"):
        info(root)


def test_v3_video_span_shorter_than_length(tmp_path):
    def drop_frames(row):
        if row["episode_index"] == 3:
            row["videos/observation.images.front/to_timestamp"] -= 2 / FPS
    root = write_v3(tmp_path / "ds", mutate_episode=drop_frames)
    doc = info(root)
    warn = [p for p in problems(doc, "warning") if p["column"].startswith("videos/")]
    assert len(warn) == 1
    assert warn[0]["episode"] == 3
    assert warn[0]["column"] == "videos/observation.images.front/to_timestamp"
    assert "5.000 frames matches neither the episode length 7" in warn[0]["message"]


def test_v3_data_file_rows_disagree(tmp_path):
    root = write_v3(tmp_path / "ds", data_extra_rows=2)
    doc = info(root)
    msgs = [p for p in errors(doc) if p["file"] == "data/chunk-000/file-000.parquet"]
    assert msgs and msgs[0]["message"] == f"file has {LENGTHS[0] + LENGTHS[1] + 2} rows, the episodes stored in it " \
                                          f"have {LENGTHS[0] + LENGTHS[1]}"
    # without footer checks the metadata alone looks fine
    assert errors(info(root, check_data=False)) == []


def test_v3_episode_rows_out_of_position(tmp_path):
    # episodes files whose rows are not in episode order
    root = write_v3(tmp_path / "ds", episodes_split=((0, 0, [3, 4]), (0, 1, [0, 1, 2])))
    doc = info(root, check_data=False)
    assert any(p["column"] == "episode_index" and p["message"].startswith("row 0 holds episode 3")
               for p in errors(doc))


# ---- table reads through the engine --------------------------------------------

COLUMNS = ["action", "observation.state", "timestamp", "frame_index", "episode_index", "index", "task_index"]


def expected_rows(root, episodes):
    tables = [pq.read_table(p) for p in sorted((root / "data").glob("*/*.parquet"))]
    table = pa.concat_tables(tables)
    ep = table.column("episode_index").to_numpy()
    out = {}
    for name in COLUMNS:
        col = table.column(name)
        if pa.types.is_fixed_size_list(col.type):
            vals = np.stack([np.asarray(v, dtype=np.float32) for v in col.to_pylist()])
        else:
            vals = col.to_numpy()
        out[name] = np.concatenate([vals[ep == e] for e in episodes])
    return out


def read_native(root, episodes=None):
    starts, cols = native.dataset_read_table(str(root), COLUMNS, episodes=episodes)
    arrays = {}
    for name, (data, dtype, width) in cols.items():
        a = np.frombuffer(data, dtype=np.float32 if dtype == "float32" else np.int64)
        arrays[name] = a.reshape(-1, width) if width > 1 else a
    return starts, arrays


@pytest.mark.parametrize("row_group_per_episode", [True, False])
@pytest.mark.parametrize("episodes", [None, [1, 3], [4, 2]])
def test_v3_table_matches_pyarrow(tmp_path, row_group_per_episode, episodes):
    root = write_v3(tmp_path / "ds", row_group_per_episode=row_group_per_episode)
    if not row_group_per_episode:
        assert pq.ParquetFile(root / "data/chunk-000/file-000.parquet").num_row_groups == 1
    starts, got = read_native(root, episodes)
    order = sorted(episodes) if episodes else list(range(len(LENGTHS)))
    assert starts == np.concatenate([[0], np.cumsum([LENGTHS[e] for e in order])]).tolist()
    want = expected_rows(root, order)
    for name in COLUMNS:
        assert got[name].dtype == (np.float32 if name in ("action", "observation.state", "timestamp") else np.int64)
        np.testing.assert_array_equal(got[name], want[name].astype(got[name].dtype), err_msg=name)


def test_v3_table_index_gap(tmp_path):
    # episode 3's range claims one row more than file-001 holds for it
    def longer(row):
        if row["episode_index"] == 3:
            row["length"] += 1
            row["dataset_to_index"] += 1
        if row["episode_index"] == 4:
            row["dataset_from_index"] += 1
            row["dataset_to_index"] += 1
    root = write_v3(tmp_path / "ds", mutate_episode=longer)
    with pytest.raises(native.VlafeedError, match=r"file-001.parquet: episode 3: rows \[15, 23\) are outside the file's 22 rows"):
        native.dataset_read_table(str(root), ["action"], episodes=[3])
    # episode 4 in chunk-001 starts at a global index its file does not have
    with pytest.raises(native.VlafeedError, match=r"chunk-001/file-000.parquet: episode 4: "):
        native.dataset_read_table(str(root), ["action"], episodes=[4])


def test_v3_table_strings(tmp_path):
    root = write_v3(tmp_path / "ds", string_feature=True)
    doc = info(root)
    assert errors(doc) == []
    assert {"name": "observation.note", "dtype": "string", "shape": [1], "kind": "string"} in doc["features"]
    starts, cols = native.dataset_read_table(str(root), ["observation.note", "frame_index"], episodes=[3, 1])
    notes, dtype, width = cols["observation.note"]
    assert (dtype, width) == ("str", 1)
    want = [f"ep{ep}-frame{i}-\u00e9" * (i % 3) for ep in (1, 3) for i in range(LENGTHS[ep])]
    assert notes == want
    assert starts == [0, LENGTHS[1], LENGTHS[1] + LENGTHS[3]]


def test_v3_table_shape_mismatch_names_file_episode_column(tmp_path):
    root = write_v3(tmp_path / "ds")
    meta = json.loads((root / "meta/info.json").read_text())
    meta["features"]["observation.state"]["shape"] = [DIM + 1]
    (root / "meta/info.json").write_text(json.dumps(meta))
    with pytest.raises(native.VlafeedError,
                       match=r"data/chunk-000/file-001.parquet: episode 2: column 'observation.state': "
                             r"row 0 has 4 elements, shape says 5"):
        native.dataset_read_table(str(root), ["observation.state"], episodes=[2])


def test_v3_table_index_disagrees(tmp_path):
    # metadata shifted by one row inside file-000, consistently (index
    # ranges still contiguous): the verified episode_index catches it
    def shift(row):
        if row["episode_index"] == 1:
            row["dataset_from_index"] -= 1
            row["length"] += 1
        if row["episode_index"] == 0:
            row["length"] -= 1
            row["dataset_to_index"] -= 1
    root = write_v3(tmp_path / "ds", mutate_episode=shift)
    assert errors(info(root, check_data=False)) == []
    with pytest.raises(native.VlafeedError, match=r"file-000.parquet: episode 1: row 0 of the episode has episode_index 0, expected 1"):
        native.dataset_read_table(str(root), ["action"], episodes=[1])


# ---- the CLI on the real fixture ------------------------------------------------

def test_cli_fixture_json(g1_dir, cli):
    res = subprocess.run([cli, "info", str(g1_dir), "--json"], capture_output=True, text=True)
    assert res.returncode == 1, res.stderr  # the 97 missing videos are errors
    doc = json.loads(res.stdout)
    assert doc["format_version"] == "v2.1"
    assert (doc["total_episodes"], doc["total_frames"], doc["total_tasks"]) == (100, 35965, 1)
    feats = {f["name"]: f for f in doc["features"]}
    assert feats["observation.state"]["shape"] == [26] and feats["action"]["shape"] == [26]
    assert doc["cameras"] == [{"key": "observation.images.cam_high", "codec": "av1", "width": 640, "height": 480,
                               "pix_fmt": "yuv420p", "fps": 30, "is_depth": False, "files": 100}]
    present = {1, 2, 4}
    expected = [f"videos/chunk-000/observation.images.cam_high/episode_{e:06d}.mp4" for e in range(100)
                if e not in present]
    assert doc["missing_files"] == expected
    assert len(doc["missing_files"]) == 97
    assert len(errors(doc)) == 97
    assert doc["data_files"] == 100
    assert doc["tasks"] == ["Pick up the yellow bottle on the table."]
    assert math.isclose(doc["stats"]["observation.state"]["mean"][0], -0.77404041, abs_tol=1e-7)
    # the Python hook returns the same document
    assert native.dataset_info(str(g1_dir)) == doc


def test_cli_fixture_subset(g1_dir, cli):
    res = subprocess.run([cli, "info", str(g1_dir), "--json", "--episodes", "1,2,4"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
    doc = json.loads(res.stdout)
    assert doc["missing_files"] == []
    assert doc["problems"] == []
    assert doc["episodes_selected"] == 3
    human = subprocess.run([cli, "info", str(g1_dir), "--episodes=1-2,4"], capture_output=True, text=True)
    assert human.returncode == 0
    assert "v2.1" in human.stdout and "observation.images.cam_high" in human.stdout


def test_cli_usage(cli, g1_dir):
    assert subprocess.run([cli, "info"], capture_output=True).returncode == 2
    assert subprocess.run([cli, "info", str(g1_dir), "--bogus"], capture_output=True).returncode == 2
    assert subprocess.run([cli, "info", str(g1_dir), "--episodes", "x"], capture_output=True).returncode == 2
    res = subprocess.run([cli, "info", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "--episodes" in res.stdout
    res = subprocess.run([cli, "info", str(g1_dir), "--episodes", "500"], capture_output=True, text=True)
    assert res.returncode == 1 and "episode 500" in res.stderr
