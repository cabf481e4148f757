"""The persistent metadata cache (src/dataset/meta_cache.c) through the
binding (dataset_info(meta_cache=...), Dataset(meta_cache=...)) and
`vlafeed info` (--no-meta-cache, VF_META_CACHE=0), on v3.0 metadata written
with pyarrow the way LeRobot writes it (list<string> tasks, 10-row row
groups, the stats/<feature>/<stat> columns with q01..q99). Each test points
VF_CACHE_DIR at its own folder."""
import json
import os
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from meta_only import write_info_and_tasks
from vlafeed import _native as native

STATS = ("min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99")


def write_episodes(root, file_index, first, n, shift=0.0, task="pick"):
    e = np.arange(first, first + n, dtype=np.int64)
    start = (e % 10) * 0.2 + shift
    columns = {
        "episode_index": e, "tasks": [[task]] * n, "length": np.full(n, 2, np.int64),
        "data/chunk_index": np.zeros(n, np.int64), "data/file_index": np.zeros(n, np.int64),
        "dataset_from_index": 2 * e, "dataset_to_index": 2 * e + 2,
        "videos/cam/chunk_index": np.zeros(n, np.int64), "videos/cam/file_index": e // 10,
        "videos/cam/from_timestamp": start, "videos/cam/to_timestamp": start + 0.2,
    }
    for stat in STATS:
        columns[f"stats/action/{stat}"] = [[0.5, 0.5]] * n
    path = root / f"meta/episodes/chunk-000/file-{file_index:03d}.parquet"
    pq.write_table(pa.table(columns), path, row_group_size=10)
    return path


def write_dataset(root, files=3, per_file=40):
    n = files * per_file
    write_info_and_tasks(root, n)
    for f in range(files):
        write_episodes(root, f, f * per_file, per_file)
    return root


def info(root, **kw):
    return native.dataset_info(str(root), check_files=False, **kw)


def without_cache(doc):
    return {k: v for k, v in doc.items() if k != "meta_cache"}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("VF_CACHE_DIR", str(d))
    monkeypatch.delenv("VF_META_CACHE", raising=False)
    return d


def test_hit_after_first_open_same_model(tmp_path, cache_dir):
    root = write_dataset(tmp_path / "ds")
    fresh = info(root, meta_cache=False)
    assert fresh["meta_cache"] == {"enabled": False, "dir": None, "hits": 0, "misses": 0, "written": 0}
    assert not cache_dir.exists()  # off: nothing created

    first = info(root)
    assert first["meta_cache"] == {"enabled": True, "dir": str(cache_dir / "meta"), "hits": 0, "misses": 3,
                                   "written": 3}
    entries = sorted(p.name for p in (cache_dir / "meta").iterdir())
    assert len(entries) == 3 and all(name.endswith(".vfmeta") for name in entries)
    assert (cache_dir / "meta").stat().st_mode & 0o777 == 0o700
    second = info(root)
    assert second["meta_cache"]["hits"] == 3 and second["meta_cache"]["misses"] == 0
    assert second["meta_cache"]["written"] == 0
    assert without_cache(first) == without_cache(fresh) == without_cache(second)

    cached = native.Dataset(str(root), check_videos=0, check_files=False)
    uncached = native.Dataset(str(root), check_videos=0, check_files=False, meta_cache=False)
    assert cached.episodes == uncached.episodes and cached.fingerprint == uncached.fingerprint
    assert cached.info()["meta_cache"]["hits"] == 3
    assert uncached.info()["meta_cache"]["enabled"] is False


def test_rewritten_file_is_read_again(tmp_path, cache_dir):
    root = write_dataset(tmp_path / "ds")
    before = info(root)
    assert before["meta_cache"]["written"] == 3
    write_episodes(root, 1, 40, 40, shift=0.05)  # other timestamps: another fingerprint
    after = info(root)
    assert after["meta_cache"] == {**before["meta_cache"], "hits": 2, "misses": 1, "written": 1}
    assert after["fingerprint"] != before["fingerprint"]
    assert after["fingerprint"] == info(root, meta_cache=False)["fingerprint"]
    assert info(root)["meta_cache"]["hits"] == 3


def test_corrupt_entry_rebuilt_with_warning(tmp_path, cache_dir, cli):
    root = write_dataset(tmp_path / "ds", files=1)
    reference = info(root)
    (entry,) = (cache_dir / "meta").iterdir()
    entry.write_bytes(entry.read_bytes()[:200])  # truncated
    r = subprocess.run([cli, "info", str(root), "--json", "--no-file-checks"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["meta_cache"]["misses"] == 1 and doc["meta_cache"]["written"] == 1
    assert str(entry) in r.stderr and "decoding the file again" in r.stderr
    assert without_cache(doc) == without_cache(reference)
    assert info(root)["meta_cache"]["hits"] == 1


def test_cli_switches(tmp_path, cache_dir, cli):
    root = write_dataset(tmp_path / "ds", files=2)

    def run(*args, env=None):
        r = subprocess.run([cli, "info", str(root), "--json", "--no-file-checks", *args], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["meta_cache"]

    assert run("--no-meta-cache")["enabled"] is False
    assert run(env={**os.environ, "VF_META_CACHE": "0"})["enabled"] is False
    assert not cache_dir.exists()
    assert run()["written"] == 2
    assert run()["hits"] == 2
    human = subprocess.run([cli, "info", str(root), "--no-file-checks"], capture_output=True, text=True).stdout
    assert f"metadata   2 episodes files from the metadata cache, 0 decoded (0 cache entries written, " \
           f"{cache_dir / 'meta'})" in human
    r = subprocess.run([cli, "info", "--help"], capture_output=True, text=True)
    assert "--no-meta-cache" in r.stdout


def test_unwritable_folder_is_no_cache(tmp_path, monkeypatch):
    root = write_dataset(tmp_path / "ds", files=1)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("VF_CACHE_DIR", str(blocker / "cache"))  # cannot be created
    doc = info(root)
    assert doc["meta_cache"]["misses"] == 1 and doc["meta_cache"]["written"] == 0
    assert doc["problems"] == info(root, meta_cache=False)["problems"]


def test_v21_dataset_not_cached(g1_dir, cache_dir):
    doc = native.dataset_info(str(g1_dir), check_data=False, check_videos=False)
    assert doc["meta_cache"]["enabled"] is False
    assert not cache_dir.exists()
