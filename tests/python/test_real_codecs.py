"""Real-world video files (issue 10): datasets whose MP4s were re-encoded the
way older or other writers make them -- MPEG-4 Part 2 (mp4v, info.json still
saying h264), VP9, H.264 with B-frames and open GOPs -- read pixel-exactly
against the ffmpeg CLI (`-sws_flags bilinear -pix_fmt rgb24`, as
test_cli_video.py), in sequential and in random order, and `vlafeed info`
reports the codec the file really holds."""
import os
import pathlib
import random
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import vlafeed

import damage
from damage import CAM, VIDEO_FILE

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg command not installed")

ENCODINGS = {
    "mpeg4": ["-c:v", "mpeg4", "-q:v", "2"],
    "h264_bframes_open_gop": ["-c:v", "libx264", "-bf", "3", "-g", "12", "-x264-params", "open-gop=1"],
    "vp9": ["-c:v", "libvpx-vp9", "-b:v", "0", "-crf", "30", "-g", "10", "-row-mt", "0"],
}


@pytest.fixture(scope="module")
def base(cli, tmp_path_factory):
    return damage.make_sample(cli, tmp_path_factory.mktemp("codecs") / "base", episodes=3, size="64x48",
                              min_length=15, max_length=30)


def reencode(root, args):
    src = root / VIDEO_FILE
    tmp = src.with_suffix(".tmp.mp4")
    # passthrough + the demuxer's time base keep every frame's pts exactly.
    damage.ffmpeg("-i", src, *args, "-vsync", "passthrough", "-enc_time_base", "-1", "-video_track_timescale",
                  "15360", tmp)
    tmp.replace(src)


def ffmpeg_frames(path, width, height):
    raw = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-vsync", "passthrough", "-sws_flags", "bilinear",
                          "-pix_fmt", "rgb24", "-f", "rawvideo", "-"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(-1, height, width, 3)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_reencoded_dataset_reads_pixel_exactly(cli, base, tmp_path, name):
    if name == "vp9" and "libvpx-vp9" not in subprocess.run(["ffmpeg", "-hide_banner", "-encoders"],
                                                             capture_output=True, text=True).stdout:
        pytest.skip("this ffmpeg has no libvpx-vp9 encoder")
    root = damage.copy(base, tmp_path / name)
    reencode(root, ENCODINGS[name])
    codec = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=codec_name",
                            "-of", "csv=p=0", str(root / VIDEO_FILE)], capture_output=True, text=True).stdout.strip()
    info = subprocess.run([cli, "info", str(root)], capture_output=True, text=True)
    assert info.returncode == 0, info.stdout
    if codec != "h264":
        assert f"{VIDEO_FILE} [{CAM}]: codec is {codec} in the file, info.json says h264" in info.stdout
    report = vlafeed.LeRobotDatasetMetadata(root).vf_info
    assert report["cameras"][0]["codec"] == codec  # the file's truth
    ref = ffmpeg_frames(root / VIDEO_FILE, 64, 48)
    ds = vlafeed.LeRobotDataset(root, image_format="uint8_hwc", output="numpy")
    assert len(ds) == len(ref)
    order = list(range(len(ds)))
    random.Random(0).shuffle(order)
    for i in list(range(len(ds))) + order:  # sequential, then random access (seeks into open GOPs)
        frame = np.asarray(ds[i][CAM])
        assert frame.shape == (48, 64, 3)
        np.testing.assert_array_equal(frame, ref[i], err_msg=f"{name}: frame {i}")


def test_mpeg4_decode_check_thorough_is_clean(cli, base, tmp_path):
    root = damage.copy(base, tmp_path / "m")
    reencode(root, ENCODINGS["mpeg4"])
    r = subprocess.run([cli, "decode-check", "--thorough", "--quiet", str(root)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    assert "mpeg4 64x48" in r.stdout


@pytest.mark.parametrize("size", ["40x24", "40x32", "100x60", "30x18"])
def test_odd_widths_read_pixel_exactly_in_a_child(cli, tmp_path, size):
    """Widths whose rows are not a multiple of the converter's alignment (40, 100, 30): a stream
    Loader over a whole epoch gives the ffmpeg CLI's frames, and the process survives (the padded-row
    scratch was once too small for swscale: malloc(): invalid size at 40x24). In a child process so a
    heap corruption fails this test instead of the run."""
    w, h = map(int, size.split("x"))
    root = damage.make_sample(cli, tmp_path / "ds", episodes=2, size=size, min_length=8, max_length=12)
    ref = ffmpeg_frames(root / VIDEO_FILE, w, h)
    code = textwrap.dedent(f"""
        import numpy as np, vlafeed
        loader = vlafeed.Loader({str(root)!r}, batch_size=4, shuffle=False, image_format="uint8_hwc",
                                output="numpy", threads=2)
        frames = {{}}
        for b in loader:
            for k, i in enumerate(b["index"].tolist()):
                frames[i] = b[{CAM!r}][k]
        np.save({str(tmp_path / "got.npy")!r}, np.stack([frames[i] for i in sorted(frames)]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "python")))
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.load(tmp_path / "got.npy")
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
