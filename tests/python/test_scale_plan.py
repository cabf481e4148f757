"""Plans at scale, from the public task API (vlafeed.plan), on synthetic
LeRobot v3.0 metadata written by bench/scale_meta.py (no data or video
file: planning never opens one).

- Coverage: at 1,024 ranks x 8 workers on a 100K-episode dataset, the
  pieces of all 8,192 consumers cover every sample of the epoch exactly
  once plus the documented wrap padding; with drop_last, no sample twice
  and exactly the documented remainder missing (fewer than world_size x
  (batch_size + 1)); in stream and pool mode; after an elastic resume too.
- Opens: on a DROID-shaped dataset (95,600 episodes, 3 cameras rolling over
  at different episodes) the MP4 opens per epoch that `vlafeed plan`
  prints at 1,024 x 8 equal the count from every consumer's task list and
  stay within 1.5x of the lower bound (every consumer must open at least
  one file per camera, so 8,192 x 3 > the 2.2K distinct files); at one
  rank with 8 workers, within 1.5x of the distinct files.
"""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import vlafeed.plan as vplan
from vlafeed import _native

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import scale_meta  # noqa: E402


@pytest.fixture(scope="module")
def ds100k(tmp_path_factory):
    root = scale_meta.ensure("100k", episode_stats=False)
    return _native.Dataset(str(root))


@pytest.fixture(scope="module")
def droid():
    return scale_meta.ensure("droid", episode_stats=False)


def coverage(pieces, n):
    """(samples delivered per position as run-length arrays): returns (missing, extra)."""
    starts = np.array([p["rows"][0] for p in pieces], dtype=np.int64)
    ends = starts + np.array([p["rows"][1] for p in pieces], dtype=np.int64)
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, starts, 1)
    np.add.at(delta, ends, -1)
    count = np.cumsum(delta)[:n]
    return int((count == 0).sum()), int(np.maximum(count - 1, 0).sum()), count


@pytest.mark.parametrize("mode", ["stream", "pool"])
def test_coverage_1024x8(ds100k, mode):
    world, workers, batch = 1024, 8, 32
    n = ds100k.num_frames
    pieces = vplan.consumer_tasks(ds100k, world_size=world, workers=workers, mode=mode, batch_size=batch, seed=7,
                                  epoch=3, video_files=False)
    consumers = {(p["rank"], p["worker"]) for p in pieces}
    assert len(consumers) == world * workers
    missing, extra, count = coverage(pieces, n)
    per_rank = -(-n // world)
    assert missing == 0
    assert extra == per_rank * world - n          # the wrap padding, and nothing else
    # Samples per rank are equal: the remainder rule.
    rows = {}
    for p in pieces:
        rows[p["rank"]] = rows.get(p["rank"], 0) + p["rows"][1]
    assert set(rows.values()) == {per_rank}

    report = vplan.plan(ds100k, world_size=world, workers=workers, mode=mode, batch_size=batch, seed=7, epoch=3,
                        drop_last=True)
    pieces = vplan.consumer_tasks(ds100k, world_size=world, workers=workers, mode=mode, batch_size=batch, seed=7,
                                  epoch=3, drop_last=True, video_files=False)
    missing, extra, _ = coverage(pieces, n)
    assert extra == 0
    kept = n // world // batch * batch
    assert missing == n - kept * world == report["dropped_drop_last"]
    assert missing < world * (batch + 1)
    for p in pieces:
        assert p["rows"][1] > 0


def test_coverage_after_elastic_resume(ds100k):
    """A state at 1,024 x 8 resolved for 768 x 4: the old delivered samples and the new
    consumers' pieces cover the epoch exactly once (plus both runs' wrap padding)."""
    n = ds100k.num_frames
    old = dict(mode="stream", batch_size=16, seed=1, world_size=1024)
    batches = 100
    state = _native.loader_state(ds100k, epoch=0, batches=batches, num_consumers=8, **old)
    new = _native.resolve_state(ds100k, resume=state, mode="stream", batch_size=16, seed=1, world_size=768,
                                num_consumers=4)
    rem = sum(b - a for a, b in new["ranges"])
    # Delivered by the old run: every old consumer's first samples. Reconstruct from its pieces.
    old_pieces = vplan.consumer_tasks(ds100k, world_size=1024, workers=8, mode="stream", batch_size=16, seed=1,
                                      video_files=False)
    per_consumer = {}
    for p in old_pieces:
        per_consumer.setdefault((p["rank"], p["worker"]), []).append(p)
    delivered = []
    # Round-robin over 8 workers, 100 rank batches: worker w delivered batches w, w+8, ... -> 13 or 12 batches.
    for (r, w), ps in per_consumer.items():
        take = (batches // 8 + (1 if w < batches % 8 else 0)) * 16
        for p in ps:
            k = min(take, p["rows"][1])
            if k > 0:
                delivered.append({"rows": [p["rows"][0], k]})
            take -= k
    new_pieces = vplan.consumer_tasks(ds100k, world_size=768, workers=4, mode="stream", batch_size=16, seed=1,
                                      state=new, video_files=False)
    assert sum(p["rows"][1] for p in new_pieces) == -(-rem // 768) * 768
    missing, extra, _ = coverage(delivered + new_pieces, n)
    assert missing == 0
    pad_old = -(-n // 1024) * 1024 - n
    assert extra <= pad_old + (-(-rem // 768) * 768 - rem)


def test_droid_opens(droid, cli):
    world, workers = 1024, 8
    out = subprocess.run([cli, "plan", str(droid), "--json", "--world-size", str(world), "--workers", str(workers)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    opens = report["opens"]
    assert opens["distinct_files"] > 2000
    # The lower bound: the distinct files of each consumer's share, summed (at least one file per camera
    # each, so more than the 2.2K distinct files at 8,192 consumers).
    assert opens["lower_bound"] >= max(opens["distinct_files"], world * workers * 3)
    # Count from the task lists: each consumer opens the distinct files of its pieces
    # (its part touches far fewer files than its decoder cache holds).
    pieces = vplan.consumer_tasks(str(droid), world_size=world, workers=workers)
    files = {}
    for p in pieces:
        s = files.setdefault((p["rank"], p["worker"]), set())
        for cam, paths in p["video_files"].items():
            s.update(paths)
    assert max(len(s) for s in files.values()) < opens["decoder_cache_entries"]
    counted = sum(len(s) for s in files.values())
    assert counted == opens["consumer_opens"] == opens["lower_bound"]
    text = subprocess.run([cli, "plan", str(droid), "--world-size", str(world), "--workers", str(workers)],
                          capture_output=True, text=True, timeout=300).stdout
    assert f": {counted};" in text
    # One rank with 8 workers: within 1.5x of the distinct files.
    small = vplan.plan(str(droid), world_size=1, workers=8)["opens"]
    assert small["consumer_opens"] <= 1.5 * small["distinct_files"]
    # Pool and map modes within 1.5x of their lower bounds too (pool: the share admitted in file
    # order; it was about one open per episode and camera).
    for mode in ("pool",):
        o = vplan.plan(str(droid), world_size=world, workers=workers, mode=mode)["opens"]
        assert o["consumer_opens"] <= 1.5 * o["lower_bound"], (mode, o)
        o = vplan.plan(str(droid), world_size=1, workers=8, mode=mode)["opens"]
        assert o["consumer_opens"] <= 1.5 * o["lower_bound"], (mode, o)
    # The file-group tasks follow the primary camera: about one task per file of it.
    tasks = vplan.tasks(str(droid), world_size=world, workers=workers)
    cams = report["cameras"]
    assert len(tasks) == max(c["files"] for c in cams)


def test_task_api_errors(ds100k):
    with pytest.raises(ValueError, match="map mode has no tasks"):
        vplan.consumer_tasks(ds100k, mode="map", rank=0, worker=0)
    with pytest.raises(ValueError, match="rank 4, consumer 0 is not in world_size 4 x 1"):
        vplan.consumer_tasks(ds100k, rank=4, worker=0, world_size=4)
    with pytest.raises(ValueError, match="give both rank and worker"):
        vplan.consumer_tasks(ds100k, rank=1)
