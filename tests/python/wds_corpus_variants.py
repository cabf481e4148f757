"""The WebDataset part of the corruption corpus (test_wds_corpus.py): name ->
(a builder of a damaged or hostile shard set, the expected outcome). The
shard sets come from the builders of the WDS tests (test_wds_errors.build,
test_wds_bombs.one_shard, test_wds_parse_errors.shard_set and the
wds_helpers writers), damaged here.

A builder takes an empty folder and returns the manifest's path. Outcomes:

  Ok(samples, check)       every sample is delivered; check(keys, columns),
                           when given, looks at the data itself.
  Refused(pattern, delivered, python_only)
                           reading raises VlafeedError matching pattern
                           (which names the shard and, for a sample, the
                           member and the key); under on_error="skip" the
                           other samples are delivered (`delivered` of
                           them, an int or an inclusive (low, high) range)
                           and a skip message matches pattern. python_only:
                           the member is parsed in Python (.json, .txt,
                           .pth), so the C-only CLI, which hands such
                           members on as bytes, reads the set whole.
  OpenRefused(pattern, error, skip_delivered)
                           constructing the loader raises `error` matching
                           pattern (the manifest, its line and the shard);
                           under on_error="skip" the same, or, when
                           skip_delivered is set, that many samples with
                           the refusal counted as a skipped shard.

Variant.options are ShardLoader keywords (fields=...) the case needs;
Variant.ray marks the cheap subset also read through vlafeed.ray.read_wds.
"""
import io
import json
import os
import random
import re
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

import vlafeed

import test_wds_bombs as bombs
import test_wds_errors as errors
import test_wds_parse_errors as parse_errors
from wds_helpers import (foundry_sample, gnu_sparse_member, gzip_with_zeros, jpeg_declaring, npz_bytes,
                         npz_with_zeros, png_bytes, png_of_zeros, tar_header, write_manifest, write_tar,
                         write_tar_with_holes)

GIB = 1 << 30
ALL_KEYS = errors.all_keys()  # the foundry set: 3 shards x 4 samples


@dataclass
class Ok:
    samples: int
    check: object = None


@dataclass
class Refused:
    pattern: str
    delivered: object
    python_only: bool = False


@dataclass
class OpenRefused:
    pattern: str
    error: type = Exception
    skip_delivered: int = None


@dataclass
class Variant:
    build: object
    expect: object
    options: dict = field(default_factory=dict)
    ray: bool = False


def _npy(array, **kw):
    buf = io.BytesIO()
    np.save(buf, array, **kw)
    return buf.getvalue()


# ---- the foundry set (test_wds_errors.build), damaged ---------------------------------------------------

def _foundry(damage=None, counts=None):
    return lambda d: errors.build(d, damage, counts)


def _edit_member(shard, index, suffix, edit):
    """A test_wds_errors damage hook: edit(bytes) -> bytes for one member of one sample."""
    def damage(s, i, members):
        if (s, i) != (shard, index):
            return members
        return [(n, edit(b) if n.endswith(suffix) else b) for n, b in members]
    return damage


def _flip(offset):
    def edit(data):
        data = bytearray(data)
        data[offset] ^= 0xFF
        return bytes(data)
    return edit


def _rewrite_shard(shard, make):
    """The foundry set with shard `shard`'s file replaced by make(old bytes)."""
    def build(d):
        manifest = errors.build(d)
        path = d / f"shard_{shard:06d}.tar"
        path.write_bytes(make(path.read_bytes()))
        return manifest
    return build


def _missing(d):
    manifest = errors.build(d)
    os.unlink(d / "shard_000001.tar")
    return manifest


def _bad_header_checksum(data):
    name = (errors.KEY.format(s=2, i=1) + ".top_t-1.jpg").encode()
    data = bytearray(data)
    data[data.index(name) + 3] ^= 0x20
    return bytes(data)


def _drop_field(s, i, members):
    return [m for m in members if not m[0].endswith("metadata.json")] if (s, i) == (1, 2) else members


def _duplicate_suffix(s, i, members):
    return members + [members[-1]] if (s, i) == (1, 1) else members


def _sizes_differ(d):
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    members = foundry_sample(rng, "a", 0, cams=("top",), size=(16, 16))
    members += foundry_sample(rng, "b", 0, cams=("top",), size=(20, 16))
    write_tar(d / "shard_000000.tar", members)
    return str(write_manifest(d, [2]))


def _keys_in_order(keys, columns):
    assert keys == ALL_KEYS


SHARD = r"\S*shard_0000{}\.tar"
# members parsed in Python name the shard as the loader's manifest lists it: the stem for ShardLoader, the
# resolved path in a vlafeed.ray task (its private manifest lists paths)
PARSED = r"\S*shard_000000(\.tar)?"
K = errors.KEY.format


def _member(shard, s, i, suffix):
    """The regex of a refusal naming foundry sample (s, i)'s member `suffix` in shard `shard` ("01")."""
    key = K(s=s, i=i)
    return SHARD.format(shard) + rf": member {key}\.{re.escape(suffix)} \(key {key}\)"


# ---- single-shard sets (test_wds_bombs.one_shard): bad members and bombs --------------------------------

NPY_GOOD = {"npy": _npy(np.arange(3.0)), "cls": b"1"}


def _one(samples, writer=write_tar, count=None):
    return lambda d: bombs.one_shard(d, samples() if callable(samples) else samples, count=count, writer=writer)


def _bomb_first(bomb_fields, good_fields=None):
    return lambda: bombs.with_good_neighbours(bomb_fields, good_fields)


def _corrupt_png():
    png = bytearray(png_bytes(np.random.default_rng(1).integers(0, 256, (12, 16, 3), dtype=np.uint8)))
    png[png.index(b"IDAT") + 10] ^= 0xFF
    return bytes(png)


def _sparse_set(d):
    """bomb.bin is a GNU sparse member expanding to 1 GiB; a1, a2 are fine."""
    d.mkdir(parents=True, exist_ok=True)
    blocks = []
    for key in ("bomb", "a1", "a2"):
        blocks.append(tar_header(f"{key}.cls", 1) + b"1" + bytes(511))
        blocks.append(gnu_sparse_member(f"{key}.bin", GIB) if key == "bomb"
                      else tar_header(f"{key}.bin", 3) + b"abc" + bytes(509))
    (d / "shard_000000.tar").write_bytes(b"".join(blocks) + bytes(1024))
    return str(write_manifest(d, [3]))


def _gzip_unrequested(d):
    """A ~1 MB gzip'd tar whose a1 has a 1 GiB member that is not a field."""
    d.mkdir(parents=True, exist_ok=True)
    jpg = bombs.small_jpeg()
    pieces = []
    for key in ("a0", "a1", "a2"):
        pieces += [tar_header(f"{key}.jpg", len(jpg)), jpg + bytes(-len(jpg) % 512)]
        if key == "a1":
            pieces += [tar_header("a1.video.bin", GIB), GIB]
    (d / "shard_000000.tar").write_bytes(gzip_with_zeros(pieces + [bytes(1024)]))
    return str(write_manifest(d, [3]))


def _manifest_text(text, build=None):
    """A set (build, default a one-sample shard) whose manifest.jsonl is replaced by `text`."""
    def make(d):
        (build or _one([("k", {"cls": b"1"})]))(d)
        (d / "manifest.jsonl").write_text(text)
        return str(d / "manifest.jsonl")
    return make


def _zero_count(d):
    d.mkdir(parents=True, exist_ok=True)
    for s in range(2):
        write_tar(d / f"shard_{s:06d}.tar", [(f"s{s}k{i}.cls", b"%d" % i) for i in range(3)])
    return str(write_manifest(d, [3, 0]))


def _escape(shard):
    """A manifest in d/set/ naming `shard` (formatted with d), next to a real shard set in d/outside/."""
    def build(d):
        errors.build(d / "outside")
        (d / "set").mkdir()
        text = json.dumps({"shard": shard.format(d=d), "num_sequences": 4})
        (d / "set" / "manifest.jsonl").write_text(text)
        return str(d / "set" / "manifest.jsonl")
    return build


ONE_BIT = [Image.fromarray(np.random.default_rng(i).integers(0, 2, (12, 17), dtype=np.uint8) * 255).convert("1")
           for i in range(3)]


def _png_of(image):
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def _one_bit_pixels(keys, columns):
    assert keys == ["k0", "k1", "k2"]
    for i, image in enumerate(ONE_BIT):
        np.testing.assert_array_equal(columns["png"][i], np.asarray(image.convert("RGB")))


def _parse_error(field_name):
    def build(d):
        d.mkdir(parents=True)
        manifest = parse_errors.shard_set(d, field_name)
        return str(manifest)
    return build


VARIANTS = {
    # -- the tar and the manifest counts
    "good_set": Variant(_foundry(), Ok(12, _keys_in_order), ray=True),
    "truncated_tar": Variant(_rewrite_shard(1, lambda b: b[: len(b) // 2 + 100]),
                             Refused(_member("01", 1, 2, "top_t0.jpg") + ": Truncated tar archive", 10), ray=True),
    "bad_header_checksum": Variant(_rewrite_shard(2, _bad_header_checksum), Refused(SHARD.format("02"), 8)),
    "random_bytes_shard": Variant(_rewrite_shard(1, lambda b: random.Random(1).randbytes(len(b))),
                                  Refused(SHARD.format("01") + ": Unrecognized archive format", 8)),
    "empty_shard_file": Variant(_rewrite_shard(1, lambda b: b""),
                                OpenRefused(r"manifest\.jsonl:2: shard " + SHARD.format("01") + r": num_sequences 4 "
                                            r"cannot be right: the file has 0 bytes", vlafeed.VlafeedError)),
    "missing_shard": Variant(_missing,
                             Refused(SHARD.format("01"), 8), ray=True),
    "count_above_tar": Variant(_foundry(counts=[4, 6, 4]),
                               Refused(SHARD.format("01") + ": ends after 4 samples, the manifest's num_sequences "
                                       "is 6", 12)),
    "count_below_tar": Variant(_foundry(counts=[4, 3, 4]),
                               Refused(SHARD.format("01") + r": more samples than the manifest's num_sequences 3 "
                                       r"\(first extra key " + K(s=1, i=3) + r"\)", 11)),
    "missing_field": Variant(_foundry(_drop_field),
                             Refused(SHARD.format("01") + r": .*key " + K(s=1, i=2) + r".*missing field "
                                     r"metadata\.json", 11)),
    "duplicate_suffix": Variant(_foundry(_duplicate_suffix),
                                Refused(_member("01", 1, 1, "language_instructions.json") + ": duplicate suffix", 9)),
    "corrupt_jpeg": Variant(_foundry(_edit_member(0, 3, "top_t0.jpg", lambda b: b[: len(b) // 2])),
                            Refused(_member("00", 0, 3, "top_t0.jpg") + ": .*JPEG", 11), ray=True),
    "corrupt_npz": Variant(_foundry(_edit_member(2, 0, "lowdim.npz", _flip(60))),
                           Refused(_member("02", 2, 0, "lowdim.npz") + ": .*npz", 11)),
    "image_sizes_differ": Variant(_sizes_differ,
                                  Refused(r"member b\.top_t-1\.jpg \(key b\): image 20x16.*resize=", 1)),
    # -- members decoded in C
    "bad_npy_header": Variant(_one(_bomb_first({"npy": b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', "
                                                       b"'shape': (3,), }"}, NPY_GOOD)),
                              Refused(SHARD.format("00") + r": member bomb\.npy \(key bomb\): \.npy header", 2)),
    "corrupt_png": Variant(_one(_bomb_first({"png": _corrupt_png()}, {"png": png_of_zeros(16, 12), "cls": b"1"})),
                           Refused(SHARD.format("00") + r": member bomb\.png \(key bomb\): PNG", 2)),
    "bad_cls": Variant(_one(_bomb_first({"cls": b"one"}, NPY_GOOD)),
                       Refused(SHARD.format("00") + r": member bomb\.cls \(key bomb\): not an integer", 2)),
    "one_bit_png": Variant(_one([(f"k{i}", {"png": _png_of(im)}) for i, im in enumerate(ONE_BIT)]),
                           Ok(3, _one_bit_pixels)),
    # -- bombs, at the default budgets
    "jpeg_bomb_30000": Variant(_one(_bomb_first({"jpg": jpeg_declaring(30000, 30000)})),
                               Refused(r"member bomb\.jpg \(key bomb\): image 30000x30000 .*max_image_pixels", 2),
                               {"fields": "jpg,cls"}),
    "jpeg_bomb_60000": Variant(_one(_bomb_first({"jpg": jpeg_declaring(60000, 60000)})),
                               Refused(r"member bomb\.jpg \(key bomb\): image 60000x60000 .*max_image_pixels", 2),
                               {"fields": "jpg,cls"}),
    "png_bomb_8bit": Variant(_one(_bomb_first({"png": png_of_zeros(20000, 20000)},
                                              {"png": png_of_zeros(16, 12), "cls": b"1"})),
                             Refused(r"member bomb\.png \(key bomb\): image 20000x20000 .*max_image_pixels", 2),
                             {"fields": "png,cls"}),
    "png_bomb_1bit": Variant(_one(_bomb_first({"png": png_of_zeros(20000, 20000, bit_depth=1)},
                                              {"png": png_of_zeros(16, 12), "cls": b"1"})),
                             Refused(r"member bomb\.png \(key bomb\): image 20000x20000 .*max_image_pixels", 2),
                             {"fields": "png,cls"}),
    "npz_bomb_1gib": Variant(_one(_bomb_first({"lowdim.npz": npz_with_zeros("state", (GIB // 4 - 32,))},
                                              {"lowdim.npz": npz_bytes({"state": np.zeros(64, np.float32)})})),
                             Refused(r"member bomb\.lowdim\.npz \(key bomb\): npz member state\.npy: .*"
                                     r"max_member_bytes", 2)),
    "tar_member_1gib": Variant(_one([("bomb", {"npy": GIB}), ("a1", {"npy": NPY_GOOD["npy"]}),
                                     ("a2", {"npy": NPY_GOOD["npy"]})], writer=write_tar_with_holes),
                               Refused(r"member bomb\.npy \(key bomb\): 1073741824 bytes, above max_member_bytes", 2)),
    "gnu_sparse_1gib": Variant(_sparse_set,
                               Refused(r"member bomb\.bin \(key bomb\): 1073741824 bytes \(a sparse member", 2),
                               {"fields": "cls,bin"}),
    "unrequested_1gib_member": Variant(_one([("a0", {"jpg": bombs.small_jpeg()}),
                                             ("a1", {"jpg": bombs.small_jpeg(), "video.bin": GIB}),
                                             ("a2", {"jpg": bombs.small_jpeg()})], writer=write_tar_with_holes),
                                       Ok(3), {"fields": "jpg"}),
    "gzip_unrequested_1gib_member": Variant(_gzip_unrequested, Ok(3), {"fields": "jpg"}),
    # -- the manifest
    "manifest_count_1e9": Variant(_manifest_text('{"shard": "shard_000000", "num_sequences": 1e9}\n'),
                                  OpenRefused(r"manifest\.jsonl:1: shard " + SHARD.format("00") + r": "
                                              r"num_sequences 1000000000 cannot be right", Exception)),
    "manifest_count_0_with_samples": Variant(_zero_count,
                                             OpenRefused(r"manifest\.jsonl:2: shard " + SHARD.format("01") +
                                                         r" has num_sequences 0 but its tar holds samples",
                                                         Exception, skip_delivered=3)),
    "manifest_empty": Variant(_manifest_text("\n\n"), OpenRefused(r"manifest\.jsonl: no shards listed")),
    "manifest_line_without_count": Variant(_manifest_text('{"shard": "shard_000000", "num_sequences": 1}\n'
                                                          '{"shard": "shard_000000"}\n'),
                                           OpenRefused(r"manifest\.jsonl: line 2: missing key 'num_sequences'")),
    "manifest_dotdot": Variant(_escape("../outside/shard_000000"),
                               OpenRefused(r"manifest\.jsonl:1: shard \"\.\./outside/shard_000000\" is refused: "
                                           r".*'\.\.' component", ValueError), ray=True),
    "manifest_absolute_path": Variant(_escape("{d}/outside/shard_000000.tar"),
                                      OpenRefused(r"manifest\.jsonl:1: shard \"/\S+/outside/shard_000000\.tar\" is "
                                                  r"refused: .*an absolute path", ValueError)),
    "manifest_url": Variant(_escape("http://other-host.invalid/x.tar"),
                            OpenRefused(r"manifest\.jsonl:1: shard \"http://other-host\.invalid/x\.tar\" is refused:"
                                        r" .*a URL in a local manifest", ValueError)),
    # -- members parsed in Python (test_wds_parse_errors), and an object .npy (refused in C against the
    #    batch's float .npy)
    "bad_json": Variant(_parse_error("meta.json"),
                        Refused(PARSED + r": sample 's002': field 'meta\.json': cannot parse", 5,
                                python_only=True)),
    "bad_txt": Variant(_parse_error("caption.txt"),
                       Refused(PARSED + r": sample 's002': field 'caption\.txt': cannot parse", 5,
                               python_only=True), ray=True),
    "bad_pth": Variant(_parse_error("extra.pth"),
                       Refused(PARSED + r": sample 's002': field 'extra\.pth': cannot parse", 5,
                               python_only=True)),
    "object_npy": Variant(_parse_error("state.npy"),
                          Refused(SHARD.format("00") + r": member s002\.state\.npy \(key s002\)", 5)),
}
