"""`vlafeed convert SRC OUT --to lerobot-v3 --codec h264|hevc|av1`: videos
re-encoded (NVDEC on A100/H100/H200 has no AV1).

Sources: a make-sample v3.0 dataset (AV1, 2 cameras, 3 episodes, 128x96,
two MP4 files per camera so the per-file path is exercised) and the same
episodes in v2.1 layout (v21_sample.py). What is proven on the output:
  * a v3.0 source is re-encoded only: data Parquet and every metadata file
    but info.json byte-identical, info.json's video.codec / video.pix_fmt
    (and video.g / video.crf) describe the new streams, everything else kept;
  * `vlafeed decode-check --thorough` exits 0: every file h264, every
    episode mapped by ordinal, frame counts equal, the start drift equal to
    the source's (frames keep their timestamps: the episode spans of the
    copied meta/episodes still locate every frame);
  * for every index, vlafeed.LeRobotDataset over the output returns the
    source's tabular values exactly and frames within tolerance of the
    source frames (RGB, [0, 1]: per-frame PSNR >= 30 dB, dataset mean abs
    diff <= 1.5/255) with the identity stamp (episode, frame, camera) intact;
  * a v2.1 source is converted and re-encoded in one run, with the same
    guarantees against the v2.1 source;
  * hevc and av1 targets pass decode-check too; --gop / --crf / --preset
    take effect; a depth camera (gray12le) is copied, not re-encoded;
  * errors: a source video that cannot be read (named with its file and
    camera, or episode and camera), unknown codec, an encoder missing
    (VF_ENCODERS_HIDE), bad
    --crf / --preset, options without --codec, an existing OUT (--force
    replaces it; runs are never resumed), --episodes with a v3.0 source.
The quality figures measured here are printed (pytest -s) next to the
converter's own summary.
"""
import filecmp
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import lerobot_reference as R
from v21_sample import make_v21

CAMS = ["observation.images.cam0", "observation.images.cam1"]
MIN_FRAME_PSNR_DB = 30.0
MAX_MEAN_ABS_DIFF = 1.5 / 255


def run(cli, *args, env=None, timeout=300):
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def reencode(cli, src, out, *extra, env=None):
    return run(cli, "convert", src, out, "--to", "lerobot-v3", "--quiet", *extra, env=env)


@pytest.fixture(scope="module")
def v3src(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("codec") / "v3src"
    r = run(cli, "make-sample", root, "--episodes", 3, "--cameras", 2, "--size", "128x96", "--min-length", 20,
            "--max-length", 30, "--max-video-mb", "0.03", "--seed", 3, "--quiet")
    assert r.returncode == 0, r.stderr
    return root


@pytest.fixture(scope="module")
def h264(cli, v3src):
    out = v3src.parent / "h264"
    r = reencode(cli, v3src, out, "--codec", "h264", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    print("\nv3.0 AV1 -> h264 summary:", json.dumps(summary))
    return out, summary


def all_files(root):
    return sorted(p.relative_to(root) for p in Path(root).rglob("*") if p.is_file())


def decode_check(cli, root):
    r = run(cli, "decode-check", root, "--thorough", "--json")
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else None, r.stderr


def compare_items(src_root, out_root):
    """Every index of both datasets through vlafeed.LeRobotDataset: tabular
    values equal, frames within tolerance, identity stamps intact. Returns
    (worst frame PSNR dB, mean abs diff, max abs diff) over every frame."""
    import torch
    import vlafeed
    src, out = vlafeed.LeRobotDataset(root=str(src_root)), vlafeed.LeRobotDataset(root=str(out_root))
    assert len(src) == len(out)
    worst_psnr, abs_sum, abs_n, max_abs = float("inf"), 0.0, 0, 0.0
    for i in range(len(src)):
        a, b = src[i], out[i]
        assert list(a) == list(b), i
        for k, v in a.items():
            if k in CAMS:
                continue
            if isinstance(v, str):
                assert b[k] == v, (i, k)
            else:
                assert b[k].dtype == v.dtype and torch.equal(b[k], v), (i, k)
        ep, frame = int(a["episode_index"]), int(a["frame_index"])
        for c, key in enumerate(CAMS):
            x, y = a[key].double(), b[key].double()
            assert x.shape == y.shape, (i, key)
            d = (x - y).abs()
            mse = float((d * d).mean())
            psnr = 10 * np.log10(1.0 / mse) if mse > 0 else float("inf")
            assert psnr >= MIN_FRAME_PSNR_DB, (i, key, psnr)
            worst_psnr = min(worst_psnr, psnr)
            abs_sum += float(d.sum())
            abs_n += d.numel()
            max_abs = max(max_abs, float(d.max()))
            assert R.read_identity(b[key].numpy()) == (ep, frame, c), (i, key)
    mean_abs = abs_sum / abs_n
    assert mean_abs <= MAX_MEAN_ABS_DIFF, mean_abs
    return worst_psnr, mean_abs, max_abs


# ---- v3.0 source -> h264 ---------------------------------------------------------------------------


def test_v3_source_summary(v3src, h264):
    out, s = h264
    info = json.loads((v3src / "meta/info.json").read_text())
    assert s["codec"] == "h264" and s["encoder"] == "libx264" and s["crf"] == 18 and s["gop"] == 2
    assert s["episodes"] == 3 and s["cameras"] == 2 and s["frames"] == info["total_frames"]
    assert s["encoded_frames"] == 2 * info["total_frames"]
    assert s["video_files"] == s["encoded_files"] >= 4  # two or more files per camera
    assert s["video_bytes_before"] > 0 and s["video_bytes_after"] > 0
    assert s["quality_measured"] is True and s["psnr_db"] > 36 and s["min_frame_psnr_db"] > 32
    assert s["verified"] is True
    assert not out.with_name(out.name + ".partial").exists()


def test_v3_source_files_copied_and_info_updated(v3src, h264):
    out, _ = h264
    assert all_files(out) == all_files(v3src)
    for rel in all_files(v3src):
        if rel.parts[0] == "videos" or rel == Path("meta/info.json"):
            continue
        assert filecmp.cmp(v3src / rel, out / rel, shallow=False), rel
    src = json.loads((v3src / "meta/info.json").read_text())
    got = json.loads((out / "meta/info.json").read_text())
    for key in CAMS:
        vin, vout = src["features"][key]["info"], got["features"][key]["info"]
        assert vout["video.codec"] == "h264" and vout["video.pix_fmt"] == "yuv420p"
        if "video.g" in vin:
            assert vout["video.g"] == 2
        if "video.crf" in vin:
            assert vout["video.crf"] == 18
        rest = {k for k in vin if k not in ("video.codec", "video.pix_fmt", "video.g", "video.crf", "video.preset")}
        assert {k: vout[k] for k in rest} == {k: vin[k] for k in rest}
        src["features"][key]["info"] = got["features"][key]["info"]
    assert got == src  # nothing else changed


def test_v3_source_decode_check_thorough(cli, v3src, h264):
    out, _ = h264
    rc_src, rep_src, _ = decode_check(cli, v3src)
    rc, rep, err = decode_check(cli, out)
    assert rc == 0, err
    assert rep["errors"] == 0
    drift_src = {(f["file"], e["episode"]): e["drift_ms"]
                 for cam in rep_src["cameras"] for f in cam["files"] for e in f["episodes"]}
    n = 0
    for cam in rep["cameras"]:
        for f in cam["files"]:
            # decoded by vlafeed's own decoder, which found H.264 streams
            assert f["codec"] == "h264" and f["pix_fmt"] == "yuv420p" and f["frames_decoded"] == f["frames"]
            assert f["mapping"] == "ordinal" and f["frames"] == f["frames_expected"]
            for e in f["episodes"]:
                # the same frame times as the source: the same drift, to the microsecond
                assert abs(e["drift_ms"] - drift_src[(f["file"], e["episode"])]) < 1e-3
                n += 1
    assert n == 2 * 3


def test_v3_source_every_item_matches(v3src, h264):
    out, s = h264
    worst, mean_abs, max_abs = compare_items(v3src, out)
    print(f"\nv3.0 AV1 -> h264 through LeRobotDataset (RGB): worst frame PSNR {worst:.2f} dB, "
          f"mean abs diff {mean_abs * 255:.3f}/255, max abs diff {max_abs * 255:.1f}/255; "
          f"converter (YUV): PSNR {s['psnr_db']:.2f} dB, mean {s['mean_abs_diff']:.3f}, max {s['max_abs_diff']}")


def test_info_reports_h264(cli, h264):
    out, _ = h264
    r = run(cli, "info", out, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["problems"] == [] and [c["codec"] for c in doc["cameras"]] == ["h264", "h264"]


@pytest.mark.parametrize("codec", ["hevc", "av1"])
def test_other_codecs(cli, v3src, tmp_path, codec):
    out = tmp_path / codec
    r = reencode(cli, v3src, out, "--codec", codec, "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["codec"] == codec and s["psnr_db"] > 36
    rc, rep, err = decode_check(cli, out)
    assert rc == 0, err
    assert all(f["codec"] == codec for cam in rep["cameras"] for f in cam["files"])
    info = json.loads((out / "meta/info.json").read_text())
    assert all(info["features"][k]["info"]["video.codec"] == codec for k in CAMS)


def test_gop_and_preset_options(cli, v3src, tmp_path):
    out = tmp_path / "gop"
    r = reencode(cli, v3src, out, "--codec", "h264", "--gop", 10, "--crf", 23, "--preset", "veryfast", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["gop"] == 10 and s["crf"] == 23 and s["preset"] == "veryfast"
    rc, rep, err = decode_check(cli, out)
    assert rc == 0, err
    assert max(f["max_keyframe_interval"] for cam in rep["cameras"] for f in cam["files"]) == 10


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg command not installed")
def test_depth_camera_is_copied(cli, v3src, tmp_path):
    """A depth camera (gray12le, lossless HEVC) is not re-encoded: no NVDEC
    decodes it and a lossy codec would change the depth codes."""
    src = tmp_path / "depth-src"
    shutil.copytree(v3src, src)
    key = CAMS[1]
    for mp4 in sorted((src / "videos" / key).rglob("*.mp4")):
        tmp = mp4.with_suffix(".gray.mp4")
        subprocess.run(["ffmpeg", "-v", "error", "-i", mp4, "-map", "0:v:0", "-fps_mode", "passthrough", "-copyts",
                        "-c:v", "libx265", "-pix_fmt", "gray12le", "-x265-params", "lossless=1:log-level=error",
                        "-video_track_timescale", "15360", "-y", tmp], check=True, timeout=120)
        tmp.replace(mp4)
    info = json.loads((src / "meta/info.json").read_text())
    feat = info["features"][key]
    feat["shape"] = [feat["shape"][0], feat["shape"][1], 1]
    feat["info"].update({"video.codec": "hevc", "video.pix_fmt": "gray12le", "video.channels": 1,
                         "is_depth_map": True})
    (src / "meta/info.json").write_text(json.dumps(info, indent=4))
    out = tmp_path / "depth-out"
    r = reencode(cli, src, out, "--codec", "h264", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    n_rgb = len(list((src / "videos" / CAMS[0]).rglob("*.mp4")))
    assert s["encoded_files"] == n_rgb and s["encoded_frames"] == s["frames"]
    for mp4 in sorted((src / "videos" / key).rglob("*.mp4")):
        assert filecmp.cmp(mp4, out / mp4.relative_to(src), shallow=False)
    got = json.loads((out / "meta/info.json").read_text())
    assert got["features"][key] == info["features"][key]
    assert got["features"][CAMS[0]]["info"]["video.codec"] == "h264"


# ---- v2.1 source: convert + re-encode -----------------------------------------------------------------


@pytest.fixture(scope="module")
def v21(cli, tmp_path_factory):
    return make_v21(cli, tmp_path_factory.mktemp("codec21") / "v21", episodes=3, cameras=2, size="128x96",
                    min_length=20, max_length=30, seed=4)


def test_v21_source_converted_and_reencoded(cli, v21, tmp_path):
    out = tmp_path / "v30"
    r = reencode(cli, v21, out, "--codec", "h264", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["encoded_files"] == 6 and s["video_files"] == 2 and s["psnr_db"] > 36
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert all(info["features"][k]["info"]["video.codec"] == "h264" for k in CAMS)
    rc, rep, err = decode_check(cli, out)
    assert rc == 0, err
    for cam in rep["cameras"]:
        for f in cam["files"]:
            assert f["codec"] == "h264" and f["mapping"] == "ordinal"
            assert all(e["drift_ms"] == 0 for e in f["episodes"])
    worst, mean_abs, max_abs = compare_items(v21, out)
    print(f"\nv2.1 AV1 -> v3.0 h264 (RGB): worst frame PSNR {worst:.2f} dB, mean abs diff "
          f"{mean_abs * 255:.3f}/255, max {max_abs * 255:.1f}/255")


# ---- errors ----------------------------------------------------------------------------------------


def no_output(out):
    return not out.exists() and not out.with_name(out.name + ".partial").exists()


def test_unknown_codec(cli, v3src, tmp_path):
    r = reencode(cli, v3src, tmp_path / "out", "--codec", "vp9")
    assert r.returncode == 2 and "--codec vp9" in r.stderr and "h264, hevc or av1" in r.stderr
    assert no_output(tmp_path / "out")


def test_missing_encoder_is_named_before_anything_runs(cli, v3src, tmp_path):
    out = tmp_path / "out"
    r = reencode(cli, v3src, out, "--codec", "hevc", env={"VF_ENCODERS_HIDE": "libx265"})
    assert r.returncode == 1 and "libx265" in r.stderr and "hevc" in r.stderr and "not available" in r.stderr
    assert no_output(out)
    # a missing source is not even opened: the encoder check comes first
    r = reencode(cli, tmp_path / "nowhere", out, "--codec", "av1", env={"VF_ENCODERS_HIDE": "libx264,libsvtav1"})
    assert r.returncode == 1 and "libsvtav1" in r.stderr and "nowhere" not in r.stderr.split(":", 2)[-1]


@pytest.mark.parametrize("args, words", [
    (["--codec", "h264", "--crf", "60"], ["--crf 60", "0..51"]),
    (["--codec", "h264", "--preset", "7"], ["--preset 7", "medium"]),
    (["--codec", "av1", "--preset", "fast"], ["--preset fast", "-2"]),
])
def test_bad_options(cli, v3src, tmp_path, args, words):
    r = reencode(cli, v3src, tmp_path / "out", *args)
    assert r.returncode == 1, r.stderr
    assert all(w in r.stderr for w in words), r.stderr
    assert no_output(tmp_path / "out")


def test_options_need_codec(cli, v3src, tmp_path):
    r = reencode(cli, v3src, tmp_path / "out", "--crf", "20")
    assert r.returncode == 2 and "go with --codec" in r.stderr


def test_episodes_with_a_v3_source_refused(cli, v3src, tmp_path):
    r = reencode(cli, v3src, tmp_path / "out", "--codec", "h264", "--episodes", "0-1")
    assert r.returncode == 1 and "--episodes" in r.stderr and "whole" in r.stderr
    assert no_output(tmp_path / "out")


def test_existing_output_is_refused_then_replaced_with_force(cli, v3src, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("x")
    r = reencode(cli, v3src, out, "--codec", "h264")
    assert r.returncode == 1 and "already exists" in r.stderr and "--force" in r.stderr
    assert (out / "keep").exists()
    # a stopped run's OUT.partial (ours, marked) is started over, not resumed
    partial = tmp_path / "out.partial"
    partial.mkdir()
    (partial / ".vlafeed-convert-partial").write_text("")
    (partial / "stale").write_text("x")
    r = reencode(cli, v3src, out, "--codec", "h264", "--force")
    assert r.returncode == 0, r.stderr
    assert not (out / "keep").exists() and not (out / "stale").exists() and not partial.exists()
    assert json.loads((out / "meta/info.json").read_text())["features"][CAMS[0]]["info"]["video.codec"] == "h264"


def test_corrupt_video_is_named(cli, v3src, v21, tmp_path):
    """A source video that cannot be decoded: the error names the file and
    camera (v3.0) or the episode and camera (v2.1); nothing is left."""
    src = tmp_path / "bad-v3"
    shutil.copytree(v3src, src)
    victim = sorted((src / "videos" / CAMS[1]).rglob("*.mp4"))[-1]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])  # the moov box is at the end: now unreadable
    out = tmp_path / "out"
    r = reencode(cli, src, out, "--codec", "h264", "--gop", 2)
    assert r.returncode == 1
    assert f"camera {CAMS[1]}" in r.stderr and victim.name in r.stderr, r.stderr
    assert no_output(out)
    src2 = tmp_path / "bad-v21"
    shutil.copytree(v21, src2)
    victim = src2 / f"videos/chunk-000/{CAMS[0]}/episode_000001.mp4"
    victim.write_bytes(victim.read_bytes()[:3000])
    r = reencode(cli, src2, out, "--codec", "h264", "--gop", 2)
    assert r.returncode == 1
    assert f"episode 1, camera {CAMS[0]}" in r.stderr and "episode_000001.mp4" in r.stderr, r.stderr
    assert no_output(out)
