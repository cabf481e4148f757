"""bench/_inplace.py picks the package the bench scripts and their children
run: the checkout's in-place build when it has one, else the installed
package; a checkout without a built extension never lands on PYTHONPATH
(its vlafeed/ cannot import there, which broke the benches after make demo)."""
import importlib.util
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def load_inplace(source):
    spec = importlib.util.spec_from_file_location("inplace_under_test", REPO / "bench" / "_inplace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.SOURCE = source
    return mod


def test_no_built_extension_leaves_the_path_alone(tmp_path, monkeypatch):
    (tmp_path / "vlafeed" / "_native").mkdir(parents=True)
    (tmp_path / "vlafeed" / "__init__.py").write_text("raise ImportError('source tree without extension')\n")
    mod = load_inplace(tmp_path)
    assert not mod.built()
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert mod.child_env(X="1") == {**os.environ, "X": "1"}
    before = list(sys.path)
    mod.use()
    assert sys.path == before


def test_built_extension_goes_first(tmp_path, monkeypatch):
    (tmp_path / "vlafeed" / "_native").mkdir(parents=True)
    (tmp_path / "vlafeed" / "_native" / "_core.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    mod = load_inplace(tmp_path)
    assert mod.built()
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert mod.child_env()["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/elsewhere"
    monkeypatch.delenv("PYTHONPATH")
    assert mod.child_env()["PYTHONPATH"] == str(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    mod.use()
    assert sys.path[0] == str(tmp_path)


def test_no_bench_script_puts_the_source_tree_on_the_path_by_hand():
    """Every script goes through _inplace (one place decides), none sets PYTHONPATH to python/ itself."""
    offenders = []
    for script in sorted((REPO / "bench").glob("*.py")) + sorted((REPO / "examples").glob("*.py")):
        text = script.read_text()
        if 'PYTHONPATH=str(REPO / "python")' in text or '"PYTHONPATH"] = str(REPO / "python")' in text \
                or 'os.path.join(ROOT, "python")' in text or "PYTHONPATH=python " in text:
            offenders.append(script.name)
    assert offenders == []


def test_bench_script_help_runs():
    """A bench script that imports through _inplace starts (its --help)."""
    r = subprocess.run([sys.executable, str(REPO / "bench" / "mix_compare.py"), "--help"], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(REPO / "python")})
    assert r.returncode == 0, r.stderr
