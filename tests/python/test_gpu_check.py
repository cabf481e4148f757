"""scripts/gpu-check.sh's CPU dry run (docs/gpus.md "The GPU check"): the
script parses its arguments, makes the tiny datasets, skips every step with
the no-CUDA reason and writes summary.json and summary.md; a rerun reuses
the datasets; the driver's per-step child processes return their result and
are killed at their time limit; bad arguments are refused."""
import importlib.util
import json
import pathlib
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"
STEPS = ["loader_cuda", "nvdec", "train", "fp8", "rl"]


def driver():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", REPO / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dry_run(out, work, *extra):
    return subprocess.run([str(REPO / "scripts" / "gpu-check.sh"), "--dry-run", "--out", str(out), "--work",
                           str(work), *extra], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_dry_run_writes_the_summary(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("VF_CLI", cli)
    t0 = time.monotonic()
    r = dry_run(tmp_path / "out", tmp_path / "work")
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - t0 < 60
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["dry_run"] is True
    assert list(summary["steps"]) == STEPS
    for name, res in summary["steps"].items():
        assert res["status"] == "skipped" and res["reason"] == NO_CUDA, (name, res)
    for key in ("name", "driver", "torch", "cuda"):
        assert key in summary["device"]
    assert summary["batch_sizes"] == [8, 16, 32, 64]
    for codec in ("h264", "av1"):  # the tiny datasets were made
        assert (pathlib.Path(summary["datasets"][codec]) / "meta" / "info.json").exists()
    md = (tmp_path / "out" / "summary.md").read_text()
    assert md.startswith("# GPU check")
    for name in STEPS:
        assert f"| {name} | skipped |" in md and NO_CUDA in md

    # idempotent: a rerun reuses the datasets and writes the same steps
    stamp = pathlib.Path(summary["datasets"]["h264"]) / "meta" / "info.json"
    before = stamp.stat().st_mtime_ns
    r = dry_run(tmp_path / "out", tmp_path / "work", "--steps", "fp8,rl", "--batch-sizes", "8,32")
    assert r.returncode == 0, r.stdout + r.stderr
    again = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert list(again["steps"]) == ["fp8", "rl"] and again["batch_sizes"] == [8, 32]
    assert stamp.stat().st_mtime_ns == before


@pytest.mark.parametrize("args, message", [(["--steps", "warp"], "unknown step"),
                                           (["--batch-sizes", "8,x"], "not a list of integers"),
                                           (["--batch-sizes", "0"], ">= 1")])
def test_bad_arguments_are_refused(tmp_path, args, message):
    r = subprocess.run(["python3", str(REPO / "bench" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr


def test_steps_run_in_child_processes_with_a_time_limit(tmp_path):
    gc = driver()
    ctx = {"cuda": False, "datasets": None, "work": str(tmp_path), "batch_sizes": [8], "train_steps": 1}
    res = gc.run_step_child("fp8", ctx, tmp_path, limit=60)
    assert res["status"] == "skipped" and res["reason"] == NO_CUDA
    res = gc.run_step_child("fp8", ctx, tmp_path, limit=0.01)  # killed before it can answer
    assert res["status"] == "failed" and res["reason"].startswith("timed out after")
    # a step that raises fails alone, with its exception
    res = gc.run_step_here("train", {**ctx, "cuda": True, "datasets": {}})
    assert res["status"] == "failed" and "KeyError" in res["reason"]


def test_slug():
    gc = driver()
    assert gc.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gc.slug("") == "unknown"
