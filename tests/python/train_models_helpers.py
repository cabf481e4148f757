"""Shared by test_train_lerobot.py, test_train_hf.py and test_train_entry.py: datasets and the
`python -m vlafeed.train` command (torchrun at 2 ranks, gloo, CPU).

renamed_dataset() writes a real LeRobot v3.0 dataset (vlafeed's LeRobotDataset.create / add_frame /
save_episode / finalize, H.264 video) whose keys are named as some real datasets name them:
`state`, `actions`, `image`, so that training it needs data.rename.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
H, W = 64, 96
RENAMED_FEATURES = {
    "image": {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
    "state": {"dtype": "float32", "shape": (6,), "names": [f"j{i}" for i in range(6)]},
    "actions": {"dtype": "float32", "shape": (6,), "names": [f"j{i}" for i in range(6)]},
}
RENAME = {"image": "observation.images.front", "state": "observation.state", "actions": "action"}


def renamed_dataset(root, episodes=4, length=24):
    from vlafeed.data.dataset import LeRobotDataset
    root = Path(root)
    if (root / "meta" / "info.json").is_file():
        return root
    ds = LeRobotDataset.create("local/renamed", 30, RENAMED_FEATURES, root=root, robot_type="test_bot",
                               rgb_encoder={"vcodec": "h264"})
    y, x = np.mgrid[0:H, 0:W]
    for e in range(episodes):
        for f in range(length):
            img = np.empty((H, W, 3), np.uint8)
            img[..., 0] = (x * 255 // (W - 1) + 9 * f) % 256
            img[..., 1] = (y * 255 // (H - 1) + 31 * e) % 256
            img[..., 2] = 128
            t = np.float32(f / length)
            state = np.array([np.sin(t + e), np.cos(t), t, e / 4, 0.5, -t], np.float32)
            ds.add_frame({"image": img, "state": state, "actions": state * 2 + 0.1,
                          "task": ["pick the cube", "place it"][e % 2]})
        ds.save_episode()
    ds.finalize()
    return root


def sample_dataset(cli, root):
    root = Path(root)
    if not (root / "meta" / "info.json").is_file():
        r = subprocess.run([cli, "make-sample", str(root), "--episodes", "4", "--cameras", "1", "--codec", "h264",
                            "--size", "96x64", "--min-length", "20", "--max-length", "28", "--seed", "3", "--quiet"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    return root


def env(tmp, **extra):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), str(Path(__file__).resolve().parent),
                                       e.get("PYTHONPATH", "")])
    e.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_HOME=str(Path(tmp) / "hf-home"),
             HF_LEROBOT_HOME=str(Path(tmp) / "lerobot-home"), TOKENIZERS_PARALLELISM="false",
             WANDB_MODE="disabled")
    e.update(extra)
    return e


def train(python, tmp, args, procs=2, check=True, timeout=600):
    """Runs python -m vlafeed.train ARGS (under torch.distributed.run when procs > 1); returns the result."""
    if procs > 1:
        cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
               "-m", "vlafeed.train"] + args
    else:
        cmd = [python, "-m", "vlafeed.train"] + args
    r = subprocess.run(cmd, cwd=tmp, env=env(tmp), capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r


def losses(log_file):
    """{step: loss hex} from a train.log_file (later lines win)."""
    out = {}
    for line in Path(log_file).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out[rec["step"]] = rec["loss_hex"]
    return out


def python311():
    return sys.executable
