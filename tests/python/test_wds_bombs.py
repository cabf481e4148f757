"""ShardLoader against decompression bombs: small shards and manifests that
declare huge contents are refused by their headers, before anything of that
size is allocated, and the peak RSS of a pass stays small.

Each bomb runs in a child process (its peak RSS measured there: the
kernel's VmHWM, which starts afresh at exec, while getrusage's ru_maxrss
carries over the RSS pytest had when it forked; its address space capped at
4 GiB so a regression fails instead of exhausting the machine): a 1 KB JPEG declaring 30000x30000 and
60000x60000, a 400 KB PNG of 20000x20000 (8-bit, and 1-bit now that 1-bit
PNGs decode), a 1 MB .npz holding a 1 GiB array, a tar member declaring 1 GiB
(a hole in the file), a GNU sparse member expanding to 1 GiB, a gzip'd tar
with a 1 GiB member that is not a field (skipped unread, not refused), and a
manifest line num_sequences 1e9. Besides: budgets settable and checked, a
sample over one skipped and counted under on_error="skip", the batch budget
admitting samples in order, JPEGs decoded at a reduced scale when resized
(pixels within the tolerance test_wds_read.py allows against PIL), 1-bit and
2/4-bit PNGs decoded like PIL's convert("RGB"), and num_sequences 0 next to
a tar that holds samples refused (or counted under on_error="skip").
"""
import io
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image

import vlafeed
from wds_helpers import (gnu_sparse_member, gzip_with_zeros, jpeg_bytes, jpeg_declaring, npz_bytes, npz_with_zeros,
                         png_of_zeros, tar_header, write_manifest, write_tar, write_tar_with_holes)

GIB = 1 << 30
MIB = 1 << 20
RSS_LIMIT_MB = 200


def small_jpeg(seed=0, size=(16, 12)):
    return jpeg_bytes(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def one_shard(d, samples, count=None, writer=write_tar):
    """shard_000000.tar holding `samples` ([(key, {suffix: bytes or int}), ...]) + manifest.jsonl."""
    d.mkdir(parents=True, exist_ok=True)
    members = [(f"{key}.{suffix}", data) for key, fields in samples for suffix, data in fields.items()]
    writer(d / "shard_000000.tar", members)
    return str(write_manifest(d, [len(samples) if count is None else count]))


def read(manifest, **kw):
    kw.setdefault("shuffle", False)
    kw.setdefault("output", "numpy")
    kw.setdefault("batch_size", 4)
    loader = vlafeed.ShardLoader(manifest, **kw)
    batches = list(loader)
    return batches, loader.stats()


def in_child(manifest, env=None, **kw):
    """Reads `manifest` in a child process (batches of 2: the bomb, first, sets the batch's columns):
    {"error": message or None, "keys": [...], "stats": {...}, "base_mb": RSS after imports, "peak_mb": peak
    RSS}."""
    kw.setdefault("batch_size", 2)
    script = textwrap.dedent(f"""
        import json, resource, sys
        limit = 4 << 30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        def peak_kb():
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        import numpy, vlafeed
        base = peak_kb()
        out = {{"error": None, "keys": [], "stats": None}}
        try:
            loader = vlafeed.ShardLoader({manifest!r}, shuffle=False, output="numpy", **{kw!r})
            for batch in loader:
                out["keys"] += batch["__key__"]
            out["stats"] = {{k: v for k, v in loader.stats().items() if k != "decode_seconds"}}
        except BaseException as e:
            out["error"] = type(e).__name__ + ": " + str(e)
        out["base_mb"] = base / 1024
        out["peak_mb"] = peak_kb() / 1024
        print(json.dumps(out))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **(env or {}))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"peak RSS {result['peak_mb']:.0f} MB (after imports {result['base_mb']:.0f} MB): {result['error']}")
    return result


def refused(result, *needles):
    assert result["error"] and result["error"].startswith("VlafeedError"), result
    for needle in needles:
        assert needle in result["error"], (needle, result["error"])
    assert result["peak_mb"] < RSS_LIMIT_MB, result


def with_good_neighbours(bomb_fields, good_fields=None):
    """The bomb first (before the fix it set its batch's columns), then two good samples."""
    good = good_fields or {"jpg": small_jpeg(), "cls": b"1"}
    return [("bomb", {**good, **bomb_fields}), ("a1", good), ("a2", good)]


# ---- images ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("side", [30000, 60000])
def test_jpeg_declaring_huge_size_refused_by_header(tmp_path, side):
    bomb = jpeg_declaring(side, side)
    assert len(bomb) < 2000
    manifest = one_shard(tmp_path / "j", with_good_neighbours({"jpg": bomb}))
    refused(in_child(manifest, fields="jpg,cls"), "shard_000000.tar", "member bomb.jpg", "key bomb",
            f"image {side}x{side}", "max_image_pixels 67108864")
    # skipped and counted; the samples around it are delivered
    result = in_child(manifest, fields="jpg,cls", on_error="skip")
    assert result["error"] is None and result["keys"] == ["a1", "a2"], result
    assert result["stats"]["skipped_samples"] == 1 and "max_image_pixels" in result["stats"]["skip_messages"][0]
    assert result["peak_mb"] < RSS_LIMIT_MB


@pytest.mark.parametrize("bit_depth", [8, 1])
def test_png_20000x20000_refused_by_ihdr(tmp_path, bit_depth):
    bomb = png_of_zeros(20000, 20000, bit_depth=bit_depth)
    assert len(bomb) < 500_000
    good = {"png": png_of_zeros(16, 12), "cls": b"1"}
    manifest = one_shard(tmp_path / "p", with_good_neighbours({"png": bomb}, good))
    refused(in_child(manifest, fields="png,cls"), "member bomb.png", "key bomb", "image 20000x20000",
            "max_image_pixels")


def test_image_decoded_bytes_count_against_member_budget(tmp_path):
    """Within the pixel budget, what an image decodes to is held to max_member_bytes (float_chw: 12 bytes
    per pixel)."""
    manifest = one_shard(tmp_path / "f", [("k", {"png": png_of_zeros(1000, 1000)})])
    batches, _ = read(manifest, image_format="float_chw")
    assert batches[0]["png"].shape == (1, 3, 1000, 1000)
    with pytest.raises(vlafeed.VlafeedError, match=r"member k.png \(key k\): image 1000x1000 decodes to "
                                                   r"15000000 bytes, above max_member_bytes 10000000"):
        read(manifest, image_format="float_chw", max_member_bytes=10_000_000)
    batches, _ = read(manifest, max_member_bytes=10_000_000)  # uint8: 3 MB
    assert batches[0]["png"].shape == (1, 1000, 1000, 3)


# ---- npz / npy / tar members -------------------------------------------------------------------------------

def test_npz_with_1gib_array_refused_by_zip_header(tmp_path):
    bomb = npz_with_zeros("observation.state", (GIB // 4 - 32,))  # with its .npy header: 1 GiB
    assert len(bomb) < 2 * MIB
    good = {"lowdim.npz": npz_bytes({"observation.state": np.zeros(GIB // 4 // (1 << 24), np.float32)})}
    manifest = one_shard(tmp_path / "z", with_good_neighbours({"lowdim.npz": bomb}, good))
    refused(in_child(manifest), "member bomb.lowdim.npz", "key bomb", "npz member observation.state.npy",
            "1073741824 bytes", "max_member_bytes 268435456")
    result = in_child(manifest, on_error="skip")
    assert result["keys"] == ["a1", "a2"] and result["stats"]["skipped_samples"] == 1, result
    assert result["peak_mb"] < RSS_LIMIT_MB


def test_tar_member_declaring_1gib_refused_by_header(tmp_path):
    """A .npy member of 1 GiB (a hole in the tar file): refused by its tar header, never read."""
    npy = io.BytesIO()
    np.save(npy, np.arange(3))
    samples = [("bomb", {"npy": GIB}), ("a1", {"npy": npy.getvalue()}), ("a2", {"npy": npy.getvalue()})]
    manifest = one_shard(tmp_path / "t", samples, writer=write_tar_with_holes)
    refused(in_child(manifest), "member bomb.npy", "key bomb", "1073741824 bytes, above max_member_bytes")
    result = in_child(manifest, on_error="skip")
    assert result["keys"] == ["a1", "a2"] and result["stats"]["skipped_samples"] == 1, result
    assert result["stats"]["bytes_read"] < 1000 and result["peak_mb"] < RSS_LIMIT_MB


def test_gnu_sparse_member_counts_its_real_size(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    with open(d / "shard_000000.tar", "wb") as f:
        for key in ("bomb", "a1", "a2"):
            f.write(tar_header(f"{key}.cls", 1) + b"1" + bytes(511))
            if key == "bomb":
                f.write(gnu_sparse_member("bomb.bin", GIB))
            else:
                f.write(tar_header(f"{key}.bin", 3) + b"abc" + bytes(509))
        f.write(bytes(1024))
    assert os.path.getsize(d / "shard_000000.tar") < 10_000
    manifest = str(write_manifest(d, [3]))
    refused(in_child(manifest, fields="cls,bin"), "member bomb.bin", "key bomb",
            "1073741824 bytes (a sparse member", "max_member_bytes")
    # not a field: skipped unread like any other member
    result = in_child(manifest, fields="cls")
    assert result["error"] is None and result["keys"] == ["bomb", "a1", "a2"], result
    assert result["peak_mb"] < RSS_LIMIT_MB


@pytest.mark.parametrize("gzipped", [False, True])
def test_unrequested_member_skipped_unread(tmp_path, gzipped):
    """A 1 GiB member whose suffix is not a field is skipped in the stream (the gzip'd tar is ~1 MB):
    nothing of it is read into memory, and it is no error."""
    d = tmp_path / ("gz" if gzipped else "plain")
    d.mkdir()
    small = small_jpeg()
    if gzipped:
        pieces = []
        for key in ("a0", "a1", "a2"):
            pieces += [tar_header(f"{key}.jpg", len(small)), small + bytes(-len(small) % 512)]
            if key == "a1":
                pieces += [tar_header(f"{key}.video.bin", GIB), GIB]
        pieces.append(bytes(1024))
        data = gzip_with_zeros(pieces)
        assert len(data) < 2 * MIB
        (d / "shard_000000.tar").write_bytes(data)
    else:
        write_tar_with_holes(d / "shard_000000.tar", [("a0.jpg", small), ("a1.jpg", small),
                                                      ("a1.video.bin", GIB), ("a2.jpg", small)])
    manifest = str(write_manifest(d, [3]))
    result = in_child(manifest, fields="jpg")
    assert result["error"] is None and result["keys"] == ["a0", "a1", "a2"], result
    assert result["stats"]["bytes_read"] == 3 * len(small)
    assert result["peak_mb"] < RSS_LIMIT_MB


def _npy(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def test_sample_and_batch_budgets(tmp_path):
    rng = np.random.default_rng(0)
    samples = [(f"k{i}", {"npy": _npy(rng.normal(size=(1000,))), "cls": b"%d" % i}) for i in range(6)]
    manifest = one_shard(tmp_path / "b", samples)
    batches, st = read(manifest, batch_size=6)
    assert batches[0]["npy"].shape == (6, 1000)
    row = 8000 + 8  # the .npy column's row and the .cls column's
    # a batch's columns within max_batch_bytes: the samples past it are refused, in order
    with pytest.raises(vlafeed.VlafeedError, match=r"key k2: the batch's columns would reach 24024 bytes with "
                                                   r"this sample \(2 before it\), above max_batch_bytes 20000"):
        read(manifest, batch_size=6, max_batch_bytes=20000)
    batches, st = read(manifest, batch_size=6, max_batch_bytes=2 * row + 10, on_error="skip")
    assert batches[0]["__key__"] == ["k0", "k1"] and st["skipped_samples"] == 4
    np.testing.assert_array_equal(batches[0]["cls"], [0, 1])
    # a sample's members as read (8128 + 1 bytes) plus what they decode to
    with pytest.raises(vlafeed.VlafeedError, match=r"member k0.npy \(key k0\): the sample's read members reach "
                                                   r"8128 bytes with it, above max_sample_bytes 5000"):
        read(manifest, max_sample_bytes=5000)
    with pytest.raises(vlafeed.VlafeedError, match="max_member_bytes 4000"):
        read(manifest, max_member_bytes=4000)
    batches, st = read(manifest, max_member_bytes=4000, fields="cls")  # the .npy is not read at all
    assert st["samples"] == 6 and st["bytes_read"] == 6


def test_budget_settings_checked(tmp_path):
    manifest = one_shard(tmp_path / "c", [("k", {"cls": b"1"})])
    for name in ("max_image_pixels", "max_member_bytes", "max_sample_bytes", "max_batch_bytes",
                 "max_manifest_samples", "max_buffer_bytes"):
        with pytest.raises(ValueError, match=f"{name} must be >= 1"):
            vlafeed.ShardLoader(manifest, **{name: 0})
    batches, _ = read(manifest, max_image_pixels=1, max_member_bytes=1, max_sample_bytes=1, max_batch_bytes=8,
                      max_manifest_samples=1, max_buffer_bytes=1)
    assert batches[0]["__key__"] == ["k"]
    jpg = one_shard(tmp_path / "i", [("k", {"jpg": small_jpeg()})])
    with pytest.raises(vlafeed.VlafeedError, match=r"image 16x12 is 192 pixels, above max_image_pixels 191"):
        read(jpg, max_image_pixels=191)
    assert read(jpg, max_image_pixels=192)[0][0]["jpg"].shape == (1, 12, 16, 3)


def test_buffer_budget_fails_at_a_fixed_sample(tmp_path):
    """max_buffer_bytes bounds the samples read ahead for the shuffle buffer: the sample that would pass it
    fails the pass at the same place on every run and under either policy (nothing is dropped or reordered),
    naming the shard, the member, the key and the settings to change."""
    samples = [(f"k{i:02d}", {"bin": bytes(1000), "cls": b"%d" % i}) for i in range(40)]
    manifest = one_shard(tmp_path / "buf", samples)
    whole, _ = read(manifest, shuffle=True, shuffle_buffer=16, seed=5)
    order = [k for b in whole for k in b["__key__"]]
    assert sorted(order) == [k for k, _ in samples] and order != sorted(order)
    messages = []
    for on_error in ("raise", "skip"):
        loader = vlafeed.ShardLoader(manifest, shuffle=True, shuffle_buffer=16, seed=5, batch_size=4,
                                     output="numpy", on_error=on_error, max_buffer_bytes=8 * 1003)
        got = []
        with pytest.raises(vlafeed.VlafeedError) as e:
            for b in loader:
                got += b["__key__"]
        assert got == order[:len(got)] and len(got) < 40   # the unbounded run's start, nothing left out
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    assert re.search(r"shard \S*shard_000000\.tar: member k\d\d\.bin \(key k\d\d\): holding this sample until its "
                     r"turn would bring the read-ahead buffer to \d+ bytes \(\d+ samples held before it\), above "
                     r"max_buffer_bytes 8024; raise max_buffer_bytes or lower shuffle_buffer \(16\)", messages[0])
    # in tar order one sample is held at a time
    batches, _ = read(manifest, max_buffer_bytes=1003)
    assert [k for b in batches for k in b["__key__"]] == [k for k, _ in samples]


# ---- the manifest --------------------------------------------------------------------------------------------

def test_manifest_count_1e9_refused_before_allocating(tmp_path):
    d = tmp_path / "m"
    one_shard(d, [("k", {"cls": b"1"})])
    (d / "manifest.jsonl").write_text('{"shard": "shard_000000", "num_sequences": 1e9}\n')
    refused(in_child(str(d / "manifest.jsonl")), "manifest.jsonl:1", "shard_000000.tar",
            "num_sequences 1000000000 cannot be right", "room for at most")
    # a count the file can hold but the shard does not have: read, then reported as before
    (d / "manifest.jsonl").write_text('{"shard": "shard_000000", "num_sequences": 2}\n')
    with pytest.raises(vlafeed.VlafeedError, match="ends after 1 samples"):
        read(str(d / "manifest.jsonl"))


def test_manifest_total_budget(tmp_path):
    d = tmp_path / "total"
    d.mkdir()
    lines = [json.dumps({"shard": f"http://127.0.0.1:9/s{i}.tar", "num_sequences": 400_000_000})
             for i in range(3)]
    (d / "manifest.jsonl").write_text("\n".join(lines))
    # remote sizes are not fetched at open: the total is capped instead (no request is made; one attempt
    # each would be refused at once)
    refused(in_child(str(d / "manifest.jsonl"), env={"VF_HTTP_ATTEMPTS": "1"}, allow_outside_base=True),
            "manifest.jsonl:1", "http://127.0.0.1:9/s0.tar", "above max_manifest_samples 268435456")
    one_shard(d / "local", [(f"k{i}", {"cls": b"1"}) for i in range(5)])
    with pytest.raises(vlafeed.VlafeedError, match=r"manifest.jsonl:1: .*num_sequences 5 brings the manifest to 5 "
                                                   r"samples, above max_manifest_samples 4"):
        vlafeed.ShardLoader(str(d / "local" / "manifest.jsonl"), max_manifest_samples=4)


def test_gzipped_shard_count_bound(tmp_path):
    """A gzip'd shard holds more samples than its size / 512: the bound is deflate's 1032:1."""
    d = tmp_path / "g"
    d.mkdir()
    pieces = [tar_header(f"k{i:05d}.cls", 1) + b"1" + bytes(511) for i in range(2000)] + [bytes(1024)]
    data = gzip_with_zeros(pieces)
    assert len(data) // 512 < 2000
    (d / "shard_000000.tar").write_bytes(data)
    write_manifest(d, [2000])
    _, st = read(str(d / "manifest.jsonl"), batch_size=500)
    assert st["samples"] == 2000
    write_manifest(d, [10 ** 9])
    refused(in_child(str(d / "manifest.jsonl")), "num_sequences 1000000000 cannot be right", "gzip'd")


def test_num_sequences_zero_with_samples(tmp_path):
    d = tmp_path / "zero"
    d.mkdir()
    for s in range(2):
        write_tar(d / f"shard_{s:06d}.tar", [(f"s{s}k{i}.cls", b"%d" % i) for i in range(3)])
    write_tar(d / "shard_000002.tar", [])
    manifest = str(write_manifest(d, [3, 0, 0]))
    with pytest.raises(vlafeed.VlafeedError, match=r"manifest.jsonl:2: shard .*shard_000001.tar has num_sequences 0 "
                                                   r"but its tar holds samples \(first key s1k0\)"):
        vlafeed.ShardLoader(manifest)
    batches, st = read(manifest, on_error="skip")
    assert [k for b in batches for k in b["__key__"]] == ["s0k0", "s0k1", "s0k2"]
    assert st["skipped_shards"] == 1 and "shard_000001.tar has num_sequences 0" in st["skip_messages"][0]
    # an empty shard listed with 0 is fine
    write_manifest(d, [3, 3, 0])
    _, st = read(manifest)
    assert st["samples"] == 6 and st["skipped_shards"] == 0


# ---- decoding ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,bits", [("1", None), ("P", 1), ("P", 2), ("P", 4), ("L", 4)])
def test_low_bit_depth_png_decodes_like_pil(tmp_path, mode, bits):
    rng = np.random.default_rng(3)
    pngs = []
    for i in range(3):
        if mode == "1":
            im = Image.fromarray(rng.integers(0, 2, (12, 17), dtype=np.uint8) * 255).convert("1")
        elif mode == "P":
            im = Image.fromarray(rng.integers(0, 1 << bits, (12, 17), dtype=np.uint8), "P")
            im.putpalette(rng.integers(0, 256, 3 * 256, dtype=np.uint8).tolist())
        else:
            im = Image.fromarray(rng.integers(0, 16, (12, 17), dtype=np.uint8) * 17, "L")
        buf = io.BytesIO()
        im.save(buf, "PNG", **({} if bits is None else {"bits": bits}))
        assert buf.getvalue()[24] == (bits or 1)
        pngs.append(buf.getvalue())
    pngs.append(png_of_zeros(17, 12))  # an 8-bit PNG in the same column
    manifest = one_shard(tmp_path / "png", [(f"k{i}", {"png": p}) for i, p in enumerate(pngs)])
    batches, _ = read(manifest)
    got = batches[0]["png"]
    assert got.dtype == np.uint8 and got.shape == (4, 12, 17, 3)
    for i, p in enumerate(pngs):
        np.testing.assert_array_equal(got[i], np.asarray(Image.open(io.BytesIO(p)).convert("RGB")))


def _smooth(h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([128 + 100 * np.sin(x / 37 + c) * np.cos(y / 29 - c) for c in range(3)], -1)
    return np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("size,target", [((1024, 768), (128, 96)), ((1920, 1080), (224, 224)),
                                         ((640, 480), (160, 120))])
def test_scaled_jpeg_decode_within_tolerance(tmp_path, size, target):
    """A JPEG at least twice the target is decoded at 1/2, 1/4 or 1/8 scale, then resized: the pixels stay
    within test_wds_read.py's tolerance against PIL's full decode + box resize, on photo-like content and on
    noise."""
    w, h = size
    rng = np.random.default_rng(1)
    images = [_smooth(h, w, 0), rng.integers(0, 256, (h, w, 3), dtype=np.uint8)]
    data = [jpeg_bytes(img, 90) for img in images]
    manifest = one_shard(tmp_path / "s", [(f"k{i}", {"jpg": b}) for i, b in enumerate(data)])
    batches, _ = read(manifest, resize=target)
    for i, b in enumerate(data):
        ref = np.asarray(Image.open(io.BytesIO(b)).convert("RGB").resize(target, Image.BOX), np.float32)
        diff = np.abs(batches[0]["jpg"][i].astype(np.float32) - ref).mean()
        assert diff < (1.5 if i == 0 else 4), (i, diff)


def test_scaled_jpeg_decode_keeps_memory_small(tmp_path):
    """An 8192x8192 JPEG (at the pixel budget) resized to 256x256 is decoded at 1/8 scale: no 200 MB buffer."""
    buf = io.BytesIO()
    Image.new("RGB", (8192, 8192), (90, 120, 200)).save(buf, "JPEG", quality=80)
    manifest = one_shard(tmp_path / "big", [("k", {"jpg": buf.getvalue()})])
    result = in_child(manifest, resize=[256, 256], threads=1)
    assert result["error"] is None and result["keys"] == ["k"], result
    assert result["peak_mb"] < result["base_mb"] + 60, result
