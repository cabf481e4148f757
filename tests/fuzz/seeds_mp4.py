"""Seeds for fuzz_mp4: tiny videos in the shapes the video layer meets.

Written with PyAV into out_dir only (the repository keeps no binary corpus):
H.264 with and without B-frames (moov at the end, and faststart), HEVC,
12-bit gray HEVC (LeRobot depth), MPEG-4 Part 2 (an unsupported codec),
H.264 in Matroska, and AV1 taken from a real LeRobot fixture by packet copy
(the first frames of an episode, both moov placements) plus one whole
fixture video. AV1 is not encoded here: SVT-AV1 run as root would start
real-time threads. Falls back to the ffmpeg CLI for a few seeds when PyAV
is missing.
"""
import pathlib
import shutil
import subprocess

FIXTURE_DIR = (pathlib.Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "lerobot-g1-v21" /
               "videos" / "chunk-000" / "observation.images.cam_high")


def _frames(n, w, h):
    import numpy as np
    for k in range(n):
        img = np.zeros((h, w, 3), np.uint8)
        img[:, : (k * 7) % w] = 255
        img[(k * 5) % h:, :, 1] = 128
        yield k, img


def _encode(path, codec, n=6, w=64, h=64, pix_fmt="yuv420p", options=None, container_options=None, fmt=None):
    import av
    import numpy as np
    with av.open(str(path), "w", format=fmt, options=container_options or {}) as out:
        st = out.add_stream(codec, rate=30)
        st.width, st.height, st.pix_fmt = w, h, pix_fmt
        st.options = options or {}
        for k, img in _frames(n, w, h):
            if pix_fmt == "gray12le":
                depth = (np.arange(w * h, dtype=np.uint16).reshape(h, w) * (k + 1)) & 4095
                frame = av.VideoFrame.from_ndarray(depth, format="gray12le")
            else:
                frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = k
            for pkt in st.encode(frame):
                out.mux(pkt)
        for pkt in st.encode(None):
            out.mux(pkt)


def _remux_fixture(src, dst, packets, faststart):
    import av
    opts = {"movflags": "faststart"} if faststart else {}
    with av.open(str(src)) as inp, av.open(str(dst), "w", options=opts) as out:
        ist = inp.streams.video[0]
        ost = out.add_stream_from_template(ist, opaque=True)
        for i, pkt in enumerate(inp.demux(ist)):
            if pkt.dts is None or i >= packets:
                break
            pkt.stream = ost
            out.mux(pkt)


def _with_pyav(out):
    _encode(out / "h264_bframes.mp4", "libx264", n=10, options={"g": "4", "crf": "30"})
    _encode(out / "h264_gop2_nob.mp4", "libx264", options={"g": "2", "bf": "0", "crf": "30"})
    _encode(out / "h264_faststart.mp4", "libx264", options={"g": "2"}, container_options={"movflags": "faststart"})
    _encode(out / "hevc.mp4", "libx265", options={"g": "2", "x265-params": "log-level=error"})
    _encode(out / "depth_gray12.mp4", "libx265", n=3, pix_fmt="gray12le",
            options={"x265-params": "lossless=1:log-level=error"})
    _encode(out / "mpeg4.mp4", "mpeg4", n=3)
    _encode(out / "h264.mkv", "libx264", n=8, options={"g": "3"}, fmt="matroska")
    fixture = FIXTURE_DIR / "episode_000001.mp4"
    if fixture.exists():
        _remux_fixture(fixture, out / "av1_fixture_head.mp4", 6, False)
        _remux_fixture(fixture, out / "av1_fixture_head_faststart.mp4", 5, True)


def _with_cli(out):
    if not shutil.which("ffmpeg"):
        return
    base = ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc=s=64x64:r=30", "-frames:v", "6"]
    subprocess.run(base + ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-g", "2", str(out / "h264.mp4")], check=False)
    subprocess.run(base + ["-c:v", "mpeg4", str(out / "mpeg4.mp4")], check=False)
    fixture = FIXTURE_DIR / "episode_000001.mp4"
    if fixture.exists():
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(fixture), "-frames:v", "6", "-c", "copy",
                        str(out / "av1_fixture_head.mp4")], check=False)


def write_seeds(out_dir):
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import av  # noqa: F401
        import numpy  # noqa: F401
        _with_pyav(out)
    except ImportError:
        _with_cli(out)
    whole = FIXTURE_DIR / "episode_000004.mp4"
    if whole.exists():
        shutil.copyfile(whole, out / "av1_fixture_episode.mp4")


if __name__ == "__main__":
    import sys
    write_seeds(sys.argv[1] if len(sys.argv) > 1 else "seeds_mp4")
