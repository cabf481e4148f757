"""ShardLoader order, coverage and exact resume (like test_pool_resume.py for LeRobot).

Proves: every sample of an epoch is delivered exactly once over all ranks
and consumers (plus the documented wrap padding of the remainder rule);
the order is a pure function of (seed, epoch, layout): the same seed gives
the same sequence, another seed or epoch another; the shuffle buffer mixes
samples across shards; state_dict() after any batch resumes every rank
(one state for all) batch for batch, through the constructor and through
load_state_dict, reading only the samples still due (the others are
skipped in the tar stream); DataLoader-style consumer loaders resume their
round-robin share; states are JSON-able; other settings are refused.
"""
import json

import numpy as np
import pytest

import vlafeed
from wds_helpers import foundry_sample, write_manifest, write_tar

COUNTS = [7, 3, 9, 5, 6]
FIELDS = "lowdim.npz,metadata.json"


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    d = tmp_path_factory.mktemp("wds_resume")
    rng = np.random.default_rng(3)
    for s, n in enumerate(COUNTS):
        members = []
        for i in range(n):
            members += foundry_sample(rng, f"s{s}_{i:02d}", i, cams=("top",), offsets=(0,), size=(8, 8))
        write_tar(d / f"shard_{s:06d}.tar", members)
    return str(write_manifest(d, COUNTS))


def keys(loader):
    return [b["__key__"] for b in loader]


def make(manifest, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("fields", FIELDS)
    kw.setdefault("output", "numpy")
    return vlafeed.ShardLoader(manifest, **kw)


@pytest.mark.parametrize("world,consumers,buffer", [(1, 1, 0), (1, 1, 6), (2, 1, 4), (2, 2, 4), (3, 2, 1000)])
def test_exactly_once_per_epoch(manifest, world, consumers, buffer):
    total = sum(COUNTS)
    seen = []
    for rank in range(world):
        loader = make(manifest, rank=rank, world_size=world, num_consumers=consumers, shuffle_buffer=buffer, seed=7)
        got = [k for batch in keys(loader) for k in batch]
        assert len(got) == loader.num_samples == -(-total // world)
        seen += got
    assert set(seen) == {f"s{s}_{i:02d}" for s, n in enumerate(COUNTS) for i in range(n)}
    assert len(seen) - len(set(seen)) == -(-total // world) * world - total  # the wrap padding only


def test_order_is_a_pure_function(manifest):
    a = keys(make(manifest, seed=1, shuffle_buffer=8))
    assert a == keys(make(manifest, seed=1, shuffle_buffer=8, threads=1))
    assert a == keys(make(manifest, seed=1, shuffle_buffer=8, prefetch=0))  # no producer thread
    assert a == keys(make(manifest, seed=1, shuffle_buffer=8, prefetch=5))
    assert a != keys(make(manifest, seed=2, shuffle_buffer=8))
    b = make(manifest, seed=1, shuffle_buffer=8)
    b.set_epoch(1)
    assert keys(b) != a
    flat = [k for batch in a for k in batch]
    # the buffer mixes shards: the first 8 samples come from more than one shard
    assert len({k.split("_")[0] for k in flat[:8]}) > 1
    plain = [k for batch in keys(make(manifest, shuffle=False)) for k in batch]
    assert plain == sorted(plain)


def test_drop_last(manifest):
    loader = make(manifest, world_size=2, rank=1, drop_last=True, batch_size=4)
    assert all(len(b) == 4 for b in keys(loader)) and len(loader) == (sum(COUNTS) // 2) // 4


@pytest.mark.parametrize("world,consumers", [(1, 1), (2, 2)])
def test_resume_every_batch_every_rank(manifest, world, consumers):
    opts = dict(world_size=world, num_consumers=consumers, shuffle_buffer=5, seed=11, epoch=2)
    full = [keys(make(manifest, rank=r, **opts)) for r in range(world)]
    for k in range(len(full[0]) + 1):
        run = make(manifest, rank=0, **opts)
        it = iter(run)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(run.state_dict()))
        assert state["epoch"] == 2
        for r in range(world):
            resumed = make(manifest, rank=r, state=state, **{**opts, "epoch": 0})
            assert keys(resumed) == full[r][k:], (k, r)
            assert resumed.stats()["samples_read"] == sum(len(b) for b in full[r][k:])
        other = make(manifest, rank=world - 1, **opts)
        other.load_state_dict(state)
        other.set_epoch(2)  # keeps the restored position
        assert keys(other) == full[world - 1][k:]


def test_consumer_loaders_resume_round_robin(manifest):
    opts = dict(num_consumers=2, shuffle_buffer=3, seed=5)
    rank_level = keys(make(manifest, **opts))
    k = 3
    run = make(manifest, **opts)
    it = iter(run)
    for _ in range(k):
        next(it)
    state = run.state_dict()
    parts = [keys(make(manifest, consumer=c, state=state, **opts)) for c in range(2)]
    merged = []
    for i in range(max(len(p) for p in parts)):
        merged += [p[i] for p in parts if i < len(p)]
    assert merged == rank_level[k:]


@pytest.mark.parametrize("old,new", [((2, 2, 4), (1, 1, 3)), ((2, 1, 3), (3, 2, 2)), ((1, 2, 2), (2, 2, 5))])
def test_elastic_resume(manifest, old, new):
    """A state saved at (world, consumers, batch) resumes at another layout: the old run's delivered
    samples plus the new run's cover the epoch exactly once (plus each run's wrap padding); a second
    restore of the new run's state continues it."""
    (w0, c0, b0), (w1, c1, b1) = old, new
    opts = dict(shuffle_buffer=4, seed=21, epoch=1)
    total = sum(COUNTS)
    for k in (0, 1, 2):
        delivered = []
        run = None
        for r in range(w0):
            loader = make(manifest, rank=r, world_size=w0, num_consumers=c0, batch_size=b0, **opts)
            it = iter(loader)
            for _ in range(k):
                delivered += next(it)["__key__"]
            run = run or loader
        state = json.loads(json.dumps(run.state_dict()))
        rest = []
        for r in range(w1):
            loader = make(manifest, rank=r, world_size=w1, num_consumers=c1, batch_size=b1, state=state, **opts)
            rest.append([key for b in keys(loader) for key in b])
        everything = delivered + [key for part in rest for key in part]
        assert set(everything) == {f"s{s}_{i:02d}" for s, n in enumerate(COUNTS) for i in range(n)}
        remaining = total - len(set(delivered))
        pad_old = (-(-total // w0) * w0 - total) if delivered else 0
        assert len(everything) - len(set(everything)) <= pad_old + (-(-remaining // w1) * w1 - remaining)
        assert len(set(delivered) & set(k for part in rest for k in part)) <= pad_old
        # a second restore, from the new layout's state after one batch, continues the new run
        if rest[0]:
            loader = make(manifest, rank=0, world_size=w1, num_consumers=c1, batch_size=b1, state=state, **opts)
            first = next(iter(loader))["__key__"]
            again = make(manifest, rank=0, world_size=w1, num_consumers=c1, batch_size=b1,
                         state=loader.state_dict(), **opts)
            assert first + [key for b in keys(again) for key in b] == rest[0]


def test_mismatched_states_are_refused(manifest):
    run = make(manifest, seed=1)
    next(iter(run))
    state = run.state_dict()
    with pytest.raises(ValueError, match="seed"):
        make(manifest, seed=2, state=state)
    with pytest.raises(ValueError, match="shuffle_buffer"):
        make(manifest, seed=1, shuffle_buffer=3, state=state)
    with pytest.raises(ValueError, match="kind"):
        make(manifest, state={"epoch": 0})
