"""The video layer seen from Python: frames equal LeRobot's PyAV decode.

LeRobot's pyav backend decodes with PyAV and converts with
``frame.to_ndarray(format="rgb24")`` (then ``/ 255`` in float32 through
torch). vlafeed's frames must be the same bytes and the same floats.
"""
import numpy as np
import pytest

native = pytest.importorskip("vlafeed._native")

CAM = "videos/chunk-000/observation.images.cam_high"


@pytest.fixture(scope="module")
def video(g1_dir):
    path = g1_dir / CAM / "episode_000002.mp4"
    if not path.exists():
        pytest.skip(f"fixture video {path} missing")
    return str(path)


def pyav_frames(path, ordinals):
    av = pytest.importorskip("av")
    wanted, out = set(ordinals), {}
    with av.open(path) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i in wanted:
                out[i] = frame.to_ndarray(format="rgb24")
            if i >= max(ordinals):
                break
    return out


def test_info(video):
    info = native.video_info(video)
    assert info["codec"] == "av1" and info["pix_fmt"] == "yuv420p"
    assert (info["width"], info["height"]) == (640, 480)
    assert info["time_base"] == (1, 15360)
    assert info["pts"] == [i * 512 for i in range(info["frames"])]
    assert info["keyframes"] == (info["frames"] + 1) // 2


def test_frames_equal_pyav(video):
    n = native.video_info(video)["frames"]
    ordinals = [0, 1, 2, 50, 51, n // 2, n - 2, n - 1]
    reference = pyav_frames(video, ordinals)
    for k in reversed(ordinals):
        h, w, data = native.video_frame(video, k)
        ours = np.frombuffer(data, np.uint8).reshape(h, w, 3)
        assert np.array_equal(ours, reference[k]), f"frame {k} differs from PyAV"


def test_float_layout_equals_torch_division(video):
    torch = pytest.importorskip("torch")
    h, w, data = native.video_frame(video, 7)
    hwc = np.frombuffer(data, np.uint8).reshape(h, w, 3)
    h2, w2, fdata = native.video_frame(video, 7, layout="chw_f32")
    ours = np.frombuffer(fdata, np.float32).reshape(3, h2, w2)
    lerobot = (torch.from_numpy(hwc.copy()).permute(2, 0, 1).float() / 255).numpy()
    assert np.array_equal(ours, lerobot)
    _, _, cdata = native.video_frame(video, 7, layout="chw")
    assert np.array_equal(np.frombuffer(cdata, np.uint8).reshape(3, h, w), hwc.transpose(2, 0, 1))


def test_errors(video, tmp_path):
    with pytest.raises(IndexError, match="out of range"):
        native.video_frame(video, 10**6)
    with pytest.raises(FileNotFoundError, match="missing.mp4"):
        native.video_frame(str(tmp_path / "missing.mp4"), 0)
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(native.VlafeedError, match="bad.mp4"):
        native.video_frame(str(bad), 0)
    with pytest.raises(ValueError, match="layout"):
        native.video_frame(video, 0, layout="nchw")
