"""examples/ray_finetune.py end to end under Ray Train (2 workers, gloo on CPU,
Ray started by the example with num_cpus=2), with a real SIGKILL of one
training worker process in the middle of an epoch.

- Ray Data feeding (read_datasource -> rename + CHW float32 inside vlafeed's
  read tasks -> iter_torch_batches): Ray restarts the worker group, the run
  resumes from the last epoch checkpoint (the restarted workers start at the
  next epoch with the checkpoint's step count), Ray Data re-reads the
  interrupted epoch from its start (a whole epoch of batches after the
  restart), and the loss keeps falling.
- vlafeed.Loader inside each worker, its state_dict() in the checkpoint: after
  the kill, every rank continues sample for sample: the `index` values it
  trains on after the restart equal those of an uninterrupted run (computed
  here with the same loader settings, since the order is a pure function of
  seed, epoch and rank).

The GPU path (NCCL) is chosen by torch.cuda.is_available(); this machine and
CI have no GPU, so only gloo runs here.
"""
import collections
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("ray")
torch = pytest.importorskip("torch")

import vlafeed  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ray_finetune.py"
CAM0 = "observation.images.cam0"


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: the NCCL path of examples/ray_finetune.py is not run here (gloo only)")
def test_gpu_nccl_path(dataset, tmp_path):
    """With a GPU the example picks NCCL and a GPU per worker; one epoch must train and report."""
    log_dir = tmp_path / "logs"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, str(EXAMPLE), "--dataset", str(dataset), "--epochs", "1", "--workers", "1",
                        "--log-dir", str(log_dir)], capture_output=True, text=True, timeout=540, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert (log_dir / "rank0.jsonl").read_text().strip()


@pytest.fixture(scope="module")
def dataset(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("raytrain") / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "6", "--codec", "h264", "--size", "96x64",
                        "--fps", "10", "--min-length", "10", "--max-length", "30", "--max-video-mb", "0.01",
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root


def run_example(log_dir, *args, timeout=540):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.5"   # notice the dead worker sooner
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    r = subprocess.run([sys.executable, str(EXAMPLE), "--num-cpus", "2", "--log-dir", str(log_dir), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, tail
    summary = json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])
    logs = {}
    for rank in (0, 1):
        logs[rank] = [json.loads(line) for line in (log_dir / f"rank{rank}.jsonl").read_text().splitlines()]
    killed_pid = int((log_dir / "killed").read_text())
    return summary, logs, killed_pid, tail


def attempts(lines):
    """{pid: [lines]} in order of first appearance."""
    out = collections.OrderedDict()
    for d in lines:
        out.setdefault(d["pid"], []).append(d)
    return out


def test_ray_data_kill_restart_resume(dataset, tmp_path):
    log_dir = tmp_path / "logs"
    # 121 rows, split equally over 2 ranks, batches of 8, drop_last: 7 steps per rank and epoch.
    # Kill rank 1 at global step 10: epoch 1, 3 steps after the epoch-0 checkpoint.
    summary, logs, killed_pid, tail = run_example(log_dir, "--dataset", dataset, "--data", "ray", "--epochs", 3,
                                                  "--kill-at", 10)
    assert summary["error"] is None and summary["metrics"]["epoch"] == 2, summary
    runs = {rank: attempts(lines) for rank, lines in logs.items()}
    for rank in (0, 1):
        assert len(runs[rank]) == 2, f"rank {rank}: expected one restart, saw pids {list(runs[rank])}"
    first1, second1 = list(runs[1])
    assert first1 == killed_pid and second1 != killed_pid
    first_steps = {rank: list(runs[rank].values())[0] for rank in (0, 1)}
    after = {rank: list(runs[rank].values())[1] for rank in (0, 1)}
    steps_per_epoch = sum(1 for d in first_steps[0] if d["epoch"] == 0)
    assert steps_per_epoch == 7
    # The kill came mid-epoch 1; the restart resumed from the epoch-0 checkpoint.
    assert max(d["step"] for d in first_steps[1]) == 10
    for rank in (0, 1):
        assert after[rank][0]["resumed_from"] == steps_per_epoch, after[rank][0]
        assert after[rank][0]["epoch"] == 1 and after[rank][0]["step"] == steps_per_epoch + 1
        # Ray Data re-reads the interrupted epoch from the start: a whole epoch of batches.
        assert sum(1 for d in after[rank] if d["epoch"] == 1) == steps_per_epoch
    seen = [i for rank in (0, 1) for d in after[rank] if d["epoch"] == 1 for i in d["index"]]
    assert len(seen) == len(set(seen)) == 2 * steps_per_epoch * 8
    # The loss keeps falling across the restart.
    def mean_loss(lines, epoch):
        values = [d["loss"] for d in lines if d["epoch"] == epoch]
        return sum(values) / len(values)
    before = np.mean([mean_loss(first_steps[r], 0) for r in (0, 1)])
    resumed = np.mean([mean_loss(after[r], 1) for r in (0, 1)])
    final = np.mean([mean_loss(after[r], 2) for r in (0, 1)])
    assert final < resumed < before, (before, resumed, final)


def test_loader_in_workers_exact_resume(dataset, tmp_path):
    log_dir = tmp_path / "logs"
    epochs, batch, every, kill_at = 2, 8, 4, 6
    summary, logs, killed_pid, tail = run_example(log_dir, "--dataset", dataset, "--data", "loader", "--epochs",
                                                  epochs, "--batch-size", batch, "--checkpoint-every", every,
                                                  "--kill-at", kill_at)
    assert summary["error"] is None, summary
    # The uninterrupted order of each rank, from the same loader settings.
    expected = {}
    for rank in (0, 1):
        loader = vlafeed.Loader(str(dataset), mode="stream", batch_size=batch, seed=0, drop_last=True, rank=rank,
                                world_size=2, threads=1, keys=[CAM0, "observation.state", "action", "index"],
                                renames={CAM0: "front"}, image_format="float32")
        seq = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            seq += [b["index"].tolist() for b in loader]
        loader.close()
        expected[rank] = seq
    for rank in (0, 1):
        runs = list(attempts(logs[rank]).values())
        assert len(runs) == 2, f"rank {rank}: expected one restart"
        before, after = runs
        # Before the kill: the uninterrupted order.
        assert [d["index"] for d in before] == expected[rank][:len(before)]
        # After: resumed at the last checkpoint (step 4), then exactly the uninterrupted order.
        assert after[0]["resumed_from"] == every
        assert [d["step"] for d in after] == list(range(every + 1, len(expected[rank]) + 1))
        assert [d["index"] for d in after] == expected[rank][every:]
    assert max(d["step"] for d in logs[1] if d["pid"] == killed_pid) == kill_at
