"""ShardLoader on bad input: each case raises VlafeedError naming the shard,
the member and the key (on_error="raise", the default), or, under
on_error="skip", leaves the bad sample (or the unreadable rest of a shard)
out, delivers every other sample, and counts it in stats().

Cases: a truncated tar, a damaged header checksum, a sample missing a field,
manifest counts above and below the shard's, a missing shard, a corrupt
JPEG, a corrupt npz, images of different sizes in one batch, an empty or
malformed manifest.
"""
import shutil

import numpy as np
import pytest

import vlafeed
from wds_helpers import foundry_sample, write_manifest, write_tar

PER_SHARD = 4
KEY = "{s}_{i:030x}"


def build(d, damage=None, counts=None):
    """3 shards x 4 samples; damage(shard, index, members) may edit a sample's members."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s in range(3):
        members = []
        for i in range(PER_SHARD):
            m = foundry_sample(rng, KEY.format(s=s, i=i), i, cams=("top",), size=(16, 16))
            if damage:
                m = damage(s, i, m)
            members += m
        write_tar(d / f"shard_{s:06d}.tar", members)
    return str(write_manifest(d, counts or [PER_SHARD] * 3))


def run(manifest, **kw):
    loader = vlafeed.ShardLoader(manifest, batch_size=3, shuffle=False, output="numpy", **kw)
    got = [k for b in loader for k in b["__key__"]]
    return got, loader.stats()


def all_keys():
    return [KEY.format(s=s, i=i) for s in range(3) for i in range(PER_SHARD)]


def expect_raise(manifest, *needles):
    with pytest.raises(vlafeed.VlafeedError) as e:
        run(manifest)
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))


def test_good_set_reads_whole(tmp_path):
    got, st = run(build(tmp_path / "ok"))
    assert got == all_keys() and st["skipped_samples"] == st["skipped_shards"] == 0


def test_truncated_tar(tmp_path):
    manifest = build(tmp_path / "t")
    path = tmp_path / "t" / "shard_000001.tar"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])
    expect_raise(manifest, "shard_000001.tar")
    got, st = run(manifest, on_error="skip")
    assert got[:4] == all_keys()[:4] and got[-4:] == all_keys()[-4:]
    assert 4 <= len(got) < 12 and st["skipped_shards"] == 1
    assert st["skipped_samples"] == 12 - len(got)
    assert "shard_000001.tar" in st["skip_messages"][0]


def test_bad_header_checksum(tmp_path):
    manifest = build(tmp_path / "c")
    path = tmp_path / "c" / "shard_000002.tar"
    data = bytearray(path.read_bytes())
    # the second sample's first member header: find its name and flip a byte of it
    name = (KEY.format(s=2, i=1) + ".top_t-1.jpg").encode()
    at = data.index(name)
    data[at + 3] ^= 0x20
    path.write_bytes(bytes(data))
    expect_raise(manifest, "shard_000002.tar")
    got, st = run(manifest, on_error="skip")
    # the sample before the damaged header is left out too (its end is not known)
    assert got == all_keys()[:8] and st["skipped_samples"] == 4 and st["skipped_shards"] == 1
    assert "checksum" in st["skip_messages"][0] or "Damaged" in st["skip_messages"][0]


def test_missing_field(tmp_path):
    def drop(s, i, m):
        return [x for x in m if not x[0].endswith("metadata.json")] if (s, i) == (1, 2) else m
    manifest = build(tmp_path / "f", drop)
    key = KEY.format(s=1, i=2)
    expect_raise(manifest, "shard_000001.tar", key, "missing field metadata.json")
    got, st = run(manifest, on_error="skip")
    assert got == [k for k in all_keys() if k != key] and st["skipped_samples"] == 1
    # fields= names the delivered fields: without metadata.json the sample is fine
    got, st = run(manifest, fields="lowdim.npz,top_t0.jpg")
    assert got == all_keys()


@pytest.mark.parametrize("count", [PER_SHARD + 2, PER_SHARD - 1])
def test_manifest_count_disagrees(tmp_path, count):
    manifest = build(tmp_path / "n", counts=[PER_SHARD, count, PER_SHARD])
    if count > PER_SHARD:
        expect_raise(manifest, "shard_000001.tar", f"ends after {PER_SHARD} samples", f"num_sequences is {count}")
        got, st = run(manifest, on_error="skip")
        assert got == all_keys() and st["skipped_samples"] == count - PER_SHARD
    else:
        expect_raise(manifest, "shard_000001.tar", f"more samples than the manifest's num_sequences {count}",
                     KEY.format(s=1, i=count))
        got, st = run(manifest, on_error="skip")
        assert got == [k for k in all_keys() if k != KEY.format(s=1, i=PER_SHARD - 1)]
        assert st["skipped_shards"] == 1


def test_manifest_count_too_low_in_last_shard(tmp_path):
    """The last shard of the epoch is checked too (after its last sample is delivered)."""
    manifest = build(tmp_path / "last", counts=[PER_SHARD, PER_SHARD, PER_SHARD - 1])
    expect_raise(manifest, "shard_000002.tar", f"more samples than the manifest's num_sequences {PER_SHARD - 1}")
    got, st = run(manifest, on_error="skip")
    assert got == all_keys()[:-1] and st["skipped_shards"] == 1


def test_missing_shard(tmp_path):
    manifest = build(tmp_path / "m")
    (tmp_path / "m" / "shard_000001.tar").unlink()
    expect_raise(manifest, "shard_000001.tar")
    got, st = run(manifest, on_error="skip")
    assert got == all_keys()[:4] + all_keys()[8:] and st["skipped_samples"] == 4 and st["skipped_shards"] == 1


def test_corrupt_jpeg(tmp_path):
    def cut(s, i, m):
        if (s, i) != (0, 3):
            return m
        return [(n, b[: len(b) // 2] if n.endswith("top_t0.jpg") else b) for n, b in m]
    manifest = build(tmp_path / "j", cut)
    key = KEY.format(s=0, i=3)
    expect_raise(manifest, "shard_000000.tar", f"member {key}.top_t0.jpg", f"key {key}", "JPEG")
    got, st = run(manifest, on_error="skip")
    assert got == [k for k in all_keys() if k != key] and st["skipped_samples"] == 1


def test_corrupt_npz(tmp_path):
    def flip(s, i, m):
        if (s, i) != (2, 0):
            return m
        out = []
        for n, b in m:
            if n.endswith(".npz"):
                b = bytearray(b)
                b[60] ^= 0xFF  # inside the first member's deflate stream
                b = bytes(b)
            out.append((n, b))
        return out
    manifest = build(tmp_path / "z", flip)
    key = KEY.format(s=2, i=0)
    expect_raise(manifest, "shard_000002.tar", f"member {key}.lowdim.npz", "npz")
    got, st = run(manifest, on_error="skip")
    assert got == [k for k in all_keys() if k != key] and st["skipped_samples"] == 1


def test_image_size_differs_in_batch(tmp_path):
    d = tmp_path / "sz"
    d.mkdir()
    rng = np.random.default_rng(0)
    members = foundry_sample(rng, "a", 0, cams=("top",), size=(16, 16))
    members += foundry_sample(rng, "b", 0, cams=("top",), size=(20, 16))
    write_tar(d / "shard_000000.tar", members)
    manifest = str(write_manifest(d, [2]))
    expect_raise(manifest, "member b.top_t-1.jpg", "image 20x16", "resize=")
    got, _ = run(manifest, resize=(8, 8))
    assert got == ["a", "b"]


def test_bad_manifests(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(vlafeed.VlafeedError, match="no shards listed"):
        vlafeed.ShardLoader(str(tmp_path / "empty.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"shard": "a", "num_sequences": 1}\n{"shard": "b"}\n')
    with pytest.raises(vlafeed.VlafeedError, match="bad.jsonl.*line 2.*num_sequences"):
        vlafeed.ShardLoader(str(tmp_path / "bad.jsonl"), fields="x")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        vlafeed.ShardLoader(str(tmp_path / "nope.jsonl"))
    shutil.rmtree(tmp_path / "empty.jsonl", ignore_errors=True)
