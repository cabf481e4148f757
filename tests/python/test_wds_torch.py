"""vlafeed.wds_torch.ShardIterableDataset behind torch's DataLoader: with 0 and
2 workers the batches equal a ShardLoader with 1 and 2 consumers; a state
taken after k batches resumes the rest exactly, at the same worker count and
at another one (elastic: old + new cover the epoch once)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from vlafeed.wds import ShardLoader  # noqa: E402
from vlafeed.wds_torch import ShardIterableDataset  # noqa: E402
from wds_helpers import foundry_sample, write_manifest, write_tar  # noqa: E402

COUNTS = [6, 4, 7, 5]
OPTS = dict(batch_size=3, seed=4, shuffle_buffer=4, fields="lowdim.npz,metadata.json", output="numpy")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    d = tmp_path_factory.mktemp("wds_torch")
    rng = np.random.default_rng(5)
    for s, n in enumerate(COUNTS):
        members = []
        for i in range(n):
            members += foundry_sample(rng, f"s{s}_{i:02d}", i, cams=("top",), offsets=(0,), size=(8, 8))
        write_tar(d / f"shard_{s:06d}.tar", members)
    return str(write_manifest(d, COUNTS))


def dl_keys(ds, workers, limit=None):
    out = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers):
        out.append(batch["__key__"])
        if limit is not None and len(out) == limit:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_order_and_resume(manifest, workers):
    ref = [b["__key__"] for b in ShardLoader(manifest, num_consumers=max(1, workers), **OPTS)]
    ds = ShardIterableDataset(manifest, **OPTS)
    assert dl_keys(ds, workers) == ref
    k = 3
    ds = ShardIterableDataset(manifest, **OPTS)
    assert dl_keys(ds, workers, limit=k) == ref[:k]
    state = ds.state_dict() if workers == 0 else ds.state_dict(batches_consumed=k, num_workers=workers)
    again = ShardIterableDataset(manifest, **OPTS)
    again.load_state_dict(state)
    assert dl_keys(again, workers) == ref[k:]


def test_dataloader_elastic_worker_count(manifest):
    ref = [b["__key__"] for b in ShardLoader(manifest, num_consumers=2, **OPTS)]
    ds = ShardIterableDataset(manifest, **OPTS)
    taken = dl_keys(ds, 2, limit=2)
    state = ds.state_dict(batches_consumed=2, num_workers=2)
    again = ShardIterableDataset(manifest, **OPTS)
    again.load_state_dict(state)
    rest = dl_keys(again, 0)
    flat = [k for b in taken + rest for k in b]
    assert sorted(flat) == sorted(k for b in ref for k in b) and len(flat) == sum(COUNTS)
