"""examples/train_policy.py resumes its data stream exactly.

A run interrupted mid-epoch and resumed from its checkpoint (which holds
each rank's vlafeed loader state) sees, step for step and rank for rank,
exactly the samples (by the `index` column) an uninterrupted run sees:
across the resume point and across the next epoch boundary, in pool mode
with 2 DDP processes under torchrun (1 when torchrun is missing) and in
stream mode with one process. Two ways to interrupt: a run that stops at step 23 resumed from
its step-20 checkpoint (the steps after the checkpoint are lost, as in a
crash), and a run killed with SIGKILL at an arbitrary point, resumed from
whatever latest.pt it left.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

vlafeed = pytest.importorskip("vlafeed")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_policy.py"
BATCH = 4


@pytest.fixture(scope="module")
def tiny(cli, tmp_path_factory):
    """6 episodes of 30..40 frames, one H.264 camera: ~200 frames, an epoch of
    ~25 steps per rank at 4 samples per step on 2 ranks."""
    root = tmp_path_factory.mktemp("train_resume") / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "6", "--cameras", "1", "--codec", "h264",
                        "--size", "96x64", "--min-length", "30", "--max-length", "40", "--seed", "9", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root


def command(args, procs):
    torchrun = shutil.which("torchrun")
    if procs > 1 and torchrun:
        return [torchrun, "--standalone", f"--nproc_per_node={procs}", str(SCRIPT)] + args
    return [sys.executable, str(SCRIPT)] + args


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), e.get("PYTHONPATH", "")])
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def train(args, procs, cwd):
    cmd = command(args, procs)
    r = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=420)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def steps_seen(prefix, rank):
    """{step: (epoch, [index, ...])} from a run's index log (later lines win)."""
    out = {}
    path = Path(f"{prefix}.rank{rank}.jsonl")
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out[rec["step"]] = (rec["epoch"], rec["index"])
    return out


def common(tiny, ckdir, mode):
    return ["--dataset", str(tiny), "--batch-size", str(BATCH), "--lr", "1e-3", "--checkpoint-dir", str(ckdir),
            "--seed", "5", "--device", "cpu", "--chunk", "3", "--mode", mode, "--log-every", "1000", "--threads", "1"]


@pytest.mark.parametrize("mode,procs", [("pool", 2), ("stream", 1)])
def test_interrupted_run_resumes_the_same_samples(tiny, tmp_path, mode, procs):
    procs = procs if shutil.which("torchrun") else 1
    steps = 36 if procs == 2 else 64  # into the second epoch (~25 steps per rank on 2 ranks, ~50 on 1)
    # The uninterrupted run.
    train(common(tiny, tmp_path / "a", mode) + ["--steps", str(steps), "--checkpoint-every", "0", "--log-indices",
                                                   str(tmp_path / "a_idx")], procs, tmp_path)
    # A run that gets to step 23; its last checkpoint before that is step 20.
    ck = tmp_path / "b"
    train(common(tiny, ck, mode) + ["--steps", "23", "--checkpoint-every", "10", "--log-indices",
                                    str(tmp_path / "b_idx")], procs, tmp_path)
    saved = torch.load(ck / "step_000020.pt", weights_only=False)
    assert saved["step"] == 20 and len(saved["loader_states"]) == procs
    assert all(s["samples_consumed"] == 20 * BATCH * procs for s in saved["loader_states"])
    # Resumed from step 20 (steps 21..23 of the interrupted run are lost).
    r = train(common(tiny, ck, mode) + ["--steps", str(steps), "--checkpoint-every", "10", "--resume",
                                        str(ck / "step_000020.pt"), "--log-indices", str(tmp_path / "c_idx")],
              procs, tmp_path)
    assert "loader state restored" in r.stdout
    for rank in range(procs):
        a, b, c = (steps_seen(tmp_path / f"{x}_idx", rank) for x in "abc")
        assert sorted(a) == list(range(1, steps + 1))
        assert sorted(c) == list(range(21, steps + 1))
        # Mid-epoch, and the run crosses into the next epoch after the resume.
        assert a[20][0] == a[21][0] == 0 and a[steps][0] >= 1
        resumed = {**{s: b[s] for s in range(1, 21)}, **c}
        for s in range(1, steps + 1):
            assert resumed[s] == a[s], f"rank {rank} step {s}: {resumed[s]} != {a[s]}"
    # Every sample of epoch 0 exactly once over the ranks (drop_last: the tail aside).
    epoch0 = [i for rank in range(procs) for s, (e, idx) in steps_seen(tmp_path / "a_idx", rank).items() if e == 0
              for i in idx]
    assert len(epoch0) == len(set(epoch0))


def test_sigkilled_run_resumes_the_same_samples(tiny, tmp_path):
    steps = 45
    train(common(tiny, tmp_path / "a", "pool") + ["--steps", str(steps), "--checkpoint-every", "0", "--log-indices",
                                                   str(tmp_path / "a_idx")], 1, tmp_path)
    ck = tmp_path / "b"
    cmd = command(common(tiny, ck, "pool") + ["--steps", str(steps), "--checkpoint-every", "6", "--log-indices",
                                              str(tmp_path / "b_idx")], 1)
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    log = Path(f"{tmp_path / 'b_idx'}.rank0.jsonl")
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and p.poll() is None:
            if log.exists() and len(log.read_text().splitlines()) >= 27:
                break
            time.sleep(0.01)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    if p.returncode == 0:
        pytest.skip("the run finished before it could be killed")
    latest = torch.load(ck / "latest.pt", weights_only=False)
    done = latest["step"]
    assert 6 <= done < steps
    train(common(tiny, ck, "pool") + ["--steps", str(steps), "--checkpoint-every", "6", "--resume", "auto",
                                      "--log-indices", str(tmp_path / "c_idx")], 1, tmp_path)
    a, b, c = (steps_seen(tmp_path / f"{x}_idx", 0) for x in "abc")
    assert sorted(c) == list(range(done + 1, steps + 1))
    resumed = {**{s: b[s] for s in range(1, done + 1)}, **c}
    assert [resumed[s] for s in range(1, steps + 1)] == [a[s] for s in range(1, steps + 1)]
