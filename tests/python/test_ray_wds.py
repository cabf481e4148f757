"""vlafeed.ray.WdsDatasource / read_wds on a local Ray (2 CPUs): shards written
by `vlafeed convert --to wds` read as a Ray Data dataset, one read task per
group of shards, decoded by vlafeed's C shard reader inside each task.

Proven: the read tasks are the manifest's shards in groups with their row
counts; every sample comes exactly once and equals vlafeed.ShardLoader's
reading of it (npz arrays, JPEG pixels, JSON); iter_torch_batches gives
tensors (strings through vlafeed.ray.TorchCollate); a missing shard raises
naming the shard and the task; under on_error="skip" a damaged shard's lost
samples are counted in skipped(), also when it is a task's first shard.
String .npy fields arrive as str / lists of str and .pth fields as their
serialized bytes; an object .npy is refused naming shard, key and field; a
relative manifest path works although the workers' working directory
differs.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(__file__))
import lerobot_reference as R  # noqa: E402

import vlafeed  # noqa: E402
import vlafeed.ray as vray  # noqa: E402


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def shards(cli, tmp_path_factory):
    top = tmp_path_factory.mktemp("raywds")
    ds = R.make_sample_dataset(cli, top / "ds", codec="h264", episodes=4, cameras=2, size="64x48",
                               min_length=15, max_length=30, seed=4)
    out = top / "wds"
    r = subprocess.run([cli, "convert", str(ds), str(out), "--to", "wds", "--past", "1", "--future", "2",
                        "--image-offsets", "0", "--samples-per-shard", "16", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out / "shards" / "manifest.jsonl"


def reference(manifest):
    loader = vlafeed.ShardLoader(str(manifest), batch_size=64, shuffle=False, shuffle_buffer=0, rank=0,
                                 world_size=1, output="numpy")
    by = {}
    for b in loader:
        for i, key in enumerate(b["__key__"]):
            by[key] = {k: (v[i] if not isinstance(v, list) else v[i]) for k, v in b.items()}
    loader.close()
    return by


def test_rows_equal_the_shard_loader(shards, ray_session):
    want = reference(shards)
    source = vray.WdsDatasource(shards, shards_per_task=2, rows_per_block=10)
    lines = [json.loads(x) for x in shards.read_text().splitlines()]
    plan = source.read_tasks_plan()
    assert [t["rows"] for t in plan] == [sum(x["num_sequences"] for x in lines[i:i + 2])
                                        for i in range(0, len(lines), 2)]
    assert source.meta["num_samples"] == len(want) == sum(x["num_sequences"] for x in lines)
    rows = ray.data.read_datasource(source).take_all()
    assert len(rows) == len(want)
    seen = set()
    for r in rows:
        key = r["__key__"]
        assert key not in seen
        seen.add(key)
        w = want[key]
        for k in ("action", "observation.state", "past_mask", "future_mask", "cam0_t0", "cam1_t0"):
            assert np.array_equal(np.asarray(r[k]), np.asarray(w[k])), (key, k)
        assert json.loads(r["metadata.json"]) == w["metadata.json"]
        assert json.loads(r["language_instructions.json"]) == w["language_instructions.json"]
    assert seen == set(want)
    report = source.report()
    assert sum(t["rows"] for t in report["tasks"]) == len(want) and source.skipped() == []


def test_iter_torch_batches(shards, ray_session):
    ds = vray.read_wds(shards, image_format="float_chw", rows_per_block=8)
    n = 0
    for batch in ds.iter_torch_batches(batch_size=8, collate_fn=vray.TorchCollate()):
        assert batch["cam0_t0"].dtype == torch.float32 and batch["cam0_t0"].shape[1:] == (3, 48, 64)
        assert batch["action"].shape[1:] == (4, 6)
        assert isinstance(batch["__key__"], list)
        n += len(batch["__key__"])
    assert n == sum(json.loads(x)["num_sequences"] for x in shards.read_text().splitlines())


def test_missing_and_damaged_shards(shards, ray_session, tmp_path):
    lines = shards.read_text().splitlines()
    shard_dir = shards.parent
    # A manifest naming a shard that is not there: the task's error names it. (It lives beside the
    # shards: a manifest may only name shards under its own folder.)
    bad = shard_dir / "missing.jsonl"
    entries = [json.loads(x) for x in lines[:2]]
    entries[1]["shard"] = "nope"
    bad.write_text("\n".join(json.dumps(e) for e in entries))
    source = vray.WdsDatasource(bad, shards_per_task=1)
    with pytest.raises(Exception, match=r"nope") as info:
        ray.data.read_datasource(source, ray_remote_args={"max_retries": 0}).take_all()
    assert "wds task 1" in str(info.value)
    # A truncated shard under on_error="skip": the lost samples are counted, the rest delivered.
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    first = json.loads(lines[0])
    data = (shard_dir / (first["shard"] + ".tar")).read_bytes()
    (damaged / "a.tar").write_bytes(data[: len(data) // 2])
    (damaged / "manifest.jsonl").write_text(json.dumps({"shard": "a", "num_sequences": first["num_sequences"]}))
    source = vray.WdsDatasource(damaged / "manifest.jsonl", on_error="skip")
    got = ray.data.read_datasource(source).take_all()
    lost = source.skipped_rows()
    assert 0 < len(got) < first["num_sequences"] and len(got) + lost == first["num_sequences"]
    (rec,) = source.skipped()
    assert rec["shards"] == ["a"] and rec["error"]


# ---- string .npy fields and relative manifests (issue 25) -------------------------------------------------

def _npy_bytes(array, allow_pickle=False):
    import io
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


def _string_npy_shard(d, bad_object=False):
    """4 samples with a float .npy, a 1-D string .npy ('<U') and a 0-d string .npy; with bad_object the third
    sample's names.npy is an object array (pickled: refused by every entry point)."""
    from wds_helpers import write_manifest, write_tar
    d.mkdir(parents=True, exist_ok=True)
    members = []
    for i in range(4):
        names = np.array([f"cam{i}", f"arm{i}x"])
        if bad_object and i == 2:
            names_bytes = _npy_bytes(np.array([{"x": 1}], dtype=object), allow_pickle=True)
        else:
            names_bytes = _npy_bytes(names)
        members += [(f"k{i}.state.npy", _npy_bytes(np.full(3, i, np.float32))),
                    (f"k{i}.names.npy", names_bytes),
                    (f"k{i}.label.npy", _npy_bytes(np.array(f"label {i}")))]
    write_tar(d / "shard_000000.tar", members)
    return write_manifest(d, [4])


def test_string_npy_fields_delivered_as_strings(ray_session, tmp_path):
    """A '<U' .npy arrives as str (0-d) or a list of str (1-D), the values ShardLoader gives (before: the read
    task failed converting the string array to an Arrow tensor column)."""
    manifest = _string_npy_shard(tmp_path / "str")
    want = reference(manifest)
    assert want["k1"]["names.npy"].tolist() == ["cam1", "arm1x"] and str(want["k1"]["label.npy"]) == "label 1"
    rows = sorted(vray.read_wds(manifest, rows_per_block=3).take_all(), key=lambda r: r["__key__"])
    assert [r["__key__"] for r in rows] == ["k0", "k1", "k2", "k3"]
    for r in rows:
        w = want[r["__key__"]]
        assert list(r["names.npy"]) == w["names.npy"].tolist()
        assert r["label.npy"] == str(w["label.npy"])
        assert np.array_equal(np.asarray(r["state.npy"]), w["state.npy"])


def test_object_npy_refused_naming_shard_member_key(ray_session, tmp_path):
    """An object .npy needs pickle: refused as ShardLoader refuses it, naming the shard, the key and the field."""
    manifest = _string_npy_shard(tmp_path / "obj", bad_object=True)
    with pytest.raises(Exception, match=r"shard_000000.*'k2'.*names\.npy") as info:
        vray.read_wds(manifest, ray_remote_args={"max_retries": 0}).take_all()
    assert "wds task 0" in str(info.value)
    source = vray.WdsDatasource(manifest, on_error="skip")
    rows = ray.data.read_datasource(source).take_all()
    assert sorted(r["__key__"] for r in rows) == ["k0", "k1", "k3"]


def test_relative_manifest_resolved_at_the_driver(ray_session, tmp_path, monkeypatch):
    """A relative manifest path is made absolute by read_wds: the read tasks run in worker processes whose
    working directory is not the driver's (before: every task failed to find its shards)."""
    _string_npy_shard(tmp_path / "rel" / "shards")
    monkeypatch.chdir(tmp_path / "rel")
    source = vray.WdsDatasource(os.path.join("shards", "manifest.jsonl"))
    assert os.path.isabs(source.manifest)
    assert all(os.path.isabs(url) for _, url, _ in source._shards)
    rows = vray.read_wds(os.path.join("shards", "manifest.jsonl")).take_all()
    assert sorted(r["__key__"] for r in rows) == ["k0", "k1", "k2", "k3"]


def test_pth_field_arrives_as_serialized_bytes(ray_session, tmp_path):
    """A .pth field: the read task's ShardLoader loads each checkpoint, the Arrow column holds it serialized
    again (before: the task failed with 'Object of type Tensor is not JSON serializable')."""
    import io
    from wds_helpers import write_manifest, write_tar
    d = tmp_path / "pth"
    d.mkdir()
    members = []
    for i in range(3):
        buf = io.BytesIO()
        torch.save({"w": torch.full((2,), float(i))}, buf)
        members += [(f"k{i}.extra.pth", buf.getvalue()), (f"k{i}.cls", b"%d" % i)]
    write_tar(d / "shard_000000.tar", members)
    rows = sorted(vray.read_wds(write_manifest(d, [3])).take_all(), key=lambda r: r["__key__"])
    for i, r in enumerate(rows):
        got = torch.load(io.BytesIO(r["extra.pth"]), weights_only=True)
        assert torch.equal(got["w"], torch.full((2,), float(i))) and r["cls"] == i


def test_task_whose_first_shard_is_missing_skips_under_skip(ray_session, tmp_path):
    """Tasks read the fields the driver learned: a task whose only shard is missing counts it under
    on_error="skip" (before: the task looked for its own first sample to learn fields, and raised)."""
    from wds_helpers import write_foundry_set
    manifest = write_foundry_set(tmp_path / "set", shards=3, per_shard=2)
    os.unlink(tmp_path / "set" / "shard_000001.tar")
    source = vray.WdsDatasource(manifest, on_error="skip")
    rows = ray.data.read_datasource(source).take_all()
    assert len(rows) == 4 and source.skipped_rows() == 2
    (rec,) = source.skipped()
    assert rec["shards"] == ["shard_000001"] and "shard_000001.tar" in rec["error"]
