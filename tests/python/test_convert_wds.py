"""`vlafeed convert SRC OUT --to wds`: LeRobot -> WebDataset shards in VLA
Foundry's robotics layout (docs/wds.md).

Checked against the source dataset read independently (pyarrow for the
tables, the frame-identity stamps make-sample paints into every frame, and
vlafeed's own LeRobotDataset decode for pixels), and read back both with
Python's tarfile/numpy/PIL and with the `webdataset` library.
"""
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import zipfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from remote_server import s3_env, upload_tree

EPISODES = 4
CAMERAS = 2
FPS = 10
W, H = 96, 64
SPS = 7
SEED = 3
PAST, FUTURE = 1, 14
T = PAST + 1 + FUTURE
OFFSETS = [-1, 0]


def run(*args, env=None, check=False):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def convert(cli, src, out, *extra, env=None):
    return run(cli, "convert", src, out, "--to", "wds", "--samples-per-shard", SPS, "--seed", SEED, "--json",
               *extra, env=env)


def summary_of(r):
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- the frame-identity stamp (src/video/identity.c), read back in Python -----

_WHITEN = [0xA5, 0x3C, 0x96, 0x5A, 0xC3, 0x69, 0x0F, 0x5A, 0xA5]


def _crc16(data):
    crc = 0xFFFF
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def read_identity(rgb):
    """(episode, frame, camera) from a stamped RGB image, or None."""
    h, w, _ = rgb.shape
    if h >= 128:
        rgb, h = rgb[: h // 2], h // 2
    out = [0] * 9
    for cell in range(72):
        col, row = cell % 9, cell // 9
        x0, x1 = col * w // 9, (col + 1) * w // 9
        y0, y1 = row * h // 8, (row + 1) * h // 8
        ix, iy = (x1 - x0) // 4, (y1 - y0) // 4
        block = rgb[y0 + iy:y1 - iy, x0 + ix:x1 - ix].astype(np.uint64)
        mean = int(block.sum() // block.size) if block.size else 128
        if 80 < mean < 176:
            return None
        if mean >= 176:
            out[cell // 8] |= 1 << (7 - cell % 8)
    out = [b ^ k for b, k in zip(out, _WHITEN)]
    crc = _crc16(out[:7])
    if out[7] != crc >> 8 or out[8] != crc & 0xFF:
        return None
    return ((out[0] << 16) | (out[1] << 8) | out[2], (out[3] << 16) | (out[4] << 8) | out[5], out[6])


# ---- fixtures -------------------------------------------------------------------

@pytest.fixture(scope="module")
def sample_ds(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("convert_src") / "ds"
    run(cli, "make-sample", root, "--episodes", EPISODES, "--cameras", CAMERAS, "--codec", "h264", "--size",
        f"{W}x{H}", "--fps", FPS, "--quiet", check=True)
    return root


@pytest.fixture(scope="module")
def truth(sample_ds):
    """The source read with pyarrow: rows per (episode, frame), lengths, tasks."""
    rows = {}
    for f in sorted(sample_ds.glob("data/*/*.parquet")):
        t = pq.read_table(f).to_pydict()
        for i in range(len(t["index"])):
            rows[(t["episode_index"][i], t["frame_index"][i])] = {k: t[k][i] for k in t}
    lengths = {}
    for (e, k) in rows:
        lengths[e] = max(lengths.get(e, 0), k + 1)
    tasks = {}
    for f in sorted(sample_ds.glob("meta/episodes/*/*.parquet")):
        t = pq.read_table(f, columns=["episode_index", "tasks"]).to_pydict()
        for e, ts in zip(t["episode_index"], t["tasks"]):
            tasks[e] = ts[0]
    return {"rows": rows, "lengths": lengths, "tasks": tasks}


@pytest.fixture(scope="module")
def converted(cli, sample_ds, tmp_path_factory):
    out = tmp_path_factory.mktemp("convert_out") / "wds"
    summary = summary_of(convert(cli, sample_ds, out))
    return out, summary


def read_tar(path):
    """[(key, [(suffix, bytes, TarInfo), ...]), ...] in file order, grouped like webdataset."""
    samples = []
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            base = m.name.rsplit("/", 1)[-1]
            key, suffix = base.split(".", 1)
            data = tf.extractfile(m).read()
            if not samples or samples[-1][0] != key:
                samples.append((key, []))
            samples[-1][1].append((suffix, data, m))
    return samples


def all_samples(out):
    shards = out / "shards"
    manifest = [json.loads(line) for line in (shards / "manifest.jsonl").read_text().split("\n")]
    result = []
    for entry in manifest:
        for key, members in read_tar(shards / (entry["shard"] + ".tar")):
            result.append((entry["shard"], key, {s: d for s, d, _ in members}))
    return manifest, result


def window(truth, e, t, column):
    n = truth["lengths"][e]
    idx = [min(max(t - PAST + i, 0), n - 1) for i in range(T)]
    return np.array([truth["rows"][(e, k)][column] for k in idx], dtype=np.float32)


# ---- layout ---------------------------------------------------------------------

def test_layout_manifest_and_tar_members(converted, truth):
    out, summary = converted
    shards = out / "shards"
    total = sum(truth["lengths"].values())
    names = sorted(p.name for p in shards.iterdir())
    n_shards = -(-total // SPS)
    assert names == sorted([f"shard_{i:06d}.tar" for i in range(n_shards)] +
                           ["manifest.jsonl", "stats.json", "processing_metadata.json", "preprocessing_config.yaml"])
    text = (shards / "manifest.jsonl").read_text()
    assert not text.endswith("\n")  # VLA Foundry joins lines with \n, no trailing newline
    manifest = [json.loads(line) for line in text.split("\n")]
    assert [m["shard"] for m in manifest] == [f"shard_{i:06d}" for i in range(n_shards)]
    assert [m["num_sequences"] for m in manifest] == [SPS] * (n_shards - 1) + [total - SPS * (n_shards - 1)]
    cams = [f"cam{c}" for c in range(CAMERAS)]
    expected_order = [f"{c}_t{o}.jpg" for o in OFFSETS for c in cams] + \
        ["lowdim.npz", "metadata.json", "language_instructions.json"]
    for m in manifest:
        path = shards / (m["shard"] + ".tar")
        raw = path.read_bytes()
        assert raw[257:263] == b"ustar\x00" and raw[263:265] == b"00"  # POSIX ustar, no pax needed here
        samples = read_tar(path)
        assert len(samples) == m["num_sequences"]
        for key, members in samples:
            assert re.fullmatch(r"[0-9a-f]{32}", key)
            assert [s for s, _, _ in members] == expected_order
            for _, _, info in members:
                assert info.isreg() and info.mode == 0o644 and info.uid == 0 and info.gid == 0 and info.mtime == 0
    assert summary["samples"] == total and summary["shards"] == n_shards


def test_every_sample_present_exactly_once(converted, truth):
    out, _ = converted
    _, samples = all_samples(out)
    seen = [(int(json.loads(m["metadata.json"])["episode_index"]), int(json.loads(m["metadata.json"])["frame_index"]))
            for _, _, m in samples]
    assert len(seen) == len(set(seen))
    assert set(seen) == set(truth["rows"])
    keys = [k for _, k, _ in samples]
    assert len(set(keys)) == len(keys)


def test_lowdim_windows_masks_and_padding(converted, truth):
    out, _ = converted
    _, samples = all_samples(out)
    edge_cases = 0
    for _, _, m in samples:
        meta = json.loads(m["metadata.json"])
        e, t = int(meta["episode_index"]), int(meta["frame_index"])
        n = truth["lengths"][e]
        z = np.load(io.BytesIO(m["lowdim.npz"]))
        assert sorted(z.files) == ["action", "future_mask", "observation.state", "past_mask"]
        with zipfile.ZipFile(io.BytesIO(m["lowdim.npz"])) as zf:  # what np.savez_compressed writes
            for info in zf.infolist():
                assert info.compress_type == zipfile.ZIP_DEFLATED
                buf = io.BytesIO()
                np.save(buf, z[info.filename[:-4]])
                assert zf.read(info) == buf.getvalue()
        for col in ("observation.state", "action"):
            assert z[col].dtype == np.float32 and z[col].shape == (T, 6)
            np.testing.assert_array_equal(z[col], window(truth, e, t, col))
        src = [t - PAST + i for i in range(T)]
        padded = [s < 0 or s >= n for s in src]
        assert z["past_mask"].dtype == np.bool_ and z["future_mask"].dtype == np.bool_
        assert z["past_mask"].tolist() == [i < PAST and not padded[i] for i in range(T)]
        assert z["future_mask"].tolist() == [i >= PAST and not padded[i] for i in range(T)]
        if t == 0:  # the doc's example: anchor at frame 0 -> past_mask all False, future_mask[0] True... at the anchor
            assert not z["past_mask"].any() and z["future_mask"][PAST]
            edge_cases += 1
        if t == n - 1:
            assert z["future_mask"].tolist() == [i == PAST for i in range(T)]
            edge_cases += 1
    assert edge_cases == 2 * EPISODES


def test_metadata_and_language(converted, truth):
    out, _ = converted
    _, samples = all_samples(out)
    for _, _, m in samples:
        meta = json.loads(m["metadata.json"])
        e, t = int(meta["episode_index"]), int(meta["frame_index"])
        row = truth["rows"][(e, t)]
        assert list(meta) == ["camera_names", "anchor_relative_idx", "episode_index", "frame_index", "index",
                              "timestamp", "task_index", "original_image_sizes"]
        assert meta["camera_names"] == ["cam0", "cam1"]
        assert meta["anchor_relative_idx"] == PAST
        # the index columns as strings, like VLA Foundry's json.dumps(default=str) of numpy scalars
        assert meta["episode_index"] == str(np.int64(row["episode_index"]))
        assert meta["index"] == str(np.int64(row["index"]))
        assert meta["task_index"] == str(np.int64(row["task_index"]))
        assert meta["timestamp"] == str(np.float32(row["timestamp"]))
        assert meta["original_image_sizes"] == {"cam0": [W, H], "cam1": [W, H]}
        assert json.loads(m["language_instructions.json"]) == {"original": truth["tasks"][e]}


def test_images_are_the_right_frames(converted, truth, sample_ds):
    out, _ = converted
    _, samples = all_samples(out)
    for _, _, m in samples:
        meta = json.loads(m["metadata.json"])
        e, t = int(meta["episode_index"]), int(meta["frame_index"])
        n = truth["lengths"][e]
        for off in OFFSETS:
            for c in range(CAMERAS):
                img = np.asarray(Image.open(io.BytesIO(m[f"cam{c}_t{off}.jpg"])).convert("RGB"))
                assert img.shape == (H, W, 3)
                assert read_identity(img) == (e, min(max(t + off, 0), n - 1), c)


def test_jpeg_pixels_close_to_vlafeed_decode(converted, sample_ds):
    vlafeed = pytest.importorskip("vlafeed")
    out, _ = converted
    _, samples = all_samples(out)
    ds = vlafeed.LeRobotDataset(str(sample_ds))
    lengths = {}
    for _, _, m in samples[:40]:
        meta = json.loads(m["metadata.json"])
        index = int(meta["index"])
        item = ds[index]
        for c in range(CAMERAS):
            frame = item[f"observation.images.cam{c}"]
            ref = np.round(np.asarray(frame).transpose(1, 2, 0) * 255).astype(np.int16)
            img = np.asarray(Image.open(io.BytesIO(m[f"cam{c}_t0.jpg"])).convert("RGB")).astype(np.int16)
            mae = np.abs(img - ref).mean()
            assert mae < 4.0, (meta, c, mae)  # JPEG q95 of the same frame
            lengths[c] = lengths.get(c, 0) + 1
    assert lengths == {0: 40, 1: 40}


def test_stats_json_matches_the_windows(converted, truth):
    out, _ = converted
    stats = json.loads((out / "shards" / "stats.json").read_text())
    assert sorted(stats) == ["action", "observation.state"]
    for col in ("observation.state", "action"):
        values = [[] for _ in range(T)]
        for (e, t) in truth["rows"]:
            n = truth["lengths"][e]
            w = window(truth, e, t, col).astype(np.float64)
            for i in range(T):
                if 0 <= t - PAST + i < n:
                    values[i].append(w[i])
        s = stats[col]
        assert s["count"] == [len(v) for v in values]
        allv = np.concatenate([np.array(v) for v in values if v])
        np.testing.assert_allclose(s["mean"], allv.mean(0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(s["std"], allv.std(0), rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(s["min"], allv.min(0))
        np.testing.assert_array_equal(s["max"], allv.max(0))
        for i in range(T):
            v = np.array(values[i])
            np.testing.assert_allclose(s["mean_per_timestep"][i], v.mean(0), rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(s["std_per_timestep"][i], v.std(0), rtol=1e-9, atol=1e-12)
            np.testing.assert_array_equal(s["min_per_timestep"][i], v.min(0))
            np.testing.assert_array_equal(s["max_per_timestep"][i], v.max(0))


def test_config_metadata_and_decode_once(converted, truth):
    out, summary = converted
    shards = out / "shards"
    cfg = (shards / "preprocessing_config.yaml").read_text()
    # flat "key: value" lines whose values are JSON (flow lists with quoted strings), so any YAML reader agrees
    c = {}
    for line in cfg.splitlines():
        if line and not line.startswith("#"):
            k, v = line.split(": ", 1)
            c[k] = json.loads(v) if v[0] in '[-0123456789"n' else v
    assert c["past_lowdim_steps"] == PAST and c["future_lowdim_steps"] == FUTURE
    assert c["image_indices"] == OFFSETS and c["camera_names"] == ["cam0", "cam1"]
    pm = json.loads((shards / "processing_metadata.json").read_text())
    assert pm["options"]["samples_per_shard"] == SPS and pm["options"]["seed"] == SEED
    assert pm["total_samples"] == summary["samples"] and pm["num_shards"] == summary["shards"]
    # with offsets -1, 0 every frame is used by some sample: each decoded once, encoded once
    frames = sum(truth["lengths"].values()) * CAMERAS
    assert summary["frames_needed"] == frames
    assert summary["frames_decoded"] == frames
    assert summary["jpegs_encoded"] == frames
    assert not (shards / ".vlafeed-convert").exists()


# ---- interop with the webdataset library ------------------------------------------

def test_webdataset_library_reads_identical_values(converted):
    wds = pytest.importorskip("webdataset")
    out, _ = converted
    manifest, samples = all_samples(out)
    urls = [str(out / "shards" / (m["shard"] + ".tar")) for m in manifest]
    got = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8"))
    assert [s["__key__"] for s in got] == [k for _, k, _ in samples]
    for s, (_, _, raw) in zip(got, samples):
        assert set(s) - {"__key__", "__url__", "__local_path__"} == set(raw)
        z = np.load(io.BytesIO(raw["lowdim.npz"]))
        assert sorted(s["lowdim.npz"]) == sorted(z.files)
        for name in z.files:
            assert s["lowdim.npz"][name].dtype == z[name].dtype
            assert s["lowdim.npz"][name].tobytes() == z[name].tobytes()
        assert s["metadata.json"] == json.loads(raw["metadata.json"])
        assert s["language_instructions.json"] == json.loads(raw["language_instructions.json"])
        for name in raw:
            if name.endswith(".jpg"):
                mine = np.asarray(Image.open(io.BytesIO(raw[name])).convert("RGB"))
                np.testing.assert_array_equal(s[name], mine)


# ---- order, determinism, resume, refusal ----------------------------------------

def tree_bytes(out):
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_shuffle_is_a_pure_function_of_the_seed(cli, sample_ds, converted, tmp_path):
    out, _ = converted
    again = tmp_path / "again"
    summary_of(convert(cli, sample_ds, again, "--threads", "1"))
    assert tree_bytes(again) == tree_bytes(out)  # byte-identical, whatever the thread count
    other = tmp_path / "other"
    r = run(cli, "convert", sample_ds, other, "--to", "wds", "--samples-per-shard", SPS, "--seed", SEED + 1, "--json")
    summary_of(r)
    _, a = all_samples(out)
    _, b = all_samples(other)
    order_a = [(json.loads(m["metadata.json"])["episode_index"], json.loads(m["metadata.json"])["frame_index"])
               for _, _, m in a]
    order_b = [(json.loads(m["metadata.json"])["episode_index"], json.loads(m["metadata.json"])["frame_index"])
               for _, _, m in b]
    assert sorted(order_a) == sorted(order_b) and order_a != order_b
    # globally shuffled: the first shard mixes episodes, and the order is not the source order
    first = {e for e, _ in order_a[:SPS * 3]}
    assert len(first) > 1 and order_a != sorted(order_a, key=lambda x: (int(x[0]), int(x[1])))


@pytest.mark.parametrize("kill_at", ["decode:1", "decode:2", "assemble:3"])
def test_resume_after_a_killed_run_gives_identical_output(cli, sample_ds, converted, tmp_path, kill_at):
    out, _ = converted
    partial = tmp_path / "partial"
    env = dict(os.environ, VF_CONVERT_KILL_AFTER=kill_at)
    r = convert(cli, sample_ds, partial, "--threads", "1", env=env)
    assert r.returncode == -9, (r.returncode, r.stderr)  # SIGKILL: nothing was cleaned up
    state = partial / "shards" / ".vlafeed-convert"
    assert state.is_dir() and not (partial / "shards" / "processing_metadata.json").exists()
    if kill_at.startswith("assemble"):
        # a kept shard damaged in between is detected (size/CRC-32) and made again
        victim = partial / "shards" / "shard_000001.tar"
        victim.write_bytes(victim.read_bytes()[:-512])
    s = summary_of(convert(cli, sample_ds, partial))
    if kill_at.startswith("decode"):
        assert s["units_resumed"] == int(kill_at.split(":")[1])
    else:
        assert s["shards_kept"] == 2 and s["units_resumed"] == s["units"]
    assert tree_bytes(partial) == tree_bytes(out)


def test_refuses_changed_options_and_rechecks_a_complete_output(cli, sample_ds, converted, tmp_path):
    partial = tmp_path / "partial"
    env = dict(os.environ, VF_CONVERT_KILL_AFTER="decode:1")
    assert convert(cli, sample_ds, partial, "--threads", "1", env=env).returncode == -9
    r = convert(cli, sample_ds, partial, "--jpeg-quality", "80")
    assert r.returncode == 1
    assert "different options: jpeg_quality was 95, now 80" in r.stderr
    # a converter already writing this output (holding the lock) is not joined by a second one
    import fcntl
    with open(partial / "shards" / ".vlafeed-convert" / "lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = convert(cli, sample_ds, partial)
        assert r.returncode == 1 and "another vlafeed convert is writing this output" in r.stderr
    summary_of(convert(cli, sample_ds, partial))  # and once it is free, the resume works
    # a complete output: same options -> verified and kept; other options -> refused
    out, _ = converted
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    s = summary_of(convert(cli, sample_ds, copy))
    assert s["already_complete"] is True and s["shards_written"] == 0
    r = run(cli, "convert", sample_ds, copy, "--to", "wds", "--samples-per-shard", SPS + 1, "--seed", SEED)
    assert r.returncode == 1 and "samples_per_shard was 7, now 8" in r.stderr
    shard = copy / "shards" / "shard_000004.tar"
    data = bytearray(shard.read_bytes())
    data[700] ^= 0xFF
    shard.write_bytes(bytes(data))
    r = convert(cli, sample_ds, copy)
    assert r.returncode == 1 and "shard_000004.tar" in r.stderr and "CRC-32" in r.stderr


def test_bad_sources_and_options(cli, sample_ds, tmp_path):
    r = run(cli, "convert", tmp_path / "nope", tmp_path / "o", "--to", "wds")
    assert r.returncode == 1 and "nope" in r.stderr
    # a missing camera file: the open names it
    broken = tmp_path / "broken"
    shutil.copytree(sample_ds, broken)
    mp4 = sorted(broken.glob("videos/observation.images.cam1/*/*.mp4"))[0]
    mp4.unlink()
    r = run(cli, "convert", broken, tmp_path / "o2", "--to", "wds")
    assert r.returncode == 1 and mp4.name in r.stderr
    # a corrupt camera file: the error names the file
    shutil.copytree(sample_ds, tmp_path / "corrupt")
    mp4 = sorted((tmp_path / "corrupt").glob("videos/observation.images.cam0/*/*.mp4"))[0]
    mp4.write_bytes(mp4.read_bytes()[: mp4.stat().st_size // 3])
    r = run(cli, "convert", tmp_path / "corrupt", tmp_path / "o3", "--to", "wds", "--quiet")
    assert r.returncode == 1 and mp4.name in r.stderr
    assert not (tmp_path / "o3" / "shards" / "processing_metadata.json").exists()
    # a foreign, non-empty shards/ folder is not touched
    foreign = tmp_path / "foreign" / "shards"
    foreign.mkdir(parents=True)
    (foreign / "mine.txt").write_text("keep me")
    r = run(cli, "convert", sample_ds, tmp_path / "foreign", "--to", "wds")
    assert r.returncode == 1 and "not a vlafeed conversion" in r.stderr and "mine.txt" in r.stderr
    r = run(cli, "convert", sample_ds, tmp_path / "o4", "--to", "wds", "--cameras", "nosuch")
    assert r.returncode == 1 and "no camera 'nosuch'" in r.stderr and "observation.images.cam0" in r.stderr
    for bad in (["--jpeg-quality", "0"], ["--resize", "10"], ["--image-offsets", "a,b"], ["--samples-per-shard", "0"],
                ["--bogus"]):
        r = run(cli, "convert", sample_ds, tmp_path / "o5", "--to", "wds", *bad)
        assert r.returncode == 2, bad
        assert bad[0] in r.stderr
    r = run(cli, "convert", "--to", "wds", "--help")
    assert r.returncode == 0 and "Memory is bounded" in r.stdout


def test_options_resize_cameras_offsets(cli, sample_ds, truth, tmp_path):
    out = tmp_path / "small"
    s = summary_of(run(cli, "convert", sample_ds, out, "--to", "wds", "--resize", "48x32", "--cameras", "cam1",
                       "--image-offsets", "0,-2", "--past", "0", "--future", "3", "--samples-per-shard", "50",
                       "--json"))
    assert s["cameras"] == ["cam1"]
    _, samples = all_samples(out)
    assert len(samples) == sum(truth["lengths"].values())
    for _, key, m in samples[:30]:
        assert sorted(m) == sorted(["cam1_t-2.jpg", "cam1_t0.jpg", "lowdim.npz", "metadata.json",
                                    "language_instructions.json"])
        img = np.asarray(Image.open(io.BytesIO(m["cam1_t0.jpg"])).convert("RGB"))
        assert img.shape == (32, 48, 3)
        # 96x64 -> 48x32 is a plain 2x downscale (no crop), so the stamp still reads
        meta = json.loads(m["metadata.json"])
        assert read_identity(img) == (int(meta["episode_index"]), int(meta["frame_index"]), 1)
        assert meta["original_image_sizes"] == {"cam1": [W, H]} and meta["anchor_relative_idx"] == 0
        z = np.load(io.BytesIO(m["lowdim.npz"]))
        assert z["action"].shape == (4, 6)
    # frames that no sample uses are not decoded: with offsets -2, 0 the last frame is used, so all are
    assert s["frames_decoded"] == s["frames_needed"] == sum(truth["lengths"].values())


def test_real_fixture_v21_av1(cli, g1_dir, tmp_path):
    """A real LeRobot v2.1 dataset (AV1 640x480), one episode, read in place."""
    if not (g1_dir / "videos").is_dir():
        pytest.skip("fixture videos absent")
    out = tmp_path / "g1"
    s = summary_of(run(cli, "convert", g1_dir, out, "--to", "wds", "--episodes", "2", "--resize", "128x96",
                       "--samples-per-shard", "64", "--json", "--quiet"))
    table = pq.read_table(g1_dir / "data" / "chunk-000" / "episode_000002.parquet").to_pydict()
    n = len(table["index"])
    assert s["samples"] == n and s["frames_decoded"] == n
    wds = pytest.importorskip("webdataset")
    manifest, samples = all_samples(out)
    urls = [str(out / "shards" / (m["shard"] + ".tar")) for m in manifest]
    got = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8"))
    assert len(got) == n
    for g in got:
        meta = g["metadata.json"]
        t = int(meta["frame_index"])
        assert meta["episode_index"] == "2" and meta["original_image_sizes"] == {"cam_high": [640, 480]}
        assert meta["timestamp"] == str(np.float32(table["timestamp"][t]))
        assert g["cam_high_t0.jpg"].shape == (96, 128, 3)
        want = np.array([table["observation.state"][min(max(t - 1 + i, 0), n - 1)] for i in range(16)],
                        dtype=np.float32)
        np.testing.assert_array_equal(g["lowdim.npz"]["observation.state"], want)


def test_s3_source_gives_the_same_shards(cli, sample_ds, converted, tmp_path, moto_endpoint):
    """s3:// through moto's server: the shards equal the local conversion's, byte for byte."""
    upload_tree(moto_endpoint, "vf-convert", sample_ds, "ds")
    env = dict(os.environ, **s3_env(moto_endpoint))
    out = tmp_path / "s3"
    summary_of(convert(cli, "s3://vf-convert/ds", out, env=env))
    r = convert(cli, "s3://vf-convert/nope", tmp_path / "s3-nope", env=env)
    assert r.returncode == 1 and "s3://vf-convert/nope" in r.stderr
    local, _ = converted
    a, b = tree_bytes(local), tree_bytes(out)
    assert sorted(a) == sorted(b)
    for name in a:
        if name.endswith("processing_metadata.json"):
            ja, jb = json.loads(a[name]), json.loads(b[name])
            assert jb["source"] == "s3://vf-convert/ds"
            ja.pop("source"), jb.pop("source")
            assert ja == jb
        else:
            assert a[name] == b[name], name


def test_many_shards_share_spill_buckets(cli, sample_ds, truth, tmp_path):
    """More shards than spill buckets (256): buckets hold consecutive shards; a kill in the middle of a
    bucket resumes with the bucket's finished shard kept and the rest made."""
    full = tmp_path / "full"
    s = summary_of(run(cli, "convert", sample_ds, full, "--to", "wds", "--samples-per-shard", "1", "--json"))
    total = sum(truth["lengths"].values())
    assert s["shards"] == total > 256
    manifest, samples = all_samples(full)
    assert [m["num_sequences"] for m in manifest] == [1] * total and len(samples) == total
    seen = {(json.loads(m["metadata.json"])["episode_index"], json.loads(m["metadata.json"])["frame_index"])
            for _, _, m in samples}
    assert len(seen) == total
    part = tmp_path / "part"
    env = dict(os.environ, VF_CONVERT_KILL_AFTER="assemble:51")  # bucket 25 = shards 50, 51: stop between them
    r = run(cli, "convert", sample_ds, part, "--to", "wds", "--samples-per-shard", "1", "--threads", "1", env=env)
    assert r.returncode == -9
    s = summary_of(run(cli, "convert", sample_ds, part, "--to", "wds", "--samples-per-shard", "1", "--json"))
    assert s["shards_kept"] == 51 and s["shards_written"] == total - 51
    assert tree_bytes(part) == tree_bytes(full)
