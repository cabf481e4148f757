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

import vlafeed
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
    rem = new["generations"][-1]["remaining"]
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


def test_pool_elastic_state_size(ds100k):
    """Pool mode, elastic restores at scale: 1,024 x 8 -> 768 x 4 after 26% of an epoch, then -> 512 x 2
    after 30% of what remained. Each state is a few hundred bytes of JSON, one generation more per restore,
    whatever was
    delivered (before state version 3 the first restore alone gave 3.87M ranges, 81 MB of JSON), and each
    generation's remainder is what was left less what its run delivered (wrap padding aside)."""
    n = ds100k.num_frames
    common = dict(mode="pool", seed=1, episode_pool_size=16)
    layouts = [(1024, 8, 16, 0.26), (768, 4, 16, 0.30), (512, 2, 32, None)]
    state, remaining, sizes = None, n, []
    for i in range(len(layouts) - 1):
        world, workers, batch, frac = layouts[i]
        kw = dict(common, world_size=world, num_consumers=workers, batch_size=batch)
        k = int(frac * (remaining // world // batch))
        st = _native.loader_state(ds100k, epoch=0, batches=k, resume=state, **kw)
        assert st["ranges"] == [] and len(st["generations"]) == i
        sizes.append(len(json.dumps(st)))
        nw, nc, nb, _ = layouts[i + 1]
        state = _native.resolve_state(ds100k, resume=st, **dict(common, world_size=nw, num_consumers=nc,
                                                                  batch_size=nb))
        gens = state["generations"]
        assert state["ranges"] == [] and len(gens) == i + 1 and gens[:i] == st["generations"]
        left = gens[-1]["remaining"]
        assert gens[-1] == dict(world_size=world, consumers=workers, batch_size=batch, batches=k,
                                                remaining=left)
        # Delivered: k batches of every rank, less the samples the last rank's wrap padding repeated.
        pad = -(-remaining // world) * world - remaining
        assert 0 <= left - (remaining - k * batch * world) <= pad
        remaining = left
    sizes.append(len(json.dumps(state)))
    # O(restores): a generation is five integers; nothing grows with samples or consumers.
    for g, size in enumerate(sizes):
        assert size < 600 + 160 * g, sizes
    # (The remainder's own pieces are not listed here: in pool mode they are millions of short runs, which
    # is why the state no longer carries them; exactly-once over chains is test_elastic_resume's.)


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


def test_plan_calls_on_an_open_dataset(cli, tmp_path):
    """vlafeed.plan.* given an open dataset read no metadata again (at 1M episodes a reopen costs
    ~1.4 CPU-s and ~440 MB per call): they work after meta/ is gone; a path still opens it."""
    root = tmp_path / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "6", "--codec", "h264", "--size", "32x24",
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ds = _native.Dataset(str(root))
    expect = vplan.plan(ds, world_size=2, workers=2)
    (root / "meta").rename(root / "meta.moved")
    assert vplan.plan(ds, world_size=2, workers=2) == expect
    assert len(vplan.tasks(ds)) == expect["strategies"]["file_group"]["tasks"]
    pieces = vplan.consumer_tasks(ds, world_size=2, workers=2, mode="pool", batch_size=4)
    assert sum(p["rows"][1] for p in pieces) == -(-ds.num_frames // 2) * 2
    # LeRobot's metadata object too, and episodes= as a subset of the open dataset.
    meta = vlafeed.LeRobotDatasetMetadata(ds)
    sub = vplan.consumer_tasks(meta, world_size=1, workers=1, episodes=[1, 4], video_files=False)
    lengths = {e["episode_index"]: e["length"] for e in ds.episodes}
    assert sum(p["rows"][1] for p in sub) == lengths[1] + lengths[4]
    with pytest.raises(Exception, match="meta"):
        vplan.plan(str(root), world_size=2, workers=2)
