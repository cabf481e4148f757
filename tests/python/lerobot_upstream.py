"""Runs upstream LeRobot's LeRobotDataset in its own venv and dumps items.

Executed by tests/python/test_upstream_lerobot.py with the python of
build-lerobot/venv312 (LeRobot 0.6 on Python 3.12,
tests/python/install_lerobot06.sh) or build-lerobot/venv (LeRobot 0.4.4 on
3.11, tests/python/install_lerobot.sh), never imported by the main test
process, so LeRobot's dependencies stay out of it.

  python lerobot_upstream.py --check
  python lerobot_upstream.py REQUESTS.json OUT.pt

REQUESTS: a list of {"root", "episodes", "delta_timestamps", "positions",
"return_uint8", "tolerance_s", "video_backend"}. OUT (torch.save): a list of
{"len", "meta": {...}, "items": {position: item dict | {"__error__": type,
"message": str}}} or {"__open_error__": type, "message": str} when the
dataset does not open, one per request (one process serves them all:
importing LeRobot takes seconds).

In the 0.4.4 venv, torchvision's PyPI build for torch 2.13 is CUDA-linked:
its C++ ops do not load on CPU torch, and its meta-kernel registrations for
them then raise at import. LeRobot's dataset code needs only
torchvision.transforms, so there (torch 2.13 only) the registrations module
is replaced by an empty one before the import. The 0.6 venv has torch 2.11
with its own paired torchvision and needs nothing of the kind.
"""
import json
import sys
import types


def _import_lerobot():
    import torch
    if torch.__version__.startswith("2.13"):
        sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import lerobot  # noqa: F401
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    return LeRobotDataset


def main(argv):
    if argv[1:] == ["--check"]:
        LeRobotDataset = _import_lerobot()
        import lerobot
        import torch
        import torchcodec  # noqa: F401
        import importlib.metadata as md
        print(f"lerobot {md.version('lerobot')} importable; torch {torch.__version__}")
        return 0
    req_path, out_path = argv[1], argv[2]
    with open(req_path, encoding="utf-8") as f:
        reqs = json.load(f)
    LeRobotDataset = _import_lerobot()
    import torch
    torch.save([serve(LeRobotDataset, req) for req in reqs], out_path)
    return 0


def serve(LeRobotDataset, req):
    kwargs = dict(root=req["root"], episodes=req.get("episodes"), delta_timestamps=req.get("delta_timestamps"),
                  video_backend=req.get("video_backend", "torchcodec"))
    if req.get("tolerance_s") is not None:
        kwargs["tolerance_s"] = req["tolerance_s"]
    import inspect
    if req.get("return_uint8") and "return_uint8" in inspect.signature(LeRobotDataset.__init__).parameters:
        kwargs["return_uint8"] = True  # 0.6: a constructor argument
    try:
        ds = LeRobotDataset("local/vlafeed-parity", **kwargs)
    except Exception as e:  # recorded, compared by the test
        return {"__open_error__": type(e).__name__, "message": str(e)[:2000]}
    if req.get("return_uint8") and not getattr(ds, "return_uint8", getattr(ds, "_return_uint8", False)):
        # LeRobot's flag (lerobot-train sets it); older releases lack it
        if not hasattr(ds, "return_uint8"):
            raise SystemExit("this LeRobot has no return_uint8")
        ds.return_uint8 = True
    items = {}
    for p in req["positions"]:
        try:
            items[p] = dict(ds[p])
        except Exception as e:  # recorded, compared by the test
            items[p] = {"__error__": type(e).__name__, "message": str(e)[:2000]}
    meta = {"fps": ds.meta.fps, "total_frames": ds.meta.total_frames, "total_episodes": ds.meta.total_episodes,
            "camera_keys": list(ds.meta.camera_keys), "video_keys": list(ds.meta.video_keys)}
    return {"len": len(ds), "meta": meta, "items": items}


if __name__ == "__main__":
    sys.exit(main(sys.argv))
