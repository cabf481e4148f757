"""`vlafeed plan`'s MP4 opens against the opens a run really makes (issue 26, part 2).

The figure `vlafeed plan` prints (and vlafeed.plan.plan returns as
opens["consumer_opens"]) is the sum over the world_size x workers consumers
of the opens their loaders make in the epoch. A run's own count is the
decoder cache's misses, Loader.stats()["video_opens"]. By default the engine
threads of a loader share one reader per video file (src/sample/assemble.c:
the decode under the file's lock, the conversion after it), so the count
does not depend on the thread count: these tests run every consumer of a
small world at 1, 2 and 4 threads with the loader's default settings in
stream, pool and map mode and compare the sum with the plan, exactly, and
check that every mode stays within 1.5x of its lower bound (the distinct
files of each consumer's share). share_video_readers=False gives each
thread its own reader: more opens than the plan's figure at more threads
(counted, not fixed: it depends on timing). A pool smaller than the
share's files exercises the pool's file order admission: admitting the
share's random episodes in the order the epoch permutation gives reopens a
file for about every episode and camera.
"""
import subprocess

import pytest

import vlafeed
import vlafeed.plan as vplan
from damage import make_sample

BATCH = 8


@pytest.fixture(scope="module")
def rolled(cli, tmp_path_factory):
    """48 episodes, 2 cameras, each camera rolling over to a new MP4 every few episodes."""
    root = tmp_path_factory.mktemp("opens") / "ds"
    make_sample(cli, root, episodes=48, cameras=2, size="64x64", min_length=12, max_length=30,
                extra=("--max-video-mb", "0.02"))
    files = sorted((root / "videos").rglob("*.mp4"))
    assert len(files) >= 16  # several files per camera, or the test shows nothing
    return root


def run_opens(root, mode, threads, world_size, **kw):
    """The MP4 opens of one epoch summed over every rank's loader (one consumer each)."""
    total, samples = 0, 0
    for rank in range(world_size):
        loader = vlafeed.Loader(str(root), mode=mode, batch_size=BATCH, threads=threads, world_size=world_size,
                                rank=rank, num_consumers=1, output="numpy", **kw)
        try:
            for batch in loader:
                samples += len(batch["index"])
            total += loader.stats()["video_opens"]
        finally:
            loader.close()
    return total, samples


@pytest.mark.parametrize("mode", ["stream", "pool", "map"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_plan_opens_equal_run_opens(rolled, mode, world_size):
    report = vplan.plan(str(rolled), world_size=world_size, workers=1, mode=mode, batch_size=BATCH)
    opens = report["opens"]
    assert report["mode"] == mode
    assert opens["lower_bound"] <= opens["consumer_opens"] <= 1.5 * opens["lower_bound"]
    for threads in (1, 2, 4):  # the loader's defaults: no share_video_readers argument
        counted, samples = run_opens(rolled, mode, threads, world_size)
        assert samples == report["samples_per_rank"] * world_size
        assert counted == opens["consumer_opens"], (mode, world_size, threads)
    # Explicitly on is the default.
    assert run_opens(rolled, mode, 2, world_size, share_video_readers=True)[0] == opens["consumer_opens"]


def test_unshared_readers_open_per_thread(rolled):
    """share_video_readers=False: each engine thread opens its own reader of a file it reads, so a run
    at 4 threads opens more than the plan's figure (stream mode reads every file from several threads)."""
    opens = vplan.plan(str(rolled), mode="stream", batch_size=BATCH)["opens"]
    assert run_opens(rolled, "stream", 1, 1, share_video_readers=False)[0] == opens["consumer_opens"]
    counted, _ = run_opens(rolled, "stream", 4, 1, share_video_readers=False)
    assert counted > opens["consumer_opens"]


def test_shared_readers_frames_exact(rolled):
    """Shared readers decode under the file's lock and convert after it: at 4 threads the batches are
    the ones one thread makes (same order, same pixels), in every mode."""
    import numpy as np
    for mode in ("stream", "pool", "map"):
        def epoch(threads, share):
            loader = vlafeed.Loader(str(rolled), mode=mode, batch_size=BATCH, threads=threads, seed=3,
                                    share_video_readers=share, output="numpy")
            try:
                return [b for b in loader]
            finally:
                loader.close()
        one, four = epoch(1, False), epoch(4, True)
        assert len(one) == len(four)
        keys = [k for k in one[0] if k.startswith("observation.images")]
        assert len(keys) == 2
        for a, b in zip(one, four):
            assert np.array_equal(a["index"], b["index"])
            for k in keys:
                assert np.array_equal(a[k], b[k]), (mode, k)


def test_pool_admits_in_file_order(rolled):
    """A pool of 2 episodes over a share of 48: each file opened about once."""
    opens = vplan.plan(str(rolled), mode="pool", batch_size=BATCH, episode_pool_size=2)["opens"]
    assert opens["lower_bound"] == opens["distinct_files"]
    assert opens["consumer_opens"] <= 1.5 * opens["lower_bound"]
    for threads in (1, 4):
        counted, _ = run_opens(rolled, "pool", threads, 1, episode_pool_size=2)
        assert counted == opens["consumer_opens"]


def test_pool_file_order_keeps_coverage_and_seed(rolled):
    """File-order admission is still a pure function of the seed and covers the epoch once."""
    def order(seed):
        loader = vlafeed.Loader(str(rolled), mode="pool", batch_size=BATCH, threads=2, seed=seed,
                                episode_pool_size=3, keys=["index"], output="numpy")
        try:
            return [int(i) for b in loader for i in b["index"]]
        finally:
            loader.close()
    a, b, c = order(1), order(1), order(2)
    assert a == b
    assert a != c
    assert sorted(a) == list(range(len(a)))


def test_plan_world_size_short_option(rolled, cli):
    long = subprocess.run([cli, "plan", str(rolled), "--world-size", "3", "--mode", "map"], capture_output=True,
                          text=True, timeout=120)
    short = subprocess.run([cli, "plan", str(rolled), "-w", "3", "--mode", "map"], capture_output=True, text=True,
                           timeout=120)
    assert long.returncode == 0 and short.returncode == 0, long.stderr + short.stderr
    assert short.stdout == long.stdout
    assert "world size 3" in short.stdout
    bad = subprocess.run([cli, "plan", str(rolled), "-w", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "--world-size" in bad.stderr
    missing = subprocess.run([cli, "plan", str(rolled), "-w"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2
    help_text = subprocess.run([cli, "plan", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "-w, --world-size N" in help_text
