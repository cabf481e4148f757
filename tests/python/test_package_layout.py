"""The package laid out by concept: every public import path of before still
works and names the very same objects, the modules of each concept import on
their own (no cycle), and the binding's sources sit in vlafeed/_native/."""
import importlib
import pathlib
import subprocess
import sys

import pytest

import vlafeed
from vlafeed import _aliases

PKG = pathlib.Path(vlafeed.__file__).parent


@pytest.mark.parametrize("old,new", sorted(_aliases.MOVED.items()))
def test_old_module_path_is_the_new_module(old, new):
    if "ray" in old:
        pytest.importorskip("ray")
    if "torch" in old:
        pytest.importorskip("torch")
    moved = importlib.import_module(old)
    assert moved is importlib.import_module(new)
    assert moved.__name__ == new and moved.__spec__.name == new  # the real module keeps its own identity
    assert getattr(vlafeed, old.split(".", 1)[1]) is moved  # `import vlafeed; vlafeed.loader` as before


def test_monkeypatch_through_old_path_reaches_new(monkeypatch):
    import vlafeed.loader
    import vlafeed.data.loader
    sentinel = object()
    monkeypatch.setattr(vlafeed.loader, "distributed_rank_world", sentinel)
    assert vlafeed.data.loader.distributed_rank_world is sentinel


def test_unknown_attribute_still_raises():
    with pytest.raises(AttributeError, match="no_such_thing"):
        vlafeed.no_such_thing  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("vlafeed.no_such_module")


def test_public_names():
    from vlafeed.data import LeRobotDataset, Loader, Mix, ShardLoader
    assert (vlafeed.Loader, vlafeed.LeRobotDataset, vlafeed.Mix, vlafeed.ShardLoader) == \
        (Loader, LeRobotDataset, Mix, ShardLoader)
    for name in vlafeed.__all__:
        assert getattr(vlafeed, name) is not None
    assert vlafeed._native.VlafeedError is vlafeed.VlafeedError
    assert vlafeed._native._core.__name__ == "vlafeed._native._core"


def test_torch_and_ray_packages():
    pytest.importorskip("torch")
    import vlafeed.torch
    from vlafeed.wds_torch import ShardIterableDataset
    assert vlafeed.torch.ShardIterableDataset is ShardIterableDataset
    assert vlafeed.torch.IterableDataset.__module__ == "vlafeed.torch.lerobot"
    pytest.importorskip("ray")
    import vlafeed.ray
    from vlafeed.ray_wds import read_wds
    assert vlafeed.ray.read_wds is read_wds
    assert vlafeed.ray.VlafeedRayError is vlafeed.ray.wds._common.VlafeedRayError


@pytest.mark.parametrize("module", ["vlafeed.ray.wds", "vlafeed.ray.lerobot", "vlafeed.torch.wds", "vlafeed.rl.run",
                                    "vlafeed.rl.server", "vlafeed.quant.cli", "vlafeed.data.plan"])
def test_each_module_imports_first_in_a_fresh_process(module):
    """A module imported before anything else of vlafeed loads: no import cycle hides behind an order."""
    if module.startswith("vlafeed.ray"):
        pytest.importorskip("ray")
    if module.split(".")[1] in ("torch", "rl", "quant"):
        pytest.importorskip("torch")
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                       env={**__import__("os").environ, "PYTHONPATH": str(PKG.parent)})
    assert r.returncode == 0, r.stderr


def test_ray_modules_do_not_import_each_other():
    for name in ("lerobot", "wds"):
        other = {"lerobot": "wds", "wds": "lerobot"}[name]
        text = (PKG / "ray" / f"{name}.py").read_text()
        assert f"vlafeed.ray.{other}" not in text.replace(f"``vlafeed.ray.{other}``", "")


def test_binding_sources_in_native_folder():
    assert not list(PKG.glob("*.c")) and not list(PKG.glob("*.h"))
    assert (PKG / "_native" / "_native.c").exists() and list((PKG / "_native").glob("py_*.c"))


def test_python_dash_m_entry_points():
    pytest.importorskip("torch")
    for module in ("vlafeed.quant", "vlafeed.rl"):
        r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                           env={**__import__("os").environ, "PYTHONPATH": str(PKG.parent)})
        assert r.returncode == 0 and "usage:" in r.stdout, (module, r.stderr)
