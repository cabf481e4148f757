"""Learner checkpoints of vlafeed.rl.

``checkpoint_dir/step_NNNNNN/`` (NNNNNN = the learner version) holds

- ``vlafeed_rl.json``: format, version, algorithm, policy spec, hidden size, value head, action
  squash, and the observation/action spaces (so ``vlafeed.rl.policies.load_policy`` rebuilds the
  policy without the env);
- ``model.safetensors``: the policy's state dict;
- ``learner.pt``: what resuming needs: optimizer state, torch RNG state, the REINFORCE baseline,
  the learner's counters and trained-id/return/lag lists, and ``extra``, a dict that the run
  fills with its own position (the colocated loop's episode counter; the queue/accounting state
  of the asynchronous run).

Each folder is written under a temporary name in checkpoint_dir and renamed into place, so a
folder named step_* is always complete; a crash leaves at most a ``.tmp-*`` folder, which the next
save removes."""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch

from vlafeed.rl import spaces as S
from vlafeed.rl.config import RLError

FORMAT = "vlafeed.rl/1"
_STEP = re.compile(r"^step_(\d+)$")


def latest(root) -> Optional[Path]:
    """The newest complete step_* folder under root (None when there is none)."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and
             (p / "vlafeed_rl.json").is_file()]
    return max(steps)[1] if steps else None


def read_meta(d) -> dict:
    p = Path(d) / "vlafeed_rl.json"
    try:
        meta = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise RLError(f"vlafeed.rl: cannot read {p}: {e}") from None
    if meta.get("format") != FORMAT:
        raise RLError(f"vlafeed.rl: {p} has format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def save(learner, root) -> Path:
    """Writes the learner's checkpoint for its current version; returns the folder."""
    from safetensors.torch import save_file
    cfg = learner.cfg
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{learner.version:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        meta = {"format": FORMAT, "version": learner.version, "algorithm": cfg.algorithm, "policy": cfg.policy,
                "hidden": cfg.hidden, "value_head": learner.value_head, "action_squash": cfg.action_squash,
                "observation_space": S.to_json(learner.observation_space),
                "action_space": S.to_json(learner.action_space), "env": str(cfg.env), "seed": cfg.seed}
        state = {k: v.detach().cpu().contiguous() for k, v in learner.model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"))
        torch.save(learner.resume_state(), tmp / "learner.pt")
        (tmp / "vlafeed_rl.json").write_text(json.dumps(meta, indent=2))
        for f in tmp.iterdir():  # durable before the rename makes it visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def restore(learner, root) -> Optional[Path]:
    """Loads the latest checkpoint under root into the learner; None when there is none."""
    from safetensors.torch import load_file
    d = latest(root)
    if d is None:
        return None
    meta = read_meta(d)
    cfg = learner.cfg
    for key, mine in (("algorithm", cfg.algorithm), ("policy", cfg.policy),
                      ("observation_space", S.to_json(learner.observation_space)),
                      ("action_space", S.to_json(learner.action_space))):
        if meta.get(key) != mine:
            raise RLError(f"vlafeed.rl: cannot resume from {d}: its {key} {meta.get(key)!r} differs from this "
                          f"run's {mine!r}")
    learner.model.load_state_dict(load_file(str(d / "model.safetensors")))
    learner.load_resume_state(torch.load(d / "learner.pt", weights_only=False))
    return d
