"""ShardLoader over http:// (tests/python/remote_server.py on loopback) and s3:// (moto): the
same samples and values as the local read, through the io layer's range
reads with small read-ahead blocks; a resume skips delivered samples
without fetching all of their bytes; a missing remote shard and a server
error are named with the URL (raise) or skipped and counted.
"""
import faulthandler

import numpy as np
import pytest

import vlafeed
from remote_server import Faults, RemoteServer, s3_env, upload_tree
from wds_helpers import write_foundry_set

FAST_HTTP = {"VF_HTTP_ATTEMPTS": "2", "VF_HTTP_BACKOFF_S": "0.01", "VF_HTTP_BACKOFF_MAX_S": "0.02",
             "VF_HTTP_BUDGET_S": "10", "VF_HTTP_BLOCK_BYTES": "8192"}


@pytest.fixture(autouse=True)
def env(monkeypatch):
    for k, v in FAST_HTTP.items():
        monkeypatch.setenv(k, v)
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("wds_remote") / "shards"
    write_foundry_set(d, shards=3, per_shard=5, seed=2)
    return d


def read(manifest, **kw):
    loader = vlafeed.ShardLoader(manifest, batch_size=4, output="numpy", seed=3, shuffle_buffer=6, **kw)
    return [b for b in loader], loader


def test_http_equals_local(shard_dir):
    local, _ = read(str(shard_dir / "manifest.jsonl"))
    with RemoteServer(shard_dir.parent) as srv:
        remote, loader = read(srv.url("shards/manifest.jsonl"))
        assert any("Range" in str(entry) or "bytes=" in str(entry) for entry in srv.log)
    assert [b["__key__"] for b in remote] == [b["__key__"] for b in local]
    for a, b in zip(local, remote):
        for name in ("observation.state", "action", "past_mask", "top_t0", "wrist_t-1"):
            np.testing.assert_array_equal(a[name], b[name])
        assert a["metadata.json"] == b["metadata.json"]
    assert loader.stats()["samples"] == 15


def test_http_resume_reads_less(shard_dir):
    with RemoteServer(shard_dir.parent) as srv:
        url = srv.url("shards/manifest.jsonl")
        full, _ = read(url)
        run = vlafeed.ShardLoader(url, batch_size=4, output="numpy", seed=3, shuffle_buffer=6)
        it = iter(run)
        next(it)
        next(it)
        state = run.state_dict()
        resumed, loader = read(url, state=state)
    assert [b["__key__"] for b in resumed] == [b["__key__"] for b in full[2:]]
    assert loader.stats()["samples_read"] == 15 - 8


def test_http_missing_and_failing_shards(shard_dir):
    with RemoteServer(shard_dir.parent, Faults(match="shard_000001", always_fail=True)) as srv:
        url = srv.url("shards/manifest.jsonl")
        with pytest.raises(vlafeed.VlafeedError, match="shard_000001.tar"):
            read(url, shuffle=False)
        batches, loader = read(url, shuffle=False, on_error="skip")
    keys = [k for b in batches for k in b["__key__"]]
    assert len(keys) == 10 and all(k.startswith(("00", "02")) for k in keys)
    assert loader.stats()["skipped_samples"] == 5


def test_s3_equals_local(shard_dir, moto_endpoint, monkeypatch):
    """s3:// shards (moto's server, SigV4-signed requests) read like the local ones."""
    upload_tree(moto_endpoint, "vf-wds", shard_dir, "set/shards")
    for k, v in s3_env(moto_endpoint).items():
        monkeypatch.setenv(k, v)
    local, _ = read(str(shard_dir / "manifest.jsonl"))
    remote, _ = read("s3://vf-wds/set/shards/manifest.jsonl")
    assert [b["__key__"] for b in remote] == [b["__key__"] for b in local]
    for a, b in zip(local, remote):
        np.testing.assert_array_equal(a["observation.state"], b["observation.state"])
        np.testing.assert_array_equal(a["top_t0"], b["top_t0"])
    with pytest.raises(FileNotFoundError, match="s3://vf-wds/set/nope/manifest.jsonl"):
        vlafeed.ShardLoader("s3://vf-wds/set/nope/manifest.jsonl")


@pytest.mark.parametrize("prefetch", [0, 2])
def test_close_from_another_thread_cancels_a_retrying_read(shard_dir, monkeypatch, prefetch):
    """close() from another thread while the iterating thread waits on shard reads that retry a 503
    storm (a 60 s budget): close returns at once and the iteration fails within seconds with the
    loader's 'closed' error, no batch delivered, instead of waiting out the retry budget."""
    import threading
    import time
    for k, v in {"VF_HTTP_BUDGET_S": "60", "VF_HTTP_ATTEMPTS": "10000", "VF_HTTP_BACKOFF_S": "0.05",
                 "VF_HTTP_BACKOFF_MAX_S": "0.5"}.items():
        monkeypatch.setenv(k, v)
    outcome = {"batches": 0}
    with RemoteServer(shard_dir.parent, Faults(match="shard_0000", always_fail=True)) as srv:
        loader = vlafeed.ShardLoader(srv.url("shards/manifest.jsonl"), batch_size=4, output="numpy",
                                     prefetch=prefetch, fields=["observation.state"])

        def iterate():
            try:
                for _ in loader:
                    outcome["batches"] += 1
            except Exception as e:  # noqa: BLE001 - inspected below
                outcome["error"] = e
        worker = threading.Thread(target=iterate, daemon=True)
        worker.start()
        time.sleep(0.5)  # the worker waits on the retrying reads
        t0 = time.monotonic()
        loader.close()
        assert time.monotonic() - t0 < 2.0
        worker.join(timeout=5)
        assert not worker.is_alive(), "the iterating thread still waits for the retry budget"
    assert outcome["batches"] == 0
    assert isinstance(outcome.get("error"), ValueError) and "closed" in str(outcome["error"]), outcome
