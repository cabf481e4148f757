"""bench/ray_bench.py's two reference measurements stay runnable and measure what
they claim (each child starts its own local Ray with 2 CPUs):

- "floor": Ray Data carrying the datasource's rows with no reader at all (no file
  opened, nothing decoded): every row of the dataset comes through once, task for
  task as vlafeed's plan, with frames of the decoded shape;
- "ray-loader": vlafeed.Loader inside two Ray tasks (rank r of 2), the Ray Train
  worker path: every row is read (stream mode pads the shorter rank by at most
  one row) and each task opens its own MP4s.

No timing is asserted (shared machines); the CPU figure only has to exist.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("ray")

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sample(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("raybench") / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "5", "--cameras", "2", "--codec", "h264",
                        "--size", "64x48", "--fps", "10", "--min-length", "8", "--max-length", "20",
                        "--max-video-mb", "0.01", "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root


def child(what, root):
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    r = subprocess.run([sys.executable, str(REPO / "bench" / "ray_bench.py"), "--child", what, "--root", str(root)],
                       capture_output=True, text=True, timeout=600, env=env)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    return json.loads(lines[-1])


def test_floor_carries_every_row_with_no_reader(sample):
    import vlafeed.ray as vray

    info = json.loads((sample / "meta" / "info.json").read_text())
    plan = vray.LeRobotDatasource(str(sample)).read_tasks_plan()
    out = child("floor", sample)
    assert out["rows"] == info["total_frames"] == sum(t["rows"] for t in plan)
    assert out["tasks"] == len(plan) > 1
    assert out["frames"] == out["rows"] * 2
    assert out["mp4_opens"] == 0
    assert out["frame_shapes"] == {k: [48, 64, 3] for k in ("observation.images.cam0", "observation.images.cam1")}
    assert out["cpu_s"] > 0


def test_loader_in_ray_tasks_reads_every_row(sample):
    info = json.loads((sample / "meta" / "info.json").read_text())
    out = child("ray-loader", sample)
    assert info["total_frames"] <= out["rows"] <= info["total_frames"] + 1
    assert out["mp4_opens"] >= 2  # each task opens its own files, per camera
    assert out["cpu_s"] > 0
