"""File existence checks at scale, through the Python open
(vlafeed._native.dataset_info(check_files=...)) and `vlafeed info`
(--no-file-checks / --check-files): checked at open up to 10,000 data and
video files, deferred above, and the episodes-file order errors, on
LeRobot v3.0 metadata written with pyarrow (the stats columns included)."""
import json
import subprocess

import numpy as np
import pytest
import pyarrow as pa
import pyarrow.parquet as pq

from meta_only import write_info_and_tasks
from vlafeed import _native as native

LAZY = 10000  # VF_LAZY_FILE_CHECKS


def write_meta(root, n, per_video_file, episode_order=None):
    """n episodes of 2 frames, one camera, metadata only (no data or mp4)."""
    write_info_and_tasks(root, n)
    e = np.arange(n, dtype=np.int64) if episode_order is None else np.asarray(episode_order, dtype=np.int64)
    vf = e // per_video_file
    start = (e % per_video_file) * 0.2
    table = pa.table({
        "episode_index": e, "tasks": [["pick"]] * n, "length": np.full(n, 2, np.int64),
        "data/chunk_index": np.zeros(n, np.int64), "data/file_index": np.zeros(n, np.int64),
        "dataset_from_index": 2 * e, "dataset_to_index": 2 * e + 2,
        "videos/cam/chunk_index": vf // 1000, "videos/cam/file_index": vf % 1000,
        "videos/cam/from_timestamp": start, "videos/cam/to_timestamp": start + 0.2,
        "stats/action/mean": [[0.5, 0.5]] * n, "stats/action/count": [[2]] * n,
    })
    pq.write_table(table, root / "meta/episodes/chunk-000/file-000.parquet", row_group_size=10)
    return root


def test_small_dataset_checked_at_open_or_skipped(tmp_path, cli):
    root = write_meta(tmp_path / "ds", 30, 10)  # 1 data file + 3 mp4, all absent
    doc = native.dataset_info(str(root), check_data=False)
    assert doc["file_checks"] == "at_open"
    assert sorted(doc["missing_files"]) == ["data/chunk-000/file-000.parquet"] + [
        f"videos/cam/chunk-000/file-00{i}.mp4" for i in range(3)]
    doc = native.dataset_info(str(root), check_files=False)
    assert doc["file_checks"] == "skipped" and doc["missing_files"] == [] and doc["problems"] == []
    res = subprocess.run([cli, "info", str(root), "--no-file-checks"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "4 data and video files not checked (--no-file-checks)" in res.stdout


def test_large_dataset_deferred(tmp_path, cli):
    root = write_meta(tmp_path / "ds", LAZY + 1, 1)  # 1 data file + 10,001 mp4 files, all absent
    doc = native.dataset_info(str(root))
    assert doc["file_checks"] == "deferred"
    assert doc["missing_files"] == [] and doc["problems"] == []
    res = subprocess.run([cli, "info", str(root)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "10002 data and video files not checked at open (more than 10000" in res.stdout
    # forced: every file stat'ed, every absence an error
    doc = native.dataset_info(str(root), check_files=True, check_data=False)
    assert doc["file_checks"] == "at_open" and len(doc["missing_files"]) == LAZY + 2
    res = subprocess.run([cli, "info", str(root), "--check-files", "--json", "--compact"], capture_output=True,
                         text=True)
    assert res.returncode == 1
    assert len(json.loads(res.stdout)["missing_files"]) == LAZY + 2


def test_episodes_out_of_order_named(tmp_path):
    order = list(range(30))
    order[12], order[13] = 13, 12
    root = write_meta(tmp_path / "ds", 30, 10, episode_order=order)
    doc = native.dataset_info(str(root), check_files=False)
    errs = [p for p in doc["problems"] if p["file"] == "meta/episodes/chunk-000/file-000.parquet"]
    assert errs and errs[0]["episode"] == 12 and errs[0]["column"] == "episode_index"
    assert errs[0]["message"].startswith("episode 12 comes after episode 13 in the same file: rows out of order")


def test_index_beyond_32_bits_named(tmp_path):
    """The model keeps chunk/file indices in 32 bits: a larger one is an error naming the file, the
    row's episode and the column, not a silently truncated file name."""
    root = write_meta(tmp_path / "ds", 30, 10)
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    for column, value in (("videos/cam/file_index", 1 << 40), ("data/chunk_index", -(1 << 33))):
        table = pq.read_table(path)
        values = table.column(column).to_numpy().copy()
        values[17] = value
        table = table.set_column(table.schema.get_field_index(column), column, pa.array(values))
        pq.write_table(table, path, row_group_size=10)
        with pytest.raises(native.VlafeedError) as err:
            native.dataset_info(str(root), check_files=False)
        msg = str(err.value)
        assert "meta/episodes/chunk-000/file-000.parquet: row 17 (episode 17)" in msg, msg
        assert f"column '{column}' is {value}, outside the supported range" in msg, msg
        values[17] = 0 if column.startswith("data") else 1
        pq.write_table(table.set_column(table.schema.get_field_index(column), column, pa.array(values)), path,
                       row_group_size=10)
    assert native.dataset_info(str(root), check_files=False)["problems"] == []
