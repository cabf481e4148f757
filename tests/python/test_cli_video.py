"""`vlafeed frame`, `vlafeed decode-check` and `vlafeed make-sample` from the
command line: frames of the real LeRobot AV1 fixture equal the ffmpeg CLI's
decode byte for byte, the checks report what is wrong by file, camera and
episode, and bad arguments give usage errors."""
import json
import shutil
import subprocess

import pytest

CAM = "observation.images.cam_high"


def run(cli, *args):
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=300)


def ppm_pixels(path):
    data = path.read_bytes()
    # P6\n<w> <h>\n255\n then raw RGB
    head, rest = data.split(b"\n", 1)
    assert head == b"P6"
    size, rest = rest.split(b"\n", 1)
    maxval, pixels = rest.split(b"\n", 1)
    w, h = map(int, size.split())
    assert maxval == b"255" and len(pixels) == w * h * 3
    return w, h, pixels


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg command not installed")
@pytest.mark.parametrize("episode,frame", [(1, 0), (1, 1), (2, 137), (4, 0), (4, 200)])
def test_frame_equals_ffmpeg_cli(cli, g1_dir, tmp_path, episode, frame):
    out = tmp_path / "f.ppm"
    r = run(cli, "frame", g1_dir, "--episode", episode, "--frame", frame, "--camera", CAM, "--out", out)
    assert r.returncode == 0, r.stderr
    w, h, pixels = ppm_pixels(out)
    assert (w, h) == (640, 480)
    video = g1_dir / f"videos/chunk-000/{CAM}/episode_{episode:06d}.mp4"
    ref = subprocess.run(["ffmpeg", "-v", "error", "-i", str(video), "-vf", f"select=eq(n\\,{frame})",
                          "-sws_flags", "bilinear", "-pix_fmt", "rgb24", "-frames:v", "1", "-f", "rawvideo", "-"],
                         capture_output=True, check=True).stdout
    assert pixels == ref


def test_frame_png_and_short_camera_name(cli, g1_dir, tmp_path):
    out = tmp_path / "f.png"
    r = run(cli, "frame", g1_dir, "--episode", 2, "--frame", 3, "--camera", "cam_high", "--out", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_frame_errors_name_the_problem(cli, g1_dir, tmp_path):
    out = tmp_path / "f.ppm"
    r = run(cli, "frame", g1_dir, "--episode", 3, "--frame", 0, "--camera", CAM, "--out", out)
    assert r.returncode == 1
    assert "episode_000003.mp4: video file missing" in r.stderr and "episode 3" in r.stderr
    r = run(cli, "frame", g1_dir, "--episode", 2, "--frame", 100000, "--camera", CAM, "--out", out)
    assert r.returncode == 1 and "out of range" in r.stderr
    r = run(cli, "frame", g1_dir, "--episode", 2, "--frame", 0, "--camera", "nope", "--out", out)
    assert r.returncode == 1 and "no camera 'nope'" in r.stderr and CAM in r.stderr
    r = run(cli, "frame", g1_dir, "--episode", 2, "--frame", 0, "--camera", CAM, "--out", tmp_path / "f.gif")
    assert r.returncode == 1 and ".png or .ppm" in r.stderr
    r = run(cli, "frame", g1_dir, "--episode", 2)
    assert r.returncode == 2 and "usage" in r.stderr
    assert not out.exists()


def test_decode_check_fixture_present_episodes(cli, g1_dir):
    r = run(cli, "decode-check", g1_dir, "--episodes", "1,2,4", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["errors"] == 0
    assert report["decoders"]["cpu"]["av1"] == "libdav1d"
    files = report["cameras"][0]["files"]
    assert len(files) == 3
    info = json.loads(run(cli, "info", g1_dir, "--episodes", "1,2,4", "--json").stdout)
    for f in files:
        # one episode per v2.1 file: every frame is there, decodable, GOP 2
        assert f["frames"] == f["frames_expected"] == f["frames_decoded"]
        assert f["max_keyframe_interval"] == 2 and f["mapping"] == "ordinal"
        assert f["episodes"][0]["drift_ms"] == 0
    assert report["frames"] == sum(f["frames"] for f in files)
    assert info["episodes_selected"] == 3


def test_decode_check_reports_missing_videos(cli, g1_dir):
    r = run(cli, "decode-check", g1_dir, "--no-decode", "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    missing = [p for p in report["problems"] if p["kind"] == "missing_file"]
    assert len(missing) == 97 and report["errors"] == 97
    assert all(p["camera"] == CAM for p in missing)


def test_make_sample_decode_check_shows_drift(cli, tmp_path):
    root = tmp_path / "ds"
    r = run(cli, "make-sample", root, "--codec", "h264", "--size", "96x64", "--episodes", "5",
            "--min-length", "20", "--max-length", "40", "--quiet")
    assert r.returncode == 0, r.stderr
    report = json.loads(run(cli, "decode-check", root, "--json").stdout)
    assert report["errors"] == 0
    for cam in report["cameras"]:
        assert len(cam["files"]) == 1
        eps = cam["files"][0]["episodes"]
        assert [e["episode"] for e in eps] == list(range(5))
        assert eps[0]["drift_ms"] == 0
        # LeRobot's concatenation: later starts are late by whole-ms rounding (< 1 ms per episode)
        assert any(0 < e["drift_ms"] < len(eps) for e in eps[1:])
        assert sum(e["length"] for e in eps) == cam["files"][0]["frames"] == cam["files"][0]["frames_decoded"]


def test_make_sample_usage_errors(cli, tmp_path):
    r = run(cli, "make-sample", tmp_path / "x", "--codec", "vp9", "--quiet")
    assert r.returncode == 1 and "--codec must be av1, h264 or hevc" in r.stderr
    r = run(cli, "make-sample", tmp_path / "x", "--size", "64x48", "--quiet")
    assert r.returncode == 1 and "64 px" in r.stderr
    r = run(cli, "make-sample", tmp_path / "x", "--episodes", "zero")
    assert r.returncode == 2 and "--episodes" in r.stderr
    r = run(cli, "make-sample", "--help")
    assert r.returncode == 0 and "--max-video-mb" in r.stdout
