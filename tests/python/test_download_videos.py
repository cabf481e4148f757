"""download_videos=False on vlafeed.LeRobotDataset: LeRobot's "tabular only" (issue 26, part 7).

Items hold every table column and the task, no camera key; no MP4 is opened
(a dataset whose videos/ folder was never downloaded serves the same items);
through torch's DataLoader, in the main process and in worker processes. A
camera key asked for by name together with download_videos=False is refused
with a message naming it.
"""
import shutil
import warnings

import numpy as np
import pytest
import torch

import vlafeed
from damage import make_sample

CAMS = ["observation.images.cam0", "observation.images.cam1"]


@pytest.fixture(scope="module")
def roots(cli, tmp_path_factory):
    base = tmp_path_factory.mktemp("dlv")
    full = make_sample(cli, base / "full", episodes=4, cameras=2, min_length=10, max_length=16)
    bare = base / "bare"  # what a download without videos/ leaves
    shutil.copytree(full / "meta", bare / "meta")
    shutil.copytree(full / "data", bare / "data")
    return full, bare


def same_item(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_items_without_cameras(roots):
    full, bare = roots
    with_videos = vlafeed.LeRobotDataset(root=str(full))
    assert set(CAMS) <= set(with_videos[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning about the missing MP4s either
        tab_full = vlafeed.LeRobotDataset(root=str(full), download_videos=False)
        tab_bare = vlafeed.LeRobotDataset(root=str(bare), download_videos=False)
    assert len(tab_full) == len(tab_bare) == len(with_videos)
    # The metadata still describes the cameras, as LeRobot's does.
    assert tab_bare.meta.camera_keys == CAMS
    for i in (0, 7, len(with_videos) - 1):
        ref = {k: v for k, v in with_videos[i].items() if k not in CAMS}
        assert not set(CAMS) & set(tab_full[i])
        assert {"action", "observation.state", "index", "task"} <= set(tab_full[i])
        same_item(tab_full[i], ref)
        same_item(tab_bare[i], ref)
    # Without download_videos=False the bare dataset fails on its first item, naming the file.
    with pytest.raises(FileNotFoundError, match="videos/observation.images.cam0"):
        vlafeed.LeRobotDataset(root=str(bare), check_videos=0)[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader(roots, num_workers):
    _, bare = roots
    ds = vlafeed.LeRobotDataset(root=str(bare), download_videos=False, delta_timestamps={"action": [0.0, 1 / 30]})
    dl = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers,
                                     generator=torch.Generator().manual_seed(0))
    seen = []
    for batch in dl:
        assert not set(CAMS) & set(batch)
        assert batch["action"].shape[1:] == (2, 6) and batch["action_is_pad"].shape[1:] == (2,)
        assert len(batch["task"]) == len(batch["index"])
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(len(ds)))
    np.testing.assert_array_equal(ds[3]["observation.state"].numpy(),
                                  vlafeed.LeRobotDataset(root=str(roots[0]))[3]["observation.state"].numpy())


def test_camera_keys_refused(roots):
    _, bare = roots
    with pytest.raises(ValueError, match="keys asks for 'observation.images.cam1'"):
        vlafeed.LeRobotDataset(root=str(bare), download_videos=False, keys=["action", CAMS[1]])
    with pytest.raises(ValueError, match="delta_timestamps has 'observation.images.cam0'"):
        vlafeed.LeRobotDataset(root=str(bare), download_videos=False, delta_timestamps={CAMS[0]: [0.0]})
    # A tabular key list is kept as given.
    ds = vlafeed.LeRobotDataset(root=str(bare), download_videos=False, keys=["action"])
    assert set(ds[0]) == {"action", "task"}
