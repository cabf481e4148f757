"""examples/train_mix.py end to end (the demo's step 9): a make-sample dataset
converted to shards with `vlafeed convert --to wds`, a policy trained from a
0.7/0.3 Mix of the shards and the LeRobot dataset. Checks the loss falls, each
full window holds exactly its shares, and a Mix restored from a mid-run
state_dict yields the same batches (the script exits 1 otherwise)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import lerobot_reference as R

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_mix.py"


def test_train_from_a_mix_of_shards_and_lerobot(tmp_path, cli):
    ds = R.make_sample_dataset(cli, tmp_path / "ds", codec="h264", episodes=4, cameras=2, size="96x64",
                               min_length=30, max_length=40, seed=3)
    out = tmp_path / "wds"
    subprocess.run([cli, "convert", str(ds), str(out), "--to", "wds", "--past", "0", "--future", "0",
                    "--image-offsets", "0", "--samples-per-shard", "20", "--quiet"], check=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(SCRIPT), "--shards", str(out / "shards" / "manifest.jsonl"),
                        "--dataset", str(ds), "--steps", "25", "--batch-size", "8", "--window", "40", "--json"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["resume_exact"] is True
    assert summary["loss_last"] < summary["loss_first"]
    # 26 batches of 8 = 208 samples: five full windows of 40 at exactly 28/12, then 8 more
    assert "each full window of 40: 28, 12" in r.stdout
    assert abs(summary["realised"]["source 0"] - 0.7) < 0.02
