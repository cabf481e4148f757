"""Checks made when a dataset is opened (issue 10, part 3): files that are
not regular files are refused at once (no open can block), metadata path
templates never leave the dataset root, Parquet page CRCs are verified, and
metadata errors that `vlafeed info` reports fail the Python open unless
on_metadata_error="warn" is passed (then they are Python warnings, counted).

FIFO cases run in a child process under a timeout, so a regression shows as
a failure instead of a hung test suite."""
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import vlafeed
from vlafeed import _native

import damage

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sample(cli, tmp_path_factory):
    return damage.make_sample(cli, tmp_path_factory.mktemp("open") / "base")


def run_cli(cli, *args, timeout=60):
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def run_python(code, timeout=60):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("target", [damage.DATA_FILE, "meta/info.json", damage.EPISODES_FILE, damage.VIDEO_FILE])
def test_fifo_is_refused_without_blocking(cli, sample, tmp_path, target):
    root = damage.copy(sample, tmp_path / "ds")
    damage.replace_with_fifo(root / target)
    r = run_python(f"import vlafeed\nds = vlafeed.LeRobotDataset({str(root)!r})\nprint(ds[0].keys())")
    assert r.returncode != 0
    assert f"{target}: not a regular file (a FIFO)" in r.stderr, r.stderr
    r = run_cli(cli, "info", root)
    assert r.returncode == 1
    assert "not a regular file (a FIFO)" in r.stdout + r.stderr
    assert target in r.stdout + r.stderr


def test_directory_in_place_of_files(cli, sample, tmp_path):
    root = damage.copy(sample, tmp_path / "ds")
    damage.replace_with_dir(root / damage.VIDEO_FILE)
    r = run_cli(cli, "info", root)
    assert r.returncode == 1
    assert f"{damage.VIDEO_FILE} [episode 0] [{damage.CAM}]: video file is not a regular file (a directory)" in r.stdout
    with pytest.raises(vlafeed.VlafeedError, match="not a regular file"):
        vlafeed.LeRobotDataset(root)[0]
    root2 = damage.copy(sample, tmp_path / "ds2")
    damage.replace_with_dir(root2 / "meta/info.json")
    with pytest.raises(vlafeed.VlafeedError, match=r"meta/info.json: not a regular file \(a directory\)"):
        vlafeed.LeRobotDataset(root2)


@pytest.mark.parametrize("key,template", [
    ("data_path", "../outside/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
    ("data_path", "data/../../chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
    ("data_path", "/etc/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
    ("video_path", "videos/{video_key}/../../../x/file-{file_index:03d}.mp4"),
    ("video_path", "http://elsewhere.example/{video_key}/file-{file_index:03d}.mp4"),
])
def test_path_templates_stay_inside_the_root(cli, sample, tmp_path, key, template):
    root = damage.copy(sample, tmp_path / "ds")
    damage.edit_info(root, lambda info: info.__setitem__(key, template))
    r = run_cli(cli, "info", root)
    assert r.returncode != 0
    assert "meta/info.json" in r.stderr and key in r.stderr and "dataset root" in r.stderr, r.stderr
    with pytest.raises(vlafeed.VlafeedError, match=f"{key}.*dataset root"):
        vlafeed.LeRobotDataset(root)


def test_feature_name_cannot_escape_through_video_key(cli, sample, tmp_path):
    root = damage.copy(sample, tmp_path / "ds")

    def rename(info):
        info["features"] = {("../../x" if k == damage.CAM else k): v for k, v in info["features"].items()}
    damage.edit_info(root, rename)
    t = damage.read_episodes(root)
    damage.write_episodes(root, t.rename_columns([c.replace(damage.CAM, "../../x") for c in t.column_names]))
    with pytest.raises(vlafeed.VlafeedError, match="dataset root"):
        vlafeed.LeRobotDataset(root)


def write_checksummed(path, values):
    table = pa.table({"x": pa.array(values, pa.float32())})
    pq.write_table(table, path, compression="none", write_page_checksum=True, use_dictionary=False)


def test_parquet_page_crc_verified(tmp_path):
    path = tmp_path / "crc.parquet"
    values = np.arange(64, dtype=np.float32)
    write_checksummed(path, values)
    got = _native.parquet_read(str(path))
    np.testing.assert_array_equal(np.asarray(got["x"]), values)  # intact: reads, CRC checked
    # Flip one bit inside the value bytes of the only data page: pyarrow with
    # verification refuses it, and so must vlafeed (no value 1.655e38).
    raw = path.read_bytes()
    offset = raw.find(np.float32(10.0).tobytes())
    assert offset > 0
    damage.flip_byte(path, offset + 3)
    with pytest.raises(OSError):
        pq.read_table(path, page_checksum_verification=True)
    with pytest.raises(vlafeed.VlafeedError, match=r"crc.parquet: column 'x', row group 0, page 0: page CRC mismatch"):
        _native.parquet_read(str(path))


def test_parquet_without_crc_still_reads(tmp_path):
    path = tmp_path / "nocrc.parquet"
    pq.write_table(pa.table({"x": pa.array([1.0, 2.0], pa.float32())}), path, write_page_checksum=False)
    np.testing.assert_array_equal(np.asarray(_native.parquet_read(str(path))["x"]), [1.0, 2.0])


def test_data_file_crc_damage_is_an_error_not_a_value(cli, sample, tmp_path):
    root = damage.copy(sample, tmp_path / "ds")
    damage.edit_data(root, lambda t: t, compression="none", write_page_checksum=True, use_dictionary=False)
    ds = vlafeed.LeRobotDataset(root)
    first = float(ds[0]["action"][0])
    path = root / damage.DATA_FILE
    offset = path.read_bytes().find(np.float32(first).tobytes())
    assert offset > 0
    damage.flip_byte(path, offset + 3)
    with pytest.raises(vlafeed.VlafeedError, match="page CRC mismatch"):
        vlafeed.LeRobotDataset(root)[0]


def duplicate_first_episode(rows):
    return rows[:1] + rows


@pytest.mark.parametrize("name,edit,message", [
    ("duplicate", duplicate_first_episode, "episode 0 is listed twice"),
    ("missing", lambda rows: rows[:1] + rows[2:], "the metadata lists 2 episodes, info.json total_episodes says 3"),
    ("overlap", lambda rows: [dict(r, dataset_from_index=r["dataset_from_index"] - 1 if i == 2 else
                                   r["dataset_from_index"], length=r["length"] + (1 if i == 2 else 0))
                              for i, r in enumerate(rows)], "global index not contiguous"),
])
def test_metadata_errors_fail_the_python_open(cli, sample, tmp_path, name, edit, message):
    root = damage.copy(sample, tmp_path / name)
    damage.edit_episodes(root, edit)
    info = run_cli(cli, "info", root)
    assert info.returncode == 1
    assert message in info.stdout
    with pytest.raises(vlafeed.VlafeedError, match=message) as err:
        vlafeed.LeRobotDataset(root)
    assert "meta/episodes" in str(err.value) and 'on_metadata_error="warn"' in str(err.value)
    with pytest.raises(vlafeed.VlafeedError, match=message) as err:
        vlafeed.Loader(root, batch_size=2)
    # The advice in the message works where the message came from (the Loader took no such keyword).
    assert 'on_metadata_error="warn"' in str(err.value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vlafeed.Loader(root, batch_size=2, on_metadata_error="warn").close()
    assert any(message in str(w.message) for w in caught)
    # Lenient mode: the same problems become Python warnings and are counted.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        meta = vlafeed.LeRobotDatasetMetadata(root, on_metadata_error="warn")
    texts = [str(w.message) for w in caught]
    assert any(message in t for t in texts), texts
    assert meta.metadata_errors_ignored == len([t for t in texts if "on_metadata_error" in t]) >= 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        native = _native.Dataset(str(root), on_metadata_error="warn")
    assert native.num_episodes >= 1
    assert len(caught) == meta.metadata_errors_ignored


def test_on_metadata_error_is_validated(sample):
    with pytest.raises(ValueError, match="on_metadata_error"):
        _native.Dataset(str(sample), on_metadata_error="ignore")
    assert vlafeed.LeRobotDataset(sample).meta.metadata_errors_ignored == 0
