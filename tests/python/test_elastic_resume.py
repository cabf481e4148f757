"""Elastic resume through the Python API: a run at world size N stops at a
random batch, its state (rank 0's state_dict(), the same on every rank)
restores a run at world size M (other consumers and batch size too), and
the two runs together deliver every sample of the epoch exactly once, plus
no more repeats than the documented wrap padding of each run (exactly once
with drop_last, minus the documented remainder). Map, stream (with a
shuffle buffer too) and pool modes, N and M in {1, 2, 3, 4}; chains of
two and four elastic restores, each state one generation longer, not
bigger with what was delivered; edited generations refused; torch DataLoader workers on both sides; frames and
table values of a restored run equal map-mode access; refusals still name
the order settings that differ.
"""
import random
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import vlafeed  # noqa: E402
import vlafeed.torch  # noqa: E402
from vlafeed import _native  # noqa: E402

FPS = 10
pytestmark = pytest.mark.filterwarnings("ignore::vlafeed.loader.LoaderWarning")


@pytest.fixture(scope="module")
def root(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("elastic") / "ds"
    r = subprocess.run([cli, "make-sample", str(out), "--episodes", "9", "--codec", "h264", "--size", "64x48",
                        "--fps", str(FPS), "--min-length", "7", "--max-length", "23", "--max-video-mb", "0.02",
                        "--seed", "4", "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def total_frames(root):
    return sum(e["length"] for e in _native.Dataset(str(root)).episodes)


def open_loader(root, mode, world, rank, batch, consumers=1, state=None, **kw):
    kw.setdefault("keys", ["index"])
    if mode == "pool":
        kw.setdefault("episode_pool_size", 3)
    return vlafeed.Loader(str(root), mode=mode, batch_size=batch, seed=21, rank=rank, world_size=world,
                          num_consumers=consumers, threads=1, state=state, **kw)


def run(root, mode, world, batch, consumers, stop, state, counts, **kw):
    """Every rank takes `stop` batches (None: all); returns rank 0's state."""
    out = None
    for rank in range(world):
        with open_loader(root, mode, world, rank, batch, consumers, state, **kw) as ld:
            it = iter(ld)
            taken = 0
            while stop is None or taken < stop:
                try:
                    b = next(it)
                except StopIteration:
                    break
                for i in b["index"].tolist():
                    counts[i] = counts.get(i, 0) + 1
                taken += 1
            if rank == 0:
                out = ld.state_dict()
    return out


def padding(n, world, drop_last):
    per = n // world if drop_last else -(-n // world)
    return 0 if drop_last else per * world - n


def check_union(counts, n, pads, drop_last, drop_bound=0):
    missing = [i for i in range(n) if counts.get(i, 0) == 0]
    extra = sum(c - 1 for c in counts.values() if c > 1)
    if drop_last:
        assert extra == 0, f"{extra} samples delivered twice"
        assert len(missing) <= drop_bound, f"{len(missing)} missing, documented at most {drop_bound}"
    else:
        assert not missing, f"never delivered: {missing[:10]}"
        assert extra <= pads, f"{extra} repeats, documented padding {pads}"


def remaining(root, state, mode, world, batch, consumers=1, **kw):
    """Samples left of the state's epoch for a run in this layout (from the resolved state)."""
    order = dict(mode=mode, batch_size=batch, seed=21, world_size=world, num_consumers=consumers,
                 shuffle=True, drop_last=kw.get("drop_last", False), shuffle_buffer=kw.get("shuffle_buffer", 0),
                 partition="file_group", episode_pool_size=3 if mode == "pool" else 16)
    st = _native.resolve_state(_native.Dataset(str(root)), resume=state, **order)
    assert not st["ranges"], "a version 3 state records generations, not the remaining ranges"
    if st["generations"]:
        return st["generations"][-1]["remaining"]
    return 0 if st["samples_consumed"] else total_frames(root)


def rank_batches(n, world, consumers, batch, drop_last):
    per = n // world if drop_last else -(-n // world)
    if drop_last:
        return per // batch
    return sum(-(-(per * (c + 1) // consumers - per * c // consumers) // batch) for c in range(consumers))


@pytest.mark.parametrize("mode", ["map", "stream", "pool"])
@pytest.mark.parametrize("old_world", [1, 2, 3, 4])
def test_elastic_worlds(root, mode, old_world):
    n = total_frames(root)
    rng = random.Random(old_world * 10 + len(mode))
    for new_world in [1, 2, 3, 4]:
        counts = {}
        b_old, b_new = 4, 3
        total = rank_batches(n, old_world, 1, b_old, False)
        stop = rng.randrange(1, total)
        state = run(root, mode, old_world, b_old, 1, stop, None, counts)
        assert state["world_size"] == old_world and state["samples_consumed"] == stop * b_old * old_world
        before = dict(counts)
        run(root, mode, new_world, b_new, 1, None, state, counts)
        # The new run repeats nothing the old one delivered (padding aside).
        rem = remaining(root, state, mode, new_world, b_new)
        assert rem <= n - stop * b_old * old_world + padding(n, old_world, False)
        pads = padding(n, old_world, False) + padding(rem, new_world, False)
        check_union(counts, n, pads, False)
        repeated = sum(1 for i, c in counts.items() if c > 1 and i in before)
        assert repeated <= pads


@pytest.mark.parametrize("mode,extra", [("map", {}), ("stream", {"shuffle_buffer": 13}), ("pool", {})])
def test_elastic_chain_consumers_drop_last(root, mode, extra):
    """3 ranks x 2 consumers, batch 4 -> 2 ranks x 3 consumers, batch 5 -> 4 ranks x 1, batch 2; with drop_last."""
    n = total_frames(root)
    for drop_last in (False, True):
        counts = {}
        kw = dict(extra, drop_last=drop_last)
        s1 = run(root, mode, 3, 4, 2, 3, None, counts, **kw)
        s2 = run(root, mode, 2, 5, 3, 2, s1, counts, **kw)
        assert len(s2["generations"]) == 1 and not s2["ranges"], \
            "a state after an elastic restore records the old layout, not the remaining ranges"
        assert {k: s2["generations"][0][k] for k in ("world_size", "consumers", "batch_size", "batches")} == \
            dict(world_size=3, consumers=2, batch_size=4, batches=3)
        assert s2["world_size"] == 2 and s2["consumers"] == 3 and s2["batch_size"] == 5
        run(root, mode, 4, 2, 1, None, s2, counts, **kw)
        rem1 = n
        rem2 = s2["generations"][-1]["remaining"]
        drops = 0
        pads = 0
        for rn, w, b in ((rem1, 3, 4), (rem2, 2, 5), (rem2, 4, 2)):
            per = rn // w
            drops += rn - w * b * (per // b)
            pads += padding(rn, w, False)
        check_union(counts, n, pads, drop_last, drops)


@pytest.mark.parametrize("mode", ["map", "stream", "pool"])
def test_elastic_chain_of_five_runs(root, mode):
    """Four elastic restores in one epoch: exactly once (padding aside) over five runs, and each state
    is its layout plus one small generation per earlier run, whatever was delivered."""
    import json
    n = total_frames(root)
    layouts = [(3, 2, 2), (2, 1, 3), (4, 1, 1), (1, 2, 2), (2, 2, 1)]  # world, batch, consumers
    counts, state, rn, pads, sizes = {}, None, n, 0, []
    for g, (world, batch, consumers) in enumerate(layouts):
        last = g == len(layouts) - 1
        state = run(root, mode, world, batch, consumers, None if last else 2, state, counts)
        pads += padding(rn, world, False)
        if not last:
            assert len(state["generations"]) == g and state["ranges"] == []
            rest = dict(state, generations=[])
            sizes.append((len(json.dumps(rest)), [len(json.dumps(x)) for x in state["generations"]]))
            rn = remaining(root, state, mode, *layouts[g + 1][:2], layouts[g + 1][2]) or rn
    check_union(counts, n, pads, False)
    # The fields of the layout, and ~90 bytes per earlier run: five integers each.
    assert all(base < 600 and all(x < 120 for x in gens) for base, gens in sizes), sizes


def test_generations_checked(root):
    """Generations are part of the state: edited, dropped, or in a version 2 state, they are refused by name."""
    counts = {}
    s1 = run(root, "pool", 2, 4, 1, 2, None, counts)
    s2 = run(root, "pool", 3, 3, 1, 1, s1, counts)
    assert len(s2["generations"]) == 1
    bad = dict(s2, generations=[dict(s2["generations"][0], remaining=s2["generations"][0]["remaining"] - 1)])
    with pytest.raises(ValueError, match="settings_hash"):
        open_loader(root, "pool", 3, 0, 3, state=bad)
    bad = dict(s2, generations=None)
    with pytest.raises(ValueError, match="'generations' is missing"):
        open_loader(root, "pool", 3, 0, 3, state=bad)
    bad = dict(s2, generations=[{"world_size": 2}])
    with pytest.raises(KeyError, match=r"generations\[0\] lacks 'consumers'"):
        open_loader(root, "pool", 3, 0, 3, state=bad)
    bad = dict(s2, generations=[dict(s2["generations"][0], batches="2")])
    with pytest.raises(TypeError, match=r"generations\[0\]\['batches'\] must be an integer"):
        open_loader(root, "pool", 3, 0, 3, state=bad)
    bad = dict(s2, version=2)
    with pytest.raises(ValueError, match="version 2 state has no generations"):
        open_loader(root, "pool", 3, 0, 3, state=bad)


def test_elastic_same_layout_and_refusals(root):
    """A restore at the same layout continues batch for batch (ranges kept); order settings must match."""
    counts = {}
    s1 = run(root, "stream", 2, 4, 1, 2, None, counts)
    s2 = run(root, "stream", 3, 4, 1, 1, s1, counts)
    # Same layout as s2: the next batches equal those of an uninterrupted second run.
    with open_loader(root, "stream", 3, 1, 4, state=s2) as a, open_loader(root, "stream", 3, 1, 4, state=s1) as b:
        ib = iter(b)
        next(ib)  # the uninterrupted run at world 3 took one batch before s2
        for x, y in zip(a, ib):
            assert x["index"].tolist() == y["index"].tolist()
    with pytest.raises(ValueError, match=r"seed \(state 21, loader 5\)"):
        vlafeed.Loader(str(root), mode="stream", batch_size=4, seed=5, world_size=3, rank=0, keys=["index"],
                       state=s2)
    bad = dict(s2)
    bad["ranges"] = [[5, 3]]
    with pytest.raises(ValueError, match="settings_hash|range"):
        open_loader(root, "stream", 3, 0, 4, state=bad)
    bad = dict(s2)
    bad["ranges"] = [[0]]
    with pytest.raises(ValueError, match=r"ranges\[0\] is not a \[start, end\] pair"):
        open_loader(root, "stream", 3, 0, 4, state=bad)


def test_elastic_frames_equal_map_access(root):
    """A restored run at another world size serves the same bytes as map-mode access of its positions."""
    deltas = {"observation.images.cam0": [-0.1, 0.0], "action": [0.0, 0.1]}
    counts = {}
    s1 = run(root, "pool", 2, 4, 1, 2, None, counts, keys=None, delta_timestamps=deltas, image_format="uint8")
    ref = vlafeed.Loader(str(root), mode="map", delta_timestamps=deltas, image_format="uint8", threads=1)
    with ref, open_loader(root, "pool", 3, 2, 4, state=s1, keys=None, delta_timestamps=deltas,
                          image_format="uint8") as ld:
        for b in list(ld)[:3]:
            direct = ref.get_items(b["index"].tolist())
            for key in ("observation.images.cam0", "action", "action_is_pad", "observation.state"):
                assert np.array_equal(b[key].numpy(), direct[key].numpy()), key


def collect(dl, counts, stop=None):
    taken = 0
    for b in dl:
        for i in b["index"].tolist():
            counts[i] = counts.get(i, 0) + 1
        taken += 1
        if stop is not None and taken == stop:
            break


def test_elastic_torch_workers(root):
    """2 ranks x 2 DataLoader workers stop; 3 ranks x 0 workers and then x 3 workers continue."""
    n = total_frames(root)
    counts = {}
    state = None
    for rank in range(2):
        ds = vlafeed.torch.IterableDataset(str(root), batch_size=4, mode="pool", seed=2, rank=rank, world_size=2,
                                           keys=["index"], episode_pool_size=2)
        dl = vlafeed.torch.DataLoader(ds, num_workers=2)
        collect(dl, counts, stop=5)
        if rank == 0:
            state = dl.state_dict()
    assert state["consumers"] == 2
    # Continue at world size 3: rank 0 in-process, ranks 1-2 with 3 workers each; then a state mid-way.
    for rank in range(3):
        ds = vlafeed.torch.IterableDataset(str(root), batch_size=3, mode="pool", seed=2, rank=rank, world_size=3,
                                           keys=["index"], episode_pool_size=2)
        ds.load_state_dict(state)
        dl = vlafeed.torch.DataLoader(ds, num_workers=0 if rank == 0 else 3)
        collect(dl, counts)
        if rank == 0:
            end = dl.state_dict()
            assert end["generations"] and end["world_size"] == 3
    # Wrap padding of each run: world 2 over n, world 3 over what remained (< 3).
    check_union(counts, n, padding(n, 2, False) + 2, False)
