"""normalize= with degenerate or broken statistics: a constant element (std 0,
or min == max) is divided by LeRobot's epsilon, as LeRobot does, and the
engine says so on stderr naming meta/stats.json, the key and how many
elements (before: silently 1e7-3e8 times the deviation); statistics of the
wrong length or not finite are refused naming meta/stats.json."""
import json
import shutil
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture(scope="module")
def sample(tmp_path_factory, cli):
    root = tmp_path_factory.mktemp("norm") / "ds"
    subprocess.run([cli, "make-sample", str(root), "--episodes", "2", "--cameras", "1", "--size", "32x32",
                    "--codec", "h264", "--quiet"], check=True, capture_output=True)
    return root


def with_stats(sample, tmp_path, edit):
    root = tmp_path / "ds"
    shutil.copytree(sample, root)
    path = root / "meta" / "stats.json"
    stats = json.loads(path.read_text())
    edit(stats)
    path.write_text(json.dumps(stats))
    return root


def open_loader(root, mode):
    code = textwrap.dedent(f"""
        import vlafeed
        loader = vlafeed.Loader({str(root)!r}, mode="map", batch_size=2, keys=["observation.state"],
                                normalize={{"observation.state": {mode!r}}}, output="numpy")
        batch = next(iter(loader))
        print(float(abs(batch["observation.state"]).max()))
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("mode,field", [("mean_std", "std"), ("min_max", "max")])
def test_constant_element_is_said(sample, tmp_path, mode, field):
    def edit(stats):
        st = stats["observation.state"]
        if mode == "mean_std":
            st["std"][0] = 0.0
        else:
            st["max"][0] = st["min"][0]
    r = open_loader(with_stats(sample, tmp_path, edit), mode)
    assert r.returncode == 0, r.stderr
    assert "normalize['observation.state']: 1 of its" in r.stderr and "meta/stats.json" in r.stderr
    assert ("std" if mode == "mean_std" else "max - min") in r.stderr


def test_wrong_length_and_non_finite_name_stats_json(sample, tmp_path):
    root = with_stats(sample, tmp_path, lambda s: s["observation.state"].update(std=s["observation.state"]["std"][:1]))
    r = open_loader(root, "mean_std")
    assert r.returncode != 0 and "meta/stats.json" in r.stderr and "normalize['observation.state']" in r.stderr
