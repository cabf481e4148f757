"""Nothing left out or changed in silence (issue 25, item 6): a feature whose
dtype vlafeed cannot read, frames stored at another size than info.json
declares, and a normalization element with std 0 each reach the Python user
as a LoaderWarning pointing at the user's own line, and the C loader's
warnings list (vf_loader_warning) holds them; `vlafeed convert --to wds`
lists the features it leaves out in its summary and says so on stderr. Before
these were stderr lines of the engine only (and the CLI printed none)."""
import json
import subprocess
import warnings

import numpy as np
import pytest

import vlafeed

import damage

STATE = "observation.state"


@pytest.fixture(scope="module")
def sample(cli, tmp_path_factory):
    return damage.make_sample(cli, tmp_path_factory.mktemp("left_out") / "base", episodes=2, cameras=1,
                              size="64x48", min_length=8, max_length=12)


def variant(sample, tmp_path, edit):
    root = damage.copy(sample, tmp_path / "ds")
    damage.edit_info(root, edit)
    return root


def complex_state(info):
    info["features"][STATE]["dtype"] = "complex128"


def smaller_frames(info):
    f = info["features"][damage.CAM]
    f["shape"] = [24, 32, 3]
    f["info"]["video.height"], f["info"]["video.width"] = 24, 32


def caught(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        value = fn()
    return value, [w for w in got if issubclass(w.category, vlafeed.LoaderWarning)]


def texts(ws):
    return [str(w.message) for w in ws]


def test_unreadable_dtype_is_warned_and_left_out(sample, tmp_path):
    root = variant(sample, tmp_path, complex_state)
    ds, ws = caught(lambda: vlafeed.LeRobotDataset(root, output="numpy"))
    said = texts(ws)
    assert any("meta/info.json" in t and "unknown dtype 'complex128'" in t for t in said), said
    assert any(f"feature '{STATE}' (dtype complex128" in t and "left out of every sample" in t for t in said), said
    assert all(w.filename == __file__ for w in ws), [w.filename for w in ws]  # the user's line, not vlafeed's
    assert STATE not in ds[0] and "action" in ds[0]

    loader, ws = caught(lambda: vlafeed.Loader(root, batch_size=4, output="numpy"))
    assert any("left out of every sample" in t for t in texts(ws)), texts(ws)
    assert any("left out of every sample" in t for t in loader._native.warnings)
    assert STATE not in next(iter(loader))

    with pytest.raises(vlafeed.VlafeedError, match=f"keys: feature '{STATE}' \\(dtype complex128\\)"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vlafeed.Loader(root, batch_size=4, keys=[STATE])


def test_convert_to_wds_lists_what_it_leaves_out(cli, sample, tmp_path):
    root = variant(sample, tmp_path, complex_state)
    r = subprocess.run([cli, "convert", root, "--to", "wds", tmp_path / "out", "--quiet"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"feature '{STATE}' (dtype complex128) is left out of the shards" in r.stderr, r.stderr
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert summary["left_out"] == [{"feature": STATE, "dtype": "complex128", "why": "its dtype is not supported"}]
    assert STATE not in summary["lowdim_keys"] and "action" in summary["lowdim_keys"]

    # VF_LOG=error silences the line; the summary still lists it.
    quiet = subprocess.run([cli, "convert", root, "--to", "wds", tmp_path / "out2", "--quiet"], capture_output=True,
                           text=True, timeout=300, env={**__import__("os").environ, "VF_LOG": "error"})
    assert quiet.returncode == 0 and "left out" not in quiet.stderr, quiet.stderr
    assert json.loads(quiet.stdout[quiet.stdout.index("{"):])["left_out"][0]["feature"] == STATE


def test_clean_dataset_says_nothing(cli, sample, tmp_path):
    _, ws = caught(lambda: vlafeed.LeRobotDataset(sample, output="numpy")[0])
    assert not ws, texts(ws)
    r = subprocess.run([cli, "convert", sample, "--to", "wds", tmp_path / "out", "--quiet"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert json.loads(r.stdout[r.stdout.index("{"):])["left_out"] == []


def test_frames_of_another_size_are_warned(sample, tmp_path):
    root = variant(sample, tmp_path, smaller_frames)
    ds, ws = caught(lambda: vlafeed.LeRobotDataset(root, output="numpy"))
    said = texts(ws)
    assert any(damage.CAM in t and "64x48" in t and "32x24" in t for t in said), said
    assert all(w.filename == __file__ for w in ws)
    # served at the files' size, as said
    assert ds[0][damage.CAM].shape == (3, 48, 64)
    loader, ws = caught(lambda: vlafeed.Loader(root, batch_size=2, output="numpy"))
    assert any("64x48" in t and "32x24" in t for t in texts(ws)), texts(ws)
    batch, ws = caught(lambda: next(iter(loader)))
    assert batch[damage.CAM].shape == (2, 3, 48, 64)


def test_zero_std_is_a_loader_warning(sample, tmp_path):
    root = damage.copy(sample, tmp_path / "ds")
    path = root / "meta" / "stats.json"
    stats = json.loads(path.read_text())
    stats[STATE]["std"][0] = 0.0
    path.write_text(json.dumps(stats))
    loader, ws = caught(lambda: vlafeed.Loader(root, batch_size=2, keys=[STATE], normalize={STATE: "mean_std"},
                                               output="numpy"))
    said = texts(ws)
    assert any(f"normalize['{STATE}']: 1 of its" in t and "meta/stats.json" in t for t in said), said
    assert np.isfinite(next(iter(loader))[STATE]).all()
