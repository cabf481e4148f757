"""vlafeed.ShardLoader against the webdataset library (1.0.2) on the same bytes.

Proves: shards written by webdataset.TarWriter (npy, jpg, png, json, txt, pth,
cls fields) read by vlafeed give the values webdataset's own decoders give
(JPEG pixels equal to PIL's decode of the same bytes, exactly: both use
libjpeg-turbo's accurate integer IDCT with fancy upsampling); a VLA
Foundry-style set (tarfile-built, stems in the manifest, npz + jpg + json)
read by vlafeed and by webdataset gives identical arrays, images and JSON;
manifest entries with and without .tar read alike; float_chw and resize;
member names grouped as webdataset groups them (upper-case suffixes, names
with dots in directories, __meta__ members, pax long names).
"""
import io
import json
import tarfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
wds = pytest.importorskip("webdataset")
from PIL import Image  # noqa: E402

import vlafeed  # noqa: E402
from wds_helpers import jpeg_bytes, png_bytes, write_foundry_set, write_manifest, write_tar  # noqa: E402


def read_all(manifest, **kw):
    kw.setdefault("shuffle", False)
    kw.setdefault("batch_size", 3)
    kw.setdefault("output", "numpy")
    loader = vlafeed.ShardLoader(str(manifest), **kw)
    samples = {}
    for batch in loader:
        for i, key in enumerate(batch["__key__"]):
            samples[key] = {name: value[i] for name, value in batch.items()}
    return samples, loader


@pytest.fixture(scope="module")
def tarwriter_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("tw")
    rng = np.random.default_rng(1)
    counts = []
    for s in range(2):
        with wds.TarWriter(str(d / f"shard_{s:06d}.tar")) as w:
            for i in range(7):
                img = rng.integers(0, 256, (20, 28, 3), dtype=np.uint8)
                w.write({"__key__": f"s{s}/k{i:03d}", "jpg": jpeg_bytes(img), "png": png_bytes(img),
                         "npy": rng.normal(size=(3, 2)), "json": {"i": i, "s": [s, 1.5]}, "txt": f"text {s} {i} é",
                         "pth": {"w": torch.arange(4, dtype=torch.float32) * i}, "cls": i})
        counts.append(7)
    return write_manifest(d, counts)


def test_tarwriter_fields_match_webdataset(tarwriter_set):
    ours, loader = read_all(tarwriter_set)
    urls = [str(tarwriter_set.parent / f"shard_{s:06d}.tar") for s in range(2)]
    theirs = list(wds.WebDataset(urls, shardshuffle=False).decode("rgb8"))
    raw = {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False)}
    assert len(theirs) == len(ours) == 14 and loader.stats()["samples"] == 14
    for ref in theirs:
        got = ours[ref["__key__"]]
        assert got["__shard__"] in ("shard_000000", "shard_000001")
        np.testing.assert_array_equal(got["npy"], ref["npy"])
        assert got["npy"].dtype == np.float64
        assert got["json"] == ref["json"]
        assert got["txt"] == ref["txt"]
        assert int(got["cls"]) == ref["cls"]
        assert torch.equal(got["pth"]["w"], ref["pth"]["w"])
        # the same JPEG bytes decoded by PIL (webdataset's rgb8) give the same pixels
        assert got["jpg"].shape == ref["jpg"].shape == (20, 28, 3)
        np.testing.assert_array_equal(got["jpg"], ref["jpg"])
        np.testing.assert_array_equal(got["png"], ref["png"])
        pil = np.asarray(Image.open(io.BytesIO(raw[ref["__key__"]]["jpg"])).convert("RGB"))
        np.testing.assert_array_equal(got["jpg"], pil)


def test_float_chw_and_resize(tarwriter_set):
    u8, _ = read_all(tarwriter_set)
    f32, _ = read_all(tarwriter_set, image_format="float_chw", fields=["jpg", "npy"])
    key = sorted(u8)[0]
    assert set(f32[key]) == {"jpg", "npy", "__key__", "__shard__"}
    np.testing.assert_allclose(f32[key]["jpg"], u8[key]["jpg"].transpose(2, 0, 1) / 255.0, atol=1e-7)
    small, _ = read_all(tarwriter_set, resize=(14, 10), fields="jpg")
    assert small[key]["jpg"].shape == (10, 14, 3)
    ref = np.asarray(Image.fromarray(u8[key]["jpg"]).resize((14, 10), Image.BOX), dtype=np.float32)
    assert np.abs(small[key]["jpg"].astype(np.float32) - ref).mean() < 4  # area filter vs PIL's box


def test_torch_output_types(tarwriter_set):
    loader = vlafeed.ShardLoader(str(tarwriter_set), batch_size=4, shuffle=False)
    batch = next(iter(loader))
    assert batch["jpg"].dtype == torch.uint8 and tuple(batch["jpg"].shape) == (4, 20, 28, 3)
    assert batch["cls"].dtype == torch.int64 and batch["cls"].tolist() == [0, 1, 2, 3]
    assert batch["npy"].dtype == torch.float64 and tuple(batch["npy"].shape) == (4, 3, 2)
    assert isinstance(batch["json"], list) and batch["json"][1] == {"i": 1, "s": [0, 1.5]}
    assert batch["__key__"] == ["s0/k000", "s0/k001", "s0/k002", "s0/k003"]


@pytest.mark.parametrize("with_tar", [False, True])
def test_vla_foundry_set_read_by_both(tmp_path, with_tar):
    manifest = write_foundry_set(tmp_path / "shards", shards=3, per_shard=4, with_tar=with_tar)
    ours, _ = read_all(manifest)
    urls = [str(tmp_path / "shards" / f"shard_{s:06d}.tar") for s in range(3)]
    theirs = list(wds.WebDataset(urls, shardshuffle=False).decode("rgb8"))
    assert len(ours) == len(theirs) == 12
    for ref in theirs:
        got = ours[ref["__key__"]]
        for name, arr in ref["lowdim.npz"].items():
            np.testing.assert_array_equal(got[name], arr)
            assert got[name].dtype == arr.dtype
        for cam in ("top", "wrist"):
            for off in (-1, 0):
                np.testing.assert_array_equal(got[f"{cam}_t{off}"], ref[f"{cam}_t{off}.jpg"])
        assert got["metadata.json"] == ref["metadata.json"]
        assert got["language_instructions.json"] == {"original": "pick"}


def test_grouping_like_webdataset(tmp_path):
    data = tmp_path / "g"
    data.mkdir()
    long_dir = "d" * 120
    members = [("__meta__", b"skip me"), ("a.b/key1.TXT", b"one"), ("a.b/key1.Data.Json", b"[1]"),
               ("nodot", b"ignored"), (f"{long_dir}/key2.txt", b"two"), (f"{long_dir}/key2.data.json", b"[2]"),
               ("x/.txt", b"three"), ("x/.data.json", b"[3]")]
    write_tar(data / "shard_000000.tar", members, fmt=tarfile.PAX_FORMAT)
    write_manifest(data, [3])
    ours, _ = read_all(data / "manifest.jsonl", batch_size=1)
    theirs = list(wds.WebDataset(str(data / "shard_000000.tar"), shardshuffle=False).decode())
    assert [s["__key__"] for s in theirs] == ["a.b/key1", f"{long_dir}/key2", "x/"]
    assert sorted(ours) == sorted(s["__key__"] for s in theirs)
    for ref in theirs:
        assert ours[ref["__key__"]]["txt"] == ref["txt"]
        assert ours[ref["__key__"]]["data.json"] == ref["data.json"]


def test_gzip_compressed_shards(tmp_path, tarwriter_set):
    """A gzip-compressed tar (webdataset opens with tarfile "r|*" and reads it too) gives the same samples."""
    import gzip
    import shutil
    gz = tmp_path / "gz"
    gz.mkdir()
    for s in range(2):
        with open(tarwriter_set.parent / f"shard_{s:06d}.tar", "rb") as f, \
                gzip.open(gz / f"shard_{s:06d}.tar", "wb") as g:
            shutil.copyfileobj(f, g)
    shutil.copy(tarwriter_set, gz / "manifest.jsonl")
    plain, _ = read_all(tarwriter_set)
    packed, _ = read_all(gz / "manifest.jsonl")
    assert sorted(plain) == sorted(packed)
    for key in plain:
        np.testing.assert_array_equal(plain[key]["jpg"], packed[key]["jpg"])
        np.testing.assert_array_equal(plain[key]["npy"], packed[key]["npy"])
