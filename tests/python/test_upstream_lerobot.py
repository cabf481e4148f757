"""The reference (lerobot_reference.py) checked against upstream LeRobot itself.

LeRobot cannot live in the main environment (it pins torch < 2.11 and a
torchvision that has no CPU build), so tests/python/install_lerobot.sh puts
lerobot 0.4.4 + torchcodec into an isolated venv (build-lerobot/venv, torch
unchanged) and lerobot_upstream.py runs LeRobotDataset there and dumps the
items. Skipped, with the reason printed, when that venv is absent
(set VF_LEROBOT_PYTHON to use another interpreter).

What is proven, on make-sample v3.0 datasets (AV1 and H.264, drift present):
  * wherever LeRobot's own lookup succeeds, its items equal the reference's
    (ordinal mapping) exactly: same keys in the same order, shapes, dtypes,
    tabular values, is_pad, task strings, and pixel-identical frames
    (torchcodec's conversion against the reference's PyAV/swscale one);
  * LeRobot raises FrameTimestampError on exactly the items where the
    reference's lerobot_compat mode does (upstream issue #3177), i.e. the
    compat mode models LeRobot faithfully;
  * with delta windows and with an episode subset too.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import lerobot_reference as R

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _lerobot_python():
    cand = os.environ.get("VF_LEROBOT_PYTHON") or str(ROOT / "build-lerobot" / "venv" / "bin" / "python")
    if not os.path.isfile(cand):
        return None, f"no LeRobot venv at {cand} (run tests/python/install_lerobot.sh)"
    r = subprocess.run([cand, str(HERE / "lerobot_upstream.py"), "--check"], capture_output=True, text=True,
                       env=_env(Path("/tmp")), timeout=300)
    if r.returncode != 0:
        return None, f"LeRobot in {cand} does not import: {(r.stderr or r.stdout).strip()[-400:]}"
    return cand, r.stdout.strip()


def _env(tmp: Path):
    env = dict(os.environ)
    env.update(HF_HOME=str(tmp / "hf-home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return env


@pytest.fixture(scope="module")
def lerobot_python():
    py, why = _lerobot_python()
    if py is None:
        print(f"\nSKIP upstream LeRobot parity: {why}")
        pytest.skip(why)
    print(f"\nupstream LeRobot: {why}")
    return py


def run_lerobot(py, tmp_path, requests):
    """Runs LeRobotDataset once for a list of requests (see lerobot_upstream.py)."""
    for req in requests:
        req["root"] = str(req["root"])
        req["positions"] = [int(p) for p in req["positions"]]
    req_path, out_path = tmp_path / "requests.json", tmp_path / "items.pt"
    req_path.write_text(json.dumps(requests))
    r = subprocess.run([py, str(HERE / "lerobot_upstream.py"), str(req_path), str(out_path)], capture_output=True,
                       text=True, env=_env(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out_path, weights_only=False)


DELTAS = {"observation.state": [-0.1, 0, 0.1], "action": [0, 1 / 30, 2 / 30], "observation.images.cam0": [-1 / 30, 0],
          "observation.images.cam1": [0.0]}
SUBSET = [5, 0, 3]  # the order LeRobot (and the reference) ignore
LOOSE = 0.45 / 30

# (case name, sample, ReferenceDataset/LeRobotDataset keyword arguments)
CASES = [
    ("av1", "av1", {}),
    ("h264", "h264", {}),
    ("av1-deltas-subset", "av1", {"episodes": SUBSET, "delta_timestamps": DELTAS}),
    ("av1-loose-tolerance", "av1", {"tolerance_s": LOOSE}),
]


@pytest.fixture(scope="module")
def upstream(lerobot_python, tmp_path_factory, cli):
    """All cases served by one LeRobot process: {case: (ref, compat, got, positions)}."""
    tmp = tmp_path_factory.mktemp("lerobot-upstream")
    prepared, requests = {}, []
    for case, name, kw in CASES:
        root = R.sample_dataset(tmp_path_factory, cli, name)
        ref = R.ReferenceDataset(root, **kw)
        compat = R.ReferenceDataset(root, lerobot_compat=True, **kw)
        positions = positions_for(ref)
        prepared[case] = (ref, compat, positions)
        requests.append(dict(root=root, positions=positions, **kw))
    results = run_lerobot(lerobot_python, tmp, requests)
    return {case: (*prepared[case][:2], got, prepared[case][2]) for (case, _, _), got in zip(CASES, results)}


def positions_for(ref):
    """Every episode's first, second, middle and last rows, plus a spread."""
    ps = set(range(0, len(ref), 29))
    for a, b in zip(ref.ep_from, ref.ep_to):
        ps |= {a, a + 1, (a + b) // 2, b - 2, b - 1}
    return sorted(ps)


def compare(ref_plain, ref_compat, got, positions):
    """LeRobot equals the ordinal reference where it succeeds; it fails
    exactly where the compat reference fails."""
    ok = failed = 0
    problems = []
    for p in positions:
        item = got["items"][p]
        try:
            ref_compat[p]
            compat_fails = False
        except R.FrameTimestampError:
            compat_fails = True
        if "__error__" in item:
            if item["__error__"] != "FrameTimestampError":
                problems.append(f"position {p}: LeRobot raised {item['__error__']}: {item['message'][:300]}")
            elif not compat_fails:
                problems.append(f"position {p}: LeRobot raised FrameTimestampError, the compat reference did not")
            failed += 1
            continue
        if compat_fails:
            problems.append(f"position {p}: the compat reference raised FrameTimestampError, LeRobot did not")
        diffs = R.item_differences(ref_plain[p], item)
        if diffs:
            problems.append(f"position {p}:\n  " + "\n  ".join(diffs))
        ok += 1
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:10])
    return ok, failed


@pytest.mark.parametrize("case", ["av1", "h264"])
def test_lerobot_items_equal_the_reference(case, upstream):
    ref, compat, got, positions = upstream[case]
    assert got["len"] == len(ref)
    assert got["meta"]["camera_keys"] == ref.meta.camera_keys
    assert got["meta"]["fps"] == ref.meta.fps and got["meta"]["total_frames"] == ref.meta.total_frames
    ok, failed = compare(ref, compat, got, positions)
    print(f"{case}: {ok} items equal, {failed} FrameTimestampError (#3177) in LeRobot and in the compat reference")
    assert ok > 0 and failed > 0, "expected both drift-free and drifting episodes in the sample"


def test_lerobot_delta_windows_and_episode_subset(upstream):
    ref, compat, got, positions = upstream["av1-deltas-subset"]
    assert got["len"] == len(ref)
    ok, failed = compare(ref, compat, got, positions)
    print(f"deltas + episodes {SUBSET}: {ok} items equal, {failed} FrameTimestampError")
    assert ok > 0


def test_lerobot_with_a_loose_tolerance(upstream):
    """With tolerance_s = 0.45/fps LeRobot no longer raises on these short
    files, and then returns exactly the ordinal reference's frames."""
    ref, compat, got, positions = upstream["av1-loose-tolerance"]
    ok, failed = compare(ref, compat, got, positions)
    assert failed == 0 and ok == len(positions)
