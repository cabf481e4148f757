"""Decode device (NVDEC through FFmpeg's CUDA hwaccel) on a machine without a
GPU: the keyword, the environment variable, per-camera overrides, the
fallback and its reason in stats()["decode_device"], the named error when
CUDA is required, and `vlafeed decode-check --decode-device`. The
VF_TEST_NVDEC hook (absent | open-fails) stands in for the device cases;
the decode on a GPU itself is not exercised here."""
import json
import os
import subprocess

import numpy as np
import pytest

import vlafeed
from vlafeed import _native

import damage

CAM0 = "observation.images.cam0"
CAM1 = "observation.images.cam1"


@pytest.fixture(scope="module")
def h264(cli, tmp_path_factory):
    return damage.make_sample(cli, tmp_path_factory.mktemp("dev") / "h264", episodes=2, cameras=2,
                              min_length=6, max_length=8)


@pytest.fixture(scope="module")
def av1(cli, tmp_path_factory):
    return damage.make_sample(cli, tmp_path_factory.mktemp("dev") / "av1", episodes=2, cameras=1, codec="av1",
                              size="64x64", min_length=6, max_length=8)


@pytest.fixture
def hook(monkeypatch):
    monkeypatch.delenv("VF_DECODE_DEVICE", raising=False)

    def set_hook(value):
        if value is None:
            monkeypatch.delenv("VF_TEST_NVDEC", raising=False)
        else:
            monkeypatch.setenv("VF_TEST_NVDEC", value)
    set_hook(None)
    return set_hook


def frames(root, **kwargs):
    loader = _native.Loader(_native.Dataset(str(root)), mode="map", batch_size=64, image_format="uint8",
                            shuffle=False, log_warnings=False, **kwargs)
    batch = loader.get_items(list(range(10)))
    return loader, {k: np.array(batch[k], copy=True) for k in batch.keys() if k.startswith("observation.images")}


def test_default_is_cpu_and_reported(h264, hook):
    loader, got = frames(h264)
    report = loader.stats()["decode_device"]
    assert set(report) == {CAM0, CAM1}
    for cam in report.values():
        assert cam["requested"] == "cpu" and cam["device"] == "cpu" and cam["reason"] is None
        assert cam["files_cpu"] >= 1 and cam["files_cuda"] == 0


@pytest.mark.parametrize("how", ["absent", "open-fails"])
def test_auto_falls_back_to_cpu_with_the_reason(h264, hook, how):
    _, want = frames(h264, decode_device="cpu")
    hook(how)
    loader, got = frames(h264, decode_device="auto")
    for k in want:  # the same frames, the same pixels: both are the CPU decoder
        assert np.array_equal(got[k], want[k]), k
    report = loader.stats()["decode_device"]
    for cam in report.values():
        assert cam["requested"] == "auto" and cam["device"] == "cpu"
        assert ("no CUDA device" if how == "absent" else "NVDEC could not open the h264 decoder") in cam["reason"]


def test_auto_without_the_hook_on_this_machine(h264, hook):
    # This machine's own FFmpeg and (absent) GPU: whatever the reason, CPU.
    loader, _ = frames(h264, decode_device="auto")
    for cam in loader.stats()["decode_device"].values():
        if cam["device"] == "cuda":
            pytest.skip("a CUDA device is present")
        assert cam["device"] == "cpu" and "CUDA" in cam["reason"]


def test_cuda_required_without_a_device_names_camera(h264, hook):
    hook("absent")
    with pytest.raises(vlafeed.VlafeedError) as e:
        frames(h264, decode_device="cuda")
    assert "decode_device cuda" in str(e.value) and "no CUDA device" in str(e.value)
    assert CAM0 in str(e.value)


def test_cuda_required_when_the_decoder_open_fails_names_file_and_codec(h264, hook):
    hook("open-fails")
    with pytest.raises(Exception) as e:
        frames(h264, decode_device="cuda")
    text = str(e.value)
    assert "cannot decode h264 on NVDEC" in text and ".mp4" in text and "observation.images.cam" in text


def test_per_camera_override(h264, hook):
    hook("open-fails")
    loader, _ = frames(h264, decode_device="auto", decode_device_cameras={CAM1: "cpu"})
    report = loader.stats()["decode_device"]
    assert report[CAM0]["requested"] == "auto" and report[CAM0]["reason"]
    assert report[CAM1]["requested"] == "cpu" and report[CAM1]["reason"] is None
    # cuda for one camera only: the other still loads
    with pytest.raises(Exception, match=CAM1.replace(".", r"\.")):
        frames(h264, decode_device="cpu", decode_device_cameras={CAM1: "cuda"})


def test_keyword_errors(h264, hook):
    with pytest.raises(ValueError, match="gpu"):
        frames(h264, decode_device="gpu")
    with pytest.raises(TypeError, match="decode_device_cameras"):
        frames(h264, decode_device_cameras=[CAM0])
    with pytest.raises(Exception, match="not a camera"):
        frames(h264, decode_device_cameras={"observation.images.nope": "cpu"})


def test_environment_variable(h264, hook, monkeypatch):
    hook("absent")
    monkeypatch.setenv("VF_DECODE_DEVICE", "auto")
    loader, _ = frames(h264)
    assert all(c["requested"] == "auto" for c in loader.stats()["decode_device"].values())
    monkeypatch.setenv("VF_DECODE_DEVICE", "cuda")
    with pytest.raises(Exception, match="decode_device cuda"):
        frames(h264)
    loader, _ = frames(h264, decode_device="cpu")  # the keyword wins
    assert all(c["requested"] == "cpu" for c in loader.stats()["decode_device"].values())


def test_av1_auto_stays_on_dav1d(av1, hook):
    _, want = frames(av1, decode_device="cpu")
    hook("open-fails")
    loader, got = frames(av1, decode_device="auto")
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    (cam,) = loader.stats()["decode_device"].values()
    assert cam["device"] == "cpu" and cam["reason"].startswith("av1: ")


def run_check(cli, root, *args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    env.pop("VF_DECODE_DEVICE", None)
    return subprocess.run([cli, "decode-check", str(root), "--json", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_decode_check_reports_the_device(cli, h264):
    out = run_check(cli, h264, "--decode-device", "auto", env_extra={"VF_TEST_NVDEC": "open-fails"})
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)["decode_device"]
    assert report["requested"] == "auto"
    for cam in report["cameras"].values():
        assert cam["device"] == "cpu" and "NVDEC could not open" in cam["reason"]
        assert cam["max_abs_diff"] == 0 and cam["frames_compared"] > 0  # both on the CPU here
    out = run_check(cli, h264, "--decode-device", "cuda", env_extra={"VF_TEST_NVDEC": "absent"})
    assert out.returncode == 1
    report = json.loads(out.stdout)["decode_device"]
    assert "decode_device cuda" in report["error"] and "no CUDA device" in report["error"]
    out = run_check(cli, h264, "--decode-device", "gpu")
    assert out.returncode == 2 and "auto, cpu or cuda" in out.stderr


def test_public_loader_passes_decode_device(h264, hook):
    """vlafeed.Loader(decode_device=..., decode_device_cameras=...) reaches the engine: the per-camera
    report says what was asked, and "cuda" without a device is the named error."""
    hook("absent")
    loader = vlafeed.Loader(h264, batch_size=4, output="numpy", decode_device="auto",
                            decode_device_cameras={CAM1: "cpu"})
    next(iter(loader))
    report = loader.stats()["decode_device"]
    assert report[CAM0]["requested"] == "auto" and report[CAM0]["device"] == "cpu"
    assert "no CUDA device" in report[CAM0]["reason"]
    assert report[CAM1]["requested"] == "cpu"
    assert loader.stats()["node_cache"] is None or "dir" in loader.stats()["node_cache"]
    with pytest.raises(vlafeed.VlafeedError, match="decode_device cuda"):
        next(iter(vlafeed.Loader(h264, batch_size=4, output="numpy", decode_device="cuda")))
