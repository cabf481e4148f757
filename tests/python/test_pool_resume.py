"""Pool mode and loader states through the Python API (make-sample H.264
datasets, windows on a camera and the action).

Proves: pool mode covers every frame of an epoch exactly once across 2
ranks x 2 DataLoader workers (plus the documented padding), with table
values equal to make-sample's ground truth and frames equal to map-mode
access of the same positions; same seed same order (1 or 2 engine
threads), another seed or epoch another; pool decoding stays at <= 2
frames per frame (GOP 2) with bounded batch buffers and decoder cache;
state_dict / load_state_dict (and Loader(state=...)) continue the stream
batch for batch at many random points for map, stream and pool, with
engine threads 1 vs 2, and through torch DataLoaders with 0 and 2 workers
(vlafeed.torch.DataLoader counts the batches the loop took); states are
plain JSON-able dicts; mismatched states are refused naming the
difference; uneven splits give LoaderWarnings.
"""
import io
import json
import math
import subprocess
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import vlafeed  # noqa: E402
import vlafeed.torch  # noqa: E402
from vlafeed import _native  # noqa: E402
from vlafeed.loader import LoaderWarning  # noqa: E402

FPS = 10
STATE_DIM = 6
DELTAS = {"action": [-0.2, 0.0, 0.1, 0.3], "observation.images.cam0": [-0.1, 0.0]}
ACTION_OFFSETS = [-2, 0, 1, 3]


def make(cli, root, episodes, seed=0):
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", str(episodes), "--codec", "h264", "--size",
                        "96x64", "--fps", str(FPS), "--min-length", "10", "--max-length", "30", "--max-video-mb",
                        "0.03", "--seed", str(seed), "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root


@pytest.fixture(scope="module")
def root(cli, tmp_path_factory):
    return make(cli, tmp_path_factory.mktemp("pool") / "ds", 8)


@pytest.fixture(scope="module")
def other_root(cli, tmp_path_factory):
    return make(cli, tmp_path_factory.mktemp("pool_other") / "ds", 8, seed=5)


def action(e, k, d):
    return np.float32(math.sin(0.05 * (k + 1) + 0.3 * d + e))


def state(e, k, d):
    return np.float32(math.sin(0.05 * k + 0.3 * d + e))


def lengths(root):
    return {e["episode_index"]: e["length"] for e in _native.Dataset(str(root)).episodes}


def loader(root, **kw):
    kw.setdefault("mode", "pool")
    kw.setdefault("batch_size", 5)
    kw.setdefault("seed", 3)
    kw.setdefault("episode_pool_size", 3)
    kw.setdefault("delta_timestamps", DELTAS)
    kw.setdefault("image_format", "uint8")
    return vlafeed.Loader(root, **kw)


def fingerprint(batch):
    """(index list, digest of every tensor's bytes) of a batch."""
    h = 0
    for name, value in batch.items():
        if isinstance(value, list):
            h = hash((h, name, tuple(value)))
        else:
            h = hash((h, name, value.numpy().tobytes()))
    return batch["index"].tolist(), h


def run_batches(it, limit=None):
    out = []
    for batch in it:
        out.append(fingerprint(batch))
        if limit is not None and len(out) == limit:
            break
    return out


def flat(batches):
    return [i for idx, _ in batches for i in idx]


# ---- pool mode ------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::vlafeed.loader.LoaderWarning")  # 2 ranks, an odd frame count
def test_pool_covers_every_frame_once_over_ranks_and_workers(root):
    n = _native.Dataset(str(root)).num_frames
    seen = []
    for rank in range(2):
        ds = vlafeed.torch.IterableDataset(root, mode="pool", batch_size=4, seed=9, world_size=2, rank=rank,
                                           episode_pool_size=2, delta_timestamps=DELTAS, num_workers=2)
        dl = vlafeed.torch.DataLoader(ds, num_workers=2)
        got = run_batches(dl)
        seen += flat(got)
        # Two worker processes == one process with two consumers.
        same = loader(root, batch_size=4, seed=9, world_size=2, rank=rank, episode_pool_size=2, num_consumers=2,
                      image_format="float32")
        assert run_batches(same) == got
        assert len(got) == len(ds)
    per_rank = (n + 1) // 2
    assert len(seen) == 2 * per_rank
    assert set(seen) == set(range(n))
    assert len(seen) - len(set(seen)) == 2 * per_rank - n


def test_pool_values_frames_and_windows(root):
    lens = lengths(root)
    ld = loader(root, batch_size=7, threads=2)
    ref = vlafeed.Loader(root, mode="map", delta_timestamps=DELTAS, image_format="uint8", threads=1)
    rows = 0
    for batch in ld:
        idx = batch["index"].tolist()
        for r in range(len(idx)):
            e, k = int(batch["episode_index"][r]), int(batch["frame_index"][r])
            np.testing.assert_array_equal(batch["observation.state"][r].numpy(),
                                          [state(e, k, d) for d in range(STATE_DIM)])
            for t, off in enumerate(ACTION_OFFSETS):
                q = min(max(k + off, 0), lens[e] - 1)
                np.testing.assert_array_equal(batch["action"][r][t].numpy(), [action(e, q, d) for d in range(STATE_DIM)])
                assert bool(batch["action_is_pad"][r][t]) == (not 0 <= k + off < lens[e])
            assert batch["observation.images.cam0_is_pad"][r].tolist() == [k == 0, False]
        # Frames: the same as map access of the same positions (identity checked in C).
        direct = ref.get_items(idx)
        for cam in ("observation.images.cam0", "observation.images.cam1"):
            assert torch.equal(batch[cam], direct[cam])
        rows += len(idx)
    assert rows == ld.dataset.num_frames
    st = ld.stats()
    assert st["frames_decoded"] <= 2 * st["frames_delivered"]           # GOP 2: at most 2 per frame
    assert st["frames_delivered"] == 3 * rows                          # cam0 window of 2 + cam1
    # No decoded frames kept beyond batches: the window, plus what the caller holds
    # (this loop's previous batch while the generator fetches the next).
    assert st["batch_buffers"] <= st["window"] + 2
    assert st["cache_capacity"] == 3 * 2 and st["cache_entries"] <= st["cache_capacity"]  # pool x cams (threads share)
    assert st["pool_admitted"] == st["pool_evicted"] >= 8 and st["pool_segments"] == 0


def test_pool_determinism_and_epochs(root):
    a = run_batches(loader(root, threads=1))
    b = run_batches(loader(root, threads=2))
    assert a == b
    other = flat(run_batches(loader(root, seed=4)))
    assert other != flat(a) and sorted(other) == sorted(flat(a))
    l1 = loader(root)
    e0 = flat(run_batches(l1))
    e1 = flat(run_batches(l1))  # the second pass is epoch 1
    assert l1.epoch == 1 and e1 != e0 and sorted(e1) == sorted(e0)
    # Random frames, not runs.
    assert sum(1 for x, y in zip(e0, e0[1:]) if y == x + 1) < len(e0) // 4


# ---- resume ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["pool", "stream", "map"])
def test_resume_equals_uninterrupted_run(root, mode):
    kw = dict(mode=mode, shuffle_buffer=6 if mode == "stream" else 0, partition="episode", epoch=1)
    ref = run_batches(loader(root, threads=2, **kw))
    rng = np.random.default_rng(42)
    points = sorted({0, 1, len(ref) - 1, len(ref), *rng.integers(2, len(ref) - 1, size=5).tolist()})
    for i, k in enumerate(points):
        first = loader(root, threads=1 + i % 2, **kw)
        head = run_batches(first, limit=k) if k else []
        assert head == ref[:k]
        st = first.state_dict()
        assert st["samples_consumed"] == len(flat(ref[:k])) and st["epoch"] == 1 and st["mode"] == mode
        st = json.loads(json.dumps(st))  # plain data
        # A new loader from the state, with the other thread count.
        again = loader(root, threads=2 - i % 2, state=st, **{**kw, "epoch": 0})
        assert again.epoch == 1
        assert run_batches(again) == ref[k:], f"resume at {k}"
        s = again.stats()
        assert s["samples_assembled"] == len(flat(ref[k:]))  # nothing before the resume point was built
        # load_state_dict on a loader that had moved on.
        first.set_epoch(3)
        next(iter(first))
        first.load_state_dict(st)
        first.set_epoch(1)  # the restored epoch: kept
        assert run_batches(first) == ref[k:]
        # The next pass is epoch 2, as for the uninterrupted loader.
        assert flat(run_batches(first)) == flat(run_batches(loader(root, **{**kw, "epoch": 2})))


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_through_torch_dataloader(root, workers):
    def make_ds():
        return vlafeed.torch.IterableDataset(root, mode="pool", batch_size=4, seed=11, episode_pool_size=2,
                                             delta_timestamps=DELTAS, num_consumers=2, num_workers=workers)

    ds = make_ds()
    dl = vlafeed.torch.DataLoader(ds, num_workers=workers)
    ref = run_batches(dl)
    assert len(ref) == len(ds)
    for k in (0, 3, len(ref) // 2 + 1, len(ref)):
        ds = make_ds()
        dl = vlafeed.torch.DataLoader(ds, num_workers=workers)
        head = run_batches(dl, limit=k) if k else []
        assert head == ref[:k]
        st = dl.state_dict()
        # One state format: the same as an in-process loader with 2 consumers reports.
        probe = loader(root, batch_size=4, seed=11, episode_pool_size=2, num_consumers=2)
        run_batches(probe, limit=k) if k else None
        assert st == probe.state_dict()
        buf = io.BytesIO()
        torch.save(st, buf)
        buf.seek(0)
        saved = torch.load(buf)  # a checkpoint round trip (weights_only: plain data)
        ds2 = make_ds()
        dl2 = vlafeed.torch.DataLoader(ds2, num_workers=workers)
        dl2.load_state_dict(saved)
        assert dl2.state_dict() == st  # restored, not iterated yet
        rest = run_batches(dl2)
        assert rest == ref[k:], f"workers {workers}: resume at {k}"
        assert dl2.state_dict()["samples_consumed"] == len(flat(ref))
        # The next epoch is the ordinary one.
        ds2.set_epoch(1)
        ds.set_epoch(1)
        assert flat(run_batches(dl2)) == flat(run_batches(vlafeed.torch.DataLoader(ds, num_workers=workers)))


def test_state_from_workers_resumes_in_process_and_vice_versa(root):
    kw = dict(mode="pool", batch_size=4, seed=11, episode_pool_size=2, delta_timestamps=DELTAS)
    ref = run_batches(vlafeed.torch.DataLoader(vlafeed.torch.IterableDataset(root, num_consumers=2, **kw)))
    ds = vlafeed.torch.IterableDataset(root, num_workers=2, **kw)
    dl = vlafeed.torch.DataLoader(ds, num_workers=2)
    run_batches(dl, limit=5)
    st = dl.state_dict()
    in_process = vlafeed.torch.IterableDataset(root, num_consumers=2, **kw)
    in_process.load_state_dict(st)
    assert run_batches(torch.utils.data.DataLoader(in_process, batch_size=None)) == ref[5:]


def test_plain_dataloader_with_workers_needs_the_count(root):
    ds = vlafeed.torch.IterableDataset(root, mode="pool", batch_size=4, seed=1, num_workers=2)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    it = iter(dl)
    for _ in range(3):
        next(it)
    with pytest.raises(RuntimeError, match="vlafeed.torch.DataLoader"):
        ds.state_dict()
    st = ds.state_dict(batches_consumed=3, num_workers=2)
    assert st["consumers"] == 2 and st["samples_consumed"] == 12
    del it


def test_refused_states_name_the_difference(root, other_root):
    base = loader(root, batch_size=4, seed=3)
    it = iter(base)
    run_batches(it, limit=2)
    st = base.state_dict()
    with pytest.raises(ValueError, match="another dataset"):
        loader(other_root, batch_size=4, seed=3, state=st)
    with pytest.raises(ValueError, match=r"seed \(state 3, loader 4\)"):
        loader(root, batch_size=4, seed=4, state=st)
    # batch_size, world_size and consumers may change (elastic resume, tests/python/test_elastic_resume.py).
    loader(root, batch_size=8, seed=3, state=st).close()
    loader(root, batch_size=4, seed=3, world_size=2, rank=0, state=st).close()
    with pytest.raises(ValueError, match=r"mode \(state 'pool', loader 'stream'\)"):
        loader(root, batch_size=4, seed=3, mode="stream", state=st)
    with pytest.raises(ValueError, match="another episode selection"):
        loader(root, batch_size=4, seed=3, episodes=[0, 1, 2], state=st)
    with pytest.raises(ValueError, match=r"shuffle \(state 1, loader 0\)"):
        loader(root, batch_size=4, seed=3, shuffle=False).load_state_dict(st)
    with pytest.raises(KeyError, match="missing key 'seed'"):
        loader(root, batch_size=4, seed=3, state={k: v for k, v in st.items() if k != "seed"})
    edited = dict(st, seed=4)
    with pytest.raises(ValueError, match="settings_hash does not match"):
        loader(root, batch_size=4, seed=4, state=edited)
    # The refused loader keeps going where it was.
    ref = run_batches(loader(root, batch_size=4, seed=3))
    with pytest.raises(ValueError):
        base.load_state_dict(dict(st, samples_consumed=st["samples_consumed"] + 1))
    assert run_batches(it) == ref[2:]
    # A worker's loader cannot see its rank's progress.
    with pytest.raises(ValueError, match="cannot see its rank's progress"):
        loader(root, num_consumers=2, consumer=1).state_dict()


def test_uneven_splits_warn(root):
    n = _native.Dataset(str(root)).num_frames
    world = next(w for w in (7, 11, 13) if n % w)
    with pytest.warns(LoaderWarning, match=f"world_size {world} does not divide the {n} samples"):
        loader(root, world_size=world, rank=0)
    # The same text on every rank: rank 0 says it; the others keep it in .warnings and stats only.
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoaderWarning)
        ld = loader(root, world_size=world, rank=world - 1)
    st = ld.stats()
    assert st["warnings"] == 1 and st["padded_samples"] == math.ceil(n / world) * world - n
    assert ld.warnings and "repeated" in ld.warnings[0]
    with pytest.warns(LoaderWarning, match="consumers of rank 0 get no samples"):
        ld = loader(root, num_consumers=n + 2)
    assert ld.stats()["empty_consumers"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader(root)  # even: silent
