"""The WebDataset part of the corruption corpus (issue 25): hostile and damaged
shard sets (tests/python/wds_corpus_variants.py), each with its expected
outcome, read through every WDS entry point:

- vlafeed.ShardLoader (the C engine behind Python), on_error "raise" and
  "skip";
- vlafeed.torch.ShardIterableDataset behind a torch DataLoader;
- the CLI's reader, ``vlafeed bench --source wds`` (the C loader alone: it
  hands .json / .txt / .pth members on as bytes, so only what C refuses
  fails there);
- vlafeed.ray.read_wds, for the subset marked ``ray`` (Ray is slow to start).

For each: the right samples (and, where the variant says, the right
pixels), or a refusal whose message matches the variant's pattern (the
shard, and for a sample the member and the key); under "skip" every other
sample is delivered and the refusal is counted with its message. No crash
(the CLI runs in a child process) and no hang (a watchdog ends a test that
passes 120 s, the CLI has a timeout).
"""
import faulthandler
import json
import os
import re
import subprocess

import pytest

import vlafeed
from wds_corpus_variants import VARIANTS, Ok, OpenRefused, Refused

torch = pytest.importorskip("torch")
from vlafeed.torch import ShardIterableDataset  # noqa: E402

NAMES = sorted(VARIANTS)


@pytest.fixture(autouse=True)
def watchdog(monkeypatch):
    monkeypatch.delenv("VF_WDS_ALLOW_OUTSIDE", raising=False)
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """name -> manifest path, each variant's set built once for every entry point."""
    top = tmp_path_factory.mktemp("wds_corpus")
    built = {}

    def get(name):
        if name not in built:
            built[name] = str(VARIANTS[name].build(top / name))
        return built[name]
    return get


def in_range(n, delivered):
    low, high = delivered if isinstance(delivered, tuple) else (delivered, delivered)
    return low <= n <= high


def read_loader(manifest, options, on_error):
    """Keys and columns (lists of per-sample values) of one pass of ShardLoader, and its stats."""
    loader = vlafeed.ShardLoader(manifest, batch_size=3, shuffle=False, output="numpy", on_error=on_error,
                                 **options)
    keys, columns = [], {}
    try:
        for batch in loader:
            keys += batch["__key__"]
            for name, value in batch.items():
                columns.setdefault(name, []).extend(list(value))
        return keys, columns, loader.stats()
    finally:
        loader.close()


def read_torch(manifest, options, on_error):
    ds = ShardIterableDataset(manifest, batch_size=3, shuffle=False, on_error=on_error, rank=0, world_size=1,
                              **options)
    keys = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0):
        keys += batch["__key__"]
    return keys


def check_read(name, read):
    """Runs read(on_error) -> keys (or (keys, columns, stats)) against the variant's expectation."""
    v = VARIANTS[name]
    expect = v.expect
    if isinstance(expect, Ok):
        got = read("raise")
        keys = got[0] if isinstance(got, tuple) else got
        assert len(keys) == expect.samples == len(set(keys)), (name, keys)
        if expect.check and isinstance(got, tuple):
            expect.check(keys, got[1])
        return
    error = vlafeed.VlafeedError if isinstance(expect, Refused) else expect.error
    with pytest.raises(error) as info:
        read("raise")
    assert re.search(expect.pattern, str(info.value)), (name, str(info.value))
    delivered = expect.delivered if isinstance(expect, Refused) else expect.skip_delivered
    if delivered is None:  # refused at construction whatever the policy
        with pytest.raises(error, match=expect.pattern):
            read("skip")
        return
    got = read("skip")
    keys = got[0] if isinstance(got, tuple) else got
    assert in_range(len(keys), delivered) and len(keys) == len(set(keys)), (name, keys)
    if isinstance(got, tuple):
        stats = got[2]
        assert stats["skipped_samples"] + stats["skipped_shards"] >= 1, (name, stats)
        assert any(re.search(expect.pattern, m) for m in stats["skip_messages"]), (name, stats["skip_messages"])


@pytest.mark.parametrize("name", NAMES)
def test_shard_loader(sets, name):
    manifest = sets(name)
    check_read(name, lambda on_error: read_loader(manifest, VARIANTS[name].options, on_error))


@pytest.mark.parametrize("name", NAMES)
def test_torch_dataloader(sets, name):
    manifest = sets(name)
    check_read(name, lambda on_error: read_torch(manifest, VARIANTS[name].options, on_error))


@pytest.mark.parametrize("name", NAMES)
def test_cli_bench_reader(cli, sets, name):
    v = VARIANTS[name]
    args = [cli, "bench", "--source", "wds", sets(name), "--batch-size", "3", "--shuffle-buffer", "0", "--json"]
    if "fields" in v.options:
        args += ["--fields", v.options["fields"]]
    env = {k: val for k, val in os.environ.items() if k != "VF_WDS_ALLOW_OUTSIDE"}
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode in (0, 1), (name, r.returncode, r.stderr[-2000:])  # never a crash
    expect = v.expect
    if isinstance(expect, Ok) or (isinstance(expect, Refused) and expect.python_only):
        assert r.returncode == 0, (name, r.stderr)
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        # a python_only variant has one unparsable sample: the CLI hands its bytes on with the rest
        total = expect.samples if isinstance(expect, Ok) else expect.delivered + 1
        assert summary["samples"] == total and summary["skipped"] == 0, (name, summary)
    else:
        assert r.returncode == 1 and re.search(expect.pattern, r.stderr), (name, r.stderr)


def test_ray_read_wds(sets):
    """The ``ray`` subset through vlafeed.ray.read_wds: the same samples, the same refusals (wrapped in the
    task's error, or raised by the datasource at the driver for a manifest refused at open), and under
    on_error="skip" the lost samples counted in skipped()."""
    ray = pytest.importorskip("ray")
    import vlafeed.ray as vray
    subset = [n for n in NAMES if VARIANTS[n].ray]
    assert len(subset) >= 5
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        for name in subset:
            v, manifest = VARIANTS[name], sets(name)
            expect = v.expect
            if isinstance(expect, Ok):
                rows = vray.read_wds(manifest, **v.options).take_all()
                assert len(rows) == expect.samples, name
            elif isinstance(expect, OpenRefused):
                with pytest.raises(expect.error, match=expect.pattern):
                    vray.WdsDatasource(manifest, **v.options)
            else:
                with pytest.raises(Exception) as info:
                    vray.read_wds(manifest, ray_remote_args={"max_retries": 0}, **v.options).take_all()
                assert re.search(expect.pattern, str(info.value)), (name, str(info.value)[-2000:])
                source = vray.WdsDatasource(manifest, on_error="skip", **v.options)
                rows = ray.data.read_datasource(source).take_all()
                assert in_range(len(rows), expect.delivered), (name, len(rows))
                assert source.skipped() and any(re.search(expect.pattern, r["error"]) for r in source.skipped())
    finally:
        ray.shutdown()


def test_corpus_is_large_enough():
    assert len(VARIANTS) >= 25
    kinds = {type(v.expect) for v in VARIANTS.values()}
    assert kinds == {Ok, Refused, OpenRefused}
