"""_native.Dataset.subset (vf_dataset_subset) and the Ray read tasks built on it.

A subset is made from an open dataset's model without reading a metadata
file again, so a Ray worker reads the metadata once per datasource and each
read task costs in proportion to its own episodes. Proven here on make-sample
data whose MP4s and data files each hold several episodes:
- a loader over a subset returns, batch for batch, exactly what a loader over
  an open with the same selection returns, and every frame's identity stamp
  is its own (episode, frame, camera), episodes from the middle of shared
  files included;
- the subset keeps its source alive (the source object dropped first);
- it reads no metadata file: with meta/ removed after the source's open, the
  subset and its loader still work;
- an unknown or repeated episode is an error naming it;
- a Ray worker process opens the dataset once per datasource and reuses it
  for every task (vlafeed.ray.lerobot._task_dataset).
The C side (closure of shared files, ordinals, ASan) is tests/c/test_dataset_subset.c.
"""
import gc
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import lerobot_reference as R  # noqa: E402

import vlafeed  # noqa: E402
from vlafeed import _native  # noqa: E402


@pytest.fixture(scope="module")
def sample(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("subset") / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "10", "--cameras", "2", "--codec", "h264",
                        "--size", "64x48", "--fps", "10", "--min-length", "6", "--max-length", "14",
                        "--max-video-mb", "0.02", "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    mp4s = list((root / "videos" / "observation.images.cam0").glob("*/*.mp4"))
    assert 1 < len(mp4s) < 10  # several files, several episodes in each
    return root


def batches(native):
    loader = vlafeed.Loader(native, mode="stream", batch_size=16, shuffle=False, rank=0, world_size=1, threads=1,
                            image_format="uint8_hwc", output="numpy")
    return [b for b in loader]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], list):
                assert x[k] == y[k], k
            else:
                assert np.array_equal(np.asarray(x[k]), np.asarray(y[k])), k


def assert_identities(bs, cams):
    n = 0
    for b in bs:
        for i in range(len(b["index"])):
            for c, key in enumerate(cams):
                assert R.read_identity(np.asarray(b[key][i])) == (int(b["episode_index"][i]),
                                                                  int(b["frame_index"][i]), c)
                n += 1
    assert n > 0


@pytest.mark.parametrize("episodes", [[7, 3, 8], [9], [0, 4, 5]])
def test_subset_equals_a_selection_open(sample, episodes):
    full = _native.Dataset(str(sample), check_videos=False, check_files=False)
    sub = full.subset(episodes)
    del full
    gc.collect()  # the subset keeps its source open
    assert [e["episode_index"] for e in sub.episodes] == sorted(episodes)
    got = batches(sub)
    assert_same(batches(_native.Dataset(str(sample), episodes, check_videos=False, check_files=False)), got)
    assert_identities(got, sub.camera_keys)


def test_subset_reads_no_metadata_file(sample, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(sample, root)
    full = _native.Dataset(str(root), check_videos=False, check_files=False)
    shutil.rmtree(root / "meta")  # data and videos stay
    sub = full.subset([6, 2])
    got = batches(sub)
    assert sum(len(b["index"]) for b in got) == sum(e["length"] for e in sub.episodes)
    assert_identities(got, sub.camera_keys)
    with pytest.raises(FileNotFoundError):
        _native.Dataset(str(root), [6, 2])


def test_subset_errors(sample):
    full = _native.Dataset(str(sample), check_videos=False, check_files=False)
    with pytest.raises(FileNotFoundError, match="episode 99 is not in the dataset"):
        full.subset([1, 99])
    with pytest.raises(ValueError, match="episode 3 is selected twice"):
        full.subset([3, 2, 3])
    with pytest.raises(TypeError):
        full.subset(5)


def test_ray_worker_opens_the_dataset_once_per_datasource(sample):
    pytest.importorskip("ray")
    import vlafeed.ray.lerobot as vray

    vray._WORKER_DATASET.clear()
    spec = {"root": str(sample), "source_id": "a"}
    first = vray._task_dataset(spec, [1, 2])
    cached = vray._WORKER_DATASET[0][1]
    second = vray._task_dataset(spec, [5])
    assert vray._WORKER_DATASET[0][1] is cached  # the second task reused the worker's open
    assert [e["episode_index"] for e in first.episodes] == [1, 2]
    assert [e["episode_index"] for e in second.episodes] == [5]
    vray._task_dataset({"root": str(sample), "source_id": "b"}, [0])
    assert vray._WORKER_DATASET[0][1] is not cached and len(vray._WORKER_DATASET) == 1  # one model per worker
    vray._WORKER_DATASET.clear()
