"""vlafeed and the reference (lerobot_reference.py) checked against upstream LeRobot itself.

LeRobot cannot live in the main environment (0.6 needs Python 3.12 and
torch < 2.12; the main one is 3.11 with torch 2.13), so
tests/python/install_lerobot06.sh puts lerobot[dataset] 0.6.x, with torch
2.11 from PyPI, into build-lerobot/venv312 (Python 3.12); the older
tests/python/install_lerobot.sh puts 0.4.4 into build-lerobot/venv (3.11).
lerobot_upstream.py runs LeRobotDataset there and dumps the items. The first
venv found is used (VF_LEROBOT_PYTHON chooses another interpreter); skipped,
with the reason printed, when there is none.

What is proven, on make-sample v3.0 datasets (AV1 and H.264, drift present;
H.264 with B-frames and open GOPs; MPEG-4 Part 2 with info.json saying h264):
  * wherever LeRobot returns an item, vlafeed.LeRobotDataset returns the
    identical item (keys in order, shapes, dtypes, tabular values, is_pad,
    task strings, pixel-identical frames), with and without delta windows,
    with an episode subset, float32 and uint8 (LeRobot's return_uint8);
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


VENVS = [ROOT / "build-lerobot" / "venv312" / "bin" / "python",  # LeRobot 0.6 (install_lerobot06.sh)
         ROOT / "build-lerobot" / "venv" / "bin" / "python"]     # LeRobot 0.4.4 (install_lerobot.sh)


def _lerobot_python():
    cand = os.environ.get("VF_LEROBOT_PYTHON")
    if not cand:
        found = [str(v) for v in VENVS if v.is_file()]
        if not found:
            return None, (f"no LeRobot venv at {VENVS[0]} or {VENVS[1]} "
                          "(run tests/python/install_lerobot06.sh, or make test with VF_LEROBOT06=1)")
        cand = found[0]
    if not os.path.isfile(cand):
        return None, f"no LeRobot interpreter at {cand}"
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

DELTAS1 = {"observation.state": [-0.1, 0, 0.1], "action": [0, 1 / 30, 2 / 30], "observation.images.cam0": [-1 / 30, 0]}

# (case name, sample, ReferenceDataset/LeRobotDataset keyword arguments, uint8)
# uint8: LeRobot's return_uint8=True, vlafeed's and the reference's image_format="uint8".
CASES = [
    ("av1", "av1", {}, False),
    ("h264", "h264", {}, False),
    ("av1-deltas-subset", "av1", {"episodes": SUBSET, "delta_timestamps": DELTAS}, False),
    ("av1-loose-tolerance", "av1", {"tolerance_s": LOOSE}, False),
    ("h264-uint8-deltas", "h264", {"delta_timestamps": DELTAS, "tolerance_s": LOOSE}, True),
    ("h264-bframes", "h264-gop12", {"delta_timestamps": DELTAS1}, False),
    ("mpeg4", "mpeg4", {"delta_timestamps": DELTAS1}, False),
]


def dataset_for(sample, tmp_path_factory, cli):
    if sample != "mpeg4":
        return R.sample_dataset(tmp_path_factory, cli, sample)
    # MPEG-4 Part 2 (mp4v) re-encoded from a make-sample H.264 dataset, every
    # pts kept, info.json still saying h264 (as on a real dataset).
    import damage
    from test_real_codecs import ENCODINGS, reencode
    root = damage.make_sample(cli, tmp_path_factory.mktemp("upstream-mpeg4") / "ds", episodes=3, size="96x64",
                              min_length=20, max_length=35)
    reencode(root, ENCODINGS["mpeg4"])
    return root


def vlafeed_kwargs(kw, uint8):
    return dict(kw, image_format="uint8" if uint8 else "float32")


@pytest.fixture(scope="module")
def upstream(lerobot_python, tmp_path_factory, cli):
    """All cases served by one LeRobot process: {case: (ref, compat, got, positions, root)}."""
    tmp = tmp_path_factory.mktemp("lerobot-upstream")
    prepared, requests = {}, []
    roots = {}
    for case, name, kw, uint8 in CASES:
        if name not in roots:
            roots[name] = dataset_for(name, tmp_path_factory, cli)
        root = roots[name]
        rkw = dict(kw, image_format="uint8") if uint8 else kw
        ref = R.ReferenceDataset(root, **rkw)
        compat = R.ReferenceDataset(root, lerobot_compat=True, **rkw)
        positions = positions_for(ref)
        prepared[case] = (ref, compat, positions, root)
        requests.append(dict(root=root, positions=positions, return_uint8=uint8, **kw))
    results = run_lerobot(lerobot_python, tmp, requests)
    return {case: (*prepared[case][:3], got, prepared[case][3])
            for (case, *_), got in zip(CASES, results)}


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


def unpack(entry):
    ref, compat, positions, got, root = entry
    assert "__open_error__" not in got, got
    return ref, compat, got, positions


@pytest.mark.parametrize("case", ["av1", "h264"])
def test_lerobot_items_equal_the_reference(case, upstream):
    ref, compat, got, positions = unpack(upstream[case])
    assert got["len"] == len(ref)
    assert got["meta"]["camera_keys"] == ref.meta.camera_keys
    assert got["meta"]["fps"] == ref.meta.fps and got["meta"]["total_frames"] == ref.meta.total_frames
    ok, failed = compare(ref, compat, got, positions)
    print(f"{case}: {ok} items equal, {failed} FrameTimestampError (#3177) in LeRobot and in the compat reference")
    assert ok > 0 and failed > 0, "expected both drift-free and drifting episodes in the sample"


def test_lerobot_delta_windows_and_episode_subset(upstream):
    ref, compat, got, positions = unpack(upstream["av1-deltas-subset"])
    assert got["len"] == len(ref)
    ok, failed = compare(ref, compat, got, positions)
    print(f"deltas + episodes {SUBSET}: {ok} items equal, {failed} FrameTimestampError")
    assert ok > 0


def test_lerobot_with_a_loose_tolerance(upstream):
    """With tolerance_s = 0.45/fps LeRobot no longer raises on these short
    files, and then returns exactly the ordinal reference's frames."""
    ref, compat, got, positions = unpack(upstream["av1-loose-tolerance"])
    ok, failed = compare(ref, compat, got, positions)
    assert failed == 0 and ok == len(positions)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_vlafeed_items_equal_lerobot(case, upstream):
    """vlafeed.LeRobotDataset returns LeRobot's own item at every probed
    position where LeRobot returns one; where LeRobot raises
    FrameTimestampError (#3177), vlafeed returns the reference's item."""
    import vlafeed
    _, name, kw, uint8 = next(c for c in CASES if c[0] == case)
    ref, compat, got, positions = unpack(upstream[case])
    root = upstream[case][4]
    ds = vlafeed.LeRobotDataset(str(root), **vlafeed_kwargs(kw, uint8))
    assert len(ds) == got["len"]
    assert list(ds.meta.camera_keys) == got["meta"]["camera_keys"]
    assert ds.meta.fps == got["meta"]["fps"] and ds.meta.total_frames == got["meta"]["total_frames"]
    equal = raised = 0
    problems = []
    for p in positions:
        mine = ds[p]
        theirs = got["items"][p]
        if "__error__" in theirs:
            assert theirs["__error__"] == "FrameTimestampError", theirs
            want, raised = ref[p], raised + 1
        else:
            want, equal = theirs, equal + 1
        diffs = R.item_differences(want, mine)
        if diffs:
            problems.append(f"position {p}:\n  " + "\n  ".join(diffs))
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:10])
    print(f"{case}: {equal} items identical to LeRobot's, {raised} where LeRobot raised (#3177) equal to the reference")
    assert equal > 0


def test_lerobot_06_refuses_v21_which_vlafeed_reads(lerobot_python, tmp_path, fixtures_dir):
    """The real v2.1 fixture: LeRobot 0.4+ reads only v3.0 and refuses it at
    open (BackwardCompatibilityError, pointing at its converter); vlafeed
    reads it in place (its items against the reference: test_parity.py)."""
    import vlafeed
    root = fixtures_dir / "lerobot-g1-v21"
    [got] = run_lerobot(lerobot_python, tmp_path, [dict(root=root, positions=[0], episodes=[1, 2, 4])])
    assert got.get("__open_error__") == "BackwardCompatibilityError", got
    ds = vlafeed.LeRobotDataset(str(root), episodes=[1, 2, 4])
    assert len(ds) == sum(e["length"] for e in ds.meta.selected_episodes)
    assert ds[0]["observation.images.cam_high"].shape[0] == 3
